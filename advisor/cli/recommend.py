"""``advisor recommend``: CAPTURE's planner (seed 000, Section III-C) over layer profiles."""

from __future__ import annotations

from pathlib import Path

import click

from advisor.cli.options import (
    DEGREE, EPILOG, GLOBAL_BATCH, GPUS, MICRO_BATCH, InputError, color_wanted, document_options, emit_document,
    gpu_options,
)


@click.command("recommend", epilog=EPILOG)
@click.option("--profile", "profiles", multiple=True, required=True, type=click.Path(path_type=Path),
              help="A run directory (rank*.jsonl) or a directory of them; repeat for more.")
@click.option("--gpus", type=GPUS, required=True, help="GPUs of the target run.")
@gpu_options
@click.option("--mode", type=click.Choice(["megatron", "hybrid"]), default="megatron", show_default=True,
              help="megatron: uniform TP/CP/DP, uneven layers per stage (launchable); hybrid: CAPTURE's "
                   "per-stage DP/TP degrees (not launchable on stock Megatron).")
@click.option("--predictor", type=click.Choice(["1f1b", "capture"]), default="1f1b", show_default=True,
              help="1f1b: per-module terms by pipeline position; capture: CAPTURE's M_i/M_a as published.")
@click.option("--tp", type=DEGREE, default=1, show_default=True, help="Megatron mode: TP.")
@click.option("--pp", type=DEGREE, default=None, help="Megatron mode: pipeline stages (required).")
@click.option("--mbs", type=MICRO_BATCH, default=1, show_default=True,
              help="Micro-batch size (Megatron's, per DP replica; in hybrid mode the pipeline microbatch).")
@click.option("--gbs", type=GLOBAL_BATCH, default=1024, show_default=True, help="Global batch size.")
@click.option("--merge-to", type=click.IntRange(min=1), default=None,
              help="Merge layers to this many units first (CAPTURE's layer merger, Section III-A3).")
@click.option("--png", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Draw the per-GPU memory of the plan beside the even split (like CAPTURE's Fig. 6).")
@document_options
def recommend(profiles, gpus, gpu, mem, gpus_per_node, mode, predictor, tp, pp, mbs, gbs, merge_to, png, fmt,
              output) -> None:
    """Recommend the layers per stage (and, in hybrid mode, per-stage degrees) with the lowest
    predicted peak memory, from layer-by-layer profiles.

    \b
    The planner is exact: it minimises the peak over every plan in polynomial
    time, breaking ties as CAPTURE does (the next-highest GPU, and so on).

    \b
    Examples:
      advisor recommend --profile runs/ --gpus 16 --pp 4 --mbs 1 --gbs 64
      advisor recommend --profile runs/ --gpus 16 --gpu h100-94gb --pp 4   (memory and node size from the preset)
      advisor recommend --profile runs/ --gpus 16 --gpus-per-node 4 --mode hybrid --mbs 8 \\
          --predictor capture -o plan.json --png plan.png
    """
    from advisor.capture.observations import load_profile_set
    from advisor.capture.recommend import recommend_hybrid, recommend_megatron

    if mode == "megatron" and pp is None:
        raise InputError("--mode megatron needs --pp (the number of pipeline stages)")
    if mode == "hybrid" and (pp is not None or tp != 1):
        raise InputError("--mode hybrid chooses TP, DP and PP per stage itself; drop --tp and --pp")
    profile_set = load_profile_set(profiles)
    common = dict(gpus=gpus, gpus_per_node=gpus_per_node, micro_batch_size=mbs, global_batch_size=gbs,
                  predictor=predictor, merge_to=merge_to)
    if mode == "megatron":
        plan = recommend_megatron(profile_set, tp=tp, pp=pp, **common)
    else:
        plan = recommend_hybrid(profile_set, **common)
    if png is not None:
        from advisor.capture.chart import draw

        draw(plan, png, mem)
        click.echo(f"wrote {png}", err=True)
    emit_document(plan.to_dict(), _plan_table(plan, mem), fmt, output)


def _plan_table(plan, mem: float | None) -> str:
    from advisor import render
    from advisor.memory import GIB

    baseline = plan.baseline
    same = baseline is not None and len(baseline.stage_bytes) == plan.pp
    # GiB for real models; MiB (or less) for the tiny ones of a CPU profile.
    unit, size = render.byte_unit([max(stage.predicted_bytes for stage in plan.stages)])
    rows = []
    for stage in plan.stages:
        first, last = stage.gpus[0], stage.gpus[-1]
        rows.append({
            "stage": stage.stage, "layers": f"{stage.first_layer}-{stage.last_layer}", "count": stage.layers,
            "tp": stage.tp, "dp": stage.dp, "gpus": f"{first}-{last}" if last > first else str(first),
            "in_flight": stage.in_flight_microbatches, "bytes": stage.predicted_bytes,
            "even": baseline.stage_bytes[stage.stage] if same else None,
        })
    columns = [render.Column("stage", "stage"), render.Column("layers", "layers"), render.Column("count", "#"),
               render.Column("tp", "TP"), render.Column("dp", "DP"), render.Column("gpus", "GPU ids"),
               render.Column("in_flight", "in flight"), render.Column("bytes", f"{unit} per GPU", ".2f", scale=size)]
    if same:
        columns.append(render.Column("even", "even split", ".2f", scale=size))
    peak = plan.peak_bytes
    caption = f"predicted peak {peak / size:.2f} {unit}"
    if mem:
        caption += f" ({peak / GIB / mem:.0%} of {mem:g} GiB)"
    if baseline:
        even = max(baseline.stage_bytes)
        change = (even - peak) / even
        caption += f"; {baseline.label}: {even / size:.2f} {unit} (this plan is {abs(change):.1%} " + \
            ("lower)" if change >= 0 else "higher)")
    caption += "; launchable on stock Megatron-LM" if plan.launchable else \
        "; NOT launchable on stock Megatron-LM (per-stage degrees)"
    degrees = f"TP {plan.tp}, CP {plan.cp}, DP {plan.dp}" if plan.tp else "per-stage TP/DP"
    title = (f"{plan.model.name}: {plan.mode} plan, {plan.gpus} GPUs, {degrees}, PP {plan.pp}, "
             f"MBS {plan.micro_batch_size}, {plan.num_microbatches} microbatches ({plan.predictor} predictor)")
    return render.to_table(rows, columns, title=title, caption=caption, color=color_wanted(None))
