"""What an MoE estimate's or sweep's title says its numbers are.

``--moe-routing dropless`` prices memory at its bound (``advisor.moe.memory``: every EP rank's
token copies that fit this rank's experts, N ep min(k, E/ep) ETP) and time at the balanced pace
times ``--moe-imbalance`` (``advisor.moe.time``): the title says so, lest DeepSeek-V3's 1306 GiB per
GPU (docs/moe.md) read as the peak a run will see."""

from __future__ import annotations

from click.testing import CliRunner
from table_text import read_table

from advisor.cli import cli

DEEPSEEK = ["estimate", "--model", "deepseek-v3", "--gpus", "2048", "--pp", "16", "--ep", "64", "--recompute",
            "selective", "--gbs", "15360", "--seq-len", "4096", "--gpu", "h800-80gb"]
MIXTRAL = ["sweep", "--model", "mixtral-8x7b", "--gpus", "64", "--gpu", "h100-80gb", "--top", "1"]


def title(argv: list[str]) -> str:
    """The title's lines (up to the table's top border) joined, checked to fit 100 columns."""
    result = CliRunner(env={"COLUMNS": "100"}).invoke(cli, argv)
    assert result.exit_code == 0, result.output
    assert all(len(line.encode()) <= 100 for line in result.stdout.splitlines())
    return read_table(result.stdout).title


def test_a_dropless_estimate_says_its_memory_is_the_worst_case():
    assert "; routing dropless (worst-case memory), dispatcher alltoall," in title(
        [*DEEPSEEK, "--moe-routing", "dropless"])
    assert "; routing balanced, dispatcher alltoall," in title(DEEPSEEK)  # the bound is dropless's only


def test_a_dropless_sweep_says_its_imbalance_is_the_pace_only():
    assert "routing dropless (worst-case memory, pace x 1.5 on the busiest rank), dispatcher alltoall" in title(
        [*MIXTRAL, "--moe-routing", "dropless", "--moe-imbalance", "1.5"])
    assert "routing balanced x 1.5 on the busiest rank, dispatcher alltoall" in title(
        [*MIXTRAL, "--moe-imbalance", "1.5"])
