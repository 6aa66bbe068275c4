"""Processes: the entry runs the script as Python would; the launcher returns torchrun's status;
Ctrl-C and SIGTERM stop the whole process tree (real torchrun, real children)."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launch_support import (CPU_TEST_JOB, alive, data_job, launcher, make_checkout, subprocess_env, tiny_sweep_row,
                            wait_for)

from launch.process import run_process_group

LAUNCH = [sys.executable, "-m", "launch"]


@pytest.fixture
def tiny_sweep(advisor, tmp_path):
    pytest.importorskip("torch.distributed.run", reason="torchrun needs torch (pip install -e '.[megatron]')")
    return tiny_sweep_row(advisor, tmp_path)


def sleeper_checkout(tmp_path: Path) -> Path:
    """A checkout (core 0.15.2's version file) whose pretrain_gpt.py records its pid and its parent's
    (torchrun's agent), then sleeps: a long training run, for the signals' sake."""
    return make_checkout(tmp_path / "sleeper", script=(
        "import os, pathlib, time\n"
        "pids = pathlib.Path(os.environ['PIDS_DIR'], f\"rank{os.environ['RANK']}\")\n"
        "written = pids.with_name(f'.{pids.name}')  # renamed once whole: the test never reads half a file\n"
        "written.write_text(f'{os.getpid()} {os.getppid()}')\n"
        "os.replace(written, pids)\n"
        "time.sleep(600)\n"))


def test_ctrl_c_stops_every_rank(tiny_sweep, tmp_path):
    path, rank, _ = tiny_sweep
    pids_dir = tmp_path / "pids"
    pids_dir.mkdir()
    launch = subprocess.Popen([*LAUNCH, "torchrun", "--from", str(path), "--rank", str(rank), "--megatron-lm",
                               str(sleeper_checkout(tmp_path)), "--", "--distributed-backend", "gloo",
                               *data_job(tmp_path)], env=subprocess_env(PIDS_DIR=str(pids_dir)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: len(list(pids_dir.glob("rank*"))) == 2, 120), "the ranks did not start"
        pids = {int(pid) for file in pids_dir.glob("rank*") for pid in file.read_text().split()}
        assert len(pids) == 3 and all(alive(pid) for pid in pids)  # two workers and torchrun's agent
        launch.send_signal(signal.SIGINT)  # what Ctrl-C sends to the launcher
        launch.wait(timeout=60)
    finally:
        launch.kill()
    # torchrun fails on SIGINT (its status, 1 with torch 2.13, is the launcher's); every rank and
    # torchrun itself are gone.
    assert launch.returncode not in (0, None)
    assert wait_for(lambda: not any(alive(pid) for pid in pids), 10)


CHILD = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a rank that ignores SIGTERM
grandchild = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
open(sys.argv[1], "w").write(f"{os.getpid()} {grandchild.pid}")
time.sleep(600)
"""
DRIVER = "import sys; from launch.process import run_process_group; sys.exit(run_process_group(sys.argv[1:], grace_s=1))"


def test_sigterm_stops_the_group_and_escalates_to_sigkill(tmp_path):
    pid_file = tmp_path / "pids"
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, sys.executable, "-c", CHILD, str(pid_file)],
                              env=subprocess_env())
    try:
        assert wait_for(lambda: pid_file.exists() and len(pid_file.read_text().split()) == 2, 30)
        pids = [int(pid) for pid in pid_file.read_text().split()]
        driver.send_signal(signal.SIGTERM)
        driver.wait(timeout=30)
    finally:
        driver.kill()
    assert driver.returncode == 128 + signal.SIGKILL  # ignored SIGTERM, killed after the grace period
    assert wait_for(lambda: not any(alive(pid) for pid in pids), 10)


def test_exit_status_is_the_childs():
    assert run_process_group([sys.executable, "-c", "import sys; sys.exit(7)"]) == 7
    assert run_process_group([sys.executable, "-c", "import os; os.kill(os.getpid(), 15)"]) == 128 + 15
    assert run_process_group(["cat"], stdin_text="to stdin\n") == 0


def test_a_failing_script_fails_the_launch_with_torchruns_status(tiny_sweep, tmp_path):
    path, rank, _ = tiny_sweep
    checkout = make_checkout(tmp_path / "failing", script="raise SystemExit(3)\n")
    command = ["torchrun", "--from", str(path), "--rank", str(rank), "--megatron-lm", str(checkout)]
    job = ["--", "--distributed-backend", "gloo", *data_job(tmp_path)]
    printed = launcher()(*command, "--dry-run", *job).stdout
    direct = subprocess.run(["bash", "-c", printed], capture_output=True, text=True, env=subprocess_env(), timeout=120)
    launched = subprocess.run([*LAUNCH, *command, *job], capture_output=True, text=True, env=subprocess_env(), timeout=120)
    assert launched.returncode == direct.returncode != 0
    assert "exitcode  : 3" in launched.stderr  # the script's status reached torchrun through the entry


def test_the_entry_runs_the_script_as_python_would(tmp_path):
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "pretrain_gpt.py").write_text(
        "import json, os, sys\n"
        "json.dump({'argv': sys.argv, 'path0': sys.path[0], 'name': __name__}, open(os.environ['SEEN'], 'w'))\n"
        "sys.exit(int(os.environ.get('STATUS', '0')) or os.environ.get('MESSAGE'))\n")
    seen = tmp_path / "seen.json"
    entry = [sys.executable, "-m", "launch.entry", "--megatron-lm", str(checkout), "--", "--num-layers", "2", "--bf16"]

    def run(**env):
        return subprocess.run(entry, capture_output=True, text=True, env=subprocess_env(SEEN=str(seen), **env))

    assert run(STATUS="3").returncode == 3
    assert json.loads(seen.read_text()) == {"argv": [str(checkout / "pretrain_gpt.py"), "--num-layers", "2", "--bf16"],
                                            "path0": str(checkout), "name": "__main__"}
    failed = run(MESSAGE="stopped early")
    assert failed.returncode == 1 and failed.stderr == "stopped early\n"
    assert run().returncode == 0
    missing = subprocess.run([sys.executable, "-m", "launch.entry", "--megatron-lm", str(tmp_path / "no")],
                             capture_output=True, text=True, env=subprocess_env())
    assert missing.returncode == 2 and missing.stderr == f"Error: Megatron-LM checkout {tmp_path / 'no'}: no such directory\n"


def test_a_checkout_under_a_leading_tilde_is_found_in_the_nodes_home(advisor, tmp_path, monkeypatch):
    """The manifests and the printed commands pass --megatron-lm '~/Megatron-LM' through quoted (a
    SkyPilot run script, a pod's args), so no shell expands it: the entry does, with its own
    $HOME, as a shell would (it said 'Megatron-LM checkout ~/Megatron-LM: no such directory' on
    every node); so does the launcher for a checkout it reads here."""
    import shlex

    import yaml

    home = tmp_path / "home"
    checkout = make_checkout(home / "Megatron-LM", script=(
        "import json, os, sys\n"
        "json.dump({'argv0': sys.argv[0], 'path0': sys.path[0]}, open(os.environ['SEEN'], 'w'))\n"))
    seen = tmp_path / "seen.json"
    entry = [sys.executable, "-m", "launch.entry", "--megatron-lm", "~/Megatron-LM", "--", "--bf16"]
    ran = subprocess.run(entry, capture_output=True, text=True, env=subprocess_env(HOME=str(home), SEEN=str(seen)))
    assert ran.returncode == 0, ran.stderr
    assert json.loads(seen.read_text()) == {"argv0": f"{home}/Megatron-LM/pretrain_gpt.py", "path0": f"{home}/Megatron-LM"}
    missing = subprocess.run([*entry[:4], "~/Megatron-LM-2"], capture_output=True, text=True,
                             env=subprocess_env(HOME=str(home)))
    assert (missing.returncode, missing.stderr) == (
        2, f"Error: Megatron-LM checkout ~/Megatron-LM-2 ({home}/Megatron-LM-2): no such directory\n")

    sweep, rank, _ = tiny_sweep_row(advisor, tmp_path)
    task = yaml.safe_load(launcher()("skypilot", "--from", sweep, "--rank", rank, "--megatron-lm", "~/Megatron-LM",
                                     "--dry-run").stdout)
    words = shlex.split(task["run"].replace("\\\n", " "))
    assert words[words.index("--megatron-lm") + 1] == "~/Megatron-LM"  # what the node's entry gets, unexpanded
    monkeypatch.setenv("HOME", str(home))
    printed = launcher()("torchrun", "--from", sweep, "--rank", rank, "--megatron-lm", "~/Megatron-LM", "--dry-run",
                         "--", *CPU_TEST_JOB).stdout
    words = shlex.split(printed.replace("\\\n", " "))
    assert words[words.index("--megatron-lm") + 1] == str(checkout)


STOPPING_CHILD = """
import pathlib, signal, sys, time
def stop(signum, frame):  # a rank that records that it was stopped, which takes a while
    time.sleep(3)
    pathlib.Path(sys.argv[1]).with_suffix(".stopped").write_text(str(signum))
    sys.exit(5)
signal.signal(signal.SIGTERM, stop)
pathlib.Path(sys.argv[1]).write_text("up")
time.sleep(600)
"""
PATIENT_DRIVER = ("import sys; from launch.process import run_process_group; "
                  "sys.exit(run_process_group(sys.argv[1:], grace_s=20))")


@pytest.mark.parametrize("apart_s, status", [(0.05, 5), (1.5, 128 + signal.SIGKILL)],
                         ids=["one stop twice", "a second stop"])
def test_a_signal_right_after_the_first_is_the_same_stop(tmp_path, apart_s, status):
    """One Ctrl-C under 'advisor profile run' reaches the runner twice (the terminal's, and the
    advisor's relay): the ranks get one signal and their time to stop (the child's status, its
    marker written). A second signal SAME_STOP_S (1 s) or more later is a second stop: SIGKILL at once,
    long before the 20 s grace."""
    marker = tmp_path / "rank"
    driver = subprocess.Popen([sys.executable, "-c", PATIENT_DRIVER, sys.executable, "-c", STOPPING_CHILD,
                               str(marker)], env=subprocess_env())
    try:
        assert wait_for(marker.exists, 30)
        driver.send_signal(signal.SIGTERM)
        time.sleep(apart_s)
        driver.send_signal(signal.SIGTERM)
        driver.wait(timeout=15)
    finally:
        driver.kill()
    assert driver.returncode == status
    assert marker.with_suffix(".stopped").exists() == (status == 5)


def test_the_advisor_waits_longer_for_a_stopped_runner_than_the_runner_for_its_ranks():
    """After Ctrl-C the advisor kills a runner still running RUNNER_STOP_S later; the GPU runner kills
    torchrun's ranks GRACE_S after the signal. The runner must decide first: with the advisor's 10 s
    it was killed before its 30 s were up, and its torchrun (a session of its own) lived on."""
    from advisor.capture.relay import RUNNER_STOP_S
    from launch.process import GRACE_S, SAME_STOP_S

    assert RUNNER_STOP_S > GRACE_S + SAME_STOP_S


def test_a_logged_command_keeps_its_output_and_still_shows_it(tmp_path, capfd):
    """``log`` (a campaign run's launch.log): stdout and stderr together, in order, in the file and
    on this process's stderr as they come; the exit status is the command's; a retried run's log
    starts afresh."""
    log = tmp_path / "launch.log"
    script = "import sys; print('out 1', flush=True); print('err 2', file=sys.stderr, flush=True); sys.exit(5)"
    assert run_process_group([sys.executable, "-c", script], log=log) == 5
    assert log.read_text().splitlines() == ["out 1", "err 2"]
    assert capfd.readouterr().err.splitlines() == ["out 1", "err 2"]
    assert run_process_group([sys.executable, "-c", "print('again')"], log=log) == 0
    assert log.read_text() == "again\n"
