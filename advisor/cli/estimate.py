"""``advisor sweep`` and ``advisor estimate``: seed 004's estimator over every layout, or for one."""

from __future__ import annotations

from pathlib import Path

import click

from advisor.cli.options import (
    EPILOG, InputError, color_wanted, emit, memory_options, model_options, output_options, parse_numbers,
    workload_options,
)

TABLE_ROWS = 30


def _row_columns(timed: bool):
    from advisor.render import Column

    columns = [
        Column("rank", "rank"),
        Column("tp", "TP"),
        Column("cp", "CP"),
        Column("pp", "PP"),
        Column("vpp", "VPP"),
        Column("mbs", "MBS"),
        Column("dp", "DP"),
        Column("num_microbatches", "m"),
        Column("split", "layers per stage", justify="left"),
        Column("recompute_text", "recompute", justify="left"),
        Column("model_states_gib", "states GiB", ".2f"),
        Column("activations_gib", "act. GiB", ".2f"),
        Column("total_gib", "total GiB", ".2f"),
        Column("memory_fraction", "of mem", ".0%"),
        Column("verdict", "verdict", justify="left"),
    ]
    if timed:
        columns.insert(10, Column("step_time_s", "step s", ".2f"))
    return columns


def recompute_text(row: dict) -> str:
    if row["recompute"] != "full":
        return row["recompute"]
    return f"full {row['recompute_method']} {row['recompute_num_layers']}"


def _setup_line(spec, workload, gpus: int, mem: float, threshold: float, options, gpu) -> str:
    changed = options.changed()
    extras = "; " + ", ".join(f"{key}={value}" for key, value in changed.items()) if changed else ""
    on = f" {gpu.name}" if gpu is not None else ""
    return (
        f"{spec.name}, seq {workload.seq_len}, gbs {workload.global_batch_size}, "
        f"{gpus}{on} GPUs x {mem:g} GiB, fits <= {threshold * mem:.1f} GiB ({threshold:.0%}){extras}"
    )


@click.command(epilog=EPILOG)
@click.option("--gpus", type=click.IntRange(min=1), required=True, help="Total number of GPUs.")
@click.option("--mem", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Memory per GPU in GiB (for example 40 for A100-40GB, 80 for H100-80GB); required "
                   "without --gpu, which sets it otherwise.")
@click.option("--gpu", "gpu_name", default=None, metavar="NAME",
              help="A GPU preset ('advisor gpus'): its memory, and the time model that plans each row's "
                   "split for speed (MadPipe) and ranks rows by predicted step time.")
@model_options
@workload_options
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=None,
              help="TP is capped at this (TP across nodes is slow, seed 004 Section 1). Default: the "
                   "--gpu preset's, else 8.")
@click.option("--threshold", type=click.FloatRange(min=0, max=1, min_open=True), default=0.8, show_default=True,
              help="'fits' up to this fraction of --mem; 'tight' up to all of it.")
@click.option("--all", "show_all", is_flag=True, help="Include the oom rows.")
@click.option("--top", type=click.IntRange(min=1), default=None,
              help=f"Show only the N best-ranked rows (table default: {TABLE_ROWS}, json/csv: all).")
@memory_options(searchable=True)
@output_options
def sweep(gpus, mem, gpu_name, spec, workload, gpus_per_node, threshold, show_all, top, options, space, fmt,
          output) -> None:
    """Every layout Megatron-LM can launch on GPUS GPUs, one row per (TP, CP, PP, DP, MBS) with its
    layers per stage, interleaving (VPP) and recomputation, and those that fit ranked.

    \b
    Enumerated: TP a power of 2 dividing the heads and KV heads, up to --gpus-per-node;
    CP a power of 2 with the sequence divisible by 2 x CP; any PP up to the layers that
    leaves DP = GPUs / (TP x CP x PP) whole; MBS a power of 2 with --gbs divisible by MBS x DP.
    Per row: the split (Megatron's --pipeline-model-parallel-layout builds any), VPP where
    Megatron interleaves (PP > 1, microbatches a multiple of PP), and recomputation
    (--recompute-method block, N layers per chunk) only where needed to fit or, with --gpu,
    where it is faster. Without --gpu: no interleaving (it only adds memory), the fewest
    recomputed layers that fit, the split with the lowest peak. With --gpu: the fastest
    variant and split that fit (MadPipe's planner under the memory limit).

    \b
    Verdict: fits (<= threshold x mem), tight (<= mem), oom (> mem; hidden without --all).
    Rank with --gpu: the shortest predicted step. Without (seed 004, Section 4.2):
      1. fits before tight  2. no recomputation first  3. smallest TP x CP x PP
      4. largest MBS  5. smallest TP  6. smallest PP, then fewest recomputed layers, lowest memory

    \b
    Examples:
      advisor sweep --gpus 64 --mem 40
      advisor sweep --gpus 16384 --gpu h100-80gb --model llama3.1-405b --gbs 2048
      advisor sweep --gpus 8 --mem 94 --seq-len 32768 --split even --recompute none --all --format json
    """
    from advisor import render
    from advisor.megatron_args import megatron_args
    from advisor.sweep import sweep as run_sweep

    gpu, timing = None, None
    if gpu_name is not None:
        from advisor.hardware import get_gpu
        from advisor.rank_times import Timing
        from advisor.throughput import TimeModel

        gpu = get_gpu(gpu_name)
        gpus_per_node = gpus_per_node or gpu.gpus_per_node
        timing = Timing(TimeModel(spec, gpu, workload.seq_len, workload.global_batch_size), gpus_per_node)
        mem = mem or gpu.memory_gib
    if mem is None:
        raise InputError("give --mem GIB (the memory of one GPU) or --gpu NAME")
    gpus_per_node = gpus_per_node or 8
    result = run_sweep(spec, workload, gpus, mem, threshold=threshold, max_tp=gpus_per_node, options=options,
                       space=space, timing=timing)
    rows = result.rows
    counts = {verdict: sum(row.verdict == verdict for row in rows) for verdict in ("fits", "tight", "oom")}
    selected = [row for row in rows if show_all or row.verdict != "oom"]
    if top is None and fmt == "table" and not show_all:
        top = TABLE_ROWS  # a screenful; JSON and CSV give every row
    shown = selected[:top] if top is not None else selected
    searched = (f"{result.considered:,} layouts considered (TP, CP, PP, DP, MBS x VPP x recomputation), "
                f"{result.pruned:,} pruned as unable to fit or to win")
    # Each row carries its setup and its Megatron flags, so that one row launches on its own.
    setup = {"seq_len": workload.seq_len, "global_batch_size": workload.global_batch_size, "memory_gib": mem,
             "model": spec.to_dict() if fmt == "json" else spec.name}
    changed: dict = {}  # few distinct options among many rows
    dicts = []
    for row in shown:
        entry = {**row.to_dict(), **setup}
        if fmt == "table":
            entry.update(split=render.counts_text(entry["layers_per_stage"]), recompute_text=recompute_text(entry))
        else:
            p, options = row.parallel, row.options
            if options not in changed:
                changed[options] = options.changed()
            entry.update(options=changed[options], megatron_args=megatron_args(
                spec, workload.seq_len, tp=p.tp, cp=p.cp, layers_per_stage=row.layers_per_stage,
                micro_batch_size=p.mbs, global_batch_size=workload.global_batch_size, options=options,
                virtual_stages=p.vpp))
            if fmt == "csv":
                entry["megatron_args"] = " ".join(entry["megatron_args"])
                entry["layers_per_stage"] = render.counts_text(entry["layers_per_stage"])
        dicts.append(entry)
    if fmt == "json":
        text = render.to_json(dicts)
    elif fmt == "csv":
        text = render.to_csv(dicts)
    else:
        hidden = "" if show_all else " (--all shows oom)"
        caption = f"{counts['fits']} fit, {counts['tight']} tight, {counts['oom']} oom{hidden}"
        if len(shown) < len(selected):
            caption += f"; best {len(shown)} of {len(selected)} shown (--top N)"
        if not dicts:
            caption = f"nothing fits: {caption}. Try more GPUs or a shorter --seq-len."
        text = render.to_table(
            dicts, _row_columns(timing is not None),
            title=_setup_line(spec, workload, gpus, mem, threshold, options, gpu),
            caption=f"{caption}\n{searched}", row_style=render.verdict_style, color=color_wanted(output),
        )
    if fmt != "table":
        click.echo(f"advisor sweep: {searched}", err=True)
    emit(text, output)


@click.command(epilog=EPILOG)
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True, help="Tensor parallel size.")
@click.option("--cp", type=click.IntRange(min=1), default=1, show_default=True, help="Context parallel size.")
@click.option("--pp", type=click.IntRange(min=1), default=1, show_default=True, help="Pipeline parallel size.")
@click.option("--mbs", type=click.IntRange(min=1), default=1, show_default=True, help="Micro-batch size.")
@click.option("--gpus", type=click.IntRange(min=1), default=None,
              help="Total GPUs; DP = GPUS / (TP x CP x PP). Give this or --dp.")
@click.option("--dp", type=click.IntRange(min=1), default=None, help="Data parallel size (instead of --gpus).")
@click.option("--vpp", type=click.IntRange(min=1), default=1, show_default=True,
              help="Virtual pipeline stages per rank (interleaved 1F1B).")
@click.option("--layers-per-stage", default=None, metavar="N,N,...",
              help="Uneven pipeline split, one layer count per stage (for example 7,9,9,7).")
@click.option("--mem", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Memory per GPU in GiB; gives a verdict.")
@click.option("--threshold", type=click.FloatRange(min=0, max=1, min_open=True), default=0.8, show_default=True)
@model_options
@workload_options
@memory_options
@output_options
def estimate(tp, cp, pp, mbs, gpus, dp, vpp, layers_per_stage, mem, threshold, spec, workload, options, fmt,
             output) -> None:
    """Per-GPU memory of one configuration, stage by stage.

    \b
    Model states (BF16 weights, FP32 gradients, Adam states sharded over DP x CP) and
    activations (1F1B: stage i holds PP - i microbatches) for every pipeline stage. The
    peak stage decides the verdict.

    \b
    Example (the public code's test case: 44.87 GiB states, 22.64 GiB activations):
      advisor estimate --tp 2 --pp 1 --mbs 1 --gpus 4 --model llama3.1-8b
    """
    from advisor import render
    from advisor.memory import GIB, estimate_memory
    from advisor.parallel import ParallelConfig
    from advisor.sweep import SweepRow, classify

    model_parallel = tp * cp * pp
    if gpus is None and dp is None:
        raise InputError("give --gpus or --dp")
    if gpus is not None:
        if gpus % model_parallel:
            raise InputError(f"--gpus {gpus} is not divisible by TP x CP x PP = {model_parallel}")
        if dp is not None and dp != gpus // model_parallel:
            raise InputError(f"--dp {dp} disagrees with --gpus {gpus} / (TP x CP x PP) = {gpus // model_parallel}")
        dp = gpus // model_parallel
    stages = parse_numbers(layers_per_stage, int, "--layers-per-stage") if layers_per_stage else None
    parallel = ParallelConfig(tp=tp, cp=cp, pp=pp, dp=dp, mbs=mbs, vpp=vpp)
    result = estimate_memory(spec, parallel, workload, options, stages)
    verdict = classify(result.total_gib, mem, threshold) if mem else None
    row = {
        **SweepRow(parallel, workload.num_microbatches(parallel), result, mem or None, verdict,
                   options=options).to_dict(),
        "vpp": parallel.vpp, "model": spec.to_dict(), "seq_len": workload.seq_len,
        "global_batch_size": workload.global_batch_size, "options": options.changed(),
    }
    stage_rows = [stage.to_dict() for stage in result.stages]
    if fmt == "json":
        text = render.to_json({**row, "stages": stage_rows})
    elif fmt == "csv":
        text = render.to_csv(stage_rows)
    else:
        columns = [
            render.Column("stage", "stage"),
            render.Column("position", "position", justify="left"),
            render.Column("layers", "layers"),
            render.Column("in_flight_microbatches", "in flight", "g"),
            render.Column("weights_gib", "weights", ".2f"),
            render.Column("gradients_gib", "grads", ".2f"),
            render.Column("optimizer_gib", "optimizer", ".2f"),
            render.Column("model_states_gib", "states", ".2f"),
            render.Column("activations_gib", "activations", ".2f"),
            render.Column("total_gib", "total GiB", ".2f"),
        ]
        title = (
            f"{spec.name}: TP {tp}, CP {cp}, PP {pp}, DP {dp}, MBS {mbs}"
            + (f", VPP {vpp}" if vpp > 1 else "") + f", seq {workload.seq_len}, gbs {workload.global_batch_size}"
        )
        peak = result.peak
        caption = f"peak: stage {peak.stage}, {peak.total_bytes / GIB:.2f} GiB"
        if mem:
            caption += f" = {row['memory_fraction']:.0%} of {mem:g} GiB -> {row['verdict']}"
        style = render.VERDICT_STYLES.get(row["verdict"])
        text = render.to_table(
            stage_rows, columns, title=title, caption=caption,
            row_style=lambda stage_row: style if stage_row["stage"] == peak.stage else None, color=color_wanted(output),
        )
    emit(text, output)
