"""--moe-shared-expert-overlap's own path through the shared experts (megatron-core
transformer/moe/shared_experts.py, ``pre_forward_comm`` and ``linear_fc1_forward_and_act``,
core_v0.15.2 and core_v0.19.0 alike) priced as it runs: the gathered FC1 input it keeps at TP > 1,
and with --no-bias-swiglu-fusion its eager ``glu`` without ``mlp.py``'s offset (8 f_shared per
token kept, 5 f_shared read and written, where the MLP's own eager path keeps 10 and moves 7)."""

from __future__ import annotations

import dataclasses
import json
import shlex

import pytest
from click.testing import CliRunner

from advisor.cli import cli
from advisor.moe import memory as mm
from advisor.moe import time as mt
from advisor.moe.spec import PRESETS
from advisor.releases import NEWEST
from advisor.throughput import terms

DSV3 = PRESETS["deepseek-v3"]
GIB = 2**30


def test_the_dsv3_shared_expert_keeps_the_hand_count_on_each_path():
    # DeepSeek-V3: h 7168, f_shared 2048; s 4096, b 1, TP 2 (sequence parallel), CP 1
    assert (DSV3.hidden_size, DSV3.shared_expert_size) == (7168, 2048)
    s, b, t, c, h, f = 4096, 1, 2, 1, 7168, 2048
    # MLP.forward's fused SwiGLU: FC1's output 2f (the fusion's input) + FC2's input f, 2 bytes
    fused = 2 * (2 * f + f) * s * b / (t * c)
    assert fused == 25_165_824 == mm.shared_expert_activation_bytes(DSV3, s, b, t, c)
    # MLP.forward's eager glu: FC1's output 2f (SiLU's input is a view of it), SiLU's output f,
    # x_linear + 0.0 f (a new tensor), the product f (FC2's input): 5 f, 2 bytes
    eager = 2 * (2 * f + f + f + f) * s * b / (t * c)
    assert eager == 41_943_040 == mm.shared_expert_activation_bytes(DSV3, s, b, t, c, False)
    # the overlap gathers the TP group's tokens itself and FC1 saves them: s b h / c, 2 bytes
    gathered = 2 * s * b * h / c
    assert gathered == 58_720_256 == mm.shared_expert_gathered_input_bytes(DSV3, s, b, t, c)
    # its fused path keeps the same SwiGLU tensors beside it
    assert mm.shared_expert_activation_bytes(DSV3, s, b, t, c, True, overlap=True) == fused + gathered == 83_886_080
    # its eager glu, silu(x[0]) * x[1]: FC1's output 2f, SiLU's output f, FC2's input f; no offset
    overlap_eager = 2 * (2 * f + f + f) * s * b / (t * c)
    assert overlap_eager == 33_554_432
    assert mm.shared_expert_activation_bytes(DSV3, s, b, t, c, False, overlap=True) \
        == overlap_eager + gathered == 92_274_688
    # the overlap against the MLP's path, unfused: 58,720,256 - 8,388,608 more a layer
    assert (overlap_eager + gathered) - eager == 50_331_648


def test_at_tp_1_the_overlap_gathers_nothing():
    # TP 1: no sequence parallelism, copy_to_tensor_model_parallel_region returns its input
    s, f = 4096, 2048
    assert mm.shared_expert_gathered_input_bytes(DSV3, s, 1, 1, 1) == 0
    assert mm.shared_expert_activation_bytes(DSV3, s, 1, 1, 1, True, overlap=True) == 2 * 3 * f * s == 50_331_648
    assert mm.shared_expert_activation_bytes(DSV3, s, 1, 1, 1, False, overlap=True) == 2 * 4 * f * s == 67_108_864
    # a model without shared experts keeps nothing for them, overlap or not
    assert mm.shared_expert_gathered_input_bytes(PRESETS["mixtral-8x7b"], s, 1, 2, 1) == 0


def test_the_overlaps_eager_swiglu_moves_five_f_not_seven():
    # per token: SiLU reads f and writes f, the product reads 2f and writes f: 5f (7f with the
    # MLP's offset add, read f and write f); fused: read 2f, write f
    f = 2048
    assert terms.swiglu_elements(f, False, linear_offset=False) == 5 * f == 10_240
    assert terms.swiglu_elements(f, False) == 7 * f and terms.swiglu_elements(f, True, linear_offset=False) == 3 * f
    # DeepSeek-V3's shared expert, s 4096, b 1, CP 1 (tokens_cp 4096), TP 2: BF16 bytes forward
    tokens_cp, t = 4096, 2
    shared = [mt.elementwise_bytes(DSV3, tokens_cp, t, 1, 1, False, overlap)[3] for overlap in (False, True)]
    assert shared == [2 * 7 * f * tokens_cp / t, 2 * 5 * f * tokens_cp / t] == [58_720_256, 41_943_040]
    fused = [mt.elementwise_bytes(DSV3, tokens_cp, t, 1, 1, True, overlap)[3] for overlap in (False, True)]
    assert fused == [2 * 3 * f * tokens_cp / t] * 2


def _estimate(command: str) -> dict:
    result = CliRunner().invoke(cli, ["estimate", "--from-command", "-", "--gpus", "1024", "--gpu", "h100-80gb",
                                      "--format", "json"], input=command)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_an_estimate_with_the_overlap_keeps_the_hand_derived_bytes_more(advisor):
    """advisor estimate --model deepseek-v3 --no-bias-swiglu-fusion (TP 2, PP 16, EP 64, s 4096,
    b 1), its Megatron command read back (--from-command: the overlap is a Megatron command's
    flag) with and without --moe-shared-expert-overlap: every stage keeps 50,331,648 bytes more
    per MoE layer and microbatch in flight (the hand count above), its first (dense layers) none."""
    row = advisor.json("estimate", "--model", "deepseek-v3", "--gpus", "1024", "--tp", "2", "--pp", "16", "--ep", "64",
                       "--etp", "1", "--mbs", "1", "--seq-len", "4096", "--gbs", "8192", "--gpu", "h100-80gb",
                       "--moe-token-dispatcher-type", "alltoall", "--no-bias-swiglu-fusion")
    vocab = NEWEST.null_tokenizer_vocab_flag(DSV3.vocab_size)
    command = shlex.join(row["megatron_args"] + ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(vocab)])
    plain, overlap = _estimate(command), _estimate(command + " --moe-shared-expert-overlap")
    assert (plain["total_gib"], plain["step_time_s"]) == (row["total_gib"], row["step_time_s"])
    per_layer = 2 * 4096 * 7168 - 2 * 4096 * 2048 / 2  # the gathered input, less glu's offset tensor
    assert per_layer == 50_331_648
    gaps = [(b["layer_activations_gib"] - a["layer_activations_gib"]) * GIB
            for a, b in zip(plain["stages"], overlap["stages"])]
    moe_layers = [(st["layers"] - st["dense_layers"]) * st["in_flight_microbatches"] for st in plain["stages"]]
    assert moe_layers[:3] == [0, 3 * 15, 4 * 14]  # layout E,t*3|t*3|(t*4|)*13t*3,L: 1F1B holds 16 - i
    assert gaps == pytest.approx([n * per_layer for n in moe_layers], rel=1e-12)
    assert gaps[1] == pytest.approx(2_264_924_160, rel=1e-12)
    # and its shared SwiGLU moves 5 f_shared, not 7: a little faster, the memory-bound kernels only
    assert overlap["step_time_s"] < plain["step_time_s"]



SYMBOLIC = """
import contextlib, dataclasses, json
from megatron_hooks.stage_emulation import quiet_megatron; quiet_megatron()
import torch
import megatron_hooks.model as model
from advisor.moe.spec import PRESETS
from megatron_hooks.fsdp_symbolic import _NoStream
from megatron_hooks.moe_layer import measure_moe_layer
# the overlap runs the shared experts on a side stream (shared_experts.py: torch.cuda.Stream,
# current_stream().wait_stream, torch.cuda.stream(...)): fake tensors run no kernels, nothing to order
torch.cuda.Stream, torch.cuda.current_stream = _NoStream, lambda *args, **kwargs: _NoStream()
torch.cuda.stream = lambda stream: contextlib.nullcontext()
build = model.build_gpt_model
out = {}
# DeepSeek-V3 at TP 1 (its MLA has no stand-in at TP > 1), EP 8; Mixtral 8x7B given a 2048-wide
# shared expert at TP 2 (sequence parallel), EP 4: the alltoall dispatcher, which the overlap needs
layers = {"dsv3_tp1": (PRESETS["deepseek-v3"], dict(tp=1, ep=8)),
          "mixtral_tp2": (dataclasses.replace(PRESETS["mixtral-8x7b"], shared_expert_size=2048), dict(tp=2, ep=4))}
for name, (spec, layout) in layers.items():
    for overlap in (False, True):
        model.build_gpt_model = lambda *args, **kwargs: build(*args, **kwargs, bias_activation_fusion=False,
                                                               moe_shared_expert_overlap=overlap)
        out[f"{name}_{overlap}"] = measure_moe_layer(spec, seq_len=4096, dispatcher="alltoall",
                                                     **layout).activation_bytes
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def measured():
    pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install -e '.[megatron]')")
    from conftest import run_json_script

    return run_json_script(SYMBOLIC)


@pytest.mark.parametrize("name, spec, tp, h", [("dsv3_tp1", DSV3, 1, 7168),
                                              ("mixtral_tp2", PRESETS["mixtral-8x7b"], 2, 4096)])
def test_the_symbolic_layer_keeps_what_each_path_is_priced(measured, name, spec, tp, h):
    """megatron-core's MoE layer on fake tensors with --no-bias-swiglu-fusion, with and without
    --moe-shared-expert-overlap, s 4096, b 1, f_shared 2048: the shared experts' saved tensors
    against ``shared_expert_activation_bytes``. With the overlap the shared experts run inside
    the dispatcher's calls (token_dispatcher.py, ``shared_experts.linear_fc1_forward_and_act``),
    so what they save is counted in the dispatch part: the dispatch's own bytes are the same
    without it, and everything else is unchanged."""
    s, f = 4096, 2048
    plain, overlap = measured[f"{name}_False"], measured[f"{name}_True"]
    # MLP.forward's eager glu: 10 s f / t (DeepSeek-V3 83,886,080 at TP 1; Mixtral 41,943,040 at TP 2)
    assert plain["shared_experts"] == 10 * s * f / tp \
        == mm.shared_expert_activation_bytes(DSV3, s, 1, tp, 1, False) == {1: 83_886_080, 2: 41_943_040}[tp]
    # the overlap's glu, 8 s f / t, and at TP 2 the gathered input 2 s h (Mixtral's h 4096)
    gathered = 2 * s * h if tp > 1 else 0
    kept = overlap["dispatch"] + overlap["shared_experts"] - plain["dispatch"]
    with_mixtral_width = dataclasses.replace(spec, shared_expert_size=f)
    assert kept == 8 * s * f / tp + gathered \
        == mm.shared_expert_activation_bytes(with_mixtral_width, s, 1, tp, 1, False, overlap=True) \
        == {1: 67_108_864, 2: 33_554_432 + 33_554_432}[tp]
    assert {part: overlap[part] for part in ("attention", "router", "experts")} \
        == {part: plain[part] for part in ("attention", "router", "experts")}
