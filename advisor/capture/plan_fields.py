"""The fields of a plan document (``advisor.capture.plan``) that its layout checks leave: which
fields a plan may hold at all, its per-GPU memory, its training options, and the numbers and
objects the report draws. Checked by ``check_plan``, the one reader of a plan for advisor-launch
and ``advisor report`` alike: a hand-edited plan one accepts, the other accepts too."""

from __future__ import annotations

from advisor import limits
from advisor.errors import AdvisorError

FIELDS = frozenset({
    "schema", "version", "mode", "objective", "launchable", "not_launchable_reason", "predictor", "model", "seq_len",
    "setup", "gpus", "gpus_per_node", "world_size", "tp", "cp", "dp", "pp", "micro_batch_size", "global_batch_size",
    "num_microbatches", "layers_per_stage", "stages", "gpu_memory", "peak_predicted_gib", "memory_model", "verdict",
    "memory_limit_gib", "stage_limit_gib", "period_s", "predicted_step_time_s", "baseline", "excluded", "options",
    "megatron_version", "megatron_args",
})
"""Every field ``Plan.to_dict`` writes (tests/test_saved_readers_agree.py holds the two alike);
plans written before some of them existed lack those, which is no error."""
STAGE_FIELDS = frozenset({
    "stage", "first_layer", "last_layer", "layers", "tp", "dp", "cp", "gpus", "nodes", "in_flight_microbatches",
    "predicted_bytes", "predicted_gib", "predicted_time_s",
})
"""Every field ``PlanStage.to_dict`` writes."""


def check_plan_fields(document: dict, stages: list[dict], where: str) -> None:
    """One line naming the first field of the plan (or of a stage in ``stages``) that no plan
    holds, its 'gpu_memory' where it is not its stages' GPUs and memory, its 'options' where
    they cannot be read, and the numbers and objects the report draws where they are not."""
    _refuse_unknown(document, FIELDS, where)
    for index, stage in enumerate(stages):
        _refuse_unknown(stage, STAGE_FIELDS, f"{where}: stage {index}")
    if "gpu_memory" in document:
        _check_gpu_memory(document, stages, where)
    if document.get("options") is not None:
        from advisor.options import TrainingOptions

        if not isinstance(document["options"], dict):
            raise AdvisorError(f"{where}: 'options' {limits.must_be('null or an object', document['options'])}")
        try:  # what the launcher emits the flags from, and the page prices
            TrainingOptions.from_dict(document["options"])
        except AdvisorError as exc:
            raise AdvisorError(f"{where}: the plan's 'options' cannot be read: {exc}") from None
    _check_drawn(document, stages, where)


def _refuse_unknown(document: dict, known: frozenset, where: str) -> None:
    if problem := limits.unknown_field(document, known, "no plan the advisor writes has it"):
        raise AdvisorError(f"{where}: {problem}")


def _check_gpu_memory(document: dict, stages: list[dict], where: str) -> None:
    """'gpu_memory' is derived from the stages (``Plan.gpu_memory``): every GPU in order, its node
    and its stage's memory. Anything else (-1, a GPU of another stage) is a hand edit of one
    without the other, which the page would draw as if it were the plan's."""
    per_node = limits.check_int(document.get("gpus_per_node", limits.ABSENT), "'gpus_per_node'",
                                limits.GPUS_PER_NODE, where)
    places = sorted((gpu, gpu // per_node, index) for index, stage in enumerate(stages) for gpu in stage["gpus"])
    given = document["gpu_memory"]
    if not isinstance(given, list) or len(given) != len(places):
        raise AdvisorError(f"{where}: 'gpu_memory' {limits.must_be(f'a list of the stages {len(places)} GPUs', given)}")
    for index, (row, (gpu, node, stage)) in enumerate(zip(given, places)):
        if not isinstance(row, dict) or row.keys() != {"gpu", "node", "stage", "predicted_gib"} or any(
                type(row[key]) is not int for key in ("gpu", "node", "stage")) or (  # true is not GPU 1
                row["gpu"], row["node"], row["stage"]) != (gpu, node, stage):
            raise AdvisorError(f"{where}: 'gpu_memory' entry {index} must be GPU {gpu} of node {node} and stage "
                               f"{stage} with its predicted_gib, got {limits.json_text(row)}")
        if not _number(row["predicted_gib"]):
            raise AdvisorError(f"{where}: 'gpu_memory' entry {index}: 'predicted_gib' "
                               f"{limits.must_be('a number of GiB, at least 0', row['predicted_gib'])}")


def _number(value) -> bool:
    return limits.finite_number(value) and value >= 0


def _check_drawn(plan: dict, stages: list[dict], where: str) -> None:
    """The fields of a plan that the page draws and launch nothing: one line naming the field,
    where they were a TypeError or an AttributeError in the report's figures."""
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
        if plan.get(key) is not None and not limits.finite_number(plan[key]):
            refuse(f"'{key}'", "a finite number or null", plan[key])
    even = (plan.get("baseline") or {}).get("stage_predicted_gib")
    if even is not None and not (isinstance(even, list) and all(v is None or limits.finite_number(v) for v in even)):
        refuse("'baseline' 'stage_predicted_gib'", "a list of finite numbers", even)
    for index, stage in enumerate(stages):
        for key in ("predicted_gib", "predicted_time_s"):
            if stage.get(key) is not None and not limits.finite_number(stage[key]):
                refuse(f"stage {index}: '{key}'", "a finite number or null", stage[key])
