"""Multi-latent attention's sequence-parallel collectives (``time.mla_attention_tp_time``), by hand.

megatron-core's Transformer Engine spec builds MLA's down projections as duplicated ``TELinear``s
(no collective), so the all-gathers come at the up projections ([tokens, q_lora_rank] and
[tokens, kv_lora_rank]) plus ``gather_from_sequence_parallel_region(k_pos_emb)`` ([tokens, d_rope]):
three gathers forward, each paying its own latency, where a GQA attention block gathers its
[tokens, h] input once; the output projection's reduce-scatter is [tokens, h] as any attention's
(``multi_latent_attention.py``, core_v0.15.2 and core_v0.19.0). --recompute-modules mla_up_proj
reruns the up projections, and their two gathers, in the backward."""

from __future__ import annotations

from dataclasses import replace

import pytest

from advisor.hardware import get_gpu
from advisor.moe import time as mt
from advisor.moe.spec import PRESETS
from advisor.throughput import levers, terms
from advisor.throughput.calibration import load_calibration
from advisor.throughput.terms import Rates

DSV3 = PRESETS["deepseek-v3"]
GPU = get_gpu("h100-80gb")
RATES = Rates.of(GPU, load_calibration())
KW = dict(tp=2, cp=1, ep=8, etp=1, mbs=1, rates=RATES)

# DeepSeek-V3 at TP 2, seq 4096, MBS 1 on the H100's calibrated rates: NVLink 450e9 B/s one way
# (900 GB/s both ways, halved: the vendor figure) x the fitted network efficiency (advisor/calibration.json,
# 0.9962) = 448.29e9 B/s, 20 us a ring step. A TP-2 ring all-gather or reduce-scatter of [4096, w] sends
# half of it, one step: 0.5 x 4096 x w x bytes / (450e9 x NET) + 20e-6.
#   q latents   w 1536, BF16: 0.5 x 4096 x 1536 x 2 = 6,291,456 B -> 14.03 us + 20 = 34.03 us
#   kv latents  w  512, BF16: 0.5 x 4096 x  512 x 2 = 2,097,152 B ->  4.68 us + 20 = 24.68 us
#   rotary key  w   64, BF16: 0.5 x 4096 x   64 x 2 =   262,144 B ->  0.58 us + 20 = 20.58 us
#   [s, h]      w 7168, BF16: 0.5 x 4096 x 7168 x 2 = 29,360,128 B -> 65.49 us + 20 = 85.49 us
NET = load_calibration().network_efficiency
LINK = 450e9 * NET  # B/s one way, as Rates.of prices NVLink


def _ring_us(sent_bytes: float) -> float:
    return (sent_bytes / LINK + 20e-6) * 1e6


Q_US, KV_US, ROPE_US, H_US = (_ring_us(b) for b in (6_291_456, 2_097_152, 262_144, 29_360_128))
FORWARD_GATHERS_US = Q_US + KV_US + ROPE_US  # 79.30 us: three gathers, against one 85.49 us [s, h] gather


def test_the_hand_figures_are_the_rates():
    assert GPU.nvlink_bytes_per_s == 450e9  # the H100 preset's 900 GB/s both ways, halved
    assert RATES.nvlink_bytes_per_s == pytest.approx(450e9 * NET) and RATES.collective_latency_s == pytest.approx(20e-6)
    assert LINK == pytest.approx(448.29e9, rel=1e-4)  # 450e9 x 0.9962
    for width, us in ((1536, 34.034), (512, 24.678), (64, 20.585), (7168, 85.494)):
        assert (0.5 * 4096 * width * 2 / (450e9 * NET) + 20e-6) * 1e6 == pytest.approx(us, abs=1e-3)
    assert (Q_US, KV_US, ROPE_US, H_US) == pytest.approx((34.034, 24.678, 20.585, 85.494), abs=1e-3)


def test_deepseek_v3_at_tp2_three_gathers_forward_and_the_same_scatter_by_hand():
    layer = mt.layer_times(DSV3, 4096, **KW)
    assert FORWARD_GATHERS_US == pytest.approx(79.30, abs=0.01)
    # forward: the three gathers and the output projection's [s, h] reduce-scatter: 164.79 us (was 2 x 85.49)
    assert layer.attention_tp * 1e6 == pytest.approx(FORWARD_GATHERS_US + H_US, abs=1e-3)
    # backward, mirrored: the output gradient's [s, h] gather, the up projections' and the rotary
    # key's input-gradient reduce-scatters at the same widths
    assert layer.attention_tp_backward * 1e6 == pytest.approx(H_US + Q_US + KV_US + ROPE_US, abs=1e-3)
    # what mla_up_proj gathers again: the up projections' two (the rotary key's runs before the checkpoint)
    assert layer.mla_up_tp * 1e6 == pytest.approx(Q_US + KV_US, abs=1e-3)  # 58.71 us
    # the MLP blocks keep one [s, h] gather and one scatter each way: 170.99 us
    for block in (layer.dense_mlp_tp, layer.dense_mlp_tp_backward, layer.shared_tp, layer.shared_tp_backward):
        assert block * 1e6 == pytest.approx(2 * H_US, abs=1e-3)


def test_fp8_gathers_the_latents_in_fp8_and_the_rotary_key_in_bf16_by_hand():
    """Current scaling (tensorwise, 1 byte an element, no scale bytes): Transformer Engine
    quantises a column-parallel linear's input before its gather (``levers.fp8_tp_bytes``), so the
    up projections gather FP8: q 0.5 x 4096 x 1536 / 448.29e9 = 7.02 us + 20 = 27.02 us, kv 2.34 +
    20 = 22.34 us; the rotary key is megatron's own gather of a BF16 tensor, 20.58 us; the
    scatter BF16, 85.49 us: 155.43 us forward. Backward: the output gradient's gather in FP8
    (tensorwise: row-wise data only), 0.5 x 4096 x 7168 / 448.29e9 = 32.75 us + 20 = 52.75 us, the
    three dgrad scatters in BF16, 34.0 + 24.7 + 20.6: 132.04 us (448.29e9 B/s: 450e9 x NET)."""
    assert levers.fp8_tp_bytes("tensorwise").input_gather == 1.0
    fp8 = mt.layer_times(DSV3, 4096, **KW, fp8=levers.fp8_gemms(RATES, GPU, "tensorwise"))
    q8, kv8, h8 = (_ring_us(b) for b in (3_145_728, 1_048_576, 14_680_064))  # 1 byte an element
    assert (q8, kv8, h8) == pytest.approx((27.017, 22.339, 52.747), abs=1e-3)
    assert (q8 + kv8 + ROPE_US + H_US, h8 + Q_US + KV_US + ROPE_US) == pytest.approx((155.43, 132.04), abs=0.01)
    assert fp8.attention_tp * 1e6 == pytest.approx(q8 + kv8 + ROPE_US + H_US, abs=1e-3)
    assert fp8.attention_tp_backward * 1e6 == pytest.approx(h8 + Q_US + KV_US + ROPE_US, abs=1e-3)
    assert fp8.mla_up_tp * 1e6 == pytest.approx(q8 + kv8, abs=1e-3)


def test_without_q_lora_rank_q_gathers_the_layers_input_by_hand():
    # DeepSeek-V2-Lite's shape: no q_lora_rank, Q's one column-parallel projection (linear_q_proj)
    # gathers the [s, h] input; kv_lora_rank and the rotary key as before: 85.49 + 24.68 + 20.58
    # = 130.76 us of gathers forward, plus the 85.49 us scatter
    lite = replace(DSV3, mla=replace(DSV3.mla, q_lora_rank=None))
    layer = mt.layer_times(lite, 4096, **KW)
    assert layer.attention_tp * 1e6 == pytest.approx(H_US + KV_US + ROPE_US + H_US, abs=1e-3)
    assert layer.mla_up_tp * 1e6 == pytest.approx(H_US + KV_US, abs=1e-3)


@pytest.mark.parametrize("recompute, modules, forwards, regathers", [
    ("none", set(), 1, 0), ("selective", {"core_attn", "layernorm"}, 1, 0), ("selective", {"mla_up_proj"}, 1, 1),
    ("selective", {"mla_up_proj", "core_attn"}, 1, 1), ("full", set(), 2, 0), ("full", {"mla_up_proj"}, 2, 0)])
def test_mla_up_proj_gathers_the_latents_once_more_by_hand(recompute, modules, forwards, regathers):
    """Attention's collectives per microbatch (``tp_comm``): once per forward that runs attention
    and once backward, plus the up projections' two gathers once more with mla_up_proj
    (CheckpointWithoutOutput reruns ``qkv_up_proj_and_rope_apply`` in the backward): 164.79 +
    164.79 + 58.71 = 388.29 us (329.58 us without it; 341.97 us before, one [s, h] gather standing
    for the three and no re-gather). Full recomputation reruns the whole forward, and Megatron
    reads --recompute-modules with selective only."""
    layer = mt.layer_times(DSV3, 4096, **KW)
    attention = mt.tp_comm(layer, recompute, frozenset(modules)).attention
    block = FORWARD_GATHERS_US + H_US
    assert attention * 1e6 == pytest.approx(forwards * block + block + regathers * (Q_US + KV_US), abs=0.005)
    if regathers:
        assert attention * 1e6 == pytest.approx(388.29, abs=0.01)


def test_mla_up_proj_regathers_land_beside_the_backward_under_the_ep_overlap():
    # --overlap-moe-expert-parallel-comm: attention's forward collectives in its forward node, the
    # backward's and any recomputed forward's (the re-gathers) in its backward node
    from advisor.moe.stage import MoEOptions
    from advisor.options import TrainingOptions

    layer = mt.layer_times(DSV3, 4096, **KW, dispatcher="flex")
    b = {"tp": 2, "cp": 1, "ep": 8, "etp": 1, "mbs": 1}
    paces = {}
    for modules in (frozenset(), frozenset({"mla_up_proj"})):
        options = MoEOptions(training=TrainingOptions(), dispatcher="flex", a2a_overlap=True, modules=modules)
        paces[modules] = mt._moe_layer_paces(DSV3, 4096, b, "selective", options, GPU, RATES, layer)
    without, with_ = paces[frozenset()], paces[frozenset({"mla_up_proj"})]
    # the plain pace adds the up projections' recomputed compute and the re-gathers, in series; the
    # steady state the same: attention's backward node (twice its ~3 ms forward) outlasts the combine
    # beside it (a quarter of the layer's ~0.45 ms all-to-all), so nothing of them is hidden
    again = layer.mla_up + (Q_US + KV_US) * 1e-6
    assert with_[0] - without[0] == pytest.approx(again, abs=5e-9)
    assert with_[1] - without[1] == pytest.approx(again, abs=5e-9)


@pytest.mark.parametrize("name", ["qwen3-235b-a22b", "mixtral-8x7b"])
def test_gqa_attention_keeps_one_gather_and_one_scatter(name):
    spec = PRESETS[name]
    layer = mt.layer_times(spec, 4096, **KW)
    forward, backward = terms.tp_block_time(spec, 4096.0, 2, RATES)
    assert (layer.attention_tp, layer.attention_tp_backward, layer.mla_up_tp) == (forward, backward, 0.0)
    assert mt.tp_comm(layer, "selective", frozenset({"mla_up_proj"})) == mt.tp_comm(layer, "selective", frozenset())


def test_tp1_has_no_collective():
    layer = mt.layer_times(DSV3, 4096, **{**KW, "tp": 1})
    assert (layer.attention_tp, layer.attention_tp_backward, layer.mla_up_tp) == (0.0, 0.0, 0.0)
