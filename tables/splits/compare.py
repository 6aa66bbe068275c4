"""The splits of each case, priced: peak memory per GPU, the period (the slowest stage's forward
+ backward per microbatch) and the predicted step of the iteration."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from advisor.capture.layout import even_split
from advisor.capture.search import plan_megatron
from advisor.errors import AdvisorError
from advisor.hardware import get_gpu
from advisor.madpipe import analytic_tables, plan_fastest
from advisor.memory import GIB, MemoryOptions
from advisor.stage_model import StageModel
from advisor.models import PRESETS
from advisor.rank_times import Timing
from advisor.throughput import TimeModel

GPU = "h100-80gb"
SEQ_LEN = 8192
THRESHOLD = 0.8
"""Seed 004's rule: a stage fits within 80% of the GPU's memory."""


@dataclass(frozen=True, slots=True)
class Case:
    model: str
    gpus: int
    tp: int
    pp: int
    gbs: int
    mbs: int = 1

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp)

    @property
    def microbatches(self) -> int:
        return self.gbs // (self.mbs * self.dp)

    @property
    def label(self) -> str:
        return f"{self.model}, {self.gpus} GPUs: TP {self.tp}, PP {self.pp}, DP {self.dp}, {self.microbatches} microbatches"


CASES = (
    Case("llama3.1-8b", 64, 1, 4, 1024),
    Case("llama3.1-8b", 48, 2, 3, 1024),
    Case("llama3.1-70b", 512, 8, 8, 1024),
    Case("llama3.1-70b", 576, 8, 9, 1024),
    Case("llama3.1-405b", 2048, 8, 16, 2048),
    Case("llama3.1-405b", 16384, 8, 16, 2048),  # Llama 3's own layout (Dubey et al. 2024)
)


def megatron_split(layers: int, pp: int, embedding: bool, loss: bool) -> tuple[int, ...] | None:
    """Megatron-LM's split with --account-for-embedding-in-pipeline-split and/or
    --account-for-loss-in-pipeline-split: the embedding and/or the loss count as one layer each, the
    total divides evenly over PP (else Megatron refuses it: None), and the first/last stage gives
    up one decoder layer for it (megatron/core/transformer/transformer_block.py)."""
    total = layers + embedding + loss
    if total % pp:
        return None
    share = total // pp
    counts = [share] * pp
    counts[0] -= embedding
    counts[-1] -= loss
    return tuple(counts) if min(counts) > 0 else None


@dataclass(frozen=True, slots=True)
class Priced:
    name: str
    layers_per_stage: tuple[int, ...] | None
    stage_gib: tuple[float, ...] = ()
    stage_ms: tuple[float, ...] = ()
    step_s: float | None = None

    @property
    def peak_gib(self) -> float | None:
        return max(self.stage_gib) if self.stage_gib else None

    @property
    def period_ms(self) -> float | None:
        return max(self.stage_ms) if self.stage_ms else None


def price(case: Case) -> tuple[list[Priced], float]:
    """Each split of ``case`` priced, and the memory limit (bytes) the time-optimal one keeps to."""
    spec = PRESETS[case.model]
    gpu = get_gpu(GPU)
    options = MemoryOptions()
    timing = Timing(TimeModel(spec, gpu, SEQ_LEN, case.gbs), gpu.gpus_per_node)
    memory, time = analytic_tables(spec, SEQ_LEN, options, tp=case.tp, cp=1, dp=case.dp, mbs=case.mbs, pp=case.pp,
                                   num_microbatches=case.microbatches, timing=timing)
    limit = THRESHOLD * gpu.memory_gib * GIB
    layers = spec.num_layers
    splits = {
        "even" if layers % case.pp == 0 else "evenest (layout)": tuple(even_split(layers, case.pp)),
        "account for embedding": megatron_split(layers, case.pp, True, False),
        "account for loss": megatron_split(layers, case.pp, False, True),
        "account for both": megatron_split(layers, case.pp, True, True),
        "memory-optimal": plan_megatron(memory, case.pp).units_per_stage,
    }
    try:
        splits["time-optimal (MadPipe)"] = plan_fastest(time, memory, case.pp, limit)[0].units_per_stage
    except AdvisorError:  # no split fits within the limit
        splits["time-optimal (MadPipe)"] = None
    layouts = timing.layouts(tp=np.array([case.tp]), cp=np.array([1]), dp=np.array([case.dp]),
                             mbs=np.array([case.mbs]), pp=np.array([case.pp]), selective=False)
    model = StageModel(spec, SEQ_LEN, options, tp=case.tp, cp=1, dp=case.dp, mbs=case.mbs, pp=case.pp, vpp=1,
                       num_microbatches=case.microbatches, stage=np.arange(case.pp)[None, :])
    priced = []
    for name, counts in splits.items():
        if counts is None:
            priced.append(Priced(name, None))
            continue
        bounds = np.concatenate([[0], np.cumsum(counts)])
        spans = [(int(bounds[i]) + 1, int(bounds[i + 1]), case.pp - i) for i in range(case.pp)]
        row = np.array([counts])
        step = layouts.step(np.array([0]), np.array([1]), np.array([0]), row, model.parameters(row).max(axis=1)).total_s
        priced.append(Priced(name, tuple(counts), tuple(memory.cost(*span) / GIB for span in spans),
                             tuple(time.cost(*span) * 1e3 for span in spans), float(step[0])))
    return priced, limit
