"""The advisor's verdicts and ranking against the paper's real runs (Tables 3, 4, 6, 10, 11).

The 80% rule (seed 004, Section 4.1): a run estimated at most 80% of GPU memory ("fits") never
ran out of memory. The ranking (Section 4.2, as ``advisor.sweep`` implements it): its first
choice among the configurations the paper ran should be the fastest one, or close to it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from statistics import fmean

from advisor.paper_rule import Verdict
from advisor.sweep import SweepRow
from tables.seed004.estimates import swept_row
from tables.seed004.paper import PaperCell, PaperTable

VERDICTS: tuple[Verdict, ...] = ("fits", "tight", "oom")
OUTCOMES = ("ran", "OOM")


@dataclass(frozen=True, kw_only=True, slots=True)
class Run:
    """One real training run of the paper, with our verdict and sweep rank for its layout."""

    table: PaperTable
    paper: PaperCell
    row: SweepRow

    @property
    def outcome(self) -> str:
        return "OOM" if self.paper.oom else "ran"

    @property
    def tflops(self) -> float:
        """Measured TFLOP/s per GPU; a run that ran out of memory delivered 0."""
        return 0.0 if self.paper.oom else self.paper.value  # type: ignore[return-value]

    @property
    def verdict(self) -> Verdict:
        return self.row.verdict

    @property
    def contradicts_rule(self) -> bool:
        """'fits' that ran out of memory, or 'oom' that ran."""
        return (self.verdict, self.outcome) in (("fits", "OOM"), ("oom", "ran"))

    def to_dict(self) -> dict:
        tp, cp, pp, mbs = self.paper.layout
        return {
            "table": self.table.number, "tp": tp, "cp": cp, "pp": pp, "mbs": mbs, "gpus": self.paper.gpus,
            "measured": self.paper.text, "outcome": self.outcome,
            "ours_gib": round(self.row.estimate.total_gib, 4),
            "memory_fraction": round(self.row.memory_fraction, 4),
            "verdict": self.verdict, "sweep_rank": self.row.rank,
        }


def runs(table: PaperTable) -> tuple[Run, ...]:
    """Every printed cell of a measured table, in the paper's order."""
    return tuple(Run(table=table, paper=cell, row=swept_row(table, cell.layout, cell.gpus)) for cell in table.cells)


@dataclass(frozen=True, kw_only=True, slots=True)
class RuleCheck:
    """Our verdict x the real outcome, over every run."""

    counts: dict[tuple[Verdict, str], int]
    fits_that_oomed: tuple[Run, ...]
    oom_that_ran: tuple[Run, ...]

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def count(self, verdict: Verdict, outcome: str | None = None) -> int:
        return sum(n for (v, o), n in self.counts.items() if v == verdict and outcome in (None, o))

    @property
    def tight_ran_fraction(self) -> float | None:
        tight = self.count("tight")
        return self.count("tight", "ran") / tight if tight else None

    def to_dict(self) -> dict:
        return {
            "runs": self.total,
            "counts": {v: {o: self.count(v, o) for o in OUTCOMES} for v in VERDICTS},
            "fits_never_ooms": not self.fits_that_oomed,
            "oom_never_runs": not self.oom_that_ran,
            "tight_ran_fraction": self.tight_ran_fraction,
            "exceptions": [run.to_dict() for run in self.fits_that_oomed + self.oom_that_ran],
        }


def check_rule(all_runs: tuple[Run, ...]) -> RuleCheck:
    counts = Counter((run.verdict, run.outcome) for run in all_runs)
    return RuleCheck(
        counts={(v, o): counts[(v, o)] for v in VERDICTS for o in OUTCOMES},
        fits_that_oomed=tuple(r for r in all_runs if r.verdict == "fits" and r.outcome == "OOM"),
        oom_that_ran=tuple(r for r in all_runs if r.verdict == "oom" and r.outcome == "ran"),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class ColumnRanking:
    """One measured column: the sweep's first choice among the runs there, against the best."""

    table: PaperTable
    gpus: int
    runs: tuple[Run, ...]

    @property
    def pick(self) -> Run | None:
        """The run of the best-ranked layout; None when the sweep ranks none of them (all oom)."""
        ranked = [run for run in self.runs if run.row.rank is not None]
        return min(ranked, key=lambda run: run.row.rank) if ranked else None

    @property
    def best(self) -> Run | None:
        """The fastest run; None when every run went out of memory."""
        ran = [run for run in self.runs if run.outcome == "ran"]
        return max(ran, key=lambda run: run.tflops) if ran else None

    @property
    def fraction(self) -> float | None:
        """Pick's TFLOP/s over the best's; None when nothing ran or nothing is ranked."""
        if self.pick is None or self.best is None:
            return None
        return self.pick.tflops / self.best.tflops

    def to_dict(self) -> dict:
        pick, best = self.pick, self.best
        return {
            "table": self.table.number, "gpu": self.table.gpu, "model": self.table.model,
            "seq_len": self.table.seq_len, "gpus": self.gpus,
            "pick": list(pick.paper.layout) if pick else None,
            "pick_rank": pick.row.rank if pick else None,
            "pick_verdict": pick.verdict if pick else None,
            "pick_measured": pick.paper.text if pick else None,
            "best": list(best.paper.layout) if best else None,
            "best_tflops": best.tflops if best else None,
            "fraction": self.fraction,
        }


def picks_and_bests(columns: tuple[ColumnRanking, ...]) -> tuple[set, set]:
    """(layout, GPUs) of the sweep's pick, and of the fastest run, of every column."""
    picks = {(c.pick.paper.layout, c.gpus) for c in columns if c.pick}
    bests = {(c.best.paper.layout, c.gpus) for c in columns if c.best}
    return picks, bests


def rank_columns(table: PaperTable, table_runs: tuple[Run, ...]) -> tuple[ColumnRanking, ...]:
    return tuple(
        ColumnRanking(table=table, gpus=gpus, runs=tuple(r for r in table_runs if r.paper.gpus == gpus))
        for gpus in table.gpu_counts
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class RankingSummary:
    columns: tuple[ColumnRanking, ...]

    @property
    def scored(self) -> tuple[ColumnRanking, ...]:
        return tuple(column for column in self.columns if column.fraction is not None)

    @property
    def mean(self) -> float:
        return fmean(column.fraction for column in self.scored)

    @property
    def minimum(self) -> float:
        return min(column.fraction for column in self.scored)

    def to_dict(self) -> dict:
        return {
            "columns": len(self.columns), "scored_columns": len(self.scored),
            "mean_fraction": self.mean, "min_fraction": self.minimum,
            "per_column": [column.to_dict() for column in self.columns],
        }
