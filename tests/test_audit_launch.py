"""Three findings of a newcomer's audit, run as the user runs them (the installed ``advisor`` and
``advisor-launch`` scripts, real subprocesses, the real core_v0.15.2 checkout where one is read):

- a sweep row's (or an estimate's) hand-edited ``megatron_args`` were dropped without a word
  (the row's fields decided the flags), while the same edit to a plan was refused: now one check
  refuses both, naming the first flag that differs;
- ``advisor-launch skypilot --accelerator H100:8`` wrote ``accelerators: H100:8:8``, and
  ``k8s --image ''`` wrote ``image: ''``: refused, with every blank option of the two writers;
- ``advisor recommend -o`` wrote a plan that does not fit (exit 1), which the launcher then ran:
  now it writes none and says so, the plan still shown on stdout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from launch_support import write_json
from megatron_real import checkout
from test_launch_strictness import refused

BIN = Path(sys.executable).parent


def script(name: str, *args, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``.venv/bin/<name> args...``, as typed in a shell, its output to a pipe (no $COLUMNS: notes
    unwrapped, whatever the test runner's terminal)."""
    env = {key: value for key, value in os.environ.items() if key != "COLUMNS"}
    return subprocess.run([str(BIN / name), *map(str, args)], capture_output=True, text=True, timeout=300, cwd=cwd,
                          env=env)


def launch_args(path: Path) -> subprocess.CompletedProcess:
    """``advisor-launch args`` for the real core_v0.15.2 checkout, as the audit ran it."""
    return script("advisor-launch", "args", "--from", path, "--megatron-lm", checkout("core_v0.15.2").path,
                  "--format", "json")


@pytest.fixture(scope="module")
def row(tmp_path_factory) -> dict:
    """The best row of the audit's sweep: Llama 3.1 8B on 64 GPUs of 40 GiB, MBS 1."""
    path = tmp_path_factory.mktemp("audit") / "sweep.json"
    made = script("advisor", "sweep", "--gpus", "64", "--mem", "40", "--format", "json", "--top", "1", "-o", path)
    assert made.returncode == 0, made.stderr
    [first] = json.loads(path.read_text())
    assert first["mbs"] == 1
    return first


def edited(args: list[str], flag: str, value: str) -> list[str]:
    args = list(args)
    args[args.index(flag) + 1] = value
    return args


# --- 1. a row's own megatron_args ------------------------------------------------------------


def test_a_row_as_written_launches_its_own_flags(tmp_path, row):
    result = launch_args(write_json(tmp_path / "row.json", row))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == row["megatron_args"]


def row_edits(row: dict) -> list[tuple[str, dict, str]]:
    """(what, the edited row, the refusal's words after 'inconsistent sweep row: its megatron_args ')."""
    args = row["megatron_args"]
    return [
        ("flag value", {**row, "megatron_args": edited(args, "--micro-batch-size", "4")},
         "give --micro-batch-size 4, its fields say 1"),
        ("field", {**row, "mbs": 2}, "give --micro-batch-size 1, its fields say 2"),
        ("flag added", {**row, "megatron_args": [*args, "--fp16"]}, "give --fp16, its fields do not"),
        ("flag removed", {**row, "megatron_args": [arg for arg in args if arg != "--bf16"]},
         "lack --bf16, which its fields give"),
        ("valued flag removed", {**row, "megatron_args": args[:args.index("--global-batch-size")]
                                 + args[args.index("--global-batch-size") + 2:]},
         "lack --global-batch-size, its fields say 1024"),
        ("reordered", {**row, "megatron_args": args[2:] + args[:2]},
         "repeat, reorder or add words to the flags its fields make"),
    ]


def test_a_hand_edited_row_is_refused_naming_the_first_flag(tmp_path, row):
    for what, document, words in row_edits(row):
        path = write_json(tmp_path / "row.json", document)
        line = refused(launch_args(path))
        assert line == f"Error: {path}: inconsistent sweep row: its megatron_args {words}", what
    sweep = write_json(tmp_path / "sweep.json", [row_edits(row)[0][1]])  # in a sweep array too
    line = refused(launch_args(sweep))
    assert line == (f"Error: rank 1 of {sweep}: inconsistent sweep row: its megatron_args give --micro-batch-size 4, "
                    "its fields say 1")
    wrong = write_json(tmp_path / "row.json", {**row, "megatron_args": " ".join(row["megatron_args"])})
    # the value shortened as every JSON value in a message is (limits.json_text)
    assert refused(launch_args(wrong)).endswith("'megatron_args' must be a list of str, got '--num-layers 32 "
                                                "--hidden-size 4096 -...")


def test_a_row_written_before_rows_carried_flags_launches_from_its_fields(tmp_path, row):
    """Rows (and estimates) of advisors before 9911264 have no megatron_args: still launched."""
    older = {key: value for key, value in row.items() if key != "megatron_args"}
    result = launch_args(write_json(tmp_path / "row.json", older))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == row["megatron_args"]


def test_an_estimate_and_a_plan_are_checked_alike(tmp_path):
    estimate, plan = tmp_path / "estimate.json", tmp_path / "plan.json"
    for command in (["estimate", "--tp", "2", "--pp", "2", "--gpus", "8", "--format", "json", "-o", estimate],
                    ["recommend", "--gpus", "8", "--pp", "4", "--mem", "80", "-o", plan]):
        made = script("advisor", *command)
        assert made.returncode == 0, made.stderr
    for kind, path in (("estimate", estimate), ("plan", plan)):
        document = json.loads(path.read_text())
        mbs = write_json(tmp_path / f"{kind}-mbs.json",
                         {**document, "megatron_args": edited(document["megatron_args"], "--micro-batch-size", "4")})
        assert refused(launch_args(mbs)) == (f"Error: {mbs}: inconsistent {kind}: its megatron_args give "
                                             "--micro-batch-size 4, its fields say 1")
        fp16 = write_json(tmp_path / f"{kind}-fp16.json", {**document, "megatron_args": [*document["megatron_args"],
                                                                                          "--fp16"]})
        assert refused(launch_args(fp16)) == (f"Error: {fp16}: inconsistent {kind}: its megatron_args give --fp16, "
                                              "its fields do not")


# --- 2. the k8s and SkyPilot writers' options ------------------------------------------------------


WRITER_REFUSALS = [  # (the writer's options, the refusal)
    (["k8s", "--image", ""], "--image '': give a container image reference without blanks"),
    (["k8s", "--image", "  "], "--image '  ': give a container image reference without blanks"),
    (["k8s", "--image", "ghcr.io/me/megatron :1"], "--image 'ghcr.io/me/megatron :1': give a container image"),
    (["k8s", "--image", "img", "--namespace", ""], "--namespace '': a namespace must be a DNS label"),
    (["k8s", "--image", "img", "--namespace", "Training"], "--namespace 'Training': a namespace must be a DNS label"),
    (["k8s", "--image", "img", "--name", ""], "--name '': a job name must be a DNS label"),
    (["skypilot", "--name", " "], "--name ' ': a job name must be a DNS label"),
    (["skypilot", "--accelerator", "H100:8"], "--accelerator 'H100:8': give the accelerator's name alone (e.g. H100): "
                                              "the count is the GPUs per node, which the launcher adds"),
    (["skypilot", "--accelerator", "A100-80GB:4"], "--accelerator 'A100-80GB:4': give the accelerator's name alone"),
    (["skypilot", "--accelerator", ""], "--accelerator '': an accelerator name is letters, digits"),
    (["skypilot", "--accelerator", " "], "--accelerator ' ': an accelerator name is letters, digits"),
]


@pytest.mark.parametrize("options, words", WRITER_REFUSALS, ids=[" ".join(o) for o, _ in WRITER_REFUSALS])
def test_a_writers_bad_option_is_one_line_and_writes_nothing(tmp_path, row, options, words):
    sweep = write_json(tmp_path / "sweep.json", [row])
    out = tmp_path / "job.yaml"
    for where in (["-o", out], ["--dry-run"]):
        line = refused(script("advisor-launch", *options, "--from", sweep, "--megatron-lm", "/workspace/Megatron-LM",
                              *where))
        assert line.startswith(f"Error: {words}"), line
        assert not out.exists()


@pytest.mark.parametrize("writer", [["k8s", "--image", "img"], ["skypilot"]], ids=lambda w: w[0])
def test_a_blank_checkout_path_is_refused_by_the_writers(tmp_path, row, writer):
    sweep = write_json(tmp_path / "sweep.json", [row])
    line = refused(script("advisor-launch", *writer, "--from", sweep, "--megatron-lm", " ", "--dry-run"))
    assert line == "Error: --megatron-lm ' ' (or $MEGATRON_LM) is blank: give the checkout's path in the image or on " \
                   "the nodes"


def test_the_accelerator_is_a_name_and_the_launcher_adds_the_count(tmp_path, row):
    sweep = write_json(tmp_path / "sweep.json", [row])
    for per_node in ("8", "4"):
        result = script("advisor-launch", "skypilot", "--from", sweep, "--megatron-lm", "/workspace/Megatron-LM",
                        "--accelerator", "A100-80GB", "--gpus-per-node", per_node, "--dry-run")
        assert result.returncode == 0, result.stderr
        assert f"accelerators: A100-80GB:{per_node}\n" in result.stdout
    k8s = script("advisor-launch", "k8s", "--from", sweep, "--megatron-lm", "/workspace/Megatron-LM", "--image",
                 "ghcr.io/me/megatron:1", "--namespace", "training", "--dry-run")
    assert k8s.returncode == 0, k8s.stderr
    assert "image: ghcr.io/me/megatron:1\n" in k8s.stdout and "namespace: training\n" in k8s.stdout
    text = " ".join(script("advisor-launch", "skypilot", "--help").stdout.split())
    assert "SkyPilot's accelerator name alone, e.g. A100-80GB: the task asks for NAME:GPUS_PER_NODE " \
           "(resources.accelerators), so a NAME:COUNT is refused; --gpus-per-node sets the count." in text


# --- 3. recommend writes no plan that does not fit -------------------------------------------------


NOTHING_FITS = ["recommend", "--gpus", "8", "--pp", "4", "--mem", "10"]


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_recommend_writes_no_plan_that_does_not_fit(tmp_path, fmt):
    plan = tmp_path / "nfplan.json"
    result = script("advisor", *NOTHING_FITS, "--format", fmt, "-o", plan)
    assert result.returncode == 1 and not plan.exists() and "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        "advisor recommend: nothing fits: the lowest peak any split reaches is 50.00 GiB per GPU, above 10 GiB. "
        f"Try more GPUs, a larger --pp or --tp, or --recompute full (advisor sweep searches the layouts); no plan "
        f"written to {plan}"]
    if fmt == "table":  # the plan is still shown, as before
        assert "predicted peak 50.00 GiB, Eq. 18 (500% of 10 GiB) -> oom" in result.stdout
    else:
        assert json.loads(result.stdout)["peak_predicted_gib"] == pytest.approx(50, abs=0.01)


def test_recommend_leaves_an_earlier_file_alone_and_prints_to_stdout_when_asked(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text("earlier\n")
    assert script("advisor", *NOTHING_FITS, "-o", plan).returncode == 1 and plan.read_text() == "earlier\n"
    printed = script("advisor", *NOTHING_FITS, "-o", "-")  # stdout asked for: the plan, no 'not written'
    assert printed.returncode == 1 and json.loads(printed.stdout)["schema"] == "megatron-4d-advisor/plan"
    assert "no plan written" not in printed.stderr
    fits = script("advisor", "recommend", "--gpus", "8", "--pp", "4", "--mem", "80", "-o", plan)
    assert fits.returncode == 0 and json.loads(plan.read_text())["peak_predicted_gib"] < 80


def test_recommend_time_objective_writes_no_plan(tmp_path):
    plan = tmp_path / "nfplan.json"
    # Eq. 18 and its 80% rule (--gpu alone would price with the calibrated model, within all 10 GiB)
    result = script("advisor", *NOTHING_FITS, "--gpu", "h100-80gb", "--memory-model", "paper", "--objective", "time",
                    "-o", plan)
    assert result.returncode == 1 and result.stdout == "" and not plan.exists()
    [line] = result.stderr.splitlines()
    assert line.startswith("advisor recommend: nothing fits: no split of 32 layers over 4 stages keeps every stage "
                           "within 8.00 GiB; the lowest peak any split reaches is 50.00 GiB")
    assert line.endswith(f"; no plan written to {plan}")


def test_recommend_help_says_o_writes_no_plan_that_does_not_fit():
    text = " ".join(script("advisor", "recommend", "--help").stdout.split())
    assert "either way -o FILE writes no plan (the line says so: a plan that does not fit is nothing to launch)" in text
