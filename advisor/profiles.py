"""Layer-profile records: the schema, the reader, and the one serialiser.

``megatron_hooks`` writes one JSON Lines file per rank, ``rank{RANK:05d}.jsonl``, into a run
directory; the advisor reads them without torch. Schema ``megatron-4d-advisor/profile``,
version 4 (versions 1 to 3 are read too: see below). Every line is one JSON object with a
``type``:

``header`` (the first line) identifies the run and this rank:
    schema, version, run_id, created (ISO 8601), backend ("cuda" | "cpu" | "symbolic": fake
    tensors that carry shapes and dtypes but no storage, megatron_hooks/symbolic.py), device,
    kernels ("cuda": what a CUDA run executes, measured on CUDA or stood in for on fake tensors
    | "cpu": torch's CPU paths), torch_version, megatron_core_version, emulated (true when a
    pipeline stage was emulated rather than run by Megatron's schedule), params_dtype ("float32" | "bfloat16" |
    "float16": the dtype of weights and activations), layer_spec ("local": unfused attention
    that keeps the s x s scores | "transformer_engine"), sequence_parallel, recompute
    ("none" | "selective" | "full"), distributed_optimizer, model (LlamaSpec fields),
    parallel (tp, cp, pp, dp, mbs, vpp of this rank's stage), seq_len, global_batch_size,
    num_microbatches (per iteration, on this rank), layers_per_stage (the whole pipeline's
    layer counts), rank, world_size, coords (this rank's tp, cp, pp, dp indices),
    stage_layers (global 1-based layer numbers on this rank, as Megatron's layer_number),
    first_stage, last_stage, in_flight_microbatches (the most microbatches whose activations
    the schedule keeps on this stage at once), asked_iterations (v3: the iterations Megatron's
    training loop was asked to run in this process, ``args.train_iters`` less ``args.iteration``
    it resumed at, --train-samples counted as Megatron's ``update_train_iters`` counts them; null
    where unknown: a run not driven by Megatron's loop, the emulators, or a file before v3). A run
    that Megatron ends early itself (--exit-interval, --exit-duration-in-mins, a signal with
    --exit-signal-handler) ends "ok" with fewer iterations than this. swiglu_fusion (v4: whether
    the model's SwiGLU runs megatron-core's fused ``bias_swiglu_impl``, which keeps FC1's output
    alone, or the unfused ``glu`` of transformer/mlp.py, which also keeps x_linear + offset and
    SiLU's output: Megatron-LM's --bias-swiglu-fusion, its default, against
    --no-bias-swiglu-fusion; false without SwiGLU; null where unknown, as in a file before v4).
``layer`` (per module, per iteration): iteration, name (the module path, for example
    "decoder.layers.3"), kind ("embedding" | "decoder" | "output"), layer_number (global,
    1-based; null for embedding and output), parameter_bytes, gradient_bytes,
    optimizer_bytes (this rank's share), activation_bytes (kept for backward by one
    microbatch), forward_peak_bytes and backward_peak_bytes (the transient rise above the
    level at the module's entry), forward_time_s and backward_time_s (seconds one
    microbatch's forward / backward pass spends in the module, the mean over the iteration's
    microbatches: CUDA events on a GPU, wall time on the CPU; null under the symbolic backend,
    which computes nothing).
``iteration``: iteration, parameter_bytes, gradient_bytes, optimizer_bytes (static memory
    after the step), peak_allocated_bytes, peak_reserved_bytes and alloc_retries (null where
    the backend has none), step_time_s, loss (null off the last stage), in_flight_microbatches
    (optional: the most microbatches the hooks saw held at once so far; it replaces the header's
    expectation when the file is read).
``end`` (the last line): status ("ok" | "oom" | "error" | "running"), iterations (completed),
    error and where (null unless the run failed; where says how far it got).

Memory is in bytes. Version 1 files have no ``kernels`` (read as "cuda" on the CUDA backend,
"cpu" otherwise) and no per-layer times (read as null); version 1 and 2 files have no
``asked_iterations`` (read as null); files before version 4 have no ``swiglu_fusion`` (read as null).

The file is written as the run goes (``RankFileWriter``): the header when the rank starts, then
per iteration its layer records followed by its iteration record, appended in one write, then
the end record. The cost of an iteration does not grow with the iterations before it, and a run
killed at any point leaves every completed iteration readable: a file without an end record is a
run still "running" (or killed), a cut last line is skipped, and the layer records of an
iteration that never got its iteration record are dropped. Layer records are written for the
first ``advisor.limits.PROFILE_LAYER_ITERATIONS`` iterations (per-layer memory is steady from
the second); every iteration has its iteration record.

The reader (``read_rank_file``, ``load_run``) is bounded (``advisor.fileio.JsonLines``: regular
files, ``limits.RANK_FILE_BYTES``) and checks what the file says against itself, and the files of
a run against each other, with one error naming the file (and line) and the field.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Iterable, Literal, get_args

from advisor import limits
from advisor.errors import AdvisorError
from advisor.fileio import JsonLines, atomic_write_text
from advisor.options.training import Recompute
from advisor.models import LlamaSpec
from advisor.parallel import ParallelConfig, world_size_problem

SCHEMA = "megatron-4d-advisor/profile"
VERSION = 4
READABLE_VERSIONS = (1, 2, 3, 4)
LayerKind = Literal["embedding", "decoder", "output"]
Status = Literal["ok", "oom", "error", "running"]
Backend = Literal["cuda", "cpu", "symbolic"]
Kernels = Literal["cuda", "cpu"]
ParamsDtype = Literal["float32", "bfloat16", "float16"]
PARAMS_DTYPES: tuple[str, ...] = get_args(ParamsDtype)
LayerSpec = Literal["local", "transformer_engine"]


class ProfileError(AdvisorError):
    """A profile file or directory that cannot be used, with the file and line named."""


def rank_file_name(rank: int) -> str:
    return f"rank{rank:05d}.jsonl"


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerRecord:
    iteration: int
    name: str
    kind: LayerKind
    layer_number: int | None
    parameter_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    forward_peak_bytes: int
    backward_peak_bytes: int
    forward_time_s: float | None = None
    backward_time_s: float | None = None

    @property
    def static_bytes(self) -> int:
        return self.parameter_bytes + self.gradient_bytes + self.optimizer_bytes


@dataclass(frozen=True, kw_only=True, slots=True)
class IterationRecord:
    iteration: int
    parameter_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int | None = None
    alloc_retries: int | None = None
    step_time_s: float | None = None
    loss: float | None = None
    in_flight_microbatches: int | None = None

    @property
    def static_bytes(self) -> int:
        return self.parameter_bytes + self.gradient_bytes + self.optimizer_bytes


@dataclass(frozen=True, kw_only=True, slots=True)
class RankHeader:
    run_id: str
    created: str
    backend: Backend
    device: str
    kernels: Kernels
    torch_version: str
    megatron_core_version: str
    emulated: bool
    params_dtype: ParamsDtype
    layer_spec: LayerSpec
    sequence_parallel: bool
    recompute: Recompute
    distributed_optimizer: bool
    model: LlamaSpec
    parallel: ParallelConfig
    seq_len: int
    global_batch_size: int | None
    num_microbatches: int
    layers_per_stage: tuple[int, ...]
    rank: int
    world_size: int
    coords: dict[str, int]
    stage_layers: tuple[int, ...]
    first_stage: bool
    last_stage: bool
    in_flight_microbatches: int
    asked_iterations: int | None = None
    """Iterations Megatron's training loop was asked to run here (None: unknown, see the module
    docstring); a run that ended ok with fewer stopped early (``RankProfile.stopped_early``)."""
    swiglu_fusion: bool | None = None
    """Whether the SwiGLU ran fused (Megatron-LM's --bias-swiglu-fusion); None: unknown (a file
    before v4)."""

    def to_dict(self) -> dict:
        return {
            "type": "header",
            "schema": SCHEMA,
            "version": VERSION,
            **{name: getattr(self, name) for name in self.__dataclass_fields__ if name not in ("model", "parallel")},
            "model": self.model.to_dict(),
            "parallel": self.parallel.to_dict(),
            "layers_per_stage": list(self.layers_per_stage),
            "stage_layers": list(self.stage_layers),
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class RankProfile:
    """Everything one rank recorded in one run."""

    header: RankHeader
    layers: tuple[LayerRecord, ...] = ()
    iterations: tuple[IterationRecord, ...] = ()
    status: Status = "running"
    error: str | None = None
    where: str | None = None
    path: Path | None = field(default=None, compare=False)

    @property
    def element_bytes(self) -> int:
        return 4 if self.header.params_dtype == "float32" else 2

    @property
    def peak_allocated_bytes(self) -> int | None:
        """PM of CAPTURE (seed 000, Section III-A): the peak over the recorded iterations."""
        return max((it.peak_allocated_bytes for it in self.iterations), default=None)

    def layers_of(self, iteration: int) -> tuple[LayerRecord, ...]:
        return tuple(layer for layer in self.layers if layer.iteration == iteration)

    @property
    def stopped_early(self) -> bool:
        """Ended ok with fewer iterations than it was asked for: Megatron's own --exit-interval,
        --exit-duration-in-mins or --exit-signal-handler stopped it (``training.py``, ``train``)."""
        asked = self.header.asked_iterations
        return self.status == "ok" and asked is not None and len(self.iterations) < asked

    def to_jsonl(self) -> str:
        """The whole file, as ``RankFileWriter`` appends it: header, per iteration its layer records
        and its iteration record, end."""
        lines = [_line(self.header.to_dict())]
        grouped = _layers_by_iteration(self.layers)
        for it in self.iterations:
            lines.append(iteration_lines(grouped.get(it.iteration, ()), it))
        lines.append(_line(end_record(self.status, len(self.iterations), self.error, self.where)))
        return "".join(lines)

    def write(self, directory: str | Path) -> Path:
        """Write the whole file atomically to ``directory/rank{RANK:05d}.jsonl``."""
        return atomic_write_text(Path(directory) / rank_file_name(self.header.rank), self.to_jsonl())


def _line(record: dict) -> str:
    return json.dumps(record, allow_nan=False) + "\n"


def iteration_lines(layers: Iterable[LayerRecord], iteration: IterationRecord) -> str:
    """One iteration as the file holds it: its layer records, then its iteration record."""
    return "".join(_line({"type": "layer", **asdict(layer)}) for layer in layers) + \
        _line({"type": "iteration", **asdict(iteration)})


def end_record(status: Status, iterations: int, error: str | None = None, where: str | None = None) -> dict:
    return {"type": "end", "status": status, "iterations": iterations, "error": error, "where": where}


class RankFileWriter:
    """One rank's file, appended as the run goes (see the module docstring): ``start`` writes the
    header (replacing an older file of the rank, atomically), ``append`` one iteration in one
    write, ``end`` the end record. A crash leaves every appended iteration readable."""

    def __init__(self, directory: str | Path, header: RankHeader) -> None:
        self.path = Path(directory) / rank_file_name(header.rank)
        self.header = header
        self.iterations = 0
        self._fd: int | None = None

    def start(self) -> "RankFileWriter":
        """Write the header (atomically: a reader sees a whole line or the file before)."""
        atomic_write_text(self.path, _line(self.header.to_dict()))
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        return self

    def _append(self, text: str) -> None:
        if self._fd is None:
            raise RuntimeError(f"{self.path}: the rank file is not open (start() it first; end() closes it)")
        view = memoryview(text.encode("utf-8"))
        while view:
            view = view[os.write(self._fd, view):]

    def append(self, layers: Iterable[LayerRecord], iteration: IterationRecord, header: RankHeader | None = None
               ) -> None:
        """Append one iteration. ``header``, with the first iteration only, replaces the header
        written at the start (what became known when the rank began its work: a GPU's name)."""
        if header is not None and header != self.header:
            if self.iterations:
                raise ValueError(f"{self.path}: the header can change only before the first iteration")
            self.header = header
            os.close(self._fd)
            self.start()
        self._append(iteration_lines(layers, iteration))
        self.iterations += 1

    def end(self, status: Status, error: str | None = None, where: str | None = None) -> Path:
        self._append(_line(end_record(status, self.iterations, error, where)))
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = None
        return self.path


@dataclass(frozen=True, slots=True)
class ProfileRun:
    """All rank files of one run directory."""

    directory: Path
    ranks: tuple[RankProfile, ...]

    @property
    def header(self) -> RankHeader:
        return self.ranks[0].header

    @property
    def status(self) -> Status:
        for status in ("oom", "error", "running"):
            if any(rank.status == status for rank in self.ranks):
                return status
        return "ok"

    @property
    def missing_ranks(self) -> tuple[int, ...]:
        """Ranks of the run's world that have no file here."""
        present = {rank.header.rank for rank in self.ranks}
        return tuple(rank for rank in range(self.header.world_size) if rank not in present)


# --- reading ----------------------------------------------------------------------------

_NON_NEGATIVE = ("_bytes", "_s", "_retries", "iteration", "_microbatches")
"""Fields that count something (bytes, seconds, retries, iterations, microbatches): never negative."""


def _field(record: dict, name: str, kind: type | tuple, where: str, nullable: bool = False):
    if name not in record:
        raise ProfileError(f"{where}: missing field {name!r}")
    value = record[name]
    if value is None and nullable:
        return None
    if isinstance(value, float) and not math.isfinite(value):
        raise ProfileError(f"{where}: field {name!r} is not finite: {value!r}")
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise ProfileError(f"{where}: field {name!r} has the wrong type: {_short(value)}")
    if name.endswith(_NON_NEGATIVE) and isinstance(value, (int, float)) and value < 0:
        raise ProfileError(f"{where}: field {name!r} is negative: {value!r}")
    return value


def _short(value: object) -> str:
    """A rank file's value in JSON's words, shortened (``limits.json_text``): a header without its
    version read 'profile schema version None', Python's word for JSON's null."""
    return limits.json_text(value)


def _dataclass_from(cls, record: dict, where: str, nullable: tuple[str, ...] = ()):
    kinds = {"int": int, "str": str, "float": (int, float), "int | None": int, "float | None": (int, float),
             "LayerKind": str}
    values = {}
    for name, spec in cls.__dataclass_fields__.items():
        if name not in record and spec.default is None:  # an optional field a writer may leave out
            continue
        values[name] = _field(record, name, kinds[spec.type], where, nullable=name in nullable or "None" in spec.type)
    return cls(**values)


def _int_list(record: dict, name: str, where: str, low: int, high: int) -> tuple[int, ...]:
    values = _field(record, name, list, where)
    if len(values) > limits.MODEL["num_layers"].high or not all(
            isinstance(v, int) and not isinstance(v, bool) and low <= v <= high for v in values):
        raise ProfileError(f"{where}: field {name!r} must be a list of integers from {low} to {high}, "
                           f"got {_short(values)}")
    return tuple(values)


def _bounded(record: dict, name: str, where: str, bound: limits.Bound, nullable: bool = False) -> int | None:
    value = _field(record, name, int, where, nullable)
    if value is not None and not bound.low <= value <= bound.high:
        raise ProfileError(f"{where}: field {name!r} must be from {bound.low:g} to {int(bound.high):,}, got {value}")
    return value


_COORDS = ("tp", "cp", "pp", "dp")


def _parse_header(record: dict, where: str) -> RankHeader:
    if record.get("schema") != SCHEMA:
        raise ProfileError(f"{where}: not a profile file (schema {_short(record.get('schema'))}, expected {SCHEMA!r})")
    version = record.get("version")
    if version not in READABLE_VERSIONS or isinstance(version, bool):
        raise ProfileError(
            f"{where}: profile schema version {_short(version)}; this advisor reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}"
        )
    if version == 1:  # before kernels and per-layer times: what a version 1 writer ran
        record = {"kernels": "cuda" if record.get("backend") == "cuda" else "cpu", **record}
    try:
        model = LlamaSpec(**_field(record, "model", dict, where))
        parallel = ParallelConfig(**_field(record, "parallel", dict, where))
    except TypeError as exc:
        raise ProfileError(f"{where}: malformed model or parallel section: {exc}") from None
    except AdvisorError as exc:
        raise ProfileError(f"{where}: {exc}") from None
    choices = {"backend": Backend, "kernels": Kernels, "params_dtype": ParamsDtype, "layer_spec": LayerSpec,
               "recompute": Recompute}
    chosen = {}
    for name, kind in choices.items():
        allowed = get_args(kind)
        chosen[name] = _field(record, name, str, where)
        if chosen[name] not in allowed:
            raise ProfileError(f"{where}: {name} must be one of {', '.join(allowed)}, got {_short(chosen[name])}")
    layers = model.num_layers
    coords = _field(record, "coords", dict, where)
    if set(coords) != set(_COORDS) or not all(isinstance(v, int) and not isinstance(v, bool) for v in coords.values()):
        raise ProfileError(f"{where}: field 'coords' must give integer tp, cp, pp and dp indices, got {_short(coords)}")
    header = RankHeader(
        run_id=_field(record, "run_id", str, where),
        created=_field(record, "created", str, where),
        device=_field(record, "device", str, where),
        torch_version=_field(record, "torch_version", str, where),
        megatron_core_version=_field(record, "megatron_core_version", str, where),
        emulated=_field(record, "emulated", bool, where),
        sequence_parallel=_field(record, "sequence_parallel", bool, where),
        distributed_optimizer=_field(record, "distributed_optimizer", bool, where),
        **chosen,
        model=model,
        parallel=parallel,
        seq_len=_bounded(record, "seq_len", where, limits.SEQ_LEN),
        global_batch_size=_bounded(record, "global_batch_size", where, limits.GLOBAL_BATCH, nullable=True),
        num_microbatches=_bounded(record, "num_microbatches", where, limits.GLOBAL_BATCH),
        layers_per_stage=_int_list(record, "layers_per_stage", where, 0, layers),
        rank=_bounded(record, "rank", where, limits.Bound(0, limits.GPUS.high - 1, "")),
        world_size=_bounded(record, "world_size", where, limits.GPUS),
        coords=dict(coords),
        stage_layers=_int_list(record, "stage_layers", where, 1, layers),
        first_stage=_field(record, "first_stage", bool, where),
        last_stage=_field(record, "last_stage", bool, where),
        in_flight_microbatches=_bounded(record, "in_flight_microbatches", where, limits.GLOBAL_BATCH),
        # v3; v1 and v2 files did not record it: unknown
        asked_iterations=(_bounded(record, "asked_iterations", where, limits.ITERATION, nullable=True)
                          if version >= 3 else None),
        # v4; files before it did not record it: unknown
        swiglu_fusion=_field(record, "swiglu_fusion", bool, where, nullable=True) if version >= 4 else None,
    )
    _check_header(header, where)
    return header


def _check_header(h: RankHeader, where: str) -> None:
    """What a header says about this rank agrees with itself: the world is TP x CP x PP x DP, the
    rank and its coordinates lie in it, the stages place the model's layers, and this rank's
    layers are its stage's (with VPP, its chunks': increasing, without gaps per chunk)."""
    p = h.parallel
    if problem := world_size_problem(h.world_size, p.tp, p.cp, p.pp, p.dp, key="world_size"):
        raise ProfileError(f"{where}: {problem}")
    if h.rank >= h.world_size:
        raise ProfileError(f"{where}: rank {h.rank} is not in a world of {h.world_size}")
    for name in _COORDS:
        size = getattr(p, name)
        if not 0 <= h.coords[name] < size:
            raise ProfileError(f"{where}: coords {name} = {h.coords[name]} is out of range for {name.upper()} {size}")
    if len(h.layers_per_stage) != p.pp or sum(h.layers_per_stage) != h.model.num_layers:
        raise ProfileError(f"{where}: layers_per_stage {list(h.layers_per_stage)} does not place {h.model.num_layers} "
                           f"layers on PP {p.pp} stages")
    stage = h.coords["pp"]
    if (h.first_stage, h.last_stage) != (stage == 0, stage == p.pp - 1):
        raise ProfileError(f"{where}: first_stage/last_stage ({h.first_stage}/{h.last_stage}) disagree with pipeline "
                           f"stage {stage} of {p.pp}")
    if p.vpp == 1:
        first = sum(h.layers_per_stage[:stage]) + 1
        expected = tuple(range(first, first + h.layers_per_stage[stage]))
        if h.stage_layers != expected:
            raise ProfileError(f"{where}: stage_layers {_short(list(h.stage_layers))} are not stage {stage}'s layers "
                               f"{first}..{first + h.layers_per_stage[stage] - 1} (layers_per_stage "
                               f"{list(h.layers_per_stage)})")
    elif len(set(h.stage_layers)) != len(h.stage_layers) or list(h.stage_layers) != sorted(h.stage_layers):
        raise ProfileError(f"{where}: stage_layers {_short(list(h.stage_layers))} must be increasing layer numbers")


def _parse_layer(record: dict, where: str, header: RankHeader) -> LayerRecord:
    layer = _dataclass_from(LayerRecord, record, where)
    if layer.kind not in get_args(LayerKind):
        raise ProfileError(f"{where}: unknown layer kind {_short(layer.kind)}")
    if layer.kind == "decoder" and layer.layer_number not in header.stage_layers:
        raise ProfileError(f"{where}: decoder layer_number {layer.layer_number!r} is not one of this rank's layers "
                           f"{_short(list(header.stage_layers))}")
    return layer


def read_rank_file(path: str | Path) -> RankProfile:
    """Read and validate one rank's file (see the module docstring for what a killed run leaves)."""
    path = Path(path)
    lines = JsonLines(path, max_bytes=limits.RANK_FILE_BYTES, what="profile rank file")
    header, end, layers, iterations, modules = None, None, [], [], set()
    try:
        for number, record in lines:
            where = f"{path}:{number}"
            if not isinstance(record, dict) or not isinstance(record.get("type"), str):
                raise ProfileError(f"{where}: expected an object with a 'type'")
            kind = record["type"]
            if header is None:
                if kind != "header":
                    raise ProfileError(f"{where}: the first record must be the header, got {_short(kind)}")
                header = _parse_header(record, where)
            elif end is not None:
                raise ProfileError(f"{where}: a {_short(kind)} record after the end record")
            elif kind == "layer":
                layer = _parse_layer(record, where, header)
                if (layer.iteration, layer.name) in modules:
                    raise ProfileError(f"{where}: {layer.name} of iteration {layer.iteration} is recorded twice")
                modules.add((layer.iteration, layer.name))
                layers.append(layer)
            elif kind == "iteration":
                it = _dataclass_from(IterationRecord, record, where)
                if iterations and it.iteration <= iterations[-1].iteration:
                    raise ProfileError(f"{where}: iteration {it.iteration} follows iteration {iterations[-1].iteration}: "
                                       f"iterations are recorded once each, in order")
                iterations.append(it)
            elif kind == "end":
                end = (record, where)
            else:
                raise ProfileError(f"{where}: unknown record type {_short(kind)}")
    except ProfileError:
        raise
    except AdvisorError as exc:  # the reader's bounds: size, line length, UTF-8, JSON
        raise ProfileError(str(exc)) from None
    if header is None:
        raise ProfileError(f"{path}: empty file" + (" (its one line was cut short)" if lines.truncated_line else ""))
    status, error, failed_where = "running", None, None  # no end record: still running, or killed
    if end is not None:
        record, where = end
        status = _field(record, "status", str, where)
        if status not in get_args(Status):
            raise ProfileError(f"{where}: unknown status {_short(status)}")
        count = _field(record, "iterations", int, where)
        if count != len(iterations):
            raise ProfileError(f"{where}: the end record counts {count} iterations, the file has {len(iterations)}")
        error = _field(record, "error", str, where, nullable=True)
        failed_where = _field(record, "where", str, where, nullable=True)
    layers = _completed_iterations_only(path, layers, iterations, status)
    measured = [it.in_flight_microbatches for it in iterations if it.in_flight_microbatches is not None]
    if measured:
        header = replace(header, in_flight_microbatches=measured[-1])
    profile = RankProfile(header=header, layers=tuple(layers), iterations=tuple(iterations), status=status,
                          error=error, where=failed_where, path=path)
    check_complete(profile)
    return profile


def _completed_iterations_only(path: Path, layers: list[LayerRecord], iterations: list[IterationRecord],
                               status: Status) -> list[LayerRecord]:
    """The layer records of recorded iterations. Those of the iteration after the last one are what
    a killed or failed run leaves of the iteration it was in: dropped. Any other is an error."""
    recorded = {it.iteration for it in iterations}
    stray = sorted({layer.iteration for layer in layers} - recorded)
    if not stray:
        return layers
    last = iterations[-1].iteration if iterations else -1
    if status == "ok" or len(stray) > 1 or stray[0] < last:
        raise ProfileError(f"{path}: layer records of iteration {stray[0]}, which has no iteration record")
    return [layer for layer in layers if layer.iteration in recorded]
def expected_layer_names(header: RankHeader) -> list[tuple[str, LayerKind, int | None]]:
    """The modules every iteration of this rank must report."""
    names: list[tuple[str, LayerKind, int | None]] = []
    if header.first_stage:
        names.append(("embedding", "embedding", None))
    names += [(f"decoder.layers.{index}", "decoder", number) for index, number in enumerate(header.stage_layers)]
    if header.last_stage:
        names.append(("output", "output", None))
    return names


def _layers_by_iteration(layers: Iterable[LayerRecord]) -> dict[int, list[LayerRecord]]:
    grouped: dict[int, list[LayerRecord]] = {}
    for layer in layers:
        grouped.setdefault(layer.iteration, []).append(layer)
    return grouped


def check_complete(profile: RankProfile) -> None:
    """The iterations with layer records are the first ones (a writer stops recording layers after
    ``limits.PROFILE_LAYER_ITERATIONS``), and each reports every module of the stage; missing
    ones are named."""
    expected = {layer_number if kind == "decoder" else kind for _, kind, layer_number in
                expected_layer_names(profile.header)}
    grouped = _layers_by_iteration(profile.layers)
    with_layers = [it.iteration for it in profile.iterations if it.iteration in grouped]
    if with_layers != [it.iteration for it in profile.iterations[:len(with_layers)]]:
        gap = next(it.iteration for it in profile.iterations if it.iteration not in grouped)
        raise ProfileError(f"{profile.path or 'profile'}: rank {profile.header.rank}, iteration {gap} has no layer "
                           f"records but a later iteration has: layer records cover the first iterations only")
    for number in with_layers:
        seen = {layer.layer_number if layer.kind == "decoder" else layer.kind for layer in grouped[number]}
        missing = expected - seen
        if missing:
            names = ", ".join(f"decoder layer {m}" if isinstance(m, int) else m for m in sorted(missing, key=str))
            raise ProfileError(
                f"{profile.path or 'profile'}: rank {profile.header.rank}, iteration {number}: missing {names}"
            )


_RUN_FIELDS = ("run_id", "world_size", "model", "parallel", "seq_len", "global_batch_size", "num_microbatches",
               "layers_per_stage", "params_dtype", "layer_spec", "sequence_parallel", "recompute",
               "distributed_optimizer", "emulated", "backend", "asked_iterations", "swiglu_fusion")
"""Header fields every rank of one run shares."""


def check_run_files(ranks: Iterable[RankProfile], where: str) -> None:
    """The rank files of one run describe one run: each file is named after its header's rank, no
    two files hold one rank or one coordinate, and the run-wide fields agree (the first
    disagreement is named with both files)."""
    ranks = list(ranks)
    seen: dict[object, RankProfile] = {}
    first = ranks[0]
    for rank in ranks:
        h, name = rank.header, rank.path.name if rank.path else "profile"
        if rank.path is not None and name != rank_file_name(h.rank):
            raise ProfileError(f"{rank.path}: the header says rank {h.rank}, the file name another "
                               f"(expected {rank_file_name(h.rank)})")
        for field_name in _RUN_FIELDS:
            if getattr(h, field_name) != getattr(first.header, field_name):
                raise ProfileError(f"{rank.path or where}: {field_name} {_short(getattr(h, field_name))} differs from "
                                   f"{first.path.name if first.path else 'the first rank'}'s "
                                   f"{_short(getattr(first.header, field_name))}: the files are not of one run")
        coords = tuple(h.coords[name] for name in _COORDS)
        for key, label in ((("rank", h.rank), f"rank {h.rank}"), (("coords", coords), f"coords {dict(h.coords)}")):
            if key in seen:
                other = seen[key].path.name if seen[key].path else "another file"
                raise ProfileError(f"{rank.path or where}: {label} is also in {other}: two files for one rank")
            seen[key] = rank


def directory_problem(path: Path) -> str | None:
    """Why ``path`` is not a profile's directory, or None: 'no such directory' where nothing is
    there (a typo), 'not a directory' where a file is."""
    if path.is_dir():
        return None
    return "not a directory" if path.exists() else "no such directory"


def load_run(directory: str | Path) -> ProfileRun:
    """All ``rank*.jsonl`` files of one run directory, checked to describe one run
    (``check_run_files``). Ranks may be missing (a run of some stages only, or one that died
    before a rank started); ``ProfileRun.missing_ranks`` lists them."""
    directory = Path(directory)
    if problem := directory_problem(directory):
        raise ProfileError(f"{directory}: {problem}")
    files = sorted(directory.glob("rank*.jsonl"))
    if not files:
        raise ProfileError(f"{directory}: no profile files (rank*.jsonl)")
    ranks = tuple(read_rank_file(path) for path in files)
    run_ids = {rank.header.run_id for rank in ranks}
    if len(run_ids) > 1:
        raise ProfileError(f"{directory}: files from different runs: {', '.join(sorted(run_ids))}")
    check_run_files(ranks, str(directory))
    return ProfileRun(directory, tuple(sorted(ranks, key=lambda rank: rank.header.rank)))
