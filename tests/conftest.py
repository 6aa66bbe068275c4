import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from advisor.cli import cli

ROOT = Path(__file__).resolve().parent.parent

# Under pytest-xdist (the README's test command: -n auto --dist loadgroup) each worker is one of
# the machine's cores: torch's intra-op threads, here and in the subprocesses the tests start,
# would only contend with the other workers' (set before any test module imports torch). Where a
# run sets its own count (the CPU campaign runner's default, cores / (TP x DP):
# stage_emulation.process_group), OpenMP's waiting threads sleep rather than spin (OMP_WAIT_POLICY,
# read by libgomp when torch loads). Spinning against the other worker, the measurement campaign of
# tests/test_capture_e2e.py (its 2 runs at 2 threads) took 89 s of CPU and 115 s wall beside a busy
# core on this 2-core machine, 26 s and 33 s passive (23 s and 32 s at 1 thread).
# The terminal's size is not the tests': the workers find COLUMNS=80 and LINES=24 set at their
# start, and a user's shell may export its own, which wrap the notes on stderr and narrow the tables
# the tests read (66 tests failed under an exported COLUMNS=100). Every process of the run takes
# neither, as a pipe or a log would: tables at their 100-column default, notes one line each; a
# test about widths sets COLUMNS itself.
TERMINAL = ("COLUMNS", "LINES")
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
for name in TERMINAL:
    os.environ.pop(name, None)


def run_json_script(script: str):
    """Run ``script`` in a process of its own at the repository root (megatron-core's global
    state, imported once, stays out of the test process), forked with torch and megatron-core
    imported (tests/warm_python.py); the JSON value of its last line of stdout."""
    import warm_python

    done = warm_python.run(["-c", script])
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


SHARED_SCOPES = ("module", "class", "package")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under --dist loadgroup, a module whose tests share a module- or class-scoped fixture (a
    profiled campaign, a sweep, a browser) runs on one worker, so the fixture is built once, not
    once per worker. Modules that name their own group (xdist_group: the single Slurm node's jobs,
    the session's Megatron validator processes) keep it. Runs before xdist reads the marks."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        definitions = getattr(item, "_fixtureinfo", None)
        if definitions is not None and any(fixture.scope in SHARED_SCOPES
                                           for chain in definitions.name2fixturedefs.values() for fixture in chain):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


def pytest_configure(config):
    """xdist groups by a suffix it writes into each grouped test's node id; pytest 9.2's node ids
    ignore that write (pytest-xdist issue 1386, open on 2026-11-26: hence pytest < 9.2 in the test
    extra), and the tests would run ungrouped without a word. Say so instead."""
    if getattr(config.option, "dist", "no") == "loadgroup" and pytest.version_tuple[:2] >= (9, 2):
        raise pytest.UsageError(f"--dist loadgroup does not group tests on pytest {pytest.__version__} "
                                "(pytest-xdist issue 1386): install the test extra's pytest (< 9.2)")


class Invoker:
    """Runs a click command in-process (CliRunner; the real ``advisor`` group by default),
    stdout and stderr apart."""

    def __init__(self, command=cli) -> None:
        self.runner = CliRunner()
        self.command = command

    def __call__(self, *args, expect: int = 0):
        result = self.runner.invoke(self.command, [str(arg) for arg in args], catch_exceptions=False)
        assert result.exit_code == expect, f"exit {result.exit_code}\n{result.output}"
        return result

    def json(self, *args):
        return json.loads(self(*args, "--format", "json").stdout)

    def error(self, *args) -> str:
        """Run a command that must fail on bad input: exit 2, one line on stderr, no traceback."""
        result = self(*args, expect=2)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
        assert "Traceback" not in result.output
        assert result.stdout == ""
        return lines[0]


@pytest.fixture
def advisor() -> Invoker:
    return Invoker()


@pytest.fixture(scope="session")
def megatron_world():
    """One gloo process group of one rank, megatron-core's parallel_state with TP = PP = 1, and
    the CPU shim, shared by every in-process megatron-core test (a process initialises them once)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    from megatron_hooks.cpu_shim import CpuShim, needs_shim
    from megatron_hooks.stage_emulation import free_port

    shim = CpuShim().install() if needs_shim() else None
    # Tiny models gain nothing from intra-op threads, and on a shared 2-core machine a
    # descheduled OpenMP worker stalls every op (10x slower tests were seen).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(free_port())
        dist.init_process_group("gloo", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    yield
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()
    torch.set_num_threads(threads)
    if shim is not None:
        shim.restore()
