"""An option with a value given under two of its names with different values is refused
(``OneValueEach`` in advisor.cli.spellings): click kept the last without a word, so '--tp 2
--tensor-model-parallel-size 4' priced TP 4 and '--seq-len 4096 --seq-length 2048' 2048. The same
value twice is fine; the same spelling again, or a switch and its opposite, keep the last (as click
and Megatron's argparse do: a script's override at its end); repeatable options keep every value."""

import pytest

ESTIMATE = ("estimate", "--gpus", "8", "--gpu", "h100-80gb", "--mbs", "1")


@pytest.mark.parametrize("args, line", [
    (("--tp", "2", "--tensor-model-parallel-size", "4"),
     "--tp 2 and --tensor-model-parallel-size 4 contradict each other"),
    (("--seq-len", "4096", "--seq-length", "2048"), "--seq-len 4096 and --seq-length 2048 contradict each other"),
])
def test_different_values_are_refused(advisor, args, line):
    assert advisor.error(*ESTIMATE, *args).startswith(f"Error: {line}: give the option once (see '")


def test_every_command_refuses(advisor, tmp_path):
    line = advisor.error("report", "sweep", "--gpus", "8", "--gpu", "h100-80gb", "--gbs", "8",
                         "--global-batch-size", "16", "-o", tmp_path / "r.html")
    assert line.startswith("Error: --gbs 8 and --global-batch-size 16 contradict each other")
    assert advisor.error("recommend", "--gpus", "8", "--gpu", "h100-80gb", "--seq-len", "4096", "--seq-length",
                         "2048").startswith("Error: --seq-len 4096 and --seq-length 2048 contradict each other")


def test_one_spelling_again_or_a_switchs_opposite_keeps_the_last(advisor):
    assert advisor.json(*ESTIMATE, "--tp", "4", "--tp", "2") == advisor.json(*ESTIMATE, "--tp", "2")
    assert advisor.json(*ESTIMATE, "--no-flash-attn", "--flash-attn") == advisor.json(*ESTIMATE, "--flash-attn")
    assert advisor.json(*ESTIMATE, "--flash-attn", "--no-flash-attn") == advisor.json(*ESTIMATE, "--no-flash-attn")


def test_the_same_value_twice_is_fine(advisor):
    once = advisor.json(*ESTIMATE, "--tp", "2")
    assert advisor.json(*ESTIMATE, "--tp", "2", "--tensor-model-parallel-size", "02") == once
    assert once["tp"] == 2


def test_repeatable_options_keep_every_value(advisor):
    moe = ("estimate", "--model", "deepseek-v3", "--gpus", "2048", "--gpu", "h100-80gb", "--tp", "2", "--pp", "16",
           "--ep", "64", "--mbs", "1", "--recompute", "selective")
    repeated = advisor.json(*moe, "--recompute-modules", "moe_act", "--recompute-modules", "layernorm")
    megatron = advisor.json(*moe, "--recompute-modules", "moe_act", "layernorm")
    one = advisor.json(*moe, "--recompute-modules", "moe_act")
    assert repeated == megatron
    assert repeated["total_gib"] != one["total_gib"]  # layernorm's recomputation is priced too


def test_an_invalid_value_is_refused_with_its_own_error(advisor):
    """Not as a contradiction: '8192.0' is not an integer, whatever the other spelling gave."""
    line = advisor.error(*ESTIMATE, "--seq-len", "8192", "--seq-length", "8192.0")
    assert "'8192.0' is not an integer" in line and "contradict" not in line
