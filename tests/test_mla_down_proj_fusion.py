"""core_v0.19.0's --mla-down-proj-fusion: named, not priced, wherever the advisor meets it.

With it, the Transformer Engine spec builds ``FusedMLASelfAttention`` (core_v0.19.0
models/gpt/gpt_layer_specs.py:257-291): one ``linear_qkv_down_proj``, a
``TELayerNormColumnParallelLinear`` that takes the input norm in, in place of the two duplicated
``TELinear`` down projections; at TP > 1 it gathers the layer's input under sequence parallelism,
holds a [h, (q_lora_rank + kv_lora_rank + d_rope) / t] weight shard, and gathers both latents
over TP after it (transformer/multi_latent_attention.py:1268-1370, :736-739). The advisor prices
the unfused form (``advisor.moe.time.mla_attention_tp_time``), so an estimate read from a command
names the flag (``advisor.moe.readback.NAMED``), and a launch that runs it after '--' says so
(``launch.arguments.unpriced_extras_note``, ``advisor.megatron_readback.unpriced_flag_note``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launch_support import launcher

from advisor.moe.readback import NAMED

COMMAND = Path(__file__).parent / "data" / "commands" / "moe_deepseek_v3_modelzoo_h100_fp8.sh"
NOTE = NAMED["mla-down-proj-fusion"]


def _estimate(advisor, tmp_path: Path, fused: bool) -> dict:
    text = COMMAND.read_text()
    if fused:
        text = text.replace("--multi-latent-attention ", "--multi-latent-attention --mla-down-proj-fusion ")
    path = tmp_path / ("fused.sh" if fused else "unfused.sh")
    path.write_text(text)
    return advisor.json("estimate", "--from-command", path, "--gpu", "h100-80gb", "--vocab-size", "129280")


def test_a_command_with_the_fusion_is_priced_unfused_and_says_so(advisor, tmp_path):
    fused, unfused = _estimate(advisor, tmp_path, True), _estimate(advisor, tmp_path, False)
    assert NOTE in fused["unpriced"] and NOTE not in unfused["unpriced"]
    assert NOTE.startswith("--mla-down-proj-fusion (") and "priced as the unfused MLA" in NOTE
    # the same price: the flag changes nothing the advisor computes
    assert (fused["total_gib"], fused["step_time_s"]) == (unfused["total_gib"], unfused["step_time_s"])


@pytest.fixture(scope="module")
def mla_estimate(tmp_path_factory) -> Path:
    """DeepSeek-V3 (MLA) at TP 2, PP 16, EP 64 on 1,024 H100s, as advisor estimate writes it."""
    from conftest import Invoker

    path = tmp_path_factory.mktemp("mla") / "estimate.json"
    Invoker()("estimate", "--model", "deepseek-v3", "--gpu", "h100-80gb", "--gpus", "1024", "--tp", "2", "--pp",
              "16", "--ep", "64", "--etp", "1", "--mbs", "1", "--format", "json", "-o", path)
    assert json.loads(path.read_text())["megatron_args"]
    return path


def test_a_launch_says_the_fusion_after_dashes_is_not_priced(mla_estimate):
    args = ["args", "--from", mla_estimate, "--megatron-version", "0.19"]
    fused = launcher()(*args, "--", "--mla-down-proj-fusion")
    note = f"advisor-launch: the estimate ({mla_estimate}) did not price what you give after --, which the launch runs: "
    assert note + NOTE in fused.stderr.splitlines()
    assert "--mla-down-proj-fusion" in fused.stdout.split()  # launched as given
    assert "did not price" not in launcher()(*args).stderr


def test_core_015_lacks_the_flag_so_only_that_is_said(mla_estimate):
    """core_v0.15.2's parser has no --mla-down-proj-fusion (its arguments.py never spells it): the
    launch warns that pretrain_gpt.py refuses it (``unknown_flags``), and names nothing unpriced."""
    result = launcher()("args", "--from", mla_estimate, "--megatron-version", "0.15", "--", "--mla-down-proj-fusion")
    assert "--mla-down-proj-fusion (after --) is not a flag of Megatron-LM core 0.15" in result.stderr
    assert "did not price" not in result.stderr


@pytest.mark.parametrize("tag, spelled", [("core_v0.15.2", False), ("core_v0.19.0", True)])
def test_only_core_019_spells_the_flag(tag, spelled):
    from megatron_real import SHARED

    arguments = SHARED / tag / "megatron" / "training" / "arguments.py"
    if not arguments.is_file():
        pytest.skip(f"no Megatron-LM checkout {tag} at {SHARED}")
    assert ("'--mla-down-proj-fusion'" in arguments.read_text()) is spelled
