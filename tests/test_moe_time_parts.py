"""Where an MoE step goes (advisor.moe.time.step_parts): the parts add up to the step, and the
pipeline's own parts against hand-derived values."""

import json

import pytest
from click.testing import CliRunner

from advisor.cli import cli
from advisor.hardware import get_gpu
from advisor.moe.space import estimate_layout
from advisor.moe.spec import PRESETS
from advisor.moe.stage import MoEOptions
from advisor.parallel import Workload
from advisor.report.details import _moe_detail
from advisor.throughput.calibration import load_calibration

MIXTRAL = PRESETS["mixtral-8x7b"]
H100 = get_gpu("h100-80gb")


def _estimate(**layout):
    options = layout.pop("options", MoEOptions())
    base = dict(tp=1, cp=1, pp=4, ep=8, etp=1, dp=16, mbs=1)
    return estimate_layout(MIXTRAL, Workload(seq_len=4096, global_batch_size=1024), **{**base, **layout}, gpu=H100,
                           memory_gib=80, options=options)


def test_the_parts_add_up_to_the_step_and_name_the_rows_ep_communication():
    for layout in ({}, {"pp": 1, "dp": 64}, {"vpp": 2}, {"vpp": 2, "options": MoEOptions(a2a_overlap=True)}):
        row = _estimate(**layout)
        parts = row["time_parts"]
        assert parts["total_s"] == row["step_time_s"]
        assert sum(v for k, v in parts.items() if k != "total_s") == pytest.approx(row["step_time_s"], rel=1e-12)
        assert all(v >= 0 for v in parts.values()), (layout, parts)
        assert parts["ep_comm_s"] == row["ep_comm_s"]


def test_the_pipeline_parts_by_hand():
    # Mixtral 8x7B, seq 4096, GBS 1024, 64 GPUs: TP 1, PP 4, DP 16, MBS 1 -> 1024 / 16 = 64 microbatches
    row = _estimate()
    parts, m = row["time_parts"], 64
    assert parts["overhead_s"] == pytest.approx(m * load_calibration().microbatch_overhead_s)
    # a stage boundary's activation, [4096 tokens, 4096] in BF16, to a neighbour TP x CP x DP = 16
    # ranks away (another node): 50 GB/s per GPU (the preset's 400 Gb/s NIC) x the fitted network
    # efficiency (0.9962: 49.81 GB/s) plus 20 us of latency, sent forward and backward for each
    # microbatch: 33,554,432 B / 49.81e9 = 673.65 us + 20 = 693.65 us, x 2 x 64 = 88.79 ms
    net = load_calibration().network_efficiency
    assert H100.network_bytes_per_s == 50e9
    send = 2 * 4096 * 4096 / (50e9 * net) + 20e-6
    assert send == pytest.approx(693.65e-6, abs=0.01e-6)
    assert parts["pp_comm_s"] == pytest.approx(m * 2 * send)
    assert m * 2 * send == pytest.approx(88.79e-3, abs=0.01e-3)
    assert parts["bubble_s"] > 0 and parts["data_wait_s"] == 0.0
    # two model chunks per rank: each microbatch crosses twice as many boundaries, and the fill and
    # drain shrink (divided by v, though each chunk's sends are in them too)
    interleaved = _estimate(vpp=2)["time_parts"]
    assert interleaved["pp_comm_s"] == pytest.approx(2 * parts["pp_comm_s"])
    assert interleaved["overhead_s"] == parts["overhead_s"]
    assert interleaved["bubble_s"] < parts["bubble_s"]


def test_one_stage_has_no_bubble_and_no_sends():
    parts = _estimate(pp=1, dp=64)["time_parts"]
    assert parts["bubble_s"] == parts["pp_comm_s"] == 0.0
    assert parts["overhead_s"] == pytest.approx(16 * load_calibration().microbatch_overhead_s)  # 1024 / 64


def test_the_overlap_hides_ep_communication_and_the_estimate_shows_it():
    plain = _estimate(vpp=2)["time_parts"]
    hidden = _estimate(vpp=2, options=MoEOptions(a2a_overlap=True))["time_parts"]
    assert hidden["ep_comm_s"] < plain["ep_comm_s"] and hidden["compute_s"] >= plain["compute_s"]
    result = CliRunner().invoke(cli, ["estimate", "--model", "mixtral-8x7b", "--gpus", "64", "--gpu", "h100-80gb",
                                       "--tp", "1", "--pp", "4", "--ep", "8", "--mbs", "1", "--seq-len", "4096"],
                                env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    words = " ".join(result.output.split())  # the caption wraps to the terminal's width
    assert "ep comm" in words and "pp comm" in words and "bubble" in words
    assert max(len(line) for line in result.output.splitlines()) <= 100
    row = json.loads(CliRunner().invoke(cli, ["estimate", "--model", "mixtral-8x7b", "--gpus", "64", "--gpu",
                                               "h100-80gb", "--tp", "1", "--pp", "4", "--ep", "8", "--mbs", "1",
                                               "--seq-len", "4096", "--format", "json"]).stdout)
    assert row["time_parts"]["overhead_s"] == pytest.approx(64 * load_calibration().microbatch_overhead_s)
    assert _moe_detail(row).time_parts == row["time_parts"]  # the report draws them
