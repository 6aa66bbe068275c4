"""A profiling campaign: CAPTURE's profiling runs (seed 000, Section III-A), as Megatron runs.

Schema ``megatron-4d-advisor/campaign``, version 1. One JSON object:

    schema, version, mode ("full" | "reduced" | "measure": given layouts at one batch, to check
        predictions; ``layout_campaign``), model (LlamaSpec fields), seq_len, gpus,
    gpus_per_node, cp, setup {params_dtype, distributed_optimizer, sequence_parallel,
        bias_swiglu_fusion (written only when false: every run carries --no-bias-swiglu-fusion;
        absent, Megatron's fused SwiGLU)}: ``MegatronSetup``, whose ``training_options`` write the
        runs' training flags and whose ``memory_options`` price them,
    target {micro_batch_size, global_batch_size, num_microbatches}: the training run the
        profiles are for (a pipeline microbatch: sequences entering the pipeline),
    fractions: the batch fractions profiled (default [0.5, 0.25]),
    scenarios: one per profiled scenario: name ("pp" | "dpK" | "tpK"), tp, dp, stages (S),
        pipeline_microbatches (the two profiled), units (layers per profiling unit; all 1 unless
        merged), partitionings (count), uncovered_mi / uncovered_ma (layers whose CAPTURE
        statistic no run of this scenario measures; empty unless S < 3 or L = S),
    skipped: [{scenario, reason}] for the scenarios that cannot run here,
    runs: [{id, scenario, tp, dp, cp, pp, pipeline_microbatch, micro_batch_size,
        num_microbatches, global_batch_size, world_size, layers_per_stage, source,
        launchable, megatron_args}].

``id`` is built from the run's content (scenario, pipeline microbatch, layers per stage; for
example ``tp2-b4-4.2.1.9``, ``2x7`` meaning seven stages of 2), so it is stable across
regenerations and a runner can resume by skipping ids it has finished. ``micro_batch_size`` is
per data-parallel replica (Megatron's --micro-batch-size): the pipeline microbatch divided by
DP. ``megatron_args`` are real Megatron-LM flags (core_v0.15.2) for the model, the split and the
batch; the launcher adds data, tokenizer and iteration flags, and starts ``world_size`` ranks.

Every run gives all of its stages one TP and DP degree (CAPTURE profiles each scenario on its
own), so every run is launchable on stock Megatron (``launchable: true``); only the
recommender's hybrid plans, with a degree per stage, need per-stage emulation.

Batch sizes. CAPTURE profiles at a half and a quarter of the target batch, with the number of
microbatches unchanged, so what shrinks is the microbatch (Description 2 then draws a line
through the two). We scale the pipeline microbatch by each fraction and round up to what the
scenario can run: a whole number, and a multiple of K for DP-K (each replica needs at least one
sequence). If both round to the same size, the larger moves up one step, so there are always two
points. Each run has min(S, m_target) microbatches: the fewest at which every stage reaches its
1F1B in-flight count of the target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from advisor.capture import partitionings
from advisor.capture.coverage import sources, stage_ranges
from advisor.capture.layout import PIPELINE, PROFILED_DEGREES, Scenario
from advisor.megatron_args import MegatronSetup, megatron_args
from advisor.memory import tp_problem
from advisor.errors import AdvisorError
from advisor.models import LlamaSpec
from advisor.render import counts_text

SCHEMA = "megatron-4d-advisor/campaign"
VERSION = 1
PROFILING_ITERATIONS = 2
"""Training iterations of one profiling run, as CAPTURE's."""
Mode = Literal["full", "reduced", "measure"]


@dataclass(frozen=True, kw_only=True, slots=True)
class CampaignRun:
    id: str
    scenario: Scenario
    cp: int
    layers_per_stage: tuple[int, ...]
    pipeline_microbatch: int
    num_microbatches: int
    source: str
    """Which part of the generator asked for it: 'description-1', 'reduced', or the caller's
    label of a measured layout ('measure', 'held-out')."""
    megatron_args: tuple[str, ...]
    ep: int | None = None
    """A mixture of experts' expert-parallel size (None: a dense model)."""
    etp: int | None = None
    """A mixture of experts' expert tensor-parallel size (None: a dense model)."""

    @property
    def micro_batch_size(self) -> int:
        return self.pipeline_microbatch // self.scenario.dp

    @property
    def global_batch_size(self) -> int:
        return self.pipeline_microbatch * self.num_microbatches

    @property
    def world_size(self) -> int:
        return self.scenario.gpus * self.cp * len(self.layers_per_stage)

    def to_dict(self) -> dict:
        return {
            "id": self.id, "scenario": self.scenario.name, "tp": self.scenario.tp, "dp": self.scenario.dp,
            "cp": self.cp, "pp": len(self.layers_per_stage), "pipeline_microbatch": self.pipeline_microbatch,
            "micro_batch_size": self.micro_batch_size, "num_microbatches": self.num_microbatches,
            "global_batch_size": self.global_batch_size, "world_size": self.world_size,
            "layers_per_stage": list(self.layers_per_stage), "source": self.source, "launchable": True,
            "megatron_args": list(self.megatron_args),
            **({"ep": self.ep, "etp": self.etp} if self.ep is not None else {}),
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class ScenarioPlan:
    scenario: Scenario
    stages: int
    pipeline_microbatches: tuple[int, int]
    units: tuple[int, ...]
    partitionings: int
    uncovered_mi: tuple[int, ...] = ()
    uncovered_ma: tuple[int, ...] = ()

    def to_dict(self) -> dict:
        return {
            "name": self.scenario.name, "tp": self.scenario.tp, "dp": self.scenario.dp, "stages": self.stages,
            "pipeline_microbatches": list(self.pipeline_microbatches), "units": list(self.units),
            "partitionings": self.partitionings, "uncovered_mi": list(self.uncovered_mi),
            "uncovered_ma": list(self.uncovered_ma),
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class Campaign:
    mode: Mode
    model: LlamaSpec
    seq_len: int
    gpus: int
    gpus_per_node: int
    cp: int
    setup: MegatronSetup
    micro_batch_size: int
    global_batch_size: int
    fractions: tuple[float, ...]
    scenarios: tuple[ScenarioPlan, ...]
    skipped: tuple[tuple[str, str], ...]
    runs: tuple[CampaignRun, ...] = field(repr=False)

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA, "version": VERSION, "mode": self.mode, "model": self.model.to_dict(),
            "seq_len": self.seq_len, "gpus": self.gpus, "gpus_per_node": self.gpus_per_node, "cp": self.cp,
            "setup": self.setup.to_dict(),
            "target": {"micro_batch_size": self.micro_batch_size, "global_batch_size": self.global_batch_size,
                       "num_microbatches": self.global_batch_size // self.micro_batch_size},
            "fractions": list(self.fractions),
            "scenarios": [plan.to_dict() for plan in self.scenarios],
            "skipped": [{"scenario": name, "reason": reason} for name, reason in self.skipped],
            "runs": [run.to_dict() for run in self.runs],
        }


def profile_microbatches(target: int, fractions: tuple[float, ...], step: int) -> tuple[int, int]:
    """The two pipeline microbatches to profile: each fraction of ``target``, rounded up to a
    multiple of ``step`` (K for DP-K); the larger moves up a step if they coincide."""
    low, high = sorted(max(step, math.ceil(f * target / step) * step) for f in fractions)
    if high == low:
        high = low + step
    return low, high


def _scenarios(spec: LlamaSpec, devices: int, devices_per_node: int) -> tuple[list, list]:
    """The scenarios to profile, and the skipped ones with the reason."""
    wanted = [PIPELINE] + [Scenario(dp=k) for k in PROFILED_DEGREES] + [Scenario(tp=k) for k in PROFILED_DEGREES]
    chosen, skipped = [], []
    for scenario in wanted:
        k = scenario.gpus
        stages = devices // k
        reason = None
        if k > devices_per_node:
            reason = f"{k}-way needs {k} GPUs in one node; a node has {devices_per_node}"
        elif devices % k:
            reason = f"{devices} GPUs do not divide into sub-meshes of {k}"
        elif scenario.tp > 1 and (problem := tp_problem(spec, k)):
            reason = problem
        elif stages < 2:
            reason = f"{stages} sub-mesh of {k}: one stage leaves no partitioning to vary"
        elif spec.num_layers < stages:
            reason = f"{spec.num_layers} layers cannot fill {stages} stages"
        if reason:
            skipped.append((scenario.name, reason))
        else:
            chosen.append((scenario, stages))
    return chosen, skipped


def _expand(unit_counts: tuple[int, ...], units: tuple[int, ...]) -> tuple[int, ...]:
    """Units per stage -> layers per stage, with ``units[i]`` layers in unit i."""
    layers, index = [], 0
    for count in unit_counts:
        layers.append(sum(units[index:index + count]))
        index += count
    return tuple(layers)


def plan_campaign(
    spec: LlamaSpec, *, gpus: int, gpus_per_node: int, seq_len: int, micro_batch_size: int,
    global_batch_size: int, mode: Mode = "full", fractions: tuple[float, ...] = (0.5, 0.25), cp: int = 1,
    setup: MegatronSetup = MegatronSetup(), units: tuple[int, ...] | None = None,
    num_microbatches: int | None = None, ep: int | None = None, etp: int | None = None,
) -> Campaign:
    """Every profiling run for ``spec`` on ``gpus`` GPUs. ``units`` (layers per merged unit, from
    the layer merger, Section III-A3) applies to the DP and TP scenarios; the pipeline-only
    scenario is always profiled layer by layer, as the merger needs its statistics first. A
    mixture of experts' runs carry ``ep`` and ``etp`` (default 1) and the MoE flags; a scenario
    whose TP x CP x DP ranks cannot hold EP x ETP (megatron-core's expert groups) is skipped."""
    _check_inputs(spec, gpus, gpus_per_node, cp, micro_batch_size, global_batch_size, fractions, units)
    experts = _expert_degrees(spec, ep, etp)
    target_m = global_batch_size // micro_batch_size
    chosen, skipped = _scenarios(spec, gpus // cp, gpus_per_node // cp)
    generate = partitionings.description1 if mode == "full" else partitionings.reduced
    plans, runs = [], []
    for scenario, stages in chosen:
        scenario_units = units if (units and scenario != PIPELINE) else (1,) * spec.num_layers
        if len(scenario_units) < stages:
            skipped.append((scenario.name, f"{len(scenario_units)} merged units cannot fill {stages} stages"))
            continue
        if experts and (scenario.gpus * cp) % (experts[0] * experts[1]):
            skipped.append((scenario.name, f"EP x ETP = {experts[0] * experts[1]} does not divide its TP x CP x DP "
                                           f"= {scenario.gpus * cp} ranks"))
            continue
        found = generate(len(scenario_units), stages)
        missing_mi, missing_ma = sources(r for p in found for r in stage_ranges(p)).missing(len(scenario_units))
        batches = profile_microbatches(micro_batch_size, fractions, scenario.dp)
        m = num_microbatches or min(stages, target_m)
        for batch in batches:
            for unit_counts in found:
                runs.append(_campaign_run(spec, seq_len, scenario, cp, _expand(unit_counts, scenario_units), batch, m,
                                          setup, "description-1" if mode == "full" else "reduced", experts))
        plans.append(ScenarioPlan(
            scenario=scenario, stages=stages, pipeline_microbatches=batches, units=scenario_units,
            partitionings=len(found),
            uncovered_mi=tuple(missing_mi) if mode == "full" else (),
            uncovered_ma=tuple(missing_ma) if mode == "full" else (),
        ))
    if not runs:
        raise AdvisorError(_no_runs(spec, gpus, gpus_per_node, cp, skipped, experts))
    return Campaign(
        mode=mode, model=spec, seq_len=seq_len, gpus=gpus, gpus_per_node=gpus_per_node, cp=cp, setup=setup,
        micro_batch_size=micro_batch_size, global_batch_size=global_batch_size, fractions=tuple(fractions),
        scenarios=tuple(plans), skipped=tuple(skipped), runs=tuple(runs),
    )


def _no_runs(spec: LlamaSpec, gpus: int, gpus_per_node: int, cp: int, skipped: list, experts) -> str:
    """Why a campaign has no run, from its skipped scenarios' own reasons, and what to change (a
    plan of no runs was printed as an empty table, exit 0; a mixture of experts was told to lower
    EP whatever the reason)."""
    if experts and all(reason.startswith("EP x ETP") for _, reason in skipped):
        return (f"no scenario's TP x CP x DP ranks on {gpus} GPUs ({gpus_per_node} per node) hold EP x ETP "
                f"= {experts[0] * experts[1]}: plan more GPUs per node or a smaller --ep/--etp")
    reasons = "; ".join(f"{name}: {reason}" for name, reason in skipped)
    hint = ""
    if gpus // cp > spec.num_layers:  # each scenario's sub-meshes are its pipeline stages
        hint = (f"; profile on at most {spec.num_layers * cp} GPUs (a few nodes: 'advisor recommend --gpus' then "
                "plans the whole cluster from their profiles)")
    return f"no scenario can be profiled on {gpus} GPUs ({gpus_per_node} per node): {reasons}{hint}"


def _expert_degrees(spec: LlamaSpec, ep: int | None, etp: int | None) -> tuple[int, int] | None:
    """(EP, ETP) of a mixture of experts' runs (1 where not given), None for a dense model."""
    if not getattr(spec, "num_experts", None):
        if (ep or 1) > 1 or (etp or 1) > 1:
            raise AdvisorError(f"--ep/--etp need a mixture-of-experts model; {spec.name} is dense")
        return None
    ep, etp = ep or 1, etp or 1
    if spec.num_experts % ep:
        raise AdvisorError(f"EP {ep} must divide the {spec.num_experts} experts")
    return ep, etp


def _campaign_run(spec: LlamaSpec, seq_len: int, scenario: Scenario, cp: int, layers: tuple[int, ...], batch: int,
                  m: int, setup: MegatronSetup, source: str, experts: tuple[int, int] | None = None) -> CampaignRun:
    args = megatron_args(
        spec, seq_len, tp=scenario.tp, cp=cp, layers_per_stage=layers, micro_batch_size=batch // scenario.dp,
        global_batch_size=batch * m, options=setup.training_options(),
    )
    if experts is not None:  # the MoE model's and expert layout's flags (advisor.moe.flags, as MoE rows have them)
        from advisor.moe.flags import layout_flags, model_flags

        args += model_flags(spec) + layout_flags(ep=experts[0], etp=experts[1], dispatcher="alltoall")
    return CampaignRun(id=f"{scenario.name}-b{batch}-{counts_text(layers, '.')}", scenario=scenario, cp=cp,
                       layers_per_stage=layers, pipeline_microbatch=batch, num_microbatches=m, source=source,
                       megatron_args=tuple(args), ep=experts and experts[0], etp=experts and experts[1])


def layout_campaign(
    spec: LlamaSpec, layouts: list[tuple[int, ...]], *, seq_len: int, pipeline_microbatch: int, num_microbatches: int,
    scenario: Scenario = PIPELINE, cp: int = 1, setup: MegatronSetup = MegatronSetup(), source: str = "measure",
) -> Campaign:
    """Given layouts, each a run at one batch (mode "measure"): what a recommended plan or a
    held-out set needs measured to check a prediction. Every run uses the same degrees."""
    if not layouts:
        raise AdvisorError("no layouts to measure")
    if pipeline_microbatch % scenario.dp:
        raise AdvisorError(f"DP {scenario.dp} does not divide the pipeline microbatch {pipeline_microbatch}")
    for layers in layouts:
        if sum(layers) != spec.num_layers or min(layers) < 1:
            raise AdvisorError(f"layout {list(layers)} does not place {spec.num_layers} layers, each stage at least one")
    runs = [_campaign_run(spec, seq_len, scenario, cp, tuple(layers), pipeline_microbatch, num_microbatches, setup,
                          source) for layers in dict.fromkeys(map(tuple, layouts))]
    gpus = max(run.world_size for run in runs)
    return Campaign(
        mode="measure", model=spec, seq_len=seq_len, gpus=gpus, gpus_per_node=scenario.gpus * cp, cp=cp, setup=setup,
        micro_batch_size=pipeline_microbatch, global_batch_size=pipeline_microbatch * num_microbatches, fractions=(),
        scenarios=(), skipped=(), runs=tuple(runs),
    )


def _check_inputs(spec, gpus, gpus_per_node, cp, micro_batch_size, global_batch_size, fractions, units) -> None:
    if gpus % gpus_per_node:
        raise AdvisorError(f"--gpus {gpus} is not a whole number of nodes of {gpus_per_node} GPUs")
    if gpus_per_node % cp:
        raise AdvisorError(f"--cp {cp} must divide --gpus-per-node {gpus_per_node} (CP groups stay inside a node)")
    if global_batch_size % micro_batch_size:
        raise AdvisorError(f"--gbs {global_batch_size} is not divisible by --mbs {micro_batch_size}")
    if len(fractions) != 2 or len(set(fractions)) != 2 or not all(0 < f <= 1 for f in fractions):
        raise AdvisorError(f"--fractions {_listed(fractions)}: give two different fractions of --mbs in (0, 1], "
                           "such as 0.5,0.25")
    if units is not None and min(units) < 1:
        raise AdvisorError(f"--units {_listed(units)}: every merged unit holds at least one layer")
    if units is not None and sum(units) != spec.num_layers:
        raise AdvisorError(f"--units {_listed(units)} sums to {sum(units)} layers, not the model's {spec.num_layers}")


def _listed(values) -> str:
    """Numbers as the user typed them, comma-separated."""
    return ",".join(f"{value:g}" for value in values)


def read_campaign(path: str | Path) -> dict:
    """A campaign document, read through the bounded reader and checked: schema and version, then
    every run against itself and the campaign (``campaign_check.check_campaign``). Returns the
    document as written."""
    from advisor.capture.campaign_check import check_campaign
    from advisor.fileio import read_json

    path = Path(path)
    document = read_json(path, what="campaign file")
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise AdvisorError(f"{path}: not a profiling campaign (schema {SCHEMA!r})")
    if document.get("version") != VERSION:
        raise AdvisorError(f"{path}: campaign schema version {document.get('version')!r}; this advisor reads {VERSION}")
    check_campaign(document, path)
    return document
