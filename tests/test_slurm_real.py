"""``advisor-launch sbatch`` on a real Slurm (tests/slurm_real.py: a one-node cluster, 2 fake GPUs
as gres): the generated batch script is submitted with the real sbatch and runs the real
Megatron-LM core_v0.15.2 ``pretrain_gpt.py`` (a copy of the checkout) on the CPU over gloo, with
the hooks; the one double is tests/fixtures/cuda_on_cpu, for the GPU.

What only a real Slurm shows: the #SBATCH lines are accepted and scheduled (--exclusive, --mem=0,
--gpus-per-node as gres, --cpus-per-task from SLURM_CPUS_ON_NODE, --signal), the output and error
files are named by the job id, and a SIGTERM that Slurm sends to the job's steps (what
``--signal=TERM@S`` sends before the time limit, and ``scancel --signal=TERM``) passes through
srun and torchrun to Megatron, which ends its iteration and exits (--exit-signal-handler)."""

import subprocess

import pytest
from megatron_real import CPU_TRAINING, LAUNCH_TIMEOUT_S, failure_report, launch_env, session_copy
from slurm_real import cluster, read_logs, submitted_id, wait_finished, wait_until
from test_launch_run import LAYOUTS, check_run, estimate

# One worker under pytest-xdist for the one-node Slurm's jobs (tests/slurm_real.py): they would only
# queue behind each other's --exclusive jobs on its 2 CPUs, their wait counted in their timeouts.
pytestmark = pytest.mark.xdist_group("slurm")

JOB = "megatron-llama3.1-8b"


@pytest.fixture(scope="module")
def core_0_15(tmp_path_factory):
    cluster()
    return session_copy("core_v0.15.2", tmp_path_factory)


def submit(release, directory, *, profile: bool, extra: list[str]) -> str:
    """``advisor-launch sbatch`` (no --dry-run: it runs the real sbatch) from ``directory``, where
    the job's output files land; the job id."""
    from megatron_hooks.stage_emulation import free_port

    result = subprocess.run(
        [str(release.bin / "advisor-launch"), "sbatch", "--from", "estimate.json", "--megatron-lm", str(release.path),
         "--gpus-per-node", "2", "--rdzv-port", str(free_port()), "-o", "job.sh", "--mock-data",
         *(["--profile-dir", "profile"] if profile else []), "--", *CPU_TRAINING, *extra],
        capture_output=True, text=True, timeout=60, env=launch_env(release), cwd=directory)
    assert result.returncode == 0, result.stderr
    return submitted_id(result.stdout)


def test_the_batch_script_trains_through_a_real_slurm(core_0_15, advisor, tmp_path):
    """TP 2 on one node of 2 GPUs: the script's export of CUDA_DEVICE_MAX_CONNECTIONS=1 reaches
    the ranks through srun (Megatron refuses TP 2 without it); the job completes, its log files
    carry its id, and every rank's profile is complete with the loss Megatron logged."""
    document = estimate(advisor, tmp_path / "estimate.json", *LAYOUTS["tp2"][:2])
    job_id = submit(core_0_15, tmp_path, profile=True, extra=[])
    fields = wait_finished(job_id, LAUNCH_TIMEOUT_S)
    logs = read_logs(tmp_path, f"{JOB}-{job_id}")
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), failure_report(logs, 4000)
    assert fields["OverSubscribe"] == "NO" and fields["TresPerNode"] == "gres:gpu:2"  # --exclusive, --gpus-per-node
    assert fields["MinMemoryNode"] == "0"  # --mem=0: all of the node's memory (accepted where RealMemory is set)
    check_run(tmp_path / "profile", document, logs)


def test_slurms_sigterm_reaches_megatron_which_exits_cleanly(core_0_15, advisor, tmp_path):
    """A long run signalled as --signal=TERM@S signals it (every process of the job's steps, not
    the batch shell): Megatron's handler sees it at the end of an iteration and exits long before
    its last one, with no rank's traceback (the DataLoader's workers got the signal too:
    launch.entry.shield_forked_children), before torchrun's shutdown timeout
    (TORCH_ELASTIC_SHUTDOWN_TIMEOUT, 300 s) or Slurm's KillWait would have killed a rank. torchrun itself then raises its SignalException (exit 1:
    its way of saying it was signalled), so Slurm records the job as FAILED."""
    estimate(advisor, tmp_path / "estimate.json", *LAYOUTS["one-rank"][:2])
    job_id = submit(core_0_15, tmp_path, profile=False, extra=["--train-iters", "100000"])
    stem = f"{JOB}-{job_id}"
    wait_until(lambda: "iteration        3/" in read_logs(tmp_path, stem), LAUNCH_TIMEOUT_S, "iteration 3")
    subprocess.run(["scancel", "--signal=TERM", job_id], check=True)
    fields = wait_finished(job_id, 60)
    logs = read_logs(tmp_path, stem)
    assert "exiting program after receiving SIGTERM" in logs, logs[-4000:]
    assert "[rank0]: Traceback" not in logs and "is killed by signal" not in logs, logs[-4000:]
    assert "iteration   100000/" not in logs and "SIGKILL" not in logs
    assert "SignalException: Process" in logs and (fields["JobState"], fields["ExitCode"]) == ("FAILED", "1:0")
