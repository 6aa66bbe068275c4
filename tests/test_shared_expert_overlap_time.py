"""--moe-shared-expert-overlap's time (``advisor.moe.ep_time.shared_expert_hidden``): megatron-core
runs the shared experts' FC1 (with the SwiGLU) beside the dispatch all-to-all and FC2 beside the
combine, on a stream of their own (``token_dispatcher.py``, ``shared_experts.py``; core_v0.15.2 and
core_v0.19.0), forward and backward; each pair takes max(c, w + f c) where in series it took w + c."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from advisor.hardware import get_gpu
from advisor.moe import ep_time
from advisor.moe import time as mt
from advisor.moe.spec import PRESETS
from advisor.throughput import terms
from advisor.throughput.calibration import load_calibration

DSV3 = PRESETS["deepseek-v3"]


def _h100_rates():
    return terms.Rates.of(get_gpu("h100-80gb"), load_calibration())


def test_the_dsv3_one_node_layers_overlap_by_hand():
    """DeepSeek-V3 (h 7168, f_shared 2048, top-8), TP 1, EP 8 on one node of H100s, s 4096, b 1,
    alltoall, BF16, fused SwiGLU: the shared experts' two GEMMs and the two all-to-alls from the
    rates the model uses, and what the overlap hides."""
    rates, cal, gpu = _h100_rates(), load_calibration(), get_gpu("h100-80gb")
    R, hbm, nvlink, latency = (rates.gemm_flops_per_s, rates.hbm_bytes_per_s, rates.nvlink_bytes_per_s,
                               rates.collective_latency_s)
    # the H100 preset's vendor figures: 989 TFLOP/s dense BF16, 3.35 TB/s HBM, NVLink 900 GB/s both ways
    assert (gpu.peak_flops, gpu.hbm_bytes_per_s, gpu.nvlink_bytes_per_s) == (989e12, 3.35e12, 450e9)
    # the calibrated H100 rates (advisor/calibration.json): GEMMs at compute_factor 0.9965 x 0.7106 x 989
    # = 700.32 TFLOP/s, HBM 0.8 x 3.35 = 2.68 TB/s, NVLink 450 GB/s x network_efficiency 0.9962 =
    # 448.29 GB/s, 20 us a collective
    assert R == pytest.approx(cal.compute_factor * 0.7106 * 989e12, rel=1e-12)
    assert (hbm, latency) == (2.68e12, 20e-6)
    assert nvlink == pytest.approx(450e9 * cal.network_efficiency, rel=1e-12)
    assert (R, nvlink) == pytest.approx((700.32e12, 448.29e9), rel=1e-5)
    s, h, f, k = 4096, 7168, 2048, 8
    assert (DSV3.hidden_size, DSV3.shared_expert_size, DSV3.moe_router_topk) == (h, f, k)
    fc1_gemm = 2 * s * h * (2 * f) / R  # [s, h] x [h, 2f]: 240.5 GFLOP
    swiglu = 2 * 3 * f * s / hbm  # fused: read 2f, write f per token, BF16
    fc2 = 2 * s * f * h / R  # [s, f] x [f, h]
    fc1 = fc1_gemm + swiglu
    assert fc1 == pytest.approx(0.362219e-3, rel=1e-5) and fc2 == pytest.approx(0.171719e-3, rel=1e-5)
    # each all-to-all: s k token copies of 2h bytes, 7/8 of them to the node's 7 other GPUs over NVLink
    a2a = s * k * 2 * h * 7 / 8 / (450e9 * cal.network_efficiency) + latency
    assert a2a == pytest.approx(0.936910e-3, rel=1e-5)  # no ETP gather at ETP 1
    layer = mt.layer_times(DSV3, s, tp=1, cp=1, ep=8, etp=1, mbs=1, rates=rates)
    assert layer.shared == pytest.approx(fc1 + fc2, rel=1e-12) and layer.comm == pytest.approx(2 * a2a, rel=1e-12)
    (w1, c1), (w2, c2) = layer.shared_pairs
    assert (w1, c1, w2, c2) == pytest.approx((fc1, a2a, fc2, a2a), rel=1e-12)
    # each all-to-all outlasts its partner, forward and backward (2w), so all of it is hidden:
    # forward min(w, c) per pair, backward min(2w, c)
    forward, backward = ep_time.shared_expert_hidden(layer.shared_pairs)
    assert forward == pytest.approx(fc1 + fc2, rel=1e-12) == pytest.approx(0.533938e-3, rel=1e-5)
    assert backward == pytest.approx(2 * (fc1 + fc2), rel=1e-12) == pytest.approx(1.067877e-3, rel=1e-5)


def test_a_short_all_to_all_hides_only_itself():
    # EP 8 with DeepEP's 20 of 132 SMs: a pair hides min(w, (1 - f) c), here c's share of it
    f = 20 / 132
    assert ep_time.comm_sm_share("flex", "hopper") == f
    forward, backward = ep_time.shared_expert_hidden(((3e-4, 1e-4), (1e-4, 5e-5)), f)
    assert forward == pytest.approx((1 - f) * 1e-4 + (1 - f) * 5e-5, rel=1e-12)
    assert backward == pytest.approx(forward, rel=1e-12)  # 2w outlasts c again
    # no communication (EP 1): nothing to hide behind
    assert ep_time.shared_expert_hidden(((3e-4, 0.0), (1e-4, 0.0))) == (0.0, 0.0)


@settings(max_examples=300, deadline=None)
@given(st.floats(0, 1e-2), st.floats(0, 1e-2), st.floats(0, 1e-2), st.floats(0, 1e-2), st.floats(0, 0.9))
def test_the_saving_is_never_negative_nor_more_than_the_shorter(w1, c1, w2, c2, share):
    pairs = ((w1, c1), (w2, c2))
    forward, backward = ep_time.shared_expert_hidden(pairs, share)

    def within(value, bound):  # w + c - max(c, w + f c) in floating point: rounding of order 1e-16 of w + c
        return -1e-15 * (w1 + c1 + w2 + c2) <= value <= bound + 1e-15 * (w1 + c1 + w2 + c2)

    assert within(forward, min(w1, c1) + min(w2, c2))
    assert within(backward, min(2 * w1, c1) + min(2 * w2, c2))
    for w, c in pairs:  # pair by pair too
        one, _ = ep_time.shared_expert_hidden(((w, c),), share)
        assert within(one, min(w, c))
