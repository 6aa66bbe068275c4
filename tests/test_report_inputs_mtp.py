"""A saved MoE row's MTP layers have one source: the model spec its reader built
(``advisor.saved_row.moe_row_settings`` takes the spec; the raw 'model' dict is not read
again). megatron-core refuses more than one MTP layer beside
--overlap-moe-expert-parallel-comm (advisor.moe.overlap.settings_problem)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from launch_support import write_json

from advisor.errors import AdvisorError
from advisor.models import preset
from advisor.saved_row import moe_row_settings

ROOT = Path(__file__).resolve().parent.parent
OVERLAP = "--overlap-moe-expert-parallel-comm"
# a qwen3-30b-a3b row with the EP all-to-all overlap, as tests/test_moe_cli.py's overlap_row saves it
SWEEP = ["sweep", "--model", "qwen3-30b-a3b", "--gpus", "16", "--gpu", "h100-80gb", "--seq-len", "4096", "--gbs",
         "256", "--format", "json", "--ep", "8", OVERLAP, "--recompute", "selective", "--top", "1"]


def run(module: str, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


@pytest.fixture(scope="module")
def overlap_row(tmp_path_factory) -> dict:
    path = tmp_path_factory.mktemp("mtp") / "rows.json"
    result = run("advisor", *SWEEP, "-o", path)
    assert result.returncode == 0, result.stderr
    row = json.loads(path.read_text())[0]
    assert row["a2a_overlap"] and row["model"].get("mtp_num_layers", 0) == 0
    return row


def test_the_mtp_rule_reads_the_built_spec(overlap_row):
    """The spec decides, whatever the raw dict says: a spec of 2 MTP layers is refused beside the
    overlap, though the row's own 'model' has none; 1 is allowed."""
    spec = preset("qwen3-30b-a3b")
    with pytest.raises(AdvisorError, match=f"{OVERLAP} allows at most one MTP layer, got --mtp-num-layers 2"):
        moe_row_settings(overlap_row, "row", replace(spec, mtp_num_layers=2))
    assert moe_row_settings(overlap_row, "row", replace(spec, mtp_num_layers=1))["a2a_overlap"] is True


@pytest.mark.parametrize("layers, allowed", [(1, True), (2, False)])
def test_both_readers_apply_the_mtp_rule_to_a_saved_row(tmp_path, overlap_row, layers, allowed):
    # the model edited, its flags dropped (as a row written before rows carried them): edited
    # flags that disagree with the fields are refused as such (tests/test_audit_launch.py)
    edited = {key: value for key, value in overlap_row.items() if key != "megatron_args"}
    row = write_json(tmp_path / "row.json", {**edited, "model": {**overlap_row["model"], "mtp_num_layers": layers}})
    page = tmp_path / "page.html"
    report = run("advisor", "report", "--from", row, "-o", page)
    launch = run("launch", "args", "--from", row, "--format", "json")
    if allowed:
        assert report.returncode == 0 and page.exists(), report.stderr
        args = json.loads(launch.stdout)
        assert args[args.index("--mtp-num-layers") + 1] == "1"
        return
    words = f"{OVERLAP} allows at most one MTP layer, got --mtp-num-layers 2 (megatron-core refuses more)"
    for result in (report, launch):
        assert result.returncode == 2 and result.stderr.strip().endswith(words), result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and result.stdout == ""
    assert not page.exists()


def test_a_malformed_mtp_count_is_the_models_own_refusal(tmp_path, overlap_row):
    """The model's reader refuses it by name before any setting is checked (it was read as 0 by a
    second reader of the same field, then refused by the first)."""
    row = write_json(tmp_path / "row.json", {**overlap_row, "model": {**overlap_row["model"],
                                                                       "mtp_num_layers": "2"}})
    for result in (run("advisor", "report", "--from", row, "-o", tmp_path / "page.html"),
                   run("launch", "args", "--from", row)):
        assert result.returncode == 2, result.stderr
        assert "mtp_num_layers must be an integer, got '2'" in result.stderr.strip().splitlines()[-1]
