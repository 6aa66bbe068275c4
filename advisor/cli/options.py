"""What every ``advisor`` command shares: one-line errors, option bundles, output.

Each bundle adds its flags to a command and hands it one object (sqlite-utils style):
``model_options`` -> ``spec``, ``workload_options`` -> ``workload``, ``memory_options``
(``advisor.cli.training_flags``) -> ``options``; ``output_options`` adds ``--format`` and
``--output`` for rows, ``document_options`` the same for commands whose result is one JSON
document (a campaign, a plan).
"""

from __future__ import annotations

import functools
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import click

from advisor import limits
from advisor.cli.spellings import lookalike_message
from advisor.errors import AdvisorError

if TYPE_CHECKING:  # the tables and the file reader load with the commands that use them, not for --help
    from advisor.render import Drawing

EPILOG = "Docs, the method and the file schemas: README.md and docs/. Errors exit with status 2, Ctrl-C with 130."


class InputError(click.ClickException):
    """Bad input: one line on stderr, exit status 2."""

    exit_code = 2


def one_line(message: str) -> str:
    """``message`` with the characters that end or redraw a terminal's line escaped as Python
    writes them ('\\n'): a path or a value after -- holding a newline (-o $'a\\nb/x.json') split
    the one error line in two, and a carriage return or an escape sequence could hide what it said."""
    import unicodedata  # only an error needs it: kept off the start-up

    return "".join(repr(char)[1:-1] if unicodedata.category(char) in ("Cc", "Zl", "Zp") else char
                   for char in message)


_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())
"""click 8.2 and later raise it for a group given nothing (as a usage error, status 2); 8.1 printed
the help and exited 0 itself."""


class CloseCommands(click.Group):
    """A group whose unknown command names the commands it may mean ('advisor sweeep' ->
    'did you mean sweep?'), as click's own hint does for a misspelt option."""

    def resolve_command(self, ctx: click.Context, args: list[str]):
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            from advisor.errors import close_names

            if close := close_names(name, self.list_commands(ctx)):  # else click's own 'No such command'
                raise click.UsageError(f"No such command {name!r}; did you mean {', '.join(close)}?", ctx)
        return super().resolve_command(ctx, args)


class OneLineErrors:
    """Mix into a click Group or Command: the core's AdvisorError (and unwritable outputs)
    become InputError, and every input error, click's usage errors included, prints as one
    line with exit status 2."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        if sys.stdout is None:  # started with stdout closed ('>&-'): nothing could be printed
            click.echo("Error: standard output is closed; redirect it to a file or /dev/null", err=True)
            sys.exit(2)
        try:
            status = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _NO_ARGS_IS_HELP as exc:  # a bare group ('advisor'): its help, as --help, not an error
            click.echo(exc.ctx.get_help(), color=exc.ctx.color)
            sys.exit(0)
        except click.UsageError as exc:
            where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
            message = exc.format_message()
            if isinstance(exc, click.NoSuchOption):
                message = self.no_such_option(exc, message)
            click.echo(f"Error: {one_line(message)}{where}", err=True)
            sys.exit(2)
        except click.ClickException as exc:
            click.echo(f"Error: {one_line(exc.format_message())}", err=True)  # ClickException.show's line
            sys.exit(exc.exit_code)
        except click.Abort as exc:
            import signal

            click.echo("Aborted!", err=True)
            # Ctrl-C: 128 + SIGINT, as a shell reports a command the signal stopped, and as profile
            # run and advisor-launch report a run stopped by one (click's status is 1)
            sys.exit(128 + signal.SIGINT if isinstance(exc.__cause__, KeyboardInterrupt) else 1)
        sys.exit(status if isinstance(status, int) else 0)

    def no_such_option(self, exc: click.NoSuchOption, message: str) -> str:
        """The line for an option the command does not have: click's ``message``, or why a
        Megatron-LM flag that looks like one of ours is not it (``lookalike_message``)."""
        return lookalike_message(exc, message)

    def invoke(self, ctx: click.Context):
        try:
            status = super().invoke(ctx)
            flush_notes()  # the command succeeded: what its checks held is said
            return status
        except AdvisorError as exc:
            raise InputError(str(exc)) from None
        except BrokenPipeError:  # stdout's reader left (| head): click exits 1 without a word
            raise
        except OSError as exc:
            raise InputError(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": ")) from None


class OneLineCommand(OneLineErrors, click.Command):
    """A stand-alone command (``python -m ...``) whose bad input is one line, exit status 2."""


class OneLineGroup(OneLineErrors, CloseCommands):
    """A stand-alone group (``python -m tables.capture``) with only its own commands, whose bad
    input is one line, exit status 2 (the ``advisor`` group's AdvisorGroup adds the advisor's
    commands to every group of its class)."""


class Bounded(click.ParamType):
    """A number within a bound of ``advisor.limits``; a float is also finite (inf and nan are
    refused: --mem inf made everything "fit" and wrote Infinity into the JSON). --help shows it
    as ``metavar`` (default N for a count, X for a number), as the advisor's docs write them
    ('--gpus N --mem GIB'), not as click's INTEGER or FLOAT."""

    def __init__(self, bound: limits.Bound, *, integer: bool = True, low_open: bool = False,
                 metavar: str | None = None) -> None:
        self.bound, self.integer, self.low_open = bound, integer, low_open
        self.name = "integer" if integer else "float"
        self.metavar = metavar or ("N" if integer else "X")

    def get_metavar(self, param, ctx=None) -> str:
        return self.metavar

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = value
        else:
            try:
                number = int(value, 10) if self.integer else float(value)
            except (TypeError, ValueError):
                self.fail(f"{value!r} is not {'an integer' if self.integer else 'a number'}", param, ctx)
        try:
            if self.integer:
                return limits.check_int(number, "", self.bound)
            return limits.check_float(number, "", self.bound, low_open=self.low_open)
        except AdvisorError as exc:
            self.fail(str(exc), param, ctx)


GIB = Bounded(limits.GPU_MEMORY_GIB, integer=False, low_open=True, metavar="GIB")
"""Memory of one GPU in GiB (--mem, --memory-limit)."""
FRACTION = Bounded(limits.MEMORY_FRACTION, integer=False, low_open=True, metavar="FRACTION")
GPUS = Bounded(limits.GPUS)
GPUS_PER_NODE = Bounded(limits.GPUS_PER_NODE)
DEGREE = Bounded(limits.DEGREE)
SEQ_LEN = Bounded(limits.SEQ_LEN)
GLOBAL_BATCH = Bounded(limits.GLOBAL_BATCH)
MICRO_BATCH = Bounded(limits.MICRO_BATCH)
LAYERS = Bounded(limits.MODEL["num_layers"])
VOCABULARY = Bounded(limits.MODEL["vocab_size"])
ROWS = Bounded(limits.ROWS)
"""A count or rank of a sweep's rows (--top, advisor-launch --rank)."""
TCP_PORT = Bounded(limits.TCP_PORT, metavar="PORT")
TRAIN_ITERS = Bounded(limits.PROFILING_ITERATIONS)
"""Iterations of a profiling run (--train-iters)."""


def apply_options(options: list[Callable], func: Callable) -> Callable:
    """Decorate ``func`` with click options and arguments, listed in the order --help shows them."""
    for option in reversed(options):
        func = option(func)
    return func


# --- option bundles: each adds its flags and hands the command one object -----------------

_OVERRIDES = {
    "num_layers": "transformer layers L",
    "hidden_size": "hidden size h, each layer's input and output width",
    "ffn_hidden_size": "the MLP's intermediate size h_ffn, per SwiGLU gate (an MoE model: its dense layers')",
    "num_attention_heads": "query heads a, each h / a wide unless the model sets its head_dim",
    "num_query_groups": "key-value heads k, a divisor of a (Megatron reads it with --group-query-attention)",
    "vocab_size": "vocabulary size v before padding (see --vocab-divisible-by)",
}
"""The overrides of a preset's sizes, each named as Megatron-LM's flag of the same name (what
``with_overrides`` replaces), and what each sets, as --help says it."""
_MODEL_FIELDS = (*_OVERRIDES, "tie_embeddings")


def _override_name(field: str) -> str:
    """A spec field as a preset's error names it; the head size (Megatron's --kv-channels, which no
    command has) as what gives it here: a config.json's head_dim."""
    return "head_dim in a config.json (--model FILE)" if field == "kv_channels" else field


def model_options(func: Callable) -> Callable:
    """--model NAME|config.json plus Megatron-style overrides -> ``spec: LlamaSpec``."""
    from advisor.models import DEFAULT_MODEL

    @functools.wraps(func)
    def wrapper(*args, model: str, **kwargs):
        from advisor.fileio import expand_home
        from advisor.model_spec import FieldError
        from advisor.models import load_model, with_overrides

        overrides = {name: kwargs.pop(name) for name in _MODEL_FIELDS}
        try:
            spec = with_overrides(load_model(expand_home(model)), **overrides)  # a config.json's path
        except FieldError as error:  # an override's
            raise InputError(f"model {error.model!r}: {error.worded(_override_name)}") from None
        return func(*args, spec=spec, **kwargs)

    return apply_options(
        [
            click.option(
                "--model", default=DEFAULT_MODEL, show_default=True, metavar="NAME|config.json|DIR",
                help="A preset (see 'advisor models'), a Hugging Face config.json (model_type llama, mistral, "
                     "qwen2, qwen3, mixtral, qwen3_moe, deepseek_v3 or kimi_k2), or the directory holding one (a Hugging Face "
                     "snapshot's).",
            ),
            *(click.option(f"--{field.replace('_', '-')}", type=Bounded(limits.MODEL[field]),
                           help=f"Megatron's --{field.replace('_', '-')}: {what}. Default: the --model's.")
              for field, what in _OVERRIDES.items()),
            click.option(
                "--tie-embeddings/--untie-embeddings", default=None,
                help="Whether the output layer shares the input embedding's weights; --untie-embeddings is "
                     "Megatron's --untie-embeddings-and-output-weights (Megatron ties them without it). "
                     "Default: the --model's.",
            ),
        ],
        wrapper,
    )


SEQ_LEN_HELP = "Tokens per training sequence, s (Megatron's --seq-length); a step trains GBS x s tokens."


def workload_options(func: Callable) -> Callable:
    """--seq-len, --gbs -> ``workload: Workload``."""

    @functools.wraps(func)
    def wrapper(*args, seq_len: int, gbs: int, **kwargs):
        from advisor.parallel import Workload

        return func(*args, workload=Workload(seq_len=seq_len, global_batch_size=gbs), **kwargs)

    return apply_options(
        [
            click.option("--seq-len", type=SEQ_LEN, default=8192, show_default=True, help=SEQ_LEN_HELP),
            click.option("--gbs", type=GLOBAL_BATCH, default=1024, show_default=True,
                         help="Global batch size (sequences per iteration)."),
        ],
        wrapper,
    )


STDOUT = Path("-")
"""``-o -`` (or ``-o /dev/stdout``): standard output, asked for explicitly."""


def empty_value(param: click.Parameter | None, hint: str) -> InputError:
    """The one refusal of an empty value (``--name ''``): '--name is empty; ' and what to give
    instead. An empty string is a value given, never the option left out: taken for absent, it
    ran something else without a word (--layers-per-stage '' an even split, --megatron-lm '' the
    CPU emulator)."""
    if isinstance(param, click.Option):
        name = next((opt for opt in param.opts if opt.startswith("--")), param.opts[0])
    else:
        name = param.human_readable_name if param is not None else "the value"
    return InputError(f"{name} is empty; {hint}")


class NonEmpty(click.ParamType):
    """Text that is not empty (``empty_value`` refuses ''): ``hint`` says what to give, e.g.
    'give one layer count per stage, for example 7,9,9,7'."""

    name = "text"

    def __init__(self, hint: str) -> None:
        self.hint = hint

    def convert(self, value, param, ctx):
        if value == "":
            raise empty_value(param, self.hint)
        return value


MEGATRON_CHECKOUT = NonEmpty("give the directory of your Megatron-LM checkout")
"""--megatron-lm DIR ('' was taken for no checkout: the CPU emulator, or $MEGATRON_LM)."""


class UserPath(click.Path):
    """click.Path with a leading ``~`` expanded (``expand_home``): the type of every option and
    argument that names a file or directory, to read (``InputPath``) or to write (-o, --plot,
    --png, --out), so that each gets it."""

    def convert(self, value, param, ctx):
        from advisor.fileio import expand_home

        if isinstance(value, str):
            value = expand_home(value)
        return super().convert(value, param, ctx)


class InputPath(UserPath):
    """A path to read: an empty value is refused (Path("") is ".", so --from '' was read as the
    current directory, and --profile '' profiled whatever was there)."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and value == "":
            kind = "a file" if not self.dir_okay else "a directory" if not self.file_okay else "a file or directory"
            raise empty_value(param, f"give {kind}" + (", or - for standard input" if self.allow_dash else ""))
        return super().convert(value, param, ctx)


class OutDirectory(UserPath):
    """A directory to write into (--out): an empty value is refused (Path("") is ".", so --out ''
    wrote the tables, or a profile's rank files, into the current directory)."""

    def __init__(self, hint: str = "give a directory", **kwargs) -> None:
        super().__init__(file_okay=False, **kwargs)
        self.hint = hint

    def convert(self, value, param, ctx):
        if isinstance(value, str) and value == "":
            raise empty_value(param, self.hint)
        from advisor.fileio import expand_home, not_a_directory

        # click's file_okay=False refuses a regular file only: a FIFO got as far as mkdir's 'File exists'
        if isinstance(value, str) and (problem := not_a_directory(expand_home(value))):
            self.fail(problem, param, ctx)
        return super().convert(value, param, ctx)


def file_path(ctx, param, value: str | None) -> Path | None:
    """A file to write (--plot, --png), checked before any work: a regular file or a new one in a
    writable directory. Its type is UserPath() (text, '~' expanded): Path() would drop a trailing
    '/', which names a directory ('-o out/' wrote the file 'out')."""
    if value is None:
        return None
    if value == "":
        raise empty_value(param, "give a file" + (", or - for standard output" if param.name == "output" else ""))
    from advisor.fileio import NotAFileToReplace, output_target

    try:
        output_target(value)
    except NotAFileToReplace as exc:  # -o alone takes '-', not --plot or another command's --out
        raise click.BadParameter(str(exc) + (" (for standard output, leave out -o or give -o -)"
                                             if param.name == "output" else "")) from None
    except AdvisorError as exc:
        raise click.BadParameter(str(exc)) from None
    return Path(value)


def png_path(ctx, param, value: str | None) -> Path | None:
    """A picture to write (--plot, --png): ``file_path``'s checks, and a name ending in .png
    (matplotlib writes the PNG under any name, so 'plot.txt' got one)."""
    if value == "":
        raise empty_value(param, "give a file ending in .png")
    path = file_path(ctx, param, value)
    if path is not None and path.suffix.lower() != ".png":
        raise click.BadParameter(f"draws a PNG: name a file ending in .png, not {value!r}")
    return path


def distinct_files(**named: Path | None) -> None:
    """Refuse two options that name one file (``--output=path, plot=path``): the second write
    would replace the first, and 'wrote' would be said of both."""
    seen: dict[str, str] = {}
    for option, path in named.items():
        if path is None or path == STDOUT:
            continue
        where = os.path.realpath(path)
        if where in seen:
            raise InputError(f"{seen[where]} and {option} name the same file {path}: give each its own")
        seen[where] = option


def input_files(ctx: click.Context) -> dict[str, str]:
    """The files that ``ctx``'s command reads, by option: each single InputPath given (--from,
    --from-command, a log) and --model when it names a config.json or a directory holding one (the
    file in it is what is read; else --model is a preset)."""
    from advisor.fileio import expand_home
    from advisor.models import config_file

    named: dict[str, str] = {}
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if not isinstance(value, (str, Path)):
            continue
        path = expand_home(os.fspath(value))  # --model=~/c.json: read expanded
        if param.name == "model":
            path = config_file(path)
        if isinstance(param.type, InputPath) or (param.name == "model" and os.path.isfile(path)):
            name = max(param.opts, key=len) if isinstance(param, click.Option) else param.human_readable_name
            named[name] = path
    return named


def refuse_overwriting_inputs(output: Path | None) -> None:
    """Refuse, before any work, an -o that names a file the current command reads
    (``advisor.fileio.refuse_overwriting``)."""
    from advisor.fileio import refuse_overwriting

    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        refuse_overwriting(output, input_files(ctx))


def _output_path(ctx, param, value: str | None) -> Path | None:
    """-o checked before any work: a regular file or a new one (written atomically), or stdout."""
    from advisor.fileio import is_stdout

    if value is not None and is_stdout(value):
        return STDOUT
    return file_path(ctx, param, value)


def output_option(help: str) -> Callable:
    """-o/--output FILE: written atomically; '-' or /dev/stdout for standard output; devices,
    FIFOs, directories and read-only files refused before any work."""
    return click.option("-o", "--output", type=UserPath(), default=None, callback=_output_path,
                        metavar="FILE", help=help)


def _wide(ctx, param, value: bool) -> None:
    from advisor import render

    render.WIDE = bool(value)  # set on every call, so that one --wide does not outlive its command


WIDE_OPTION = click.option("--wide", is_flag=True, expose_value=False, is_eager=True, callback=_wide,
                           help="Tables with every column, however wide (default: fit $COLUMNS, else 100).")


_FILE_FORMATS = {".json": "json", ".csv": "csv", ".html": "html", ".htm": "html", ".yaml": "yaml",
                 ".yml": "yaml", ".png": "png"}
"""The formats a file's name says (-o rows.json): rows are written so unless --format says
otherwise; every command that writes a file refuses a name that says another format than the
one it writes (JSON in x.html or x.yaml, a table in x.png), with the one check ``refuse_named``."""
_ROW_FORMATS = ("json", "csv")
"""The named formats that rows can be written in (``file_format``)."""

_WRITTEN = {"table": "a table", "json": "JSON", "csv": "CSV", "html": "HTML", "yaml": "YAML", "script": "a script"}
_SUFFIX = {"table": ".txt", "json": ".json", "csv": ".csv", "html": ".html", "yaml": ".yaml", "script": ".sh"}
"""The name to offer for what is written (a table is text)."""


def named_format(output: Path | None) -> str | None:
    """The format the name of the file ``output`` says (``_FILE_FORMATS``), or None."""
    return None if output is None or output == STDOUT else _FILE_FORMATS.get(output.suffix.lower())


def wrong_format(who: str, written: str, output: Path, remedy: str) -> InputError:
    """The refusal of writing the format ``written`` into a file whose name says another (-o x.csv
    with --format json; advisor report's page into -o x.json), before any work: a reader that
    trusts the name (advisor-launch --from, a spreadsheet, a browser) could not read it."""
    return InputError(f"{who} would write {_WRITTEN.get(written, written)} into {output}: {remedy}")


def refuse_named(who: str, written: str, output: Path | None, remedy: str | None = None) -> None:
    """The one suffix check: refuse (``wrong_format``) to write ``written`` into ``output`` when
    its name says another known format (``_FILE_FORMATS``); other names and stdout pass. The
    remedy offered, unless given, is the name with the suffix of what is written."""
    named = named_format(output)
    if named is None or named == written:
        return
    if remedy is None:
        remedy = f"name the file {output.with_suffix(_SUFFIX[written])}"
        if named == "html" and written in (*_ROW_FORMATS, "table"):  # rows: the report draws them
            remedy += ", or use 'advisor report' for a page"
        elif named == "png":  # -o x.png: a picture was meant
            remedy += _picture_remedy(written)
    raise wrong_format(who, written, output, remedy)


def _picture_remedy(written: str) -> str:
    """Where -o names a PNG: the command's own picture option (estimate's --plot, recommend's
    --png; not where it is given already), else, for rows, the report's pictures; nothing for other
    writers (advisor-launch)."""
    ctx = click.get_current_context(silent=True)
    for param in ctx.command.params if ctx is not None else ():
        if param.callback is png_path:
            return "" if ctx.params.get(param.name) else f", or give {param.opts[0]} FILE.png for the picture"
    return ", or use 'advisor report' for a page with its pictures" if written in (*_ROW_FORMATS, "table") else ""


def file_format(fmt: str, output: Path | None) -> str:
    """The format the rows are written in: ``fmt``, or, when --format was left out and -o names a
    file ending in .json or .csv (any case), that format ('-o sweep.json' wrote the table into
    sweep.json, which 'advisor-launch --from' and 'advisor report --from' then could not read).
    A --format given that differs from the name's, or any format into a name that says one rows
    are never written in (x.html, x.yaml, x.png), is refused (InputError) before any work."""
    if output is None or output == STDOUT:
        return fmt
    from click.core import ParameterSource

    named = named_format(output)
    if named in _ROW_FORMATS and named != fmt:
        ctx = click.get_current_context(silent=True)
        source = ctx.get_parameter_source("fmt") if ctx is not None else None
        if source in (ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP):
            return named
        refuse_named(f"--format {fmt}", fmt, output, f"give --format {named}, or another file name")
    refuse_named(f"--format {fmt}", fmt, output)
    return fmt


def output_options(func: Callable) -> Callable:
    """--format table|json|csv and --output FILE (written atomically), --wide; the command gets
    ``fmt`` as ``file_format`` settles it (-o rows.json without --format: json)."""

    @functools.wraps(func)
    def wrapper(*args, fmt: str, output: Path | None, **kwargs):
        refuse_overwriting_inputs(output)
        return func(*args, fmt=file_format(fmt, output), output=output, **kwargs)

    return apply_options(
        [
            WIDE_OPTION,
            click.option("--format", "fmt", type=click.Choice(["table", "json", "csv"]), default="table",
                         show_default=True, help="table for people; json or csv for machines."),
            output_option("Write to this regular file (atomically, with your umask) instead of stdout; '-' is "
                          "stdout. A FILE ending in .json or .csv gets that format unless --format is given; "
                          "one named for a format not written (.html, .yaml, .png) is refused."),
        ],
        wrapper,
    )


def document_options(func: Callable) -> Callable:
    """--format table|json and --output FILE for a command whose result is one JSON document: the
    file always gets the document, the terminal gets what --format asks for."""

    @functools.wraps(func)
    def wrapper(*args, output: Path | None, **kwargs):
        # the file always gets the JSON document (a nested one: no CSV rows), whatever --format says
        refuse_named(command_name(), "json", output)
        refuse_overwriting_inputs(output)
        return func(*args, output=output, **kwargs)

    return apply_options(
        [
            WIDE_OPTION,
            click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
                         show_default=True, help="What to print: a table for people, or the JSON document."),
            output_option("Also write the JSON document to this regular file (atomically, with your umask); "
                          "'-' prints the JSON document to stdout instead of the table. A FILE named for another "
                          "format (.csv, .html, .yaml, .png) is refused."),
        ],
        wrapper,
    )


def _write(output: Path, text: str) -> None:
    from advisor.fileio import atomic_write_text

    atomic_write_text(output, text)
    wrote(output)


def wrote(path, detail: str = "") -> None:
    """'wrote PATH' on stderr, the path escaped as ``one_line`` escapes an error's (a newline in
    -o $'a\\nb.json' split the line in two, and printed what looked like a second note)."""
    click.echo(one_line(f"wrote {path}{detail}"), err=True)


def emit(text: str, output: Path | None) -> None:
    """Rows: the formatted text to stdout, or (only) to ``output``."""
    if output is None or output == STDOUT:
        _to_stdout(text)
    else:
        _write(output, text)


def _to_stdout(text: str) -> None:
    """``text`` on stdout; a write that fails (a full disk behind '> file', /dev/full) said as
    stdout's, since the error itself names no file ('Error: No space left on device' alone left
    the user to guess which). A reader that left (| head) stays click's quiet exit."""
    flush_notes()
    try:
        click.echo(text, nl=False)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise AdvisorError(f"standard output: {exc.strerror or exc}") from None


def table_on_stdout(fmt: str, output: Path | None) -> bool:
    """Whether the rows go to stdout as a table, whose caption already says what a note would."""
    return fmt == "table" and (output is None or output == STDOUT)


def command_name() -> str:
    """The command as the user typed it ('advisor sweep', 'advisor report sweep'), for the lines
    that say which command speaks; the root is 'cli' when called in-process, so it is named."""
    ctx = click.get_current_context(silent=True)
    return " ".join(["advisor", *ctx.command_path.split()[1:]]) if ctx is not None else "advisor"


def note(line: str) -> None:
    """A note or warning on stderr, wrapped to the terminal (``render.wrap_note``); the notes
    held so far (``held_note``) first, in the order they were given."""
    from advisor.render import stderr_width, wrap_note

    flush_notes()
    click.echo(wrap_note(one_line(line), stderr_width()), err=True)  # one note a line, as an error


_HELD_NOTES = "advisor held notes"


def held_note(line: str) -> None:
    """A note for stderr said while the input is still being checked (an option's, read before
    the layout is): held until the checks have passed, then printed before the command's output
    (``_to_stdout``), before any later note, or when the command ends (``OneLineErrors.invoke``);
    dropped with an error, so that bad input stays one line."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        note(line)
    else:
        ctx.find_root().meta.setdefault(_HELD_NOTES, []).append(line)


def flush_notes() -> None:
    """Print the notes ``held_note`` holds (the command's checks have passed)."""
    ctx = click.get_current_context(silent=True)
    for line in ctx.find_root().meta.pop(_HELD_NOTES, []) if ctx is not None else ():
        note(line)


def nothing_fits(line: str) -> None:
    """"Nothing fits": ``line`` on stderr and exit status 1, after whatever the command has
    written (bad input is 2). The one way every command ends so (README, "nothing fits")."""
    note(line)
    click.get_current_context().exit(1)


def emit_document(document: dict, table: str | Callable[[], str], fmt: str, output: Path | None) -> None:
    """A document: its JSON to ``output`` if given, and the table or the JSON to stdout
    (``table`` may be a function: drawn only when shown)."""
    from advisor import render

    text = render.to_json(document)
    if output == STDOUT:
        fmt = "json"
    elif output is not None:
        _write(output, text)
    _to_stdout(text if fmt == "json" else table if isinstance(table, str) else table())


def parse_numbers(text: str, kind: Callable, option: str) -> tuple:
    """'7,9,9,7' -> (7, 9, 9, 7) for a comma-separated option; one line naming the option if not."""
    try:
        return tuple(kind(part) for part in text.split(","))
    except ValueError:
        what = "integers" if kind is int else "numbers"
        raise InputError(f"{option} must be comma-separated {what}, got {text!r}") from None


def parse_layer_counts(text: str) -> tuple[int, ...]:
    """'3,5,4,4' -> (3, 5, 4, 4); a part LxN is N stages of L layers, as the sweep prints them
    ('7,8x14,7') and campaign run ids write them: 1x80 is 80 one-layer stages. ValueError says
    what is wrong (the caller names its option)."""
    counts: list[int] = []
    most = limits.MODEL["num_layers"].high  # stages and layers alike: 1x1000000000 was a list of 10^9
    for part in text.split(","):
        layers, _, repeat = part.partition("x")
        try:
            times, layers = (int(repeat) if repeat else 1), int(layers)
        except ValueError:
            raise ValueError(f"expected comma-separated layer counts like 3,5,4,4 or 7,8x14,7, got {text!r}") from None
        if len(counts) + times > most:
            raise ValueError(f"more than {most:,} stages in {text[:40]!r}")
        counts += [layers] * times
    return tuple(counts)


def drawing_for(output: Path | None) -> Drawing:
    """How a table bound for ``output`` is drawn (``render.Drawing``): for a terminal, in
    box-drawing characters and coloured, not coloured where NO_COLOR is set to anything but the
    empty string (https://no-color.org) or the terminal is dumb; for a pipe or a file, plain."""
    from advisor.render import PLAIN, Drawing

    if not ((output is None or output == STDOUT) and sys.stdout is not None and sys.stdout.isatty()):
        return PLAIN
    plain_terminal = bool(os.environ.get("NO_COLOR")) or os.environ.get("TERM") == "dumb"
    return Drawing(color=not plain_terminal, boxes=True)


# --- GPU presets and the time model (issue 16) ---------------------------------------------

_TOKEN_SUFFIXES = {"": 1.0, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12, "P": 1e15}


class TokenCount(click.ParamType):
    """A token budget: 15T, 300B, 2.5e12; a positive whole number and, with ``bound``, at most its high
    (the advisor's --tokens: ``limits.TOKENS``; the launcher's is bounded by Megatron's int64
    sample index instead, ``launch.job``)."""

    name = "TOKENS"

    def __init__(self, bound: limits.Bound | None = None) -> None:
        self.bound = bound

    def convert(self, value, param, ctx):
        import decimal

        if isinstance(value, (int, float)):
            number = decimal.Decimal(value)
        else:
            text = str(value).strip().upper()
            suffix = text[-1:] if text[-1:] in _TOKEN_SUFFIXES and text[-1:] else ""
            try:  # in decimal, so that 4.1T is 4100000000000 tokens, not float's 4099999999999.9995
                number = decimal.Decimal(text[: len(text) - len(suffix)]) * int(_TOKEN_SUFFIXES[suffix])
            except (ValueError, ArithmeticError):  # decimal.InvalidOperation is an ArithmeticError
                self.fail(f"{value!r} is not a token count (for example 15T, 300B, 2.5e12)", param, ctx)
        # is_finite first: comparing a decimal NaN ('nan') raises InvalidOperation, not False
        if not number.is_finite() or not number > 0 or not math.isfinite(float(number)):
            self.fail(f"{value!r} must be a positive, finite token count", param, ctx)
        if number != number.to_integral_value():  # a budget counts whole tokens (--train-samples' tokens)
            # str, not :f, so the number is no longer than it was typed: 1e-999999999 :f is a GB of zeros
            self.fail(f"{value!r} is {number.normalize()} tokens, not a whole number: a token count is an integer "
                      "(4.1T is 4100000000000 tokens)", param, ctx)
        number = float(number)
        if self.bound is None:
            return number
        try:
            return limits.check_float(number, "", self.bound, low_open=True)
        except AdvisorError as exc:
            self.fail(str(exc), param, ctx)


GPU_HOUR_PRICE = click.option(
    "--gpu-hour-price", type=Bounded(limits.GPU_HOUR_PRICE_USD, integer=False, low_open=True), default=None,
    metavar="USD",
    help="With --tokens: the price of one GPU-hour, to turn the GPU-hours into a cost (cost_usd).")


TP_ACROSS_NODES = {
    "sweep": "TP is searched up to it",
    "recommend": "TP stays within it",
    "estimate": "a TP larger than it is priced over the network (with --from-command and this not given, the "
                "command's own --nproc-per-node where fewer)",
    "compare-log": "a TP larger than it is priced over the network",
}
"""What each command that takes --gpus-per-node does with it, as its --help says."""
PER_NODE_FLAG = "Megatron has no flag for it (a launch's torchrun --nproc-per-node)."
"""Where a launch states GPUs per node, as --gpus-per-node's help says (advisor profile plan's too)."""


def gpu_options(command: str) -> Callable[[Callable], Callable]:
    """--gpu NAME, --mem GIB, --gpus-per-node N -> ``gpu`` (a GpuSpec or None), ``mem`` (GiB)
    and ``gpus_per_node``: a preset sets all three, --mem and --gpus-per-node override it. The
    help of --gpus-per-node says what ``command`` does with it (``TP_ACROSS_NODES``)."""
    return functools.partial(_with_gpu_options, tp_across_nodes=TP_ACROSS_NODES[command])


def _with_gpu_options(func: Callable, tp_across_nodes: str) -> Callable:
    @functools.wraps(func)
    def wrapper(*args, gpu: str | None, mem: float | None, gpus_per_node: int | None, **kwargs):
        from advisor.parallel import DEFAULT_GPUS_PER_NODE

        spec = None
        if gpu is not None:
            from advisor.hardware import get_gpu

            spec = get_gpu(gpu).with_overrides(memory_gib=mem, gpus_per_node=gpus_per_node)
            mem, gpus_per_node = spec.memory_gib, spec.gpus_per_node
        return func(*args, gpu=spec, mem=mem, gpus_per_node=gpus_per_node or DEFAULT_GPUS_PER_NODE, **kwargs)

    return apply_options(
        [
            click.option("--gpu", default=None, metavar="NAME",
                         help="A GPU preset (see 'advisor gpus'): memory, FLOP/s, bandwidths and GPUs per "
                              "node; enables the time model and the calibrated verdicts."),
            click.option("--mem", type=GIB, default=None,
                         help="Memory per GPU in GiB (overrides --gpu's)."),
            click.option("--gpus-per-node", type=GPUS_PER_NODE, default=None,
                         help=f"GPUs per node, the NVLink domain: {tp_across_nodes}. Default: --gpu's, else 8. "
                              + PER_NODE_FLAG),
        ],
        wrapper,
    )


def model_choice_options(func: Callable) -> Callable:
    """--memory-model, --rank-by, --tokens: how rows are judged, ranked and costed."""
    return apply_options(
        [
            click.option("--memory-model", type=click.Choice(["calibrated", "paper", "profile"]), default=None,
                         help="calibrated: Eq. 18 with the terms it leaves out (the loss's working set, the "
                              "mask, the runtime), its activations scaled and the allocator's reserve added, both "
                              "fitted on measured runs (it can come out below Eq. 18); verdicts fits / likely fits "
                              "/ likely "
                              "oom / oom with the margin (default with --gpu); paper: Eq. 18 exactly and its 80% "
                              "rule, fits / tight / oom (default without --gpu); profile: the calibrated model "
                              "with the activations a profile measured (--profile DIR)."),
            click.option("--profile", "profile_dir", type=InputPath(path_type=Path), default=None, metavar="DIR",
                         help="Profiles (a run, or a campaign's --out; advisor profile run --backend symbolic "
                              "takes them at the real size without a GPU) whose measured activations, as ratios "
                              "to Eq. 12-14, replace the equations' (implies --memory-model profile)."),
            click.option("--rank-by", type=click.Choice(["throughput", "memory", "paper"]), default=None,
                         help="throughput: the fastest predicted layout expected to run (default with --gpu); "
                              "memory: most headroom; paper: the 4D paper's rule (default without --gpu)."),
            click.option("--tokens", type=TokenCount(limits.TOKENS), default=None,
                         help="A token budget (15T, 300B): adds the days and GPU-hours it takes (needs --gpu)."),
            GPU_HOUR_PRICE,
        ],
        func,
    )
