"""The MoE term functions that were checked only through sums of them (a layer's transient peak,
its router's kept bytes, a model's total) or not at all, one at a time against arithmetic written
out here from the source each docstring cites (megatron-core core_v0.15.2 unless noted), on small
cases: Mixtral 8x7B (h 4096, a 32, k_v 8, d 128, E 8, top-2, h_moe 14336), DeepSeek-V3 (h 7168,
a 128, q_lora 1536, kv_lora 512, d_nope 128, d_rope 64, d_v 128, E 256, top-8, h_moe 2048, shared
2048, h_ffn 18432) and Qwen3-30B-A3B (h 2048, E 128, top-8). BF16 2 B, FP32 4 B, int64 8 B, bool 1 B."""

import numpy as np
import pytest

from advisor.models import preset
from advisor.moe import ep_time, fp8, fsdp, mtp, params
from advisor.moe import memory as mm
from advisor.moe import time as mt
from advisor.moe import transient as tr
from advisor.moe.spec import PRESETS
from advisor.throughput import terms
from advisor.throughput.levers import Fp8Casts
from advisor.throughput.terms import Rates

MIXTRAL, DSV3, QWEN = PRESETS["mixtral-8x7b"], PRESETS["deepseek-v3"], PRESETS["qwen3-30b-a3b"]
MiB = 2**20
BALANCED = mm.RoutedTokens()


# --- advisor.moe.memory: routed-token counts and per-token router terms ------------------------


def test_sent_and_gathered_token_counts_by_hand():
    """``moe_utils.permute``'s num_out_tokens: a rank sends N k copies, f N k padded to capacity f
    (the dropped slots are filled); the allgather dispatcher gathers N etp ep rows over its
    tp_ep_group (token_dispatcher.py:256-261), none where etp ep = 1."""
    n = 1024
    assert mm.sent_token_copies(MIXTRAL, n, BALANCED) == 1024 * 2
    assert mm.sent_token_copies(MIXTRAL, n, mm.RoutedTokens(routing="capacity", capacity_factor=1.25)) == 2560
    # dropless: the busiest rank receives more, but sends its own N k
    assert mm.sent_token_copies(MIXTRAL, n, mm.RoutedTokens(routing="dropless")) == 2048
    assert float(mm.gathered_tokens(n, 4, 2)) == 1024 * 4 * 2
    assert float(mm.gathered_tokens(n, 1, 1)) == 0.0
    assert float(mm.local_experts(DSV3, 64)) == 256 / 64


def test_router_per_token_terms_by_hand():
    """Per token routed (router.py ``TopKRouter.routing``, moe_utils.py
    ``topk_routing_with_score_function``, ``compute_routing_scores_for_aux_loss``):
    the pre-MLP RMSNorm's input 2h, FP32 rstd 4 and output 2h (the gate GEMM's saved input);
    softmax after top-k: int64 indices 8k and the FP32 softmax over the k, 4k; the aux loss's FP32
    softmax over all E, 4E; sigmoid with the expert bias: the sigmoid over E, 4E, the gather index
    8k, the picked scores 4k and their sum 4; fused (TE FusedTopkScoreFunction): map E + FP32 4E."""
    assert mm.router_norm_bytes(MIXTRAL) == 2 * 4096 + 4 + 2 * 4096  # 16388
    assert mm.router_norm_bytes(MIXTRAL, norm_recomputed=True) == 2 * 4096  # the checkpoint's input only
    assert mm.routing_saved_bytes(MIXTRAL) == 8 * 2 + 4 * 2  # 24
    assert mm.routing_saved_bytes(MIXTRAL, fused=True) == 8 + 4 * 8  # 40
    assert mm.routing_saved_bytes(QWEN) == 8 * 8 + 4 * 8  # 96
    assert mm.routing_saved_bytes(DSV3) == 4 * 256 + 8 * 8 + 4 * 8 + 4  # 1124; group mask dropped (bias)
    assert mm.aux_loss_saved_bytes(MIXTRAL) == 4 * 8  # 32
    assert mm.aux_loss_saved_bytes(DSV3) == 4 * 256 + 4  # sigmoid and its sum: 1028
    assert mm.aux_loss_saved_bytes(DSV3, fused=True) == 4 * 256
    assert mm.capacity_mask_bytes(MIXTRAL, mm.RoutedTokens(routing="capacity", capacity_factor=1.0)) == 8
    assert mm.capacity_mask_bytes(MIXTRAL, BALANCED) == 0


# --- advisor.moe.transient: each tensor of the alltoall and allgather paths --------------------
# Mixtral, N = 1024 tokens a rank, EP 4 (2 local experts), ETP 2, balanced: c = N k etp = 4096
# copies the local experts process, r = c / etp = 2048 the all-to-all brings, S = N k 2h sent.

N, C, R = 1024.0, 4096.0, 2048.0
H, H_MOE = 4096, 14336


def test_alltoall_tensors_one_by_one():
    """token_dispatcher.py ``MoEAlltoAllTokenDispatcher``: the permuted send buffer N k x 2h; the
    all-to-all's output r x 2h (with 2 local experts it is sorted into a kept copy, so it is
    transient); the experts' output c x 2h and its unsort (``sort_chunks_by_idxs``, :727) c x 2h;
    at etp > 1 ``hidden_states.to(self.probs.dtype)`` (:740), c x 4h, reduce-scattered to r x 4h;
    the received FP32 probabilities r x 4; the held probs and map N E (4 + 1)."""
    send = 1024 * 2 * 2 * H  # 16 MiB
    assert tr.a2a_send_bytes(MIXTRAL, N, BALANCED) == send == 16 * MiB
    assert float(tr.a2a_received_bytes(MIXTRAL, C, 4, 2)) == 2048 * 2 * H == 16 * MiB
    # EP 8 ETP 1: one local expert, the all-to-all's output is the experts' kept input
    assert float(tr.a2a_received_bytes(MIXTRAL, 2048.0, 8, 1)) == 0.0
    assert tr.expert_output_bytes(MIXTRAL, C) == 4096 * 2 * H == 32 * MiB
    assert float(tr.unsort_bytes(MIXTRAL, C, 4)) == 32 * MiB
    assert float(tr.unsort_bytes(MIXTRAL, C, 8)) == 0.0
    assert float(tr.etp_cast_bytes(MIXTRAL, C, 2)) == 4096 * 4 * H == 64 * MiB
    assert float(tr.etp_cast_bytes(MIXTRAL, C, 1)) == 0.0
    assert float(tr.etp_reduce_scatter_bytes(MIXTRAL, C, 2)) == 2048 * 4 * H == 32 * MiB
    assert float(tr.a2a_received_probs_bytes(MIXTRAL, C, 4, 2)) == 2048 * 4
    assert tr.a2a_routing_held_bytes(MIXTRAL, N) == 1024 * 8 * 5
    assert tr.shared_expert_output_bytes(MIXTRAL, N) == 0.0
    assert tr.shared_expert_output_bytes(DSV3, N) == 1024 * 2 * 7168


def test_alltoall_peaks_from_their_tensors():
    """Forward: the larger of combine_preprocess's moment, S + r 2h + c 2h + unsort c 2h + cast c 4h
    + scatter r 4h = 16 + 16 + 32 + 32 + 64 + 32 = 192 MiB, and the combine all-to-all's, 2 S +
    r 2h + r 2h = 64 MiB; + the received probabilities 8 KiB and the held routing 40 KiB.
    Backward: the reduce-scatter's backward c 4h + max(r 4h, c 2h) = 64 + 32 = 96 MiB; the unsort's
    2 c 2h = 64; the combine's S + r 2h = 32; FC2's c 2 (h + h_moe / etp) = 4096 x 2 x 11264 =
    88 MiB; FC1's output gradient c 2 x 2 h_moe / etp = 4096 x 28672 = 112 MiB, which leads."""
    held, probs = 1024 * 8 * 5, 2048 * 4
    assert float(tr.a2a_forward_peak_bytes(MIXTRAL, N, C, 4, 2)) == 192 * MiB + probs + held
    assert float(tr.a2a_reduce_scatter_backward_bytes(MIXTRAL, C, 2)) == 4096 * 4 * H + 2048 * 4 * H == 96 * MiB
    # ETP 4 (c = 8192, r = 2048): the BF16 cast c 2h (64 MiB) outgrows the incoming r 4h (32 MiB)
    assert float(tr.a2a_reduce_scatter_backward_bytes(MIXTRAL, 8192.0, 4)) == 8192 * 4 * H + 8192 * 2 * H
    assert float(tr.expert_fc2_backward_bytes(MIXTRAL, C, 2)) == 4096 * 2 * (H + H_MOE / 2) == 88 * MiB
    assert tr.expert_transient_bytes(MIXTRAL, C, 2) == 4096 * 2 * 2 * H_MOE / 2 == 112 * MiB
    assert float(tr.experts_backward_peak_bytes(MIXTRAL, C, 2)) == 112 * MiB
    assert float(tr.a2a_backward_peak_bytes(MIXTRAL, N, C, 4, 2)) == 112 * MiB + held


def test_allgather_tensors_one_by_one():
    """token_dispatcher.py ``MoEAllGatherTokenDispatcher``: T = N etp ep = 8192 rows gathered into
    the global buffer (:260) T x 2h; the combine's reduce-scatter (:323) reads the unpermuted rows
    T x 2h and their FP32 copy T x 4h and writes N x 4h; the unpermute (:304) writes T x 2h beside
    the experts' output c x 2h; the local map max(T, N) E / ep bool; the gathered FP32 probabilities
    max(T, N) E 4 and the router's map N E."""
    t = 1024 * 2 * 4
    assert float(tr.allgather_buffer_bytes(MIXTRAL, N, 4, 2)) == t * 2 * H == 64 * MiB
    assert float(tr.allgather_combine_bytes(MIXTRAL, N, 4, 2)) == t * 6 * H + 1024 * 4 * H == 208 * MiB
    assert float(tr.allgather_unpermute_bytes(MIXTRAL, N, C, 4, 2)) == (4096 + t) * 2 * H == 96 * MiB
    # nothing gathered at EP 1 ETP 1: the unpermute's rows are the rank's own N
    assert float(tr.allgather_unpermute_bytes(MIXTRAL, N, 2048.0, 1, 1)) == (2048 + 1024) * 2 * H
    assert float(tr.allgather_map_held_bytes(MIXTRAL, N, 4, 2)) == t * 8 / 4
    assert float(tr.allgather_routing_held_bytes(MIXTRAL, N, 4, 2)) == 1024 * 8 + t * 8 * 4 + t * 8 / 4
    # forward: buffer 64 + routing + max(combine 208, unpermute 96); backward: buffer 64 + map +
    # max(the scatter's backward T 6h = 192, the unpermute's (T + c) 2h = 96, the experts' 112)
    routing = 1024 * 8 + t * 8 * 4 + t * 2
    assert float(tr.allgather_forward_peak_bytes(MIXTRAL, N, C, 4, 2)) == (64 + 208) * MiB + routing
    assert float(tr.allgather_backward_peak_bytes(MIXTRAL, N, C, 4, 2)) == (64 + 192) * MiB + t * 2


def test_held_between_forwards_and_flex_buffers_by_hand():
    """Recomputed (no autograd in the forward), the alltoall dispatcher holds its probs and map
    N E (4 + 1) and ``reversed_local_input_permutation_mapping``, int64 per copy sent, N k 8
    (token_dispatcher.py:596); the allgather one its local map and per copy its experts process
    the FP32 local_probs and the int64 permutation index, c (4 + 8) (:282, :289). DeepEP's
    buffers: the received copies, c x 2h (``fused_a2a.py``)."""
    assert tr.alltoall_held_bytes(MIXTRAL, N, recomputed=True) == 1024 * 8 * 5 + 1024 * 2 * 8
    assert float(tr.allgather_held_bytes(MIXTRAL, N, C, 4, 2, recomputed=True)) == 8192 * 8 / 4 + 4096 * 12
    assert float(tr.allgather_held_bytes(MIXTRAL, N, C, 4, 2)) == 8192 * 8 / 4
    assert tr.flex_buffer_bytes(MIXTRAL, C) == 4096 * 2 * H


# --- advisor.moe.params and mtp: per-module parameter counts on one GPU ------------------------


def test_per_module_parameters_at_tp_ep_etp_by_hand():
    """experts.py: one expert's FC1 h x 2 h_moe and FC2 h_moe x h, E / ep of them over etp;
    shared_experts.py: one MLP of 2048 over t; router.py: the E x h gate, replicated;
    multi_latent_attention.py: the down projections (h q_lora, h (kv_lora + d_rope)) and the latent
    norms (q_lora + kv_lora, with --qk-layernorm) duplicated, the up projections (q_lora a
    (d_nope + d_rope), kv_lora a (d_nope + d_v)) and the output projection (a d_v h) over t.
    Mixtral's attention: QKV h (a + 2 k_v) d and the output a d h over t (Eq. 1)."""
    assert params.expert_parameters(MIXTRAL) == 3 * 4096 * 14336  # 176,160,768
    assert params.local_expert_parameters(MIXTRAL, ep=4, etp=2) == 8 / 4 * 176_160_768 / 2
    assert params.shared_expert_parameters(DSV3, tp=2) == 3 * 7168 * 2048 / 2
    assert params.shared_expert_parameters(MIXTRAL, tp=2) == 0
    assert params.router_parameters(DSV3) == 256 * 7168
    assert params.attention_parameters(MIXTRAL, tp=2) == (4096 * (32 + 2 * 8) * 128 + 32 * 128 * 4096) / 2
    replicated = 7168 * 1536 + 7168 * (512 + 64) + 1536 + 512
    split = 1536 * 128 * (128 + 64) + 512 * 128 * (128 + 128) + 128 * 128 * 7168
    assert params.attention_parameters(DSV3, tp=2) == replicated + split / 2
    attention = replicated + split / 2
    assert params.moe_layer_dense_parameters(DSV3, tp=2) == attention + 2 * 7168 + 256 * 7168 + 3 * 7168 * 2048 / 2
    assert params.dense_layer_parameters(DSV3, tp=2) == attention + 3 * 7168 * 18432 / 2 + 2 * 7168


def test_mixtral_total_parameters_by_hand():
    """All 8 experts of the 32 layers, the untied embedding and LM head (v 32000) and the final norm:
    46,702,792,704, the model card's 46.7B; ``every_parameter`` is that count for an MoE spec."""
    layer = 4096 * (32 + 2 * 8) * 128 + 32 * 128 * 4096 + 2 * 4096 + 8 * 4096 + 8 * 3 * 4096 * 14336
    total = 32 * layer + 2 * 32000 * 4096 + 4096
    assert total == 46_702_792_704
    assert params.total_parameters(MIXTRAL) == total
    assert params.every_parameter(MIXTRAL) == total


def test_mtp_own_parameters_and_checkpoint_by_hand():
    """multi_token_prediction.py ``MultiTokenPredictionLayer``: enorm, hnorm and final_layernorm
    (h each, replicated), eh_proj 2h x h column-parallel over t; under full recomputation it keeps
    the checkpoint's input, the next tokens' embedding, 2h per token over t c."""
    assert float(mtp.own_parameters(DSV3, 8)) == 3 * 7168 + 2 * 7168 * 7168 / 8
    assert float(mtp.checkpoint_bytes(DSV3, 4096, 2, 2, 2)) == 2 * 4096 * 2 * 7168 / 4


# --- advisor.moe.time, fp8 and fsdp --------------------------------------------------------------


def test_causal_attention_flops_by_hand():
    """QK^T (2 s^2 d_qk a head) and PV (2 s^2 d_v) over the causal half of the s x s square, b
    sequences, a / t heads, s / c queries: GQA d_qk = d_v = 128; MLA d_qk = d_nope + d_rope = 192,
    d_v = 128."""
    s, b, tp, cp = 4096, 2, 2, 2
    gqa = (2 * s * s * 128 + 2 * s * s * 128) / 2 * b * 32 / (tp * cp)
    assert float(mt.attention_flops(MIXTRAL, s, b, tp, cp)) == gqa == 2 * s * s * b * 32 * 128 / 4
    mla = (2 * s * s * 192 + 2 * s * s * 128) / 2 * b * 128 / (tp * cp)
    assert float(mt.attention_flops(DSV3, s, b, tp, cp)) == mla


def test_fp8_gemm_counts_and_weights_by_hand():
    """Transformer Engine modules run in FP8: GQA's QKV and output projection (2); MLA's q down,
    q up, kv down, kv up and output projection (5; 4 without q_lora); the shared experts' FC1 and
    FC2; each local expert's FC1 and FC2 (one GEMM each of the grouped linears). Their weights:
    the attention's less its norms, the shared and the local experts'."""
    assert fp8.attention_gemms(MIXTRAL) == 2 and fp8.attention_gemms(DSV3) == 5
    split = 1536 * 128 * 192 + 512 * 128 * 256 + 128 * 128 * 7168
    assert fp8.attention_linear_parameters(DSV3, 2) == 7168 * 1536 + 7168 * 576 + split / 2
    # Qwen3's per-head Q and K RMSNorms (d = 128 each) are not GEMM weights
    assert fp8.attention_linear_parameters(QWEN, 1) == 2048 * (32 + 2 * 4) * 128 + 32 * 128 * 2048
    linear, gemms = fp8.moe_layer_fp8(MIXTRAL, 2, 4, 2)
    assert float(linear) == (4096 * 48 * 128 + 32 * 128 * 4096) / 2 + 2 * 3 * 4096 * 14336 / 2
    assert int(gemms) == 2 + 2 * 2
    linear, gemms = fp8.moe_layer_fp8(DSV3, 2, 64, 1)
    assert float(linear) == 7168 * 1536 + 7168 * 576 + split / 2 + 3 * 7168 * 2048 / 2 + 4 * 3 * 7168 * 2048
    assert int(gemms) == 5 + 2 + 2 * 4


def test_fsdp_units_held_by_hand():
    """Megatron-FSDP's units (``advisor.moe.fsdp``'s docstring: each transformer layer a unit, an MTP
    layer's among them). A stage of 3 dense layers (300 elements each) and 2 MoE units (dense part 100, experts 1000):
    the dense-part elements 3 x 300 + 2 x 100, the experts' 2 x 1000, the largest unit an MoE layer
    whole (1100), 5 units; without MoE units the largest is a dense layer."""
    dense, experts, largest, units = fsdp.held_parameters((100.0, 1000.0, 300.0), 3, 2)
    assert (float(dense), float(experts), float(largest), float(units)) == (1100.0, 2000.0, 1100.0, 5.0)
    assert float(fsdp.held_parameters((100.0, 1000.0, 300.0), 4, 0)[2]) == 300.0
    assert float(fsdp.held_parameters((100.0, 1000.0, 5000.0), 1, 1)[2]) == 5000.0


# --- advisor.throughput.terms: the three not in tests/test_terms_by_hand.py ----------------------

RATES = Rates(gemm_flops_per_s=1e12, gemm_latency_s=0.0, attention_flops_per_s=5e11, attention_latency_s=3.5e-5,
              hbm_bytes_per_s=1e12, nvlink_bytes_per_s=1e11, network_bytes_per_s=1e10, collective_latency_s=1e-6,
              gpus_per_node=8, host_mask_s_per_element=1e-9)


def test_attention_kernel_elementwise_and_tp_collective_by_hand():
    """The flash-attention calls: backward 2.5 x the forward's FLOPs (FlashAttention-2, Section 3)
    and one call's fixed cost per CP ring step split 1 : 2.5; a memory-bound pass: bytes / HBM; one
    sequence-parallel ring collective of [tokens, h] BF16 over t inside a node: (t - 1) / t of it
    over NVLink, plus t - 1 latencies (Patarasuk and Yuan 2009)."""
    forward, backward = terms.attention_kernel_time(1e12, 2, RATES)
    assert float(forward) == pytest.approx(1e12 / 5e11 + 2 * 3.5e-5 / 3.5, rel=1e-12)  # 2.00002 s
    assert float(backward) == pytest.approx(2.5e12 / 5e11 + 2.5 * 2 * 3.5e-5 / 3.5, rel=1e-12)  # 5.00005 s
    assert terms.elementwise_time(3e9, RATES) == pytest.approx(3e-3, rel=1e-12)
    llama = preset("llama3.1-8b")  # h 4096
    expected = 3 / 4 * 2 * 8192 * 4096 / 1e11 + 3 * 1e-6  # 0.5033 ms + 3 us
    assert float(terms.tp_collective_time(llama, 8192, 4, RATES)) == pytest.approx(expected, rel=1e-12)
    assert float(terms.tp_collective_time(llama, 8192, 4, RATES, element_bytes=1)) == pytest.approx(
        3 / 4 * 8192 * 4096 / 1e11 + 3e-6, rel=1e-12)
    assert np.all(terms.tp_collective_time(llama, 8192, 1, RATES) == 0.0)


CASTS = Fp8Casts(operand=6.0, normed=4.0, gathered_operand=5.0, gathered_normed=3.0, transpose=2.0)
"""Round bytes per element (not a recipe's): each term's count of elements shows in its sum."""


def test_fp8_dense_mlp_and_mla_attention_casts_by_hand():
    """A first dense layer's MLP (DeepSeek-V3, h_ffn 18432; FC1 a LayerNormLinear, gathered), 4096
    tokens at TP 2: forward FC1's input h (normed, gathered: on the shard) and FC2's input h_ffn
    over t; backward FC1's output gradient 2 h_ffn over t, FC2's output gradient h (gathered: on
    the shard) and the transposes of the two gathered operands, all 4096 rows, h each.
    MLA's backward (multi_latent_attention.py): the output gradients of q down (q_lora) and kv down
    (kv_lora + d_rope, duplicated linears on the shard), q up (a (d_nope + d_rope)), kv up
    (a (d_nope + d_v)) over t, the output projection's h (gathered), and the transposes of the
    projection's gradient (h) and of the up projections' gathered latents (q_lora + kv_lora)."""
    s, t, h, f = 4096, 2, 7168, 18432
    transposes = 2 * s * h + 2 * s * h
    forward, backward, transposed = fp8.dense_mlp_cast_bytes(DSV3, float(s), t, CASTS)
    assert float(forward) == s * h * 3 / t + s * f * 6 / t
    assert float(transposed) == transposes
    assert float(backward) == s * 2 * f * 6 / t + s * h * 5 / t + transposes
    gradients = 1536 + 512 + 64 + 128 * (128 + 64) + 128 * (128 + 128)
    transposes = 2 * s * h + 2 * s * (1536 + 512)
    _, backward, transposed = fp8.attention_cast_bytes(DSV3, float(s), t, CASTS)
    assert float(transposed) == transposes
    assert float(backward) == 6 * s * gradients / t + 5 * s * h / t + transposes
    # the up projections' latents, normed (qk_layernorm) and gathered: cast on the shard
    assert float(fp8.mla_up_cast_bytes(DSV3, float(s), t, CASTS)) == s * (1536 + 512) * 3 / t
    assert float(fp8.mla_up_cast_bytes(MIXTRAL, float(s), t, CASTS)) == 0.0


def test_host_mask_and_data_loader_bound_by_hand():
    """gpt_dataset._get_ltor_masks_and_position_ids builds an s x s mask per sample, shared by the
    loader's workers: at 1e-9 s an element, s 8192, 2 workers: 8192^2 x 1e-9 / 2 = 33.55 ms a sample;
    a replica's 16 samples take 0.537 s, above a 0.4 s step, below a 0.6 s one."""
    per_sample = 8192 * 8192 * 1e-9 / 2
    assert terms.host_mask_time(8192, RATES) == pytest.approx(per_sample, rel=1e-12)
    assert float(terms.data_loader_bound(0.4, True, 16, 8192, RATES)) == pytest.approx(16 * per_sample, rel=1e-12)
    assert float(terms.data_loader_bound(0.6, True, 16, 8192, RATES)) == 0.6
    assert terms.data_loader_bound(0.4, False, 16, 8192, RATES) == 0.4


def test_paired_time_by_hand():
    """Communication c on its own stream beside work w, the work slowed by the share f of the SMs the
    communication holds while both run: max(c, w + f c). c 4 ms beside w 3 ms: 4 ms plain NCCL
    (f 0), 3 + 0.25 x 4 = 4 ms at f 1/4, 3 + 0.5 x 4 = 5 ms at f 1/2 (then the pair saves only
    c + w - 5 = 2 ms, (1 - f) c); w 0: c."""
    assert float(ep_time.paired_time(4e-3, 3e-3)) == 4e-3
    assert float(ep_time.paired_time(4e-3, 3e-3, 0.25)) == pytest.approx(4e-3, rel=1e-12)
    assert float(ep_time.paired_time(4e-3, 3e-3, 0.5)) == pytest.approx(5e-3, rel=1e-12)
    assert float(ep_time.paired_time(4e-3, 0.0, 0.5)) == 4e-3
