"""The routed-token counts and the activations one MoE layer keeps for the backward, on one GPU,
one function each with its source (megatron-core core_v0.15.2 ``transformer/moe/``, and
core_v0.19.0 where marked v0.19; measured against the symbolic layer, docs/profiling.md). What a
layer holds beyond them, its transient peaks and what its dispatcher holds between forwards, is
``advisor.moe.transient``'s.

Sizes are bytes (BF16 activations, 2 bytes an element), for one microbatch of ``seq_len`` x
``mbs`` tokens unless a name says otherwise. Layout symbols: t (TP), c (CP), ep (EP), etp
(expert TP), and the expert-data-parallel size edp = world / (etp x ep x pp)
(``parallel_state.initialize_model_parallel``: expert_data_parallel_size =
world_size // (etp x ep x pp)). Megatron requires sequence parallelism whenever TP > 1 with
MoE (``transformer/moe/moe_layer.py``: ``MoELayer.forward`` raises ValueError in training without
it, both releases; ``validate_args`` does not check it), so every rank routes N = s b / (c t) tokens.

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
from advisor.moe.spec import MoESpec

BF16 = 2
PROBS_BYTES = 4
"""The routing probabilities' dtype: FP32, with --moe-router-dtype fp32, which the advisor's rows
always emit (``advisor.moe.flags.model_flags``)."""
INDEX_BYTES = 8
"""int64: ``torch.topk``'s indices, the permutations' indices."""
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
    """The busiest rank's load over the mean (1: perfectly balanced): routing 'balanced''s, capped
    at the capacity with routing 'capacity' not padded (``capacity_share``), and the pace of
    'dropless' (whose memory is its worst case)."""


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
    it runs the copies routed to it that fit, min(x N k / E, C) with the busiest rank x times
    its share (``imbalance``; 1 under balanced routing), so min(x, f) of the share: f below x
    drops, above it nothing."""
    factor = assumption.capacity_factor or 1.0
    return factor if assumption.pad_to_capacity else min(factor, assumption.imbalance)


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


def sent_token_copies(spec: MoESpec, tokens: float, assumption: RoutedTokens) -> float:
    """Token copies a rank permutes and sends (``moe_utils.permute``, num_out_tokens): N k, or
    with capacity routing padded to capacity f N k (``capacity_share``). Under 'dropless' and
    'balanced' with an imbalance the busiest rank receives more, but sends its own N k."""
    share = capacity_share(assumption) if assumption.routing == "capacity" else 1.0
    return tokens * spec.moe_router_topk * share


def local_experts(spec: MoESpec, ep) -> np.ndarray:
    """E / ep experts on a rank."""
    return spec.num_experts / np.asarray(ep, dtype=float)


def gathered_tokens(tokens: float, ep, etp) -> np.ndarray:
    """T = N etp ep rows the allgather dispatcher gathers, or 0 where etp ep = 1 (no gather)."""
    group = np.asarray(ep, dtype=float) * np.asarray(etp, dtype=float)
    return np.where(group > 1, tokens * group, 0.0)


def flex_received_tokens(spec: MoESpec, tokens: float, copies: float, ep, etp,
                         assumption: RoutedTokens = RoutedTokens()) -> np.ndarray:
    """R, the tokens DeepEP's dispatch brings a rank, each once whatever its copies there: of the
    N ep etp tokens of the EP x ETP group, those with one of their k experts among the rank's
    E / ep. Under balanced routing, uniformly random top-k (what --moe-router-force-load-balancing
    draws: random logits, router.py:554-556), N ep etp (1 - C(E - E/ep, k) / C(E, k)), scaled by
    the imbalance; dropless, the bound min(c, N ep etp); never above the copies c."""
    group = tokens * np.asarray(ep, dtype=float) * np.asarray(etp, dtype=float)
    if assumption.routing == "dropless":
        return np.minimum(copies, group)
    experts, local = spec.num_experts, local_experts(spec, ep)
    missed = np.ones_like(local)
    for i in range(spec.moe_router_topk):  # C(E - E/ep, k) / C(E, k), factor by factor (0 once E - E/ep < k)
        missed = missed * np.clip((experts - local - i) / (experts - i), 0.0, None)
    return np.minimum(copies, group * (1 - missed) * assumption.imbalance)


# --- activations of one MoE layer, one microbatch ---------------------------------------------


def attention_activation_bytes(spec: MoESpec, seq_len: int, mbs: int, tp: int, cp: int,
                               recompute_up_proj: bool = False, fused_norms: bool = True) -> float:
    """The attention block's kept activations, input norm included. GQA: Eq. 11 and the norm
    input (seed 004) over t c, plus what Qwen3's Q/K norms keep (``eq.qk_norm_activation_bytes``;
    ``fused_norms`` False: --transformer-impl local, whose attention keeps the QKV output through
    K's norm). MLA
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
        # Eq. 11 holds Qwen3's Q/K norm inputs (eq.qk_norm_activation_bytes, shared with dense Qwen3)
        attention = eq.attention_activation_bytes(spec, seq_len, mbs, fused_norms) + 2 * seq_len * mbs * spec.hidden_size
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


# --- what the router and the dispatcher keep for the backward, tensor by tensor ---------------
# Per token routed on this rank (N of them) unless a name says otherwise. Sources: megatron-core
# core_v0.15.2 ``transformer/moe/router.py`` (``TopKRouter.routing``/``forward``) and
# ``moe_utils.py``; core_v0.19.0 saves the same in its router (its ``moe_utils.py``
# :710-900). Measured: the symbolic layer's router part (norm and router) equals the sum of
# ``router_norm_bytes`` and ``routing_saved_bytes`` to the byte on Mixtral 8x7B and DeepSeek-V3
# (tests/test_symbolic_moe.py), without balancing loss, which the symbolic layer is built without
# (megatron_hooks/model.py, moe_config_overrides: load balancing 'none').

RSTD_BYTES = 4
"""The RMSNorm's FP32 reciprocal standard deviation, one per token, which Transformer Engine's
norm saves beside its input for the backward (docs/profiling.md, the dense table's rstd row)."""
AUX_LOSS_TYPES = ("aux_loss", "seq_aux_loss", "global_aux_loss")
"""The balancing types whose loss reads the router's scores (``TopKRouter.is_aux_loss_enabled``)."""
SELF_BALANCING_TYPES = ("sinkhorn", "quantile_balancing")
"""The balancing types that balance the routing itself, with no loss: Sinkhorn's normalisation
(core_v0.15.2 ``router.py``, ``sinkhorn_load_balancing``) and core_v0.19.0's quantile balancing
(its ``router.py``, ``quantile_balancing``)."""


def balancing_types(spec: MoESpec) -> tuple[str, ...]:
    """The --moe-router-load-balancing-type the spec launches (``advisor.moe.flags``): a command's
    or a DeepSeek config.json's as read (seq_aux_loss beside the expert bias), else aux_loss, or
    none with the expert bias."""
    return spec.load_balancing or (("none",) if spec.expert_bias else ("aux_loss",))


def aux_loss_enabled(spec: MoESpec) -> bool:
    """Whether the router computes a load-balancing loss: one of ``AUX_LOSS_TYPES`` with a weight
    above 0 (``get_aux_loss_coeff``: a weight per type where several are given). Mixtral and Qwen3
    take aux_loss with their weight; DeepSeek-V3 seq_aux_loss with its aux_loss_alpha beside the
    expert bias (``advisor.moe.spec._deepseek_balancing``)."""
    types = balancing_types(spec)
    weights = spec.aux_loss_coeff if isinstance(spec.aux_loss_coeff, tuple) else (spec.aux_loss_coeff,) * len(types)
    return any(kind in AUX_LOSS_TYPES and weight > 0 for kind, weight in zip(types, weights))


def router_balanced(spec: MoESpec) -> bool:
    """Whether Megatron's router is driven toward balanced routing: a load-balancing loss with a
    weight (``aux_loss_enabled``), the expert bias (aux-loss-free balancing: ``moe_utils.py``
    ``get_updated_expert_bias``, stepped by ``finalize_model_grads.py``), or a type that balances
    by itself (``SELF_BALANCING_TYPES``). Without any (an aux-loss type at weight 0: ``router.py``
    returns the probabilities untouched where ``aux_loss_coeff == 0``) the router is trained
    unbalanced, and balanced routing is only an assumption
    (``advisor.cli.moe_balancing.unbalanced_line``)."""
    return (aux_loss_enabled(spec) or spec.expert_bias
            or any(kind in SELF_BALANCING_TYPES for kind in balancing_types(spec)))


def router_norm_bytes(spec: MoESpec, norm_recomputed: bool = False) -> float:
    """The pre-MLP RMSNorm, per token: its input (2h, BF16) and FP32 rstd (``RSTD_BYTES``), which
    the norm saves, and its output (2h), the router's input, which the gate GEMM saves
    (``moe_utils.RouterGatingLinearFunction.forward``: ctx.save_for_backward(inp, weight, bias);
    its FP32 logits are saved by nothing). With --recompute-modules layernorm
    (``transformer_layer.py``, ``CheckpointWithoutOutput``: the norm runs under no_grad, its input
    saved by the checkpoint, its output discarded) only the input."""
    if norm_recomputed:
        return BF16 * spec.hidden_size
    return 2 * BF16 * spec.hidden_size + RSTD_BYTES


def routing_saved_bytes(spec: MoESpec, fused: bool = False) -> float:
    """What the top-k routing saves per token (``moe_utils.topk_routing_with_score_function``; the
    FP32 logits are --moe-router-dtype fp32's, which the rows emit). Fused (--moe-router-fusion,
    Transformer Engine ``router.py``, ``FusedTopkScoreFunction.forward``:
    ctx.save_for_backward(routing_map, intermediate_output)): the bool map and the FP32
    intermediate, E + 4E, whatever the score function. Unfused:
    - top-k indices, int64 (``torch.topk``'s node saves them; ``scatter`` builds the N x E
      probabilities from the same tensor): 8k;
    - softmax after the top-k (the default): its FP32 output over the k picked, 4k;
      before it (--moe-router-pre-softmax, always at top-1): its output over all E, 4E;
    - sigmoid: its FP32 output over all E, 4E; the k picked scores (``torch.gather`` with the expert
      bias, else the top-k's values), 4k, and their FP32 sum, 4, which normalise them (k > 1);
    - group-limited routing (--moe-router-num-groups) where the top-k's values are used (softmax,
      or sigmoid without the expert bias): ``masked_fill``'s bool group mask, E
      (``group_limited_topk``); with the expert bias the selection's values are dropped and its
      nodes die in the forward pass, keeping nothing (DeepSeek-V3)."""
    experts, k = spec.num_experts, spec.moe_router_topk
    if fused:
        return experts * (1 + PROBS_BYTES)
    group_mask = experts if spec.router_group_topk and not spec.expert_bias else 0
    if spec.score_function == "sigmoid":
        picked = PROBS_BYTES * k + PROBS_BYTES if k > 1 else 0
        return PROBS_BYTES * experts + INDEX_BYTES * k + picked + group_mask
    if spec.router_pre_softmax or k == 1:  # --moe-router-pre-softmax (megatron-core refuses top-1 without it)
        return PROBS_BYTES * experts + INDEX_BYTES * k + group_mask
    return INDEX_BYTES * k + PROBS_BYTES * k + group_mask


def aux_loss_saved_bytes(spec: MoESpec, fused: bool = False) -> float:
    """The load-balancing loss's scores per token (``moe_utils.compute_routing_scores_for_aux_loss``,
    computed once for every type of ``AUX_LOSS_TYPES``): softmax's FP32 output over all E, 4E;
    sigmoid's, 4E, with the FP32 sum that normalises it, 4; fused (Transformer Engine
    ``FusedComputeScoresForMoEAuxLoss``: its FP32 intermediate), 4E. Its top-k's node dies in the
    forward pass; the loss itself saves only E-wide sums (``switch_load_balancing_loss_func``).
    seq_aux_loss keeps the same (core_v0.15.2 and core_v0.19.0 ``router.py``,
    ``_apply_seq_aux_loss``): it reshapes the same scores to one row per position with the batch
    folded into the experts (a view, nothing saved), so its sums are b x E wide per micro-batch,
    not per token, and not counted (2 KiB at DeepSeek-V3's E 256, MBS 1)."""
    sum_bytes = PROBS_BYTES if spec.score_function == "sigmoid" and not fused else 0
    return PROBS_BYTES * spec.num_experts + sum_bytes


def capacity_mask_bytes(spec: MoESpec, assumption: RoutedTokens) -> float:
    """With capacity routing, the bool capacity mask per token, E, which the probabilities' product
    with it saves (``apply_router_token_dropping``, ``final_probs = routing_probs * final_map``,
    moe_utils.py:706 and :710, v0.19 :1015 and :1019; padded or not). Its top-k over the tokens
    dies in the forward pass (measured: Mixtral 8x7B at EP 8, capacity 1.25 padded, N E more)."""
    return spec.num_experts if assumption.routing == "capacity" else 0.0


def router_activation_bytes(spec: MoESpec, tokens: float, assumption: RoutedTokens = RoutedTokens(),
                            fused: bool = False, aux_loss: bool | None = None,
                            norm_recomputed: bool = False) -> float:
    """What the pre-MLP norm and the router keep: ``router_norm_bytes`` + ``routing_saved_bytes``
    (``fused``: --moe-router-fusion) + ``aux_loss_saved_bytes`` where the router computes a
    balancing loss (``aux_loss``; None: ``aux_loss_enabled``) + ``capacity_mask_bytes``, per token.
    The router's N x E probabilities and map are its outputs: the dispatcher saves its own copies
    (``dispatch_activation_bytes``). Per token, unfused, aux loss on: Mixtral 8x7B 4h + 4 + 24 + 32;
    Qwen3-30B-A3B 4h + 4 + 96 + 512; DeepSeek-V3 (seq_aux_loss) 4h + 4 + 1024 + 96 + 4 + 1028."""
    balancing = aux_loss_enabled(spec) if aux_loss is None else aux_loss
    per_token = (router_norm_bytes(spec, norm_recomputed) + routing_saved_bytes(spec, fused)
                 + (aux_loss_saved_bytes(spec, fused) if balancing else 0.0) + capacity_mask_bytes(spec, assumption))
    return tokens * per_token


def dispatch_activation_bytes(spec: MoESpec, tokens: float, copies: float, ep, etp, dispatcher: Dispatcher = "alltoall",
                              assumption: RoutedTokens = RoutedTokens()) -> np.ndarray:
    """What the token dispatcher keeps for the backward beyond the experts' permutation index
    (priced in ``expert_activation_bytes``), as megatron-core core_v0.15.2's unfused permutation
    saves it (--moe-permute-fusion priced the same: Transformer Engine's fused permutation keeps
    its own row map instead, whose layout changes across its releases):
    - alltoall (``dispatch_preprocess``, ``moe_utils.permute`` with the probabilities):
      ``masked_select`` saves the transposed FP32 probabilities and bool map, N E 5; padded to
      capacity (``drop_and_pad``) the probabilities' ``index_select`` saves its int64 1-D index
      instead, one per padded copy sent (``sent_token_copies``), and no map. core_v0.19.0's
      permutation (argsort, moe_utils.py:457-462) keeps its N x E int64 argsort through the slice
      its indexing saves, N E 8, not priced;
    - allgather (``dispatch_postprocess``, token_dispatcher.py:289, v0.19 :328): ``masked_select``
      of the local experts' transposed FP32 probabilities and bool map, max(T, N) E / ep 5 (T the
      gathered tokens, ``gathered_tokens``), with capacity routing too;
    - flex (DeepEP, ``_DeepepManager``, token_dispatcher.py:977-1116; unmeasured, DeepEP needs
      CUDA; HybridEP and NCCL-EP priced as it): the top-k indices, N k' 8 (k' = etp k,
      ``setup_metadata``'s ``torch.topk``), of the R received tokens (``flex_received_tokens``) the
      valid-index mask, R k', ``_indices_to_multihot``'s two int64 index vectors, one per copy c,
      16 c, and ``permute``'s ``masked_select``, R E / ep 5. Measured (alltoall and allgather): the
      symbolic layer's dispatch part less the permutation index, tests/test_symbolic_moe.py."""
    masked = PROBS_BYTES + 1
    if dispatcher == "allgather":
        rows = np.maximum(gathered_tokens(tokens, ep, etp), tokens)
        return rows * local_experts(spec, ep) * masked
    if dispatcher == "flex":
        topk = spec.moe_router_topk * np.asarray(etp, dtype=float)
        received = flex_received_tokens(spec, tokens, copies, ep, etp, assumption)
        return (tokens * topk * INDEX_BYTES + received * (topk + local_experts(spec, ep) * masked)
                + copies * 2 * INDEX_BYTES)
    if assumption.routing == "capacity" and assumption.pad_to_capacity:
        return np.asarray(sent_token_copies(spec, tokens, assumption) * INDEX_BYTES, dtype=float)
    return np.asarray(tokens * spec.num_experts * masked, dtype=float)


def expert_activation_bytes(spec: MoESpec, copies: float, etp: int, recompute_act: bool = False,
                            bias_swiglu_fusion: bool = True) -> float:
    """What the routed experts keep per token copy (``experts.py``, ``TEGroupedMLP.forward``):
    FC1's input (h), FC1's output, the SwiGLU input (2 h_moe / etp), the SwiGLU output, FC2's
    input (h_moe / etp; not kept with --recompute-modules moe_act), the FP32 routing prob
    applied in the activation (4 bytes), and the permutation's int64 index (8 bytes,
    ``moe_utils.permute``: sorted_indices), made before the all-gather over the expert TP group
    (``MoEAlltoAllTokenDispatcher.dispatch_preprocess``), so once per copy this rank routes, one
    in etp of those its experts process (measured: docs/profiling.md); BF16.

    With --no-bias-swiglu-fusion (``bias_swiglu_fusion`` False) the experts' eager activation
    (``experts.py``, ``TEGroupedMLP.forward``'s ``bias_act_func``; ``SequentialMLP`` runs
    ``mlp.py``'s with the probs as ``per_token_scale``; both releases) keeps 3 h_moe / etp more:
    the SiLU output and ``x_linear + glu_linear_offset``, which the product saves, and the
    product itself, which the multiplication by the FP32 probs saves (its FP32 result, cast back
    to BF16 for FC2, is saved by nothing: ``.to`` keeps no tensor). None with moe_act, whose
    checkpoint (``CheckpointWithoutOutput``) runs it without autograd."""
    f = spec.moe_ffn_hidden_size / etp
    eager = 0 if recompute_act or bias_swiglu_fusion else 3 * f
    per_copy = BF16 * (spec.hidden_size + 2 * f + (0 if recompute_act else f) + eager) + 4 + 8 / etp
    return copies * per_copy


def shared_expert_activation_bytes(spec: MoESpec, seq_len: int, mbs: int, tp: int, cp: int,
                                   bias_swiglu_fusion: bool = True, overlap: bool = False) -> float:
    """The shared experts' SwiGLU (``shared_experts.py``: an ``MLP`` under TP, whose forward runs
    Megatron's fused SwiGLU, ``mlp.py`` with ``bias_swiglu_impl``): FC1's output, which the fusion
    keeps as its input (2 f_shared), and FC2's input (f_shared), 2 bytes each: 6 s b f_shared over
    t c, as the dense layers' fused MLP (``stage._dense_layer_activations``). Its input is the
    router's. Seed 004's unfused 8 s b f_shared was priced until the symbolic layer measured 6.
    With --no-bias-swiglu-fusion the ``MLP``'s eager ``glu`` keeps seed 004's 8 and one f_shared
    more, 10 (``equations.unfused_swiglu_bytes``: ``x_linear + glu_linear_offset``, a new tensor).

    ``overlap`` (--moe-shared-expert-overlap, ``SharedExpertMLP.linear_fc1_forward_and_act``,
    core_v0.15.2 shared_experts.py:167-216, core_v0.19.0 :254-309, the same code in both): the
    fused path is the same 6; the eager one runs its own ``glu``, ``silu(x[0]) * x[1]`` on
    ``torch.chunk`` views of FC1's output, with no offset: SiLU saves its input (a view: FC1's
    output, 2 f_shared, kept whole), the product the SiLU output (f_shared) and x[1] (the same
    storage), FC2 its input (f_shared): 8 s b f_shared over t c. The overlap also keeps the
    gathered FC1 input (``shared_expert_gathered_input_bytes``)."""
    f = spec.shared_expert_size
    if bias_swiglu_fusion or overlap:
        kept = (6 if bias_swiglu_fusion else 8) * seq_len * mbs * f
    else:
        kept = 8 * seq_len * mbs * f + eq.unfused_swiglu_bytes(spec, seq_len, mbs, f)
    gathered = shared_expert_gathered_input_bytes(spec, seq_len, mbs, tp, cp) if overlap else 0.0
    return kept / (tp * cp) + gathered


def shared_expert_gathered_input_bytes(spec: MoESpec, seq_len: int, mbs: int, tp, cp):
    """What --moe-shared-expert-overlap keeps beyond the shared experts' own tensors at TP > 1:
    the sequence-parallel all-gather of their input, 2 s b h / c BF16 on every rank (the whole
    TP group's tokens). ``pre_forward_comm`` gathers it itself
    (``gather_from_sequence_parallel_region``, a new tensor; core_v0.15.2 shared_experts.py:146-165,
    core_v0.19.0 :229-252) and ``__init__`` turns FC1's own gather off (``parallel_mode = None`` on
    Transformer Engine's linears, ``explicit_expert_comm`` on megatron-core's), so FC1 saves the
    gathered tensor for its weight gradient. Without the overlap FC1 is column parallel: it saves
    its local share, the router's input, and gathers again in the backward. At TP 1 (no sequence
    parallelism: validate_args turns it off) ``copy_to_tensor_model_parallel_region`` returns the
    input itself: nothing more. With FP8 the original BF16 input is what FC1 saves
    (``set_save_original_input``), except core_v0.19.0's delayed scaling, which saves it in FP8,
    1 byte: priced as BF16 there too. 0 without shared experts (Megatron then never calls them)."""
    if not spec.shared_expert_size:
        return 0.0
    return BF16 * seq_len * mbs * spec.hidden_size / cp * np.greater(tp, 1)


def moe_layer_activation_bytes(spec: MoESpec, seq_len: int, mbs: int, tp: int, cp: int, ep: int, etp: int,
                               assumption: RoutedTokens = RoutedTokens(),
                               recompute_modules: frozenset[str] = frozenset(), dispatcher: Dispatcher = "alltoall",
                               router_fusion: bool = False, aux_loss: bool | None = None,
                               fused_norms: bool = True, bias_swiglu_fusion: bool = True,
                               shared_expert_overlap: bool = False) -> float:
    """Everything one MoE layer keeps for one microbatch on the busiest rank: attention
    (``fused_norms`` False: --transformer-impl local, ``attention_activation_bytes``), router
    (``router_activation_bytes``: ``router_fusion`` is --moe-router-fusion, ``aux_loss`` its
    balancing loss, None: the spec's), dispatcher (``dispatch_activation_bytes``), shared and
    routed experts (``shared_expert_overlap``: --moe-shared-expert-overlap's own path,
    ``shared_expert_activation_bytes``). --recompute-modules
    (``transformer/transformer_config.py``, recompute_modules): ``moe`` keeps only the MoE
    block's input, the pre-MLP norm's output (``moe_layer.py``, ``MoELayer.forward`` under
    checkpoint), beside that norm's own input (``transformer_layer.py``, ``_forward_mlp``: the norm
    is outside the checkpoint), 2h per token each; ``moe_act`` drops FC2's input, ``mla_up_proj``
    the MLA up projections' outputs, ``shared_experts`` the shared experts' activations,
    ``layernorm`` the outputs of the norms that are modules of their own (output-discarding
    checkpoints): pre_mlp_layernorm's, the router's input (2h per token) with its rstd
    (``router_norm_bytes``), and with MLA input_layernorm's (``input_norm_recomputed_bytes``)."""
    tokens = tokens_per_rank(seq_len, mbs, tp, cp)
    norms = "layernorm" in recompute_modules
    attention = attention_activation_bytes(spec, seq_len, mbs, tp, cp, "mla_up_proj" in recompute_modules,
                                           fused_norms) - input_norm_recomputed_bytes(spec, tokens, recompute_modules)
    if "moe" in recompute_modules:  # the norm's output is freed with the MoE input where it is recomputed
        return attention + tokens * BF16 * spec.hidden_size * (1 if norms else 2)
    copies = expert_token_copies(spec, tokens, ep, etp, assumption)
    router = router_activation_bytes(spec, tokens, assumption, router_fusion, aux_loss, norm_recomputed=norms)
    dispatch = dispatch_activation_bytes(spec, tokens, copies, ep, etp, dispatcher, assumption)
    shared = 0.0 if "shared_experts" in recompute_modules else shared_expert_activation_bytes(
        spec, seq_len, mbs, tp, cp, bias_swiglu_fusion, shared_expert_overlap)
    # The combine keeps no tokens: every dispatcher unpermutes without probabilities
    # (token_dispatcher.py: token_combine / get_restored_hidden_states_by_experts call unpermute
    # without probs; the experts applied them, experts.py activation_func_with_probs), and an
    # index scatter's backward is a gather that needs only the indices.
    return attention + router + dispatch + shared \
        + expert_activation_bytes(spec, copies, etp, "moe_act" in recompute_modules, bias_swiglu_fusion)
