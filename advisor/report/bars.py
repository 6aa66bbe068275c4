"""Stacked bar charts as hand-written SVG: memory per pipeline stage (vertical) and the step's
time parts (horizontal). Drawn by hand, as the heatmap and the schedule, because matplotlib
spends about a second importing itself and a third of one laying out each chart's text, and the
405B page has to be written in under 3 s (benchmarks/bench_report.py)."""

from __future__ import annotations

import html
import math

from advisor.report.labels import spread
from advisor.report.svg import svg_element


def nice_ticks(high: float, most: int = 8) -> list[float]:
    """0, step, 2 step, ... up to ``high`` with step 1, 2, 2.5 or 5 x 10^k and at most ``most``."""
    if high <= 0:
        return [0.0]
    raw = high / most
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    return [step * i for i in range(int(high / step + 1e-9) + 1)]


def _stacked(series, count: int):
    """(index, colour, where the segment starts, its value, its series' label) of every non-zero
    segment, stacked in the order of ``series``."""
    starts = [0.0] * count
    for label, colour, values in series:
        for i, value in enumerate(values):
            if value > 0:
                yield i, colour, starts[i], value, label
                starts[i] += value


def _tip(text: str) -> str:
    """A segment's own value, as the browser shows it on hover: the figures draw no numbers on
    their bars, and a stage's terms were readable only by eye against the axis (audit)."""
    return f"<title>{html.escape(text)}</title>"


def _legend(series, x: float, y: float) -> str:
    return "".join(f'<rect x="{x}" y="{y + 15 * i - 8}" width="10" height="9" fill="{colour}"/>'
                   f'<text x="{x + 14}" y="{y + 15 * i}">{html.escape(label)}</text>'
                   for i, (label, colour, _) in enumerate(series))


def stacked_columns(name: str, description: str, labels: list[str], series: list[tuple[str, str, list[float]]],
                    *, y_label: str, x_label: str, title: str, lines: tuple = (), unit: str = "GiB",
                    label_name: str = "stage") -> str:
    """One column per label, ``series`` (label, colour, values) stacked bottom up; ``lines``
    (value, label, dashed) across the plot, for example the GPU's memory."""
    left, top, plot_w, plot_h, legend_w = 52, 26, 520, 200, 210
    n = max(len(labels), 1)
    totals = [sum(values[i] for _, _, values in series) for i in range(len(labels))]
    high = max([*totals, *(value for value, _, _ in lines), 1e-9]) * 1.05
    ticks = nice_ticks(high)
    high = max(high, ticks[-1])

    def y(value):
        return top + plot_h * (1 - value / high)

    slot = plot_w / n
    bar = slot * (0.8 if n <= 24 else 1.0)
    parts = [f'<text x="0" y="14" font-size="10">{html.escape(title)}</text>']
    for t in ticks:
        parts.append(f'<line x1="{left - 4}" x2="{left + plot_w}" y1="{y(t):.1f}" y2="{y(t):.1f}" stroke="#e5e5e5"/>'
                     f'<text x="{left - 6}" y="{y(t) + 3:.1f}" text-anchor="end">{t:g}</text>')
    for i, colour, bottom, value, term in _stacked(series, len(labels)):
        tip = _tip(f"{label_name} {labels[i]}: {term} {value:.2f} {unit} (of {totals[i]:.2f} {unit})")
        parts.append(f'<rect x="{left + slot * i + (slot - bar) / 2:.1f}" y="{y(bottom + value):.1f}" '
                     f'width="{bar:.1f}" height="{plot_h * value / high:.1f}" fill="{colour}">{tip}</rect>')
    every = max(1, math.ceil(n / 16))
    parts += [f'<text x="{left + slot * (i + 0.5):.1f}" y="{top + plot_h + 13}" text-anchor="middle">'
              f"{html.escape(label)}</text>" for i, label in enumerate(labels) if i % every == 0]
    # the lines' labels a line of text apart: at 1 GiB the GPU's memory and 80% of it are 0.7 px apart
    baselines = spread([y(value) + 3 for value, _, _ in lines], 11, top + 8, top + plot_h + 37)
    for (value, label, dashed), baseline in zip(lines, baselines):
        dash = ' stroke-dasharray="5 3"' if dashed else ""
        parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y(value):.1f}" y2="{y(value):.1f}" '
                     f'stroke="black" stroke-width="1.5"{dash}/>'
                     f'<text x="{left + plot_w + 4}" y="{baseline:.1f}">{html.escape(label)}</text>')
    parts.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>'
                 f'<text x="{left + plot_w / 2}" y="{top + plot_h + 30}" text-anchor="middle">{html.escape(x_label)}</text>'
                 f'<text transform="translate(12 {top + plot_h / 2}) rotate(-90)" text-anchor="middle">'
                 f"{html.escape(y_label)}</text>")
    parts.append(_legend(series, left + plot_w + 60, top + 10))
    return svg_element(name, description, left + plot_w + 60 + legend_w, top + plot_h + 40, "".join(parts))


def stacked_rows(name: str, description: str, labels: list[str], series: list[tuple[str, str, list[float]]],
                 *, x_label: str, value_format: str = "{:.2f} s") -> str:
    """One horizontal bar per label, ``series`` stacked left to right, each total at its end."""
    left, top, plot_w, row_h, legend_w = 230, 8, 420, 26, 150
    totals = [sum(values[i] for _, _, values in series) for i in range(len(labels))]
    # the ticks stop at or below the longest bar and its label's room: the scale runs past them
    high = max([*totals, 1e-9]) * 1.12
    ticks = nice_ticks(high)
    plot_h = row_h * len(labels)
    parts = []
    for t in ticks:
        x = left + plot_w * t / high
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + plot_h + 4}" stroke="#e5e5e5"/>'
                     f'<text x="{x:.1f}" y="{top + plot_h + 15}" text-anchor="middle">{t:g}</text>')
    for i, colour, start, value, term in _stacked(series, len(labels)):
        tip = _tip(f"{labels[i]}: {term} {value_format.format(value)} (of {value_format.format(totals[i])})")
        parts.append(f'<rect x="{left + plot_w * start / high:.1f}" y="{top + row_h * i + 4}" '
                     f'width="{plot_w * value / high:.2f}" height="{row_h - 8}" fill="{colour}" '
                     f'stroke="#999" stroke-width="0.3">{tip}</rect>')
    for i, label in enumerate(labels):
        middle = top + row_h * (i + 0.5) + 3
        parts.append(f'<text x="{left - 6}" y="{middle:.1f}" text-anchor="end">{html.escape(label)}</text>'
                     f'<text x="{left + plot_w * totals[i] / high + 4:.1f}" y="{middle:.1f}">'
                     f"{value_format.format(totals[i])}</text>")
    parts.append(f'<text x="{left + plot_w / 2}" y="{top + plot_h + 30}" text-anchor="middle">{html.escape(x_label)}</text>')
    parts.append(_legend(series, left + plot_w + 50, top + 8))
    height = max(top + plot_h + 40, top + 15 * len(series) + 16)
    return svg_element(name, description, left + plot_w + 50 + legend_w, height, "".join(parts))
