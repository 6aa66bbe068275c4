"""The program torchrun starts on every GPU: the user's ``pretrain_gpt.py``, with the hooks.

    python -m launch.entry --megatron-lm DIR [--profile-dir DIR [--run-id ID]] [--check-imports]
        -- MEGATRON_ARGS...

It does what ``python DIR/pretrain_gpt.py MEGATRON_ARGS...`` does (the checkout first on
``sys.path``, ``sys.argv`` the script and its arguments, the script run as ``__main__`` with
``runpy``), in this process and without touching the checkout; with ``--profile-dir`` it first
installs ``megatron_hooks`` (``megatron_hooks.integration.install``), which writes this rank's
``rank{RANK:05d}.jsonl`` there, and uninstalls them when the script returns. The exit status is
the script's. ``--megatron-lm`` defaults to ``$MEGATRON_LM``.

``--check-imports`` first checks that the modules the Megatron arguments need outside
megatron-core are importable here (``transformer_engine`` where they use it, ``deep_ep`` for the
flex dispatcher's DeepEP and HybridEP backends: ``launch.preflight.rank_import_problems``), and
otherwise exits with status 2 before Megatron is imported, local rank 0 printing a line for each
(so at most that per node): ``advisor-launch sbatch`` asks for it where the launch needs one,
because the node it submits from (a login node) need not have them, while the job's nodes must.
Without it the entry adds no check of its own.
"""

from __future__ import annotations

import argparse
import os
import runpy
import signal
import socket
import sys
import time
from typing import Sequence

from advisor.errors import AdvisorError
from launch.checkout import SCRIPT, resolve_checkout

QUIET_RANK_WAIT_S = 3.0
"""How long a rank other than local rank 0 waits before it exits for a missing module: longer than local rank 0 takes to print its one line (a fraction of a second here)."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m launch.entry", allow_abbrev=False,
        description="Run Megatron-LM's pretrain_gpt.py in this process, with megatron_hooks when profiling. "
                    "Megatron-LM arguments follow '--'.")
    parser.add_argument("--megatron-lm", default=None, help="The Megatron-LM checkout (default: $MEGATRON_LM).")
    parser.add_argument("--profile-dir", default=None, help="Install the hooks; rank files go here.")
    parser.add_argument("--run-id", default=None, help="The profiled run's id (default: a new one from rank 0).")
    # --check-transformer-engine: the name written by earlier advisor-launch scripts and manifests
    parser.add_argument("--check-imports", "--check-transformer-engine", dest="check_imports", action="store_true",
                        help="Exit with status 2 before the script if a module the arguments need (transformer_engine, "
                             "deep_ep) cannot be imported here.")
    return parser


def missing_imports(megatron_args: Sequence[str]) -> list[str]:
    """A line for each module the arguments need that this rank cannot import, naming the node and
    the interpreter (what a job's log needs to find the environment that lacks it)."""
    from launch.preflight import rank_import_problems

    return rank_import_problems(megatron_args, f" on {socket.gethostname()} ({sys.executable})")


def split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """The entry's own options, and the Megatron-LM arguments after the first ``--``."""
    argv = list(argv)
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1:]


def _status(code) -> int:
    """``SystemExit.code`` as a process exit status, as the interpreter maps it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def shield_forked_children(megatron_args: Sequence[str]) -> None:
    """With ``--exit-signal-handler``, the processes this rank forks (the DataLoader's workers)
    block SIGTERM. Slurm signals every process of a job step (``--signal``, ``scancel
    --signal``), workers included, and a worker killed by it makes the rank raise ("DataLoader
    worker ... is killed by signal: Terminated") before Megatron's handler can save and exit:
    seen on a real Slurm with core_v0.15.2. core_v0.19.0's own worker_init_fn makes its workers
    catch the exit signal (megatron/training/datasets/data_samplers.py); this does the same for
    every release. The workers still end with their rank (the DataLoader shuts them down)."""
    if "--exit-signal-handler" in megatron_args:
        os.register_at_fork(after_in_child=lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM}))


def run(checkout, megatron_args: Sequence[str], *, profile_dir=None, run_id: str | None = None) -> int:
    """Run ``checkout/pretrain_gpt.py`` with ``megatron_args`` in this process; its exit status."""
    shield_forked_children(megatron_args)
    script = checkout / SCRIPT
    sys.path.insert(0, str(checkout.resolve()))  # as `python pretrain_gpt.py` puts the script's directory first
    sys.argv = [str(script), *megatron_args]
    session = None
    if profile_dir is not None:
        from megatron_hooks import integration  # torch and megatron-core, only when profiling

        session = integration.install(profile_dir, run_id=run_id)
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        return _status(exc.code)
    finally:
        if session is not None:
            session.uninstall()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    own, megatron_args = split_argv(sys.argv[1:] if argv is None else argv)
    options = _parser().parse_args(own)
    if options.run_id is not None and options.profile_dir is None:
        print("Error: --run-id names a profiled run; give --profile-dir too", file=sys.stderr)
        return 2
    try:
        checkout = resolve_checkout(options.megatron_lm)
    except AdvisorError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2
    if options.check_imports and (problems := missing_imports(megatron_args)):
        if os.environ.get("LOCAL_RANK", "0") == "0":  # one line per node, not one per GPU
            for problem in problems:
                print(f"Error: {problem}", file=sys.stderr, flush=True)
        else:
            # torchrun ends a node's other ranks as soon as one fails: the quiet ones wait, so that
            # local rank 0 has said why before it is ended (its line was sometimes lost)
            time.sleep(QUIET_RANK_WAIT_S)
        return 2
    return run(checkout, megatron_args, profile_dir=options.profile_dir, run_id=options.run_id)


if __name__ == "__main__":
    sys.exit(main())
