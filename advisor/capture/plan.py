"""A recommended plan, and its JSON document for the launcher.

Schema ``megatron-4d-advisor/plan``, version 1. One JSON object:

    schema, version, mode ("megatron" | "hybrid"), objective ("memory": the lowest peak;
        "time": MadPipe's shortest period with every stage within stage_limit_gib),
    launchable (true: stock Megatron-LM runs it with ``megatron_args``; false: stages have
        different TP/DP degrees, which stock Megatron cannot build; only per-stage emulation or a
        framework with per-stage meshes, such as Alpa, can run it),
    not_launchable_reason (null when launchable),
    predictor {name: the predictor that priced the plan ("1f1b" | "capture" from profiles;
        "seed004": the analytic estimator, without profiles),
        profile_runs (directory names), skipped_runs [{run, status}], stopped_early_runs [{run,
        iterations, asked_iterations}] (runs used that Megatron ended before the iterations they
        were asked for: --exit-interval, --exit-duration-in-mins, a signal), fits (1f1b: per scenario and
        microbatch, c0, c1 and the residuals)},
    model (LlamaSpec fields), seq_len, setup {params_dtype, distributed_optimizer,
        sequence_parallel, bias_swiglu_fusion (only when false), transformer_impl (only when
        "local": the profiles' layer spec, ``observations.launched_transformer_impl``)},
    gpus, gpus_per_node, world_size,
    tp, cp, dp (uniform degrees; tp and dp null in hybrid plans), pp (stages),
    micro_batch_size (Megatron's, per DP replica; in hybrid plans the pipeline microbatch),
    global_batch_size, num_microbatches (per pipeline per iteration),
    layers_per_stage [int],
    stages [{stage, first_layer, last_layer, layers, tp, dp, cp, gpus [global GPU indices],
        nodes [node indices], in_flight_microbatches, predicted_bytes, predicted_gib}],
    gpu_memory [{gpu, node, stage, predicted_gib}] for every GPU (Megatron rank order
        tp-cp-dp-pp: stage i holds ranks i*t*c*d .. (i+1)*t*c*d - 1),
    peak_predicted_gib, memory_limit_gib (the memory of each GPU the plan is for: --mem or the
        --gpu preset's; null when neither was given), stage_limit_gib (time objective: --threshold x
        memory_limit_gib, less the runtime's memory and the allocator's reserve where the stages are
        profiled allocations; the limit every stage was kept within; null otherwise), period_s (the
        slowest stage's time; null without times), predicted_step_time_s (with a time model; null
        otherwise),
    baseline (null, or the even split with the same degrees: {label, layers_per_stage,
        stage_predicted_gib [per stage], peak_predicted_gib, stage_predicted_time_s, period_s,
        predicted_step_time_s}),
    excluded [{scenario, reason}]: stage configs the planner could not consider,
    options: the training options the plan was priced with, every field
        (``advisor.options.TrainingOptions.flat``); the launcher emits the flags from them, so
        what is launched is what was priced (older plans without it launch their megatron_args),
    megatron_version (the Megatron-LM release an analytic plan was priced for, 'core_v0.19.0';
        null for plans from profiles, and absent from plans written before plans named one),
    megatron_args [str] (launchable plans only; null otherwise): model, parallel, split, batch and
        training-option flags, in the words of megatron_version's release where the plan names one
        (``advisor.options.flags.release_spelling``); the launcher adds data, tokenizer and iterations.

Memory is per GPU, in bytes (``predicted_bytes``) and GiB (2^30 bytes).

``check_plan`` checks a plan document against itself before anything launches it or draws it (a
plan may be edited by hand): one error line naming the file and the field. It is the one reader of
a plan for advisor-launch and ``advisor report`` (``advisor.capture.plan_fields``: no unknown field,
its per-GPU memory, options and drawn numbers).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from advisor import limits
from advisor.capture.plan_fields import check_plan_fields
from advisor.errors import AdvisorError
from advisor.megatron_args import MegatronSetup
from advisor.memory import GIB
from advisor.model_spec import from_fields
from advisor.models import LlamaSpec
from advisor.options import TrainingOptions

SCHEMA = "megatron-4d-advisor/plan"
VERSION = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanStage:
    stage: int
    first_layer: int
    last_layer: int
    tp: int
    dp: int
    cp: int
    gpus: tuple[int, ...]
    in_flight_microbatches: int
    predicted_bytes: float
    predicted_time_s: float | None = None
    """Forward and backward seconds per microbatch (the time objective's planners)."""

    @property
    def layers(self) -> int:
        return self.last_layer - self.first_layer + 1

    def to_dict(self, gpus_per_node: int) -> dict:
        return {
            "stage": self.stage, "first_layer": self.first_layer, "last_layer": self.last_layer, "layers": self.layers,
            "tp": self.tp, "dp": self.dp, "cp": self.cp, "gpus": list(self.gpus),
            "nodes": sorted({gpu // gpus_per_node for gpu in self.gpus}),
            "in_flight_microbatches": self.in_flight_microbatches, "predicted_bytes": self.predicted_bytes,
            "predicted_gib": self.predicted_bytes / GIB, "predicted_time_s": self.predicted_time_s,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class Baseline:
    label: str
    layers_per_stage: tuple[int, ...]
    stage_bytes: tuple[float, ...]
    stage_times: tuple[float, ...] | None = None
    step_time_s: float | None = None

    def to_dict(self) -> dict:
        return {"label": self.label, "layers_per_stage": list(self.layers_per_stage),
                "stage_predicted_gib": [value / GIB for value in self.stage_bytes],
                "peak_predicted_gib": max(self.stage_bytes) / GIB,
                "stage_predicted_time_s": None if self.stage_times is None else list(self.stage_times),
                "period_s": None if self.stage_times is None else max(self.stage_times),
                "predicted_step_time_s": self.step_time_s}


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    mode: Literal["megatron", "hybrid"]
    predictor: str
    model: LlamaSpec
    seq_len: int
    setup: MegatronSetup
    gpus: int
    gpus_per_node: int
    tp: int | None
    cp: int
    dp: int | None
    micro_batch_size: int
    global_batch_size: int
    num_microbatches: int
    stages: tuple[PlanStage, ...]
    baseline: Baseline | None
    megatron_args: tuple[str, ...] | None
    profile_runs: tuple[str, ...] = ()
    skipped_runs: tuple[tuple[str, str], ...] = ()
    stopped_early_runs: tuple[tuple[str, int, int], ...] = ()
    """(run, iterations run, iterations asked) of the profile runs used that stopped early."""
    fits: tuple[dict, ...] = ()
    excluded: tuple[tuple[str, str], ...] = ()
    objective: Literal["memory", "time"] = "memory"
    memory_limit_bytes: float | None = None
    """The memory of each GPU (--mem, or the --gpu preset's), whatever the objective; None where
    neither was given. The same in the plan printed and the plan written."""
    stage_limit_bytes: float | None = None
    """The time objective's limit on every stage (--threshold x the memory); None otherwise."""
    step_time_s: float | None = None
    """The predicted iteration time (with a time model)."""
    options: TrainingOptions | None = None
    """The training options the plan was priced with (issue 21): written whole (``flat``) as the
    plan's ``options``, and what the launcher emits the flags from."""
    megatron_version: str | None = None
    """The Megatron-LM release an analytic plan was priced for ('core_v0.19.0'), whose words its
    ``megatron_args`` are in; None for plans from profiles (no option there differs by release)."""
    memory_model: str | None = None
    """How an analytic plan's stage memory was priced: 'calibrated' (what advisor sweep and
    estimate judge with a GPU preset) or 'paper' (Eq. 18); None for a plan from profiles."""
    verdict: str | None = None
    """The analytic plan's peak judged as advisor estimate judges a layout under ``memory_model``
    (``advisor.verdicts.verdict_for``, or the paper's 80% rule); None without a memory or profiles."""

    @property
    def launchable(self) -> bool:
        return self.megatron_args is not None

    @property
    def pp(self) -> int:
        return len(self.stages)

    @property
    def layers_per_stage(self) -> tuple[int, ...]:
        return tuple(stage.layers for stage in self.stages)

    @property
    def period_s(self) -> float | None:
        """The slowest stage's forward and backward seconds per microbatch (time objective)."""
        times = [stage.predicted_time_s for stage in self.stages]
        return None if None in times else max(times)

    @property
    def peak_bytes(self) -> float:
        return max(stage.predicted_bytes for stage in self.stages)

    def gpu_memory(self) -> list[dict]:
        rows = []
        for stage in self.stages:
            for gpu in stage.gpus:
                rows.append({"gpu": gpu, "node": gpu // self.gpus_per_node, "stage": stage.stage,
                             "predicted_gib": stage.predicted_bytes / GIB})
        return sorted(rows, key=lambda row: row["gpu"])

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA, "version": VERSION, "mode": self.mode, "objective": self.objective,
            "launchable": self.launchable,
            "not_launchable_reason": None if self.launchable else (
                "stages have different TP/DP degrees; stock Megatron-LM gives every stage the same ones"),
            "predictor": {"name": self.predictor, "profile_runs": list(self.profile_runs),
                          "skipped_runs": [{"run": run, "status": status} for run, status in self.skipped_runs],
                          "stopped_early_runs": [{"run": run, "iterations": done, "asked_iterations": asked}
                                                 for run, done, asked in self.stopped_early_runs],
                          "fits": list(self.fits)},
            "model": self.model.to_dict(), "seq_len": self.seq_len, "setup": self.setup.to_dict(),
            "gpus": self.gpus, "gpus_per_node": self.gpus_per_node,
            "world_size": sum(len(stage.gpus) for stage in self.stages),
            "tp": self.tp, "cp": self.cp, "dp": self.dp, "pp": self.pp,
            "micro_batch_size": self.micro_batch_size, "global_batch_size": self.global_batch_size,
            "num_microbatches": self.num_microbatches, "layers_per_stage": list(self.layers_per_stage),
            "stages": [stage.to_dict(self.gpus_per_node) for stage in self.stages],
            "gpu_memory": self.gpu_memory(),
            "peak_predicted_gib": self.peak_bytes / GIB, "memory_model": self.memory_model, "verdict": self.verdict,
            "memory_limit_gib": None if self.memory_limit_bytes is None else self.memory_limit_bytes / GIB,
            "stage_limit_gib": None if self.stage_limit_bytes is None else self.stage_limit_bytes / GIB,
            "period_s": self.period_s, "predicted_step_time_s": self.step_time_s,
            "baseline": self.baseline.to_dict() if self.baseline else None,
            "excluded": [{"scenario": name, "reason": reason} for name, reason in self.excluded],
            "options": None if self.options is None else self.options.flat(),
            "megatron_version": self.megatron_version,
            "megatron_args": list(self.megatron_args) if self.megatron_args is not None else None,
        }


# --- checking a plan document --------------------------------------------------------------------


def _int(document: dict, key: str, where: str, bound: limits.Bound) -> int:
    if key not in document:
        raise AdvisorError(f"{where}: missing {key!r}")
    return limits.check_int(document[key], repr(key), bound, where)


def _flag(args: list[str], flag: str) -> str | None:
    """The value after the last ``flag`` in ``args`` (``--flag value`` or ``--flag=value``)."""
    value = None
    for index, arg in enumerate(args):
        if arg == flag and index + 1 < len(args):
            value = args[index + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def _expand(layout: str) -> str:
    """Megatron's layout shorthand expanded: 't*3' -> 'ttt', '(t|)*2' -> 't|t|'."""
    for _ in range(64):  # nested repetitions, each pass expands the innermost
        expanded = re.sub(r"\(([^()]*)\)\*(\d+)|([A-Za-z])\*(\d+)",
                          lambda m: (m.group(1) if m.group(1) is not None else m.group(3))
                          * min(int(m.group(2) or m.group(4)), limits.MODEL["num_layers"].high), layout)
        if expanded == layout:
            return layout
        layout = expanded
    return layout


def split_from_args(args: list[str], num_layers: int, pp: int, origin: str) -> tuple[int, ...]:
    """The decoder layers per pipeline stage that Megatron-LM builds from ``args``: its
    ``--pipeline-model-parallel-layout``, its first/last-stage counts (the rest even), or the even
    split (advisor.megatron_args writes one of these)."""
    layout = _flag(args, "--pipeline-model-parallel-layout")
    if layout is not None:
        if len(layout) > 10_000 or not re.fullmatch(r"[A-Za-z|,()*\d\s]*", layout):
            raise AdvisorError(f"{origin}: cannot read --pipeline-model-parallel-layout {layout[:40]!r}")
        return tuple(stage.count("t") for stage in _expand(layout.replace(" ", "")).split("|"))
    ends = {}
    for key, flag in (("first", "--decoder-first-pipeline-num-layers"), ("last", "--decoder-last-pipeline-num-layers")):
        value = _flag(args, flag)
        if value is not None:
            if not value.isdecimal():
                raise AdvisorError(f"{origin}: {flag} {value!r} is not a layer count")
            ends[key] = int(value)
    middle_stages = pp - len(ends)
    middle_layers = num_layers - sum(ends.values())
    if pp == 2 and len(ends) == 2 and middle_layers == 0:  # no middle stage: both ends given, adding up
        return ends["first"], ends["last"]
    if pp == 1 or middle_stages <= 0 or middle_layers < 0 or middle_layers % middle_stages:
        if not ends and pp == 1:
            return (num_layers,)
        raise AdvisorError(f"{origin}: Megatron-LM cannot split {num_layers} layers over PP {pp} with "
                           f"{', '.join(f'{k} stage {v}' for k, v in ends.items()) or 'an even split'}")
    share = middle_layers // middle_stages
    return (ends.get("first", share), *(share,) * (pp - 2), ends.get("last", share)) if pp > 1 else (share,)


def check_plan(document: dict, origin: str) -> None:
    """A plan document checked against itself (see the module docstring): its stages place the
    model's layers in order on distinct GPUs of its world (no GPU -1), each stage on TP x DP x CP
    GPUs; a launchable plan gives every stage the plan's degrees and Megatron rank order, its batch
    adds up, and its megatron_args split the layers as its layers_per_stage says."""
    where = origin
    if "model" not in document:
        raise AdvisorError(f"{where}: missing 'model'")
    try:  # an object of LlamaSpec's fields, each checked (a dataclass's TypeError named Python's internals)
        spec = from_fields(LlamaSpec, document["model"], "'model'")
    except AdvisorError as exc:
        raise AdvisorError(f"{where}: {exc}") from None
    world = _int(document, "world_size", where, limits.GPUS)
    counts = document.get("layers_per_stage")
    if not isinstance(counts, list) or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0
                                               for c in counts) or sum(counts) != spec.num_layers:
        raise AdvisorError(f"{where}: 'layers_per_stage' {limits.json_text(counts)} must be layer counts that sum to the "
                           f"model's {spec.num_layers} layers")
    stages = document.get("stages")
    if not isinstance(stages, list) or len(stages) != len(counts):
        raise AdvisorError(f"{where}: 'stages' must list one stage per entry of layers_per_stage ({len(counts)})")
    used: dict[int, int] = {}
    next_layer = 1
    for index, (stage, count) in enumerate(zip(stages, counts)):
        at = f"{where}: stage {index}"
        if not isinstance(stage, dict):
            raise AdvisorError(f"{at} must be an object")
        if _int(stage, "stage", at, limits.Bound(0, len(counts) - 1, "")) != index:
            raise AdvisorError(f"{at}: 'stage' is {stage['stage']}; stages are listed in order")
        first = _int(stage, "first_layer", at, limits.Bound(1, spec.num_layers + 1, ""))
        last = _int(stage, "last_layer", at, limits.Bound(0, spec.num_layers, ""))
        if first != next_layer or last - first + 1 != count:
            raise AdvisorError(f"{at}: layers {first}..{last} do not follow on from the stage before with "
                               f"layers_per_stage's {count} layers (expected {next_layer}..{next_layer + count - 1})")
        next_layer = last + 1
        degrees = [_int(stage, key, at, limits.DEGREE) for key in ("tp", "dp", "cp")]
        gpus = stage.get("gpus")
        if not isinstance(gpus, list) or len(gpus) != degrees[0] * degrees[1] * degrees[2]:
            raise AdvisorError(f"{at}: 'gpus' must list TP x DP x CP = {degrees[0] * degrees[1] * degrees[2]} GPUs")
        for gpu in gpus:
            if isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 <= gpu < world:
                raise AdvisorError(f"{at}: GPU {limits.json_text(gpu)} is not in the plan's world of {world} (0..{world - 1})")
            if gpu in used:
                raise AdvisorError(f"{at}: GPU {gpu} is also stage {used[gpu]}'s")
            used[gpu] = index
    if len(used) != world:
        raise AdvisorError(f"{where}: 'world_size' is {world}, but the stages use {len(used)} GPUs")
    if document.get("launchable") is True:
        _check_launchable(document, spec, counts, stages, where)
    check_plan_fields(document, stages, where)  # last: its per-GPU memory follows from the stages' GPUs


def _check_launchable(document: dict, spec: LlamaSpec, counts: list[int], stages: list[dict], where: str) -> None:
    tp, cp, dp = (_int(document, key, where, limits.DEGREE) for key in ("tp", "cp", "dp"))
    for index, stage in enumerate(stages):
        if (stage["tp"], stage["dp"], stage["cp"]) != (tp, dp, cp):
            raise AdvisorError(f"{where}: stage {index} has TP {stage['tp']}, DP {stage['dp']}, CP {stage['cp']}, but "
                               f"the plan is marked launchable with TP {tp}, DP {dp}, CP {cp} on every stage (stock "
                               f"Megatron-LM gives all stages the same degrees)")
        size = tp * cp * dp
        if sorted(stage["gpus"]) != list(range(index * size, (index + 1) * size)):
            raise AdvisorError(f"{where}: stage {index}'s GPUs are not Megatron's ranks {index * size}.."
                               f"{(index + 1) * size - 1} (rank order tp-cp-dp-pp)")
    mbs = _int(document, "micro_batch_size", where, limits.MICRO_BATCH)
    microbatches = _int(document, "num_microbatches", where, limits.GLOBAL_BATCH)
    gbs = _int(document, "global_batch_size", where, limits.GLOBAL_BATCH)
    if gbs != mbs * dp * microbatches:
        raise AdvisorError(f"{where}: 'global_batch_size' is {gbs}, but micro_batch_size x DP x num_microbatches = "
                           f"{mbs} x {dp} x {microbatches} = {mbs * dp * microbatches}")
    args = document.get("megatron_args")
    if not isinstance(args, list) or not all(isinstance(arg, str) for arg in args):
        raise AdvisorError(f"{where}: 'megatron_args' must be a list of strings")
    built = split_from_args(args, spec.num_layers, len(counts), where)
    if list(built) != list(counts):
        raise AdvisorError(f"{where}: its megatron_args make Megatron-LM build {'/'.join(map(str, built))} layers per "
                           f"stage, its layers_per_stage say {'/'.join(map(str, counts))} (the flags are what launches)")
