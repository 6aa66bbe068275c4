"""When no layout fits with the options given, the sweep tries the levers that free model-state
memory, in order of their cost: Megatron-FSDP sharding the gradients too (optim_grads, ZeRO-2),
then the weights (optim_grads_params, ZeRO-3), then optimizer CPU offload. The first with a
layout expected to run wins; its rows carry the lever in their options (and so in their
Megatron-LM flags) and, with a time model, what it costs against the same layout without it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from advisor.errors import AdvisorError
from advisor.options import TrainingOptions

# Megatron-FSDP runs with the distributed optimizer (DataParallel.distributed_optimizer_for), and
# so does the offload (its precision-aware optimizer: megatron-core OptimizerConfig): every rung
# turns it on where the user's options had it off.
LADDER: tuple[tuple[str, dict], ...] = (
    ("Megatron-FSDP optim_grads (gradients and optimizer states sharded, ZeRO-2)",
     {"fsdp_strategy": "optim_grads", "distributed_optimizer": True}),
    ("Megatron-FSDP optim_grads_params (weights too, ZeRO-3)",
     {"fsdp_strategy": "optim_grads_params", "distributed_optimizer": True}),
    ("optimizer CPU offload (optimizer states in host memory)",
     {"optimizer_cpu_offload": True, "distributed_optimizer": True}),
)


def _layout(row) -> tuple:
    p = row.parallel
    return p.tp, p.cp, p.pp, p.dp, p.mbs


def _runs(sweep) -> bool:
    return any(row.rank for row in sweep.rows)


def escalate(first, run: Callable[[TrainingOptions], object], options: TrainingOptions, gpu=None,
             may_help: Callable[[TrainingOptions], bool] | None = None):
    """``first`` (a Sweep with ``options``) if anything in it runs or the options already use a
    lever; else the first rung of ``LADDER`` whose sweep (``run(options)``) has a layout expected
    to run, with ``escalation`` set and each timed row's ``lever_time_cost_s``: its step time
    minus that of the same (TP, CP, PP, DP, MBS) under ``options``. A rung for which
    ``may_help(options)`` is False (``advisor.space_search.may_fit``: no layout can fit on it) is not
    swept: its sweep would have nothing that runs."""
    if _runs(first) or options.data_parallel.fsdp_strategy or options.offload.optimizer_cpu_offload:
        return first
    base = {_layout(row): row.timing["step_time_s"] for row in first.rows if row.timing}
    for label, changes in LADDER:
        if "optimizer_cpu_offload" in changes and gpu is not None and gpu.host_link_gb_per_s is None:
            continue  # cannot be timed on this preset
        try:
            lever = options.with_(**changes)  # a rung these options cannot take is skipped, as one that fails
            if may_help is not None and not may_help(lever):
                continue  # a whole search (minutes at the largest inputs) that cannot find a layout
            candidate = run(lever)
        except AdvisorError:
            continue
        if _runs(candidate):
            for row in candidate.rows:
                if row.timing and _layout(row) in base:
                    row.timing["lever_time_cost_s"] = row.timing["step_time_s"] - base[_layout(row)]
            return replace(candidate, escalation=label)
    return first
