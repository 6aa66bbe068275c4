"""The recommender: a predictor's stage costs -> the exact planner -> a ``Plan``.

Two modes:

- ``megatron``: what stock Megatron-LM can launch. Uniform TP, CP and DP on every stage; the
  planner chooses the layers of each of the PP stages (uneven counts, written as
  ``--pipeline-model-parallel-layout`` or first/last-stage counts) to minimise the peak. The
  1F1B-aware predictor is the natural one: the first stages hold the most microbatches.
- ``hybrid``: CAPTURE's space (seed 000, Section III-C): each stage its own DP or TP degree on
  one node, every GPU used. Stock Megatron cannot build it (``launchable: false``), unless the
  best plan happens to give every stage the same degrees.

Both report, beside the plan, the even split with the same degrees, priced by the same
predictor (CAPTURE's Fig. 6 compares its plan with Alpa's in the same way).
"""

from __future__ import annotations

from typing import Literal

from advisor.capture.costs import CostTable
from advisor.capture.layout import PIPELINE, PipelineLayout, Scenario, even_split, in_flight_microbatches
from advisor.megatron_args import megatron_args
from advisor.capture.observations import ProfileSet
from advisor.capture.plan import Baseline, Plan, PlanStage
from advisor.capture.predict_1f1b import PositionAwarePredictor
from advisor.capture.predict_capture import CapturePredictor
from advisor.capture.search import Solution, hybrid_scenarios, plan_hybrid, plan_megatron
from advisor.capture.statistics import merge_groups
from advisor.errors import AdvisorError
from advisor.memory import tp_problem

PredictorName = Literal["1f1b", "capture"]
PREDICTORS = {"1f1b": PositionAwarePredictor, "capture": CapturePredictor}


def make_predictor(profiles: ProfileSet, name: PredictorName = "1f1b", merge_to: int | None = None,
                   merge_microbatch: float = 1):
    """A predictor over layers, or over ``merge_to`` units merged by CAPTURE's layer merger from
    the pipeline-only statistics at ``merge_microbatch`` (Section III-A3)."""
    groups = None
    if merge_to is not None:
        isolated, added = CapturePredictor(profiles).unit_statistics(PIPELINE, merge_microbatch)
        groups = merge_groups(list(isolated), [None] + list(added[1:]), merge_to)
    return PREDICTORS[name](profiles, groups)


def _stages(solution: Solution, table: CostTable, num_microbatches: int, cp: int, gpus_of) -> tuple[PlanStage, ...]:
    """Plan stages in layers; ``gpus_of(index, stage)`` gives the GPUs of a planned stage."""
    count = len(solution.stages)
    return tuple(
        PlanStage(
            stage=index, first_layer=table.layers[stage.first - 1][0], last_layer=table.layers[stage.last - 1][1],
            tp=stage.scenario.tp, dp=stage.scenario.dp, cp=cp, gpus=gpus_of(index, stage),
            in_flight_microbatches=in_flight_microbatches(index, count, num_microbatches),
            predicted_bytes=stage.cost,
        )
        for index, stage in enumerate(solution.stages)
    )


def _baseline(predictor, layers: int, stages: int, scenario: Scenario, batch: float, m: int, label: str):
    if layers < stages:
        return None
    counts = even_split(layers, stages)
    plain = type(predictor)(predictor.profiles) if predictor.groups else predictor
    predicted = plain.predict(PipelineLayout.from_counts(counts, batch, m, scenario))
    return Baseline(label=label, layers_per_stage=tuple(counts), stage_bytes=predicted)


def _common(profiles: ProfileSet, predictor) -> dict:
    return dict(
        predictor=predictor.name, model=profiles.model, seq_len=profiles.seq_len, setup=profiles.setup,
        profile_runs=tuple(run.run for run in profiles.runs), skipped_runs=profiles.skipped,
        fits=tuple(fit.to_dict() for fit in getattr(predictor, "fits", ())),
    )


def recommend_megatron(profiles: ProfileSet, *, gpus: int, gpus_per_node: int, tp: int, pp: int,
                       micro_batch_size: int, global_batch_size: int, predictor: PredictorName = "1f1b",
                       merge_to: int | None = None) -> Plan:
    """Uniform TP/CP/DP, PP stages: the layers per stage with the lowest predicted peak."""
    cp = profiles.cp
    if gpus % (tp * cp * pp):
        raise AdvisorError(f"--gpus {gpus} is not divisible by TP x CP x PP = {tp} x {cp} x {pp}")
    if tp > gpus_per_node:
        raise AdvisorError(f"TP {tp} spans nodes of {gpus_per_node} GPUs")
    if reason := tp_problem(profiles.model, tp):
        raise AdvisorError(reason)
    dp = gpus // (tp * cp * pp)
    if global_batch_size % (micro_batch_size * dp):
        raise AdvisorError(f"global batch {global_batch_size} is not divisible by micro-batch x DP = "
                           f"{micro_batch_size} x {dp}")
    m = global_batch_size // (micro_batch_size * dp)
    scenario, batch = Scenario(tp=tp, dp=dp), micro_batch_size * dp
    predictor = make_predictor(profiles, predictor, merge_to, batch)
    table = predictor.cost_table(scenario, batch, m, pp)
    solution = plan_megatron(table, pp, scenario)
    per_stage = tp * cp * dp

    stages = _stages(solution, table, m, cp,  # Megatron's rank order tp-cp-dp-pp: PP outermost
                     lambda index, stage: tuple(range(index * per_stage, (index + 1) * per_stage)))
    return Plan(
        mode="megatron", **_common(profiles, predictor), gpus=gpus, gpus_per_node=gpus_per_node, tp=tp, cp=cp, dp=dp,
        micro_batch_size=micro_batch_size, global_batch_size=global_batch_size, num_microbatches=m, stages=stages,
        baseline=_baseline(predictor, profiles.num_layers, pp, scenario, batch, m, f"even split, PP {pp}"),
        megatron_args=_megatron_args(profiles, tp, stages, micro_batch_size, global_batch_size),
    )


def _megatron_args(profiles: ProfileSet, tp: int, stages, micro_batch_size: int, global_batch_size: int):
    setup = profiles.setup
    return tuple(megatron_args(
        profiles.model, profiles.seq_len, tp=tp, cp=profiles.cp, layers_per_stage=[stage.layers for stage in stages],
        micro_batch_size=micro_batch_size, global_batch_size=global_batch_size,
        options=setup.memory_options(), params_dtype=setup.params_dtype))


def hybrid_tables(predictor, *, devices_per_node: int, devices: int, micro_batch_size: int, num_microbatches: int
                  ) -> tuple[dict[Scenario, CostTable], list[tuple[str, str]]]:
    """A cost table for every stage config the predictor can price; the others with the reason."""
    tables, excluded = {}, []
    for scenario in hybrid_scenarios(devices_per_node):
        reason = tp_problem(predictor.profiles.model, scenario.tp)
        if scenario.dp > 1 and micro_batch_size % scenario.dp:
            reason = f"DP {scenario.dp} would split a microbatch of {micro_batch_size} sequences"
        if reason is None:
            try:
                tables[scenario] = predictor.cost_table(scenario, micro_batch_size, num_microbatches, devices)
            except AdvisorError as exc:
                reason = str(exc)
        if reason:
            excluded.append((scenario.name, reason))
    return tables, excluded


def recommend_hybrid(profiles: ProfileSet, *, gpus: int, gpus_per_node: int, micro_batch_size: int,
                     global_batch_size: int, predictor: PredictorName = "1f1b", merge_to: int | None = None) -> Plan:
    """CAPTURE's hybrid space on ``gpus`` GPUs in nodes of ``gpus_per_node``."""
    cp = profiles.cp
    if gpus % gpus_per_node or gpus_per_node % cp:
        raise AdvisorError(f"--gpus {gpus} must be whole nodes of {gpus_per_node} GPUs, and CP {cp} must divide "
                           f"a node")
    if global_batch_size % micro_batch_size:
        raise AdvisorError(f"global batch {global_batch_size} is not divisible by the microbatch {micro_batch_size}")
    m = global_batch_size // micro_batch_size
    per_node, devices = gpus_per_node // cp, gpus // cp
    predictor = make_predictor(profiles, predictor, merge_to, micro_batch_size)
    tables, excluded = hybrid_tables(predictor, devices_per_node=per_node, devices=devices,
                                     micro_batch_size=micro_batch_size, num_microbatches=m)
    if not tables:
        raise AdvisorError("no stage config can be predicted: " + "; ".join(f"{n}: {r}" for n, r in excluded))
    solution = plan_hybrid(tables, gpus // gpus_per_node, per_node)
    table = next(iter(tables.values()))

    stages = _stages(solution, table, m, cp,  # each device is a CP group of cp GPUs
                     lambda index, stage: tuple(range(stage.gpu * cp, (stage.gpu + stage.scenario.gpus) * cp)))
    # If every stage happens to get the same degrees, Megatron can run it: DP d on every stage is
    # Megatron's DP d with each replica taking 1/d of the pipeline microbatch.
    uniform = len({(stage.tp, stage.dp) for stage in stages}) == 1
    tp, dp = (stages[0].tp, stages[0].dp) if uniform else (None, None)
    return Plan(
        mode="hybrid", **_common(profiles, predictor), gpus=gpus, gpus_per_node=gpus_per_node, tp=tp, cp=cp, dp=dp,
        micro_batch_size=micro_batch_size, global_batch_size=global_batch_size, num_microbatches=m, stages=stages,
        baseline=_baseline(predictor, profiles.num_layers, devices, PIPELINE, micro_batch_size, m,
                           f"even split, PP {devices}"),
        megatron_args=_megatron_args(profiles, tp, stages, micro_batch_size // dp, global_batch_size)
        if uniform else None,
        excluded=tuple(excluded),
    )
