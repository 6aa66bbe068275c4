"""The sweep tables' columns, dense and MoE alike: one layout per row. Where the terminal is
narrow, the answer goes last: the layout (TP, CP, PP, VPP, EP, ETP, MBS) never, then the
verdict, the columns the ranking orders by (TFLOP/s ranked by throughput, the margin or share of
memory ranked by memory), what the user asked for (a token budget's days, --gpu-hour-price's
cost), DP (a degree: the audit read a table without it as missing the layout), the
recomputation (part of what is launched), TFLOP/s where it is not the ranking, how close the row
is to the memory limit and whether its split is uneven (marked on its PP). Before them go the
memory used in GiB (the margin says it against the limit), the memory's parts and the secondary
times."""

from __future__ import annotations


def uneven_split(row: dict) -> str:
    """A row's layers per stage where its stages differ ('5,7,10,10'), else '': an even split is
    the layers over PP, which the row's PP already says."""
    from advisor.render import counts_text

    stages = row.get("layers_per_stage") or ()
    return counts_text(stages) if len(set(stages)) > 1 else ""


RANKED_BY = {"paper": "the paper's rule", "memory": "memory headroom", "throughput": "throughput"}
"""--rank-by's values as a title says them."""


RANKING_COLUMNS = {"paper": ("verdict", "recompute_text"), "memory": ("margin_gib", "memory_fraction"),
                   "throughput": ("tflops_per_gpu",)}
"""The columns a ranking orders by (``advisor.ranking.order``): the paper's rule by the verdict,
then no recomputation before any, then the fewest model-parallel GPUs (the layout, always shown);
memory by the usage (its margin, or the 80% rule's share of memory); throughput by TFLOP/s."""


def sweep_columns(calibrated: bool = False, timed: bool = False, tokens: bool = False, priced: bool = False,
                  experts: bool = False, rank_by: str = "paper") -> list:
    """``render.Column``s of a sweep table: ``calibrated`` the calibrated model's usage and
    margin beside the analytic total (Eq. 18 for dense models), else the 80% rule's share of
    memory; ``timed`` the time model's columns; ``tokens`` and ``priced`` the token budget's
    days, GPU-hours and cost; ``experts`` EP and ETP (MoE rows). ``drop``: the highest is left
    out first; the answer last (``_answer_first``)."""
    from advisor.render import Column, Fold

    # The rank stays (a table's first column always does): the report's '#3', and '-' on a row
    # --all shows unranked. The degrees and MBS are the layout: never left out.
    columns = [Column("rank", "rank"), Column("tp", "TP", keep=True), Column("cp", "CP", keep=True),
               Column("pp", "PP", keep=True), Column("vpp", "VPP", keep=True)]
    if experts:
        columns += [Column("ep", "EP", keep=True), Column("etp", "ETP", keep=True)]
    split = Fold("pp", uneven_split, "an uneven split's layers per stage follow its PP", drop=4, mark="*",
                 mark_note="PP* marks an uneven split")
    columns += [
        Column("mbs", "MBS", keep=True),
        Column("dp", "DP", drop=-1),
        Column("num_microbatches", "m", drop=9),
        Column("split", "layers", justify="left", drop=5, fold=split),
        Column("recompute_text", "recompute", justify="left", drop=0),
        Column("model_states_gib", "states", ".1f", drop=10, unit="GiB"),
        Column("activations_gib", "act.", ".1f", drop=10, unit="GiB"),
    ]
    # each column its own unit: the margin was a bare '+22.2' wherever the usage, the one header
    # that said 'GiB', was left out (at 100 columns with --tokens)
    columns.append(Column("total_gib", "analytic" if experts else "Eq.18", ".1f" if calibrated else ".2f",
                          drop=8 if calibrated else 7, unit="GiB"))
    if calibrated:
        columns += [Column("usage_gib", "used", ".1f", drop=7, unit="GiB"),
                    Column("margin_gib", "margin", "+.1f", drop=3, unit="GiB")]
    else:
        columns.append(Column("memory_fraction", "of mem", ".0%", drop=3))
    columns.append(Column("verdict", "verdict", justify="left", drop=-4))
    if timed:
        columns += [Column("tflops_per_gpu", "TFLOP/s", ".0f", drop=1, unit="per GPU"),
                    Column("mfu", "MFU", ".0%", drop=9), Column("step_time_s", "step", ".2f", drop=8, unit="s")]
    if tokens:
        columns += [Column("days", "days", ".1f", drop=-2), Column("gpu_hours", "GPU-h", ",.0f", drop=9)]
    if priced:
        columns.append(Column("cost_usd", "cost", ",.0f", drop=-2, unit="$"))
    return _answer_first(columns, RANKING_COLUMNS.get(rank_by, ()))


def _answer_first(columns: list, ranking: tuple[str, ...]) -> list:
    """The columns with the ones the ranking orders by kept to the last but the verdict (drop -3):
    a table titled 'ranked by throughput' that left TFLOP/s out at 60 columns showed a ranking
    without its reason (audit). Last of all the verdict (-4), then the ranking's columns (-3), what
    the user asked for (--tokens' days, --gpu-hour-price's cost: -2), DP (-1, a degree that follows
    from the others), the recomputation (0)."""
    from dataclasses import replace

    return [replace(column, drop=-3) if column.key in ranking and column.drop > -3 else column
            for column in columns]


def setup_line(spec, workload, gpus: int, mem: float, threshold: float, options, gpu=None,
               memory_model: str = "paper", rank_by: str = "paper", lever: str | None = None) -> str:
    """The table's title: the model, the batch, the GPUs, the memory model and the ranking, the
    training options that differ from the defaults as the Megatron flags they change
    (``changed_args``), and the lever the rows use because nothing fit without it
    (``advisor.escalation``; the title said nothing of it)."""
    from advisor.options.flags import changed_args
    from advisor.paper_rule import percent

    changed = changed_args(options)
    extras = f"; {changed}" if changed else ""
    if lever:
        extras += f"; the rows use {lever.partition(' (')[0]}, as nothing fits without it"
    where = f"{gpus} x {gpu.name} ({mem:g} GiB, {gpu.gpus_per_node}/node)" if gpu else f"{gpus} GPUs x {mem:g} GiB"
    rule = (f"fits <= {threshold * mem:.1f} GiB ({percent(threshold)})" if memory_model == "paper"
            else "calibrated memory model" if memory_model == "calibrated"
            else "calibrated memory model with profiled activations")
    return (f"{spec.name}, seq {workload.seq_len}, gbs {workload.global_batch_size}, {where}, {rule}, "
            f"ranked by {RANKED_BY.get(rank_by, rank_by)}{extras}")


def lever_note(lever: str, timed: bool) -> str:
    """The stderr line of a sweep whose rows use ``lever`` (``advisor.escalation``) because nothing
    fit without it, dense and MoE rows alike; ``timed``: the rows have ``lever_time_cost_s`` (a
    time model prices it)."""
    from advisor.cli.options import command_name

    cost = "; lever_time_cost_s is its step-time cost" if timed else ""
    return (f"{command_name()}: nothing fits with the options given; the rows use {lever}: "
            f"their options and megatron_args say so{cost}")


def ladder_text(ladder) -> str:
    """The nothing-fits line's words for the rungs of --sharding auto climbed in vain, dense and
    MoE sweeps alike (``advisor.sweep.Sweep.ladder``, ``advisor.moe.space.SweepResult.ladder``:
    ``advisor.escalation.climb``'s attempts): those swept, and those not swept with why; '' where
    none was climbed (--sharding fixed, or a lever given: the user chose the sharding)."""
    swept = [label for label, why in ladder if why is None]
    parts = [f"tried {_rung_names(swept, 'and')}: no layout fits with {'it' if len(swept) == 1 else 'them'} either"] \
        if swept else []
    reasons: dict[str, list[str]] = {}
    for label, why in ladder:
        if why is not None:
            reasons.setdefault(why, []).append(label)
    parts += [f"did not try {_rung_names(labels, 'or')}: {why}" for why, labels in reasons.items()]
    return f"; --sharding auto {'; it '.join(parts)}" if parts else ""


def _rung_names(labels: list[str], conjunction: str) -> str:
    """Rungs' labels as the title names them (before their parenthesis), listed, 'Megatron-FSDP'
    said once: 'Megatron-FSDP optim_grads and optim_grads_params'."""
    from advisor import render

    names = [label.partition(" (")[0] for label in labels]
    prefix = "Megatron-FSDP "
    names = [name[len(prefix):] if i and name.startswith(prefix) and names[i - 1].startswith(prefix) else name
             for i, name in enumerate(names)]
    return render.listed(names, conjunction)


def counts_caption(counts: dict, show_all: bool, shown: int, selected: int) -> str:
    """The caption's first line: how many layouts got each verdict, and how many are shown."""
    caption = ", ".join(f"{n:,} {v}" for v, n in counts.items()) + ("" if show_all else " (--all shows oom)")
    if shown < selected:
        caption += f"; best {shown:,} of {selected:,} shown (--top N)"
    return caption


def evaluation_caption(tokens: float | None, workload, release, experts: bool = False) -> str:
    """The sweep table's line under a budget's days, where one is given: what they leave out
    (``advisor.evaluation.budget_words``), one line for every row, since the budget and the global
    batch alone decide the count ('' without a budget). ``advisor estimate`` prices its time for a
    dense row, not for an MoE one (``experts``), whose time model prices whole steps."""
    if tokens is None or release is None:
        return ""
    from advisor.evaluation import budget_words

    text = budget_words(tokens, workload.seq_len, workload.global_batch_size, release)
    if release.eval_interval is not None:
        text += "; --eval-iters 0 turns it off" + ("" if experts else " (advisor estimate prices its time)")
    return f"\n{text}"


def write_plot(rows: list[dict], path, title: str, experts: bool = False) -> None:
    """``advisor sweep --plot``, dense and MoE rows alike: the rows shown drawn to ``path``
    (``advisor.plots.sweep_plot``), and a line on stderr naming it. No rows (nothing fits, and no
    --all): nothing drawn, nothing written, and the sweep goes on to say why nothing fits (exit
    status 1), not a bad-input error."""
    from advisor.cli.options import note, wrote
    from advisor.plots import sweep_plot

    if not rows:
        note(f"--plot: {path} not written: no row to draw (--all draws the oom ones)")
        return
    sweep_plot(rows, path, title=title, experts=experts)
    wrote(path)
