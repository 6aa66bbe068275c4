"""The generated results section of a README: the text between two marker lines."""

from __future__ import annotations

from advisor.errors import AdvisorError


def replace_between(readme: str, begin: str, end: str, section: str) -> str:
    """``readme`` with the text from its ``begin`` marker to its ``end`` marker replaced by
    ``section`` (which carries the markers itself)."""
    start, stop = readme.find(begin), readme.find(end)
    if start < 0 or stop < start:
        raise AdvisorError(f"the README has no results markers ({begin!r} ... {end!r})")
    return readme[:start] + section.rstrip("\n") + readme[stop + len(end):]
