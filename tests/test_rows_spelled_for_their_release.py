"""Sweep rows and estimates write their megatron_args in the words of the Megatron-LM release they
were priced for, and say which (their 'megatron_version'): so that the list, copied into a
launch script on that release or read back with ``estimate --from-command``, runs as priced.

The case that made this necessary: core_v0.19.0's Megatron-FSDP keeps its main gradients in the
dtype of --megatron-fsdp-main-grads-dtype (default 'auto': BF16 for BF16 weights) whatever
--accumulate-allreduce-grads-in-fp32 says (``MegatronRelease.fsdp_main_grads_own_flag``). A
release-neutral list without that flag priced FP32 gradients and ran (and read back as) BF16
ones on core_v0.19.0: Llama 3.1 8B at TP 2, optim_grads on 8 H100s, 49.21 GiB priced, 45.28 read back.
The advisor-launch path always spelled the flag (``launch.arguments.compose``); the rows did not.
"""

from __future__ import annotations

import json
import shlex

import pytest
from launch_support import launcher, write_json

from advisor.options.flags import release_spelling
from advisor.releases import FSDP_MAIN_GRADS, NEWEST

FSDP = ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads"]
DENSE = ["--model", "llama3.1-8b", "--gpus", "8", "--gpu", "h100-80gb", *FSDP]
MIXTRAL = ["--model", "mixtral-8x7b", "--gpus", "64", "--gpu", "h100-80gb", "--gbs", "256", *FSDP]


def _read_back(advisor, row: dict, vocab: int, gpus: int, *release: str) -> dict:
    """``advisor estimate --from-command`` of the row's own megatron_args, as a launch script holds them."""
    result = advisor.runner.invoke(advisor.command, [
        "estimate", "--from-command", "-", "--gpus", str(gpus), "--gpu", "h100-80gb", "--vocab-size", str(vocab),
        "--format", "json", *release], input=shlex.join(["pretrain_gpt.py", *row["megatron_args"]]))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _same_price(read: dict, row: dict) -> None:
    assert read["unpriced"] == []
    assert read["step_time_s"] == pytest.approx(row["step_time_s"], rel=1e-12)
    assert read["total_gib"] == pytest.approx(row["total_gib"], rel=1e-12)


@pytest.mark.parametrize("release, checked", [((), NEWEST.checked), (("--megatron-version", "0.15"), "core_v0.15.2")])
def test_a_dense_sweeps_fsdp_rows_read_back_as_priced_on_their_release(advisor, release, checked):
    rows = json.loads(advisor("sweep", *DENSE, "--tp", "2", "--format", "json", *release).stdout)
    assert rows and {row["megatron_version"] for row in rows} == {checked}
    for row in rows[:3]:
        args = row["megatron_args"]
        # core_v0.19.0 is told the FP32 gradients priced; core_v0.15.2 reads them from
        # --accumulate-allreduce-grads-in-fp32 and has no such flag
        assert (args[-2:] == [FSDP_MAIN_GRADS, "fp32"]) == (checked == NEWEST.checked)
        assert "--accumulate-allreduce-grads-in-fp32" in args
        _same_price(_read_back(advisor, row, 128256, 8, *release), row)


def test_the_release_neutral_list_reads_back_otherwise_on_core_0_19(advisor):
    """What the rows wrote before: the same list without the flag prices BF16 gradients on
    core_v0.19.0, as Megatron keeps them there (tests/test_fsdp_main_grads.py by hand): less memory."""
    row = json.loads(advisor("sweep", *DENSE, "--tp", "2", "--format", "json").stdout)[0]
    neutral = {**row, "megatron_args": row["megatron_args"][:-2]}
    read = _read_back(advisor, neutral, 128256, 8)
    assert read["total_gib"] < row["total_gib"]
    assert read["options"]["grad_reduce_dtype"] == "bf16" and "grad_reduce_dtype" not in row["options"]


def test_an_moe_rows_fsdp_args_read_back_as_priced(advisor):
    """Megatron-FSDP on an MoE model is priced on core_v0.19.0 only (advisor.moe.fsdp.release_problem):
    its rows' lists read back there to the same step time and memory."""
    rows = json.loads(advisor("sweep", *MIXTRAL, "--format", "json", "--top", "3").stdout)
    assert rows and {row["megatron_version"] for row in rows} == {NEWEST.checked}
    for row in rows:
        assert row["megatron_args"][-2:] == [FSDP_MAIN_GRADS, "fp32"]
        _same_price(_read_back(advisor, row, 32000, 64), row)
    estimate = json.loads(advisor("estimate", *MIXTRAL, "--tp", "2", "--pp", "4", "--ep", "4", "--format",
                                  "json").stdout)
    assert estimate["megatron_version"] == NEWEST.checked
    _same_price(_read_back(advisor, estimate, 32000, 64), estimate)


def test_an_moe_rows_renamed_flags_are_in_its_releases_words(advisor):
    """core_v0.19.0 renamed --moe-enable-deepep (transformer_config.py routes it to the flex
    backend with a deprecation warning): its rows say --moe-flex-dispatcher-backend deepep."""
    flex = ["--model", "mixtral-8x7b", "--gpus", "64", "--gpu", "h100-80gb", "--moe-token-dispatcher-type", "flex",
            "--ep", "8", "--top", "1", "--format", "json"]
    newest = json.loads(advisor("sweep", *flex).stdout)[0]["megatron_args"]
    old = json.loads(advisor("sweep", *flex, "--megatron-version", "0.15").stdout)[0]["megatron_args"]
    assert "--moe-enable-deepep" in old and "--moe-enable-deepep" not in newest
    assert newest == release_spelling(NEWEST, old)


def test_a_launch_on_another_release_than_priced_says_so_where_it_prices_otherwise(advisor, tmp_path):
    """Llama 3.1 70B at TP 1 (a layer of 855,654,400 elements, over 5e8): core_v0.19.0 sizes
    optim_grads_params's buffers from it (tests/test_fsdp_budget_release.py), so that row's launch
    on core_v0.15.2 says so; an optim_grads row's at DP 8 does not (both releases' budgets are 1e9)."""
    line = "priced for Megatron-LM"
    for strategy, said in (("optim_grads", False), ("optim_grads_params", True)):
        row = tmp_path / f"{strategy}.json"
        advisor("estimate", "--model", "llama3.1-70b", "--gpus", "64", "--tp", "1", "--pp", "8", "--gbs", "512",
                *FSDP[:2], strategy, "--format", "json", "-o", row)
        same = launcher()("args", "--from", row, "--megatron-version", "0.19")
        other = launcher()("args", "--from", row, "--megatron-version", "0.15")
        assert line not in same.stderr
        assert (f"{line} {NEWEST.checked}, launched on core_v0.15.2, whose Megatron-FSDP sizes its {strategy} "
                "buffers otherwise: advisor estimate --megatron-version 0.15 prices it there" in other.stderr) == said
        assert (line in other.stderr) == said
        # the same flags, each in its release's words
        assert shlex.split(same.stdout) == release_spelling(NEWEST, shlex.split(other.stdout))


@pytest.mark.parametrize("case, priced, launched, said", [
    # 70B at TP 2: u = 855,638,016 / 2 (the matrices) + 16,384 (two RMSNorms, not split) =
    # 427,835,392; 2u = 855,670,784 < 1e9, so core_v0.19.0's optim_grads_params budgets are the
    # 1e9 floor, as core_v0.15.2's: the same price, nothing to say
    ("ogp_tp2", "0.19", "0.15", False),
    # 8B at DP 2048, optim_grads, --overlap-grad-reduce: core_v0.19.0 queues the DDP bucket,
    # 1M x 2048 = 2.048e9 > 1e9 (resolve_ddp_bucket_size), core_v0.15.2 1e9, but neither trims a
    # bucket the other keeps (the last bucket, 713,056,256, is below both; the others are not
    # queued together: tests/test_fsdp_optim_grads_queue.py): priced alike, not said
    ("og_dp2048", "0.19", "0.15", False),
    ("og_dp2048", "0.15", "0.19", False),
    # 70B, TP 4, PP 4 (20 layers a stage), DP 1536: buckets >= 1.536e9 cut in named order are
    # layers 0-6 + layer 7 to FC1 (7 x 213,925,888 + 37,765,120 + 117,440,512 = 1,652,686,848),
    # FC2_7 + layers 8-14 (1,556,201,472) and layers 15-19 (1,069,629,440). Backward queues the
    # last, and FC2_7 completes the middle one: core_v0.19.0's queue of 1.536e9 keeps the last
    # (4,278,517,760 unsharded when FC1_7 opens the first), core_v0.15.2's 1e9 pops it
    # (3,208,888,320): said both ways
    ("og70_dp1536", "0.19", "0.15", True),
    ("og70_dp1536", "0.15", "0.19", True),
    # without --overlap-grad-reduce the bucket size is None and core_v0.19.0 keeps 1e9 too
    ("og_dp2048_no_overlap", "0.19", "0.15", False),
])
def test_the_release_line_follows_the_prices_not_the_strategy(advisor, tmp_path, case, priced, launched, said):
    """The launch's note compares the buffers each release prices (``fsdp_buffers_alike``): it
    named every optim_grads_params row launched on another release, though at TP 2 on 70B both price
    it alike, and no optim_grads row, though core_v0.19.0 grows its queue past DP x CP = 1,000
    (Llama 3.1 70B, TP 4, PP 4, DP 1536: 38.14 GiB on core_v0.19.0, 34.15 on core_v0.15.2)."""
    layouts = {
        "ogp_tp2": ["--model", "llama3.1-70b", "--gpus", "8", "--tp", "2", "--pp", "1", "--gbs", "64",
                    "--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params"],
        "og_dp2048": ["--model", "llama3.1-8b", "--gpus", "2048", "--tp", "1", "--pp", "1", "--mbs", "1",
                      "--gbs", "4096", *FSDP],
        "og70_dp1536": ["--model", "llama3.1-70b", "--gpus", "24576", "--tp", "4", "--pp", "4", "--mbs", "1",
                        "--gbs", "1536", *FSDP],
    }
    layouts["og_dp2048_no_overlap"] = [*layouts["og_dp2048"], "--no-overlap-grad-reduce"]
    row = tmp_path / "row.json"
    advisor("estimate", *layouts[case], "--gpu", "h100-80gb", "--megatron-version", priced, "--format", "json",
            "-o", row)
    stderr = launcher()("args", "--from", row, "--megatron-version", launched).stderr
    assert ("priced for Megatron-LM" in stderr) == said, stderr


def test_an_moe_rows_megatron_fsdp_is_refused_on_core_0_15(advisor, tmp_path):
    """core_v0.15.2's Megatron-FSDP fails to wrap an expert-parallel model (advisor.moe.fsdp):
    the MoE model refuses to price it there, and the launch refuses to run a row priced on core_v0.19.0 there."""
    row = tmp_path / "mixtral.json"
    advisor("sweep", *MIXTRAL, "--top", "1", "--format", "json", "-o", row)
    launcher()("args", "--from", row, "--megatron-version", "0.19")
    line = launcher().error("args", "--from", row, "--megatron-version", "0.15")
    assert line == (f"Error: the sweep row (rank 1 of {row}): Megatron-LM core 0.15's Megatron-FSDP cannot wrap an "
                    "MoE model's expert-parallel parameters (megatron_fsdp.py get_expert_dp_group raises "
                    "AttributeError): launch it on a core 0.19 checkout, or price it without --use-megatron-fsdp")


def test_a_row_written_before_rows_named_their_release_still_launches(advisor, tmp_path):
    """Its flags were then release-neutral: no gradient dtype flag, held to the neutral list."""
    row = json.loads(advisor("estimate", *DENSE, "--tp", "2", "--format", "json", "--megatron-version",
                             "0.15").stdout)
    del row["megatron_version"]
    launched = launcher()("args", "--from", write_json(tmp_path / "old.json", row), "--megatron-version", "0.19")
    assert shlex.split(launched.stdout)[-2:] == [FSDP_MAIN_GRADS, "fp32"]  # the launch spells it (compose)
    assert "priced for" not in launched.stderr


@pytest.mark.parametrize("version, message", [
    ("0.99", "its 'megatron_version': Megatron-LM core 0.99 is not a release the advisor knows"),
    (19, "'megatron_version' must be a release such as core_v0.19.0, not 19"),
])
def test_a_rows_unknown_release_is_one_line(advisor, tmp_path, version, message):
    row = json.loads(advisor("estimate", *DENSE, "--tp", "2", "--format", "json").stdout)
    path = write_json(tmp_path / "row.json", {**row, "megatron_version": version})
    assert message in launcher().error("args", "--from", path)
    assert message in advisor.error("report", "--from", path, "-o", tmp_path / "r.html")


def test_the_reports_detail_prices_a_row_for_its_release(advisor):
    """core_v0.19.0's Megatron-FSDP sizes its buffers from the model, core_v0.15.2's are fixed:
    Llama 3.1 70B at TP 1, PP 8 holds 711,308,800 bytes more gathered weights and 3,422,617,600
    more queued gradients a stage on core_v0.19.0 (tests/test_fsdp_budget_release.py, by hand).
    The report's detail of each release's estimate shows its own stages, as the estimate does."""
    from advisor.report.details import layout_detail

    gib = 2**30
    rows = [json.loads(advisor("estimate", "--model", "llama3.1-70b", "--gpus", "64", "--tp", "1", "--pp", "8",
                               "--gbs", "512", *FSDP[:2], "optim_grads_params", "--format", "json", *release).stdout)
            for release in ((), ("--megatron-version", "0.15"))]
    newest, old = (layout_detail(row).stages for row in rows)
    for a, b, priced in zip(newest, old, rows[0]["stages"], strict=True):
        assert a["weights"] - b["weights"] == pytest.approx(711_308_800 / gib)
        assert a["gradients"] - b["gradients"] == pytest.approx(3_422_617_600 / gib)
        assert a["weights"] == pytest.approx(priced["weights_gib"], rel=1e-12)


@pytest.mark.parametrize("release, checked", [((), NEWEST.checked), (("--megatron-version", "0.15"), "core_v0.15.2")])
def test_an_analytic_plan_is_written_for_its_release_and_launched_as_priced(advisor, tmp_path, release, checked):
    """advisor recommend's analytic plans name their release and write its words, as rows do; the
    launch holds the plan's own list to its options in those words, and runs them on that release."""
    plan = tmp_path / "plan.json"
    advisor("recommend", "--model", "llama3.1-8b", "--gpus", "8", "--tp", "2", "--pp", "2", "--gpu", "h100-80gb",
            *FSDP, "-o", plan, *release)
    document = json.loads(plan.read_text())
    assert document["megatron_version"] == checked
    assert (document["megatron_args"][-2:] == [FSDP_MAIN_GRADS, "fp32"]) == (checked == NEWEST.checked)
    launched = launcher()("args", "--from", plan, "--megatron-version", checked)
    assert shlex.split(launched.stdout) == document["megatron_args"]
    assert "priced for" not in launched.stderr


def test_a_plan_launched_on_another_release_says_to_recommend_it_there(advisor, tmp_path):
    """A plan is priced again by advisor recommend, not estimate: the note names the command that
    made it (70B at TP 1, PP 8, optim_grads_params: core_v0.19.0 sizes its buffers from the model)."""
    plan = tmp_path / "plan.json"
    advisor("recommend", "--model", "llama3.1-70b", "--gpus", "64", "--tp", "1", "--pp", "8", "--gbs", "512",
            *FSDP[:2], "optim_grads_params", "-o", plan)
    note = launcher()("args", "--from", plan, "--megatron-version", "0.15").stderr
    assert ("whose Megatron-FSDP sizes its optim_grads_params buffers otherwise: advisor recommend "
            "--megatron-version 0.15 prices it there") in note
