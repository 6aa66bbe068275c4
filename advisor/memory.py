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
from typing import Literal

from advisor import equations as eq
from advisor.errors import AdvisorError
from advisor.models import LlamaSpec
from advisor.parallel import ParallelConfig, Workload

GIB = 2**30
"""Seed 004's tables say GB and mean GiB (2^30 bytes): its Eq. 10/17 values printed in Tables 2-11
are bytes / 2^30 (tables/seed004 reproduces them so; README, "The method")."""

Recompute = Literal["none", "selective", "full"]
RecomputeMethod = Literal["uniform", "block"]


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryOptions:
    """Extensions to the paper. The defaults are the paper's assumptions (Section 3)."""

    distributed_optimizer: bool = True
    """Shard the Adam states over the DP x CP group (Eq. 10); False keeps all 12 bytes (Eq. 4)."""
    gradient_bytes: int = 4
    """4: FP32 gradient accumulation (the paper); 2: BF16 gradients."""
    recompute: Recompute = "none"
    """Activation recomputation, as Megatron's --recompute-granularity."""
    recompute_method: RecomputeMethod = "uniform"
    """With full recomputation: 'uniform' checkpoints every N layers, 'block' the first N."""
    recompute_num_layers: int = 1
    """N, Megatron's --recompute-num-layers (per model chunk)."""
    sequence_parallel: bool = True
    """Sequence parallelism with TP (the paper: whenever t > 1). Without it the norm and
    projection inputs, 8sbh per layer, stay whole on every TP rank (Korthikanti et al. 2023)."""
    flash_attention: bool = True
    """False also keeps the softmax output, 2as^2b per layer (Korthikanti et al. 2023)."""
    vocab_divisible_by: int | None = None
    """Pad v to a multiple of this x t, as Megatron's --make-vocab-size-divisible-by (default
    128 there); None = 1, the smallest padding Megatron does: to a multiple of t (the paper's
    vocabularies divide by every t it uses)."""

    def __post_init__(self) -> None:
        if self.gradient_bytes not in (2, 4):
            raise AdvisorError(f"gradient_bytes must be 2 (BF16) or 4 (FP32), got {self.gradient_bytes}")
        if self.recompute not in ("none", "selective", "full"):
            raise AdvisorError(f"recompute must be none, selective or full, got {self.recompute!r}")
        if self.recompute_method not in ("uniform", "block"):
            raise AdvisorError(f"recompute_method must be uniform or block, got {self.recompute_method!r}")
        if self.recompute_num_layers < 1:
            raise AdvisorError(f"recompute_num_layers must be at least 1, got {self.recompute_num_layers}")
        if self.vocab_divisible_by is not None and self.vocab_divisible_by < 1:
            raise AdvisorError(f"vocab_divisible_by must be positive, got {self.vocab_divisible_by}")

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
            "parameters": self.parameters,
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
    """All stages of one configuration; the peak stage decides whether it fits."""

    stages: tuple[StageMemory, ...]

    @property
    def peak(self) -> StageMemory:
        return max(self.stages, key=lambda stage: stage.total_bytes)

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
    a, k = spec.num_attention_heads, spec.num_query_groups
    if a % tp or k % tp:
        return f"TP {tp} must divide the attention heads ({a}) and the KV heads ({k})"
    return None


def check_layout(
    spec: LlamaSpec,
    parallel: ParallelConfig,
    workload: Workload,
    layers_per_stage: tuple[int, ...] | None = None,
) -> None:
    """Raise AdvisorError unless Megatron-LM can run this layout."""
    t, c, p, v = parallel.tp, parallel.cp, parallel.pp, parallel.vpp
    if problem := tp_problem(spec, t):
        raise AdvisorError(problem)
    if c > 1 and workload.seq_len % (2 * c):
        raise AdvisorError(f"sequence length {workload.seq_len} must be divisible by 2 x CP = {2 * c}")
    if t > 1 and (workload.seq_len // c) % t:
        raise AdvisorError(
            f"sequence parallelism needs the sequence per CP rank ({workload.seq_len // c}) divisible by TP {t}"
        )
    if v > 1 and p == 1:
        raise AdvisorError("interleaved virtual pipeline stages need PP > 1")
    if layers_per_stage is not None:
        if v > 1:
            raise AdvisorError("uneven layers per stage cannot be combined with virtual pipeline stages here")
        if len(layers_per_stage) != p:
            raise AdvisorError(f"layers per stage lists {len(layers_per_stage)} stages, but PP is {p}")
        if any(n < 0 for n in layers_per_stage) or sum(layers_per_stage) != spec.num_layers:
            raise AdvisorError(
                f"layers per stage {list(layers_per_stage)} must be non-negative and sum to "
                f"{spec.num_layers} layers"
            )
    elif spec.num_layers % (p * v):
        raise AdvisorError(
            f"{spec.num_layers} layers cannot be split evenly over PP {p}"
            + (f" x {v} virtual stages" if v > 1 else "")
        )
    workload.num_microbatches(parallel)  # raises unless gbs divides evenly


def in_flight_microbatches(stage: int, pp: int, vpp: int = 1, num_microbatches: int | None = None) -> float:
    """Microbatches of activations that stage ``stage`` holds at its peak.

    1F1B: p - i (seed 004, Section 3.2.2). Interleaved: Megatron's warm-up of
    2(p - i - 1) + (v - 1)p forward chunks plus the one in its steady state
    (megatron/core/pipeline_parallel/schedules.py), each chunk 1/v of the stage; on the first
    stage this is p(1 + (p - 1)/(pv)), the penalty in Megatron-LM's
    ``theoretical_memory_usage.py``. Fewer microbatches than that cap it (upstream's m < p
    discount)."""
    if vpp == 1:
        in_flight = float(pp - stage)
    else:
        in_flight = (2 * (pp - stage - 1) + (vpp - 1) * pp + 1) / vpp
    if num_microbatches is not None:
        in_flight = min(in_flight, float(num_microbatches))
    return in_flight


def stage_layer_activation_bytes(
    spec: LlamaSpec, seq_len: int, mbs: int, layers: int, parallel: ParallelConfig, options: MemoryOptions
) -> float:
    """Activations that ``layers`` transformer layers keep on one GPU for one microbatch.

    Everything is split over t x c (Eq. 15, 17), except, without sequence parallelism, the
    8sbh that tensor parallelism leaves whole on each TP rank."""
    t, c = parallel.tp, parallel.cp
    whole = 0.0 if options.sequence_parallel or t == 1 else eq.tensor_parallel_replicated_activation_bytes(
        spec, seq_len, mbs
    )
    full = eq.layer_activation_bytes(spec, seq_len, mbs) - whole
    if not options.flash_attention and options.recompute != "selective":
        # Selective recomputation recomputes exactly the core attention, whose s^2 terms it
        # removes (Korthikanti et al. 2023, Table 2); with FlashAttention there are none.
        full += eq.attention_scores_bytes(spec, seq_len, mbs)
    full_per_gpu = full / (t * c) + whole / c
    if options.recompute != "full" or layers == 0:
        return layers * full_per_gpu
    # A checkpoint is the layer input: split like the other sequence-parallel tensors.
    checkpoint = eq.layer_checkpoint_bytes(spec, seq_len, mbs) / (t * c if whole == 0 else c)
    chunk_layers = layers // parallel.vpp  # Megatron recomputes within each model chunk
    n = options.recompute_num_layers
    if options.recompute_method == "block":
        recomputed = min(n, chunk_layers)
        per_chunk = recomputed * checkpoint + (chunk_layers - recomputed) * full_per_gpu
    else:
        per_chunk = math.ceil(chunk_layers / n) * checkpoint
    return parallel.vpp * per_chunk


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
    t, c, p, d, b = parallel.tp, parallel.cp, parallel.pp, parallel.dp, parallel.mbs
    s = workload.seq_len
    m = workload.num_microbatches(parallel)
    vocab = eq.padded_vocab_size(spec.vocab_size, options.vocab_divisible_by, t)
    layers = layers_per_stage or (spec.num_layers // p,) * p

    optimizer_shards = d * c if options.distributed_optimizer else 1
    optimizer_per_parameter = eq.optimizer_bytes_per_parameter(optimizer_shards)
    # Eq. 17: TP with SP, and CP, split every activation; without SP only CP splits the
    # hidden states around the embedding and the LM head.
    sharded = t * c
    whole = sharded if options.sequence_parallel else c
    embedding = eq.embedding_parameters(spec, t, vocab)

    stages = []
    for i in range(p):
        first, last = i == 0, i == p - 1
        parameters = layers[i] * eq.layer_parameters(spec, t)
        if first:
            parameters += embedding  # Eq. 7
        if last:
            parameters += eq.final_norm_parameters(spec)  # Eq. 9
            if not (spec.tie_embeddings and p == 1):
                # Untied: the LM head. Tied with p > 1: Megatron keeps a copy of the
                # embedding on the last stage, kept in sync by an all-reduce.
                parameters += embedding
        in_flight = in_flight_microbatches(i, p, parallel.vpp, m)
        layer_bytes = stage_layer_activation_bytes(spec, s, b, layers[i], parallel, options)
        stages.append(
            StageMemory(
                stage=i,
                position="only" if p == 1 else "first" if first else "last" if last else "middle",
                layers=layers[i],
                in_flight_microbatches=in_flight,
                parameters=parameters,
                weights_bytes=eq.WEIGHT_BYTES * parameters,
                gradients_bytes=options.gradient_bytes * parameters,
                optimizer_bytes=optimizer_per_parameter * parameters,
                layer_activations_bytes=layer_bytes * in_flight,  # Eq. 16-17
                embedding_activations_bytes=(
                    eq.embedding_activation_bytes(spec, s, b) * in_flight / whole if first else 0.0
                ),  # Eq. 13: 8sbh per microbatch in flight
                output_activations_bytes=(
                    eq.output_hidden_activation_bytes(spec, s, b) / whole + eq.logits_bytes(spec, s, b, vocab) / sharded
                    if last else 0.0
                ),  # Eq. 14: the last stage runs each microbatch's backward at once
            )
        )
    return MemoryEstimate(tuple(stages))
