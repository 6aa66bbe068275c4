"""Which layout first: the fastest one expected to run, the leanest, or the paper's rule.

``rank_by``:
- ``throughput``: among the rows expected to run (``fits`` and ``likely fits``; with the paper's
  memory model ``fits`` and ``tight``), the highest predicted TFLOP/s per GPU first (for a given
  GPU count that is the shortest step); ties by the paper's rule.
- ``memory``: the most headroom first (lowest predicted usage).
- ``paper``: seed 004, Section 4.2's rule as ``advisor.sweep.ranking_key`` implements it.
Rows not expected to run are never ranked.
"""

from __future__ import annotations

from typing import Callable, Literal, Sequence, TypeVar

from advisor.errors import AdvisorError
from advisor.verdicts import EXPECTED_TO_RUN

RankBy = Literal["throughput", "memory", "paper"]
RANK_BY: tuple[RankBy, ...] = ("throughput", "memory", "paper")

Row = TypeVar("Row")


def expected_to_run(verdict: str | None) -> bool:
    return verdict in EXPECTED_TO_RUN


def order(
    rows: Sequence[Row],
    rank_by: RankBy,
    *,
    verdict: Callable[[Row], str | None],
    paper_key: Callable[[Row], tuple],
    tflops: Callable[[Row], float | None] = lambda row: None,
    usage_gib: Callable[[Row], float] = lambda row: 0.0,
) -> list[Row]:
    """The rows expected to run, best first. Accessors keep this independent of the row type."""
    if rank_by not in RANK_BY:
        raise AdvisorError(f"--rank-by must be one of {', '.join(RANK_BY)}, got {rank_by!r}")
    survivors = [row for row in rows if expected_to_run(verdict(row))]
    if rank_by == "paper":
        return sorted(survivors, key=paper_key)
    if rank_by == "memory":
        return sorted(survivors, key=lambda row: (usage_gib(row), paper_key(row)))
    if any(tflops(row) is None for row in survivors):
        raise AdvisorError("ranking by throughput needs a GPU preset (--gpu NAME) for the time model")
    return sorted(survivors, key=lambda row: (-tflops(row), paper_key(row)))
