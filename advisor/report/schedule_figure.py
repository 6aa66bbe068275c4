"""The pipeline schedule of one layout as a timeline per rank: Megatron-LM's 1F1B or interleaved
order (``advisor.schedule.timeline``) with each rank's per-microbatch times, forward passes
blue and backward passes green as in seed 004's Figure 4, the idle time between them the bubble.
Hand-written SVG: thousands of passes.

A deep pipeline with many microbatches has tens of thousands of passes; the page draws at most
``MAX_BARS`` of them: fewer microbatches (a multiple of PP, so warm-up, steady state and cool-down
all show) and, beyond ``MAX_RANKS``, the first and the last ranks, and says so. It also draws
fewer where a pass would be narrower than ``MIN_PASS_PX`` (64 microbatches of 5 chunks made the
forwards and backwards a pixel wide, indistinguishable): the first microbatches show warm-up, the
steady state and cool-down, which the rest only repeat; the title says how many are drawn.
"""

from __future__ import annotations

import html

from advisor.report.bars import nice_ticks
from advisor.report.details import LayoutDetail

from advisor.report.svg import svg_element

MAX_BARS = 8000
MAX_RANKS = 16
MIN_PASS_PX = 2.0
"""The narrowest pass drawn, in pixels of the ``WIDTH``-pixel timeline."""
FORWARD, BACKWARD = "#4c72b0", "#55a868"


def drawn_ranks(pp: int) -> list[int]:
    if pp <= MAX_RANKS:
        return list(range(pp))
    return list(range(MAX_RANKS // 2)) + list(range(pp - MAX_RANKS // 2, pp))


def drawn_microbatches(pp: int, vpp: int, m: int) -> int:
    """m, or fewer so that at most MAX_BARS passes are drawn (a multiple of PP, at least PP)."""
    per_microbatch = 2 * vpp * len(drawn_ranks(pp))
    if m * per_microbatch <= MAX_BARS:
        return m
    return max(pp, MAX_BARS // per_microbatch // pp * pp)


def schedule(detail: LayoutDetail, unit_times: bool = False) -> str:
    """The timeline of ``detail``'s layout (its per-rank times; ``unit_times``: a layer's forward 1
    and backward 2 per layer when no time model priced it)."""
    from advisor.schedule import timeline

    p, v = detail.pp, detail.vpp
    forward, backward, m = _passes(detail)
    slots = timeline(p, v, m, forward, backward)
    ranks = drawn_ranks(p)
    end = max(slot.end for slot in slots)
    busy = sum(slot.end - slot.start for slot in slots)
    bubble = 1 - busy / (end * p)
    kind = "interleaved 1F1B" if v > 1 else "1F1B"
    shown = (f"the first {m} of {detail.num_microbatches} microbatches (the rest repeat the steady state)"
             if m < detail.num_microbatches else f"{m} microbatches")
    if len(ranks) < p:
        shown += f", ranks {ranks[0]}-{ranks[MAX_RANKS // 2 - 1]} and {ranks[MAX_RANKS // 2]}-{ranks[-1]} of {p}"
    unit = "ms" if detail.forward_s is not None else "layer-forward units"
    scale = 1e3 if detail.forward_s is not None else 1.0
    drawn = "the drawn ranks' time" if m == detail.num_microbatches else "the drawn schedule's time"
    title = f"{detail.label}: {kind}, {shown}; bubble {bubble:.0%} of {drawn}"
    description = (f"Pipeline schedule of {detail.label}: {kind} over {p} ranks, {shown}: warm-up forwards, "
                   f"one forward one backward in the steady state, cool-down backwards; idle {bubble:.0%}")
    return svg_element("schedule", description, LEFT + WIDTH + 20, TOP + ROW * len(ranks) + 44,
                       _bars(slots, ranks, end, title) + _axis(end * scale, unit, len(ranks)))


LEFT, TOP, ROW, WIDTH = 56, 22, 16, 900


def _passes(detail: LayoutDetail) -> tuple[list[float], list[float], int]:
    """(each rank's forward and backward per chunk, the microbatches drawn): the priced times, or
    a layer's forward 1 and backward 2 on every stage alike."""
    p, v = detail.pp, detail.vpp
    if detail.forward_s is not None:
        forward, backward = [t / v for t in detail.forward_s], [t / v for t in detail.backward_s]
    else:
        forward, backward = [1.0 / v] * p, [2.0 / v] * p
    return forward, backward, legible_microbatches(p, v, drawn_microbatches(p, v, detail.num_microbatches),
                                                   forward, backward)


def unit_note(detail: LayoutDetail) -> str:
    """Why a schedule in layer-forward units shows another bubble than the step's parts: where no
    time model priced each rank's microbatch (an MoE layout's prices the step,
    ``advisor.moe.time.step_parts``), every stage is drawn alike, and the idle share of the drawn
    microbatches is (p - 1)/v over m + (p - 1)/v (Narayanan et al. 2021, Section 2.2), larger
    where fewer are drawn; the step's bubble_s is the priced one, (the stages' summed time per
    microbatch - the slowest's) / v, a share of the whole step (DeepSeek-V3's #1 on 2,048 H100s:
    14% drawn over 32 of 64 microbatches, 0.39 s of 5.63 s priced, audit). Empty with priced times."""
    if detail.forward_s is not None or detail.pp < 2:
        return ""
    p, v, n = detail.pp, detail.vpp, detail.num_microbatches
    _, _, m = _passes(detail)
    fill = (p - 1) / v
    text = (f" No time model priced each rank's microbatch here (the MoE time model prices the step), so the stages "
            f"are drawn alike in layer-forward units (a forward 1, a backward 2). Their idle share, (p - 1)/v over "
            f"m + (p - 1)/v, is {fill / (m + fill):.1%} over the {m} microbatches drawn")
    if m < n:
        text += f" and {fill / (n + fill):.1%} over all {n}"
    parts = detail.time_parts or {}
    if parts.get("bubble_s") is not None and parts.get("total_s"):
        text += (f"; the step's bubble above is the priced one, {parts['bubble_s']:.2f} s of {parts['total_s']:.2f} s "
                 f"({parts['bubble_s'] / parts['total_s']:.1%}): the stages' summed time per microbatch less the "
                 "slowest's, over VPP, from stages that differ, as a share of the whole step")
    return text + "."


def legible_microbatches(p: int, v: int, m: int, forward: list[float], backward: list[float]) -> int:
    """``m``, or fewer (a multiple of PP, at least PP; at least 1 without interleaving) so that the
    narrowest pass is ``MIN_PASS_PX`` wide. The iteration of equal stages lasts (m + (p - 1)/v)
    chunk pairs (Narayanan et al. 2021, Section 2.2); with the slowest stage's pair as the chunk
    pair this bounds the timeline's length from above, so the passes are at least as wide."""
    narrowest, pair = min(forward + backward), max(f + b for f, b in zip(forward, backward)) * v
    if narrowest <= 0 or pair <= 0:
        return m
    fit = WIDTH * narrowest / (MIN_PASS_PX * pair) - (p - 1) / v  # microbatches whose passes are wide enough
    if fit >= m:
        return m
    if v == 1:
        return max(1, int(fit))
    return max(p, int(fit) // p * p)


def _bars(slots, ranks: list[int], end: float, title: str) -> str:
    row_of = {rank: i for i, rank in enumerate(ranks)}
    parts = [f'<text x="0" y="12" font-size="10">{html.escape(title)}</text>']
    parts += [f'<text x="{LEFT - 4}" y="{TOP + ROW * i + 11}" text-anchor="end">rank {r}</text>'
              for i, r in enumerate(ranks)]
    parts.append(f'<rect x="{LEFT}" y="{TOP}" width="{WIDTH}" height="{ROW * len(ranks)}" fill="#ffffff" '
                 'stroke="#999999"/>')
    for slot in slots:
        if slot.rank not in row_of:
            continue
        x = LEFT + WIDTH * slot.start / end
        w = max(WIDTH * (slot.end - slot.start) / end - 0.3, 0.3)
        parts.append(f'<rect x="{x:.1f}" y="{TOP + ROW * row_of[slot.rank] + 2}" width="{w:.1f}" height="{ROW - 4}" '
                     f'class="pass-{slot.kind}"/>')
    return f'<style>.pass-F{{fill:{FORWARD}}}.pass-B{{fill:{BACKWARD}}}</style>' + "".join(parts)


def _axis(span: float, unit: str, rows: int) -> str:
    """Ticks under the timeline, and the legend."""
    y = TOP + ROW * rows
    parts = []
    for value in nice_ticks(span, most=6):  # 0, 2,000, 4,000 ms, not 2,014
        x = LEFT + WIDTH * value / span
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y}" y2="{y + 4}" stroke="black"/>'
                     f'<text x="{x:.1f}" y="{y + 14}" text-anchor="middle">{_tick(value)}</text>')
    parts.append(f'<text x="{LEFT + WIDTH / 2}" y="{y + 27}" text-anchor="middle">time ({unit})</text>')
    legend_y = y + 36
    for i, (label, colour) in enumerate((("forward", FORWARD), ("backward", BACKWARD), ("idle: the bubble", "#ffffff"))):
        x = LEFT + 110 * i
        parts.append(f'<rect x="{x}" y="{legend_y - 8}" width="10" height="8" fill="{colour}" stroke="#999999"/>'
                     f'<text x="{x + 14}" y="{legend_y}">{label}</text>')
    return "".join(parts)


def _tick(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"
