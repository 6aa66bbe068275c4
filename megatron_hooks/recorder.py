"""One rank's profile file: the run's description, the hooks' records, and how the run ended.

``ProfileRecorder(hooks, run, directory)`` writes ``directory/rank{RANK:05d}.jsonl`` through
``advisor.profiles.RankFileWriter`` (schema ``megatron-4d-advisor/profile``), appending as
the run goes: the header when it starts, each iteration's layer records and iteration record in
one write when the iteration ends, and the end record when the run ends ("ok") or fails ("oom"
or "error", with ``where`` saying how far it got: iteration, microbatch, forward or backward, and
module). An iteration costs the same whatever came before it (the file was rewritten whole after
every iteration, a cost that grew with the square of the iterations; ``benchmarks/
bench_recorder.py``), and nothing is kept in memory. A run killed at any point (Ctrl-C too)
leaves every completed iteration readable, its status "running". Layer records are written for the first
``layer_iterations`` iterations (``advisor.limits.PROFILE_LAYER_ITERATIONS``); every iteration
has its iteration record, so a 100,000-iteration training adds about 300 bytes per iteration.

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
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import torch

from advisor import limits
from advisor.models import LlamaSpec
from advisor.parallel import ParallelConfig
from advisor.profiles import RankFileWriter, RankHeader
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
    asked_iterations: int | None = None
    """Iterations Megatron's training loop was asked to run in this process (``asked_iterations``);
    None where no such loop drives the run (the emulators)."""


def swiglu_fusion(config) -> bool:
    """Whether megatron-core's MLP runs the fused ``bias_swiglu_impl`` (core_v0.15.2 and
    core_v0.19.0 transformer/mlp.py ``MLP.forward``: ``config.bias_activation_fusion``, not
    ``use_te_activation_func``, SiLU with a GLU), which keeps FC1's output alone, rather than the
    unfused ``glu``, which also keeps x_linear + offset and SiLU's output. Megatron-LM sets
    ``bias_activation_fusion`` from --bias-swiglu-fusion, its default (training/arguments.py,
    core_transformer_config_from_args); the emulator's model turns it off (megatron_hooks.model)."""
    return bool(config.bias_activation_fusion and not getattr(config, "use_te_activation_func", False)
                and config.gated_linear_unit and config.activation_func is torch.nn.functional.silu)


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
    layer_iterations: int = limits.PROFILE_LAYER_ITERATIONS
    """Iterations whose per-layer records are written (every iteration gets its iteration record)."""

    def __post_init__(self) -> None:
        self.directory = Path(self.directory)
        self.status = "running"
        self.writer: RankFileWriter | None = None
        self.peak_allocated_bytes = 0
        self.peak_reserved_bytes: int | None = None
        """The highest iteration peaks so far (the run's, once it ends)."""

    def header(self) -> RankHeader:
        """RunInfo's fields (same names in RankHeader), and what the hooks and this process know.
        The in-flight count is the schedule's; each iteration record carries the hooks' count."""
        run, hooks = self.run, self.hooks
        given = {f.name: getattr(run, f.name) for f in fields(run)}
        given.update(layers_per_stage=tuple(run.layers_per_stage), coords=dict(run.coords))
        return RankHeader(
            **given, created=self.created, backend=hooks.backend.name, device=hooks.backend.device,
            kernels=hooks.backend.kernels,
            torch_version=torch.__version__, megatron_core_version=megatron_core_version(),
            stage_layers=hooks.stage_layers, first_stage=hooks.first_stage, last_stage=hooks.last_stage,
            swiglu_fusion=swiglu_fusion(hooks.models[0].config),
        )

    @property
    def iterations(self) -> int:
        """Iterations recorded so far."""
        return self.writer.iterations if self.writer else 0

    def start(self) -> "ProfileRecorder":
        self.directory.mkdir(parents=True, exist_ok=True)
        self.writer = RankFileWriter(self.directory, self.header()).start()
        return self

    @contextlib.contextmanager
    def iteration(self, number: int, *, optimizer=None) -> Iterator[StepResult]:
        """Measure one training iteration; on an exception, write the failure and re-raise it."""
        if self.writer is None:
            self.start()
        result = StepResult()
        self.hooks.begin_iteration(number, optimizer=optimizer)
        try:
            yield result
        except KeyboardInterrupt:
            self.interrupt()
            raise
        except BaseException as exc:
            self.fail(exc)
            raise
        measurement = self.hooks.end_iteration(loss=result.loss)
        self._fold_peaks(measurement.iteration)
        layers = measurement.layers if self.writer.iterations < self.layer_iterations else ()
        in_flight = self.hooks.in_flight_microbatches or None
        # After the first iteration the backend knows its device by name (a CUDA GPU's model).
        header = self.header() if self.writer.iterations == 0 else None
        self.writer.append(layers, replace(measurement.iteration, in_flight_microbatches=in_flight), header)

    def _fold_peaks(self, iteration) -> None:
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, iteration.peak_allocated_bytes)
        if iteration.peak_reserved_bytes is not None:
            self.peak_reserved_bytes = max(self.peak_reserved_bytes or 0, iteration.peak_reserved_bytes)

    def fail(self, exc: BaseException) -> None:
        """Record how the run died and how far it got (the hooks' position)."""
        where = self.hooks.where
        self.hooks.abort()
        self.status = "oom" if is_out_of_memory(exc) else "error"
        message = str(exc).strip().splitlines()
        error = f"{type(exc).__name__}: {message[0] if message else ''}"[:500]
        if self.writer is None:
            self.start()
        self.writer.end(self.status, error, where)

    def interrupt(self) -> None:
        """Ctrl-C (and SIGTERM where the runner turns it into one) is a kill, not a failure: no end
        record, so the file reads "running", as after SIGKILL, and ``finish`` leaves it so. Audit:
        Ctrl-C in 'advisor profile run' recorded the rank "error" (KeyboardInterrupt), and
        'advisor profile show' and 'recommend' reported a failed run where none had failed."""
        self.hooks.abort()
        self.status = "interrupted"

    def finish(self) -> Path:
        """End the file: "ok", unless an iteration failed (whose end record is written) or was
        interrupted (the file stays "running")."""
        if self.writer is None:
            self.start()
        if self.status == "running":
            self.status = "ok"
            return self.writer.end("ok")
        return self.writer.path
