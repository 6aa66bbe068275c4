"""Everything the seed-004 reproduction computes, in one value (no files written here)."""

from __future__ import annotations

from dataclasses import dataclass

from tables.seed004.estimates import EstimatedTable, reproduce
from tables.seed004.paper import ESTIMATE_OF, Misprint, PaperTable, load_misprints, load_tables
from tables.seed004.reality import RankingSummary, RuleCheck, Run, check_rule, rank_columns, runs
from tables.seed004.validation import Validation, validate


@dataclass(frozen=True, kw_only=True, slots=True)
class MeasuredTable:
    paper: PaperTable
    estimate_table: int
    """The estimated table whose colours it carries (Table 3 <-> 2, ...)."""
    runs: tuple[Run, ...]

    def run(self, layout, gpus: int) -> Run | None:
        for run in self.runs:
            if run.paper.layout == layout and run.paper.gpus == gpus:
                return run
        return None


@dataclass(frozen=True, kw_only=True, slots=True)
class Results:
    estimated: tuple[EstimatedTable, ...]
    measured: tuple[MeasuredTable, ...]
    rule: RuleCheck
    ranking: RankingSummary
    listed_misprints: dict[tuple, Misprint]
    measured_cells: int
    """Measured cells in the CSV, '-' (no such run) included."""
    validation: Validation | None = None
    """Issue 16: the time model, the calibrated verdicts and the ranking, held out by GPU type."""

    @property
    def found_misprints(self) -> set[tuple]:
        """(table, layout, GPUs) of every printed estimate that disagrees with ours."""
        return {cell.misprint.key for table in self.estimated for cell in table.misprints}

    @property
    def listed_but_agreeing(self) -> set[tuple]:
        return set(self.listed_misprints) - self.found_misprints

    @property
    def found_without_evidence(self) -> set[tuple]:
        return self.found_misprints - set(self.listed_misprints)


def analyse(with_validation: bool = False) -> Results:
    tables = load_tables()
    listed = load_misprints()
    estimated = tuple(reproduce(t, listed) for t in tables.values() if t.kind == "estimate")
    measured = tuple(
        MeasuredTable(paper=t, estimate_table=ESTIMATE_OF[t.number], runs=runs(t))
        for t in tables.values()
        if t.kind == "measured_tflops"
    )
    all_runs = tuple(run for table in measured for run in table.runs)
    columns = tuple(column for table in measured for column in rank_columns(table.paper, table.runs))
    return Results(
        estimated=estimated,
        measured=measured,
        rule=check_rule(all_runs),
        ranking=RankingSummary(columns=columns),
        listed_misprints=listed,
        measured_cells=sum(t.paper.grid_cells for t in measured),
        validation=validate(measured) if with_validation else None,
    )
