"""Transformer Engine FP8 (--fp8-format) in MoE layers: the dense FP8 terms of
``advisor.memory_levers`` and ``advisor.throughput.levers`` applied to what an MoE layer runs as
FP8 GEMMs. Every linear layer built from Transformer Engine modules runs in FP8 under
``fp8_autocast``: the attention projections (``TELayerNormColumnParallelLinear``,
``TERowParallelLinear``; MLA's down and up projections, ``TELinear``/``TEColumnParallelLinear``
in ``multi_latent_attention.py``), the shared experts' ``MLP`` and the routed experts' grouped
GEMMs (``TEGroupedMLP``: ``TEColumnParallelGroupedLinear`` FC1 and ``TERowParallelGroupedLinear``
FC2, one GEMM per local expert, ``extensions/transformer_engine.py``, ``TEGroupedLinear``). The
router's gate stays a BF16/FP32 GEMM (``router.py``, ``Router.gating``: ``torch.nn.functional
.linear``, not a TE module) and core attention stays BF16.

All functions are per GPU, bytes (or counts), and zero without --fp8-format.
"""

from __future__ import annotations

import numpy as np

from advisor import equations as eq
from advisor import memory_levers as levers
from advisor.moe import params
from advisor.moe.spec import MoESpec
from advisor.throughput import levers as time_levers
from advisor.throughput.levers import Fp8Casts


def attention_gemms(spec: MoESpec) -> int:
    """FP8 GEMM modules of one attention block: QKV and the output projection (GQA); MLA's
    Q down and up (or one Q projection without q_lora_rank), KV down and up, and the output
    projection (``MLASelfAttention.__init__``: linear_q_down_proj/linear_q_up_proj or
    linear_q_proj, linear_kv_down_proj, linear_kv_up_proj, linear_proj)."""
    if spec.mla is None:
        return 2
    return 5 if spec.mla.q_lora_rank is not None else 4


def attention_linear_parameters(spec: MoESpec, tp) -> float:
    """The attention block's GEMM weights on one GPU: ``params.attention_parameters`` less its
    norm weights (Qwen3's per-head Q and K norms, 2d; MLA's q and kv latent norms)."""
    mla = spec.mla
    if mla is None:
        norms = eq.qk_norm_parameters(spec)
    else:
        norms = ((mla.q_lora_rank or 0) + mla.kv_lora_rank) if spec.qk_layernorm else 0
    return params.attention_parameters(spec, tp) - norms


def moe_layer_fp8(spec: MoESpec, tp, ep, etp) -> tuple[float, int]:
    """(GEMM weights, FP8 GEMMs) of one MoE layer on one GPU: attention, the shared experts (FC1
    and FC2) and the E/ep local experts' FC1 and FC2, each expert one GEMM of its grouped linear."""
    shared = 2 if spec.shared_expert_size else 0
    local = spec.num_experts // np.asarray(ep)
    linear = (attention_linear_parameters(spec, tp) + params.shared_expert_parameters(spec, tp)
              + params.local_expert_parameters(spec, ep, etp))
    return linear, attention_gemms(spec) + shared + 2 * local


def weight_bytes(spec: MoESpec, tp, ep, etp, options, dense: bool = False):
    """FP8 weight copies, transposes and amax history of one MoE layer (or, with ``dense``, one
    of the first dense layers: attention and its SwiGLU MLP), as
    ``memory_levers.fp8_weight_bytes_per_layer`` counts them for a dense layer (its sources);
    5 FP8 tensors per GEMM for delayed scaling's history (``AMAX_TENSORS_PER_LAYER``'s rule)."""
    if options.fp8_format is None:
        return 0.0 * np.asarray(tp, dtype=float)
    if dense:
        linear, gemms = attention_linear_parameters(spec, tp) + eq.mlp_parameters(spec, tp), attention_gemms(spec) + 2
    else:
        linear, gemms = moe_layer_fp8(spec, tp, ep, etp)
    return levers.fp8_weight_bytes(linear, 5 * gemms, options)


def activation_saving(spec: MoESpec, seq_len: int, mbs, tp, cp, copies, etp, options,
                      modules: frozenset[str] = frozenset()):
    """Bytes one MoE layer's kept activations shrink by for one microbatch with FP8 GEMMs, by
    ``memory_levers.fp8_activation_saving``'s rule (a GEMM saves its input in FP8, 1 byte, plus
    MXFP8's scales; the BF16 tensor goes where nobody else keeps it):
    - routed experts, per token copy: FC1's input (h; the permuted tokens, which the permutation's
      backward does not need) and FC2's input (h_moe / etp; the SwiGLU saves its own input), not
      kept at all with --recompute-modules moe_act;
    - the shared experts' FC2 input (f_shared / t per token over c); their FC1 input is the
      router's input too, kept in BF16;
    - GQA attention: the QKV input (the fused norm writes FP8, h per token) saved, the
      projection's input grows by an FP8 copy beside core attention's BF16 output (a d);
      MLA: its down projections share one BF16 input and its up projections read the latent
      norms' outputs, which the rope and norm backward keep, so no saving is counted."""
    zero = 0.0 * np.asarray(copies, dtype=float)
    if options.fp8_format is None:
        return zero
    scale = levers.FP8_SCALE_BYTES[options.fp8_recipe]
    tokens = seq_len * np.asarray(mbs, dtype=float) / (np.asarray(tp, dtype=float) * np.asarray(cp, dtype=float))
    fc2 = 0.0 if "moe_act" in modules else spec.moe_ffn_hidden_size / np.asarray(etp, dtype=float)
    experts = copies * (1 - scale) * (spec.hidden_size + fc2)
    shared = tokens * (1 - scale) * spec.shared_expert_size
    attention = 0.0 if spec.mla is not None else tokens * ((1 - scale) * spec.hidden_size
                                                           - (1 + scale) * spec.query_size)
    return experts + shared + attention + zero


def mla_up_cast_bytes(spec: MoESpec, tokens_cp, tp, casts: Fp8Casts):
    """Forward HBM bytes of the FP8 casts of MLA's up projections' inputs, q_lora and kv_lora
    (normed where qk_layernorm makes them LayerNormLinears, gpt_layer_specs.py:129-138), cast on
    the sequence-parallel shard before the up projections gather them (column-parallel,
    ``multi_latent_attention.py``: the latents are scattered back to s / TP;
    ``time_levers.gathered_cast_bytes``), what --recompute-modules mla_up_proj casts again; 0
    without MLA."""
    mla = spec.mla
    if mla is None:
        return 0.0 * np.asarray(tokens_cp, dtype=float)
    return time_levers.gathered_cast_bytes(tokens_cp, (mla.q_lora_rank or 0) + mla.kv_lora_rank, tp, casts,
                                           normed=spec.qk_layernorm)[0]


def attention_cast_bytes(spec: MoESpec, tokens_cp, tp, casts: Fp8Casts) -> time_levers.CastBytes:
    """``time_levers.CastBytes`` of Transformer Engine's FP8 casts in one layer's attention, at
    ``casts`` per element (``throughput.levers.fp8_casts``): forward each GEMM's input, backward
    each GEMM's output gradient and the transposes of the sequence-parallel gathered operands. GQA
    as a dense layer's (``time_levers.fp8_attention_cast_bytes``); MLA's down projections' inputs h
    twice (duplicated linears on the sequence-parallel shard after the layer's own norm, not
    gathered; without q_lora_rank Q's one projection, column-parallel, gathers its h), its up projections' (``mla_up_cast_bytes``, gathered) and a d_v; gradients q_lora,
    kv_lora + d_rope, a(d_nope + d_rope), a(d_nope + d_v) over t, h (the projection's, gathered)."""
    mla = spec.mla
    if mla is None:
        return time_levers.fp8_attention_cast_bytes(spec, tokens_cp, tp, casts)
    h, a, q, t = spec.hidden_size, spec.num_attention_heads, mla.q_lora_rank or 0, np.asarray(tp, dtype=float)
    # without q_lora_rank, Q's one projection is column-parallel: it gathers h (MLASelfAttention.__init__)
    q_proj, q_proj_transpose = time_levers.gathered_cast_bytes(tokens_cp, 0 if q else h, tp, casts)
    forward = tokens_cp * casts.operand * ((2 if q else 1) * h + a * mla.v_head_dim) / t + q_proj \
        + mla_up_cast_bytes(spec, tokens_cp, tp, casts)
    gradients = (q + mla.kv_lora_rank + mla.qk_pos_emb_head_dim + a * (mla.qk_head_dim + mla.qk_pos_emb_head_dim)
                 + a * (mla.qk_head_dim + mla.v_head_dim))
    proj_gradient, proj_transpose = time_levers.gathered_cast_bytes(tokens_cp, h, tp, casts)
    transposes = proj_transpose + q_proj_transpose \
        + time_levers.gathered_cast_bytes(tokens_cp, q + mla.kv_lora_rank, tp, casts)[1]
    return time_levers.CastBytes(forward, casts.operand * tokens_cp * gradients / t + proj_gradient + transposes,
                                 transposes)


def routed_expert_cast_bytes(spec: MoESpec, copies, etp, casts: Fp8Casts) -> time_levers.CastBytes:
    """``time_levers.CastBytes`` of the routed experts on one GPU (``time_levers.fp8_mlp_cast_bytes``
    per token copy, h_moe / etp wide): FC1's input is never normed, the experts' inputs come from
    the dispatcher, not a sequence-parallel gather (no transposes)."""
    return time_levers.fp8_mlp_cast_bytes(spec.hidden_size, spec.moe_ffn_hidden_size / np.asarray(etp, dtype=float),
                                          copies, 1, casts, normed=False)


def shared_expert_cast_bytes(spec: MoESpec, tokens_cp, tp, casts: Fp8Casts) -> time_levers.CastBytes:
    """``time_levers.CastBytes`` of the shared experts, an MLP of f_shared over t whose FC1 input
    is not normed (the pre-MLP norm is a module of its own in an MoE layer,
    gpt_layer_specs.py:159) and is sequence-parallel gathered, as FC2's gradient; zeros without
    shared experts."""
    if not spec.shared_expert_size:
        zero = 0.0 * np.asarray(tokens_cp, dtype=float)
        return time_levers.CastBytes(zero, zero, zero)
    return time_levers.fp8_mlp_cast_bytes(spec.hidden_size, spec.shared_expert_size, tokens_cp, tp, casts,
                                          normed=False)


def dense_mlp_cast_bytes(spec: MoESpec, tokens_cp, tp, casts: Fp8Casts) -> time_levers.CastBytes:
    """``time_levers.CastBytes`` of a first dense layer's MLP (DeepSeek-V3's first three): its FC1 a
    LayerNormLinear (the pre-MLP norm is IdentityOp in a dense layer, gpt_layer_specs.py:159),
    f = ffn_hidden_size, over t."""
    return time_levers.fp8_mlp_cast_bytes(spec.hidden_size, spec.ffn_hidden_size, tokens_cp, tp, casts)


def cast_bytes(spec: MoESpec, tokens_cp, tp, copies, etp, casts: Fp8Casts) -> time_levers.CastBytes:
    """``time_levers.CastBytes`` of the FP8 casts in one MoE layer: its attention's, its routed
    and its shared experts'."""
    parts = (attention_cast_bytes(spec, tokens_cp, tp, casts), routed_expert_cast_bytes(spec, copies, etp, casts),
             shared_expert_cast_bytes(spec, tokens_cp, tp, casts))
    return time_levers.CastBytes(*(sum(p[i] for p in parts) for i in range(3)))
