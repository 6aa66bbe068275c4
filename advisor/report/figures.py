"""The sweep's and the layouts' figures, as inline hand-written SVG (``advisor.report.svg``,
``advisor.report.bars``: matplotlib would take seconds over the 405B page's thousands of marks).

- heatmap: every (TP, CP, PP) by MBS, coloured by predicted memory over the GPU's, as seed 004's
  Tables 2-11 colour their cells; cells over the GPU's memory carry a dot (the limit marked).
- scatter: predicted step time against memory of every row, coloured by verdict, the chosen
  (ranked first) ones marked and numbered.
- stage memory: per pipeline stage, the memory terms stacked, against the GPU's memory.
- time parts: where a step's time goes (``StepTime``'s parts).
"""

from __future__ import annotations

from advisor.plots import COLOURS
from advisor.render import counted
from advisor.report.details import SEGMENTS, LayoutDetail, row_label
from advisor.report.inputs import memory_share
from advisor.saved_row import number
from advisor.report.labels import text_box

PANEL_ROWS = 70
"""Layouts per heatmap panel; more panels side by side beyond it."""
SEGMENT_COLOURS = ("#4c72b0", "#6f8fc7", "#9db3dc", "#dd8452", "#e8a677", "#f2c7a6", "#8c8c8c", "#55a868")
MOE_SEGMENT_COLOURS = {"FP8 weights": "#8172b3", "dispatcher and expert buffers": "#ccb974"}
"""An MoE stage's own terms (advisor.report.moe_detail), each a colour no other term has: the
dispatcher's buffers were drawn in the runtime's grey beside it (audit), the FP8 copies in the
layer activations' orange. The expert buffers take the EP all-to-all's colour of the time parts."""
PART_COLOURS = {"compute_s": "#4c72b0", "tp_comm_s": "#dd8452", "cp_comm_s": "#c44e52", "ep_comm_s": "#ccb974",
                "pp_comm_s": "#937860",
                "overhead_s": "#8c8c8c", "bubble_s": "#e6e6e6", "dp_comm_s": "#55a868", "optimizer_s": "#8172b3",
                "data_wait_s": "#da8bc3"}


def _layout_key(row: dict) -> tuple:
    return tuple(row.get(key) or 1 for key in ("tp", "cp", "pp"))


def shared_cells(rows: list[dict]) -> tuple[int, list[str]]:
    """(how many heatmap cells several rows share, the fields that tell those rows apart, of EP,
    ETP, VPP and recomputation): the heatmap colours each such cell by its leanest row, and its
    caption says so."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        if memory_share(row) is not None and row.get("mbs"):
            groups.setdefault((_layout_key(row), row["mbs"]), []).append(row)
    shared = [group for group in groups.values() if len(group) > 1]
    names = {"ep": "EP", "etp": "ETP", "vpp": "VPP", "recompute": "recomputation"}
    differ = [name for key, name in names.items()
              if any(len({str(row.get(key)) for row in group}) > 1 for group in shared)]
    return len(shared), differ


MEMORY_STOPS = [(0.0, "#1a9850"), (0.6, "#91cf60"), (0.84, "#fee08b"), (1.0, "#fed976"), (1.0001, "#f46d43"),
                (1.5, "#a50026")]
"""Green to yellow up to and at the GPU's memory, orange-red to dark red beyond it: the limit is the
colour break. The within-limit end stays yellow (hue about 44 degrees): an orange at 90-99% read
as the over-limit colour the caption names (audit)."""
CELL_W, CELL_H, LABEL_W, TOP = 22, 11, 62, 34


def heatmap(rows: list[dict], memory_gib: float | None) -> str:
    """Layouts (TP, CP, PP) down, MBS across, colour = memory share (the best variant where
    several rows share a cell, for example expert-parallel degrees), a dot on the cells over
    the limit. Hand-written SVG: thousands of cells."""
    from advisor.report.svg import interpolate, svg_element

    cells: dict[tuple, float] = {}
    for row in rows:
        share = memory_share(row)
        if share is not None and row.get("mbs"):
            key = (_layout_key(row), row["mbs"])
            cells[key] = min(share, cells.get(key, float("inf")))
    layouts = sorted({layout for layout, _ in cells})
    mbs = sorted({m for _, m in cells})
    column = {m: i for i, m in enumerate(mbs)}
    count = -(-len(layouts) // PANEL_ROWS)  # panels of equal height, at most PANEL_ROWS rows each
    per_panel = -(-len(layouts) // max(count, 1)) or 1
    panels = [layouts[i:i + per_panel] for i in range(0, len(layouts), per_panel)] or [[]]
    panel_w = LABEL_W + CELL_W * len(mbs) + 16
    parts = []
    for p, panel in enumerate(panels):
        x0 = p * panel_w
        parts.append(f'<text x="{x0 + LABEL_W - 4}" y="{TOP - 16}" text-anchor="end">TP,CP,PP</text>')
        parts += [f'<text x="{x0 + LABEL_W + CELL_W * (i + 0.5):.0f}" y="{TOP - 4}" text-anchor="middle">{m}</text>'
                  for i, m in enumerate(mbs)]
        for r, layout in enumerate(panel):
            y = TOP + r * CELL_H
            parts.append(f'<text x="{x0 + LABEL_W - 4}" y="{y + CELL_H - 2}" text-anchor="end" font-size="8">'
                         f'{",".join(map(str, layout))}</text>')
            for m in mbs:
                share = cells.get((layout, m))
                if share is None:
                    continue
                x = x0 + LABEL_W + CELL_W * column[m]
                parts.append(f'<rect x="{x}" y="{y}" width="{CELL_W - 1}" height="{CELL_H - 1}" '
                             f'fill="{interpolate(MEMORY_STOPS, share)}"><title>{share:.0%}</title></rect>')
                if share > 1:
                    parts.append(f'<circle cx="{x + CELL_W / 2 - 0.5:.1f}" cy="{y + CELL_H / 2 - 0.5:.1f}" r="1.6"/>')
    height = TOP + CELL_H * max(len(p) for p in panels) + 48
    width = max(panel_w * len(panels) + 10, SCALE_MIN_W + 20)  # a few MBS columns: the scale's words still fit
    parts.append(_memory_scale(10, height - 26, min(width - 20, 360)))
    over = sum(value > 1 for value in cells.values())
    limit = f" of {memory_gib:g} GiB" if memory_gib else ""
    return svg_element("heatmap", f"Memory heatmap: {len(layouts)} (TP, CP, PP) layouts by {len(mbs)} micro-batch "
                       f"sizes, coloured by predicted memory{limit}; {over} cells over the limit (dotted)",
                       width, height, "".join(parts))


SCALE_MIN_W = 260
"""The colour scale's narrowest width: its two words over the parts within and over the limit fit."""


def _memory_scale(x: float, y: float, width: float) -> str:
    """The colour scale from 0 to 150% of the GPU's memory, the limit marked, each side named
    above its own part (one label right of the limit ran past a narrow heatmap's edge)."""
    from advisor.report.svg import interpolate

    steps = 30
    parts = [f'<rect x="{x + width * i / steps:.1f}" y="{y}" width="{width / steps + 0.5:.1f}" height="8" '
             f'fill="{interpolate(MEMORY_STOPS, 1.5 * (i + 0.5) / steps)}"/>' for i in range(steps)]
    limit = x + width / 1.5
    parts.append(f'<line x1="{limit:.1f}" x2="{limit:.1f}" y1="{y - 3}" y2="{y + 11}" stroke="black" '
                 'stroke-width="2"/>')
    parts += [f'<text x="{x + width * v / 1.5:.1f}" y="{y + 20}" text-anchor="{anchor}">{v:.0%}</text>'
              for v, anchor in ((0, "start"), (0.5, "middle"), (1.0, "middle"), (1.5, "end"))]
    parts.append(f'<text x="{(x + limit) / 2:.1f}" y="{y - 4}" text-anchor="middle">within GPU memory</text>'
                 f'<text x="{(limit + x + width) / 2:.1f}" y="{y - 4}" text-anchor="middle">over it (dot)</text>')
    return "".join(parts)


X_CAP = 3.0
SCATTER = dict(width=780, height=380, left=62, right=170, top=14, bottom=44)


def _log_ticks(low: float, high: float) -> list[float]:
    """1-2-5 ticks within [low, high] (a log axis)."""
    import math

    ticks = [m * 10.0 ** e for e in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
             for m in (1, 2, 5)]
    return [t for t in ticks if low <= t <= high]


def scatter(rows: list[dict], chosen: int) -> str | None:
    """Predicted step time (log) against memory share of every row with a time, coloured by
    verdict; the ``chosen`` best ranked rows ringed and numbered; the GPU's memory a line.
    None without a time model. Hand-written SVG: one circle per row, thousands of them."""
    import math

    from advisor.report.svg import svg_element

    points = [(memory_share(row), number(row, "step_time_s"), row) for row in rows]
    points = [p for p in points if p[0] is not None and p[1] is not None and p[1] > 0]
    if not points:
        return None
    best = sorted((p for p in points if p[2].get("rank")), key=lambda p: p[2]["rank"])[:chosen]
    g = SCATTER
    plot_w, plot_h = g["width"] - g["left"] - g["right"], g["height"] - g["top"] - g["bottom"]
    # Beyond X_CAP of the GPU's memory the exact share matters little: those dots sit on the edge.
    x_max = min(max(1.1, max(p[0] for p in points) * 1.03), X_CAP)
    low, high = min(p[1] for p in points) / 1.15, max(p[1] for p in points) * 1.15
    span = math.log10(high / low)

    def x(share):
        return g["left"] + plot_w * min(share, x_max) / x_max

    def y(seconds):
        return g["top"] + plot_h * (1 - math.log10(seconds / low) / span)

    verdicts = [v for v in COLOURS if v and any(p[2].get("verdict") == v for p in points)]
    style = "".join(f".dot-{i}{{fill:{COLOURS[v]}}}" for i, v in enumerate(verdicts))
    parts = [f"<style>{style}</style>",
             f'<rect x="{g["left"]}" y="{g["top"]}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>']
    for t in _log_ticks(low, high):
        parts.append(f'<line x1="{g["left"] - 4}" x2="{g["left"] + plot_w}" y1="{y(t):.1f}" y2="{y(t):.1f}" '
                     f'stroke="#e5e5e5"/><text x="{g["left"] - 6}" y="{y(t) + 3:.1f}" text-anchor="end">{t:g}</text>')
    step = next(s for s in (0.1, 0.2, 0.25, 0.5, 1.0) if x_max / s <= 10)
    for i in range(int(x_max / step + 1e-9) + 1):
        share = step * i
        parts.append(f'<text x="{x(share):.1f}" y="{g["top"] + plot_h + 14}" text-anchor="middle">{share:.0%}</text>')
    index = {v: i for i, v in enumerate(verdicts)}
    parts += [f'<circle cx="{x(share):.1f}" cy="{y(seconds):.1f}" r="2.3" class="dot-{index[row.get("verdict")]}"/>'
              for share, seconds, row in points if row.get("verdict") in index]
    parts.append(f'<line x1="{x(1):.1f}" x2="{x(1):.1f}" y1="{g["top"]}" y2="{g["top"] + plot_h}" stroke="black"/>'
                 f'<text x="{x(1) + 3:.1f}" y="{g["top"] + 10}">GPU memory</text>')
    plot_box = (g["left"], g["top"], g["left"] + plot_w, g["top"] + plot_h)
    parts += _chosen_marks([(x(share), y(seconds), row) for share, seconds, row in best], plot_box,
                           avoid=(text_box(x(1) + 3, g["top"] + 10, "GPU memory"),))
    parts.append(f'<text x="{g["left"] + plot_w / 2}" y="{g["height"] - 8}" text-anchor="middle">'
                 f"predicted memory / GPU memory{' (beyond ' + format(X_CAP, '.0%') + ': on the edge)' if x_max == X_CAP else ''}</text>"
                 f'<text transform="translate(14 {g["top"] + plot_h / 2}) rotate(-90)" text-anchor="middle">'
                 "predicted step time (s, log)</text>")
    legend_x = g["left"] + plot_w + 14
    for i, verdict in enumerate(verdicts):
        count = sum(p[2].get("verdict") == verdict for p in points)
        parts.append(f'<circle cx="{legend_x}" cy="{g["top"] + 10 + 16 * i}" r="4" class="dot-{i}"/>'
                     f'<text x="{legend_x + 9}" y="{g["top"] + 13 + 16 * i}">{verdict} ({count})</text>')
    parts.append(f'<circle cx="{legend_x}" cy="{g["top"] + 10 + 16 * len(verdicts)}" r="6" fill="none" '
                 f'stroke="#1f3b73" stroke-width="2"/><text x="{legend_x + 9}" y="{g["top"] + 13 + 16 * len(verdicts)}">'
                 "chosen (best ranked)</text>")
    return svg_element("scatter", f"Predicted step time against memory for {counted(len(points), 'layout')}; the best "
                       f"{len(best)} ranked {'is' if len(best) == 1 else 'are'} ringed and numbered", g["width"], g["height"], "".join(parts))


def _chosen_marks(points: list[tuple[float, float, dict]], bounds: tuple, avoid: tuple) -> list[str]:
    """The chosen rows' rings and '#rank' labels, the labels placed best rank first so that none
    covers another (``advisor.report.labels``): the best row's stays beside its ring, and one moved
    away from its ring is tied back to it by a thin line."""
    from advisor.report.labels import leader_line, place_labels

    placed = place_labels([(px, py, f"#{row['rank']}") for px, py, row in points], bounds, avoid)
    parts = []
    for (px, py, row), label in zip(points, placed):
        parts.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="6" fill="none" stroke="#1f3b73" '
                     f'stroke-width="2"><title>{row_label(row)}</title></circle>')
        if label.leader:
            parts.append(leader_line(px, py, label))
        parts.append(f'<text x="{label.x:.1f}" y="{label.y:.1f}" font-weight="bold">#{row["rank"]}</text>')
    return parts


def stage_memory(detail: LayoutDetail, name: str) -> str:
    """Per stage, the memory terms stacked against the GPU's memory (and the paper's rule's line,
    at the rows' --threshold)."""
    from advisor.report.bars import stacked_columns

    keys = list(detail.stages[0]) if detail.stages else []
    # the dense terms' colours wherever the term is the same (an MoE stage's weights too); an MoE
    # stage's own terms their own; any other (a plan's 'predicted') by position
    series = [(key, SEGMENT_COLOURS[SEGMENTS.index(key)] if key in SEGMENTS else
               MOE_SEGMENT_COLOURS.get(key, SEGMENT_COLOURS[i % len(SEGMENT_COLOURS)]),
               [stage[key] for stage in detail.stages]) for i, key in enumerate(keys)]
    series = [entry for entry in series if any(entry[2])]
    lines = []
    if detail.memory_gib:
        lines.append((detail.memory_gib, "GPU memory", False))
    if detail.threshold_gib:
        lines.append((detail.threshold_gib, detail.threshold_label, True))
    peak = max((sum(stage.values()) for stage in detail.stages), default=0)
    limit = f" against {detail.memory_gib:g} GiB" if detail.memory_gib else ""
    return stacked_columns(name, f"Memory per pipeline stage of {detail.label}: {detail.pp} stages, peak "
                           f"{peak:.1f} GiB{limit}", [str(i) for i in range(len(detail.stages))], series,
                           y_label=f"GiB per GPU ({detail.model_name})", x_label="pipeline stage",
                           title=detail.label, lines=tuple(lines))


def time_parts(details: list[LayoutDetail]) -> str | None:
    """One bar per layout: the step's parts (compute, TP/CP/EP/PP communication, overhead, the
    pipeline bubble, exposed DP communication, the optimizer, waiting for data; an MoE step has
    no separate TP/CP part, ``advisor.moe.time.step_parts``)."""
    from advisor.report.bars import stacked_rows

    timed = [d for d in details if d.time_parts]
    if not timed:
        return None
    series = [(part.removesuffix("_s").replace("_", " "), colour, [d.time_parts.get(part, 0.0) for d in timed])
              for part, colour in PART_COLOURS.items()]
    which = "one layout" if len(timed) == 1 else f"{len(timed)} layouts"
    return stacked_rows("time-parts", f"Step time broken into its parts for {which}",
                        [d.label for d in timed], [entry for entry in series if any(entry[2])],
                        x_label="seconds per iteration")
