"""Two real processes over gloo, forked from multiprocessing's fork server, which imports torch,
megatron-core and the test's module once for both (spawned, each process imported them itself:
about 6 s of CPU each here)."""

from __future__ import annotations

import multiprocessing
from typing import Callable


def run_two_ranks(target: Callable[[int, str], None], module: str, init_file: str, what: str = "a rank") -> None:
    """``target(rank, init_file)`` in ranks 0 and 1 (``module``, the test's ``__name__``, holds it);
    each must exit 0 within 120 s, a hung one is killed and named ``what``."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "megatron.core", module])
    ranks = [context.Process(target=target, args=(rank, init_file)) for rank in (0, 1)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(timeout=120)
    hung = [process for process in ranks if process.is_alive()]
    for process in hung:
        process.kill()
    assert not hung, f"{what} is still waiting for its peer"
    assert [process.exitcode for process in ranks] == [0, 0]
