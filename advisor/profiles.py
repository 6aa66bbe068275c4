"""Layer-profile records: the schema, the reader, and the one serialiser.

``megatron_hooks`` writes one JSON Lines file per rank, ``rank{RANK:05d}.jsonl``, into a run
directory; the advisor reads them without torch. Schema ``megatron-4d-advisor/profile``,
version 2 (version 1 files are read too: see below). Every line is one JSON object with a
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
    the schedule keeps on this stage at once).
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
    the backend has none), step_time_s, loss (null off the last stage).
``end`` (the last line): status ("ok" | "oom" | "error" | "running"), iterations (completed),
    error and where (null unless the run failed; where says how far it got).

Memory is in bytes. Version 1 files have no ``kernels`` (read as "cuda" on the CUDA backend,
"cpu" otherwise) and no per-layer times (read as null). A writer rewrites the whole file
atomically (``advisor.fileio``) after each iteration, so a killed run leaves a valid file whose
end record says "running".
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, get_args

from advisor.errors import AdvisorError
from advisor.fileio import atomic_write_text
from advisor.memory import Recompute
from advisor.models import LlamaSpec
from advisor.parallel import ParallelConfig

SCHEMA = "megatron-4d-advisor/profile"
VERSION = 2
READABLE_VERSIONS = (1, 2)
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


LAYER_TIME_FIELDS = ("forward_time_s", "backward_time_s")
"""Per-layer times, new in version 2 (published for the MadPipe planner)."""


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

    def to_jsonl(self) -> str:
        lines = [self.header.to_dict()]
        lines += [{"type": "layer", **asdict(layer)} for layer in self.layers]
        lines += [{"type": "iteration", **asdict(it)} for it in self.iterations]
        lines.append({
            "type": "end", "status": self.status, "iterations": len(self.iterations),
            "error": self.error, "where": self.where,
        })
        return "".join(json.dumps(line, allow_nan=False) + "\n" for line in lines)

    def write(self, directory: str | Path) -> Path:
        """Write atomically to ``directory/rank{RANK:05d}.jsonl``."""
        return atomic_write_text(Path(directory) / rank_file_name(self.header.rank), self.to_jsonl())


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


# --- reading ----------------------------------------------------------------------------


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
        raise ProfileError(f"{where}: field {name!r} has the wrong type: {value!r}")
    if name.endswith("_bytes") and value < 0:
        raise ProfileError(f"{where}: field {name!r} is negative: {value!r}")
    return value


def _dataclass_from(cls, record: dict, where: str, nullable: tuple[str, ...] = ()):
    kinds = {"int": int, "str": str, "float": (int, float), "int | None": int, "float | None": (int, float),
             "LayerKind": str}
    values = {}
    for name, spec in cls.__dataclass_fields__.items():
        values[name] = _field(record, name, kinds[spec.type], where, nullable=name in nullable or "None" in spec.type)
    return cls(**values)


def _parse_header(record: dict, where: str) -> RankHeader:
    if record.get("schema") != SCHEMA:
        raise ProfileError(f"{where}: not a profile file (schema {record.get('schema')!r}, expected {SCHEMA!r})")
    version = record.get("version")
    if version not in READABLE_VERSIONS or isinstance(version, bool):
        raise ProfileError(
            f"{where}: profile schema version {version!r}; this advisor reads versions "
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
            raise ProfileError(f"{where}: {name} must be one of {', '.join(allowed)}, got {chosen[name]!r}")
    return RankHeader(
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
        seq_len=_field(record, "seq_len", int, where),
        global_batch_size=_field(record, "global_batch_size", int, where, nullable=True),
        num_microbatches=_field(record, "num_microbatches", int, where),
        layers_per_stage=tuple(_field(record, "layers_per_stage", list, where)),
        rank=_field(record, "rank", int, where),
        world_size=_field(record, "world_size", int, where),
        coords=dict(_field(record, "coords", dict, where)),
        stage_layers=tuple(_field(record, "stage_layers", list, where)),
        first_stage=_field(record, "first_stage", bool, where),
        last_stage=_field(record, "last_stage", bool, where),
        in_flight_microbatches=_field(record, "in_flight_microbatches", int, where),
    )


def read_rank_file(path: str | Path) -> RankProfile:
    """Read and validate one rank's file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    lines = text.splitlines()
    if not lines:
        raise ProfileError(f"{path}: empty file")
    records = []
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ProfileError(f"{path}:{number}: truncated or malformed JSON ({exc.msg})") from None
        if not isinstance(record, dict) or "type" not in record:
            raise ProfileError(f"{path}:{number}: expected an object with a 'type'")
        records.append((f"{path}:{number}", record))
    where, first = records[0]
    if first["type"] != "header":
        raise ProfileError(f"{where}: the first record must be the header, got {first['type']!r}")
    header = _parse_header(first, where)
    where, last = records[-1]
    if last["type"] != "end":
        raise ProfileError(f"{path}: truncated: no end record after line {len(lines)}")
    layers, iterations = [], []
    for where, record in records[1:-1]:
        kind = record["type"]
        if kind == "layer":
            if first.get("version") == 1:  # no per-layer times before version 2
                record = {**dict.fromkeys(LAYER_TIME_FIELDS), **record}
            layer = _dataclass_from(LayerRecord, record, where)
            if layer.kind not in get_args(LayerKind):
                raise ProfileError(f"{where}: unknown layer kind {layer.kind!r}")
            layers.append(layer)
        elif kind == "iteration":
            iterations.append(_dataclass_from(IterationRecord, record, where))
        else:
            raise ProfileError(f"{where}: unknown record type {kind!r}")
    status = _field(last, "status", str, where)
    if status not in get_args(Status):
        raise ProfileError(f"{where}: unknown status {status!r}")
    profile = RankProfile(
        header=header, layers=tuple(layers), iterations=tuple(iterations), status=status,
        error=_field(last, "error", str, where, nullable=True), where=_field(last, "where", str, where, nullable=True),
        path=path,
    )
    check_complete(profile)
    return profile


def expected_layer_names(header: RankHeader) -> list[tuple[str, LayerKind, int | None]]:
    """The modules every iteration of this rank must report."""
    names: list[tuple[str, LayerKind, int | None]] = []
    if header.first_stage:
        names.append(("embedding", "embedding", None))
    names += [(f"decoder.layers.{index}", "decoder", number) for index, number in enumerate(header.stage_layers)]
    if header.last_stage:
        names.append(("output", "output", None))
    return names


def check_complete(profile: RankProfile) -> None:
    """Every completed iteration reports every module of the stage; missing ones are named."""
    expected = {layer_number if kind == "decoder" else kind for _, kind, layer_number in
                expected_layer_names(profile.header)}
    for it in profile.iterations:
        seen = {layer.layer_number if layer.kind == "decoder" else layer.kind for layer in profile.layers_of(it.iteration)}
        missing = expected - seen
        if missing:
            names = ", ".join(f"decoder layer {m}" if isinstance(m, int) else m for m in sorted(missing, key=str))
            raise ProfileError(
                f"{profile.path or 'profile'}: rank {profile.header.rank}, iteration {it.iteration}: "
                f"missing {names}"
            )


def load_run(directory: str | Path) -> ProfileRun:
    """All ``rank*.jsonl`` files of one run directory, checked to belong to the same run."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ProfileError(f"{directory}: not a directory")
    files = sorted(directory.glob("rank*.jsonl"))
    if not files:
        raise ProfileError(f"{directory}: no profile files (rank*.jsonl)")
    ranks = tuple(read_rank_file(path) for path in files)
    run_ids = {rank.header.run_id for rank in ranks}
    if len(run_ids) > 1:
        raise ProfileError(f"{directory}: files from different runs: {', '.join(sorted(run_ids))}")
    return ProfileRun(directory, ranks)
