"""The MoE grouped-GEMM time term against an independent GPU measurement (tables/moe_gemm_probe.py,
benchmarks/gpu/data/h200_moe_grouped_gemm_*.json: one H200, 2026-11-28). The model was calibrated on
dense runs and is not fitted to these timings."""

import pytest

from tables import moe_gemm_probe as probe


@pytest.fixture(scope="module")
def results():
    return probe.load()


def test_every_shape_was_measured_in_every_mode(results):
    assert len(results) == 13
    for r in results:
        assert set(r.measured_s) == {"eager", "serial", "streams4", "fp8_serial", "fp8_streams4"}, r
    assert {(r.model, r.groups, r.m) for r in results} >= set(probe.PUBLISHED_SHAPES)


def test_bf16_grouped_gemms_of_the_published_shapes_are_priced_within_ten_percent(results):
    # What TE's grouped linear costs beyond its arithmetic (one GEMM per expert over 4 streams) is
    # not missing from the model at these shapes: measured 0.92-1.00 of the modelled time.
    for r in results:
        if r.published:
            assert r.measured_s["streams4"] / r.modelled_s["bf16"] == pytest.approx(1.0, abs=0.10), r.published


def test_the_backward_is_twice_the_forward_as_the_model_charges_it(results):
    for r in results:
        if r.m >= 1024:
            backward = r.measured_s["streams4"] - r.forward_s
            assert backward / r.forward_s == pytest.approx(2.0, rel=0.06), (r.model, r.groups, r.m)


def test_small_expert_batches_cost_more_than_the_tile_model_says(results):
    # The m sweep: per-GEMM fixed costs the tile model leaves out dominate below ~1,000 copies per
    # expert (no published run is there); the streams hide part of them.
    sweep = {r.m: r for r in results if r.model == "qwen3-30b-a3b" and r.groups == 16}
    ratios = [sweep[m].measured_s["streams4"] / sweep[m].modelled_s["bf16"] for m in (128, 512, 1024, 4096)]
    assert ratios == sorted(ratios, reverse=True) and ratios[0] > 1.5
    assert all(sweep[m].measured_s["serial"] > sweep[m].measured_s["streams4"] for m in (128, 512, 1024))


def test_fp8_is_optimistic_for_qwen3_30b_a3b_experts_and_right_for_wide_ones(results):
    # fp8_rates prices FP8 GEMMs at twice the BF16 rate. Measured (per-tensor scaled cuBLASLt GEMMs,
    # casts not timed): within 6% for h >= 4096, 11-24% slower than that for Qwen3-30B-A3B's h = 2048,
    # f = 768 experts, where FP8 is 1.5-1.7x BF16, not 2x. Stated in docs/validation.md.
    for r in results:
        if not r.published:
            continue
        ratio = r.measured_s["fp8_streams4"] / r.modelled_s["fp8"]
        if r.model == "qwen3-30b-a3b":
            assert 1.10 < ratio < 1.25, r.published
        else:
            assert ratio == pytest.approx(1.0, abs=0.06), r.published


def test_the_table_fits_100_columns():
    text = probe.markdown() + probe.NOTE
    assert max(len(line) for line in text.splitlines()) <= 100


def test_the_probe_script_runs_on_the_cpu(tmp_path):
    # its structure, on tiny shapes (no GPU here: no streams, graphs or FP8; those ran on the H200)
    import json
    import subprocess
    import sys

    out = tmp_path / "probe.json"
    done = subprocess.run([sys.executable, "benchmarks/gpu/moe_grouped_gemm.py", str(out), "--device", "cpu",
                           "--tiny", "--precisions", "bf16"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert not result["errors"] and not result["skipped"]
    calls = {(r["model"], r["groups"], r["m"], r["call"], r["mode"]) for r in result["rows"]}
    assert {c[3] for c in calls} == set(probe.CALLS) and {c[4] for c in calls} == {"eager", "serial", "one"}
    assert all(r["seconds"] > 0 for r in result["rows"])
