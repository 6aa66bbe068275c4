"""One layout in detail, rebuilt from its row with the advisor's own models: per pipeline stage
the memory terms (seed 004's Eq. 18 and the calibrated model's additions), the step time's
parts (``advisor.throughput.StepTime``) and each rank's time per microbatch (for the schedule).

Nothing is priced here: ``advisor.memory.estimate_memory``, ``advisor.verdicts.calibrated_terms``
and the estimate command's time path (``advisor.cli.estimate``, the sweep's pricing) do it, so
the page shows the numbers the terminal shows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from advisor.memory import GIB
from advisor.paper_rule import DEFAULT_THRESHOLD, percent
from advisor.saved_row import is_moe_row, number, row_layout, row_options, row_spec
from advisor.saved_row_time import row_times

SEGMENTS = ("weights", "gradients", "optimizer", "layer activations", "embedding activations",
            "output activations", "runtime, allocator, logits, mask")
"""Stacked memory, bottom to top; the last is the calibrated model's addition to Eq. 18."""


@dataclass(frozen=True, slots=True)
class LayoutDetail:
    label: str
    pp: int
    vpp: int
    num_microbatches: int
    memory_gib: float | None
    threshold_gib: float | None
    """The paper's rule's line (memory model 'paper': the row's recorded --threshold of the
    memory, ``paper_threshold``), a time plan's limit per stage, else None."""
    stages: list[dict]
    """Per stage: each of SEGMENTS in GiB."""
    model_name: str
    """Which memory model the segments are: 'Eq. 18' or 'calibrated'."""
    time_parts: dict | None
    """StepTime's parts in seconds (total_s included), with a GPU preset."""
    forward_s: list[float] | None
    backward_s: list[float] | None
    """Each rank's forward and backward time per microbatch (all its chunks)."""
    threshold_label: str
    """What the threshold line is: the paper's rule (``rule_label``), or a time plan's limit per
    stage."""
    experts: str | None = None
    """An MoE row's expert layout and routing assumptions (``moe_detail.experts_text``)."""


def paper_threshold(row: dict) -> float:
    """The fraction of the memory under which the paper's rule judged ``row`` 'fits': the
    'threshold' a sweep's rows and an estimate record (its --threshold), else the default, as for
    a file saved before they recorded it; checked in (0, 1] by
    ``advisor.report.inputs``."""
    recorded = number(row, "threshold")
    return DEFAULT_THRESHOLD if recorded is None else recorded


def rule_label(threshold: float) -> str:
    """The line's name: the paper's own 80%, or another --threshold."""
    return f"{percent(threshold)} ({'4D paper' if threshold == DEFAULT_THRESHOLD else '--threshold'})"


def row_label(row: dict) -> str:
    rank = f"#{row['rank']} " if row.get("rank") else ""
    extra = "".join(f" {key.upper()} {row[key]}" for key in ("vpp", "ep", "etp")
                    if isinstance(row.get(key), int) and row[key] > 1)
    return f"{rank}TP {row.get('tp')} CP {row.get('cp')} PP {row.get('pp')} MBS {row.get('mbs')}{extra}"


def _stage_segments(estimate, calibrated, attention_buffer: float = 0.0) -> list[dict]:
    """Each stage's memory by segment; calibrated, each activation term by its factor (the local
    attention's ``attention_buffer``, in the layer activations of stages with layers, by the
    allocator's alone: ``verdicts.CalibratedTerms.stage_bytes``)."""
    stages = []
    for i, stage in enumerate(estimate.stages):
        acts = (stage.layer_activations_bytes, stage.embedding_activations_bytes, stage.output_activations_bytes)
        added = 0.0
        if calibrated is not None:
            def at(name: str) -> float:
                return float(np.broadcast_to(getattr(calibrated, name), (len(estimate.stages),))[i])

            buffer = attention_buffer if stage.layer_activations_bytes > 0 else 0.0
            acts = (at("layer_factor") * (acts[0] - buffer) + at("buffer_factor") * buffer,
                    at("embedding_factor") * acts[1], at("output_factor") * acts[2])
            added = at("added")
        values = (stage.weights_bytes, stage.gradients_bytes, stage.optimizer_bytes, *acts, added)
        stages.append({name: value / GIB for name, value in zip(SEGMENTS, values)})
    return stages


def layout_detail(row: dict) -> LayoutDetail:
    """The detail of a sweep row or an estimate (their JSON); an MoE row's by its own terms
    (``advisor.report.moe_detail``)."""
    from advisor.memory import estimate_memory
    from advisor.memory_terms import local_attention_buffer

    if is_moe_row(row):
        return _moe_detail(row)

    spec = row_spec(row)
    training = row_options(row)
    # the release it was priced for (report.inputs read it): Megatron-FSDP's buffers differ by release
    options = training.memory_options(row.get("megatron_version"))
    parallel, workload, layers = row_layout(row, spec)
    estimate = estimate_memory(spec, parallel, workload, options, layers)
    memory = number(row, "memory_gib")
    calibrated = None
    if row.get("memory_model") in ("calibrated", "profile") and memory:
        from advisor.throughput.calibration import load_memory_calibration
        from advisor.verdicts import calibrated_terms

        calibrated = calibrated_terms(spec, workload.seq_len, parallel.mbs, parallel.tp, parallel.cp,
                                      np.arange(parallel.pp), parallel.pp, options.recompute == "full", options,
                                      load_memory_calibration(), memory)
    parts = forward = backward = None
    if row.get("gpu"):
        _, parts, forward, backward = row_times(row, spec, parallel, workload, layers, training)
    fraction = paper_threshold(row)
    threshold = fraction * memory if memory and row.get("memory_model", "paper") == "paper" else None
    return LayoutDetail(label=row_label(row), pp=parallel.pp, vpp=parallel.vpp,
                        num_microbatches=workload.num_microbatches(parallel) or 1, memory_gib=memory,
                        threshold_gib=threshold, stages=_stage_segments(
                            estimate, calibrated, float(local_attention_buffer(spec, workload.seq_len, parallel.mbs,
                                                                               parallel.tp, options))),
                        model_name="calibrated" if calibrated is not None else "Eq. 18", time_parts=parts,
                        forward_s=forward, backward_s=backward, threshold_label=rule_label(fraction))


def _moe_detail(row: dict) -> LayoutDetail:
    """An MoE row: its stages' MoE terms (weights, gradients and optimizer states as a dense
    stage's, with whose they are in words, FP8 weights, the activation buckets, the dispatcher's
    buffers); the step's parts (the all-to-all's among them: a sweep row's
    repriced, as the dense rows' are); the schedule in layer units (the MoE time model prices the
    step, not each rank's microbatch)."""
    from advisor.report.moe_detail import experts_text, moe_layout

    stages, calibrated, spec, parts, owners = moe_layout(row)
    memory = number(row, "memory_gib")
    pp, vpp = row["pp"], row.get("vpp") or 1
    fraction = paper_threshold(row)
    return LayoutDetail(label=row_label(row), pp=pp, vpp=vpp,
                        num_microbatches=max(1, row["global_batch_size"] // (row["mbs"] * row["dp"])),
                        memory_gib=memory,
                        threshold_gib=fraction * memory if memory and not calibrated else None,
                        stages=stages, model_name="calibrated MoE" if calibrated else "MoE",
                        time_parts=row.get("time_parts") or parts, forward_s=None, backward_s=None,
                        threshold_label=rule_label(fraction),
                        experts=experts_text(row) + " " + owners)


def plan_detail(plan: dict) -> LayoutDetail:
    """A plan's stages: its predicted memory per stage (the profiles' or Eq. 18's, as the planner
    predicted it) and, for a time plan, each stage's forward + backward time per microbatch
    (drawn 1 : 2, the ratio of a layer's FLOPs; the plan records only their sum)."""
    stages = [{"predicted": stage.get("predicted_gib") or 0.0} for stage in plan.get("stages", [])]
    times = [stage.get("predicted_time_s") for stage in plan.get("stages", [])]
    timed = bool(times) and all(isinstance(t, (int, float)) for t in times)
    limit = number(plan, "memory_limit_gib")
    return LayoutDetail(
        label=f"plan: TP {plan.get('tp')} CP {plan.get('cp')} PP {plan.get('pp')} MBS {plan.get('micro_batch_size')}",
        pp=len(stages), vpp=1, num_microbatches=int(plan.get("num_microbatches") or 1), memory_gib=limit,
        threshold_gib=number(plan, "stage_limit_gib"), threshold_label="limit per stage (--threshold)", stages=stages,
        model_name=f"{(plan.get('predictor') or {}).get('name', 'plan')} prediction",
        time_parts=None, forward_s=[t / 3 for t in times] if timed else None,
        backward_s=[2 * t / 3 for t in times] if timed else None)
