"""A sweep's rows record the --threshold its paper-rule verdicts were judged by, and 'advisor report'
draws and names the rule at it: a sweep saved with --threshold 0.9 was drawn at the default 80%,
its 'fits' rows above the line the page said they had to stay under. Estimates record it too;
files saved before either did fall back to the default."""

import json
import re

import pytest

from advisor.paper_rule import DEFAULT_THRESHOLD
from advisor.report.details import layout_detail

DENSE = ("sweep", "--gpus", "64", "--mem", "80", "--threshold", "0.9", "--format", "json")
MOE = ("sweep", "--model", "mixtral-8x7b", "--gpus", "32", "--mem", "80", "--threshold", "0.9", "--format", "json")


@pytest.fixture(scope="module")
def invoke():
    from tests.conftest import Invoker

    return Invoker()


@pytest.fixture(scope="module")
def dense_rows(invoke):
    return json.loads(invoke(*DENSE).stdout)


@pytest.fixture(scope="module")
def moe_rows(invoke):
    return json.loads(invoke(*MOE).stdout)


def _between_thresholds(rows):
    """The ranked rows the paper's rule judged 'fits' under 90% that 80% would call 'tight'."""
    return [row for row in rows if row["rank"] and row["verdict"] == "fits" and row["memory_fraction"] > 0.8]


@pytest.mark.parametrize("which", ["dense_rows", "moe_rows"])
def test_paper_rows_record_the_threshold_they_were_judged_by(request, which):
    rows = request.getfixturevalue(which)
    assert {row["threshold"] for row in rows} == {0.9}
    assert {row["memory_model"] for row in rows} == {"paper"}
    # the record is the one the verdicts used: rows between 80% and 90% of the memory are 'fits'
    assert _between_thresholds(rows)
    assert all(row["verdict"] != "fits" for row in rows if row["memory_fraction"] > 0.9)


@pytest.mark.parametrize("model", ["llama3.1-8b", "mixtral-8x7b"])
def test_calibrated_rows_record_no_threshold(invoke, model):
    """The calibrated model judges by its band: the --threshold did not decide their verdicts."""
    rows = json.loads(invoke("sweep", "--model", model, "--gpus", "32", "--gpu", "h100-80gb", "--top", "3",
                             "--format", "json").stdout)
    assert rows and all(row["memory_model"] == "calibrated" and row["threshold"] is None for row in rows)


def test_sweep_csv_has_the_threshold_column(invoke):
    text = invoke("sweep", "--gpus", "8", "--mem", "80", "--threshold", "0.75", "--top", "2", "--format", "csv").stdout
    header, *lines = text.splitlines()
    column = header.split(",").index("threshold")
    assert lines and all(line.split(",")[column] == "0.75" for line in lines)


@pytest.mark.parametrize("which", ["dense_rows", "moe_rows"])
def test_the_detail_draws_the_rows_threshold(request, which):
    rows = request.getfixturevalue(which)
    row = _between_thresholds(rows)[0]
    detail = layout_detail(row)
    assert detail.threshold_gib == pytest.approx(0.9 * 80)
    assert detail.threshold_label == "90% (--threshold)"
    # the verdict 'fits' and the drawn line agree: the peak stage is under it (at 80% it was over)
    peak = max(sum(stage.values()) for stage in detail.stages)
    assert 0.8 * 80 < peak <= detail.threshold_gib


@pytest.mark.parametrize("which", ["dense_rows", "moe_rows"])
def test_a_file_without_the_threshold_falls_back_to_the_default(request, which):
    row = {key: value for key, value in request.getfixturevalue(which)[0].items() if key != "threshold"}
    detail = layout_detail(row)
    assert detail.threshold_gib == pytest.approx(DEFAULT_THRESHOLD * 80)
    assert detail.threshold_label == "80% (4D paper)"
    assert layout_detail({**row, "threshold": None}).threshold_gib == pytest.approx(DEFAULT_THRESHOLD * 80)


def _assumed_rule(page: str) -> str:
    match = re.search(r"<th[^>]*>verdict rule</th>\s*<td[^>]*>([^<]*)</td>", page)
    assert match, "no verdict rule among the assumptions"
    return match.group(1)


def test_the_page_of_a_saved_sweep_uses_its_threshold(invoke, dense_rows, tmp_path):
    saved, page = tmp_path / "sweep.json", tmp_path / "sweep.html"
    saved.write_text(json.dumps(dense_rows))
    invoke("report", "--from", saved, "-o", page)
    text = page.read_text()
    assert "90% (--threshold)" in text and "(4D paper)" not in text
    assert _assumed_rule(text).startswith("the 4D paper&#x27;s: fits &lt;= 90% of memory (the rows&#x27; --threshold)")
    old = tmp_path / "old.json"  # saved before the rows recorded it
    old.write_text(json.dumps([{k: v for k, v in row.items() if k != "threshold"} for row in dense_rows]))
    invoke("report", "--from", old, "-o", page)
    text = page.read_text()
    assert "80% (4D paper)" in text and "(--threshold)" not in text
    assert "fits &lt;= 80% of memory (the default; these rows do not record --threshold)" in _assumed_rule(text)


@pytest.mark.parametrize("value, shown", [(5, "5"), (0, "0"), (-0.5, "-0.5"), ("0.9", "'0.9'"), (True, "true")])
def test_a_threshold_outside_the_rule_is_refused(invoke, dense_rows, tmp_path, value, shown):
    saved = tmp_path / "sweep.json"
    saved.write_text(json.dumps([{**dense_rows[0], "threshold": value}]))
    line = invoke.error("report", "--from", saved, "-o", tmp_path / "r.html")
    assert line == f"Error: {saved}, row 1: 'threshold' must be a number in (0, 1] or null, got {shown}"


@pytest.mark.parametrize("command", [("sweep", "--gpus", "64", "--top", "1"),
                                     ("sweep", "--model", "mixtral-8x7b", "--gpus", "64", "--top", "1"),
                                     ("estimate", "--tp", "2", "--gpus", "8")])
def test_a_threshold_the_calibrated_model_would_ignore_is_refused(invoke, command):
    """The calibrated model judges by its margin, so --threshold beside it changed nothing, silently."""
    line = invoke.error(*command, "--gpu", "h100-80gb", "--threshold", "0.9")
    assert "--threshold is the 4D paper's rule (--memory-model paper)" in line
    judged = invoke.json(*command, "--gpu", "h100-80gb", "--threshold", "0.9", "--memory-model", "paper")
    assert judged  # with the paper's rule, it judges


def test_a_saved_moe_estimate_is_drawn_at_its_threshold(invoke, tmp_path):
    """The estimate records its --threshold as the sweep rows do (an MoE estimate's report drew 80%)."""
    row = json.loads(invoke("estimate", "--model", "mixtral-8x7b", "--tp", "2", "--ep", "8", "--pp", "4", "--gpus",
                            "64", "--mem", "80", "--threshold", "0.9", "--format", "json").stdout)
    assert row["threshold"] == 0.9 and row["memory_model"] == "paper"
    detail = layout_detail(row)
    assert detail.threshold_gib == pytest.approx(0.9 * 80) and detail.threshold_label == "90% (--threshold)"
    dense = json.loads(invoke("estimate", "--tp", "2", "--gpus", "8", "--mem", "80", "--threshold", "0.9",
                              "--format", "json").stdout)
    assert dense["threshold"] == 0.9 and dense["memory_gib"] == 80
    drawn = layout_detail(dense)
    assert drawn.threshold_gib == pytest.approx(0.9 * 80) and drawn.memory_gib == 80
    calibrated = json.loads(invoke("estimate", "--tp", "2", "--gpus", "8", "--gpu", "h100-80gb",
                                   "--format", "json").stdout)
    assert layout_detail(calibrated).model_name == "calibrated"  # it was drawn as Eq. 18: no memory_gib
