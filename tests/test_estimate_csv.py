"""'advisor estimate --format csv' carries the run's verdict and time figures, not only the memory
per stage: one header, one row per pipeline stage with its own columns first, then the run's values
(the JSON's keys; its step's parts as ``time_parts.<part>``) repeated on every stage's row."""

import csv
import io
import json

import pytest

from advisor.paper_rule import classify

DENSE = ("estimate", "--tp", "2", "--pp", "2", "--mbs", "1", "--gpus", "16")
TIMED = (*DENSE, "--gpu", "h100-80gb", "--tokens", "1T", "--gpu-hour-price", "2")
MOE = ("estimate", "--model", "mixtral-8x7b", "--tp", "2", "--pp", "2", "--ep", "4", "--mbs", "1", "--gpus", "32",
       "--gpu", "h100-80gb")
TIMES = ("step_time_s", "tflops_per_gpu", "mfu", "tokens_per_s")


def _csv(advisor, *args) -> tuple[list[str], list[dict]]:
    text = advisor(*args, "--format", "csv").stdout
    reader = csv.DictReader(io.StringIO(text))
    rows = list(reader)
    assert len(text.splitlines()) == 1 + len(rows)  # one header, one line per stage
    return reader.fieldnames, rows


def _number(cell: str) -> float:
    return float(cell)


def test_dense_csv_has_the_verdict_and_the_times(advisor):
    header, rows = _csv(advisor, *TIMED)
    whole = json.loads(advisor(*TIMED, "--format", "json").stdout)
    assert len(rows) == 2 and [row["stage"] for row in rows] == ["0", "1"]
    # the stage's own columns first, as before, in the JSON's order
    assert header[:len(whole["stages"][0])] == list(whole["stages"][0])
    for key in ("verdict", "memory_model", "margin_gib", *TIMES, "days", "gpu_hours", "cost_usd"):
        assert {row[key] for row in rows} == {str(whole[key])}, key  # the run's, on every stage's row
    assert rows[0]["verdict"] == "fits" and rows[0]["memory_model"] == "calibrated"
    parts = {key.removeprefix("time_parts."): _number(rows[0][key]) for key in header if key.startswith("time_parts.")}
    assert {"compute_s", "tp_comm_s", "bubble_s", "dp_comm_s"} <= parts.keys()
    # the step is its parts, and the cost its GPU-hours at the price given
    assert parts["total_s"] == pytest.approx(_number(rows[0]["step_time_s"]), rel=1e-12)
    assert sum(v for k, v in parts.items() if k != "total_s") == pytest.approx(parts["total_s"], rel=1e-9)
    assert _number(rows[0]["cost_usd"]) == pytest.approx(2 * _number(rows[0]["gpu_hours"]), rel=1e-12)
    # a stage's total stays its own; the run's peak is the row at peak_stage
    totals = [_number(row["total_gib"]) for row in rows]
    assert totals[0] != totals[1] and int(rows[0]["peak_stage"]) == totals.index(max(totals))


@pytest.mark.parametrize("threshold, verdict", [(None, "tight"), ("0.9", "fits")])
def test_paper_verdict_follows_the_stage_totals(advisor, threshold, verdict):
    """Llama-3.1-8B on TP 2, PP 1 peaks at 67.5 GiB: 84% of 80 GiB, tight by the 80% rule."""
    args = ("estimate", "--tp", "2", "--pp", "1", "--mbs", "1", "--gpus", "4", "--mem", "80",
            *(("--threshold", threshold) if threshold else ()))
    header, rows = _csv(advisor, *args)
    peak = max(_number(row["total_gib"]) for row in rows)
    assert rows[0]["verdict"] == verdict == classify(peak, 80, float(threshold or 0.8))
    assert _number(rows[0]["memory_fraction"]) == pytest.approx(peak / 80, rel=1e-12)
    assert not any(key in header for key in TIMES) and not any(key.startswith("time_parts.") for key in header)


def test_without_memory_the_verdict_is_empty(advisor):
    header, rows = _csv(advisor, *DENSE)
    assert "verdict" in header and {row["verdict"] for row in rows} == {""}  # null in the JSON


def test_moe_csv_has_the_verdict_and_the_times(advisor):
    header, rows = _csv(advisor, *MOE)
    whole = json.loads(advisor(*MOE, "--format", "json").stdout)
    assert header[:len(whole["stages"][0])] == list(whole["stages"][0])
    for key in ("verdict", "memory_gib", "margin_gib", *TIMES):
        assert {row[key] for row in rows} == {str(whole[key])}, key
    assert _number(rows[0]["time_parts.ep_comm_s"]) > 0  # the expert all-to-all, the MoE step's own part
    # an MoE stage's usage_gib stays per stage: the verdict's margin is the peak stage's
    usage = [_number(row["usage_gib"]) for row in rows]
    peak = int(rows[0]["calibrated_peak_stage"])
    assert usage[0] != usage[1] and usage[peak] == max(usage)
    assert _number(rows[0]["margin_gib"]) == pytest.approx(_number(rows[0]["memory_gib"]) - usage[peak], rel=1e-9)
    assert header.count("usage_gib") == 1


def test_the_parameter_count_is_written_as_a_whole_number(advisor):
    """Llama-3.1-8B on TP 2, PP 2, by hand (h 4096, 32 heads, 8 KV heads of 128, h_ffn 14336,
    v 128256): a layer holds (2h^2 + 2h·1024)/2 + 3h·h_ffn/2 + 2h = 109,060,096 on one GPU, the
    embedding and the untied head hv/2 = 262,668,288 each, the final norm h. The CSV wrote them
    '2007629824.0' (a float), beside the sweep's whole counts."""
    layer = (2 * 4096 * 4096 + 2 * 4096 * 1024) // 2 + 3 * 4096 * 14336 // 2 + 2 * 4096
    embedding = 128256 * 4096 // 2
    header, rows = _csv(advisor, *DENSE)
    assert [row["parameters"] for row in rows] == [str(16 * layer + embedding), str(16 * layer + 4096 + embedding)]
    stages = json.loads(advisor(*DENSE, "--format", "json").stdout)["stages"]
    assert [stage["parameters"] for stage in stages] == [16 * layer + embedding, 16 * layer + 4096 + embedding]
    assert all(type(stage["parameters"]) is int for stage in stages)


@pytest.mark.parametrize("given, count", [("1T", 10**12), ("10P", 10**16), ("4.1T", 4_100_000_000_000)])
def test_a_token_budget_is_written_as_a_whole_count(advisor, given, count):
    """--tokens 1T is 10^12 tokens: the JSON's 'tokens' is that integer and the CSV's cell its digits
    (not 1000000000000.0, nor 1e+16 for 10P), in a sweep row and an estimate (JSON); 4.1T is 4.1 x 10^12
    exactly, not float's 4099999999999.9995."""
    sweep = ("sweep", "--gpus", "16", "--gpu", "h100-80gb", "--tokens", given, "--top", "1")
    row = json.loads(advisor(*sweep, "--format", "json").stdout)[0]
    estimate = json.loads(advisor(*DENSE, "--gpu", "h100-80gb", "--tokens", given, "--format", "json").stdout)
    for tokens in (row["tokens"], estimate["tokens"]):
        assert type(tokens) is int and tokens == count
    sweep_csv = list(csv.DictReader(io.StringIO(advisor(*sweep, "--format", "csv").stdout)))
    assert sweep_csv[0]["tokens"] == str(count)
