"""A token budget (--tokens) and its price (--gpu-hour-price) on MoE sweeps and estimates, as on
dense ones: each row's days, GPU-hours and cost from its own tokens/s (derived here by hand:
days = tokens / tokens_per_s / 86400, GPU-hours = days x 24 x GPUs, cost = GPU-hours x price),
the same table columns and estimate line, JSON and CSV keys, and a row that advisor-launch turns
into Megatron-LM's sample-based length."""

import csv
import io
import json
import math

import pytest
from click.testing import CliRunner
from launch_support import launcher, sweep_file
from table_text import read_table

from advisor.cli import cli

TOKENS, PRICE = 1e12, 2.5
BUDGET = ["--tokens", "1T", "--gpu-hour-price", "2.5"]
SWEEP = ["sweep", "--model", "qwen3-30b-a3b", "--gpus", "16", "--gpu", "h100-80gb", "--seq-len", "4096",
         "--gbs", "256", "--top", "4"]
ESTIMATE = ["estimate", "--model", "mixtral-8x7b", "--gpus", "64", "--gpu", "h100-80gb", "--pp", "4", "--ep", "8",
            "--seq-len", "4096", "--gbs", "256"]


def _run(*args) -> str:
    result = CliRunner().invoke(cli, [*args])
    assert result.exit_code == 0, result.output
    return result.stdout


def _by_hand(row: dict) -> dict:
    days = TOKENS / row["tokens_per_s"] / 86400
    return {"tokens": TOKENS, "days": days, "gpu_hours": days * 24 * row["gpus"],
            "cost_usd": days * 24 * row["gpus"] * PRICE}


def _assert_budget(row: dict) -> None:
    for key, value in _by_hand(row).items():
        assert float(row[key]) == pytest.approx(value, rel=1e-12), key


def test_an_moe_sweeps_json_and_csv_rows_carry_the_budget():
    plain = json.loads(_run(*SWEEP, "--format", "json"))
    rows = json.loads(_run(*SWEEP, *BUDGET, "--format", "json"))
    assert len(rows) == 4
    for row, before in zip(rows, plain):
        _assert_budget(row)
        # the budget adds its keys and changes nothing else
        assert {k: v for k, v in row.items() if k not in ("tokens", "days", "gpu_hours", "cost_usd")} == before
    table = list(csv.DictReader(io.StringIO(_run(*SWEEP, *BUDGET, "--format", "csv"))))
    assert [int(r["rank"]) for r in table] == [1, 2, 3, 4]
    for line, row in zip(table, rows):
        _assert_budget({**line, "tokens_per_s": float(line["tokens_per_s"]), "gpus": int(line["gpus"])})
        assert float(line["days"]) == pytest.approx(row["days"], rel=1e-12)


def test_an_moe_sweep_table_shows_days_gpu_hours_and_cost():
    rows = json.loads(_run(*SWEEP, *BUDGET, "--format", "json"))
    text = _run(*SWEEP, *BUDGET, "--wide")
    table = read_table(text)
    assert table.headers[-3:] == ["days", "GPU-h", "cost $"]
    for cells, row in zip(table.rows, rows, strict=True):
        days, hours, cost = (float(cell.replace(",", "")) for cell in cells[-3:])
        hand = _by_hand(row)
        assert days == pytest.approx(hand["days"], abs=0.05)
        assert hours == pytest.approx(hand["gpu_hours"], abs=0.5)
        assert cost == pytest.approx(hand["cost_usd"], abs=0.5)
    assert "days" not in read_table(_run(*SWEEP, "--wide")).headers


def test_an_moe_estimate_json_csv_and_caption_carry_the_budget():
    row = json.loads(_run(*ESTIMATE, *BUDGET, "--format", "json"))
    _assert_budget(row)
    plain = json.loads(_run(*ESTIMATE, "--format", "json"))
    assert row["step_time_s"] == plain["step_time_s"] and row["stages"] == plain["stages"]
    assert "days" not in plain and "tokens" not in plain
    stages = list(csv.DictReader(io.StringIO(_run(*ESTIMATE, *BUDGET, "--format", "csv"))))
    assert len(stages) == 4
    for stage in stages:  # the run's figures on every stage's row, as a dense estimate's CSV
        for key in ("days", "gpu_hours", "cost_usd"):
            assert float(stage[key]) == pytest.approx(_by_hand(row)[key], rel=1e-12)
    caption = next(line for line in _run(*ESTIMATE, *BUDGET).splitlines() if "GPU-hours" in line)
    # this layout is judged oom at 80 GiB: its time lines say what it would take if it fit
    prefix = "if it fit: " if row["verdict"] in ("oom", "likely oom") else ""
    assert caption.startswith(f"{prefix}1T tokens: ")
    numbers = [float(word.strip("$,").replace(",", "")) for word in caption.split()
               if word.strip("$,").replace(",", "").replace(".", "").isdigit()]
    hand = _by_hand(row)
    assert numbers[0] == pytest.approx(hand["days"], abs=0.05)
    assert numbers[1] == pytest.approx(hand["gpu_hours"], abs=0.5)
    assert numbers[2] == pytest.approx(hand["cost_usd"], abs=0.5)
    assert numbers[3] == PRICE


def test_a_budget_needs_a_gpu_and_a_price_needs_a_budget_as_for_dense_models():
    for model in ("llama3.1-8b", "mixtral-8x7b"):
        for args, message in ((["--mem", "80", "--tokens", "1T"], "--tokens needs --gpu NAME"),
                              (["--gpu", "h100-80gb", "--gpu-hour-price", "2"], "--gpu-hour-price needs --tokens")):
            for command in ("sweep", "estimate"):
                result = CliRunner().invoke(cli, [command, "--model", model, "--gpus", "64", *args])
                assert result.exit_code == 2 and message in result.output, (model, command, result.output)


def test_an_moe_row_with_a_budget_launches_its_length(advisor, tmp_path):
    """advisor-launch derives --train-samples from the row's own tokens and sequence length:
    ceil(1e12 / 4096) = 244,140,625 samples; Megatron trains floor(244,140,625 / 256) = 953,674
    iterations of them (update_train_iters drops the partial last batch)."""
    sweep = sweep_file(advisor, tmp_path / "moe.json", *SWEEP[1:], "--tokens", "1T")
    row = json.loads(sweep.read_text())[0]
    assert (row["tokens"], row["seq_len"], row["global_batch_size"]) == (1e12, 4096, 256)
    samples = math.ceil(row["tokens"] / row["seq_len"])
    iterations = samples // row["global_batch_size"]
    assert (samples, iterations) == (244_140_625, 953_674)
    result = launcher()("sbatch", "--from", sweep, "--megatron-version", "0.15", "--dry-run", "--mock-data",
                        "--", "--lr", "1e-4")
    args = result.stdout.split()
    assert args[args.index("--train-samples") + 1] == args[args.index("--lr-decay-samples") + 1] == str(samples)
    assert "--train-iters" not in args
    length = next(line for line in result.stderr.splitlines() if "length:" in line)
    assert f"= {samples:,} samples of 4096 tokens = {iterations:,} iterations of 256" in length, length
