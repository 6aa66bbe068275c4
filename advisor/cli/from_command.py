"""``advisor estimate --from-command FILE``: a user's own launch read into the estimate's inputs.

The reading is the core's (``advisor.shell_command``: the text; ``advisor.megatron_readback``:
the arguments); here only what the CLI adds: which of estimate's own options may go with it, the
world size, and the lines that tell the user what was read and what is not priced.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click

from advisor.errors import AdvisorError
from advisor.cli.options import InputError, note

ALLOWED_WITH_COMMAND = {"from_command", "compare_best", "gpus", "gpu", "mem", "gpus_per_node", "threshold",
                        "memory_model", "tokens", "vocab_size", "fmt", "output", "gpu_hour_price",
                        "megatron_version", "moe_routing", "moe_imbalance"}
"""estimate's options that the command cannot say (the hardware, the judging, the output, and the
routing a mixture of experts is priced under, no Megatron flag's); every other (layout, model,
training options) comes from the command, and giving it too is refused."""


def with_routing(flags, given_flags):
    """The command's MoE flags (``advisor.moe.readback.MoEFlags``) priced under the routing the
    advisor's own --moe-routing and --moe-imbalance give (``given_flags``: the CLI's), where given:
    a command says its capacity factor, not how its router will route."""
    from dataclasses import replace

    changes = {name: getattr(given_flags, name) for name, flag in (("moe_routing", "--moe-routing"),
                                                                   ("moe_imbalance", "--moe-imbalance"))
               if flag in given_flags.given}
    return replace(flags, **changes, given=tuple(given_flags.given)) if changes else flags


@dataclass(frozen=True, slots=True)
class CommandInputs:
    """The estimate's inputs, as the command gives them."""

    run: object
    """``advisor.megatron_readback.ReadRun``."""
    gpus: int
    dp: int
    source: str
    """One line: what was read, and where the world size came from."""
    gpus_per_node: int | None = None
    """The ranks per node the command's launcher starts, where it says (``LaunchCommand``)."""

    @property
    def moe(self):
        """The command's MoE part (``advisor.moe.readback.MoEFlags``), or None."""
        return self.run.moe


def refuse_explicit(ctx: click.Context) -> None:
    """One line for the first option given beside --from-command that the command decides."""
    for name in ctx.params:
        if name in ALLOWED_WITH_COMMAND:
            continue
        if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE:
            flag = next((p.opts[0] for p in ctx.command.params if p.name == name), name)
            raise InputError(f"{flag} comes from the command with --from-command (edit the command instead)")


def read_inputs(path: str, *, gpus: int | None, vocab_size: int | None, release=None) -> CommandInputs:
    """The pasted command's run, its world size (--gpus overrides the launcher's) and DP. Every
    refusal of what the file says begins '--from-command NAME: ', said here once: a refusal of a
    value (--tensor-model-parallel-size 0) or of the world size named no file, where the shell
    reading's line numbers did."""
    from advisor import limits
    from advisor.fileio import read_text

    text = read_text(path, max_bytes=limits.COMMAND_FILE_BYTES, what="command file")
    name = "stdin" if path == "-" else Path(path).name
    try:
        return _read_inputs(text, name, gpus=gpus, vocab_size=vocab_size, release=release)
    except (AdvisorError, InputError) as exc:
        raise InputError(f"--from-command {name}: {exc}") from None


def _read_inputs(text: str, name: str, *, gpus: int | None, vocab_size: int | None, release) -> CommandInputs:
    """``read_inputs`` of the file's ``text``; its errors are unprefixed (the caller names the file)."""
    from advisor.megatron_readback import Missing, MissingInputs, missing_line, model_parallel_degrees, read_run
    from advisor.shell_command import read_command

    launch = read_command(text)
    world, where = (gpus, "--gpus") if gpus is not None else (launch.world_size, launch.world_source)
    # The world size is missing independently of what the reading misses: one line names all.
    unknown = () if world is not None else (Missing("its world size", where, "--gpus N"),)
    try:
        run = read_run(launch.arguments, name=name, vocab_size=vocab_size, release=release)
    except MissingInputs as missing:
        # a world size the layout cannot use is told in the same line: TP, CP and PP read without the rest
        problems = [missing_line(missing.missing + unknown),
                    world is not None and _world_problem(world, where, text, *model_parallel_degrees(launch.arguments))]
        raise InputError("; also, ".join(filter(None, problems))) from None
    if unknown:
        raise InputError(missing_line(unknown))
    layout = run.layout
    # without --expert-tensor-parallel-size, Megatron's ETP is the TP (arguments.py, both releases)
    experts = (run.moe.ep or 1, run.moe.etp or layout.tp) if run.moe is not None else (1, 1)
    if problem := _world_problem(world, where, text, layout.tp, layout.cp, layout.pp, *experts):
        raise InputError(problem)
    dp = world // (layout.tp * layout.cp * layout.pp)
    if problem := _batch_problem(layout, dp):
        raise InputError(problem)
    source = f"{name}: {launch.launcher}, {world} GPU{'s' if world != 1 else ''} ({where}); vocabulary {run.vocab_source}"
    return CommandInputs(run=run, gpus=world, dp=dp, source=source,
                         gpus_per_node=launch.gpus_per_node if gpus is None else None)


def _batch_problem(layout, dp: int) -> str | None:
    """Why the command's global batch is not a whole number of microbatches per pipeline, named as
    the command gave it (--global-batch-size, or the last batch of --step-batch-size-schedule, which
    Megatron-LM refuses only when the schedule reaches it), or None."""
    from advisor.megatron_layout import STEP_SCHEDULE
    from advisor.parallel import global_batch_problem

    if layout.global_batch_size is None:
        return None
    subject = f"--global-batch-size {layout.global_batch_size}"
    if layout.step_schedule is not None:
        subject = (f"--{STEP_SCHEDULE}'s last batch, {layout.global_batch_size} (Megatron-LM fails when the schedule "
                   "reaches it),")
    return global_batch_problem(layout.global_batch_size, layout.mbs, dp, subject=subject)


def _world_problem(world: int, where: str, text: str, tp: int, cp: int, pp: int, ep: int = 1,
                   etp: int = 1) -> str | None:
    """Why the command's world size (or --gpus) cannot hold its TP x CP x PP, or its EP x ETP
    expert groups, with where the world size came from and the remedy."""
    from advisor.parallel import expert_groups_problem, model_parallel_problem

    if model_parallel_problem(world, tp, cp, pp) is None:
        problem = expert_groups_problem(world // pp, ep, etp)
        return problem and (f"{problem}, from {_world_subject(world, where, text)} over PP {pp}: "
                            "give --gpus N for the run you mean")
    problem = model_parallel_problem(world, tp, cp, pp, subject=_world_subject(world, where, text))
    return f"{problem}: give --gpus N for the run you mean"


def _world_subject(world: int, where: str, text: str) -> str:
    """'--gpus 8', or 'the world size 8 (how the launcher gave it)', naming the variables it came
    from through the script's own defaults (``shell_command.world_defaults``): a launch script's
    NNODES=${NNODES:-1} counts one node here, whatever the caller's environment holds."""
    from advisor.shell_command import world_defaults

    if where == "--gpus":
        return f"--gpus {world}"
    defaults = world_defaults(text)
    named = ", ".join(f"${name} from the script's default ${{{name}:-{default}}}" for name, default in defaults)
    return (f"the world size {world} ({where}; {named}: the caller's environment is not read)" if named
            else f"the world size {world} ({where})")


def unpriced_line(unpriced: tuple[str, ...], not_launched: tuple[str, ...] = ()) -> str | None:
    """The one line naming what changes memory or time and is not priced (None when nothing), and
    where the launch would write some of it otherwise (``priced_otherwise``) that advisor-launch
    launches the estimate only when told to."""
    from advisor.megatron_readback import priced_otherwise

    if not unpriced:
        return None
    refused = ("; advisor-launch runs this estimate only with --launch-as-priced (it trains what was priced)"
               if priced_otherwise(unpriced, not_launched) else "")
    return "not priced (they change memory or time): " + ", ".join(unpriced) + refused


def read_notes(row: dict, read: CommandInputs | None, table_on_stdout: bool = False) -> list[str]:
    """Where a --from-command estimate was read from, and the flags it does not price (also said
    on stderr, but where the table that shows them goes to the terminal: it said them twice); the
    row records both, and the command's flags that change no price ('not_launched': its learning
    rates, data and tokenizer, checkpoints, logging), which its megatron_args leave out and
    advisor-launch names. Then why the arguments carry a flag the command lacks (``ReadRun.added``),
    said the same way."""
    if read is None:
        return []
    row.update(read_from=read.source, unpriced=list(read.run.unpriced), not_launched=list(read.run.skipped))
    notes = [f"read {read.source}"] + [line for line in [unpriced_line(read.run.unpriced, read.run.skipped)] if line]
    if read.run.unpriced and not table_on_stdout:
        note(f"advisor estimate: {notes[-1]}")
    for line in read.run.added if not table_on_stdout else ():  # the arguments differ from the command
        note(f"advisor estimate: {line}")
    return notes + list(read.run.added)


def estimate_notes(row: dict, read: CommandInputs | None, fmt: str, output, release) -> list[str]:
    """An estimate's caption notes, dense and MoE rows alike: what ``release`` evaluates besides a
    budget's days (``advisor.evaluation.budget_note``; the table's alone, as the JSON and CSV rows
    carry no notes), then the reading of a command's (``read_notes``)."""
    from advisor.cli.options import table_on_stdout
    from advisor.evaluation import budget_note

    line = budget_note(row, release) if fmt == "table" else None
    return [*([line] if line is not None else []), *read_notes(row, read, table_on_stdout(fmt, output))]


def best_row_line(row: dict, spec, workload, gpus: int, mem: float | None, threshold: float, gpu, gpus_per_node: int,
                  options, memory_model: str) -> tuple[dict | None, str]:
    """(the best sweep row on the same GPUs, model, batch and options, one line comparing it with ``row``)."""
    from advisor.sweep import sweep

    need_memory(mem)
    result = sweep(spec, workload, gpus, mem, threshold=threshold, max_tp=gpus_per_node, options=options, gpu=gpu,
                   memory_model=memory_model)
    ranked = [candidate for candidate in result.rows if candidate.rank]
    best = ranked[0].to_dict() if ranked else None
    return best, comparison_line(best, row, gpus)


def need_memory(mem: float | None) -> None:
    if mem is None:
        raise InputError("--compare-best needs --gpu NAME or --mem GIB")


def comparison_line(best: dict | None, row: dict, gpus: int, *, experts: bool = False) -> str:
    """One line: the best sweep row ``best`` (its degrees, recomputation, the memory its verdict
    judged, the calibrated usage where there is one, and the verdict; EP and ETP with
    ``experts``) and its step time against ``row``'s."""
    if best is None:
        return f"best sweep row on {gpus} GPUs: nothing the sweep considers fits"
    names = ("TP", "CP", "PP") + (("EP", "ETP") if experts else ()) + ("DP", "MBS", "VPP")
    degrees = ", ".join(f"{name} {best[name.lower()]}" for name in names)
    gib = best["usage_gib"] if best.get("usage_gib") is not None else best["total_gib"]
    line = f"best sweep row on {gpus} GPUs: {degrees}, recompute {best['recompute']}, {gib:.1f} GiB, {best['verdict']}"
    if best.get("step_time_s") is not None and row.get("step_time_s") is not None:
        if row.get("verdict") in ("oom", "likely oom"):
            # a layout that does not fit has no step time to compare: its price is only 'if it fit'
            line += (f"; {best['step_time_s']:.2f} s per step, where yours is called {row['verdict']} "
                     f"({row['step_time_s']:.2f} s only if it fit)")
        else:
            ratio = row["step_time_s"] / best["step_time_s"]
            line += (f"; {best['step_time_s']:.2f} s per step against yours {row['step_time_s']:.2f} s "
                     f"(yours takes {ratio:.2f}x as long)")
            if ratio < 1:  # the sweep's first row is the simplest within the time model's error, not the fastest
                from advisor.ranking import ranking_tolerance

                tolerance = ranking_tolerance()
                line += (f"; yours is faster by the model, within the {tolerance:.1%} inside which the sweep ranks "
                         "the simpler layout first" if 1 / ratio <= 1 / (1 - tolerance)
                         else "; yours is faster by the model than every layout the sweep tried")
    return line
