"""The docs' hand-written tables and sentences read back in tests, and a value printed as the doc
prints it (its decimals, its sign): tests/test_doc_numbers.py and the tests that own a table's
measurement (tests/test_symbolic_moe.py)."""

from __future__ import annotations

import re

from conftest import ROOT

NUMBER = re.compile(r"[-+]?\d+(?:,\d{3})*(?:\.\d+)?")


def text_of(doc: str) -> str:
    """The document with its lines joined: a sentence may wrap anywhere."""
    return " ".join((ROOT / doc).read_text().split())


def table_after(doc: str, header: str, below: str = "") -> list[list[str]]:
    """The rows (cells stripped) of the first Markdown table whose header line starts with
    ``header`` (below the first line that starts with ``below``, if given)."""
    lines = (ROOT / doc).read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(below))
    start = next(i for i, line in enumerate(lines) if i >= first and line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    return rows


def printed(value: float, shown: str) -> str:
    """``value`` printed with as many decimals as ``shown`` has (its sign too, if it shows one)."""
    number = NUMBER.search(shown).group()
    decimals = len(number.split(".")[1]) if "." in number else 0
    sign = "+" if number.startswith("+") else ""
    return f"{value:{sign}.{decimals}f}"


def numbers(cell: str) -> list[str]:
    return NUMBER.findall(cell)
