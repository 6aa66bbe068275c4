"""A matplotlib figure as inline SVG: text kept as text (smaller, selectable, searchable), no
date (the same input writes the same page), ids salted per figure (several SVGs share one page),
and the accessible name screen readers read (``role="img"``, ``aria-label`` and ``<title>``)."""

from __future__ import annotations

import html
import io
import re
from typing import Callable

STYLE = {"svg.fonttype": "none", "font.size": 7.5, "axes.titlesize": 8.5, "axes.labelsize": 7.5,
         "legend.fontsize": 7, "xtick.labelsize": 7, "ytick.labelsize": 7}


def figure_svg(name: str, description: str, size: tuple[float, float], draw: Callable) -> str:
    """Draw with ``draw(figure)`` on a new figure of ``size`` inches (matplotlib's object API, no
    pyplot state) and return its SVG element, named ``name`` and described by ``description``."""
    import matplotlib
    from matplotlib.figure import Figure

    with matplotlib.rc_context({**STYLE, "svg.hashsalt": name}):
        figure = Figure(figsize=size)  # margins set by each drawing: a layout engine doubles the time
        draw(figure)
        buffer = io.StringIO()
        figure.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
    text = buffer.getvalue()
    text = text[text.index("<svg"):]
    text = re.sub(r"<metadata>.*?</metadata>", "", text, count=1, flags=re.S)  # matplotlib's RDF block
    label = html.escape(description, quote=True)
    text = text.replace("<svg ", f'<svg role="img" aria-label="{label}" class="figure" data-figure="{name}" ', 1)
    # The <title> first inside the element: what a browser shows on hover and a screen reader reads.
    return re.sub(r"(<svg[^>]*>)", lambda m: f"{m.group(1)}<title>{label}</title>", text, count=1)


def svg_element(name: str, description: str, width: float, height: float, body: str) -> str:
    """A hand-written SVG (for the figures with thousands of marks, which matplotlib lays out
    too slowly: the heatmap and the schedule), with the same accessible name as ``figure_svg``."""
    label = html.escape(description, quote=True)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{label}" class="figure" '
            f'data-figure="{name}" width="{width:.0f}" height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" '
            f'font-family="sans-serif" font-size="9"><title>{label}</title>{body}</svg>')


def interpolate(stops: list[tuple[float, str]], value: float) -> str:
    """The colour at ``value`` on a piecewise linear scale of (position, '#rrggbb') stops."""
    value = min(max(value, stops[0][0]), stops[-1][0])
    for (low, a), (high, b) in zip(stops, stops[1:]):
        if value <= high:
            t = 0.0 if high == low else (value - low) / (high - low)
            mix = [round(int(a[i:i + 2], 16) * (1 - t) + int(b[i:i + 2], 16) * t) for i in (1, 3, 5)]
            return "#" + "".join(f"{c:02x}" for c in mix)
    return stops[-1][1]
