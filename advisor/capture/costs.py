"""Stage-cost tables: what a predictor hands the planners.

``CostTable.values[j - 1, l, r]`` is the predicted per-GPU bytes of a stage that holds units
l..r (1-based, inclusive; a unit is a layer, or a merged group) and is the j-th stage from the
end of the pipeline (j = 1: the last stage). Under 1F1B such a stage holds min(j, m)
microbatches (``layout.in_flight_microbatches`` with p - i = j), and whether it is the first
stage (l = 1, with the embedding) or the last (r = U, with the LM head) follows from l and r,
so (j, l, r) is all a stage's cost depends on. Entries with r < l are +inf. A position-free
predictor (CAPTURE's) gives one j row, used for every j.

``layers`` maps units to decoder layers, so that a plan over units becomes layers per stage.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True, eq=False)
class CostTable:
    values: np.ndarray
    """float64, shape (J, U + 2, U + 2); rows and columns 0 and U + 1 are +inf padding."""
    layers: tuple[tuple[int, int], ...]
    """(first, last) decoder layer of each unit."""

    @property
    def num_units(self) -> int:
        return len(self.layers)

    @property
    def position_free(self) -> bool:
        return self.values.shape[0] == 1

    def cost(self, first: int, last: int, from_end: int) -> float:
        return float(self.row(from_end)[first, last])

    def row(self, from_end: int) -> np.ndarray:
        """The (U + 2, U + 2) matrix for the j-th stage from the end (the last row repeats)."""
        return self.values[0 if self.position_free else min(from_end, self.values.shape[0]) - 1]


def empty(units: int, rows: int) -> np.ndarray:
    return np.full((rows, units + 2, units + 2), np.inf)


def upper(units: int) -> tuple[np.ndarray, np.ndarray]:
    """Index grids (l, r) over 1..U with r >= l, for filling a table."""
    first, last = np.triu_indices(units)
    return first + 1, last + 1


def unit_table(layer_values: np.ndarray, groups: tuple[tuple[int, int], ...]) -> CostTable:
    """A table over layers (J, L + 2, L + 2) restricted to merged units."""
    starts = np.array([0] + [first for first, _ in groups] + [0])
    ends = np.array([0] + [last for _, last in groups] + [0])
    values = layer_values[:, starts[:, None], ends[None, :]]
    values[:, 0, :] = values[:, -1, :] = np.inf
    values[:, :, 0] = values[:, :, -1] = np.inf
    units = len(groups)
    lower = np.tril_indices(units + 2, -1)
    values[:, lower[0], lower[1]] = np.inf
    return CostTable(values, tuple(groups))
