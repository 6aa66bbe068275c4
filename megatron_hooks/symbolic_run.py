"""Run stages on the symbolic backend (``symbolic.py``), rank by rank: ``run_symbolic``.

Ranks: one process runs every rank it profiles, one after another. TP ranks are symmetric in
megatron-core (every split is even), so TP rank 0 of each (stage, CP rank, DP rank) is run and
its records are written for the other TP ranks too (``tests/test_symbolic.py`` runs TP rank 1
and compares). CP ranks differ in their ring steps and DP ranks in their distributed-optimizer
shards, so each is run; without the distributed optimizer DP ranks are symmetric too.

Microbatches: each stage runs its 1F1B warm-up and one steady forward-backward pair, which
reach every memory state of the full schedule (``emulate.steady_microbatches``).

``every_rank=True`` runs every rank and every microbatch instead: the reference that
``tests/test_symbolic.py`` compares the shortcuts with, byte for byte.

Apart from ``symbolic.py`` because it drives ``emulate.run_stage``, which itself uses the
symbolic backend's pieces.
"""

from __future__ import annotations

import dataclasses
import gc
from pathlib import Path
from typing import Sequence

from megatron_hooks.emulate import run_stage
from megatron_hooks.symbolic import fake_world


def _ranks_to_run(config, every_rank: bool) -> list[tuple[int, int, int]]:
    """(TP, CP, DP) coordinates to run on each stage; see the module docstring."""
    if every_rank:
        return [(t, c, d) for d in range(config.dp) for c in range(config.cp) for t in range(config.tp)]
    dp_ranks = range(config.dp) if config.distributed_optimizer else [0]
    return [(0, c, d) for d in dp_ranks for c in range(config.cp)]


def _copies(config, cp_rank: int, dp_rank: int) -> list[tuple[int, int, int]]:
    """The (TP, CP, DP) coordinates whose records equal those of TP rank 0 at (cp_rank, dp_rank)."""
    dp_ranks = [dp_rank] if config.distributed_optimizer else range(config.dp)
    return [(tp_rank, cp_rank, other) for other in dp_ranks for tp_rank in range(config.tp)
            if (tp_rank, other) != (0, dp_rank)]


def run_symbolic(config, stages: Sequence[int], *, after_oom: str = "raise", every_rank: bool = False) -> list[Path]:
    """Profile ``stages`` of ``config`` (an ``emulate.StageEmulation`` with
    ``backend="symbolic"``) in this process; returns every rank file written. With
    ``after_oom="continue"`` a rank that exceeds ``memory_limit_bytes`` is recorded and the others
    still run, as ``emulate.run_stages`` does. ``every_rank`` runs every TP and DP rank instead
    of writing copies for the symmetric ones, and every microbatch (to check the shortcuts)."""
    from advisor.profiles import read_rank_file
    from megatron_hooks.recorder import is_out_of_memory

    if every_rank:
        config = dataclasses.replace(config, every_microbatch=True)
    written = []
    for stage in stages:
        for tp_rank, cp_rank, dp_rank in _ranks_to_run(config, every_rank):
            rank = tp_rank + config.tp * (cp_rank + config.cp * dp_rank)  # Megatron's tp-cp-dp order
            with fake_world(config.tp, config.cp, config.dp, rank):
                try:
                    path = run_stage(config, stage)
                except Exception as exc:
                    if after_oom != "continue" or not is_out_of_memory(exc):
                        raise
                    path = config.output_dir / _rank_file(config, stage, tp_rank, cp_rank, dp_rank)
                finally:
                    gc.collect()
            written.append(path)
            if every_rank:
                continue
            profile = read_rank_file(path)
            for tp_other, cp_other, dp_other in _copies(config, cp_rank, dp_rank):
                header = dataclasses.replace(
                    profile.header, rank=config.global_rank(stage, tp_other, dp_other, cp_other),
                    coords={"tp": tp_other, "cp": cp_other, "pp": stage, "dp": dp_other})
                written.append(dataclasses.replace(profile, header=header).write(config.output_dir))
    return written


def _rank_file(config, stage: int, tp_rank: int, cp_rank: int, dp_rank: int) -> str:
    from advisor.profiles import rank_file_name

    return rank_file_name(config.global_rank(stage, tp_rank, dp_rank, cp_rank))
