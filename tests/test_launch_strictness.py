"""What advisor-launch refuses rather than launches differently from what it was given, each as
one line on stderr with exit status 2 and nothing written, run as the user runs it (a subprocess
of ``python -m launch`` / ``python -m advisor``):

- a --megatron-lm (or $MEGATRON_LM) that is not a checkout on this machine, wherever the launcher
  reads it here (k8s and skypilot name a checkout in the image or on the nodes: not refused);
- a dense model's row with expert parallelism (EP or ETP above 1);
- a pipeline split that is not PP counts summing to the model's layers (at least VPP each), an
  estimate whose 'layers_per_stage' is not its stages' split, a row without a split whose layers
  PP does not divide;
- a token budget whose --train-samples would not fit Megatron's int64 sample index;
- a row whose 'gpus' is not TP x CP x PP x DP, in the launcher's and the report's one words.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from launch_support import make_checkout, write_json

ROOT = Path(__file__).resolve().parent.parent
INT64_MAX = 2**63 - 1  # numpy.iinfo(numpy.int64).max: megatron-core's sample index dtype


def run(module: str, *args, env: dict | None = None) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if key != "MEGATRON_LM"}
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, env={**environment, **(env or {})}, timeout=120)


def refused(result: subprocess.CompletedProcess) -> str:
    """The one line of a refusal: exit status 2, no traceback, nothing on stdout."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    return lines[0]


def args_of(result: subprocess.CompletedProcess) -> list[str]:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """Llama 3.1 8B (32 layers) on 8 GPUs of 80 GiB, saved as the user saves it."""
    path = tmp_path_factory.mktemp("strict") / "sweep.json"
    result = run("advisor", "sweep", "--gpus", "8", "--mem", "80", "--format", "json", "-o", path)
    assert result.returncode == 0, result.stderr
    return path


@pytest.fixture(scope="module")
def rows(sweep) -> list[dict]:
    return json.loads(sweep.read_text())


def pp2_row(rows: list[dict]) -> dict:
    return next(row for row in rows if row["pp"] == 2 and row["vpp"] == 1)


# --- the checkout --------------------------------------------------------------------------


READS_IT_HERE = [["args"], ["torchrun", "--dry-run"], ["sbatch", "--dry-run"], ["check"], ["torchrun"], ["sbatch"]]


@pytest.mark.parametrize("command", READS_IT_HERE, ids=" ".join)
def test_a_checkout_that_is_not_here_is_refused(tmp_path, sweep, command):
    missing, empty = tmp_path / "Megatron-LM", tmp_path / "not-a-checkout"
    empty.mkdir()
    assert f"Megatron-LM checkout {missing}: no such directory" in refused(
        run("launch", *command, "--from", sweep, "--megatron-lm", missing))
    assert f"Megatron-LM checkout {empty} has no pretrain_gpt.py" in refused(
        run("launch", *command, "--from", sweep, "--megatron-lm", empty))
    assert f"Megatron-LM checkout {missing}: no such directory" in refused(
        run("launch", *command, "--from", sweep, env={"MEGATRON_LM": str(missing)}))
    script = empty / "pretrain_gpt.py"  # the script, not its checkout: it was 'no such directory'
    script.write_text("")
    assert f"Megatron-LM checkout {script} is a file, not a directory (give the directory that holds it)" in refused(
        run("launch", *command, "--from", sweep, "--megatron-lm", script))


def test_a_refused_checkout_writes_no_script(tmp_path, sweep):
    script = tmp_path / "job.sh"
    refused(run("launch", "sbatch", "--from", sweep, "--megatron-lm", tmp_path / "nowhere", "--dry-run",
                "-o", script))
    assert not script.exists()


def test_a_dry_run_without_a_checkout_still_assumes_a_release(sweep):
    """What a machine without the checkout does instead: no --megatron-lm, the rules named."""
    result = run("launch", "sbatch", "--from", sweep, "--megatron-version", "0.15", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "no --megatron-lm or $MEGATRON_LM: the rules of Megatron-LM core 0.15 (--megatron-version 0.15;" in result.stderr
    assert "picks another" not in result.stderr  # the user has picked it


def test_a_checkout_given_decides_the_rules(tmp_path, sweep):
    """docs/launch.md: core 0.15's NullTokenizer builds V + 1 rows from --vocab-size V, so Llama 3's
    128,256 rows need --vocab-size 128255; 0.19's builds V."""
    old = make_checkout(tmp_path / "v15", 15)
    new = make_checkout(tmp_path / "v19", 19)
    for checkout, vocab in ((old, "128255"), (new, "128256")):
        args = args_of(run("launch", "args", "--from", sweep, "--megatron-lm", checkout, "--mock-data",
                           "--format", "json"))
        assert args[args.index("--vocab-size") + 1] == vocab


@pytest.mark.parametrize("command", [["k8s", "--image", "ghcr.io/me/megatron:1"], ["skypilot"]], ids=lambda c: c[0])
def test_k8s_and_skypilot_name_a_checkout_elsewhere(tmp_path, sweep, command):
    """Their --megatron-lm is the path in the image or on the nodes (docs/launch.md), not here."""
    elsewhere = "/workspace/Megatron-LM"
    assert not Path(elsewhere).exists()
    result = run("launch", *command, "--from", sweep, "--megatron-lm", elsewhere, "-o", tmp_path / "job.yaml")
    assert result.returncode == 0, result.stderr
    assert f"no checkout at {elsewhere}: assuming the rules of" in result.stderr
    assert elsewhere in (tmp_path / "job.yaml").read_text()


# --- the row -------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["ep", "etp"])
def test_a_dense_row_with_expert_parallelism_is_refused(tmp_path, rows, key):
    row = rows[0]
    line = refused(run("launch", "args", "--from", write_json(tmp_path / "row.json", {**row, key: 2})))
    assert f"'{key}' is 2, but llama3.1-8b is a dense model" in line
    for value in (1, None):  # as the sweep writes a dense row, or without the field
        run_ok = run("launch", "args", "--from", write_json(tmp_path / "ok.json", {**row, key: value}))
        assert run_ok.returncode == 0, run_ok.stderr


SPLITS = [  # (the row's edit, the words of its refusal) on a PP 2 row of the 32-layer model
    ({"layers_per_stage": [32]}, "'layers_per_stage' lists 1 stage, but PP is 2"),
    ({"layers_per_stage": [16, 15]}, "'layers_per_stage' [16, 15] must be non-negative and sum to 32 layers"),
    ({"layers_per_stage": [16, 16, 0]}, "'layers_per_stage' lists 3 stages, but PP is 2"),
    ({"layers_per_stage": [1, 31], "vpp": 2},
     "with 2 virtual stages every stage needs at least 2 layers (one per model chunk), got 'layers_per_stage' [1, 31]"),
]


@pytest.mark.parametrize("edit, words", SPLITS, ids=[words[:40] for _, words in SPLITS])
def test_a_split_that_is_not_the_models_is_refused(tmp_path, rows, edit, words):
    line = refused(run("launch", "args", "--from", write_json(tmp_path / "row.json", {**pp2_row(rows), **edit})))
    assert words in line


def test_an_uneven_split_is_launched_as_given(tmp_path, rows):
    # Megatron-LM's --decoder-first/last-pipeline-num-layers place 13 and 19 layers on PP 2
    args = args_of(run("launch", "args", "--from", write_json(tmp_path / "row.json", {
        **pp2_row(rows), "layers_per_stage": [13, 19]}), "--format", "json"))
    assert args[args.index("--decoder-first-pipeline-num-layers") + 1] == "13"
    assert args[args.index("--decoder-last-pipeline-num-layers") + 1] == "19"


def test_a_row_without_a_split_needs_pp_to_divide_the_layers(tmp_path, rows):
    """Megatron's default split is even; 32 layers over PP 4 launch, over PP 3 they cannot (the
    message named a split [10, 10, 10] that the row never held). The edited row drops its flags, as
    rows written before they carried them do (its own flags would disagree with the edit: refused)."""
    row = {key: value for key, value in pp2_row(rows).items() if key not in ("layers_per_stage", "megatron_args")}
    for pp, ok in ((4, True), (3, False)):
        edited = {**row, "pp": pp, "tp": 1, "dp": 1, "gpus": pp, "mbs": 1}
        result = run("launch", "args", "--from", write_json(tmp_path / f"pp{pp}.json", edited))
        if ok:
            assert result.returncode == 0, result.stderr
        else:
            assert "32 layers cannot be split evenly over PP 3" in refused(result)


def test_an_estimates_split_is_its_stages(tmp_path):
    path = tmp_path / "estimate.json"
    made = run("advisor", "estimate", "--tp", "2", "--pp", "2", "--gpus", "8", "--layers-per-stage", "13,19",
               "--format", "json", "-o", path)
    assert made.returncode == 0, made.stderr
    estimate = json.loads(path.read_text())
    args = args_of(run("launch", "args", "--from", path, "--format", "json"))
    assert args[args.index("--decoder-first-pipeline-num-layers") + 1] == "13"
    edited = write_json(tmp_path / "edited.json", {**estimate, "layers_per_stage": [16, 16]})
    assert "'layers_per_stage' [16, 16] is not the stages' split [13, 19]" in refused(
        run("launch", "args", "--from", edited))


# --- the token budget ----------------------------------------------------------------------


def test_a_budget_within_int64_samples_is_launched(sweep):
    # 2^75 tokens of 8,192 (2^13) are exactly 2^62 samples: within int64, and exact in a float
    args = args_of(run("launch", "args", "--from", sweep, "--tokens", str(2**75), "--format", "json"))
    assert args[args.index("--train-samples") + 1] == str(2**62) and 2**62 <= INT64_MAX


def test_a_budget_of_a_fraction_of_a_token_is_refused(sweep):
    # advisor-launch's --tokens reads a count as the advisor's does (TokenCount): 2.5 tokens are not one
    line = refused(run("launch", "args", "--from", sweep, "--tokens", "2.5"))
    assert "'2.5' is 2.5 tokens, not a whole number: a token count is an integer" in line


def test_a_budget_past_int64_samples_is_refused_from_every_source(tmp_path, rows, sweep):
    """2^76 tokens are 2^63 samples, one past int64; 1e300 were a 300-digit --train-samples."""
    line = refused(run("launch", "args", "--from", sweep, "--tokens", str(2**76)))
    assert f"--tokens {float(2**76):g} is" in line and "int64" in line
    row = write_json(tmp_path / "row.json", {**rows[0], "tokens": 1e300})
    line = refused(run("launch", "args", "--from", row))
    assert "'tokens' 1e+300 is" in line and f"at most {INT64_MAX:,} samples" in line
    job = tmp_path / "job.toml"
    job.write_text("tokens = 1e300\n")
    assert f"{job}: tokens 1e+300 is" in refused(run("launch", "args", "--from", sweep, "--job-config", job))
    job.write_text("tokens = inf\n")  # TOML's infinity: refused by the job file's reader
    assert f"{job}: tokens must be a positive whole number" in refused(
        run("launch", "args", "--from", sweep, "--job-config", job))


# --- the world size ------------------------------------------------------------------------


def test_the_launcher_and_the_report_refuse_a_wrong_gpu_count_alike(tmp_path, rows):
    row = write_json(tmp_path / "row.json", {**rows[0], "gpus": 16})
    world = rows[0]["tp"] * rows[0]["cp"] * rows[0]["pp"] * rows[0]["dp"]
    words = f"'gpus' is 16, but TP x CP x PP x DP = {world}"
    assert refused(run("launch", "args", "--from", row)).endswith(words)
    assert refused(run("advisor", "report", "--from", row, "-o", tmp_path / "page.html")).endswith(words)
    assert not (tmp_path / "page.html").exists()


def test_a_budget_under_one_global_batch_is_refused(sweep):
    """Megatron-LM trains train_samples // global batch iterations (launch.job.Schedule): at seq
    8,192 and gbs 1,024, 1,023 x 8,192 = 8,380,416 tokens are 1,023 samples and no iteration
    (refused, nothing printed on stdout); one token more rounds up to 1,024 samples, one iteration."""
    result = run("launch", "args", "--from", sweep, "--tokens", str(1_023 * 8_192))
    assert refused(result) == ("Error: --tokens 8.38042e+06 is 1,023 samples of 8192 tokens, less than one global "
                               "batch of 1024: Megatron-LM would train no iteration; give at least 8,388,608 tokens")
    assert result.stdout == ""
    args = args_of(run("launch", "args", "--from", sweep, "--tokens", str(1_023 * 8_192 + 1), "--format", "json"))
    assert args[args.index("--train-samples") + 1] == "1024"
