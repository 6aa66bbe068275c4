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

from advisor import equations as eq
from advisor.moe import fp8 as fp8_terms
from advisor.moe import memory as mm
from advisor.moe import mtp as mtp_terms
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


def layer_times(spec: MoESpec, seq_len: int, *, tp, cp, ep, etp, mbs, rates: Rates, imbalance: float = 1.0,
                gemm_rates: Rates | None = None):
    """(dense forward, MoE forward, all-to-all, expert) seconds of one layer, one microbatch;
    backward is twice the compute and the same communication. ``gemm_rates``: the linear
    layers' GEMM rates (``throughput.levers.fp8_rates`` with --fp8-format: attention
    projections, dense and shared MLPs and the routed experts' grouped GEMMs at FP8, core
    attention and the router at BF16), with Transformer Engine's forward casts
    (``advisor.moe.fp8.cast_bytes``; the backward, priced as twice the forward, carries twice
    the forward casts where the backward's own are 1.3-1.7 times those bytes)."""
    fp8 = gemm_rates is not None
    gemm_rates = gemm_rates or rates
    tp, cp = np.asarray(tp, dtype=float), np.asarray(cp, dtype=float)
    tokens_cp = np.asarray(mbs, dtype=float) * seq_len / cp  # the TP group's tokens
    # every projection's FLOPs split over t: the column/row-parallel ones by their weights, MLA's
    # duplicated down projections by their sequence-parallel tokens
    attention_gemm = 2.0 * tokens_cp * params.attention_parameters(spec) / tp / gemm_rates.gemm_flops_per_s \
        + 4 * rates.gemm_latency_s
    core = attention_flops(spec, seq_len, mbs, tp, cp) / rates.attention_flops_per_s + rates.attention_latency_s
    tp_comm, _ = terms.tensor_parallel_time(spec, tokens_cp, tp, rates)
    elementwise = terms.elementwise_time(mm.BF16 * 10 * spec.hidden_size * tokens_cp / tp, rates)
    cp_comm, _ = terms.context_parallel_time(spec, seq_len, mbs, tp, cp, rates, core, 2.5 * core)
    attention = attention_gemm + core + tp_comm / 2 + elementwise + cp_comm
    dense_mlp = terms.gemm_time(tokens_cp, spec.hidden_size, 3 * spec.ffn_hidden_size / tp, gemm_rates) + tp_comm / 2
    tokens = mm.tokens_per_rank(seq_len, mbs, tp, cp)
    copies = mm.expert_token_copies(spec, tokens, ep, etp, mm.RoutedTokens()) * imbalance
    expert_f, _ = expert_gemm_time(spec, copies, ep, etp, gemm_rates)
    shared = 2.0 * tokens_cp * params.shared_expert_parameters(spec, tp) / gemm_rates.gemm_flops_per_s
    router = 2.0 * tokens * spec.hidden_size * spec.num_experts / rates.gemm_flops_per_s
    permute = terms.elementwise_time(4 * copies * mm.BF16 * spec.hidden_size, rates)
    a2a = 2 * all_to_all_time(spec, copies / np.asarray(etp, dtype=float), ep, etp, rates)  # dispatch + combine
    gather = terms.ring_collective_time(copies * mm.BF16 * spec.hidden_size, etp,
                                        terms.link_bandwidth(etp, rates), rates)
    moe = attention + expert_f + shared + router + permute + a2a + 2 * gather
    if fp8:
        moe = moe + terms.elementwise_time(fp8_terms.cast_bytes(spec, tokens_cp, tp, copies, etp)[0], rates)
    return attention + dense_mlp, moe, a2a + 2 * gather, expert_f


def megatron_flops_per_iteration(spec: MoESpec, seq_len: int, global_batch_size: int, padded_vocab: int) -> float:
    """Training FLOPs of one iteration as Megatron-LM counts them for its TFLOP/s
    (``training/training.py``, ``num_floating_point_operations``, transformer_flops; core_v0.15.2),
    term by term, with the D = --mtp-num-layers MTP layers counted as Megatron does (L' = L + D
    layers, the D counted as MoE layers since the last layer is one): 12 L' h (1.5 h_ffn (dense
    share) + 1.5 h_moe k (MoE share) + 1.5 h_shared (MoE share)) for the MLPs; attention
    12 L' h^2 (1 + k/a + s/(2h)) (a d / h) for GQA, or MLA's 6 L' (q term + kv term + h d_rope +
    a d_v h + s a (d_nope + d_rope)/2 + s a d_v/2); the MTP norms and eh projection
    6 D (3h + 2h^2); the logits 6 h v (D + 1); all per token, times gbs x s."""
    h, a, mtp = spec.hidden_size, spec.num_attention_heads, spec.mtp_num_layers
    L = spec.num_layers + mtp
    moe_layers = spec.moe_layers + mtp
    mlp = 12 * L * h * 1.5 * (spec.ffn_hidden_size * spec.first_dense_layers / L
                               + (spec.moe_ffn_hidden_size * spec.moe_router_topk + spec.shared_expert_size)
                               * moe_layers / L)
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
    mtp_terms = 6 * mtp * (3 * h + 2 * h * h)
    return global_batch_size * seq_len * (mlp + attention + mtp_terms + 6 * h * padded_vocab * (mtp + 1))


RECOMPUTE_PASSES = {"none": 3.0, "selective": 3.1, "full": 4.0}
"""Compute passes of a layer per microbatch: forward and a backward of twice its FLOPs; full
recomputation runs the forward again; selective recomputation of --recompute-modules moe_act,
layernorm (and mla_up_proj) redoes elementwise work and MLA's up projections, taken as a tenth
of a forward (an assumption)."""


def step_times(spec: MoESpec, seq_len: int, global_batch_size: int, columns: dict, recompute: str, *, gpu, options,
               first_stage, layers_per_stage: tuple[int, ...] | None = None) -> dict:
    """Step time of MoE layouts (``columns``: tp, cp, pp, ep, etp, dp, mbs, vpp arrays): 1F1B over
    the stages (Narayanan et al. 2021: m x the slowest stage + the others' fill and drain), the
    interleaved schedule's fill and drain divided by v, each chunk's boundary sends
    (``terms.pipeline_p2p_time``, forward and backward, across nodes where the PP neighbours,
    t c d ranks apart, are) and the calibration's overhead per microbatch and stage; the last stage with the LM head
    and the MTP layers (``advisor.moe.mtp.extra_time``); the DP gradient reduce-scatter and
    parameter all-gather (dense parts over DP x CP, experts over EDP; in the gradient dtype, FP8
    weights with --fp8-param-gather), hidden behind the first stage's backward and forward where
    --overlap-grad-reduce / --overlap-param-gather are on, else exposed; Adam on the shards.
    ``first_stage``: ``stage.stage_bytes`` of stage 0 (its parameters). Communication of a layer
    runs once forward and once backward (and again when fully recomputed). ``layers_per_stage``:
    one layout's own split (its largest and its last stage) instead of ``stage.split_layers``."""
    from advisor.throughput import levers
    from advisor.throughput.calibration import load_calibration

    cal = load_calibration()
    rates = terms.Rates.of(gpu, cal)
    training = options.training
    fp8 = training.precision.fp8_format is not None
    gemm_rates = levers.fp8_rates(rates, gpu) if fp8 else None
    c = {k: np.asarray(v, dtype=float) for k, v in columns.items()}
    vpp = c["vpp"]
    dense_f, moe_f, comm, _ = layer_times(spec, seq_len, tp=c["tp"], cp=c["cp"], ep=c["ep"], etp=c["etp"], mbs=c["mbs"],
                                          rates=rates, imbalance=options.routing.imbalance, gemm_rates=gemm_rates)
    passes = RECOMPUTE_PASSES[recompute]
    moe_t = passes * (moe_f - comm) + (3.0 if recompute == "full" else 2.0) * comm
    dense_t = passes * dense_f
    most, fewest_last = ((np.ceil(spec.num_layers / c["pp"]), np.floor(spec.num_layers / c["pp"]))
                         if layers_per_stage is None else (max(layers_per_stage), layers_per_stage[-1]))
    tokens_cp = c["mbs"] * seq_len / c["cp"]
    head_f, head_b = terms.lm_head_time(spec, tokens_cp, c["tp"], spec.vocab_size, rates)
    emb_f, emb_b = terms.embedding_time(spec, tokens_cp, c["tp"], rates)
    mtp = spec.mtp_num_layers * mtp_terms.extra_time(
        spec, tokens_cp, c["tp"], moe_t, head_f + head_b, emb_f + emb_b,
        lambda m, k, n: terms.gemm_time(m, k, n, gemm_rates or rates))
    cross = c["tp"] * c["cp"] * c["dp"] >= rates.gpus_per_node
    p2p = np.where(c["pp"] > 1, terms.pipeline_p2p_time(spec, tokens_cp, c["tp"], cross, rates), 0.0)
    chunk = vpp * 2 * p2p + cal.microbatch_overhead_s  # per microbatch on a rank: its chunks' sends, its overhead
    last = fewest_last * moe_t + head_f + head_b + mtp  # split_layers' last is the shortest
    total = (spec.first_dense_layers * dense_t + spec.moe_layers * moe_t + head_f + head_b + mtp + c["pp"] * chunk)
    slowest = np.maximum(np.where(c["pp"] == 1, total, np.maximum(most * moe_t, last) + chunk), total / c["pp"])
    m = global_batch_size / (c["mbs"] * c["dp"])
    pipeline = m * slowest + (total - slowest) / vpp  # interleaving shrinks the fill and drain v-fold
    dp_comm, optimizer = _data_parallel(c, training, first_stage, most * moe_f, rates)
    step = pipeline + dp_comm + optimizer
    vocab = eq.padded_vocab_size(spec.vocab_size, None, c["tp"])
    flops = megatron_flops_per_iteration(spec, seq_len, global_batch_size, vocab)
    tflops = flops / (step * c["tp"] * c["cp"] * c["pp"] * c["dp"]) / 1e12
    return {"step_time_s": step, "tflops_per_gpu": tflops, "mfu": tflops / gpu.bf16_dense_tflops,
            "tokens_per_s": global_batch_size * seq_len / step,
            "ep_comm_s": m * spec.moe_layers / c["pp"] * (3.0 if recompute == "full" else 2.0) * comm}


def _data_parallel(c: dict, training, first, forward_s, rates: Rates):
    """(exposed DP communication, optimizer) seconds of the first stage (see ``step_times``)."""
    edp = c["tp"] * c["cp"] * c["dp"] / (c["etp"] * c["ep"])
    grad = training.precision.gradient_bytes
    sharded = training.data_parallel.distributed_optimizer
    dense_params = first.weights_gradients_optimizer / (mm.BF16 + grad + 12 / (c["dp"] * c["cp"] if sharded else 1))
    expert_params = first.expert_states / (mm.BF16 + grad + 12 / (edp if sharded else 1))
    span = c["tp"] * c["cp"] * c["dp"]
    param_bytes = 1 if training.precision.fp8_param_gather else mm.BF16
    reduce_d, gather_d = terms.data_parallel_time(dense_params, c["dp"] * c["cp"], span, rates, grad_bytes=grad,
                                                  param_bytes=param_bytes)
    reduce_e, gather_e = terms.data_parallel_time(expert_params, edp, span, rates, grad_bytes=grad,
                                                  param_bytes=param_bytes)
    dp = training.data_parallel
    hidden_reduce = 2 * forward_s if dp.overlap_grad_reduce else 0.0
    hidden_gather = forward_s if dp.overlap_param_gather else 0.0
    exposed = (np.maximum(0.0, reduce_d + reduce_e - hidden_reduce)
               + np.maximum(0.0, gather_d + gather_e - hidden_gather))
    return exposed, terms.optimizer_time(dense_params, c["dp"] * c["cp"], rates) + terms.optimizer_time(
        expert_params, edp, rates)
