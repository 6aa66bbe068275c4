"""Time terms of MoE layers and the iteration of an MoE layout, vectorised over layouts.

Assumptions, stated once:
- Grouped GEMM efficiency: the experts' GEMMs run at the dense GEMM rate times M / (M + 256),
  M the token copies per local expert (``GROUPED_GEMM_HALF_TOKENS``): small per-expert shapes
  run at half the rate at 256 rows. An assumption (no grouped-GEMM probe here), not a fit.
- The EP all-to-all (dispatch and combine, forward and backward: four per layer) is exposed:
  megatron-core 0.15 runs it on the compute stream (``token_dispatcher.py``,
  ``MoEAlltoAllTokenDispatcher``); only the shared experts overlap it with
  --moe-shared-expert-overlap, which the rows do not set.
- Load imbalance: the busiest rank's expert GEMMs and all-to-all scale by
  ``RoutedTokens.imbalance`` (default 1, balanced: the published runs this is checked against
  force balanced routing or use aux-loss balancing after warm-up).
"""

from __future__ import annotations

import numpy as np

from advisor.moe import memory as mm
from advisor.moe import params
from advisor.moe.spec import MoESpec
from advisor.throughput import terms
from advisor.throughput.terms import Rates

GROUPED_GEMM_HALF_TOKENS = 256.0


def grouped_gemm_efficiency(tokens_per_expert):
    """The fraction of the dense GEMM rate a grouped GEMM keeps with M rows per expert."""
    m = np.asarray(tokens_per_expert, dtype=float)
    return m / (m + GROUPED_GEMM_HALF_TOKENS)


def expert_gemm_time(spec: MoESpec, copies, ep, etp, rates: Rates):
    """(forward, backward) of the routed experts: FC1 [copies, h] x [h, 2 h_moe / etp] and FC2
    [copies, h_moe / etp] x [h_moe / etp, h], 2 x 3 h h_moe / etp FLOPs per copy forward, twice
    that backward, at the grouped efficiency, plus one kernel cost per grouped GEMM."""
    local = spec.num_experts / np.asarray(ep, dtype=float)
    flops = 2.0 * copies * 3 * spec.hidden_size * spec.moe_ffn_hidden_size / np.asarray(etp, dtype=float)
    rate = rates.gemm_flops_per_s * grouped_gemm_efficiency(copies / local)
    forward = flops / rate + 2 * rates.gemm_latency_s
    return forward, 2 * forward


def all_to_all_time(spec: MoESpec, copies, ep, etp, rates: Rates):
    """One all-to-all of ``copies`` tokens (2h bytes each) over an EP group of ``ep`` ranks,
    ``etp`` apart (the expert rank order tp-ep-dp-pp: ``parallel_state``, expert RankGenerator).
    The (ep - 1)/ep that leaves the rank splits into the peers inside the node, over NVLink,
    and those outside, over the GPU's network share; the slower of the two paces it."""
    ep, etp = np.asarray(ep, dtype=float), np.asarray(etp, dtype=float)
    size = copies * mm.BF16 * spec.hidden_size
    in_node = np.minimum(ep, np.maximum(1.0, rates.gpus_per_node / etp))
    inside = size * (in_node - 1) / ep / rates.nvlink_bytes_per_s
    outside = size * (ep - in_node) / ep / rates.network_bytes_per_s
    return np.where(ep > 1, np.maximum(inside, outside) + rates.collective_latency_s, 0.0)


def attention_flops(spec: MoESpec, seq_len: int, mbs, tp, cp):
    """Causal attention's executed FLOPs forward on one GPU: QK^T and attention x V, half the
    s x s square, 2 s^2 b a (d_qk + d_v) / 2 over t c (MLA: d_qk = d_nope + d_rope)."""
    if spec.mla is not None:
        qk, v = spec.mla.qk_head_dim + spec.mla.qk_pos_emb_head_dim, spec.mla.v_head_dim
    else:
        qk = v = spec.head_dim
    return 2.0 * seq_len * seq_len * np.asarray(mbs) * spec.num_attention_heads * (qk + v) / 2 / (
        np.asarray(tp) * np.asarray(cp))


def layer_times(spec: MoESpec, seq_len: int, *, tp, cp, ep, etp, mbs, rates: Rates, imbalance: float = 1.0):
    """(dense forward, MoE forward, all-to-all, expert) seconds of one layer, one microbatch;
    backward is twice the compute and the same communication."""
    tp, cp = np.asarray(tp, dtype=float), np.asarray(cp, dtype=float)
    tokens_cp = np.asarray(mbs, dtype=float) * seq_len / cp  # the TP group's tokens
    # every projection's FLOPs split over t: the column/row-parallel ones by their weights, MLA's
    # duplicated down projections by their sequence-parallel tokens
    attention_gemm = 2.0 * tokens_cp * params.attention_parameters(spec) / tp / rates.gemm_flops_per_s \
        + 4 * rates.gemm_latency_s
    core = attention_flops(spec, seq_len, mbs, tp, cp) / rates.attention_flops_per_s + rates.attention_latency_s
    tp_comm, _ = terms.tensor_parallel_time(spec, tokens_cp, tp, rates)
    elementwise = terms.elementwise_time(mm.BF16 * 10 * spec.hidden_size * tokens_cp / tp, rates)
    cp_comm, _ = terms.context_parallel_time(spec, seq_len, mbs, tp, cp, rates, core, 2.5 * core)
    attention = attention_gemm + core + tp_comm / 2 + elementwise + cp_comm
    dense_mlp = terms.gemm_time(tokens_cp, spec.hidden_size, 3 * spec.ffn_hidden_size / tp, rates) + tp_comm / 2
    tokens = mm.tokens_per_rank(seq_len, mbs, tp, cp)
    copies = mm.expert_token_copies(spec, tokens, ep, etp, mm.RoutedTokens()) * imbalance
    expert_f, _ = expert_gemm_time(spec, copies, ep, etp, rates)
    shared = 2.0 * tokens_cp * params.shared_expert_parameters(spec, tp) / rates.gemm_flops_per_s
    router = 2.0 * tokens * spec.hidden_size * spec.num_experts / rates.gemm_flops_per_s
    permute = terms.elementwise_time(4 * copies * mm.BF16 * spec.hidden_size, rates)
    a2a = 2 * all_to_all_time(spec, copies / np.asarray(etp, dtype=float), ep, etp, rates)  # dispatch + combine
    gather = terms.ring_collective_time(copies * mm.BF16 * spec.hidden_size, etp,
                                        terms.link_bandwidth(etp, rates), rates)
    moe = attention + expert_f + shared + router + permute + a2a + 2 * gather
    return attention + dense_mlp, moe, a2a + 2 * gather, expert_f


def megatron_flops_per_iteration(spec: MoESpec, seq_len: int, global_batch_size: int, padded_vocab: int) -> float:
    """Training FLOPs of one iteration as Megatron-LM counts them for its TFLOP/s
    (``training/training.py``, ``num_floating_point_operations``, transformer_flops; core_v0.15.2),
    term by term: 12 L h (1.5 h_ffn (dense share) + 1.5 h_moe k (MoE share) + 1.5 h_shared (MoE
    share)) for the MLPs; attention 12 L h^2 (1 + k/a + s/(2h)) (a d / h) for GQA, or MLA's
    6 L (q term + kv term + h d_rope + a d_v h + s a (d_nope + d_rope)/2 + s a d_v/2); the logits
    6 h v; all per token, times gbs x s. MTP modules are not counted (the rows train without them)."""
    h, L, a = spec.hidden_size, spec.num_layers, spec.num_attention_heads
    mlp = 12 * L * h * 1.5 * (spec.ffn_hidden_size * spec.first_dense_layers / L
                               + (spec.moe_ffn_hidden_size * spec.moe_router_topk + spec.shared_expert_size)
                               * spec.moe_layers / L)
    mla = spec.mla
    if mla is None:
        d = spec.head_dim
        attention = 12 * L * h * h * (1 + spec.num_query_groups / a + seq_len / h / 2) * (d * a / h)
    else:
        q_head = mla.qk_head_dim + mla.qk_pos_emb_head_dim
        q_term = h * a * q_head if mla.q_lora_rank is None else mla.q_lora_rank * (h + a * q_head + 1)
        attention = 6 * L * (q_term + mla.kv_lora_rank * (h + a * (mla.qk_head_dim + mla.v_head_dim) + 1)
                             + h * mla.qk_pos_emb_head_dim + a * mla.v_head_dim * h
                             + seq_len * a * q_head / 2 + seq_len * a * mla.v_head_dim / 2)
    return global_batch_size * seq_len * (mlp + attention + 6 * h * padded_vocab)
