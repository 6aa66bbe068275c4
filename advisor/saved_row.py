"""A sweep row or an estimate saved as JSON (``--format json``), read back into what priced it:
its model, training options, layout, GPU preset and MoE settings. The readers of a saved row,
advisor-launch (``launch.inputs``), the report (``advisor.report.inputs``) and the evaluation
note (``advisor.evaluation``), read it here, so one row is launched, shown and priced alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from advisor import limits
from advisor.errors import AdvisorError

if TYPE_CHECKING:  # the models are imported only when a row is read
    from advisor.moe.spec import MoESpec


ROW_FIELDS = frozenset({
    # the layout and its memory (advisor.sweep.SweepRow.to_dict; an MoE row's, advisor.moe.space._rows)
    "rank", "tp", "cp", "pp", "mbs", "dp", "ep", "etp", "edp", "gpus", "vpp", "layers_per_stage", "num_microbatches",
    "recompute", "recompute_method", "recompute_num_layers", "recompute_modules", "total_gib", "model_states_gib",
    "activations_gib", "peak_stage", "memory_fraction", "verdict",
    # the calibrated verdict (advisor.verdicts), the time (advisor.throughput, advisor.moe.time, advisor.escalation)
    "usage_gib", "margin_gib", "calibrated_peak_stage", "step_time_s", "tflops_per_gpu", "mfu", "tokens_per_s",
    "ep_comm_s", "lever_time_cost_s",
    # --tokens and --gpu-hour-price (advisor.ranking), --plot's columns (advisor.cli.estimate._sweep_text)
    "tokens", "days", "gpu_hours", "cost_usd", "split", "recompute_text",
    # the setup, options and flags (advisor.cli.estimate.sweep, advisor.cli.moe.sweep, advisor.pricing)
    "seq_len", "global_batch_size", "memory_gib", "memory_model", "threshold", "gpu", "gpus_per_node",
    "ranking_tolerance", "megatron_version", "model", "options", "megatron_args",
    # an MoE row's settings (advisor.moe.space._RowParts; read back by moe_row_settings)
    "dispatcher", "a2a_overlap", "delay_wgrad", "dispatcher_sms", "permute_fusion", "router_fusion",
    "shared_expert_overlap", "flex_backend", "routing", "capacity_factor", "pad_to_capacity", "gradient_bytes",
    "distributed_optimizer", "imbalance",
    # an estimate's stages and time parts, --compare-best's row, --from-command's read-back (advisor.cli.from_command)
    "stages", "time_parts", "best_sweep_row", "read_from", "unpriced", "not_launched",
})
"""Every field a sweep row (dense or MoE) or an estimate that the advisor writes as JSON may
carry, with any of its options. A reader that refuses another (``unknown_field``) takes a
misspelt field ('vp' for 'vpp', which left VPP at 1) for what it is, where it was ignored without
a word. A field the writers add goes here too: tests/test_launch_inputs.py writes rows and
estimates with every optional field, launches them, and holds this set to what they carry."""


def unknown_field(row: dict) -> str | None:
    """The problem of the first field of ``row`` that no sweep row or estimate carries
    (``ROW_FIELDS``), with the known field it may misspell; None where there is none."""
    return limits.unknown_field(row, ROW_FIELDS, "no sweep row or estimate the advisor writes has it")


NUMBERS = {
    "total_gib": limits.Bound(0, 1e15, "a GPU holds at most a few hundred GiB"),
    "usage_gib": limits.Bound(0, 1e15, "a GPU holds at most a few hundred GiB"),
    "peak_predicted_gib": limits.Bound(0, 1e15, "a GPU holds at most a few hundred GiB"),
    "memory_gib": limits.GPU_MEMORY_GIB,
    "tokens": limits.Bound(0, 1e300, "a token budget is a finite count"),
    "step_time_s": limits.Bound(1e-6, 1e9, "a training step takes milliseconds to minutes"),
}
"""The numbers a saved row, estimate or plan ('peak_predicted_gib') may carry besides its layout
(positive: 0 is above none of them)."""


def saved_number(document: dict, key: str, where: str) -> float | None:
    """A positive, finite number within ``NUMBERS[key]``, or None where absent or null (a row's
    step time of 1e-300 s was an OverflowError pricing the save interval, tokens 0 or -1 became
    --train-samples 0, a string was ignored without a word)."""
    value = document.get(key)
    if value is None:
        return None
    return limits.check_float(value, repr(key), NUMBERS[key], where, low_open=True)


def verdicts() -> tuple[str, ...]:
    """A row's 'verdict' (the paper's rule's or the calibrated model's): 'OOM' or 5 skipped the
    launcher's warning that the row does not fit, without a word."""
    from advisor.paper_rule import PAPER_VERDICTS
    from advisor.verdicts import CALIBRATED_VERDICTS

    return tuple(dict.fromkeys(PAPER_VERDICTS + CALIBRATED_VERDICTS))


def check_saved_fields(row: dict, where: str) -> None:
    """The fields of a saved sweep row or estimate that advisor-launch and the report read alike,
    checked once for both (``launch.inputs``, ``advisor.report.inputs``): no unknown field, a
    known 'verdict', and its numbers (``NUMBERS``) within their bounds. One line naming ``where``."""
    if problem := unknown_field(row):  # first: 'tpp' for 'tp' is more than a missing 'tp'
        raise AdvisorError(f"{where}: {problem}")
    known = verdicts()
    if row.get("verdict") is not None and row["verdict"] not in known:
        raise AdvisorError(f"{where}: 'verdict' {limits.must_be('null or ' + ', '.join(known), row['verdict'])}")
    for key in NUMBERS.keys() & row.keys():
        saved_number(row, key, where)


def positive_count(value) -> bool:
    """A JSON integer a layout degree or count can be: above 0, within JSON's exact integers."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= limits.JSON_INT


def number(row: dict, key: str) -> float | None:
    """A numeric field, or None where absent or not a number."""
    value = row.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def is_moe_row(row: dict) -> bool:
    return isinstance(row.get("model"), dict) and "num_experts" in row["model"]


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


def row_layout(row: dict, spec):
    """(ParallelConfig, Workload, layers per stage) of the row, as the sweep priced it."""
    from advisor.parallel import ParallelConfig, Workload, default_layers_per_stage

    parallel = ParallelConfig(tp=row["tp"], cp=row["cp"], pp=row["pp"], dp=row["dp"], mbs=row["mbs"],
                              vpp=row.get("vpp") or 1)
    workload = Workload(seq_len=row["seq_len"], global_batch_size=row["global_batch_size"])
    layers = tuple(row.get("layers_per_stage") or default_layers_per_stage(spec.num_layers, parallel.pp))
    return parallel, workload, layers



def row_gpu(row: dict):
    """The row's GPU preset at its own memory and node size, as its step was priced: the
    preset's alone re-priced TP 8 on 4-GPU nodes over NVLink, parts the row's step never had."""
    from advisor.hardware import get_gpu

    return get_gpu(row["gpu"]).with_overrides(memory_gib=number(row, "memory_gib") or None,
                                              gpus_per_node=row.get("gpus_per_node"))



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
        if not positive_count(row.get(key)):
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
    shared = _given(row, "shared_expert_overlap", False)
    switches = (overlap, delay, sharded, *fusions, shared)
    if not all(isinstance(value, bool) for value in switches) or grads not in (2, 4):
        refuse("'a2a_overlap', 'delay_wgrad', 'distributed_optimizer', 'permute_fusion', 'router_fusion' and "
               "'shared_expert_overlap' must be true or false, 'gradient_bytes' 2 or 4")
    # megatron-core's refusals of the EP all-to-all overlap and of --moe-shared-expert-overlap that
    # the layout does not decide, in the words the command line's check uses (advisor.moe.overlap;
    # the layout's: advisor.moe.space.layout_problem). The recomputation method and layer count
    # are launched under full recomputation only (advisor.moe.flags), which the layout's check refuses.
    if problem := settings_problem(a2a_overlap=overlap, delay_wgrad=delay, dispatcher=dispatcher,
                                   recompute=recompute, recompute_modules=modules, shared_expert_overlap=shared,
                                   mtp_num_layers=spec.mtp_num_layers):
        refuse(problem)
    if shared and (problem := _shared_overlap_problem(dispatcher, modules, spec)):
        refuse(problem)
    sms = row.get("dispatcher_sms")
    if sms is not None:  # a string was 'abc' % 2, a TypeError; -2 and 0 were launched as written
        limits.check_int(sms, "'dispatcher_sms'", limits.DISPATCHER_SMS, where)
    gpu = row["gpu"] if isinstance(row.get("gpu"), str) else None
    if problem := dispatcher_sms_problem(sms, dispatcher, _architecture(row), gpu,
                                         unnamed="where the row names no 'gpu'"):
        refuse(problem.replace("--moe-deepep-num-sms", "'dispatcher_sms'"))
    backend = row.get("flex_backend")
    if backend not in (None, *FLEX_BACKENDS) or (backend not in (None, "deepep") and dispatcher != "flex"):
        refuse(f"'flex_backend' must be null or, with the flex dispatcher, {_choices(FLEX_BACKENDS)}; got "
               f"{limits.json_text(backend)} with {limits.json_text(dispatcher)}")
    return {**settings, "recompute": recompute, "recompute_modules": modules, "a2a_overlap": overlap,
            "shared_expert_overlap": shared, "delay_wgrad": delay, "gradient_bytes": grads, "distributed_optimizer": sharded, "dispatcher_sms": sms,
            "permute_fusion": fusions[0], "router_fusion": fusions[1], "flex_backend": backend}


def row_routing(settings: dict):
    """The routing a saved MoE row was priced with (``advisor.moe.memory.RoutedTokens``), from its
    ``moe_row_settings``: a padding it does not state was priced padded (``advisor.moe.flags.row_pads``)."""
    from advisor.moe.memory import RoutedTokens

    return RoutedTokens(routing=settings["routing"], capacity_factor=settings["capacity_factor"],
                        pad_to_capacity=settings["pad_to_capacity"] is not False, imbalance=settings["imbalance"])


def _shared_overlap_problem(dispatcher: str, modules, spec) -> str | None:
    """megatron-core's refusal of a row's 'shared_expert_overlap' with its dispatcher and
    recomputed modules (``advisor.moe.overlap.shared_expert_overlap_problem``, the command line's
    check), under the newest release's rules: a row does not say which release it is launched
    on, and core_v0.19.0 takes the flex dispatcher that core_v0.15.2 refuses; advisor-launch
    checks the release it launches on (``launch.arguments.check_moe_refusals``)."""
    from advisor.moe.overlap import shared_expert_overlap_problem
    from advisor.releases import NEWEST

    return shared_expert_overlap_problem(dispatcher=dispatcher, a2a_overlap=False, recompute_modules=modules,
                                         shared_experts=bool(spec.shared_expert_size), release=NEWEST)


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
