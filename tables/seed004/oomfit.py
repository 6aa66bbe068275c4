"""The calibrated memory model against the paper's runs: its usage for every run, and the fit.

Fit: the two constants (the allocator's reserve as a fraction of the GPU's memory, the
activations' factor) are chosen on a fixed grid to make the fewest wrong calls on the training
runs, a call that a run fits when it went out of memory counting three times (that error costs a
user a failed launch). Many grid points are often equally right (the H100 runs leave a wide gap
between their largest run that ran and their smallest that did not: 84% and 96% of Eq. 18's
memory), so a tie-break picks one of them (``TIE_BREAKS``): the most conservative, or the
largest margin. Which one is chosen by ``select_tie_break`` on the training runs alone, leaving
one table out at a time. The band of the 'likely' zone is then the largest distance from the
boundary of a training run called wrong (at least 2%), so that every training error falls
inside it.
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


def grid_peaks(runs) -> np.ndarray:
    """Each run's peak stage usage without the reserve, GiB, at every factor of the grid:
    shape (factors, runs)."""
    stages = max(len(r.fixed_gib) for r in runs)
    fixed = np.full((len(runs), stages), -np.inf)
    acts = np.zeros((len(runs), stages))
    for i, r in enumerate(runs):
        fixed[i, :len(r.fixed_gib)] = r.fixed_gib
        acts[i, :len(r.activations_gib)] = r.activations_gib
    return np.max(fixed[None] + FACTOR_GRID[:, None, None] * acts[None], axis=2)


def _grid_ratios(runs) -> np.ndarray:
    """``ratios`` at every (reserve, factor) of the grid at once: shape (reserves, factors, runs)."""
    memory = np.array([r.memory_gib for r in runs])
    return (grid_peaks(runs)[None] + RESERVE_GRID[:, None, None] * memory) / memory


def _errors(r: np.ndarray, oom: np.ndarray) -> tuple[int, int]:
    """(false fits, false OOMs) of the calls ``ratio <= 1`` means it runs."""
    return int(np.sum((r <= 1) & oom)), int(np.sum((r > 1) & ~oom))


def _conservative(reserve: float, factor: float, r: np.ndarray, oom: np.ndarray) -> tuple:
    """The largest predicted usage: the largest reserve, then the factor nearest the prior's."""
    return (-reserve, abs(factor - PRIOR.activation_factor))


def _largest_margin(reserve: float, factor: float, r: np.ndarray, oom: np.ndarray) -> tuple:
    """The boundary farthest from the training runs it calls right (the middle of the gap)."""
    right = (r <= 1) != oom
    margin = float(np.min(np.abs(r[right] - 1))) if right.any() else 0.0
    return (-margin, -reserve, abs(factor - PRIOR.activation_factor))


TIE_BREAKS = {"conservative": _conservative, "largest margin": _largest_margin}
"""Among grid points with equally few (weighted) wrong calls on the training runs, which one.
Listed in the order that decides a tie of ``select_tie_break`` itself: the conservative one
first, because a false "fits" is the costlier error (``FALSE_FITS_WEIGHT``)."""


def fit_memory(runs, label: str = "", tie_break: str = "conservative") -> MemoryCalibration:
    """The constants fitted to ``runs`` (see the module docstring)."""
    oom = np.array([x.oom for x in runs])
    prefer = TIE_BREAKS[tie_break]
    best = None
    grid = _grid_ratios(runs)
    for i, reserve in enumerate(RESERVE_GRID):
        for j, factor in enumerate(FACTOR_GRID):
            r = grid[i, j]
            false_fits, false_oom = _errors(r, oom)
            key = (FALSE_FITS_WEIGHT * false_fits + false_oom, *prefer(float(reserve), float(factor), r, oom))
            if best is None or key < best[0]:
                best = (key, float(reserve), float(factor), r)
    _, reserve, factor, r = best
    wrong = (r <= 1) == oom
    band = max(MIN_BAND, float(np.max(np.abs(r[wrong] - 1))) if wrong.any() else 0.0)
    return MemoryCalibration(
        reserve_fraction=reserve, activation_factor=factor, band=round(band + 1e-4, 4),
        fitted=("reserve_fraction", "activation_factor", "band"),
        fitted_on=(label or f"{len(runs)} runs") + f"; tie-break: {tie_break}",
    )


def select_tie_break(runs_by_table: dict[int, tuple[MemoryRun, ...]]) -> tuple[str, dict[str, tuple[int, int]]]:
    """The tie-break chosen on training runs only: leave one table out, fit on the others with
    each tie-break, call the left-out table's runs; the fewest weighted wrong calls over all the
    folds wins, then the fewest false fits, then ``TIE_BREAKS``' order. Returns the name and,
    per tie-break, (false fits, false OOMs) summed over the folds."""
    scores = {}
    for name in TIE_BREAKS:
        false_fits = false_oom = 0
        for table, held in runs_by_table.items():
            rest = [r for t, runs in runs_by_table.items() if t != table for r in runs]
            cal = fit_memory(rest, tie_break=name)
            ff, fo = _errors(ratios(held, cal.reserve_fraction, cal.activation_factor),
                             np.array([x.oom for x in held]))
            false_fits, false_oom = false_fits + ff, false_oom + fo
        scores[name] = (false_fits, false_oom)
    order = list(TIE_BREAKS)
    chosen = min(order, key=lambda n: (FALSE_FITS_WEIGHT * scores[n][0] + scores[n][1], scores[n][0], order.index(n)))
    return chosen, scores
