"""``advisor-launch``: run Megatron-LM's pretrain_gpt.py with the configuration the advisor chose.

A thin click layer: reading the input (``launch.inputs``), the Megatron-LM arguments and their
conflicts (``launch.arguments``), the commands (``launch.commands``) and running them
(``launch.process``). Nothing here imports torch.
"""

from __future__ import annotations

import functools
import inspect
import re
import shlex
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Literal, Sequence

import click

from advisor import limits
from advisor.cli.help_sections import Sections, SectionedHelp
from advisor.cli.options import (GPUS, GPUS_PER_NODE, MEGATRON_CHECKOUT, ROWS, STDOUT, TCP_PORT, Bounded, CloseCommands,
                                 InputError, InputPath, NonEmpty, OneLineErrors, TokenCount, apply_options, emit,
                                 flush_notes, held_note, one_line, output_option, refuse_overwriting_inputs, wrote)
from launch.commands import DEFAULT_RDZV_PORT, SIGNAL_TIME_S, signal_at_start_warning

if TYPE_CHECKING:
    from launch.arguments import UnknownFlag
    from launch.inputs import LaunchInput

EPILOG = ("Megatron-LM arguments go after '--' and pass through unchanged; those that contradict the input "
          "(layout, batch, model, memory switches), or lack the value Megatron's parser needs "
          "(or give one its int or float type refuses), are refused. Exit status: 2 for bad input or a failed "
          "check (nothing is started); 0 where nothing is run (args, check, k8s, skypilot, a dry run); else the "
          "status of the torchrun or sbatch it ran (128 + N where signal N killed it; Ctrl-C before: 130). "
          "Docs: docs/launch.md.")

USER_ARGS_HELP = textwrap.dedent("""\
    \b
    The input decides the model, the layout (TP, CP, PP and the split), the
    batch and the memory switches. You add the rest after '--': data
    (--data-path ... or --mock-data), tokenizer (--tokenizer-type ...),
    iterations (--train-iters N), learning rate (--lr ...), logging and
    checkpoints. --mock-data here adds Megatron-LM's mock data with a
    NullTokenizer sized to the model's vocabulary.""")


class LaunchGroup(OneLineErrors, CloseCommands):
    """Every input error as one line with exit status 2: the notes and warnings a command
    gathers (``advisor.cli.options.held_note``) are printed once its checks have passed (before
    its output, or before it starts a process), never ahead of its error line."""


LAUNCH_SECTIONS: Sections = (
    ("Input", ("source", "rank", "launch_as_priced")),
    ("Megatron-LM", ("megatron_lm", "megatron_version", "mock_data", "job_config", "tokens", "fs_bandwidth")),
    ("Nodes", ("nproc_per_node", "nnodes", "nodes", "gpus_per_node", "no_gpus_here", "node_rank", "rdzv_endpoint",
               "rdzv_id", "rdzv_port")),
    ("Job", ("name", "job_name", "image", "namespace", "accelerator", "partition", "account", "time", "qos",
             "cpus_per_task", "signal_time", "requeue")),
    ("Profiling", ("profile_dir", "run_id")),
    ("Output", ("fmt", "output", "dry_run")),
)
"""The subcommands' --help sections (``advisor.cli.help_sections``), by option name: what to launch
and with which Megatron-LM, where it runs, the scheduler's job, profiling, what is written."""


class LaunchCommand(SectionedHelp, click.Command):
    """A subcommand; an unknown option gets a hint that Megatron-LM's go after '--'. Its --help
    lists the options in ``LAUNCH_SECTIONS``, every subcommand alike (they share the bundles)."""

    help_sections = LAUNCH_SECTIONS
    sectioned_from = 0

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as exc:
            raise click.UsageError(f"no such option: {exc.option_name} (Megatron-LM arguments go after '--')",
                                   ctx) from None


# --- option bundles: each adds its flags and hands the command one object ---------------------


def input_options(func: Callable) -> Callable:
    """--from FILE [--rank N] [--launch-as-priced] -> ``config: LaunchInput`` (one read from a command
    that it priced otherwise refused without --launch-as-priced: ``_launch_as_priced``)."""

    @functools.wraps(func)
    def wrapper(*args, source: Path, rank: int | None, launch_as_priced: bool, **kwargs):
        from launch.inputs import read_input

        refuse_overwriting_inputs(kwargs.get("output"))  # -o --from's file: the sweep replaced by YAML
        _refuse_misnamed(kwargs.get("output"))
        config = read_input(source, rank)
        if config.verdict == "oom":  # an --all row or an estimate: launchable, but it will not fit
            estimate = f"{config.judged_gib:.1f} GiB" if config.judged_gib is not None else "the estimate"
            limit = f" of {config.memory_gib:g} GiB" if config.memory_gib else ""
            held_note(f"warning: {config.source} does not fit: {estimate} per GPU{limit} (oom)")
        _launch_as_priced(config, launch_as_priced)
        return func(*args, config=config, **kwargs)

    return apply_options([
        click.option("--from", "source", type=InputPath(dir_okay=False, allow_dash=True, path_type=Path),
                     required=True, metavar="FILE|-", help="A sweep (advisor sweep --format json), one sweep row, an estimate "
                                            "(advisor estimate --format json) or a plan (advisor recommend -o); "
                                            "'-' reads it from standard input, as piped from advisor sweep."),
        click.option("--rank", type=ROWS, default=None,
                     help="The sweep row ranked N (default 1). Only for sweep arrays."),
        click.option("--launch-as-priced", is_flag=True,
                     help="Launch an estimate read from a command (advisor estimate --from-command) whose "
                          "\"unpriced\" list is not empty, which is refused without it: the launch then trains the "
                          "network and options the advisor priced (its megatron_args: a GELU, LayerNorm network "
                          "priced as SwiGLU, RMSNorm, ...; each unpriced entry says what), not the command as written."),
    ], wrapper)


WRITES = {"sbatch": "script", "k8s": "yaml", "skypilot": "yaml"}
"""What each command's -o holds: a name that says another format (sbatch -o job.json, k8s -o
job.json) is refused, as the advisor's commands refuse JSON into x.csv (``refuse_named``)."""


def _refuse_misnamed(output: Path | None) -> None:
    from advisor.cli.options import refuse_named

    ctx = click.get_current_context(silent=True)
    command = ctx.info_name if ctx is not None else None
    if command in WRITES:
        refuse_named(f"advisor-launch {command}", WRITES[command], output)


def _launch_as_priced(config: LaunchInput, opted_in: bool) -> None:
    """Refuse an estimate read from a command that it priced otherwise (its ``unpriced`` entries,
    advisor.megatron_readback): its megatron_args are the network and options priced (a GELU,
    LayerNorm, learned-position network priced as a Llama one), so launching them trains another
    model than the command asks for, unless the user says so (--launch-as-priced: then a warning)."""
    if not (config.read_from and config.unpriced):  # a sweep row, a plan, a command priced as written
        return
    from advisor.megatron_readback import priced_otherwise

    otherwise = priced_otherwise(config.unpriced, config.not_launched)
    if not otherwise:  # what it leaves out, left_out_note names
        return
    command = config.read_from.partition(": ")[0]  # 'train.sh: torchrun, 8 GPUs (...)'
    if opted_in:
        held_note(f"warning: {config.source} was read from {command}, which it priced otherwise: "
              f"{'; '.join(otherwise)}. The launch runs what was priced (its megatron_args: the network and "
              f"options the advisor priced), not {command} as written")
        return
    # each entry is 'FLAG (what was priced instead)': the flags alone keep the line short
    named = [item.split(" (")[0] for item in otherwise[:2]]
    more = f" and {len(otherwise) - 2} more" if len(otherwise) > 2 else ""
    written = "the command" if command == "stdin" else command
    raise InputError(f"{config.source} was read from {command}, which it priced otherwise: {', '.join(named)}{more} "
                     f"(its \"unpriced\" list), so its launch would train what was priced, not {written} as written. "
                     f"Give --launch-as-priced to launch what was priced, or change {written} so that the advisor "
                     "prices it as written (each entry says what was priced in its place) and estimate it again")


CheckoutNeed = Literal["optional", "here", "here-unless-dry-run", "elsewhere"]
"""Where a command needs the user's Megatron-LM checkout: ``optional`` (args: the rules of
--megatron-version when none is given), ``here`` (check reads it), ``here-unless-dry-run``
(torchrun and sbatch start it on this machine or its cluster), ``elsewhere`` (k8s and skypilot
name one in the image or on the nodes, which need not be here)."""


def megatron_options(checkout: CheckoutNeed = "optional", *, warn_unknown_flags: bool = True
                     ) -> Callable[[Callable], Callable]:
    """--megatron-lm DIR, --megatron-version, --mock-data and the user's arguments after '--' ->
    ``release: Release`` (the checkout and its version's rules) and ``megatron: CommandLine``
    (conflicts checked). A dry run, and ``args``, need no checkout on disk: they assume the rules
    of --megatron-version, else of the newest release, and say so on stderr.
    ``warn_unknown_flags``: warn of flags after '--' that the release's table does not know
    (check refuses those its checkout does not spell either: ``_unknown_flag_problems``)."""
    return functools.partial(_with_megatron_options, checkout=checkout, warn_unknown_flags=warn_unknown_flags)


def _with_megatron_options(func: Callable, checkout: CheckoutNeed, warn_unknown_flags: bool) -> Callable:
    @functools.wraps(func)
    def wrapper(*args, config, megatron_lm: str | None, megatron_version: str | None, mock_data: bool,
                job_config: Path | None, tokens: float | None, fs_bandwidth: float | None,
                user_args: tuple[str, ...], **kwargs):
        from launch.arguments import compose
        from launch.checkout import resolve_release
        from launch.evaluation import check_values as check_evaluation
        from launch.job import check_length, check_rates, plan_job, read_job_file

        # one given to args or a dry run must be here too (resolve_release)
        need_checkout = checkout == "here" or (checkout == "here-unless-dry-run" and not kwargs.get("dry_run"))
        release = resolve_release(megatron_lm, megatron_version, need_checkout=need_checkout,
                                  elsewhere=checkout == "elsewhere")
        job_file = read_job_file(job_config) if job_config is not None else None
        mock_data = mock_data or bool(job_file and job_file.mock_data)
        if (note := release.assumption()) and (mock_data or "dry_run" in kwargs):  # where the release matters
            held_note(f"advisor-launch: {note}")
        job = plan_job(config, job_file=job_file, tokens=tokens, bandwidth_gbs=fs_bandwidth, user_args=user_args,
                       release=release.rules)
        megatron = compose(config.source, config.megatron_args, rules=release.rules, model=config.model,
                           mock_data=mock_data, extras=user_args, job=job.group, chunk_layers=config.chunk_layers(),
                           named_by_input=config.unpriced)
        check_evaluation(megatron.args)  # values Megatron takes and then fails on, refused in one line
        check_length(megatron.args, release.rules)
        check_rates(megatron.args)
        if warn_unknown_flags:
            for unknown in megatron.unknown:
                held_note(unknown.warning())
        for line in megatron.notes:
            held_note(line)
        for line in (_unbalanced_line(config, megatron.args), _release_line(config, release.rules)):
            if line is not None:
                held_note(f"advisor-launch: {config.source}: {line}")
        return func(*args, config=config, release=release, megatron=megatron, job_plan=job, **kwargs)

    return apply_options([
        click.option("--megatron-lm", type=MEGATRON_CHECKOUT, metavar="DIR", default=None,
                     help="Your Megatron-LM checkout, holding pretrain_gpt.py (default: $MEGATRON_LM). Its "
                          "version (megatron/core/package_info.py) decides the flags and the environment."),
        click.option("--megatron-version", metavar="RELEASE", default=None,
                     help="Without a checkout on disk (a dry run): the release whose rules to follow, 0.15 or "
                          "0.19 (default: the newest). With one: must be its version."),
        click.option("--mock-data", is_flag=True,
                     help="Add --mock-data --tokenizer-type NullTokenizer --vocab-size sized so that your release "
                          "builds the input's vocabulary; refused where its mock data cannot feed the model."),
        click.option("--job-config", type=InputPath(dir_okay=False, path_type=Path), default=None, metavar="FILE",
                     help="A job file, TOML if named .toml, else JSON. Its keys data_path, tokenizer_type, "
                          "tokenizer_model, save, load, save_interval, tensorboard_dir, lr, min_lr, eval_iters and "
                          "eval_interval become Megatron-LM's flags of those names (data_path: --data-path); "
                          "mock_data, tokens and fs_bandwidth_gbs do what --mock-data, --tokens and --fs-bandwidth "
                          "do; lr_warmup_fraction is the warm-up's share of the tokens (default 0.01). See "
                          "docs/launch.md, 'Preflight, complete jobs'."),
        click.option("--tokens", type=TokenCount(), default=None,
                     help="The token budget (15T, 300B): --train-samples, --lr-decay-samples and "
                          "--lr-warmup-samples (1%) from it (default: the job file's, else the sweep row's)."),
        click.option("--fs-bandwidth", type=Bounded(limits.FS_BANDWIDTH_GBS, integer=False), default=None,
                     metavar="GB/S",
                     help="Aggregate file-system write bandwidth that prices a checkpoint save "
                          "(default 10 GB/s, or the job file's fs_bandwidth_gbs)."),
        click.argument("user_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- MEGATRON_ARGS...]"),
    ], wrapper)


def _release_line(config: LaunchInput, rules) -> str | None:
    """Where a row priced for one Megatron-LM release launches on another whose price of it
    differs. Its flags run in that release's words (``launch.arguments.compose``) and mean what
    they meant; what the releases price differently for a launchable dense row is Megatron-FSDP's
    buffers where core_v0.19.0's budgets exceed core_v0.15.2's fixed ones (a unit over 5e8
    elements under optim_grads_params, DP x CP over 1,000 under optim_grads:
    ``advisor.memory_levers.fsdp_buffers_alike`` compares the stages' buffers as each release
    prices them). Megatron-FSDP on an MoE model, priced on core_v0.19.0 only, is refused on
    core_v0.15.2 (``launch.arguments.check_moe_refusals``)."""
    from advisor.moe.spec import is_moe

    if config.priced_release is None or config.priced_release == rules.checked or is_moe(config.model):
        return None
    import numpy as np

    from advisor import equations as eq
    from advisor.memory_levers import fsdp_buffers_alike, layer_weights
    from advisor.options import parse_training_args

    options, _ = parse_training_args(config.megatron_args, config.priced_release)
    strategy = options.data_parallel.fsdp_strategy
    if strategy is None or fsdp_buffers_alike(
            options.memory_options(config.priced_release), options.memory_options(rules),
            eq.layer_parameters(config.model, config.tp), np.asarray(config.layers_per_stage, dtype=float),
            config.dp * config.cp, layer_weights(config.model, config.tp)):
        return None
    version = ".".join(map(str, rules.release))
    command = "recommend" if config.kind == "plan" else "estimate"  # a plan is priced again by its own command
    return (f"priced for Megatron-LM {config.priced_release}, launched on {rules.checked}, whose Megatron-FSDP "
            f"sizes its {strategy} buffers otherwise: advisor {command} --megatron-version {version} prices it there")


def _unbalanced_line(config: LaunchInput, args: Sequence[str]) -> str | None:
    """What advisor sweep and estimate say of an MoE row whose routing assumes a balance that its
    model's router is not trained to (``advisor.cli.moe_balancing.unbalanced_line``, the one line of
    the three): the launch trains it with no balancing loss. Megatron's
    --moe-router-force-load-balancing after -- balances the routing itself (router.py: random
    logits), so there it is not said."""
    if config.routing is None:  # a dense model
        return None
    from advisor.cli.moe_balancing import unbalanced_line
    from advisor.row_flags import flag_values

    return unbalanced_line(config.model, config.routing, forced="--moe-router-force-load-balancing" in flag_values(args),
                           command=config.read_from is not None, launched=True)


def run_options(func: Callable) -> Callable:
    """--profile-dir DIR, --run-id ID -> ``profiling: dict`` (launch.entry's profiling options)."""

    @functools.wraps(func)
    def wrapper(*args, profile_dir: Path | None, run_id: str | None, **kwargs):
        from launch.checkout import check_profile_dir

        if run_id is not None and profile_dir is None:
            raise InputError("--run-id names a profiled run; give --profile-dir too")
        if profile_dir is not None:
            check_profile_dir(profile_dir)
        return func(*args, profiling={"profile_dir": profile_dir, "run_id": run_id}, **kwargs)

    return apply_options([
        click.option("--profile-dir", type=InputPath(path_type=Path), default=None,
                     help="Profile the run: install megatron_hooks and write one rank*.jsonl per rank here "
                          "(a new directory; on several nodes, a shared file system). Without it, no hooks."),
        click.option("--run-id", type=NonEmpty("give the profiled run's id, or leave it out for a new one"),
                     default=None, help="The profiled run's id (default: a new one)."),
    ], wrapper)


def _launch_plan(config, release, megatron, profiling: dict, job, *, dry_run: bool, per_node: int,
                 gpus_here: bool = True, show_job: bool | None = None, checks: bool = True,
                 elsewhere_option: str | None = None, hold_notes: bool = False, flag_problems: Sequence[str] = ()):
    """The entry's options and the environment every rank needs, after the preflight
    (launch.preflight) and the job's report (``show_job``, default: in a dry run): a dry run
    prints the problems as warnings; a real run with a problem prints every one, one line each,
    and exits with status 2 before anything starts. ``hold_notes``: the caller prints the notes
    (``flush_notes``) once its -o file is written, so that a write that fails is one line. Where
    the ranks run elsewhere (``gpus_here`` false: sbatch, and the k8s and SkyPilot manifests, whose
    image this machine cannot see), Transformer Engine and DeepEP are not checked here but by each
    rank's entry (``--check-imports``), on the nodes that need them. ``flag_problems``: problems of
    the command line the caller found (check's unknown flags), listed first."""
    from launch.commands import entry_options
    from launch.megatron_versions import LaunchShape, environment
    from launch.placement import node_size_note, span_notes
    from launch.preflight import deep_ep_backend, local_attention_note, uses_transformer_engine

    env = environment(release.rules, LaunchShape.of(config.tp, config.cp, megatron.args))  # refused in one line
    for line in span_notes(per_node, config.source, config.tp, config.ep, config.etp, config.priced_gpus_per_node,
                           timed=config.step_time_s is not None, cp=config.cp):
        held_note(line)
    if (line := node_size_note(per_node, config.source, config.priced_gpus_per_node, config.gpus_per_node)) is not None:
        held_note(line)
    if (note := config.left_out_note(megatron.args)) is not None:
        held_note(note)
    report = _preflight(config, release, megatron, profiling, job, per_node=per_node, gpus_here=gpus_here,
                        checks=checks, elsewhere_option=elsewhere_option)
    for line in job.report(megatron.args) if (dry_run if show_job is None else show_job) else ():
        held_note(f"advisor-launch: {line}")
    for note in report.notes:
        held_note(f"advisor-launch: {note}")
    if (note := local_attention_note(megatron.groups[0][1], megatron.args)) is not None:
        held_note(f"advisor-launch: {note}")
    problems = [*flag_problems, *report.problems, *([report.incomplete] if report.incomplete else [])]
    if problems and not dry_run:  # every problem, one line each (the preflight's own report)
        for problem in problems:
            click.echo(f"Error: {one_line(problem)}", err=True)
        click.get_current_context().exit(2)
    for problem in problems:
        held_note(f"warning: {problem}")
    if not hold_notes:
        flush_notes()  # the command's checks passed: its notes come before its output
    entry = entry_options(release.checkout or release.given, **profiling)
    if not gpus_here and (uses_transformer_engine(megatron.args) or deep_ep_backend(megatron.args)):
        # the ranks' nodes (sbatch's, or a manifest's image, which this machine cannot see) check
        # what this one could not, at once, not at Megatron's first TE or DeepEP import
        entry.append("--check-imports")
    return entry, env


def _preflight(config, release, megatron, profiling: dict, job, *, per_node: int, gpus_here: bool, checks: bool,
               elsewhere_option: str | None = None):
    """launch.preflight's report (without ``checks``, where the job runs in an image or on nodes
    this machine cannot see, an empty one), with the job's missing parts (``incomplete``)."""
    from launch.evaluation import interval_problem
    from launch.job import missing
    from launch.preflight import Report, Setup, preflight

    setup = Setup(rules=release.rules, checkout=release.checkout, args=tuple(megatron.args), cp=config.cp,
                  gpus_per_node=per_node, profile_dir=profiling.get("profile_dir"), gpus_here=gpus_here,
                  elsewhere_option=elsewhere_option)
    report = preflight(setup) if checks else Report()
    report.incomplete = missing(megatron.args)
    # Megatron's own behaviour, wherever the ranks run (launch.evaluation)
    if (problem := interval_problem(release.rules, megatron.args)) is not None:
        report.problems.append(problem)
    return report


def _announce(config, command: str, release) -> None:
    flush_notes()  # a process starts: what was held is said first
    click.echo(f"advisor-launch: {config.describe()}; {release.rules.name} ({release.checkout})\n+ {command}",
               err=True)


# --- commands ------------------------------------------------------------------------------


@click.group(cls=LaunchGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="megatron-4d-advisor", prog_name="advisor-launch")
def cli() -> None:
    """Launch Megatron-LM's pretrain_gpt.py as the advisor planned it.

    \b
    From a sweep row, an estimate or a plan to a real run, with the layer
    memory hooks when --profile-dir is given:
      advisor sweep --gpus 8 --mem 80 --format json -o sweep.json
      advisor-launch torchrun --from sweep.json --megatron-lm ~/Megatron-LM \\
          --mock-data --profile-dir profiles/run-1 -- --train-iters 10 --lr 3e-4
      advisor-launch sbatch --from plan.json --megatron-lm ~/Megatron-LM \\
          -o job.sh --dry-run \\
          -- --data-path ... --tokenizer-type ... --train-iters 1000

    """


@cli.command("torchrun", cls=LaunchCommand, epilog=EPILOG)
@input_options
@run_options
@click.option("--nproc-per-node", type=GPUS_PER_NODE, default=None,
              help="GPUs per node (default: the plan's GPUs per node, else 8, at most the world size).")
@click.option("--nnodes", type=GPUS, default=None,
              help="Nodes (default: the world size / --nproc-per-node).")
@click.option("--rdzv-endpoint", type=NonEmpty("give HOST:PORT, for example node001:29500"), default=None,
              metavar="HOST:PORT",
              help="Several nodes: where they meet (c10d rendezvous; run the same command on every node).")
@click.option("--node-rank", type=Bounded(limits.NODE_RANK), default=None,
              help="Several nodes: this node's rank; switches to torchrun's static rendezvous "
                   "(--master-addr/--master-port = the endpoint), as Megatron-LM's examples.")
@click.option("--rdzv-id", type=NonEmpty("give the job id all nodes share"), default=None, help="Several nodes, c10d: the job id all nodes share.")
@click.option("--dry-run", is_flag=True, help="Print the command instead of running it.")
@megatron_options("here-unless-dry-run")
def torchrun_command(config, release, megatron, job_plan, profiling, nproc_per_node, nnodes, rdzv_endpoint, node_rank,
                     rdzv_id, dry_run) -> int:
    """Run (or print) torchrun with the input's Megatron-LM arguments.

    torchrun starts 'python -m launch.entry' on each GPU, which runs your
    pretrain_gpt.py in-process (with the hooks when --profile-dir is given).
    One node: 'torchrun --standalone'. Several nodes: give --rdzv-endpoint and
    run the command on each node. The GPU count must be the input's world size
    (TP x CP x PP x DP); Ctrl-C stops every rank.

    \b
    Examples:
      advisor-launch torchrun --from sweep.json --rank 2 \\
          --megatron-lm ~/Megatron-LM --mock-data -- --train-iters 20 --lr 1e-4
      advisor-launch torchrun --from plan.json --nnodes 2 \\
          --rdzv-endpoint node001:29500 --megatron-lm ~/Megatron-LM --dry-run \\
          -- --data-path ... --train-iters 1000
    """
    from launch.commands import Rendezvous, format_command, resolve_topology, torchrun_argv
    from launch.process import TORCH_ENVIRONMENT, require_program, run_process_group

    topology = resolve_topology(config, nnodes=nnodes, per_node=nproc_per_node)
    if rdzv_endpoint is None and (node_rank is not None or rdzv_id is not None):
        raise InputError("--node-rank and --rdzv-id need --rdzv-endpoint HOST:PORT")
    if node_rank is not None and rdzv_id is not None:  # Rendezvous.args would drop the id without a word
        raise InputError("--rdzv-id names a c10d rendezvous, and --node-rank switches to torchrun's static one "
                         "(--master-addr/--master-port), which has no id: give one or the other")
    rendezvous = Rendezvous.parse(rdzv_endpoint, node_rank=node_rank, rdzv_id=rdzv_id) if rdzv_endpoint else None
    torchrun_argv(topology, [], [], rendezvous)  # its shape refused (one line) before the preflight's list
    entry, env = _launch_plan(config, release, megatron, profiling, job_plan, dry_run=dry_run,
                              per_node=topology.nproc_per_node)
    argv = torchrun_argv(topology, entry, megatron.args, rendezvous)
    if dry_run:
        from advisor.render import terminal_width

        emit(format_command(argv, env.settings, width=terminal_width()), None)
        return 0
    require_program("torchrun", TORCH_ENVIRONMENT)
    _announce(config, format_command(argv, env.settings).rstrip(), release)
    return run_process_group(argv, environment=env.settings)


_JOB_NAME = re.compile(r"[^\w.-]+")


@cli.command("sbatch", cls=LaunchCommand, epilog=EPILOG)
@input_options
@run_options
@click.option("--nodes", type=GPUS, default=None,
              help="Nodes (#SBATCH --nodes; default: the world size / --gpus-per-node).")
@click.option("--gpus-per-node", type=GPUS_PER_NODE, default=None,
              help="GPUs per node (default: the plan's, else 8, at most the world size).")
@click.option("--partition", default=None, help="#SBATCH --partition.")
@click.option("--account", default=None, help="#SBATCH --account.")
@click.option("--time", default=None, help="#SBATCH --time, e.g. 02:00:00.")
@click.option("--qos", default=None, help="#SBATCH --qos.")
@click.option("--job-name", type=NonEmpty("give a Slurm job name, or leave it out for megatron-MODEL"), default=None,
              help="#SBATCH --job-name (default: megatron-MODEL).")
@click.option("--cpus-per-task", type=Bounded(limits.CPUS_PER_TASK), default=None,
              help="CPUs of each node's task (torchrun and its ranks; default: all the node's CPUs, which "
                   "--exclusive gives the job).")
@click.option("--signal-time", type=Bounded(limits.SIGNAL_TIME_S), default=SIGNAL_TIME_S, show_default=True,
              metavar="SECONDS",
              help="Slurm sends SIGTERM this long before the time limit (#SBATCH --signal=TERM@SECONDS); "
                   "Megatron (--exit-signal-handler) finishes its iteration, saves with --save, and exits; "
                   "torchrun waits as long (TORCH_ELASTIC_SHUTDOWN_TIMEOUT) before killing ranks.")
@click.option("--requeue", is_flag=True,
              help="#SBATCH --requeue: Slurm may requeue the job (node failure, preemption); give "
                   "--save and --load the same directory after '--' so that it resumes.")
@click.option("--rdzv-port", type=TCP_PORT, default=DEFAULT_RDZV_PORT, show_default=True,
              help="The c10d rendezvous port on the first node.")
@output_option("Write the script here (atomically) and submit this file; '-' prints it.")
@click.option("--dry-run", is_flag=True, help="Do not submit: print the script (or only write it, with -o).")
@megatron_options("here-unless-dry-run")
def sbatch_command(config, release, megatron, job_plan, profiling, nodes, gpus_per_node, partition, account, time,
                   qos, job_name, cpus_per_task, signal_time, requeue, rdzv_port, output, dry_run) -> int:
    """Write a Slurm batch script for the input, and submit it with sbatch.

    The script asks for the input's nodes and GPUs (whole nodes, with all
    their memory: --exclusive --mem=0), runs one torchrun per node (srun
    --ntasks-per-node=1, every task killed if one fails) meeting at a c10d
    rendezvous on the first node, each starting 'python -m launch.entry' on its
    GPUs. Output goes to JOB_NAME-JOBID.out and
    .err. Before the time limit Slurm sends SIGTERM, which Megatron
    (--exit-signal-handler) turns into a save and a clean exit. The job inherits your
    environment (Slurm's default), so submit it from the environment that has
    torch and this package. The checkout and --profile-dir must be on a file
    system the nodes share. Transformer Engine is checked on the job's nodes,
    before Megatron starts, not on this one.

    \b
    Examples:
      advisor-launch sbatch --from plan.json --megatron-lm ~/Megatron-LM \\
          --partition gpu --time 01:00:00 --profile-dir profiles/plan-1 \\
          --mock-data -- --train-iters 20
      advisor-launch sbatch --from sweep.json --megatron-lm ~/Megatron-LM \\
          -o job.sh --dry-run \\
          -- --data-path ... --tokenizer-type ... --train-iters 1000
    """
    from launch.commands import SlurmJob, resolve_topology, sbatch_script
    from launch.process import write_or_submit

    topology = resolve_topology(config, nnodes=nodes, per_node=gpus_per_node, names=("--nodes", "--gpus-per-node"))
    model = config.model.name.partition("[")[0]  # a preset's name, without the overrides
    job = SlurmJob(job_name=job_name or _JOB_NAME.sub("-", f"megatron-{model}"), partition=partition,
                   account=account, time=time, qos=qos, cpus_per_task=cpus_per_task, signal_time_s=signal_time,
                   requeue=requeue, rdzv_port=rdzv_port)
    entry, env = _launch_plan(config, release, megatron, profiling, job_plan, dry_run=dry_run,
                              per_node=topology.nproc_per_node, gpus_here=False, hold_notes=True)
    from launch.job import requeue_warning

    for warning in (signal_at_start_warning(time, signal_time),
                    job_plan.signal_lead_warning(signal_time, megatron.args),
                    requeue_warning(megatron.args) if requeue else None):
        if warning is not None:
            held_note(warning)
    script = sbatch_script(job, topology, entry, megatron.groups, description=config.describe(),
                           environment=env.settings, environment_reason=env.reason)
    status = write_or_submit(script, output, dry_run=dry_run, ready=flush_notes,
                             announce=lambda argv: _announce(config, shlex.join(argv), release))
    return 0 if status is None else status


@cli.command("check", cls=LaunchCommand, epilog=EPILOG)
@input_options
@run_options
@click.option("--nproc-per-node", type=GPUS_PER_NODE, default=None,
              help="GPUs per node the launch will use (default: as torchrun's).")
@click.option("--nnodes", type=GPUS, default=None, help="Nodes (default: as torchrun's).")
@click.option("--no-gpus-here", is_flag=True,
              help="The ranks run on other nodes (a login node preparing a Slurm job): skip the GPU and "
                   "Transformer Engine checks (sbatch's job checks TE on its nodes).")
@megatron_options("here", warn_unknown_flags=False)
def check_command(config, release, megatron, job_plan, profiling, nproc_per_node, nnodes, no_gpus_here) -> int:
    """Check, before any rank starts, everything that would stop the launch later.

    The Python the checkout's release needs, the modules it imports, GPUs on
    this node against the GPUs per node, Transformer Engine where the launch
    uses it (and TE-only options with --transformer-impl local), the data and
    tokenizer files, the directories the run writes, a complete job (data,
    tokenizer, length, learning rate), and each flag after '--' that neither
    the release's parser nor a Python file of the checkout has (torchrun and
    sbatch warn of it). Every problem is one line, all at once, exit status 2;
    torchrun and sbatch run the same checks before they start.

    \b
    Examples:
      advisor-launch check --from sweep.json --megatron-lm ~/Megatron-LM \\
          --job-config job.toml
      advisor-launch check --from plan.json --megatron-lm ~/Megatron-LM \\
          --no-gpus-here -- --data-path ...
    """
    from launch.commands import resolve_topology

    topology = resolve_topology(config, nnodes=nnodes, per_node=nproc_per_node)
    _launch_plan(config, release, megatron, profiling, job_plan, dry_run=False, per_node=topology.nproc_per_node,
                 gpus_here=not no_gpus_here, show_job=True, elsewhere_option="--no-gpus-here",
                 flag_problems=_unknown_flag_problems(release.checkout, megatron.unknown))
    emit(f"advisor-launch check: ok: {config.describe()}; {release.rules.name} ({release.checkout})\n", None)
    return 0


def _unknown_flag_problems(checkout: Path, unknown: Sequence[UnknownFlag]) -> list[str]:
    """check's problem for each flag after '--' that neither the release's parser nor any Python file
    of the checkout has (``launch.checkout.spelled_in``): every rank refuses it at start-up. One that a
    file spells, which the checkout's pretrain_gpt.py may add, stays a warning."""
    from launch.checkout import spelled_in

    spelled = spelled_in(checkout, [flag.name for flag in unknown]) if unknown else {}
    problems = []
    for flag in unknown:
        if flag.name in spelled:
            held_note(flag.warning(spelled[flag.name]))
        else:
            problems.append(f"{flag.problem}, and no Python file of the checkout spells {flag.name}, so it adds "
                            "no such flag")
    return problems


def manifest_options(document: str, start: str) -> Callable[[Callable], Callable]:
    """What the k8s and skypilot writers share: nodes, GPUs per node, name, -o, --dry-run; the help
    names what the command writes (``document``) and what starts it (``start``): neither command
    submits anything, dry run or not."""
    return functools.partial(_with_manifest_options, document=document, start=start)


def _with_manifest_options(func: Callable, document: str, start: str) -> Callable:
    return apply_options([
        click.option("--nodes", type=GPUS, default=None, help="Nodes (default: the world size / --gpus-per-node)."),
        click.option("--gpus-per-node", type=GPUS_PER_NODE, default=None,
                     help="GPUs per node (default: the plan's, else 8, at most the world size)."),
        click.option("--name", default=None, help="The job's name, a DNS label (default: megatron-MODEL)."),
        output_option(f"Write {document} here (atomically) instead of printing it; '-' is stdout."),
        click.option("--dry-run", is_flag=True,
                     help=f"Print {document} on stdout even with -o, which still writes it (without -o it is "
                          f"printed anyway). Nothing is submitted, dry run or not: {start} does that."),
    ], func)


def _write_manifest(config, release, megatron, job_plan, profiling, *, nodes, gpus_per_node, name, output,
                    dry_run, build, comment) -> int:
    """The job for the input (its preflight problems as warnings: the ranks run elsewhere), built
    into a document by ``build(job)`` under the comment lines ``comment(job)`` (what the image or
    the nodes must hold), printed or written atomically."""
    from advisor.fileio import atomic_write_text
    from launch.commands import resolve_topology
    from launch.arguments import flag_values
    from launch.manifests import Job, check_name, job_name, to_yaml

    name = check_name(name if name is not None else job_name(config.model.name))  # --name '' is refused
    if release.given is not None and not release.given.strip():  # '' is unset, as for $MEGATRON_LM
        raise InputError(f"--megatron-lm {release.given!r} (or $MEGATRON_LM) is blank: give the checkout's path "
                         "in the image or on the nodes")
    topology = resolve_topology(config, nnodes=nodes, per_node=gpus_per_node, names=("--nodes", "--gpus-per-node"))
    entry, env = _launch_plan(config, release, megatron, profiling, job_plan, dry_run=True,
                              per_node=topology.nproc_per_node, gpus_here=False, checks=False, hold_notes=True)
    job = Job(name=name, topology=topology, entry=tuple(entry),
              megatron=tuple(megatron.args), environment=env.settings)
    ub_cfg = flag_values(megatron.args).get("--tp-comm-overlap-cfg")
    if ub_cfg:  # Megatron opens it on the nodes
        held_note(f"warning: --tp-comm-overlap-cfg {ub_cfg[-1]} is read by every rank where it runs (relative to its "
              "working directory): put the file there (in the image or on a mount); this job does not carry it")
    text = to_yaml(build(job), comment(job))
    output = None if output == STDOUT else output
    if output is not None:
        atomic_write_text(output, text)  # before the notes: a file that cannot be written is one line
    flush_notes()
    if output is not None:
        wrote(output)
    if output is None or dry_run:
        emit(text, None)
    return 0


@cli.command("k8s", cls=LaunchCommand, epilog=EPILOG)
@input_options
@run_options
@manifest_options("the PyTorchJob manifest", "kubectl apply -f FILE")
@click.option("--image", required=True, metavar="IMAGE",
              help="The container image: torch, your Megatron-LM checkout (at --megatron-lm) and this package "
                   "with its [megatron] extra, which the job does not install (a reference without blanks).")
@click.option("--namespace", default=None, help="metadata.namespace, a DNS label (default: kubectl's).")
@megatron_options("elsewhere")
def k8s_command(config, release, megatron, job_plan, profiling, nodes, gpus_per_node, name, output, dry_run, image,
                namespace) -> int:
    """Write a Kubeflow PyTorchJob manifest (kubeflow.org/v1) for the input.

    One Master pod and nodes - 1 Worker pods, each with its GPUs
    (nvidia.com/gpu), the environment Megatron needs, and one torchrun that
    meets the others at the Master (the operator's MASTER_ADDR, MASTER_PORT
    and RANK). --megatron-lm and --profile-dir are paths inside the image
    (a profile directory on a shared volume). Apply it with kubectl apply -f.

    \b
    Examples:
      advisor-launch k8s --from plan.json --image ghcr.io/me/megatron:latest \\
          --megatron-lm /workspace/Megatron-LM -o job.yaml \\
          -- --data-path ... --lr 3e-4
    """
    from launch.manifests import node_needs, pytorchjob

    if release.checkout is None and release.given is None:  # "$MEGATRON_LM" in a pod's args is not expanded
        raise InputError("advisor-launch k8s needs --megatron-lm DIR (or $MEGATRON_LM): the checkout's path inside "
                         "--image (a pod's arguments are not read by a shell)")
    return _write_manifest(config, release, megatron, job_plan, profiling, nodes=nodes, gpus_per_node=gpus_per_node,
                           name=name, output=output, dry_run=dry_run,
                           build=lambda job: pytorchjob(job, image, namespace),
                           comment=lambda job: node_needs(job, f"The image {image}"))


@cli.command("skypilot", cls=LaunchCommand, epilog=EPILOG)
@input_options
@run_options
@manifest_options("the task YAML", "sky launch FILE")
@click.option("--accelerator", default=None,
              help="SkyPilot's accelerator name alone, e.g. A100-80GB: the task asks for NAME:GPUS_PER_NODE "
                   "(resources.accelerators), so a NAME:COUNT is refused; --gpus-per-node sets the count. Default: "
                   "the GPU the input was priced on (H100 where it names none); another is a warning.")
@megatron_options("elsewhere")
def skypilot_command(config, release, megatron, job_plan, profiling, nodes, gpus_per_node, name, output, dry_run,
                     accelerator) -> int:
    """Write a SkyPilot task YAML for the input (sky launch job.yaml).

    num_nodes nodes with ACCELERATOR:GPUS each, the environment Megatron needs,
    and a run script with one torchrun per node meeting at the first node
    (SKYPILOT_NODE_RANK, SKYPILOT_NODE_IPS). --megatron-lm is the checkout's
    path on the nodes (e.g. synced with file_mounts or in the image). The task
    installs nothing: the nodes must hold torch and this package with its
    [megatron] extra too (the comment it starts with says how to add them).

    \b
    Examples:
      advisor-launch skypilot --from sweep.json --megatron-lm ~/Megatron-LM \\
          --accelerator H100 --mock-data -o task.yaml \\
          -- --train-iters 100 --lr 3e-4
    """
    from launch.manifests import SKYPILOT_SETUP, accelerator_for, node_needs, skypilot_task

    if release.checkout is None and release.given is None:  # the run script would read an unset $MEGATRON_LM
        raise InputError("advisor-launch skypilot needs --megatron-lm DIR (or $MEGATRON_LM): the checkout's path on "
                         "the nodes (the task's envs set no MEGATRON_LM there)")
    accelerator, warning = accelerator_for(config.gpu, accelerator)
    if warning is not None:
        held_note(warning)
    return _write_manifest(config, release, megatron, job_plan, profiling, nodes=nodes, gpus_per_node=gpus_per_node,
                           name=name, output=output, dry_run=dry_run, build=lambda job: skypilot_task(job, accelerator),
                           comment=lambda job: [*node_needs(job, "The nodes (their image)"), *SKYPILOT_SETUP])


@cli.command("args", cls=LaunchCommand, epilog=EPILOG)
@input_options
@click.option("--format", "fmt", type=click.Choice(["shell", "json"]), default="shell", show_default=True,
              help="shell: one shell-quoted line; json: an array of strings.")
@megatron_options()
def args_command(config, release, megatron, job_plan, fmt) -> int:
    """Print only the Megatron-LM arguments, for a launch script of your own.

    \b
    Examples:
      advisor-launch args --from sweep.json --rank 3
      advisor-launch args --from plan.json --format json -- --train-iters 100
    """
    from launch.megatron_versions import LaunchShape, environment_demands
    from launch.preflight import local_attention_note, local_implementation_problems

    if (note := config.left_out_note(megatron.args)) is not None:
        held_note(note)
    # the flags alone do not launch: a script of the user's own must set what Megatron asserts
    if (note := environment_demands(release.rules, LaunchShape.of(config.tp, config.cp, megatron.args))) is not None:
        held_note(f"advisor-launch: {note}")
    # what the launchers' preflight says of the same arguments (args launches nothing: warnings)
    if (note := local_attention_note(megatron.groups[0][1], megatron.args)) is not None:
        held_note(f"advisor-launch: {note}")
    for problem in local_implementation_problems(megatron.args, config.cp):
        held_note(f"warning: {problem}")
    flush_notes()
    if fmt == "json":
        from advisor.render import to_json

        emit(to_json(megatron.args), None)
    else:
        emit(shlex.join(megatron.args) + "\n", None)
    return 0


for _command in (torchrun_command, sbatch_command, check_command, k8s_command, skypilot_command, args_command):
    _command.help = f"{inspect.cleandoc(_command.help)}\n\n{USER_ARGS_HELP}"


def main() -> None:
    cli(prog_name="advisor-launch")


if __name__ == "__main__":
    sys.exit(main())
