"""The MoE side of ``advisor sweep`` and ``advisor estimate`` (advisor.moe): the options they
add (--ep, --etp, the dispatcher and the routing assumption) and their output."""

from __future__ import annotations

import click

from advisor.cli.options import DEGREE, InputError, apply_options, color_wanted, emit


def moe_options(func):
    """--ep, --etp, --moe-token-dispatcher-type, --moe-routing, --moe-expert-capacity-factor, --moe-imbalance."""
    return apply_options([
        click.option("--ep", type=DEGREE, default=None,
                     help="Expert parallel size (--expert-model-parallel-size); sweep: only this EP. MoE models."),
        click.option("--etp", type=DEGREE, default=None,
                     help="Expert tensor parallel size (--expert-tensor-parallel-size); sweep: only this ETP."),
        click.option("--moe-token-dispatcher-type", "dispatcher", type=click.Choice(["alltoall", "allgather", "flex"]),
                     default="alltoall", show_default=True, help="Megatron's token dispatcher (MoE models)."),
        click.option("--moe-routing", type=click.Choice(["balanced", "capacity", "dropless"]), default="balanced",
                     show_default=True, help="Routed tokens per rank: balanced (x --moe-imbalance), capacity "
                     "(x --moe-expert-capacity-factor), dropless (the worst case)."),
        click.option("--moe-expert-capacity-factor", "capacity_factor", type=click.FloatRange(min=0, min_open=True),
                     default=None, help="Megatron's capacity factor (with --moe-routing capacity)."),
        click.option("--moe-imbalance", type=click.FloatRange(min=1.0), default=1.0, show_default=True,
                     help="The busiest rank's routed tokens over the mean (balanced routing)."),
        click.option("--recompute-modules", "recompute_modules", multiple=True, type=click.Choice(RECOMPUTE_MODULES),
                     help="MoE models, with --recompute selective: Megatron's --recompute-modules (repeat the "
                          "option; default moe_act, layernorm and, with MLA, mla_up_proj)."),
    ], func)


RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
"""Megatron's --recompute-modules values (core_v0.15.2 arguments.py); core_attn keeps nothing
more with fused attention (no s^2 scores), so it changes no term."""


def moe_settings(spec, ep, etp, dispatcher, moe_routing, capacity_factor, moe_imbalance, recompute_modules, *,
                 options, space=None, unpriced: dict | None = None):
    """MoEOptions from the flags; a dense model refuses EP/ETP above 1; for an MoE model, every
    option the MoE model does not price is refused by name (none is ignored)."""
    from advisor.moe.memory import RoutedTokens
    from advisor.moe.spec import is_moe
    from advisor.moe.stage import MoEOptions

    if not is_moe(spec):
        if (ep or 1) > 1 or (etp or 1) > 1 or recompute_modules:
            raise InputError(f"--ep/--etp/--recompute-modules need a mixture-of-experts model; {spec.name} is dense")
        return None
    training, options = options, options.memory_options()  # advisor.options.TrainingOptions
    refused = {"--no-sequence-parallel": not options.sequence_parallel, "--no-flash-attn": not options.flash_attention,
               "--vocab-divisible-by": options.vocab_divisible_by is not None,
               **_levers_not_priced(training), **(unpriced or {})}
    if space is not None:
        refused.update({"--vpp N (advisor estimate --vpp prices interleaving)": space.vpp not in (None, 1),
                        "--recompute-method/--recompute-num-layers": bool(space.recompute_method
                                                                          or space.recompute_num_layers)})
    named = [flag for flag, given in refused.items() if given]
    if named:
        raise InputError(f"{spec.name} is a mixture of experts; its model does not price {', '.join(named)}")
    if moe_routing == "capacity" and capacity_factor is None:
        raise InputError("--moe-routing capacity needs --moe-expert-capacity-factor")
    return MoEOptions(dispatcher=dispatcher, routing=RoutedTokens(routing=moe_routing, capacity_factor=capacity_factor,
                                                                  imbalance=moe_imbalance),
                      gradient_bytes=options.gradient_bytes, distributed_optimizer=options.distributed_optimizer,
                      modules=frozenset(recompute_modules) if recompute_modules else None)


def _levers_not_priced(training) -> dict[str, bool]:
    """The training options (advisor.options) the MoE model does not price yet: named, never ignored."""
    dp, precision = training.data_parallel, training.precision
    return {"--use-megatron-fsdp": dp.fsdp_strategy is not None, "--use-torch-fsdp2": dp.torch_fsdp2,
            "--fp8-format": precision.fp8_format is not None,
            "--optimizer-cpu-offload": training.offload.optimizer_cpu_offload,
            "--tp-comm-overlap": training.tensor_parallel.tp_comm_overlap,
            "--no-overlap-grad-reduce/--no-overlap-param-gather": not (dp.overlap_grad_reduce
                                                                        and dp.overlap_param_gather),
            "--params-dtype other than bf16": precision.params_dtype != "bfloat16",
            "--dataloader-mask cached/rebuilt": training.attention.dataloader_mask != "off"}


def row_flags(spec, workload, row: dict) -> list[str]:
    """Every Megatron flag of one MoE row (``advisor.moe.flags.row_args``)."""
    from advisor.moe.flags import row_args

    return row_args(spec, workload.seq_len, workload.global_batch_size, row)


def _columns(timed: bool):
    """The table's columns, within 100 characters (the states and activations split is in the
    JSON and in advisor estimate's stages)."""
    from advisor.render import Column

    columns = [Column("rank", "rank"), Column("tp", "TP"), Column("cp", "CP"), Column("pp", "PP"), Column("ep", "EP"),
               Column("etp", "ETP"), Column("mbs", "MBS"), Column("dp", "DP"),
               Column("recompute", "recompute", justify="left"), Column("total_gib", "peak GiB", ".1f"),
               Column("verdict", "verdict", justify="left")]
    if timed:
        columns += [Column("mfu", "MFU", ".0%"), Column("step_time_s", "step s", ".2f")]
    return columns


def sweep(spec, workload, gpus, mem, threshold, gpu, gpus_per_node, settings, ep, etp, show_all, top, fmt, output,
          space=None):
    from advisor import render
    from advisor.errors import AdvisorError
    from advisor.moe.space import sweep as run

    try:
        result = run(spec, workload, gpus, mem, threshold=threshold, max_tp=gpus_per_node, gpu=gpu, options=settings,
                     ep=ep, etp=etp, even_split=space is not None and space.split == "even",
                     recompute=None if space is None or space.recompute == "auto" else space.recompute)
    except AdvisorError as error:
        raise InputError(str(error)) from None
    shown = result.rows(include_oom=show_all, limit=top or (30 if fmt == "table" else None))
    setup = {"seq_len": workload.seq_len, "global_batch_size": workload.global_batch_size, "memory_gib": mem,
             "gpu": gpu.name if gpu else None, "model": spec.to_dict() if fmt == "json" else spec.name}
    if fmt != "table":
        shown = [{**row, **setup, "megatron_args": row_flags(spec, workload, row)} for row in shown]
    if fmt == "json":
        text = render.to_json(shown)
    elif fmt == "csv":
        text = render.to_csv([{**row, "megatron_args": " ".join(row["megatron_args"]),
                               "layers_per_stage": render.counts_text(row["layers_per_stage"]),
                               "recompute_modules": " ".join(row["recompute_modules"] or [])} for row in shown])
    else:
        title = (f"{spec.name}, seq {workload.seq_len}, gbs {workload.global_batch_size}, {gpus} GPUs x {mem:g} GiB, "
                 f"fits <= {threshold:.0%}; routing {settings.routing.routing}, dispatcher {settings.dispatcher}")
        caption = (", ".join(f"{n} {v}" for v, n in result.counts.items())
                   + f" (each layout with the recomputation it needs, or the fastest); {result.considered:,} "
                   "layouts x recomputation priced")
        text = render.to_table(shown, _columns(gpu is not None), title=title, row_style=render.verdict_style,
                               caption=caption, color=color_wanted(output))
    if not result.counts["fits"] + result.counts["tight"] and not show_all:
        least = result.least()
        click.echo(f"advisor sweep: nothing fits; the least any layout needs is {least['total_gib']:.1f} GiB per GPU "
                   f"(TP {least['tp']}, PP {least['pp']}, EP {least['ep']}) against {mem:g} GiB", err=True)
        click.get_current_context().exit(1)
    emit(text, output)


def estimate(spec, workload, tp, cp, pp, ep, etp, dp, mbs, mem, threshold, gpu, settings, fmt, output, vpp=1,
             recompute="none"):
    """One MoE layout, every stage."""
    from advisor import render
    from advisor.errors import AdvisorError
    from advisor.moe.space import estimate_layout

    try:
        row = estimate_layout(spec, workload, tp=tp, cp=cp, pp=pp, ep=ep or 1, etp=etp or 1, dp=dp, mbs=mbs, vpp=vpp,
                              recompute=recompute, memory_gib=mem, threshold=threshold, gpu=gpu, options=settings)
    except AdvisorError as error:
        raise InputError(str(error)) from None
    row.update(megatron_args=row_flags(spec, workload, row), model=spec.to_dict(), memory_gib=mem)
    stages, timing = row["stages"], gpu is not None
    peak = stages[row["peak_stage"]]
    if fmt == "json":
        text = render.to_json(row)
    elif fmt == "csv":
        text = render.to_csv(stages)
    else:
        from advisor.render import Column

        columns = [Column("stage", "stage"), Column("layers", "layers"), Column("dense_layers", "dense"),
                   Column("in_flight_microbatches", "in flight", "g"), Column("dense_states_gib", "dense st.", ".2f"),
                   Column("expert_states_gib", "expert st.", ".2f"), Column("activations_gib", "act.", ".2f"),
                   Column("transient_gib", "transient", ".2f"), Column("total_gib", "total GiB", ".2f")]
        caption = f"peak: stage {peak['stage']}, {peak['total_gib']:.2f} GiB" + (
            f" -> {row['verdict']}" if mem else "")
        if timing:
            caption += f"\nstep {row['step_time_s']:.2f} s, {row['tflops_per_gpu']:.0f} TFLOP/s per GPU (MFU {row['mfu']:.0%})"
        text = render.to_table(stages, columns, caption=caption, color=color_wanted(output),
                               title=f"{spec.name}: TP {tp}, CP {cp}, PP {pp}, EP {row['ep']}, ETP {row['etp']}, "
                                     f"DP {dp}, MBS {mbs}" + (f", VPP {vpp}" if vpp > 1 else ""))
    emit(text, output)
