"""Where the hand-written figures put their text labels so that no two overlap (the sweep
scatter's '#1' was drawn 1.6 px from '#2' where the two best rows share a point, and read as
'#2', audit). A browser lays text out, not this code, so the boxes are estimates on the generous
side: in DejaVu Sans Bold (the widest of the usual sans-serif fonts; Helvetica's and Arial's are
0.556 em) a digit is 0.696 em wide and '#' 0.838 em, and the capitals rise 0.73 em."""

from __future__ import annotations

from dataclasses import dataclass

Box = tuple[float, float, float, float]
"""(left, top, right, bottom) in SVG units, y down."""


@dataclass(frozen=True, slots=True)
class Placed:
    """A label's baseline start (text-anchor start) and box; ``leader`` where it sits away from its
    point and wants a line back to it."""
    x: float
    y: float
    box: Box
    leader: bool


def text_box(x: float, y: float, text: str, font_size: float = 9.0) -> Box:
    """The box of ``text`` drawn from (x, y) as its baseline start: 0.78 em a character (about
    DejaVu Sans Bold's '#1'), 0.8 em above the baseline, 0.25 em below."""
    return x, y - 0.8 * font_size, x + 0.78 * font_size * len(text), y + 0.25 * font_size


def overlaps(a: Box, b: Box) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _inside(box: Box, bounds: Box) -> bool:
    return bounds[0] <= box[0] and box[2] <= bounds[2] and bounds[1] <= box[1] and box[3] <= bounds[3]


def _candidates(px: float, py: float, width: float, ring: float, line: float):
    """(x, y, leader) of the label's places around a point, nearest first: its four corners beside
    the ring, then further up and down to the right and to the left, each with a leader line."""
    right, left = px + ring + 1, px - ring - 1 - width
    yield right, py - ring + 1, False
    yield right, py + ring + line - 2, False
    yield left, py - ring + 1, False
    yield left, py + ring + line - 2, False
    for k in range(1, 60):
        for x in (right + ring, left - ring):
            for y in (py - ring + 1 - k * line, py + ring + line - 2 + k * line):
                yield x, y, True


def place_labels(points: list[tuple[float, float, str]], bounds: Box, avoid: tuple[Box, ...] = (),
                 ring: float = 6.0, font_size: float = 9.0) -> list[Placed]:
    """A place for each (x, y, text) in turn, the first kept beside its point: the first place of
    ``_candidates`` inside ``bounds`` whose box overlaps neither an earlier label's nor one of
    ``avoid`` (other text of the figure); the nearest inside ``bounds`` where every place is taken."""
    placed: list[Placed] = []
    taken = list(avoid)
    line = font_size * 1.15
    for px, py, text in points:
        width = text_box(0, 0, text, font_size)[2]
        choice = None
        for x, y, leader in _candidates(px, py, width, ring, line):
            box = text_box(x, y, text, font_size)
            if not _inside(box, bounds):
                continue
            choice = choice or Placed(x, y, box, leader)
            if not any(overlaps(box, other) for other in taken):
                choice = Placed(x, y, box, leader)
                break
        if choice is None:  # no place inside the bounds at all: beside the point, as ever
            x, y = px + ring + 1, py - ring + 1
            choice = Placed(x, y, text_box(x, y, text, font_size), False)
        placed.append(choice)
        taken.append(choice.box)
    return placed


def leader_line(px: float, py: float, label: Placed, ring: float = 6.0) -> str:
    """A thin line from the ring around (px, py) to the nearer side of ``label``'s box."""
    import math

    left, top, right, bottom = label.box
    tx, ty = (left if left > px else right), (top + bottom) / 2
    distance = math.hypot(tx - px, ty - py) or 1.0
    sx, sy = px + (tx - px) * ring / distance, py + (ty - py) * ring / distance
    return f'<line x1="{sx:.1f}" y1="{sy:.1f}" x2="{tx:.1f}" y2="{ty:.1f}" stroke="#1f3b73" stroke-width="0.6"/>'


def spread(wanted: list[float], gap: float, low: float, high: float) -> list[float]:
    """Positions as near ``wanted`` as keeps each at least ``gap`` from the next, in the same order,
    and within [low, high] where they fit there (more than (high - low) / gap + 1 labels run past
    ``low``): labels beside lines across a plot (the GPU's memory and the paper's 80% of it drew
    on one another where the GPU had 1 GiB, audit)."""
    order = sorted(range(len(wanted)), key=lambda i: wanted[i])
    placed = [min(max(wanted[i], low), high) for i in order]
    for k in range(1, len(placed)):  # downwards from the top one...
        placed[k] = max(placed[k], placed[k - 1] + gap)
    if placed and placed[-1] > high:  # ...then back up from the bottom where that ran past it
        placed[-1] = high
        for k in range(len(placed) - 2, -1, -1):
            placed[k] = min(placed[k], placed[k + 1] - gap)
    out = [0.0] * len(wanted)
    for k, i in enumerate(order):
        out[i] = placed[k]
    return out
