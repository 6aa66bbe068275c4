"""Numbers in the docs' prose that the code computes, recomputed and compared.

tests/doc_examples.py checks the console blocks (a command and its output) and the generated
sections (tables/README.md's results, docs/profiling.md's symbolic comparison, docs/estimator.md's
reserve forms) are checked by their own tests. What is left are tables and sentences written by
hand from several commands' numbers: this file parses each from the document and compares it with
what the code gives now, to the doc's printed precision (0.01 printed is rounded from the code's
value, never a tolerance). A stale doc fails here, naming the file, the row and the command.
Where the doc gives a hand formula (docs/profiling.md's layer counts, a checkpoint's 14 bytes a
parameter, a schedule's passes), the test evaluates the formula on the model's sizes instead of
reading the code's output back.
"""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner
from doc_text import numbers, printed, table_after, text_of

# --- docs/options.md: Llama 3 405B as Meta laid it out ------------------------------------------

FSDP = ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads"]


def estimate(*args: str) -> dict:
    from advisor.cli import cli

    result = CliRunner().invoke(cli, ["estimate", *args, "--format", "json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def meta_405b(dp: int, *options: str) -> dict:
    """docs/options.md's command for one row of its 405B table."""
    return estimate("--tp", "8", "--pp", "16", "--dp", str(dp), "--mbs", "1", "--gbs", "2048", "--gpu",
                    "h100-80gb", "--model", "llama3.1-405b", "--layers-per-stage", "7,8x14,7", *options)


def test_options_md_405b_table_is_what_advisor_estimate_prints():
    rows = table_after("docs/options.md", "| DP | data parallel | weights |")
    assert len(rows) == 4
    for dp, sharding, weights, gradients, optimizer, activations, total, usage, verdict, step in rows:
        got = meta_405b(int(dp), *(FSDP if "FSDP" in sharding else ()))
        peak = got["stages"][got["peak_stage"]]
        where = f"docs/options.md 405B table, DP {dp}, {sharding}"
        assert weights == printed(peak["weights_gib"], weights), where
        assert gradients == printed(peak["gradients_gib"], gradients), where
        assert optimizer == printed(peak["optimizer_gib"], optimizer), where
        assert activations == printed(peak["activations_gib"], activations), where
        assert total == printed(got["total_gib"], total), where
        assert usage == printed(got["usage_gib"], usage), where
        assert step == printed(got["step_time_s"], step), where
        said = got["verdict"] if got["verdict"] == "oom" else f"{got['verdict']} ({got['margin_gib']:.1f})"
        assert verdict == said, where
        assert peak["stage"] == 1 and peak["in_flight_microbatches"] == 15, where


def test_options_md_405b_prose_is_what_advisor_estimate_prints():
    """The sentences around the table: the peak stage's in-flight count, the BF16-gradient variant."""
    text = text_of("docs/options.md")
    got = meta_405b(64, *FSDP)
    in_flight = int(got["stages"][got["peak_stage"]]["in_flight_microbatches"])
    assert f"the peak stage (stage 1, {in_flight} microbatches in flight)" in text
    assert f"the {in_flight} in-flight microbatches' activations" in text
    bf16 = meta_405b(64, *FSDP, "--grad-dtype", "bf16")
    peak = bf16["stages"][bf16["peak_stage"]]
    assert (f"gradients {peak['gradients_gib']:.2f} GiB at DP 64, Eq. 18 total {bf16['total_gib']:.2f} GiB, "
            f"still {bf16['verdict']}, and a step of {bf16['step_time_s']:.2f} s instead of "
            f"{got['step_time_s']:.2f} s") in text


# --- docs/time.md: issue 16's targets, as tables/README.md's generated section has them ---------

README_TARGETS = "| target (issue 16) | reached |"
"""tables/README.md's table, written by ``python -m tables.seed004`` and checked against the code by
tests/test_tables_seed004.py: docs/time.md's copy is compared with it."""
TIME_TARGETS = [  # (time.md row, [(tables/README.md row, how many of its numbers)])
    ("tight band", [(0, 1)]),
    ("runs called fits / likely fits that went OOM", [(1, 1)]),
    ("all 454 runs", [(2, 1)]),
    ("ranking: mean", [(3, 1), (4, 1)]),
    ("ranking never below the paper's rule", [(5, 4)]),
    ("TFLOP/s MAPE", [(6, 5)]),
    ("within-column Spearman", [(7, 1)]),
    ("Table 11", [(8, 1)]),
]


def test_time_md_targets_are_tables_readme_s():
    ours = table_after("docs/time.md", "| target | reached |")
    generated = table_after("tables/README.md", README_TARGETS)
    for start, sources in TIME_TARGETS:
        row = next(r for r in ours if r[0].startswith(start))
        # "T3 8.1%" in the generated cell: the table's number is a label, not a result
        expected = [n for index, count in sources
                    for n in numbers(re.sub(r"\bT\d+ ", "", generated[index][1]))[:count]]
        shown = numbers(re.sub(r"\b[AH]100\b", "", row[1]))[:len(expected)]  # GPU names, not results
        assert shown == [printed(float(n), s) for n, s in zip(expected, shown)], \
            f"docs/time.md, target {start!r}: {shown} against tables/README.md's {expected} (python -m tables.seed004)"


# --- docs/validation.md: the published MoE runs' table ------------------------------------------

MOE_RUNS = {  # docs/validation.md's row -> tables/published/moe_runs.csv's id
    "Mixtral 8x7B, 64 H100 (MoE guide)": "mcore-mixtral-8x7b",
    "DeepSeek-V3, 1,024 H100 (DGX Cloud v25.05)": "dgxc-dsv3-bf16",
    "DeepSeek-V3, 1,024 H100, DeepEP, a2a overlap, MTP (25.09)": "mb2509-dsv3",
    "DeepSeek-V3, 1,024 H100, HybridEP, MTP, GBS 16384 (model card, 2026-08-15)": "mbcard-dsv3-bf16",
    "Qwen3-235B-A22B, 256 H100, token drop (25.09)": "mb2509-q235-td",
    "Qwen3-235B-A22B, 256 H100, a2a overlap (25.11)": "mb2511-q235",
    "Qwen3-235B-A22B, 256 H100, a2a overlap (26.04.01)": "mb2604-q235",
    "Qwen3-30B-A3B, 16 H100, token drop (25.09)": "mb2509-q30-td",
    "Qwen3-30B-A3B, 16 H100, the same layout (25.11)": "mb2511-q30",
    "Qwen3-30B-A3B, 16 H100, PP 2 VP 12 (26.02.01)": "mb2602-q30",
    "Qwen3-30B-A3B, 16 H100, EP 16, HybridEP (26.06)": "mb2606-q30-ep16",
    "Qwen3-30B-A3B, 16 H100, EP 16, alltoall (Bridge docs, 2026-05-18)": "mbdoc-q30-a2a",
    "Qwen3-30B-A3B, the same, a2a overlap": "mbdoc-q30-a2a-overlap",
    "Qwen3-30B-A3B, the same, a2a overlap, delayed wgrad": "mbdoc-q30-a2a-overlap-dw",
    "Qwen3-30B-A3B, 16 H100, EP 16, HybridEP, a2a overlap (model card)": "mbcard-q30-hybridep",
    "Qwen3-30B-A3B, the same, HybridEP, no overlap (card, 2026-07-18)": "mbcard0718-q30-hybridep",
    "Qwen3-30B-A3B, the same, HybridEP, a2a overlap (card, 2026-07-25)": "mbcard0725-q30-overlap",
}


@pytest.fixture(scope="module")
def moe_rows() -> dict[str, dict]:
    from tables import published_moe

    return {row["id"]: row for row in published_moe.rows()}


def test_validation_md_moe_table_is_what_tables_published_moe_prices(moe_rows):
    rows = table_after("docs/validation.md", "| run | precision | predicted | published | error | status |")
    assert sorted(MOE_RUNS[r[0]] for r in rows) == sorted(i for i, r in moe_rows.items() if r["targeted"]), \
        "docs/validation.md's MoE table: one row per H100 test run of tables/published/moe_runs.csv"
    for label, precision, predicted, published, error, status in rows:
        got = moe_rows[MOE_RUNS[label]]
        where = f"docs/validation.md, {label} (python -m tables.published_moe)"
        assert precision == got["priced_precision"].upper(), where
        assert predicted == printed(got["step_time_s"], predicted) + " s", where
        assert published == printed(got["published_step_time_s"], published) + " s", where
        assert error == f"{got['error']:+.1%}", where
        assert status == ("within" if got["within_target"] else "**miss**"), where


# --- README.md's "How good it is" and docs/validation.md's Megatron-Bridge results --------------

WORDS = {2: "two", 3: "three", 4: "four", 5: "five"}


@pytest.fixture(scope="module")
def dense() -> dict[str, tuple[list[dict], dict]]:
    from tables.published.runs import load_source, report

    return {name: report(load_source(name)) for name in ("DGX Cloud Benchmarking", "Megatron-Bridge")}


def test_readme_dense_figures_are_what_tables_published_prints(dense):
    text = text_of("README.md")
    rows, summary = dense["DGX Cloud Benchmarking"]
    bf16, fp8 = summary["bf16"], summary["fp8"]
    assert f"Against {len(rows)} published NeMo runs" in text
    assert (f"BF16 step time within {bf16['mape']:.1%} on average, at most {bf16['max_error']:.1%}; FP8 within "
            f"{fp8['mape']:.1%} on average, every one within 15% (at most {fp8['max_error']:.1%}: 24.12's 405B on "
            "96 GPUs") in text
    assert fp8["max_error_run"] == "dgxc-24.12-405b-fp8-96" and fp8["within_target"] == fp8["runs"]
    assert all(r["verdict"] in ("fits", "likely fits") for r in rows), "README: every run called runnable"
    rows, summary = dense["Megatron-Bridge"]
    bridge = summary["fp8"]
    assert (f"{bridge['runs']} FP8 runs of Megatron-Bridge's performance summaries") in text
    assert (f"within {bridge['mape']:.1%} on average, every one within 15% (at most {bridge['max_error']:.1%}), "
            f"but the six 70B runs called *likely oom*") in text
    seventy = [r for r in rows if "-70b-" in r["run"]]
    assert len(seventy) == 6 and {r["verdict"] for r in seventy} == {"likely oom"}


def test_validation_md_bridge_results_are_what_tables_published_prints(dense):
    text = text_of("docs/validation.md")
    rows, summary = dense["Megatron-Bridge"]
    s = summary["fp8"]
    largest = next(r for r in rows if r["run"] == s["max_error_run"])
    assert (f"Results now: {s['within_target']} of {s['runs']} within 15%, MAPE {s['mape']:.1%}, largest error "
            f"{largest['error']:+.1%} (25.11's 405B); {s['verdicts_ok']} of {s['runs']} called runnable") in text
    assert s["max_error_run"] == "mb-25.11-405b-fp8-1024"

    def errors(size: str) -> list[float]:
        return sorted(r["error"] for r in rows if f"-{size}-" in r["run"])

    eight, seventy, big = errors("8b"), errors("70b"), errors("405b")
    assert f"the 8B (Megatron-FSDP) {eight[0]:+.1%} and {eight[1]:+.1%}" in text
    assert f"the 70B {seventy[0]:+.1%} to {seventy[-1]:+.1%}" in text
    assert f"the 405B {big[-1]:+.1%} to {big[0]:+.1%}" in text
    from tables.published.runs import load_source, price

    tflops = sorted(price(run)["tflops_per_gpu"] for run in load_source("Megatron-Bridge") if "-405b-" in run.run)
    assert f"predicted fast ({tflops[0]:.0f}-{tflops[-1]:.0f} TFLOP/s per GPU by Megatron's count" in text
    from tables.published.runs import combined_summary

    total = combined_summary(dense["DGX Cloud Benchmarking"][0] + rows)["fp8"]
    assert (f"Both sources together: FP8 {total['runs']} runs, MAPE {total['mape']:.1%}, {total['within_target']} "
            f"within 15%, {total['verdicts_ok']} called runnable") in text


def test_readme_meta_405b_margins_are_what_advisor_estimate_prints():
    margins = sorted(-meta_405b(dp, *FSDP)["margin_gib"] for dp in (64, 128))
    assert f"*likely oom* by {margins[0]:.1f}-{margins[1]:.1f} GiB" in text_of("README.md")


def test_readme_moe_figures_are_what_tables_published_moe_prints(moe_rows):
    text = text_of("README.md")
    tests = [r for r in moe_rows.values() if r["targeted"]]
    within = sum(bool(r["within_target"]) for r in tests)
    mape = sum(abs(r["error"]) for r in tests) / len(tests)
    assert (f"{within} within 15%, mean absolute error {mape:.1%} (the issue's target: all {len(tests)})") in text
    dsv3 = moe_rows["mb2509-dsv3"]["error"]
    assert f"DeepSeek-V3 FP8 among them at {dsv3:+.2%}, inside by {15 - abs(dsv3) * 100:.2f} points" in text
    misses = [r["id"] for r in tests if not r["within_target"]]
    assert f"the {WORDS[len(misses)]} misses are Qwen3-30B-A3B runs" in text
    assert all(m.startswith(("mb2511-q30", "mb2602-q30", "mb2606-q30", "mbcard0718-q30")) for m in misses), misses
    ran = [r for r in moe_rows.values() if r["role"] != "context"]
    not_runnable = [r for r in ran if not r["runnable"]]
    assert f"{WORDS[len(not_runnable)]} of {len(ran)} runs that ran called likely oom or oom" in text


# --- docs/moe.md: the router and the permutations, measured and priced ---------------------------


def test_moe_md_router_and_permutation_table_is_what_the_probe_derives():
    """Each cell's numbers in ms: measured (the H200 summaries, as tables.moe_kernel_probe reads
    them), the model before (the bytes at the HBM rate) and now (the constants: ROUTER_KERNELS_S,
    the bytes over PERMUTE_HBM_FRACTION unfused, at the rate fused)."""
    from advisor.moe import ep_time
    from advisor.moe import time as moe_time
    from tables import moe_kernel_probe

    probe = moe_kernel_probe.load()
    qwen = probe["qwen3-30b-a3b"]
    softmax, sigmoid = (moe_time.ROUTER_KERNELS_S[k] for k in ("softmax", "sigmoid"))
    expected = [  # (measured, before, now) in ms, a row each
        ([qwen.router_kernels_s], [0], [softmax, 0]),
        ([probe["mixtral-8x7b"].router_kernels_s], [0], [softmax]),
        ([probe["deepseek-v3"].router_kernels_s], [0], [sigmoid]),
        ([qwen.permute_measured_s], [qwen.permute_priced_s],
         [qwen.permute_priced_s / ep_time.PERMUTE_HBM_FRACTION, qwen.permute_priced_s]),
        ([qwen.sort_measured_s], [qwen.sort_priced_s], [qwen.sort_priced_s]),
    ]
    rows = table_after("docs/moe.md", "| part | kernels | measured | the model before | now |")
    assert len(rows) == len(expected)
    for row, values in zip(rows, expected):
        for cell, seconds in zip(row[2:], values):
            shown = numbers(re.sub(r"\d+ experts|top-\d+", "", cell))
            assert len(shown) == len(seconds) and shown == [printed(s * 1e3, n) for s, n in zip(seconds, shown)], \
                f"docs/moe.md, {row[0]}: {cell!r} (python -m tables.moe_kernel_probe)"


def test_validation_md_misprints_are_tables_readme_s():
    """docs/validation.md's misprint table (the paper's printed value, Eq. 18's) against the one
    ``python -m tables.seed004`` generates in tables/README.md (checked by test_tables_seed004.py)."""
    ours = table_after("docs/validation.md", "| table | (TP, CP, PP, MBS) | GPUs | printed | Eq. 18 | evidence |")
    generated = table_after("tables/README.md", "| table | (TP, CP, PP, MBS) | GPUs | printed | ours | evidence |")
    assert [(numbers(r[0])[0], *r[1:5]) for r in ours] == [tuple(r[:5]) for r in generated]


def spelled(split: str) -> str:
    """A run-length split as the prose spells it: '8,9x2,6' -> '8, 9, 9, 6'."""
    layers = []
    for part in split.split(","):
        size, _, times = part.partition("x")
        layers += [size] * int(times or 1)
    return ", ".join(layers)


def test_search_md_splits_example_is_tables_readme_s():
    """docs/search.md's example copies two of ``python -m tables.splits``' cases from tables/README.md's
    generated section (checked by tests/test_tables_splits.py)."""
    text = text_of("docs/search.md")
    small = {r[0]: r for r in table_after("tables/README.md", "| split |", "**llama3.1-8b, 64 GPUs")}
    even, madpipe, memory = small["even"], small["time-optimal (MadPipe)"], small["memory-optimal"]
    assert (f"Llama-3.1-8B's even split (8 x 4) predicts a {even[5]} s step, MadPipe's "
            f"`{spelled(madpipe[1])}` (the last stage carries the 128k-vocabulary LM head) "
            f"{madpipe[5]} s ({madpipe[6]}) and the memory-optimal `{spelled(memory[1])}` {memory[5]} s") in text
    big = {r[0]: r for r in table_after("tables/README.md", "| split |", "**llama3.1-405b, 16384 GPUs")}
    even, llama3, madpipe = big["evenest (layout)"], big["account for both"], big["time-optimal (MadPipe)"]
    assert (even[3], llama3[3], madpipe[3]) == ("no", "no", "yes") and llama3[1] == "7,8x14,7"
    longer = float(madpipe[6].strip("+%"))
    assert (f"do not fit 80 GiB without recomputation ({float(even[2]):.0f} and {float(llama3[2]):.0f} GiB), "
            f"MadPipe's fits ({float(madpipe[2]):.1f} GiB) at a {longer:.0f}% longer step") in text


def test_time_md_meta_405b_sentence_is_what_tables_published_prints():
    """docs/time.md's Llama 3 405B against Meta (python -m tables.published, tables/published/meta405b.py)."""
    from tables.published import meta405b

    eight, sixteen, long = meta405b.rows()
    text = text_of("docs/time.md")
    assert (f"{eight['ours_v4']:.0f} vs {eight['published_tflops']} TFLOP/s per GPU on 8,192 GPUs, "
            f"{sixteen['ours_v4']:.0f} vs {sixteen['published_tflops']} on 16,384, {long['ours_v4']:.0f} vs "
            f"{long['published_tflops']} at 131K context") in text
    plain = sorted(r["ours_v1"] for r in (eight, sixteen, long))
    assert f"plain 1F1B would give {plain[0]:.0f}-{plain[-1]:.0f}" in text


def sweep(*args: str) -> list[dict]:
    from advisor.cli import cli

    result = CliRunner().invoke(cli, ["sweep", *args, "--format", "json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_time_md_rank_by_sentence_is_what_advisor_sweep_ranks():
    """docs/time.md on --rank-by: advisor sweep --gpus 16384 --gpu h100-80gb --model llama3.1-405b
    --gbs 2048 (--rank-by paper)."""
    common = ("--gpus", "16384", "--gpu", "h100-80gb", "--model", "llama3.1-405b", "--gbs", "2048")
    paper, throughput = sweep(*common, "--rank-by", "paper")[0], sweep(*common)
    fastest = max(throughput, key=lambda r: r["tflops_per_gpu"])
    ordinal = {2: "second", 3: "third", 4: "fourth", 5: "fifth", 6: "sixth"}[fastest["rank"]]
    assert (f"`--rank-by paper` puts first a PP-{paper['pp']} layout predicted at {paper['tflops_per_gpu']:.0f} "
            f"TFLOP/s per GPU, `throughput` one at {throughput[0]['tflops_per_gpu']:.0f} (the fastest, at "
            f"{fastest['tflops_per_gpu']:.0f}, ranks {ordinal}") in text_of("docs/time.md")


ALLOCATED = {"mbdoc-q30-a2a": 61.351, "mbcard0725-q30-overlap": 62.166}
"""NVIDIA's max allocated, decimal GB (tests/test_tables_published_moe.py has the sources)."""


def test_allocated_memory_figures_are_what_tables_published_moe_prices(moe_rows):
    """README.md's 'within x% and y%' and docs/validation.md's predicted allocated GiB of the two
    Qwen3-30B-A3B EP 16 runs: the analytic total (no allocator reserve) against NVIDIA's."""
    plain, overlapped = ((moe_rows[i]["total_gib"], gb * 1e9 / 2**30) for i, gb in ALLOCATED.items())
    errors = [ours / theirs - 1 for ours, theirs in (plain, overlapped)]
    readme = text_of("README.md")
    assert f"runs within {abs(errors[0]):.1%} and {abs(errors[1]):.1%} of NVIDIA's measurements" in readme
    text = text_of("docs/validation.md")
    assert (f"the plain alltoall layout: {plain[0]:.1f} GiB, against {plain[1]:.1f} GiB (61.351 GB) max allocated "
            f"in NVIDIA's 2026-05-17 run of it (docs/training/moe-optimization.md), {errors[0]:.1%}") in text
    assert (f"recipe: {overlapped[0]:.1f} GiB, against rank-0 peak allocated 62.166 ({overlapped[1]:.1f} GiB), "
            f"{errors[1]:.1%}") in text
    assert f"as GiB it would be {overlapped[0] / 62.166 - 1:.1%})" in text


# --- docs/launch.md: numbers in its prose --------------------------------------------------------


def test_launch_md_signal_time_example_is_a_405b_rows_step_and_save():
    """docs/launch.md's --signal-time lead: the best row of advisor sweep --model llama3.1-405b
    --gpus 128 --gpu h100-80gb, its step, and a save by hand: 14 bytes a parameter (BF16 weight 2,
    FP32 main 4, Adam's two FP32 moments 4 + 4; gradients are not saved) at 10 GB/s."""
    import math

    from advisor import equations
    from advisor.models import load_model

    row = sweep("--model", "llama3.1-405b", "--gpus", "128", "--gpu", "h100-80gb")[0]
    save = equations.model_parameters(load_model("llama3.1-405b")) * (2 + 4 + 4 + 4) / 10e9
    lead = math.ceil(row["step_time_s"] + save)
    said = re.search(r"Llama 3\.1 405B on 128 H100s: a ([\d.]+) s step and a ([\d.]+) s save at 10 GB/s, (\d+) s",
                     text_of("docs/launch.md"))
    step, saved, total = said.groups()
    assert (step, saved, total) == (printed(row["step_time_s"], step), printed(save, saved), str(lead)), \
        "docs/launch.md's --signal-time example (advisor sweep --model llama3.1-405b --gpus 128 --gpu h100-80gb)"


def test_launch_md_ep_time_example_is_what_advisor_estimate_prices():
    """docs/launch.md: EP 8 on nodes of 8 (its all-to-all inside a node) and of 4 (across them)."""
    common = ("--model", "qwen3-30b-a3b", "--gpus", "16", "--gpu", "h100-80gb", "--ep", "8")
    inside, across = estimate(*common)["ep_comm_s"], estimate(*common, "--gpus-per-node", "4")["ep_comm_s"]
    assert (f"`advisor estimate --model qwen3-30b-a3b --gpus 16 --gpu h100-80gb --ep 8` prices {inside:.1f} s of "
            f"it, and `--gpus-per-node 4` {across:.0f} s") in text_of("docs/launch.md")


NUMBER_WORDS = {"seven": 7, "eight": 8, "nine": 9, "ten": 10}


def _test_module_assignment(module: str, name: str):
    """A module-level constant of a test module, read without importing it (it needs torch)."""
    import ast

    from conftest import ROOT

    tree = ast.parse((ROOT / "tests" / module).read_text())
    return next(node.value for node in tree.body if isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == name for t in node.targets))


def test_launch_md_counts_the_models_test_megatron_validation_sweeps():
    """'the ranked rows of sweeps of N models: A, B, ...': N and the list are the distinct
    --model values of tests/test_megatron_validation.py's SWEEPS."""
    import ast

    sweeps = _test_module_assignment("test_megatron_validation.py", "SWEEPS")
    models = set()
    for args in sweeps.values:
        words = [ast.unparse(word) for word in args.elts]
        models.add(words[words.index("'--model'") + 1])
    said = re.search(r"rows of sweeps of (\w+) models: (.+?); estimates", text_of("docs/launch.md"))
    assert NUMBER_WORDS[said[1]] == len(models) == len(said[2].split(", ")), \
        f"docs/launch.md: {said[1]} models, {said[2]!r}; tests/test_megatron_validation.py sweeps {sorted(models)}"


def test_the_real_megatron_profiling_runs_are_counted_right():
    """docs/capture.md and docs/launch.md on tests/test_profile_run_megatron.py: its campaign
    (MODEL, CPU, 2 GPUs of 2 a node, MBS 4, GBS 8) planned here, and the runs of the split its
    module fixture keeps."""
    import ast

    from conftest import ROOT

    model, cpu = (ast.literal_eval(_test_module_assignment("test_profile_run_megatron.py", name))
                  for name in ("MODEL", "CPU"))
    source = (ROOT / "tests" / "test_profile_run_megatron.py").read_text()
    kept = ast.literal_eval(re.search(r'run\["layers_per_stage"\] == (\[[\d, ]+\])', source)[1])
    from advisor.cli import cli

    planned = CliRunner().invoke(cli, ["profile", "plan", *model, *cpu, "--no-bias-swiglu-fusion", "--gpus", "2",
                                       "--gpus-per-node", "2", "--mbs", "4", "--gbs", "8", "--format", "json"])
    assert planned.exit_code == 0, planned.output
    runs = [run for run in json.loads(planned.stdout)["runs"] if run["layers_per_stage"] == kept]
    assert len(kept) == 2 and sorted(run["micro_batch_size"] for run in runs) == [1, 2]
    assert (f"(`tests/test_profile_run_megatron.py`: {len(runs)} runs of PP {len(kept)}, the even split at "
            "microbatches 1 and 2,") in text_of("docs/capture.md")
    assert (f"`advisor profile run --megatron-lm` runs {len(runs)} runs of a reduced campaign (the even "
            f"PP-{len(kept)} split at microbatches 1 and 2;") in text_of("docs/launch.md")


# --- docs/capture.md: the end-to-end example's prediction ---------------------------------------


def test_capture_md_predicted_reduction_is_what_advisor_recommend_plans(tmp_path):
    """'the recommended split 2/5/7/2 ... (predicted: 23.5%)': advisor recommend on the reduced
    campaign's committed profiles, as tests/test_capture_e2e.py plans it (which measures the rest
    of the sentence with torch)."""
    import shutil

    from conftest import ROOT

    from advisor.cli import cli

    committed = ROOT / "tables" / "data" / "capture"
    for run in json.loads((committed / "campaigns" / "reduced.json").read_text())["runs"]:
        shutil.copytree(committed / "profiles" / run["id"], tmp_path / run["id"])
    result = CliRunner().invoke(cli, ["recommend", "--profile", str(tmp_path), "--gpus", "4", "--gpus-per-node", "1",
                                      "--pp", "4", "--mbs", "4", "--gbs", "16", "--format", "json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    predicted = 1 - plan["peak_predicted_gib"] / plan["baseline"]["peak_predicted_gib"]
    split = "/".join(map(str, plan["layers_per_stage"]))
    assert re.search(rf"the recommended split {split} measured [\d.]+ MiB at its peak against [\d.]+ MiB for the "
                     rf"even 4/4/4/4: \*\*[\d.]+% lower\*\* \(predicted: {predicted:.1%}\)", text_of("docs/capture.md"))


# --- docs/report.md: the 405B page's marks --------------------------------------------------------


def test_report_md_405b_page_marks_are_its_sweeps():
    """'1,992 rows, 3,336 heatmap cells, 1,536 pipeline passes': the rows of advisor sweep
    --model llama3.1-405b --gpus 16384 --gpu h100-80gb --gbs 2048 --all, its (TP, CP, PP) x MBS
    grid, and the schedule of its first row by hand: every rank runs each microbatch forward and
    backward through each of its VPP chunks, 2 x PP x VPP x microbatches passes."""
    rows = sweep("--model", "llama3.1-405b", "--gpus", "16384", "--gpu", "h100-80gb", "--gbs", "2048", "--all")
    cells = len({(r["tp"], r["cp"], r["pp"]) for r in rows}) * len({r["mbs"] for r in rows})
    first = rows[0]
    passes = 2 * first["pp"] * first["vpp"] * first["num_microbatches"]
    assert (f"the 405B page has thousands of marks ({len(rows):,} rows, {cells:,} heatmap cells, {passes:,} "
            "pipeline passes)") in text_of("docs/report.md")
    assert f"the 405B page has its {len(rows):,} rows" in text_of("docs/report.md")


# --- docs/profiling.md: the hand counts ---------------------------------------------------------


def test_profiling_md_te_layer_counts_by_hand():
    """The TE layer's table: what it keeps in units of s b h / (t c) bytes, by the table's rows
    (norms 4 + 8/h, GEMM inputs 4, Q and K 2 + 2k/a, V 2(1 + 2k/a), output 2, statistics 4a/h,
    SwiGLU 6f/h; with CP the ring's K|V buffer 4k/a for K and the whole QKV output), against Eq. 12's
    12 + 4k/a + 8f/h, for each model's own sizes."""
    from advisor.models import load_model

    def units(name: str, cp: bool) -> tuple[float, float]:
        spec = load_model(name)
        h, a, k, f = spec.hidden_size, spec.num_attention_heads, spec.num_query_groups, spec.ffn_hidden_size
        attention = 2 + 4 * k / a + 2 if cp else 2 + 2 * k / a + 2 * (1 + 2 * k / a) + 2
        kept = 4 + 8 / h + 4 + attention + 4 * a / h + 6 * f / h
        return kept, 12 + 4 * k / a + 8 * f / h

    text = text_of("docs/profiling.md")
    (b8, p8), (b70, p70), (b405, p405) = units("llama3.1-8b", False), units("llama3.1-70b", False), \
        units("llama3.1-405b", True)
    assert (f"8B {b8:.2f} ({b8 / p8:.3f} of {p8:g}), 70B {b70:.2f} ({b70 / p70:.3f} of {p70:g})") in text
    assert f"405B {b405:.2f} ({b405 / p405:.3f} of {p405:g})" in text
    assert f"profiles say a layer keeps {b8 / p8:.3f} of Eq. 12 (8B)" in text


def test_profiling_md_local_layer_counts_by_hand():
    """The local spec's 8B layer at sequence 8192 in s b h units, tensor by tensor as
    tests/test_symbolic.py counts it (norms' inputs and outputs 8, their rstd 8/h, Q 2, K and V
    expanded 4, the context 2, RoPE's cos and sin 8d/h, the eager SwiGLU's five tensors 10f/h, the
    BF16 scores 2as/h); the expanded K and V at 4096, 4 s b (a - k) d; the calibrated SwiGLU share
    of Eq. 12, (12 + 4k/a + 6f/h) / (12 + 4k/a + 8f/h), and RoPE's frequencies for 70B at TP 8."""
    from advisor import memory_terms
    from advisor.models import load_model

    spec, s = load_model("llama3.1-8b"), 8192
    h, a, k, f, d = spec.hidden_size, spec.num_attention_heads, spec.num_query_groups, spec.ffn_hidden_size, \
        spec.head_dim
    scores = 2 * a * s / h
    layer = 8 + 8 / h + 2 + 4 * a * d / h + 2 + 8 * d / h + 10 * f / h + scores
    text = text_of("docs/profiling.md")
    assert (f"keeps {layer:.2f} s b h per 8B layer at sequence 8192 instead: its BF16 s x s scores are "
            f"{scores:g}") in text
    assert f"({4 * 4096 * (a - k) * d / 2**20:g} MiB an 8B layer at sequence 4096)" in text
    share = (12 + 4 * k / a + 6 * f / h) / (12 + 4 * k / a + 8 * f / h)
    assert round(share, 3) == round(memory_terms.swiglu_fusion_fraction(spec), 3)
    assert f"the calibrated model's SwiGLU correction alone assumes {share:.3f}" in text
    big = load_model("llama3.1-70b")
    assert f"({4 * big.head_dim * 8 / big.hidden_size:g} of these units for 70B at TP 8)" in text


def test_profiling_md_cuda_attention_ratio_is_what_profile_show_reads():
    """'Qwen3-30B-A3B's attention reads Nx its term': advisor profile show of the H200's
    --backend cuda layer (benchmarks/gpu/data/h200_moe_layers), against today's analytic term."""
    from conftest import ROOT

    from advisor.cli import cli

    layer = ROOT / "benchmarks" / "gpu" / "data" / "h200_moe_layers" / "qwen3-30b-a3b-alltoall-cuda"
    shown = CliRunner().invoke(cli, ["profile", "show", str(layer), "--format", "json"])
    assert shown.exit_code == 0, shown.output
    ratio = next(r["ratio"] for r in json.loads(shown.stdout)["compare"] if r["term"] == "attention activations")
    assert f"(Qwen3-30B-A3B's attention reads {ratio:.0f}x its term)" in text_of("docs/profiling.md")


# --- docs/validation.md: the Megatron-Bridge runs beyond a target and the choices left open --------


def test_validation_md_bridge_notes_are_what_tables_published_prices(dense):
    """The 70B's memory, the largest error's parts and the 25.09-to-25.11 share of it, and the
    25.09 rows priced with delayed scaling (their recipe's default) against current scaling."""
    import dataclasses

    from tables.published.runs import load_source, price

    text = text_of("docs/validation.md")
    rows = {r["run"]: r for r in dense["Megatron-Bridge"][0]}
    runs = {run.run: run for run in load_source("Megatron-Bridge")}
    seventy = price(runs["mb-25.11-70b-fp8-64"])
    assert (f"*likely oom* at {seventy['usage_gib']:.2f} GiB of 80, and they ran: Eq. 18 gives "
            f"{seventy['total_gib']:.2f} GiB on the first stage") in text
    big, before = rows["mb-25.11-405b-fp8-1024"], rows["mb-25.09-405b-fp8-1024"]
    parts = price(runs["mb-25.11-405b-fp8-1024"])["time_parts"]
    assert (f"25.11's 405B at {big['error']:+.1%} ({big['predicted_s']:.2f} s against {big['published_s']:.2f}), is "
            f"not explained: the model charges {parts['compute_s']:.2f} s of compute, {parts['tp_comm_s']:.2f} s of "
            f"exposed TP communication") in text
    assert f"{parts['bubble_s']:.2f} s of bubble and {parts['overhead_s']:.2f} s of per-microbatch overhead" in text
    assert (f"the same layout published {before['published_s']:.2f} s in 25.09, so "
            f"{abs(big['error']) - abs(before['error']):.1%} of its {abs(big['error']):.1%} points").replace("%", "") \
        in text
    current = [rows[f"mb-25.09-{size}-fp8-{gpus}"]["error"] for size, gpus in (("8b", 8), ("70b", 64), ("405b", 1024))]
    delayed = []
    for size, gpus in (("8b", 8), ("70b", 64), ("405b", 1024)):
        run = runs[f"mb-25.09-{size}-fp8-{gpus}"]
        assert "--fp8-recipe tensorwise" in run.training_flags
        flags = run.training_flags.replace("--fp8-recipe tensorwise", "--fp8-recipe delayed")
        delayed.append(price(dataclasses.replace(run, training_flags=flags))["step_time_s"] / run.step_time_s - 1)
    assert (f"delayed scaling, prices {delayed[0]:+.1%} (8B), {delayed[1]:+.1%} (70B) and {delayed[2]:+.1%} (405B), "
            f"against {current[0]:+.1%}, {current[1]:+.1%} and {current[2]:+.1%}.") in text


def test_validation_md_container_moves_are_the_published_data():
    """'The same layout in several containers moved by x% to y% (N pairs)': consecutive releases
    of one layout in tables/published/bridge_dense_runs.csv, their published step times alone."""
    from tables.published.runs import load_source

    layouts: dict[tuple, list] = {}
    for run in load_source("Megatron-Bridge"):
        key = (run.model, run.gpus, run.global_batch_size, run.micro_batch_size, run.seq_len, run.tp, run.pp, run.cp,
               run.vpp, run.training_flags)
        layouts.setdefault(key, []).append(run)
    moves = sorted((b.step_time_s / a.step_time_s - 1, a.run, b.run)
                   for same in layouts.values() for a, b in zip(same, same[1:]))
    (low, *_), (high, *_) = moves[0], moves[-1]
    text = text_of("docs/validation.md")
    assert f"moved by {low:+.1%} to {high:+.1%} ({len(moves)} pairs): the 405B by {low:+.1%} from 26.02 to 26.04.01" \
        in text
    assert moves[0][1:] == ("mb-26.02-405b-fp8-1024", "mb-26.04.01-405b-fp8-1024")


# --- README.md and docs/testing.md: the mutation pass ---------------------------------------------


def test_the_mutation_counts_are_the_mutants_and_the_table_of_their_last_run():
    """README's 'kills N of N mutants' and docs/testing.md's latest 'N of N killed' are the
    mutants tests/tools/mutate.py holds, and the table under them has one row each, all killed
    (the pass itself takes minutes: docs/testing.md says how it is run)."""
    import importlib.util

    from conftest import ROOT

    loaded = importlib.util.spec_from_file_location("mutate", ROOT / "tests" / "tools" / "mutate.py")
    mutate = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(mutate)
    count = len(mutate.MUTANTS)
    assert f"kills {count} of {count} mutants" in text_of("README.md")
    testing = text_of("docs/testing.md")
    latest = re.findall(r"(\d+) of (\d+) (?:mutants )?killed", testing)[0]
    assert latest == (str(count), str(count)), "docs/testing.md: the latest run's count"
    rows = table_after("docs/testing.md", "| # | file | mutant |")
    assert [int(row[0]) for row in rows] == list(range(1, count + 1))
    assert {row[-1].split(" (")[0] for row in rows} == {"killed"}
    assert [row[1] for row in rows] == [mutant[0] for mutant in mutate.MUTANTS]
