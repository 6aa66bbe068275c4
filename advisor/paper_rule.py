"""Seed 004's verdicts and ranking rule, without a time model (Sections 4.1 and 4.2).

Verdicts: ``fits`` at most threshold x memory (80%: no run OOMed there), ``tight`` above it and
up to the memory, ``oom`` above the memory. The ranking key orders the rows the way
``advisor.sweep``'s docstring lists (fits first, no recomputation first, the smallest
TP x CP x PP, the larger MBS, ...). Both ``advisor.sweep`` (which builds the rows) and
``advisor.ranking`` (which orders them) use it, so it lives apart from both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from advisor.sweep import SweepRow

Verdict = Literal["fits", "tight", "oom"]
"""The paper's verdicts; the calibrated memory model's are ``advisor.verdicts.CalibratedVerdict``."""
DEFAULT_THRESHOLD = 0.8


def classify(total_gib: float, memory_gib: float, threshold: float = DEFAULT_THRESHOLD) -> Verdict:
    if total_gib <= threshold * memory_gib:
        return "fits"
    if total_gib <= memory_gib:
        return "tight"
    return "oom"


def ranking_key(row: SweepRow) -> tuple:
    p = row.parallel
    return (row.verdict != "fits", row.options.recompute != "none", p.model_parallel_size, -p.mbs, p.tp, p.pp,
            row.recomputed_layers, row.estimate.total_gib, p.cp, p.vpp)
