"""The real Slurm the tests submit to: a single-node cluster on this machine (``.ci/slurm-up``:
munged, slurmctld and slurmd as root, 2 fake GPUs as gres; ``.ci/run`` installs Debian's
slurm-wlm and munge and starts it).

``cluster()`` starts it if it is installed and not running (the script does nothing when it
answers). Where Slurm cannot run, the tests that need it skip, saying why; in CI (``CI=true``)
they fail instead, so that a CI without Slurm cannot pass by skipping them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import ROOT

SLURM_UP = ROOT / ".ci" / "slurm-up"
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
            "DEADLINE"}


def _absent(reason: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI needs the real Slurm: {reason}")
    pytest.skip(reason)


def cluster() -> None:
    """A Slurm that takes jobs, started with .ci/slurm-up if needed; else skip (fail in CI)."""
    if shutil.which("sbatch") is None or shutil.which("slurmctld") is None:
        _absent("Slurm is not installed (apt-get install slurm-wlm munge; .ci/slurm-up starts a one-node cluster)")
    started = subprocess.run([str(SLURM_UP)], capture_output=True, text=True, timeout=120)
    if started.returncode != 0:
        _absent(f"{SLURM_UP.relative_to(ROOT)} could not start Slurm here: {started.stderr.strip()[-500:]}")


def submitted_id(stdout: str) -> str:
    """The job id sbatch printed ('Submitted batch job 12')."""
    match = re.search(r"Submitted batch job (\d+)", stdout)
    assert match, stdout
    return match.group(1)


def job_fields(job_id: str) -> dict[str, str]:
    """``scontrol show job`` as a dict (one line per job with -o; an array job's tasks each)."""
    shown = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=True)
    line = shown.stdout.splitlines()[0]
    return dict(field.split("=", 1) for field in line.split() if "=" in field)


def array_states(job_id: str) -> dict[str, str]:
    """Each array task's JobState, by task id."""
    shown = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=True)
    states = {}
    for line in shown.stdout.splitlines():
        fields = dict(field.split("=", 1) for field in line.split() if "=" in field)
        states[fields.get("ArrayTaskId", "")] = fields["JobState"]
    return states


def wait_until(condition, timeout_s: float, what: str, poll_s: float = 0.5):
    """Poll ``condition()`` until it returns something true; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if result := condition():
            return result
        time.sleep(poll_s)
    pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")


def wait_finished(job_id: str, timeout_s: float) -> dict[str, str]:
    """The job's fields once every one of its tasks has finished (scancel'd on timeout)."""
    def finished():
        states = array_states(job_id)
        return job_fields(job_id) if all(state in FINISHED for state in states.values()) else None

    try:
        return wait_until(finished, timeout_s, f"Slurm job {job_id}")
    finally:
        if any(state not in FINISHED for state in array_states(job_id).values()):
            subprocess.run(["scancel", job_id], check=False)


def read_logs(directory: Path, stem: str) -> str:
    """A job's output and error files (``#SBATCH --output/--error``), together."""
    return "".join((directory / f"{stem}.{suffix}").read_text() for suffix in ("out", "err")
                   if (directory / f"{stem}.{suffix}").exists())
