"""``advisor recommend`` through the real CLI: the predictor asked for is the one used (capture
without profiles ran the analytic seed004 without a word), no picture where no plan is written
(--png drew one that did not fit), and the same memory limit in every plan however it is printed
(stdout said null, or only the time objective's stage limit)."""

import json

import pytest
from capture_synth import write_campaign

from advisor.hardware import get_gpu

FITS = ["recommend", "--model", "llama3.1-8b", "--gpus", 64, "--tp", 2, "--pp", 4]
# 405B on 64 H100s, TP 8 and PP 8: no split fits (the lowest peak is about 150 GiB per GPU)
TOO_BIG = ["recommend", "--model", "llama3.1-405b", "--gpus", 64, "--tp", 8, "--pp", 8, "--gbs", 2048,
           "--gpu", "h100-80gb"]
NEEDS_PROFILES = ("Error: --predictor {} needs profiles: give --profile DIR (made by 'advisor profile run'), or "
                  "use --predictor seed004")


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    return write_campaign(tmp_path_factory.mktemp("profiles"))


# --- 1: the predictor asked for, or none ----------------------------------------------------------


@pytest.mark.parametrize("predictor", ["capture", "1f1b"])
def test_a_profile_predictor_without_profiles_is_refused_and_writes_nothing(advisor, tmp_path, predictor):
    plan, png = tmp_path / "plan.json", tmp_path / "plan.png"
    line = advisor.error(*FITS, "--gpu", "h100-80gb", "--predictor", predictor, "-o", plan, "--png", png)
    assert line == NEEDS_PROFILES.format(predictor)
    assert list(tmp_path.iterdir()) == []


def test_without_profiles_the_plan_records_seed004(advisor, tmp_path):
    default = advisor.json(*FITS, "--gpu", "h100-80gb")
    assert default["predictor"]["name"] == "seed004"
    asked = advisor(*FITS, "--gpu", "h100-80gb", "--predictor", "seed004", "-o", tmp_path / "plan.json")
    assert "(analytic estimates, no profiles)" in " ".join(asked.stdout.split())  # the title, wrapped
    assert json.loads((tmp_path / "plan.json").read_text()) == default


def test_seed004_with_profiles_is_refused(advisor, profiles):
    line = advisor.error("recommend", "--profile", profiles, "--gpus", 4, "--pp", 4, "--mbs", 2, "--gbs", 8,
                         "--predictor", "seed004")
    assert line == ("Error: --predictor seed004 is the analytic models', which read no profiles: drop --profile, "
                    "or use --predictor 1f1b or capture")


@pytest.mark.parametrize("asked,used", [((), "1f1b"), (("--predictor", "1f1b"), "1f1b"),
                                        (("--predictor", "capture"), "capture")])
def test_with_profiles_the_plan_records_the_predictor_used(advisor, profiles, tmp_path, asked, used):
    plan = tmp_path / "plan.json"
    result = advisor("recommend", "--profile", profiles, "--gpus", 4, "--pp", 4, "--mbs", 2, "--gbs", 8, *asked,
                     "-o", plan)
    assert json.loads(plan.read_text())["predictor"]["name"] == used
    assert f"({used} predictor)" in " ".join(result.stdout.split())


# --- 2: no plan, no picture -----------------------------------------------------------------------


def test_nothing_fits_draws_no_picture_and_writes_no_plan(advisor, tmp_path):
    plan, png = tmp_path / "plan.json", tmp_path / "plan.png"
    result = advisor(*TOO_BIG, "-o", plan, "--png", png, expect=1)
    assert not plan.exists() and not png.exists()
    [line] = [line for line in result.stderr.splitlines() if line.startswith("advisor recommend")]
    assert line.endswith(f"; no plan written to {plan}, no picture to {png}")
    assert "wrote" not in result.stderr


def test_nothing_fits_without_a_plan_file_still_draws_no_picture(advisor, tmp_path):
    png = tmp_path / "plan.png"
    for extra in ((), ("-o", "-"), ("--objective", "time")):
        result = advisor(*TOO_BIG, "--png", png, *extra, expect=1)
        assert not png.exists()
        assert result.stderr.rstrip().endswith(f"; no picture written to {png}")


def test_a_plan_that_fits_is_drawn(advisor, tmp_path):
    png = tmp_path / "plan.png"
    advisor(*FITS, "--gpu", "h100-80gb", "--png", png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- 3: the same memory limit wherever the plan goes ------------------------------------------------


@pytest.mark.parametrize("objective", ["memory", "time"])
@pytest.mark.parametrize("limit,memory", [(("--gpu", "h100-80gb"), get_gpu("h100-80gb").memory_gib),
                                          (("--gpu", "h100-80gb", "--mem", 70), 70.0),
                                          (("--mem", 75), 75.0)])
def test_stdout_and_file_plans_carry_the_same_memory_limit(advisor, tmp_path, objective, limit, memory):
    if objective == "time" and "--gpu" not in limit:
        limit = (*limit, "--gpu", "h100-80gb", "--mem", 75)  # the time model needs a GPU preset
    common = (*FITS, *limit, "--objective", objective)
    plan = tmp_path / "plan.json"
    advisor(*common, "-o", plan)
    written = json.loads(plan.read_text())
    printed = json.loads(advisor(*common, "-o", "-").stdout)
    shown = advisor.json(*common)
    assert written == printed == shown
    assert written["memory_limit_gib"] == pytest.approx(memory)
    if objective == "time":  # --gpu: the calibrated model's default --threshold, all of the memory
        assert written["stage_limit_gib"] == pytest.approx(memory)
    else:
        assert written["stage_limit_gib"] is None


def test_without_a_memory_the_plan_says_none(advisor):
    plan = advisor.json(*FITS)
    assert plan["memory_limit_gib"] is None and plan["stage_limit_gib"] is None


def test_profile_plans_carry_the_gpu_memory(advisor, profiles, tmp_path):
    common = ("recommend", "--profile", profiles, "--gpus", 4, "--pp", 4, "--mbs", 2, "--gbs", 8, "--mem", 12)
    plan = tmp_path / "plan.json"
    advisor(*common, "-o", plan)
    assert json.loads(plan.read_text())["memory_limit_gib"] == json.loads(advisor(*common, "-o", "-").stdout)[
        "memory_limit_gib"] == 12
    hybrid = advisor.json("recommend", "--profile", profiles, "--gpus", 8, "--gpus-per-node", 2, "--mode", "hybrid",
                          "--predictor", "capture", "--mbs", 4, "--gbs", 32, "--gpu", "h100-94gb")
    assert hybrid["memory_limit_gib"] == pytest.approx(get_gpu("h100-94gb").memory_gib)


def test_a_time_plan_keeping_the_even_splits_peak_says_so(advisor):
    """Llama 3.1 8B, PP 4 on 8 H100s, --objective time: the plan moves layers off the slow stages
    but keeps stage 0's 8 layers, the even split's peak stage, so the peaks are equal: said as
    'the same peak', not 'this plan is 0.0% lower' (newcomer review); the title names the
    analytic estimates, not a second 'memory model' beside the caption's calibrated one."""
    plan = advisor.json("recommend", "--gpus", 8, "--pp", 4, "--objective", "time", "--gpu", "h100-80gb")
    assert plan["layers_per_stage"][0] == plan["baseline"]["layers_per_stage"][0] == 8
    assert plan["peak_predicted_gib"] == plan["baseline"]["peak_predicted_gib"]  # the premise: equal peaks
    text = " ".join(advisor("recommend", "--gpus", 8, "--pp", 4, "--objective", "time", "--gpu", "h100-80gb")
                    .stdout.split())
    assert "even split, PP 4: 72.57 GiB (the same peak)" in text
    assert "(analytic estimates, no profiles)" in text and "0.0%" not in text
