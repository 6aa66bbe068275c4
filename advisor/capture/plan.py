"""A recommended plan, and its JSON document for the launcher.

Schema ``megatron-4d-advisor/plan``, version 1. One JSON object:

    schema, version, mode ("megatron" | "hybrid"), objective ("memory": the lowest peak;
        "time": MadPipe's shortest period within memory_limit_gib),
    launchable (true: stock Megatron-LM runs it with ``megatron_args``; false: stages have
        different TP/DP degrees, which stock Megatron cannot build; only per-stage emulation or a
        framework with per-stage meshes, such as Alpa, can run it),
    not_launchable_reason (null when launchable),
    predictor {name ("1f1b" | "capture" from profiles; "seed004": the analytic estimator),
        profile_runs (directory names), skipped_runs [{run, status}], fits (1f1b: per scenario and
        microbatch, c0, c1 and the residuals)},
    model (LlamaSpec fields), seq_len, setup {params_dtype, distributed_optimizer,
        sequence_parallel},
    gpus, gpus_per_node, world_size,
    tp, cp, dp (uniform degrees; tp and dp null in hybrid plans), pp (stages),
    micro_batch_size (Megatron's, per DP replica; in hybrid plans the pipeline microbatch),
    global_batch_size, num_microbatches (per pipeline per iteration),
    layers_per_stage [int],
    stages [{stage, first_layer, last_layer, layers, tp, dp, cp, gpus [global GPU indices],
        nodes [node indices], in_flight_microbatches, predicted_bytes, predicted_gib}],
    gpu_memory [{gpu, node, stage, predicted_gib}] for every GPU (Megatron rank order
        tp-cp-dp-pp: stage i holds ranks i*t*c*d .. (i+1)*t*c*d - 1),
    peak_predicted_gib, memory_limit_gib (time objective; null otherwise), period_s (the slowest
        stage's time; null without times), predicted_step_time_s (with a time model; null otherwise),
    baseline (null, or the even split with the same degrees: {label, layers_per_stage,
        stage_predicted_gib [per stage], peak_predicted_gib, stage_predicted_time_s, period_s,
        predicted_step_time_s}),
    excluded [{scenario, reason}]: stage configs the planner could not consider,
    megatron_args [str] (launchable plans only; null otherwise): model, parallel, split and batch
        flags of Megatron-LM core_v0.15.2; the launcher adds data, tokenizer and iterations.

Memory is per GPU, in bytes (``predicted_bytes``) and GiB (2^30 bytes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from advisor.megatron_args import MegatronSetup
from advisor.memory import GIB
from advisor.models import LlamaSpec

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
    fits: tuple[dict, ...] = ()
    excluded: tuple[tuple[str, str], ...] = ()
    objective: Literal["memory", "time"] = "memory"
    memory_limit_bytes: float | None = None
    """The time objective's limit on every stage (the memory objective has none)."""
    step_time_s: float | None = None
    """The predicted iteration time (with a time model)."""

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
                          "fits": list(self.fits)},
            "model": self.model.to_dict(), "seq_len": self.seq_len, "setup": self.setup.to_dict(),
            "gpus": self.gpus, "gpus_per_node": self.gpus_per_node,
            "world_size": sum(len(stage.gpus) for stage in self.stages),
            "tp": self.tp, "cp": self.cp, "dp": self.dp, "pp": self.pp,
            "micro_batch_size": self.micro_batch_size, "global_batch_size": self.global_batch_size,
            "num_microbatches": self.num_microbatches, "layers_per_stage": list(self.layers_per_stage),
            "stages": [stage.to_dict(self.gpus_per_node) for stage in self.stages],
            "gpu_memory": self.gpu_memory(),
            "peak_predicted_gib": self.peak_bytes / GIB,
            "memory_limit_gib": None if self.memory_limit_bytes is None else self.memory_limit_bytes / GIB,
            "period_s": self.period_s, "predicted_step_time_s": self.step_time_s,
            "baseline": self.baseline.to_dict() if self.baseline else None,
            "excluded": [{"scenario": name, "reason": reason} for name, reason in self.excluded],
            "megatron_args": list(self.megatron_args) if self.megatron_args is not None else None,
        }
