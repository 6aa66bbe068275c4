"""Issue 24: each time term against a value derived by hand from its source, with the rates set to
round numbers (no fitted constant enters), so that a wrong factor fails here and not only in a
comparison with the code's own output (which a refit absorbs)."""

import numpy as np
import pytest

from advisor.models import preset
from advisor.throughput import terms
from advisor.throughput.terms import Rates

SPEC = preset("llama3.1-8b")  # h 4096, a 32, k 8, d 128, h_ffn 14336
H, A, K, D, F = 4096, 32, 8, 128, 14336
RATES = Rates(gemm_flops_per_s=1e12, gemm_latency_s=0.0, attention_flops_per_s=5e11, attention_latency_s=0.0,
              hbm_bytes_per_s=1e12, nvlink_bytes_per_s=1e11, network_bytes_per_s=1e10, collective_latency_s=0.0,
              gpus_per_node=8, host_mask_s_per_element=1e-9)
LATENT = Rates(**{**{f: getattr(RATES, f) for f in Rates.__dataclass_fields__}, "gemm_latency_s": 1e-5,
                  "collective_latency_s": 1e-6})


def test_a_gemm_is_2mnk_flops_plus_its_latency():
    assert terms.gemm_time(2, 3, 5, RATES) == 60 / 1e12
    assert terms.gemm_time(2, 3, 5, LATENT) == pytest.approx(60 / 1e12 + 1e-5, rel=1e-15)


def test_a_layers_gemms_forward_and_backward_by_hand():
    """QKV [T, h] x [h, (a + 2k) d / t], output [T, a d / t] x [., h], FC1 [T, h] x [h, 2 f / t],
    FC2 [T, f / t] x [., h]; backward: a data- and a weight-gradient GEMM each, 2 x forward."""
    tokens, tp = 8192, 2
    flops = 2 * tokens * (H * (A + 2 * K) * D / tp + A * D / tp * H + H * 2 * F / tp + F / tp * H)
    forward, backward = terms.layer_gemm_time(SPEC, tokens, tp, RATES)
    assert forward == pytest.approx(flops / 1e12, rel=1e-12)
    assert backward == pytest.approx(2 * flops / 1e12, rel=1e-12)


def test_causal_flash_attention_by_hand():
    """Q K^T and P V over the lower triangle: 2 x 2 b s^2 a d / 2 per layer, split over t and c;
    backward 2.5 x forward (FlashAttention-2, Section 3)."""
    s, b, tp, cp = 8192, 2, 2, 2
    flops = 2 * 2 * b * s * s * A * D / 2 / (tp * cp)
    forward, backward = terms.attention_time(SPEC, s, b, tp, cp, RATES)
    assert float(forward) == pytest.approx(flops / 5e11, rel=1e-12)
    assert float(backward) == pytest.approx(2.5 * flops / 5e11, rel=1e-12)


def test_unfused_attention_by_hand():
    """--no-flash-attn: b a / t full s x s matrices (E elements). Forward: two batched GEMMs of
    2 s^2 d FLOPs a head (QK^T, PV) and the softmax's read and write of E BF16; backward: four
    GEMMs (dP, dV, dQ, dK) and the softmax backward's three passes. Each GEMM the slower of its
    FLOPs and one BF16 pass over E."""
    s, b, tp = 4096, 2, 2
    elements = b * A / tp * s * s  # 536,870,912
    gemm, one_pass = 2 * D * elements / 1e12, 2 * elements / 1e12  # 0.1374 s, 0.0011 s: compute-bound
    forward, backward = terms.unfused_attention_time(SPEC, s, b, tp, RATES)
    assert float(forward) == pytest.approx(2 * gemm + 2 * one_pass, rel=1e-12)  # 0.2770 s
    assert float(backward) == pytest.approx(4 * gemm + 3 * one_pass, rel=1e-12)  # 0.5530 s
    slow_memory = Rates(**{**{f: getattr(RATES, f) for f in Rates.__dataclass_fields__}, "hbm_bytes_per_s": 1e9})
    one_pass = 2 * elements / 1e9  # 1.0737 s: now every GEMM waits on its s x s matrix
    forward, backward = terms.unfused_attention_time(SPEC, s, b, tp, slow_memory)
    assert float(forward) == pytest.approx(4 * one_pass, rel=1e-12)
    assert float(backward) == pytest.approx(7 * one_pass, rel=1e-12)


def test_memory_bound_kernels_by_hand():
    tokens, tp = 1000, 4
    # norms 2 x (read h + write h), residuals 2 x (read 2h + write h), RoPE read+write (a + k) d, SwiGLU 3 f
    elements = 2 * 2 * H + 2 * 3 * H + 2 * (A + K) * D + 3 * F
    assert float(terms.layer_elementwise_bytes(SPEC, tokens, tp)) == 2 * elements * tokens / tp
    forward, backward = terms.embedding_time(SPEC, tokens, tp, RATES)
    assert float(forward) == pytest.approx(2 * H * tokens / tp / 1e12) and float(backward) == pytest.approx(
        2 * 2 * H * tokens / tp / 1e12)


def test_ring_reduce_scatter_and_all_gather_move_n_minus_1_over_n():
    """Patarasuk and Yuan 2009: each rank sends (n - 1)/n of the tensor; plus n - 1 latencies."""
    assert terms.ring_collective_time(8e9, 8, 1e11, RATES) == pytest.approx(7 / 8 * 8e9 / 1e11)
    assert terms.ring_collective_time(8e9, 4, 1e11, LATENT) == pytest.approx(3 / 4 * 8e9 / 1e11 + 3e-6)
    assert terms.ring_collective_time(8e9, 1, 1e11, LATENT) == 0


def test_data_parallel_collectives_by_hand():
    """Distributed optimizer: reduce-scatter FP32 gradients, all-gather BF16 parameters;
    without it one all-reduce, 2 (n - 1)/n of the FP32 gradients (twice a reduce-scatter)."""
    p, n = 1e9, 8
    reduce, gather = terms.data_parallel_time(p, n, n, RATES)
    assert float(reduce) == pytest.approx(7 / 8 * 4 * p / 1e11) and float(gather) == pytest.approx(7 / 8 * 2 * p / 1e11)
    all_reduce, none = terms.data_parallel_time(p, n, n, RATES, distributed_optimizer=False)
    assert float(all_reduce) == pytest.approx(2 * 7 / 8 * 4 * p / 1e11) and float(none) == 0
    bf16, _ = terms.data_parallel_time(p, n, n, RATES, grad_bytes=2)
    assert float(bf16) == pytest.approx(7 / 8 * 2 * p / 1e11)
    # 16 ranks over two nodes of 8: the network, 8 NICs of the node together (capped by NVLink)
    across, _ = terms.data_parallel_time(p, 16, 16, RATES, ranks_per_node=8)
    assert float(across) == pytest.approx(15 / 16 * 4 * p / min(8 * 1e10, 1e11))


def test_tensor_parallel_collectives_by_hand():
    """Sequence parallelism: 2 all-gathers and 2 reduce-scatters of the [T, h] BF16 activation
    forward, the same backward (Korthikanti et al. 2023, Section 4.2.2)."""
    tokens, tp = 8192, 4
    one = 3 / 4 * 2 * tokens * H / 1e11
    forward, backward = terms.tensor_parallel_time(SPEC, tokens, tp, RATES)
    assert float(forward) == pytest.approx(4 * one) and float(backward) == pytest.approx(4 * one)


def test_one_blocks_tensor_parallel_collectives_by_hand():
    """One block (attention or an MLP): forward its input's all-gather and its output's
    reduce-scatter, backward the output gradient's gather and the input gradient's scatter, each
    at its own bytes; the layer's two blocks are ``tensor_parallel_time``. An FP8 input gather
    (1 byte an element) beside BF16 others: a TP-4 ring sends 3/4 of T h bytes at 1e11 B/s."""
    tokens, tp = 8192, 4
    fp8_gather = terms.TpBytes(input_gather=1, output_scatter=2, grad_gather=2, dgrad_scatter=2, fp8_scatter=1)
    forward, backward = terms.tp_block_time(SPEC, tokens, tp, RATES, fp8_gather)
    assert float(forward) == pytest.approx(3 / 4 * (1 + 2) * tokens * H / 1e11)
    assert float(backward) == pytest.approx(3 / 4 * (2 + 2) * tokens * H / 1e11)
    assert terms.tensor_parallel_time(SPEC, tokens, tp, RATES, fp8_gather) == (2 * forward, 2 * backward)


def test_context_parallel_ring_by_hand():
    """c - 1 sends of this rank's K and V (2 x T/c x k d / t BF16), hidden behind the step's
    attention where it is longer; backward twice the bytes."""
    s, b, tp, cp = 8192, 1, 1, 4
    send = 2 * 2 * (b * s / cp) * K * D / tp / 1e11
    forward, backward = terms.context_parallel_time(SPEC, s, b, tp, cp, RATES, 0.0, 0.0)
    assert float(forward) == pytest.approx(3 * send) and float(backward) == pytest.approx(3 * 2 * send)
    hidden, _ = terms.context_parallel_time(SPEC, s, b, tp, cp, RATES, cp * send, 0.0)
    assert float(hidden) == 0  # the attention step is as long as the send: nothing shows
    half, _ = terms.context_parallel_time(SPEC, s, b, tp, cp, RATES, cp * send / 2, 0.0)
    assert float(half) == pytest.approx(3 * send / 2)


def test_pipeline_send_and_optimizer_by_hand():
    tokens, tp = 8192, 2
    assert float(terms.pipeline_p2p_time(SPEC, tokens, tp, False, RATES)) == pytest.approx(2 * tokens * H / tp / 1e11)
    assert float(terms.pipeline_p2p_time(SPEC, tokens, tp, True, RATES)) == pytest.approx(2 * tokens * H / tp / 1e10)
    # Adam: 38 bytes per parameter of this rank's shard, at HBM speed
    assert float(terms.optimizer_time(8e9, 8, RATES)) == pytest.approx(38 * 1e9 / 1e12)
    assert float(terms.optimizer_time(8e9, 8, RATES, distributed_optimizer=False)) == pytest.approx(38 * 8e9 / 1e12)
    # the gradient buffer zeroed, 4 bytes each: all 8e9 of the rank's parameters, or its 1e9 shard
    # where the buffer is sharded (Megatron-FSDP optim_grads, optim_grads_params)
    assert float(terms.optimizer_time(8e9, 8, RATES, zeroed_bytes=4)) == pytest.approx((38e9 + 4 * 8e9) / 1e12)
    assert float(terms.optimizer_time(8e9, 8, RATES, zeroed_bytes=4, grads_sharded=True)) == pytest.approx(
        (38e9 + 4e9) / 1e12)
    # the zeroing alone (the TimeModel's offloaded step prices it apart from Adam): 4 x 8e9 = 32e9
    # bytes over the whole buffer, 4 x 1e9 over its shard, 2 x 8e9 for a BF16 buffer, none at 0 bytes
    assert float(terms.grad_zero_time(8e9, 8, RATES, 4)) == pytest.approx(32e9 / 1e12)
    assert float(terms.grad_zero_time(8e9, 8, RATES, 4, grads_sharded=True)) == pytest.approx(4e9 / 1e12)
    assert float(terms.grad_zero_time(8e9, 8, RATES, 2)) == pytest.approx(16e9 / 1e12)
    assert float(terms.grad_zero_time(8e9, 8, RATES, 0.0)) == 0.0


def test_lm_head_by_hand():
    """The GEMM [T, h] x [h, v/t] (backward twice), the final norm (read and write h), and the
    vocab-parallel cross-entropy as megatron-core core_v0.15.2 fuses it (fusions/
    fused_cross_entropy.py, each step a torch.compile'd kernel, jit.py): forward, the FP32 copy
    of the BF16 logits (calculate_logits_max: read 2, write 4), the shift, exp and sum in place
    (calculate_predicted_logits: read 4, write 4), the softmax's division in place
    (calculate_cross_entropy_loss: read 4, write 4): 22 bytes a logit; backward, the gradient
    from the saved FP32 softmax cast to BF16 in one kernel (calculate_gradients: read 4, write
    2): 6. (Unfused, tensor_parallel/cross_entropy.py runs each op as its own kernel: more.)"""
    tokens, tp, v = 1000, 2, 128256
    gemm = 2 * tokens * H * v / tp / 1e12
    norm = 2 * 2 * H * tokens / tp / 1e12
    logits = tokens * v / tp
    forward_bytes, backward_bytes = (2 + 4) + (4 + 4) + (4 + 4), 4 + 2
    forward, backward = terms.lm_head_time(SPEC, tokens, tp, v, RATES)
    assert float(forward) == pytest.approx(gemm + norm + forward_bytes * logits / 1e12, rel=1e-12)
    assert float(backward) == pytest.approx(2 * gemm + 2 * norm + backward_bytes * logits / 1e12, rel=1e-12)


def test_links_inside_and_across_nodes():
    assert float(terms.link_bandwidth(8, RATES)) == 1e11
    assert float(terms.link_bandwidth(16, RATES, ranks_per_node=4)) == 4e10
    assert float(terms.link_bandwidth(np.array([16]), RATES, ranks_per_node=1)[0]) == 1e10


def test_unequal_stages_pace_the_pipeline_by_the_slowest():
    """1F1B with stage times t_i: T = m max t_i + (sum t_i - max t_i) / v (Narayanan et al. 2021,
    Section 2.2). With equal stages m max t_i = m sum t_i / p, so only unequal ones tell the
    slowest stage's pace from the average's (a mutant the equal-stage test let through)."""
    from advisor.hardware import get_gpu
    from advisor.throughput import Calibration, TimeModel

    model = TimeModel(SPEC, get_gpu("h100-80gb"), 8192, 1024, Calibration())
    short, long = model.stage(2, 1, 1, 4), model.stage(2, 1, 1, 12)
    t = [float(short.total), float(long.total)]
    m, p = 1024 // 8, 2
    for v in (1, 2):
        step = model.step_from_stages([short, long], 2, 1, 8, 1, vpp=v)
        pipeline = m * max(t) + (sum(t) - max(t)) / v
        assert float(step.bubble_s) == pytest.approx(pipeline - m * sum(t) / p, rel=1e-9)


def test_optimizer_bytes_per_parameter_by_hand():
    """Adam's states (seed 004, Section 3.1: FP32 master weight, momentum and variance, 4 bytes
    each) and one step's HBM traffic (Transformer Engine's FusedAdam): read the FP32 gradient 4,
    write the BF16 weight 2, the gradient norm's read 4 and the buffer's zeroing 4, and each FP32
    state read and written, 8. With BF16 moments each is read 2, unscaled into FP32 (write 4), run
    by the kernel (read 4, write 4) and copied back (read 4, write 2, copy 2 + 2): 24; an FP32
    master kept as the 16 bits its BF16 weight lacks: the int16 read and written and the weight
    read, 6."""
    from advisor.memory_levers import optimizer_state_bytes

    assert optimizer_state_bytes(("fp32", "fp32", "fp32")) == 4 + 4 + 4
    assert optimizer_state_bytes(("remainder", "bf16", "bf16")) == 2 + 2 + 2
    # an FP8 moment is TE's Float8Tensor with its Float8Quantizer's default column-wise usage: the
    # E4M3 byte and its transpose's byte (memory_levers.STATE_BYTES), as many bytes as a BF16 moment
    assert optimizer_state_bytes(("fp32", "fp8", "fp8")) == 4 + (1 + 1) + (1 + 1)
    # the gradient read (4) and read again by the norm (4), the FP32 master read (4) and the BF16
    # weight written (2) by the copy to the model, the states
    assert terms.optimizer_step_bytes() == 4 + 4 + (4 + 2) + 3 * (4 + 4)
    assert terms.optimizer_step_bytes(("fp32", "bf16", "bf16")) == 4 + 4 + 6 + 8 + 2 * (2 + 4 + 4 + 4 + 4 + 2 + 2 + 2)
    # Transformer Engine's kernel writes the weight beside the remainder: no master read (0)
    assert terms.optimizer_step_bytes(("remainder", "fp32", "fp32"), 4, 0) == 4 + 4 + 2 + (2 + 2 + 2) + 2 * 8
    # BF16 main gradients handed to Adam uncast: the step and the norm read 2 bytes each
    assert terms.optimizer_step_bytes(("fp32", "fp32", "fp32"), 2) == 2 + 2 + (4 + 2) + 3 * (4 + 4)
    # a 2-byte main weight (Megatron-FSDP's BF16 buffer) read for the copy: 2
    assert terms.optimizer_step_bytes(("fsdp_half", "fp32", "fp32"), 2, 2) == 2 + 2 + (2 + 2) + (2 + 2) + 2 * 8


def test_llama_8b_step_zeroes_the_whole_buffer_and_reads_the_master_by_hand():
    """Llama 3.1 8B at TP 1, PP 1, DP 8 on the h100-80gb preset, the distributed optimizer, FP32
    main gradients and masters (the defaults). The rank holds every parameter: 32 layers of
    4096 x (4096 + 1024 + 1024 + 4096) + 3 x 4096 x 14336 + 2 x 4096 = 218,112,000 (6,979,584,000),
    the embedding and the untied head 128,256 x 4096 = 525,336,576 each (128,256 a multiple of 128:
    no padding), the final norm 4,096: P = 8,030,261,248. Adam steps the DP 8 shard, S = P / 8 =
    1,003,782,656, at 4 (the gradient) + 4 (the norm's read) + 4 (_copy_main_params_to_model_params
    reads the FP32 master) + 2 (and writes the BF16 weight into the parameter buffer) + 3 x 8 (FP32
    master, momentum, variance) = 38 bytes: 38,143,740,928. ``zero_grad_buffer`` zeroes the whole
    FP32 buffer, 4 x P = 32,121,044,992, not 4 x S. Together 70,264,785,920 bytes at the preset's
    3.35 TB/s x 0.8 (the calibration's hbm_efficiency) = 2.68e12 B/s: 26.22 ms (14.23 ms before
    2026-11-30, 38 x S with the zeroing per shard element and no master read).
    --grad-reduce-in-bf16: Adam reads the FP32 copy ``.float()`` makes (2 + 4 = 6 more a shard
    element): 44 x S = 44,166,436,864, and a BF16 buffer zeroed, 2 x P = 16,060,522,496:
    60,226,959,360 bytes, 22.47 ms. The precision-aware optimizer (Transformer Engine's FusedAdam
    holds the master as the remainder and its kernel writes the weight: no master read): 4 + 4 + 2 +
    (2 + 2 + 2) + 16 = 32 x S = 32,121,044,992, plus 4 x P: 64,242,089,984 bytes, 23.97 ms."""
    from advisor.hardware import get_gpu
    from advisor.options import TrainingOptions
    from advisor.throughput import TimeModel, load_calibration

    h100 = get_gpu("h100-80gb")
    assert h100.hbm_bytes_per_s == 3.35e12 and load_calibration().hbm_efficiency == 0.8
    parameters = 32 * (4096 * (4096 + 1024 + 1024 + 4096) + 3 * 4096 * 14336 + 2 * 4096) + 2 * 128256 * 4096 + 4096
    assert parameters == 8_030_261_248 and parameters // 8 == 1_003_782_656

    def optimizer_s(**changes) -> float:
        options = TrainingOptions().with_(**changes).time_options()
        return float(TimeModel(preset("llama3.1-8b"), h100, 8192, 64, options=options).step(1, 1, 1, 8, 1).optimizer_s)

    assert optimizer_s() == pytest.approx(70_264_785_920 / 2.68e12, rel=1e-9)
    assert optimizer_s() == pytest.approx(0.02622, abs=5e-6)
    assert optimizer_s(grad_reduce_dtype="bf16") == pytest.approx(60_226_959_360 / 2.68e12, rel=1e-9)
    assert optimizer_s(precision_aware_optimizer=True) == pytest.approx(64_242_089_984 / 2.68e12, rel=1e-9)


def test_mixtral_step_zeroes_the_whole_buffer_and_shards_adam_only_when_distributed_by_hand(advisor):
    """Mixtral 8x7B on 8 H100s, TP 1, PP 1, EP 8 (DP 8; the expert-data-parallel group 8 / 8 = 1),
    the distributed optimizer, FP32 main gradients and masters. A rank's dense parameters: 32 layers
    of attention 4096 x (4096 + 1024 + 1024 + 4096) = 41,943,040, two norms 8,192 and the router
    4096 x 8 = 32,768 (41,984,000; 1,343,488,000), the embedding and the untied head 32,000 x 4096
    = 131,072,000 each, the final norm 4,096: D = 1,605,636,096. Its experts: one of the 8 a layer,
    3 x 4096 x 14336 = 176,160,768, x 32: E = 5,637,144,576. Adam steps the dense shard D / 8 and
    the experts' E / 1 at 38 bytes (as the 8B test's: 4 + 4 + 4 + 2 + 24), and
    ``zero_grad_buffer`` zeroes the whole FP32 buffer, 4 x (D + E):
    38 x 5,837,849,088 + 4 x 7,242,780,672 = 221,838,265,344 + 28,971,122,688 = 250,809,388,032
    bytes at 2.68e12 B/s, 93.59 ms. Without --use-distributed-optimizer Adam steps all of D:
    38 x 7,242,780,672 + 28,971,122,688 = 304,196,788,224 bytes, 113.51 ms (the MoE model priced the
    dense part at D / 8 and no zeroing whatever the flag, 2026-11-30, 82.78 ms)."""
    dense = 32 * (4096 * (4096 + 1024 + 1024 + 4096) + 2 * 4096 + 4096 * 8) + 2 * 32000 * 4096 + 4096
    experts = 32 * 3 * 4096 * 14336
    assert (dense, experts) == (1_605_636_096, 5_637_144_576)
    common = ("estimate", "--model", "mixtral-8x7b", "--gpus", 8, "--ep", 8, "--gpu", "h100-80gb")
    distributed = advisor.json(*common)["time_parts"]["optimizer_s"]
    assert distributed == pytest.approx((38 * (dense / 8 + experts) + 4 * (dense + experts)) / 2.68e12, rel=1e-9)
    assert distributed == pytest.approx(250_809_388_032 / 2.68e12, rel=1e-9) and distributed == pytest.approx(
        0.09359, abs=5e-6)
    whole = advisor.json(*common, "--no-distributed-optimizer")["time_parts"]["optimizer_s"]
    assert whole == pytest.approx(304_196_788_224 / 2.68e12, rel=1e-9)


def test_a_data_parallel_groups_gpus_in_a_node_by_hand():
    """megatron-core's RankGenerator (order tp-cp-ep-dp-pp) puts a DP group's ranks TP apart and an
    expert-data-parallel group's ETP x EP apart: on nodes of 8, TP 1 has 8 of a DP 16 group in a
    node, TP 8 one; EP 2 at ETP 1 has 4 of an expert group of 32, EP 8 one; never more than the
    group (DP 2 at TP 1: 2), never fewer than one (EP 64)."""
    from advisor.throughput.terms import ranks_per_node

    assert [float(ranks_per_node(16, 1, 8)), float(ranks_per_node(16, 8, 8))] == [8.0, 1.0]
    assert [float(ranks_per_node(32, 2 * 1, 8)), float(ranks_per_node(32, 8, 8))] == [4.0, 1.0]
    assert [float(ranks_per_node(2, 1, 8)), float(ranks_per_node(2, 64, 8))] == [2.0, 1.0]
