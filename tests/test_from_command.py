"""``advisor estimate --from-command``: a sweep row's own flags read back give the row's memory
and time exactly, and real launch scripts read with every unpriced flag named."""

from __future__ import annotations

import json
import shlex
from functools import lru_cache
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from advisor.cli import cli

COMMANDS = Path(__file__).parent / "data" / "commands"
PRICED = ("total_gib", "model_states_gib", "activations_gib", "verdict", "usage_gib", "margin_gib", "step_time_s",
          "tflops_per_gpu", "layers_per_stage", "vpp", "recompute", "recompute_num_layers", "num_microbatches")
SWEEPS = [  # (argv, vocabulary): every row of these is read back
    (["--gpus", "8", "--gpu", "h100-80gb"], 128256),
    (["--gpus", "64", "--gpu", "h100-80gb", "--model", "llama3.1-70b", "--seq-len", "4096", "--gbs", "256"], 128256),
    (["--gpus", "32", "--gpu", "a100-40gb", "--model", "llama3.1-8b", "--grad-dtype", "bf16", "--top", "40"], 128256),
    (["--gpus", "16", "--mem", "80", "--model", "llama3.1-8b", "--seq-len", "2048", "--gbs", "64"], 128256),
]


def invoke(argv: list[str], stdin: str | None = None) -> dict | list:
    result = CliRunner().invoke(cli, argv, input=stdin)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@lru_cache(maxsize=None)
def sweep_rows(index: int) -> list[dict]:
    argv, _ = SWEEPS[index]
    return invoke(["sweep", *argv, "--format", "json"])


@st.composite
def rows(draw):
    index = draw(st.sampled_from(range(len(SWEEPS))))
    return index, draw(st.sampled_from(sweep_rows(index)))


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(rows())
def test_every_sweep_row_reads_back_to_its_own_price(drawn):
    index, row = drawn
    argv, vocab = SWEEPS[index]
    hardware = argv[argv.index("--gpu"):argv.index("--gpu") + 2] if "--gpu" in argv else ["--mem", "80"]
    command = shlex.join(row["megatron_args"] + ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(vocab - 1)])
    estimate = invoke(["estimate", "--from-command", "-", "--gpus", str(row["gpus"]), *hardware, "--format", "json"],
                      stdin=command)
    assert {key: estimate.get(key) for key in PRICED} == {key: row.get(key) for key in PRICED}
    assert estimate["megatron_args"] == row["megatron_args"]
    assert estimate["unpriced"] == []
