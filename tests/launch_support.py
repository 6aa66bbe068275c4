"""Shared inputs of the launcher's tests: real files written by the advisor's own commands."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from capture_synth import TINY, Truth, write_scenario
from conftest import ROOT, Invoker

from advisor.capture.partitionings import description1
from launch.cli import cli as launch_cli

FLAGS = frozenset((ROOT / "tables" / "data" / "megatron_lm_core_v0.15.2_flags.txt").read_text().split())

# A model small enough to train 2 iterations on the CPU in seconds (the stand-in runs CP = 1).
TINY_SWEEP = ["--model", "llama3.1-8b", "--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128",
              "--num-attention-heads", "4", "--num-query-groups", "2", "--vocab-size", "256", "--seq-len", "32",
              "--gbs", "4", "--gpus", "2", "--mem", "1"]


# What a launch on this CPU machine adds after '--' to pass the preflight (launch.preflight):
# gloo (the CPU test path), megatron-core's own modules (no Transformer Engine) with the persistent
# layer-norm kernel off (torch's RMSNorm refuses it: advisor.options.local_spec), and a complete job.
CPU_TEST_JOB = ["--distributed-backend", "gloo", "--transformer-impl", "local", "--no-persist-layer-norm",
                "--train-iters", "2", "--lr", "1e-4"]


def data_job(directory: Path) -> list[str]:
    """Megatron-LM arguments of a complete job on a dataset prefix whose .bin and .idx exist (empty:
    for launches of stand-in scripts that never read them), without Transformer Engine. Its
    tokenizer is a local Hugging Face directory (empty too), whose rows come from its files: a
    NullTokenizer's --vocab-size must build the input's own rows (launch.arguments.check_null_tokenizer)."""
    for suffix in (".bin", ".idx"):
        (directory / f"corpus_text_document{suffix}").touch()
    (directory / "tokenizer").mkdir(exist_ok=True)
    return ["--transformer-impl", "local", "--no-persist-layer-norm",
            "--data-path", str(directory / "corpus_text_document"),
            "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(directory / "tokenizer"),
            "--train-iters", "2", "--lr", "1e-4"]


def launcher() -> Invoker:
    return Invoker(launch_cli)


def write_json(path: Path, document) -> Path:
    path.write_text(json.dumps(document, indent=2))
    return path


def sweep_file(advisor: Invoker, path: Path, *args: str) -> Path:
    """``advisor sweep ... --format json -o path``."""
    advisor("sweep", *args, "--format", "json", "-o", path)
    return path


def rank_of(path: Path, **wanted) -> int:
    """The rank of the first row of a sweep file with these values (e.g. tp=2, pp=1)."""
    rows = json.loads(path.read_text())
    return next(row["rank"] for row in rows if row["rank"] and all(row[k] == v for k, v in wanted.items()))


def tiny_sweep_row(advisor: Invoker, root: Path) -> tuple[Path, int, dict]:
    """The sweep of a 2-layer model on 2 GPUs, the rank of its row with TP 2 and 2 microbatches, the row.
    Without sequence parallelism, which the CPU launches' --transformer-impl local refuses at TP 2
    (advisor.options.local_spec)."""
    path = sweep_file(advisor, root / "tiny.json", *TINY_SWEEP, "--no-sequence-parallel")
    rank = rank_of(path, tp=2, cp=1, pp=1, mbs=2)
    return path, rank, next(row for row in json.loads(path.read_text()) if row["rank"] == rank)


def plan_files(advisor: Invoker, root: Path) -> dict[str, Path]:
    """Plans written by ``advisor recommend`` from synthetic profiles of the 8-layer TINY model
    (capture_synth, with a light embedding and LM head): launchable ones with uneven splits
    (a layout, a different last stage, TP 2) and a hybrid one with per-stage degrees."""
    profiles = root / "profiles"
    truth = Truth(spec=TINY, params={"embedding": 1000, "output": 1000})
    write_scenario(profiles, truth, description1(8, 4), (2, 4))
    write_scenario(profiles, truth, description1(8, 3), (2, 4), tp=2)
    write_scenario(profiles, truth, description1(8, 3), (2, 4), dp=2)
    plans = {
        "pp4": ["--gpus", "4", "--pp", "4", "--mbs", "2", "--gbs", "8"],
        "pp3": ["--gpus", "3", "--pp", "3", "--mbs", "2", "--gbs", "8"],
        "pp3-tp2": ["--gpus", "12", "--gpus-per-node", "4", "--pp", "3", "--tp", "2", "--mbs", "2", "--gbs", "8"],
        "hybrid": ["--gpus", "3", "--gpus-per-node", "3", "--mode", "hybrid", "--mbs", "4", "--gbs", "16"],
    }
    out = {}
    for name, args in plans.items():
        out[name] = root / f"{name}.json"
        advisor("recommend", "--profile", profiles, *args, "-o", out[name])
    return out


def make_checkout(directory: Path, minor: int = 15, script: str = "raise SystemExit('not run by these tests')\n") -> Path:
    """A directory holding a pretrain_gpt.py and a Megatron-LM release's version file
    (megatron/core/package_info.py, 0.MINOR.2): where a test exercises the launcher around the
    script (quoting, signals, exit statuses), not Megatron (test_launch_run.py runs the real one)."""
    (directory / "megatron" / "core").mkdir(parents=True)
    (directory / "pretrain_gpt.py").write_text(script)
    (directory / "megatron" / "core" / "package_info.py").write_text(f"MAJOR = 0\nMINOR = {minor}\nPATCH = 2\n")
    return directory


def alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie."""
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


def subprocess_env(**extra: str) -> dict[str, str]:
    """This interpreter's bin directory first on PATH (torchrun, advisor-launch), one thread each."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env
