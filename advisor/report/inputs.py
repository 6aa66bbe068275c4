"""What a report is made of: the document a command wrote (a sweep's rows, an estimate, a plan),
where it came from, and the profiles to compare against.

Rows are read by key and defensively: a field another version of the advisor adds (an option, an
expert-parallel degree) is shown as it is, a field it lacks is left out, never an error. What the
page re-prices a row with (its model, options, layout, GPU preset) is checked as advisor-launch
checks it, and so is the row's own ``megatron_args`` against its fields (``advisor.row_flags``, the
launcher's check: the page shows the flags beside the price of the fields), each problem one line
naming the file and the row.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from advisor import limits
from advisor.errors import AdvisorError

if TYPE_CHECKING:  # the report's readers import the models only when they read a row
    from advisor.models import LlamaSpec
    from advisor.moe.spec import MoESpec

PLAN_SCHEMA = "megatron-4d-advisor/plan"


@dataclass(frozen=True, slots=True)
class ReportInput:
    """One report's data: ``kind`` sweep | estimate | plan, and the document of that kind."""

    kind: str
    rows: list[dict]
    """Sweep rows best first (an estimate: its one row; a plan: none)."""
    document: dict | None = None
    """The estimate or the plan itself."""
    question: str = ""
    """The command line that asked, or the file read."""
    profiles: tuple[Path, ...] = field(default_factory=tuple)


_LAYOUT = ("tp", "cp", "pp", "dp", "mbs", "seq_len", "global_batch_size")
"""What every sweep row and estimate holds, and the report re-prices a layout from."""
_FIELDS = {  # key: (what it must be, the check) for the fields the report reads where present
    **{key: ("a positive integer or null", lambda v: v is None or _positive(v))
       for key in ("vpp", "ep", "etp", "gpus", "rank", "recompute_num_layers", "dispatcher_sms")},
    **{key: ("a finite number or null", lambda v: v is None or _finite(v))
       for key in ("total_gib", "usage_gib", "memory_gib", "margin_gib", "memory_fraction", "model_states_gib",
                   "activations_gib", "step_time_s", "tflops_per_gpu", "mfu", "tokens_per_s", "imbalance",
                   "capacity_factor", "days", "gpu_hours", "cost_usd")},
    **{key: ("a string or null", lambda v: v is None or isinstance(v, str))
       for key in ("verdict", "gpu", "memory_model", "recompute", "recompute_method", "dispatcher", "routing",
                   "flex_backend")},
    **{key: ("true, false or null", lambda v: v is None or isinstance(v, bool))
       for key in ("a2a_overlap", "delay_wgrad", "pad_to_capacity", "distributed_optimizer", "permute_fusion",
                   "router_fusion")},
    # the node size the row was priced at (its time model's NVLink domain), bounded as --gpus-per-node is
    "gpus_per_node": (f"a positive integer up to {int(limits.GPUS_PER_NODE.high)} or null",
                      lambda v: v is None or _positive(v) and v <= limits.GPUS_PER_NODE.high),
    # the paper's rule's fraction, bounded as advisor sweep's --threshold is (a hand-edited 5 drew no rule)
    "threshold": ("a number in (0, 1] or null", lambda v: v is None or _finite(v) and 0 < v <= 1),
    "options": ("an object", lambda v: isinstance(v, dict)),
    "layers_per_stage": ("a list of layer counts", lambda v: isinstance(v, list) and all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in v)),
    **{key: ("a list of strings or null", lambda v: v is None or isinstance(v, list) and all(
        isinstance(x, str) for x in v)) for key in ("megatron_args", "recompute_modules")},
}


def _positive(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= limits.JSON_INT


def _finite(value) -> bool:
    """A number the figures can scale: 1e308 GiB overflowed a log axis's ticks."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and abs(value) <= 1e15


def _check_row(row: dict, where: str, kind: str = "sweep row") -> None:
    """One line naming the first field the report could not read (a hand-edited or truncated
    row was a KeyError or TypeError deep in the page's figures), or the first flag of its own
    ``megatron_args`` that its fields contradict (``kind``, sweep row or estimate, names it)."""
    from advisor.moe.spec import is_moe

    for key in _LAYOUT:
        if not _positive(row.get(key)):
            raise AdvisorError(f"{where}: '{key}' {limits.must_be('a positive integer', row.get(key, limits.ABSENT))}")
    for key, (what, valid) in _FIELDS.items():
        if key in row and not valid(row[key]):
            raise AdvisorError(f"{where}: '{key}' must be {what}, got {limits.json_text(row[key])}")
    if "model" in row and not isinstance(row["model"], (str, dict)):
        raise AdvisorError(f"{where}: 'model' must be a preset's name or a model object, got {limits.json_text(row['model'])}")
    try:
        spec = row_spec(row)  # a row without its model cannot be priced (nor launched)
    except AdvisorError as exc:
        raise AdvisorError(f"{where}: {exc}") from None
    settings = None
    if is_moe(spec):  # a preset's name too, whose flags are an MoE row's (row_flags)
        settings = moe_row_settings(row, where, spec)  # as advisor-launch reads it: what one refuses, the other does
    _check_pricing(row, where, spec)
    _check_own_flags(row, where, kind, spec, settings)


def _check_own_flags(row: dict, where: str, kind: str, spec: LlamaSpec, moe: dict | None) -> None:
    """The row's own ``megatron_args`` must be the flags its fields make, as advisor-launch
    holds them (``advisor.row_flags``, the one check of both): the page prices the fields and
    shows the flags, so a row edited in one and not the other (TP 2 priced, TP 4 named) is
    refused. Its split is the one the launcher reads: its own, else the sweep's default
    (``advisor.moe.stage.split_layers``); ``moe`` its MoE settings (``moe_row_settings``)."""
    from advisor.memory import split_problem
    from advisor.moe.stage import split_layers
    from advisor.row_flags import check_own_args, row_flags

    if row.get("megatron_args") is None:  # rows written before they carried their flags: nothing to check
        return
    listed = row.get("layers_per_stage")
    layers = tuple(split_layers(spec.num_layers, row["pp"]) if listed is None else listed)
    if problem := split_problem(spec.num_layers, row["pp"], row.get("vpp") or 1, layers, name="'layers_per_stage'"):
        raise AdvisorError(f"{where}: {problem}")  # an MoE row's split, which the layout's check leaves
    try:
        options = _saved_options(row["options"]) if "options" in row else None
    except AdvisorError as exc:
        raise AdvisorError(f"{where}: the row's options cannot be read: {exc}") from None
    check_own_args(where, kind, tuple(row["megatron_args"]), row_flags(row, spec, layers, options, moe))


def _saved_options(given: dict):
    """The row's 'options' as ``TrainingOptions``, read once per distinct object: a sweep's
    thousands of rows share a handful. Keyed by their JSON text, which tells true from 1."""
    return _options_of(json.dumps(given, sort_keys=True))


@functools.lru_cache(maxsize=64)
def _options_of(text: str):
    from advisor.options import TrainingOptions

    return TrainingOptions.from_dict(json.loads(text))


def row_spec(row: dict):
    from advisor.models import load_model, spec_from_dict

    model = row.get("model")
    if isinstance(model, str):
        return load_model(model)
    if not isinstance(model, dict):
        raise AdvisorError("a row without its model: save sweeps with --format json")
    return spec_from_dict(model)


def row_options(row: dict):
    """The training options of a row (``advisor.options.TrainingOptions``): its changed options
    and its own recomputation, as the sweep priced it."""
    from advisor.options import TrainingOptions
    from advisor.row_flags import recomputation_fields

    values = dict(row.get("options")) if isinstance(row.get("options"), dict) else {}
    values.update(recomputation_fields(row))
    try:
        return TrainingOptions.from_dict(values).at_tp(row["tp"])
    except AdvisorError as exc:
        raise AdvisorError(f"the row's options cannot be read: {exc}") from None


def _check_pricing(row: dict, where: str, spec: LlamaSpec) -> None:
    """What the page re-prices a row with (its model ``spec``, options, layout, GPU preset and
    memory), checked here so that one line names the file and the row (their errors, raised while
    the figures were drawn, named neither), and refused as advisor-launch refuses it."""
    from advisor.hardware import get_gpu
    from advisor.memory import check_layout
    from advisor.parallel import ParallelConfig, Workload, world_size_problem

    try:
        row_options(row)
        if row.get("gpus") is not None and (problem := world_size_problem(row["gpus"], row["tp"], row["cp"],
                                                                           row["pp"], row["dp"])):
            raise AdvisorError(problem)
        if row.get("gpu") is not None:
            get_gpu(row["gpu"])
        if row.get("memory_gib") is not None and not row["memory_gib"] > 0:
            raise AdvisorError(f"'memory_gib' must be above 0, got {limits.json_text(row['memory_gib'])}")
        if not (isinstance(row["model"], dict) and "num_experts" in row["model"]):  # MoE: moe_row_settings
            layers = row.get("layers_per_stage")
            check_layout(spec, ParallelConfig(tp=row["tp"], cp=row["cp"], pp=row["pp"], dp=row["dp"], mbs=row["mbs"],
                                              vpp=row.get("vpp") or 1),
                         Workload(seq_len=row["seq_len"], global_batch_size=row["global_batch_size"]),
                         None if layers is None else tuple(layers), split_name="'layers_per_stage'")
    except AdvisorError as exc:
        raise AdvisorError(f"{where}: {exc}") from None


MOE_DISPATCHERS = ("alltoall", "allgather", "flex")
"""--moe-token-dispatcher-type's choices (advisor.cli.moe.moe_options)."""
MOE_ROUTINGS = ("balanced", "capacity", "dropless")
"""--moe-routing's choices (advisor.cli.moe.moe_options)."""


def moe_row_settings(row: dict, where: str, spec: MoESpec) -> dict:
    """The MoE settings of a sweep row or an estimate (EP, ETP, dispatcher, routing, recomputation,
    overlap, gradients), checked as ``advisor sweep`` and ``estimate`` check the flags they come
    from (``advisor.cli.moe.moe_settings``: the same refusals, one line naming the row's field),
    an absent one at the command's default. ``spec`` is the row's model as its reader built it
    (``row_spec``, ``spec_from_dict``): the MTP layers the overlap's rule counts are read from it,
    never from the raw 'model' again. The one check of both readers of a saved MoE row,
    advisor-launch's (``launch.inputs``) and the report's (``classify``): a hand-edited row that
    one would launch or price differently from the other is refused by both."""
    from advisor.moe.overlap import settings_problem
    from advisor.moe.space import RECOMPUTES
    from advisor.moe.ep_time import dispatcher_sms_problem
    from advisor.moe.spec import FLEX_BACKENDS, RECOMPUTE_MODULES

    def refuse(text: str):
        raise AdvisorError(f"{where}: {text}")

    for key in ("ep", "etp"):  # an MoE row is priced by EP and ETP
        if not _positive(row.get(key)):
            refuse(f"an MoE row's '{key}' {limits.must_be('a positive integer', row.get(key, limits.ABSENT))}")
    dispatcher = _given(row, "dispatcher", "alltoall")
    if dispatcher not in MOE_DISPATCHERS:
        refuse(f"'dispatcher' must be {_choices(MOE_DISPATCHERS)}, got {limits.json_text(dispatcher)}")
    settings = {"ep": row["ep"], "etp": row["etp"], "dispatcher": dispatcher, **_moe_routing(row, dispatcher, refuse)}
    recompute, modules = _given(row, "recompute", "none"), row.get("recompute_modules")
    if recompute not in RECOMPUTES:
        refuse(f"'recompute' must be {_choices(RECOMPUTES)}, got {limits.json_text(recompute)}")
    if modules is not None and (not isinstance(modules, list) or not modules
                                or not all(module in RECOMPUTE_MODULES for module in modules)):
        refuse(f"'recompute_modules' must be null or a list of {_choices(RECOMPUTE_MODULES)}, got {limits.json_text(modules)}")
    if modules and recompute != "selective":  # Megatron reads --recompute-modules only with selective
        refuse(f"'recompute_modules' needs 'recompute' selective, got {limits.json_text(recompute)}")
    method, layers = row.get("recompute_method"), row.get("recompute_num_layers")
    if recompute == "full" and (method not in (None, "uniform") or layers not in (None, 1) or layers is True):
        # the MoE model prices full recomputation of every layer, launched so (advisor.moe.flags)
        refuse(f"an MoE row's full recomputation is 'recompute_method' uniform with 'recompute_num_layers' 1 (every "
               f"layer, as priced), got {limits.json_text(method)} and {limits.json_text(layers)}")
    overlap, delay = _given(row, "a2a_overlap", False), _given(row, "delay_wgrad", False)
    grads, sharded = _given(row, "gradient_bytes", 4), _given(row, "distributed_optimizer", True)
    fusions = _given(row, "permute_fusion", False), _given(row, "router_fusion", False)
    if not all(isinstance(value, bool) for value in (overlap, delay, sharded, *fusions)) or grads not in (2, 4):
        refuse("'a2a_overlap', 'delay_wgrad', 'distributed_optimizer', 'permute_fusion' and 'router_fusion' must be "
               "true or false, 'gradient_bytes' 2 or 4")
    # megatron-core's refusals of the EP all-to-all overlap that the layout does not decide, in the
    # words the command line's check uses (advisor.moe.overlap; the layout's: advisor.moe.space.layout_problem).
    # A row carries no --moe-shared-expert-overlap, and its recomputation method and layer count
    # are launched under full recomputation only (advisor.moe.flags), which the layout's check refuses.
    if problem := settings_problem(a2a_overlap=overlap, delay_wgrad=delay, dispatcher=dispatcher,
                                   recompute=recompute, recompute_modules=modules,
                                   mtp_num_layers=spec.mtp_num_layers):
        refuse(problem)
    sms = row.get("dispatcher_sms")
    gpu = row["gpu"] if isinstance(row.get("gpu"), str) else None
    if problem := dispatcher_sms_problem(sms, dispatcher, _architecture(row), gpu,
                                         unnamed="where the row names no 'gpu'"):
        refuse(problem.replace("--moe-deepep-num-sms", "'dispatcher_sms'"))
    backend = row.get("flex_backend")
    if backend not in (None, *FLEX_BACKENDS) or (backend not in (None, "deepep") and dispatcher != "flex"):
        refuse(f"'flex_backend' must be null or, with the flex dispatcher, {_choices(FLEX_BACKENDS)}; got "
               f"{limits.json_text(backend)} with {limits.json_text(dispatcher)}")
    return {**settings, "recompute": recompute, "recompute_modules": modules, "a2a_overlap": overlap,
            "delay_wgrad": delay, "gradient_bytes": grads, "distributed_optimizer": sharded, "dispatcher_sms": sms,
            "permute_fusion": fusions[0], "router_fusion": fusions[1], "flex_backend": backend}


def _architecture(row: dict) -> str:
    """The architecture of the row's GPU preset (its SMs bound the dispatcher's), else Hopper's."""
    from advisor.hardware import get_gpu

    return get_gpu(row["gpu"]).architecture if isinstance(row.get("gpu"), str) else "hopper"


def _moe_routing(row: dict, dispatcher: str, refuse) -> dict:
    """The routing, its capacity factor, padding and imbalance, as advisor.cli.moe's ``_routing``
    and ``_padded`` take them: a factor alone is capacity routing (Megatron drops tokens over
    it), capacity routing needs one, another routing refuses one (it would be read and ignored)."""
    from advisor.moe.flags import pad_problem

    factor, routing = row.get("capacity_factor"), row.get("routing")
    if factor is not None:
        _bounded(factor, "capacity_factor", limits.MOE_CAPACITY_FACTOR, refuse, low_open=True)
    if routing is None:
        routing = "balanced" if factor is None else "capacity"
    elif routing not in MOE_ROUTINGS:
        refuse(f"'routing' must be {_choices(MOE_ROUTINGS)}, got {limits.json_text(routing)}")
    if routing == "capacity" and factor is None:
        refuse("'routing' capacity needs a 'capacity_factor' (--moe-routing capacity needs "
               "--moe-expert-capacity-factor)")
    if routing != "capacity" and factor is not None:
        refuse(f"'capacity_factor' drops tokens (capacity routing); 'routing' {routing} routes every token: give "
               "one of them")
    pad = row.get("pad_to_capacity")
    if pad is not None and not isinstance(pad, bool):
        refuse(f"'pad_to_capacity' must be null, true or false, got {limits.json_text(pad)}")
    if pad and routing != "capacity":
        refuse("'pad_to_capacity' needs capacity routing and a 'capacity_factor'")
    if routing == "capacity" and (problem := pad_problem(dispatcher, factor, pad is not False)):
        refuse(problem)
    imbalance = _given(row, "imbalance", 1.0)
    _bounded(imbalance, "imbalance", limits.MOE_IMBALANCE, refuse)
    return {"routing": routing, "capacity_factor": factor, "pad_to_capacity": pad, "imbalance": imbalance}


def _given(row: dict, key: str, default):
    """A field's value, its default where absent or null."""
    value = row.get(key)
    return default if value is None else value


def _choices(names) -> str:
    return f"{', '.join(names[:-1])} or {names[-1]}"


def _bounded(value, key: str, bound: limits.Bound, refuse, *, low_open: bool = False) -> None:
    """A number within the bound the command's option has (advisor.cli.moe: MOE_CAPACITY_FACTOR,
    MOE_IMBALANCE), else ``refuse`` with limits.check_float's reason."""
    try:
        limits.check_float(value, f"'{key}'", bound, low_open=low_open)
        return
    except AdvisorError as exc:
        problem = str(exc)
    refuse(problem)


_PLAN_KEYS = {"world_size", "micro_batch_size"}
"""Keys of a plan that no sweep row or estimate has: a plan whose schema was lost is not read as a row."""


def classify(document: object, where: str) -> tuple[str, list[dict], dict | None]:
    """(kind, rows, document) of the JSON of 'advisor sweep --format json', one sweep row,
    'advisor estimate --format json' or 'advisor recommend -o'."""
    if isinstance(document, list):
        if not document:
            raise AdvisorError(f"{where}: the sweep holds no rows")
        if not all(isinstance(row, dict) for row in document):
            raise AdvisorError(f"{where}: a sweep array must hold row objects (advisor sweep --format json)")
        for number_, row in enumerate(document, 1):
            _check_row(row, f"{where}, row {number_}")
        return "sweep", document, None
    if isinstance(document, dict) and document.get("schema") == PLAN_SCHEMA:
        from advisor.capture.plan import check_plan

        check_plan(document, where)  # the plan's own reader (advisor-launch's): every field it holds
        _check_plan_page(document, where)
        return "plan", [], document
    if isinstance(document, dict) and ("schema" in document or _PLAN_KEYS <= document.keys()):
        given = f"unknown schema {repr(document['schema'])[:40]}" if "schema" in document else "missing 'schema'"
        raise AdvisorError(f"{where}: {given} (a plan of 'advisor recommend -o' has schema {PLAN_SCHEMA})")
    if isinstance(document, dict) and isinstance(document.get("stages"), list) and "tp" in document:
        _check_row(document, where, "estimate")
        return "estimate", [document], document
    if isinstance(document, dict) and "tp" in document and "pp" in document:
        _check_row(document, where)
        return "sweep", [document], None
    raise AdvisorError(f"{where}: neither a sweep, a sweep row, an estimate nor a plan (expected the JSON of "
                       "'advisor sweep --format json', 'advisor estimate --format json' or 'advisor recommend -o')")


def _check_plan_page(plan: dict, where: str) -> None:
    """The fields of a plan that the page draws and ``check_plan`` leaves (they launch nothing):
    one line naming the field, where they were a TypeError or an AttributeError in the figures."""
    def refuse(key: str, what: str, value) -> None:
        raise AdvisorError(f"{where}: {key} must be {what}, got {limits.json_text(value)}")

    if not isinstance(plan.get("baseline", {}), dict):
        raise AdvisorError(f"{where}: 'baseline' must be an object, got {limits.json_text(plan['baseline'])}")
    predictor = plan.get("predictor")
    if predictor is not None and not (isinstance(predictor, dict) and isinstance(predictor.get("name", ""), str)):
        refuse("'predictor'", "null or an object with a string 'name'", predictor)
    args = plan.get("megatron_args")
    if args is not None and not (isinstance(args, list) and all(isinstance(arg, str) for arg in args)):
        refuse("'megatron_args'", "null or a list of strings", args)
    for key in ("peak_predicted_gib", "memory_limit_gib", "stage_limit_gib", "period_s", "predicted_step_time_s"):
        if plan.get(key) is not None and not _finite(plan[key]):
            refuse(f"'{key}'", "a finite number or null", plan[key])
    even = (plan.get("baseline") or {}).get("stage_predicted_gib")
    if even is not None and not (isinstance(even, list) and all(v is None or _finite(v) for v in even)):
        refuse("'baseline' 'stage_predicted_gib'", "a list of finite numbers", even)
    for index, stage in enumerate(plan["stages"]):  # check_plan: a list of objects
        for key in ("predicted_gib", "predicted_time_s"):
            if stage.get(key) is not None and not _finite(stage[key]):
                refuse(f"stage {index}: '{key}'", "a finite number or null", stage[key])


def read_input(path: Path, profiles: tuple[Path, ...] = ()) -> ReportInput:
    """A saved sweep, row, estimate or plan (``--from FILE``, or ``--from -``: standard input, so
    that a sweep pipes into its page), through the bounded JSON reader."""
    from advisor.fileio import read_json_input

    document, where = read_json_input(path, what="report input")
    kind, rows, document = classify(document, where)
    return ReportInput(kind=kind, rows=rows, document=document, question=f"--from {path}", profiles=profiles)


def number(row: dict, key: str) -> float | None:
    """A numeric field, or None where absent or not a number."""
    value = row.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def memory_share(row: dict) -> float | None:
    """The row's predicted memory over the GPU's: the calibrated usage where the model judged
    with it, else Eq. 18's total (``memory_fraction``)."""
    memory = number(row, "memory_gib")
    usage = number(row, "usage_gib")
    if usage is not None and memory:
        return usage / memory
    return number(row, "memory_fraction")
