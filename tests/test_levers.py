"""The training levers' memory and time terms against hand-derived values (issue 21).

Llama 3.1 8B numbers used below: h 4096, a 32, k 8, d 128, h_ffn 14336, v 128256. One layer's
GEMM weights at TP 1: h(a + 2k)d + a d h + 3 h h_ffn = 25,165,824 + 16,777,216 + 176,160,768
= 218,103,808; with its two RMSNorms (2h) 218,112,000 (Eq. 6)."""

from dataclasses import replace

import numpy as np
import pytest

from advisor import memory_levers as levers
from advisor.hardware import get_gpu
from advisor.memory import estimate_memory
from advisor.models import PRESETS
from advisor.options import TrainingOptions
from advisor.parallel import ParallelConfig, Workload
from advisor.throughput import TimeModel, load_calibration
from advisor.throughput import levers as time_levers
from advisor.throughput.terms import Rates

SPEC = PRESETS["llama3.1-8b"]
H100 = get_gpu("h100-80gb")


def memory(**changes):
    return TrainingOptions().with_(**changes).memory_options()


def test_sharded_states_per_parameter():
    # optim_grads over 8 ranks: BF16 weights whole, FP32 gradients / 8, 12 optimizer bytes / 8
    assert [float(x) for x in levers.state_bytes_per_parameter(memory(fsdp_strategy="optim_grads"), 8)] == [2, 0.5, 1.5]
    assert [float(x) for x in levers.state_bytes_per_parameter(memory(fsdp_strategy="optim_grads_params"), 8)] \
        == [0.25, 0.5, 1.5]
    assert [float(x) for x in levers.state_bytes_per_parameter(memory(fsdp_strategy="no_shard"), 8)] == [2, 4, 12]
    # half the (sharded) optimizer on the host: 12 / 8 / 2
    offloaded = memory(optimizer_cpu_offload=True, optimizer_offload_fraction=0.5)
    assert float(levers.state_bytes_per_parameter(offloaded, 8)[2]) == 0.75


def test_fsdp_buffers():
    # units of 1e8 elements, 8 layers: gathered = the unit + min(5e8 prefetch, 7e8) = 6e8 elements in BF16;
    # queued gradients = min(8e8, (floor(1e9 / 1e8) + 2) 1e8) = 8e8 elements in FP32
    gathered, queued = levers.fsdp_buffer_bytes(memory(fsdp_strategy="optim_grads_params"), 1e8, 8)
    assert (float(gathered), float(queued)) == (1.2e9, 3.2e9)
    # optim_grads_params, 30 layers: one bucket per unit; the queue trimmed to 10 whole units (1e9, not
    # more than it), the unit just reduced appended, the next being filled: 12 units, 1.2e9 elements in FP32
    gathered, queued = levers.fsdp_buffer_bytes(memory(fsdp_strategy="optim_grads_params"), 1e8, 30)
    assert (float(gathered), float(queued)) == (1.2e9, 4 * 1.2e9)
    # units of 3e8: floor(1e9 / 3e8) = 3 kept (9e8), plus two: 5 units, 1.5e9 (not 1e9 + 3e8)
    assert float(levers.fsdp_queued_units(3e8)) == 5.0
    assert float(levers.fsdp_buffer_bytes(memory(fsdp_strategy="optim_grads_params"), 3e8, 30)[1]) == 4 * 1.5e9
    # optim_grads: buckets of a few weights each (no FSDP units), the queue + about two of them, 1e9 + 1e8
    gathered, queued = levers.fsdp_buffer_bytes(memory(fsdp_strategy="optim_grads"), 1e8, 30)
    assert (float(gathered), float(queued)) == (0.0, 4 * 1.1e9)


def test_fp8_weight_copies_and_saved_activations():
    options = memory(fp8_format="hybrid")
    # two cached FP8 copies (row-wise and its transpose) of 218,103,808 GEMM weights, plus delayed scaling's
    # amax history: 4 GEMMs x (3 forward + 2 backward) tensors x (history 1 + scale 1) FP32 values
    assert levers.fp8_weight_bytes_per_layer(SPEC, 1, options) == 2 * 218_103_808 + 20 * 2 * 4
    # --fp8-param-gather drops the BF16 copy of those weights: 2 - 2 bytes, the amax history stays
    gather = memory(fp8_format="hybrid", fp8_param_gather=True)
    assert levers.fp8_weight_bytes_per_layer(SPEC, 1, gather) == 160
    history = memory(fp8_format="hybrid", fp8_amax_history_len=1024)
    assert levers.fp8_weight_bytes_per_layer(SPEC, 1, history) == 2 * 218_103_808 + 20 * 1025 * 4
    split, whole = levers.fp8_activation_saving(SPEC, 8192, 1, options)
    # one byte less per element of the SwiGLU output (14336) and of the QKV and FC1 inputs (2h); one byte
    # more per element of the attention output (a d = 4096): attention keeps its BF16 copy beside the FP8 one
    assert (float(split), float(whole)) == (8192 * (14336 - 4096), 8192 * 2 * 4096)
    mx_split, mx_whole = levers.fp8_activation_saving(SPEC, 8192, 1, memory(fp8_format="e4m3", fp8_recipe="mxfp8"))
    # MXFP8: each FP8 element carries 1/32 byte of scale
    assert (float(mx_split), float(mx_whole)) == (8192 * (14336 * 31 / 32 - 4096 * 33 / 32), 8192 * 2 * 4096 * 31 / 32)


def test_estimate_with_zero2_sharding():
    """Llama 3.1 8B, TP 1, PP 1, DP 8 with optim_grads: gradients are 4/8 bytes per parameter plus
    the unsharded buckets at the queue's peak in FP32 (memory_levers.fsdp_optim_grads_peak, over
    the embedding, the layers, the final norm and the output layer: memory_levers.stage_ends).

    Buckets of >= 40,000,000 elements (max(40M, 1M x 8)) cut in named order, three a layer:
    P = input norm + proj + QKV = 4,096 + 16,777,216 + 25,165,824 = 41,947,136, M = MLP norm + FC1 =
    117,444,608, F = FC2 = 58,720,256 (P + M + F = L = 218,112,000). Backward completes F, M, P in
    turn, each before the next is allocated. The queue (trimmed to <= 1e9 before each append) grows
    by L a layer to 4L = 872,448,000 after layers 31-28; layer 27 appends F and M (1,048,612,864),
    its P's completion pops F_31 (989,892,608) and appends P: 1,031,839,744; layer 26's F pops M_31
    (973,115,392 after the append), M brings it to 1,090,560,000 = 5L with no pop, and proj_26
    allocates P_26: 5L + P = 1,132,507,136, the layers' peak (P's completion pops P_31 and F_30 back
    to 1,031,839,744, and each later layer repeats it). The ends: the embedding (525,336,576, first
    in named order) is a bucket alone (>= 4e7); FC2_31 + the final norm (58,724,352) closes at the
    norm, and the output layer (525,336,576) is one more. The output layer's bucket is queued first
    and popped at M_29's completion (1,137,729,536 held just before: above 5L + P); after layer 0's
    P completes the queue holds 1,031,839,744, and the embedding's gradient, last, opens its bucket
    on it: 1,031,839,744 + 525,336,576 = 1,557,176,320, the peak. Before: 1e9 + L = 1,218,112,000,
    then 5L + P over the layers alone."""
    layer = 218_112_000
    embedding = 4096 * 128256
    parameters = 32 * layer + 2 * embedding + 4096  # layers, embedding and head, final norm
    queued = 4 * (4 * layer + 117_444_608 + 41_947_136 + embedding)
    result = estimate_memory(SPEC, ParallelConfig(tp=1, cp=1, pp=1, dp=8, mbs=1), Workload(),
                             memory(fsdp_strategy="optim_grads"))
    assert result.peak.gradients_bytes == parameters * 0.5 + queued
    assert result.peak.optimizer_bytes == parameters * 1.5
    assert result.peak.weights_bytes == parameters * 2


def _rates_without_latency():
    return replace(Rates.of(H100, load_calibration()), collective_latency_s=0.0)


def test_fsdp_collectives_per_microbatch():
    # 1e9 parameters over 8 ranks at 1e11 B/s: reduce-scatter 7/8 x 4e9 / 1e11 = 0.035 s,
    # all-gather 7/8 x 2e9 / 1e11 = 0.0175 s
    rates = _rates_without_latency()
    forward, backward = time_levers.fsdp_microbatch_time(1e9, 8, 1e11, rates, "optim_grads_params")
    assert (float(forward), float(backward)) == pytest.approx((0.0175, 0.0525), rel=1e-12)
    forward, backward = time_levers.fsdp_microbatch_time(1e9, 8, 1e11, rates, "optim_grads")
    assert (float(forward), float(backward)) == pytest.approx((0.0, 0.035), rel=1e-12)


def test_offload_time():
    # 1e9 parameters: 4 + 2 bytes each over a 63 GB/s link, 30 bytes each at 76.8 GB/s of host memory
    seconds = time_levers.offload_time(1e9, 1.0, 4, 63e9, 76.8e9)
    assert float(seconds) == pytest.approx(6e9 / 63e9 + 30e9 / 76.8e9, rel=1e-12)
    assert time_levers.host_link(H100) == (63e9, 76.8e9)


def test_half_offloaded_adam_runs_the_other_half_on_the_gpu_by_hand():
    """--optimizer-cpu-offload --optimizer-offload-fraction 0.5 (Megatron's HybridDeviceOptimizer,
    megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py): half of the rank's shard steps on
    the host (``offload_time``: 4 + 2 bytes a parameter over the 63 GB/s link, 30 at 76.8 GB/s of
    host memory), the other half on the GPU at Adam's 38 HBM bytes a parameter
    (terms.optimizer_step_bytes). The FP32 main-gradient buffer stays on the GPU and is zeroed
    whole, 4 bytes each of the rank's P (``zero_grad_buffer``, terms.optimizer_time). Llama 3.1 8B
    at TP 8, PP 1, DP 8: P = 1,004,015,616 (see test_gradient_dtype_drives_the_step_time), a shard
    of P / 8 = 125,501,952."""
    shard = 1_004_015_616 / 8
    half = memory(optimizer_cpu_offload=True, optimizer_offload_fraction=0.5)
    assert float(levers.state_bytes_per_parameter(half, 8)[2]) == 0.75
    rates = Rates.of(H100, load_calibration())
    gpu = 38 * 0.5 * shard / rates.hbm_bytes_per_s
    host = 0.5 * shard * (4 + 2) / 63e9 + 0.5 * shard * 30 / 76.8e9
    zeroed = 4 * 1_004_015_616 / rates.hbm_bytes_per_s
    assert float(time_levers.gpu_optimizer_time(shard, 0.5, rates)) == pytest.approx(gpu, rel=1e-12)
    options = TrainingOptions().with_(optimizer_cpu_offload=True, optimizer_offload_fraction=0.5).time_options()
    step = TimeModel(SPEC, H100, 8192, 64, options=options).step(8, 1, 1, 8, 1)
    assert float(step.optimizer_s) == pytest.approx(gpu + host + zeroed, rel=1e-9)


def test_fp8_gemm_rate_and_casts():
    rates = Rates.of(H100, load_calibration())
    assert time_levers.fp8_rates(rates, H100).gemm_flops_per_s == pytest.approx(rates.gemm_flops_per_s * 1979 / 989)
    # delayed scaling on Hopper: an operand read (2), written in FP8 (1) and transposed (1), 4 bytes;
    # QKV's and FC1's inputs written in FP8 by their norm (1 byte less than BF16) and transposed
    # (read and write 1 each), +1. Inputs h + h normed, a d + h_ffn not; output gradients
    # (a + 2k) d + h + 2 h_ffn + h
    casts = time_levers.fp8_casts("delayed", H100.architecture)
    forward, backward, transposes = time_levers.fp8_cast_bytes(SPEC, 8192, 1, casts)
    assert (float(forward), float(backward), float(transposes)) == (8192 * (1 * 8192 + 4 * 18432), 4 * 8192 * 43008, 0)
    # the same bytes by part (h 4096, a d 4096, (a + 2k) d 6144, h_ffn 14336): attention h normed + a d,
    # gradients (a + 2k) d + h; the MLP h normed + h_ffn, gradients 2 h_ffn + h; an MoE layer's MLP (its
    # norm a module of its own) reads h at 4 bytes, not 1
    attention = time_levers.fp8_attention_cast_bytes(SPEC, 8192, 1, casts)
    mlp = time_levers.fp8_mlp_cast_bytes(4096, 14336, 8192, 1, casts)
    assert attention == (8192 * (1 * 4096 + 4 * 4096), 4 * 8192 * (6144 + 4096), 0)
    assert mlp == (8192 * (1 * 4096 + 4 * 14336), 4 * 8192 * (2 * 14336 + 4096), 0)
    assert time_levers.fp8_mlp_cast_bytes(4096, 14336, 8192, 1, casts, normed=False)[0] == 8192 * 4 * (4096 + 14336)
    fp8 = time_levers.fp8_gemms(rates, H100, "delayed")
    assert (fp8.rates, fp8.casts) == (time_levers.fp8_rates(rates, H100), casts)


def test_fp8_cast_bytes_per_element_by_recipe_and_gpu():
    """Transformer Engine 2.8's HBM traffic per element quantised (levers.fp8_casts), by hand:
    read BF16 2, write FP8 1, on Hopper its transpose 1 more (no non-TN FP8 GEMM before compute
    capability 10.0); current scaling first reads the whole tensor for its amax, 2 more, but
    after a norm the norm finds it; blockwise and MXFP8 write both directions with their scales
    (FP32 per 128 elements, or a byte per 32) whatever the GPU; delayed scaling's norm writes
    FP8 itself, 1 byte under its BF16 output, and Hopper transposes it (read and write 1).
    Sequence-parallel gathered operands (TE 2.9): the per-tensor recipes cast row-wise only (no
    transposed write, no norm transpose) and, on Hopper, transpose the gathered tensor (read 1,
    write 1); blockwise casts both directions and transposes the gathered column-wise copy (read
    1, write 1) on any GPU; MXFP8 gathers both, no transpose."""
    expected = {("delayed", "hopper"): (4, 1, 3, -1, 2), ("delayed", "blackwell"): (3, -1, 3, -1, 0),
                ("tensorwise", "hopper"): (6, 4, 5, 3, 2), ("tensorwise", "blackwell"): (5, 3, 5, 3, 0),
                ("blockwise", "hopper"): (4 + 8 / 128,) * 4 + (2,),
                ("mxfp8", "blackwell"): (4 + 2 / 32,) * 4 + (0,)}
    for (recipe, architecture), values in expected.items():
        assert time_levers.fp8_casts(recipe, architecture) == time_levers.Fp8Casts(*values), recipe


def test_fp8_casts_of_gathered_operands_at_tp_8():
    """Llama 3.1 70B (h 8192, a 64, k 8, d 128, h_ffn 28672), 8192 tokens, TP 8 on H100, by hand.
    Gathered: QKV's and FC1's inputs (h, normed) forward, the projection's and FC2's output
    gradients (h) backward, each cast on its 1024-token shard, and each transposed whole (8192
    tokens x h, 2 bytes) in the backward. Delayed: the normed inputs -1 (the norm's FP8 write, no
    transpose), the gradients 3; the rest (a d, h_ffn forward; (a + 2k) d, 2 h_ffn backward) 4
    over t. Tensorwise: normed 3, gradients 5, the rest 6."""
    spec = PRESETS["llama3.1-70b"]
    h, tokens, shard = 8192, 8192, 1024
    transposes = 4 * 2 * tokens * h
    for recipe, normed, gathered, rest in (("delayed", -1, 3, 4), ("tensorwise", 3, 5, 6)):
        casts = time_levers.fp8_casts(recipe, "hopper")
        forward, backward, moved = time_levers.fp8_cast_bytes(spec, tokens, 8, casts)
        assert float(forward) == shard * (2 * normed * h + rest * (64 * 128 + 28672)), recipe
        assert float(backward) == shard * (2 * gathered * h + rest * ((64 + 16) * 128 + 2 * 28672)) + transposes
        assert float(moved) == transposes
    # TP 1: nothing gathered, the local casts with their transposed write, as before
    casts = time_levers.fp8_casts("delayed", "hopper")
    forward, backward, moved = time_levers.fp8_cast_bytes(spec, tokens, 1, casts)
    assert (float(forward), float(backward), float(moved)) == (
        tokens * (2 * 1 * h + 4 * (64 * 128 + 28672)), 4 * tokens * (2 * h + (64 + 16) * 128 + 2 * 28672), 0)
    # MXFP8 on Blackwell: no transpose anywhere, the same bytes gathered or not
    mx = time_levers.fp8_casts("mxfp8", "blackwell")
    assert float(time_levers.fp8_cast_bytes(spec, tokens, 8, mx).transposes) == 0
    assert time_levers.fp8_cast_bytes(spec, tokens, 8, mx).forward == pytest.approx(
        shard * (4 + 2 / 32) * (2 * h + 64 * 128 + 28672))


def test_gradient_dtype_drives_the_step_time():
    """With overlap off the whole DP reduction shows: BF16 gradients move 2 bytes fewer per
    parameter, (n - 1)/n x 2P over the bandwidth (the latencies cancel). Llama 3.1 8B at TP 8,
    PP 1, DP 8: P = 32 x (218,103,808 / 8 + 2 x 4096) + 2 x 4096 x 128,256 / 8 + 4096 (the final
    norm, whole on each TP rank) = 1,004,015,616 (the advisor launches --make-vocab-size-divisible-by
    1, and 128,256 rows divide by TP 8); the group spans 64 GPUs, so the network, one NIC per rank
    group (8 / TP = 1 per node)."""
    off = dict(overlap_grad_reduce=False, overlap_param_gather=False)
    steps = {dtype: TimeModel(SPEC, H100, 8192, 64, options=TrainingOptions().with_(
        grad_reduce_dtype=dtype, **off).time_options()).step(8, 1, 1, 8, 1) for dtype in ("fp32", "bf16")}
    parameters = 32 * (218_103_808 / 8 + 2 * 4096) + 2 * 4096 * 128256 / 8 + 4096
    assert parameters == 1_004_015_616
    bandwidth = load_calibration().network_efficiency * H100.network_bytes_per_s
    expected = 7 / 8 * 2 * parameters / bandwidth
    assert float(steps["fp32"].dp_comm_s - steps["bf16"].dp_comm_s) == pytest.approx(expected, rel=1e-9)


def test_at_pp_2_the_dp_collectives_and_adam_move_the_heaviest_stages_parameters():
    """The same Llama 3.1 8B at TP 8, PP 2, DP 8: each stage holds 16 layers and one end (seed 004,
    Eq. 6-9); the last stage's LM head (untied, h x v / t) and final norm (h, whole on each TP
    rank) make it the heavier end, by the first's embedding's h x v / t plus h. P = 16 x
    (218,103,808 / 8 + 2 x 4096) + 4096 x 128,256 / 8 + 4096 = 436,338,688 + 65,667,072 + 4096 =
    502,009,856 (the PP 1 count less 16 layers and one embedding). The DP group is the same 64
    GPUs apart over the network, so the FP32-BF16 gap is 7/8 x 2P over it, and Adam's step moves
    38 bytes (terms.optimizer_step_bytes) of each of this rank's P / 8 parameters at the HBM rate,
    beside the FP32 gradient buffer's zeroing, 4 bytes of each of its P.
    A mutant counting both ends on every stage (P + 65,667,072, 13% more) fails both."""
    parameters = 16 * (218_103_808 / 8 + 2 * 4096) + 4096 * 128256 / 8 + 4096
    assert parameters == 502_009_856
    _assert_dp_gap_and_adam(SPEC, (8, 1, 2, 8, 1), parameters, H100.network_bytes_per_s)


def _assert_dp_gap_and_adam(spec, layout, parameters, link_bytes_per_s):
    """With the DP overlap off: the FP32-BF16 gradient reduction gap is 7/8 x 2P over the link at
    the fitted NCCL efficiency, and Adam's step moves 38 bytes of each of this rank's P / 8, and
    the zeroing of the whole FP32 gradient buffer 4 of each of its P (``zero_grad_buffer``)."""
    off = dict(overlap_grad_reduce=False, overlap_param_gather=False)
    steps = {dtype: TimeModel(spec, H100, 8192, 64, options=TrainingOptions().with_(
        grad_reduce_dtype=dtype, **off).time_options()).step(*layout) for dtype in ("fp32", "bf16")}
    calibration = load_calibration()
    expected = 7 / 8 * 2 * parameters / (calibration.network_efficiency * link_bytes_per_s)
    assert float(steps["fp32"].dp_comm_s - steps["bf16"].dp_comm_s) == pytest.approx(expected, rel=1e-9)
    hbm = calibration.hbm_efficiency * H100.hbm_bytes_per_s
    assert float(steps["fp32"].optimizer_s) == pytest.approx((38 * parameters / 8 + 4 * parameters) / hbm, rel=1e-9)


def test_a_tied_model_at_pp_1_reduces_and_steps_one_embedding_matrix():
    """Llama 3.2 1B ties its embedding and LM head: at PP 1 the output layer has no weight of its
    own (megatron-core core_v0.15.2 models/gpt/gpt_model.py: ColumnParallelLinear(...,
    skip_weight_param_allocation=self.pre_process and self.share_embeddings_and_output_weights)),
    so the DP collectives and Adam move one v x h matrix, not two. By hand (h 2048, a 32, k 8,
    d 64, h_ffn 8192, L 16, v 128,256, already a multiple of 128): a layer is 2048 x 48 x 64 +
    2048 x 2048 + 3 x 2048 x 8192 + 2 x 2048 = 60,821,504; 16 layers 973,144,064; the embedding
    128,256 x 2048 = 262,668,288; the final norm 2048: P = 1,235,814,400 (the model card's 1.24B).
    TP 1, DP 8 within a node: the FP32-BF16 gap is 7/8 x 2P over NVLink; Adam 38 P / 8 bytes, the
    gradient buffer's zeroing 4 P."""
    spec = PRESETS["llama3.2-1b"]
    assert spec.tie_embeddings
    layer = 2048 * 48 * 64 + 2048 * 2048 + 3 * 2048 * 8192 + 2 * 2048
    parameters = 16 * layer + 128256 * 2048 + 2048
    assert parameters == 1_235_814_400
    _assert_dp_gap_and_adam(spec, (1, 1, 1, 8, 1), parameters, H100.nvlink_bytes_per_s)


def test_overlap_off_exposes_the_whole_reduction():
    on = TimeModel(SPEC, H100, 8192, 64, options=TrainingOptions().time_options()).step(8, 1, 1, 8, 1)
    off_options = TrainingOptions().with_(overlap_grad_reduce=False, overlap_param_gather=False).time_options()
    off = TimeModel(SPEC, H100, 8192, 64, options=off_options).step(8, 1, 1, 8, 1)
    assert float(off.dp_comm_s) > float(on.dp_comm_s)
    assert np.all(off.total_s - on.total_s == pytest.approx(off.dp_comm_s - on.dp_comm_s))


def test_the_dense_layer_prices_the_gathered_casts_where_they_run():
    """Llama 3.1 70B, one 8192-token microbatch at TP 8 on H100, delayed scaling, against the same
    layer priced the old way (every operand cast on its shard with its transposed write, 4 bytes,
    1 after a norm; no transpose after the gather). Forward: QKV's and FC1's inputs (1,024 x 8,192
    each) at -1 instead of 1, 2 bytes less an element; backward: the two gathered gradients at 3
    instead of 4, plus four transposes of the whole gathered 8,192 x 8,192, 2 bytes an element."""
    spec = PRESETS["llama3.1-70b"]
    options = TrainingOptions().with_(fp8_format="hybrid").time_options()
    model = TimeModel(spec, H100, 8192, 64, options=options)
    new = model.layer(8, 1, 1)
    model.fp8 = replace(model.fp8, casts=time_levers.Fp8Casts(4, 1, 4, 1, 0))
    old = model.layer(8, 1, 1)
    hbm = model.rates.hbm_bytes_per_s
    shard = 1024 * 8192
    assert float(new[0] - old[0]) == pytest.approx(-2 * 2 * shard / hbm, rel=1e-9)
    assert float(new[1] - old[1]) == pytest.approx((-2 * shard + 4 * 2 * 8192 * 8192) / hbm, rel=1e-9)
