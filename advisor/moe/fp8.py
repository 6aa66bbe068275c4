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
        norms = 2 * spec.head_dim if spec.qk_layernorm else 0
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


def cast_bytes(spec: MoESpec, tokens_cp, tp, copies, etp, casts: Fp8Casts):
    """(forward, backward) HBM bytes of Transformer Engine's FP8 casts in one MoE layer, at
    ``casts`` per element (``throughput.levers.fp8_casts``, as ``fp8_cast_bytes`` for a dense
    layer): forward each GEMM's input, backward each GEMM's output gradient. Attention: GQA's
    input h (its LayerNormLinear's, normed) and projection input a d; MLA's down projections'
    inputs h twice (plain linears after the layer's own norm), its up projections' q_lora and
    kv_lora (normed where qk_layernorm makes them LayerNormLinears, gpt_layer_specs.py:129-138)
    and a d_v; gradients (a + 2k) d and h, or MLA's q_lora, kv_lora + d_rope, a(d_nope + d_rope),
    a(d_nope + d_v), h; all over t. Shared experts as a dense MLP of f_shared over t, routed
    experts per token copy, inputs h and h_moe / etp, gradients 2 h_moe / etp and h: all quantised
    on their own (the pre-MLP norm is a module of its own in an MoE layer, and the experts'
    inputs come from the dispatcher)."""
    h, t = spec.hidden_size, np.asarray(tp, dtype=float)
    mla = spec.mla
    if mla is None:
        a, k, d = spec.num_attention_heads, spec.num_query_groups, spec.head_dim
        attention_f = casts.normed * h + casts.operand * a * d
        attention_b = (a + 2 * k) * d + h
    else:
        a, q = spec.num_attention_heads, mla.q_lora_rank or 0
        up = casts.normed if spec.qk_layernorm else casts.operand
        attention_f = casts.operand * (2 * h + a * mla.v_head_dim) + up * (q + mla.kv_lora_rank)
        attention_b = (q + mla.kv_lora_rank + mla.qk_pos_emb_head_dim + a * (mla.qk_head_dim + mla.qk_pos_emb_head_dim)
                       + a * (mla.qk_head_dim + mla.v_head_dim) + h)
    f_shared, f = spec.shared_expert_size, spec.moe_ffn_hidden_size / np.asarray(etp, dtype=float)
    shared_f, shared_b = (h + f_shared, 2 * f_shared + h) if f_shared else (0, 0)
    forward = tokens_cp * attention_f / t + casts.operand * (tokens_cp * shared_f / t + copies * (h + f))
    backward = casts.operand * (tokens_cp * (attention_b + shared_b) / t + copies * (2 * f + h))
    return forward, backward
