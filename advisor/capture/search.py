"""The exact planner: minimise the peak stage memory by dynamic programming, in polynomial time.

Both plan spaces are paths through a small state graph. A path's stages cover units 1..U in
order; a plan's cost is the largest stage cost on it (every GPU of a stage has the stage's
predicted memory). With V(state, l) the best peak for placing units l..U from ``state``:

    V(s, l) = min over edges s -> t, r >= l of  max(C_edge[l, r], V(t, r + 1))

- Megatron mode (uniform degrees, P stages): states i = 0..P, edge i -> i + 1 with the table row
  j = P - i (the stage's distance from the end). O(P U^2).
- Hybrid mode (CAPTURE's space, N nodes of K GPUs): states (g, j): g GPUs filled in order, j
  stages still to place. An edge places a stage of degree d (power of 2) on the current node,
  so only if it fits: g mod K + d <= K; it leads to (g + d, j - 1). Every GPU is used and no stage
  crosses a node, as in Algorithm 4. With a position-free predictor j is dropped. O(G^2 C U^2)
  with C scenarios per stage (O(G C U^2) position-free).

Each minimisation over r is one numpy reduction over a (U x U) matrix.

Ties (seed 000, Section III-C): among plans with the lowest peak, exclude each plan's GPUs at its
highest memory and compare the highest of the rest, and repeat. That is the lexicographic order
of each plan's distinct memory levels, highest first, where a plan with no GPUs left is lowest.
We compute it exactly by repeated passes: with levels P1 > ... > Pk found, the next pass allows
only stages at a found level or below Pk, counts found levels as -inf, and minimises the maximum
of the rest: that is P(k+1), or -inf when nothing is left. The paper then picks at random; we
pick the first plan in Algorithm 4's enumeration order (units of the first stage ascending, then
its scenario in the order pp, dp2, dp4, ..., tp2, tp4, ..., then the next stage), so the exact
planner and ``algorithm4`` return the same plan, not only the same peak.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable

import numpy as np

from advisor.capture.costs import CostTable
from advisor.capture.layout import Scenario
from advisor.errors import AdvisorError


@dataclass(frozen=True, kw_only=True, slots=True)
class PlannedStage:
    first: int
    """First unit (1-based)."""
    last: int
    scenario: Scenario
    gpu: int
    """Index of the stage's first GPU (GPUs are filled node by node, in stage order)."""
    cost: float
    """Predicted bytes on each of its GPUs."""


@dataclass(frozen=True, slots=True)
class Solution:
    stages: tuple[PlannedStage, ...]

    @property
    def peak(self) -> float:
        return max(stage.cost for stage in self.stages)

    @property
    def levels(self) -> tuple[float, ...]:
        """The distinct stage costs, highest first: the tie-break key."""
        return tuple(sorted({stage.cost for stage in self.stages}, reverse=True))

    @property
    def units_per_stage(self) -> tuple[int, ...]:
        return tuple(stage.last - stage.first + 1 for stage in self.stages)


@dataclass(frozen=True, slots=True)
class _Edge:
    order: int
    scenario: Scenario
    target: Hashable
    matrix: np.ndarray


class _Graph:
    """States in processing order (targets before sources), edges per state, one terminal."""

    def __init__(self, units: int, terminal: Hashable) -> None:
        self.units = units
        self.terminal = terminal
        self.order: list[Hashable] = []
        self.edges: dict[Hashable, list[_Edge]] = {}
        self.sources: list[Hashable] = []

    def solve(self, transform) -> dict[Hashable, np.ndarray]:
        units = self.units
        values = {self.terminal: np.full(units + 2, np.inf)}
        values[self.terminal][units + 1] = -np.inf
        cache: dict[int, np.ndarray] = {}
        for state in self.order:
            best = np.full(units + 2, np.inf)
            for edge in self.edges.get(state, ()):
                after = values.get(edge.target)
                if after is None:
                    continue
                key = id(edge.matrix)
                if key not in cache:
                    cache[key] = transform(edge.matrix)[1:units + 1, 1:units + 1]
                candidates = np.maximum(cache[key], after[None, 2:units + 2]).min(axis=1)
                np.minimum(best[1:units + 1], candidates, out=best[1:units + 1])
            values[state] = best
        return values

    def best(self, values) -> float:
        return min((values[s][1] for s in self.sources if s in values), default=np.inf)

    def reconstruct(self, values, transform) -> list[tuple[int, int, _Edge]]:
        """The first path, in enumeration order, whose stages all have transformed cost -inf.

        Forward, the sets of states that the chosen prefix reaches pick each stage; the states
        themselves are then read backwards from the terminal. Several states can carry the same
        prefix (positional hybrid states (GPUs, stages left) for different stage counts), and an
        edge of one of them prices the stage at another position, so the edges must be those of
        the one path that reaches the terminal, not the first edge of the chosen order."""
        current = [s for s in self.sources if s in values and values[s][1] == -np.inf]
        first, steps = 1, []
        while first <= self.units:
            for last in range(first, self.units + 1):
                usable = [
                    (state, edge) for state in current for edge in self.edges.get(state, ())
                    if edge.target in values and values[edge.target][last + 1] == -np.inf
                    and transform(edge.matrix)[first, last] == -np.inf
                ]
                if usable:
                    break
            chosen = min(edge.order for _, edge in usable)
            into = {edge.target: (state, edge) for state, edge in usable if edge.order == chosen}
            steps.append((first, last, into))
            current = list(into)
            first = last + 1
        path, state = [], self.terminal
        for first, last, into in reversed(steps):
            state, edge = into[state]
            path.append((first, last, edge))
        return path[::-1]


def _levels(graph: _Graph) -> tuple[list[float], Callable[[np.ndarray], np.ndarray], dict]:
    """CAPTURE's tie-break levels, the transform under which the chosen plans cost -inf, and the
    values of that last pass."""
    values = graph.solve(lambda m: m)
    peak = graph.best(values)
    if peak == np.inf:
        raise AdvisorError("no plan places every layer on every GPU (too few layers for the GPUs?)")
    levels = [peak]
    while True:
        found = np.array(levels)

        transform = _memo(lambda matrix, found=found, below=levels[-1]: np.where(
            np.isin(matrix, found), -np.inf, np.where(matrix < below, matrix, np.inf)))
        values = graph.solve(transform)
        value = graph.best(values)
        if value == -np.inf:
            return levels, transform, values
        levels.append(value)


def _memo(transform):
    cache: dict[int, np.ndarray] = {}

    def cached(matrix):
        key = id(matrix)
        if key not in cache:
            cache[key] = transform(matrix)
        return cache[key]

    return cached


def _solution(graph: _Graph, gpu_of) -> Solution:
    _, transform, values = _levels(graph)
    path = graph.reconstruct(values, transform)
    stages, gpu = [], 0
    for first, last, edge in path:
        stages.append(PlannedStage(first=first, last=last, scenario=edge.scenario, gpu=gpu,
                                   cost=float(edge.matrix[first, last])))
        gpu += gpu_of(edge.scenario)
    return Solution(tuple(stages))


def plan_megatron(table: CostTable, stages: int, scenario: Scenario = Scenario()) -> Solution:
    """Layers per stage for ``stages`` pipeline stages of one uniform scenario (Megatron)."""
    if stages > table.num_units:
        raise AdvisorError(f"{table.num_units} layers cannot fill {stages} pipeline stages")
    graph = _Graph(table.num_units, stages)
    for i in reversed(range(stages)):
        graph.order.append(i)
        graph.edges[i] = [_Edge(0, scenario, i + 1, table.row(stages - i))]
    graph.sources = [0]
    return _solution(graph, lambda s: s.gpus)


def hybrid_scenarios(gpus_per_node: int) -> list[Scenario]:
    """Algorithm 4's stage configs, in its order: DP degrees 1, 2, 4, ..., then TP 2, 4, ...
    (1-way DP and TP are the same pipeline-only stage, listed once)."""
    degrees = [1 << k for k in range(gpus_per_node.bit_length()) if 1 << k <= gpus_per_node]
    return [Scenario(dp=d) for d in degrees] + [Scenario(tp=d) for d in degrees if d > 1]


def plan_hybrid(tables: dict[Scenario, CostTable], nodes: int, gpus_per_node: int) -> Solution:
    """CAPTURE's hybrid space: per-stage DP or TP degree, node-local, every GPU used."""
    order = [s for s in hybrid_scenarios(gpus_per_node) if s in tables]
    if not order:
        raise AdvisorError("no stage configs to place")
    units = next(iter(tables.values())).num_units
    gpus = nodes * gpus_per_node
    positional = not all(tables[s].position_free for s in order)
    graph = _Graph(units, (gpus, 0) if positional else gpus)
    counts = range(1, gpus + 1) if positional else (None,)
    for used in reversed(range(gpus)):
        for left in counts:
            state = (used, left) if positional else used
            if positional and left > gpus - used:
                continue
            graph.order.append(state)
            room = gpus_per_node - used % gpus_per_node
            graph.edges[state] = [
                _Edge(index, s, (used + s.gpus, left - 1) if positional else used + s.gpus,
                      tables[s].row(left or 1))
                for index, s in enumerate(order) if s.gpus <= room
            ]
    graph.sources = [(0, left) for left in counts] if positional else [0]
    return _solution(graph, lambda s: s.gpus)
