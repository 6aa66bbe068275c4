"""Per-GPU memory of the pipeline stages of MoE layouts, vectorised over layouts (numpy arrays
broadcast): the per-layer terms of ``advisor.moe.memory``, ``advisor.moe.transient`` and
``advisor.moe.params``, summed over a stage's dense and MoE layers, with seed 004's ends
(Eq. 7-9, 13, 14) and 1F1B's p - i microbatches in flight (Section 3.2.2).

The split: L layers over p stages as evenly as possible, the remainder on the stages just
before the last (they hold fewer microbatches than the first); the first dense layers
(first_k_dense_replace) are the model's first layers, wherever they fall. One layout can give
its own split instead (``advisor estimate --layers-per-stage``, a command's
--decoder-first/last-pipeline-num-layers or layout).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from advisor import equations as eq
from advisor import schedule
from advisor import memory_levers as levers
from advisor import memory_terms
from advisor.stage_model import head_shares_embedding
from advisor.moe import fp8 as fp8_terms
from advisor.moe import fsdp
from advisor.moe.fsdp_replay import ReplayedStages
from advisor.moe import memory as mm
from advisor.moe import mtp as mtp_terms
from advisor.moe import params
from advisor.moe import transient as tr
from advisor.moe.spec import MoESpec
from advisor.options import TrainingOptions
from advisor.options.training import Recompute


OWN_PERMUTATION_BACKENDS = frozenset({"hybridep", "ncclep"})
"""Flex backends that permute inside their own dispatch (core_v0.19.0 token_dispatcher.py: their
``get_permuted_hidden_states_by_experts`` returns its input), never megatron-core's unfused
``moe_utils.permute``."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MoEOptions:
    """MoE settings of a run (Megatron's flag names) beside its ``training`` options: the one
    description (``advisor.options.TrainingOptions``) that dense rows are priced from too, whose
    gradient dtype, optimizer sharding, DP overlap and FP8 the MoE terms read."""

    dispatcher: mm.Dispatcher = "alltoall"
    """--moe-token-dispatcher-type."""
    routing: mm.RoutedTokens = field(default_factory=mm.RoutedTokens)
    grouped_gemm: bool = True
    """--moe-grouped-gemm."""
    training: TrainingOptions = TrainingOptions()
    """The run's training options (its recomputation is the row's, set per layout)."""

    modules: frozenset[str] | None = None
    """--recompute-modules of 'selective' recomputation; None: ``recompute_modules``' default."""
    a2a_overlap: bool = False
    """--overlap-moe-expert-parallel-comm: the combined 1F1B schedule, which runs one microbatch's
    forward beside another's backward, layer by layer, so that each one's EP dispatch and combine
    hide behind the other's compute (``advisor.moe.ep_time.overlapped_layer_time``); the schedule
    holds one more layer's activations (``overlap_layers_in_flight``)."""
    delay_wgrad: bool = False
    """--delay-wgrad-compute (only with ``a2a_overlap``: megatron-core refuses it alone)."""
    dispatcher_sms: int | None = None
    """--moe-deepep-num-sms: the SMs the flex dispatcher's kernels hold, which the overlapped
    compute loses (``advisor.moe.ep_time.comm_sm_share``); None: not given, DeepEP's default."""
    permute_fusion: bool = False
    """--moe-permute-fusion: Transformer Engine's fused token permutations, priced at the HBM rate;
    without, megatron-core's own at the measured ``advisor.moe.ep_time.PERMUTE_HBM_FRACTION`` of it.
    Memory is priced as the unfused permutation keeps it (an int64 index per routed copy)."""
    router_fusion: bool = False
    """--moe-router-fusion: Transformer Engine's fused top-k and scores, priced as the gating GEMM
    alone; without, the unfused router's small kernels besides (``ROUTER_KERNELS_S``). Memory: what
    the fused kernel saves, its bool map and FP32 intermediate (``memory.routing_saved_bytes``)."""
    shared_expert_overlap: bool = False
    """--moe-shared-expert-overlap (``advisor estimate``'s and ``sweep``'s option, a Megatron
    command's read back, a saved row's ``shared_expert_overlap``): the shared experts run beside
    the dispatch on their own path, whose memory is priced
    (``memory.shared_expert_activation_bytes``), its eager SwiGLU's traffic
    (``time.elementwise_bytes``) and its time beside the EP communication
    (``ep_time.shared_expert_hidden``); the rows write the flag (``advisor.moe.flags``)."""
    flex_backend: str = "deepep"
    """--moe-flex-dispatcher-backend, with the flex dispatcher (core_v0.19.0; core_v0.15.2 has
    DeepEP alone): every backend's all-to-all priced as DeepEP's deduplicated one
    (``advisor.moe.ep_time.all_to_all_time``); HybridEP and NCCL-EP permute in their own kernels."""

    @property
    def fused_permutation(self) -> bool:
        """Whether the token permutations run fused, at the HBM rate: --moe-permute-fusion, or a flex
        backend that permutes inside its own dispatch (``OWN_PERMUTATION_BACKENDS``)."""
        return self.permute_fusion or (self.dispatcher == "flex" and self.flex_backend in OWN_PERMUTATION_BACKENDS)

    @property
    def gradient_bytes(self) -> int:
        return self.training.precision.gradient_bytes

    @property
    def distributed_optimizer(self) -> bool:
        return self.training.data_parallel.distributed_optimizer

    @property
    def memory(self):
        """The estimator's view of the precision (``MemoryOptions``: fp8_format, recipe, param
        gather, amax history, element bytes), read by ``advisor.memory_levers``' FP8 terms."""
        return _memory_options(self.training)

    def recomputed_modules(self, spec: MoESpec, recompute: Recompute) -> frozenset[str]:
        """The modules a layout with ``recompute`` runs again: ``recompute_modules`` with selective,
        none otherwise (Megatron reads --recompute-modules with selective only; full recomputes
        whole layers)."""
        return self.recompute_modules(spec) if recompute == "selective" else frozenset()

    def recompute_modules(self, spec: MoESpec) -> frozenset[str]:
        """What 'selective' recomputes (--recompute-modules): the given modules, or by default the
        MoE activation and the norms, and MLA's up projections where the model has MLA. FP8 with
        delayed scaling cannot recompute moe_act or layernorm (``transformer_config.py``,
        ``__post_init__``: 'Delayed scaling does not support moe_act and layernorm recompute for
        fp8'): then MLA's up projections alone, or core_attn (which saves nothing with fused
        attention) without MLA."""
        if self.modules is not None:
            return self.modules
        mla = {"mla_up_proj"} if spec.mla is not None else set()
        if self.delayed_fp8:
            return frozenset(mla or {"core_attn"})
        return frozenset({"moe_act", "layernorm"} | mla)

    @property
    def delayed_fp8(self) -> bool:
        precision = self.training.precision
        return precision.fp8_format is not None and precision.fp8_recipe == "delayed"


@functools.lru_cache(maxsize=64)
def _memory_options(training: TrainingOptions):
    return training.memory_options()


def split_layers(num_layers: int, pp: int) -> list[int]:
    """Layers per stage: L // p each, the remainder on the stages just before the last, or on every
    stage after the first where it is p - 1 (``stage_layers``)."""
    return list(_split(num_layers, pp))


@functools.lru_cache(maxsize=1024)
def _split(num_layers: int, pp: int) -> tuple[int, ...]:
    return tuple(int(x) for x in stage_layers(num_layers, pp, np.arange(pp))[0])


def stage_layers(num_layers, pp, stage):
    """(layers, the layers before it) of ``stage`` under ``split_layers``, vectorised over ``pp``
    and ``stage``: L // p each and the remainder r on the r stages just before the last, except
    r = p - 1, which goes on every stage after the first (the last included: 61 at PP 2 is
    30 | 31). The one place the default split is made: the memory model, the emitted flags and
    the time model (``longest_and_last``) read it."""
    base, extra = np.divmod(num_layers, pp)
    start_extra = np.where(extra <= pp - 2, np.maximum(1, pp - 1 - extra), pp - extra)
    end_extra = np.where(extra <= pp - 2, pp - 1, pp)
    has_extra = (stage >= start_extra) & (stage < end_extra) & (pp > 1)
    layers = np.where(pp == 1, num_layers, base + has_extra)
    # the first global layer of the stage: base x stage plus the extras before it
    before = base * stage + np.clip(stage - start_extra, 0, np.maximum(end_extra - start_extra, 0)) * (pp > 1)
    return layers, before


def longest_and_last(num_layers, pp, layers_per_stage: tuple[int, ...] | None = None):
    """(the largest stage's layers, the last stage's) under ``split_layers``, vectorised over
    ``pp``, or of the given ``layers_per_stage`` (one layout's split). The last is the largest
    where the remainder is p - 1 (or 0), not always the smallest."""
    if layers_per_stage is not None:
        return max(layers_per_stage), layers_per_stage[-1]
    return np.ceil(num_layers / pp), stage_layers(num_layers, pp, pp - 1)[0]


def _stage_arrays(spec: MoESpec, pp, stage, layers_per_stage: tuple[int, ...] | None = None):
    """(layers, dense layers) of ``stage`` under ``split_layers``, vectorised, or under the given
    ``layers_per_stage`` (one layout's split: ``pp`` a number)."""
    if layers_per_stage is not None:
        counts = np.asarray(layers_per_stage)
        layers, before = counts[stage], (np.cumsum(counts) - counts)[stage]
    else:
        layers, before = stage_layers(spec.num_layers, pp, stage)
    dense = np.clip(spec.first_dense_layers - before, 0, layers)  # the model's first layers are its dense ones
    return layers, dense


@dataclass(frozen=True, slots=True)
class StageBytes:
    """Bytes per GPU of stages (arrays over layouts), in the buckets the calibrated model
    corrects (``advisor.verdicts.calibrated_terms``): model states, the layers' activations, the
    embedding's and the output's, and one layer's transient buffers with the routing the other
    MoE layers' dispatchers hold."""

    layers: np.ndarray
    dense_layers: np.ndarray
    in_flight: np.ndarray
    weights_gradients_optimizer: np.ndarray
    expert_states: np.ndarray
    fp8_weights: np.ndarray
    """Transformer Engine's FP8 weight copies and amax history (``advisor.moe.fp8``); 0 in BF16."""
    layer_activations: np.ndarray
    embedding_activations: np.ndarray
    output_activations: np.ndarray
    transient: np.ndarray
    states: "ModelStates"
    """The model states by owner and by kind as ``model_states`` made them (numbers or arrays, not
    broadcast: only an estimate's stages read the split by kind, ``weights`` and the rest)."""

    @property
    def weights(self):
        return np.broadcast_to(self.states.weights, self.layers.shape)

    @property
    def gradients(self):
        return np.broadcast_to(self.states.gradients, self.layers.shape)

    @property
    def optimizer(self):
        return np.broadcast_to(self.states.optimizer, self.layers.shape)

    @property
    def dense_parameters(self):
        """The stage's dense parameters on one GPU (``ModelStates.dense_parameters``), per layout."""
        return np.broadcast_to(self.states.dense_parameters, self.layers.shape)

    @property
    def expert_parameters(self):
        return np.broadcast_to(self.states.expert_parameters, self.layers.shape)

    @property
    def model_states(self):
        return self.weights_gradients_optimizer + self.expert_states + self.fp8_weights

    @property
    def activations(self):
        return self.layer_activations + self.embedding_activations + self.output_activations

    @property
    def total(self):
        return self.model_states + self.activations + self.transient


def _dense_layer_activations(spec: MoESpec, s, b, tp, cp, modules: frozenset[str] = frozenset(),
                             fused_norms: bool = True, bias_swiglu_fusion: bool = True):
    """A dense layer (DeepSeek-V3's first three): the attention block's terms and the MLP's with
    Megatron's fused SwiGLU (``fusions/fused_bias_swiglu.py``: it saves its input, FC1's output
    2 h_ffn, and FC2 saves its own, h_ffn: seed 004's 2sb(h + 4 h_ffn) less 2 s b h_ffn, as
    ``memory_terms.swiglu_fusion_fraction`` corrects dense layers) with the pre-MLP norm input
    2sbh, over t c; --recompute-modules mlp keeps only the MLP's input (2sbh), mla_up_proj and
    layernorm as in the MoE layers' attention (the dense MLP's norm is fused into FC1). With
    --no-bias-swiglu-fusion the eager SwiGLU keeps seed 004's count and one h_ffn more
    (``equations.unfused_swiglu_bytes``): 2sb(h + 5 h_ffn)."""
    if bias_swiglu_fusion:
        kept = eq.mlp_activation_bytes(spec, s, 1) - 2 * s * spec.ffn_hidden_size
    else:
        kept = eq.mlp_activation_bytes(spec, s, 1) + eq.unfused_swiglu_bytes(spec, s, 1)
    mlp = kept if "mlp" not in modules else 2 * s * spec.hidden_size
    attention = mm.attention_activation_bytes(spec, s, b, tp, cp, "mla_up_proj" in modules, fused_norms) \
        - mm.input_norm_recomputed_bytes(spec, mm.tokens_per_rank(s, b, tp, cp), modules)
    return attention + (mlp + 2 * s * spec.hidden_size) * b / (tp * cp)


class ModelStates(NamedTuple):
    """A stage's model states on one GPU, by owner (the buckets the calibrated model corrects)
    and by kind (the estimate's per-stage split, as the dense estimator's); both sum to the same
    bytes with ``fp8_weights``."""

    dense: object
    """Weights, gradients and Adam states of the dense parameters (sharded over DP x CP)."""
    experts: object
    """The routed experts' (Adam states sharded over the expert-data-parallel group)."""
    fp8_weights: object
    weights: object
    gradients: object
    optimizer: object
    dense_parameters: object = 0.0
    """The dense parameters on one GPU (the DP collectives and Adam move them: ``advisor.moe.time``)."""
    expert_parameters: object = 0.0
    """The routed experts' parameters on one GPU."""


def model_states(spec: MoESpec, options: MoEOptions, tp, cp, pp, ep, etp, dp, stage, dense, moe_layers,
                 mtp) -> ModelStates:
    """A stage's model states: ``dense`` dense layers, ``moe_layers`` MoE layers and ``mtp`` MTP
    layers (with their embedding copy). Per parameter as the dense estimator counts it
    (``memory_levers.state_bytes_per_parameter``: BF16 weights, the main gradients, Adam's 12
    bytes under the distributed optimizer sharded over the shards given): the dense parts (the
    layers' attention, norms, router and shared experts, ``params.moe_layer_dense_parameters``,
    the embedding and head) over DP x CP; the routed experts' E/ep experts split over etp
    (``params.local_expert_parameters``) over EDP = t c d / (etp ep), the expert-data-parallel
    group (``distributed/distributed_data_parallel.py``: expert parameters go to the expert DP
    buffers; ``optimizer/__init__.py``, ``get_megatron_optimizer``: the expert optimizer over
    ``get_expert_data_parallel_group``). Megatron-FSDP shards what its strategy shards
    (``memory_levers.SHARDING``) over the same two groups, and adds its unsharded buffers
    (``advisor.moe.fsdp.buffer_bytes``) to the weights and gradients. --optimizer-cpu-offload takes
    the same --optimizer-offload-fraction of each group's Adam states off the GPU (the dense
    model's ``optimizer_host_fraction``): each group's optimizer is a HybridDeviceOptimizer built
    from the same OptimizerConfig over its own shard (core_v0.15.2 optimizer/__init__.py:602-614,
    :636-649, :310-351; core_v0.19.0 :1164-1178, :1203-1217, :502-543), offloading that fraction
    of it (cpu_offloading/hybrid_optimizer.py:258-273, both releases)."""
    edp = tp * cp * dp // (etp * ep)
    vocab = eq.padded_vocab_size(spec.vocab_size, options.training.vocab_divisible_by, tp)
    embedding = eq.embedding_parameters(spec, tp, vocab)
    # tied at PP > 1 the head is the last stage's copy of the embedding, which MTP's embedding then
    # shares: it gets a copy of its own below only when untied
    head = np.where(head_shares_embedding(spec, pp), 0, embedding)
    ends = np.where(stage == 0, embedding, 0) + np.where(stage == pp - 1, head + spec.hidden_size, 0)
    ends = ends + mtp * mtp_terms.dense_parameters(spec, tp) + np.where(
        (mtp > 0) & (not spec.tie_embeddings), mtp_terms.embedding_copy_parameters(spec, tp, pp, vocab), 0.0)
    # per layer on one GPU: an MoE layer's dense part and its experts, a dense layer (also FSDP's units)
    layer_parameters = moe_dense, experts, dense_layer = (
        params.moe_layer_dense_parameters(spec, tp), params.local_expert_parameters(spec, ep, etp),
        params.dense_layer_parameters(spec, tp))
    dense_params = dense * dense_layer + ends + moe_layers * moe_dense
    expert_params = (moe_layers + mtp) * experts
    per_dense = levers.state_bytes_per_parameter(options.memory, dp * cp)
    per_expert = levers.state_bytes_per_parameter(options.memory, edp)
    fp8 = options.memory
    fp8_weights = ((moe_layers + mtp) * fp8_terms.weight_bytes(spec, tp, ep, etp, fp8)
                   + dense * fp8_terms.weight_bytes(spec, tp, ep, etp, fp8, dense=True))
    weights, gradients, optimizer = (dense_params * d + expert_params * e for d, e in zip(per_dense, per_expert))
    dense_bytes, expert_bytes = dense_params * sum(per_dense), expert_params * sum(per_expert)
    if options.memory.fsdp_strategy is not None:  # Megatron-FSDP's unsharded buffers (advisor.moe.fsdp)
        replayed = None  # optim_grads alone reads the stage's weights (advisor.moe.fsdp_replay)
        if options.memory.fsdp_strategy == "optim_grads":
            replayed = ReplayedStages(spec, tp, pp, ep, etp, stage, vocab, moe_layers, mtp, options.grouped_gemm)
        gathered, queued, share = fsdp.buffer_bytes(options.memory, layer_parameters, dense, moe_layers + mtp,
                                                    dp * cp, replayed)
        weights, gradients = weights + gathered, gradients + queued
        dense_bytes = dense_bytes + share * (gathered + queued)
        expert_bytes = expert_bytes + (1.0 - share) * (gathered + queued)
    return ModelStates(dense=dense_bytes, experts=expert_bytes, fp8_weights=fp8_weights, weights=weights,
                       gradients=gradients, optimizer=optimizer, dense_parameters=dense_params,
                       expert_parameters=expert_params)


def stage_bytes(spec: MoESpec, seq_len: int, options: MoEOptions, *, tp, cp, pp, ep, etp, dp, mbs,
                num_microbatches, stage, recompute: Recompute = "none", vpp=1,
                layers_per_stage: tuple[int, ...] | None = None) -> StageBytes:
    """Memory of pipeline ``stage`` of each layout: model states (dense parts over DP x CP,
    experts over the expert-data-parallel group gpus / (etp ep pp)), activations of the
    microbatches in flight (1F1B: p - i; interleaved with ``vpp`` chunks: Megatron's warm-up,
    ``advisor.schedule.forward_passes_in_flight`` over v, in whole-stage units), and one layer's
    transient peak (``transient.moe_layer_transient_bytes``: dispatcher and expert buffers at its
    forward or backward peak, plus the grouped GEMM workspace) with the routing the other MoE
    layers' dispatchers hold (``transient.routing_held_by_other_layers_bytes``). FP8
    (``advisor.moe.fp8``) adds its weight copies and saves activations; the MTP layers
    (``advisor.moe.mtp``) sit on the last stage, their activations counted once, as the
    output's (the last stage's one microbatch in flight). ``layers_per_stage``: one layout's own
    split (``advisor estimate --layers-per-stage``) instead of ``split_layers``."""
    parts = stage_parts(spec, seq_len, options, tp=tp, cp=cp, pp=pp, ep=ep, etp=etp, dp=dp, mbs=mbs, stage=stage,
                        recompute=recompute, layers_per_stage=layers_per_stage)
    return parts.with_in_flight(*in_flight(options, stage, pp, vpp, num_microbatches))


def in_flight(options: MoEOptions, stage, pp, vpp, num_microbatches):
    """(microbatches in flight on ``stage`` in whole-stage units, layers held beyond them:
    ``overlap_layers_in_flight``), as ``StageParts.with_in_flight`` takes them."""
    passes = schedule.forward_passes_in_flight(stage, pp, vpp, num_microbatches) / np.asarray(vpp)
    return passes, overlap_layers_in_flight(options, stage, pp, vpp, num_microbatches)


@dataclass(frozen=True, slots=True)
class StageParts:
    """What ``stage_bytes`` holds of a stage before its microbatches in flight: everything but
    the schedule (so layouts that differ only in VPP or the number of microbatches share it).
    Each field is an array over layouts or a number (broadcast)."""

    layers: np.ndarray
    dense_layers: np.ndarray
    states: ModelStates
    per_microbatch: np.ndarray
    """The layers' activations of one microbatch in flight."""
    rebuilt: np.ndarray
    """The layer being rebuilt (full recomputation), held once."""
    mtp_layers: np.ndarray
    """The MTP layers' activations, held once."""
    embedding: np.ndarray
    """The embedding's activations of one microbatch in flight."""
    mtp_embedding: np.ndarray
    output: np.ndarray
    transient: np.ndarray
    largest_layer: np.ndarray
    """One microbatch's activations of the stage's largest layer (``overlap_layers_in_flight``)."""

    def take(self, index) -> "StageParts":
        """The layouts at ``index`` (numbers stay numbers)."""
        pick = lambda x: x[index] if np.ndim(x) else x  # noqa: E731
        return StageParts(pick(self.layers), pick(self.dense_layers), ModelStates(*map(pick, self.states)),
                          *(pick(getattr(self, name)) for name in ("per_microbatch", "rebuilt", "mtp_layers",
                                                                   "embedding", "mtp_embedding", "output",
                                                                   "transient", "largest_layer")))

    def with_in_flight(self, in_flight, layers_beyond=0.0) -> StageBytes:
        """The stage with ``in_flight`` microbatches (whole-stage units) and ``layers_beyond``
        more of its largest layer, each with an embedding output on the first stage (a combined
        step embeds its forward's microbatch before the layers, and frees the other's embedding
        gradient path after them: ``TransformerModelChunkSchedulePlan.run``)."""
        ones = np.ones_like(self.layers, dtype=float)
        states = self.states
        held = in_flight * self.per_microbatch + layers_beyond * self.largest_layer + self.rebuilt + self.mtp_layers
        return StageBytes(layers=self.layers, dense_layers=self.dense_layers,
                          in_flight=in_flight * np.ones_like(self.layers),
                          weights_gradients_optimizer=states.dense * ones,
                          expert_states=states.experts * ones, fp8_weights=states.fp8_weights * ones,
                          states=states,
                          layer_activations=held * ones,
                          embedding_activations=((in_flight + layers_beyond) * self.embedding
                                                 + self.mtp_embedding) * ones,
                          output_activations=self.output * ones, transient=self.transient * ones)


def stage_states(spec: MoESpec, options: MoEOptions, *, tp, cp, pp, ep, etp, dp, stage) -> ModelStates:
    """``stage_parts``'s model states alone, on the sweep's split (``split_layers``): they depend
    on neither the micro-batch, the recomputation nor VPP (``advisor.moe.space.may_fit`` bounds by them)."""
    layers, dense = _stage_arrays(spec, pp, stage, None)
    mtp = np.where(stage == pp - 1, spec.mtp_num_layers, 0)
    return model_states(spec, options, tp, cp, pp, ep, etp, dp, stage, dense, layers - dense, mtp)


def stage_parts(spec: MoESpec, seq_len: int, options: MoEOptions, *, tp, cp, pp, ep, etp, dp, mbs, stage,
                recompute: Recompute = "none", layers_per_stage: tuple[int, ...] | None = None) -> StageParts:
    """``stage_bytes`` without the microbatches in flight (``StageParts``)."""
    tp, cp, pp, ep, etp, dp, mbs, stage = (np.asarray(x) for x in (tp, cp, pp, ep, etp, dp, mbs, stage))
    layers, dense = _stage_arrays(spec, pp, stage, layers_per_stage)
    moe_layers = layers - dense
    mtp = np.where(stage == pp - 1, spec.mtp_num_layers, 0)
    states = model_states(spec, options, tp, cp, pp, ep, etp, dp, stage, dense, moe_layers, mtp)
    modules = options.recomputed_modules(spec, recompute)
    tokens = mm.tokens_per_rank(seq_len, mbs, tp, cp)
    copies = mm.expert_token_copies(spec, tokens, ep, etp, options.routing)
    moe_act = mm.moe_layer_activation_bytes(spec, seq_len, mbs, tp, cp, ep, etp, options.routing, modules,
                                            options.dispatcher, options.router_fusion,
                                            fused_norms=options.memory.fused_norms,
                                            bias_swiglu_fusion=options.memory.bias_swiglu_fusion,
                                            shared_expert_overlap=options.shared_expert_overlap)
    dense_act = _dense_layer_activations(spec, seq_len, mbs, tp, cp, modules, options.memory.fused_norms,
                                         options.memory.bias_swiglu_fusion)
    if recompute != "full" and "moe" not in modules:  # FP8 GEMM inputs saved in 1 byte
        moe_act = moe_act - fp8_terms.activation_saving(spec, seq_len, mbs, tp, cp, copies, etp, options.memory,
                                                        modules)
        dense_act = dense_act - sum(levers.fp8_activation_saving(spec, seq_len, mbs, options.memory)) / (tp * cp)
    per_microbatch = moe_layers * moe_act + dense * dense_act
    if recompute == "full":  # every layer keeps its input; one layer is rebuilt at a time
        checkpoint = eq.layer_checkpoint_bytes(spec, seq_len, mbs) / (tp * cp)
        per_microbatch = layers * checkpoint
        rebuilt = np.where(moe_layers > 0, moe_act, np.where(dense > 0, dense_act, 0.0))
    else:
        rebuilt = 0.0
    vocab = eq.padded_vocab_size(spec.vocab_size, options.training.vocab_divisible_by, tp)
    embedding = np.where(stage == 0, eq.embedding_activation_bytes(spec, seq_len, mbs) / (tp * cp), 0.0)
    fusion = options.memory.cross_entropy_fusion
    logits = memory_terms.loss_logits_bytes(spec, seq_len, mbs, vocab, fusion)
    output = np.where(stage == pp - 1, (eq.output_hidden_activation_bytes(spec, seq_len, mbs) + logits) / (tp * cp),
                      0.0)
    mtp_layer, mtp_embedding, mtp_output = mtp_terms.activation_bytes(spec, seq_len, mbs, tp, cp, vocab, moe_act,
                                                                      fusion)
    if recompute == "full":  # each MTP layer keeps its checkpoint and is rebuilt, one layer at a time
        rebuilt = np.maximum(rebuilt, np.where(mtp > 0, mtp_layer, 0.0))
        mtp_layer = mtp_terms.checkpoint_bytes(spec, seq_len, mbs, tp, cp)
    # the MTP layers' transformer layers are MoE layers too, with their own dispatchers: a last
    # stage of MTP alone (a layout's 'mL' stage) has a transient of its own
    transient = np.where(moe_layers + mtp > 0, _transient(spec, options, tokens, copies, ep, etp, moe_layers + mtp,
                                                          recompute == "full" or "moe" in modules), 0.0)
    return StageParts(layers, dense, states, per_microbatch, rebuilt, mtp * mtp_layer, embedding, mtp * mtp_embedding,
                      output + mtp * mtp_output, transient, np.where(moe_layers > 0, moe_act, dense_act))


def _transient(spec: MoESpec, options: MoEOptions, tokens, copies, ep, etp, moe_layers, recomputed: bool):
    """One MoE layer's transient peak (``transient.moe_layer_transient_bytes``), beside the routing the
    stage's other MoE layers' dispatchers hold (``transient.routing_held_by_other_layers_bytes``;
    ``recomputed``: their forwards ran without autograd, which saves none of it). ``moe_layers``
    counts the MTP layers: each MTP layer's transformer layer is the model's MoE layer (Megatron-LM
    core_v0.15.2 ``gpt_builders.py``:59-67, v0.19 :57-65, builds it from the MoE layer spec even on a
    last stage without decoder layers; ``get_gpt_mtp_block_spec``), on the same tokens."""
    one = tr.moe_layer_transient_bytes(spec, tokens, copies, ep, etp, options.dispatcher, options.routing,
                                       options.grouped_gemm, options.flex_backend)
    return one + tr.routing_held_by_other_layers_bytes(spec, moe_layers, tokens, copies, ep, etp, options.dispatcher,
                                                       options.routing, recomputed, options.flex_backend)


def overlap_layers_in_flight(options: MoEOptions, stage, pp, vpp, num_microbatches):
    """Layers the combined 1F1B schedule of --overlap-moe-expert-parallel-comm holds beyond plain
    1F1B's peak: one, where it runs a combined step. Megatron's interleaved schedule warms up one
    microbatch more ('we schedule one extra micro-batch forward step before the 1f1b stages',
    ``pipeline_parallel/schedules.py``, ``get_pp_rank_microbatches``; core_v0.15.2), which plain
    1F1B also holds at its peak (its forward before the first backward); with PP = 1
    (``combined_1f1b.py``) microbatch i + 1's forward runs beside microbatch i's backward. Either
    way a combined step (``TransformerModelChunkSchedulePlan.run``) runs forward layer j of one
    chunk beside backward layer L - 1 - j of the other, and each layer's nodes release their
    saved tensors when their backward ends (``pipeline_parallel/utils.py``, ``ScheduleNode``,
    ``_release_state``; ``keep_graph=False``): (j + 1) + (L - j) = L + 1 layers, one more than the
    chunk (an upper bound: the backward layer's MLP is freed before the forward's MLP runs)."""
    if not options.a2a_overlap:
        return 0.0
    vpp = np.asarray(vpp, dtype=float)
    passes = schedule.forward_passes_in_flight(stage, pp, vpp, num_microbatches)
    return np.where(passes < np.asarray(num_microbatches, dtype=float) * vpp, 1.0, 0.0)


def representative_stages(spec: MoESpec, pp) -> list:
    """The stages whose peak bounds every stage's: the first ``first_dense_layers`` + 1 (those
    holding dense layers, and the first all-MoE one: each stage has at least one layer, so it is
    at most stage ``first_dense_layers``), the first of the stages with an extra layer, the last
    (in-flight microbatches fall with the stage index, and the other middle stages differ only in
    that and in one extra layer)."""
    pp = np.asarray(pp)
    extra = spec.num_layers % pp
    first_extra = np.where(extra <= pp - 2, np.maximum(1, pp - 1 - extra), pp - extra)
    leading = [np.minimum(k, pp - 1) for k in range(max(2, spec.first_dense_layers + 1))]
    return [*leading, np.minimum(first_extra, pp - 1), pp - 1]
