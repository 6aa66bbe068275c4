"""``advisor recommend``'s exit status, as ``advisor sweep``'s (README: bad input is 2, "nothing
fits" is 1): the time objective with no split within the limit said so as an error (2); the memory
objective printed a plan at 188% of the memory and exited 0."""

import json

import pytest

# 405B on 64 H100s, TP 8 and PP 8: no split fits (the lowest peak is about 150 GiB per GPU)
TOO_BIG = ["recommend", "--model", "llama3.1-405b", "--gpus", 64, "--tp", 8, "--pp", 8, "--gbs", 2048,
           "--gpu", "h100-80gb"]
FITS = ["recommend", "--model", "llama3.1-8b", "--gpus", 64, "--tp", 2, "--pp", 4, "--gpu", "h100-80gb"]


def _lowest_peak(advisor) -> float:
    """The memory objective's plan: the lowest peak any split reaches."""
    result = advisor(*TOO_BIG, "--format", "json", expect=1)
    return json.loads(result.stdout)["peak_predicted_gib"]


def test_time_objective_with_nothing_within_the_limit_exits_1(advisor):
    lowest = _lowest_peak(advisor)
    for fmt in ("table", "json"):
        result = advisor(*TOO_BIG, "--objective", "time", "--format", fmt, expect=1)
        assert result.stdout == ""  # no plan: none keeps the limit
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and "Traceback" not in result.stderr
        # --gpu: the calibrated model, whose usage may fill the memory (the paper's rule keeps 80%)
        assert lines[0].startswith("advisor recommend: nothing fits: no split of 126 layers over 8 stages keeps "
                                   "every stage within 80.00 GiB")
        assert f"the lowest peak any split reaches is {lowest:.2f} GiB" in lines[0]
        assert "TP 8, PP 8, MBS 1, --threshold 1 x 80 GiB" in lines[0]
    paper = advisor(*TOO_BIG, "--objective", "time", "--memory-model", "paper", expect=1)
    assert "keeps every stage within 64.00 GiB" in paper.stderr and "--threshold 0.8 x 80 GiB" in paper.stderr


def test_memory_objective_above_the_memory_prints_the_plan_writes_none_and_exits_1(advisor, tmp_path):
    result = advisor(*TOO_BIG, "--format", "json", "-o", tmp_path / "plan.json", expect=1)
    assert not (tmp_path / "plan.json").exists()  # a plan that does not fit is nothing to launch
    plan = json.loads(result.stdout)
    assert plan["peak_predicted_gib"] > 80
    assert plan["layers_per_stage"] and sum(plan["layers_per_stage"]) == 126  # the lowest peak, still useful
    notes = [line for line in result.stderr.splitlines() if line.startswith("advisor recommend")]
    shown = notes[0].split("reaches is ")[1].split(" GiB")[0]
    assert 80 < float(shown) <= plan["peak_predicted_gib"] < float(shown) + 0.01 and len(shown.split(".")[1]) == 2
    assert notes == [f"advisor recommend: nothing fits: the lowest peak any split reaches is "
                     f"{shown} GiB per GPU, above 80 GiB. Try more GPUs, a larger --pp or "
                     f"--tp, or --recompute full (advisor sweep searches the layouts); no plan written to "
                     f"{tmp_path / 'plan.json'}"]
    recomputed = advisor(*TOO_BIG, "--recompute", "full", expect=1)
    assert recomputed.stderr.rstrip().endswith("Try more GPUs, a larger --pp or --tp (advisor sweep searches the "
                                               "layouts)")  # not what was given already
    table = advisor(*TOO_BIG, expect=1)
    assert "predicted peak" in table.stdout and table.stderr.count("nothing fits") == 1
    # "launchable" under "-> oom" read as a contradiction: Megatron can launch it, it would not fit
    assert "stock Megatron-LM can launch this layout, but it is predicted oom" in table.stdout
    assert "\nlaunchable on stock Megatron-LM" not in table.stdout
    assert "\nlaunchable on stock Megatron-LM" in advisor(*FITS).stdout
    assert plan["verdict"] == "oom" and plan["memory_model"] == "calibrated"
    # --mem decides where it is given: within 200 GiB a plan runs, and says so
    roomy = json.loads(advisor(*TOO_BIG, "--mem", 200, "--format", "json").stdout)
    assert roomy["memory_limit_gib"] == 200 and roomy["verdict"] in ("fits", "likely fits")
    # Eq. 18 does not depend on the GPU's memory (the calibrated reserve does): the same plan
    paper = json.loads(advisor(*TOO_BIG, "--memory-model", "paper", "--format", "json", expect=1).stdout)
    roomy = json.loads(advisor(*TOO_BIG, "--memory-model", "paper", "--mem", 200, "--format", "json").stdout)
    assert (roomy.pop("memory_limit_gib"), paper.pop("memory_limit_gib")) == (200, 80)
    assert (roomy.pop("verdict"), paper.pop("verdict")) == ("fits", "oom") and roomy == paper


def test_the_plan_is_judged_as_advisor_estimate_judges_its_split(advisor):
    """Llama-3.1-8B on 64 A100 40 GB, PP 4: Eq. 18's lowest peak (92% of the memory, 'tight') was
    a split the calibrated model calls oom, and the plan exited 0. The plan is now priced with the
    model that judges it: its peak is estimate's calibrated usage of the same split, its verdict
    estimate's, and a plan above the memory exits 1."""
    command = ["recommend", "--gpus", 64, "--pp", 4, "--gpu", "a100-40gb", "--format", "json"]
    for model, status, key in (("calibrated", 1, "usage_gib"), ("paper", 0, "total_gib")):
        plan = json.loads(advisor(*command, "--memory-model", model, expect=status).stdout)
        split = ",".join(str(n) for n in plan["layers_per_stage"])
        estimate = advisor.json("estimate", "--gpus", 64, "--pp", 4, "--gpu", "a100-40gb", "--layers-per-stage", split,
                                "--memory-model", model)
        assert plan["peak_predicted_gib"] == pytest.approx(estimate[key], rel=1e-9)
        assert plan["verdict"] == estimate["verdict"] and plan["memory_model"] == model
    assert plan["verdict"] == "tight"  # the paper's rule: above 80%, within the memory


def test_memory_objective_without_a_memory_limit_exits_0(advisor):
    """No --mem or --gpu: nothing to fit, the plan is the answer."""
    plan = json.loads(advisor(*TOO_BIG[:-2], "--format", "json").stdout)
    assert plan["peak_predicted_gib"] > 80


def test_plans_that_fit_exit_0(advisor):
    for objective in ("memory", "time"):
        plan = json.loads(advisor(*FITS, "--objective", objective, "--format", "json").stdout)
        assert plan["peak_predicted_gib"] <= 80


def test_bad_input_stays_2(advisor):
    assert "--objective time needs the memory limit" in advisor.error(*TOO_BIG[:-2], "--objective", "time")
    assert "--gpus 64 is not divisible by TP x CP x PP" in advisor.error(*FITS, "--pp", 3)


def test_the_help_states_the_exit_statuses(advisor):
    text = " ".join(advisor("recommend", "--help").stdout.split())
    assert "The exit status is 0 for a plan within the memory; 1 when nothing fits" in text
    assert "2 for bad input" in text


def test_the_memory_model_is_refused_where_it_cannot_apply(advisor, tmp_path):
    """--memory-model prices the analytic plan: profiles measure their own memory, and the
    calibrated model needs the GPU's memory. Each is one line, exit 2, and no plan written."""
    plan = tmp_path / "plan.json"
    assert advisor.error("recommend", "--profile", "examples/launch/profiles", "--gpus", 16, "--pp", 4,
                         "--memory-model", "paper", "-o", plan) == (
        "Error: --memory-model paper prices the analytic plan; profiles measure their own memory: drop it with "
        "--profile")
    assert advisor.error("recommend", "--gpus", 64, "--pp", 4, "--memory-model", "calibrated", "-o", plan) == (
        "Error: --memory-model calibrated needs the GPU's memory: --gpu NAME or --mem GIB")
    assert not plan.exists()


@pytest.mark.parametrize("peak,mem,shown", [(80.5, 80, "80.50"), (80.001, 80, "80.001"), (0.0412, 0.04, "0.041"),
                                            (0.04504, 0.045, "0.04504")])
def test_a_peak_over_the_memory_never_reads_as_the_memory(peak, mem, shown):
    """A MiB-scale CPU plan said "0.04 GiB per GPU, above 0.04 GiB": as many decimals as it takes."""
    from advisor.cli.recommend import _above

    assert _above(peak, mem) == shown
