"""Megatron-LM's spellings of the advisor's options: its own names accepted beside the short ones
(``SpelledOption``, ``add_megatron_spellings``), its lookalike flags refused with why
(``lookalike_message``), its flags no option stands for sent to --from-command
(``megatron_flag_message``), two spellings with two values refused (``OneValueEach``), and its
several-valued ``--recompute-modules`` and ``--moe-aux-loss-coeff`` (``megatron_nargs``). Every
command gets them from ``advisor.cli``'s group."""

from __future__ import annotations

import functools

import click


MEGATRON_SPELLINGS = {
    "--tp": "--tensor-model-parallel-size", "--pp": "--pipeline-model-parallel-size",
    "--cp": "--context-parallel-size", "--ep": "--expert-model-parallel-size",
    "--etp": "--expert-tensor-parallel-size", "--vpp": "--num-virtual-stages-per-pipeline-rank",
    "--mbs": "--micro-batch-size", "--gbs": "--global-batch-size", "--seq-len": "--seq-length",
    "--recompute": "--recompute-granularity",
    "--distributed-optimizer": "--use-distributed-optimizer",
    "--vocab-divisible-by": "--make-vocab-size-divisible-by",
    "--untie-embeddings": "--untie-embeddings-and-output-weights",
}
"""Megatron-LM's own names (core_v0.15.2 and core_v0.19.0 arguments.py) for the options that mean
the same, accepted beside the short ones: a Megatron user's hands type them. A key may be either
side of a boolean pair (--tie-embeddings/--untie-embeddings): its Megatron name joins that side, so
sets the same value. Not --use-flash-attn: it picks the legacy model's kernel only (Megatron Core's
is --attention-backend), so it does not mean --flash-attn."""


MEGATRON_LOOKALIKES = {
    "--use-flash-attn": "Megatron Core ignores --use-flash-attn (legacy models only; its kernel is "
                        "--attention-backend): flash attention is the advisor's default (--flash-attn), "
                        "--no-flash-attn prices --attention-backend unfused",
    "--attention-backend": "Megatron's --attention-backend is the advisor's --flash-attn (a fused kernel, as auto, "
                           "flash and fused run it; the default) or --no-flash-attn (unfused, as unfused and local "
                           "run it)",
    "--no-create-attention-mask-in-dataloader": "Megatron's --no-create-attention-mask-in-dataloader is the "
                                                "advisor's --dataloader-mask off (its default with flash attention; "
                                                "Megatron's own default builds the mask: --dataloader-mask cached)",
    "--fp8": "FP8 is Megatron's --fp8-format hybrid|e4m3 (with --fp8-recipe); --fp8 is not a Megatron-LM flag",
    "--fp16": "FP16 weights with loss scaling (Megatron's --fp16) are priced only from a whole Megatron command "
              "(advisor estimate --from-command); the options here price BF16 (--bf16, the default) and FP8 GEMMs "
              "(--fp8-format)",
    "--recompute-activations": "Megatron's --recompute-activations is --recompute-granularity selective: give "
                               "--recompute selective (or --recompute-granularity selective)",
    "--num-layers-per-virtual-pipeline-stage": "give the virtual stages per rank, --vpp N (Megatron's "
                                               "--num-virtual-stages-per-pipeline-rank): each then holds "
                                               "layers / (PP x N) layers",
    **{flag: (f"Megatron's uneven pipeline split ({flag}) is advisor estimate's --layers-per-stage N,N,... "
              "(each stage's layers); sweep and recommend choose the split themselves; a whole Megatron command "
              "that sets it: advisor estimate --from-command FILE")
       for flag in ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
                    "--pipeline-model-parallel-layout", "--account-for-embedding-in-pipeline-split",
                    "--account-for-loss-in-pipeline-split")},
}
"""Megatron flags that look like an advisor option's spelling but do not mean it: refused with why.
Every Megatron flag a message names is one of core_v0.15.2's (tests/test_cli_megatron_flags.py):
interleaving's is --num-virtual-stages-per-pipeline-rank, which sets the args attribute
virtual_pipeline_model_parallel_size (megatron/training/arguments.py), no flag of any release."""
LOOKALIKE_NEEDS = {"--num-layers-per-virtual-pipeline-stage": "--vpp", "--use-flash-attn": "--flash-attn",
                   "--attention-backend": "--flash-attn",
                   "--no-create-attention-mask-in-dataloader": "--dataloader-mask"}
"""The option a lookalike's advice names, where not every command has it: a command without it
says so instead (``lookalike_message``): without --vpp, that it prices no interleaving; without
another, click's own line (which the advisor's group words as any Megatron flag it lacks)."""
NO_INTERLEAVING = ("{command} {takes}: 'advisor sweep "
                   "--vpp auto|N' and 'advisor estimate --vpp N' price interleaved layouts (Megatron's "
                   "--num-virtual-stages-per-pipeline-rank N; each virtual stage holds layers / (PP x N) layers)")


def lookalike_message(exc: click.NoSuchOption, default: str) -> str:
    """Why a Megatron flag is not the advisor option it looks like, as fits the command it was
    given to: advice to give --vpp only where the command has it."""
    message = {**MEGATRON_LOOKALIKES, **SPELLED_OTHERWISE}.get(exc.option_name, default)
    needed = LOOKALIKE_NEEDS.get(exc.option_name)
    command = exc.ctx.command if exc.ctx else None
    if needed and command is not None and not any(needed in getattr(p, "opts", ()) for p in command.params):
        if needed != "--vpp":
            return default
        takes = ("plans without interleaving (no virtual pipeline stages, so no --vpp)" if command.name == "recommend"
                 else "takes no virtual pipeline stages (no --vpp)")
        return NO_INTERLEAVING.format(command=exc.ctx.command_path, takes=takes)
    if isinstance(command, click.Group) and command.name == "report" and message == default:
        return _subcommand_option(exc, command) or message
    return message


def megatron_flag_message(exc: click.NoSuchOption) -> str | None:
    """Where a Megatron-LM flag (any release's) that the command has no option for is read: a whole
    Megatron command given to --from-command, of this command where it has one (advisor estimate,
    compare-log), else of advisor estimate; None for a name no release has (click's hint stays)."""
    from advisor.megatron_flag_table import FLAGS
    from advisor.megatron_layout import release_flags

    if not any(exc.option_name in release_flags(release) for release in FLAGS):
        return None
    path = " ".join(["advisor", *exc.ctx.command_path.split()[1:]]) if exc.ctx else "advisor"
    params = exc.ctx.command.params if exc.ctx else ()
    reader = path if any("--from-command" in getattr(param, "opts", ()) for param in params) else "advisor estimate"
    return (f"no such option: {exc.option_name} ({path} has no option for this Megatron-LM flag); a whole "
            f"Megatron-LM command that gives it is read by {reader} --from-command FILE ('-' reads standard input)")


def _subcommand_option(exc: click.NoSuchOption, group: click.Group) -> str | None:
    """An option given to a group that its subcommands take ('advisor report --gpus 64', as
    DESIGN.md's 'advisor report [sweep/estimate/recommend options | --from FILE]' reads): where it
    goes, else None."""
    owners = [name for name, sub in sorted(group.commands.items())
              if any(exc.option_name in (*p.opts, *getattr(p, "secondary_opts", ())) for p in sub.params)]
    if not owners:
        return None
    path = exc.ctx.command_path
    return (f"no such option: {exc.option_name} for '{path}' itself; it goes after a subcommand: "
            f"{path} {'|'.join(owners)} {exc.option_name} ...")
SPELLED_OTHERWISE = {
    "--json": "no such option: --json (machine-readable output is --format json)",
}
"""Options other tools spell so, which click's close-name hint does not reach: refused with ours."""


HELP_NAMES_WIDTH = 76
"""The longest names column of an option's help line: with click's indent of 2, within 78 columns."""


class SpelledOption(click.Option):
    """An option with Megatron-LM's spelling (``megatron``) beside the advisor's. The help's names
    column lists both where they fit; where they do not (--distributed-optimizer,
    --use-distributed-optimizer / --no-distributed-optimizer), it keeps the advisor's and the help
    text names Megatron's."""

    megatron: tuple[str, ...] = ()

    def get_help_record(self, ctx: click.Context):
        record = super().get_help_record(ctx)
        if record is None or len(record[0]) <= HELP_NAMES_WIDTH:
            return record
        names, text = record
        for name in self.megatron:
            names = names.replace(f", {name}", "")
        missing = [name for name in self.megatron if name not in text]
        return names, (f"Megatron: {', '.join(missing)}. {text}" if missing else text)


def _with_spellings(names: list[str]) -> list[str]:
    return names + [MEGATRON_SPELLINGS[name] for name in names
                    if name in MEGATRON_SPELLINGS and MEGATRON_SPELLINGS[name] not in names]


def add_megatron_spellings(command: click.Command) -> None:
    """Give every option of ``command`` (and of its subcommands) named in ``MEGATRON_SPELLINGS``
    Megatron-LM's name as a second spelling, in its help too; once per command object. A boolean
    pair's spelling joins the side it means (--untie-embeddings-and-output-weights: the negative)."""
    for param in command.params:
        if isinstance(param, click.Option) and not isinstance(param, SpelledOption):
            opts, secondary = _with_spellings(param.opts), _with_spellings(param.secondary_opts)
            added = tuple(name for name in (*opts, *secondary) if name not in (*param.opts, *param.secondary_opts))
            if added:
                param.opts, param.secondary_opts = opts, secondary
                param.__class__ = SpelledOption  # the same option, whose help keeps to 80 columns
                param.megatron = added
    for sub in getattr(command, "commands", {}).values():
        add_megatron_spellings(sub)


class _OneName:
    """One name of one option in click's parser (its ``_Option``, whose every other attribute this
    passes through): notes the value given under the name, and refuses the option given again
    under another of its names with another value (``OneValueEach``)."""

    def __init__(self, option, name: str, given: dict, ctx: click.Context) -> None:
        self._option, self._name, self._given, self._ctx = option, name, given, ctx

    def __getattr__(self, attribute: str):
        return getattr(self._option, attribute)

    def process(self, value, state) -> None:
        param, now = self._option.obj, value
        if param.name in self._given:
            name, earlier = self._given[param.name]
            if name != self._name and not _same_value(param, self._ctx, earlier, now):
                raise click.UsageError(f"{name} {earlier} and {self._name} {now} contradict each other: give "
                                       "the option once", self._ctx)
        self._given[param.name] = (self._name, now)
        self._option.process(value, state)


def _same_value(param: click.Parameter, ctx: click.Context, a, b) -> bool:
    """Whether two values given for ``param`` are the same: as written, or once converted (--tp 2
    and --tp 02); a value that does not convert is refused with its own error (--seq-length 8192.0
    is not an integer), not as a contradiction."""
    return a == b or param.type_cast_value(ctx, a) == param.type_cast_value(ctx, b)


class OneValueEach:
    """Mix into a click Command: an option with a value given under two of its names (ours and
    Megatron's) with different values is refused (a usage error naming both), where click kept the
    last without a word ('--tp 2 --tensor-model-parallel-size 4' priced TP 4, '--seq-len 4096
    --seq-length 2048' 2048): the two spellings do not look like one option. The same spelling
    again, or a switch and its opposite, keep the last, as click and Megatron's argparse do (a
    script's override at its end); repeatable options (``multiple=True``: --profile,
    --recompute-modules) take every value, and are left alone."""

    def make_parser(self, ctx: click.Context):
        parser = super().make_parser(ctx)
        given: dict[str, tuple[str, object]] = {}
        # click's parser (private, in click 8.1-8.5): one _Option per name; where a click lacks the
        # tables the check is skipped, not the command
        for names in (getattr(parser, "_long_opt", {}), getattr(parser, "_short_opt", {})):
            for name, option in names.items():
                if option.action == "store":
                    names[name] = _OneName(option, name, given, ctx)
        return parser


@functools.cache
def _one_value_class(base: type) -> type:
    return type(base.__name__, (OneValueEach, base), {})


def one_value_each(command: click.Command) -> None:
    """Make ``command`` and its subcommands ``OneValueEach`` (their class, as ``SpelledOption``'s
    options: the commands are click's own, declared with the plain decorators)."""
    if not isinstance(command, OneValueEach):
        command.__class__ = _one_value_class(type(command))
    for sub in getattr(command, "commands", {}).values():
        one_value_each(sub)


NARGS_FLAGS = ("--recompute-modules", "--moe-aux-loss-coeff")
"""Megatron-LM's nargs='+' flags that the advisor takes as repeated options (core_v0.15.2
``arguments.py``: --recompute-modules, and --moe-aux-loss-coeff's one weight per balancing type)."""


def megatron_nargs(args: list[str]) -> list[str]:
    """``args`` with Megatron-LM's ``--recompute-modules moe_act layernorm`` (one flag, several values:
    ``nargs='+'``; ``NARGS_FLAGS``) spelled as the advisor's repeated option. As argparse does, every
    word after it that is not an option is taken as a value, so a misspelt module is refused by the
    option's choices ("'layrnorm' is not one of ...") rather than as a stray argument (the commands
    that take the option take no positional arguments); nothing after a bare ``--`` (arguments
    passed on to Megatron) is touched."""
    if not any(flag in args for flag in NARGS_FLAGS):
        return args
    out: list[str] = []
    flag, values = None, None  # the current several-valued flag, and how many values it has taken
    for i, word in enumerate(args):
        if word == "--":
            return out + args[i:]
        if word in NARGS_FLAGS:
            flag, values = word, 0
        elif values is not None and not word.startswith("-"):
            out += [flag] if values else []
            values += 1
        else:
            values = None
        out.append(word)
    return out
