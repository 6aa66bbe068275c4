"""Calibrated verdicts, the ranking rules, and the sweep/estimate output with --gpu."""

import json

import pytest

from advisor.errors import AdvisorError
from advisor.hardware import get_gpu
from advisor.memory import GIB, MemoryOptions, estimate_memory
from advisor.models import preset
from advisor.parallel import ParallelConfig, Workload
from advisor.ranking import order
from advisor.space import PAPER_SPACE
from advisor.sweep import DEFAULT_THRESHOLD, classify, sweep
from advisor.throughput.calibration import CALIBRATION_FILE, SCHEMA, load_memory_calibration, parse_calibration
from advisor.verdicts import MemoryCalibration, assess, verdict_for
from conftest import Invoker

SPEC = preset("llama3.1-8b")
PNG = b"\x89PNG\r\n\x1a\n"


def test_verdict_bands():
    assert [verdict_for(u, 100, 0.05) for u in (95, 95.1, 100, 100.1, 105, 105.1)] == [
        "fits", "likely fits", "likely fits", "likely oom", "likely oom", "oom"]


def test_calibrated_usage_is_eq18_plus_the_documented_terms_by_hand():
    """TP 2, PP 1, MBS 1, 4 GPUs, s = 8192 (the public code's case: 44.87 + 22.64 GiB)."""
    s, b, t, c, h, f, v = 8192, 1, 2, 1, 4096, 14336, 128256
    est = estimate_memory(SPEC, ParallelConfig(tp=t, pp=1, dp=2, mbs=b), Workload(seq_len=s))
    cal = MemoryCalibration(overhead_gib=2.0, reserve_fraction=0.1, activation_factor=1.2, band=0.05)
    layer = s * b * h * (12 + 4 * 8 / 32 + 8 * f / h) / (t * c) * 32
    embedding = 8 * s * b * h / (t * c)
    head = 4 * s * b * h * (1 + v / h) / (t * c)
    activations = layer + embedding + head
    corrected = activations - embedding + 8 * s * b / (t * c) - layer * 2 * f / (h * (12 + 1 + 8 * f / h))
    extra = 2 * GIB + 0.1 * 80 * GIB + 2 * s * b * v / (t * c) + b * s * s * (1 + 1 / c)
    expected = (est.model_states_gib * GIB + 1.2 * corrected + extra) / GIB
    got = assess(est, SPEC, s, b, t, c, 80, MemoryOptions(), cal)
    assert est.activations_gib * GIB == pytest.approx(activations)
    assert got.usage_gib == pytest.approx(expected)
    assert got.margin_gib == pytest.approx(80 - expected)


def test_the_paper_model_stays_eq18_exactly_with_a_gpu():
    """In the paper's space every layout has one variant, so the rows are the same with a GPU; in
    the whole space the time model picks other variants (faster splits, interleaving), each still
    judged by Eq. 18 and the 80% rule on its own estimate."""
    gpu = get_gpu("a100-40gb")
    plain = {r.parallel: r for r in sweep(SPEC, Workload(), 64, 40, space=PAPER_SPACE).rows}
    paper = sweep(SPEC, Workload(), 64, 40, gpu=gpu, memory_model="paper", space=PAPER_SPACE).rows
    assert paper and len(paper) == len(plain)
    for row in paper:
        assert row.estimate.total_gib == plain[row.parallel].estimate.total_gib
        assert row.verdict == plain[row.parallel].verdict and row.verdict in ("fits", "tight", "oom")
    for row in sweep(SPEC, Workload(), 64, 40, gpu=gpu, memory_model="paper").rows:
        assert row.verdict == classify(row.estimate.total_gib, 40, DEFAULT_THRESHOLD)


def test_order_rules():
    rows = [dict(v=v, t=t, u=u, k=k) for v, t, u, k in [
        ("fits", 100, 30, (3,)), ("likely fits", 120, 39, (2,)), ("oom", 200, 50, (1,)), ("tight", 90, 35, (0,))]]
    kwargs = dict(verdict=lambda r: r["v"], paper_key=lambda r: r["k"], tflops=lambda r: r["t"],
                  usage_gib=lambda r: r["u"])
    assert [r["t"] for r in order(rows, "throughput", **kwargs)] == [120, 100, 90]
    assert [r["u"] for r in order(rows, "memory", **kwargs)] == [30, 35, 39]
    assert [r["k"] for r in order(rows, "paper", **kwargs)] == [(0,), (2,), (3,)]
    with pytest.raises(AdvisorError, match="needs a GPU preset"):
        order(rows, "throughput", verdict=lambda r: r["v"], paper_key=lambda r: r["k"])


def test_sweep_with_a_gpu_predicts_time_and_ranks_by_it(advisor):
    rows = advisor.json("sweep", "--gpus", 64, "--gpu", "h100-80gb", "--tokens", "15T")
    ranked = [r for r in rows if r["rank"] is not None]
    assert ranked and [r["rank"] for r in ranked] == list(range(1, len(ranked) + 1))
    assert all(r["verdict"] in ("fits", "likely fits") for r in ranked)
    tflops = [r["tflops_per_gpu"] for r in ranked]
    assert tflops == sorted(tflops, reverse=True)
    for r in rows:
        assert {"step_time_s", "tflops_per_gpu", "mfu", "tokens_per_s", "usage_gib", "margin_gib"} <= r.keys()
        assert r["tokens_per_s"] == pytest.approx(1024 * 8192 / r["step_time_s"])
        assert r["days"] == pytest.approx(15e12 / r["tokens_per_s"] / 86400)
        assert r["gpu_hours"] == pytest.approx(r["days"] * 24 * 64)
        assert r["margin_gib"] == pytest.approx(80 - r["usage_gib"])
        assert r["memory_gib"] == 80 and r["gpu"] == "h100-80gb" and r["memory_model"] == "calibrated"


def test_mem_and_gpus_per_node_override_the_preset(advisor):
    rows = advisor.json("sweep", "--gpus", 16, "--gpu", "h100-80gb", "--mem", 40, "--gpus-per-node", 2, "--all")
    assert {r["memory_gib"] for r in rows} == {40} and max(r["tp"] for r in rows) == 2


def test_rank_by_and_memory_model_flags(advisor):
    paper = advisor.json("sweep", "--gpus", 64, "--gpu", "a100-40gb", "--rank-by", "paper", "--memory-model", "paper")
    assert {r["verdict"] for r in paper} <= {"fits", "tight"}
    memory = advisor.json("sweep", "--gpus", 64, "--gpu", "a100-40gb", "--rank-by", "memory")
    usage = [r["usage_gib"] for r in memory if r["rank"]]
    assert usage == sorted(usage)


def test_estimate_with_a_gpu_reports_time_parts(advisor):
    row = advisor.json("estimate", "--tp", 2, "--pp", 2, "--gpus", 16, "--gpu", "h100-80gb")
    parts = row["time_parts"]
    assert parts["total_s"] == pytest.approx(row["step_time_s"])
    pieces = sum(v for k, v in parts.items() if k not in ("total_s", "data_wait_s"))
    assert parts["total_s"] == pytest.approx(pieces + parts["data_wait_s"], rel=1e-9)
    assert row["verdict"] in ("fits", "likely fits", "likely oom", "oom") and row["layers_per_stage"] == [16, 16]
    uneven = advisor.json("estimate", "--tp", 2, "--pp", 2, "--gpus", 16, "--gpu", "h100-80gb",
                          "--layers-per-stage", "15,17")
    assert uneven["layers_per_stage"] == [15, 17] and uneven["step_time_s"] != row["step_time_s"]


def test_sweep_plot_writes_a_png(tmp_path, advisor):
    path = tmp_path / "sweep.png"
    advisor("sweep", "--gpus", 64, "--gpu", "h100-80gb", "--top", 10, "--plot", path)
    assert path.read_bytes()[:8] == PNG
    assert not list(tmp_path.glob(".*tmp"))
    line = Invoker().error("sweep", "--gpus", 64, "--gpu", "h100-80gb", "--plot", tmp_path)
    assert str(tmp_path) in line


def test_the_calibration_file_is_strict():
    document = json.loads(CALIBRATION_FILE.read_text())
    assert document["schema"] == SCHEMA
    parse_calibration(document["time"])
    with pytest.raises(AdvisorError, match="unknown key"):
        parse_calibration({**document["time"], "speedup": 2})
    with pytest.raises(AdvisorError, match="missing key"):
        parse_calibration({k: v for k, v in document["time"].items() if k != "compute_factor"})
    with pytest.raises(AdvisorError, match="expected exactly the keys"):
        MemoryCalibration.from_dict({**document["memory"], "extra": 1})
    assert load_memory_calibration().fitted == ("reserve_fraction", "activation_factor", "band")
