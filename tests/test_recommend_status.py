"""``advisor recommend``'s exit status, as ``advisor sweep``'s (README: bad input is 2, "nothing
fits" is 1): the time objective with no split within the limit said so as an error (2); the memory
objective printed a plan at 188% of the memory and exited 0."""

import json

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
        assert lines[0].startswith("advisor recommend: nothing fits: no split of 126 layers over 8 stages keeps "
                                   "every stage within 64.00 GiB")
        assert f"the lowest peak any split reaches is {lowest:.2f} GiB" in lines[0]
        assert "TP 8, PP 8, MBS 1, --threshold 0.8 x 80 GiB" in lines[0]


def test_memory_objective_above_the_memory_prints_the_plan_writes_none_and_exits_1(advisor, tmp_path):
    result = advisor(*TOO_BIG, "--format", "json", "-o", tmp_path / "plan.json", expect=1)
    assert not (tmp_path / "plan.json").exists()  # a plan that does not fit is nothing to launch
    plan = json.loads(result.stdout)
    assert plan["peak_predicted_gib"] > 80
    assert plan["layers_per_stage"] and sum(plan["layers_per_stage"]) == 126  # the lowest peak, still useful
    notes = [line for line in result.stderr.splitlines() if line.startswith("advisor recommend")]
    assert notes == [f"advisor recommend: nothing fits: the lowest peak any split reaches is "
                     f"{plan['peak_predicted_gib']:.2f} GiB per GPU, above 80 GiB. Try more GPUs, a larger --pp or "
                     f"--tp, or --recompute full (advisor sweep searches the layouts); no plan written to "
                     f"{tmp_path / 'plan.json'}"]
    recomputed = advisor(*TOO_BIG, "--recompute", "full", expect=1)
    assert recomputed.stderr.rstrip().endswith("Try more GPUs, a larger --pp or --tp (advisor sweep searches the "
                                               "layouts)")  # not what was given already
    table = advisor(*TOO_BIG, expect=1)
    assert "predicted peak" in table.stdout and table.stderr.count("nothing fits") == 1
    # --mem decides where it is given: the same plan within 200 GiB runs, and says so
    roomy = json.loads(advisor(*TOO_BIG, "--mem", 200, "--format", "json").stdout)
    assert (roomy.pop("memory_limit_gib"), plan.pop("memory_limit_gib")) == (200, 80) and roomy == plan


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
