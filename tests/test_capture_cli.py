"""``advisor profile plan`` and ``advisor recommend``, run in-process on real files."""

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
from capture_synth import TINY, Truth, write_campaign, write_run, write_scenario
from table_text import read_table

from advisor.capture.partitionings import reduced

FLAGS = set((Path(__file__).parent.parent / "tables/data/megatron_lm_core_v0.15.2_flags.txt").read_text().split())


@pytest.fixture(scope="module")
def campaign_dir(tmp_path_factory):
    return write_campaign(tmp_path_factory.mktemp("profiles"))


def test_profile_plan_prints_and_writes(advisor, tmp_path):
    out = tmp_path / "campaign.json"
    result = advisor("profile", "plan", "--gpus", 8, "--gpus-per-node", 4, "--model", "llama3.2-1b", "--mbs", 4,
                     "-o", out)
    assert "full profiling campaign" in result.stdout and "pp-b1-" in result.stdout
    document = json.loads(out.read_text())
    assert document["schema"] == "megatron-4d-advisor/campaign" and document["mode"] == "full"
    assert {s["name"] for s in document["scenarios"]} == {"pp", "dp2", "dp4", "tp2", "tp4"}
    printed = advisor.json("profile", "plan", "--gpus", 8, "--gpus-per-node", 4, "--model", "llama3.2-1b",
                           "--mbs", 4)
    assert printed == document


@pytest.mark.parametrize("args,message", [
    (["--gpus", 10, "--gpus-per-node", 4], "--gpus 10 is not a whole number of nodes of 4 GPUs"),
    (["--gpus", 8, "--fractions", "0.5"], "--fractions 0.5: give two different fractions of --mbs in (0, 1]"),
    (["--gpus", 8, "--fractions", "half,quarter"], "--fractions must be comma-separated numbers"),
    (["--gpus", 8, "--units", "3,3"], "--units 3,3 sums to 6 layers, not the model's 32"),
    (["--gpus", 8, "--units", "0,32"], "--units 0,32: every merged unit holds at least one layer"),
    (["--gpus", 8, "--gpus-per-node", 4, "--cp", 8], "--cp 8 must divide --gpus-per-node 4"),
    (["--gpus", 8, "--mbs", 3, "--gbs", 1024], "--gbs 1024 is not divisible by --mbs 3"),
    (["--gpus", 8, "--model", "llama9"], "unknown model"),
])
def test_profile_plan_errors(advisor, args, message):
    assert message in advisor.error("profile", "plan", *args)


def test_recommend_megatron_plan(advisor, campaign_dir, tmp_path):
    out, png = tmp_path / "plan.json", tmp_path / "plan.png"
    result = advisor("recommend", "--profile", campaign_dir, "--gpus", 8, "--gpus-per-node", 4, "--pp", 4,
                     "--mbs", 2, "--gbs", 16, "-o", out, "--png", png)
    assert "launchable on stock Megatron-LM" in result.stdout
    plan = json.loads(out.read_text())
    assert plan["schema"] == "megatron-4d-advisor/plan" and plan["version"] == 1
    assert plan["launchable"] is True and plan["mode"] == "megatron" and plan["predictor"]["name"] == "1f1b"
    assert (plan["tp"], plan["cp"], plan["pp"], plan["dp"]) == (1, 1, 4, 2)
    assert sum(plan["layers_per_stage"]) == 8 and plan["num_microbatches"] == 4
    assert [g["gpu"] for g in plan["gpu_memory"]] == list(range(8))
    assert {arg for arg in plan["megatron_args"] if arg.startswith("--")} <= FLAGS
    # The even split is one of the plans the exact planner considered.
    assert plan["peak_predicted_gib"] <= plan["baseline"]["peak_predicted_gib"]
    # The plan is the best split for the synthetic truth the profiles were written from, found by
    # brute force over all 35 splits of 8 layers into 4 stages (DP 2: each rank holds b = 2).
    truth = Truth(spec=TINY)

    def true_peak(split):
        firsts = [1 + sum(split[:i]) for i in range(len(split))]
        return max(truth.peak(first, first + n - 1, 2, 1, 2, min(4 - i, 4))
                   for i, (first, n) in enumerate(zip(firsts, split)))

    splits = [s for s in itertools.product(range(1, 6), repeat=4) if sum(s) == 8]
    assert len(splits) == 35
    best = min(map(true_peak, splits))
    assert true_peak(plan["layers_per_stage"]) == best == round(plan["peak_predicted_gib"] * 2**30)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_recommend_says_which_profile_runs_megatron_stopped_early(advisor, campaign_dir, tmp_path):
    """A run Megatron ended itself before its iterations (--exit-interval, --exit-duration-in-mins,
    a signal) ended ok: it is used (each iteration it ran was measured) and said, with how many."""
    import shutil

    copied = shutil.copytree(campaign_dir, tmp_path / "runs")
    short = "tp1dp1-b2-2.2.1.3"
    for path in (copied / short).glob("rank*.jsonl"):  # the synthetic runs record 1 iteration; 3 asked
        lines = path.read_text().splitlines(keepends=True)
        path.write_text(lines[0].replace('"asked_iterations": null', '"asked_iterations": 3') + "".join(lines[1:]))
    options = ["--gpus", 8, "--gpus-per-node", 4, "--pp", 4, "--mbs", 2, "--gbs", 16]
    table = advisor("recommend", "--profile", copied, *options).stdout
    assert (f"stopped early by Megatron (--exit-interval, --exit-duration-in-mins or a signal), measured over the "
            f"iterations they ran: {short} (1 of 3 iterations)") in " ".join(table.split())
    plan = advisor.json("recommend", "--profile", copied, *options)
    assert plan["predictor"]["stopped_early_runs"] == [{"run": short, "iterations": 1, "asked_iterations": 3}]
    assert short in plan["predictor"]["profile_runs"]  # used, not set aside
    assert advisor.json("recommend", "--profile", campaign_dir, *options)["predictor"]["stopped_early_runs"] == []
    assert "stopped early" not in advisor("recommend", "--profile", campaign_dir, *options).stdout


def test_recommend_with_the_layer_merger(advisor, campaign_dir):
    def plan(pp, *merge):
        return advisor.json("recommend", "--profile", campaign_dir, "--gpus", pp, "--pp", pp, "--mbs", 2, "--gbs",
                            2 * pp, "--predictor", "capture", *merge)

    merged = plan(4, "--merge-to", 5)
    assert merged["predictor"]["name"] == "capture" and sum(merged["layers_per_stage"]) == 8 and merged["pp"] == 4
    # One unit per layer is no merging; two units leave two stages one split only, which the
    # exact planner over layers can only match or beat, and here beats.
    layers = plan(2)
    assert plan(2, "--merge-to", 8)["layers_per_stage"] == layers["layers_per_stage"]
    coarse = plan(2, "--merge-to", 2)
    assert coarse["layers_per_stage"] != layers["layers_per_stage"]
    assert coarse["peak_predicted_gib"] > layers["peak_predicted_gib"]


def test_recommend_hybrid_plan(advisor, campaign_dir):
    plan = advisor.json("recommend", "--profile", campaign_dir, "--gpus", 8, "--gpus-per-node", 2, "--mode",
                        "hybrid", "--predictor", "capture", "--mbs", 4, "--gbs", 32)
    assert plan["mode"] == "hybrid" and plan["predictor"]["name"] == "capture"
    degrees = {(stage["tp"], stage["dp"]) for stage in plan["stages"]}
    assert plan["launchable"] == (len(degrees) == 1)
    assert (plan["megatron_args"] is None) == (not plan["launchable"])
    assert (plan["not_launchable_reason"] is None) == plan["launchable"]
    assert sum(len(stage["gpus"]) for stage in plan["stages"]) == 8
    for stage in plan["stages"]:
        assert len(stage["nodes"]) == 1  # no stage crosses a node


def test_recommend_errors(advisor, campaign_dir, tmp_path):
    common = ["--profile", campaign_dir, "--gpus", 8, "--gpus-per-node", 4]
    assert "needs --pp" in advisor.error("recommend", *common)
    assert "drop --tp and --pp" in advisor.error("recommend", *common, "--mode", "hybrid", "--pp", 2)
    assert "--gpus 8 is not divisible by TP x CP x PP = 1 x 1 x 3 = 3" in advisor.error("recommend", *common, "--pp", 3)
    assert "nope: no such directory" in advisor.error("recommend", "--profile", tmp_path / "nope", "--gpus", 4, "--pp", 2)
    line = advisor.error("recommend", "--profile", tmp_path, "--gpus", 4, "--pp", 2)
    assert "no profile files (rank*.jsonl) nor run directories holding them" in line
    few = tmp_path / "reduced"
    for p in reduced(8, 4):
        write_run(few, Truth(spec=TINY), p, mbs=2)
    message = advisor.error("recommend", "--profile", few, "--gpus", 4, "--pp", 4, "--mbs", 2, "--gbs", 8,
                            "--predictor", "capture")
    assert "M_i(" in message and "is unknown" in message
    # a reduced campaign serves the default predictor: the line says so, beside the full campaign
    assert message.endswith("; profile the full campaign ('advisor profile plan --mode full'), or use the 1f1b "
                            "predictor (recommend's default), which reads a reduced campaign")
    assert advisor.json("recommend", "--profile", few, "--gpus", 4, "--pp", 4, "--mbs", 2, "--gbs", 8)["pp"] == 4
    # hybrid mode over reduced pp, dp2 and tp2 runs: each scenario's reason, the shared advice once
    hybrid = tmp_path / "reduced-hybrid"
    write_scenario(hybrid, Truth(spec=TINY), reduced(8, 4), (2, 4))
    write_scenario(hybrid, Truth(spec=TINY), reduced(8, 3), (2, 4), tp=2)
    write_scenario(hybrid, Truth(spec=TINY), reduced(8, 3), (2, 4), dp=2)
    line = advisor.error("recommend", "--profile", hybrid, "--gpus", 8, "--gpus-per-node", 2, "--mode", "hybrid",
                         "--mbs", 4, "--gbs", 32, "--predictor", "capture")
    assert line.startswith("Error: no stage config can be predicted: pp: scenario pp, pipeline microbatch 4: no run "
                           "held layer ")
    assert line.count("profile the full campaign") == 1 and line.count("is unknown") == 3
    assert line.endswith(". For all: profile the full campaign ('advisor profile plan --mode full'), or use the "
                         "1f1b predictor (recommend's default), which reads a reduced campaign")
    # degrees no profile prices: the line says how to get them (audit: it named the scenario and stopped)
    line = advisor.error("recommend", "--profile", few, "--gpus", 8, "--tp", 2, "--pp", 4, "--mbs", 2, "--gbs", 8)
    assert line == ("Error: no profile runs for scenario tp2, nor any to derive it from; profiled: pp. Profile "
                    "those degrees ('advisor profile plan' plans TP 2 and 4 and DP 2 and 4 runs where "
                    "--gpus-per-node holds them, and the 1f1b predictor derives a larger TP from two profiled TPs), "
                    "or give the --tp and --gpus of a profiled run")
    line = advisor.error("recommend", "--profile", few, "--gpus", 8, "--pp", 4, "--mbs", 2, "--gbs", 16,
                         "--predictor", "capture")
    assert line.startswith("Error: no profile runs for scenario dp2; profiled: pp. Profile those degrees")
    # hybrid stages stay in a node: the nodes are the default 8 GPUs unless --gpus-per-node says otherwise
    line = advisor.error("recommend", "--profile", few, "--gpus", 4, "--mode", "hybrid", "--mbs", 2, "--gbs", 8)
    assert line == ("Error: --gpus 4 must be whole nodes of 8 GPUs (hybrid stages stay within a node): give "
                    "--gpus-per-node N, the GPUs your nodes hold")


def test_recommend_says_which_runs_it_set_aside(advisor, tmp_path):
    """A campaign killed midway left a run 'running': recommend planned from the finished runs and
    said so only in the JSON's skipped_runs (audit); the table now names them and what to do."""
    import shutil

    root = tmp_path / "runs"
    shutil.copytree(write_campaign(tmp_path / "full"), root)
    killed = write_run(root, Truth(spec=TINY), (2, 2, 2, 2), mbs=2, name="pp-killed", status="running")
    write_run(root, Truth(spec=TINY), (2, 2, 2, 2), mbs=4, name="pp-oom", status="oom")
    total = len(list(root.iterdir()))
    args = ("recommend", "--profile", root, "--gpus", 4, "--pp", 4, "--mbs", 2, "--gbs", 8)
    plan = advisor.json(*args)
    assert plan["predictor"]["skipped_runs"] == [{"run": "pp-killed", "status": "running"},
                                                 {"run": "pp-oom", "status": "oom"}]
    text = " ".join(advisor(*args, "--wide").stdout.split())  # the caption, unwrapped
    assert (f"set aside 2 of {total} profile runs: pp-killed (still 'running': killed midway; run the same "
            "'advisor profile run' to resume); pp-oom (out of memory: an outcome, not a measurement)") in text
    shutil.rmtree(killed)
    shutil.rmtree(root / "pp-oom")
    assert "set aside" not in advisor(*args).stdout


def test_recommend_from_no_finished_run_names_them_and_what_to_do(advisor, tmp_path):
    """A campaign interrupted in its first run (Ctrl-C on 'advisor profile run'), then recommend:
    the line was "none of the 1 profile runs finished ('ok')", naming no run and saying nothing of
    the resume that the caption of a plan says when some runs finished."""
    killed = tmp_path / "killed"
    write_run(killed, Truth(spec=TINY), (2, 2, 2, 2), mbs=2, name="pp-b1-2x4", status="running")
    args = ("--gpus", 4, "--pp", 4, "--mbs", 2, "--gbs", 8)
    assert advisor.error("recommend", "--profile", killed, *args) == (
        "Error: the one profile run did not finish ('ok'): pp-b1-2x4 still 'running': killed midway; run the same "
        "'advisor profile run' to resume")
    write_run(killed, Truth(spec=TINY), (2, 2, 2, 2), mbs=4, name="pp-b2-2x4", status="oom")
    assert advisor.error("recommend", "--profile", killed, *args) == (
        "Error: none of the 2 profile runs finished ('ok'): pp-b1-2x4 still 'running': killed midway; run the same "
        "'advisor profile run' to resume; pp-b2-2x4 out of memory: an outcome, not a measurement")


@pytest.mark.parametrize("columns,left_out", [(70, "GPU ids"), (60, "GPU ids, even split KiB")])
def test_a_narrow_plan_table_keeps_the_memory_per_gpu(advisor, campaign_dir, monkeypatch, columns, left_out):
    """At 60 columns the plan's memory per GPU was the column left out (equal rank, rightmost but
    the even split) and the GPU ids, which the degrees give, stayed (audit). (With the units under
    the headers the table is narrower: at 80 columns all of it fits, the same case is met at 70.)"""
    monkeypatch.setenv("COLUMNS", str(columns))
    text = advisor("recommend", "--profile", campaign_dir, "--gpus", 8, "--gpus-per-node", 4, "--pp", 4, "--mbs", 2,
                   "--gbs", 16).stdout
    header = " | ".join(read_table(text).headers)
    assert header.startswith("stage") and "| plan KiB" in header and "in flight" in header and "GPU ids" not in header
    assert max(len(line.encode()) for line in text.splitlines()) <= columns
    assert f"not shown to fit {columns} columns: {left_out} (--wide shows them)" in " ".join(text.split())


def test_help_stays_fast_without_numpy():
    code = "import sys, advisor.cli; print(any(m in sys.modules for m in ('numpy', 'matplotlib', 'rich')))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


def test_recommend_takes_a_gpu_preset(advisor, campaign_dir):
    """--gpu sets the node size (and the memory drawn); --gpus-per-node still overrides it."""
    common = ("recommend", "--profile", campaign_dir, "--gpus", 8, "--mode", "hybrid", "--predictor", "capture",
              "--mbs", 4, "--gbs", 32)
    preset = advisor.json(*common, "--gpu", "h100-94gb")
    explicit = advisor.json(*common, "--gpus-per-node", 4)
    assert preset["stages"] == explicit["stages"]
    assert advisor.json(*common, "--gpu", "h100-94gb", "--gpus-per-node", 2)["stages"] == advisor.json(
        *common, "--gpus-per-node", 2)["stages"]
    assert "unknown GPU" in advisor.error(*common, "--gpu", "tpu-v5")


def test_a_profiled_plan_is_judged_with_the_memory_its_profiles_do_not_measure(advisor, campaign_dir):
    """A profile measures allocated bytes; the GPU also holds the CUDA runtime's memory and the
    allocator's reserve, which the calibrated model adds to every stage (2.5 GiB and 15.5% of the
    GPU: at 80 GiB, 2.5 + 12.4 = 14.9 GiB). --objective time keeps each stage within the rest."""
    common = ("recommend", "--profile", campaign_dir, "--gpus", 8, "--gpus-per-node", 4, "--pp", 4, "--mbs", 2,
              "--gbs", 16)
    plan = advisor.json(*common, "--gpu", "h100-80gb", "--objective", "time")  # times from the time model
    assert plan["stage_limit_gib"] == pytest.approx(80 - 14.9, abs=0.05)
    shown = advisor(*common, "--mem", 80).stdout
    assert "allocated; with 14.9 GiB of runtime and allocator reserve" in shown
    # 2 GiB of GPU cannot hold the 2.5 GiB runtime the tiny model runs beside
    refused = advisor(*common, "--mem", 2, expect=1)
    assert "GiB of runtime and allocator reserve, above 2 GiB" in refused.output


def test_a_one_layer_stage_reads_as_its_layer(advisor, campaign_dir):
    """'1', not '1-1', where a stage holds one layer (the 8-layer plan over PP 4 gives its first
    stage one: tests/test_capture_cli.py's brute force, docs/launch.md)."""
    import re

    common = ("recommend", "--profile", campaign_dir, "--gpus", 8, "--gpus-per-node", 4, "--pp", 4, "--mbs", 2,
              "--gbs", 16)
    plan = advisor.json(*common)
    assert 1 in plan["layers_per_stage"]
    table = advisor(*common).stdout
    assert not re.search(r"\|\s+(\d+)-\1\s+\|", table), table
    first = plan["layers_per_stage"].index(1)
    layer = sum(plan["layers_per_stage"][:first]) + 1
    assert re.search(rf"\|\s+{first}\s+\|\s+{layer}\s+\|\s+1\s+\|", table), table
