"""One rank's profile file: the run's description, the hooks' records, and how the run ended.

``ProfileRecorder(hooks, run, directory)`` writes ``directory/rank{RANK:05d}.jsonl`` through
``advisor.profiles.RankProfile.write`` (schema ``megatron-4d-advisor/profile`` v1, atomic):
once when it starts (status "running", no iterations), again after every iteration, and a last
time when the run ends ("ok") or fails ("oom" or "error", with ``where`` saying how far it got:
iteration, microbatch, forward or backward, and module). A run killed between two writes
leaves the previous file, which is valid and says "running".

    hooks = LayerMemoryHooks(model_chunks, optimizer=optimizer).install()
    recorder = ProfileRecorder(hooks, run_info, "profiles/run-1").start()
    for it in range(1, iterations + 1):
        with recorder.iteration(it) as step:
            ...  # forward, backward, optimizer step
            step.loss = loss.item()
    recorder.finish()
    hooks.remove()
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import torch

from advisor.models import LlamaSpec
from advisor.parallel import ParallelConfig
from advisor.profiles import IterationRecord, LayerRecord, RankHeader, RankProfile
from megatron_hooks.hooks import LayerMemoryHooks


@dataclass(frozen=True, kw_only=True, slots=True)
class RunInfo:
    """What the hooks cannot see in the model: the run, and this rank's place in it (the
    header fields of ``advisor.profiles.RankHeader`` that only the caller knows)."""

    run_id: str
    """The same on every rank of one run."""
    model: LlamaSpec
    parallel: ParallelConfig
    seq_len: int
    global_batch_size: int | None
    num_microbatches: int
    """Microbatches per iteration on this rank."""
    layers_per_stage: tuple[int, ...]
    """Decoder layers on each pipeline stage, first to last."""
    rank: int
    world_size: int
    coords: dict[str, int]
    """This rank's tp, cp, pp and dp indices."""
    in_flight_microbatches: int
    """What the schedule should hold at once on this stage; the measured maximum replaces it."""
    params_dtype: str = "float32"
    layer_spec: str = "local"
    sequence_parallel: bool = False
    recompute: str = "none"
    distributed_optimizer: bool = False
    emulated: bool = False


def megatron_core_version() -> str:
    from megatron.core.package_info import __version__

    return __version__


def is_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


@dataclass(slots=True)
class StepResult:
    """Set ``loss`` inside an ``iteration()`` block (leave it None off the last stage)."""

    loss: float | None = None


@dataclass(eq=False)
class ProfileRecorder:
    hooks: LayerMemoryHooks
    run: RunInfo
    directory: Path
    created: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))

    def __post_init__(self) -> None:
        self.directory = Path(self.directory)
        self.layers: list[LayerRecord] = []
        self.iterations: list[IterationRecord] = []
        self.status, self.error, self.failed_where = "running", None, None

    def header(self) -> RankHeader:
        """RunInfo's fields (same names in RankHeader), and what the hooks and this process know."""
        run, hooks = self.run, self.hooks
        given = {f.name: getattr(run, f.name) for f in fields(run)}
        given.update(layers_per_stage=tuple(run.layers_per_stage), coords=dict(run.coords),
                     in_flight_microbatches=hooks.in_flight_microbatches or run.in_flight_microbatches)
        return RankHeader(
            **given, created=self.created, backend=hooks.backend.name, device=hooks.backend.device,
            kernels=hooks.backend.kernels,
            torch_version=torch.__version__, megatron_core_version=megatron_core_version(),
            stage_layers=hooks.stage_layers, first_stage=hooks.first_stage, last_stage=hooks.last_stage,
        )

    def write(self) -> Path:
        profile = RankProfile(header=self.header(), layers=tuple(self.layers), iterations=tuple(self.iterations),
                              status=self.status, error=self.error, where=self.failed_where)
        self.directory.mkdir(parents=True, exist_ok=True)
        return profile.write(self.directory)

    def start(self) -> "ProfileRecorder":
        self.write()
        return self

    @contextlib.contextmanager
    def iteration(self, number: int, *, optimizer=None) -> Iterator[StepResult]:
        """Measure one training iteration; on an exception, write the failure and re-raise it."""
        result = StepResult()
        self.hooks.begin_iteration(number, optimizer=optimizer)
        try:
            yield result
        except BaseException as exc:
            self.fail(exc)
            raise
        measurement = self.hooks.end_iteration(loss=result.loss)
        self.layers += measurement.layers
        self.iterations.append(measurement.iteration)
        self.write()

    def fail(self, exc: BaseException) -> None:
        """Record how the run died and how far it got (the hooks' position)."""
        where = self.hooks.where
        self.hooks.abort()
        self.status = "oom" if is_out_of_memory(exc) else "error"
        message = str(exc).strip().splitlines()
        self.error = f"{type(exc).__name__}: {message[0] if message else ''}"[:500]
        self.failed_where = where
        self.write()

    def finish(self) -> Path:
        if self.status == "running":
            self.status = "ok"
        return self.write()
