"""A saved sweep row or estimate re-priced by the one time model (``advisor.pricing``): its step's
parts and each pipeline rank's forward and backward per microbatch (the report's schedule), and
its forward-only evaluation iteration (``advisor.evaluation``, ``launch.evaluation``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from advisor.errors import AdvisorError
from advisor.saved_row import is_moe_row, row_gpu, row_layout, row_options, row_spec


def row_times(row: dict, spec, parallel, workload, layers, training):
    """(the time model, the step's parts as 'advisor estimate' prices them, each rank's forward and
    backward times per microbatch)."""
    from advisor.pricing import layout_times, one_layout_time

    # at the row's own node size where it records one (--gpus-per-node, a command's ranks per node)
    gpu = row_gpu(row)
    _, parts = one_layout_time(spec, gpu, workload, parallel, layers, training, None)
    model, layouts, recompute = layout_times(spec, gpu, workload, parallel, training)
    stages = layouts.stage_times(np.array([0]), np.array([parallel.vpp]), recompute, np.array([layers]))
    return model, parts, [float(s.forward[0]) for s in stages], [float(s.backward[0]) for s in stages]


@dataclass(frozen=True, slots=True)
class ForwardOnly:
    """A dense row's evaluation iteration as the time model prices it (``forward_only_iteration``)."""

    iteration_s: float
    """One forward-only iteration of the global batch (``advisor.throughput.forward_only``)."""
    step_s: float
    """The row's training step, re-priced the same way (its ``step_time_s`` where it was priced so)."""


def forward_only_iteration(row: dict) -> ForwardOnly:
    """One forward-only iteration of a dense sweep row or estimate priced on a GPU preset: each
    pipeline rank's forward per microbatch, as ``row_times`` re-prices them for the report, through
    ``forward_only_pipeline_s``, no faster than the data loader (``terms.data_loader_bound``, the
    training step's rule); no gradient reduction, no optimizer step. AdvisorError for a row this
    cannot re-price (no GPU, an MoE row: the MoE time model prices whole steps, not a rank's
    microbatch)."""
    from advisor.throughput import terms
    from advisor.throughput.forward_only import forward_only_pipeline_s

    if not row.get("gpu") or is_moe_row(row):
        raise AdvisorError("only a dense row priced on a GPU preset has per-stage forward times")
    spec = row_spec(row)
    training = row_options(row)
    parallel, workload, layers = row_layout(row, spec)
    model, parts, forward, _ = row_times(row, spec, parallel, workload, layers, training)
    m = workload.num_microbatches(parallel)
    pipeline = forward_only_pipeline_s(forward, m, parallel.vpp)
    bound = terms.data_loader_bound(pipeline, model.options.dataloader_mask == "rebuilt",
                                    workload.global_batch_size / parallel.dp, workload.seq_len, model.rates,
                                    model.options.dataloader_workers)
    return ForwardOnly(iteration_s=float(bound), step_s=parts["total_s"])
