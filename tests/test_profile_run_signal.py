"""SIGTERM to ``advisor profile run`` (a job's time limit, ``scancel``, ``kill``) stops the
runner it started too: no orphan keeps emulating after the command is gone. Real processes:
the advisor CLI and its CPU-emulator runner on a toy campaign."""

import json
import signal
import subprocess
import sys
from pathlib import Path

from launch_support import alive, subprocess_env, wait_for
from test_campaign_run import campaign


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(child) for child in path.read_text().split()] if path.exists() else []


def test_sigterm_stops_the_runner_and_exits_143(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(campaign(layouts=((2, 2),) * 1, num_microbatches=64)))
    command = [sys.executable, "-m", "advisor", "profile", "run", str(path), "--out", str(tmp_path / "runs"),
               "--force"]
    advisor = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=subprocess_env())
    try:
        assert wait_for(lambda: _children(advisor.pid), 60), "the runner never started"
        runner = _children(advisor.pid)[0]
        advisor.send_signal(signal.SIGTERM)
        _, stderr = advisor.communicate(timeout=60)
    finally:
        advisor.kill()
    assert advisor.returncode == 128 + signal.SIGTERM, stderr
    assert "interrupted: 0 of 1 runs are complete" in stderr
    assert wait_for(lambda: not alive(runner), 15), "the runner outlived the command"
