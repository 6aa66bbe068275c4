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
from advisor.paper_rule import DEFAULT_THRESHOLD, classify
from advisor.sweep import sweep
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
    # within the tolerance of the fastest the simplest lead; after them, fastest first
    floor = (1 - ranked[0]["ranking_tolerance"]) * max(tflops)
    near = sum(t >= floor for t in tflops)
    assert 0 < near < len(tflops) and min(tflops[:near]) >= floor
    assert tflops[near:] == sorted(tflops[near:], reverse=True)
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
    band = load_memory_calibration().band
    assert row["usage_gib"] / 80 <= 1 - band and row["verdict"] == "fits" and row["layers_per_stage"] == [16, 16]
    uneven = advisor.json("estimate", "--tp", 2, "--pp", 2, "--gpus", 16, "--gpu", "h100-80gb",
                          "--layers-per-stage", "15,17")
    # the same layers in all: the same compute; the 17-layer stage sets the pace, so the bubble grows
    moved = uneven["time_parts"]
    assert uneven["layers_per_stage"] == [15, 17] and moved["compute_s"] == pytest.approx(parts["compute_s"])
    assert moved["bubble_s"] > parts["bubble_s"] and uneven["step_time_s"] > row["step_time_s"]


def test_sweep_plot_writes_a_png(tmp_path, advisor):
    from PIL import Image

    path = tmp_path / "sweep.png"
    advisor("sweep", "--gpus", 64, "--gpu", "h100-80gb", "--top", 10, "--plot", path)
    assert path.read_bytes()[:8] == PNG
    image = Image.open(path).convert("RGB")
    # 11 x (1.6 + 0.24 x 10) inches at 110 dpi; ten green (fits) memory bars and ten dark (ranked) TFLOP/s bars
    assert image.size == (1210, 440)
    colours = image.getcolors(maxcolors=1 << 16)
    assert any(rgb == (0x91, 0xcf, 0x60) and n > 500 for n, rgb in colours)
    assert any(rgb == (0x3b, 0x6f, 0xb6) and n > 500 for n, rgb in colours)
    assert not list(tmp_path.glob(".*tmp"))
    line = Invoker().error("sweep", "--gpus", 64, "--gpu", "h100-80gb", "--plot", tmp_path)
    assert str(tmp_path) in line


def test_an_moe_sweep_plot_names_ep_in_its_labels(tmp_path, advisor):
    """MoE rows are drawn as dense ones are, each labelled with its EP (a layout of a mixture of
    experts is not told apart without it: Mixtral's rows 1 and 2 differ in TP and CP, others in EP)."""
    from PIL import Image

    from advisor.plots import sweep_figure

    path = tmp_path / "moe.png"
    advisor("sweep", "--model", "mixtral-8x7b", "--gpus", 64, "--gpu", "h100-80gb", "--top", 3, "--plot", path)
    assert path.read_bytes()[:8] == PNG and not list(tmp_path.glob(".*tmp"))
    # 11 x max(1.6 + 0.24 x 3, 2.8) inches at 110 dpi
    assert Image.open(path).size == (1210, 308)
    rows = advisor.json("sweep", "--model", "mixtral-8x7b", "--gpus", 64, "--gpu", "h100-80gb", "--top", 3,
                        "--format", "json")
    axes = sweep_figure(rows, experts=True).axes[0]
    assert axes.yaxis.label.get_text() == "(TP, CP, PP, EP, MBS), rank first"
    assert [tick.get_text() for tick in axes.get_yticklabels()] == [
        f"#{row['rank']} ({row['tp']}, {row['cp']}, {row['pp']}, {row['ep']}, {row['mbs']})" for row in rows]


@pytest.mark.parametrize("gpu", [("--gpu", "h100-80gb"), ("--mem", "80")], ids=["timed", "memory only"])
@pytest.mark.parametrize("n", [1, 3, 12])
def test_sweep_plot_fits_its_labels(advisor, gpu, n):
    """A plot of a few rows cut its y-axis label off ('(TP, CP, PP, MBS), rank firs', audit):
    every text of the figure, as the Agg renderer lays it out at the PNG's dpi, lies inside it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from advisor.plots import DPI, sweep_figure

    rows = advisor.json("sweep", "--gpus", 64, *gpu, "--top", n, "--format", "json")
    figure = sweep_figure(rows, "llama3.1-8b, seq 8192, gbs 1024, 64 GPUs")
    figure.set_dpi(DPI)
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    renderer, frame = canvas.get_renderer(), figure.bbox
    label = figure.axes[0].yaxis.label
    assert label.get_text() == "(TP, CP, PP, MBS), rank first"
    texts = [label, figure.axes[0].xaxis.label, figure._suptitle, *figure.axes[0].get_yticklabels()]
    for text in texts:
        box = text.get_window_extent(renderer)
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1, \
            text.get_text()


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


def _row(tflops: float, pp: int = 1, vpp: int = 1, tp: int = 1, recompute: str = "none"):
    from types import SimpleNamespace

    from advisor.memory import MemoryOptions
    from advisor.parallel import ParallelConfig

    return SimpleNamespace(parallel=ParallelConfig(tp=tp, pp=pp, vpp=vpp, dp=1), options=MemoryOptions(recompute=recompute),
                           recomputed_layers=0, tflops=tflops, verdict="fits")


def test_rows_within_the_tolerance_are_ranked_simplest_first():
    """Issue 24: 516 TFLOP/s with 30 pipeline chunks over 507 with none (1.7% less) is a gain
    the time model cannot resolve; 7% tolerance: the simpler first, the rest by speed."""
    from advisor.ranking import order, simplicity_key

    chunky, plain, recomputing, slow = _row(516, pp=2, vpp=15, tp=2), _row(507, tp=2), _row(510, recompute="selective"), \
        _row(400)
    kwargs = dict(verdict=lambda r: r.verdict, paper_key=lambda r: (), tflops=lambda r: r.tflops,
                  simplicity=simplicity_key)
    assert order([chunky, slow, recomputing, plain], "throughput", tolerance=0.07, **kwargs) == \
        [plain, recomputing, chunky, slow]
    assert order([chunky, slow, recomputing, plain], "throughput", tolerance=0.0, **kwargs) == \
        [chunky, recomputing, plain, slow]
    # the boundary: exactly (1 - tolerance) x the fastest is within it
    edge = _row(516 * (1 - 0.5), tp=1)
    assert order([chunky, edge], "throughput", tolerance=0.5, **kwargs)[0] is edge
    assert order([chunky, _row(516 * 0.5 - 1e-9)], "throughput", tolerance=0.5, **kwargs)[0] is chunky


def test_the_8b_top_pick_on_8_h100s_is_the_simplest_within_the_tolerance(advisor):
    from advisor.throughput.calibration import load_ranking_tolerance

    rows = advisor.json("sweep", "--gpus", 8, "--gpu", "h100-80gb")
    tolerance = load_ranking_tolerance()["tolerance"]
    assert rows[0]["ranking_tolerance"] == tolerance > 0
    fastest = max(r["tflops_per_gpu"] for r in rows if r["rank"])
    near = [r for r in rows if r["rank"] and r["tflops_per_gpu"] >= (1 - tolerance) * fastest]
    simplest = min(near, key=lambda r: (r["pp"] * r["vpp"], r["recompute"] != "none", r["tp"] * r["cp"] * r["pp"]))
    assert (rows[0]["tp"], rows[0]["cp"], rows[0]["pp"], rows[0]["vpp"], rows[0]["dp"]) == (2, 1, 1, 1, 4)
    assert rows[0]["rank"] == 1 and rows[0] == simplest


def test_the_80_percent_boundary_is_inclusive(advisor):
    """Seed 004 Section 4.1: fits *at most* 80%. A layout priced exactly at the threshold fits; a
    hair less memory makes it tight. Threshold 0.5 and memory 2 x the estimate make the product
    exact in binary floating point, so '<=' against '<' decides it."""
    import math

    layout = ("--tp", 2, "--gpus", 4, "--split", "even", "--vpp", 1, "--recompute", "none", "--all")
    total = advisor.json("estimate", "--tp", 2, "--gpus", 4)["total_gib"]
    at, below = repr(2 * total), repr(math.nextafter(2 * total, 0))
    estimate = ("estimate", "--tp", 2, "--gpus", 4, "--threshold", 0.5, "--memory-model", "paper")
    assert advisor.json(*estimate, "--mem", at)["verdict"] == "fits"
    assert advisor.json(*estimate, "--mem", below)["verdict"] == "tight"
    # and tight up to all of the memory, inclusive: at exactly the estimate tight, a hair less oom
    assert advisor.json(*estimate, "--mem", repr(total))["verdict"] == "tight"
    assert advisor.json(*estimate, "--mem", repr(math.nextafter(total, 0)))["verdict"] == "oom"
    sweep = ("sweep", "--gpus", 4, "--threshold", 0.5, *layout[4:])
    for mem, verdict in ((at, "fits"), (below, "tight")):
        row = next(r for r in advisor.json(*sweep, "--mem", mem)
                   if (r["tp"], r["cp"], r["pp"], r["mbs"]) == (2, 1, 1, 1))
        assert row["total_gib"] == total and row["verdict"] == verdict
