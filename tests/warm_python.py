"""``python ARGS`` for the tests' megatron-core runs, each in a process of its own, forked from an
interpreter that has already imported torch and megatron-core.

A fresh interpreter spends about 6 s of CPU on those two imports on this 2-core machine (their
bytecode cached by pip), more than most of the symbolic runs the tests start take themselves
(tests/test_symbolic.py's 29 processes took 155 s of CPU, 19 of them importing megatron-core).
One server per test process imports them once and forks a child per command: the child has its
own megatron-core global state, working directory, environment, stdout, stderr and exit status,
as ``subprocess.run`` gives them; only the imports of torch and megatron-core are done already
(with the environment of the first command: OMP_NUM_THREADS and the like, read by libgomp as
torch loads, are the test process's), and the warnings they print at import are not printed
again. A test whose point is what a fresh interpreter prints or imports (a one-line error, the
start-up imports) starts a fresh one.

``python -m MODULE``, ``python -c CODE`` and ``python SCRIPT`` run as Python runs them: their
``__main__``, ``sys.argv`` and ``sys.path[0]``, and a normal exit (``sys.exit``: threads joined,
``atexit`` run, buffers flushed).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SERVER = r"""
import gc, json, os, runpy, sys, types, warnings
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # megatron-core's notices on a CPU build, said once here
    try:
        import torch, megatron.core  # noqa: F401
    except ImportError:  # the child's own import says what is missing, as a fresh interpreter's would
        pass
# What the imports made stays (as stage_emulation.freeze_what_is_imported does in a run): each child's
# exit, a normal one, then takes 0.5 s, not the 2 s of tearing down the copies of them it writes to.
gc.freeze()

def child(request):
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["out"], os.O_WRONLY),
                            (2, request["err"], os.O_WRONLY)):
        os.dup2(os.open(path, flags), fd)
    first, *rest = request["argv"]
    if first == "-m":
        sys.argv, sys.path[0] = [first, *rest[1:]], request["cwd"]
        runpy.run_module(rest[0], run_name="__main__", alter_sys=True)
    elif first == "-c":
        sys.argv, sys.path[0] = ["-c", *rest[1:]], ""
        sys.modules["__main__"] = main = types.ModuleType("__main__")
        exec(compile(rest[0], "<string>", "exec"), main.__dict__)
    else:
        sys.argv, sys.path[0] = [first, *rest], os.path.dirname(os.path.abspath(first))
        runpy.run_path(first, run_name="__main__")
    sys.exit(0)  # an exception raised above ends the child as it ends Python: a traceback, status 1

for line in sys.stdin:
    pid = os.fork()
    if pid == 0:
        child(json.loads(line))
    print(pid, flush=True)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), flush=True)
"""


class WarmPython:
    """The server (started at the first command, stopped when this process exits). It answers each
    command with two lines: the child's pid, and its exit status when it has ended."""

    def __init__(self) -> None:
        self.server: subprocess.Popen | None = None
        self.log = tempfile.TemporaryFile()
        self.pending = b""

    def start(self) -> subprocess.Popen:
        if self.server is None or self.server.poll() is not None:
            self.server = subprocess.Popen([sys.executable, "-c", SERVER], cwd=ROOT, stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, stderr=self.log, bufsize=0)
            self.pending = b""
            atexit.register(self.stop)
        return self.server

    def stop(self) -> None:
        if self.server is not None and self.server.poll() is None:
            self.server.stdin.close()
            self.server.wait()

    def reply(self, deadline: float | None) -> int | None:
        """The server's next line, or None when ``deadline`` (time.monotonic) passes first."""
        while b"\n" not in self.pending:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self.server.stdout], [], [], wait)[0]:
                return None
            if not (chunk := os.read(self.server.stdout.fileno(), 4096)):
                self.log.seek(0)
                raise RuntimeError(f"the warm interpreter died: {self.log.read()[-3000:].decode(errors='replace')}")
            self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        return int(line)

    def run(self, argv: list, cwd: Path = ROOT, timeout: float | None = None) -> subprocess.CompletedProcess:
        """``subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True,
        timeout=timeout)``: past the timeout the child is killed and TimeoutExpired raised."""
        args = [sys.executable, *map(str, argv)]
        server = self.start()
        with tempfile.TemporaryDirectory() as directory:
            out, err = Path(directory, "stdout"), Path(directory, "stderr")
            out.touch(), err.touch()
            request = {"argv": args[1:], "cwd": str(cwd), "env": dict(os.environ), "out": str(out), "err": str(err)}
            server.stdin.write(json.dumps(request).encode() + b"\n")
            pid = self.reply(None)
            status = self.reply(None if timeout is None else time.monotonic() + timeout)
            if status is None:
                os.kill(pid, signal.SIGKILL)
                self.reply(None)
                raise subprocess.TimeoutExpired(args, timeout, out.read_text(), err.read_text())
            return subprocess.CompletedProcess(args, status, out.read_text(), err.read_text())


WARM = WarmPython()


def run(argv: list, cwd: Path = ROOT, timeout: float | None = None) -> subprocess.CompletedProcess:
    return WARM.run(argv, cwd, timeout)
