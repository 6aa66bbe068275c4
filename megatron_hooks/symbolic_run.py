"""Run stages on the symbolic backend (``symbolic.py``), rank by rank: ``run_symbolic``.

Ranks: one process runs every rank it profiles, one after another. TP ranks are symmetric in
megatron-core (every split is even), so TP rank 0 of each (stage, CP rank, DP rank) is run and
its records are written for the other TP ranks too (``tests/test_symbolic.py`` runs TP rank 1
and compares). CP ranks differ in their ring steps, so each is run; without the distributed optimizer DP ranks
are symmetric too.

DP ranks under the distributed optimizer hold different shards of the optimizer state, and
nothing else differs: their forward and backward passes run the same shapes on the same
parameters, gradient buffer and activations. So DP rank 0 runs in full, and each DP rank ``d``
(0 included) runs only its optimizer steps, with the same build and no microbatch
(``StepProbe(optimizer_only=True)``). Rank ``d``'s records are DP rank 0's with its own optimizer
bytes (per module and per iteration) and its own iteration peak: at every moment before the step
rank ``d`` holds rank 0's bytes plus the difference ``a_d - a_0`` of the two probes' bytes at
their steps, and during the step rank 0's bytes at its step ``A_0`` plus rank ``d``'s rise, so
``peak_d = max(F_0 + a_d - a_0, A_0 + q_d - a_0)``, with ``F_0`` rank 0's peak before its step and
``q_d`` the probe's peak during it. The same formula for ``d = 0`` must give back rank 0's
measured records, byte for byte; where it does not, or under a memory limit (a rank may run out
of memory in its passes), every DP rank runs in full.

Microbatches: each stage runs its 1F1B warm-up and one steady forward-backward pair, which
reach every memory state of the full schedule (``stage_emulation.steady_microbatches``).

``every_rank=True`` runs every rank and every microbatch instead: the reference that
``tests/test_symbolic.py`` compares the shortcuts with, byte for byte.

Apart from ``symbolic.py`` because it drives ``stage_emulation.run_stage``, which itself uses the
symbolic backend's pieces.
"""

from __future__ import annotations

import dataclasses
import gc
import tempfile
from pathlib import Path
from typing import Sequence

from megatron_hooks.stage_emulation import freeze_what_is_imported, run_stage
from megatron_hooks.symbolic import fake_world


class StepProbe:
    """The memory around each optimizer step of one stage run (``stage_emulation._Stage.iteration``
    calls it): per iteration (peak before the step, bytes held at its start, peak during it).
    ``optimizer_only``: the run has no microbatch, only its steps (see the module docstring)."""

    def __init__(self, optimizer_only: bool) -> None:
        self.optimizer_only = optimizer_only
        self.steps: list[tuple[int, int, int | None]] = []
        self.hooks = self.backend = None
        self._before: tuple[int, int] = (0, 0)

    def attach(self, hooks, backend) -> None:
        self.hooks, self.backend = hooks, backend

    def before_step(self) -> None:
        self._before = (self.hooks.peak_so_far(), self.backend.allocated())
        if self.optimizer_only:  # nothing is open in a run without microbatches: the step's own peak
            self.backend.reset_peak()

    def after_step(self) -> None:
        self.steps.append((*self._before, self.backend.peak() if self.optimizer_only else None))


def _ranks_to_run(config, every_rank: bool, derive_dp: bool = False) -> list[tuple[int, int, int]]:
    """(TP, CP, DP) coordinates to run in full on each stage; see the module docstring."""
    if every_rank:
        return [(t, c, d) for d in range(config.dp) for c in range(config.cp) for t in range(config.tp)]
    dp_ranks = range(config.dp) if config.distributed_optimizer and not derive_dp else [0]
    return [(0, c, d) for d in dp_ranks for c in range(config.cp)]


def _derives_dp_ranks(config, every_rank: bool) -> bool:
    """Whether DP ranks other than 0 are derived from DP rank 0 (module docstring)."""
    return not every_rank and config.distributed_optimizer and config.dp > 1 and config.memory_limit_bytes is None


def _copies(config, cp_rank: int, dp_rank: int) -> list[tuple[int, int, int]]:
    """The (TP, CP, DP) coordinates whose records equal those of TP rank 0 at (cp_rank, dp_rank)."""
    dp_ranks = [dp_rank] if config.distributed_optimizer else range(config.dp)
    return [(tp_rank, cp_rank, other) for other in dp_ranks for tp_rank in range(config.tp)
            if (tp_rank, other) != (0, dp_rank)]


def run_symbolic(config, stages: Sequence[int], *, after_oom: str = "raise", every_rank: bool = False) -> list[Path]:
    """Profile ``stages`` of ``config`` (an ``stage_emulation.StageEmulation`` with
    ``backend="symbolic"``) in this process; returns every rank file written. With
    ``after_oom="continue"`` a rank that exceeds ``memory_limit_bytes`` is recorded and the others
    still run, as ``stage_emulation.run_stages`` does. ``every_rank`` runs every TP and DP rank instead
    of writing copies for the symmetric ones, and every microbatch (to check the shortcuts)."""
    from advisor.profiles import read_rank_file

    if every_rank:
        config = dataclasses.replace(config, every_microbatch=True)
    freeze_what_is_imported()
    derive = _derives_dp_ranks(config, every_rank)
    written = []
    for stage in stages:
        for tp_rank, cp_rank, dp_rank in _ranks_to_run(config, every_rank, derive):
            probe = StepProbe(optimizer_only=False) if derive else None
            path = _run_rank(config, stage, (tp_rank, cp_rank, dp_rank), after_oom, probe)
            written.append(path)
            if every_rank:
                continue
            profiles = {dp_rank: read_rank_file(path)}
            if derive:
                derived = _derived_dp_ranks(config, stage, cp_rank, profiles[0], probe.steps)
                if derived is None:  # the shortcut's premise failed its check: run them in full
                    derived = {d: read_rank_file(_run_rank(config, stage, (0, cp_rank, d), after_oom))
                               for d in range(1, config.dp)}
                for d, profile in derived.items():
                    written.append(_with_coords(config, profile, stage, (0, cp_rank, d)).write(config.output_dir))
                profiles.update(derived)
            for d, profile in profiles.items():
                for other in _copies(config, cp_rank, d):
                    written.append(_with_coords(config, profile, stage, other).write(config.output_dir))
    return written


def _run_rank(config, stage: int, coords: tuple[int, int, int], after_oom: str, probe=None) -> Path:
    """Run ``stage`` as the rank at (TP, CP, DP) ``coords`` in a fresh fake world; its rank file."""
    from megatron_hooks.recorder import is_out_of_memory

    tp_rank, cp_rank, dp_rank = coords
    rank = tp_rank + config.tp * (cp_rank + config.cp * dp_rank)  # Megatron's tp-cp-dp order
    with fake_world(config.tp, config.cp, config.dp, rank):
        try:
            return run_stage(config, stage, probe)
        except Exception as exc:
            if after_oom != "continue" or not is_out_of_memory(exc):
                raise
            return config.output_dir / _rank_file(config, stage, tp_rank, cp_rank, dp_rank)
        finally:
            gc.collect()


def _derived_dp_ranks(config, stage: int, cp_rank: int, base, base_steps) -> dict | None:
    """DP rank -> records of DP ranks 1.. of (``stage``, ``cp_rank``), derived from DP rank 0's
    (``base``, its probe's ``base_steps``) and each rank's optimizer-only run; None where rank
    0's own optimizer-only run does not give back ``base`` (module docstring)."""
    from advisor.profiles import read_rank_file

    if base.status != "ok":
        return None
    measured = {}
    with tempfile.TemporaryDirectory(prefix="optimizer-only-") as scratch:
        scratch_config = dataclasses.replace(config, output_dir=Path(scratch))
        for d in range(config.dp):
            probe = StepProbe(optimizer_only=True)
            profile = read_rank_file(_run_rank(scratch_config, stage, (0, cp_rank, d), "raise", probe))
            measured[d] = (profile, probe.steps)
    zero = measured[0][1]
    if _derived(base, base_steps, *measured[0], zero) != base:
        return None
    return {d: _derived(base, base_steps, profile, steps, zero) for d, (profile, steps) in measured.items() if d}


def _derived(base, base_steps, own, own_steps, zero_steps):
    """DP rank 0's records ``base`` with the optimizer bytes of ``own`` (an optimizer-only run of
    another DP rank) and the iteration peak of the module docstring; the header stays base's."""
    optimizer = {(layer.iteration, layer.name): layer.optimizer_bytes for layer in own.layers}
    layers = tuple(dataclasses.replace(layer, optimizer_bytes=optimizer[layer.iteration, layer.name])
                   for layer in base.layers)
    iterations = []
    for it, mine, (before_0, at_0, _), (_, at_d, rise_d), (_, at_z, _) in zip(
            base.iterations, own.iterations, base_steps, own_steps, zero_steps, strict=True):
        peak = max(before_0 + at_d - at_z, at_0 + rise_d - at_z)
        iterations.append(dataclasses.replace(it, optimizer_bytes=mine.optimizer_bytes, peak_allocated_bytes=peak))
    return dataclasses.replace(base, layers=layers, iterations=tuple(iterations))


def _with_coords(config, profile, stage: int, coords: tuple[int, int, int]):
    """``profile`` as the rank at (TP, CP, DP) ``coords`` of ``stage``."""
    tp_rank, cp_rank, dp_rank = coords
    header = dataclasses.replace(profile.header, rank=config.global_rank(stage, tp_rank, dp_rank, cp_rank),
                                 coords={"tp": tp_rank, "cp": cp_rank, "pp": stage, "dp": dp_rank})
    return dataclasses.replace(profile, header=header)


def _rank_file(config, stage: int, tp_rank: int, cp_rank: int, dp_rank: int) -> str:
    from advisor.profiles import rank_file_name

    return rank_file_name(config.global_rank(stage, tp_rank, dp_rank, cp_rank))
