"""--tp-comm-overlap priced as Transformer Engine's userbuffers run it (advisor.throughput.userbuffers),
against hand-derived numbers.

Hand rates (H100 SXM, advisor/calibration.json): GEMMs at 0.9965 x 0.7106 x 989 TFLOP/s =
700.32 TFLOP/s plus 13.8 us a call; one TP ring collective of the [tokens, h] BF16 activation at
TP t: (t - 1)/t x 2 tokens h bytes over 450e9 x 0.9962 = 448.29e9 B/s (NVLink 900 GB/s both
ways, halved, times the fitted network efficiency) plus (t - 1) x 20 us. Userbuffers' defaults
(TE 2.9 ``initialize_ub``): ring exchange hides an all-gather behind (t - 1)/t of its GEMM; the
pipeline method leaves 1/4 of a reduce-scatter, and all of it past 3/4 of its GEMM; bulk hides a
collective behind the whole GEMM; pipeline and bulk GEMMs run on 132 - 16 of the H100's 132 SMs.
Each figure below is rounded from the unrounded arithmetic, so a sum of rounded figures may differ
in its last place."""

import numpy as np
import pytest

from advisor.hardware import get_gpu
from advisor.models import PRESETS
from advisor.options import TrainingOptions
from advisor.throughput import TimeModel, load_calibration

H100 = get_gpu("h100-80gb")
OVERLAP = TrainingOptions().with_(tp_comm_overlap=True).time_options()


def models(spec, gbs=64):
    return TimeModel(spec, H100, 8192, gbs), TimeModel(spec, H100, 8192, gbs, options=OVERLAP)


def hand_rates():
    cal = load_calibration()
    flops = cal.compute_factor * cal.kernels_for("hopper").gemm * 989e12
    return flops, cal.gemm_latency_s, cal.network_efficiency * 450e9, cal.collective_latency_s


def test_llama_8b_at_tp_8_leaves_half_its_tp_communication_exposed():
    """Llama 3.1 8B (h 4096, a 32, k 8, d 128, h_ffn 14336), TP 8, one 8192-token microbatch.
    GEMMs: QKV 2 x 8192 x 4096 x 768 -> 0.08739 ms, projection 2 x 8192 x 512 x 4096 -> 0.06286,
    FC1 2 x 8192 x 4096 x 3584 -> 0.35724, FC2 2 x 8192 x 1792 x 4096 -> 0.18552 ms. One
    collective: 7/8 x 67,108,864 B / 448.29 GB/s + 7 x 20 us = 0.27099 ms (4 a pass: 1.08395 ms).
    Margin 132/116. Forward: QKV ring 0.27099 - 7/8 x 0.08739 = 0.19452; projection pipeline
    0.27099 - 3/4 x 0.07153 = 0.21734; FC1 ring hidden (7/8 x 0.35724 > 0.27099); FC2 pipeline
    max(0.27099/4, 0.27099 - 3/4 x 0.21111) = 0.11266; 0.52451 ms. Backward: projection dgrad ring
    0.21598, FC2 dgrad ring 0.27099 - 0.16233 = 0.10866, QKV wgrad bulk 0.27099 - 0.09945 =
    0.17154, FC1 wgrad bulk hidden: 0.49618 ms. GEMMs slowed: forward 16/116 x (0.06286 +
    0.18552) = 0.03426 ms, backward 16/116 x 2 x (0.08739 + 0.35724) = 0.12266 ms."""
    flops, latency, bandwidth, hop = hand_rates()
    qkv, proj, fc1, fc2 = (2 * 8192 * k * n / flops + latency for k, n in
                           ((4096, 768), (512, 4096), (4096, 3584), (1792, 4096)))
    one = 7 / 8 * 2 * 8192 * 4096 / bandwidth + 7 * hop
    margin = 132 / 116
    forward = (one - 7 / 8 * qkv) + (one - 3 / 4 * proj * margin) + 0.0 + max(one / 4, one - 3 / 4 * fc2 * margin)
    backward = (one - 7 / 8 * proj) + (one - 7 / 8 * fc2) + (one - qkv * margin) + 0.0
    assert (forward, backward) == pytest.approx((0.52451e-3, 0.49618e-3), rel=1e-4)
    plain, overlapped = models(PRESETS["llama3.1-8b"])
    p, o = plain.layer(8, 1, 1), overlapped.layer(8, 1, 1)
    assert float(o[3]) == pytest.approx(forward + backward, rel=1e-12)
    slowed = (margin - 1) * (proj + fc2) + (margin - 1) * 2 * (qkv + fc1)
    assert slowed == pytest.approx(0.03426e-3 + 0.12266e-3, rel=1e-3)
    assert float(o[2] - p[2]) == pytest.approx(slowed, rel=1e-9)
    assert float(p[0] - o[0]) == pytest.approx(4 * one - forward - (margin - 1) * (proj + fc2), rel=1e-9)


def test_a_wide_layer_at_tp_2_hides_all_but_the_pipelines_last_chunks():
    """Llama 3.1 405B (h 16384, a 128, k 8, h_ffn 53248), TP 2: one collective is 1/2 x 2 x 8192 x
    16384 B / 448.29 GB/s + 20 us = 0.31940 ms, and the smallest GEMM (the projection, 2 x 8192 x
    8192 x 16384 / 700.32 TFLOP/s + 13.8 us = 3.154 ms) outlasts it nearly ten times: every ring exchange and bulk
    collective hides; the two pipelined reduce-scatters leave their last quarter each, 0.15970 ms
    forward, nothing backward."""
    flops, latency, bandwidth, hop = hand_rates()
    one = 1 / 2 * 2 * 8192 * 16384 / bandwidth + hop
    assert one == pytest.approx(0.31940e-3, rel=1e-4)
    assert 2 * 8192 * 8192 * 16384 / flops + latency == pytest.approx(3.1538e-3, rel=1e-4)
    plain, overlapped = models(PRESETS["llama3.1-405b"])
    p, o = plain.layer(2, 1, 1), overlapped.layer(2, 1, 1)
    assert float(o[3]) == pytest.approx(2 * one / 4, rel=1e-12)
    assert float(p[3]) == pytest.approx(8 * one, rel=1e-12)


def test_tp_1_prices_no_overlap_and_no_margin():
    plain, overlapped = models(PRESETS["llama3.1-8b"])
    assert np.allclose(np.array(overlapped.layer(1, 1, 1)), np.array(plain.layer(1, 1, 1)), rtol=0, atol=0)


@pytest.mark.parametrize("name", ["llama3.2-1b", "llama3.1-8b", "llama3.1-70b", "llama3.1-405b"])
def test_exposed_tp_time_is_between_zero_and_the_plain_time_and_grows_with_tp(name):
    """Each overlapped collective shows at most its whole time, so the layer's exposed TP time with
    the overlap lies in [0, without]; more TP ranks mean bigger collectives beside smaller GEMMs,
    so it never falls as TP grows (TP 16 leaves the 8-GPU node: the network's bandwidth)."""
    plain, overlapped = models(PRESETS[name])
    tp = np.array([2, 4, 8, 16])
    for cp in (1, 2):
        for mbs in (1, 4):
            _, _, _, p, _, _ = plain.layer(tp, cp, mbs)
            _, _, _, o, _, _ = overlapped.layer(tp, cp, mbs)
            assert np.all(o >= 0) and np.all(o <= p)
            assert np.all(np.diff(o) >= 0)


def test_the_step_prices_the_exposed_part_not_zero():
    """The audit's case: `advisor estimate --model llama3.1-8b --tp 8 --gpus 8 --gpu h100-80gb
    --gbs 128 --tp-comm-overlap`. 128 microbatches x 32 layers of the per-layer 1.02069 ms (the
    first test) = 4.1807 s of TP communication, where it was 0 (and 8.8797 s without the overlap)."""
    plain, overlapped = TimeModel(PRESETS["llama3.1-8b"], H100, 8192, 128), \
        TimeModel(PRESETS["llama3.1-8b"], H100, 8192, 128, options=OVERLAP)
    assert float(overlapped.step(8, 1, 1, 1, 1).tp_comm_s) == pytest.approx(128 * 32 * 1.02069e-3, rel=1e-4)
    assert float(plain.step(8, 1, 1, 1, 1).tp_comm_s) == pytest.approx(128 * 32 * 8 * 0.27099e-3, rel=1e-4)


def test_a_recomputed_mlp_runs_its_userbuffers_again():
    """--recompute-modules mlp under --tp-comm-overlap: the checkpointed MLP calls the same
    Transformer Engine modules, so its forward again leaves FC1's all-gather (ring exchange, hidden:
    7/8 x 0.35724 > 0.27099 ms) and FC2's pipelined reduce-scatter (0.11266 ms) exposed, with FC2
    on 116 of 132 SMs (16/116 x 0.18552 = 0.02559 ms): 0.13824 ms per layer; without the overlap
    the two collectives whole, 2 x 0.27099 ms (Llama 3.1 8B, TP 8, one 8192-token microbatch)."""
    flops, latency, bandwidth, hop = hand_rates()
    fc1, fc2 = (2 * 8192 * k * n / flops + latency for k, n in ((4096, 3584), (1792, 4096)))
    one = 7 / 8 * 2 * 8192 * 4096 / bandwidth + 7 * hop
    margin = 132 / 116
    hand = max(0.0, one - 7 / 8 * fc1) + max(one / 4, one - 3 / 4 * fc2 * margin) + (margin - 1) * fc2
    assert hand == pytest.approx(0.13824e-3, rel=1e-3)
    selective = TrainingOptions().with_(recompute="selective", recompute_modules=("mlp",))
    plain = TimeModel(PRESETS["llama3.1-8b"], H100, 8192, 64, options=selective.time_options())
    overlapped = TimeModel(PRESETS["llama3.1-8b"], H100, 8192, 64,
                           options=selective.with_(tp_comm_overlap=True).time_options())
    # (compute, TP communication) again, as TimeModel.stage adds them under selective recomputation
    compute_plain, comm_plain = (float(x) for x in plain.recomputed_forward_parts(8, 8192, 0.0))
    compute_overlapped, comm_overlapped = (float(x) for x in overlapped.recomputed_forward_parts(8, 8192, 0.0))
    assert compute_overlapped - compute_plain == pytest.approx((margin - 1) * fc2, rel=1e-9)
    assert comm_plain == pytest.approx(2 * one, rel=1e-9)
    assert comm_overlapped == pytest.approx(hand - (margin - 1) * fc2, rel=1e-9)
    assert (compute_plain + comm_plain) - (compute_overlapped + comm_overlapped) == pytest.approx(2 * one - hand,
                                                                                               rel=1e-9)


def test_a_layers_two_blocks_add_up_to_the_layer():
    """``block_overlap_time`` (one block alone, what the MoE model prices attention, a dense MLP and
    the shared experts with) is the same term: attention's block and the MLP's add up to the layer's
    ``tp_overlap_time`` (Llama 3.1 8B at TP 2, 4 and 8, one 8192-token microbatch)."""
    from advisor.throughput import terms
    from advisor.throughput.flops import layer_gemm_shapes
    from advisor.throughput.userbuffers import block_overlap_time, tp_overlap_time

    spec, rates = PRESETS["llama3.1-8b"], terms.Rates.of(H100, load_calibration())
    tp = np.array([2, 4, 8])
    qkv, proj, fc1, fc2 = (terms.gemm_time(m, k, n, rates) for m, k, n in layer_gemm_shapes(spec, 8192.0, tp))
    attention = block_overlap_time(("qkv", "proj"), (qkv, proj), spec, 8192.0, tp, rates, 132)
    mlp = block_overlap_time(("fc1", "fc2"), (fc1, fc2), spec, 8192.0, tp, rates, 132)
    layer = tp_overlap_time(spec, 8192.0, tp, rates, 132)
    for part, whole in zip(np.add(attention, mlp), layer):
        assert np.allclose(part, whole, rtol=1e-12, atol=0)
