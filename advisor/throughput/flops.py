"""FLOP counts: the one Megatron-LM reports (TFLOP/s, MFU) and the ones the GPU executes (time).

Megatron-LM's ``num_floating_point_operations`` (``megatron/training/training.py``) counts,
per iteration, 3 x (forward) with a GEMM of m x n by n x k as 2mnk FLOPs:

    12 * gbs * s * L * h^2 * ((1 + k/a + A) * (a d / h) + 3/2 * h_ffn / h + v_padded / (2 L h))

where A is the attention-score term. Megatron-LM core_r0.8-0.9, and the paper's fork
(okoge-kaz/Megatron-LM v0.9.0-abci, which logged seed 004's TFLOP/s), count the full s x s
score matrix: A = s/h. From core_r0.10 upstream counts the causal half: A = s/(2h)
(``FlopsConvention``). A causal flash-attention kernel executes about half of the full count
forward, and 2.5 forward passes backward (it recomputes Q K^T): ``attention_executed_flops``.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from advisor.models import LlamaSpec

FlopsConvention = Literal["paper", "megatron"]
"""'paper': full attention, s/h (Megatron-LM core_r0.8/0.9 and the paper's fork);
'megatron': causal attention, s/(2h) (Megatron-LM from core_r0.10, including core_v0.15)."""



def megatron_flops_per_iteration(
    spec: LlamaSpec, seq_len: int, global_batch_size, padded_vocab, convention: FlopsConvention = "megatron"
):
    """FLOPs of one iteration as Megatron-LM's ``num_floating_point_operations`` counts them,
    with ``padded_vocab`` the run's ``args.padded_vocab_size`` (``equations.padded_vocab_size``)."""
    h, L, s = spec.hidden_size, spec.num_layers, seq_len
    a, k, d = spec.num_attention_heads, spec.num_query_groups, spec.head_dim
    score = s / h if convention == "paper" else s / (2 * h)
    per_token = 12 * L * h * h * (
        (1 + k / a + score) * (a * d / h)
        + 1.5 * spec.ffn_hidden_size / h
        + padded_vocab / (2 * L * h)
    )
    return np.asarray(global_batch_size) * s * per_token


def layer_gemm_shapes(spec: LlamaSpec, tokens, tp):
    """The four forward GEMMs of one Megatron-core Llama layer on one TP rank, as (m, k, n):
    QKV [tokens, h] x [h, (a + 2k) d / t], output projection [tokens, a d / t] x [., h],
    FC1 (gate and up fused) [tokens, h] x [h, 2 h_ffn / t], FC2 [tokens, h_ffn / t] x [., h]."""
    h, a, k, d, f = spec.hidden_size, spec.num_attention_heads, spec.num_query_groups, spec.head_dim, spec.ffn_hidden_size
    tp = np.asarray(tp, dtype=float)
    return (
        (tokens, h, (a + 2 * k) * d / tp),
        (tokens, a * d / tp, h),
        (tokens, h, 2 * f / tp),
        (tokens, f / tp, h),
    )


def attention_executed_flops(spec: LlamaSpec, seq_len: int, mbs, tp, cp):
    """Forward FLOPs a causal flash-attention kernel executes for one layer, one microbatch,
    one GPU: Q K^T and P V over the lower triangle, 2 x 2 b s^2 (a d) / 2, split over the heads
    (t) and, load-balanced, over the CP ranks (c). The backward pass executes 2.5 times this
    (Dao 2023, FlashAttention-2, Section 3: it recomputes Q K^T)."""
    query = spec.num_attention_heads * spec.head_dim
    return 2.0 * np.asarray(mbs) * seq_len * seq_len * query / (np.asarray(tp) * np.asarray(cp))
