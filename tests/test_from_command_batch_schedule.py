"""``advisor estimate --from-command`` with core_v0.19.0's --step-batch-size-schedule: read as
Megatron-LM reads it (its final batch is the run's global batch), refused in one line where
Megatron-LM refuses the command. Input: Megatron-LM core_v0.19.0's own
examples/gpt3/train_gpt3_175b_distributed.sh (quoted in tests/data/commands/), whose schedule was
priced as "not known to the advisor" at a global batch of MBS x DP = 1 when given alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from megatron_real import NO_TRANSFORMER_ENGINE, checkout, validate

from advisor.cli import cli
from advisor.errors import AdvisorError
from advisor.megatron_layout import step_schedule
from advisor.shell_command import read_command

pytestmark = pytest.mark.xdist_group("megatron-validator")

COMMANDS = Path(__file__).parent / "data" / "commands"
# the script's model and layout, with the fields a Llama spec prices said (SwiGLU, RMSNorm, RoPE,
# no biases, no dropout) so that only the batch flags are under test; GPT-2's BPE: 50,257 tokens
_MODEL = ("torchrun --nproc-per-node 8 --nnodes 16 pretrain_gpt.py --num-layers 96 --hidden-size 12288 "
          "--num-attention-heads 96 --seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 1 "
          "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 16 --fp16 --swiglu --normalization RMSNorm "
          "--position-embedding-type rope --disable-bias-linear --attention-dropout 0 --hidden-dropout 0 "
          "--tokenizer-type NullTokenizer --vocab-size 50257 --mock-data")
_SCHEDULE = "0:16 2.4B:320 4.8B:624 7.2B:928 9.6B:1232 12B:1536"  # the script's, quoted


def estimate(text: str, *extra: str):
    return CliRunner().invoke(cli, ["estimate", "--from-command", "-", "--gpu", "h100-80gb", "--format", "json",
                                    *extra], input=text + "\n")


@pytest.mark.parametrize("text, expected", [
    # core_v0.19.0's _parse_numeric_value: int(float(x) * multiplier), K/M/B/T; sorted by threshold
    (_SCHEDULE, [(0, 16), (2_400_000_000, 320), (4_800_000_000, 624), (7_200_000_000, 928),
                 (9_600_000_000, 1232), (12_000_000_000, 1536)]),
    ("0:768,250B:1536", [(0, 768), (250_000_000_000, 1536)]),  # commas read as spaces
    ("500B:3072 0:768", [(0, 768), (500_000_000_000, 3072)]),  # out of order: the last after sorting
    ("0:1.5K 1m:2k", [(0, 1500), (1_000_000, 2000)]),  # lower-case suffixes (upper()), on batches too
])
def test_the_schedule_is_parsed_as_megatron_parses_it(text, expected):
    assert step_schedule(text) == expected


@pytest.mark.parametrize("text, error", [
    ("0:16 2.4B", "entry '2.4B' is not THRESHOLD:BATCH_SIZE"),  # _parse_schedule: ValueError
    ("0:16 x:32", "entry 'x:32' is not THRESHOLD:BATCH_SIZE"),  # float('x'): ValueError
    ("0:16 0:32", "thresholds increase strictly"),  # _validate_schedule's assert
    ("0:16 1K:0", "every batch size is positive"),
])
def test_a_schedule_megatron_refuses_is_refused(text, error):
    with pytest.raises(AdvisorError, match=error):
        step_schedule(text)



@pytest.mark.parametrize("text, expected", [
    # Megatron gives the calculator --seq-length (global_vars.py, init_num_microbatches_calculator):
    # thresholds are tokens, // seq_length samples. The script's at --seq-length 2048:
    # 2.4e9 // 2048 = 1,171,875; 4.8e9 -> 2,343,750; 7.2e9 -> 3,515,625; 9.6e9 -> 4,687,500; 12e9 -> 5,859,375
    (_SCHEDULE, [(0, 16), (1_171_875, 320), (2_343_750, 624), (3_515_625, 928), (4_687_500, 1232),
                 (5_859_375, 1536)]),
    ("100:16 3K:32", [(0, 16), (1, 32)]),  # 100 // 2048 = 0, 3,000 // 2048 = 1
])
def test_the_thresholds_are_tokens_over_the_sequence_length(text, expected):
    assert step_schedule(text, 2048) == expected


@pytest.mark.parametrize("text, samples", [
    ("0:16 1K:32", "[0, 0]"),  # 1,000 // 2,048 = 0: two thresholds of 0 samples, not increasing
    ("4096:16 1M:32", "[2, 488]"),  # 4,096 // 2,048 = 2: the first threshold is not 0; 1e6 // 2,048 = 488
])
def test_a_schedule_megatron_refuses_once_in_samples_is_refused(text, samples):
    """core_v0.19.0's ``_validate_schedule`` runs on the thresholds in samples (its ``__init__``,
    at start-up): a schedule whose thresholds are distinct tokens but not distinct samples, or whose
    first is not 0 samples, is an AssertionError there. The advisor priced both (at 32)."""
    result = estimate(f"{_MODEL} --step-batch-size-schedule '{text}'")
    assert result.exit_code == 2 and result.stderr == (
        f"Error: --from-command stdin: --step-batch-size-schedule '{text}': Megatron-LM asserts that its first "
        "threshold is 0, that its "
        f"thresholds increase strictly (in samples, tokens // --seq-length 2048: {samples}) and that every batch "
        "size is positive\n"), result.output
    # under a token of a sample's length the first threshold is 0 samples: accepted, priced at its last batch
    accepted = estimate(f"{_MODEL} --step-batch-size-schedule '2047:16 2048:32'")
    assert accepted.exit_code == 0 and json.loads(accepted.stdout)["global_batch_size"] == 32, accepted.output

def test_the_schedule_alone_is_priced_at_its_last_batch_as_if_given_as_the_global_batch():
    """StepBatchsizeNumMicroBatchesCalculator.global_batch_size = schedule[-1][1] = 1536, so the
    run's steady step is --global-batch-size 1536's: the same memory and time, to the byte."""
    scheduled = estimate(f"{_MODEL} --step-batch-size-schedule '{_SCHEDULE}'")
    constant = estimate(f"{_MODEL} --global-batch-size 1536")
    assert scheduled.exit_code == 0 and constant.exit_code == 0, scheduled.output + constant.output
    row, same = json.loads(scheduled.stdout), json.loads(constant.stdout)
    assert (row["global_batch_size"], row["dp"]) == (1536, 128 // (8 * 16))  # DP = 128 / (TP 8 x PP 16) = 1
    assert (row["total_gib"], row["step_time_s"], row["num_microbatches"]) == (
        same["total_gib"], same["step_time_s"], same["num_microbatches"])
    assert row["num_microbatches"] == 1536 // (1 * 1)  # GBS / (MBS x DP)
    assert ("--step-batch-size-schedule (priced at its last batch, 1536, the global batch Megatron-LM gives the "
            "run; the steps before it train smaller batches, not priced)") in row["unpriced"]


def test_the_schedule_beside_the_global_batch_is_refused_as_megatron_refuses_it():
    result = estimate(f"{_MODEL} --global-batch-size 1536 --step-batch-size-schedule '{_SCHEDULE}'")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.output
    assert result.stderr == (
        "Error: --from-command stdin: --step-batch-size-schedule with --global-batch-size 1536: Megatron-LM core 0.19 "
        "refuses the command "
        "(validate_args: 'Cannot specify both --step-batch-size-schedule and --global-batch-size'); leave out "
        "--global-batch-size (the schedule's last batch is the run's global batch)\n")


def test_the_schedule_on_core_0_15_is_refused_as_its_argparse_refuses_it():
    result = estimate(f"{_MODEL} --step-batch-size-schedule '{_SCHEDULE}'", "--megatron-version", "core_v0.15.2")
    assert result.exit_code == 2 and result.stderr == (
        "Error: --from-command stdin: --step-batch-size-schedule is not a flag of Megatron-LM core 0.15 (its argparse "
        "refuses the command): "
        "give --global-batch-size N, or --megatron-version for a release that has it (0.19)\n")


def test_a_malformed_schedule_is_one_line():
    result = estimate(f"{_MODEL} --step-batch-size-schedule '0:16 2.4B'")
    assert result.exit_code == 2 and result.stderr == (
        "Error: --from-command stdin: --step-batch-size-schedule entry '2.4B' is not THRESHOLD:BATCH_SIZE (e.g. '0:16 "
        "2.4B:320'; the "
        "numbers may end in K, M, B or T): Megatron-LM refuses it\n")


@pytest.mark.parametrize("flags, refused", [
    (f"--global-batch-size 1536 --step-batch-size-schedule '{_SCHEDULE}'", "Cannot specify both"),
    (f"--step-batch-size-schedule '{_SCHEDULE}'", None),
])
def test_the_real_core_0_19_refuses_and_accepts_the_same_commands(flags, refused):
    release = checkout("core_v0.19.0")  # skips without it
    command = read_command(f"{_MODEL.replace('--nnodes 16', '--nnodes 1')} {flags}".replace(
        "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 16", "--tensor-model-parallel-size 1"))
    [result] = validate(release, [{"args": [*command.arguments, *NO_TRANSFORMER_ENGINE, "--train-iters", "10",
                                            "--lr", "1e-4", "--num-layers", "2", "--hidden-size", "256",
                                            "--num-attention-heads", "4", "--fp16"],
                                   "world_size": 8, "env": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}}])
    if refused is None:
        assert result["ok"], result
    else:
        assert not result["ok"] and refused in result["error"], result


def test_the_example_as_published_is_refused_at_the_word_its_unquoted_array_splits_off():
    """The script's ``${TRAINING_ARGS[@]}`` is unquoted, so bash splits the quoted schedule at its
    spaces: pretrain_gpt.py gets --step-batch-size-schedule 0:16 and then '2.4B:320' ..., which
    Megatron-LM's argparse refuses (the flag takes one value, megatron_flag_table; no positional
    arguments). The line names the flag the stray word follows, where it said only that the word
    is not a flag."""
    result = CliRunner().invoke(cli, ["estimate", "--from-command", str(COMMANDS / "megatron_gpt3_175b_core_v0_19.sh"),
                                      "--gpu", "h100-80gb"])
    assert result.exit_code == 2 and result.stderr == (
        "Error: --from-command megatron_gpt3_175b_core_v0_19.sh: '2.4B:320' is not a flag (Megatron's arguments are "
        "--name [value]): it follows "
        "--step-batch-size-schedule 0:16, read as its value, and Megatron-LM's argparse refuses it too "
        "(unrecognized arguments); a value with spaces needs its quotes where the command is run "
        "(\"${ARGS[@]}\" in a script)\n")


def test_a_stray_word_after_a_flag_the_advisor_does_not_know_does_not_claim_megatrons_refusal():
    """--not-a-megatron-flag is in no release's parser: whether Megatron refuses the next word is not
    known, so only where it stands is said."""
    result = estimate(f"{_MODEL} --global-batch-size 1536 --not-a-megatron-flag 3 stray")
    assert result.exit_code == 2 and result.stderr == (
        "Error: --from-command stdin: 'stray' is not a flag (Megatron's arguments are --name [value]): it follows "
        "--not-a-megatron-flag 3, "
        "read as its value; a value with spaces needs its quotes where the command is run (\"${ARGS[@]}\" in a "
        "script)\n")


def test_a_stray_first_word_is_refused_as_before():
    result = estimate("--num-layers=2 stray")
    assert result.exit_code == 2 and result.stderr == (
        "Error: --from-command stdin: 'stray' is not a flag (Megatron's arguments are --name [value])\n")


@pytest.mark.parametrize("batch_flags, subject", [
    ("--step-batch-size-schedule '0:16 12B:1537'",
     "--step-batch-size-schedule's last batch, 1537 (Megatron-LM fails when the schedule reaches it),"),
    ("--global-batch-size 1537", "--global-batch-size 1537"),
], ids=["schedule", "global-batch-size"])
def test_a_last_batch_that_does_not_divide_is_named_as_the_command_gave_it(batch_flags, subject):
    """A batch not a multiple of MBS x DP was refused as '--gbs 1537 ...', a flag the command
    never wrote (reviewer5). TP 8 x PP 16 on 256 GPUs leaves DP 2: 1537 is odd."""
    result = estimate(f"{_MODEL} {batch_flags}", "--gpus", "256")
    assert result.exit_code == 2, result.output
    assert result.output.strip() == f"Error: --from-command stdin: {subject} is not divisible by MBS x DP = 1 x 2 = 2"
