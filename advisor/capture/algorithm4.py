"""CAPTURE's recommender as published: Algorithm 4, by enumeration (seed 000, Section III-C).

    place_layer_group(mesh, plan, group):
        if not enough groups left for the remaining GPUs: return
        if all layer groups placed: keep the plan if its peak is the lowest so far
        else: for parallelism in [DP, TP]: for degree in 1, 2, 4, ... up to the sub-mesh size:
                  if the config fits on the current sub-mesh: place it, and
                      for each next group starting after this one: place_layer_group(...)

Groups are the L(L+1)/2 contiguous layer groups of Description 3; each node is a sub-mesh of K
GPUs whose stage degrees must sum to exactly K; 1-way DP and TP are one pipeline-only config.

Pruning (Section III-C): a stage config whose predicted memory is above the best plan's peak is
not placed. Only strictly above: configs equal to the peak must stay for the tie-break. With a
position-aware table the config's cost is not known until the plan is complete, so pruning uses
its lowest cost over all positions, which never prunes a plan that could win.

Tie-break (Section III-C): the plan whose distinct per-GPU memory levels, highest first, are
lexicographically smallest (see ``search``); equal plans keep the one found first (the paper
picks at random). Complete plans are priced with the stage's position: the j-th stage from the
end uses the table's row j.

This is exponential; ``search`` returns the same plan in polynomial time.
"""

from __future__ import annotations

import numpy as np

from advisor.capture.costs import CostTable
from advisor.capture.layout import Scenario
from advisor.capture.search import PlannedStage, Solution, hybrid_scenarios
from advisor.errors import AdvisorError


def algorithm4(tables: dict[Scenario, CostTable], nodes: int, gpus_per_node: int) -> Solution:
    configs = [s for s in hybrid_scenarios(gpus_per_node) if s in tables]
    units = next(iter(tables.values())).num_units
    gpus = nodes * gpus_per_node
    lowest = {s: tables[s].values.min(axis=0) for s in configs}  # over positions, for pruning
    best: dict[str, object] = {"key": None, "plan": None}

    def complete(plan: list[tuple[int, int, Scenario]]) -> None:
        count = len(plan)
        costs = [tables[s].cost(first, last, count - index) for index, (first, last, s) in enumerate(plan)]
        key = tuple(sorted(set(costs), reverse=True))
        if best["key"] is None or key < best["key"]:
            best["key"], best["plan"] = key, (list(plan), costs)

    def place(first: int, used: int, plan: list) -> None:
        room = gpus_per_node - used % gpus_per_node
        free = gpus - used
        needed = 1 + (free - room) // gpus_per_node  # one stage per node still to fill, at least
        if units - first + 1 < needed:  # "not enough groups left for remaining GPUs"
            return
        peak = np.inf if best["key"] is None else best["key"][0]
        for last in range(first, units + 1):  # Description 3: the groups starting at ``first``
            for scenario in configs:
                if scenario.gpus > room or lowest[scenario][first, last] > peak:
                    continue
                plan.append((first, last, scenario))
                if last == units:
                    if used + scenario.gpus == gpus:
                        complete(plan)
                elif used + scenario.gpus < gpus:
                    place(last + 1, used + scenario.gpus, plan)
                plan.pop()
                peak = np.inf if best["key"] is None else best["key"][0]

    place(1, 0, [])
    if best["plan"] is None:
        raise AdvisorError("no plan places every layer on every GPU")
    plan, costs = best["plan"]
    stages, gpu = [], 0
    for (first, last, scenario), cost in zip(plan, costs):
        stages.append(PlannedStage(first=first, last=last, scenario=scenario, gpu=gpu, cost=float(cost)))
        gpu += scenario.gpus
    return Solution(tuple(stages))
