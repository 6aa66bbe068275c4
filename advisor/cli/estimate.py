"""``advisor sweep`` and ``advisor estimate``: seed 004's estimator over every layout, or for one."""

from __future__ import annotations

from pathlib import Path

import click

from advisor.cli.options import (
    DEGREE, EPILOG, FRACTION, GIB, GPUS, GPUS_PER_NODE, MICRO_BATCH, InputError, color_wanted, emit, memory_options,
    model_options, output_options, parse_numbers, workload_options,
)

TABLE_ROWS = 30


def _row_columns():
    from advisor.render import Column

    return [
        Column("rank", "rank"),
        Column("tp", "TP"),
        Column("cp", "CP"),
        Column("pp", "PP"),
        Column("mbs", "MBS"),
        Column("dp", "DP"),
        Column("num_microbatches", "m"),
        Column("model_states_gib", "states GiB", ".2f"),
        Column("activations_gib", "act. GiB", ".2f"),
        Column("total_gib", "total GiB", ".2f"),
        Column("memory_fraction", "of mem", ".0%"),
        Column("verdict", "verdict", justify="left"),
    ]


def _setup_line(spec, workload, gpus: int, mem: float, threshold: float, options) -> str:
    changed = options.changed()
    extras = "; " + ", ".join(f"{key}={value}" for key, value in changed.items()) if changed else ""
    return (
        f"{spec.name}, seq {workload.seq_len}, gbs {workload.global_batch_size}, "
        f"{gpus} GPUs x {mem:g} GiB, fits <= {threshold * mem:.1f} GiB ({threshold:.0%}){extras}"
    )


@click.command(epilog=EPILOG)
@click.option("--gpus", type=GPUS, required=True, help="Total number of GPUs.")
@click.option("--mem", type=GIB, required=True,
              help="Memory per GPU in GiB (for example 40 for A100-40GB, 80 for H100-80GB).")
@model_options
@workload_options
@click.option("--gpus-per-node", type=GPUS_PER_NODE, default=8, show_default=True,
              help="TP is capped at this (TP across nodes is slow, seed 004 Section 1).")
@click.option("--threshold", type=FRACTION, default=0.8, show_default=True,
              help="'fits' up to this fraction of --mem; 'tight' up to all of it.")
@click.option("--all", "show_all", is_flag=True, help="Include the oom rows.")
@click.option("--top", type=click.IntRange(min=1), default=None,
              help=f"Show only the N best-ranked rows (table default: {TABLE_ROWS}, json/csv: all).")
@memory_options
@output_options
def sweep(gpus, mem, spec, workload, gpus_per_node, threshold, show_all, top, options, fmt, output) -> None:
    """Estimate every valid (TP, CP, PP, MBS) on GPUS GPUs and rank those that fit.

    \b
    Enumerated: TP a power of 2 dividing the heads and KV heads, up to --gpus-per-node;
    CP a power of 2 with the sequence divisible by 2 x CP; PP a divisor of the layers;
    DP = GPUs / (TP x CP x PP); MBS a power of 2 with --gbs divisible by MBS x DP.

    \b
    Verdict: fits (<= threshold x mem), tight (<= mem), oom (> mem; hidden without --all).
    Rank (seed 004, Section 4.2: the smallest TP x CP x PP that fits is fastest):
      1. fits before tight   2. smallest TP x CP x PP   3. largest MBS
      4. smallest TP         5. smallest PP, then lowest memory

    \b
    Examples:
      advisor sweep --gpus 64 --mem 40
      advisor sweep --gpus 128 --mem 80 --model llama3.1-70b --top 10
      advisor sweep --gpus 8 --mem 94 --seq-len 32768 --all --format json
    """
    from advisor import render
    from advisor.sweep import sweep as run_sweep

    rows = run_sweep(spec, workload, gpus, mem, threshold=threshold, max_tp=gpus_per_node, options=options)
    counts = {verdict: sum(row.verdict == verdict for row in rows) for verdict in ("fits", "tight", "oom")}
    selected = [row for row in rows if show_all or row.verdict != "oom"]
    if top is None and fmt == "table" and not show_all:
        top = TABLE_ROWS  # a screenful; JSON and CSV give every row
    shown = selected[:top] if top is not None else selected
    # Each row carries its setup, so that one row can be launched on its own (launch --from).
    setup = {"seq_len": workload.seq_len, "global_batch_size": workload.global_batch_size, "memory_gib": mem}
    if fmt == "json":
        setup.update(model=spec.to_dict(), options=options.changed())
    else:
        setup.update(model=spec.name)
    dicts = [{**row.to_dict(), **setup} for row in shown]
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
            caption = f"nothing fits: {caption}. Try more GPUs, --recompute full, or a shorter --seq-len."
        text = render.to_table(
            dicts, _row_columns(), title=_setup_line(spec, workload, gpus, mem, threshold, options),
            caption=caption, row_style=render.verdict_style, color=color_wanted(output),
        )
    emit(text, output)


@click.command(epilog=EPILOG)
@click.option("--tp", type=DEGREE, default=1, show_default=True, help="Tensor parallel size.")
@click.option("--cp", type=DEGREE, default=1, show_default=True, help="Context parallel size.")
@click.option("--pp", type=DEGREE, default=1, show_default=True, help="Pipeline parallel size.")
@click.option("--mbs", type=MICRO_BATCH, default=1, show_default=True, help="Micro-batch size.")
@click.option("--gpus", type=GPUS, default=None,
              help="Total GPUs; DP = GPUS / (TP x CP x PP). Give this or --dp.")
@click.option("--dp", type=DEGREE, default=None, help="Data parallel size (instead of --gpus).")
@click.option("--vpp", type=DEGREE, default=1, show_default=True,
              help="Virtual pipeline stages per rank (interleaved 1F1B).")
@click.option("--layers-per-stage", default=None, metavar="N,N,...",
              help="Uneven pipeline split, one layer count per stage (for example 7,9,9,7).")
@click.option("--mem", type=GIB, default=None,
              help="Memory per GPU in GiB; gives a verdict.")
@click.option("--threshold", type=FRACTION, default=0.8, show_default=True)
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
        **SweepRow(parallel, workload.num_microbatches(parallel), result, mem or None, verdict).to_dict(),
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
