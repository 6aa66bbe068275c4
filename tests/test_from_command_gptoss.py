"""``advisor estimate --from-command`` of Megatron-LM core_v0.19.0's examples/gptoss/02_train.sh
(the command it runs on 4 GPUs, quoted in tests/data/commands/megatron_gptoss_4gpu.sh): its
--quick-geglu MLP is gated (core_transformer_config_from_args sets gated_linear_unit with
quick_gelu, core_v0.15.2 and core_v0.19.0 alike), so SwiGLU's price has its weights and FLOPs.
The read-back called it 'no --swiglu (a GELU MLP, priced as SwiGLU ...: 1.5x its MLP weights and
FLOPs)', wrong for this MLP, and '--quick-geglu (not known to the advisor)'."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from megatron_real import NO_TRANSFORMER_ENGINE, checkout, validate

from advisor.cli import cli

pytestmark = pytest.mark.xdist_group("megatron-validator")

SCRIPT = Path(__file__).parent / "data" / "commands" / "megatron_gptoss_4gpu.sh"
GIB = 2**30


def _estimate(*extra: str, stdin: str | None = None):
    source = "-" if stdin is not None else str(SCRIPT)
    return CliRunner().invoke(cli, ["estimate", "--from-command", source, "--gpu", "h100-80gb", "--format", "json",
                                    *extra], input=stdin)


def test_quick_geglu_is_named_as_the_gated_mlp_it_is_and_priced_with_its_three_matrices():
    result = _estimate()
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout)
    assert (row["tp"], row["pp"], row["dp"], row["ep"]) == (1, 4, 1, 1)  # DP = 4 GPUs / (TP 1 x CP 1 x PP 4)
    assert row["layers_per_stage"] == [3, 3, 3, 3]  # 12 layers over PP 4
    unpriced = row["unpriced"]
    assert ("--quick-geglu (a gated MLP as SwiGLU is: priced as SwiGLU, the same weights and FLOPs; its quick-GELU "
            "activation, not SiLU, not priced)") in unpriced
    assert not any(item.startswith("no --swiglu") for item in unpriced)
    assert "--quick-geglu (not known to the advisor)" not in unpriced
    # One layer by hand (h 512, 64 heads of h/a = 8, 8 query groups, 4 experts of h_ffn 2048, no biases):
    #   experts  4 x 3 x 512 x 2048 = 12,582,912 (gated: FC1 2 x h_ffn wide, FC2 h_ffn)
    #   router   512 x 4            =      2,048
    #   attention q 512 x 512 + out 512 x 512 + k, v 2 x 512 x 64 = 589,824
    #   norms    2 x 512            =      1,024
    #   total                        = 13,175,808; a middle stage's 3 layers in 2-byte weights
    # (a GELU MLP, 2 matrices, would be 8,981,504 a layer)
    assert row["stages"][1]["weights_gib"] == 3 * 13_175_808 * 2 / GIB


def test_quick_geglu_beside_swiglu_is_refused_as_megatron_refuses_it():
    text = SCRIPT.read_text().replace("--quick-geglu", "--quick-geglu --swiglu")
    result = _estimate(stdin=text)
    assert result.exit_code == 2 and result.stderr == (
        "Error: --from-command stdin: --quick-geglu with --swiglu: Megatron-LM refuses the command (building its "
        "TransformerConfig: 'assert not args.swiglu'); keep one of them\n")


def test_a_plain_gelu_mlp_keeps_its_note():
    """Without --quick-geglu (nor --swiglu) the MLP is GELU's two matrices: still named as priced 1.5x."""
    text = SCRIPT.read_text().replace("--quick-geglu", "")
    result = _estimate(stdin=text)
    assert result.exit_code == 0, result.output
    assert any(item.startswith("no --swiglu (a GELU MLP") for item in json.loads(result.stdout)["unpriced"])


_SMALL = ["--num-layers", "2", "--hidden-size", "256", "--num-attention-heads", "4", "--seq-length", "128",
          "--max-position-embeddings", "128", "--micro-batch-size", "1", "--global-batch-size", "8", "--bf16",
          "--tokenizer-type", "NullTokenizer", "--vocab-size", "1000", "--mock-data", "--train-iters", "10",
          "--lr", "1e-4"]


@pytest.mark.parametrize("tag", ["core_v0.15.2", "core_v0.19.0"])
def test_the_real_megatron_builds_quick_geglu_gated_with_4h_and_refuses_it_beside_swiglu(tag):
    """What the read-back assumes, from the checkout itself: gated_linear_unit True, the default
    h_ffn 4h = 1024 (validate_args' 2/3 rule is for --swiglu only), and an AssertionError with both."""
    release = checkout(tag)  # skips without it
    args = [*_SMALL, *NO_TRANSFORMER_ENGINE]
    alone, both = validate(release, [{"args": [*args, "--quick-geglu"], "world_size": 1, "env": {}},
                                     {"args": [*args, "--quick-geglu", "--swiglu"], "world_size": 1, "env": {}}])
    assert alone["ok"] and (alone["derived"]["gated_linear_unit"], alone["derived"]["ffn_hidden_size"]) == (True, 4 * 256)
    assert not both["ok"], both
