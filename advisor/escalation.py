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
from advisor.options import DataParallel, TrainingOptions

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


def rung(options: TrainingOptions, changes: dict, gather_given: bool = False) -> TrainingOptions:
    """``options`` with a rung's ``changes``, as the same lever given by hand builds them
    (``advisor.cli.training_flags``): the distributed optimizer a rung turns on brings
    --overlap-param-gather's default with it (``DataParallel.overlap_param_gather_for``: on with
    --overlap-grad-reduce), unless the user chose it (``gather_given``). A rung that kept it off
    where --no-distributed-optimizer had it off priced and emitted an exposed parameter all-gather
    that the hand-given lever hides (Mixtral 8x7B on 8 H100s: 3.567 s against 3.366 s a step)."""
    lever = options.with_(**changes)
    if gather_given:
        return lever
    dp = lever.data_parallel
    gather = DataParallel.overlap_param_gather_for(None, dp.overlap_grad_reduce, dp.distributed_optimizer)
    return lever if gather == dp.overlap_param_gather else lever.with_(overlap_param_gather=gather)


def _layout(row) -> tuple:
    p = row.parallel
    return p.tp, p.cp, p.pp, p.dp, p.mbs


def _runs(sweep) -> bool:
    return any(row.rank for row in sweep.rows)


HOPELESS = "no layout can fit with it"
"""Why a rung was not swept where a lower bound on its memory (``advisor.space_search.may_fit``,
``advisor.moe.space.may_fit``) says no layout can fit with it."""

Attempt = tuple[str, str | None]
"""A rung climbed in vain: its label, and why it was not swept (None: swept, and nothing ran)."""


def climb(run: Callable[[TrainingOptions], object], runs: Callable[[object], bool], options: TrainingOptions,
          gpu=None, problem: Callable[[TrainingOptions], str | None] | None = None, gather_given: bool = False
          ) -> tuple[tuple[str, object] | None, tuple[Attempt, ...]]:
    """The ladder itself, dense and MoE sweeps alike: ((label, its sweep) of the first rung of
    ``LADDER`` whose sweep (``run(options with the rung)``) has something that ``runs``, or None;
    the rungs climbed in vain before it, each with why it was not swept). None and no rung where
    ``options`` already use a lever (the user chose the sharding). A rung is not swept where its
    options cannot be taken (AdvisorError: its text), where ``problem`` gives a reason (a model
    that does not price it, or a bound that says no layout can fit on it), or, for the offload,
    where the GPU preset lacks the host link or host memory bandwidth to time it. Each rung's
    options are the hand-given lever's (``rung``; ``gather_given``: the user chose
    --overlap-param-gather)."""
    from advisor.throughput.levers import times_offload

    if options.data_parallel.fsdp_strategy or options.offload.optimizer_cpu_offload:
        return None, ()
    attempts: list[Attempt] = []
    for label, changes in LADDER:
        if "optimizer_cpu_offload" in changes and gpu is not None and not times_offload(gpu):
            attempts.append((label, f"{gpu.name} has no host link or host memory bandwidth to time it (gpus.json)"))
            continue
        try:
            # a rung these options cannot take is skipped, as one that fails
            lever = rung(options, changes, gather_given)
            if problem is not None and (why := problem(lever)):
                attempts.append((label, why))
                continue
            candidate = run(lever)
        except AdvisorError as error:
            attempts.append((label, str(error)))
            continue
        if runs(candidate):
            return (label, candidate), tuple(attempts)
        attempts.append((label, None))
    return None, tuple(attempts)


def escalate(first, run: Callable[[TrainingOptions], object], options: TrainingOptions, gpu=None,
             may_help: Callable[[TrainingOptions], bool] | None = None, gather_given: bool = False):
    """``first`` (a Sweep with ``options``) if anything in it runs or the options already use a
    lever; else the first rung of ``LADDER`` whose sweep (``run(options)``) has a layout expected
    to run (``climb``), with ``escalation`` set and each timed row's ``lever_time_cost_s``: its step
    time minus that of the same (TP, CP, PP, DP, MBS) under ``options``. A rung for which
    ``may_help(options)`` is False (``advisor.space_search.may_fit``: no layout can fit on it) is not
    swept: its sweep would have nothing that runs (``gather_given``: as ``climb``). The result
    (``first`` where no rung runs) carries the rungs climbed in vain (``ladder``), as the MoE sweep's does."""
    if _runs(first):
        return first
    bound = None if may_help is None else (lambda lever: None if may_help(lever) else HOPELESS)
    found, attempts = climb(run, _runs, options, gpu, problem=bound, gather_given=gather_given)
    if found is None:
        return replace(first, ladder=attempts)
    label, candidate = found
    base = {_layout(row): row.timing["step_time_s"] for row in first.rows if row.timing}
    for row in candidate.rows:
        if row.timing and _layout(row) in base:
            row.timing["lever_time_cost_s"] = row.timing["step_time_s"] - base[_layout(row)]
    return replace(candidate, escalation=label, ladder=attempts)
