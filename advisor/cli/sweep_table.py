"""What a sweep table says around its rows, dense and MoE alike: its title (``setup_line``), its
captions and notes (counts, the evaluation, the lever used, the ladder) and its plot. The columns
themselves are ``advisor.sweep_columns``'."""

from __future__ import annotations


RANKED_BY = {"paper": "the paper's rule", "memory": "memory headroom", "throughput": "throughput"}
"""--rank-by's values as a title says them."""


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
