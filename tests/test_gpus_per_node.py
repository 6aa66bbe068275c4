"""Every sweep row and estimate records the GPUs per node it was priced at (``gpus_per_node``: the
NVLink domain its time model priced TP inside, ``advisor.throughput.terms.link_bandwidth``)."""

import json

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
