"""The one renderer of rows: a table for people, JSON or CSV for machines.

Rows are flat dicts of scalars (each result type's ``to_dict()``). ``rich`` is imported only
when a table is drawn, so that the CLI starts fast.
"""

from __future__ import annotations

import io
import json
import re
import textwrap
from dataclasses import dataclass
from typing import Callable, Sequence

VERDICT_STYLES = {"fits": "green", "likely fits": "green3", "tight": "yellow", "likely oom": "dark_orange",
                  "oom": "red"}


@dataclass(frozen=True, slots=True)
class Drawing:
    """How a table is drawn where it lands. On a terminal: its verdicts coloured (unless NO_COLOR)
    and its borders in box-drawing characters. Anywhere else (a pipe, a file, ``--output``, a
    test): plain ASCII, so that each line's bytes are its columns and ``wc -L``, ``cut`` and a
    byte-counting width check see what a terminal shows (a box-drawing character is one column but
    three bytes in UTF-8: a 100-column sweep table had 34 lines of 100 to 118 bytes)."""
    color: bool = False
    boxes: bool = False


PLAIN = Drawing()


@dataclass(frozen=True, slots=True)
class Fold:
    """What a column leaves in another where it is itself left out: ``text(row)`` (nothing where
    empty) in parentheses after the cell of the column ``into`` ('4 (5,7,10,10)'); where that is
    still too wide, ``mark`` in its place ('4*'), which costs at most a character."""
    into: str
    """The key of the column that carries the text."""
    text: Callable[[dict], str]
    note: str
    """The caption's words for the text: 'an uneven split's layers per stage follow its PP'."""
    drop: int = 0
    """As a column's: where the table with the text is still too wide, the text goes (for the mark)."""
    mark: str = ""
    mark_note: str = ""
    """The caption's words for the mark: 'PP* marks an uneven split'."""


@dataclass(frozen=True, slots=True)
class Column:
    key: str
    header: str
    spec: str = ""
    """Format spec for the table (for example '.2f'); JSON and CSV keep full precision."""
    justify: str = "right"
    scale: float = 1
    """Divide by this before formatting (for example 2**20 to show bytes in MiB)."""
    drop: int = 0
    """Where a table is wider than the terminal, the columns with the highest ``drop`` are left
    out first (ties: the rightmost); ``--wide`` or JSON shows them."""
    keep: bool = False
    """Never left out, however narrow the terminal (a layout's degrees: a row without them names
    no layout); where these alone overflow, the table drops its cell padding instead."""
    fold: Fold | None = None
    """What this column leaves in another where it is left out (an uneven split after its PP)."""
    group: str = ""
    """Columns of one group are left out together, the first time any is: the terms of a sum,
    so that those shown still add up to it (an estimate at 80 columns kept the weights of the
    model states without their gradients and optimizer, and 7.48 + 22.64 read as 56.30, audit)."""
    unit: str = ""
    """The unit of the cells, on a line of its own under the header ('GiB' under 'margin'): each
    column says its own at no cost in width, whichever others the terminal leaves out (at 100
    columns with --tokens a sweep's margin was a bare '+22.2': only the usage column, left out,
    had said 'GiB')."""

    @property
    def name(self) -> str:
        """The header and its unit on one line, as a caption names the column: 'margin GiB'."""
        return f"{self.header} {self.unit}" if self.unit else self.header

    def cell(self, row: dict) -> str:
        value = row.get(self.key)
        if value is None:
            return "-"
        return format(value / self.scale if self.scale != 1 else value, self.spec)


BYTE_UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def byte_unit(values) -> tuple[str, int]:
    """The largest binary unit in which the largest value is at least 1."""
    largest = max((abs(v) for v in values if v is not None), default=0)
    return next(((name, size) for name, size in BYTE_UNITS if largest >= size), ("B", 1))


def counts_text(counts, separator: str = ",") -> str:
    """Layers per stage in runs: [7, 8, 8, ..., 8, 7] -> '7,8x14,7' (a campaign's run ids use
    separator '.': '7.8x14.7')."""
    runs: list[list[int]] = []
    for count in counts:
        if runs and runs[-1][0] == count:
            runs[-1][1] += 1
        else:
            runs.append([count, 1])
    return separator.join(str(count) if times == 1 else f"{count}x{times}" for count, times in runs)


def si_count(n: float) -> str:
    """A count as --tokens takes it: 1.5e13 -> '15T', 3e11 -> '300B' (k, M, B, T)."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3g}{suffix}"
    return f"{n:.3g}"


def counted(n: int, noun: str) -> str:
    """'1 row', '2 rows', '3,862 layouts': a count with its noun (an -s plural)."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def listed(items, conjunction: str = "and") -> str:
    """Items as a sentence lists them: 'a', 'a and b', 'a, b and c' (or 'a, b or c')."""
    words = [str(item) for item in items]
    return ", ".join(words[:-1]) + f" {conjunction} " + words[-1] if len(words) > 1 else "".join(words)


def recompute_text(row: dict) -> str:
    """A row's recomputation as the sweep tables show it: 'none', 'selective', 'full block 1'."""
    if row["recompute"] != "full":
        return row["recompute"]
    return f"full {row['recompute_method']} {row['recompute_num_layers']}"


PERCENT_SHOWN = 100.0
"""The largest share of memory shown in full (10,000%): a --mem of 1e-300 GiB, valid to mean that
nothing fits, printed a percentage hundreds of digits long. JSON keeps the number itself."""


def percent_text(fraction: float) -> str:
    """A share of memory as the captions show it ('72%'), above ``PERCENT_SHOWN`` as '>10000%'."""
    return f"{fraction:.0%}" if fraction <= PERCENT_SHOWN else f">{PERCENT_SHOWN:.0%}"


def memory_call_text(memory_gib: float, verdict: str, *, usage_gib: float | None = None,
                     fraction: float | None = None) -> str:
    """The estimates' verdict after the peak stage's analytic total: the calibrated model's
    usage and margin ('; calibrated: 67.7 of 80 GiB, margin +12.3 GiB -> fits'), or the 80%
    rule's share of memory (' = 72% of 80 GiB -> fits')."""
    if usage_gib is not None:
        return (f"; calibrated: {usage_gib:.1f} of {memory_gib:g} GiB, margin {memory_gib - usage_gib:+.1f} GiB "
                f"-> {verdict}")
    return f" = {percent_text(fraction)} of {memory_gib:g} GiB -> {verdict}"


def time_parts_text(parts: dict[str, float]) -> str:
    """A step's parts in seconds, as the estimates' captions show them: 'compute 93.55 s, tp comm
    6.20 s, ...' (the nonzero parts, not the total)."""
    return ", ".join(f"{name.removesuffix('_s').replace('_', ' ')} {value:.2f} s" for name, value in parts.items()
                     if name != "total_s" and value > 0)


def step_text(timing: dict, parts: dict[str, float], options: dict | None = None) -> str:
    """An estimate's step line (dense or MoE): 'step 6.37 s, 715 TFLOP/s per GPU (MFU 72%), 161,931
    tokens/s; compute ...'. MFU is Megatron's TFLOP/s over the GPU's dense BF16 peak; an FP8 run
    (the row's ``options`` with an ``fp8_format``) says so, since its GEMMs run against a peak twice
    that (there is no one convention: torchtitan issue #560), and its MFU can pass what a BF16 run
    can reach."""
    peak = " of the BF16 peak" if (options or {}).get("fp8_format") else ""
    return (f"step {timing['step_time_s']:.2f} s, {timing['tflops_per_gpu']:.0f} TFLOP/s per GPU (MFU "
            f"{timing['mfu']:.0%}{peak}), {timing['tokens_per_s']:,.0f} tokens/s; " + time_parts_text(parts))


def budget_text(row: dict, gpu_hour_price: float | None = None) -> str:
    """A token budget's estimate line (dense or MoE, ``advisor.ranking.budget_fields``'s keys and,
    priced, ``cost_usd``): '1T tokens: 31.3 days, 48,120 GPU-hours, $96,240 at $2 per GPU-hour'."""
    text = f"{si_count(row['tokens'])} tokens: {row['days']:.1f} days, {row['gpu_hours']:,.0f} GPU-hours"
    if gpu_hour_price is not None:
        text += f", ${row['cost_usd']:,.0f} at ${gpu_hour_price:g} per GPU-hour"
    return text


def ranking_note(tolerance: float) -> str:
    """A throughput ranking's caption line on its tolerance (``advisor.ranking.order``)."""
    return (f"rows with TFLOP/s within {tolerance:.1%} of the best (the time model's held-out ordering error) rank "
            "simplest first")


def to_json(obj: object) -> str:
    """Indented JSON: objects one key per line, an array of objects or arrays one element per line,
    an array of numbers or strings on one line. Each line is written by json's C encoder: a
    whole-space sweep writes thousands of rows, a plan for 16,384 GPUs lists every GPU, and
    indenting them through the pure-Python encoder took seconds. JSON as the standard has it: a
    NaN or an infinity is a bug upstream, never written (ValueError)."""
    return _indented(obj, 0) + "\n"


def rows_to_json(rows: Sequence[dict], shared: dict, key: str, parts: Sequence[Sequence[Sequence]],
                 tails: Sequence[dict] | None = None) -> str:
    """``to_json([{**row, **shared, **tail, key: [*a, *b, ...]} for row, tail, (a, b, ...) in
    zip(rows, tails, parts)])``, byte for byte, without building those dicts: a sweep's rows share
    ``shared`` (the model, the batch) and most of their flags, so ``shared`` is encoded once and
    each part once per distinct object (the caller hands the same tuple to the rows that share
    it); json's C encoder then sees only each row's own values. ``tails`` (no tails by default)
    are small dicts whose keys follow ``shared``, encoded once per distinct object as the parts
    are (a dense row's ``options``). A row holding a key of ``shared`` or ``key``, or sharing one
    with its tail, takes the plain path."""
    if not rows:
        return to_json([])
    names = (*shared, key)
    head = ", " + _dumps(shared)[1:-1] if shared else ""
    head_key = f", {_dumps(key)}: ["
    encoded: dict[int, tuple] = {}  # id -> (the part, kept alive so that its id stays its own; its text)
    out = ["[\n  "]  # every piece of the text, joined once at the end: the text can be tens of MB
    for row, tail, row_parts in zip(rows, tails or ({},) * len(rows), parts, strict=True):
        held, tail_text = encoded.get(id(tail), (None, None))
        if held is not tail:
            tail_text = ", " + _dumps(tail)[1:-1] if tail and tail.keys().isdisjoint(names) else "" if not tail \
                else None
            encoded[id(tail)] = tail, tail_text
        if not row or not row.keys().isdisjoint(names) or tail_text is None or not row.keys().isdisjoint(tail):
            out += _dumps({**row, **shared, **tail, key: [item for part in row_parts for item in part]}), ",\n  "
            continue
        out += _dumps(row)[:-1], head, tail_text, head_key
        comma = ""
        for part in row_parts:
            held, text = encoded.get(id(part), (None, ""))
            if held is not part:
                text = _dumps(list(part))[1:-1]
                encoded[id(part)] = part, text
            if text:
                out += comma, text
                comma = ", "
        out.append("]},\n  ")
    out[-1] = out[-1][:-4] + "\n]\n"  # the last row's "]}" or its whole text, without the separator
    return "".join(out)


_dumps: Callable[[object], str] = json.JSONEncoder(allow_nan=False).encode
"""``json.dumps(obj, allow_nan=False)`` with one encoder made once: dumps makes a new one per call
when given any option, a quarter of the time of encoding a sweep row."""


def _indented(obj: object, depth: int) -> str:
    pad, inner = "  " * depth, "  " * (depth + 1)
    if isinstance(obj, dict) and obj:
        return "{\n" + ",\n".join(f"{inner}{_dumps(key if isinstance(key, str) else _dumps(key))}: "
                                   f"{_indented(value, depth + 1)}"
                                   for key, value in obj.items()) + f"\n{pad}}}"
    if isinstance(obj, (list, tuple)) and any(isinstance(item, (dict, list, tuple)) for item in obj):
        return "[\n" + ",\n".join(inner + _dumps(item) for item in obj) + f"\n{pad}]"
    return _dumps(obj)


def csv_header(text: str) -> str:
    """The header line alone of a CSV document: the empty table with its columns (an empty file
    is no CSV to pandas), for output where nothing is shown."""
    return text.partition("\n")[0] + "\n"


def to_csv(rows: Sequence[dict], columns: Sequence[str] = ()) -> str:
    """The rows under a header of their keys (every row's, in the order first met: a key only
    later rows have is a column too, empty where a row lacks it); with no rows, the header of
    ``columns`` alone: a CSV reader takes it as a table with those columns and no rows (an empty
    file is refused by pandas). Neither: the empty document."""
    import csv  # only CSV output needs it: kept off the start-up of the others

    if not rows and not columns:
        return ""  # no columns to name: the empty document
    buffer = io.StringIO()
    keys = list(dict.fromkeys(key for row in rows for key in row)) if rows else list(columns)
    writer = csv.DictWriter(buffer, fieldnames=keys, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    # a nested value (a row's options) as JSON, not Python's repr
    writer.writerows({k: json.dumps(v) if isinstance(v, (dict, list, tuple)) else v for k, v in row.items()}
                     for row in rows)
    return buffer.getvalue()


DEFAULT_WIDTH = 100
RICH_HEIGHT = 25
"""The height every rich Console is given with its width (a table is printed whole, a progress
bar is one line): rich reads a size it is not given from $COLUMNS and $LINES, int() after
str.isdigit(), which a superscript digit passes ('LINES=²' was a ValueError traceback)."""
WIDE = False
"""Set by ``--wide`` (``advisor.cli.options``): every column, however wide the table."""


def terminal_width() -> int:
    """``$COLUMNS`` where it is a sensible width; else the terminal's own width where stdout is
    one (interactive shells seldom export COLUMNS); else 100 (a pipe, a file)."""
    import sys

    return _columns(sys.stdout) or DEFAULT_WIDTH


def stderr_width() -> int | None:
    """The width to wrap notes on stderr at: ``$COLUMNS`` where it is a sensible width, else
    the terminal's where stderr is one; None (one line a note, for logs and grep) otherwise."""
    import sys

    return _columns(sys.stderr)


def _columns(stream) -> int | None:
    import os

    text = os.environ.get("COLUMNS", "")
    if text.isdecimal() and 20 <= int(text) <= 10_000:
        return int(text)
    try:
        columns = os.get_terminal_size(stream.fileno()).columns if stream.isatty() else 0
    except (AttributeError, ValueError, OSError):  # replaced or closed stream (click's runner, '>&-')
        columns = 0
    return columns if 20 <= columns <= 10_000 else None


def wrap_note(text: str, width: int | None) -> str:
    """A note or warning wrapped at ``width``, its continuation lines indented two spaces so
    that each note still reads as one, a long word (a path) kept whole; unwrapped where
    ``width`` is None."""
    return _wrapped(text, width, indent="  ", break_long_words=False)


def to_table(
    rows: Sequence[dict],
    columns: Sequence[Column],
    *,
    title: str | None = None,
    caption: str | None = None,
    row_style: Callable[[dict], str | None] | None = None,
    drawing: Drawing = PLAIN,
    width: int | None = None,
) -> str:
    """A table no wider than ``width`` (default ``terminal_width()``; ``--wide``: unbounded):
    columns are left out by their ``drop`` until it fits (never one to ``keep``, and the first
    only where the ones to keep fill the width without padding), and the caption names them; a
    column left out leaves its ``fold`` in another."""
    from rich.console import Console

    limit = None if WIDE and width is None else (width or terminal_width())
    cells = [[column.cell(row) for column in columns] for row in rows]
    folds = {i: [column.fold.text(row) for row in rows] for i, column in enumerate(columns) if column.fold}
    kept, padding, full = list(range(len(columns))), 1, set(folds)
    if limit is not None:
        kept, padding, full = _fitted(columns, cells, folds, limit)
    shown, justify = _folded(columns, cells, _suffixes(columns, folds, full), kept)
    if hidden := [i for i in range(len(columns)) if i not in kept]:
        # each header whole on a line: 'margin' and 'GiB' on two read as two columns
        names = ", ".join(columns[i].name.replace(" ", _KEEP) for i in hidden)
        notes = [columns[i].fold.note if i in full else columns[i].fold.mark_note for i in hidden
                 if i in folds and any(folds[i]) and (i in full or columns[i].fold.mark)
                 and any(columns[j].key == columns[i].fold.into for j in kept)]
        note = f"not shown to fit {limit} columns: {names} (--wide shows them)" + "".join(f"; {n}" for n in notes)
        caption = note if caption is None else f"{caption}\n{note}"
    table = _table(rows, [columns[i] for i in kept], justify, list(zip(*shown)), row_style, padding, drawing.boxes)
    console = Console(file=io.StringIO(), force_terminal=drawing.color, no_color=not drawing.color,
                      width=limit or 10_000, height=RICH_HEIGHT)
    console.print(table)
    body = "\n".join(line.rstrip() for line in console.file.getvalue().rstrip("\n").split("\n"))
    return "\n".join(part for part in (_wrapped(title, limit), body, _wrapped(caption, limit)) if part) + "\n"


def _fitted(columns: Sequence[Column], cells: list[list[str]], folds: dict[int, list[str]],
            limit: int) -> tuple[list[int], int, set[int]]:
    """(the indices of the columns kept, the cells' padding either side, the folds whose text is
    kept): columns, and the texts the left-out ones fold into others, go highest ``drop`` first
    until the table fits ``limit``; where the ones never left out do not fit with a space either
    side of each cell, none (a narrow box beats rich's '…' in every header)."""
    for padding in (1, 0):
        kept, full = list(range(len(columns))), set(folds)
        while _natural_width(columns, cells, _suffixes(columns, folds, full), kept, padding) > limit:
            # (drop, position, is a fold's text, index): a fold's text stands where its column did
            droppable = [(columns[i].drop, i, False, i) for i in kept[1:] if not columns[i].keep]
            droppable += [(columns[i].fold.drop, i, True, i) for i in full if i not in kept]
            if not droppable and padding == 0 and len(kept) > 1 and not columns[kept[0]].keep:
                droppable = [(0, 0, False, kept[0])]  # the last resort: the first column, not a '…' header
            if not droppable:
                break
            *_, text, i = max(droppable)
            if text:
                full.discard(i)
            else:
                kept = [j for j in kept if j not in _together(columns, i)]
        else:
            return _restored(columns, cells, folds, full, kept, padding, limit), padding, full
    return kept, 0, full


def _together(columns: Sequence[Column], i: int) -> set[int]:
    """Column ``i`` and the columns of its group: left out, and shown again, together."""
    group = columns[i].group
    return {j for j, column in enumerate(columns) if j == i or (group and column.group == group)}


def _restored(columns: Sequence[Column], cells: list[list[str]], folds: dict[int, list[str]], full: set[int],
              kept: list[int], padding: int, limit: int) -> list[int]:
    """``kept`` with the columns left out early shown again, most wanted first (lowest ``drop``),
    wherever the table still fits: a column left out before a wide group that had to go as well
    would fit once the group is gone (an estimate at 80 columns lost its position for nothing)."""
    for i in sorted((i for i in range(len(columns)) if i not in kept), key=lambda i: (columns[i].drop, i)):
        if i in kept:  # shown again with its group
            continue
        trial = sorted(set(kept) | _together(columns, i))
        if _natural_width(columns, cells, _suffixes(columns, folds, full), trial, padding) <= limit:
            kept = trial
    return kept


def _suffixes(columns: Sequence[Column], folds: dict[int, list[str]], full: set[int]) -> dict[int, list[str]]:
    """What each fold adds after its cells, row by row: ' (text)' where its text is kept, else its
    mark (if any) where the text is not empty."""
    return {i: [(f" ({text})" if i in full else columns[i].fold.mark) if text else "" for text in texts]
            for i, texts in folds.items() if i in full or columns[i].fold.mark}


def _folded(columns: Sequence[Column], cells: list[list[str]], suffixes: dict[int, list[str]],
            kept: list[int]) -> tuple[list[list[str]], list[str]]:
    """Each kept column's cells and justification, with what the columns left out fold into it:
    the cell right-aligned to its column's widest, the suffix after it ('16 (7,8x14,7)', ' 4*'), the
    column left-justified: the numbers stay in line."""
    shown, justify = [], []
    for j in kept:
        own = [line[j] for line in cells]
        extras = [suffixes[i] for i in suffixes if i not in kept and columns[i].fold.into == columns[j].key
                  and any(suffixes[i])]
        if not extras:
            shown.append(own)
            justify.append(columns[j].justify)
            continue
        wide = max(map(len, own), default=0)
        shown.append([f"{cell:>{wide}}" + "".join(extra[r] for extra in extras) for r, cell in enumerate(own)])
        justify.append("left")  # right-justified, rich would strip the space that keeps '2' above the '4' of '4*'
    return shown, justify


def _wrapped(text: str | None, width: int | None, *, indent: str = "", break_long_words: bool = True) -> str:
    """A title or caption left-aligned under the terminal's width, each of its lines wrapped on
    its own (rich would centre it and wrap it at the table's narrower width); ``indent`` begins
    each continuation line."""
    if not text:
        return ""
    if width is None:
        return text
    wrapper = _NameWrapper(width, subsequent_indent=indent, break_on_hyphens=False, break_long_words=break_long_words)
    # what reads as one stays on one line: joined by a no-break space, which textwrap does not
    # split at, and given back after
    text = _UNBROKEN.sub(_KEEP, _OPTION_HINT.sub(lambda m: m[0].replace(" ", _KEEP), text))
    return "\n".join("\n".join(wrapper.wrap(line) or [""]) for line in text.split("\n")).replace(_KEEP, " ")


_KEEP = "\u00a0"
_OPTION_HINT = re.compile(r"\(--[\w-]+ [A-Z]+\)")
"""An option and its value in a hint: '(--top N)'."""
_UNITS = ("GiB", "MiB", "KiB", "TiB", "GB", "MB", "TB", "B", "GB/s", "TB/s", "TFLOP/s", "tokens/s", "s", "ms", "us",
          "GPU-hours", "days")
_LABELS = ("tp", "cp", "pp", "vpp", "ep", "etp", "dp", "edp", "mbs", "gbs", "seq", "mfu", "stage")


def _unbroken() -> re.Pattern:
    """The spaces a wrapped line never breaks at: a number's before its unit ('+5.3 GiB', '6.20 s',
    '430 TFLOP/s per GPU'); a degree's label's before its value or its 'comm' and a comm's before
    its time ('TP 2', 'tp comm 6.20 s'); an arrow's before the verdict it leads to ('-> likely
    fits'). At 80 columns an estimate's caption ended a line with 'bubble 5.39' and began the next
    with 's,'."""
    units = "|".join(map(re.escape, sorted(_UNITS, key=len, reverse=True)))
    labels = "|".join(rf"(?<=\b{label})" for name in _LABELS for label in (name, name.upper()))
    return re.compile(rf"(?<=\d) (?=(?:{units})(?![\w/-]))|(?<=TFLOP/s) (?=per GPU\b)|(?<=TFLOP/s per) (?=GPU\b)"
                      rf"|(?:{labels}) (?=[-+]?\d|comm\b)|(?<=\bcomm) (?=[-+]?\d)"
                      r"|(?<=->) (?=\S)|(?<=\blikely) (?=(?:fits|oom)\b)")


_UNBROKEN = _unbroken()


class _NameWrapper(textwrap.TextWrapper):
    """textwrap's wrapper that breaks a word too long for the line after a comma before a letter
    first: an overridden model's name, 'llama3.1-8b[num_layers=8,hidden_size=256,...]', wraps
    between its fields, not inside one (numbers such as '12,376' keep their commas)."""

    def _split(self, text: str) -> list[str]:
        return [piece for chunk in super()._split(text)
                for piece in (_FIELD_BREAK.split(chunk) if len(chunk) > self.width else [chunk])]


_FIELD_BREAK = re.compile(r"(?<=,)(?=[A-Za-z_])")


def _natural_width(columns: Sequence[Column], cells: list[list[str]], suffixes: dict[int, list[str]],
                   kept: list[int], padding: int = 1) -> int:
    """Characters a SQUARE-boxed table of the ``kept`` columns needs unwrapped: each column its
    widest cell (with what folds into it), header or unit plus a border and ``padding`` either
    side, and the closing border."""
    shown, _ = _folded(columns, cells, suffixes, kept)
    return 1 + sum(1 + 2 * padding + max([len(columns[j].header), len(columns[j].unit), *map(len, texts)])
                   for j, texts in zip(kept, shown))


def _table(rows, columns, justify, cells, row_style, padding: int = 1, boxes: bool = False):
    from rich import box
    from rich.table import Table
    from rich.text import Text

    # Text, not markup: '[...]' in a name (an overridden model 'llama3.1-8b[num_layers=8]', a
    # file name) is shown as it is, not taken for a style and dropped.
    # box-drawing characters only on a terminal that can show them (not under LANG=C or
    # PYTHONIOENCODING=ascii); ASCII2 has the same geometry, so a table fits the same columns
    boxed = boxes and _unicode_stdout()
    table = Table(header_style="bold", padding=(0, padding), box=box.HEAVY_HEAD if boxed else box.ASCII2)
    # where any column has a unit, the header is two lines: the names, then the units
    units = any(column.unit for column in columns)
    for column, side in zip(columns, justify):
        table.add_column(Text(f"{column.header}\n{column.unit}" if units else column.header), justify=side)
    for row, line in zip(rows, cells):
        table.add_row(*(Text(cell) for cell in line), style=row_style(row) if row_style else None)
    return table


def _unicode_stdout() -> bool:
    """Whether standard output's encoding has the box-drawing characters (UTF-8, UTF-16, ...)."""
    import sys

    return (getattr(sys.stdout, "encoding", None) or "ascii").lower().replace("-", "").startswith("utf")


def verdict_style(row: dict) -> str | None:
    return VERDICT_STYLES.get(row.get("verdict"))
