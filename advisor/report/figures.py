"""The sweep's and the layouts' figures, as inline SVG (``advisor.report.svg``).

- heatmap: every (TP, CP, PP) by MBS, coloured by predicted memory over the GPU's, as seed 004's
  Tables 2-11 colour their cells; cells over the GPU's memory carry a dot (the limit marked).
- scatter: predicted step time against memory of every row, coloured by verdict, the chosen
  (ranked first) ones marked and numbered.
- stage memory: per pipeline stage, the memory terms stacked, against the GPU's memory.
- time parts: where a step's time goes (``StepTime``'s parts).
"""

from __future__ import annotations

from advisor.plots import COLOURS
from advisor.report.details import SEGMENTS, LayoutDetail
from advisor.report.inputs import memory_share, number
from advisor.report.svg import figure_svg

PANEL_ROWS = 70
BARS = 24
"""Stages drawn as bars; more as steps (a stacked area per term)."""
"""Layouts per heatmap panel; more panels side by side beyond it."""
SEGMENT_COLOURS = ("#4c72b0", "#6f8fc7", "#9db3dc", "#dd8452", "#e8a677", "#f2c7a6", "#8c8c8c")
PART_COLOURS = {"compute_s": "#4c72b0", "tp_comm_s": "#dd8452", "cp_comm_s": "#c44e52", "pp_comm_s": "#937860",
                "overhead_s": "#8c8c8c", "bubble_s": "#e6e6e6", "dp_comm_s": "#55a868", "optimizer_s": "#8172b3",
                "data_wait_s": "#da8bc3"}


def _layout_key(row: dict) -> tuple:
    return tuple(row.get(key) or 1 for key in ("tp", "cp", "pp"))


MEMORY_STOPS = [(0.0, "#1a9850"), (0.6, "#91cf60"), (0.84, "#fee08b"), (1.0, "#fdae61"), (1.0001, "#f46d43"),
                (1.5, "#a50026")]
"""Green to yellow within the GPU's memory, orange to red beyond it: the limit is the colour break."""
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
    panels = [layouts[i:i + PANEL_ROWS] for i in range(0, len(layouts), PANEL_ROWS)] or [[]]
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
    height = TOP + CELL_H * max(len(p) for p in panels) + 40
    width = panel_w * len(panels) + 10
    parts.append(_memory_scale(10, height - 26, min(width - 20, 360)))
    over = sum(value > 1 for value in cells.values())
    limit = f" of {memory_gib:g} GiB" if memory_gib else ""
    return svg_element("heatmap", f"Memory heatmap: {len(layouts)} (TP, CP, PP) layouts by {len(mbs)} micro-batch "
                       f"sizes, coloured by predicted memory{limit}; {over} cells over the limit (dotted)",
                       width, height, "".join(parts))


def _memory_scale(x: float, y: float, width: float) -> str:
    """The colour scale from 0 to 150% of the GPU's memory, the limit marked."""
    from advisor.report.svg import interpolate

    steps = 30
    parts = [f'<rect x="{x + width * i / steps:.1f}" y="{y}" width="{width / steps + 0.5:.1f}" height="8" '
             f'fill="{interpolate(MEMORY_STOPS, 1.5 * (i + 0.5) / steps)}"/>' for i in range(steps)]
    limit = x + width / 1.5
    parts.append(f'<line x1="{limit:.1f}" x2="{limit:.1f}" y1="{y - 3}" y2="{y + 11}" stroke="black" '
                 'stroke-width="2"/>')
    parts += [f'<text x="{x + width * v / 1.5:.1f}" y="{y + 20}" text-anchor="middle">{v:.0%}</text>'
              for v in (0, 0.5, 1.0, 1.5)]
    parts.append(f'<text x="{limit + 4:.1f}" y="{y - 2}">GPU memory (dot: over it)</text>')
    return "".join(parts)


def scatter(rows: list[dict], chosen: int) -> str | None:
    """Predicted step time against memory share of every row with a time; the ``chosen`` best
    ranked rows marked and numbered. None without a time model."""
    points = [(memory_share(row), number(row, "step_time_s"), row) for row in rows]
    points = [p for p in points if p[0] is not None and p[1] is not None]
    if not points:
        return None
    best = sorted((p for p in points if p[2].get("rank")), key=lambda p: p[2]["rank"])[:chosen]

    def draw(figure):
        figure.subplots_adjust(left=0.09, right=0.98, bottom=0.12, top=0.97)
        ax = figure.add_subplot()
        for verdict in [v for v in COLOURS if v]:
            mine = [p for p in points if p[2].get("verdict") == verdict]
            if mine:
                ax.scatter([p[0] for p in mine], [p[1] for p in mine], s=9, color=COLOURS[verdict],
                           edgecolors="none", label=f"{verdict} ({len(mine)})")
        ax.scatter([p[0] for p in best], [p[1] for p in best], s=70, marker="*", color="#1f3b73",
                   edgecolors="white", linewidths=0.5, label="chosen", zorder=3)
        for share, seconds, row in best:
            ax.annotate(f"#{row['rank']}", (share, seconds), xytext=(4, 3), textcoords="offset points", fontsize=7)
        ax.axvline(1.0, color="black", linewidth=1)
        ax.text(1.0, 1.0, " GPU memory", transform=ax.get_xaxis_transform(), va="top", fontsize=6.5)
        ax.set_yscale("log")
        ax.set_xlabel("predicted memory / GPU memory")
        ax.set_ylabel("predicted step time (s, log)")
        ax.legend(loc="upper right", frameon=False)
        ax.grid(alpha=0.3, linewidth=0.5)

    return figure_svg("scatter", f"Predicted step time against memory for {len(points)} layouts; the best "
                      f"{len(best)} ranked are marked with stars", (7.5, 4.2), draw)


def stage_memory(detail: LayoutDetail, name: str) -> str:
    """Per stage, the memory terms stacked against the GPU's memory (and the paper's 80% line)."""
    keys = list(detail.stages[0]) if detail.stages else []

    def draw(figure):
        from matplotlib.ticker import MaxNLocator

        figure.subplots_adjust(left=0.08, right=0.7, bottom=0.16, top=0.9)
        ax = figure.add_subplot()
        ax.xaxis.set_major_locator(MaxNLocator(nbins=16, integer=True))
        x = range(len(detail.stages))
        bottom = [0.0] * len(detail.stages)
        for key in keys:
            colour = SEGMENT_COLOURS[SEGMENTS.index(key)] if key in SEGMENTS else "#4c72b0"
            values = [stage[key] for stage in detail.stages]
            if any(values):
                top = [b + v for b, v in zip(bottom, values)]
                if len(values) <= BARS:
                    ax.bar(x, values, bottom=bottom, color=colour, label=key, width=0.8)
                else:  # one polygon per term: a deep pipeline has a hundred stages
                    edges = [i - 0.5 for i in x] + [len(values) - 0.5]
                    ax.stairs(top, edges, baseline=bottom, fill=True, color=colour, label=key)
                bottom = top
        if detail.memory_gib:
            ax.axhline(detail.memory_gib, color="black", linewidth=1.2)
            ax.text(1.0, detail.memory_gib, " GPU", transform=ax.get_yaxis_transform(), va="center", fontsize=6.5)
        if detail.threshold_gib:
            ax.axhline(detail.threshold_gib, color="black", linewidth=0.8, linestyle="--")
            ax.text(1.0, detail.threshold_gib, " 80%", transform=ax.get_yaxis_transform(), va="center", fontsize=6.5)
        ax.set_xlabel("pipeline stage")
        ax.set_ylabel(f"GiB per GPU ({detail.model_name})")
        ax.set_title(detail.label, loc="left")
        ax.legend(loc="upper left", bbox_to_anchor=(1.06, 1), frameon=False)

    peak = max((sum(stage.values()) for stage in detail.stages), default=0)
    limit = f" against {detail.memory_gib:g} GiB" if detail.memory_gib else ""
    return figure_svg(name, f"Memory per pipeline stage of {detail.label}: {detail.pp} stages, peak "
                      f"{peak:.1f} GiB{limit}", (7.5, 2.8), draw)


def time_parts(details: list[LayoutDetail]) -> str | None:
    """One bar per layout: the step's parts (compute, TP/CP/PP communication, overhead, the
    pipeline bubble, exposed DP communication, the optimizer, waiting for data)."""
    timed = [d for d in details if d.time_parts]
    if not timed:
        return None

    def draw(figure):
        figure.subplots_adjust(left=0.32, right=0.8, bottom=0.5 / (1.0 + 0.45 * len(timed)), top=0.97)
        ax = figure.add_subplot()
        y = range(len(timed))
        left = [0.0] * len(timed)
        for part, colour in PART_COLOURS.items():
            values = [d.time_parts.get(part, 0.0) for d in timed]
            if any(values):
                ax.barh(y, values, left=left, color=colour, edgecolor="#999999", linewidth=0.3,
                        label=part.removesuffix("_s").replace("_", " "), height=0.6)
                left = [a + b for a, b in zip(left, values)]
        for i, d in enumerate(timed):
            ax.text(left[i], i, f" {d.time_parts['total_s']:.2f} s", va="center", fontsize=7)
        ax.set_yticks(list(y), [d.label for d in timed])
        ax.invert_yaxis()
        ax.set_xlabel("seconds per iteration")
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False)

    return figure_svg("time-parts", f"Step time broken into its parts for {len(timed)} layouts",
                      (9, 1.0 + 0.45 * len(timed)), draw)
