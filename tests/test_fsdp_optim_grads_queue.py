"""Megatron-FSDP's optim_grads gradient buckets and reduce-scatter queue, by hand from the real
source, against ``memory_levers.fsdp_buffer_bytes`` (which prices the queued gradients as
queue + u: ``fsdp_queued_elements``).

How the buckets are made (core_v0.15.2 megatron_fsdp/param_and_grad_buffer.py:1300-1384,
core_v0.19.0 :1786-1866, ``_get_parameter_groups``): under optim_grads the adapter passes no FSDP
unit modules (mcore_fsdp_adapter.py:93-96 / :161-164), so every parameter has fsdp_unit_id None and
all BF16 weights of the chunk form ONE parameter group in ``named_parameters`` order (Step 1); Step 2
cuts it into buckets, each closed at the parameter that brings it to >= ``suggested_bucket_size``
= ddp_config.bucket_size = max(40M, 1M x DP x CP) with --overlap-grad-reduce (training.py:984-990 /
:1552-1567). Buckets are not per layer: with B > u a bucket spans several layers.

What is held (param_and_grad_buffer.py, core_v0.19.0): a bucket's whole unsharded storage is
allocated when its first gradient arrives (``main_grad_getter`` -> ``fetch_bucket`` ->
``allocate_bucket_storage``, :3086-3104, :1291-1411); when its last one arrives,
``reduce_gradients`` (:3872-3914) first pops the oldest queued buckets while the queue holds more
than Q elements (``wait_for_previous_grad_reduce``, :3916-3946) and frees them, then appends it
(:4246). So at a peak: the queue trimmed to <= Q, the bucket just queued, and the one being filled,
each a whole BUCKET (about B), not a layer.

Llama 3.1 8B middle stage of 32 layers at TP 1 (u = 218,112,000; per layer, in named order:
input norm 4,096, proj 16,777,216, QKV 25,165,824, MLP norm 4,096, FC1 117,440,512,
FC2 58,720,256), DP 2048: B = 2,048,000,000.
- bucket 0: layers 0-8 (9 u = 1,963,008,000) + layer 9's norm, proj, QKV, norm (41,951,232) =
  2,004,959,232 < B, + FC1_9 -> 2,122,399,744, closed.
- bucket 1: FC2_9 58,720,256 + layers 10-18 (1,963,008,000) + norm_19 + proj_19 = 2,038,509,568 < B,
  + QKV_19 -> 2,063,675,392, closed.
- bucket 2: MLP norm_19 + FC1_19 + FC2_19 (176,164,864) + layers 20-27 (1,744,896,000) + layer 28's
  norm, proj, QKV (41,947,136) = 1,963,008,000 < B, + norm + FC1_28 -> 2,080,452,608, closed.
- bucket 3: FC2_28 + layers 29-31 = 58,720,256 + 654,336,000 = 713,056,256.
Backward fills bucket 3, then 2; bucket 2 completes at MLP norm_19: the queue holds bucket 3
(713,056,256 <= Q on both releases: 1e9 on core_v0.15.2, 2,048,000,000 on core_v0.19.0), kept;
bucket 2 is appended; proj_19's gradient then allocates bucket 1:
713,056,256 + 2,080,452,608 + 2,063,675,392 = 4,857,184,256 elements unsharded at once (the real
buckets are padded a little more: 4,991,221,760 from megatron-core's own ``_get_parameter_groups``
on fake tensors). The advisor priced Q + u: 1,218,112,000 (core_v0.15.2) or 2,266,112,000
(core_v0.19.0); it now replays the cut and the queue (``memory_levers.fsdp_optim_grads_peak``)."""

import numpy as np
import pytest

from advisor import memory_levers as levers
from advisor.memory import MemoryOptions
from advisor.models import preset

WEIGHTS_8B = levers.layer_weights(preset("llama3.1-8b"), 1)

U_8B = 218_112_000
B_2048 = 2_048_000_000
BUCKETS = (2_122_399_744, 2_063_675_392, 2_080_452_608, 713_056_256)  # named order, by hand above
PEAK = BUCKETS[3] + BUCKETS[2] + BUCKETS[1]


def test_hand_buckets_add_up_to_the_stage():
    assert sum(BUCKETS) == 32 * U_8B == 6_979_584_000
    assert all(b >= B_2048 for b in BUCKETS[:3]) and PEAK == 4_857_184_256


def test_layer_weights_in_named_order():
    # Llama 3.1 8B, h 4096, 32 heads of 128, 8 groups, h_ffn 14336, TP 1 (module doc)
    assert WEIGHTS_8B == (4_096, 16_777_216, 25_165_824, 4_096, 117_440_512, 58_720_256)
    assert sum(WEIGHTS_8B) == U_8B


@pytest.mark.parametrize("from_units", [False, True], ids=["core_v0.15.2", "core_v0.19.0"])
def test_optim_grads_queue_at_dp_2048_covers_three_buckets(from_units):
    options = MemoryOptions(fsdp_strategy="optim_grads", fsdp_budget_from_units=from_units)
    _, gradients = levers.fsdp_buffer_bytes(options, U_8B, 32, 2048, WEIGHTS_8B)
    assert float(gradients) == 4 * PEAK  # FP32 main gradients, 4 bytes an element


# DP 64: B = 64,000,000 < FC1. Cut in named order: layer 0's norm, proj, QKV, norm, FC1 = 159,391,744;
# then per layer i >= 1 C = FC2_{i-1} + norm_i + proj_i = 75,501,568 and A = QKV_i + norm_i + FC1_i =
# 142,610,432 (A + C = u); last, FC2_31 alone: d = 58,720,256. Backward (FC2, FC1, norm, proj, QKV,
# norm): FC2_31 completes d at once; FC1_i allocates A_i, proj_i allocates C_i (the cut falls between
# proj and QKV, produced in the other order), QKV_i completes A_i, FC2_{i-1} completes C_i. The queue
# grows d, A, C, ... to d + 4u = 931,168,256 <= 1e9 after layers 31-28; layer 27's QKV appends A_27
# (1,073,778,688); FC2_26 completing C_27 trims d and A_31 (to 872,448,000 = 4u) and appends C_27:
# 947,949,568; FC1_26 allocates A_26 and proj_26 C_26: 947,949,568 + 142,610,432 + 75,501,568 =
# 1,166,061,568 = 5u + C, the peak (each later layer repeats it). Q + u priced 1,218,112,000 before.
PEAK_64 = 5 * U_8B + 75_501_568


@pytest.mark.parametrize("from_units", [False, True], ids=["core_v0.15.2", "core_v0.19.0"])
def test_optim_grads_queue_at_dp_64_near_queue_plus_a_layer(from_units):
    options = MemoryOptions(fsdp_strategy="optim_grads", fsdp_budget_from_units=from_units)
    _, gradients = levers.fsdp_buffer_bytes(options, U_8B, 32, 64, WEIGHTS_8B)
    assert float(gradients) == 4 * PEAK_64 == 4 * 1_166_061_568


def test_without_overlap_grad_reduce_the_stage_is_one_bucket():
    # bucket size None (training.py): the 32 layers' 6,979,584,000 gradients in one bucket, all unsharded
    options = MemoryOptions(fsdp_strategy="optim_grads", overlap_grad_reduce=False)
    _, gradients = levers.fsdp_buffer_bytes(options, U_8B, 32, 64, WEIGHTS_8B)
    assert float(gradients) == 4 * 32 * U_8B
    assert levers.fsdp_buffer_lines(options, U_8B, 64, WEIGHTS_8B) == [(4 * U_8B, 0.0)]  # n u alone


def test_replay_broadcasts_over_layer_counts_and_dp():
    layers, dp = np.array([[32], [0]]), np.array([64, 2048])
    peaks = levers.fsdp_optim_grads_peak(WEIGHTS_8B, layers, levers.ddp_bucket_size(dp), 1e9)
    assert peaks.tolist() == [[PEAK_64, PEAK], [0.0, 0.0]]


@pytest.mark.parametrize("dp", [8, 64, 128, 512, 1024, 2048, 4096])
@pytest.mark.parametrize("from_units", [False, True])
def test_lines_bound_the_replay(dp, from_units):
    """The split search's lines (min(n u, Q + 3 b), b = B + FC1) never undercut the replay."""
    options = MemoryOptions(fsdp_strategy="optim_grads", fsdp_budget_from_units=from_units)
    lines = levers.fsdp_buffer_lines(options, U_8B, dp, WEIGHTS_8B)
    for n in range(0, 81):
        _, gradients = levers.fsdp_buffer_bytes(options, U_8B, n, dp, WEIGHTS_8B)
        assert float(gradients) <= min(slope * n + intercept for slope, intercept in lines)


# Llama 3 405B at TP 8 (docs/options.md, Meta's layout), stage 1 of 8 layers, queue 1e9. Per layer
# per TP rank in named order: input norm 16,384, proj 33,554,432, QKV 37,748,736, MLP norm 16,384,
# FC1 218,103,808, FC2 109,051,904 (u = 398,491,648).
U_405B_TP8 = 398_491_648
# DP 64, B = 64,000,000: three buckets a layer, P = norm + proj + QKV = 71,319,552, M = norm + FC1 =
# 218,120,192, F = FC2 = 109,051,904, each completed (F, M, P) before the next opens. The queue grows
# by u a layer to 2u + F = 906,035,200 (layers 7, 6 and layer 5's F); M_5 brings it to 1,124,155,392
# untrimmed and P_5 opens: 1,195,474,944; P_5's completion pops F_7, M_7 (796,983,296 = 2u) and
# appends: 868,302,848; layer 4: F appended (977,354,752, no pop), M appended (1,195,474,944, no
# pop: 977,354,752 <= 1e9 before it), P_4 opens: 2u + P + F + M + P = 1,266,794,496, the peak (P_4's
# completion pops P_7, F_6, M_6 back to 868,302,848: each later layer repeats it).
PEAK_405B_64 = 2 * U_405B_TP8 + 71_319_552 + 109_051_904 + 218_120_192 + 71_319_552
# DP 128, B = 128,000,000: layer 0's norm, proj, QKV, norm, FC1 (289,439,744), then C = FC2_i + norm +
# proj of the next (142,622,720) and D = QKV + norm + FC1 (255,868,928), FC2_7 alone last. Backward:
# FC1_i opens D_i, proj_i opens C_i before QKV_i completes D_i, FC2_{i-1} completes C_i. The queue:
# F, then + u a layer: F + 2u = 906,035,200 after layers 7-6; layer 5 opens D_5 and C_5 on it:
# 1,304,526,848, D_5 appended untrimmed; C_5's completion pops F_7 and D_7 (to 2u = 796,983,296)
# and appends C_5: 939,606,016; layer 4 opens D_4 and C_4: 939,606,016 + 255,868,928 + 142,622,720 =
# 1,338,097,664, the peak (C_4's completion pops C_7 and D_6 back to 939,606,016: periodic).
PEAK_405B_128 = 939_606_016 + 255_868_928 + 142_622_720


@pytest.mark.parametrize("dp, peak", [(64, PEAK_405B_64), (128, PEAK_405B_128)])
def test_llama3_405b_stage_at_meta_layout(dp, peak):
    weights = levers.layer_weights(preset("llama3.1-405b"), 8)
    assert weights == (16_384, 33_554_432, 37_748_736, 16_384, 218_103_808, 109_051_904)
    assert (PEAK_405B_64, PEAK_405B_128) == (1_266_794_496, 1_338_097_664)
    _, gradients = levers.fsdp_buffer_bytes(MemoryOptions(fsdp_strategy="optim_grads"), U_405B_TP8, 8, dp, weights)
    assert float(gradients) == 4 * peak  # 4.72 and 4.98 GiB of FP32 gradients


def test_the_split_search_cap_bounds_every_layer_count():
    """``QueueReplay.most``, the cap of ``fsdp_buffer_lines`` in ``StageModel``: the largest replay
    over 0..32 layers, per layout (a column of two DP sizes); at DP 64 the periodic peak above, which
    every stage from layer 26 of 32 down repeats (module doc: 5u + C)."""
    replay = levers.QueueReplay(WEIGHTS_8B, levers.ddp_bucket_size(np.array([[64], [2048]])), 1e9)
    cap = replay.most(32)
    peaks = np.array([replay.peak(np.full((2, 1), n)) for n in range(33)])
    assert cap.shape == (2, 1) and (peaks <= cap).all()
    assert float(cap[0, 0]) == PEAK_64 and float(cap[1, 0]) >= PEAK
