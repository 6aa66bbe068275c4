"""--moe-deepep-num-sms is bounded by the GPU's SMs (DeepEP's kernels must leave compute some):
the refusal names the GPU it counted, or, without --gpu, the architecture it assumed and that
--gpu sets it (it said 'the GPU has 132 SMs', an H100's, of whatever GPU the user meant)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from advisor.cli import cli
from advisor.errors import AdvisorError
from advisor.models import preset
from advisor.saved_row import moe_row_settings

FLEX = ["estimate", "--model", "mixtral-8x7b", "--gpus", "64", "--ep", "8", "--moe-token-dispatcher-type", "flex",
        "--format", "json"]


def refused(argv: list[str]) -> str:
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.output
    return result.stderr.removeprefix("Error: ").rstrip("\n")


def test_without_gpu_the_assumed_gpu_is_named():
    # 132 SMs: an H100 SXM5's (NVIDIA H100 Tensor Core GPU Architecture whitepaper)
    assert refused([*FLEX, "--moe-deepep-num-sms", "200"]) == (
        "--moe-deepep-num-sms 200: the GPU has 132 SMs (a Hopper GPU's, assumed without --gpu, which sets it), "
        "and compute needs some of them")


@pytest.mark.parametrize("gpu, sms", [("a100-80gb", 108), ("h100-80gb", 132)])
def test_with_gpu_the_gpu_is_named(gpu, sms):
    assert refused([*FLEX, "--moe-deepep-num-sms", str(sms), "--gpu", gpu]) == (
        f"--moe-deepep-num-sms {sms}: the {gpu} has {sms} SMs, and compute needs some of them")


def test_a_blackwell_takes_more_than_a_hopper_has():
    # B200: 148 SMs (NVIDIA Blackwell Architecture Technical Brief); 140 leaves it 8
    result = CliRunner().invoke(cli, [*FLEX, "--moe-deepep-num-sms", "140", "--gpu", "b200-180gb"])
    assert result.exit_code == 0, result.output


def test_a_saved_row_without_a_gpu_says_what_was_assumed():
    row = {"ep": 8, "etp": 1, "dispatcher": "flex", "dispatcher_sms": 200, "recompute": "none"}
    with pytest.raises(AdvisorError, match=r"row: 'dispatcher_sms' 200: the GPU has 132 SMs \(a Hopper GPU's, "
                                           r"assumed where the row names no 'gpu'\)"):
        moe_row_settings(row, "row", preset("mixtral-8x7b"))
    with pytest.raises(AdvisorError, match="the a100-80gb has 108 SMs"):
        moe_row_settings({**row, "gpu": "a100-80gb"}, "row", preset("mixtral-8x7b"))
