"""The one reader of the published-run tables (``dense_runs.csv``, ``moe_runs.csv``): the exact
columns, the numeric ones typed, a bad row an error naming its line."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Iterator

from advisor.errors import AdvisorError


def typed_rows(path: Path, columns: tuple[str, ...], integers: tuple[str, ...] = (),
               floats: tuple[str, ...] = ()) -> Iterator[tuple[int, dict]]:
    """(line number, the row with ``integers`` as int and ``floats`` as float) for each row of
    ``path``, whose header must be ``columns`` exactly."""
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        if tuple(reader.fieldnames or ()) != columns:
            raise AdvisorError(f"{path}: columns must be {', '.join(columns)}; got {', '.join(reader.fieldnames or [])}")
        for line, row in enumerate(reader, start=2):
            try:
                yield line, {**row, **{key: int(row[key]) for key in integers},
                             **{key: float(row[key]) for key in floats}}
            except ValueError as exc:
                raise AdvisorError(f"{path}:{line}: {exc}") from None
