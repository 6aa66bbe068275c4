"""How many values each Megatron-LM flag takes, and whether argparse reads them as int or float,
per release (``launch.arguments.check_values`` refuses the user's arguments after ``--`` that give
a flag too few, too many, or one its type refuses).

Megatron's argparse (megatron/training/arguments.py, ``parse_args``) refuses ``--lr`` with no
value after it ("argument --lr: expected one argument") on every rank at start-up, and the
launcher would otherwise read the flag as given (``--lr`` alone even silenced its "no learning
rate" warning). Which flags need values is read from each release's own parser, not listed by
hand: core_v0.19.0 builds many of its flags from dataclasses (``ArgumentGroupFactory``), so only
running the parser tells. ``advisor.megatron_flag_table`` holds what ``python -m
launch.megatron_check --flags`` read from the checkout each release was checked with (in the core,
which reads it too: a command's flag that no release has is named as a likely typo);
``tests/test_launch_passthrough_values.py`` compares it with the real parsers. Regenerate it, with
this project's Python for core_v0.15.2 and a Python >= 3.12 with torch for core_v0.19.0, with

    python -m launch.megatron_flags core_v0.15.2=DIR core_v0.19.0=DIR:PYTHON312 -o advisor/megatron_flag_table.py

A flag needs values unless its action is a switch (store_true, store_false,
BooleanOptionalAction) or takes nargs '?' or '*' (``--data-path`` alone is accepted by argparse);
it takes at most one unless its nargs is a number or '+' or '*' ('--lr 3e-4 5' and '--bf16 true'
leave '5' and 'true' to argparse, which refuses them as unrecognized arguments). Its values'
type is kept where it is exactly int or float (``--lr abc``: argparse's float('abc') fails,
"invalid float value", on every rank at start-up); Megatron's own converters and str are not.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Mapping, Sequence

from advisor.megatron_flag_table import FLAGS
from launch.megatron_check import ParserFlags
from launch.megatron_versions import VERSIONS, MegatronVersion


Arity = tuple[int, "int | None"]
"""(the least, the most values a flag takes; None: no most)."""
_WORDS = {"": (1, 1), "?": (0, 1), "*": (0, None)}
"""The table's suffixes besides a number: ``--flag`` one value, ``--flag=?`` one or none,
``--flag=*`` any number; ``--flag=N`` exactly N (0: a switch), ``--flag=N+`` N or more. After
them, ``:int`` or ``:float``: the values' argparse type (``--lr:float``, ``--rampup-batch-size=3:int``)."""
TYPES = {"int": int, "float": float}
"""The types the table keeps, by the name it writes."""


def _read(text: str) -> ParserFlags:
    """The table's text: ``--flag[=SUFFIX][:TYPE]`` words (``_WORDS``, ``TYPES``), separated by blanks."""
    counts, types = {}, {}
    for word in text.split():
        word, _, kind = word.partition(":")
        flag, _, suffix = word.partition("=")
        if kind:
            types[flag] = kind
        if suffix in _WORDS:
            counts[flag] = _WORDS[suffix]
        else:
            least = int(suffix.rstrip("+"))
            counts[flag] = (least, None if suffix.endswith("+") else least)
    return ParserFlags(counts=counts, types=types)


def _word(flag: str, arity: Arity, kind: str | None) -> str:
    suffix = next((word for word, taken in _WORDS.items() if taken == arity), None)
    if suffix is None:
        least, most = arity
        suffix = f"{least}+" if most is None else str(least)
    return (f"{flag}={suffix}" if suffix else flag) + (f":{kind}" if kind else "")


_TABLES = {release: _read(text) for release, text in FLAGS.items()}
_NONE = ParserFlags(counts={}, types={})


def values_taken(rules: MegatronVersion) -> dict[str, Arity]:
    """Every flag of ``rules``' release with the least and the most values it takes (none for a
    release without a table: the tests require one for every release the launcher knows)."""
    return _TABLES.get(rules.release, _NONE).counts


def value_types(rules: MegatronVersion) -> dict[str, str]:
    """The flags of ``rules``' release whose values argparse converts with int or float ('int',
    'float'; ``TYPES``), each value of them."""
    return _TABLES.get(rules.release, _NONE).types


# --- the table, from the checkouts' own parsers ---------------------------------------------


def table_source(parsers: Mapping[tuple[int, int], ParserFlags], checked: Mapping[tuple[int, int], str]) -> str:
    """``advisor/megatron_flag_table.py`` for these releases' parsers (``megatron_check.parser_flags``)."""
    blocks = []
    for release in sorted(parsers):
        flags = parsers[release]
        words = " ".join(_word(flag, arity, flags.types.get(flag)) for flag, arity in sorted(flags.counts.items()))
        body = textwrap.fill(words, width=112, initial_indent=" " * 8, subsequent_indent=" " * 8,
                             break_on_hyphens=False, break_long_words=False)
        blocks.append(f"    # {checked[release]}\n    {release!r}: \"\"\"\n{body}\n    \"\"\",")
    return "\n".join([
        '"""Generated by ``python -m launch.megatron_flags`` (see ``launch.megatron_flags``): do not edit.',
        "",
        "For each Megatron-LM release (major, minor), every flag of its own argument parser and the values it",
        "takes: ``--flag`` one, ``--flag=N`` N (0: a switch), ``--flag=N+`` N or more, ``--flag=?`` one or",
        "none, ``--flag=*`` any number; then ``:int`` or ``:float`` where argparse converts each value with",
        "that type; read from the checkout named above it.",
        '"""',
        "",
        "FLAGS = {",
        *blocks,
        "}",
        "",
    ])


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m launch.megatron_flags TAG=DIR[:PYTHON]... [-o FILE]``: the table of every
    known release, each read from its checkout by ``megatron_check --flags`` in its Python."""
    import argparse

    from advisor.fileio import atomic_write_text
    from launch.megatron_check import parser_flags
    from launch.megatron_versions import of_checkout

    parser = argparse.ArgumentParser(prog="python -m launch.megatron_flags", description=main.__doc__)
    parser.add_argument("checkouts", nargs="+", metavar="TAG=DIR[:PYTHON]")
    parser.add_argument("-o", "--output", type=Path, default=None)
    options = parser.parse_args(argv)
    parsers, checked = {}, {}
    for given in options.checkouts:
        tag, _, rest = given.partition("=")
        directory, _, python = rest.partition(":")
        release = of_checkout(Path(directory)).release
        parsers[release] = parser_flags(directory, python=python or None)
        checked[release] = tag
    missing = [rules.name for rules in VERSIONS if rules.release not in parsers]
    if missing:
        parser.error(f"no checkout of {', '.join(missing)}: the table covers every release the launcher knows")
    text = table_source(parsers, checked)
    if options.output is None:
        sys.stdout.write(text)
    else:
        atomic_write_text(options.output, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
