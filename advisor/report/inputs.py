"""What a report is made of: the document a command wrote (a sweep's rows, an estimate, a plan),
where it came from, and the profiles to compare against.

Rows are read by key and defensively: a field another version of the advisor adds (an option, an
expert-parallel degree) is shown as it is, a field it lacks is left out, never an error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from advisor import limits
from advisor.errors import AdvisorError

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
       for key in ("vpp", "ep", "etp", "gpus", "rank", "recompute_num_layers")},
    **{key: ("a finite number or null", lambda v: v is None or _finite(v))
       for key in ("total_gib", "usage_gib", "memory_gib", "margin_gib", "memory_fraction", "model_states_gib",
                   "activations_gib", "step_time_s", "tflops_per_gpu", "mfu", "tokens_per_s", "imbalance",
                   "capacity_factor", "days", "gpu_hours", "cost_usd")},
    **{key: ("a string or null", lambda v: v is None or isinstance(v, str))
       for key in ("verdict", "gpu", "memory_model", "recompute", "recompute_method", "dispatcher", "routing")},
    **{key: ("true, false or null", lambda v: v is None or isinstance(v, bool))
       for key in ("a2a_overlap", "delay_wgrad", "pad_to_capacity", "distributed_optimizer")},
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


def _check_row(row: dict, where: str) -> None:
    """One line naming the first field the report could not read (a hand-edited or truncated
    row was a KeyError or TypeError deep in the page's figures)."""
    for key in _LAYOUT:
        if not _positive(row.get(key)):
            raise AdvisorError(f"{where}: '{key}' must be a positive integer, got {_shown(row.get(key))}")
    for key, (what, valid) in _FIELDS.items():
        if key in row and not valid(row[key]):
            raise AdvisorError(f"{where}: '{key}' must be {what}, got {_shown(row[key])}")
    if "model" in row and not isinstance(row["model"], (str, dict)):
        raise AdvisorError(f"{where}: 'model' must be a preset's name or a model object, got {_shown(row['model'])}")
    if isinstance(row.get("model"), dict) and "num_experts" in row["model"]:
        moe_row_settings(row, where)  # as advisor-launch reads it: what one refuses, the other does


MOE_DISPATCHERS = ("alltoall", "allgather", "flex")
"""--moe-token-dispatcher-type's choices (advisor.cli.moe.moe_options)."""
MOE_ROUTINGS = ("balanced", "capacity", "dropless")
"""--moe-routing's choices (advisor.cli.moe.moe_options)."""


def moe_row_settings(row: dict, where: str) -> dict:
    """The MoE settings of a sweep row or an estimate (EP, ETP, dispatcher, routing, recomputation,
    overlap, gradients), checked as ``advisor sweep`` and ``estimate`` check the flags they come
    from (``advisor.cli.moe.moe_settings``: the same refusals, one line naming the row's field),
    an absent one at the command's default. The one check of both readers of a saved MoE row,
    advisor-launch's (``launch.inputs``) and the report's (``classify``): a hand-edited row that
    one would launch or price differently from the other is refused by both."""
    from advisor.moe.overlap import settings_problem
    from advisor.moe.space import RECOMPUTES
    from advisor.moe.spec import RECOMPUTE_MODULES

    def refuse(text: str):
        raise AdvisorError(f"{where}: {text}")

    for key in ("ep", "etp"):  # an MoE row is priced by EP and ETP
        if not _positive(row.get(key)):
            refuse(f"an MoE row's '{key}' must be a positive integer, got {_shown(row.get(key))}")
    dispatcher = _given(row, "dispatcher", "alltoall")
    if dispatcher not in MOE_DISPATCHERS:
        refuse(f"'dispatcher' must be {_choices(MOE_DISPATCHERS)}, got {_shown(dispatcher)}")
    settings = {"ep": row["ep"], "etp": row["etp"], "dispatcher": dispatcher, **_moe_routing(row, dispatcher, refuse)}
    recompute, modules = _given(row, "recompute", "none"), row.get("recompute_modules")
    if recompute not in RECOMPUTES:
        refuse(f"'recompute' must be {_choices(RECOMPUTES)}, got {_shown(recompute)}")
    if modules is not None and (not isinstance(modules, list) or not modules
                                or not all(module in RECOMPUTE_MODULES for module in modules)):
        refuse(f"'recompute_modules' must be null or a list of {_choices(RECOMPUTE_MODULES)}, got {_shown(modules)}")
    if modules and recompute != "selective":  # Megatron reads --recompute-modules only with selective
        refuse(f"'recompute_modules' needs 'recompute' selective, got {_shown(recompute)}")
    method, layers = row.get("recompute_method"), row.get("recompute_num_layers")
    if recompute == "full" and (method not in (None, "uniform") or layers not in (None, 1) or layers is True):
        # the MoE model prices full recomputation of every layer, launched so (advisor.moe.flags)
        refuse(f"an MoE row's full recomputation is 'recompute_method' uniform with 'recompute_num_layers' 1 (every "
               f"layer, as priced), got {_shown(method)} and {_shown(layers)}")
    overlap, delay = _given(row, "a2a_overlap", False), _given(row, "delay_wgrad", False)
    grads, sharded = _given(row, "gradient_bytes", 4), _given(row, "distributed_optimizer", True)
    if not all(isinstance(value, bool) for value in (overlap, delay, sharded)) or grads not in (2, 4):
        refuse("'a2a_overlap', 'delay_wgrad' and 'distributed_optimizer' must be true or false, 'gradient_bytes' 2 "
               "or 4")
    # megatron-core's refusals of the EP all-to-all overlap that the layout does not decide, in the
    # words the command line's check uses (advisor.moe.overlap; the layout's: advisor.moe.space.layout_problem).
    # A row carries no --moe-shared-expert-overlap, and its recomputation method and layer count
    # are launched under full recomputation only (advisor.moe.flags), which the layout's check refuses.
    if problem := settings_problem(a2a_overlap=overlap, delay_wgrad=delay, dispatcher=dispatcher,
                                   recompute=recompute, recompute_modules=modules, mtp_num_layers=_mtp_layers(row)):
        refuse(problem)
    return {**settings, "recompute": recompute, "recompute_modules": modules, "a2a_overlap": overlap,
            "delay_wgrad": delay, "gradient_bytes": grads, "distributed_optimizer": sharded}


def _mtp_layers(row: dict) -> int:
    """The MTP layers of a row's model object (0 without one, or where the model's own check,
    ``spec_from_dict``, will refuse what it holds)."""
    model = row.get("model")
    layers = model.get("mtp_num_layers", 0) if isinstance(model, dict) else 0
    return layers if isinstance(layers, int) and not isinstance(layers, bool) else 0


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
        refuse(f"'routing' must be {_choices(MOE_ROUTINGS)}, got {_shown(routing)}")
    if routing == "capacity" and factor is None:
        refuse("'routing' capacity needs a 'capacity_factor' (--moe-routing capacity needs "
               "--moe-expert-capacity-factor)")
    if routing != "capacity" and factor is not None:
        refuse(f"'capacity_factor' drops tokens (capacity routing); 'routing' {routing} routes every token: give "
               "one of them")
    pad = row.get("pad_to_capacity")
    if pad is not None and not isinstance(pad, bool):
        refuse(f"'pad_to_capacity' must be null, true or false, got {_shown(pad)}")
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


def _shown(value) -> str:
    text = "nothing" if value is None else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def classify(document: object, where: str) -> tuple[str, list[dict], dict | None]:
    """(kind, rows, document) of the JSON of 'advisor sweep --format json', one sweep row,
    'advisor estimate --format json' or 'advisor recommend -o'."""
    if isinstance(document, list):
        if not document:
            raise AdvisorError(f"{where}: the sweep holds no rows")
        if not all(isinstance(row, dict) and "tp" in row for row in document):
            raise AdvisorError(f"{where}: a sweep array must hold row objects (advisor sweep --format json)")
        for number_, row in enumerate(document, 1):
            _check_row(row, f"{where}, row {number_}")
        return "sweep", document, None
    if isinstance(document, dict) and document.get("schema") == PLAN_SCHEMA:
        from advisor.capture.plan import check_plan

        check_plan(document, where)  # the plan's own reader (advisor-launch's): every field it holds
        if not isinstance(document.get("baseline", {}), dict):
            raise AdvisorError(f"{where}: 'baseline' must be an object, got {_shown(document['baseline'])}")
        return "plan", [], document
    if isinstance(document, dict) and isinstance(document.get("stages"), list) and "tp" in document:
        _check_row(document, where)
        return "estimate", [document], document
    if isinstance(document, dict) and "tp" in document and "pp" in document:
        _check_row(document, where)
        return "sweep", [document], None
    raise AdvisorError(f"{where}: neither a sweep, a sweep row, an estimate nor a plan (expected the JSON of "
                       "'advisor sweep --format json', 'advisor estimate --format json' or 'advisor recommend -o')")


def read_input(path: Path, profiles: tuple[Path, ...] = ()) -> ReportInput:
    """A saved sweep, row, estimate or plan (``--from FILE``), through the bounded JSON reader."""
    from advisor.fileio import read_json

    kind, rows, document = classify(read_json(path, what="report input"), str(path))
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
