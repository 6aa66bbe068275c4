"""``advisor report``: one self-contained HTML page for a sweep, an estimate or a plan.

``advisor report sweep|estimate|recommend ...`` take exactly what those commands take (their
options are theirs: the same objects, so a new option there appears here) and run them for
their JSON; ``advisor report --from FILE`` reads the JSON they saved. Either way the page comes
from the same document, by ``advisor.report``.
"""

from __future__ import annotations

import contextlib
import io
import shlex
from pathlib import Path

import click

from advisor import limits
from advisor.cli.options import (EPILOG, STDOUT, Bounded, CloseCommands, InputError, InputPath, output_option,
                                 refuse_named, refuse_overwriting_inputs, wrote)

DROPPED = {"fmt", "output", "plot", "top", "png"}
"""The wrapped command's own output options: the report writes the page instead."""


def _check_output(output: Path | None) -> Path:
    """-o given, not a file the command reads, and not named for another format (-o x.json)."""
    if output is None:
        raise InputError("give -o FILE.html (or -o - for stdout)")
    refuse_overwriting_inputs(output)
    refuse_named("advisor report", "html", output)
    return output


def _report_options(func):
    func = click.option("--top", "detail", type=Bounded(limits.DETAILED_LAYOUTS), default=3, show_default=True,
                        help="Draw this many best-ranked layouts in detail (memory per stage, time parts).")(func)
    return output_option("Write the page here (atomically, with your umask); '-' is stdout.")(func)


def _write(page: str, output: Path) -> None:
    from advisor.fileio import atomic_write_bytes

    if output == STDOUT:
        click.echo(page, nl=False)
        return
    data = page.encode("utf-8", "surrogateescape")  # as atomic_write_text: a path that is not UTF-8 as its bytes
    atomic_write_bytes(output, data)
    wrote(output, f" ({len(data) / 1e6:.2f} MB)")


def _profiles(values) -> tuple[Path, ...]:
    """The profile directories given, checked before any work: runs of one model and setup
    (``advisor.report.profile.load_profiles``), else one line naming the values that differ."""
    if values is None:
        return ()
    paths = tuple(values) if isinstance(values, (tuple, list)) else (values,)
    if paths:
        from advisor.report.profile import load_profiles

        load_profiles(paths)
    return paths


def command_line(ctx: click.Context) -> str:
    """The command as asked: the options given on the command line, with their values."""
    from click.core import ParameterSource

    words = ["advisor", *ctx.command_path.split()[1:]]  # the root is "cli" when called in-process
    for context in (ctx.parent, ctx) if ctx.parent and ctx.parent.command.name == "report" else (ctx,):
        for param in context.command.params:
            if context.get_parameter_source(param.name) != ParameterSource.COMMANDLINE:
                continue
            value = context.params.get(param.name)
            if isinstance(param, click.Option) and param.is_flag:
                words.append(param.opts[0] if value else (param.secondary_opts or param.opts)[0])
            elif isinstance(param, click.Option):
                for item in value if param.multiple else (value,):
                    words += [param.opts[0], str(item)]
    return shlex.join(words)


def _page(kind: str, rows: list, document, profiles, detail: int, output: Path) -> None:
    from advisor.report import ReportInput, build_page

    question = command_line(click.get_current_context())
    report = ReportInput(kind=kind, rows=rows, document=document, question=question, profiles=profiles)
    _write(build_page(report, detail), output)


_EXAMPLES = {"sweep": "advisor report sweep --gpus 64 --gpu h100-80gb -o report.html",
             "estimate": "advisor report estimate --tp 2 --pp 2 --mbs 1 --gpus 16 --gpu h100-80gb \\\n"
                         "      -o one.html",
             "recommend": "advisor report recommend --gpus 64 --tp 2 --pp 4 --objective time \\\n"
                          "      --gpu h100-80gb -o plan.html"}
"""One example per page, continued (\\) within 78 columns."""


def _wrapped(name: str, command: click.Command, json_output) -> click.Command:
    """``advisor report NAME``: ``command``'s options, its JSON (``json_output`` of its keyword
    arguments) made into a page."""

    def callback(output, detail, **kwargs):
        _check_output(output)
        from advisor.fileio import parse_json
        from advisor.report.inputs import classify

        profiles = _profiles(kwargs.get("profile_dir") or kwargs.get("profiles"))  # a mixed set: refused first
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):  # the command prints its JSON; the page is made of it
            command.callback(**json_output(kwargs))
        kind, rows, document = classify(parse_json(buffer.getvalue(), f"advisor {name}"), f"advisor {name}")
        _page(kind, rows, document, profiles, detail, output)

    params = [param for param in command.params if param.name not in DROPPED]
    report = click.Command(name, params=params, callback=callback, epilog=EPILOG,
                           help=f"The page of 'advisor {name}' (same options; see 'advisor {name} --help')."
                                f"\n\n\b\nExample:\n  {_EXAMPLES[name]}")
    return _report_options(report)


def _sweep_json(kwargs: dict) -> dict:
    return {**kwargs, "fmt": "json", "output": None, "plot": None, "top": None}


def _estimate_json(kwargs: dict) -> dict:
    return {**kwargs, "fmt": "json", "output": None}


def _recommend_json(kwargs: dict) -> dict:
    return {**kwargs, "fmt": "json", "output": STDOUT, "png": None}


@click.group("report", cls=CloseCommands, invoke_without_command=True, no_args_is_help=True, epilog=EPILOG)
@click.option("--from", "source", type=InputPath(dir_okay=False, allow_dash=True, path_type=Path), default=None,
              metavar="FILE|-",
              help="A saved sweep (advisor sweep --format json), sweep row, estimate (advisor estimate --format "
                   "json) or plan (advisor recommend -o); '-' reads it from standard input, as piped from "
                   "advisor sweep --format json.")
@click.option("--profile", "profiles", multiple=True, type=InputPath(path_type=Path), metavar="DIR",
              help="Profiles (a run, or a campaign's directory of runs) to set against the prediction; repeatable.")
@_report_options
@click.pass_context
def report(ctx: click.Context, source: Path | None, profiles: tuple[Path, ...], detail: int, output: Path | None) -> None:
    """One self-contained HTML page (no network at view time) for a sweep, an estimate or a plan:
    the question and its assumptions, the memory heatmap and the time-memory scatter of the
    space, the ranked rows (sortable, filterable, each with its Megatron flags), memory per
    pipeline stage and the step's parts for the best, the pipeline schedule, and profiles
    against the prediction.

    \b
    Examples:
      advisor report sweep --gpus 64 --gpu h100-80gb -o r.html
      advisor report sweep --model llama3.1-405b --gpus 16384 --gpu h100-80gb \\
          --gbs 2048 --all -o r.html
      advisor report estimate --tp 2 --pp 2 --mbs 1 --gpus 16 --gpu h100-80gb \\
          -o one.html
      advisor report recommend --model llama3.1-8b --gpus 64 --tp 2 --pp 4 \\
          --objective time --gpu h100-80gb -o plan.html
      advisor sweep --gpus 64 --gpu h100-80gb --all --format json -o sweep.json
      advisor report --from sweep.json --profile examples/launch/profiles \\
          -o r.html
    """
    if ctx.invoked_subcommand is not None:
        if source is not None or profiles or output is not None:
            raise InputError("--from, --profile and -o before a subcommand: give -o after it "
                             "(advisor report sweep ... -o r.html)")
        return
    if source is None:
        raise InputError("give --from FILE, or a subcommand: advisor report sweep|estimate|recommend ...")
    _check_output(output)
    from advisor.report import read_input

    document = read_input(source, _profiles(profiles))
    _page(document.kind, document.rows, document.document, profiles, detail, output)


def _register() -> None:
    from advisor.cli import estimate, recommend

    report.add_command(_wrapped("sweep", estimate.sweep, _sweep_json))
    report.add_command(_wrapped("estimate", estimate.estimate, _estimate_json))
    report.add_command(_wrapped("recommend", recommend.recommend, _recommend_json))


_register()
