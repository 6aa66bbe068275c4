"""The three inputs of ``advisor-launch``, read strictly, and the Megatron-LM arguments of each.

What a file holds is decided from its content:

- a JSON array: the rows of ``advisor sweep --format json``; ``--rank N`` picks the row ranked N
  (default 1);
- an object with ``schema``: a plan, ``megatron-4d-advisor/plan`` v1 (``advisor recommend -o``),
  launched with the flags of the training options it was priced with (its ``options``; they
  must be its ``megatron_args``), or, written before plans recorded them, with its own
  ``megatron_args``; a plan that is not launchable is refused;
- an object with ``stages``: ``advisor estimate --format json``;
- another object with a row's keys: one sweep row saved on its own.

A sweep row or an estimate becomes arguments through ``advisor.megatron_args`` (the one writer
of Megatron-LM flags) from its model, layout, batch and estimator options, with BF16 weights as
the estimator assumes; its own ``megatron_args``, where it has them (rows and estimates written
before they carried their flags have none), must be exactly those flags, as a plan's must be its
options' (one check, ``advisor.row_flags.check_own_args``, which ``advisor report --from`` holds a
row to as well: a hand edit of one without the other is refused).
Anything malformed, truncated or inconsistent is one AdvisorError.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Mapping

from advisor import limits
from advisor.capture.plan import SCHEMA as PLAN_SCHEMA
from advisor.capture.plan import check_plan
from advisor.capture.plan import VERSION as PLAN_VERSION
from advisor.errors import AdvisorError
from advisor.fileio import read_bytes, read_json_input
from advisor.megatron_args import chunk_layers, megatron_args
from advisor.memory import check_layout, split_problem
from advisor.options import TrainingOptions
from advisor.models import LlamaSpec
from advisor.moe.spec import is_moe
from advisor.moe.stage import split_layers
from advisor.parallel import ParallelConfig, Workload, world_size_problem
from advisor.row_flags import as_written, check_own_args, priced_release, row_flags
from advisor.saved_row import check_saved_fields, saved_number

if TYPE_CHECKING:
    from advisor.moe.memory import RoutedTokens

ROW_KEYS = ("tp", "cp", "pp", "mbs", "dp", "gpus", "seq_len", "global_batch_size", "model")


@dataclass(frozen=True, kw_only=True, slots=True)
class LaunchInput:
    """One configuration to launch, whatever file it came from."""

    kind: Literal["sweep row", "estimate", "plan"]
    origin: str
    """The file (and the row's rank), for messages."""
    model: LlamaSpec
    seq_len: int
    tp: int
    cp: int
    pp: int
    dp: int
    vpp: int
    micro_batch_size: int
    global_batch_size: int
    layers_per_stage: tuple[int, ...]
    megatron_args: tuple[str, ...]
    """Model, parallel layout, split, batch and memory flags; data, tokenizer and iterations are the user's."""
    gpus_per_node: int | None = None
    """What the input was planned for (plans), else None: the launch's default ranks per node."""
    priced_gpus_per_node: int | None = None
    """The GPUs per node a sweep row or estimate was priced with (its 'gpus_per_node': the NVLink
    domain its TP and CP collectives were priced inside, ``advisor.throughput.terms.link_bandwidth``),
    else None (rows written before they recorded it). Not a default for the launch's ranks per
    node: a preset's node is its NVLink domain, 72 GPUs for a GB200 NVL72 whose hosts hold 4."""
    verdict: str | None = None
    """The estimate's fits / tight / oom, where it made one."""
    judged_gib: float | None = None
    """The memory its verdict was judged on: the calibrated usage where it has one, else the analytic total."""
    memory_gib: float | None = None
    tokens: float | None = None
    """The token budget the row was priced for (``advisor sweep --tokens``), else None."""
    step_time_s: float | None = None
    """The estimated time of one iteration (with a GPU preset), else None."""
    ep: int | None = None
    etp: int | None = None
    """A mixture of experts' expert parallel and expert tensor parallel sizes, else None."""
    routing: RoutedTokens | None = None
    """A mixture of experts' routing as the row was priced (``advisor.saved_row.row_routing``), else None."""
    gpu: str | None = None
    """The GPU preset the input was priced on (its 'gpu'), else None."""
    priced_release: str | None = None
    """The Megatron-LM release a sweep row, estimate or analytic plan was priced for (its
    'megatron_version', as ``advisor.row_flags.priced_release`` reads it: 'core_v0.19.0'), else
    None (plans from profiles, and inputs written before they recorded one)."""
    read_from: str | None = None
    """The command an estimate was read from (``advisor estimate --from-command``), else None."""
    unpriced: tuple[str, ...] = ()
    """What that command holds that the estimate priced otherwise or not at all: its megatron_args,
    which the launch runs, state what was priced instead (a Llama network, the advisor's options)."""
    row: Mapping[str, object] | None = field(default=None, compare=False, repr=False)
    """The sweep row's or estimate's own JSON (None for a plan): what the launcher re-prices from it
    (an evaluation iteration, ``launch.evaluation``)."""
    not_launched: tuple[str, ...] = ()
    """That command's flags that the estimate's megatron_args leave out, as written ('--lr 3e-4'):
    its data and tokenizer (whose vocabulary the model was priced with), learning rates,
    checkpoints and logging, and the flags the advisor does not know (also unpriced)."""

    def left_out_note(self, args: list[str] | tuple[str, ...]) -> str | None:
        """The command's unpriced flags that the launch's ``args`` (the user's after -- included)
        do not give: Megatron's defaults run in their place, said rather than silent."""
        from advisor.row_flags import flag_values
        from launch.arguments import DATA_FLAGS, TOKENIZER_FLAGS
        from launch.job import LENGTH_FLAGS

        given = set(flag_values(args))
        # a group the launch sets one way stands for the command's other way: --mock-data for its data
        # and tokenizer, the user's data for its data (the command's tokenizer is still named), the
        # user's tokenizer for its tokenizer, the run's length (--train-samples of a token budget)
        groups = (DATA_FLAGS,) if "--mock-data" in given else (DATA_FLAGS - TOKENIZER_FLAGS, TOKENIZER_FLAGS)
        for group in (*groups, LENGTH_FLAGS):
            if given & set(group):
                given |= set(group)
        left = [flag for flag in self.not_launched if flag.split()[0] not in given]
        if not left or not self.read_from:
            return None
        command = self.read_from.partition(": ")[0]
        return (f"advisor-launch: {command}'s flags that change no price (data, tokenizer, schedule, logging) or that "
                f"the advisor does not know are not in {self.source} "
                f"and not launched: {', '.join(left)} (Megatron's defaults run instead: give the ones the run needs "
                "after --)")

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def source(self) -> str:
        return f"the {self.kind} ({self.origin})"

    def layout(self) -> str:
        vpp = f", VPP {self.vpp}" if self.vpp > 1 else ""
        split = "" if len(set(self.layers_per_stage)) == 1 else f" ({'/'.join(map(str, self.layers_per_stage))})"
        experts = f", EP {self.ep}, ETP {self.etp}" if self.ep is not None else ""
        return (f"TP {self.tp}, CP {self.cp}, PP {self.pp}{split}{vpp}, DP {self.dp}{experts}, "
                f"MBS {self.micro_batch_size}, GBS {self.global_batch_size}, seq {self.seq_len}")

    def describe(self) -> str:
        return f"{self.model.name}: {self.layout()}; {self.source}"

    def chunk_layers(self) -> list[int]:
        """The decoder layers of each model chunk (a pipeline stage, or each of its virtual stages)."""
        return chunk_layers(self.layers_per_stage, self.vpp)


# --- reading ---------------------------------------------------------------------------------


def _script_hint(path: Path) -> str:
    """Where --from names a launch script rather than saved JSON: what reads a script. Read as a
    command file is (``read_bytes``: a regular file of at most ``limits.COMMAND_FILE_BYTES``): a
    FIFO's open waited forever for a writer, and a file of gigabytes was read whole for its head."""
    try:
        head = read_bytes(path, max_bytes=limits.COMMAND_FILE_BYTES, what="launch script")[:4096]
    except AdvisorError:
        return ""
    head = head.decode(errors="replace")
    if head.lstrip()[:1] not in ("{", "[") and (head.startswith("#!") or any(
            word in head for word in ("torchrun", "pretrain_gpt", "srun "))):  # not a truncated estimate
        return (f" (it reads as a launch script: price it with 'advisor estimate --from-command "
                f"{path} -o est.json', then launch --from est.json)")
    return ""


def _read_document(path: Path) -> tuple[object, str]:
    """The JSON of ``path``, or of standard input for '-' (a sweep piped in), and its name."""
    if str(path) == "-":
        return read_json_input(path, what="launch input")
    try:
        return read_json_input(path, what="JSON file")
    except AdvisorError as exc:  # a launch script: only where to give it, not how sweeps write JSON
        hint = _script_hint(path)
        raise AdvisorError(f"{path} holds no JSON{hint}" if hint else str(exc)) from None


def read_input(path: str | Path, rank: int | None = None) -> LaunchInput:
    """Read a sweep array (picking ``rank``, default 1), a sweep row, an estimate or a plan."""
    document, where = _read_document(Path(path))
    if isinstance(document, list):
        row, origin = _pick_row(document, where, 1 if rank is None else rank)
        return _from_row(_Fields(row, origin), "sweep row")
    if not isinstance(document, dict):
        raise AdvisorError(f"{where}: expected a JSON object or array, got {limits.json_text(document)}")
    if rank is not None:
        raise AdvisorError(f"--rank picks a row of a sweep array; {where} holds one object")
    if "schema" in document or {"world_size", "micro_batch_size"} <= document.keys():  # a plan's keys, no row's
        return _from_plan(_Fields(document, where))
    if "stages" in document:
        return _from_row(_Fields(document, where), "estimate")
    if all(key in document for key in ROW_KEYS):
        return _from_row(_Fields(document, where), "sweep row")
    raise AdvisorError(
        f"{where}: neither a sweep row, an estimate nor a plan (expected the JSON of 'advisor sweep --format json', "
        "'advisor estimate --format json' or 'advisor recommend -o')")


def _pick_row(rows: list, path: str, rank: int) -> tuple[dict, str]:
    if not rows:
        raise AdvisorError(f"{path}: the sweep holds no rows")
    if not all(isinstance(row, dict) for row in rows):
        raise AdvisorError(f"{path}: a sweep array must hold row objects")
    ranked = [row for row in rows if row.get("rank") == rank]
    if len(ranked) > 1:  # the first was launched without a word
        raise AdvisorError(f"{path}: {len(ranked)} rows are ranked {rank}: a sweep ranks each row once (a hand edit "
                           "or two sweeps joined?)")
    if ranked:
        return ranked[0], f"rank {rank} of {path}"
    ranks = sorted(row["rank"] for row in rows if isinstance(row.get("rank"), int))
    held = f"ranks {ranks[0]}-{ranks[-1]}" if ranks else "no ranked rows"
    raise AdvisorError(f"{path} has no row ranked {rank} ({held}; oom rows have no rank)")


class _Fields:
    """Typed access to one JSON object, with messages that name the file and the key."""

    def __init__(self, document: dict, origin: str) -> None:
        self.document = document
        self.origin = origin

    def _get(self, key: str):
        if key not in self.document:
            raise AdvisorError(f"{self.origin}: missing {key!r}")
        return self.document[key]

    def positive(self, key: str, default: int | None = None) -> int:
        value = self.document.get(key, default) if default is not None else self._get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise AdvisorError(f"{self.origin}: {key!r} {limits.must_be('a positive integer', value)}")
        return value

    def count(self, key: str) -> int:
        """A non-negative integer: a stage's layers, 0 for an empty stage (which Megatron builds
        from a --pipeline-model-parallel-layout: advisor.megatron_args.split_args)."""
        value = self._get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise AdvisorError(f"{self.origin}: {key!r} {limits.must_be('a non-negative integer', value)}")
        return value

    def number(self, key: str) -> float | None:
        """A number of ``advisor.saved_row.NUMBERS``, or None where absent or null."""
        return saved_number(self.document, key, self.origin)

    def obj(self, key: str, default: dict | None = None) -> dict:
        value = self.document.get(key, default) if default is not None else self._get(key)
        if not isinstance(value, dict):
            raise AdvisorError(f"{self.origin}: {key!r} {limits.must_be('an object', value)}")
        return value

    def array(self, key: str, kind: type) -> list:
        value = self._get(key)
        if not isinstance(value, list) or not all(isinstance(item, kind) and not isinstance(item, bool)
                                                   for item in value):
            raise AdvisorError(f"{self.origin}: {key!r} {limits.must_be('a list of ' + kind.__name__, value)}")
        return value

    def text(self, key: str) -> str | None:
        """A string, or None where absent or null."""
        value = self.document.get(key)
        if value is not None and not isinstance(value, str):
            raise AdvisorError(f"{self.origin}: {key!r} {limits.must_be('a string or null', value)}")
        return value

    def flag_entries(self, key: str) -> tuple[str, ...]:
        """An estimate's list of flags as written or named ('--lr 3e-4', 'no --swiglu (...)':
        ``advisor.megatron_readback``), or () where absent or null. Each entry is read by its first
        words: a string was read letter by letter, and a blank entry, a number or true was an
        IndexError or TypeError."""
        value = self.document.get(key)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(item, str) and item.split() for item in value):
            raise AdvisorError(f"{self.origin}: {key!r} {limits.must_be('null or a list of flags as written', value)}")
        return tuple(value)

    def model(self) -> LlamaSpec:
        from advisor.models import spec_from_dict

        values = self.obj("model")  # its own error names the file once
        try:
            return spec_from_dict(values)
        except AdvisorError as exc:
            raise AdvisorError(f"{self.origin}: {exc}") from None

    def options(self) -> TrainingOptions:
        values = self.obj("options", {})  # its own error names the file once
        try:
            return TrainingOptions.from_dict(values)  # its fields' types are checked there
        except AdvisorError as exc:
            raise AdvisorError(f"{self.origin}: {exc}") from None


def _from_row(fields: _Fields, kind: Literal["sweep row", "estimate"]) -> LaunchInput:
    check_saved_fields(fields.document, fields.origin)  # as the report reads it
    spec, options = fields.model(), fields.options()
    tp, cp, pp, dp, mbs = (fields.positive(key) for key in ("tp", "cp", "pp", "dp", "mbs"))
    vpp = fields.positive("vpp", default=1)
    seq_len, gbs, gpus = fields.positive("seq_len"), fields.positive("global_batch_size"), fields.positive("gpus")
    if problem := world_size_problem(gpus, tp, cp, pp, dp):
        raise AdvisorError(f"{fields.origin}: {problem}")
    given = _split(fields, kind, spec, pp, vpp)
    # without a split of its own, the one the sweep and the MoE model price (even where PP divides the
    # layers; a dense model's uneven default is refused by check_layout below, as Megatron refuses it)
    layers = given if given is not None else tuple(split_layers(spec.num_layers, pp))
    ep = etp = routing = None
    if is_moe(spec):
        args, ep, etp, routing = _moe_args(fields, spec, seq_len, gbs, layers)
    else:
        _refuse_experts(fields, spec)
        parallel = ParallelConfig(tp=tp, cp=cp, pp=pp, dp=dp, mbs=mbs, vpp=vpp)
        try:  # what Megatron-LM would refuse, refused here before anything starts
            check_layout(spec, parallel, Workload(seq_len=seq_len, global_batch_size=gbs), given)
            # the row's own 'recompute' fields are read here: their error named no file ('recompute must be ...')
            args = row_flags(fields.document, spec, layers, options)
        except AdvisorError as exc:
            raise AdvisorError(f"{fields.origin}: {exc}") from None
    # launched in the words of the release it runs (launch.arguments.compose), held to the row's own
    # words for the release it was priced for
    priced = priced_release(fields.document, fields.origin)
    if "megatron_args" in fields.document:  # rows written before they carried their flags launch from their fields
        check_own_args(fields.origin, kind, tuple(fields.array("megatron_args", str)),
                       as_written(fields.document, fields.origin, tuple(args)))
    return LaunchInput(
        kind=kind, origin=fields.origin, model=spec, seq_len=seq_len, tp=tp, cp=cp, pp=pp, dp=dp, vpp=vpp,
        micro_batch_size=mbs, global_batch_size=gbs, layers_per_stage=layers, megatron_args=tuple(args),
        verdict=fields.document.get("verdict"),
        judged_gib=usage if (usage := fields.number("usage_gib")) is not None else fields.number("total_gib"),
        memory_gib=fields.number("memory_gib"), tokens=fields.number("tokens"),
        step_time_s=fields.number("step_time_s"), ep=ep, etp=etp, routing=routing,
        priced_gpus_per_node=_priced_per_node(fields), priced_release=priced.checked if priced else None,
        gpu=fields.text("gpu"),
        read_from=fields.text("read_from"), unpriced=fields.flag_entries("unpriced"),
        not_launched=fields.flag_entries("not_launched"),
        row=fields.document,
    )


def _priced_per_node(fields: _Fields) -> int | None:
    """A row's 'gpus_per_node' (within ``limits.GPUS_PER_NODE``, as --gpus-per-node), or None
    where it has none or null (rows written before they recorded it)."""
    value = fields.document.get("gpus_per_node")
    return None if value is None else limits.check_int(value, "'gpus_per_node'", limits.GPUS_PER_NODE, fields.origin)


def _split(fields: _Fields, kind: str, spec: LlamaSpec, pp: int, vpp: int) -> tuple[int, ...] | None:
    """The input's own pipeline split, or None where it has none. Layers per pipeline rank, each
    rank's VPP chunks together (``advisor.megatron_args.chunk_layers`` splits them), checked as
    Megatron builds it (``advisor.memory.split_problem``: PP counts, summing to the model's layers,
    at least VPP on each). An estimate's split is its stages'; a 'layers_per_stage' beside them
    that differs was ignored without a word."""
    listed = tuple(fields.array("layers_per_stage", int)) if "layers_per_stage" in fields.document else None
    if kind == "estimate":
        stages = fields.document["stages"]
        if not isinstance(stages, list) or not all(isinstance(stage, dict) for stage in stages):
            raise AdvisorError(f"{fields.origin}: 'stages' must be a list of stage objects")
        layers = tuple(_Fields(stage, f"{fields.origin}, stage {i}").count("layers") for i, stage in enumerate(stages))
        if listed is not None and listed != layers:
            raise AdvisorError(f"{fields.origin}: 'layers_per_stage' {list(listed)} is not the stages' split "
                               f"{list(layers)}")
    else:
        layers = listed
    key = "'stages'" if kind == "estimate" else "'layers_per_stage'"
    if layers is not None and (problem := split_problem(spec.num_layers, pp, vpp, layers, name=key)):
        raise AdvisorError(f"{fields.origin}: {problem}")
    return layers


def _refuse_experts(fields: _Fields, spec: LlamaSpec) -> None:
    """A dense model's row with EP or ETP above 1: its flags come from the model, which has no
    experts, so the degree was dropped without a word (an MoE row's: ``_moe_args``)."""
    for key in ("ep", "etp"):
        if fields.document.get(key) is not None and fields.positive(key) > 1:
            raise AdvisorError(f"{fields.origin}: {key!r} is {fields.document[key]}, but {spec.name} is a dense "
                               "model: expert parallelism needs a mixture of experts")


def _moe_args(fields: _Fields, spec, seq_len: int, gbs: int, layers: tuple[int, ...]
              ) -> tuple[list[str], int, int, RoutedTokens]:
    """(the flags, EP, ETP, the routing priced) of a mixture of experts' row: its EP, ETP,
    dispatcher, routing and recomputation read back by the check the report reads it with too
    (``advisor.saved_row.moe_row_settings``: what is launched is what was priced, and shown),
    the layout checked as megatron-core builds its expert groups, the flags from ``advisor.moe.flags``."""
    from advisor.moe.space import layout_problem
    from advisor.saved_row import moe_row_settings, row_routing

    row = {key: fields.positive(key) for key in ("tp", "cp", "pp", "dp", "mbs")}
    row["vpp"] = fields.positive("vpp", default=1)
    settings = moe_row_settings(fields.document, fields.origin, spec)
    gpus = row["tp"] * row["cp"] * row["pp"] * row["dp"]
    problem = layout_problem(spec, Workload(seq_len=seq_len, global_batch_size=gbs), gpus, row["tp"], row["cp"],
                             row["pp"], settings["ep"], settings["etp"], row["mbs"], row["vpp"], tuple(layers),
                             a2a_overlap=settings["a2a_overlap"], recompute=settings["recompute"],
                             dispatcher=settings["dispatcher"])
    if problem:
        raise AdvisorError(f"{fields.origin}: {problem}")
    options = fields.options() if "options" in fields.document else None
    return (list(row_flags(fields.document, spec, layers, options, settings)), settings["ep"], settings["etp"],
            row_routing(settings))


def _from_plan(fields: _Fields) -> LaunchInput:
    document, origin = fields.document, fields.origin
    if document.get("schema") != PLAN_SCHEMA:
        given = f"unknown schema {document['schema']!r}" if "schema" in document else "missing 'schema'"
        raise AdvisorError(f"{origin}: {given} (this launcher reads {PLAN_SCHEMA})")
    if document.get("version") != PLAN_VERSION:
        given = (f"plan version {limits.json_text(document['version'])} is not supported" if "version" in document
                 else "missing 'version'")
        raise AdvisorError(f"{origin}: {given} (this launcher reads version {PLAN_VERSION})")
    launchable = document.get("launchable", limits.ABSENT)
    if not isinstance(launchable, bool):  # 'yes' was 'it is marked not launchable'
        raise AdvisorError(f"{origin}: 'launchable' {limits.must_be('true or false', launchable)}")
    if not launchable:
        reason = document.get("not_launchable_reason") or "it is marked not launchable"
        mode = f" {document['mode']}" if isinstance(document.get("mode"), str) else ""
        raise AdvisorError(f"{origin}: stock Megatron-LM cannot build this{mode} plan: {reason}. "
                           "Recommend with --mode megatron for a plan it can run")
    spec = fields.model()
    tp, cp, pp, dp = (fields.positive(key) for key in ("tp", "cp", "pp", "dp"))
    mbs, gbs = fields.positive("micro_batch_size"), fields.positive("global_batch_size")
    seq_len, world, per_node = fields.positive("seq_len"), fields.positive("world_size"), fields.positive("gpus_per_node")
    layers = tuple(fields.array("layers_per_stage", int))
    args = tuple(fields.array("megatron_args", str))
    if problem := world_size_problem(world, tp, cp, pp, dp, key="world_size"):
        raise AdvisorError(f"{origin}: {problem}")
    if problem := split_problem(spec.num_layers, pp, 1, layers, name="'layers_per_stage'"):
        raise AdvisorError(f"{origin}: {problem}")
    check_own_args(origin, "plan", args, {
        "--tensor-model-parallel-size": tp, "--context-parallel-size": cp, "--pipeline-model-parallel-size": pp,
        "--micro-batch-size": mbs, "--global-batch-size": gbs, "--num-layers": spec.num_layers,
        "--seq-length": seq_len,
    })
    check_plan(document, origin)  # its stages, GPUs, batch and split against each other
    priced = priced_release(document, origin)
    if document.get("options") is not None:  # what was priced is what is launched
        args = _priced_plan_args(fields, spec, seq_len, tp, cp, layers, mbs, gbs, args)
    return LaunchInput(
        kind="plan", origin=origin, model=spec, seq_len=seq_len, tp=tp, cp=cp, pp=pp, dp=dp, vpp=1,
        micro_batch_size=mbs, global_batch_size=gbs, layers_per_stage=layers, megatron_args=args,
        gpus_per_node=per_node, judged_gib=fields.number("peak_predicted_gib"),
        priced_release=priced.checked if priced else None,
    )


def _priced_plan_args(fields: _Fields, spec, seq_len: int, tp: int, cp: int, layers: tuple[int, ...], mbs: int,
                      gbs: int, written: tuple[str, ...]) -> tuple[str, ...]:
    """The flags of the training options a plan records (its ``options``, what it was priced
    with), emitted as a sweep row's are; refused where the plan's ``megatron_args`` say otherwise
    (a hand edit of one without the other), in the words of the release it names."""
    args = tuple(megatron_args(spec, seq_len, tp=tp, cp=cp, layers_per_stage=layers, micro_batch_size=mbs,
                               global_batch_size=gbs, options=fields.options()))
    check_own_args(fields.origin, "plan", written, as_written(fields.document, fields.origin, args))
    return args
