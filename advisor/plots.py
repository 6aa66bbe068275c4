"""``advisor sweep --plot``: the rows shown, as the paper draws them, with the time model beside.

Left: each layout's predicted memory as a share of the GPU's, one cell per row coloured like
seed 004's tables (green fits, yellow tight / likely, red oom). Right: the predicted TFLOP/s per
GPU of the same rows (when a GPU preset gave the time model), the ranked ones solid. Drawn with a
``matplotlib.figure.Figure`` on the Agg canvas (no pyplot state) and written atomically.
"""

from __future__ import annotations

import io
from pathlib import Path

from advisor.errors import AdvisorError
from advisor.fileio import atomic_write_bytes

COLOURS = {"fits": "#91cf60", "likely fits": "#d9ef8b", "tight": "#fee08b", "likely oom": "#fdae61",
           "oom": "#f46d43", None: "#eeeeee"}
MAX_ROWS = 80
AXIS_LIMIT = 1.5
"""The memory axis ends at 150% of the GPU's memory: a bar beyond it (an oom row with --all,
once 725%) is drawn to the edge with its value written, so that the rows that fit keep their width."""


def _label(row: dict, keys: tuple[str, ...]) -> str:
    rank = f"#{row['rank']} " if row.get("rank") else ""
    return f"{rank}({', '.join(str(row[key]) for key in keys)})"


def _layout_keys(experts: bool) -> tuple[str, ...]:
    """The degrees a row's label names: a mixture of experts' EP beside TP, CP and PP (dense rows
    carry ep 1 in their JSON, so the rows alone do not say which)."""
    return ("tp", "cp", "pp", "ep", "mbs") if experts else ("tp", "cp", "pp", "mbs")


MIN_HEIGHT = 2.8
"""Inches: the memory axis's label (8 pt, about 1.4 in long) runs along the plot's height, and a
figure of 1.6 + 0.24 in a row cut it off below four rows ('..., rank firs', audit)."""


def sweep_plot(rows: list[dict], path: Path, title: str = "", experts: bool = False) -> Path:
    """Draw ``rows`` (sweep rows as dicts, best first; ``experts``: a mixture of experts') to a
    PNG at ``path``."""
    if not rows:
        raise AdvisorError("--plot: no rows to draw (add --all to include the oom ones)")
    fig = sweep_figure(rows[:MAX_ROWS], title, experts)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    return atomic_write_bytes(path, buffer.getvalue())


DPI = 110


def sweep_figure(rows: list[dict], title: str = "", experts: bool = False):
    """The ``matplotlib.figure.Figure`` of ``sweep_plot``, for its rows (at most ``MAX_ROWS``)."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    timed = any(row.get("tflops_per_gpu") is not None for row in rows)
    n = len(rows)
    fig = Figure(figsize=(11 if timed else 6.5, max(1.6 + 0.24 * n, MIN_HEIGHT)), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True, width_ratios=(1, 1.4)) if timed else [fig.add_subplot()]
    memory_ax = axes[0]
    keys = _layout_keys(experts)
    labels = [_label(row, keys) for row in rows]
    share = [(row.get("usage_gib") or row["total_gib"]) / row["memory_gib"] for row in rows]
    y = list(range(n))
    limit = min(max(share), AXIS_LIMIT) * 1.18  # room for the labels
    memory_ax.barh(y, [min(value, AXIS_LIMIT) for value in share], edgecolor="white",
                   color=[COLOURS.get(row["verdict"], COLOURS[None]) for row in rows],
                   hatch=["//" if value > AXIS_LIMIT else None for value in share])
    memory_ax.set_xlim(0, max(limit, 1.05))
    memory_ax.axvline(1.0, color="black", linewidth=1)
    for i, value in enumerate(share):
        clipped = value > AXIS_LIMIT
        memory_ax.text(min(value, AXIS_LIMIT), i, f" {100 * value:.0f}%" + (" (clipped)" if clipped else ""),
                       va="center", fontsize=7)
    memory_ax.set_yticks(y, labels, fontsize=7)
    memory_ax.invert_yaxis()
    memory_ax.set_xlabel("predicted memory / GPU memory")
    memory_ax.set_ylabel(f"({', '.join(key.upper() for key in keys)}), rank first", fontsize=8)
    verdicts = [v for v in COLOURS if v and any(row["verdict"] == v for row in rows)]
    fig.legend(handles=[Patch(color=COLOURS[v], label=v) for v in verdicts], fontsize=7, loc="outside lower center",
               ncols=len(verdicts))
    if timed:
        time_ax = axes[1]
        tflops = [row.get("tflops_per_gpu") or 0.0 for row in rows]
        time_ax.barh(y, tflops, color=["#3b6fb6" if row.get("rank") else "#b9c7dd" for row in rows])
        for i, value in enumerate(tflops):
            time_ax.text(value, i, f" {value:.0f}", va="center", fontsize=7)
        time_ax.set_xlabel("predicted TFLOP/s per GPU (dark: expected to run, ranked; pale: not ranked)")
    fig.suptitle(title, fontsize=8)
    return fig
