"""The advisor's tables read back in tests.

Off a terminal (a test's standard output is a pipe or click's runner) a table is drawn in ASCII
(``render.Drawing``), its title above and its caption below::

    llama3.1-8b, seq 8192, ...
    +------+----+
    | rank | TP |
    +------+----+
    |    1 |  2 |
    +------+----+
    430 fits, ...
"""

from __future__ import annotations

import re
from dataclasses import dataclass

BORDER = re.compile(r"^\+[-+]*\+$")


@dataclass(frozen=True)
class ShownTable:
    title: str
    """The words above the first table, unwrapped into one line."""
    headers: list[str]
    rows: list[list[str]]
    """Each row's cells, stripped, one row a line (no cell of the tables read here wraps)."""
    header_line: str
    body_lines: list[str]
    caption_lines: list[str]
    """The lines below the first table, as drawn."""

    @property
    def caption(self) -> str:
        """The words below the first table, unwrapped into one line."""
        return " ".join(" ".join(self.caption_lines).split())

    def records(self) -> list[dict[str, str]]:
        """Each row's cells by header."""
        return [dict(zip(self.headers, row, strict=True)) for row in self.rows]

    @property
    def columns(self) -> list[str]:
        """Every column's name, with its unit: those shown, then those the caption says are not
        ('not shown to fit 80 columns: m, margin GiB (--wide shows them)')."""
        hidden = self.caption.partition("not shown to fit ")[2].partition(": ")[2].partition(" (--wide")[0]
        return self.headers + (hidden.split(", ") if hidden else [])


def cells(line: str) -> list[str]:
    """A table line's cells, stripped: '|  1 | fits |' -> ['1', 'fits']."""
    return [cell.strip() for cell in line.strip()[1:-1].split("|")]


def read_table(text: str) -> ShownTable:
    """The first table in ``text``; an AssertionError (a test's failure, with the text) where
    there is none."""
    lines = text.splitlines()
    borders = [i for i, line in enumerate(lines) if BORDER.match(line.strip())]
    assert len(borders) >= 3, f"no ASCII table in:\n{text}"
    top, under_header, end = borders[:3]
    header_lines = lines[top + 1:under_header]
    headers = [" ".join(part for part in parts if part) for parts in zip(*map(cells, header_lines))]
    body = lines[under_header + 1:end]
    return ShownTable(title=" ".join(" ".join(lines[:top]).split()), headers=headers,
                      rows=[cells(line) for line in body], header_line=header_lines[0], body_lines=body, caption_lines=lines[end + 1:])
