"""The generated results section of a README: the text between two marker lines."""

from __future__ import annotations

import os

from advisor.errors import AdvisorError


def replace_between(readme: str, begin: str, end: str, section: str) -> str:
    """``readme`` with the text from its ``begin`` marker to its ``end`` marker replaced by
    ``section`` (which carries the markers itself)."""
    start, stop = _markers(readme, begin, end)
    return readme[:start] + section.rstrip("\n") + readme[stop + len(end):]


def _markers(readme: str, begin: str, end: str) -> tuple[int, int]:
    """Where ``readme``'s ``begin`` and ``end`` markers start; refused where either is missing."""
    start, stop = readme.find(begin), readme.find(end)
    if start < 0 or stop < start:
        raise AdvisorError(f"the README has no results markers ({begin!r} ... {end!r})")
    return start, stop


def read_readme(path: str | os.PathLike, begin: str, end: str) -> str:
    """The text of the README ``path``, read before any work: a regular UTF-8 file (click's
    ``Path(exists=True)`` let a FIFO through, and reading it waited forever) holding both markers
    (a README without them stopped only after the tables' seconds of work)."""
    from advisor.fileio import decode_utf8, read_bytes

    text = decode_utf8(read_bytes(path, what="README"), str(path))
    _markers(text, begin, end)
    return text
