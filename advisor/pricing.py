"""One layout priced with its training options: memory per stage, the verdict, the step time and
its parts, and the Megatron-LM flags, as one row. The one pricing behind ``advisor estimate``,
``advisor compare-log``, the published-runs report (``tables.published``) and the report's
per-layout detail (``advisor.report``); the sweep prices the same terms vectorised."""

from __future__ import annotations


def price_layout(spec, workload, parallel, stages, training, *, gpu, mem, threshold, memory_model, tokens=None,
                 release=None, time_constants=None, gpus_per_node=None, gpu_hour_price=None):
    """One layout priced with its training options (``advisor.options.TrainingOptions``): (the
    estimate's row, the memory estimate, the calibrated assessment or None, the timing fields or
    None, the time parts or None). The one pricing of ``estimate``, also behind ``compare-log``.
    ``time_constants``: the time model's fitted constants (``advisor.throughput.Calibration``;
    None: the shipped ones), for checks that price without one of them. ``gpus_per_node``: the node
    (NVLink domain) size the layout is priced at without a preset; with one, the preset's (its
    overrides applied) is what the time model read. The row records it, so that a reader (the
    launcher's TP-across-nodes warning) knows whether TP was priced within a node. ``tokens``: a
    budget (its days and GPU-hours, ``advisor.ranking.budget_fields``); ``gpu_hour_price``: with
    it, their ``cost_usd``."""
    from advisor.megatron_args import megatron_args
    from advisor.memory import estimate_memory
    from advisor.options import release_defaults
    from advisor.options.flags import release_spelling
    from advisor.paper_rule import classify, judged_threshold
    from advisor.sweep import SweepRow

    training = training.at_tp(parallel.tp)
    options = training.memory_options(release)
    result = estimate_memory(spec, parallel, workload, options, stages)
    assessment = timing = parts = verdict = None
    if mem and memory_model == "calibrated":
        from advisor.verdicts import assess

        assessment = assess(result, spec, workload.seq_len, parallel.mbs, parallel.tp, parallel.cp, mem, options)
        verdict = assessment.verdict
    elif mem:
        verdict = classify(result.total_gib, mem, threshold)
    if gpu is not None:
        timing, parts = one_layout_time(spec, gpu, workload, parallel, stages, training, tokens, time_constants)
    row = {
        **SweepRow(parallel, workload.num_microbatches(parallel), result, mem or None, verdict, options=options,
                   assessment=assessment, timing=timing, training=training).to_dict(),
        "model": spec.to_dict(), "seq_len": workload.seq_len, "global_batch_size": workload.global_batch_size,
        "options": training.changed(), "memory_gib": mem or None, "memory_model": memory_model,
        "threshold": judged_threshold(memory_model, threshold), "gpu": gpu.name if gpu else None,
        "gpus_per_node": gpu.gpus_per_node if gpu is not None else gpus_per_node,
        # as the release priced reads them: a list that runs, and reads back, as priced there
        "megatron_version": release_defaults(release).checked,
        "megatron_args": release_spelling(release, megatron_args(
            spec, workload.seq_len, tp=parallel.tp, cp=parallel.cp, layers_per_stage=result.layers,
            micro_batch_size=parallel.mbs, global_batch_size=workload.global_batch_size, options=training,
            virtual_stages=parallel.vpp, release=release)),
    }
    if parts is not None:
        row["time_parts"] = parts
    if gpu_hour_price is not None:
        from advisor.ranking import cost_usd

        row["cost_usd"] = cost_usd(row["gpu_hours"], gpu_hour_price)
    return row, result, assessment, timing, parts


def one_layout_time(spec, gpu, workload, parallel, stages, training, tokens, time_constants=None):
    """(timing fields, time parts in seconds) of one layout, priced as the sweep prices its rows
    (``advisor.rank_times``: its split, interleaving and recomputation) with its training options."""
    import numpy as np

    from advisor.stage_model import StageModel
    from advisor.parallel import default_layers_per_stage
    from advisor.ranking import timing_fields

    model, layouts, recompute = layout_times(spec, gpu, workload, parallel, training, time_constants)
    options = training.memory_options()
    p = parallel
    counts = np.array([stages or default_layers_per_stage(spec.num_layers, p.pp)])
    memory = StageModel(spec, workload.seq_len, options, tp=p.tp, cp=p.cp, dp=p.dp, mbs=p.mbs, pp=p.pp, vpp=p.vpp,
                        num_microbatches=workload.num_microbatches(p), stage=np.arange(p.pp)[None, :])
    step = layouts.step(np.array([0]), np.array([p.vpp]), recompute, counts, memory.parameters(counts).max(axis=1))
    timing = timing_fields(model, step, p.gpus, p.tp, tokens)[0]
    return timing, {k: float(v) for k, v in step.row(0).items()}


def layout_times(spec, gpu, workload, parallel, training, time_constants=None):
    """(the time model, the layout's ``rank_times.LayoutTimes``, its recomputed layers per model
    chunk): one layout as the sweep times its rows (``advisor.sweep.run_timing``), for its step
    (``one_layout_time``) and each rank's times per microbatch (the report's schedule)."""
    import numpy as np

    from advisor.rank_times import recomputed_per_chunk
    from advisor.sweep import run_timing

    options = training.memory_options()
    timing = run_timing(spec, workload, gpu, training.time_options(), time_constants)
    p = parallel
    layouts = timing.layouts(
        tp=np.array([p.tp]), cp=np.array([p.cp]), dp=np.array([p.dp]), mbs=np.array([p.mbs]), pp=np.array([p.pp]),
        selective=options.recompute == "selective")
    recompute = recomputed_per_chunk(options.recompute, options.recompute_method,
                                     np.array([options.recompute_num_layers]), spec.num_layers)
    return timing.model, layouts, recompute
