"""``--from-command``: every input a launch script leaves out is named in one line, so a user does
not learn them one failed run at a time (DeepSeek-V3's Megatron-FSDP example gave its vocabulary's
line, then, with --vocab-size, its world size's)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from advisor.cli import cli

COMMANDS = Path(__file__).parent / "data" / "commands"
FSDP = str(COMMANDS / "moe_deepseek_v3_megatron_fsdp_example.sh")  # a bare argument list, its tokenizer from files
VOCABULARY = "its vocabulary (its tokenizer is read from files)"
WORLD = "its world size (no torchrun or srun in it)"
_MODEL = ("--num-layers 4 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 128 --seq-length 64 "
          "--micro-batch-size 1")


def estimate(*argv: str, stdin: str | None = None):
    return CliRunner().invoke(cli, ["estimate", "--from-command", *argv], input=stdin)


def refused(result, name: str = "stdin") -> str:
    """The one line a refusal of the command file ``name`` prints, without click's 'Error: ' and the
    file's prefix, checked whole ('--from-command NAME: ')."""
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and "Traceback" not in result.output, result.output
    prefix = f"Error: --from-command {name}: "
    assert result.stderr.startswith(prefix), result.stderr
    return result.stderr[len(prefix):-1]


@pytest.mark.parametrize("command", ["estimate", "compare-log"])
def test_the_fsdp_example_names_its_vocabulary_and_world_size_at_once(command, tmp_path):
    (tmp_path / "train.log").write_text("")
    argv = ["estimate", "--from-command", FSDP, "--gpu", "h100-80gb"] if command == "estimate" else [
        "compare-log", str(tmp_path / "train.log"), "--from-command", FSDP]
    line = refused(CliRunner().invoke(cli, argv), Path(FSDP).name)
    assert line == (f"the command does not give {VOCABULARY} or {WORLD}: give --vocab-size N (the tokenizer's size) "
                    "and --gpus N")


def test_the_fsdp_example_goes_further_with_both():
    result = estimate(FSDP, "--gpu", "h100-80gb", "--vocab-size", "129280", "--gpus", "256", "--format", "json")
    assert result.exit_code == 0, result.output
    assert "does not give" not in result.stderr


@pytest.mark.parametrize("given, still", [
    (["--vocab-size", "129280"], f"the command does not give {WORLD}: give --gpus N"),
    (["--gpus", "256"], f"the command does not give {VOCABULARY}: give --vocab-size N (the tokenizer's size)"),
])
def test_one_given_leaves_only_the_other(given, still):
    assert refused(estimate(FSDP, "--gpu", "h100-80gb", *given), Path(FSDP).name) == still


def test_missing_model_flags_are_named_with_the_options_that_supply_the_rest():
    """The model flags only the command can give: to be written in it, apart from the options."""
    line = refused(estimate("-", "--mem", "80", stdin="python pretrain_gpt.py --num-layers 2\n"))
    assert line == ("the command does not give --hidden-size, --num-attention-heads, --seq-length, "
                    f"--micro-batch-size, {VOCABULARY} or its world size (no torchrun or srun in it): write "
                    "--hidden-size, --num-attention-heads, --seq-length and --micro-batch-size in the command; give "
                    "--vocab-size N (the tokenizer's size) and --gpus N")
    alone = refused(estimate("-", "--mem", "80", "--gpus", "8", "--vocab-size", "1000",
                             stdin="python pretrain_gpt.py --num-layers 2 --hidden-size 64 --micro-batch-size 1\n"))
    assert alone == "the command does not give --num-attention-heads or --seq-length: write them in the command"
    # Megatron has no default micro-batch size (validate_args asserts one): it was read as 1
    batch = refused(estimate("-", "--mem", "80", "--gpus", "8", "--vocab-size", "1000", stdin=f"python pretrain_gpt.py "
                             f"{_MODEL.replace(' --micro-batch-size 1', '')}\n"))
    assert batch == "the command does not give --micro-batch-size: write it in the command"


@pytest.mark.parametrize("launch, why", [
    ("torchrun --nproc-per-node $N", "torchrun's --nproc-per-node is $N, a shell variable the script does not set"),
    ("torchrun --nproc-per-node gpu", "torchrun's --nproc-per-node 'gpu' is not a positive integer"),
    ("srun --ntasks $((NODES*8))", "srun's --ntasks is $((NODES*8)), shell arithmetic the advisor does not evaluate"),
])
def test_a_launcher_count_the_advisor_cannot_read_is_a_missing_world_size(launch, why):
    """It said 'write its value, or give --gpus', and refused the command with --gpus too."""
    script = f"{launch} pretrain_gpt.py {_MODEL}\n"
    line = refused(estimate("-", "--mem", "80", stdin=script))
    assert line == (f"the command does not give {VOCABULARY} or its world size ({why}): give --vocab-size N "
                    "(the tokenizer's size) and --gpus N")
    result = estimate("-", "--mem", "80", "--vocab-size", "1000", "--gpus", "8", "--format", "json", stdin=script)
    assert result.exit_code == 0, result.output


def test_srun_around_an_unreadable_torchrun_does_not_stand_in_for_it():
    """srun's tasks are torchrun's agents (one a node), not the ranks."""
    script = f"srun --ntasks 2 torchrun --nproc-per-node $N pretrain_gpt.py {_MODEL}\n"
    line = refused(estimate("-", "--mem", "80", "--vocab-size", "1000", stdin=script))
    assert line == ("the command does not give its world size (torchrun's --nproc-per-node is $N, a shell variable "
                    "the script does not set): give --gpus N")


def test_a_world_size_that_depends_on_the_missing_one_is_checked_once_given():
    """Divisibility needs the world size: after --gpus, its own line."""
    script = f"python pretrain_gpt.py {_MODEL} --tensor-model-parallel-size 4\n"
    assert refused(estimate("-", "--mem", "80", stdin=script)).endswith("give --vocab-size N (the tokenizer's size) "
                                                                        "and --gpus N")
    line = refused(estimate("-", "--mem", "80", "--vocab-size", "1000", "--gpus", "6", stdin=script))
    assert "not divisible by TP x CP x PP = 4 x 1 x 1 = 4" in line and "does not give" not in line


def test_a_world_size_the_layout_cannot_use_joins_the_missing_inputs_line():
    """Megatron-LM's GPT-3 175B example: 8 GPUs for TP 8 x PP 16 and a tokenizer from files. Both
    are told at once; TP, CP and PP are read without the vocabulary."""
    line = refused(estimate(str(COMMANDS / "megatron_gpt3_175b.sh"), "--gpu", "h100-80gb"), "megatron_gpt3_175b.sh")
    assert line == (f"the command does not give {VOCABULARY}: give --vocab-size N (the tokenizer's size); also, the "
                    "world size 8 (torchrun --nproc-per-node 8 x --nnodes 1) is not divisible by TP x CP x PP = 8 x 1 "
                    "x 16 = 128: give --gpus N for the run you mean")
    fixed = estimate(str(COMMANDS / "megatron_gpt3_175b.sh"), "--gpu", "h100-80gb", "--vocab-size", "50257",
                     "--gpus", "128")
    assert fixed.exit_code == 0, fixed.output


def test_the_readers_own_refusal_names_every_missing_input():
    """``read_run`` alone (no launcher, so no world size): the same line, its inputs kept."""
    from advisor.errors import AdvisorError
    from advisor.megatron_readback import Missing, MissingInputs, read_run

    with pytest.raises(MissingInputs) as caught:
        read_run(["--num-layers", "2", "--hidden-size", "64", "--micro-batch-size", "1"])
    assert isinstance(caught.value, AdvisorError)
    assert caught.value.missing == (Missing("--num-attention-heads"), Missing("--seq-length"), Missing(
        "its vocabulary", "its tokenizer is read from files", "--vocab-size N (the tokenizer's size)"))
    assert str(caught.value) == (f"the command does not give --num-attention-heads, --seq-length or {VOCABULARY}: "
                                 "write --num-attention-heads and --seq-length in the command; give --vocab-size N "
                                 "(the tokenizer's size)")
