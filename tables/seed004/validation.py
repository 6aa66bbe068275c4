"""Issue 16's validation: the calibrated verdicts, the time model and the ranking against the
paper's 454 runs, every number from constants fitted on the *other* GPU type.

Two directions: fit on the A100 runs (Tables 3, 6) and predict the H100 runs (Tables 4, 10, 11),
and the reverse; "combined" pools the two held-out halves, so every one of the 454 runs is
predicted by a model that never saw its GPU type. The fits are ``timing.fit`` (time) and
``oomfit.fit_memory`` (memory); the ranking among a column's runs is ``advisor.ranking.order``.

Two procedure choices are made per direction on its training runs alone, by leaving one of
their tables out at a time (``fit_on``): the memory fit's tie-break (``oomfit.select_tie_break``)
and the ranking rule (``select_rank_by``). ``python -m tables.seed004.calibrate`` makes them the
same way on all runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from statistics import fmean

import numpy as np
from scipy.stats import spearmanr

from advisor.ranking import RANK_BY, order, simplicity_key
from advisor.paper_rule import ranking_key
from advisor.throughput import Calibration
from advisor.verdicts import CALIBRATED_VERDICTS, MemoryCalibration, verdict_for
from tables.seed004 import oomfit, timing
from tables.seed004.reality import Run

GPUS = ("A100-40GB", "H100-94GB")
TIGHT = (0.8, 1.0)
"""The paper's tight band of Eq. 18's memory fraction."""
MAPE_TABLES = (3, 4, 6, 10)


@dataclass(frozen=True, slots=True)
class Fit:
    """Constants fitted on some runs, and the procedure choices those runs alone made."""

    time: Calibration
    memory: MemoryCalibration
    tie_break: str
    tie_break_scores: tuple[tuple[str, tuple[int, int]], ...]
    """Per tie-break: (false fits, false OOMs) on the left-out tables."""
    rank_by: str
    rank_by_scores: tuple[tuple[str, tuple[float, float]], ...]
    """Per ranking rule: (mean, min) of the pick's fraction of the best, on the left-out tables."""


@dataclass(frozen=True, slots=True)
class Direction:
    """Constants fitted on one GPU type's runs."""

    train: str
    test: str
    fit: Fit

    @property
    def time(self) -> Calibration:
        return self.fit.time

    @property
    def memory(self) -> MemoryCalibration:
        return self.fit.memory

    @property
    def rank_by(self) -> str:
        return self.fit.rank_by

    @property
    def name(self) -> str:
        return f"{self.train.split('-')[0]} -> {self.test.split('-')[0]}"


@dataclass(frozen=True, slots=True)
class Prediction:
    """One run as the model fitted on the other GPU type sees it."""

    run: Run
    direction: Direction | None
    """None inside a selection fold (``select_rank_by``)."""
    usage_gib: float
    verdict: str
    tflops: float

    @property
    def ran(self) -> bool:
        return self.run.outcome == "ran"

    @property
    def called_to_run(self) -> bool:
        return self.verdict in ("fits", "likely fits")

    @property
    def correct(self) -> bool:
        return self.called_to_run == self.ran

    @property
    def tight(self) -> bool:
        return TIGHT[0] < self.run.row.memory_fraction <= TIGHT[1]

    @property
    def key(self) -> tuple:
        return (self.run.table.number, self.run.paper.layout, self.run.paper.gpus)

    def describe(self) -> str:
        tp, cp, pp, mbs = self.run.paper.layout
        return (f"Table {self.run.table.number}, ({tp}, {cp}, {pp}, {mbs}) on {self.run.paper.gpus} GPUs: "
                f"{self.verdict} ({self.usage_gib:.1f} of {self.run.table.memory_gib} GiB, "
                f"margin {self.run.table.memory_gib - self.usage_gib:+.1f} GiB), {self.run.outcome}")


def fit_on(measured_tables, label: str) -> Fit:
    """Fit the constants on ``measured_tables`` and make the procedure choices on them alone."""
    tie_break, tie_scores = oomfit.select_tie_break({t.paper.number: oomfit.memory_runs([t]) for t in measured_tables})
    rank_by, rank_scores = select_rank_by(measured_tables, tie_break)
    return Fit(
        time=timing.fit(timing.timed_runs(measured_tables), label=f"{label} that ran"),
        memory=oomfit.fit_memory(oomfit.memory_runs(measured_tables), label=label, tie_break=tie_break),
        tie_break=tie_break, tie_break_scores=tuple(tie_scores.items()),
        rank_by=rank_by, rank_by_scores=tuple(rank_scores.items()),
    )


def select_rank_by(measured_tables, tie_break: str) -> tuple[str, dict[str, tuple[float, float]]]:
    """The ranking rule chosen on ``measured_tables`` alone: leave one table out, fit the time and
    memory constants on the others, rank each column of the left-out table by every rule; the
    highest mean fraction of the column's best over all left-out columns wins, then the highest
    minimum, then ``RANK_BY``'s order. Returns the rule and, per rule, (mean, min)."""
    fractions: dict[str, list[float]] = {rule: [] for rule in RANK_BY}
    for held in measured_tables:
        rest = [t for t in measured_tables if t is not held]
        time = timing.fit(timing.timed_runs(rest))
        memory = oomfit.fit_memory(oomfit.memory_runs(rest), tie_break=tie_break)
        predictions = predict([held], time, memory)
        for rule in RANK_BY:
            fractions[rule] += [c.fraction for c in column_picks(predictions, rule) if c.fraction is not None]
    scores = {rule: (fmean(f), min(f)) for rule, f in fractions.items()}
    order_ = list(RANK_BY)
    return min(order_, key=lambda r: (-scores[r][0], -scores[r][1], order_.index(r))), scores


def fit_direction(measured_tables, train: str, test: str) -> Direction:
    runs = [t for t in measured_tables if t.paper.gpu == train]
    return Direction(train=train, test=test, fit=fit_on(runs, label=f"the {train} runs"))


def predict(tables, time: Calibration, memory: MemoryCalibration, direction: Direction | None = None) -> list[Prediction]:
    """Every run of ``tables`` as the constants ``time`` and ``memory`` see it."""
    memory_runs = oomfit.memory_runs(tables)
    timed = [timing.TimedRun(t.paper.number, t.paper.gpu, t.paper.model, t.paper.seq_len, *r.paper.layout,
                             r.paper.gpus, r.tflops) for t in tables for r in t.runs]
    tflops = timing.predict(timed, time)
    out = []
    for mr, predicted in zip(memory_runs, tflops):
        usage = mr.usage_gib(memory.reserve_fraction, memory.activation_factor)
        out.append(Prediction(run=mr.run, direction=direction, usage_gib=usage,
                              verdict=verdict_for(usage, mr.memory_gib, memory.band), tflops=float(predicted)))
    return out


def predict_direction(measured_tables, direction: Direction) -> list[Prediction]:
    tables = [t for t in measured_tables if t.paper.gpu == direction.test]
    return predict(tables, direction.time, direction.memory, direction)


@dataclass(frozen=True, slots=True)
class ColumnPick:
    """One measured column ranked by one rule."""

    table: int
    gpus: int
    rank_by: str
    pick: Prediction | None
    best: Prediction | None

    @property
    def fraction(self) -> float | None:
        if self.best is None or self.pick is None:
            return None if self.best is None else 0.0
        return (self.pick.run.tflops if self.pick.ran else 0.0) / self.best.run.tflops


def column_picks(predictions: list[Prediction], rank_by: str, tolerance: float = 0.0) -> list[ColumnPick]:
    columns: dict[tuple, list[Prediction]] = {}
    for p in predictions:
        columns.setdefault((p.run.table.number, p.run.paper.gpus), []).append(p)
    picks = []
    for (table, gpus), column in sorted(columns.items()):
        ranked = order(column, rank_by, verdict=lambda p: p.verdict, paper_key=lambda p: ranking_key(p.run.row),
                       tflops=lambda p: p.tflops, usage_gib=lambda p: p.usage_gib, tolerance=tolerance,
                       simplicity=lambda p: simplicity_key(p.run.row))
        ran = [p for p in column if p.ran]
        picks.append(ColumnPick(table, gpus, rank_by, ranked[0] if ranked else None,
                                max(ran, key=lambda p: p.run.tflops) if ran else None))
    return picks


ORDERED_SHARE = 0.9
"""The share of held-out pairs a gap must order right to count as a real difference."""


def ordered_pairs(predictions: list[Prediction]) -> list[tuple[float, bool]]:
    """(relative gap in predicted TFLOP/s |a - b| / max(a, b), ordered as measured) of every pair
    of runs in one column that both ran with different measured speeds, smallest gap first."""
    columns: dict[tuple, list[Prediction]] = {}
    for p in predictions:
        if p.ran:
            columns.setdefault((p.run.table.number, p.run.paper.gpus), []).append(p)
    pairs = []
    for column in columns.values():
        for i, a in enumerate(column):
            for b in column[i + 1:]:
                if a.run.tflops != b.run.tflops:
                    pairs.append((abs(a.tflops - b.tflops) / max(a.tflops, b.tflops),
                                  (a.tflops - b.tflops) * (a.run.tflops - b.run.tflops) > 0))
    return sorted(pairs)


def ordering_tolerance(predictions: list[Prediction], share: float = ORDERED_SHARE) -> dict:
    """The ranking's tolerance: the smallest relative gap g in predicted TFLOP/s such that, for g
    and every larger pair's gap g', at least ``share`` of the held-out pairs whose predicted gap
    lies in [g', 2 g') are ordered as measured (``ordered_pairs``). A band of a factor of two,
    not every pair above g: the many pairs far apart, almost all right, would hide that close
    ones are a coin toss. Returns ``advisor/calibration.json``'s ``ranking`` section."""
    pairs = ordered_pairs(predictions)
    gaps = np.array([gap for gap, _ in pairs])
    right = np.r_[0, np.cumsum([ok for _, ok in pairs])]
    start = np.arange(len(pairs))
    end = np.maximum(np.searchsorted(gaps, 2 * gaps, side="left"), start + 1)  # the band [g, 2g) of each gap g
    shares = (right[end] - right[start]) / (end - start)
    failing = np.flatnonzero(shares < share)
    first = failing[-1] + 1 if failing.size else 0
    tolerance = gaps[first] if first < len(pairs) else gaps[-1]
    return {"tolerance": round(float(tolerance), 4), "share": share, "pairs": len(pairs),
            "pairs_at_or_above": int(len(pairs) - first),
            "computed": "tables/seed004/validation.py ordering_tolerance: the smallest relative gap in predicted "
                        "TFLOP/s from which every band [g, 2g) of held-out pairs (runs of one column that both ran, "
                        "each predicted by the constants fitted on the other GPU type) is ordered right at least "
                        f"{share:.0%} of the time"}


def spearman_by_column(predictions: list[Prediction]) -> list[tuple[tuple, float]]:
    """Within-column Spearman of predicted vs measured TFLOP/s over the runs that ran (columns
    with at least three distinct measurements)."""
    columns: dict[tuple, list[Prediction]] = {}
    for p in predictions:
        if p.ran:
            columns.setdefault((p.run.table.number, p.run.paper.gpus), []).append(p)
    out = []
    for key, column in sorted(columns.items()):
        measured = [p.run.tflops for p in column]
        if len(column) >= 3 and len(set(measured)) > 1:
            out.append((key, float(spearmanr([p.tflops for p in column], measured).statistic)))
    return out


def mape(predictions: list[Prediction], tables) -> float | None:
    errors = [abs(p.tflops / p.run.tflops - 1) for p in predictions if p.ran and p.run.table.number in tables]
    return fmean(errors) if errors else None


@dataclass(frozen=True)
class Validation:
    directions: tuple[Direction, ...]
    predictions: tuple[Prediction, ...]
    """All 454 runs, each from the direction that held its GPU type out."""

    def of(self, direction: Direction | None = None) -> list[Prediction]:
        return [p for p in self.predictions if direction is None or p.direction is direction]

    @cached_property
    def false_fits(self) -> list[Prediction]:
        return [p for p in self.predictions if p.called_to_run and not p.ran]

    def confusion(self, predictions: list[Prediction]) -> dict[str, dict[str, int]]:
        return {v: {o: sum(p.verdict == v and p.run.outcome == o for p in predictions) for o in ("ran", "OOM")}
                for v in CALIBRATED_VERDICTS}

    def picks(self, rank_by: str, direction: Direction | None = None, tolerance: float = 0.0) -> list[ColumnPick]:
        return column_picks(self.of(direction), rank_by, tolerance)

    @cached_property
    def tolerance(self) -> dict:
        """The ranking's tolerance over all held-out predictions (``ordering_tolerance``)."""
        return ordering_tolerance(list(self.predictions))

    def selected_picks(self, direction: Direction | None = None) -> list[ColumnPick]:
        """Each direction's columns ranked by the rule its training side chose."""
        return [c for d in self.directions if direction in (None, d) for c in self.picks(d.rank_by, d)]

    @staticmethod
    def summary(picks: list[ColumnPick]) -> tuple[float, float, int]:
        scored = [p.fraction for p in picks if p.fraction is not None]
        return fmean(scored), min(scored), len(scored)


def validate(measured_tables) -> Validation:
    a, h = GPUS
    directions = (fit_direction(measured_tables, a, h), fit_direction(measured_tables, h, a))
    predictions = tuple(p for d in directions for p in predict_direction(measured_tables, d))
    return Validation(directions=directions, predictions=predictions)


__all__ = ["RANK_BY", "Fit", "Validation", "fit_on", "validate", "spearman_by_column", "mape", "MAPE_TABLES"]
