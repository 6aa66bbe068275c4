"""What a report is made of: the document a command wrote (a sweep's rows, an estimate, a plan),
where it came from, and the profiles to compare against.

A row's fields are read as advisor-launch reads them (``advisor.saved_row.check_saved_fields``:
an unknown field, verdict or out-of-range number is refused by both); an optional field it lacks
is left out, never an error. What the page re-prices a row with (its model, options, layout, GPU preset) is checked as advisor-launch
checks it, and so is the row's own ``megatron_args`` against its fields (``advisor.row_flags``, the
launcher's check: the page shows the flags beside the price of the fields), each problem one line
naming the file and the row.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from advisor import limits
from advisor.errors import AdvisorError

from advisor.saved_row import check_saved_fields, moe_row_settings, number, positive_count, row_options, row_spec

if TYPE_CHECKING:  # the report's readers import the models only when they read a row
    from advisor.models import LlamaSpec



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
    **{key: ("a positive integer or null", lambda v: v is None or positive_count(v))
       for key in ("vpp", "ep", "etp", "gpus", "rank", "recompute_num_layers", "dispatcher_sms")},
    **{key: ("a finite number or null", lambda v: v is None or limits.finite_number(v))
       for key in ("margin_gib", "memory_fraction", "model_states_gib", "activations_gib", "tflops_per_gpu", "mfu",
                   "tokens_per_s", "imbalance", "capacity_factor", "days", "gpu_hours", "cost_usd")},
    **{key: ("a string or null", lambda v: v is None or isinstance(v, str))
       for key in ("gpu", "memory_model", "recompute", "recompute_method", "dispatcher", "routing",
                   "flex_backend")},
    **{key: ("true, false or null", lambda v: v is None or isinstance(v, bool))
       for key in ("a2a_overlap", "delay_wgrad", "pad_to_capacity", "distributed_optimizer", "permute_fusion",
                   "router_fusion", "shared_expert_overlap")},
    # the node size the row was priced at (its time model's NVLink domain), bounded as --gpus-per-node is
    "gpus_per_node": (f"a positive integer up to {int(limits.GPUS_PER_NODE.high)} or null",
                      lambda v: v is None or positive_count(v) and v <= limits.GPUS_PER_NODE.high),
    # the paper's rule's fraction, bounded as advisor sweep's --threshold is (a hand-edited 5 drew no rule)
    "threshold": ("a number in (0, 1] or null", lambda v: v is None or limits.finite_number(v) and 0 < v <= 1),
    "options": ("an object", lambda v: isinstance(v, dict)),
    "layers_per_stage": ("a list of layer counts", lambda v: isinstance(v, list) and all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in v)),
    **{key: ("a list of strings or null", lambda v: v is None or isinstance(v, list) and all(
        isinstance(x, str) for x in v)) for key in ("megatron_args", "recompute_modules")},
}


def _check_row(row: dict, where: str, kind: str = "sweep row") -> None:
    """One line naming the first field the report could not read (a hand-edited or truncated
    row was a KeyError or TypeError deep in the page's figures), or the first flag of its own
    ``megatron_args`` that its fields contradict (``kind``, sweep row or estimate, names it)."""
    from advisor.moe.spec import is_moe

    check_saved_fields(row, where)  # advisor-launch's check: what one refuses, the other does
    for key in _LAYOUT:
        if not positive_count(row.get(key)):
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
    from advisor.row_flags import as_written, check_own_args, priced_release, row_flags

    priced_release(row, where)  # the detail prices the row for it: one it knows, or none (older rows)
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
    check_own_args(where, kind, tuple(row["megatron_args"]),
                   as_written(row, where, row_flags(row, spec, layers, options, moe)))


def _saved_options(given: dict):
    """The row's 'options' as ``TrainingOptions``, read once per distinct object: a sweep's
    thousands of rows share a handful. Keyed by their JSON text, which tells true from 1."""
    return _options_of(json.dumps(given, sort_keys=True))


@functools.lru_cache(maxsize=64)
def _options_of(text: str):
    from advisor.options import TrainingOptions

    return TrainingOptions.from_dict(json.loads(text))


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
        if not (isinstance(row["model"], dict) and "num_experts" in row["model"]):  # MoE: moe_row_settings
            layers = row.get("layers_per_stage")
            check_layout(spec, ParallelConfig(tp=row["tp"], cp=row["cp"], pp=row["pp"], dp=row["dp"], mbs=row["mbs"],
                                              vpp=row.get("vpp") or 1),
                         Workload(seq_len=row["seq_len"], global_batch_size=row["global_batch_size"]),
                         None if layers is None else tuple(layers), split_name="'layers_per_stage'")
    except AdvisorError as exc:
        raise AdvisorError(f"{where}: {exc}") from None


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
    from advisor.capture.plan import SCHEMA as PLAN_SCHEMA

    if isinstance(document, dict) and document.get("schema") == PLAN_SCHEMA:
        from advisor.capture.plan import check_plan

        check_plan(document, where)  # the plan's one reader (advisor-launch's): every field it holds
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


def read_input(path: Path, profiles: tuple[Path, ...] = ()) -> ReportInput:
    """A saved sweep, row, estimate or plan (``--from FILE``, or ``--from -``: standard input, so
    that a sweep pipes into its page), through the bounded JSON reader."""
    from advisor.fileio import read_json_input

    document, where = read_json_input(path, what="report input")
    kind, rows, document = classify(document, where)
    return ReportInput(kind=kind, rows=rows, document=document, question=f"--from {path}", profiles=profiles)


def memory_share(row: dict) -> float | None:
    """The row's predicted memory over the GPU's: the calibrated usage where the model judged
    with it, else Eq. 18's total (``memory_fraction``)."""
    memory = number(row, "memory_gib")
    usage = number(row, "usage_gib")
    if usage is not None and memory:
        return usage / memory
    return number(row, "memory_fraction")
