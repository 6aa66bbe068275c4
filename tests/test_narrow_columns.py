"""What a narrow terminal leaves out (audit): the columns that carry the answer go last. The
verdict, the columns the ranking orders by (TFLOP/s under 'ranked by throughput', the margin
under memory), what the user asked for (--gpu-hour-price's cost, --tokens' days) and the
layout's degrees (DP too) stay; and an estimate's memory terms, as shown, add up to its total
(at 80 columns it showed weights 7.48 and activations 22.64 beside a total of 56.30). Widths
are each line's bytes: off a terminal a table is ASCII, a byte a column (tests/test_table_drawing.py)."""

from __future__ import annotations

import pytest
from table_text import read_table

TERMS = ("weights GiB", "grads GiB", "optimizer GiB", "states GiB", "activations GiB")
DEFAULT = ("sweep", "--gpus", 64, "--gpu", "h100-80gb", "--top", 5)


def _shown(advisor, monkeypatch, columns: int, *args) -> tuple[str, list[str], list[dict[str, str]]]:
    """The title and caption, the headers and the rows' cells by header, every line checked to
    fit ``columns`` bytes (ASCII off a terminal: a byte a column)."""
    monkeypatch.setenv("COLUMNS", str(columns))
    text = advisor(*args).stdout
    assert max(len(line.encode()) for line in text.splitlines()) <= columns, text
    table = read_table(text)
    return f"{table.title} {table.caption}", table.headers, table.records()


@pytest.mark.parametrize("columns", [60, 80, 100])
@pytest.mark.parametrize("layout", [("--tp", 2), ("--tp", 2, "--pp", 2), ("--pp", 4, "--cp", 2)],
                         ids=["tp2", "tp2-pp2", "pp4-cp2"])
def test_an_estimates_memory_terms_shown_add_up_to_its_total(advisor, monkeypatch, columns, layout):
    _, headers, rows = _shown(advisor, monkeypatch, columns, "estimate", "--model", "llama3.1-8b", "--gpus", 16,
                              *layout)
    assert "total GiB" in headers
    shown = [term for term in TERMS if term in headers]
    # the states' parts come all or none: with them, the states are their sum (not also counted)
    parts = {"weights GiB", "grads GiB", "optimizer GiB"}
    assert parts & set(shown) in (set(), parts)
    summed = ["states GiB", "activations GiB"] if "states GiB" in shown else shown
    assert summed in ([], ["states GiB", "activations GiB"])
    for row in rows:
        if summed:
            assert sum(float(row[t]) for t in summed) == pytest.approx(float(row["total GiB"]), abs=0.011)
        if "weights GiB" in shown:
            assert sum(float(row[part]) for part in parts) == pytest.approx(float(row["states GiB"]), abs=0.011)
    if columns >= 60:
        assert summed == ["states GiB", "activations GiB"]  # room for the terms at 60 columns: they stay


@pytest.mark.parametrize("columns", [60, 80, 100])
def test_a_throughput_ranking_keeps_its_tflops_the_verdict_and_dp(advisor, monkeypatch, columns):
    words, headers, rows = _shown(advisor, monkeypatch, columns, *DEFAULT)
    assert "ranked by throughput" in words
    assert {"TP", "CP", "PP", "VPP", "MBS", "DP", "verdict", "TFLOP/s per GPU"} <= set(headers)
    rows_json = advisor.json(*DEFAULT, "--format", "json")
    assert [int(r["DP"]) for r in rows] == [r["dp"] for r in rows_json]
    assert [int(r["TFLOP/s per GPU"]) for r in rows] == [round(r["tflops_per_gpu"]) for r in rows_json]
    if columns >= 80:
        assert "recompute" in headers


@pytest.mark.parametrize("columns", [60, 80, 100])
def test_a_memory_ranking_keeps_its_margin(advisor, monkeypatch, columns):
    words, headers, _ = _shown(advisor, monkeypatch, columns, *DEFAULT, "--rank-by", "memory")
    assert "ranked by memory headroom" in words
    assert {"DP", "verdict", "margin GiB"} <= set(headers)


@pytest.mark.parametrize("columns", [80, 100])
def test_the_cost_asked_for_stays(advisor, monkeypatch, columns):
    """--gpu-hour-price's cost went first at 100 columns."""
    _, headers, rows = _shown(advisor, monkeypatch, columns, *DEFAULT, "--tokens", "1T", "--gpu-hour-price", 2)
    assert {"DP", "verdict", "TFLOP/s per GPU", "days", "cost $"} <= set(headers)
    rows_json = advisor.json(*DEFAULT, "--tokens", "1T", "--gpu-hour-price", 2, "--format", "json")
    # cost = GPU-hours x the price (by hand from the row's own GPU-hours)
    assert [int(r["cost $"].replace(",", "")) for r in rows] == [round(r["gpu_hours"] * 2) for r in rows_json]


@pytest.mark.parametrize("columns", [60, 80, 100])
def test_the_papers_ranking_keeps_the_verdict_recomputation_and_dp(advisor, monkeypatch, columns):
    """The paper's rule orders by the verdict, then no recomputation before any (paper_rule.rule_key);
    at 60 columns the layout, the verdict and the recomputation fill 57, and DP goes."""
    words, headers, _ = _shown(advisor, monkeypatch, columns, "sweep", "--gpus", 64, "--mem", 40, "--top", 5)
    assert "ranked by the paper's rule" in words
    assert {"verdict", "recompute"} <= set(headers)
    assert ("DP" in headers) == (columns >= 80)


MOE_TERMS = ("dense st. GiB", "expert st. GiB", "FP8 w. GiB", "act. GiB", "transient GiB")
MOE = ("estimate", "--model", "mixtral-8x7b", "--gpus", 64, "--tp", 2, "--pp", 4, "--ep", 8, "--mbs", 1)
FP8 = ("estimate", "--model", "deepseek-v3", "--gpus", 1024, "--tp", 2, "--pp", 16, "--ep", 64, "--etp", 1,
       "--mbs", 1, "--gpu", "h100-80gb", "--fp8-format", "hybrid", "--fp8-recipe", "delayed")


@pytest.mark.parametrize("columns", [60, 80, 100])
@pytest.mark.parametrize("args", [MOE + ("--mem", 80), MOE + ("--gpu", "h100-80gb"), FP8],
                         ids=["analytic", "calibrated", "fp8"])
def test_a_moe_estimates_terms_shown_add_up_to_its_total(advisor, monkeypatch, columns, args):
    """The MoE stage table at 80 columns left out 'transient' and 'total GiB' (1.63 + 11.81 + 32.02
    beside a predicted 59.00), at 60 all but 'dense st.'. Its terms (advisor.moe.stage.StageBytes.total:
    dense and expert states, FP8 copies, activations, transient) are shown all, with their total, or
    none, and named as not shown; the verdict's number (used GiB where calibrated) always stays."""
    words, headers, rows = _shown(advisor, monkeypatch, columns, *args)
    calibrated = "--gpu" in args
    assert ("used GiB" in headers) == calibrated and ("total GiB" in headers or calibrated)
    shown = [term for term in MOE_TERMS if term in headers]
    fp8 = "--fp8-format" in args
    if shown:
        assert shown == [term for term in MOE_TERMS if fp8 or term != "FP8 w. GiB"] and "total GiB" in headers
    else:
        hidden = words[words.index("not shown to fit"):]
        assert all(term in hidden for term in ("dense st. GiB", "expert st. GiB", "act. GiB", "transient GiB"))
    for row in rows:
        total = sum(float(row[term]) for term in shown)
        if shown:  # each cell rounded to 0.01: the sum within half a hundredth per cell
            assert total == pytest.approx(float(row["total GiB"]), abs=0.005 * (len(shown) + 1))
    if columns >= 100 or (columns >= 80 and not calibrated):
        assert shown  # the room is there: the terms stay


def test_a_column_left_out_before_a_group_that_had_to_go_too_comes_back(advisor, monkeypatch):
    """At 80 columns an estimate left out 'position' first, then the states' parts as a group
    (still too wide), and showed a 53-character table: without the group, position (and 'in
    flight') fit again. Every column hidden must be one that does not fit beside those shown.
    (The parts fit at 80 since the total's unit went under its header: the same case at 76.)"""
    _, headers, _ = _shown(advisor, monkeypatch, 76, "estimate", "--tp", 2, "--pp", 2, "--mbs", 1, "--gpus", 8,
                           "--gpu", "h100-80gb")
    assert {"position", "in flight", "states GiB", "activations GiB", "total GiB"} <= set(headers)
    assert "weights GiB" not in headers


@pytest.mark.parametrize("args", [("--gpu", "h100-80gb"), ("--mem", 80)], ids=["calibrated", "analytic"])
def test_each_of_an_estimates_memory_columns_says_gib_at_every_width(advisor, monkeypatch, args):
    """Only the total's header said 'GiB': the parts' unit was the neighbour's. Each memory column
    says its own under its header, the same at every width; only which are shown changes."""
    memory = ("weights", "grads", "optimizer", "states", "activations", "total")
    for columns in (50, 60, 80, 100, 300):
        monkeypatch.setenv("COLUMNS", str(columns))
        named = read_table(advisor("estimate", "--model", "llama3.1-8b", "--gpus", 16, "--pp", 2, *args).stdout).columns
        assert {name for name in named if name.split(" ")[0] in memory} == {f"{term} GiB" for term in memory}, named


def test_the_moe_stage_tables_counts_and_memory_say_their_units_at_every_width(advisor, monkeypatch):
    """'dense', a count of layers beside 'dense st.' in GiB, read as either, and the terms said no
    unit: the count says 'layers' and each memory column 'GiB', the same at every width."""
    memory = ("dense st.", "expert st.", "FP8 w.", "act.", "transient", "total", "used")
    for columns in (50, 60, 80, 100, 300):
        monkeypatch.setenv("COLUMNS", str(columns))
        table = read_table(advisor(*FP8).stdout)
        named = table.columns
        assert [name for name in named if name.startswith("dense ")] == ["dense layers", "dense st. GiB"], named
        assert {name.removesuffix(" GiB") for name in named if name.endswith(" GiB")} == set(memory), named
        if "dense layers" in table.headers:  # DeepSeek-V3's first three layers are dense, on stage 0
            assert [row["dense layers"] for row in table.records()] == ["3"] + ["0"] * 15
