"""Transformer Engine is checked where the ranks run: on this node for ``torchrun`` (and ``check``),
on the job's nodes for ``sbatch``.

A Slurm login node often has no Transformer Engine (no GPU, an environment of its own), and
``advisor-launch sbatch`` used to refuse to submit from one. Now the node that submits only notes
its lack; the batch script's ranks check it (``launch.entry --check-imports``) before
Megatron is imported, so a job whose nodes lack TE fails at once with at most one line per node instead
of on every rank 40-50 s into the run. This machine has no TE; where a test needs one, a stand-in
``transformer_engine`` package (an empty one, which is all that importability sees) is put on
``PYTHONPATH``. Slurm's commands are stood in by tests/fixtures/slurm_standin (torchrun and the
entry are real), and the last test submits to the real one-node Slurm (tests/slurm_real.py)."""

import json
import os
import subprocess
import sys

import pytest
from launch_support import TINY_SWEEP, data_job, launcher, make_checkout, subprocess_env, sweep_file

from conftest import ROOT

SLURM = ROOT / "tests" / "fixtures" / "slurm_standin"
NO_TE = "cannot import transformer_engine"
# pretrain_gpt.py of the stand-in checkout: it says it ran, and stops.
MARKS_ITS_RUN = "import os, pathlib\npathlib.Path(os.environ['RAN'], os.environ['RANK']).touch()\n"


@pytest.fixture
def job(advisor, tmp_path):
    """A 2-GPU sweep (2 nodes of 1 GPU), a checkout of core 0.15's version whose script marks its
    runs, and a complete job on an existing dataset using Megatron-LM's default Transformer Engine."""
    sweep = sweep_file(advisor, tmp_path / "tiny.json", *TINY_SWEEP)
    checkout = make_checkout(tmp_path / "Megatron-LM", 15, script=MARKS_ITS_RUN)
    extras = [arg for arg in data_job(tmp_path) if arg not in ("--transformer-impl", "local")]
    return sweep, checkout, extras


def standin_env(tmp_path, **extra) -> dict[str, str]:
    from megatron_hooks.stage_emulation import free_port

    env = subprocess_env(SLURM_JOB_NODELIST="n[1-2]", SLURM_NNODES="2", SLURM_JOB_ID="4242",
                         SLURM_STANDIN_HOSTS="127.0.0.1 127.0.0.2", SLURM_CPUS_ON_NODE="1",
                         SLURM_STANDIN_RECORD=str(tmp_path / "slurm.jsonl"), RAN=str(tmp_path / "ran"),
                         PORT=str(free_port()), **extra)
    env["PATH"] = f"{SLURM}{os.pathsep}{env['PATH']}"
    return env


def submit(tmp_path, sweep, checkout, extras, monkeypatch, *options) -> tuple[object, str]:
    """``advisor-launch sbatch`` (no --dry-run) with the stand-in sbatch: the result and the script."""
    env = standin_env(tmp_path)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = launcher()("sbatch", "--from", sweep, "--megatron-lm", checkout, "--gpus-per-node", "1",
                        "--rdzv-port", env["PORT"], *options, "-o", tmp_path / "job.sh", "--", *extras)
    (submitted,) = [json.loads(line) for line in (tmp_path / "slurm.jsonl").read_text().splitlines()]
    (tmp_path / "slurm.jsonl").unlink()
    return result, submitted["script"]


def run_script(tmp_path, **extra):
    """The batch script as Slurm's first node runs it: srun starts one real torchrun per node."""
    (tmp_path / "ran").mkdir(exist_ok=True)
    return subprocess.run(["bash", tmp_path / "job.sh"], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=standin_env(tmp_path, **extra))


def test_sbatch_submits_from_a_node_without_te_and_the_ranks_check_it(job, tmp_path, monkeypatch):
    sweep, checkout, extras = job
    result, script = submit(tmp_path, sweep, checkout, extras, monkeypatch)
    assert result.exit_code == 0 and "Error" not in result.stderr  # it used to stop here, exit 2
    assert "transformer_engine is not importable on this node, where no rank runs" in result.stderr
    assert "--check-imports" in script

    # the job's nodes lack TE too: a node's local rank 0 says so, no rank runs the script. One line
    # per node at most: the first node's failure ends its torchrun, which hosts the rendezvous
    # store, and the other torchrun may stop its rank before that rank has printed its own.
    failed = run_script(tmp_path)
    assert failed.returncode != 0
    lines = [line for line in failed.stderr.splitlines() if line.startswith("Error: ")]
    assert 1 <= len(lines) <= 2 and all(line.startswith(f"Error: {NO_TE} on ") for line in lines), \
        failed.stderr[-3000:]
    assert "Megatron-LM's default --transformer-impl transformer_engine" in lines[0]
    assert list((tmp_path / "ran").iterdir()) == []

    # nodes that have it: every rank runs the script
    stand_in = tmp_path / "te"
    (stand_in / "transformer_engine").mkdir(parents=True)
    (stand_in / "transformer_engine" / "__init__.py").touch()
    ran = run_script(tmp_path, PYTHONPATH=f"{stand_in}{os.pathsep}{ROOT}")
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert sorted(path.name for path in (tmp_path / "ran").iterdir()) == ["0", "1"]


def test_without_te_in_the_launch_the_ranks_check_nothing(job, advisor, tmp_path, monkeypatch):
    sweep, checkout, extras = job
    result, script = submit(tmp_path, sweep, checkout, ["--transformer-impl", "local", *extras], monkeypatch)
    assert result.exit_code == 0 and NO_TE not in result.stderr and "transformer_engine is not" not in result.stderr
    assert "--check-imports" not in script
    # TE's own options with --transformer-impl local are still refused before submitting
    overlap = tmp_path / "tp-overlap.json"  # priced with TE's TP overlap, so its flags carry it
    advisor("estimate", *TINY_SWEEP, "--tp", "2", "--pp", "1", "--mbs", "1", "--tp-comm-overlap",
                     "--format", "json", "-o", overlap)
    result = launcher()("sbatch", "--from", overlap, "--megatron-lm", checkout, "--gpus-per-node", "1", "-o",
                        tmp_path / "job2.sh", "--", "--transformer-impl", "local", *extras, expect=2)
    assert "--tp-comm-overlap (TE's userbuffers) needs Transformer Engine" in result.stderr
    assert not (tmp_path / "job2.sh").exists()


def test_where_the_ranks_run_here_te_is_still_checked_here(job, tmp_path, monkeypatch):
    sweep, checkout, extras = job
    started = []
    monkeypatch.setattr("launch.process.run_process_group", lambda *args, **kwargs: started.append(args) or 0)
    common = ["--from", sweep, "--megatron-lm", checkout]
    for command in (["torchrun", "--nproc-per-node", "1", "--nnodes", "2", "--rdzv-endpoint", "h:1"], ["check"]):
        result = launcher()(*command, *common, "--", "--distributed-backend", "gloo", *extras, expect=2)
        errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
        assert errors == [f"Error: {NO_TE}, which Megatron-LM's default --transformer-impl transformer_engine needs: "
                          "install Transformer Engine (--transformer-impl local after -- runs megatron-core's own "
                          "modules instead: unfused attention, not the fused attention a plan is priced with, and no "
                          "CP > 1, FP8, TP overlap or fused MoE kernels)"], result.stderr
    assert started == []
    # check --no-gpus-here prepares a job for other nodes: a note, not an error
    result = launcher()("check", *common, "--no-gpus-here", "--", *extras)
    assert result.stdout.startswith("advisor-launch check: ok") and "where no rank runs" in result.stderr


def test_the_entry_prints_once_per_node_and_only_when_asked(tmp_path):
    checkout = make_checkout(tmp_path / "Megatron-LM", 15, script=MARKS_ITS_RUN)
    (tmp_path / "ran").mkdir()
    entry = [sys.executable, "-m", "launch.entry", "--megatron-lm", str(checkout)]

    def run(*own, **env):
        return subprocess.run([*entry, *own, "--", "--transformer-impl", "transformer_engine"], capture_output=True,
                              text=True, env=subprocess_env(RAN=str(tmp_path / "ran"), RANK="0", **env))

    quiet = run("--check-imports", LOCAL_RANK="3")
    assert (quiet.returncode, quiet.stderr) == (2, "")
    loud = run("--check-imports", LOCAL_RANK="0")
    assert loud.returncode == 2 and loud.stderr.startswith(f"Error: {NO_TE} on ") and loud.stderr.count("\n") == 1
    assert "--transformer-impl transformer_engine needs" in loud.stderr  # as given, not "the default"
    assert list((tmp_path / "ran").iterdir()) == []
    assert run().returncode == 0 and (tmp_path / "ran" / "0").exists()  # the entry adds no check of its own


def test_the_entry_checks_deep_ep_for_the_flex_dispatcher(tmp_path):
    """The flex dispatcher's DeepEP and HybridEP backends need deep_ep on every node (megatron-core
    moe/fused_a2a.py): with --check-imports the entry says so before the script runs, one line for
    each missing module (Transformer Engine not needed here: local modules, but NCCL-EP's own)."""
    checkout = make_checkout(tmp_path / "Megatron-LM", 15, script=MARKS_ITS_RUN)
    (tmp_path / "ran").mkdir()
    entry = [sys.executable, "-m", "launch.entry", "--megatron-lm", str(checkout), "--check-imports", "--"]
    flex = ["--transformer-impl", "local", "--moe-token-dispatcher-type", "flex"]
    env = subprocess_env(RAN=str(tmp_path / "ran"), RANK="0", LOCAL_RANK="0")
    hybrid = subprocess.run([*entry, *flex, "--moe-flex-dispatcher-backend", "hybridep"], capture_output=True,
                            text=True, env=env)
    assert hybrid.returncode == 2 and hybrid.stderr.count("\n") == 1
    assert hybrid.stderr.startswith("Error: cannot import deep_ep on ") and "HybridEPBuffer" in hybrid.stderr
    assert list((tmp_path / "ran").iterdir()) == []
    nccl = subprocess.run([*entry, *flex, "--moe-flex-dispatcher-backend", "ncclep"], capture_output=True, text=True,
                          env=env)
    # NCCL-EP is Transformer Engine's (core_v0.19.0 moe/fused_a2a.py: transformer_engine.pytorch.ep), not DeepEP's
    assert nccl.returncode == 2 and nccl.stderr.count("\n") == 1
    assert "cannot import transformer_engine on " in nccl.stderr and "--moe-flex-dispatcher-backend ncclep" in nccl.stderr


@pytest.mark.xdist_group("slurm")  # with the other jobs of the one-node Slurm (tests/test_slurm_real.py)
def test_a_job_whose_node_lacks_te_fails_at_once_on_a_real_slurm(advisor, tmp_path):
    """The real sbatch and the real Slurm: the job fails with the entry's line in its error file,
    and the checkout's script never runs (tests/slurm_real.py starts the cluster, or skips)."""
    from megatron_real import LAUNCH_TIMEOUT_S
    from slurm_real import cluster, read_logs, submitted_id, wait_finished

    from megatron_hooks.stage_emulation import free_port

    cluster()
    sweep = sweep_file(advisor, tmp_path / "tiny.json", *TINY_SWEEP)
    checkout = make_checkout(tmp_path / "Megatron-LM", 15, script=MARKS_ITS_RUN)
    extras = [arg for arg in data_job(tmp_path) if arg not in ("--transformer-impl", "local")]
    (tmp_path / "ran").mkdir()
    env = subprocess_env(RAN=str(tmp_path / "ran"), PYTHONPATH=str(ROOT), NO_VCS_VERSION="1")
    launch = [os.path.join(os.path.dirname(sys.executable), "advisor-launch")]
    result = subprocess.run([*launch, "sbatch", "--from", str(sweep), "--megatron-lm", str(checkout),
                             "--gpus-per-node", "2", "--rdzv-port", str(free_port()), "--job-name", "te-check",
                             "-o", "job.sh", "--", *extras], capture_output=True, text=True, timeout=60, env=env,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    job_id = submitted_id(result.stdout)
    fields = wait_finished(job_id, LAUNCH_TIMEOUT_S)  # its wait in the queue included
    logs = read_logs(tmp_path, f"te-check-{job_id}")
    assert fields["JobState"] == "FAILED", logs[-3000:]
    assert sum(line.startswith(f"Error: {NO_TE} on ") for line in logs.splitlines()) == 1, logs[-3000:]
    assert list((tmp_path / "ran").iterdir()) == []


def test_local_modules_after_the_dashes_are_named_as_not_what_was_priced(job):
    """--transformer-impl local (after --) makes the attention unfused, which keeps every s x s
    score: a plan priced with fused attention is not that run, and the launch says so (a note: CPU
    test launches need the local modules); a plan priced unfused is."""
    sweep, checkout, extras = job
    result = launcher()("torchrun", "--from", sweep, "--megatron-lm", checkout, "--nproc-per-node", "1", "--nnodes",
                        "2", "--rdzv-endpoint", "h:1", "--dry-run", "--", "--distributed-backend", "gloo", *extras,
                        "--transformer-impl", "local")
    assert "--transformer-impl local (after --) runs megatron-core's own unfused attention" in result.stderr
    from launch.preflight import local_attention_note

    mine = ["--transformer-impl", "local"]
    assert local_attention_note(["--attention-backend", "unfused"], ["--attention-backend", "unfused", *mine]) is None
    assert local_attention_note(mine, mine) is None  # a plan read from a command on the local modules
    assert local_attention_note([], ["--transformer-impl", "transformer_engine"]) is None
    assert local_attention_note([], mine) is not None


def test_a_missing_deep_ep_or_a_contradicting_nvte_variable_stops_a_launch_here(advisor, tmp_path, monkeypatch):
    """advisor-launch check (the ranks run here): the flex dispatcher's DeepEP without deep_ep, and
    an NVTE_*_ATTN that contradicts the launch's attention backend, are each one Error: line (beside
    the check's others) and exit status 2 before anything starts."""
    from launch_support import write_json

    checkout = make_checkout(tmp_path / "Megatron-LM", 15, script=MARKS_ITS_RUN)
    extras = [arg for arg in data_job(tmp_path) if arg not in ("--transformer-impl", "local")]
    row = advisor.json("estimate", "--model", "qwen3-30b-a3b", "--gpus", 16, "--ep", 8, "--gpu", "h100-80gb",
                       "--moe-token-dispatcher-type", "flex")
    flex = write_json(tmp_path / "flex.json", row)
    result = launcher()("check", "--from", flex, "--megatron-lm", checkout, "--", *extras, "--transformer-impl",
                        "local", expect=2)
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    # one line each: this CPU machine's lack of GPUs is one too
    assert ("Error: cannot import deep_ep, which the flex dispatcher's deepep backend needs: install DeepEP, or launch "
            "a row of another --moe-token-dispatcher-type") in errors, result.stderr
    monkeypatch.setenv("NVTE_FLASH_ATTN", "0")  # Megatron's default backend, auto, wants 1
    sweep = sweep_file(advisor, tmp_path / "tiny.json", *TINY_SWEEP)
    result = launcher()("check", "--from", sweep, "--megatron-lm", checkout, "--", *extras, "--transformer-impl",
                        "local", expect=2)
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert ("Error: NVTE_FLASH_ATTN=0 in the environment contradicts --attention-backend auto, which sets it to 1 "
            "(megatron-core asserts it when it builds the model): unset NVTE_FLASH_ATTN, NVTE_FUSED_ATTN, "
            "NVTE_UNFUSED_ATTN") in errors, result.stderr
