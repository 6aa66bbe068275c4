"""MoE stage memory (advisor.moe.stage), time terms (advisor.moe.time) and Megatron's FLOPs
count for MoE, against hand-derived values."""

import numpy as np
import pytest

from advisor.hardware import get_gpu
from advisor.moe import memory as mm
from advisor.moe import stage as st
from advisor.moe import time as mt
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
    tokens, copies = 4096, 4096 * 2
    assert b.transient[0] == pytest.approx(tokens * 2 * 2 * 4096 + copies * 2 * 2 * 14336 + 4 * (32 * 2**20 + 256))


def test_deepseek_dense_layers_and_interleaving():
    b = st.stage_bytes(DSV3, 4096, st.MoEOptions(), tp=1, cp=1, pp=16, ep=64, etp=1, dp=64, mbs=1,
                       num_microbatches=128, stage=np.array([0, 1]), vpp=1)
    assert list(b.dense_layers) == [3, 0] and b.expert_states[0] == 0
    # interleaved: stage 0 of PP 4 with v = 2 holds 2(p - 1) + (v - 1) p + 1 = 11 chunk passes, 5.5 stages
    c = st.stage_bytes(MIXTRAL, 4096, st.MoEOptions(), tp=1, cp=1, pp=4, ep=8, etp=1, dp=16, mbs=1,
                       num_microbatches=16, stage=np.array([0]), vpp=2)
    assert c.in_flight[0] == 5.5


def test_grouped_gemm_and_all_to_all_by_hand():
    gpu = get_gpu("h800-80gb")
    rates = Rates.of(gpu, load_calibration())
    assert mt.grouped_gemm_efficiency(256) == 0.5
    # EP 16 spanning two 8-GPU nodes: 7/16 of the bytes on NVLink, 8/16 on the network
    size = 1000 * 2 * 7168
    expected = max(size * 7 / 16 / rates.nvlink_bytes_per_s, size * 8 / 16 / rates.network_bytes_per_s)
    assert mt.all_to_all_time(DSV3, 1000, 16, 1, rates) == pytest.approx(expected + rates.collective_latency_s)
    assert mt.all_to_all_time(DSV3, 1000, 1, 1, rates) == 0
    forward, backward = mt.expert_gemm_time(MIXTRAL, 4096.0, 8, 1, rates)
    flops = 2 * 4096 * 3 * 4096 * 14336
    assert forward == pytest.approx(flops / (rates.gemm_flops_per_s * 4096 / (4096 + 256)) + 2 * rates.gemm_latency_s)
    assert backward == 2 * forward


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
