"""Enumerate every valid (TP, CP, PP, MBS) for a GPU count, classify each, and rank them.

Verdicts (seed 004, Section 4.1): ``fits`` at most threshold x memory (80%: no run OOMed
there), ``tight`` above it and up to the memory, ``oom`` above the memory.

Ranking (seed 004, Section 4.2: "the parallel configurations that achieve high TFLOP/s are
those with the minimal combination of TP x CP x PP that does not result in out-of-memory",
and a larger micro-batch size raised throughput in every such case):

1. ``fits`` before ``tight``; ``oom`` rows are not ranked;
2. the smallest TP x CP x PP;
3. the larger MBS;
4. the smaller TP (the paper found TP+CP and TP+PP slightly faster than TP alone);
5. the smaller PP (fewer pipeline bubbles, Section 4.2.1), then the lower peak memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Literal

from advisor.errors import AdvisorError
from advisor.memory import MemoryEstimate, MemoryOptions, check_layout, estimate_memory
from advisor.models import LlamaSpec
from advisor.parallel import DEFAULT_GPUS_PER_NODE, ParallelConfig, Workload

Verdict = Literal["fits", "tight", "oom"]
"""The paper's verdicts; the calibrated memory model's are ``advisor.verdicts.CalibratedVerdict``."""
DEFAULT_THRESHOLD = 0.8


def classify(total_gib: float, memory_gib: float, threshold: float = DEFAULT_THRESHOLD) -> Verdict:
    if total_gib <= threshold * memory_gib:
        return "fits"
    if total_gib <= memory_gib:
        return "tight"
    return "oom"


@dataclass(frozen=True, slots=True)
class SweepRow:
    """One configuration of a sweep: its layout, its memory estimate, verdict and rank."""

    parallel: ParallelConfig
    num_microbatches: int | None
    estimate: MemoryEstimate
    memory_gib: float | None
    """The GPU's memory; None for an estimate made without one."""
    verdict: str | None
    """fits | tight | oom (Eq. 18, the 80% rule), or fits | likely fits | likely oom | oom
    (the calibrated model, ``advisor.verdicts``)."""
    rank: int | None = None
    assessment: object | None = None
    """The calibrated model's ``advisor.verdicts.Assessment`` (usage and margin), if it judged."""
    timing: dict | None = None
    """Predicted step time, TFLOP/s per GPU, MFU, tokens/s (``advisor.ranking.timing_fields``)."""

    @property
    def memory_fraction(self) -> float | None:
        return None if self.memory_gib is None else self.estimate.total_gib / self.memory_gib

    def to_dict(self) -> dict:
        p = self.parallel
        return {
            "rank": self.rank,
            "tp": p.tp,
            "cp": p.cp,
            "pp": p.pp,
            "mbs": p.mbs,
            "dp": p.dp,
            "gpus": p.gpus,
            "num_microbatches": self.num_microbatches,
            "total_gib": self.estimate.total_gib,
            "model_states_gib": self.estimate.model_states_gib,
            "activations_gib": self.estimate.activations_gib,
            "peak_stage": self.estimate.peak.stage,
            "memory_fraction": self.memory_fraction,
            "verdict": self.verdict,
            **(self.assessment.to_dict() if self.assessment is not None else {}),
            **(self.timing or {}),
        }


def _powers_of_two(limit: int) -> Iterator[int]:
    n = 1
    while n <= limit:
        yield n
        n *= 2


def candidate_layouts(
    spec: LlamaSpec, workload: Workload, gpus: int, max_tp: int = DEFAULT_GPUS_PER_NODE
) -> Iterator[ParallelConfig]:
    """Every layout Megatron can run on ``gpus`` GPUs: TP and CP powers of 2, PP a divisor of
    L, DP = gpus / (TP x CP x PP), MBS a power of 2 with gbs divisible by MBS x DP."""
    max_mbs = workload.global_batch_size or workload.seq_len  # without a gbs, any MBS is allowed
    for tp in _powers_of_two(min(max_tp, gpus)):
        for cp in _powers_of_two(gpus // tp):
            for pp in (n for n in range(1, spec.num_layers + 1) if spec.num_layers % n == 0):
                if gpus % (tp * cp * pp):
                    continue
                dp = gpus // (tp * cp * pp)
                for mbs in _powers_of_two(max_mbs // dp):
                    parallel = ParallelConfig(tp=tp, cp=cp, pp=pp, dp=dp, mbs=mbs)
                    try:
                        check_layout(spec, parallel, workload)
                    except AdvisorError:
                        continue
                    yield parallel


def ranking_key(row: SweepRow) -> tuple:
    p = row.parallel
    return (row.verdict != "fits", p.model_parallel_size, -p.mbs, p.tp, p.pp, row.estimate.total_gib, p.cp)


def sweep(
    spec: LlamaSpec,
    workload: Workload,
    gpus: int,
    memory_gib: float,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    max_tp: int = DEFAULT_GPUS_PER_NODE,
    options: MemoryOptions = MemoryOptions(),
    gpu=None,
    memory_model: str = "paper",
    rank_by: str | None = None,
    time_options=None,
    tokens: float | None = None,
    measured=None,
) -> list[SweepRow]:
    """All valid layouts, ranked ones first in rank order, then the others by memory.

    With a GPU preset (``gpu``, an ``advisor.hardware.GpuSpec``) every row also gets the time
    model's prediction; verdicts and ranking come from ``advisor.ranking.assess_rows``
    (``memory_model`` 'paper': Eq. 18 and the 80% rule, 'calibrated', or 'profile' with
    ``measured`` activations, ``advisor.profile_terms``; ``rank_by`` throughput | memory | paper)."""
    if gpus < 1:
        raise AdvisorError(f"the GPU count must be positive, got {gpus}")
    if not memory_gib > 0:
        raise AdvisorError(f"GPU memory must be positive, got {memory_gib} GiB")
    if not 0 < threshold <= 1:
        raise AdvisorError(f"the threshold must be in (0, 1], got {threshold}")
    rows = []
    for parallel in candidate_layouts(spec, workload, gpus, max_tp):
        if parallel.cp > 1 and not options.flash_attention:  # CP runs inside fused attention only
            continue
        estimate = estimate_memory(spec, parallel, workload, options)
        rows.append(
            SweepRow(
                parallel=parallel,
                num_microbatches=workload.num_microbatches(parallel),
                estimate=estimate,
                memory_gib=memory_gib,
                verdict=classify(estimate.total_gib, memory_gib, threshold),
            )
        )
    if not rows:
        raise AdvisorError(
            f"no valid (TP, CP, PP, MBS) for {gpus} GPUs with {spec.name}: DP = GPUs / (TP x CP x PP) "
            f"must be whole, PP must divide {spec.num_layers} layers, TP (at most {max_tp}) must divide "
            f"{spec.num_attention_heads} heads and {spec.num_query_groups} KV heads, and the global "
            f"batch {workload.global_batch_size} must be divisible by MBS x DP"
        )
    from advisor.ranking import assess_rows

    return assess_rows(rows, spec, workload, memory_gib, gpu=gpu, memory_model=memory_model, rank_by=rank_by,
                       options=options, time_options=time_options, tokens=tokens, threshold=threshold,
                       measured=measured)
