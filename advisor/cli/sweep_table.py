"""The sweep tables' columns, dense and MoE alike: one layout per row, the ones that decide the
ranking (the verdict, TFLOP/s) kept longest where the terminal is narrow."""

from __future__ import annotations


def sweep_columns(calibrated: bool = False, timed: bool = False, tokens: bool = False, priced: bool = False,
                  experts: bool = False) -> list:
    """``render.Column``s of a sweep table: ``calibrated`` the calibrated model's usage and
    margin beside the analytic total (Eq. 18 for dense models), else the 80% rule's share of
    memory; ``timed`` the time model's columns; ``tokens`` and ``priced`` the token budget's
    days, GPU-hours and cost; ``experts`` EP and ETP (MoE rows)."""
    from advisor.render import Column

    columns = [Column("rank", "rank"), Column("tp", "TP"), Column("cp", "CP"), Column("pp", "PP"),
               Column("vpp", "VPP")]
    if experts:
        columns += [Column("ep", "EP"), Column("etp", "ETP")]  # a degree of the layout: never left out
    columns += [
        Column("mbs", "MBS"),
        Column("dp", "DP"),
        Column("num_microbatches", "m", drop=4),
        Column("split", "layers", justify="left", drop=1),
        Column("recompute_text", "recompute", justify="left"),
        Column("model_states_gib", "states", ".1f", drop=5),
        Column("activations_gib", "act.", ".1f", drop=5),
    ]
    analytic = "analytic" if experts else "Eq.18"
    columns.append(Column("total_gib", analytic, ".1f", drop=3) if calibrated else Column("total_gib", "GiB", ".2f"))
    if calibrated:
        columns += [Column("usage_gib", "GiB", ".1f"), Column("margin_gib", "margin", "+.1f", drop=2)]
    else:
        columns.append(Column("memory_fraction", "of mem", ".0%"))
    columns.append(Column("verdict", "verdict", justify="left", drop=-1))
    if timed:
        columns += [Column("tflops_per_gpu", "TFLOP/s", ".0f", drop=-1), Column("mfu", "MFU", ".0%", drop=4),
                    Column("step_time_s", "step s", ".2f", drop=3)]
    if tokens:
        columns += [Column("days", "days", ".1f"), Column("gpu_hours", "GPU-h", ",.0f", drop=4)]
    if priced:
        columns.append(Column("cost_usd", "cost $", ",.0f", drop=4))
    return columns


def setup_line(spec, workload, gpus: int, mem: float, threshold: float, options, gpu=None,
               memory_model: str = "paper", rank_by: str = "paper", lever: str | None = None) -> str:
    """The table's title: the model, the batch, the GPUs, the memory model and the ranking, the
    training options that differ from the defaults as the Megatron flags they change
    (``changed_args``), and the lever the rows use because nothing fit without it
    (``advisor.escalation``; the title said nothing of it)."""
    from advisor.options.flags import changed_args

    changed = changed_args(options)
    extras = f"; {changed}" if changed else ""
    if lever:
        extras += f"; the rows use {lever.partition(' (')[0]}, as nothing fits without it"
    where = f"{gpus} x {gpu.name} ({mem:g} GiB, {gpu.gpus_per_node}/node)" if gpu else f"{gpus} GPUs x {mem:g} GiB"
    rule = (f"fits <= {threshold * mem:.1f} GiB ({threshold:.0%})" if memory_model == "paper"
            else "calibrated memory model" if memory_model == "calibrated"
            else "calibrated memory model with profiled activations")
    return (f"{spec.name}, seq {workload.seq_len}, gbs {workload.global_batch_size}, {where}, {rule}, "
            f"ranked by {rank_by}{extras}")


def counts_caption(counts: dict, show_all: bool, shown: int, selected: int) -> str:
    """The caption's first line: how many layouts got each verdict, and how many are shown."""
    caption = ", ".join(f"{n:,} {v}" for v, n in counts.items()) + ("" if show_all else " (--all shows oom)")
    if shown < selected:
        caption += f"; best {shown:,} of {selected:,} shown (--top N)"
    return caption
