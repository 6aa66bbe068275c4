"""The training options check their own fields' types and bounds (``advisor.options.training``),
so that every reader of a saved row, a command line or a launch script relies on one check: a
hand-edited row's "0.5" or null was a raw TypeError from ``advisor report`` (and a line quoting
Python's TypeError from advisor-launch), and a 400-digit --fp8-amax-history-len an OverflowError."""

from __future__ import annotations

import json
from typing import get_args

import pytest
from conftest import Invoker
from launch_support import launcher, write_json

from advisor.errors import AdvisorError
from advisor.options import TrainingOptions, parse_training_args
from advisor.options import training

BAD_NUMBERS = [  # (the field, a value of the wrong type): every numeric option
    *(("recompute_num_layers", value) for value in (None, "2", 1.5, True, [1])),
    *(("fp8_amax_history_len", value) for value in (None, "3", 2.0, False)),
    *(("vocab_divisible_by", value) for value in ("128", 128.0, True, {})),
    *(("optimizer_offload_fraction", value) for value in (None, "0.5", True, [1])),
]
BAD_SWITCHES = [(name, value) for name, default in TrainingOptions().flat().items() if isinstance(default, bool)
                for value in ("false", 0, None)]
NEEDS = {"fp8_amax_history_len": {"fp8_format": "hybrid"}, "optimizer_offload_fraction": {"optimizer_cpu_offload": True}}
"""What a field is read beside in a real row (the check does not depend on it)."""


@pytest.mark.parametrize("name,value", BAD_NUMBERS + BAD_SWITCHES, ids=repr)
def test_each_option_refuses_a_value_of_another_type(name, value):
    with pytest.raises(AdvisorError, match=f"^{name} .*must be (an integer|a number|true or false), got "):
        TrainingOptions.from_dict({**NEEDS.get(name, {}), name: value})


@pytest.mark.parametrize("name,value,message", [
    ("recompute_num_layers", 0, "recompute_num_layers (--recompute-num-layers) must be at least 1, got 0"),
    ("recompute_num_layers", 5000, "must be at most 4,096, got 5000"),
    ("fp8_amax_history_len", 0, "fp8_amax_history_len (--fp8-amax-history-len) must be at least 1, got 0"),
    ("fp8_amax_history_len", 10**400, "must be at most 65,536"),
    ("vocab_divisible_by", 0, "vocab_divisible_by (--make-vocab-size-divisible-by) must be at least 1, got 0"),
    ("vocab_divisible_by", 2**25, "must be at most 16,777,216"),
    ("optimizer_offload_fraction", 1.5, "must be at most 1, got 1.5"),
    ("optimizer_offload_fraction", float("nan"), "must be a finite number, got nan"),
])
def test_each_number_is_bounded(name, value, message):
    with pytest.raises(AdvisorError, match="^" + name) as raised:
        TrainingOptions.from_dict({**NEEDS.get(name, {}), name: value})
    assert message in str(raised.value)


def test_the_choices_are_their_types():
    assert training.RECOMPUTES == get_args(training.Recompute) == ("none", "selective", "full")
    assert training.RECOMPUTE_METHODS == ("uniform", "block")
    assert training.FSDP_STRATEGIES == ("no_shard", "optim", "optim_grads", "optim_grads_params")


def test_megatron_fsdp_turns_the_distributed_optimizer_on_for_the_cli_and_the_parser(advisor):
    """One rule (DataParallel.distributed_optimizer_for): Megatron-FSDP runs with the distributed
    optimizer whether the command line names it or not; torch FSDP2 refuses it (DataParallel)."""
    options, _ = parse_training_args(["--bf16", "--use-megatron-fsdp"])
    assert options.data_parallel.distributed_optimizer
    row = advisor.json("estimate", "--gpus", 8, "--pp", 1, "--mbs", 1, "--no-distributed-optimizer",
                       "--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads")
    assert "--use-distributed-optimizer" in row["megatron_args"]
    with pytest.raises(AdvisorError, match="^--use-torch-fsdp2 runs without --use-distributed-optimizer"):
        parse_training_args(["--bf16", "--use-torch-fsdp2", "--use-distributed-optimizer"])
    assert advisor.error("estimate", "--gpus", 8, "--pp", 1, "--mbs", 1, "--use-torch-fsdp2",
                         "--use-megatron-fsdp") == "Error: --use-torch-fsdp2 and --use-megatron-fsdp are two FSDPs: choose one"


# --- the readers of a saved row: one line naming the field, exit 2, nothing written ---------------


@pytest.fixture(scope="module")
def row(tmp_path_factory):
    path = tmp_path_factory.mktemp("row") / "sweep.json"
    Invoker()("sweep", "--gpus", 8, "--mem", 80, "--top", 1, "--format", "json", "-o", path)
    return next(row for row in json.loads(path.read_text()) if row["rank"] == 1)


READERS = [(name, value) for name, value in BAD_NUMBERS if value is None or isinstance(value, str)] + [
    ("sequence_parallel", "false")]


@pytest.mark.parametrize("name,value", READERS, ids=repr)
def test_report_and_launcher_name_the_field(advisor, tmp_path, row, name, value):
    path = write_json(tmp_path / "row.json", {**row, "options": {**row["options"], **NEEDS.get(name, {}), name: value}})
    page = tmp_path / "r.html"
    for line in (advisor.error("report", "--from", path, "-o", page),
                 launcher().error("args", "--from", path, "--megatron-version", "0.19")):
        assert line.startswith(f"Error: {path}: ") and f"{name} " in line and "TypeError" not in line
        assert f"got {'null' if value is None else repr(value)}" in line  # JSON's null, not Python's None
    assert not page.exists()


@pytest.mark.parametrize("flags,message", [
    (["--make-vocab-size-divisible-by", "9" * 400], "vocab_divisible_by (--make-vocab-size-divisible-by) must be at "
                                                    "most 16,777,216"),
    (["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "9" * 400],
     "recompute_num_layers (--recompute-num-layers) must be at most 4,096"),
    (["--fp8-format", "hybrid", "--fp8-amax-history-len", "9" * 400], "fp8_amax_history_len (--fp8-amax-history-len) "
                                                                      "must be at most 65,536"),
], ids=["vocab", "recompute", "amax"])
def test_a_launch_script_beyond_the_bounds_is_one_line(advisor, tmp_path, flags, message):
    """Each was an OverflowError while the estimate was priced."""
    path = tmp_path / "train.sh"
    path.write_text("torchrun pretrain_gpt.py --num-layers 2 --hidden-size 256 --num-attention-heads 4 "
                    "--seq-length 512 --max-position-embeddings 512 --micro-batch-size 1 --global-batch-size 8 "
                    "--bf16 --use-distributed-optimizer " + " ".join(flags) + "\n")
    assert message in advisor.error("estimate", "--from-command", path, "--vocab-size", 32000, "--gpus", 1)
