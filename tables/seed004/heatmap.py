"""Heatmap PNGs of the tables in the paper's green / yellow / red, with matplotlib (Agg).

A ``matplotlib.figure.Figure`` renders through the Agg canvas without pyplot, so no global
backend state is touched and nothing needs a display.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

from advisor.fileio import atomic_write_bytes
from advisor.paper_rule import DEFAULT_THRESHOLD, Verdict
from tables.seed004.estimates import EstimatedTable
from tables.seed004.paper import PaperTable
from tables.seed004.reality import ColumnRanking, picks_and_bests
from tables.seed004.report import PICK_MARK, layout_text
from tables.seed004.results import MeasuredTable

COLOURS = {"fits": "#91cf60", "tight": "#fee08b", "oom": "#f46d43", None: "#eeeeee"}
FLAG_COLOUR = "#202060"


@dataclass(frozen=True, slots=True)
class Cell:
    verdict: Verdict | None
    """None: no such run ('-')."""
    text: str
    note: str = ""
    """A smaller second line (the paper's printed value where it differs)."""
    flagged: bool = False
    bold: bool = False


def _draw(table: PaperTable, cells: dict, title: str, flag_label: str, path: Path) -> Path:
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch, Rectangle

    rows, cols = len(table.layouts), len(table.gpu_counts)
    fig = Figure(figsize=(max(6.4, 1.9 + 1.25 * cols), 2.0 + 0.36 * rows), layout="constrained")
    ax = fig.add_subplot()
    for i, layout in enumerate(table.layouts):
        for j, gpus in enumerate(table.gpu_counts):
            cell = cells.get((layout, gpus)) or Cell(None, "-")
            ax.add_patch(Rectangle((j, i), 1, 1, facecolor=COLOURS[cell.verdict], edgecolor="white", linewidth=1.5))
            if cell.flagged:
                ax.add_patch(Rectangle((j + 0.05, i + 0.07), 0.9, 0.86, fill=False, edgecolor=FLAG_COLOUR,
                                       linewidth=2.2, linestyle="--"))
            y = i + (0.38 if cell.note else 0.5)
            ax.text(j + 0.5, y, cell.text, ha="center", va="center", fontsize=9,
                    fontweight="bold" if cell.bold else "normal")
            if cell.note:
                ax.text(j + 0.5, i + 0.74, cell.note, ha="center", va="center", fontsize=6.5, color=FLAG_COLOUR)
    ax.set_xlim(0, cols)
    ax.set_ylim(rows, 0)
    ax.set_xticks([j + 0.5 for j in range(cols)], [f"{n} GPUs" for n in table.gpu_counts])
    ax.set_yticks([i + 0.5 for i in range(rows)], [layout_text(layout) for layout in table.layouts])
    ax.xaxis.tick_top()
    ax.tick_params(length=0)
    ax.set_ylabel("(TP, CP, PP, MBS)")
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_title(title, fontsize=10, pad=10)
    fits = DEFAULT_THRESHOLD * table.memory_gib
    handles = [
        Patch(facecolor=COLOURS["fits"], label=f"fits: ≤ {fits:g} GiB ({DEFAULT_THRESHOLD:.0%})"),
        Patch(facecolor=COLOURS["tight"], label=f"tight: ≤ {table.memory_gib} GiB"),
        Patch(facecolor=COLOURS["oom"], label=f"oom: > {table.memory_gib} GiB"),
        Patch(fill=False, edgecolor=FLAG_COLOUR, linestyle="--", linewidth=2, label=flag_label),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=8, frameon=False)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=130)
    return atomic_write_bytes(path, buffer.getvalue())


def estimated_cells(table: EstimatedTable) -> dict[tuple, Cell]:
    """Our estimate in every printed cell, coloured by our verdict; misprints framed, with the
    printed value under ours."""
    return {
        (c.paper.layout, c.paper.gpus): Cell(
            c.verdict, f"{c.ours_gib:.2f}", note=f"paper {c.paper.text}" if c.misprint else "", flagged=bool(c.misprint)
        )
        for c in table.cells
    }


def measured_cells(table: MeasuredTable, columns: tuple[ColumnRanking, ...]) -> dict[tuple, Cell]:
    """Measured TFLOP/s (or OOM) coloured by our verdict; the sweep's pick starred, the
    fastest run bold, runs that contradict the 80% rule framed."""
    picks, bests = picks_and_bests(columns)
    cells = {}
    for run in table.runs:
        key = (run.paper.layout, run.paper.gpus)
        text = run.paper.text + (f" {PICK_MARK}" if key in picks else "")
        cells[key] = Cell(run.verdict, text, flagged=run.contradicts_rule, bold=key in bests)
    return cells


def estimated_heatmap(table: EstimatedTable, path: Path) -> Path:
    cells = estimated_cells(table)
    title = f"{table.paper.setup}\nour estimate, GiB per GPU (paper's value where it differs)"
    return _draw(table.paper, cells, title, "misprint in the paper", path)


def measured_heatmap(table: MeasuredTable, columns: tuple[ColumnRanking, ...], path: Path) -> Path:
    cells = measured_cells(table, columns)
    title = (
        f"{table.paper.setup}\nmeasured TFLOP/s per GPU, coloured by our estimate\n"
        f"bold = fastest in the column, {PICK_MARK} = advisor sweep's pick"
    )
    return _draw(table.paper, cells, title, "contradicts the 80% rule", path)
