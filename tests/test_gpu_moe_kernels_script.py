"""benchmarks/gpu/time_moe_kernels.py, the unattended GPU timing of an MoE layer's small kernels
against advisor.moe.time's price, run on the CPU on a shrunken preset (--device cpu --tiny) so
that its errors show here and not on the lent GPU."""

import gzip
import json
import subprocess
import sys

import pytest

import warm_python
from conftest import ROOT

SCRIPT = "benchmarks/gpu/time_moe_kernels.py"
DISPATCHERS = ("alltoall", "allgather")
PARTS = ("price", "build", "router", "router-profile", "dispatch", "dispatch-profile", "block")
PRESETS = ("h100-80gb", "h200-141gb")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install -e '.[megatron]')")
    out = tmp_path_factory.mktemp("kernels") / "out"
    done = warm_python.run([SCRIPT, out, "--device", "cpu", "--tiny"], timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return out, json.loads((out / "summary.json").read_text())


def test_every_part_of_each_dispatcher_runs(tiny_run):
    _, summary = tiny_run
    assert set(summary["parts"]) == {f"{d}-{p}" for d in DISPATCHERS for p in PARTS}
    failed = {name: part.get("error") for name, part in summary["parts"].items() if not part["ok"]}
    assert failed == {}
    assert summary["device"] == "cpu" and summary["seq_len"] == 32 and summary["tiny"] is True
    # the router the advisor's flags emit for the preset, with the published runs' forced balancing
    assert summary["router"] == {"moe_router_load_balancing_type": "aux_loss", "moe_aux_loss_coeff": 0.001,
                                 "moe_router_dtype": "fp32", "moe_router_force_load_balancing": True,
                                 "moe_z_loss_coeff": None}
    for dispatcher in DISPATCHERS:
        built = summary["parts"][f"{dispatcher}-build"]["result"]
        assert built["router"] == "TopKRouter" and built["experts"] == "SequentialMLP"
        assert built["tokens"] == 32 and built["routed_copies"] == 32 * summary["sizes"]["moe_router_topk"]


def test_each_timed_part_has_positive_times_and_the_advisors_price(tiny_run):
    _, summary = tiny_run
    for dispatcher in DISPATCHERS:
        for part in ("router", "dispatch", "block"):
            result = summary["parts"][f"{dispatcher}-{part}"]["result"]
            timing = result["isolated"]
            assert timing["repeats"] >= 1 and 0 < timing["min_s"] <= timing["median_s"] <= timing["max_s"]
            assert result["queued"] is None  # CUDA only
            assert set(result["isolated_vs_predicted"]) == set(PRESETS)
            for compared in result["isolated_vs_predicted"].values():
                assert compared["predicted_s"] > 0 and compared["measured_over_predicted"] > 0
            row = summary["readout"][f"{dispatcher}-{part}"]
            assert row["isolated_s"] == timing["median_s"] and row["predicted_h100-80gb_s"] > 0


def test_the_price_is_advisor_moe_times_terms(tiny_run):
    """The recorded price is layer_times' router term, the permutations by expert at
    PERMUTE_HBM_FRACTION of the calibrated HBM rate and those by local expert at the rate, and
    host_sync_idle, forward and backward as layer_times prices them."""
    from advisor.moe import ep_time

    _, summary = tiny_run
    for dispatcher in DISPATCHERS:
        for preset in PRESETS:
            priced = summary["predicted"][dispatcher][preset]
            forward, both = priced["forward"], priced["forward_backward_s"]
            assert forward["router_s"] > 0 and forward["permute_s"] > 0 and forward["comm_s"] == 0  # EP 1
            (by_expert, by_local_expert), rate = priced["permutation_pairs_bytes_forward"], priced["hbm_bytes_per_s"]
            assert priced["permutation_bytes_forward"] == by_expert + by_local_expert
            assert by_local_expert == (by_expert if dispatcher == "alltoall" else 0)  # 8 local experts at EP 1
            assert forward["permute_s"] == pytest.approx(by_expert / rate / ep_time.PERMUTE_HBM_FRACTION
                                                         + by_local_expert / rate)
            assert both["router"] == pytest.approx(3 * forward["router_s"])
            assert both["dispatch"] == pytest.approx(3 * forward["permute_s"] + forward["host_sync_idle_s"])
            assert both["block"] == pytest.approx(3 * forward["block_s"] + forward["host_sync_idle_s"])
            assert priced["host_launch_s"] == ep_time.HOST_LAUNCH_S
        # at the tiny size the permutation queued before alltoall's wait is shorter than one
        # launch, and allgather's wait has nothing queued: both leave the GPU idle
        assert summary["predicted"][dispatcher]["h100-80gb"]["forward"]["host_sync_idle_s"] > 0


def test_each_profile_counts_kernels_and_keeps_its_trace(tiny_run):
    out, summary = tiny_run
    for dispatcher in DISPATCHERS:
        for part in ("router", "dispatch"):
            profile = summary["parts"][f"{dispatcher}-{part}-profile"]["result"]
            assert profile["counted"] == "aten ops (CPU)" and profile["kernels"] > 0
            assert profile["kernel_s"] > 0 and profile["wall_s"] > 0 and profile["span_s"] >= profile["busy_s"] > 0
            assert profile["gaps_s"] == pytest.approx(profile["span_s"] - profile["busy_s"])
            assert profile["top_kernels"] and all(k["name"].startswith("aten::") for k in profile["top_kernels"])
            trace = json.loads(gzip.decompress((out / profile["trace"]).read_bytes()))
            assert trace["traceEvents"]
            assert summary["readout"][f"{dispatcher}-{part}"]["kernels"] == profile["kernels"]
            assert set(profile["kernel_vs_predicted"]) == set(PRESETS)
            assert all(c["predicted_s"] > 0 for c in profile["kernel_vs_predicted"].values())


def test_a_second_run_into_the_same_directory_is_refused_in_one_line(tiny_run):
    out, _ = tiny_run
    again = subprocess.run([sys.executable, SCRIPT, str(out), "--device", "cpu", "--tiny"], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 2 and again.stderr.strip() == f"Error: {out} is not empty"


@pytest.mark.parametrize("argument", [["--repeats", "0"], ["--device", "tpu"], ["--deadline", "soon"]])
def test_a_bad_argument_exits_2_in_one_line(tmp_path, argument):
    done = subprocess.run([sys.executable, SCRIPT, str(tmp_path / "out"), "--tiny", *argument], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith("Error: ")
    assert not (tmp_path / "out").exists()


def test_the_held_out_models_run_too(tmp_path):
    """--model deepseek-v3: its MLA dropped (the local spec cannot build it; the router and the
    dispatcher do not depend on it), its sigmoid group-limited router kept; a model not offered is
    one error line."""
    pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install -e '.[megatron]')")
    out = tmp_path / "dsv3"
    done = warm_python.run([SCRIPT, out, "--device", "cpu", "--tiny", "--model", "deepseek-v3"], timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"] == "deepseek-v3" and all(part["ok"] for part in summary["parts"].values())
    # the preset's flags: the expert bias with DeepSeek-V3's sequence-wise balance loss (config.json
    # seq_aux true, aux_loss_alpha 0.001), run by the real TopKRouter
    assert summary["router"]["moe_router_load_balancing_type"] == "seq_aux_loss"
    assert summary["router"]["moe_aux_loss_coeff"] == 0.001
    bad = subprocess.run([sys.executable, SCRIPT, str(tmp_path / "x"), "--model", "llama3.1-8b"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("Error:") and bad.stderr.count("\n") == 1
