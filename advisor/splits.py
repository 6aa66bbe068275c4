"""Layers per pipeline rank for models whose decoder layers are all alike, for thousands of
layouts at once (numpy): the split that minimises the peak memory, and MadPipe's split that
minimises the period (the slowest rank's time per microbatch) with every rank under a memory
limit. Both are exact.

Each layout k is a pipeline of ``pp[k]`` ranks (arrays are padded to the longest pipeline;
columns beyond a layout's ranks are inactive and hold no layers). A rank holds n layers with
v <= n (every model chunk at least one layer; v = 1 without interleaving). A cost of a rank is
any function of (layout, rank, n) that strictly increases with n, evaluated on whole (K, P)
arrays: ``stage_model.StageModel.total`` (bytes) or a time per microbatch. Every rank is different
(the first holds the embedding and the most microbatches, the last the LM head), so the
planner is the general min-max over compositions, not a formula.

The min-max value is one of the costs the ranks can take. With caps_i(B) = the most layers rank i
can hold at cost <= B (within its own bounds), a cost B is achievable iff every cap is at least v
and the caps add up to L. The planner brackets the smallest such B by bisection, then walks up
exactly from below: the next achievable value is the smallest cost of one more layer on some
rank, so the result is an attained cost, not a float close to it. The split returned is the
evenest one under the final caps (``fill``): each rank gets min(cap, lambda) for the largest
common level lambda, and the layers left over go to the last ranks that can take them (under
1F1B the front ranks hold the most microbatches).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

Cost = Callable[[np.ndarray], np.ndarray]
"""Cost of every (layout, rank) at a (K, P) array of layer counts; strictly increasing in them."""


def per_rank(values, shape: tuple):
    """A cost's per-layout term (a (K, 1) column) as a contiguous array of the ranks' (K, P)
    ``shape``, each layout's value in every rank: the cost is then elementwise over whole arrays.
    numpy copies a broadcast column through a buffer at every operation with a (K, P) array,
    about as much again as the arithmetic for a few ranks, and the planners evaluate a cost many
    times for each array made. A number stays one (numpy broadcasts it without a copy)."""
    if not np.ndim(values):
        return values
    return np.ascontiguousarray(np.broadcast_to(values, np.broadcast_shapes(shape, np.shape(values))))


BISECTIONS = 10
"""The fewest steps of the bracketing bisection (more for long pipelines); the exact walk does
the rest."""


class Pipelines:
    """K pipelines over the same ``layers`` decoder layers: ``pp`` (K,) ranks each, ``vpp`` (K,)
    model chunks per rank (1 without interleaving)."""

    def __init__(self, pp: np.ndarray, vpp: np.ndarray, layers: int) -> None:
        self.pp, self.vpp, self.layers = np.asarray(pp), np.asarray(vpp), layers
        self.width = int(self.pp.max()) if self.pp.size else 1
        self.active = np.arange(self.width)[None, :] < self.pp[:, None]
        """(K, P): which columns are ranks of their pipeline."""
        self.lowest = np.where(self.active, self.vpp[:, None], 0)
        """(K, P): the fewest layers a rank may hold (v; 0 for inactive columns)."""
        self.highest = np.where(self.active, (layers - (self.pp - 1) * self.vpp)[:, None], 0)
        """(K, P): the most a rank can hold, the others holding their fewest."""
        self.possible = self.pp * self.vpp <= layers
        """(K,): a layer (per chunk) for every rank."""


WIDE = 1 << 16
"""Ranks x layers beyond which ``min_max`` brackets from the evenest split: the halvings it saves
(up to log2 of the pipeline's depth) then outweigh a fill and a cost."""

WALK = 8
"""(Rank, layers) costs left between the bracket's caps at which ``min_max`` stops halving: a
halving (``caps``: an inversion and two costs per cell) costs about four steps of the walk (one
cost each), and each halving saves at most half the walk's steps."""

Inverse = Callable[[np.ndarray, np.ndarray, np.ndarray], "np.ndarray | None"]
"""inverse(bound, low, high): what ``caps`` computes, in closed form; None where it has none."""


def caps(cost: Cost, bound: np.ndarray, low: np.ndarray, high: np.ndarray, inverse: Inverse | None = None,
         within: np.ndarray | None = None, beyond: np.ndarray | None = None) -> np.ndarray:
    """The most layers n in [low, high] with cost(n) <= bound, per (layout, rank); low - 1 where
    even ``low`` costs more. The cost's closed-form ``inverse`` if it has one, else bisection
    over n, all cells at once: between ``within`` and ``beyond`` where the caller knows them
    (counts with cost(within) <= bound or low - 1, and cost(beyond) > bound or high + 1; the
    cost increases in n, so the answer is the same, in fewer steps)."""
    if inverse is not None and (closed := inverse(bound, low, high)) is not None:
        return closed
    # cost(below) counts as within the bound, cost(above) not
    below, above = low - 1 if within is None else within, high + 1 if beyond is None else beyond
    while True:
        open_ = above - below > 1
        if not open_.any():
            return below
        middle = np.where(open_, (below + above) // 2, low)
        within = cost(middle) <= bound
        below = np.where(open_ & within, middle, below)
        above = np.where(open_ & ~within, middle, above)


def fill(cap: np.ndarray, pipelines: Pipelines) -> np.ndarray:
    """The evenest split with lowest <= n <= cap summing to L (caps must allow one): every rank
    min(cap, lambda) for the largest lambda that does not overshoot, the rest one each to the last
    ranks whose caps are above lambda."""
    low, active, total = pipelines.lowest, pipelines.active, pipelines.layers
    cap = np.where(active, np.maximum(cap, low), 0)
    below, above = np.zeros(len(cap), dtype=np.int64), np.full(len(cap), total + 1, dtype=np.int64)
    while (above - below > 1).any():  # the largest level whose split does not exceed L
        middle = (below + above) // 2
        under = np.minimum(np.maximum(middle[:, None], low), cap).sum(axis=1) <= total  # np.clip, without its wrapper
        below, above = np.where(under, middle, below), np.where(under, above, middle)
    counts = np.minimum(np.maximum(below[:, None], low), cap)
    left = total - counts.sum(axis=1)
    room = active & (cap > counts)
    from_end = np.cumsum(room[:, ::-1], axis=1)[:, ::-1]  # 1 for the last rank with room, 2 for the one before, ...
    return counts + (room & (from_end <= left[:, None]))


def _achievable(cap: np.ndarray, pipelines: Pipelines) -> np.ndarray:
    return ((cap >= pipelines.lowest) | ~pipelines.active).all(axis=1) & (cap.sum(axis=1) >= pipelines.layers)


@dataclass(frozen=True, slots=True)
class Split:
    counts: np.ndarray
    """(K, P) layers per rank (0 in inactive columns); meaningless where not ``feasible``."""
    value: np.ndarray
    """(K,) the min-max cost (inf where not feasible)."""
    feasible: np.ndarray
    """(K,)"""


def min_max(cost: Cost, pipelines: Pipelines, ceiling: np.ndarray | None = None, inverse: Inverse | None = None
            ) -> Split:
    """The split minimising the largest rank cost, each rank at most ``ceiling`` layers
    (default: its highest), exactly (see the module docstring)."""
    active, low = pipelines.active, pipelines.lowest
    ceiling = pipelines.highest if ceiling is None else np.where(active, np.minimum(ceiling, pipelines.highest), 0)
    feasible = pipelines.possible & _achievable(ceiling, pipelines)
    whole = bool(active.all())  # pipelines of one depth (the sweep groups them so): nothing to mask

    def masked(n):
        return np.asarray(cost(n), dtype=float) if whole else np.where(active, cost(np.where(active, n, low)), -np.inf)

    def _caps(bound, within=None, beyond=None):
        found = caps(masked, bound[:, None], low, ceiling, inverse, within, beyond)
        return found if whole else np.where(active, found, 0)

    floor = masked(low).max(axis=1)  # every rank holds at least its lowest
    top = np.where(feasible, np.where(active, masked(np.maximum(ceiling, low)), -np.inf).max(axis=1), floor)
    below = np.nextafter(floor, -np.inf)  # not achievable: below every rank's lowest cost
    # achievable where feasible: the evenest split under the ceilings, far below ``top`` (a rank
    # holding all it can) in long pipelines. The bracket changes only how fast the walk below
    # reaches the min-max: it ends at caps(min-max) from any achievable upper bound.
    above, share, wide = top, 1.0, pipelines.width * pipelines.layers > WIDE
    if wide:
        evenest = np.where(feasible, masked(fill(np.maximum(ceiling, low), pipelines)).max(axis=1), top)
        above = np.minimum(top, evenest)
        with np.errstate(invalid="ignore", divide="ignore"):
            share = float(np.where(feasible & (top > floor), (above - floor) / (top - floor), 0.0).max(initial=0.0))
    # Enough halvings that the walk meets few attained costs (up to P x L of them in the
    # bracket, the share of them left in the narrower one). From the evenest split, halve only
    # while more than WALK (rank, layers) costs lie between the bounds' caps (exact, so counted):
    # in the deepest pipelines the evenest split is often the min-max already (none between).
    # caps(below) <= caps(middle) <= caps(above) <= the ceiling: each halving's caps start from
    # that bracket, and the walk meets at most sum(upper - cap) costs; ranks with equal costs
    # step together, so once each rank is within a layer of its upper cap, at most as many
    # steps as distinct costs of their next layers (``_walk_steps``, asked once)
    cap = _caps(below)
    upper = _caps(above, cap) if wide else ceiling
    asked = False
    for _ in range(max(BISECTIONS, math.ceil(math.log2(max(2.0, pipelines.width * pipelines.layers * share))))):
        gap = np.where(feasible[:, None], upper - cap, 0)
        if gap.sum(axis=1).max(initial=0) <= WALK:
            break
        if not asked and gap.max(initial=0) <= 1:
            asked = True
            if _walk_steps(masked, cap, gap) <= WALK:
                break
        middle = (below + above) / 2
        middle_cap = _caps(middle, cap, upper + 1)
        within = _achievable(middle_cap, pipelines)
        below, above = np.where(within, below, middle), np.where(within, middle, above)
        cap = np.where(within[:, None], cap, middle_cap)
        upper = np.where(within[:, None], middle_cap, upper)
    # Walk up from below: raise the bound to the next cost that gives some rank one more layer.
    bound = below.copy()
    done = _achievable(cap, pipelines) | ~feasible
    while not done.all():
        room = active & (cap < ceiling)
        step = np.where(room, masked(np.minimum(cap + 1, ceiling)), np.inf)
        bound = np.where(done, bound, step.min(axis=1))
        cap = cap + (room & (step <= bound[:, None]) & ~done[:, None])
        done = _achievable(cap, pipelines) | ~feasible
    counts = np.where(feasible[:, None], fill(cap, pipelines), 0)
    value = np.where(feasible, masked(counts).max(axis=1), np.inf)
    return Split(counts=counts, value=value, feasible=feasible)


def _walk_steps(masked: Cost, cap: np.ndarray, gap: np.ndarray) -> int:
    """The most steps ``min_max``'s walk takes from ``cap`` where every rank is at most one layer
    below its upper cap (``gap``: 0 or 1, 0 in rows not planned): each step raises the bound to the
    least cost of a next layer, and every rank whose next layer costs that much steps with it, so
    one step per distinct cost among the next layers of the ranks with a gap. A pipeline's ranks
    often share their cost (MadPipe's times of the middle ranks, ``advisor.rank_times``): 3
    distinct costs where the sum of the gaps counts 64 ranks."""
    step = np.sort(np.where(gap > 0, masked(cap + gap), np.inf), axis=1)  # the ranks without a gap last
    first = np.isfinite(step[:, 0])
    later = np.isfinite(step[:, 1:]) & (step[:, 1:] != step[:, :-1])
    return int((first + later.sum(axis=1)).max(initial=0))


def memory_caps(memory: Cost, pipelines: Pipelines, limit, inverse: Inverse | None = None) -> np.ndarray:
    """(K, P): the most layers each rank can hold within ``limit`` bytes (below its lowest where
    not even that fits)."""
    bound = np.asarray(limit, dtype=float)  # one limit for all stays one number: no column to broadcast
    bound = bound[:, None] if bound.ndim else bound
    return np.where(pipelines.active, caps(memory, bound, pipelines.lowest, pipelines.highest, inverse), 0)


def fastest_within(time: Cost, memory: Cost, pipelines: Pipelines, limit, *, time_inverse: Inverse | None = None,
                   memory_inverse: Inverse | None = None) -> Split:
    """MadPipe for Megatron (seed 001, Section 4): the split with the smallest period, the slowest
    rank's time, with every rank's memory (its 1F1B microbatches in flight) within ``limit``."""
    return min_max(time, pipelines, memory_caps(memory, pipelines, limit, memory_inverse), time_inverse)


def lowest_memory(memory: Cost, pipelines: Pipelines, inverse: Inverse | None = None) -> Split:
    """The split with the lowest peak memory (the planner of ``recommend --objective memory``,
    for alike layers)."""
    return min_max(memory, pipelines, inverse=inverse)
