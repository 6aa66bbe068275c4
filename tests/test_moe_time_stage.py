"""MoE stage memory (advisor.moe.stage), time terms (advisor.moe.time) and Megatron's FLOPs
count for MoE, against hand-derived values."""

from dataclasses import replace

import numpy as np
import pytest

from advisor import equations as eq
from advisor.hardware import get_gpu
from advisor.moe import ep_time
from advisor.moe import memory as mm
from advisor.moe import stage as st
from advisor.moe import time as mt
from advisor.moe import transient as tr
from advisor.moe.spec import PRESETS
from advisor.throughput.calibration import load_calibration
from advisor.throughput.terms import Rates

MIXTRAL, DSV3 = PRESETS["mixtral-8x7b"], PRESETS["deepseek-v3"]


def test_split_puts_the_remainder_before_the_last_stage():
    assert st.split_layers(61, 16) == [3, 3] + [4] * 13 + [3]
    assert st.split_layers(32, 4) == [8] * 4
    assert st.split_layers(10, 4) == [2, 3, 3, 2]
    assert st.split_layers(7, 4) == [1, 2, 2, 2]  # remainder pp - 1: every stage after the first
    assert sum(st.split_layers(61, 8)) == 61


def test_stage_memory_by_hand():
    # Mixtral, PP 2 (16 layers each), TP 1, CP 1, EP 8, DP 8 (16 GPUs... 8 per stage), MBS 1, 4 microbatches
    b = st.stage_bytes(MIXTRAL, 4096, st.MoEOptions(), tp=1, cp=1, pp=2, ep=8, etp=1, dp=8, mbs=1,
                       num_microbatches=4, stage=np.array([0, 1]))
    embedding = 4096 * 32000
    dense_layer = 4096 * 10240 + 2 * 4096 + 8 * 4096
    first_dense = (16 * dense_layer + embedding) * (2 + 4 + 12 / 8)
    assert b.weights_gradients_optimizer[0] == pytest.approx(first_dense)
    last_dense = (16 * dense_layer + embedding + 4096) * (2 + 4 + 12 / 8)
    assert b.weights_gradients_optimizer[1] == pytest.approx(last_dense)
    expert = 16 * 1 * 3 * 4096 * 14336 * (2 + 4 + 12 / 1)  # one expert per GPU; EDP = 8 / 8 = 1
    assert b.expert_states[0] == pytest.approx(expert)
    layer = mm.moe_layer_activation_bytes(MIXTRAL, 4096, 1, 1, 1, 8, 1)
    assert b.activations[0] == pytest.approx(2 * (16 * layer + 8 * 4096 * 4096))
    assert b.activations[1] == pytest.approx(16 * layer + 4 * 4096 * 4096 + 4 * 4096 * 32000)
    copies = 4096 * 2
    # one local expert: forward S + the experts' output at the unsort-free combine, 2 x 64 + 64 MiB,
    # below FC1's gradient in the backward, copies x 2 x 2 h_moe = 448 MiB; with the routing the
    # dispatcher holds, 4096 tokens x 8 experts x (4 + 1) B, and the same held by each of the
    # stage's 15 other MoE layers' dispatchers
    assert b.transient[0] == pytest.approx(copies * 2 * 2 * 14336 + 16 * 4096 * 8 * 5 + 4 * (32 * 2**20 + 256))


@pytest.mark.parametrize("recompute, per_layer", [("none", 2.5), ("full", 2.75)])
def test_every_other_moe_layer_s_held_routing_on_the_stage(monkeypatch, recompute, per_layer):
    """Qwen3-30B-A3B at PP 1 (48 MoE layers; TP 1, EP 16, alltoall, balanced, sequence 4096, MBS 1:
    N 4096, E 128, k 8): each dispatcher holds self.probs N E 4 and self.routing_map N E, 2.5 MiB,
    from its layer's forward to the next; one layer's is in its transient peak, the 47 others' beside
    it: 117.5 MiB. Fully recomputed, their forwards saved nothing, so each holds the permutation's
    indices too (N k 8, 0.25 MiB): 129.25. The stage's total moves by exactly that."""
    qwen, MiB = PRESETS["qwen3-30b-a3b"], 2**20
    layout = dict(tp=1, cp=1, pp=1, ep=16, etp=1, dp=16, mbs=1, num_microbatches=64, stage=np.array([0]),
                  recompute=recompute)
    b = st.stage_bytes(qwen, 4096, st.MoEOptions(), **layout)
    one = tr.moe_layer_transient_bytes(qwen, 4096.0, 4096.0 * 8, 16, 1, "alltoall")
    assert (b.transient[0] - one) / MiB == pytest.approx(47 * per_layer, abs=1e-9)
    monkeypatch.setattr(tr, "routing_held_by_other_layers_bytes", lambda *args, **kwargs: 0.0)
    without = st.stage_bytes(qwen, 4096, st.MoEOptions(), **layout)
    assert (b.total[0] - without.total[0]) / MiB == pytest.approx(47 * per_layer, abs=1e-9)


def test_deepseek_v3_stages_hold_their_other_moe_layers_routing():
    """DeepSeek-V3 at TP 2, PP 16, EP 64, alltoall, capacity 1.0 (dgxc-dsv3-bf16's layout, one MTP
    layer; N 2048, E 256): the held routing is the FP32 probabilities alone (the capacity mask is
    kept), N E 4 = 2 MiB a layer. Split 3 | 3 | 4 x 13 | 3: stage 0's three dense layers hold none;
    stage 1's three MoE layers, 2 others: 4 MiB; stage 2's four, 3 others: 6; the last stage's three
    and its MTP layer's MoE layer, 3 others: 6."""
    dsv3, MiB = replace(DSV3, mtp_num_layers=1), 2**20
    options = st.MoEOptions(routing=mm.RoutedTokens(routing="capacity", capacity_factor=1.0))
    stages = np.array([0, 1, 2, 15])
    b = st.stage_bytes(dsv3, 4096, options, tp=2, cp=1, pp=16, ep=64, etp=1, dp=32, mbs=1, num_microbatches=128,
                       stage=stages)
    tokens = 2048.0
    copies = mm.expert_token_copies(dsv3, tokens, 64, 1, options.routing)
    one = tr.moe_layer_transient_bytes(dsv3, tokens, copies, 64, 1, "alltoall", options.routing)
    assert list((b.transient - np.where(stages > 0, one, 0.0)) / MiB) == pytest.approx([0, 4, 6, 6], abs=1e-9)


def test_deepseek_dense_layers_and_interleaving():
    b = st.stage_bytes(DSV3, 4096, st.MoEOptions(), tp=1, cp=1, pp=16, ep=64, etp=1, dp=64, mbs=1,
                       num_microbatches=128, stage=np.array([0, 1]), vpp=1)
    assert list(b.dense_layers) == [3, 0] and b.expert_states[0] == 0
    # interleaved: stage 0 of PP 4 with v = 2 holds 2(p - 1) + (v - 1) p + 1 = 11 chunk passes, 5.5 stages
    c = st.stage_bytes(MIXTRAL, 4096, st.MoEOptions(), tp=1, cp=1, pp=4, ep=8, etp=1, dp=16, mbs=1,
                       num_microbatches=16, stage=np.array([0]), vpp=2)
    assert c.in_flight[0] == 5.5


def test_all_to_all_by_hand():
    gpu = get_gpu("h800-80gb")
    cal = load_calibration()
    rates, net = Rates.of(gpu, cal), cal.network_efficiency  # fitted: 0.9962
    # the H800 preset's vendor figures: NVLink 400 GB/s both ways (200e9 one way), 50 GB/s of network
    # a GPU; the model's rates are those times the network efficiency
    assert (gpu.nvlink_bytes_per_s, gpu.network_bytes_per_s, gpu.gpus_per_node) == (200e9, 50e9, 8)
    assert rates.nvlink_bytes_per_s == pytest.approx(200e9 * net)
    assert rates.network_bytes_per_s == pytest.approx(50e9 * net)
    # EP 16 spanning two 8-GPU nodes: 7/16 of the bytes on NVLink (200e9 x 0.9962 = 199.24e9 B/s),
    # 8/16 on the network at NCCL's measured 83.4% of its 50 GB/s line rate (41.7e9 B/s: a fraction
    # of the line rate, so without the fitted efficiency), and 8 messages to the other node's peers
    # at 10.4 us each: 14,336,000 B x 7/16 / 199.24e9 = 31.48 us against 7,168,000 / 41.7e9 =
    # 171.89 us + 83.2 us = 255.09 us; the network paces it, plus 20 us: 275.09 us
    size = 1000 * 2 * 7168
    expected = max(size * 7 / 16 / (200e9 * net), size * 8 / 16 / (0.834 * 50e9) + 8 * 10.4e-6)
    assert expected + 20e-6 == pytest.approx(275.09e-6, abs=0.01e-6)
    assert ep_time.all_to_all_time(DSV3, 1000, 16, 1, rates) == pytest.approx(expected + rates.collective_latency_s)
    assert ep_time.all_to_all_time(DSV3, 1000, 1, 1, rates) == 0
    # inside one node (EP 8) only NVLink: no network term, 14,336,000 x 7/8 / 199.24e9 + 20 us = 82.96 us
    assert ep_time.all_to_all_time(DSV3, 1000, 8, 1, rates) == pytest.approx(size * 7 / 8 / (200e9 * net) + 20e-6)
    assert size * 7 / 8 / (200e9 * net) + 20e-6 == pytest.approx(82.96e-6, abs=0.01e-6)


def test_the_off_node_all_to_all_is_a_fraction_of_the_line_rate_whatever_the_fitted_efficiency():
    """NCCL's all-to-all fraction (0.834) was measured against the line rate (DeepEP is priced at
    it: test_deepep_sends_...): the ring collectives' fitted network efficiency, folded into the
    rates, is divided out there (it discounted the network twice once fitted under 1.0,
    2026-11-30). Two-node EP 16,
    where the network paces it: the same time at efficiency 1.0 and 0.5; inside a node (EP 8)
    NVLink's rate keeps the efficiency."""

    line = Rates.of(get_gpu("h800-80gb"), load_calibration())
    line = replace(line, network_bytes_per_s=50e9, nvlink_bytes_per_s=200e9, network_efficiency=1.0)
    half = replace(line, network_bytes_per_s=25e9, nvlink_bytes_per_s=100e9, network_efficiency=0.5)
    both = [ep_time.all_to_all_time(DSV3, 1000, 16, 1, rates) for rates in (line, half)]
    assert both[0] == pytest.approx(both[1], rel=1e-12)
    inside = [ep_time.all_to_all_time(DSV3, 1000, 8, 1, rates) for rates in (line, half)]
    assert inside[1] - half.collective_latency_s == pytest.approx(2 * (inside[0] - line.collective_latency_s))


def test_grouped_gemm_from_its_shapes_by_hand():
    rates = Rates.of(get_gpu("h800-80gb"), load_calibration())
    # 16 experts of 200 rows, [200, 2048] x [2048, 1536]: 16 x 2 x 12 = 384 tiles of 128 x 128 in
    # ceil(384 / 132) = 3 waves, useful 16 x 200 x 1536 / (3 x 132 x 128^2) of them; its bytes (weights
    # 2048 x 1536, input 200 x 2048, output 200 x 1536, BF16, per expert) take longer: memory-bound
    useful = 16 * 200 * 1536 / (3 * 132 * 16384)
    compute = 2 * 16 * 200 * 2048 * 1536 / (rates.gemm_flops_per_s * useful)
    memory = 16 * 2 * (2048 * 1536 + 200 * 2048 + 200 * 1536) / rates.hbm_bytes_per_s
    assert memory > compute
    assert mt.grouped_gemm_time(16, 200, 2048, 1536, rates, 132) == pytest.approx(memory + rates.gemm_latency_s)
    # Mixtral at EP 8: one expert of 4096 copies; FC1 [4096, 4096] x [4096, 28672]: 32 x 224 = 7168
    # tiles, 55 waves; FC2 [4096, 14336] x [14336, 4096]: 32 x 32 = 1024 tiles, 8 waves; compute-bound
    forward, backward = mt.expert_gemm_time(MIXTRAL, 4096.0, 8, 1, rates)
    fc1 = 2 * 4096 * 4096 * 28672 / (rates.gemm_flops_per_s * 4096 * 28672 / (55 * 132 * 16384))
    fc2 = 2 * 4096 * 14336 * 4096 / (rates.gemm_flops_per_s * 4096 * 4096 / (8 * 132 * 16384))
    assert forward == pytest.approx(fc1 + fc2 + 2 * rates.gemm_latency_s)
    assert backward == 2 * forward


def test_deepep_sends_a_token_once_per_remote_node_and_once_per_rank_by_hand():
    # 4 items in 2 bins, 2 drawn: both in one bin with chance C(2, 2) / C(4, 2) = 1/6 each
    assert ep_time.distinct_bins(2, 4, 2) == pytest.approx(2 * (1 - 1 / 6))
    assert ep_time.distinct_bins(8, 8, 4) == pytest.approx(4)  # 4 of 8 one-item bins: 4 bins
    # DeepSeek-V3 at EP 64 over 8 nodes: group-limited routing picks 4 of the 8 groups, one node
    # each; 7/8 of those remote; its 8 experts fall among the 32 ranks of the 4 groups (4 each)
    ranks, remote = ep_time.flex_destinations(DSV3, 64, 8)
    assert remote == pytest.approx(4 * 7 / 8)
    miss = np.prod([(124 - i) / (128 - i) for i in range(8)])
    assert ranks == pytest.approx(32 * (1 - miss))
    rates = Rates.of(get_gpu("h100-80gb"), load_calibration())
    copies = 2048 * 8.0
    token = 2048 * 2 * 7168
    # NVLink at its fitted rate, the network at DeepEP's line rate (the H100 preset's 50e9 B/s a GPU)
    assert get_gpu("h100-80gb").network_bytes_per_s == 50e9
    expected = max(token * ranks * 7 / 8 / rates.nvlink_bytes_per_s, token * 3.5 / 50e9)
    got = ep_time.all_to_all_time(DSV3, copies, 64, 1, rates, "flex")
    assert got == pytest.approx(expected + rates.collective_latency_s)
    assert got < ep_time.all_to_all_time(DSV3, copies, 64, 1, rates)  # alltoall: 8 x 56/64 = 7 copies leave the node
    # Qwen3-30B-A3B at EP 16 over 2 nodes, no groups: the other node is hit unless all 8 experts are local
    qwen = PRESETS["qwen3-30b-a3b"]
    _, remote = ep_time.flex_destinations(qwen, 16, 8)
    assert remote == pytest.approx(1 - np.prod([(64 - i) / (128 - i) for i in range(8)]))


def test_overlapped_layer_by_hand():
    # a = 1, x = 2, comm 8 (four of 2): max(2, 1) + max(2, 2) + max(2, 4) + max(2, 2) = 10
    assert ep_time.overlapped_layer_time(1.0, 2.0, 8.0) == pytest.approx(10.0)
    # DeepEP's SMs, a quarter: each compute beside a communication gains 0.25 x 2 = 0.5
    assert ep_time.overlapped_layer_time(1.0, 2.0, 8.0, 0.25) == pytest.approx(2 + 2.5 + 4.5 + 2.5)
    assert ep_time.overlapped_layer_time(1.0, 2.0, 0.0) == pytest.approx(9.0)  # the plain 3a + 3x
    assert ep_time.overlapped_layer_time(0.0, 0.0, 8.0) == pytest.approx(8.0)  # the plain communication
    assert ep_time.comm_sm_share("flex", "hopper") == pytest.approx(20 / 132)
    assert ep_time.comm_sm_share("alltoall", "hopper") == 0
    # --moe-deepep-num-sms 32 (HybridEP recipes' count): 32 of Hopper's 132, of Blackwell's 148
    assert ep_time.comm_sm_share("flex", "hopper", 32) == pytest.approx(32 / 132)
    assert ep_time.comm_sm_share("flex", "blackwell", 32) == pytest.approx(32 / 148)
    assert ep_time.comm_sm_share("alltoall", "hopper", 32) == 0


def test_the_dispatchers_sms_slow_only_the_overlapped_compute():
    # Qwen3-30B-A3B, EP 16 on 2 nodes of H100, flex: with the overlap, each compute beside a
    # communication loses f c, so 32 SMs instead of 20 add at most (32 - 20)/132 x comm per layer
    # and microbatch; without the overlap the SM count changes nothing (line-rate communication)
    from advisor.moe.space import estimate_layout
    from advisor.parallel import Workload

    qwen, gpu = PRESETS["qwen3-30b-a3b"], get_gpu("h100-80gb")
    work = Workload(seq_len=4096, global_batch_size=1024)

    def step(sms, overlap):
        options = st.MoEOptions(dispatcher="flex", a2a_overlap=overlap, dispatcher_sms=sms)
        return estimate_layout(qwen, work, tp=1, cp=1, pp=1, ep=16, etp=1, dp=16, mbs=1, memory_gib=80, gpu=gpu,
                               options=options)["step_time_s"]

    assert step(32, False) == step(None, False) == step(20, False)
    assert step(20, True) == step(None, True)
    slower = step(32, True) - step(20, True)
    assert slower > 0
    rates = Rates.of(gpu, load_calibration())
    comm = 4 * ep_time.all_to_all_time(qwen, 4096 * 8.0, 16, 1, rates, "flex")  # dispatch and combine, both ways
    assert slower <= 64 * qwen.num_layers * (32 - 20) / 132 * comm * (1 + 1e-9)  # 64 microbatches, 48 layers


def test_overlap_holds_one_more_layer():
    # a combined step runs forward layer j of one chunk beside backward layer L - 1 - j of another,
    # each backward layer freeing its tensors: L + 1 layers, one more than plain 1F1B's peak, where
    # a combined step runs: PP 1 with two microbatches or more; PP 4 VPP 2 stage 0 warms up
    # 2(p - 1) + (v - 1) p + 1 = 11 chunk passes, fewer than m v = 32 (m = 16), not than 8 (m = 4)
    overlap = st.MoEOptions(a2a_overlap=True)
    assert st.overlap_layers_in_flight(overlap, 0, 1, 1, 4) == 1.0
    assert st.overlap_layers_in_flight(overlap, 0, 1, 1, 1) == 0.0
    assert st.overlap_layers_in_flight(overlap, 0, 4, 2, 16) == 1.0
    assert st.overlap_layers_in_flight(overlap, 0, 4, 2, 4) == 0.0
    assert st.overlap_layers_in_flight(st.MoEOptions(), 0, 1, 1, 4) == 0.0
    layout = dict(tp=1, cp=1, pp=4, ep=8, etp=1, dp=16, mbs=1, num_microbatches=16, stage=np.array([0]), vpp=2)
    plain = st.stage_bytes(MIXTRAL, 4096, st.MoEOptions(), **layout)
    combined = st.stage_bytes(MIXTRAL, 4096, overlap, **layout)
    assert combined.in_flight[0] == plain.in_flight[0] == 5.5  # the same 11 chunk passes, in stages
    one_layer = mm.moe_layer_activation_bytes(MIXTRAL, 4096, 1, 1, 1, 8, 1, mm.RoutedTokens(), frozenset())
    assert combined.layer_activations[0] - plain.layer_activations[0] == pytest.approx(one_layer)
    assert one_layer == pytest.approx(plain.layer_activations[0] / (5.5 * 8))  # Mixtral's 32 layers: 8 a stage
    # and the combined step's forward embeds its microbatch before the other's embedding is freed
    embedded = eq.embedding_activation_bytes(MIXTRAL, 4096, 1)
    assert combined.embedding_activations[0] - plain.embedding_activations[0] == pytest.approx(embedded)


def test_megatron_flops_by_hand():
    s, gbs, v = 4096, 256, 32000
    h, L = 4096, 32
    mlp = 12 * L * h * 1.5 * 14336 * 2
    attention = 12 * L * h * h * (1 + 8 / 32 + s / h / 2)
    assert mt.megatron_flops_per_iteration(MIXTRAL, s, gbs, v) == pytest.approx(gbs * s * (mlp + attention + 6 * h * v))
    # DeepSeek-V3's MLA term (training.py, transformer_flops)
    a, hd = 128, 7168
    mla = 6 * 61 * (1536 * (hd + a * 192 + 1) + 512 * (hd + a * 256 + 1) + hd * 64 + a * 128 * hd
                    + s * a * 192 / 2 + s * a * 128 / 2)
    dsv3_mlp = 12 * 61 * hd * 1.5 * (18432 * 3 / 61 + (2048 * 8 + 2048) * 58 / 61)
    assert mt.megatron_flops_per_iteration(DSV3, s, 1, 129280) == pytest.approx(s * (dsv3_mlp + mla + 6 * hd * 129280))


def test_overlap_in_the_step_by_hand():
    # PP 1 (Qwen3-30B-A3B, EP 16, 16 microbatches of one DP rank): the combined schedule runs the
    # first forward and the last backward plain and pairs the other 15, so the step shortens by
    # (m - 1) x the MoE layers x (a plain layer - an overlapped one), nothing else changing
    from advisor.moe.stage import MoEOptions
    from advisor.options import TrainingOptions
    from advisor.throughput import terms

    qwen, gpu = PRESETS["qwen3-30b-a3b"], get_gpu("h100-80gb")
    columns = {"tp": 1, "cp": 1, "pp": 1, "ep": 16, "etp": 1, "dp": 16, "mbs": 1, "vpp": 1}
    m = 256 / 16

    def step(options):
        first = st.stage_bytes(qwen, 4096, options, num_microbatches=m, stage=0, **columns)
        return mt.step_times(qwen, 4096, 256, columns, "none", gpu=gpu, options=options, first_stage=first)

    flex = dict(dispatcher="flex", training=TrainingOptions())
    plain, overlap = step(MoEOptions(**flex)), step(MoEOptions(**flex, a2a_overlap=True))
    rates = terms.Rates.of(gpu, load_calibration())
    times = mt.layer_times(qwen, 4096, tp=1, cp=1, ep=16, etp=1, mbs=1, rates=rates, dispatcher="flex")
    moe_f, comm, expert = times.moe, times.comm, times.expert
    layer = 3 * (moe_f - comm) + 2 * comm
    paired = ep_time.overlapped_layer_time(moe_f - comm - expert, expert, 2 * comm, 20 / 132)
    assert paired < layer
    assert plain["step_time_s"] - overlap["step_time_s"] == pytest.approx((m - 1) * qwen.moe_layers * (layer - paired))
    assert overlap["ep_comm_s"] == pytest.approx(m * qwen.moe_layers * (paired - 3 * (moe_f - comm)))


def test_allgather_dispatcher_gathers_and_reduce_scatters_over_the_expert_tp_ep_group_by_hand():
    # Mixtral, N = 4096 tokens a rank, EP 8 x ETP 1 = 8 ranks of one node (NVLink rings): the
    # dispatch gathers 8 x 4096 tokens of 2h bytes with their FP32 probabilities (4E) and
    # routing map (E); the combine reduce-scatters 8 x 4096 rows of 4h (FP32); each rank moves
    # 7/8 of each, in 7 ring steps
    from advisor.throughput import terms

    rates = terms.Rates.of(get_gpu("h100-80gb"), load_calibration())
    n, h, e = 4096, 4096, 8
    gathered = 7 / 8 * 8 * n * (2 * h + 5 * e) / rates.nvlink_bytes_per_s
    scattered = 7 / 8 * 8 * n * 4 * h / rates.nvlink_bytes_per_s
    expected = gathered + scattered + 2 * 7 * rates.collective_latency_s
    assert ep_time.allgather_dispatch_time(MIXTRAL, n, 8, 1, rates) == pytest.approx(expected)
    times = mt.layer_times(MIXTRAL, 4096, tp=1, cp=1, ep=8, etp=1, mbs=1, rates=rates, dispatcher="allgather")
    assert times.comm == pytest.approx(expected)
    # six times the all-to-all's bytes here: k = 2 copies of 2h, 7/8 of them leaving, both ways
    assert times.comm > 5 * mt.layer_times(MIXTRAL, 4096, tp=1, cp=1, ep=8, etp=1, mbs=1, rates=rates).comm


def test_recomputing_the_moe_block_runs_its_compute_and_all_to_alls_again():
    # --recompute-modules moe checkpoints MoELayer.forward whole (moe_layer.py, custom_forward:
    # router, dispatch, experts, combine, shared experts), so each MoE layer's backward runs its
    # block, its dispatch and combine, and (flex) DeepEP's host wait once more than moe_act's
    from advisor.moe.stage import MoEOptions
    from advisor.options import TrainingOptions
    from advisor.throughput import terms

    qwen, gpu = PRESETS["qwen3-30b-a3b"], get_gpu("h100-80gb")
    columns = {"tp": 1, "cp": 1, "pp": 1, "ep": 16, "etp": 1, "dp": 16, "mbs": 1, "vpp": 1}
    m = 256 / 16

    def step(modules):
        options = MoEOptions(dispatcher="flex", training=TrainingOptions(), modules=frozenset(modules))
        first = st.stage_bytes(qwen, 4096, options, num_microbatches=m, stage=0, recompute="selective", **columns)
        return mt.step_times(qwen, 4096, 256, columns, "selective", gpu=gpu, options=options, first_stage=first)

    rates = terms.Rates.of(gpu, load_calibration())
    times = mt.layer_times(qwen, 4096, tp=1, cp=1, ep=16, etp=1, mbs=1, rates=rates, dispatcher="flex")
    again = times.block + times.comm + ep_time.HOST_LAUNCH_S
    cheap, whole = step({"moe_act"}), step({"moe"})
    # moe_act runs the routed experts' SwiGLU again: 3 x 2 bytes x 768 per copy, 8 copies of 4096
    # tokens, at the HBM rate
    swiglu = 2 * 3 * 768 * 8 * 4096 / rates.hbm_bytes_per_s
    assert times.moe_act == pytest.approx(swiglu)
    assert whole["step_time_s"] - cheap["step_time_s"] == pytest.approx(m * qwen.moe_layers * (again - swiglu))
    assert whole["ep_comm_s"] - cheap["ep_comm_s"] == pytest.approx(m * qwen.moe_layers * times.comm)
    # the block is the layer's compute less attention: most of it, and more than the experts' GEMMs
    assert times.expert < times.block < times.moe - times.comm


def test_elementwise_bytes_by_hand():
    # Qwen3-30B-A3B (GQA 32/4 heads of 128, QK norms): norms and residuals 10h, RoPE on Q and K
    # read and written 2 (32 + 4) 128, the QK norms as much again; 1000 tokens over TP 2
    qwen = PRESETS["qwen3-30b-a3b"]
    attention, dense, routed, shared = mt.elementwise_bytes(qwen, 1000.0, 2, 8000.0, 1)
    assert attention == 2 * 1000 * (10 * 2048 + 2 * 2 * 36 * 128) / 2
    assert dense == 2 * 1000 * 3 * 6144 / 2
    assert routed == 2 * 8000 * 3 * 768  # SwiGLU on every copy: read 2 x 768, write 768
    assert shared == 0  # no shared expert
    # DeepSeek-V3 (MLA: RoPE on the 128 heads' and the shared key's 64 rotary dims, its norms on the
    # 1536 and 512 wide latents; a 2048-wide shared expert over TP 2)
    attention, _, routed, shared = mt.elementwise_bytes(DSV3, 1000.0, 2, 8000.0, 1)
    assert attention == 2 * 1000 * (10 * 7168 + 2 * 129 * 64 + 2 * (1536 + 512)) / 2
    assert (routed, shared) == (2 * 3 * 8000 * 2048, 2 * 3 * 1000 * 2048 / 2)


def test_permutation_bytes_by_hand():
    # 1000 copies of h = 2048 read and written (2 x 2 x 2048 bytes each) by the permutation and its
    # inverse; the alltoall dispatcher sorts them by local expert again after the all-to-all (and
    # back before the combine) where a rank holds more than one expert
    qwen = PRESETS["qwen3-30b-a3b"]
    pair = 4 * 1000 * 2 * 2048
    assert ep_time.permutation_pairs(qwen, 1000.0, 8) == (pair, pair)
    assert ep_time.permutation_pairs(qwen, 1000.0, 8, "flex") == (pair, 0)
    assert ep_time.permutation_pairs(qwen, 1000.0, 128) == (pair, 0)  # one expert per rank


def test_permutation_time_by_hand():
    # 1000 copies of h = 2048 at an HBM rate of 1e12 B/s: each pair moves 4 x 1000 x 2 x 2048 =
    # 16,384,000 bytes, 16.384 us at the rate. Unfused, megatron-core's permutation by expert and
    # its inverse run at 0.42 of it (39.01 us), the alltoall's sort by local expert at the rate;
    # Transformer Engine's fused ones (--moe-permute-fusion) at the rate, each pair
    qwen = PRESETS["qwen3-30b-a3b"]
    rates = Rates(**{**{f: getattr(_RATES, f) for f in Rates.__dataclass_fields__}, "hbm_bytes_per_s": 1e12})
    pair = 16_384_000 / 1e12
    assert ep_time.PERMUTE_HBM_FRACTION == 0.42
    assert ep_time.permutation_time(qwen, 1000.0, 8, rates) == pytest.approx(pair / 0.42 + pair, rel=1e-12)
    assert ep_time.permutation_time(qwen, 1000.0, 8, rates, fused=True) == pytest.approx(2 * pair, rel=1e-12)
    assert ep_time.permutation_time(qwen, 1000.0, 8, rates, "flex") == pytest.approx(pair / 0.42, rel=1e-12)
    assert ep_time.permutation_time(qwen, 1000.0, 128, rates) == pytest.approx(pair / 0.42, rel=1e-12)


def test_the_unfused_router_costs_its_measured_small_kernels():
    # forward a third of the softmax router's ROUTER_KERNELS_S (0.08 ms), so that the backward, priced as twice the
    # forward, brings the whole 0.24 ms; the fused router (--moe-router-fusion) is its GEMM alone,
    # and the fused permutation takes the unfused one's extra time (1/0.42 - 1 of its first pair)
    qwen = PRESETS["qwen3-30b-a3b"]
    kw = dict(tp=1, cp=1, ep=8, etp=1, mbs=1, rates=_RATES)
    unfused = mt.layer_times(qwen, 4096, **kw)
    router_fused = mt.layer_times(qwen, 4096, **kw, router_fusion=True)
    both_fused = mt.layer_times(qwen, 4096, **kw, router_fusion=True, permute_fusion=True)
    assert mt.ROUTER_KERNELS_S["softmax"] == 0.24e-3  # Qwen3-30B-A3B's softmax router
    assert float(unfused.block - router_fused.block) == pytest.approx(0.08e-3, rel=1e-9)
    assert float(unfused.moe - router_fused.moe) == pytest.approx(0.08e-3, rel=1e-9)
    copies = 4096 * 8  # balanced top-8 of the rank's 4096 tokens
    first_pair = _at_hbm_rate(4 * copies * 2 * 2048)
    assert float(router_fused.block - both_fused.block) == pytest.approx(first_pair * (1 / 0.42 - 1), rel=1e-9)
    assert unfused.expert == both_fused.expert and unfused.comm == both_fused.comm
    # DeepSeek-V3's sigmoid router, measured apart: 0.50 ms, a third of it forward
    kw = dict(tp=2, cp=1, ep=64, etp=1, mbs=1, rates=_RATES)
    sigmoid = mt.layer_times(DSV3, 4096, **kw).block - mt.layer_times(DSV3, 4096, **kw, router_fusion=True).block
    assert float(sigmoid) == pytest.approx(0.50e-3 / 3, rel=1e-9)


def _at_hbm_rate(bytes_moved: float) -> float:
    return bytes_moved / _RATES.hbm_bytes_per_s


_RATES = Rates.of(get_gpu("h100-80gb"), load_calibration())


def test_host_sync_idle_by_hand():
    # The dropless dispatcher's host wait for the token counts, once per MoE layer forward: the
    # GPU idles for the launches after it (20 us each) until it has work again. alltoall: the
    # wait comes after permutation 1 is queued, N k copies of 2h bytes read and written; 4096
    # tokens take 2 x 4096 x 8 x 2 x 2048 bytes, longer than a launch: no idle; 100 tokens
    # 6,553,600 bytes. allgather and flex (DeepEP's host wait for its receive counts): nothing
    # queued, one launch. Token drop padded to capacity (alltoall's drop_and_pad): the counts are
    # known, no wait; not padded, the dropless wait; allgather copies its counts to the host
    # either way (token_dispatcher.py, MoEAllGatherTokenDispatcher: local_map.sum(dim=0).cpu()).
    qwen = PRESETS["qwen3-30b-a3b"]
    rates = Rates.of(get_gpu("h100-80gb"), load_calibration())
    assert ep_time.host_sync_idle(qwen, 4096.0, rates) == 0.0
    assert 2 * 4096 * 8 * 2 * 2048 / rates.hbm_bytes_per_s > 20e-6
    assert ep_time.host_sync_idle(qwen, 100.0, rates) == pytest.approx(20e-6 - 6_553_600 / rates.hbm_bytes_per_s)
    assert ep_time.host_sync_idle(qwen, 4096.0, rates, "flex") == pytest.approx(20e-6)
    assert ep_time.host_sync_idle(qwen, 4096.0, rates, "allgather") == pytest.approx(20e-6)
    padded = mm.RoutedTokens(routing="capacity", capacity_factor=1.0)
    unpadded = mm.RoutedTokens(routing="capacity", capacity_factor=1.0, pad_to_capacity=False)
    assert ep_time.host_sync_idle(qwen, 100.0, rates, "alltoall", padded) == 0.0
    assert ep_time.host_sync_idle(qwen, 100.0, rates, "alltoall", unpadded) == ep_time.host_sync_idle(qwen, 100.0, rates)
    assert ep_time.host_sync_idle(qwen, 4096.0, rates, "allgather", padded) == pytest.approx(20e-6)
    assert ep_time.host_sync_idle(qwen, 4096.0, rates, "flex", unpadded) == pytest.approx(20e-6)


def test_capacity_routing_paces_the_expert_work_as_memory_counts_it():
    # layer_times takes the copies from memory.expert_token_copies: padded to factor 1.5 the
    # experts run 1.5 x the balanced copies; unpadded at 1.5 nothing drops (min(1.5, 1) = 1),
    # at 0.5 half drop, the same as padded at 0.5
    qwen = PRESETS["qwen3-30b-a3b"]
    rates = Rates.of(get_gpu("h100-80gb"), load_calibration())

    def expert(**routing):
        given = mm.RoutedTokens(routing="capacity", **routing) if routing else mm.RoutedTokens()
        return mt.layer_times(qwen, 4096, tp=1, cp=1, ep=8, etp=1, mbs=1, rates=rates, routing=given).expert

    balanced = expert()
    assert expert(capacity_factor=1.5, pad_to_capacity=False) == balanced
    assert expert(capacity_factor=1.5) > balanced
    assert expert(capacity_factor=0.5, pad_to_capacity=False) == expert(capacity_factor=0.5) < balanced


def test_host_sync_idle_in_the_step(monkeypatch):
    # PP 1: the step is m microbatches of every layer, so the waits add m x 48 MoE layers x one
    # launch with the flex dispatcher (forward only: none in the backward)
    from advisor.moe.stage import MoEOptions
    from advisor.options import TrainingOptions

    qwen, gpu = PRESETS["qwen3-30b-a3b"], get_gpu("h100-80gb")
    columns = {"tp": 1, "cp": 1, "pp": 1, "ep": 16, "etp": 1, "dp": 16, "mbs": 1, "vpp": 1}
    options = MoEOptions(dispatcher="flex", training=TrainingOptions())
    first = st.stage_bytes(qwen, 4096, options, num_microbatches=16, stage=0, **columns)

    def step():
        return mt.step_times(qwen, 4096, 256, columns, "none", gpu=gpu, options=options, first_stage=first)

    with_waits = step()
    monkeypatch.setattr(ep_time, "HOST_LAUNCH_S", 0.0)
    without = step()
    assert with_waits["step_time_s"] - without["step_time_s"] == pytest.approx(16 * 48 * 20e-6)
    assert with_waits["ep_comm_s"] == pytest.approx(without["ep_comm_s"])


def test_te_cross_entropy_keeps_the_bf16_logits_on_the_last_stage():
    # Qwen3-30B-A3B, s 4096, b 2, PP 2 (TP 1, CP 1): Eq. 14's FP32 logits, 4 s b v with v = 151,936,
    # become Transformer Engine's BF16 logits, 2 s b v, on the last stage only
    from advisor.moe.stage import MoEOptions
    from advisor.options import TrainingOptions

    qwen = PRESETS["qwen3-30b-a3b"]
    columns = {"tp": 1, "cp": 1, "pp": 2, "ep": 8, "etp": 1, "dp": 8, "mbs": 2}

    def stages(fusion):
        options = MoEOptions(training=TrainingOptions().with_(cross_entropy_fusion=fusion))
        return [st.stage_bytes(qwen, 4096, options, num_microbatches=32, stage=s, **columns) for s in (0, 1)]

    (first, last), (first_te, last_te) = stages("none"), stages("te")
    assert first.output_activations == first_te.output_activations == 0.0
    assert last.output_activations - last_te.output_activations == pytest.approx(2 * 4096 * 2 * 151936)


def test_mla_up_projections_by_hand():
    # DeepSeek-V3 at TP 2, 4096 tokens: Q up [4096, 1536] x [1536, 128 (128 + 64) / 2], KV up
    # [4096, 512] x [512, 128 (128 + 128) / 2], two GEMM kernels; the fused latent norms read and
    # write 1536 + 512, RoPE reads and writes the 128 heads' and the shared key's 64 rotary dims
    rates = Rates.of(get_gpu("h100-80gb"), load_calibration())
    gemms = 2 * 4096 * (1536 * 128 * 192 + 512 * 128 * 256) / 2 / rates.gemm_flops_per_s + 2 * rates.gemm_latency_s
    elementwise = 2 * 4096 * (2 * 129 * 64 + 2 * (1536 + 512)) / 2 / rates.hbm_bytes_per_s
    assert mt.mla_up_time(DSV3, 4096.0, 2, rates, rates) == pytest.approx(gemms + elementwise)
    assert mt.mla_up_time(MIXTRAL, 4096.0, 2, rates, rates) == 0


def test_selective_recomputation_runs_each_module_once_more_by_hand():
    # megatron-core's Transformer Engine specs: the input norm is a module of its own only with
    # MLA, the pre-MLP norm only in MoE layers; mlp recomputes dense layers' MLPs only
    rates = Rates.of(get_gpu("h100-80gb"), load_calibration())
    qwen = PRESETS["qwen3-30b-a3b"]
    for spec, input_norms in ((DSV3, 1), (qwen, 0)):
        layer = mt.layer_times(spec, 4096, tp=2, cp=1, ep=8, etp=1, mbs=1, rates=rates)
        # one RMSNorm: read and write h of 4096 tokens over TP 2
        assert layer.norm == pytest.approx(2 * 2 * spec.hidden_size * 4096 / 2 / rates.hbm_bytes_per_s)
        by_module = {m: mt.recomputed_forward(spec, layer, frozenset({m})) for m in
                     ("core_attn", "layernorm", "mla_up_proj", "mlp", "moe_act", "shared_experts", "moe")}
        assert by_module["core_attn"] == (layer.core, layer.core, 0)
        assert by_module["layernorm"] == pytest.approx((input_norms * layer.norm, (input_norms + 1) * layer.norm, 0))
        assert by_module["mla_up_proj"] == (layer.mla_up, layer.mla_up, 0)
        assert by_module["mlp"] == (layer.dense_mlp, 0, 0)
        assert by_module["moe_act"] == (0, 0, layer.moe_act)
        assert by_module["shared_experts"] == (0, 0, layer.shared)
        assert by_module["moe"] == (0, 0, 0)  # the whole block: _moe_layer_paces
        everything = mt.recomputed_forward(spec, layer, frozenset(by_module))
        assert everything == pytest.approx(tuple(sum(v[i] for v in by_module.values()) for i in range(3)))
    # the parts that are priced again sit inside the layer they are recomputed from
    layer = mt.layer_times(DSV3, 4096, tp=2, cp=1, ep=8, etp=1, mbs=1, rates=rates)
    assert layer.moe_act + layer.shared < layer.expert < layer.block
    assert layer.core + layer.mla_up + 2 * layer.norm < layer.moe - layer.block - layer.comm


def test_selective_step_adds_each_layers_recomputed_forward():
    # DeepSeek-V3 on one stage (memory aside): --recompute-modules mla_up_proj mlp against
    # mla_up_proj alone costs the three dense layers' MLP forward once more per microbatch, its
    # sequence-parallel gather and scatter with it (LayerTimes.dense_mlp_tp)
    from advisor.moe.stage import MoEOptions
    from advisor.options import TrainingOptions

    gpu = get_gpu("h100-80gb")
    columns = {"tp": 2, "cp": 1, "pp": 1, "ep": 8, "etp": 1, "dp": 4, "mbs": 1, "vpp": 1}
    m = 64 / 4

    def step(modules):
        options = MoEOptions(training=TrainingOptions(), modules=frozenset(modules))
        first = st.stage_bytes(DSV3, 4096, options, num_microbatches=m, stage=0, recompute="selective", **columns)
        return mt.step_times(DSV3, 4096, 64, columns, "selective", gpu=gpu, options=options, first_stage=first)

    rates = Rates.of(gpu, load_calibration())
    layer = mt.layer_times(DSV3, 4096, tp=2, cp=1, ep=8, etp=1, mbs=1, rates=rates)
    with_mlp, without = step({"mla_up_proj", "mlp"}), step({"mla_up_proj"})
    assert layer.dense_mlp_tp > 0
    assert with_mlp["step_time_s"] - without["step_time_s"] == pytest.approx(m * 3 * (layer.dense_mlp
                                                                                     + layer.dense_mlp_tp))


def test_core_attention_as_the_dense_model_prices_it_by_hand():
    # Mixtral at seq 4096, MBS 2, TP 2, CP 4: causal attention executes 2 x 2 b s^2 a d / 2 over
    # t c forward, 2.5 times that backward (FlashAttention-2); one call's fixed cost per CP ring
    # step, forward and backward together, split as the FLOPs are
    rates = Rates.of(get_gpu("h100-80gb"), load_calibration())
    flops = 2 * 2 * 2 * 4096 ** 2 * 32 * 128 / 2 / (2 * 4)
    forward = flops / rates.attention_flops_per_s + 4 * rates.attention_latency_s / 3.5
    backward = 2.5 * flops / rates.attention_flops_per_s + 2.5 * 4 * rates.attention_latency_s / 3.5
    layer = mt.layer_times(MIXTRAL, 4096, tp=2, cp=4, ep=8, etp=1, mbs=2, rates=rates)
    assert layer.core == pytest.approx(forward)
    assert layer.core_backward_extra == pytest.approx(backward - 2 * forward)
    # the same numbers as the dense model's own term for a layer of these heads
    from advisor.throughput import terms
    assert (forward, backward) == pytest.approx(terms.attention_time(MIXTRAL, 4096, 2, 2, 4, rates))


def test_the_last_stage_holds_a_remainder_of_p_minus_1():
    # split_layers puts a remainder r <= p - 2 on the stages just before the last (the last is then
    # among the smallest), but r = p - 1 on every stage after the first, the last included
    assert st.split_layers(61, 2) == [30, 31] and st.split_layers(47, 4) == [11, 12, 12, 12]
    assert st.split_layers(61, 4) == [15, 15, 16, 15]
    pp = np.array([1, 2, 4, 4, 8, 16])
    layers = np.array([61, 61, 61, 47, 47, 61])
    most, last = st.longest_and_last(layers, pp)
    assert list(most) == [61, 31, 16, 12, 6, 4] and list(last) == [61, 31, 15, 12, 6, 3]
    for n, p, m, la in zip(layers, pp, most, last):
        assert (m, la) == (max(st.split_layers(n, p)), st.split_layers(n, p)[-1])


def test_the_last_stage_with_the_extra_layer_paces_the_step_by_hand():
    """Mixtral with 31 layers at PP 2 splits 15 | 16: the last stage, 16 MoE layers and the LM
    head, is the slowest, so the steady state's compute and exposed all-to-all are m x (16 layers
    + the head) (not 15 layers + the head, the split's last stage taken for its smallest)."""

    from advisor.moe.space import estimate_layout
    from advisor.parallel import Workload
    from advisor.throughput import terms

    spec, gpu = replace(MIXTRAL, num_layers=31), get_gpu("h100-80gb")
    row = estimate_layout(spec, Workload(seq_len=4096, global_batch_size=256), tp=1, cp=1, pp=2, ep=8, etp=1, dp=16,
                          mbs=1, gpu=gpu, memory_gib=80.0)
    assert row["layers_per_stage"] == [15, 16]
    rates = Rates.of(gpu, load_calibration())
    times = mt.layer_times(spec, 4096, tp=1, cp=1, ep=8, etp=1, mbs=1, rates=rates)
    layer = 3 * (times.moe - times.comm) + times.core_backward_extra + 2 * times.comm
    head = sum(terms.lm_head_time(spec, 4096.0, 1, spec.vocab_size, rates))
    parts, m = row["time_parts"], 256 / 16
    assert parts["compute_s"] + parts["ep_comm_s"] == pytest.approx(m * (16 * layer + head), rel=1e-9)


QWEN47 = PRESETS["qwen3-30b-a3b"]


@pytest.mark.parametrize("case", [
    # L mod PP = PP - 1: the remainder's last layer on the last stage
    ("deepseek-v3", 61, 1024, "b200-180gb", 1024, dict(pp=2, tp=8, recompute="full")),
    ("qwen3-30b-a3b", 47, 64, "h100-80gb", 512, dict(pp=2)),
    ("qwen3-30b-a3b", 47, 64, "h100-80gb", 512, dict(pp=4)),
    ("qwen3-30b-a3b", 47, 64, "h100-80gb", 512, dict(pp=8)),
    # the remainder before the last stage, and none
    ("deepseek-v3", 61, 2048, "h100-80gb", 8192, dict(pp=16)),
    ("deepseek-v3", 61, 2048, "h100-80gb", 8192, dict(pp=4)),
    ("qwen3-30b-a3b", 48, 64, "h100-80gb", 512, dict(pp=4)),
])
def test_a_sweep_row_is_priced_as_its_estimate(case):
    """A sweep row's step time is its layout's estimate's, under the default split and under the
    row's own layers_per_stage (what its Megatron flags say), whatever the remainder L mod PP."""

    from advisor.moe.space import estimate_layout, sweep
    from advisor.parallel import Pinned, Workload

    name, layers, gpus, gpu_name, gbs, pins = case
    spec, gpu = replace(PRESETS[name], num_layers=layers, mtp_num_layers=int(name == "deepseek-v3")), get_gpu(gpu_name)
    recompute = pins.pop("recompute", None)
    workload = Workload(seq_len=4096, global_batch_size=gbs)
    result = sweep(spec, workload, gpus, gpu.memory_gib, gpu=gpu, recompute=recompute, pinned=Pinned(**pins))
    rows = result.rows(include_oom=True, limit=4)
    assert rows
    for row in rows:
        layout = {k: row[k] for k in ("tp", "cp", "pp", "ep", "etp", "dp", "mbs", "vpp", "recompute")}
        assert row["layers_per_stage"] == st.split_layers(layers, row["pp"])
        for split in (None, tuple(row["layers_per_stage"])):
            one = estimate_layout(spec, workload, **layout, gpu=gpu, memory_gib=gpu.memory_gib,
                                  layers_per_stage=split)
            assert one["step_time_s"] == pytest.approx(row["step_time_s"], rel=1e-9, abs=0), (layout, split)
