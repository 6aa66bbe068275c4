"""Run a command as its own process group and hand its exit status back.

torchrun starts one worker per GPU. The launcher starts torchrun in a new session (so that it
leads a process group of its own, workers included) and forwards SIGINT and SIGTERM to that
whole group: Ctrl-C stops every rank, not only torchrun. A second signal, or a group still alive
``grace_s`` seconds after the first, gets SIGKILL. No shell is involved: the command is an
argument list.

A signal within ``SAME_STOP_S`` of the first is the same stop, not a second one: under 'advisor
profile run' the terminal's Ctrl-C reaches the runner (in the advisor's process group) and the
advisor relays it too (``advisor.capture.relay``), so one Ctrl-C arrived twice and SIGKILLed the
ranks before they could record that they were stopped (audit of 2026-11-30).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import BinaryIO, Mapping, Sequence

from advisor.errors import AdvisorError

FORWARDED = (signal.SIGINT, signal.SIGTERM)
GRACE_S = 30.0
SAME_STOP_S = 1.0
"""Seconds after a signal within which another is the same stop (module docstring): far less than a
person takes to press Ctrl-C again after seeing nothing happen."""


TORCH_ENVIRONMENT = "activate the environment where torch and this package are installed"


def require_program(program: str, hint: str) -> None:
    """AdvisorError before anything starts if ``program`` is not on PATH."""
    if shutil.which(program) is None:
        raise AdvisorError(f"{program} not found on PATH; {hint}")


def exit_status(returncode: int) -> int:
    """A child's status as a shell reports it: killed by signal N -> 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:  # the group is gone already
        pass


def run_process_group(argv: Sequence[str], *, stdin_text: str | None = None, grace_s: float = GRACE_S,
                      raise_on_signal: bool = False, environment: Mapping[str, str] | None = None,
                      log: Path | None = None) -> int:
    """Run ``argv`` in a new session, forwarding SIGINT/SIGTERM to its group; return its exit
    status. ``environment``: variables set over this process's for the command. With
    ``raise_on_signal``, a forwarded signal is raised here as KeyboardInterrupt once the group is
    gone (for a caller that runs one command after another and must stop too). ``log``: a file
    that also gets the command's output, stdout and stderr together, as it comes (``_tee``), so
    that a run's output outlives the terminal it scrolled through (not with ``stdin_text``)."""
    if log is not None and stdin_text is not None:
        raise ValueError("run_process_group: log and stdin_text together are not supported")
    env = {**os.environ, **environment} if environment else None
    process = subprocess.Popen(list(argv), start_new_session=True, env=env,
                               stdin=subprocess.PIPE if stdin_text is not None else None,
                               stdout=subprocess.PIPE if log is not None else None,
                               stderr=subprocess.STDOUT if log is not None else None,
                               text=stdin_text is not None)
    copier = _tee(process.stdout, log) if log is not None else None
    received: list[int] = []
    first: list[float] = []

    def forward(signum, _frame) -> None:
        now = time.monotonic()
        if first and now - first[0] < SAME_STOP_S:
            return  # the same Ctrl-C, relayed (module docstring)
        received.append(signum)
        first[:] = first or [now]
        _signal_group(process.pid, signal.SIGKILL if len(received) > 1 else signum)

    previous = {signum: signal.signal(signum, forward) for signum in FORWARDED}
    try:
        if stdin_text is not None:
            process.stdin.write(stdin_text)
            process.stdin.close()
        _wait_for_exit(process.pid, received, grace_s)
        # The leader has exited but is not reaped yet, so its process group id cannot be reused:
        # workers it left behind (it was killed, or died early) go now.
        _signal_group(process.pid, signal.SIGKILL if received else signal.SIGTERM)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if copier is not None:  # the group is gone, so the pipe ends; a worker that escaped it cannot hold us
            copier.join(timeout=TEE_JOIN_S)
    status = exit_status(process.wait())
    if received and raise_on_signal:
        raise KeyboardInterrupt(f"stopped by signal {received[0]}")
    return status


TEE_JOIN_S = 10.0
"""Seconds to wait for the last of a command's output once its process group is gone."""


def _tee(stream: BinaryIO, log: Path) -> threading.Thread:
    """A thread copying ``stream`` (a command's output pipe) to ``log`` and to this process's
    stderr, chunk by chunk as it comes (``read1``: no waiting for a full buffer), until the pipe
    ends. stderr as text where it has no byte buffer (click's test runner)."""
    def copy() -> None:
        err = getattr(sys.stderr, "buffer", None)
        with open(log, "wb") as out:  # a retried run starts its log afresh
            for chunk in iter(lambda: stream.read1(1 << 16), b""):
                out.write(chunk)
                out.flush()
                if err is not None:
                    err.write(chunk)
                    err.flush()
                else:
                    sys.stderr.write(chunk.decode(errors="replace"))
        stream.close()

    thread = threading.Thread(target=copy, name="tee", daemon=True)
    thread.start()
    return thread


def _wait_for_exit(pid: int, received: list[int], grace_s: float) -> None:
    """Block until ``pid`` exits, without reaping it; SIGKILL its group ``grace_s`` after a signal."""
    deadline = None
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is None:
        if received and deadline is None:
            deadline = time.monotonic() + grace_s
        if deadline is not None and time.monotonic() > deadline:
            _signal_group(pid, signal.SIGKILL)
            deadline = float("inf")
        time.sleep(0.1)


def write_or_submit(script: str, output, *, dry_run: bool, announce=None, ready=None) -> int | None:
    """A Slurm batch script: written atomically to ``output`` (if given), printed (a dry run without
    ``output``, or ``output`` '-': advisor.cli.options.STDOUT), or submitted with sbatch (the file,
    else the script on its standard input). Returns sbatch's exit status, or None when nothing was
    submitted. ``ready()`` is called once the file is written, before anything is printed or
    submitted: a caller's held notes come out then, never ahead of a file that could not be
    written (its one error line). ``announce(argv)`` is called just before submitting. One place
    for ``advisor-launch sbatch`` and ``--slurm-array``."""
    from advisor.cli.options import emit, wrote
    from advisor.fileio import atomic_write_text, is_stdout

    if not dry_run:  # before anything is written or said: no sbatch is one line
        require_program("sbatch", "submit from a Slurm login node, or write the script with --dry-run -o FILE")
    printed = output is not None and is_stdout(output)
    written = None if output is None or printed else output
    if written is not None:
        atomic_write_text(written, script)
    if ready is not None:
        ready()
    if written is not None:
        wrote(written)
    if printed or (dry_run and written is None):
        emit(script, None)  # a failed write to stdout said as stdout's (advisor.cli.options)
    if dry_run:
        return None
    argv = ["sbatch", str(written)] if written is not None else ["sbatch"]
    if announce is not None:
        announce(argv)
    return run_process_group(argv, stdin_text=None if written is not None else script)
