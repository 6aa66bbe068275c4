"""Real launches: torchrun with 2 gloo processes on the CPU through ``advisor-launch``, of the
stand-in checkout (tests/fixtures/megatron_lm_standin, the only fake besides Slurm's commands);
the entry; exit statuses; Ctrl-C and SIGTERM."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launch_support import STANDIN, TINY_SWEEP, launcher, rank_of, subprocess_env, sweep_file

from advisor.profiles import load_run
from conftest import ROOT
from launch.process import run_process_group

pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install -e '.[megatron]')")

LAUNCH = [sys.executable, "-m", "launch"]
SLURM = ROOT / "tests" / "fixtures" / "slurm_standin"


@pytest.fixture
def tiny_sweep(advisor, tmp_path):
    """The sweep of a 2-layer model on 2 GPUs, and the rank of its row with TP 2 and 2 microbatches."""
    path = sweep_file(advisor, tmp_path / "tiny.json", *TINY_SWEEP)
    rank = rank_of(path, tp=2, cp=1, pp=1, mbs=2)
    return path, rank, next(row for row in json.loads(path.read_text()) if row["rank"] == rank)


def received(argv_dir: Path) -> dict[int, list[str]]:
    """The command line each rank of the stand-in received."""
    return {int(path.stem.removeprefix("argv-rank")): json.loads(path.read_text())
            for path in sorted(argv_dir.glob("argv-rank*.json"))}


def check_profiled_run(profile_dir: Path, row: dict, run_id: str | None) -> None:
    """Both ranks wrote their records through the hooks, and the header is the sweep row's."""
    run = load_run(profile_dir)
    assert run.status == "ok" and [rank.header.rank for rank in run.ranks] == [0, 1]
    for rank in run.ranks:
        header = rank.header
        assert not header.emulated and (run_id is None or header.run_id == run_id)
        assert (header.parallel.tp, header.parallel.cp, header.parallel.pp, header.parallel.dp) == (2, 1, 1, 1)
        assert header.parallel.mbs == row["mbs"] == 2 and header.seq_len == row["seq_len"] == 32
        assert header.global_batch_size == row["global_batch_size"] == 4 and header.num_microbatches == 2
        model = row["model"]
        assert (header.model.num_layers, header.model.hidden_size, header.model.ffn_hidden_size) == (
            model["num_layers"], model["hidden_size"], model["ffn_hidden_size"])
        assert (header.model.num_attention_heads, header.model.num_query_groups, header.model.vocab_size) == (
            model["num_attention_heads"], model["num_query_groups"], model["vocab_size"])
        assert header.params_dtype == "bfloat16"  # the estimate's --bf16 arrived
        assert len(rank.iterations) == 2 and rank.layers_of(2)
    assert {rank.header.coords["tp"] for rank in run.ranks} == {0, 1}
    assert run.ranks[0].iterations[-1].loss == pytest.approx(run.ranks[1].iterations[-1].loss)


def test_torchrun_launch_installs_the_hooks_on_both_ranks(tiny_sweep, tmp_path):
    path, rank, row = tiny_sweep
    (tmp_path / "argv").mkdir()
    command = ["torchrun", "--from", path, "--rank", rank, "--megatron-lm", STANDIN, "--profile-dir",
               tmp_path / "profile", "--run-id", "launch-test", "--mock-data", "--", "--train-iters", "2", "--lr", "1e-3"]
    result = subprocess.run([*LAUNCH, *map(str, command)], capture_output=True, text=True, timeout=300,
                            env=subprocess_env(STANDIN_ARGV_DIR=str(tmp_path / "argv")))
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"+ torchrun --nproc-per-node 2 --standalone -m launch.entry --megatron-lm {STANDIN}" in result.stderr
    check_profiled_run(tmp_path / "profile", row, "launch-test")
    # The input's arguments arrived unchanged on both ranks, with --mock-data's and the user's after them.
    expected = json.loads(launcher()("args", "--from", path, "--rank", rank, "--mock-data", "--format", "json",
                                     "--", "--train-iters", "2", "--lr", "1e-3").stdout)
    argv = received(tmp_path / "argv")
    assert argv[0] == argv[1] == [str(STANDIN / "pretrain_gpt.py"), *expected]
    args = argv[0][1:]
    assert args[args.index("--tensor-model-parallel-size") + 1] == "2" and "--sequence-parallel" in args
    assert args[args.index("--vocab-size") + 1] == "255"  # 256 - 1, NullTokenizer adds one


def test_sbatch_script_runs_torchrun_on_two_nodes(tiny_sweep, tmp_path):
    """The generated script, run by bash with Slurm's commands stood in: srun starts one real
    torchrun per "node" (two here), meeting at a real c10d rendezvous on the first."""
    from megatron_hooks.emulate import free_port

    path, rank, row = tiny_sweep
    script = tmp_path / "job.sh"
    launcher()("sbatch", "--from", path, "--rank", rank, "--megatron-lm", STANDIN, "--gpus-per-node", 1,
               "--rdzv-port", free_port(), "--profile-dir", tmp_path / "profile", "-o", script, "--dry-run", "--",
               "--vocab-size", "256", "--train-iters", "2")
    env = subprocess_env(PATH=f"{SLURM}{os.pathsep}{subprocess_env()['PATH']}", SLURM_JOB_NODELIST="n[1-2]",
                         SLURM_NNODES="2", SLURM_JOB_ID="4242", SLURM_STANDIN_HOSTS="127.0.0.1 127.0.0.2",
                         STANDIN_ARGV_DIR=str(tmp_path / "argv"))
    (tmp_path / "argv").mkdir()
    result = subprocess.run(["bash", script], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    check_profiled_run(tmp_path / "profile", row, None)
    argv = received(tmp_path / "argv")
    assert argv[0] == argv[1] and argv[0][-4:] == ["--vocab-size", "256", "--train-iters", "2"]


def sleeper_checkout(tmp_path: Path) -> Path:
    """A checkout whose pretrain_gpt.py records its pid and its parent's (torchrun's agent), then sleeps."""
    checkout = tmp_path / "sleeper"
    checkout.mkdir()
    (checkout / "pretrain_gpt.py").write_text(
        "import os, pathlib, time\n"
        "pids = pathlib.Path(os.environ['PIDS_DIR'], f\"rank{os.environ['RANK']}\")\n"
        "pids.write_text(f'{os.getpid()} {os.getppid()}')\n"
        "time.sleep(600)\n")
    return checkout


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def wait_for(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


def test_ctrl_c_stops_every_rank(tiny_sweep, tmp_path):
    path, rank, _ = tiny_sweep
    pids_dir = tmp_path / "pids"
    pids_dir.mkdir()
    launch = subprocess.Popen([*LAUNCH, "torchrun", "--from", str(path), "--rank", str(rank), "--megatron-lm",
                               str(sleeper_checkout(tmp_path))], env=subprocess_env(PIDS_DIR=str(pids_dir)),
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
    checkout = tmp_path / "failing"
    checkout.mkdir()
    (checkout / "pretrain_gpt.py").write_text("raise SystemExit(3)\n")
    command = ["torchrun", "--from", str(path), "--rank", str(rank), "--megatron-lm", str(checkout)]
    printed = launcher()(*command, "--dry-run").stdout
    direct = subprocess.run(["bash", "-c", printed], capture_output=True, text=True, env=subprocess_env(), timeout=120)
    launched = subprocess.run([*LAUNCH, *command], capture_output=True, text=True, env=subprocess_env(), timeout=120)
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
