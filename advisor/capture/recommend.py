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

from dataclasses import replace
from typing import TYPE_CHECKING, Literal

import numpy as np

from advisor.capture.costs import CostTable, unit_table
from advisor.capture.layout import PIPELINE, PipelineLayout, Scenario, even_split, in_flight_microbatches
from advisor.capture.observations import ProfileSet
from advisor.capture.plan import Baseline, Plan, PlanStage
from advisor.capture.predict_1f1b import PositionAwarePredictor
from advisor.capture.predict_capture import CapturePredictor
from advisor.capture.predictor import UnprofiledScenario
from advisor.capture.search import Solution, hybrid_scenarios, plan_hybrid, plan_megatron
from advisor.capture.statistics import FULL_CAMPAIGN, merge_groups
from advisor.errors import AdvisorError
from advisor.madpipe import analytic_tables, plan_fastest, profile_time_table, profiled_times, stage_times
from advisor.megatron_args import MegatronSetup, megatron_args
from advisor.memory import GIB, check_layout, tp_problem
from advisor.stage_model import StageModel
from advisor.memory_calibration import MemoryCalibration
from advisor.options import TrainingOptions, release_defaults
from advisor.options.flags import release_spelling
from advisor.models import LlamaSpec
from advisor.paper_rule import DEFAULT_THRESHOLD
from advisor.parallel import ParallelConfig, Workload, global_batch_problem, model_parallel_problem
from advisor.rank_times import recomputed_per_chunk
from advisor.verdicts import judge

if TYPE_CHECKING:
    from advisor.rank_times import Timing

PredictorName = Literal["1f1b", "capture"]
Objective = Literal["memory", "time"]
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


def _stages(solution: Solution, table: CostTable, num_microbatches: int, cp: int, gpus_of,
            times: tuple[float, ...] | None = None) -> tuple[PlanStage, ...]:
    """Plan stages in layers; ``gpus_of(index, stage)`` gives the GPUs of a planned stage."""
    count = len(solution.stages)
    return tuple(
        PlanStage(
            stage=index, first_layer=table.layers[stage.first - 1][0], last_layer=table.layers[stage.last - 1][1],
            tp=stage.scenario.tp, dp=stage.scenario.dp, cp=cp, gpus=gpus_of(index, stage),
            in_flight_microbatches=in_flight_microbatches(index, count, num_microbatches),
            predicted_bytes=stage.cost, predicted_time_s=None if times is None else times[index],
        )
        for index, stage in enumerate(solution.stages)
    )


def _plan_split(memory: CostTable, time: CostTable | None, pp: int, scenario: Scenario, objective: Objective,
                stage_limit: float | None) -> tuple[Solution, tuple[float, ...] | None]:
    """The memory objective: CAPTURE's lowest peak. The time objective: MadPipe's shortest period
    within ``stage_limit`` bytes (``advisor.madpipe``). With the stage times where there are any."""
    if objective == "time":
        missing = [what for what, absent in (
            ("stage times (profiles with per-layer times, or --gpu NAME for the time model)", time is None),
            ("a memory limit (--mem, or --gpu NAME's memory)", stage_limit is None)) if absent]
        if missing:  # only what is missing: a --mem given is not asked for again
            raise AdvisorError(f"--objective time needs {' and '.join(missing)}")
        solution, _ = plan_fastest(time, memory, pp, stage_limit, scenario)
    else:
        solution = plan_megatron(memory, pp, scenario)
    return solution, None if time is None else stage_times(time, solution)


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
        stopped_early_runs=profiles.stopped_early,
        fits=tuple(fit.to_dict() for fit in getattr(predictor, "fits", ())),
        options=profiles.setup.training_options(),
    )


def _uniform_layout(spec: LlamaSpec, gpus: int, gpus_per_node: int, tp: int, cp: int, pp: int,
                    micro_batch_size: int, global_batch_size: int) -> tuple[int, int]:
    """(DP, microbatches) of a Megatron layout, or AdvisorError saying why it cannot run."""
    if problem := model_parallel_problem(gpus, tp, cp, pp):
        raise AdvisorError(problem)
    if tp > gpus_per_node:
        raise AdvisorError(f"TP {tp} spans nodes of {gpus_per_node} GPUs")
    if reason := tp_problem(spec, tp):
        raise AdvisorError(reason)
    if pp > spec.num_layers:
        raise AdvisorError(f"{spec.num_layers} layers cannot fill {pp} pipeline stages")
    dp = gpus // (tp * cp * pp)
    if problem := global_batch_problem(global_batch_size, micro_batch_size, dp):
        raise AdvisorError(problem)
    return dp, global_batch_size // (micro_batch_size * dp)


UNPROFILED_NEXT = ("Profile those degrees ('advisor profile plan' plans TP 2 and 4 and DP 2 and 4 runs where "
                   "--gpus-per-node holds them, and the 1f1b predictor derives a larger TP from two profiled TPs), "
                   "or give the --tp and --gpus of a profiled run")
"""What to do where recommend --tp asks for degrees the profiles cannot price (a campaign planned
on --gpus-per-node 1 has only pipeline runs; audit: the line named the scenario and stopped)."""


def recommend_megatron(profiles: ProfileSet, *, gpus: int, gpus_per_node: int, tp: int, pp: int,
                       micro_batch_size: int, global_batch_size: int, predictor: PredictorName = "1f1b",
                       merge_to: int | None = None, objective: Objective = "memory",
                       stage_limit: float | None = None, gpu_memory: float | None = None,
                       timing: Timing | None = None) -> Plan:
    """Uniform TP/CP/DP, PP stages: the layers per stage with the lowest predicted peak, or
    (``objective="time"``) with the shortest period whose stages stay within ``stage_limit``
    bytes, the stage times from the profiles' per-layer times or, given ``timing``, the time
    model. ``gpu_memory`` (bytes per GPU, if known) is the plan's memory limit."""
    cp = profiles.cp
    dp, m = _uniform_layout(profiles.model, gpus, gpus_per_node, tp, cp, pp, micro_batch_size, global_batch_size)
    scenario, batch = Scenario(tp=tp, dp=dp), micro_batch_size * dp
    predictor = make_predictor(profiles, predictor, merge_to, batch)
    try:
        table = predictor.cost_table(scenario, batch, m, pp)
    except UnprofiledScenario as exc:
        raise AdvisorError(f"{exc}. {UNPROFILED_NEXT}") from None
    time = None
    if objective == "time":
        if timing is not None:
            _, time = analytic_tables(profiles.model, profiles.seq_len, profiles.setup.memory_options(), tp=tp,
                                      cp=cp, dp=dp, mbs=micro_batch_size, pp=pp, num_microbatches=m, timing=timing)
        else:
            time = profile_time_table(*profiled_times(profiles, scenario, batch))
        if predictor.groups:
            time = unit_table(time.values, predictor.groups)
    solution, times = _plan_split(table, time, pp, scenario, objective, stage_limit)
    per_stage = tp * cp * dp
    stages = _stages(solution, table, m, cp,  # Megatron's rank order tp-cp-dp-pp: PP outermost
                     lambda index, stage: tuple(range(index * per_stage, (index + 1) * per_stage)), times)
    baseline = _baseline(predictor, profiles.num_layers, pp, scenario, batch, m, f"even split, PP {pp}")
    if baseline is not None and time is not None:
        baseline = replace(baseline, stage_times=_split_times(time, baseline.layers_per_stage))
    return Plan(
        mode="megatron", **_common(profiles, predictor), gpus=gpus, gpus_per_node=gpus_per_node, tp=tp, cp=cp, dp=dp,
        micro_batch_size=micro_batch_size, global_batch_size=global_batch_size, num_microbatches=m, stages=stages,
        baseline=baseline, megatron_args=_megatron_args(profiles, tp, stages, micro_batch_size, global_batch_size),
        objective=objective, **_limits(objective, stage_limit, gpu_memory),
    )


def _limits(objective: Objective, stage_limit: float | None, gpu_memory: float | None) -> dict:
    """A plan's limits: the GPU's memory whatever the objective (a plan printed and a plan
    written say the same), the stage limit for the time objective only."""
    return dict(memory_limit_bytes=gpu_memory, stage_limit_bytes=stage_limit if objective == "time" else None)


def _split_times(time: CostTable, layers_per_stage) -> tuple[float, ...]:
    """Each stage's time in a split given as layers per stage (over the table's units)."""
    bounds = np.concatenate([[0], np.cumsum(layers_per_stage)])
    count = len(layers_per_stage)
    return tuple(time.cost(int(bounds[i]) + 1, int(bounds[i + 1]), count - i) for i in range(count))


def _chunk_units(spec: LlamaSpec, training: TrainingOptions, pp: int, release,
                 tables: tuple[CostTable, CostTable | None]) -> tuple[CostTable, CostTable | None]:
    """The tables the planner may split: over layers, or, where ``release`` runs the recomputation
    only on stages whose layers N divides (``Recomputation.chunk_multiple``: the uniform method on
    core 0.15), over units of N layers, so that every planned stage holds a multiple of N (as
    CAPTURE's merged units do). One line where no split can."""
    multiple = training.recomputation.chunk_multiple(release)
    if multiple == 1:
        return tables
    from advisor.options.training import uniform_chunk_rule

    layers = spec.num_layers
    if layers % multiple or layers // multiple < pp:
        raise AdvisorError(f"--recompute-method uniform --recompute-num-layers {multiple}: no split of {layers} "
                           f"layers over PP {pp} gives every stage a multiple of {multiple} layers; "
                           f"{uniform_chunk_rule(release)}")
    groups = tuple((first, first + multiple - 1) for first in range(1, layers + 1, multiple))
    return tuple(None if table is None else unit_table(table.values, groups) for table in tables)


def recommend_analytic(spec: LlamaSpec, workload: Workload, options: TrainingOptions, *, gpus: int,
                       gpus_per_node: int, tp: int, cp: int, pp: int, micro_batch_size: int,
                       objective: Objective = "memory", stage_limit: float | None = None,
                       gpu_memory: float | None = None, timing: Timing | None = None, release=None,
                       calibration: MemoryCalibration | None = None, threshold: float = DEFAULT_THRESHOLD) -> Plan:
    """Without profiles: seed 004's memory per stage and position, or with ``calibration`` the
    calibrated model's usage (as advisor sweep and estimate judge a layout on ``gpu_memory``),
    the time model's stage times; the lowest peak, or MadPipe's shortest period within
    ``stage_limit`` bytes, among the splits Megatron-LM ``release`` runs (None: the newest); the
    plan's flags state every training option of ``options``. ``gpu_memory`` (bytes per GPU, if
    known) is the plan's memory limit, and its peak's verdict (``threshold``: the paper rule's)."""
    if calibration is not None and gpu_memory is None:
        raise AdvisorError("the calibrated memory model needs the GPU's memory")
    training, options = options.at_tp(tp), options.memory_options(release)
    gbs = workload.global_batch_size
    if gbs is None:
        raise AdvisorError("a plan needs the global batch size")
    check_layout(spec, ParallelConfig(tp=tp, cp=cp, pp=1, dp=1, mbs=micro_batch_size),
                 Workload(seq_len=workload.seq_len, global_batch_size=None))
    dp, m = _uniform_layout(spec, gpus, gpus_per_node, tp, cp, pp, micro_batch_size, gbs)
    scenario = Scenario(tp=tp, dp=dp)
    memory, time = analytic_tables(spec, workload.seq_len, options, tp=tp, cp=cp, dp=dp, mbs=micro_batch_size,
                                   pp=pp, num_microbatches=m, timing=timing,
                                   calibrated=None if calibration is None else (calibration, gpu_memory / GIB))
    units = _chunk_units(spec, training, pp, release, (memory, time))
    solution, times = _plan_split(*units, pp, scenario, objective, stage_limit)
    per_stage = tp * cp * dp
    stages = _stages(solution, units[0], m, cp,
                     lambda index, stage: tuple(range(index * per_stage, (index + 1) * per_stage)), times)
    layers = tuple(stage.layers for stage in stages)
    even = tuple(even_split(spec.num_layers, pp))
    baseline = Baseline(label=f"even split, PP {pp}", layers_per_stage=even,
                        stage_bytes=_split_times(memory, even),
                        stage_times=None if time is None else _split_times(time, even))
    step = baseline_step = None
    if timing is not None:
        layouts = timing.layouts(tp=np.array([tp]), cp=np.array([cp]), dp=np.array([dp]),
                                 mbs=np.array([micro_batch_size]), pp=np.array([pp]),
                                 selective=options.recompute == "selective")
        recompute = recomputed_per_chunk(options.recompute, options.recompute_method,
                                         np.array([options.recompute_num_layers]), spec.num_layers)
        model = StageModel(spec, workload.seq_len, options, tp=tp, cp=cp, dp=dp, mbs=micro_batch_size, pp=pp,
                           vpp=1, num_microbatches=m, stage=np.arange(pp)[None, :])
        step, baseline_step = (float(layouts.step(np.array([0]), np.array([1]), recompute, counts,
                                                  model.parameters(counts).max(axis=1)).total_s[0])
                               for counts in (np.array([layers]), np.array([even])))
        baseline = replace(baseline, step_time_s=baseline_step)
    setup = MegatronSetup(distributed_optimizer=options.distributed_optimizer,
                          sequence_parallel=options.sequence_parallel, bias_swiglu_fusion=options.bias_swiglu_fusion)
    return Plan(
        mode="megatron", predictor="seed004", model=spec, seq_len=workload.seq_len, setup=setup, gpus=gpus,
        gpus_per_node=gpus_per_node, tp=tp, cp=cp, dp=dp, micro_batch_size=micro_batch_size, global_batch_size=gbs,
        num_microbatches=m, stages=stages, baseline=baseline,
        # in the words of the release priced: they run, and read back, as priced there
        megatron_args=tuple(release_spelling(release, megatron_args(
            spec, workload.seq_len, tp=tp, cp=cp, layers_per_stage=layers, micro_batch_size=micro_batch_size,
            global_batch_size=gbs, options=training, release=release))),
        megatron_version=release_defaults(release).checked,
        objective=objective, **_limits(objective, stage_limit, gpu_memory), step_time_s=step, options=training,
        memory_model="paper" if calibration is None else "calibrated",
        verdict=_verdict(max(stage.predicted_bytes for stage in stages), gpu_memory, calibration, threshold),
    )


def _verdict(peak_bytes: float, gpu_memory: float | None, calibration: MemoryCalibration | None,
             threshold: float) -> str | None:
    """The verdict advisor estimate gives a layout of this peak: the calibrated model's, or the
    paper's 80% rule on Eq. 18; None without the GPU's memory."""
    if gpu_memory is None:
        return None
    return judge(peak_bytes / GIB, gpu_memory / GIB, band=calibration and calibration.band, threshold=threshold)


def _megatron_args(profiles: ProfileSet, tp: int, stages, micro_batch_size: int, global_batch_size: int):
    setup = profiles.setup
    return tuple(megatron_args(
        profiles.model, profiles.seq_len, tp=tp, cp=profiles.cp, layers_per_stage=[stage.layers for stage in stages],
        micro_batch_size=micro_batch_size, global_batch_size=global_batch_size,
        options=setup.training_options()))


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


def _reasons(excluded: list[tuple[str, str]]) -> str:
    """Each excluded scenario's reason, the advice CAPTURE's statistics close with
    (``statistics.FULL_CAMPAIGN``) said once where every one ends with it (audit: the five scenarios
    of a reduced campaign under --predictor capture repeated it five times)."""
    tail = f"; {FULL_CAMPAIGN}"
    if len(excluded) > 1 and all(reason.endswith(tail) for _, reason in excluded):
        return "; ".join(f"{name}: {reason.removesuffix(tail)}" for name, reason in excluded) + \
            f". For all: {FULL_CAMPAIGN}"
    return "; ".join(f"{name}: {reason}" for name, reason in excluded)


def recommend_hybrid(profiles: ProfileSet, *, gpus: int, gpus_per_node: int, micro_batch_size: int,
                     global_batch_size: int, predictor: PredictorName = "1f1b", merge_to: int | None = None,
                     gpu_memory: float | None = None) -> Plan:
    """CAPTURE's hybrid space on ``gpus`` GPUs in nodes of ``gpus_per_node``; ``gpu_memory``
    (bytes per GPU, if known) is the plan's memory limit."""
    cp = profiles.cp
    if gpus % gpus_per_node:  # audit: --gpus 4 on the default nodes of 8 named CP too, and not the flag to give
        raise AdvisorError(f"--gpus {gpus} must be whole nodes of {gpus_per_node} GPUs (hybrid stages stay "
                           f"within a node): give --gpus-per-node N, the GPUs your nodes hold")
    if gpus_per_node % cp:
        raise AdvisorError(f"the profiles' CP {cp} must divide a node of --gpus-per-node {gpus_per_node} GPUs")
    if global_batch_size % micro_batch_size:  # hybrid mode: the pipeline's microbatch, no DP factor
        raise AdvisorError(f"--gbs {global_batch_size} is not divisible by the pipeline microbatch (--mbs) "
                           f"{micro_batch_size}")
    m = global_batch_size // micro_batch_size
    per_node, devices = gpus_per_node // cp, gpus // cp
    predictor = make_predictor(profiles, predictor, merge_to, micro_batch_size)
    tables, excluded = hybrid_tables(predictor, devices_per_node=per_node, devices=devices,
                                     micro_batch_size=micro_batch_size, num_microbatches=m)
    if not tables:
        raise AdvisorError(f"no stage config can be predicted: {_reasons(excluded)}")
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
        # the pipelining-only plan on as many devices, as CAPTURE's Fig. 6 sets hybrid against pipelining only
        baseline=_baseline(predictor, profiles.num_layers, devices, PIPELINE, micro_batch_size, m,
                           f"even split, pipelining only, PP {devices}"),
        megatron_args=_megatron_args(profiles, tp, stages, micro_batch_size // dp, global_batch_size)
        if uniform else None,
        excluded=tuple(excluded), memory_limit_bytes=gpu_memory,
    )
