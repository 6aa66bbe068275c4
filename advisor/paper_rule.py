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
PAPER_VERDICTS: tuple[Verdict, ...] = ("fits", "tight", "oom")
DEFAULT_THRESHOLD = 0.8
"""Section 4.1: no run OOMed at or below 80% of the GPU's memory (``--threshold``'s default)."""


def judged_threshold(memory_model: str, threshold: float) -> float | None:
    """The ``threshold`` a sweep's rows record: the --threshold the paper's rule judged them by,
    so that a saved sweep's reader (``advisor report``) draws and names the line they were judged
    against; None where the calibrated or profile model judged them (its band decides 'fits')."""
    return threshold if memory_model == "paper" else None


def percent(fraction: float) -> str:
    """A --threshold as given, in percent: 80%, 87.5% (not rounded to 88%, a rule it is not)."""
    return f"{round(fraction * 100, 2):g}%"


def classify(total_gib: float, memory_gib: float, threshold: float = DEFAULT_THRESHOLD) -> Verdict:
    if total_gib <= threshold * memory_gib:
        return "fits"
    if total_gib <= memory_gib:
        return "tight"
    return "oom"


def ranking_key(row: SweepRow) -> tuple:
    p = row.parallel
    return rule_key(verdict=row.verdict, recompute=row.options.recompute, tp=p.tp, cp=p.cp, pp=p.pp, mbs=p.mbs,
                    recomputed_layers=row.recomputed_layers, memory_gib=row.estimate.total_gib, vpp=p.vpp)


def rule_key(*, verdict: str | None, recompute: str, tp: int, cp: int, pp: int, mbs: int, recomputed_layers: int,
             memory_gib: float, vpp: int, ep: int = 1) -> tuple:
    """``ranking_key``'s order from the fields themselves (dense rows and MoE rows alike);
    ``memory_gib``: Eq. 18's total for a dense row, the memory its verdict judged for an MoE row
    (``advisor.moe.space``); last, for MoE rows, the smaller EP (1 for dense rows)."""
    return (verdict != "fits", recompute != "none", tp * cp * pp, -mbs, tp, pp, recomputed_layers, memory_gib, cp,
            vpp, ep)
