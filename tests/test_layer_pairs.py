"""tables/published/layer_pairs.py: a step split into a part per layer and a fixed part, from
published runs that differ in their layer count alone (DGX Cloud's Llama 3.1 405B at 21 and 42
layers). The arithmetic by hand from the published step times; the pairing on the data file."""

import pytest

from tables.published.layer_pairs import microbatches, pairs, split
from tables.published.runs import load


def test_a_line_through_two_points_is_recovered_exactly():
    # t = 0.5 + 0.25 L at L = 21 and 42
    assert split(0.5 + 0.25 * 21, 0.5 + 0.25 * 42, 21, 42) == pytest.approx((0.5, 0.25))


def test_the_405b_runs_pair_by_layers_with_63_microbatches():
    runs = load()
    by_name = {run.run: run for run in runs}
    # 96 GPUs / (TP 8 x PP 3 x CP 2) = DP 2; GBS 126 / (MBS 1 x DP 2) = 63
    assert microbatches(by_name["dgxc-24.09-405b-fp8-96"]) == 63
    # 192 GPUs: DP 4, GBS 252: 63 as well
    assert microbatches(by_name["dgxc-24.09-405b-fp8-192"]) == 63
    rows = [{"run": run.run, "predicted_s": 1.0 + 0.2 * run.num_layers} for run in runs]
    found = pairs(runs, rows, overhead_s=0.02)
    assert [pair["runs"] for pair in found] == [
        (f"dgxc-{release}-405b-{precision}-96", f"dgxc-{release}-405b-{precision}-192")
        for release in ("24.09", "24.12") for precision in ("bf16", "fp8")]
    fp8 = found[1]
    assert fp8["layers"] == (21, 42) and fp8["microbatches"] == 63
    # published 5.71 s at 21 layers and 11.0 s at 42: b = (11.0 - 5.71) / 21 = 0.25190,
    # a = 5.71 - 21 b = 2 x 5.71 - 11.0 = 0.42
    assert fp8["published"]["per_layer_s"] == pytest.approx(0.2519048, rel=1e-6)
    assert fp8["published"]["fixed_s"] == pytest.approx(0.42, abs=1e-9)
    # the stand-in predictions are the line 1.0 + 0.2 L itself
    assert fp8["predicted"] == pytest.approx({"fixed_s": 1.0, "per_layer_s": 0.2})
    assert fp8["overhead_s"] == pytest.approx(63 * 0.02)
    # one layer, one microbatch: (0.2519048 - 0.2) x PP 3 / 63 = 2.4717 ms missing from the stand-in
    assert fp8["pp"] == 3 and fp8["layer_gap_s"] == pytest.approx(2.4717e-3, rel=1e-4)


def test_a_run_the_advisor_refused_leaves_no_pair():
    runs = load()
    rows = [{"run": run.run, "predicted_s": None if run.run == "dgxc-24.09-405b-fp8-96" else 1.0} for run in runs]
    assert len(pairs(runs, rows, overhead_s=0.0)) == 3
