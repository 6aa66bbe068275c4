"""Our estimate of every printed cell, from ``advisor.sweep``, and the misprints it exposes.

A printed estimate is a misprint when it differs from ours by more than 0.01 GiB: the paper
prints two decimals, so a correct cell is within 0.005 of the exact value. The set is found
by this comparison; ``seed004_misprints.csv`` only supplies the evidence for each cell.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from advisor.errors import AdvisorError
from advisor.models import load_model
from advisor.parallel import Workload
from advisor.space import PAPER_SPACE
from advisor.paper_rule import Verdict, classify
from advisor.sweep import SweepRow, sweep
from tables.seed004.paper import Layout, Misprint, PaperCell, PaperTable

TOLERANCE_GIB = 0.01
MISSING_EVIDENCE = "not in seed004_misprints.csv: no evidence on file"


@lru_cache(maxsize=None)
def column_sweep(model: str, seq_len: int, gpus: int, memory_gib: float) -> dict[Layout, SweepRow]:
    """``advisor sweep --all --split even --recompute none`` (the paper's space: Megatron's even
    split, no recomputation) for one column of a table (the paper's global batch, 1024)."""
    rows = sweep(load_model(model), Workload(seq_len=seq_len), gpus, memory_gib, space=PAPER_SPACE).rows
    return {(r.parallel.tp, r.parallel.cp, r.parallel.pp, r.parallel.mbs): r for r in rows}


def swept_row(table: PaperTable, layout: Layout, gpus: int) -> SweepRow:
    rows = column_sweep(table.model, table.seq_len, gpus, table.memory_gib)
    if layout not in rows:
        raise AdvisorError(f"table {table.number}: advisor sweep has no layout {layout} on {gpus} GPUs")
    return rows[layout]


@dataclass(frozen=True, kw_only=True, slots=True)
class EstimatedCell:
    """One printed estimate next to ours."""

    paper: PaperCell
    row: SweepRow
    misprint: Misprint | None = None
    """Set when ours and the printed value differ by more than TOLERANCE_GIB."""

    @property
    def ours_gib(self) -> float:
        return self.row.estimate.total_gib

    @property
    def printed_gib(self) -> float:
        return self.paper.value  # type: ignore[return-value]  # estimates are never OOM

    @property
    def difference_gib(self) -> float:
        return self.ours_gib - self.printed_gib

    @property
    def verdict(self) -> Verdict:
        return self.row.verdict

    @property
    def printed_verdict(self) -> Verdict:
        """The colour the printed value takes under the paper's 80% rule."""
        return classify(self.printed_gib, self.row.memory_gib)

    def to_dict(self, table: int) -> dict:
        tp, cp, pp, mbs = self.paper.layout
        return {
            "table": table, "tp": tp, "cp": cp, "pp": pp, "mbs": mbs, "gpus": self.paper.gpus,
            "ours_gib": round(self.ours_gib, 4), "paper_gib": self.paper.text,
            "difference_gib": round(self.difference_gib, 4),
            "memory_fraction": round(self.row.memory_fraction, 4),
            "verdict": self.verdict, "paper_verdict": self.printed_verdict,
            "misprint": self.misprint is not None,
            "evidence": self.misprint.evidence if self.misprint else "",
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class EstimatedTable:
    paper: PaperTable
    cells: tuple[EstimatedCell, ...]

    def cell(self, layout: Layout, gpus: int) -> EstimatedCell | None:
        for cell in self.cells:
            if cell.paper.layout == layout and cell.paper.gpus == gpus:
                return cell
        return None

    @property
    def misprints(self) -> tuple[EstimatedCell, ...]:
        return tuple(cell for cell in self.cells if cell.misprint)

    @property
    def largest_agreeing_difference_gib(self) -> float:
        return max(abs(cell.difference_gib) for cell in self.cells if not cell.misprint)


def reproduce(table: PaperTable, listed: dict[tuple, Misprint]) -> EstimatedTable:
    """Every printed cell of an estimated table next to our value; misprints flagged."""
    if table.kind != "estimate":
        raise AdvisorError(f"table {table.number} is not an estimated table")
    cells = []
    for paper in table.cells:
        row = swept_row(table, paper.layout, paper.gpus)
        misprint = None
        if abs(row.estimate.total_gib - paper.value) > TOLERANCE_GIB:
            key = (table.number, paper.layout, paper.gpus)
            misprint = listed.get(key) or Misprint(
                table=table.number, layout=paper.layout, gpus=paper.gpus,
                printed=paper.value, evidence=MISSING_EVIDENCE,
            )
        cells.append(EstimatedCell(paper=paper, row=row, misprint=misprint))
    return EstimatedTable(paper=table, cells=tuple(cells))
