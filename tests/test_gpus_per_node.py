"""Every sweep row and estimate records the GPUs per node it was priced at (``gpus_per_node``: the
NVLink domain its time model priced TP inside, ``advisor.throughput.terms.link_bandwidth``), and its
readers, advisor-launch and advisor report, read it: a row priced at 4 GPUs per node is re-priced
at 4, and a malformed value is one line."""

import json

import pytest
from launch_support import launcher, write_json

from conftest import ROOT

H100 = next(gpu for gpu in json.loads((ROOT / "advisor" / "gpus.json").read_text())["gpus"]
            if gpu["name"] == "h100-80gb")
"""The preset as its data file gives it, read apart from advisor.hardware."""
MOE = ("--model", "qwen3-30b-a3b", "--seq-len", "4096", "--gbs", "64")


def test_the_presets_node_size_is_in_every_row(advisor):
    """Dense and MoE, estimate and sweep: the preset's node (8 GPUs for an HGX H100, its data
    file says), --gpus-per-node's where given, the sweep's default of 8 without a preset."""
    assert H100["gpus_per_node"] == 8
    preset = ("--gpu", "h100-80gb")
    rows = [advisor.json("estimate", "--tp", "2", "--gpus", "8", *preset),
            advisor.json("sweep", "--gpus", "8", *preset, "--top", "3")[0],
            advisor.json("estimate", *MOE, "--gpus", "8", "--ep", "8", *preset),
            advisor.json("sweep", *MOE, "--gpus", "8", *preset, "--top", "3", "--all")[0]]
    assert [row["gpus_per_node"] for row in rows] == [H100["gpus_per_node"]] * 4
    given = [advisor.json("estimate", "--tp", "2", "--gpus", "8", *preset, "--gpus-per-node", "4"),
             advisor.json("sweep", "--gpus", "8", *preset, "--gpus-per-node", "4", "--top", "3")[0],
             advisor.json("estimate", *MOE, "--gpus", "8", "--ep", "8", *preset, "--gpus-per-node", "4")]
    assert [row["gpus_per_node"] for row in given] == [4, 4, 4]
    assert advisor.json("estimate", "--tp", "2", "--gpus", "8", "--mem", "80")["gpus_per_node"] == 8


def test_the_report_reprices_a_row_at_its_own_node_size(advisor, tmp_path):
    """TP 8 priced on nodes of 4 crosses the network; the report's detail re-priced it at the
    preset's 8, over NVLink: parts the row's step never had."""
    from advisor.report.details import layout_detail

    row = advisor.json("estimate", "--tp", "8", "--gpus", "16", "--gpu", "h100-80gb", "--gpus-per-node", "4")
    within = advisor.json("estimate", "--tp", "8", "--gpus", "16", "--gpu", "h100-80gb")
    assert row["time_parts"]["tp_comm_s"] > 2 * within["time_parts"]["tp_comm_s"]  # priced apart at all
    assert layout_detail(row).time_parts["tp_comm_s"] == pytest.approx(row["time_parts"]["tp_comm_s"])
    advisor("report", "--from", write_json(tmp_path / "row.json", row), "-o", tmp_path / "r.html")
    assert "GPUs per node</th><td>4<" in (tmp_path / "r.html").read_text()


@pytest.mark.parametrize("value", [0, "8", 4096])
def test_a_malformed_gpus_per_node_is_one_line_for_both_readers(advisor, tmp_path, value):
    row = advisor.json("estimate", "--tp", "2", "--gpus", "8", "--gpu", "h100-80gb")
    path = write_json(tmp_path / "bad.json", {**row, "gpus_per_node": value})
    assert "'gpus_per_node'" in launcher().error("args", "--from", path)
    assert "'gpus_per_node'" in advisor.error("report", "--from", path, "-o", tmp_path / "r.html")
