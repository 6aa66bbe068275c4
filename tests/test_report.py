"""advisor report: the page's data against the advisor's own numbers, the pipeline timeline
against Narayanan et al.'s bubble, the CLI's shapes and errors. The page in a real browser:
tests/test_report_browser.py."""

import json
import math
import re
import subprocess
import sys

import pytest

from advisor import schedule
from advisor.report import ReportInput, build_page
from advisor.report.details import layout_detail
from advisor.report.table import cell_value, split_columns


@pytest.mark.parametrize("p,v,m", [(4, 1, 8), (4, 2, 8), (4, 3, 12), (2, 1, 1), (8, 1, 3), (3, 2, 6)])
def test_timeline_of_equal_stages_has_narayanans_bubble(p, v, m):
    """Equal stages, forward f and backward b per microbatch (chunks f/v, b/v): the iteration
    lasts (m + (p - 1)/v)(f + b) (Narayanan et al. 2021, Section 2.2: bubble (p - 1)/v of
    (f + b)); with m < p under 1F1B the pipe never fills: (m + p - 1)(f + b) all the same."""
    f, b = 1.0, 2.0
    slots = schedule.timeline(p, v, m, [f / v] * p, [b / v] * p)
    assert max(slot.end for slot in slots) == pytest.approx((m + (p - 1) / v) * (f + b))
    assert len(slots) == 2 * m * v * p
    for rank in range(p):  # each rank runs its passes back to back in Megatron's order, never overlapping
        mine = [s for s in slots if s.rank == rank]
        assert all(a.end <= c.start + 1e-12 for a, c in zip(mine, mine[1:]))


@pytest.mark.parametrize("p,v,m", [(4, 1, 8), (4, 2, 8), (5, 3, 10), (8, 1, 3)])
def test_order_holds_what_the_estimator_counts_in_flight(p, v, m):
    """The forwards before the first backward, plus the one that comes with it, are the passes
    the memory estimator holds at the peak (advisor.schedule.InFlight)."""
    for rank in range(p):
        order = schedule.megatron_order(rank, p, v, m)
        first_backward = next(i for i, (kind, _, _) in enumerate(order) if kind == "B")
        assert first_backward == schedule.InFlight.at(rank, p, v, m).passes


@pytest.fixture(scope="module")
def sweep_rows(advisor_module):
    return advisor_module.json("sweep", "--gpus", "16", "--gpu", "h100-80gb", "--all", "--seq-len", "4096",
                               "--gbs", "64")


@pytest.fixture(scope="module")
def advisor_module():
    from tests.conftest import Invoker

    return Invoker()


def test_detail_prices_a_row_as_the_sweep_did(sweep_rows):
    for row in [r for r in sweep_rows if r["rank"]][:3] + [r for r in sweep_rows if r["verdict"] == "oom"][:1]:
        detail = layout_detail(row)
        assert detail.time_parts["total_s"] == pytest.approx(row["step_time_s"], rel=1e-12)
        peak = max(sum(stage.values()) for stage in detail.stages)
        assert peak == pytest.approx(row["usage_gib"], rel=1e-12)
        assert len(detail.forward_s) == row["pp"]


def test_new_row_fields_show_without_code_changes(sweep_rows):
    rows = [{**row, "ep": 2 if i % 2 else 1, "ranking_tolerance": 0.02} for i, row in enumerate(sweep_rows)]
    columns, shared = split_columns(rows)
    assert "ep" in columns and shared["ranking_tolerance"] == 0.02
    page = build_page(ReportInput(kind="sweep", rows=rows, question="test"), top=1)
    assert "ranking_tolerance (every row)" in page and ">EP</button>" in page


def test_the_pages_headers_are_the_terminals_words(sweep_rows):
    """The page headed the calibrated usage 'pred. GiB' and the throughput 'TFLOP/s' where the
    terminal's sweep table says 'used GiB' and 'TFLOP/s per GPU' (its header over its unit): one
    number under two names. Every column both show is headed alike, and the verdicts' meanings
    name the usage as its column does."""
    import html

    from advisor.sweep_columns import sweep_columns

    page = build_page(ReportInput(kind="sweep", rows=sweep_rows, question="test"), top=1)
    headers = {key: html.unescape(text) for key, text in re.findall(
        r'<th scope="col" data-key="([^"]+)"[^>]*><button type="button">([^<]*)</button>', page)}
    assert headers["usage_gib"] == "used GiB" and headers["tflops_per_gpu"] == "TFLOP/s per GPU"
    terminal = {column.key: column.name for column in sweep_columns(calibrated=True, timed=True)}
    both = headers.keys() & terminal.keys()
    assert {"total_gib", "margin_gib", "step_time_s", "mfu"} <= both
    assert {key: headers[key] for key in both} == {key: terminal[key] for key in both}
    assert "the calibrated prediction (used GiB) of the peak stage" in page


def test_a_dense_page_has_no_expert_columns(sweep_rows, advisor_module):
    """Dense rows carry ep = etp = 1 (DESIGN.md): two columns of ones said nothing; an MoE
    sweep keeps them, the same EP in every row included (EP is its layout)."""
    columns, shared = split_columns(sweep_rows)
    assert {row["ep"] for row in sweep_rows} == {1} and "ep" not in columns and "etp" not in columns
    assert "ep" not in shared and "etp" not in shared
    moe = advisor_module.json("sweep", "--model", "mixtral-8x7b", "--gpus", "64", "--gpu", "h100-80gb", "--ep", "8",
                              "--etp", "1")
    assert {(row["ep"], row["etp"]) for row in moe} == {(8, 1)}
    assert {"ep", "etp"} <= set(split_columns(moe)[0])


def test_the_pages_recomputation_cell_is_the_terminals(sweep_rows):
    from advisor.render import recompute_text

    full = {**sweep_rows[0], "recompute": "full", "recompute_method": "block", "recompute_num_layers": 2}
    assert cell_value(full, "recompute") == recompute_text(full) == "full block 2"
    assert cell_value({**full, "recompute": "selective"}, "recompute") == "selective"


def test_cli_writes_the_page_atomically_with_the_umask(advisor, tmp_path):
    out = tmp_path / "r.html"
    result = advisor("report", "sweep", "--gpus", "16", "--gpu", "h100-80gb", "--seq-len", "4096", "--gbs", "64",
                     "-o", out)
    page = out.read_text()
    assert "wrote" in result.stderr and oct(out.stat().st_mode & 0o777) == oct(0o666 & ~_umask())
    assert '<h2 id="rows-heading">Ranked layouts</h2>' in page  # a sweep keeps its ranking
    assert 'data-key="rank"' in page
    for anchor in ('id="assumptions"', 'data-figure="heatmap"', 'data-figure="scatter"', 'id="rows"',
                   'data-figure="stages-0"', 'data-figure="time-parts"', 'data-figure="schedule"'):
        assert anchor in page
    assert "advisor report sweep --gpus 16 --gpu h100-80gb --seq-len 4096 --gbs 64" in page
    # Nothing to fetch at view time: no external source, link or stylesheet (namespaces are names).
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)|<link|@import|url\((?!#)""", page)


def _umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_estimate_and_plan_pages(advisor, tmp_path):
    estimate = tmp_path / "e.html"
    advisor("report", "estimate", "--tp", "2", "--pp", "2", "--gpus", "16", "--gpu", "h100-80gb", "-o", estimate)
    text = estimate.read_text()
    assert 'data-figure="schedule"' in text
    # one layout, not a ranking: titled as the layout, no rank column (its rank was always '-')
    assert '<h2 id="rows-heading">The layout</h2>' in text and "Ranked layouts" not in text
    assert 'data-key="rank"' not in text and "best ranked first" not in text
    assert re.search(r'<th scope="col" data-key="tp"', text)
    plan = tmp_path / "plan.json"
    advisor("recommend", "--gpus", "16", "--tp", "2", "--pp", "4", "--gbs", "64", "-o", plan)
    page = tmp_path / "p.html"
    advisor("report", "--from", plan, "--profile", "examples/launch/profiles", "-o", page)
    text = page.read_text()
    for anchor in ('id="plan-stages"', 'id="plan-flags"', 'data-figure="stages-0"', 'data-figure="schedule"',
                   'data-figure="profile-stages"', 'data-figure="profile-layers"', 'id="profile-stages-table"'):
        assert anchor in text


@pytest.mark.parametrize("args", [
    ("report", "--profile", "examples/launch/profiles"),  # neither --from nor a subcommand
    ("report", "--from", "/nonexistent.json", "-o", "x.html"), ("report", "-o", "x.html", "sweep"),
    ("report", "sweep", "--gpus", "8", "--mem", "80"),  # no -o
    ("report", "--from", "README.md", "-o", "x.html"),
])
def test_bad_input_is_one_line(advisor, args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path) if "README.md" not in args else None
    advisor.error(*args)


def test_from_dash_reads_the_sweep_piped_in(advisor, tmp_path):
    """advisor sweep --format json | advisor report --from - -o r.html: the page of standard
    input is the page of the same JSON saved to a file, but for the question it names."""
    saved = tmp_path / "s.json"
    advisor("sweep", "--gpus", 8, "--gpu", "h100-80gb", "--top", 4, "--format", "json", "-o", saved)
    piped = advisor.runner.invoke(advisor.command, ["report", "--from", "-", "-o", "-"], input=saved.read_text())
    assert piped.exit_code == 0, piped.output
    from_file = advisor("report", "--from", saved, "-o", "-").stdout
    assert "--from - -o -" in piped.stdout and f"--from {saved} -o -" in from_file
    assert piped.stdout.replace("--from -", "") == from_file.replace(f"--from {saved}", "")


@pytest.mark.parametrize("piped,message", [
    ("", "--from -: standard input is empty; pipe in the JSON of advisor sweep or estimate --format json"),
    ("[1", "standard input: malformed JSON at line 1"),
    ("[]", "standard input: the sweep holds no rows"),  # what a sweep where nothing fits pipes in
])
def test_from_dash_refuses_bad_standard_input(advisor, piped, message):
    result = advisor.runner.invoke(advisor.command, ["report", "--from", "-", "-o", "r.html"], input=piped)
    assert result.exit_code == 2 and result.stdout == "", result.output
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert result.stderr.startswith(f"Error: {message}"), result.stderr


def test_sweep_does_not_import_matplotlib():
    code = ("import sys; from advisor.cli import cli\n"
            "try: cli(['sweep', '--gpus', '8', '--mem', '80', '--format', 'json'], standalone_mode=False)\n"
            "except SystemExit: pass\n"
            "assert 'matplotlib' not in sys.modules and 'torch' not in sys.modules, 'imported'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)


def test_page_without_a_time_model(advisor, tmp_path):
    """--mem alone: the paper's verdicts and 80% line, no time figures, the schedule in layer units."""
    out = tmp_path / "paper.html"
    advisor("report", "sweep", "--gpus", "8", "--mem", "80", "--seq-len", "4096", "--all", "-o", out)
    page = out.read_text()
    assert 'data-figure="heatmap"' in page and 'data-figure="scatter"' not in page
    assert 'data-figure="time-parts"' not in page and "80% (4D paper)" in page
    assert "layer-forward units" in page


MOE_ROW_EDITS = [  # (a hand edit of an MoE sweep row, the line both readers print), as the CLI's flags refuse it
    ({"routing": "balanced", "capacity_factor": 1.25},
     "'capacity_factor' drops tokens (capacity routing); 'routing' balanced routes every token"),
    ({"routing": "capacity", "capacity_factor": None}, "'routing' capacity needs a 'capacity_factor'"),
    ({"routing": "bogus"}, "'routing' must be balanced, capacity or dropless, got 'bogus'"),
    ({"dispatcher": "bogus"}, "'dispatcher' must be alltoall, allgather or flex, got 'bogus'"),
    ({"capacity_factor": -1}, "'capacity_factor' must be above 0, got -1"),
    ({"imbalance": 0}, "'imbalance' must be at least 1, got 0"),
    ({"pad_to_capacity": True}, "'pad_to_capacity' needs capacity routing and a 'capacity_factor'"),
    ({"recompute_modules": ["moe_act"]}, "'recompute_modules' needs 'recompute' selective, got 'none'"),
    # the overlap's rules in the command line's words, Megatron's flags (advisor.moe.overlap; all of
    # them through both paths: tests/test_moe_cli.py, test_each_overlap_rule_is_one_message_in_both_paths)
    ({"delay_wgrad": True}, "--delay-wgrad-compute needs --overlap-moe-expert-parallel-comm"),
    ({"ep": 0}, "'ep' must be a positive integer"),
    ({"flex_backend": "bogus"}, "'flex_backend' must be null or, with the flex dispatcher, deepep, hybridep or ncclep; "
                                "got 'bogus' with 'alltoall'"),
    ({"flex_backend": "hybridep"}, "got 'hybridep' with 'alltoall'"),
    # shown as block 2 by the report, launched as uniform 1 (every layer, as priced) before
    ({"recompute": "full", "recompute_method": "block", "recompute_num_layers": 2},
     "an MoE row's full recomputation is 'recompute_method' uniform with 'recompute_num_layers' 1 (every layer, as "
     "priced), got 'block' and 2"),
]


@pytest.fixture(scope="module")
def moe_row(tmp_path_factory):
    from conftest import Invoker

    path = tmp_path_factory.mktemp("moe") / "moe_sweep.json"
    Invoker()("sweep", "--model", "mixtral-8x7b", "--gpus", "64", "--gpu", "h100-80gb", "--top", "2", "--format",
              "json", "-o", path)
    return json.loads(path.read_text())[0]


@pytest.mark.parametrize("edit,message", MOE_ROW_EDITS, ids=[message[:30] for _, message in MOE_ROW_EDITS])
def test_a_hand_edited_moe_row_is_refused_by_the_report_and_the_launcher_alike(advisor, tmp_path, moe_row, edit,
                                                                              message):
    """One check (advisor.saved_row.moe_row_settings) for both readers: a row the report would
    price one way and advisor-launch launch another (or only one of them refuse) is one line in each."""
    from launch_support import launcher, write_json

    path = write_json(tmp_path / "row.json", {**moe_row, **edit})
    assert message in advisor.error("report", "--from", path, "-o", tmp_path / "r.html")
    assert message in launcher().error("args", "--from", path)
    assert not (tmp_path / "r.html").exists()


def test_an_moe_row_as_written_is_read_by_both(advisor, tmp_path, moe_row):
    from launch_support import launcher, write_json

    path = write_json(tmp_path / "row.json", moe_row)
    advisor("report", "--from", path, "-o", tmp_path / "r.html")
    page = (tmp_path / "r.html").read_text()
    # MoE memory is the analytic model's, not Eq. 18 (seed 004's dense total), as the terminal says
    assert ">analytic GiB</button>" in page and "Eq.18" not in page
    args = json.loads(launcher()("args", "--from", path, "--format", "json").stdout)
    assert args[args.index("--expert-model-parallel-size") + 1] == str(moe_row["ep"])


def test_a_flex_row_edited_to_ep_1_is_not_launched(tmp_path, moe_row):
    # megatron-core's flex dispatcher asserts EP x ETP > 1 (token_dispatcher.py, both releases)
    from launch_support import launcher, write_json

    row = {**moe_row, "dispatcher": "flex", "ep": 1, "etp": 1, "dp": moe_row["dp"], "a2a_overlap": False}
    assert "flex dispatcher needs EP x ETP > 1" in launcher().error("args", "--from", write_json(tmp_path / "r.json", row))


def _two_runs(tmp_path, **second):
    """Two synthetic profile runs (tests/capture_synth.py) of one model and setup; ``second``
    edits the second run's headers."""
    from dataclasses import replace

    from capture_synth import Truth, write_run

    from advisor.profiles import load_run

    first = write_run(tmp_path / "a", Truth(), [4, 4], mbs=1, name="r1")
    other = write_run(tmp_path / "b", Truth(), [4, 4], mbs=2, name="r2")
    for rank in load_run(other).ranks:
        replace(rank, header=replace(rank.header, **second)).write(other)
    return first, other


@pytest.mark.parametrize("second,values", [
    ({"seq_len": 64}, "seq_len (64 vs 32)"),
    ({"params_dtype": "bfloat16"}, "params_dtype ('bfloat16' vs 'float32')"),
])
def test_profiles_of_different_setups_are_refused_as_recommend_refuses_them(advisor, tmp_path, second, values):
    """'report --profile A --profile B' with runs that disagree: one line naming the two runs and the
    two values, before any work, no page; the same line 'recommend --profile' gives for that set."""
    first, other = _two_runs(tmp_path, **second)
    estimate = tmp_path / "estimate.json"
    estimate.write_text(advisor("estimate", "--tp", "1", "--pp", "2", "--gpus", "2", "--mem", "80",
                                "--format", "json").stdout)
    page = tmp_path / "page.html"
    line = advisor.error("report", "--from", estimate, "--profile", first, "--profile", other, "-o", page)
    assert line == f"Error: run r2 differs from run r1 in {values}; profile one setup at a time"
    recommend = ("--profile", first, "--profile", other, "--gpus", "2", "--mem", "80", "--pp", "2")
    assert line == advisor.error("recommend", *recommend)
    assert line == advisor.error("report", "recommend", *recommend, "-o", page)
    assert not page.exists()


def test_profiles_of_different_models_name_the_fields_that_differ(advisor, tmp_path):
    from capture_synth import TINY, Truth, write_run

    from advisor.models import LlamaSpec

    write_run(tmp_path, Truth(), [4, 4], mbs=1, name="r1")
    wider = LlamaSpec(**{**TINY.to_dict(), "name": "wider", "hidden_size": 128})
    write_run(tmp_path, Truth(spec=wider), [4, 4], mbs=1, name="r2")
    estimate = tmp_path / "estimate.json"
    estimate.write_text(advisor("estimate", "--tp", "1", "--pp", "2", "--gpus", "2", "--mem", "80",
                                "--format", "json").stdout)
    line = advisor.error("report", "--from", estimate, "--profile", tmp_path, "-o", tmp_path / "page.html")
    assert line == "Error: run r2 differs from run r1 in model (hidden_size 128 vs 64); profile one setup at a time"


def test_a_time_plans_stage_limit_is_its_threshold_line():
    """A time plan records the GPU's memory and the limit every stage was kept within
    (--threshold x memory): the page draws the first as the GPU memory and the second as the
    plan's own line, not as the paper's 80%."""
    from advisor.report.details import plan_detail

    plan = {"tp": 1, "cp": 1, "pp": 2, "micro_batch_size": 1, "num_microbatches": 8,
            "memory_limit_gib": 80.0, "stage_limit_gib": 64.0, "predictor": {"name": "seed004"},
            "stages": [{"predicted_gib": 50.0, "predicted_time_s": 0.3}, {"predicted_gib": 60.0, "predicted_time_s": 0.3}]}
    detail = plan_detail(plan)
    assert (detail.memory_gib, detail.threshold_gib) == (80.0, 64.0)
    assert "80%" not in detail.threshold_label
    memory_plan = dict(plan, stage_limit_gib=None)
    assert plan_detail(memory_plan).threshold_gib is None


def test_an_moe_rows_fusions_are_priced_by_the_report_and_launched(advisor, tmp_path, moe_row):
    """--moe-router-fusion and --moe-permute-fusion ride on the row ('router_fusion',
    'permute_fusion'): the report reads it, advisor-launch writes the flags, and fields that disagree
    with the row's arguments, or are not booleans, are refused by both alike."""
    from launch_support import launcher, write_json

    path = tmp_path / "fused_sweep.json"
    advisor("sweep", "--model", "mixtral-8x7b", "--gpus", "64", "--gpu", "h100-80gb", "--top", "1", "--format",
            "json", "--moe-router-fusion", "--moe-permute-fusion", "-o", path)
    fused = json.loads(path.read_text())[0]
    assert (fused["router_fusion"], fused["permute_fusion"]) == (True, True)
    row = write_json(tmp_path / "fused.json", fused)
    args = json.loads(launcher()("args", "--from", row, "--format", "json").stdout)
    assert {"--moe-router-fusion", "--moe-permute-fusion"} <= set(args)
    advisor("report", "--from", row, "-o", tmp_path / "r.html")
    assert "inconsistent sweep row" in launcher().error("args", "--from", write_json(
        tmp_path / "edited.json", {**moe_row, "router_fusion": True}))
    bad = write_json(tmp_path / "bad.json", {**fused, "router_fusion": "false"})  # a string: truthy
    assert "'router_fusion' must be true, false or null" in advisor.error("report", "--from", bad, "-o",
                                                                          tmp_path / "r2.html")
    assert "'router_fusion' and 'shared_expert_overlap' must be true or false" in launcher().error("args", "--from", bad)


def test_a_hybridep_row_is_priced_by_the_report_and_launched_as_priced(advisor, tmp_path):
    """--moe-flex-dispatcher-backend rides on the row ('flex_backend'): the report re-prices it
    (HybridEP's own permutation, at the HBM rate) to the sweep's step time, advisor-launch writes
    the backend (not DeepEP's --moe-enable-deepep), and a row whose backend field disagrees with
    its arguments is refused."""
    from launch_support import launcher, write_json

    path = tmp_path / "hybridep.json"
    advisor("sweep", "--model", "qwen3-30b-a3b", "--gpus", "16", "--gpu", "h100-80gb", "--ep", "8", "--top", "1",
            "--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "hybridep", "--format", "json",
            "-o", path)
    row = json.loads(path.read_text())[0]
    assert row["flex_backend"] == "hybridep"
    saved = write_json(tmp_path / "row.json", row)
    args = json.loads(launcher()("args", "--from", saved, "--format", "json").stdout)
    assert args[args.index("--moe-flex-dispatcher-backend") + 1] == "hybridep" and "--moe-enable-deepep" not in args
    advisor("report", "--from", saved, "-o", tmp_path / "r.html")
    from advisor.report.moe_detail import _settings

    settings = _settings(row)  # what the report prices the row with
    assert settings.flex_backend == "hybridep" and settings.fused_permutation and not settings.permute_fusion
    assert "inconsistent sweep row" in launcher().error("args", "--from", write_json(
        tmp_path / "edited.json", {**row, "flex_backend": "deepep"}))


def test_a_sweeps_assumptions_do_not_give_the_first_rows_recomputation_to_every_row(advisor, tmp_path):
    """A sweep's rows recompute differently (each row's in its column): the assumptions name the
    training options every row shares without the first row's recomputation; an estimate's are its
    own, recomputation included. A field without a format of its own shows 4 figures, not 16."""
    import html as html_module
    import re

    sweep = tmp_path / "sweep.json"
    advisor("sweep", "--gpus", "16", "--gpu", "h100-80gb", "--model", "llama3.1-70b", "--all", "--format", "json",
            "-o", sweep)
    rows = json.loads(sweep.read_text())
    assert len({row["recompute"] for row in rows}) > 1  # the premise: rows recompute differently
    advisor("report", "--from", sweep, "-o", tmp_path / "s.html")
    page = html_module.unescape((tmp_path / "s.html").read_text())
    [cell] = re.findall(r"training options \(every row; its recomputation in its column\)</th><td>([^<]*)", page)
    assert "recomputation." not in cell and "precision.params_dtype: bfloat16" in cell
    estimate = tmp_path / "estimate.json"
    advisor("estimate", "--gpus", "16", "--gpu", "h100-80gb", "--model", "llama3.1-70b", "--tp", "8", "--pp", "2",
            "--recompute", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1", "--format", "json",
            "-o", estimate)
    advisor("report", "--from", estimate, "-o", tmp_path / "e.html")
    page = html_module.unescape((tmp_path / "e.html").read_text())
    [cell] = re.findall(r"training options \(all\)</th><td>([^<]*)", page)
    assert "recomputation.recompute: full" in cell.splitlines()
    from advisor.report.table import _format

    assert _format(9.989366743040005, "") == "9.989" and _format(3, "") == "3"


def _hue(colour: str) -> float:
    """Hue in degrees of '#rrggbb' (colorsys: red 0, orange about 30, yellow 60, green 120)."""
    import colorsys

    r, g, b = (int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return 360 * colorsys.rgb_to_hsv(r, g, b)[0]


def test_heatmap_cells_within_the_limit_never_take_the_over_limit_colour():
    """A cell at 95% of the GPU's memory fits (tight) and was drawn orange, the colour the caption
    gives to over the limit (audit). Read back from the figure: every cell up to 100% is yellow to
    green (hue at least 40 degrees: #fee08b, the tables' 'tight', is 44), every cell over it orange to
    red (under 30 or, dark red, over 330: #fdae61 is 30), and only those carry the dot."""
    from advisor.report.figures import heatmap

    shares = {1: 0.5, 2: 0.85, 4: 0.95, 8: 0.99, 16: 1.0, 32: 1.05, 64: 1.3, 128: 2.0}
    rows = [{"tp": 1, "cp": 1, "pp": 1, "mbs": mbs, "memory_gib": 80.0, "usage_gib": 80.0 * share}
            for mbs, share in shares.items()]
    svg = heatmap(rows, 80.0)
    cells = re.findall(r'<rect x="[\d.]+" y="[\d.]+" width="21" height="10" fill="(#[0-9a-f]{6})"><title>(\d+)%</title>',
                       svg)
    assert [int(text) for _, text in cells] == [round(100 * share) for share in shares.values()]
    for (colour, text), share in zip(cells, shares.values()):
        if share <= 1:
            assert _hue(colour) >= 40, (text, colour)
        else:
            assert _hue(colour) < 30 or _hue(colour) > 330, (text, colour)  # red wraps round 0
    assert svg.count("<circle") == 3  # the dots: 105%, 130%, 200%


def test_the_page_opens_with_the_answer_and_ends_with_every_assumption_folded(advisor, tmp_path):
    """The page opened with about 30 rows of assumptions, the GPU preset and the training options
    as raw JSON (audit). Now: the answer (the best ranked row's layout, verdict, step time and
    memory, read here from the sweep's own JSON) before any figure or table; the assumptions last,
    in a folded <details>, every one still there, objects as 'key: value' lines."""
    import html as html_module

    from advisor.hardware import get_gpu

    sweep = tmp_path / "sweep.json"
    advisor("sweep", "--gpus", "16", "--gpu", "h100-80gb", "--seq-len", "4096", "--gbs", "64", "--format", "json",
            "-o", sweep)
    best = next(row for row in json.loads(sweep.read_text()) if row["rank"] == 1)
    advisor("report", "--from", sweep, "-o", tmp_path / "s.html")
    page = html_module.unescape((tmp_path / "s.html").read_text())
    headings = re.findall(r'<h2 id="([^"]+)"', page)
    assert headings[0] == "answer" and headings[-1] == "question"
    answer = page[page.index('id="answer"'):page.index('data-figure="heatmap"')]
    assert f"TP {best['tp']} CP {best['cp']} PP {best['pp']} MBS {best['mbs']}" in answer
    assert f"{best['step_time_s']:.3f} s per iteration" in answer
    assert f"{best['usage_gib']:.1f} GiB predicted of 80 GiB ({best['usage_gib'] / 80:.0%})" in answer
    assert f">{best['verdict']}<" in answer
    folded = page[page.index('<details id="assumptions-section">'):]
    assert "</details>" in folded and '<details id="assumptions-section" open' not in page
    assert page.index('id="rows"') < page.index('id="assumptions"')
    [preset] = re.findall(r"GPU preset</th><td>([^<]*)", page)
    assert "{" not in preset  # no raw JSON
    lines = preset.splitlines()
    for key, value in get_gpu("h100-80gb").to_dict().items():  # every field of the preset, as its own line
        assert any(line.startswith(f"{key}:") for line in lines), key
    assert "memory_gib: 80" in lines and "architecture: hopper" in lines
    for name in ("question", "model: name", "GPUs per node", "advisor version", "calibration SHA-256",
                 "memory calibration", "memory_model"):
        assert f">{name}</th>" in folded, name


def test_an_estimates_answer_is_its_verdict(advisor, tmp_path):
    estimate = tmp_path / "e.json"
    advisor("estimate", "--tp", "2", "--pp", "2", "--gpus", "16", "--gpu", "h100-80gb", "--format", "json",
            "-o", estimate)
    row = json.loads(estimate.read_text())
    advisor("report", "--from", estimate, "-o", tmp_path / "e.html")
    page = (tmp_path / "e.html").read_text()
    assert f'<h2 id="answer">The answer: {row["verdict"]}</h2>' in page
    assert page.index('id="answer"') < page.index('id="rows"') < page.index('id="assumptions"')
    assert f"{row['step_time_s']:.3f} s per iteration" in page
    # one layout: no 'chosen layouts' nor 'the first' of them (audit)
    assert '<h2 id="details">The layout in detail</h2>' in page
    assert '<h3 id="schedule-heading">Pipeline schedule: TP 2 CP 1 PP 2 MBS 1</h3>' in page


def test_schedule_ticks_are_round_and_passes_stay_legible(advisor_module):
    """Llama 3.1 70B at PP 8 x VPP 5 with 64 microbatches: the ticks read 2,116 / 4,233 ms and
    the forward and backward chunks were about a pixel wide (audit). Now every drawn pass is at
    least 2 px (less the 0.3 px gap between passes), the title says how many of the 64 are drawn,
    and the ticks step by 1, 2, 2.5 or 5 times a power of ten from 0."""
    from advisor.report.schedule_figure import schedule

    row = advisor_module.json("estimate", "--model", "llama3.1-70b", "--tp", "8", "--pp", "8", "--vpp", "5",
                              "--mbs", "1", "--gbs", "64", "--gpus", "64", "--gpu", "h100-80gb")
    detail = layout_detail(row)
    assert (detail.pp, detail.vpp, detail.num_microbatches) == (8, 5, 64)
    svg = schedule(detail)
    widths = [float(w) for w in re.findall(r'width="([\d.]+)" height="\d+" class="pass-[FB]"', svg)]
    assert widths and min(widths) >= 2.0 - 0.3 - 0.05  # printed to 0.1 px
    drawn = len(widths) // (2 * 5 * 8)
    assert 8 <= drawn < 64 and drawn % 8 == 0  # a multiple of PP: warm-up, steady state, cool-down all show
    assert f"the first {drawn} of 64 microbatches" in svg
    ticks = [float(t.replace(",", "")) for t in re.findall(r'text-anchor="middle">([\d,.]+)</text>', svg)]
    step = ticks[1] - ticks[0]
    assert ticks[0] == 0 and len(ticks) >= 3
    assert all(abs(b - a - step) < 1e-9 for a, b in zip(ticks, ticks[1:]))
    mantissa = step / 10 ** math.floor(math.log10(step))
    assert any(abs(mantissa - m) < 1e-9 for m in (1, 2, 2.5, 5)), step


def test_a_short_schedule_is_drawn_whole():
    """Few microbatches already legible: all drawn (4 ranks, 8 microbatches, 1F1B)."""
    from advisor.report.bars import nice_ticks
    from advisor.report.schedule_figure import legible_microbatches

    assert legible_microbatches(4, 1, 8, [1.0] * 4, [2.0] * 4) == 8
    # 2,000 passes of 1 + 2 units on 900 px: a forward would be 0.15 px; 1F1B keeps 149 (900/(2*3) - 1)
    assert legible_microbatches(2, 1, 2000, [1.0] * 2, [2.0] * 2) == 149
    assert nice_ticks(10_582, most=6) == [0, 2000, 4000, 6000, 8000, 10000]
    assert nice_ticks(18.67, most=6) == [0, 5, 10, 15]


def test_a_time_bar_stays_inside_its_scale():
    """One bar of 86.79 s: the ticks stopped at 80 and the scale with them, so the bar ran past the
    plot and its total was drawn over the legend (audit). The scale now reaches past the bar."""
    import re

    from advisor.report.bars import stacked_rows

    svg = stacked_rows("t", "one bar", ["TP 8"], [("compute", "#4c72b0", [60.0]), ("tp comm", "#dd8452", [26.79])],
                       x_label="seconds per iteration")
    widths = [float(w) for w in re.findall(r'<rect x="[\d.]+" y="\d+" width="([\d.]+)" height="18"', svg)]
    assert sum(widths) < 420  # the plot's width
    total_x = float(re.search(r'<text x="([\d.]+)" y="[\d.]+">86.79 s</text>', svg).group(1))
    legend_x = float(re.search(r'<rect x="([\d.]+)" y="[\d.-]+" width="10"', svg).group(1))
    assert total_x + 50 < legend_x  # "86.79 s" is about 45 px wide at the page's font


def test_a_subcommand_option_given_to_report_itself_says_where_it_goes(advisor, tmp_path):
    """DESIGN.md writes 'advisor report [sweep/estimate/recommend options | --from FILE]', and
    'advisor report --gpus 64 --gpu h100-80gb -o r.html' answered only "No such option '--gpus'"
    (audit). Nothing is written; an option no subcommand has keeps click's own message."""
    out = tmp_path / "r.html"
    line = advisor.error("report", "--gpus", "64", "--gpu", "h100-80gb", "-o", out)
    assert line == ("Error: no such option: --gpus for 'cli report' itself; it goes after a subcommand: "
                    "cli report estimate|recommend|sweep --gpus ... (see 'cli report --help')")
    assert not out.exists()
    assert "a subcommand: cli report recommend --objective ..." in advisor.error("report", "--objective", "time")
    assert advisor.error("report", "--bogus") == "Error: No such option '--bogus'. (see 'cli report --help')"
