"""The shared experts' sequence-parallel all-gather and reduce-scatter (``time.shared_expert_tp_time``):
megatron-core's SharedExpertMLP is an MLP over the TP group (``shared_experts.py``), so at TP > 1 it
gathers its input and reduce-scatters its output as a dense MLP does, forward and backward."""

from __future__ import annotations

import pytest

from advisor.hardware import get_gpu
from advisor.moe import time as mt
from advisor.moe.spec import PRESETS
from advisor.moe.stage import MoEOptions
from advisor.options import TrainingOptions
from advisor.throughput import levers
from advisor.throughput.calibration import load_calibration
from advisor.throughput.terms import Rates

DSV3 = PRESETS["deepseek-v3"]
GPU = get_gpu("h100-80gb")
RATES = Rates.of(GPU, load_calibration())
KW = dict(tp=2, cp=1, ep=8, etp=1, mbs=1, rates=RATES)
NET = load_calibration().network_efficiency  # fitted (advisor/calibration.json): 0.9962


def _collective(element_bytes: float, width: int = 7168) -> float:
    # one ring all-gather or reduce-scatter of DeepSeek-V3's [s b, h] activation over TP 2 in NVLink:
    # s b h x bytes = 4096 x 1 x 7168 x 2 = 58,720,256 bytes in BF16; a rank sends (n - 1)/n = 1/2 of it
    # at the calibrated NVLink rate (450e9 B/s on the H100: 900 GB/s both ways, halved, x the network
    # efficiency 0.9962 = 448.29e9 B/s), plus one latency a step (1 step, 20 us):
    # 29,360,128 / 448.29e9 + 20e-6 = 85.5 us in BF16
    return 0.5 * 4096 * 1 * width * element_bytes / RATES.nvlink_bytes_per_s + RATES.collective_latency_s


def _mla_block() -> float:
    # MLA's attention block, either way in BF16 (tests/test_mla_tp_time.py): the up projections'
    # latents (q_lora_rank 1536: 34.0 us, kv_lora_rank 512: 24.7 us), the rotary key (d_rope 64:
    # 20.6 us) and the output projection's [s b, h] (85.5 us): 164.8 us
    return _collective(2, 1536) + _collective(2, 512) + _collective(2, 64) + _collective(2)


def test_deepseek_v3_at_tp2_pays_one_gather_and_one_scatter_each_way_by_hand():
    assert GPU.nvlink_bytes_per_s == 450e9  # the H100 preset's 900 GB/s both ways, halved
    assert RATES.nvlink_bytes_per_s == pytest.approx(450e9 * NET) and RATES.collective_latency_s == pytest.approx(20e-6)
    layer = mt.layer_times(DSV3, 4096, **KW)
    bf16 = 2 * _collective(2)  # FC1's input gather + FC2's output reduce-scatter
    assert bf16 == pytest.approx(2 * (29_360_128 / (450e9 * NET) + 20e-6))
    assert bf16 == pytest.approx(170.99e-6, abs=0.01e-6)  # 2 x (65.49 + 20) us
    assert layer.shared_tp == pytest.approx(bf16)
    assert layer.shared_tp_backward == pytest.approx(bf16)  # FC2's output-gradient gather, FC1's dgrad scatter
    # their own field, not in the MoE layer's compute nor the shared experts' (which selective
    # recomputation reruns): the MoE layer's TP collectives (tp_comm) are attention's (MLA's, four
    # collectives each way: 164.8 us) and these, each block's once forward and once backward
    mla = _mla_block()
    assert mla == pytest.approx(164.79e-6, abs=0.01e-6)  # 34.03 + 24.68 + 20.58 + 85.49 us
    assert layer.attention_tp == pytest.approx(mla) and layer.attention_tp_backward == pytest.approx(mla)
    tp = mt.tp_comm(layer, "none", frozenset())
    assert tp.attention + tp.shared == pytest.approx(2 * mla + 2 * bf16)  # the MoE layer's
    without = layer._replace(shared_tp=0.0, shared_tp_backward=0.0)
    assert mt.tp_comm(without, "none", frozenset()) == (tp.attention, tp.dense_mlp, 0.0)
    assert tp.attention + tp.dense_mlp == pytest.approx(2 * mla + 2 * bf16)  # a dense layer: attention's and its MLP's


def test_fp8_gathers_as_the_dense_mlp_but_bf16_with_the_shared_expert_overlap():
    fp8 = levers.fp8_gemms(RATES, GPU, "tensorwise")
    sizes = levers.fp8_tp_bytes("tensorwise")
    layer = mt.layer_times(DSV3, 4096, **KW, fp8=fp8)
    assert layer.shared_tp == pytest.approx(_collective(sizes.input_gather) + _collective(sizes.output_scatter))
    assert layer.shared_tp_backward == pytest.approx(_collective(sizes.grad_gather) + _collective(sizes.dgrad_scatter))
    # --moe-shared-expert-overlap: pre_forward_comm gathers the BF16 input itself (the linears lose their parallel mode)
    overlapped = mt.layer_times(DSV3, 4096, **KW, fp8=fp8, shared_expert_overlap=True)
    assert overlapped.shared_tp == pytest.approx(2 * _collective(2))


@pytest.mark.parametrize("name", ["mixtral-8x7b", "qwen3-30b-a3b"])
def test_no_shared_experts_or_tp1_pays_nothing(name):
    assert mt.layer_times(PRESETS[name], 4096, **KW).shared_tp == 0.0
    layer = mt.layer_times(DSV3, 4096, **{**KW, "tp": 1})
    assert layer.shared_tp == 0.0 and layer.shared_tp_backward == 0.0


@pytest.mark.parametrize("recompute, modules, forwards", [("selective", set(), 1), ("selective", {"shared_experts"}, 2),
                                                          ("selective", {"moe"}, 2), ("full", set(), 2),
                                                          ("selective", {"moe", "shared_experts"}, 3)])
def test_priced_as_communication_once_per_forward_and_once_backward(recompute, modules, forwards):
    # compute is priced forward + twice backward; these collectives run once per forward that runs
    # the shared experts (again where recomputed) and once in the backward. With moe and
    # shared_experts both, the shared experts' checkpoint is nested in the block's
    # (moe_layer.py: custom_forward calls shared_experts_compute, which checkpoints them): the
    # block's recomputation runs their checkpoint's forward, and its backward runs them once more
    # (tensor_parallel/random.py CheckpointFunction), three forwards: DeepSeek-V3 at TP 2,
    # s 4096, 3 x 171.0 us forward + 171.0 us backward = 684 us a layer (2 x 171.0 before: one
    # forward's collectives missing, where the compute counted three: block + recomputed_forward)
    layer = mt.layer_times(DSV3, 4096, **KW)
    without = layer._replace(shared_tp=0.0, shared_tp_backward=0.0)
    options = MoEOptions(training=TrainingOptions(), modules=frozenset(modules))
    b = {"tp": 2, "cp": 1, "ep": 8, "etp": 1, "mbs": 1}
    paces = [mt._moe_layer_paces(DSV3, 4096, b, recompute, options, GPU, RATES, x) for x in (layer, without)]
    bf16 = 2 * _collective(2)
    assert paces[0][0] - paces[1][0] == pytest.approx(forwards * bf16 + bf16)
    assert paces[0][2] == pytest.approx(paces[1][2])  # not EP communication
    # Megatron reads --recompute-modules with selective only: full runs each forward twice
    assert mt.tp_comm(layer, "full", frozenset({"moe", "shared_experts", "mlp"})) == mt.tp_comm(layer, "full", frozenset())
    if forwards == 3:  # the compute, as the collectives: the shared experts' forward three times
        assert paces[0][0] - paces[1][0] == pytest.approx(4 * 2 * (29_360_128 / (450e9 * NET) + 20e-6))  # 683.95 us
        x = layer.shared  # forward, backward at twice it, block's recomputation, their own recomputation
        bare = without._replace(shared=0.0, block=layer.block - x, expert=layer.expert - x, moe=layer.moe - x)
        assert paces[1][0] - mt._moe_layer_paces(DSV3, 4096, b, recompute, options, GPU, RATES, bare)[0] \
            == pytest.approx((3 + 2) * x)


def test_with_the_ep_overlap_they_stay_in_series_in_the_mlp_node():
    # --overlap-moe-expert-parallel-comm: shared_experts_compute runs in the MoE node on the compute
    # stream (core_v0.15.2 models/gpt/fine_grained_callables.py, submodule_moe_forward), so its TP
    # collectives pair with nothing: forward + backward added to the steady state, none of it EP
    layer = mt.layer_times(DSV3, 4096, **KW, dispatcher="flex")
    without = layer._replace(shared_tp=0.0, shared_tp_backward=0.0)
    options = MoEOptions(training=TrainingOptions(), dispatcher="flex", a2a_overlap=True)
    b = {"tp": 2, "cp": 1, "ep": 8, "etp": 1, "mbs": 1}
    paces = [mt._moe_layer_paces(DSV3, 4096, b, "selective", options, GPU, RATES, x) for x in (layer, without)]
    assert paces[0][1] - paces[1][1] == pytest.approx(2 * 2 * _collective(2))
    assert paces[0][2] == pytest.approx(paces[1][2])


def test_attentions_tp_collectives_are_communication_backward_too_by_hand():
    """The attention block's sequence-parallel gathers and scatters (``terms.tp_block_time``) run
    once backward, as many collectives as forward (the output projection's gradient gather, QKV's
    dgrad scatter), not twice the forward as compute is priced. Qwen3-235B-A22B (no shared experts),
    TP 2, s 4096, b 1, BF16: [4096, 4096] x 2 bytes = 33,554,432 bytes a collective, 16,777,216 sent
    at 450e9 x 0.9962 (the network efficiency) = 448.29e9 B/s plus 20 us = 57.42 us; two forward, two
    backward: the MoE layer's pace drops by two collectives (114.85 us) against pricing its backward
    at twice its forward; a dense layer, both halves, by four (229.70 us)."""
    qwen = PRESETS["qwen3-235b-a22b"]
    one = 0.5 * 4096 * 4096 * 2 / RATES.nvlink_bytes_per_s + RATES.collective_latency_s
    assert one == pytest.approx(16_777_216 / (450e9 * NET) + 20e-6)
    assert one == pytest.approx(57.42e-6, abs=0.01e-6)  # 37.42 + 20 us
    layer = mt.layer_times(qwen, 4096, **KW)
    for forward, backward in ((layer.attention_tp, layer.attention_tp_backward),
                              (layer.dense_mlp_tp, layer.dense_mlp_tp_backward)):
        assert forward == pytest.approx(2 * one) and backward == pytest.approx(2 * one)
    # the backward at twice the forward, as the compute is priced
    old = layer._replace(attention_tp_backward=2 * layer.attention_tp, dense_mlp_tp_backward=2 * layer.dense_mlp_tp)
    options = MoEOptions(training=TrainingOptions())
    b = {"tp": 2, "cp": 1, "ep": 8, "etp": 1, "mbs": 1}
    new_pace, old_pace = (mt._moe_layer_paces(qwen, 4096, b, "none", options, GPU, RATES, x)[0] for x in (layer, old))
    assert old_pace - new_pace == pytest.approx(2 * one)
    dense = [mt._dense_layer_pace(qwen, "none", options, x) for x in (layer, old)]
    assert dense[1] - dense[0] == pytest.approx(4 * one)
    # the collectives are in neither layer's compute: without them a dense layer's pace drops by
    # four forward and four backward, an MoE layer's by two and two
    bare = layer._replace(attention_tp=0.0, attention_tp_backward=0.0, dense_mlp_tp=0.0, dense_mlp_tp_backward=0.0)
    assert dense[0] - mt._dense_layer_pace(qwen, "none", options, bare) == pytest.approx(8 * one)
    assert new_pace - mt._moe_layer_paces(qwen, 4096, b, "none", options, GPU, RATES, bare)[0] == pytest.approx(4 * one)
    tp1 = mt.layer_times(qwen, 4096, **{**KW, "tp": 1})
    assert (tp1.attention_tp, tp1.attention_tp_backward, tp1.dense_mlp_tp, tp1.dense_mlp_tp_backward) == (0, 0, 0, 0)


@pytest.mark.parametrize("recompute, modules, attention, mlp", [
    ("none", set(), 1, 1), ("selective", {"core_attn", "layernorm"}, 1, 1), ("selective", {"mlp"}, 1, 2),
    ("full", set(), 2, 2)])
def test_a_dense_layers_collectives_once_per_forward_that_runs_them_by_hand(recompute, modules, attention, mlp):
    """DeepSeek-V3's dense layers at TP 2, s 4096, b 1, BF16: the MLP's gather and scatter
    2 x 85.5 us (``_collective``) a forward and the same backward, MLA's four collectives 164.8 us
    (``_mla_block``) each way; full recomputation runs both
    blocks' forward again, --recompute-modules mlp the MLP's (``transformer_layer.py``,
    ``_forward_mlp`` under ``tensor_parallel.checkpoint``), core_attn and layernorm neither."""
    layer = mt.layer_times(DSV3, 4096, **KW)
    bare = layer._replace(attention_tp=0.0, attention_tp_backward=0.0, dense_mlp_tp=0.0, dense_mlp_tp_backward=0.0)
    options = MoEOptions(training=TrainingOptions(), modules=frozenset(modules))
    block = 2 * _collective(2)
    paces = [mt._dense_layer_pace(DSV3, recompute, options, x) for x in (layer, bare)]
    assert paces[0] - paces[1] == pytest.approx((attention + 1) * _mla_block() + (mlp + 1) * block)
