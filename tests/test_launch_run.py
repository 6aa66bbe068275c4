"""Real launches: torchrun with 2 gloo processes on the CPU through ``advisor-launch`` and through
the generated Slurm script, of the stand-in checkout (tests/fixtures/megatron_lm_standin, the
only fake besides Slurm's commands), with the hooks installed."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from launch_support import STANDIN, launcher, subprocess_env, tiny_sweep_row

from advisor.profiles import load_run
from conftest import ROOT

pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install -e '.[megatron]')")

LAUNCH = [sys.executable, "-m", "launch"]
SLURM = ROOT / "tests" / "fixtures" / "slurm_standin"


@pytest.fixture
def tiny_sweep(advisor, tmp_path):
    return tiny_sweep_row(advisor, tmp_path)


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
