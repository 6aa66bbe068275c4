"""Seed 004's Tables 2-11 as data: the cells, their layout, and the listed misprints.

The cells come from ``tables/data/seed004_tables.csv`` (one row per cell, in the paper's
order). Table numbers, GPU memories and the pairing of each measured table with the
estimate that colours it are from seed 004, Section 4 and Appendix A.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from advisor.errors import AdvisorError

DATA = Path(__file__).resolve().parent.parent / "data"
TABLES_CSV = DATA / "seed004_tables.csv"
MISPRINTS_CSV = DATA / "seed004_misprints.csv"

GPU_MEMORY_GIB = {"A100-40GB": 40, "H100-94GB": 94}
"""The memory the paper's colours are relative to (captions of Tables 2-11)."""

ESTIMATE_OF = {3: 2, 4: 7, 6: 5, 10: 8, 11: 9}
"""Measured table -> the estimated table whose colours it carries (same GPU, model, sequence)."""

MODEL_TITLES = {"llama3.1-8b": "Llama-3.1-8B", "llama3.1-70b": "Llama-3.1-70B"}

Layout = tuple[int, int, int, int]
"""(TP, CP, PP, MBS), the row label of every table."""
Kind = Literal["estimate", "measured_tflops"]


@dataclass(frozen=True, kw_only=True, slots=True)
class PaperCell:
    """One printed cell. ``text`` is the paper's own printing ('27.2', 'OOM')."""

    layout: Layout
    gpus: int
    text: str

    @property
    def value(self) -> float | None:
        """GiB (estimate) or TFLOP/s (measured); None for OOM."""
        return None if self.oom else float(self.text)

    @property
    def oom(self) -> bool:
        return self.text == "OOM"


@dataclass(frozen=True, kw_only=True, slots=True)
class PaperTable:
    """One of Tables 2-11: rows (TP, CP, PP, MBS) in the paper's order, GPU counts as columns."""

    number: int
    kind: Kind
    gpu: str
    model: str
    seq_len: int
    layouts: tuple[Layout, ...]
    gpu_counts: tuple[int, ...]
    cells: tuple[PaperCell, ...]
    """The printed cells; a '-' (no such run) is absent."""

    @property
    def grid_cells(self) -> int:
        """Rows x columns: the printed cells and the '-' ones."""
        return len(self.layouts) * len(self.gpu_counts)

    @property
    def memory_gib(self) -> int:
        return GPU_MEMORY_GIB[self.gpu]

    @property
    def setup(self) -> str:
        return f"Table {self.number}: {MODEL_TITLES.get(self.model, self.model)}, {self.gpu}, sequence {self.seq_len:,}"

    @property
    def title(self) -> str:
        what = "estimated GiB per GPU" if self.kind == "estimate" else "measured TFLOP/s per GPU"
        return f"{self.setup}, {what}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Misprint:
    """A printed estimate that disagrees with the paper's own equations, with the evidence."""

    table: int
    layout: Layout
    gpus: int
    printed: float
    evidence: str

    @property
    def key(self) -> tuple[int, Layout, int]:
        return (self.table, self.layout, self.gpus)


def _layout(row: dict) -> Layout:
    return tuple(int(row[k]) for k in ("tp", "cp", "pp", "mbs"))  # type: ignore[return-value]


def _unique(values) -> tuple:
    return tuple(dict.fromkeys(values))


def load_tables(path: Path = TABLES_CSV) -> dict[int, PaperTable]:
    """Every table of the CSV by number, rows and columns in the order the paper prints them."""
    by_table: dict[int, list[dict]] = {}
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            by_table.setdefault(int(row["table"]), []).append(row)
    tables = {}
    for number, rows in by_table.items():
        setups = {(r["kind"], r["gpu"], r["model"], r["seq_len"]) for r in rows}
        if len(setups) != 1:
            raise AdvisorError(f"{path}: table {number} mixes setups {sorted(setups)}")
        ((kind, gpu, model, seq_len),) = setups
        keys = {(_layout(r), r["gpus"]) for r in rows}
        layouts, gpu_counts = _unique(_layout(r) for r in rows), _unique(int(r["gpus"]) for r in rows)
        if len(keys) != len(rows) or len(rows) != len(layouts) * len(gpu_counts):
            raise AdvisorError(f"{path}: table {number} is not a full grid of (TP, CP, PP, MBS) x GPUs")
        if gpu not in GPU_MEMORY_GIB:
            raise AdvisorError(f"{path}: table {number} has an unknown GPU {gpu!r}")
        tables[number] = PaperTable(
            number=number,
            kind=kind,
            gpu=gpu,
            model=model,
            seq_len=int(seq_len),
            layouts=layouts,
            gpu_counts=gpu_counts,
            cells=tuple(
                PaperCell(layout=_layout(r), gpus=int(r["gpus"]), text=r["value"]) for r in rows if r["value"] != "-"
            ),
        )
    return dict(sorted(tables.items()))


def load_misprints(path: Path = MISPRINTS_CSV) -> dict[tuple[int, Layout, int], Misprint]:
    """The listed misprints, keyed by (table, layout, GPUs)."""
    with open(path, newline="") as handle:
        misprints = [
            Misprint(
                table=int(r["table"]), layout=_layout(r), gpus=int(r["gpus"]),
                printed=float(r["printed"]), evidence=r["evidence"],
            )
            for r in csv.DictReader(handle)
        ]
    return {m.key: m for m in misprints}
