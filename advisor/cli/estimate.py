"""``advisor sweep`` and ``advisor estimate``: seed 004's estimator over every layout, or for one."""

from __future__ import annotations

import json

import click

from advisor import limits
from advisor.cli import hints as hints_text
from advisor.cli import moe as moe_cli
from advisor.cli.moe import dense_recompute_options, moe_options, moe_settings
from advisor.cli.options import (
    GPU_HOUR_PRICE, DEGREE, EPILOG, FRACTION, GPUS, MICRO_BATCH, ROWS, InputError, InputPath, NonEmpty, TokenCount,
    drawing_for, command_name, emit, distinct_files, gpu_options, held_note, model_choice_options, model_options, note,
    nothing_fits, output_options, parse_layer_counts, png_path, workload_options, UserPath,
)
from advisor.cli.sweep_table import (
    counts_caption, evaluation_caption, ladder_text, lever_note, setup_line, write_plot,
)
from advisor.cli.training_flags import given, memory_options
from advisor.options.releases import release_defaults
from advisor.paper_rule import DEFAULT_THRESHOLD, judged_threshold

TABLE_ROWS = 30


def _resolve_choices(gpu, memory_model, rank_by, tokens, profile_dir=None, gpu_hour_price=None):
    """The defaults that depend on --gpu (and --profile), and the combinations that need it."""
    from advisor.ranking import default_rank_by
    from advisor.verdicts import default_memory_model

    _check_budget(gpu, tokens, gpu_hour_price)
    if memory_model == "profile" and profile_dir is None:
        raise InputError("--memory-model profile needs --profile DIR (advisor profile run writes one)")
    if profile_dir is not None and memory_model not in (None, "profile"):
        raise InputError(f"--profile gives the profile memory model, not --memory-model {memory_model}")
    memory_model = memory_model or ("profile" if profile_dir is not None else None)
    if rank_by == "throughput" and gpu is None:
        raise InputError("--rank-by throughput needs --gpu NAME (see 'advisor gpus')")
    memory_model = memory_model or default_memory_model(gpu is not None)
    _threshold_needs_paper(memory_model)
    return memory_model, rank_by or default_rank_by(gpu is not None)


def _check_budget(gpu, tokens, gpu_hour_price) -> None:
    """--tokens and --gpu-hour-price (dense and MoE rows alike): a price needs a budget, and a
    budget the time model's tokens/s, which needs a GPU preset."""
    if gpu_hour_price is not None and tokens is None:
        raise InputError("--gpu-hour-price needs --tokens N: the cost is the GPU-hours of a token budget")
    if tokens is not None and gpu is None:
        raise InputError("--tokens needs --gpu NAME: the time model needs the GPU's FLOP/s and bandwidths")


def _check_budget_covers_a_step(tokens: float | None, workload) -> None:
    """A --tokens budget below one step's tokens (--gbs x --seq-len) trains not one step: a count
    without its unit ('--tokens 15' for 15T), which priced '0.0 days, 0 GPU-hours' without a word."""
    step = workload.global_batch_size * workload.seq_len if workload.global_batch_size else None
    if tokens is not None and step is not None and tokens < step:
        given = f"{int(tokens):,}" if float(tokens).is_integer() else f"{tokens:g}"
        raise InputError(f"--tokens {given} is less than one step's {step:,} tokens (--gbs "
                         f"{workload.global_batch_size} x --seq-len {workload.seq_len}): a budget counts tokens, "
                         "for example 15T, 300B or 2.5e12")


def _threshold_needs_paper(memory_model: str) -> None:
    """--threshold is the paper's rule's fraction; the calibrated (and profile) model judges by
    its own band, so a --threshold beside it would be silently ignored: refused instead."""
    if given("threshold") and memory_model != "paper":
        with_gpu = " (the default with --gpu)" if memory_model == "calibrated" else ""
        raise InputError(f"--threshold is the 4D paper's rule (--memory-model paper); the {memory_model} memory "
                         f"model{with_gpu} judges by its own margin: drop --threshold, or add --memory-model paper")


SWEEP_HELP = """Every layout Megatron-LM can launch on N GPUs (--gpus), one row per (TP, CP, PP, DP, MBS) with
its layers per stage, interleaving (VPP) and recomputation; judge which run, and rank them.

\b
Enumerated: TP a power of 2 dividing the heads and KV heads, up to
--gpus-per-node; CP a power of 2 with the sequence divisible by 2 x CP; any
PP up to the layers that leaves DP = GPUs / (TP x CP x PP) whole; MBS a
power of 2 with --gbs divisible by MBS x DP. Mixtures of experts (advisor
models) add EP, any divisor of the experts, and ETP, a power of 2 up to TP,
with EP x ETP dividing TP x CP x DP (megatron-core's expert groups), and
price the dispatcher --moe-token-dispatcher-type names (alltoall).
Per row: the split (Megatron's --pipeline-model-parallel-layout builds
any), VPP where Megatron interleaves (PP > 1, microbatches a multiple of
PP), and recomputation (--recompute-method block, N layers per chunk) only
where needed to fit or, with --gpu, where it is faster. Without --gpu: no
interleaving (it only adds memory; with --recompute-method uniform, only
where nothing else fits), the fewest recomputed layers that fit, the split
with the lowest peak. With --gpu: the fastest variant and split that
the memory model judges to fit (MadPipe's planner under its limit: the
paper's 80% rule, or the calibrated model's 'fits', then 'likely fits').
--split even --vpp 1 --recompute none keeps the paper's space.

\b
With --gpu (a preset: advisor gpus), the defaults are the calibrated memory
model and the time model: verdicts fits / likely fits / likely oom / oom
with the margin in GiB, predicted TFLOP/s (as Megatron-LM counts FLOPs),
MFU and step time, and the rows expected to run ranked fastest first.
With --mem alone, the 4D paper as published: fits (<= threshold x mem),
tight (<= mem), oom (> mem; hidden without --all), ranked by its rule
(Section 4.2):
  1. fits before tight   2. no recomputation first
  3. smallest TP x CP x PP   4. largest MBS   5. smallest TP
  6. smallest PP, fewest recomputed layers, lowest memory
When nothing fits, one line says what the least layout needs (and what its
weights, gradients and optimizer states alone need, where those do not fit
either), JSON and CSV are their empty documents, and the exit status is 1
(bad input is 2).

\b
Examples:
  advisor sweep --gpus 64 --mem 40
  advisor sweep --gpus 64 --gpu h100-80gb --tokens 15T --top 10
  advisor sweep --gpus 128 --gpu a100-80gb --model llama3.1-70b \\
      --rank-by paper
  advisor sweep --gpus 8 --gpu h100-94gb --seq-len 32768 --all \\
      --plot sweep.png
  advisor sweep --gpus 16384 --gpu h100-80gb --model llama3.1-405b \\
      --gbs 2048
  advisor sweep --gpus 8 --mem 94 --seq-len 32768 --split even \\
      --recompute none --all --format csv
  advisor sweep --gpus 64 --gpu h100-80gb --profile runs/
      # activations as profiled
  advisor sweep --gpus 64 --gpu h100-80gb --model llama3.1-70b --tp 8
      # TP pinned (also --cp, --pp, --mbs); the rest searched
"""
"""advisor sweep --help (here, not in the docstring: the function stays within 80 lines)."""


@click.command(epilog=EPILOG, help=SWEEP_HELP)
@click.option("--gpus", type=GPUS, required=True, help="Total number of GPUs.")
@gpu_options("sweep")
@model_options
@workload_options
@click.option("--threshold", type=FRACTION, default=DEFAULT_THRESHOLD, show_default=True,
              help="With --memory-model paper: 'fits' up to this fraction of --mem; 'tight' up to all of it.")
@click.option("--all", "show_all", is_flag=True, help="Include the oom rows.")
@click.option("--top", type=ROWS, default=None,
              help=f"Show only the N best-ranked rows (table default: {TABLE_ROWS}, json/csv: all).")
@model_choice_options
@click.option("--plot", type=UserPath(dir_okay=False), default=None, callback=png_path, metavar="FILE.png",
              help="Also draw the rows shown as a PNG: memory per layout (the paper's colours) beside the "
                   "predicted TFLOP/s per GPU.")
@memory_options(searchable=True)
@moe_options("sweep")
@output_options
def sweep(gpus, gpu, mem, gpus_per_node, spec, workload, threshold, show_all, top, memory_model, profile_dir, rank_by,
          tokens, gpu_hour_price, plot, options, space, release, fmt, output, moe) -> None:
    """``advisor sweep``: ``SWEEP_HELP`` says what it does."""
    from advisor.verdicts import verdict_kinds

    if mem is None:
        raise InputError("give --mem GIB or --gpu NAME (see 'advisor gpus')")
    distinct_files(**{"--output": output, "--plot": plot})
    _check_budget_covers_a_step(tokens, workload)
    options = dense_recompute_options(spec, moe, options, space)
    spec, settings = moe_settings(spec, moe, options=options, gpu=gpu, space=space, release=release, unsupported={
        "--memory-model profile": memory_model == "profile", "--profile": profile_dir is not None})
    # dense and MoE rows alike; --profile and its memory model were refused for MoE rows above
    memory_model, rank_by = _resolve_choices(gpu, memory_model, rank_by, tokens, profile_dir, gpu_hour_price)
    if settings is not None:  # a mixture of experts: advisor.moe's space (EP and ETP as dimensions)
        return moe_cli.sweep(spec, workload, gpus, mem, threshold, gpu, gpus_per_node, settings, moe.ep, moe.etp,
                             show_all, top, fmt, output, space, memory_model, budget=(tokens, gpu_hour_price),
                             plot=plot, rank_by=rank_by, release=release)
    from advisor.sweep import sweep as run_sweep  # the dense search: a mixture of experts' is advisor.moe.space

    measured = _measured(profile_dir, spec, options)
    result = run_sweep(spec, workload, gpus, mem, threshold=threshold, max_tp=gpus_per_node, options=options,
                       space=space, gpu=gpu, memory_model=memory_model, rank_by=rank_by, tokens=tokens,
                       measured=measured, release=release)
    if result.escalation:
        note(lever_note(result.escalation, timed=gpu is not None))  # no time model without a GPU
    counts = {verdict: sum(row.verdict == verdict for row in result.rows) for verdict in verdict_kinds(memory_model)}
    selected = [row for row in result.rows if show_all or row.verdict != "oom"]
    if top is None and fmt == "table" and not show_all:
        top = TABLE_ROWS  # a screenful; JSON and CSV give every row
    shown = selected[:top] if top is not None else selected
    tolerance = _tolerance(rank_by)
    setup = {"seq_len": workload.seq_len, "global_batch_size": workload.global_batch_size, "memory_gib": mem,
             "memory_model": memory_model, "threshold": judged_threshold(memory_model, threshold),
             "gpu": gpu.name if gpu else None, "gpus_per_node": gpus_per_node, "ranking_tolerance": tolerance,
             "megatron_version": release_defaults(release).checked,
             "model": spec.to_dict() if fmt == "json" else spec.name}
    dicts = _sweep_entries(shown, setup, gpu_hour_price, table=True) if fmt == "table" or plot is not None else []
    text = None if fmt == "table" else _sweep_text(shown, setup, spec, workload, fmt, plot is not None, gpu_hour_price,
                                                   release)
    if fmt == "csv" and not shown:  # nothing shown: the columns of a row (the search always makes one)
        from advisor import render

        text = render.csv_header(_sweep_text(result.rows[:1], setup, spec, workload, fmt, False, gpu_hour_price,
                                             release))
    title = setup_line(spec, workload, gpus, mem, threshold, options, gpu, memory_model, rank_by, result.escalation)
    if plot is not None:
        write_plot(dicts, plot, title)
    caption = counts_caption(counts, show_all, len(shown), len(selected)) + evaluation_caption(tokens, workload, release)
    columns = (memory_model != "paper", gpu is not None, tokens is not None, gpu_hour_price is not None, False, rank_by)
    _emit_sweep(dicts, text, fmt, output, result, title, caption, columns, tolerance,
                nothing=None if any(row.rank for row in result.rows) or show_all else
                _nothing_fits(result.rows, counts, space, mem, result.ladder))


def _measured(profile_dir, spec, options):
    """``--profile DIR``: the activations as profiled (``advisor.profile_terms``), checked against
    the sweep's model and options; None without it."""
    if profile_dir is None:
        return None
    from advisor.profile_terms import measured_activations

    measured = measured_activations(profile_dir)
    measured.check_sweep(spec, options.attention.flash_attention, options.tensor_parallel.sequence_parallel)
    return measured


def _tolerance(rank_by: str) -> float | None:
    """The throughput ranking's tolerance (``advisor.ranking.ranking_tolerance``); None otherwise."""
    if rank_by != "throughput":
        return None
    from advisor.ranking import ranking_tolerance

    return ranking_tolerance()


def _sweep_entries(shown, setup: dict, gpu_hour_price, *, table: bool) -> list[dict]:
    """One dict per row shown, with its setup (``table``: with the split and recomputation as
    the table and the plot show them; the rows as JSON and CSV write them are ``_sweep_text``'s)."""
    from advisor import render
    from advisor.ranking import cost_usd

    dicts = []
    for row in shown:
        entry = {**row.to_dict(), **setup}
        if gpu_hour_price is not None:
            entry["cost_usd"] = cost_usd(entry["gpu_hours"], gpu_hour_price)
        if table:
            entry.update(split=render.counts_text(entry["layers_per_stage"]),
                         recompute_text=render.recompute_text(entry))
        dicts.append(entry)
    return dicts


def _sweep_text(shown, setup: dict, spec, workload, fmt: str, plotted: bool, gpu_hour_price, release) -> str:
    """The rows as JSON or CSV, each with its setup, options and Megatron flags, so that one row
    launches on its own. The flags come in parts shared between rows (``rows_arg_parts``), and
    JSON encodes the setup, each part and each options dict once (``render.rows_to_json``)."""
    from advisor import render
    from advisor.megatron_args import rows_arg_parts
    from advisor.options.flags import spelled_parts
    from advisor.ranking import cost_usd

    parts, row_options = rows_arg_parts(spec, workload.seq_len, workload.global_batch_size, shown, release)
    parts = spelled_parts(release, parts)  # as the release priced reads them
    plotted = plotted and fmt == "json"  # CSV leaves the plot's columns out
    shared_tails: dict = {}  # id of options -> (those options, the tail of the rows with them): a handful
    rows, tails = [], []
    for row, options in zip(shown, row_options):
        held = shared_tails.get(id(options))
        if held is None or held[0] is not options:
            held = shared_tails[id(options)] = (options, {"options": options.changed()})
        entry, tail = row.to_dict(), held[1]
        if gpu_hour_price is not None or plotted:  # keys of the row's own before its options, as ever
            tail = {"cost_usd": cost_usd(entry["gpu_hours"], gpu_hour_price)} if gpu_hour_price is not None else {}
            if plotted:
                tail.update(split=render.counts_text(entry["layers_per_stage"]),
                            recompute_text=render.recompute_text(entry))
            tail["options"] = held[1]["options"]
        rows.append(entry)
        tails.append(tail)
    if fmt == "json":
        return render.rows_to_json(rows, setup, "megatron_args", parts, tails)
    # CSV, the README's columns: the options as one JSON cell, the flags as one line
    return render.to_csv([{**entry, **setup, **tail, "options": json.dumps(tail["options"], sort_keys=True),
                           "megatron_args": " ".join(flag for part in flags for flag in part),
                           "layers_per_stage": render.counts_text(entry["layers_per_stage"])}
                          for entry, tail, flags in zip(rows, tails, parts)])


def _emit_sweep(dicts: list[dict], text: str | None, fmt: str, output, result, title: str, caption: str,
                columns: tuple, tolerance: float | None, nothing: str | None) -> None:
    """Write the rows (JSON, CSV or the table); with ``nothing`` (no row ranked), the line saying
    why instead of an empty table, and exit status 1 (no result)."""
    from advisor import render

    searched = (f"{render.counted(result.considered, 'layout')} considered (TP, CP, PP, DP, MBS x VPP x recomputation), "
                f"{result.pruned:,} pruned as unable to fit or to win")
    if fmt == "table":
        from advisor.sweep_columns import sweep_columns

        text = render.to_table(
            dicts, sweep_columns(*columns), title=title,
            caption=f"{caption}\n{searched}" + (f"\n{render.ranking_note(tolerance)}" if tolerance else ""),
            row_style=render.verdict_style, drawing=drawing_for(output),
        )
    if fmt != "table":
        note(f"{command_name()}: {searched}")
    if nothing is not None:
        if fmt != "table":
            emit(text, output)
        nothing_fits(nothing)
    emit(text, output)


def _nothing_fits(rows, counts: dict, space, mem: float, ladder: tuple = ()) -> str:
    """The line saying why no row runs: the verdicts' tally, the layout that needs the least,
    the rungs of --sharding auto climbed in vain (``ladder``: ``Sweep.ladder``, worded by
    ``sweep_table.ladder_text`` as the MoE sweep words its own), and the choices that could help."""
    from advisor import render

    least = min(rows, key=lambda row: row.judged_gib, default=None)  # the memory the verdicts judged
    tally = ", ".join(f"{n:,} {v}" for v, n in counts.items())
    if least is None:
        return f"{command_name()}: nothing fits: {tally}. Try more GPUs (--all shows the rows)"
    floor = min(_states_gib(row) for row in rows)
    # where the states alone exceed the memory, each layout is priced without recomputation
    # (advisor.space_search: no variant can fit), which would lower its activations, not its states
    plain = " without recomputation" if floor > mem else ""
    need = (f"; the least any layout needs{plain} is {least.judged_gib:.1f} GiB per GPU against {mem:g} GiB "
            f"(TP {least.parallel.tp}, CP {least.parallel.cp}, PP {least.parallel.pp}, MBS {least.parallel.mbs})")
    if floor > mem:  # the --seq-len, the micro-batch and recomputation touch activations only
        return _states_bound(f"{command_name()}: nothing fits: {tally}{need}", rows, least, space, mem, floor, ladder)
    hints = ["more GPUs", "a shorter --seq-len"]
    if space.recompute in ("none", "selective"):  # auto and full have tried full recomputation
        hints.insert(1, "--recompute auto")
    if space.split == "even":
        hints.insert(1, "--split auto")
    if space.sharding == "fixed":  # auto has tried Megatron-FSDP and CPU offload
        hints.insert(1, "--sharding auto")
    hints[1:1] = hints_text.unpinned(space.pinned.given())
    return (f"{command_name()}: nothing fits: {tally}{need}{ladder_text(ladder)}. Try {render.listed(hints, 'or')} "
            "(--all shows the rows)")


def _states_gib(row) -> float:
    """The weights, gradients and optimizer states of a row's fullest stage, GiB."""
    from advisor.memory import GIB

    return float(row.estimate.terms.model_states.max()) / GIB


def _states_bound(head: str, rows, least, space, mem: float, floor: float, ladder: tuple = ()) -> str:
    """The nothing-fits line where no row's model states alone fit: what they need, and only the
    hints that can shrink them. Megatron-FSDP and optimizer CPU offload can, down to the weights
    and gradients sharded over every GPU (a floor: their gathered buffers come on top); where
    even that floor does not fit, no sharding can make room for any activations either. Where
    --sharding auto climbed, ``ladder`` (``Sweep.ladder``) says which rungs it swept in vain and
    why it did not sweep the others."""
    from advisor import render
    from advisor.memory import GIB

    training = least.training
    plain = not (training.data_parallel.fsdp_strategy or training.offload.optimizer_cpu_offload)
    sharded = min(float((row.estimate.terms.weights + row.estimate.terms.gradients).max())
                  / (row.parallel.dp * row.parallel.cp) for row in rows) / GIB
    text = head + hints_text.states_text(_states_gib(least), mem)
    hints = ["more GPUs", *hints_text.unpinned(space.pinned.given()), *(["--split auto"] if space.split == "even" else [])]
    if sharded > mem:
        over = f" sharded over all {least.parallel.gpus} GPUs" if least.parallel.gpus > 1 else ""  # 1: none to shard
        text += (f";{over} with the optimizer in host memory, the weights "
                 f"and gradients alone would still need {sharded:.1f} GiB")
    elif plain and space.sharding == "auto":  # the escalation climbed: what it tried, and why not the rest
        text += ladder_text(ladder)
        if lowered := training.optimizer_states.lowered:  # offload refuses them (its states stay FP32)
            hints.append(f"--optimizer-cpu-offload without {' and '.join(flag.split()[0] for flag in lowered)}")
        elif not training.optimizer_states.precision_aware_optimizer:  # FSDP is not priced with it
            hints.append("a shorter --seq-len with them")
    elif plain:
        hints.append("--sharding auto (Megatron-FSDP, optimizer CPU offload)")
    else:  # a lever given: the sweep escalates no further
        fsdp = training.data_parallel.fsdp_strategy
        hints += [flag for flag, unused in (
            (("" if fsdp else "--use-megatron-fsdp ") + "--data-parallel-sharding-strategy optim_grads_params",
             fsdp != "optim_grads_params"),
            ("--optimizer-cpu-offload", not training.offload.optimizer_cpu_offload)) if unused]
    if sharded <= mem and space.recompute in ("none", "selective"):  # with states shrunk, activations count
        hints.append("--recompute auto")
    if hints_text.bigger_gpu(floor, mem):
        hints.append("a GPU with more memory")
    return f"{text}. Try {render.listed(hints, 'or')} (--all shows the rows)"


@click.command(epilog=EPILOG)
@click.option("--tp", type=DEGREE, default=1, show_default=True, help="Tensor parallel size.")
@click.option("--cp", type=DEGREE, default=1, show_default=True, help="Context parallel size.")
@click.option("--pp", type=DEGREE, default=1, show_default=True, help="Pipeline parallel size.")
@click.option("--mbs", type=MICRO_BATCH, default=1, show_default=True, help="Micro-batch size.")
@click.option("--gpus", type=GPUS, default=None,
              help="Total GPUs; DP = N / (TP x CP x PP). Give this or --dp.")
@click.option("--dp", type=DEGREE, default=None, help="Data parallel size (instead of --gpus).")
@click.option("--vpp", type=DEGREE, default=1, show_default=True,
              help="Virtual pipeline stages per rank (interleaved 1F1B).")
@click.option("--layers-per-stage", type=NonEmpty("give one layer count per stage, for example 7,9,9,7"),
              default=None, metavar="N,N,...",
              help="Uneven pipeline split, one layer count per stage (for example 7,9,9,7), or in runs as "
                   "the sweep prints them (7,9x2,7).")
@gpu_options("estimate")
@click.option("--threshold", type=FRACTION, default=DEFAULT_THRESHOLD, show_default=True,
              help="The paper's rule (--memory-model paper): fits at most this fraction of --mem, tight up to "
                   "all of it, oom beyond.")
@click.option("--memory-model", type=click.Choice(["calibrated", "paper"]), default=None,
              help="calibrated (default with --gpu) or paper (Eq. 18 and its 80% rule; default without).")
@click.option("--tokens", type=TokenCount(limits.TOKENS), default=None,
              help="A token budget (15T, 300B): adds the days and GPU-hours it takes (needs --gpu).")
@GPU_HOUR_PRICE
@model_options
@workload_options
@memory_options(torch_fsdp2=True)
@click.option("--from-command", type=InputPath(dir_okay=False, allow_dash=True), default=None, metavar="FILE|-",
              help="Read the layout, model and training options from your own pretrain_gpt.py argument list, "
                   "torchrun / srun / python -m torch.distributed.run line or launch script ('-': stdin). "
                   "The world size comes from torchrun's or Slurm's arguments, or --gpus.")
@click.option("--compare-best", is_flag=True,
              help="Also show the best row of 'advisor sweep' on the same GPUs, model and options.")
@moe_options("estimate")
@output_options
def estimate(tp, cp, pp, mbs, gpus, dp, vpp, layers_per_stage, gpu, mem, gpus_per_node, threshold, memory_model,
             tokens, gpu_hour_price, spec, workload, options, release, from_command, compare_best, fmt, output,
             moe) -> None:
    """Per-GPU memory of one configuration, stage by stage; with --gpu, its step time too.

    \b
    Model states (BF16 weights, FP32 gradients, Adam states sharded over
    DP x CP) and activations (1F1B: stage i holds PP - i microbatches) for every
    pipeline stage. The peak stage decides the verdict. With --gpu the
    calibrated memory model gives the verdict and its margin, and the time
    model the step time, its parts, TFLOP/s per GPU (as Megatron-LM counts
    FLOPs), MFU and tokens/s.

    \b
    --from-command reads your own launch instead: a pretrain_gpt.py argument
    list, a torchrun / srun / python -m torch.distributed.run line, or a launch
    script as you paste it (continuations, comments, VAR=value, $VAR, arrays).
    Flags that change memory or time and are not priced are named in one line;
    data, logging, checkpoint and learning-rate flags are skipped.

    The exit status is 0 whenever the estimate is made, whatever its verdict (a script
    reads 'verdict' from --format json: fits, likely fits, tight, likely oom, oom); a
    sweep's is 1 when no layout fits.

    \b
    Examples (the public code's test: weights, gradients and optimizer
    states 44.87 GiB, activations 22.64 GiB):
      advisor estimate --tp 2 --pp 1 --mbs 1 --gpus 4 --model llama3.1-8b
      advisor estimate --from-command train.sh --gpu h100-80gb --compare-best
      advisor estimate --tp 8 --pp 16 --gpus 16384 --gpu h100-80gb \\
          --model llama3.1-405b --gbs 2048 --tokens 15T \\
          --layers-per-stage 7,8,8,8,8,8,8,8,8,8,8,8,8,8,8,7
    """
    from advisor.cli.from_command import estimate_notes, with_routing
    from advisor.parallel import ParallelConfig, default_layers_per_stage
    from advisor.pricing import price_layout

    given_memory_model = memory_model
    memory_model, _ = _resolve_choices(gpu, memory_model, None, tokens, gpu_hour_price=gpu_hour_price)
    read = None
    if from_command is not None:
        read, (spec, options, gpus, dp, tp, cp, pp, mbs, vpp, layers_per_stage, workload, gpu, gpus_per_node) = \
            _read_command(from_command, gpus, release, gpu, gpus_per_node)
    dp = _data_parallel(gpus, dp, tp, cp, pp, gpus_per_node)
    _check_budget_covers_a_step(tokens, workload)
    if read is not None and read.moe is not None:  # the command's own MoE flags (advisor.moe.readback)
        moe = with_routing(read.moe, moe)
    options = dense_recompute_options(spec, moe, options)
    spec, settings = moe_settings(spec, moe, options=options, gpu=gpu, release=release)
    given = _layer_counts(layers_per_stage)
    if settings is not None:  # a mixture of experts: advisor.moe's stages, EP and ETP
        return moe_cli.estimate(spec, workload, tp, cp, pp, moe.ep, moe.etp, dp, mbs, mem, threshold, gpu, settings,
                                fmt, output, vpp, _moe_recompute(options), given_memory_model, read,
                                layers_per_stage=given, compare_best=compare_best, gpus_per_node=gpus_per_node,
                                budget=(tokens, gpu_hour_price), release=release)
    parallel = ParallelConfig(tp=tp, cp=cp, pp=pp, dp=dp, mbs=mbs, vpp=vpp)
    stages, planned = _planned_split(spec, given, pp, vpp)
    _check_layout_options(options, spec, tp, pp, stages or default_layers_per_stage(spec.num_layers, pp), vpp, release)
    row, result, assessment, timing, parts = price_layout(
        spec, workload, parallel, stages, options, gpu=gpu, mem=mem, threshold=threshold, memory_model=memory_model,
        tokens=tokens, release=release, gpus_per_node=gpus_per_node, gpu_hour_price=gpu_hour_price)
    notes = estimate_notes(row, read, fmt, output, release)
    if compare_best:
        from advisor.cli.from_command import best_row_line

        best, line = best_row_line(row, spec, workload, parallel.gpus, mem, threshold, gpu, gpus_per_node,
                                   options, memory_model)
        row["best_sweep_row"] = best
        notes.append(line)
    stage_rows = [stage.to_dict() for stage in result.stages]
    if fmt == "table":
        caption = _estimate_caption(spec, parallel, stages if planned else None, result, row, assessment, timing,
                                    parts, mem, tokens, gpu_hour_price, notes)
        emit(_stage_table(stage_rows, spec, parallel, workload, gpu, result.peak.stage, caption, row["verdict"],
                          output, options), output)
        return
    from advisor import render
    from advisor.cli.estimate_csv import estimate_csv

    emit(render.to_json({**row, "stages": stage_rows}) if fmt == "json" else estimate_csv(row, stage_rows), output)


def _command_nodes(read, gpu, gpus_per_node: int):
    """(gpu, GPUs per node) as the command starts its ranks: fewer per node than the preset's
    GPUs (torchrun --nproc-per-node 4 on 8-GPU nodes) leave the others out of each node's NVLink
    group, so TP spans nodes sooner; --gpus-per-node, given, decides instead."""
    per_node = read.gpus_per_node
    if per_node is None or per_node >= gpus_per_node or given("gpus_per_node"):
        return gpu, gpus_per_node
    # held: said once the command's other checks have passed (bad input stays one line)
    held_note(f"advisor estimate: priced at {per_node} GPUs per node, as the command's launcher starts its ranks "
         f"(the preset has {gpus_per_node}); --gpus-per-node decides otherwise")
    return (gpu.with_overrides(gpus_per_node=per_node) if gpu is not None else None), per_node


def _read_command(from_command, gpus, release, gpu, gpus_per_node: int):
    """``--from-command``: the launch's reading (``advisor.cli.from_command.read_inputs``) and the
    command's values it gives (spec, options, gpus, dp, tp, cp, pp, mbs, vpp, layers per stage,
    workload, and the GPU with its GPUs per node as the command starts its ranks)."""
    from advisor.cli.from_command import read_inputs, refuse_explicit
    from advisor.parallel import Workload

    ctx = click.get_current_context()
    refuse_explicit(ctx)
    read = read_inputs(from_command, gpus=gpus, vocab_size=ctx.params.get("vocab_size"), release=release)
    run, layout = read.run, read.run.layout
    pp, mbs = layout.pp, layout.mbs
    layers_per_stage = ",".join(map(str, layout.layers_per_stage)) if pp > 1 else None
    # Megatron's default global batch: one microbatch per DP rank (validate_args).
    workload = Workload(seq_len=run.seq_len, global_batch_size=layout.global_batch_size or mbs * read.dp)
    return read, (run.spec, run.options, read.gpus, read.dp, layout.tp, layout.cp, pp, mbs, layout.vpp,
                  layers_per_stage, workload, *_command_nodes(read, gpu, gpus_per_node))


def _data_parallel(gpus: int | None, dp: int | None, tp: int, cp: int, pp: int, gpus_per_node: int) -> int:
    """DP from --gpus or --dp (one line where they disagree), the GPUs filling whole nodes."""
    from advisor.parallel import check_whole_nodes, model_parallel_problem

    if gpus is None and dp is None:
        raise InputError("give --gpus or --dp")
    model_parallel = tp * cp * pp
    if gpus is not None:
        if problem := model_parallel_problem(gpus, tp, cp, pp):
            raise InputError(problem)
        if dp is not None and dp != gpus // model_parallel:
            raise InputError(f"--dp {dp} disagrees with --gpus {gpus} / (TP x CP x PP) = {gpus // model_parallel}")
        dp = gpus // model_parallel
    check_whole_nodes(gpus or dp * model_parallel, gpus_per_node)
    return dp


def _check_layout_options(options, spec, tp: int, pp: int, layers_per_stage, vpp: int, release) -> None:
    """One line where Megatron-LM refuses the options with this layout (``layout_problem``), or,
    the split being one it builds, where the release fails on --recompute-num-layers with its
    model chunks (``Recomputation.chunk_problem``, the check advisor sweep and recommend share)."""
    from advisor.megatron_args import chunk_layers
    from advisor.memory import split_problem

    if problem := options.layout_problem(tp=tp, pp=pp, tie_embeddings=spec.tie_embeddings):
        raise InputError(problem)
    if problem := split_problem(spec.num_layers, pp, vpp, tuple(layers_per_stage)):
        raise InputError(problem)
    if problem := options.recomputation.chunk_problem(chunk_layers(layers_per_stage, vpp), release):
        raise InputError(problem)


def _moe_recompute(options) -> str:
    """The recomputation MoE stages price: none, selective, or full on every layer."""
    recomputation = options.recomputation
    if recomputation.recompute == "full" and (recomputation.recompute_method,
                                              recomputation.recompute_num_layers) != ("uniform", 1):
        raise InputError("for MoE models, full recomputation is priced for every layer (--recompute-method "
                         "uniform --recompute-num-layers 1)")
    return recomputation.recompute


def _layer_counts(layers_per_stage: str | None) -> tuple[int, ...] | None:
    try:
        return parse_layer_counts(layers_per_stage) if layers_per_stage else None
    except ValueError as error:
        raise InputError(f"--layers-per-stage: {error}") from None


def _planned_split(spec, stages: tuple[int, ...] | None, pp: int, vpp: int) -> tuple[tuple[int, ...] | None, bool]:
    """The layers per stage given, or, where PP does not divide the layers, the planner's split (as
    the sweep's rows have it; ``planned`` True); None for Megatron's even split."""
    planned = stages is None and spec.num_layers % (pp * vpp) != 0
    if planned:
        if spec.num_layers < pp * vpp:
            raise InputError(f"{spec.num_layers} layers cannot fill PP {pp} x VPP {vpp} model chunks (one layer each)")
        stages = _evenest_split(spec.num_layers, pp)
    return stages, planned


def _estimate_caption(spec, parallel, planned_split, result, row: dict, assessment, timing, parts, mem, tokens,
                      gpu_hour_price, notes: list[str]) -> str:
    """The table's caption: the peak stage and the verdict, the step time and the notes."""
    from advisor import render
    from advisor.memory import GIB

    peak = result.peak
    caption = f"peak: stage {peak.stage}, {peak.total_bytes / GIB:.2f} GiB (Eq. 18)"
    if planned_split is not None:
        over = (f"PP {parallel.pp}" if parallel.vpp == 1 else
                f"PP {parallel.pp} x VPP {parallel.vpp} ({parallel.pp * parallel.vpp} model chunks)")
        caption = (f"{spec.num_layers} layers do not divide over {over}: split "
                   f"{render.counts_text(planned_split)}, the evenest (--layers-per-stage to choose)\n{caption}")
    if assessment is not None:
        caption += render.memory_call_text(mem, assessment.verdict, usage_gib=assessment.usage_gib)
    elif mem:
        caption += render.memory_call_text(mem, row["verdict"], fraction=row["memory_fraction"])
    if timing is not None:
        hypothetical = hints_text.if_it_fit(row["verdict"])
        caption += f"\n{hypothetical}{render.step_text(timing, parts, row.get('options'))}"
        if tokens is not None:
            caption += f"\n{hypothetical}{render.budget_text(row, gpu_hour_price)}"
    return caption + "".join("\n" + note for note in notes)


def _stage_table(stage_rows: list[dict], spec, parallel, workload, gpu, peak_stage: int, caption: str, verdict: str,
                 output, options) -> str:
    """One row per pipeline stage, the peak stage in its verdict's colour; the title names the
    layout and, as the sweep's does, the training options that differ from the defaults."""
    from advisor import render
    from advisor.options.flags import changed_args

    columns = [
        render.Column("stage", "stage"),
        render.Column("position", "position", justify="left", drop=5),
        render.Column("layers", "layers"),
        render.Column("in_flight_microbatches", "in flight", hints_text.IN_FLIGHT_FORMAT, drop=6),
        # narrow terminals drop the states' three parts together (their sum stays), then the states
        # and activations together, never the total: the terms shown always add up to it. Each says
        # its unit: where only the total's header said 'GiB', the parts' depended on it
        render.Column("weights_gib", "weights", ".2f", drop=4, group="parts", unit="GiB"),
        render.Column("gradients_gib", "grads", ".2f", drop=4, group="parts", unit="GiB"),
        render.Column("optimizer_gib", "optimizer", ".2f", drop=4, group="parts", unit="GiB"),
        render.Column("model_states_gib", "states", ".2f", drop=2, group="terms", unit="GiB"),
        render.Column("activations_gib", "activations", ".2f", drop=2, group="terms", unit="GiB"),
        render.Column("total_gib", "total", ".2f", drop=-1, unit="GiB"),
    ]
    p = parallel
    title = (
        f"{spec.name}: TP {p.tp}, CP {p.cp}, PP {p.pp}, DP {p.dp}, MBS {p.mbs}"
        + (f", VPP {p.vpp}" if p.vpp > 1 else "") + f", seq {workload.seq_len}, gbs {workload.global_batch_size}"
        + (f", {gpu.name}" if gpu else "")
    )
    if changed := changed_args(options):
        title += f"; {changed}"
    if note := hints_text.in_flight_note(stage_rows):
        caption += f"\n{note}"
    style = render.VERDICT_STYLES.get(verdict)
    return render.to_table(
        stage_rows, columns, title=title, caption=caption,
        row_style=lambda stage_row: style if stage_row["stage"] == peak_stage else None, drawing=drawing_for(output),
    )


def _evenest_split(layers: int, pp: int) -> tuple[int, ...]:
    """``layers`` over ``pp`` ranks as evenly as they go, the ranks with one layer fewer at the
    ends first (the first rank also holds the embedding, the last the LM head): 126 over 16 ->
    7,8x14,7, the split the README's 405B example gives by hand."""
    base, extra = divmod(layers, pp)
    order = list(range(1, pp - 1)) + [0, pp - 1][:pp]  # the middle ranks take the extra layers first
    counts = [base] * pp
    for rank in order[:extra]:
        counts[rank] += 1
    return tuple(counts)
