"""Seed 004's per-GPU memory estimator, for every pipeline stage.

The paper (Section 3.3) reports the first stage, which holds the embedding and the
activations of p microbatches:

    M = (6 + 12/(dc)) (hv/t + 2(L/p) h^2 ((1 + k/a + 3/2 h_ffn/h)/t + 1/h))          # Eq. 10
      + sbh/(tc) ((12 + 4k/a + 8h_ffn/h) L + 8p + delta_{p,1} 4(1 + v/h))            # Eq. 17

We generalise it to stage i of p under 1F1B: stage i keeps p - i microbatches in flight
(Section 3.2.2), the last stage carries the LM head and the final norm (Eq. 9, 14), and with
p = 1 the single stage carries both ends. Every default reproduces the paper's tables.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Literal

import numpy as np

from advisor import memory_levers as levers
from advisor import schedule
from advisor.errors import AdvisorError
from advisor.models import LlamaSpec
from advisor.parallel import ParallelConfig, Workload, default_layers_per_stage, heads_problem, sequence_problem
from advisor.stage_model import StageModel, StageTerms

if TYPE_CHECKING:  # a run-time import would close a cycle: TrainingOptions.memory_options imports this module
    from advisor.options.ub_config import UserbuffersConfig
    from advisor.options.training import Recompute, RecomputeMethod

GIB = 2**30
"""Seed 004's tables say GB and mean GiB (2^30 bytes): its Eq. 10/17 values printed in Tables 2-11
are bytes / 2^30 (tables/seed004 reproduces them so; README, "The method")."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryOptions:
    """Extensions to the paper. The defaults are the paper's assumptions (Section 3)."""

    distributed_optimizer: bool = True
    """Shard the Adam states over the DP x CP group (Eq. 10); False keeps all 12 bytes (Eq. 4)."""
    gradient_bytes: int = 4
    """4: FP32 gradient accumulation (the paper); 2: BF16 gradients."""
    grad_comm_bytes: int | None = None
    """Megatron-FSDP's gradient communication element where it differs from the main gradients'
    (core_v0.19.0's --megatron-fsdp-grad-comm-dtype): its un-sharded gradient buckets take it
    (``memory_levers.fsdp_buffer_bytes``); None: ``gradient_bytes``."""
    element_bytes: int = 2
    """Bytes per weight and activation element: 2, BF16 (the paper, Section 3); 4 for an FP32
    run (``--params-dtype float32``, as the CPU backend profiles tiny models). The equations
    count BF16 bytes, so weights and every activation term scale by element_bytes / 2, except
    the FP32 logits and the int64 embedding input of Eq. 13-14, which no dtype changes."""
    recompute: Recompute = "none"
    """Activation recomputation, as Megatron's --recompute-granularity."""
    recompute_method: RecomputeMethod = "uniform"
    """With full recomputation: 'uniform' checkpoints every N layers, 'block' the first N."""
    recompute_num_layers: int = 1
    """N, Megatron's --recompute-num-layers (per model chunk)."""
    recompute_modules: frozenset[str] = frozenset({"core_attn"})
    """With selective recomputation: Megatron's --recompute-modules (its default core_attn)."""
    fused_norms: bool = True
    """Transformer Engine's layer spec, whose dense layers fuse both RMSNorms into the next
    linear layer (``gpt_layer_specs.py``); False: --transformer-impl local, norms of their own."""
    sequence_parallel: bool = True
    """Sequence parallelism with TP (the paper: whenever t > 1). Without it the norm and
    projection inputs, 8sbh per layer, stay whole on every TP rank (Korthikanti et al. 2023)."""
    flash_attention: bool = True
    """False also keeps the softmax output, 2as^2b per layer (Korthikanti et al. 2023)."""
    vocab_divisible_by: int | None = None
    """Pad v to a multiple of this x t, as Megatron's --make-vocab-size-divisible-by (default
    128 there); None = 1, the smallest padding Megatron does: to a multiple of t (the paper's
    vocabularies divide by every t it uses)."""
    fsdp_strategy: str | None = None
    """Megatron-FSDP's --data-parallel-sharding-strategy, or 'torch_fsdp2': a key of
    ``advisor.memory_levers.SHARDING``; None: DDP."""
    fsdp_budget_from_units: bool = True
    """Megatron-FSDP's all-gather prefetch and reduce-scatter queue sized from the rank's FSDP units,
    as core_v0.19.0 sizes them (the newest release's rule, the default); False: core_v0.15.2's fixed
    1e9 elements (``memory_levers.fsdp_communication_unit``; ``MegatronRelease.fsdp_budget_from_units``)."""
    overlap_grad_reduce: bool = True
    """--overlap-grad-reduce: with it core_v0.19.0's Megatron-FSDP sizes the queue and prefetch of the
    strategies not sized by their units from the DDP bucket size, which grows with DP x CP beyond
    1,000 (``memory_levers.fsdp_communication_unit``); without it, 1e9 elements."""
    optimizer_bytes: float = 12.0
    """Bytes per parameter of the optimizer states before sharding: 12, FP32 master weight,
    momentum and variance (Section 3.1); fewer with the precision-aware optimizer
    (``memory_levers.optimizer_state_bytes``)."""
    optimizer_host_fraction: float = 0.0
    """The share of the optimizer states in host memory (--optimizer-cpu-offload x
    --optimizer-offload-fraction)."""
    fp8_format: str | None = None
    """--fp8-format (None: BF16 GEMMs)."""
    fp8_recipe: str = "delayed"
    """--fp8-recipe."""
    fp8_param_gather: bool = False
    """--fp8-param-gather: no BF16 copy of the compute weights."""
    fp8_amax_history_len: int = 1
    """--fp8-amax-history-len."""
    cross_entropy_fusion: str = "none"
    """The loss kernel (``advisor.options.training.Loss``): 'te' keeps no FP32 logits."""
    userbuffers: UserbuffersConfig | None = None
    """--tp-comm-overlap's buffers (``ub_config.UserbuffersConfig``, the --tp-comm-overlap-cfg
    file's or TE's defaults; ``memory_terms.userbuffers_bytes``); None: no overlap."""
    bias_swiglu_fusion: bool = True
    """Megatron's fused SwiGLU (its default); False, --no-bias-swiglu-fusion: each layer keeps
    ``equations.unfused_swiglu_bytes`` more (``stage_model.layer_bytes``)."""
    dataloader_mask: bool = True
    """The data loader builds the s x s attention mask (Megatron's default, the paper's runs);
    False with --no-create-attention-mask-in-dataloader (``memory_terms.dataloader_mask_bytes``)."""

    def __post_init__(self) -> None:
        # The estimator's own encodings and the keys of its tables. Megatron's rules (recomputation,
        # padding, which options go together) are the options' (``advisor.options.TrainingOptions``,
        # whose ``memory_options`` builds this).
        if self.gradient_bytes not in (2, 4):
            raise AdvisorError(f"gradient_bytes must be 2 (BF16) or 4 (FP32), got {self.gradient_bytes}")
        if self.grad_comm_bytes not in (None, 2, 4):
            raise AdvisorError(f"grad_comm_bytes must be None, 2 or 4, got {self.grad_comm_bytes}")
        if self.element_bytes not in (2, 4):
            raise AdvisorError(f"element_bytes must be 2 (BF16) or 4 (FP32), got {self.element_bytes}")
        if self.fsdp_strategy not in levers.SHARDING:
            raise AdvisorError(f"fsdp_strategy must be None or a Megatron-FSDP strategy, got {self.fsdp_strategy!r}")
        if not 0.0 <= self.optimizer_host_fraction <= 1.0:
            raise AdvisorError(f"optimizer_host_fraction must be in [0, 1], got {self.optimizer_host_fraction}")
        if self.fp8_format is not None and self.fp8_recipe not in levers.FP8_SCALE_BYTES:
            raise AdvisorError(f"unknown FP8 recipe {self.fp8_recipe!r}")

    def changed(self) -> dict:
        """The options that differ from the paper's assumptions."""
        default = MemoryOptions()
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != getattr(default, f.name)}


@dataclass(frozen=True, kw_only=True, slots=True)
class StageMemory:
    """Per-GPU memory of one pipeline stage, in bytes."""

    stage: int
    position: Literal["only", "first", "middle", "last"]
    layers: int
    in_flight_microbatches: float
    """Microbatches whose activations the stage holds at its peak (p - i under 1F1B)."""
    parameters: float
    """Parameters on one GPU of this stage (after TP sharding)."""
    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    layer_activations_bytes: float
    embedding_activations_bytes: float
    output_activations_bytes: float

    @property
    def model_states_bytes(self) -> float:
        return self.weights_bytes + self.gradients_bytes + self.optimizer_bytes

    @property
    def activations_bytes(self) -> float:
        return self.layer_activations_bytes + self.embedding_activations_bytes + self.output_activations_bytes

    @property
    def total_bytes(self) -> float:
        return self.model_states_bytes + self.activations_bytes

    def to_dict(self) -> dict:
        return {
            "stage": self.stage,
            "position": self.position,
            "layers": self.layers,
            "in_flight_microbatches": self.in_flight_microbatches,
            # a count, written as one ('2007629824', not '2007629824.0', in the estimate's CSV): whole
            # on every launchable layout (TP divides the heads, the KV heads and h_ffn; the
            # vocabulary pads to a multiple of TP, equations.padded_vocab_size)
            "parameters": round(self.parameters),
            "weights_gib": self.weights_bytes / GIB,
            "gradients_gib": self.gradients_bytes / GIB,
            "optimizer_gib": self.optimizer_bytes / GIB,
            "model_states_gib": self.model_states_bytes / GIB,
            "layer_activations_gib": self.layer_activations_bytes / GIB,
            "embedding_activations_gib": self.embedding_activations_bytes / GIB,
            "output_activations_gib": self.output_activations_bytes / GIB,
            "activations_gib": self.activations_bytes / GIB,
            "total_gib": self.total_bytes / GIB,
        }


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """All stages of one configuration (``terms``: arrays over its pipeline ranks); the peak stage
    decides whether it fits."""

    terms: StageTerms
    layers: tuple[int, ...]
    """Decoder layers of each stage."""
    peak_stage: int | None = None
    """The stage with the most bytes (the first of equals), when the caller knows it already."""

    @property
    def stages(self) -> tuple[StageMemory, ...]:
        pp = len(self.layers)
        return tuple(stage_memory(self.terms, i, pp, self.layers[i]) for i in range(pp))

    @property
    def peak(self) -> StageMemory:
        """The stage with the most bytes (the first of equals)."""
        index = int(np.argmax(self.terms.total)) if self.peak_stage is None else self.peak_stage
        return stage_memory(self.terms, index, len(self.layers), self.layers[index])

    @property
    def total_gib(self) -> float:
        return self.peak.total_bytes / GIB

    @property
    def model_states_gib(self) -> float:
        return self.peak.model_states_bytes / GIB

    @property
    def activations_gib(self) -> float:
        return self.peak.activations_bytes / GIB


def tp_problem(spec: LlamaSpec, tp: int) -> str | None:
    """Why Megatron-LM cannot split this model's attention over ``tp`` ranks, or None."""
    return heads_problem(tp, spec.num_attention_heads, spec.num_query_groups)


def split_problem(num_layers: int, pp: int, vpp: int, layers_per_stage: tuple[int, ...], *,
                  name: str = "--layers-per-stage") -> str | None:
    """Why Megatron cannot build ``layers_per_stage`` over PP x VPP model chunks, or None (dense
    and MoE layouts alike). ``name``: where the split was given, the flag (its counts shown as
    typed, 7,9,9,7) or an input's field such as "'layers_per_stage'" (shown as its JSON list)."""
    shown = ",".join(map(str, layers_per_stage)) if name.startswith("--") else str(list(layers_per_stage))
    if len(layers_per_stage) != pp:
        stages = len(layers_per_stage)
        return f"{name} lists {stages} stage{'' if stages == 1 else 's'}, but PP is {pp}"
    if any(n < 0 for n in layers_per_stage) or sum(layers_per_stage) != num_layers:
        return f"{name} {shown} must be non-negative and sum to {num_layers} layers"
    if vpp > 1 and min(layers_per_stage) < vpp:
        return (f"with {vpp} virtual stages every stage needs at least {vpp} layers (one per model chunk), "
                f"got {name} {shown}")
    return None


def check_layout(
    spec: LlamaSpec,
    parallel: ParallelConfig,
    workload: Workload,
    layers_per_stage: tuple[int, ...] | None = None,
    *,
    split_name: str = "--layers-per-stage",
) -> None:
    """Raise AdvisorError unless Megatron-LM can run this layout (``split_name``: where
    ``layers_per_stage`` was given, as ``split_problem`` names it)."""
    t, c, p, v = parallel.tp, parallel.cp, parallel.pp, parallel.vpp
    if problem := tp_problem(spec, t):
        raise AdvisorError(problem)
    if problem := sequence_problem(workload.seq_len, c, t):
        raise AdvisorError(problem)
    if v > 1 and p == 1:
        raise AdvisorError("interleaved virtual pipeline stages need PP > 1")
    if layers_per_stage is not None:
        if problem := split_problem(spec.num_layers, p, v, layers_per_stage, name=split_name):
            raise AdvisorError(problem)
    elif spec.num_layers % (p * v):
        raise AdvisorError(
            f"{spec.num_layers} layers cannot be split evenly over PP {p}"
            + (f" x {v} virtual stages" if v > 1 else "")
        )
    m = workload.num_microbatches(parallel)  # raises unless gbs divides evenly
    if v > 1 and m is not None and m % p:
        # megatron/core/pipeline_parallel/schedules.py: microbatches run in groups of PP per chunk
        raise AdvisorError(f"the interleaved schedule needs the microbatches ({m}) to be a multiple of PP {p}")


def in_flight_microbatches(stage: int, pp: int, vpp: int = 1, num_microbatches: int | None = None) -> float:
    """Microbatches of activations that stage ``stage`` holds at its peak, in whole-stage units.

    1F1B: p - i (seed 004, Section 3.2.2). Interleaved: Megatron's warm-up of
    2(p - i - 1) + (v - 1)p forward chunks plus the one in its steady state
    (``advisor.schedule``), each chunk 1/v of the stage; on the first stage this is
    p(1 + (p - 1)/(pv)), the penalty in Megatron-LM's ``theoretical_memory_usage.py``. Fewer
    microbatches than that cap it (upstream's m < p discount)."""
    m = math.inf if num_microbatches is None else num_microbatches
    return float(schedule.forward_passes_in_flight(stage, pp, vpp, m)) / vpp


def estimate_memory(
    spec: LlamaSpec,
    parallel: ParallelConfig,
    workload: Workload = Workload(),
    options: MemoryOptions = MemoryOptions(),
    layers_per_stage: tuple[int, ...] | None = None,
) -> MemoryEstimate:
    """Per-GPU memory of every pipeline stage (seed 004, Eq. 10 and 17, per stage)."""
    check_layout(spec, parallel, workload, layers_per_stage)
    if parallel.cp > 1 and not options.flash_attention:
        raise AdvisorError(
            "context parallelism runs inside fused (flash or cuDNN) attention, which keeps no s^2 "
            "scores; unfused attention needs CP 1"
        )
    p = parallel.pp
    m = workload.num_microbatches(parallel)
    layers = layers_per_stage or default_layers_per_stage(spec.num_layers, p)
    model = StageModel(spec, workload.seq_len, options, tp=parallel.tp, cp=parallel.cp, dp=parallel.dp,
                       mbs=parallel.mbs, pp=p, vpp=parallel.vpp, num_microbatches=math.inf if m is None else m,
                       stage=np.arange(p))
    terms = model.terms(np.array(layers))
    return MemoryEstimate(terms, tuple(int(n) for n in layers))


def stage_memory(terms: StageTerms, index, pp: int, layers: int, stage: int | None = None) -> StageMemory:
    """One stage of ``terms`` (``index`` into its arrays) as a StageMemory."""
    stage = index if stage is None else stage
    return StageMemory(
        stage=stage,
        position="only" if pp == 1 else "first" if stage == 0 else "last" if stage == pp - 1 else "middle",
        layers=int(layers),
        in_flight_microbatches=float(terms.in_flight[index]),
        parameters=float(terms.parameters[index]),
        weights_bytes=float(terms.weights[index]),
        gradients_bytes=float(terms.gradients[index]),
        optimizer_bytes=float(terms.optimizer[index]),
        layer_activations_bytes=float(terms.layer_activations[index]),
        embedding_activations_bytes=float(terms.embedding_activations[index]),
        output_activations_bytes=float(terms.output_activations[index]),
    )
