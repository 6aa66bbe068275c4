"""Why Table 11 (H100, sequence 32,768) runs at its speed: the data loader, not the GPUs.

Step time from the logged TFLOP/s: T = F / (N x TFLOP/s), F the fork's FLOPs per iteration.
If the GPUs set the pace, T x DP (the time one data-parallel replica needs for the whole global
batch) would halve when a replica has twice the GPUs. It does not: at 32K, T x DP is the same
for replicas of 4 GPUs (TP x CP x PP = 4) and of 8, at every DP. What a replica cannot split is
its data loader: the authors run with --reset-position-ids --reset-attention-mask (their
scripts, okoge-kaz/Megatron-LM scripts/tsubame/Llama-3.1-8B/*.sh), so Megatron's GPTDataset
cannot cache the attention mask and builds an s x s FP32 matrix per sample on the CPU
(``_get_ltor_masks_and_position_ids``): 4 GiB at 32K, four times 16K's. The replica waits for
its samples. The 16K MP = 8 rows of Table 10 sit on the same bound, a quarter as high.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean

from advisor.hardware import get_gpu
from advisor.throughput import TimeModel
from advisor.throughput.terms import Rates, host_mask_time
from tables.seed004 import timing
from advisor.models import load_model


@dataclass(frozen=True, slots=True)
class ReplicaRow:
    table: int
    seq_len: int
    dp: int
    model_parallel: int
    replica_seconds: float
    """Mean T x DP of the layouts with this (DP, TP x CP x PP), seconds."""
    layouts: int


def replica_rows(measured_tables) -> list[ReplicaRow]:
    """T x DP per (table, DP, model-parallel size), for Tables 10 and 11."""
    groups: dict[tuple, list[float]] = {}
    for table in measured_tables:
        if table.paper.number not in (10, 11):
            continue
        tm = TimeModel(load_model(table.paper.model), get_gpu(timing.PAPER_GPUS[table.paper.gpu]),
                       table.paper.seq_len, timing.PAPER_GLOBAL_BATCH, options=timing.PAPER_OPTIONS)
        flops = float(tm.flops_per_iteration())
        for run in table.runs:
            if run.outcome != "ran":
                continue
            tp, cp, pp, _ = run.paper.layout
            dp = run.paper.gpus // (tp * cp * pp)
            seconds = flops / (run.paper.gpus * run.tflops * 1e12)
            groups.setdefault((table.paper.number, table.paper.seq_len, dp, tp * cp * pp), []).append(seconds * dp)
    return [ReplicaRow(t, s, dp, mp, fmean(v), len(v)) for (t, s, dp, mp), v in sorted(groups.items())]


def seconds_per_sample(rows: list[ReplicaRow], table: int, dp: int = 1) -> float | None:
    """A data-bound replica's seconds per sample: T x DP / global batch at DP (MP = 8 rows)."""
    values = [r.replica_seconds for r in rows if r.table == table and r.dp == dp and r.model_parallel == 8]
    return fmean(values) / timing.PAPER_GLOBAL_BATCH if values else None


def predicted_seconds_per_sample(seq_len: int, calibration) -> float:
    """The time model's host term for the paper's H100 node (DDR5-4800, 2 loader workers)."""
    rates = Rates.of(get_gpu("h100-94gb"), calibration)
    return host_mask_time(seq_len, rates)


def markdown(rows: list[ReplicaRow], calibration) -> list[str]:
    lines = [
        "| table | sequence | DP | replica of 4 GPUs: T x DP (s) | replica of 8 GPUs: T x DP (s) |",
        "|---:|---:|---:|---:|---:|",
    ]
    keys = sorted({(r.table, r.seq_len, r.dp) for r in rows})
    for table, seq, dp in keys:
        cells = []
        for mp in (4, 8):
            match = [r for r in rows if (r.table, r.seq_len, r.dp, r.model_parallel) == (table, seq, dp, mp)]
            cells.append(f"{match[0].replica_seconds:,.0f} ({match[0].layouts})" if match else "-")
        if cells != ["-", "-"]:
            lines.append(f"| {table} | {seq:,} | {dp} | {cells[0]} | {cells[1]} |")
    s32, s16 = seconds_per_sample(rows, 11), seconds_per_sample(rows, 10)
    p32, p16 = predicted_seconds_per_sample(32768, calibration), predicted_seconds_per_sample(16384, calibration)
    lines += [
        "",
        f"(In brackets: how many layouts the mean is over.) A replica of 8 GPUs needs as long as one of 4: "
        f"{s32:.2f} s per sample at 32K and {s16:.2f} s at 16K (DP = 1, MP = 8), a ratio of {s32 / s16:.1f} "
        f"where the mask's s^2 gives 4. The time model's data-loader term for this node, with the constant "
        f"fitted on all runs, gives {p32:.2f} s and {p16:.2f} s.",
    ]
    return lines
