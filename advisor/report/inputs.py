"""What a report is made of: the document a command wrote (a sweep's rows, an estimate, a plan),
where it came from, and the profiles to compare against.

Rows are read by key and defensively: a field another version of the advisor adds (an option, an
expert-parallel degree) is shown as it is, a field it lacks is left out, never an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from advisor.errors import AdvisorError

PLAN_SCHEMA = "megatron-4d-advisor/plan"


@dataclass(frozen=True, slots=True)
class ReportInput:
    """One report's data: ``kind`` sweep | estimate | plan, and the document of that kind."""

    kind: str
    rows: list[dict]
    """Sweep rows best first (an estimate: its one row; a plan: none)."""
    document: dict | None = None
    """The estimate or the plan itself."""
    question: str = ""
    """The command line that asked, or the file read."""
    profiles: tuple[Path, ...] = field(default_factory=tuple)


def classify(document: object, where: str) -> tuple[str, list[dict], dict | None]:
    """(kind, rows, document) of the JSON of 'advisor sweep --format json', one sweep row,
    'advisor estimate --format json' or 'advisor recommend -o'."""
    if isinstance(document, list):
        if not document:
            raise AdvisorError(f"{where}: the sweep holds no rows")
        if not all(isinstance(row, dict) and "tp" in row for row in document):
            raise AdvisorError(f"{where}: a sweep array must hold row objects (advisor sweep --format json)")
        return "sweep", document, None
    if isinstance(document, dict) and document.get("schema") == PLAN_SCHEMA:
        return "plan", [], document
    if isinstance(document, dict) and isinstance(document.get("stages"), list) and "tp" in document:
        return "estimate", [document], document
    if isinstance(document, dict) and "tp" in document and "pp" in document:
        return "sweep", [document], None
    raise AdvisorError(f"{where}: neither a sweep, a sweep row, an estimate nor a plan (expected the JSON of "
                       "'advisor sweep --format json', 'advisor estimate --format json' or 'advisor recommend -o')")


def read_input(path: Path, profiles: tuple[Path, ...] = ()) -> ReportInput:
    """A saved sweep, row, estimate or plan (``--from FILE``), through the bounded JSON reader."""
    from advisor.fileio import read_json

    kind, rows, document = classify(read_json(path, what="report input"), str(path))
    return ReportInput(kind=kind, rows=rows, document=document, question=f"--from {path}", profiles=profiles)


def number(row: dict, key: str) -> float | None:
    """A numeric field, or None where absent or not a number."""
    value = row.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def memory_share(row: dict) -> float | None:
    """The row's predicted memory over the GPU's: the calibrated usage where the model judged
    with it, else Eq. 18's total (``memory_fraction``)."""
    memory = number(row, "memory_gib")
    usage = number(row, "usage_gib")
    if usage is not None and memory:
        return usage / memory
    return number(row, "memory_fraction")
