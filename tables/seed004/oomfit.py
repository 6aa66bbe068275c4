"""The calibrated memory model against the paper's runs: its usage for every run, and the fit.

Fit: the two constants (the allocator's reserve as a fraction of the GPU's memory, the
activations' factor) are
chosen on a fixed grid to make the fewest wrong calls on the training runs, a call that a run
fits when it went out of memory counting three times (that error costs a user a failed
launch); among equals, the most conservative (the largest reserve, then the factor nearest 1).
The training side often leaves a wide gap between its largest run that ran and its smallest
that did not (the H100 runs: 84% and 96% of Eq. 18's memory); the conservative end of it is the
one that keeps false "fits" rare on the other GPU. The band of the 'likely' zone is
then the largest distance from the boundary of a training run called wrong (at least 2%), so
that every training error falls inside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from advisor.models import load_model
from advisor.verdicts import MemoryCalibration, calibrated_stage_bytes
from advisor.memory import GIB, MemoryOptions

RESERVE_GRID = np.round(np.arange(0.0, 0.2001, 0.005), 3)
FACTOR_GRID = np.round(np.arange(0.90, 1.3001, 0.01), 2)
FALSE_FITS_WEIGHT = 3
MIN_BAND = 0.02
PRIOR = MemoryCalibration()


@dataclass(frozen=True, slots=True)
class MemoryRun:
    """One of the 454 runs with the numbers the memory model needs."""

    run: object
    """``reality.Run``: the table, the paper's cell and the swept row (Eq. 18)."""
    memory_gib: float
    states_gib: float
    fixed_gib: tuple[float, ...]
    """Per stage: model states and everything that does not scale with the fitted factor, GiB."""
    activations_gib: tuple[float, ...]

    @property
    def oom(self) -> bool:
        return self.run.outcome == "OOM"

    def usage_gib(self, reserve: float, factor: float) -> float:
        return max(f + factor * a for f, a in zip(self.fixed_gib, self.activations_gib)) + reserve * self.memory_gib


@lru_cache(maxsize=None)
def _spec(model: str):
    return load_model(model)


def memory_runs(measured_tables) -> tuple[MemoryRun, ...]:
    """Every run of the measured tables, decomposed once so that fits are fast: the calibrated
    usage is linear in the two constants per stage."""
    out = []
    for table in measured_tables:
        paper = table.paper
        spec = _spec(paper.model)
        for run in table.runs:
            tp, cp, pp, mbs = run.paper.layout
            est = run.row.estimate
            # Evaluate the per-stage terms at (overhead 0, factor 0) and (overhead 0, factor 1).
            at0 = calibrated_stage_bytes(est, spec, paper.seq_len, mbs, tp, cp, MemoryOptions(),
                                         MemoryCalibration(reserve_fraction=0.0, activation_factor=0.0), paper.memory_gib)
            at1 = calibrated_stage_bytes(est, spec, paper.seq_len, mbs, tp, cp, MemoryOptions(),
                                         MemoryCalibration(reserve_fraction=0.0, activation_factor=1.0), paper.memory_gib)
            out.append(MemoryRun(
                run=run, memory_gib=paper.memory_gib, states_gib=est.model_states_gib,
                fixed_gib=tuple(x / GIB for x in at0),
                activations_gib=tuple((b - a) / GIB for a, b in zip(at0, at1)),
            ))
    return tuple(out)


def ratios(runs, reserve: float, factor: float) -> np.ndarray:
    return np.array([r.usage_gib(reserve, factor) / r.memory_gib for r in runs])


def _score(runs, reserve, factor):
    r = ratios(runs, reserve, factor)
    oom = np.array([x.oom for x in runs])
    false_fits = int(np.sum((r <= 1) & oom))
    false_oom = int(np.sum((r > 1) & ~oom))
    # Among equally wrong constants, the most conservative: the largest predicted usage.
    return (FALSE_FITS_WEIGHT * false_fits + false_oom, -reserve, abs(factor - PRIOR.activation_factor)), r, oom


def fit_memory(runs, label: str = "") -> MemoryCalibration:
    """The constants fitted to ``runs`` (see the module docstring)."""
    best = None
    for reserve in RESERVE_GRID:
        for factor in FACTOR_GRID:
            key, r, oom = _score(runs, float(reserve), float(factor))
            if best is None or key < best[0]:
                best = (key, float(reserve), float(factor), r, oom)
    _, reserve, factor, r, oom = best
    wrong = (r <= 1) == oom
    band = max(MIN_BAND, float(np.max(np.abs(r[wrong] - 1))) if wrong.any() else 0.0)
    return MemoryCalibration(
        reserve_fraction=reserve, activation_factor=factor, band=round(band + 1e-4, 4),
        fitted=("reserve_fraction", "activation_factor", "band"), fitted_on=label or f"{len(runs)} runs",
    )
