"""A Megatron-LM argument list read back as flags, and the one check that a saved sweep row, an
estimate or a plan says with its own ``megatron_args`` what its fields say.

Both readers of a saved row hold it to that check: ``advisor-launch`` (``launch.inputs``), which
launches the flags, and ``advisor report --from`` (``advisor.report.inputs``), which prices the
fields and shows the flags. A row whose ``megatron_args`` were edited without its fields (or its
fields without them) is refused by both in the same words, naming the first flag that differs:
launched, it would run another layout than the one priced; shown, its page would price one layout
and name the flags of another. Dependencies point one way (launch -> advisor), so the check lives
here and the launcher calls it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from advisor.errors import AdvisorError

if TYPE_CHECKING:  # the readers have built both before they ask for the flags
    from advisor.models import LlamaSpec
    from advisor.options import TrainingOptions


@dataclass(frozen=True, slots=True)
class Flag:
    """One flag and the values that follow it (``--flag=value`` is read as ``--flag value``)."""

    name: str
    values: tuple[str, ...]

    def __str__(self) -> str:
        return " ".join((self.name, *self.values))


def is_flag(token: str) -> bool:
    return token.startswith("--") and len(token) > 2


def parse_flags(args: Iterable[str]) -> list[Flag]:
    """Split an argument list into flags with their values, in order; tokens before the first
    flag are dropped (Megatron-LM's pretrain_gpt.py takes no positional arguments)."""
    flags: list[Flag] = []
    name, values = None, []
    for token in args:
        if is_flag(token):
            if name is not None:
                flags.append(Flag(name, tuple(values)))
            name, _, value = token.partition("=")
            values = [value] if value else []
        elif name is not None:
            values.append(token)
    if name is not None:
        flags.append(Flag(name, tuple(values)))
    return flags


def flag_values(args: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """The last value of each flag, as argparse keeps it."""
    return {flag.name: flag.values for flag in parse_flags(args)}


# --- a saved row's flags ------------------------------------------------------------------------


def row_flags(row: dict, spec: LlamaSpec, layers: tuple[int, ...], options: TrainingOptions | None,
              moe: dict | None = None) -> tuple[str, ...]:
    """Every flag the fields of a sweep row or an estimate make, as ``advisor sweep`` and
    ``estimate`` wrote them into its ``megatron_args``: a dense model's from
    ``advisor.megatron_args`` (BF16 weights, as the estimator assumes), a mixture of experts' from
    ``advisor.moe.flags.row_args`` with ``moe``, its settings as ``advisor.saved_row.moe_row_settings``
    read them. ``row`` has been checked by its reader (positive layout integers, an options object);
    ``spec`` is its model, ``layers`` its split, ``options`` its 'options' (None where it has none:
    an MoE row then takes its optimizer and gradients from its own fields)."""
    from advisor.options import TrainingOptions

    tp, cp, mbs, gbs, vpp = row["tp"], row["cp"], row["mbs"], row["global_batch_size"], row.get("vpp") or 1
    if moe is None:
        from advisor.megatron_args import megatron_args

        options = options or TrainingOptions()
        if "recompute" in row:  # priced from the row's own fields (advisor report): they must be what it launches
            options = TrainingOptions.from_dict({**options.changed(), **recomputation_fields(row)})
        return tuple(megatron_args(spec, row["seq_len"], tp=tp, cp=cp, layers_per_stage=layers, micro_batch_size=mbs,
                                   global_batch_size=gbs, options=options, virtual_stages=vpp))
    from advisor.moe.flags import row_args

    priced = {"tp": tp, "cp": cp, "pp": row["pp"], "dp": row["dp"], "mbs": mbs, "vpp": vpp, **moe,
              "layers_per_stage": list(layers), "recompute_num_layers": 1 if moe["recompute"] == "full" else None}
    if options is not None:  # the training options the row was priced with (FP8, ...)
        priced["options"] = options.changed()
    return tuple(row_args(spec, row["seq_len"], gbs, priced))


def priced_release(row: dict, origin: str):
    """The Megatron-LM release a sweep row, an estimate or an analytic plan was priced for (its
    'megatron_version', as ``advisor.options.release_defaults`` reads it), or None for one that
    names none (a plan from profiles; one written before they recorded it: its flags were then the
    same on every release). AdvisorError names one the advisor does not know."""
    from advisor.options import release_defaults

    version = row.get("megatron_version")
    if version is None:
        return None
    if not isinstance(version, str):
        raise AdvisorError(f"{origin}: 'megatron_version' must be a release such as core_v0.19.0, not {version!r}")
    try:
        return release_defaults(version)
    except AdvisorError as exc:
        raise AdvisorError(f"{origin}: its 'megatron_version': {exc}") from None


def as_written(row: dict, origin: str, derived: tuple[str, ...]) -> tuple[str, ...]:
    """The flags a row's fields make (``row_flags``) as its writer wrote them into its
    ``megatron_args``: in the words of the release it was priced for (``priced_release``,
    ``advisor.options.flags.release_spelling``), or as they are for a row that names none."""
    release = priced_release(row, origin)
    if release is None:
        return derived
    from advisor.options.flags import release_spelling

    return tuple(release_spelling(release, derived))


def recomputation_fields(row: dict) -> dict:
    """A dense row's own recomputation fields as training options ('recompute', and with full
    its method and N, Megatron's uniform 1 where left out): what ``advisor report`` prices the row
    with, so what ``row_flags`` holds its flags to."""
    recompute = row.get("recompute", "none")
    fields = {"recompute": recompute}
    if recompute == "full":
        fields["recompute_method"] = row.get("recompute_method") or "uniform"
        fields["recompute_num_layers"] = row.get("recompute_num_layers") or 1
    return fields


def check_own_args(origin: str, kind: str, written: tuple[str, ...],
                   derived: tuple[str, ...] | dict[str, int]) -> None:
    """An input's own ``megatron_args`` must say what its fields say (a hand edit of one without
    the other is refused, naming the first flag that differs): ``derived`` is either every flag the
    fields make (a sweep row's, an estimate's: ``row_flags``; a plan's with its options: then the
    lists must be equal) or the flags the fields decide, with their values (an older plan,
    launched with its own)."""
    whole = isinstance(derived, tuple)
    if whole and written == derived:  # the row as written (a report reads thousands: no parse for them)
        return
    expected = flag_values(derived) if whole else {flag: (str(value),) for flag, value in derived.items()}
    given = flag_values(written)
    beyond = [flag for flag in given if flag not in expected] if whole else []
    for flag in (*expected, *beyond):
        ours, theirs = given.get(flag), expected.get(flag)
        if ours != theirs:
            raise AdvisorError(f"{origin}: inconsistent {kind}: its megatron_args {_difference(flag, ours, theirs)}")
    if whole and written != derived:
        raise AdvisorError(f"{origin}: inconsistent {kind}: its megatron_args repeat, reorder or add words to the "
                           "flags its fields make")


def _difference(flag: str, ours: tuple[str, ...] | None, theirs: tuple[str, ...] | None) -> str:
    """How an input's own flag differs from its fields': 'give --micro-batch-size 4, its fields say 1'."""
    if ours is None:
        return f"lack {flag}, its fields say {' '.join(theirs)}" if theirs else f"lack {flag}, which its fields give"
    if theirs is None:
        return f"give {' '.join((flag, *ours))}, its fields do not"
    return f"give {flag} {' '.join(ours) or '(no value)'}, its fields say {' '.join(theirs) or '(no value)'}"
