"""``advisor profile run``'s side of the runner: start it, relay its progress and its exit status.

The runner (``python -m megatron_hooks.campaign_runner`` on the CPU, ``python -m
launch.campaign_runner`` on GPUs) needs torch and megatron-core, itself or in the ranks it
starts; the advisor never imports them. It runs with this interpreter (``sys.executable``, no
shell), this package's source first on its path, its events on a pipe and its stderr in a
temporary file, whose last lines explain a crash.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

RUNNER_MODULE = "megatron_hooks.campaign_runner"
"""The CPU emulator's runner."""
LAUNCH_RUNNER_MODULE = "launch.campaign_runner"
"""The GPU runner: torchrun and the user's Megatron-LM."""
LAUNCH_ARRAY_MODULE = "launch.slurm_array"
"""Writes and submits a campaign as one Slurm job array (advisor profile run --slurm-array)."""
RUNNER_STOP_S = 45.0
"""How long a stopped runner may take to end after Ctrl-C before it is killed: more than the GPU
runner gives torchrun's ranks to stop (``launch.process.GRACE_S``, 30 s; a test checks), so that
the runner, not this process, decides when the ranks are killed (with 10 s the runner was killed
first and its torchrun left running)."""
REQUIRED = ("torch", "megatron.core")


def missing_modules(checkout: str | os.PathLike | None = None) -> list[str]:
    """The packages the runner needs that this interpreter cannot import (without importing them).
    A Megatron-LM ``checkout`` provides megatron.core itself (its ranks run with the checkout first
    on their path, as ``python pretrain_gpt.py`` does), so it need not be installed then."""
    missing = []
    provided = checkout is not None and (Path(checkout) / "megatron" / "core" / "__init__.py").is_file()
    for name in REQUIRED:
        if provided and name == "megatron.core":
            continue
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # the parent package (megatron) is absent
            found = False
        if not found:
            missing.append(name)
    return missing


@dataclass
class Summary:
    """What the events said, for the final line and the exit status."""

    runs: int = 0
    done: dict = field(default_factory=dict)
    failed: list = field(default_factory=list)
    finished: bool = False
    seconds: float = 0.0
    skipped: int = 0
    counts: dict = field(default_factory=dict)

    def take(self, event: dict) -> None:
        kind = event.get("event")
        if kind == "campaign":
            self.runs = event["runs"]
        elif kind == "run":
            self.done[event["id"]] = event["status"]
            if event["status"] == "error":
                self.failed.append(event)
        elif kind == "done":
            self.finished, self.seconds = True, event["seconds"]
            self.skipped, self.counts = event["skipped"], {k: event[k] for k in ("ok", "oom", "error")}


def _environment() -> dict:
    root = str(Path(__file__).resolve().parents[2])  # holds advisor/ and megatron_hooks/
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}


def _last_lines(log, count: int = 3) -> str:
    log.seek(0)
    lines = [line.strip() for line in log.read().splitlines() if line.strip()]
    return " | ".join(lines[-count:])


class Terminated(KeyboardInterrupt):
    """SIGTERM (Slurm's scancel, a job timeout, ``kill``) seen as an interrupt, so that the runner
    is stopped too rather than left running as an orphan; ``args[0]`` is the signal."""


@contextlib.contextmanager
def _terminate_as_interrupt():
    """Within the block SIGTERM raises :class:`Terminated` (where this is the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, _frame):
        raise Terminated(signum)

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def relay(campaign: Path, out: Path, options: list[str], view, *, gpus: bool = False) -> tuple[int, Summary, str]:
    """Run the runner (the GPU one with ``gpus``) to the end; returns (its exit status, the
    summary, its last stderr lines). ``view.handle(event)`` sees every event. Ctrl-C stops the
    runner and re-raises."""
    module = LAUNCH_RUNNER_MODULE if gpus else RUNNER_MODULE
    command = [sys.executable, "-m", module, str(campaign), "--out", str(out), *options]
    summary = Summary()
    with tempfile.TemporaryFile("w+", encoding="utf-8") as log, _terminate_as_interrupt():
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True, env=_environment())
        try:
            for line in process.stdout:
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    continue  # not an event
                summary.take(event)
                view.handle(event)
            status = process.wait()
        except KeyboardInterrupt as stop:
            process.send_signal(stop.args[0] if isinstance(stop, Terminated) else signal.SIGINT)
            try:
                process.wait(timeout=RUNNER_STOP_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            raise
        finally:
            view.close()
        return status, summary, _last_lines(log)
