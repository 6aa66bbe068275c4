"""Per-layer memory terms of MoE layers, on one GPU, one function each with its source.

Sizes are bytes (BF16 activations, 2 bytes an element), for one microbatch of ``seq_len`` x
``mbs`` tokens unless a name says otherwise. Layout symbols: t (TP), c (CP), ep (EP), etp
(expert TP), and the expert-data-parallel size edp = world / (etp x ep x pp)
(``parallel_state.initialize_model_parallel``: expert_data_parallel_size =
world_size // (etp x ep x pp)). Megatron requires sequence parallelism whenever TP > 1 with
MoE (``training/arguments.py``, ``validate_args``), so every rank routes N = s b / (c t) tokens.

Routing assumptions (``RoutedTokens``): how many token copies the busiest rank's experts
receive. ``balanced``: N k etp (every expert gets its share: what many published runs force
with --moe-router-force-load-balancing); ``capacity``: --moe-expert-capacity-factor f caps each
expert at f times its share (``moe_utils.get_capacity``), f N k etp padded to capacity
(--moe-pad-expert-input-to-capacity), min(f, 1) N k etp not padded (``RoutedTokens.pad_to_capacity``);
``dropless``: the worst a
dropless router can send one rank, all copies of the EP group's tokens that fit its experts,
N ep min(k, E/ep) etp (what the MoE guide warns about in the first few hundred steps). An
``imbalance`` factor in between scales the balanced case (default 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from advisor import equations as eq
from advisor.moe import params
from advisor.moe.spec import MoESpec

BF16 = 2
Routing = Literal["balanced", "capacity", "dropless"]
Dispatcher = Literal["alltoall", "allgather", "flex"]


@dataclass(frozen=True, kw_only=True, slots=True)
class RoutedTokens:
    """The routing assumption: see the module docstring."""

    routing: Routing = "balanced"
    capacity_factor: float | None = None
    """--moe-expert-capacity-factor (with routing 'capacity')."""
    pad_to_capacity: bool = True
    """--moe-pad-expert-input-to-capacity (with routing 'capacity'): every expert runs its full
    capacity, or (False) only the routed copies it kept; see ``capacity_share``."""
    imbalance: float = 1.0
    """The busiest rank's load over the mean, with routing 'balanced' (1: perfectly balanced)."""


def tokens_per_rank(seq_len: int, mbs: int, tp: int, cp: int) -> float:
    """N = s b / (c t): the tokens one rank routes (sequence parallel over t, context over c)."""
    return seq_len * mbs / (cp * tp)


def capacity_share(assumption: RoutedTokens) -> float:
    """Each expert's copies over its balanced share N k / E, with routing 'capacity'. Megatron
    (megatron-core core_v0.15.2 and core_v0.19.0 ``transformer/moe/moe_utils.py``) gives each
    expert C = get_capacity(N k, E, f) = ceil(N k f / E) copies of a rank's N tokens
    (``apply_router_token_dropping``; the alltoall dispatcher's ``preprocess`` the same). Padded
    (``pad_to_capacity``: the routing map becomes the capacity mask) it runs C, f of the share
    (the ceil dropped: under one copy per expert); not padded (``routing_map AND capacity_mask``)
    it runs the copies routed to it that fit, min(N k / E, C) under balanced routing, so
    min(1, f) of the share: f below 1 drops, above 1 nothing."""
    factor = assumption.capacity_factor or 1.0
    return factor if assumption.pad_to_capacity else min(factor, 1.0)


def expert_token_copies(spec: MoESpec, tokens: float, ep: int, etp: int, assumption: RoutedTokens) -> float:
    """Token copies the busiest rank's local experts process for one microbatch. The alltoall
    dispatcher (``token_dispatcher.py``, ``MoEAlltoAllTokenDispatcher.token_dispatch``) sends each
    of a rank's N tokens to its k experts' EP ranks, then all-gathers over the expert TP group
    (etp), so a balanced rank receives N k etp copies; see the module docstring for the others."""
    k, local = spec.moe_router_topk, spec.num_experts / np.asarray(ep, dtype=float)
    if assumption.routing == "dropless":  # vectorised over layouts: np.minimum, not min
        return tokens * ep * np.minimum(k, local) * etp
    if assumption.routing == "capacity":
        return capacity_share(assumption) * tokens * k * etp
    return assumption.imbalance * tokens * k * etp


# --- model states -----------------------------------------------------------------------------


# --- activations of one MoE layer, one microbatch ---------------------------------------------


def attention_activation_bytes(spec: MoESpec, seq_len: int, mbs: int, tp: int, cp: int,
                               recompute_up_proj: bool = False) -> float:
    """The attention block's kept activations, input norm included. GQA: Eq. 11 and the norm
    input (seed 004) over t c, plus Qwen3's Q/K norm inputs (2 s b (a + k) d). MLA
    (``multi_latent_attention.py``, ``MLASelfAttention.get_query_key_value_tensors``): per
    token, sequence-parallel over t: the norm input and the down projections' input (4h), the
    compressed q and kv with their rope part before their norms (2(q_lora + kv_lora + d_rope)), and
    the normed latents, the up projections' inputs (2(q_lora + kv_lora)): the up projections are
    Transformer Engine's LayerNormColumnParallelLinear, which under sequence parallelism saves its
    norm's output before the all-gather and gathers it again in the backward
    (``layernorm_linear.py``, ``ln_out_needs_gather``), as megatron-core's own column-parallel
    linear saves its local input (``tensor_parallel/layers.py``); split over t by heads: Q and K
    (2 a (d_nope + d_rope) each), V and the attention output (2 a d_v each), the output
    projection's input being that output. --recompute-modules
    mla_up_proj drops the up projections' outputs (Q, K, V), rebuilt from the latents."""
    tokens = seq_len * mbs / cp
    mla = spec.mla
    if mla is None:
        attention = eq.attention_activation_bytes(spec, seq_len, mbs) + 2 * seq_len * mbs * spec.hidden_size
        if spec.qk_layernorm:
            attention += 2 * seq_len * mbs * (spec.num_attention_heads + spec.num_query_groups) * spec.head_dim
        return attention / (tp * cp)
    a, h = spec.num_attention_heads, spec.hidden_size
    q_lora = mla.q_lora_rank or 0
    sequence_split = BF16 * (2 * h + q_lora + mla.kv_lora_rank + mla.qk_pos_emb_head_dim)
    latents = BF16 * (q_lora + mla.kv_lora_rank)
    q_k_v = BF16 * a * (2 * (mla.qk_head_dim + mla.qk_pos_emb_head_dim) + mla.v_head_dim)
    output = BF16 * a * mla.v_head_dim
    heads = output + (0 if recompute_up_proj else q_k_v)
    return tokens * (sequence_split + latents + heads) / tp


def input_norm_recomputed_bytes(spec: MoESpec, tokens: float, recompute_modules: frozenset[str]) -> float:
    """What --recompute-modules layernorm frees of the attention block: input_layernorm's output
    (2h per token) where it is a module of its own, with MLA; with GQA Transformer Engine fuses
    the norm into the QKV projection (``gpt_layer_specs.py``: linear_qkv a
    column_parallel_layer_norm_linear, input_layernorm IdentityOp), which ``transformer_layer.py``
    does not recompute (``recompute_input_layernorm`` needs a norm that is not IdentityOp)."""
    if "layernorm" not in recompute_modules or spec.mla is None:
        return 0.0
    return tokens * BF16 * spec.hidden_size


def router_activation_bytes(spec: MoESpec, tokens: float) -> float:
    """The pre-MLP norm's input and the router's input (2h each, BF16), and its FP32 logits and
    scores (4E each) with the top-k routing map (E bool) (``router.py``, ``TopKRouter.routing``
    casts the logits to FP32 with --moe-router-dtype fp32; ``moe_utils.topk_routing_with_score_function``)."""
    return tokens * (2 * BF16 * spec.hidden_size + 9 * spec.num_experts)


def expert_activation_bytes(spec: MoESpec, copies: float, etp: int, recompute_act: bool = False) -> float:
    """What the routed experts keep per token copy (``experts.py``, ``TEGroupedMLP.forward``):
    FC1's input (h), FC1's output, the SwiGLU input (2 h_moe / etp), the SwiGLU output, FC2's
    input (h_moe / etp; not kept with --recompute-modules moe_act), the FP32 routing prob
    applied in the activation (4 bytes), and the permutation's int64 index (8 bytes,
    ``moe_utils.permute``: sorted_indices), made before the all-gather over the expert TP group
    (``MoEAlltoAllTokenDispatcher.dispatch_preprocess``), so once per copy this rank routes, one
    in etp of those its experts process (measured: docs/profiling.md); BF16."""
    f = spec.moe_ffn_hidden_size / etp
    per_copy = BF16 * (spec.hidden_size + 2 * f + (0 if recompute_act else f)) + 4 + 8 / etp
    return copies * per_copy


def shared_expert_activation_bytes(spec: MoESpec, seq_len: int, mbs: int, tp: int, cp: int) -> float:
    """The shared experts' SwiGLU (``shared_experts.py``: an ``MLP`` under TP, whose forward runs
    Megatron's fused SwiGLU, ``mlp.py`` with ``bias_swiglu_impl``): FC1's output, which the fusion
    keeps as its input (2 f_shared), and FC2's input (f_shared), 2 bytes each: 6 s b f_shared over
    t c, as the dense layers' fused MLP (``stage._dense_layer_activations``). Its input is the
    router's. Seed 004's unfused 8 s b f_shared was priced until the symbolic layer measured 6.
    """
    return 6 * seq_len * mbs * spec.shared_expert_size / (tp * cp)


def moe_layer_activation_bytes(spec: MoESpec, seq_len: int, mbs: int, tp: int, cp: int, ep: int, etp: int,
                               assumption: RoutedTokens = RoutedTokens(),
                               recompute_modules: frozenset[str] = frozenset()) -> float:
    """Everything one MoE layer keeps for one microbatch on the busiest rank. --recompute-modules
    (``transformer/transformer_config.py``, recompute_modules): ``moe`` keeps only the MoE
    block's input, the pre-MLP norm's output (``moe_layer.py``, ``MoELayer.forward`` under
    checkpoint), beside that norm's own input (``transformer_layer.py``, ``_forward_mlp``: the norm
    is outside the checkpoint), 2h per token each; ``moe_act`` drops FC2's input, ``mla_up_proj``
    the MLA up projections' outputs, ``shared_experts`` the shared experts' activations,
    ``layernorm`` the outputs of the norms that are modules of their own (output-discarding
    checkpoints): pre_mlp_layernorm's, the router's input (2h per token), and with MLA
    input_layernorm's (``input_norm_recomputed_bytes``)."""
    tokens = tokens_per_rank(seq_len, mbs, tp, cp)
    norms = "layernorm" in recompute_modules
    attention = attention_activation_bytes(spec, seq_len, mbs, tp, cp, "mla_up_proj" in recompute_modules) \
        - input_norm_recomputed_bytes(spec, tokens, recompute_modules)
    if "moe" in recompute_modules:  # the norm's output is freed with the MoE input where it is recomputed
        return attention + tokens * BF16 * spec.hidden_size * (1 if norms else 2)
    copies = expert_token_copies(spec, tokens, ep, etp, assumption)
    router = router_activation_bytes(spec, tokens)
    if norms:  # pre_mlp_layernorm's output, the router's input
        router -= tokens * BF16 * spec.hidden_size
    shared = 0.0 if "shared_experts" in recompute_modules else shared_expert_activation_bytes(spec, seq_len, mbs, tp, cp)
    # The combine keeps no tokens: every dispatcher unpermutes without probabilities
    # (token_dispatcher.py: token_combine / get_restored_hidden_states_by_experts call unpermute
    # without probs; the experts applied them, experts.py activation_func_with_probs), and an
    # index scatter's backward is a gather that needs only the indices.
    return attention + router + shared + expert_activation_bytes(spec, copies, etp, "moe_act" in recompute_modules)


# --- transient buffers (one layer at a time) --------------------------------------------------


def dispatcher_buffer_bytes(spec: MoESpec, tokens: float, copies: float, etp: int, ep: int,
                            dispatcher: Dispatcher) -> float:
    """The token dispatcher's working buffers during one layer's dispatch or combine, beyond what
    is kept. ``alltoall`` (``MoEAlltoAllTokenDispatcher``): the permuted send buffer, N k copies
    of 2h, live with the received buffer (counted as kept). ``allgather``
    (``MoEAllGatherTokenDispatcher``, over ``tp_ep_group``, the expert TP x EP group of etp ep
    ranks): the dispatch gathers every token of the group (N etp ep x 2h) with its FP32
    probabilities and routing map (9E); the combine unpermutes into as many rows (2h) and
    reduce-scatters their copy in the probabilities' dtype (4h, FP32 with --moe-router-dtype
    fp32): the larger of the two. ``flex`` (``MoEFlexTokenDispatcher`` with DeepEP, ``fused_a2a.py``): DeepEP
    permutes inside its kernels and sends from its own registered buffers, whose size is the
    received copies (2h each) again."""
    h, k = spec.hidden_size, spec.moe_router_topk
    if dispatcher == "allgather":
        return tokens * etp * ep * max(BF16 * h + 9 * spec.num_experts, (BF16 + 4) * h)
    if dispatcher == "flex":
        return copies * BF16 * h
    return tokens * k * BF16 * h


GROUPED_GEMM_WORKSPACE_BYTES = 4 * (32 * 2**20 + 256)
"""Transformer Engine's grouped GEMM gets one cuBLAS workspace per stream
(``transformer_engine/pytorch/module/base.py``, get_multi_stream_cublas_workspace: one
get_cublas_workspace_size_bytes() tensor, 32 MiB + 256 B on Hopper, for each of
tex.get_num_cublas_streams(), 4), allocated once per process."""


def grouped_gemm_workspace_bytes(grouped_gemm: bool = True) -> float:
    """The grouped GEMM's cuBLAS workspaces (``GROUPED_GEMM_WORKSPACE_BYTES``); 0 without --moe-grouped-gemm."""
    return GROUPED_GEMM_WORKSPACE_BYTES if grouped_gemm else 0.0


def expert_transient_bytes(spec: MoESpec, copies: float, etp: int) -> float:
    """The largest temporary of the experts' backward: the gradient of FC1's output (2 h_moe /
    etp per copy, BF16) beside the recomputed or kept SwiGLU input."""
    return copies * BF16 * 2 * spec.moe_ffn_hidden_size / etp
