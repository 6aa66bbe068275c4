"""``advisor compare-log LOG --from-command CMD``: a Megatron-LM training log against the estimate
of the command that produced it (``advisor.megatron_log`` reads and compares; this is the CLI)."""

from __future__ import annotations

import click

from advisor.cli.options import (EPILOG, GPUS, VOCABULARY, InputError, InputPath, document_options, drawing_for,
                                 emit_document, gpu_options)
from advisor.paper_rule import DEFAULT_THRESHOLD
from advisor.render import listed


@click.command("compare-log", epilog=EPILOG)
@click.argument("log", type=InputPath(dir_okay=False, allow_dash=True))
@click.option("--from-command", "command", type=InputPath(dir_okay=False, allow_dash=True), required=True,
              metavar="FILE|-", help="The launch that wrote the log (as 'advisor estimate --from-command' reads it).")
@click.option("--gpus", type=GPUS, default=None,
              help="World size, where the command does not give it; given, it replaces the command's.")
@click.option("--vocab-size", type=VOCABULARY, default=None,
              help="The tokenizer's vocabulary, where the command does not give it; given, it replaces the command's.")
@click.option("--megatron-version", "release", default=None, metavar="RELEASE",
              help="The Megatron-LM release whose defaults apply to flags the command leaves out (default: the newest "
                   "the advisor knows).")
@gpu_options("compare-log")
@document_options
def compare_log(log, command, gpus, vocab_size, release, gpu, mem, gpus_per_node, fmt, output) -> None:
    """Measured against predicted: the step time, TFLOP/s per GPU and peak memory per pipeline
    stage of a Megatron-LM training log, beside the advisor's estimate of its command.

    \b
    Read from the log (megatron/training): 'elapsed time per iteration (ms)'
    and 'throughput per GPU (TFLOP/s/GPU)' (needs --log-throughput) of every
    logged iteration after the first (start-up), their median; the '[Rank N]
    (after N iterations) memory (MB)' reports (one per model-parallel rank);
    Megatron's own 'Theoretical memory footprints' line; and, from a
    launch with --profile-dir, the hooks' peaks ('megatron_hooks: [Rank N]
    peak ...'), which replace Megatron's reports (the hooks reset torch's
    peak counters). A report after iteration 1 only (core_v0.15.2's) comes
    before Adam's moments exist, and is labelled so.
    The step time and TFLOP/s need --gpu (the time model); memory needs neither.
    A log of another model, layout, world size or rank order than the
    command's is refused; with --rampup-batch-size only the iterations at
    the final global batch are compared.

    \b
    Examples:
      advisor compare-log train.log --from-command train.sh --gpu h100-80gb
      srun ... 2>&1 | tee train.log
      advisor compare-log train.log --from-command job.sbatch --format json
    """
    from advisor import limits, render
    from advisor.pricing import price_layout
    from advisor.verdicts import default_memory_model
    from advisor.cli.from_command import read_inputs
    from advisor.fileio import read_text
    from advisor.megatron_log import (compare, cut_note, ends_a_line, memory_source_note, read_log, run_notes,
                                      theoretical_note, unmeasured_note)
    from advisor.parallel import ParallelConfig, Workload

    if log == "-" and command == "-":
        raise InputError("the log and the command cannot both be standard input")
    # the log first, as the command line names it: a missing log is told before the command is read
    # errors="replace": a log of hours can hold a stray byte (ranks' output interleaved mid-character,
    # another program's text through tee); the lines read are Megatron's ASCII ones, and one bad
    # byte refused the whole log ('not UTF-8 text')
    text = read_text(log, max_bytes=limits.LOG_FILE_BYTES, what="training log", errors="replace")
    read = read_inputs(command, gpus=gpus, vocab_size=vocab_size, release=release)
    run, layout = read.run, read.run.layout
    training = read_log(text.splitlines(), last_line_ended=ends_a_line(text))
    workload = Workload(seq_len=run.seq_len, global_batch_size=layout.global_batch_size or layout.mbs * read.dp)
    ramp_up = _check_batches(training, workload.global_batch_size, layout.rampup_batch_size)
    _check_arguments(training, read, release)
    parallel = ParallelConfig(tp=layout.tp, cp=layout.cp, pp=layout.pp, dp=read.dp, mbs=layout.mbs, vpp=layout.vpp)
    estimate, result, *_ = price_layout(
        run.spec, workload, parallel, layout.layers_per_stage if layout.pp > 1 else None, run.options, gpu=gpu,
        mem=mem, threshold=DEFAULT_THRESHOLD, memory_model=default_memory_model(gpu is not None),
        release=release, gpus_per_node=gpus_per_node)
    estimate["stages"] = [stage.to_dict() for stage in result.stages]
    rows = compare(training, estimate, world_size=read.gpus, rank_order=layout.rank_order)
    notes = [f"read {read.source}", ramp_up, theoretical_note(training, estimate),
             _count(len(training.iterations), "logged iteration") + ", " + _count(len(training.memory), "memory report"), cut_note(training),
             memory_source_note(training, estimate), unmeasured_note(rows), *run_notes(training),
             f"the estimate's verdict: {estimate['verdict']}" if estimate.get("verdict") else None,
             None if gpu is not None else "no --gpu: the step time and TFLOP/s are predicted only for a GPU preset"]
    if run.unpriced:
        notes.append("not priced: " + ", ".join(run.unpriced))
    document = {"rows": rows, "notes": [note for note in notes if note], "estimate": estimate}

    def table() -> str:
        # narrow terminals lose the unit first, the ratio last (it is what the command is for)
        columns = [render.Column("what", "quantity", justify="left", keep=True),
                   render.Column("unit", "unit", justify="left", drop=2),
                   render.Column("measured", "measured", ".4g"), render.Column("predicted", "predicted", ".4g", drop=1),
                   render.Column("measured_over_predicted", "measured / predicted", ".3f", keep=True)]
        # emit_document: the table goes to standard output whatever --output is (it takes the JSON)
        return render.to_table(rows, columns, title=f"{log} against the estimate of {command}",
                               caption="\n".join(document["notes"]), drawing=drawing_for(None))

    emit_document(document, table, fmt, output)


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}{'' if n == 1 else 's'}"


def _check_batches(training, global_batch_size: int, rampup) -> str | None:
    """Refuse a log of another global batch; with the command's --rampup-batch-size (``rampup``),
    compare only the iterations at its final global batch (``TrainingLog.compared_batch``) and
    return the note on the ramp-up iterations left out (None where there are none)."""
    logged = sorted({i.global_batch_size for i in training.iterations} - {None})
    ramp = [size for size in logged if size != global_batch_size]
    if not ramp:
        return None
    if rampup is None or ramp[-1] > global_batch_size:
        sizes = ("size " if len(logged) == 1 else "sizes ") + listed(logged)
        raise InputError(f"the log trains global batch {sizes}, the command {global_batch_size}: "
                         "is it the command that wrote the log?")
    left_out = sum(i.global_batch_size in ramp for i in training.iterations)
    sizes = ("size " if len(ramp) == 1 else "sizes ") + listed(ramp)
    if global_batch_size not in logged:
        raise InputError(f"every logged iteration ramps up (global batch {sizes}; --rampup-batch-size "
                         f"{' '.join(map(str, rampup))}), none trains the command's global batch {global_batch_size}: "
                         "nothing to compare; give a log that runs past the ramp-up")
    training.compared_batch = global_batch_size
    return (f"{_count(left_out, 'logged ramp-up iteration')} (global batch {sizes}) left out: the times are those "
            f"at global batch {global_batch_size}")


def _check_arguments(training, read, release) -> None:
    """The log's arguments against the command: a log of another model, layout, world, rank order
    or padded vocabulary is refused (``advisor.megatron_log.LAYOUT_ARGUMENTS``), as one of another
    global batch is. The padded vocabulary only where the command (with ``release``) says it:
    NullTokenizer's rows differ by release (``ReadRun.vocab_by_release``)."""
    from advisor import equations as eq
    from advisor.parallel import RANK_ORDER

    run, layout, spec, printed = read.run, read.run.layout, read.run.spec, dict(training.arguments)
    if printed.get("group_query_attention") == "False":  # Megatron then ignores --num-query-groups (default 1)
        printed["num_query_groups"] = printed.get("num_attention_heads")
    command = {"num_layers": spec.num_layers, "hidden_size": spec.hidden_size, "ffn_hidden_size": spec.ffn_hidden_size,
               "num_attention_heads": spec.num_attention_heads, "num_query_groups": spec.num_query_groups,
               "tensor_model_parallel_size": layout.tp, "pipeline_model_parallel_size": layout.pp,
               "context_parallel_size": layout.cp, "micro_batch_size": layout.mbs, "seq_length": run.seq_len,
               "world_size": read.gpus, "data_parallel_size": read.dp,
               "use_tp_pp_dp_mapping": layout.rank_order != RANK_ORDER,
               "padded_vocab_size": None if run.vocab_by_release and release is None else
               eq.padded_vocab_size(spec.vocab_size, run.options.vocab_divisible_by, layout.tp)}
    differ = [f"{name} {printed[name]} (the command: {value})" for name, value in command.items()
              if value is not None and printed.get(name) is not None and printed[name] != str(value)]
    if differ:
        vocab = f"; its vocabulary: {run.vocab_source}" if "padded_vocab_size" in " ".join(differ) else ""
        raise InputError(f"the log ran {', '.join(differ)}{vocab}: is it the command that wrote the log?")
