"""Run a profiling campaign on the CPU: ``python -m megatron_hooks.campaign_runner CAMPAIGN --out DIR``.

``advisor profile run`` starts this module as a subprocess (the advisor core never imports
torch) and draws its progress from the events it prints: one JSON object per line on stdout
(``advisor.capture.campaign_run``: the schema, the loop, resuming, what counts as done). Anything
else this process or its libraries print goes to stderr.

Each campaign run is emulated stage by stage with real megatron-core modules
(``megatron_hooks.stage_emulation``, 1F1B order, two iterations as CAPTURE's profiling runs), into
``DIR/<run id>/``. torch and megatron-core are imported once: runs without TP or DP execute in
this process, one after another; runs with TP x DP > 1 in a pool of TP x DP spawned gloo
processes that lives as long as consecutive runs share their degrees. A stage that runs out of
memory (see ``--memory-limit``) is recorded and the run's other stages still run, so every rank
has its file; the run's outcome is "oom".

With ``--backend symbolic`` (``SymbolicExecutor``) every run is profiled in this process on fake
tensors (``megatron_hooks.symbolic``): the campaign's setup (dtype, distributed optimizer,
sequence parallelism) and CP as the user's Megatron-LM would run them, at the real model size,
with megatron-core's optimizer and the CUDA kernel stand-ins of the chosen layer spec.

On GPUs the same loop runs with another executor: ``python -m launch.campaign_runner`` starts
each run through torchrun and the user's Megatron-LM ``pretrain_gpt.py`` with the hooks
(``advisor profile run --megatron-lm DIR``).

Exit status: 0 when every run ended ok or oom, 1 when a run failed, 2 on bad input.
"""

from __future__ import annotations

import contextlib
import queue
import time
import uuid
from pathlib import Path

from advisor.capture.campaign import PROFILING_ITERATIONS
from advisor.memory import GIB

GRACE_S = 30.0
"""How long the other processes of a pool may take to report after one has failed."""


def _config(campaign: dict, run: dict, directory: Path, threads: int | None, memory_limit_bytes: int | None,
            **symbolic):
    """The StageEmulation of one campaign run (``symbolic``: backend and layer_spec, with the
    campaign's setup)."""
    from advisor.models import LlamaSpec
    from megatron_hooks.stage_emulation import StageEmulation

    setup = campaign.get("setup", {})
    if symbolic:
        symbolic.update(cp=run.get("cp", 1), sequence_parallel=bool(setup.get("sequence_parallel")),
                        distributed_optimizer=bool(setup.get("distributed_optimizer")),
                        bias_swiglu_fusion=setup.get("bias_swiglu_fusion", True))
    return StageEmulation(
        model=LlamaSpec(**campaign["model"]), layers_per_stage=tuple(run["layers_per_stage"]),
        seq_len=campaign["seq_len"], output_dir=directory, micro_batch_size=run["micro_batch_size"],
        num_microbatches=run["num_microbatches"], iterations=PROFILING_ITERATIONS, tp=run["tp"], dp=run["dp"],
        params_dtype=setup.get("params_dtype", "float32"), threads=threads,
        run_id=f"{run['id']}-{uuid.uuid4().hex[:8]}", memory_limit_bytes=memory_limit_bytes, **symbolic,
    )


def _pool_worker(rank: int, world: int, port: int, tp: int, threads: int | None, tasks, results) -> None:
    """One process of a TP x DP pool: set up once, then run every configuration it is sent."""
    from megatron_hooks.stage_emulation import process_group, quiet_megatron, run_stages

    quiet_megatron()

    with process_group(rank, world, port, tp, threads):
        while (config := tasks.get()) is not None:
            try:
                run_stages(config, range(config.pp), after_oom="continue")
                results.put((rank, None))
            except BaseException as exc:  # reported to the parent, which decides
                results.put((rank, f"{type(exc).__name__}: {exc}"[:500]))


class _Pool:
    """TP x DP spawned processes that run campaign runs of those degrees, one after the other."""

    def __init__(self, tp: int, dp: int, threads: int | None) -> None:
        import torch.multiprocessing as mp

        from megatron_hooks.stage_emulation import free_port

        context = mp.get_context("spawn")
        self.degrees, self.world = (tp, dp), tp * dp
        self.results = context.Queue()
        self.tasks = [context.Queue() for _ in range(self.world)]
        port = free_port()
        self.processes = [
            context.Process(target=_pool_worker, args=(rank, self.world, port, tp, threads, self.tasks[rank],
                                                       self.results), daemon=True)
            for rank in range(self.world)
        ]
        for process in self.processes:
            process.start()

    def run(self, config) -> None:
        for tasks in self.tasks:
            tasks.put(config)
        reported, errors, deadline = set(), {}, None
        while len(reported) < self.world:
            try:
                rank, error = self.results.get(timeout=1.0)
            except queue.Empty:
                dead = [(rank, p.exitcode) for rank, p in enumerate(self.processes) if not p.is_alive()]
                if dead:
                    self.close(kill=True)
                    raise RuntimeError(f"emulation process {dead[0][0]} of {self.world} died "
                                       f"(exit code {dead[0][1]})") from None
                if deadline is not None and time.monotonic() > deadline:
                    self.close(kill=True)
                    raise RuntimeError(next(iter(errors.values()))) from None
                continue
            reported.add(rank)
            if error:
                errors[rank] = error
                deadline = deadline or time.monotonic() + GRACE_S
        if errors:  # a rank failed for another reason than memory: its group may be out of step
            self.close(kill=True)
            raise RuntimeError(errors[min(errors)])

    def close(self, kill: bool = False) -> None:
        if not kill:
            for tasks in self.tasks:
                tasks.put(None)
        for process in self.processes:
            process.join(timeout=None if not kill else 0)
            if process.is_alive():
                process.kill()
                process.join()


class EmulateExecutor:
    """Campaign runs on the CPU with ``megatron_hooks.stage_emulation``; see the module docstring."""

    def __init__(self, *, threads: int | None = None, memory_limit_bytes: int | None = None) -> None:
        self.threads, self.memory_limit_bytes = threads, memory_limit_bytes
        self._local: contextlib.ExitStack | None = None
        self._pool: _Pool | None = None

    def run(self, campaign: dict, run: dict, directory: Path) -> None:
        from megatron_hooks.stage_emulation import free_port, process_group, run_stages

        config = _config(campaign, run, directory, self.threads, self.memory_limit_bytes)
        if config.tp * config.dp == 1:
            if self._local is None:
                self._local = contextlib.ExitStack()
                self._local.enter_context(process_group(0, 1, free_port(), 1, self.threads))
            run_stages(config, range(config.pp), after_oom="continue")
            return
        if self._pool is not None and self._pool.degrees != (config.tp, config.dp):
            self._pool.close()
            self._pool = None
        if self._pool is None:
            self._pool = _Pool(config.tp, config.dp, self.threads)
        try:
            self._pool.run(config)
        except RuntimeError:
            self._pool = None  # closed by run(); the next run starts a fresh pool
            raise

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._local is not None:
            self._local.close()
            self._local = None


class SymbolicExecutor:
    """Campaign runs on fake tensors in this process (``megatron_hooks.symbolic``), every rank."""

    def __init__(self, *, layer_spec: str, memory_limit_bytes: int | None = None) -> None:
        self.layer_spec, self.memory_limit_bytes = layer_spec, memory_limit_bytes

    def run(self, campaign: dict, run: dict, directory: Path) -> None:
        from megatron_hooks.symbolic_run import run_symbolic

        config = _config(campaign, run, directory, None, self.memory_limit_bytes, backend="symbolic",
                         layer_spec=self.layer_spec)
        run_symbolic(config, range(config.pp), after_oom="continue")

    def close(self) -> None:
        pass


def run(campaign: Path, out: Path, backend: str = "cpu", layer_spec: str | None = None, threads: int | None = None,
        memory_limit: float | None = None) -> int:
    """Run a campaign (``advisor profile run``'s options: ``memory_limit`` in GiB) into ``out``;
    returns the exit status (module docstring). Bad input raises AdvisorError before any work."""
    from advisor.capture.campaign_run import LAYER_SPECS, backend_fields, prepare, run_campaign, scan
    from advisor.errors import AdvisorError
    from megatron_hooks.stage_emulation import quiet_megatron

    document = prepare(campaign, out, backend=backend, layer_spec=layer_spec)  # bad input before any work
    if backend != "symbolic" and layer_spec:
        raise AdvisorError("--layer-spec is the symbolic backend's")
    # runs another backend made: refused before any work; the scan is the one the runs are chosen by
    states = scan(document, out, backend_fields(backend, layer_spec))
    quiet_megatron()
    limit = None if memory_limit is None else int(memory_limit * GIB)
    if backend == "symbolic":
        executor = SymbolicExecutor(layer_spec=layer_spec or LAYER_SPECS[0], memory_limit_bytes=limit)
    else:
        executor = EmulateExecutor(threads=threads, memory_limit_bytes=limit)
    return run_campaign(document, out, executor, states)


if __name__ == "__main__":  # the command line is the one CLI's (advisor.cli.runners)
    from advisor.cli.runners import cpu_runner

    cpu_runner(run).main(prog_name="python -m megatron_hooks.campaign_runner")
