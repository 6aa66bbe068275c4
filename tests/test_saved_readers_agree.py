"""advisor-launch --from and advisor report --from read a saved sweep row, estimate or plan
through one check each (``advisor.saved_row.check_saved_fields`` for rows and estimates): what
one refuses, the other refuses in the same line, exit status 2 and no traceback. Run on files
the advisor itself writes, each edited by hand in one field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from advisor.cli import cli as advisor
from launch.cli import cli as launcher


def invoke(command, *args) -> tuple[int, str]:
    result = CliRunner().invoke(command, [str(arg) for arg in args])
    return result.exit_code, result.stderr


def both_refuse(path: Path, words: str) -> None:
    """Both readers refuse ``path`` in one line ending in ``words``; the report writes no page."""
    page = path.with_suffix(".html")
    for code, stderr in (invoke(launcher, "args", "--from", path),
                         invoke(advisor, "report", "--from", path, "-o", page)):
        assert code == 2 and stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
        assert stderr.rstrip().endswith(words), stderr
    assert not page.exists()


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, dict]:
    """A sweep row and an estimate of Llama 3.1 8B on 8 H100s, as the advisor writes them."""
    folder = tmp_path_factory.mktemp("saved")
    gpu = ("--gpus", "8", "--gpu", "h100-80gb", "--format", "json")
    assert invoke(advisor, "sweep", *gpu, "--tokens", "1e9", "-o", folder / "sweep.json")[0] == 0
    assert invoke(advisor, "estimate", *gpu, "--tp", "2", "-o", folder / "estimate.json")[0] == 0
    return {"row": json.loads((folder / "sweep.json").read_text())[0],
            "estimate": json.loads((folder / "estimate.json").read_text())}


EDITS = [
    ({"vp": 2}, "unknown field 'vp' (did you mean 'vpp'?): no sweep row or estimate the advisor writes has it"),
    ({"verdict": "OOM"}, "'verdict' must be null or fits, tight, oom, likely fits, likely oom, got 'OOM'"),
    ({"tokens": "1T"}, "'tokens' must be a number, got '1T'"),
    ({"step_time_s": 1e-300}, "'step_time_s' must be above 1e-06, got 1e-300"),
]


@pytest.mark.parametrize("kind", ["row", "estimate"])
@pytest.mark.parametrize("edit, words", EDITS, ids=[next(iter(edit)) for edit, _ in EDITS])
def test_a_hand_edited_field_is_refused_by_both_readers(tmp_path, saved, kind, edit, words):
    path = tmp_path / f"{kind}.json"
    path.write_text(json.dumps({**saved[kind], **edit}))
    both_refuse(path, words)


@pytest.mark.parametrize("kind", ["row", "estimate"])
def test_what_the_advisor_writes_is_read_by_both(tmp_path, saved, kind):
    path = tmp_path / f"{kind}.json"
    path.write_text(json.dumps(saved[kind]))
    assert invoke(launcher, "args", "--from", path)[0] == 0
    assert invoke(advisor, "report", "--from", path, "-o", tmp_path / "page.html")[0] == 0


# --- plans (advisor recommend -o): advisor.capture.plan.check_plan, the one reader of both ------


ROOT = Path(__file__).resolve().parent.parent
ANALYTIC = ("--gpus", "16", "--tp", "2", "--pp", "4", "--gbs", "64", "--gpu", "h100-80gb")


def recommend(path: Path, *args) -> Path:
    code, stderr = invoke(advisor, "recommend", *args, "-o", path)
    assert code == 0, stderr
    return path


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> dict[str, Path]:
    """Plans as the advisor writes them: analytic (memory and time objectives) and from profiles
    (Megatron's layout, and a hybrid one with per-stage degrees), and the example in examples/."""
    from capture_synth import write_campaign

    folder = tmp_path_factory.mktemp("plans")
    profiles = write_campaign(folder / "profiles")
    common = ("--profile", profiles, "--gpus", "8", "--gpus-per-node", "4")
    return {
        "analytic": recommend(folder / "analytic.json", *ANALYTIC),
        "time": recommend(folder / "time.json", *ANALYTIC, "--objective", "time"),
        "profiled": recommend(folder / "profiled.json", *common, "--pp", "4", "--mbs", "2", "--gbs", "16"),
        "hybrid": recommend(folder / "hybrid.json", *common, "--mode", "hybrid", "--predictor", "capture", "--mbs",
                            "4", "--gbs", "32"),
        "example": ROOT / "examples/symbolic/llama3.1-8b-campaign/plan.json",
    }


@pytest.mark.parametrize("name", ["analytic", "time", "profiled", "hybrid", "example"])
def test_plans_the_advisor_writes_are_read_by_both(tmp_path, plans, name):
    assert invoke(advisor, "report", "--from", plans[name], "-o", tmp_path / "page.html")[0] == 0
    if name != "hybrid":  # not launchable on stock Megatron-LM: refused for that, not for a field
        assert invoke(launcher, "args", "--from", plans[name])[0] == 0


def test_the_plan_fields_are_what_a_plan_is_written_with(plans):
    from advisor.capture.plan_fields import FIELDS, STAGE_FIELDS

    written = json.loads(plans["time"].read_text())
    assert set(written) == FIELDS and set(written["stages"][0]) == STAGE_FIELDS


def _gpu_minus_one(plan: dict) -> None:
    plan["gpu_memory"][0]["gpu"] = -1


PLAN_EDITS = [
    (lambda plan: plan.update(gpu="h100-80gb"), "unknown field 'gpu' (did you mean 'gpu_memory'?): no plan the "
                                                 "advisor writes has it"),
    (lambda plan: plan["stages"][1].update(tpp=2), "stage 1: unknown field 'tpp' (did you mean 'tp'?): no plan the "
                                                   "advisor writes has it"),
    (lambda plan: plan.update(gpu_memory=-1), "'gpu_memory' must be a list of the stages 16 GPUs, got -1"),
    (_gpu_minus_one, "'gpu_memory' entry 0 must be GPU 0 of node 0 and stage 0 with its predicted_gib, got "
                     "{'gpu': -1, 'node': 0, 'stage': 0, 'p..."),
    (lambda plan: plan["gpu_memory"][5].update(predicted_gib=-1),
     "'gpu_memory' entry 5: 'predicted_gib' must be a number of GiB, at least 0, got -1"),
    (lambda plan: plan["options"].update(recompute="x"),
     "the plan's 'options' cannot be read: recompute must be none, selective or full, got 'x'"),
]


@pytest.mark.parametrize("edit, words", PLAN_EDITS, ids=[words[:30] for _, words in PLAN_EDITS])
def test_a_hand_edited_plan_is_refused_by_both_readers(tmp_path, plans, edit, words):
    plan = json.loads(plans["analytic"].read_text())
    edit(plan)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    both_refuse(path, words)


def test_two_rows_of_one_rank_are_refused_not_the_first_launched(tmp_path, saved):
    second = dict(saved["row"])  # the same rank, as two sweeps joined have
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps([saved["row"], second]))
    code, stderr = invoke(launcher, "args", "--from", path, "--rank", saved["row"]["rank"])
    assert code == 2 and stderr.count("\n") == 1
    assert stderr.endswith(f"{path}: 2 rows are ranked {saved['row']['rank']}: a sweep ranks each row once (a hand "
                           "edit or two sweeps joined?)\n")
