"""Which layout first: the fastest one expected to run, the leanest, or the paper's rule.

``rank_by``:
- ``throughput``: among the rows expected to run (``fits`` and ``likely fits``; with the paper's
  memory model ``fits`` and ``tight``), the highest predicted TFLOP/s per GPU first (for a given
  GPU count that is the shortest step); ties by the paper's rule. The rows within ``tolerance``
  of the fastest (a gain smaller than the time model orders right, ``advisor/calibration.json``'s
  ``ranking`` section) come first ordered by ``simplicity_key``: the simplest layout whose speed
  the model cannot tell from the fastest's.
- ``memory``: the most headroom first (lowest predicted usage).
- ``paper``: seed 004, Section 4.2's rule as ``advisor.paper_rule.ranking_key`` implements it.
Rows not expected to run are never ranked. Without ``--rank-by``: throughput with a GPU preset,
else the paper's rule (``default_rank_by``). The sweep judges its rows as it makes them, by
``judge_rows``' rules (``advisor.sweep._rows``), then ranks them (``rank_rows``).
"""

from __future__ import annotations

from typing import Callable, Literal, Sequence, TypeVar

from advisor.errors import AdvisorError
from advisor.paper_rule import DEFAULT_THRESHOLD, classify, ranking_key
from advisor.verdicts import EXPECTED_TO_RUN

RankBy = Literal["throughput", "memory", "paper"]
RANK_BY: tuple[RankBy, ...] = ("throughput", "memory", "paper")

Row = TypeVar("Row")


def expected_to_run(verdict: str | None) -> bool:
    return verdict in EXPECTED_TO_RUN


def simplicity_key(row) -> tuple:
    """Simpler first, for rows the time model cannot tell apart: fewer pipeline chunks (PP x VPP),
    no recomputation (then selective before full, fewer recomputed layers), smaller TP x CP x PP;
    then the levers of the row's options (``option_levers``): DDP before FSDP, no CPU offload,
    BF16 before FP8."""
    p, o = row.parallel, row.options
    return simplicity(pp=p.pp, vpp=p.vpp, recompute=o.recompute, recomputed_layers=row.recomputed_layers,
                      model_parallel=p.tp * p.cp * p.pp, **option_levers(o), ep=1)  # dense: no experts


def option_levers(options) -> dict:
    """``simplicity``'s fields that a run's estimator options (``advisor.memory.MemoryOptions``)
    decide: ``fsdp`` for Megatron-FSDP with any strategy (no_shard too: another data-parallel
    wrapper than DDP's) or torch FSDP2, ``offload`` for optimizer states in host memory, ``fp8``
    for FP8 GEMMs."""
    return {"fsdp": options.fsdp_strategy is not None, "offload": options.optimizer_host_fraction > 0,
            "fp8": options.fp8_format is not None}


def simplicity(*, pp: int, vpp: int, recompute: str, recomputed_layers: int, model_parallel: int, fsdp: bool,
               offload: bool, fp8: bool, ep: int) -> tuple:
    """``simplicity_key``'s order from the fields themselves (dense rows and MoE rows alike)."""
    return (pp * vpp, {"none": 0, "selective": 1}.get(recompute, 2), recomputed_layers, model_parallel, fsdp,
            offload, fp8, ep)


def order(
    rows: Sequence[Row],
    rank_by: RankBy,
    *,
    verdict: Callable[[Row], str | None],
    paper_key: Callable[[Row], tuple],
    tflops: Callable[[Row], float | None] = lambda row: None,
    usage_gib: Callable[[Row], float] = lambda row: 0.0,
    tolerance: float = 0.0,
    simplicity: Callable[[Row], tuple] | None = None,
) -> list[Row]:
    """The rows expected to run, best first. Accessors keep this independent of the row type.
    ``tolerance`` (throughput only): the rows predicted within this fraction of the fastest
    (``tflops >= (1 - tolerance) x fastest``) lead, ordered by ``simplicity`` (default
    ``paper_key``)."""
    if rank_by not in RANK_BY:
        raise AdvisorError(f"--rank-by must be one of {', '.join(RANK_BY)}, got {rank_by!r}")
    survivors = [row for row in rows if expected_to_run(verdict(row))]
    if rank_by == "paper":
        return sorted(survivors, key=paper_key)
    if rank_by == "memory":
        return sorted(survivors, key=lambda row: (usage_gib(row), paper_key(row)))
    if any(tflops(row) is None for row in survivors):
        raise AdvisorError("ranking by throughput needs a GPU preset (--gpu NAME) for the time model")
    fastest = sorted(survivors, key=lambda row: (-tflops(row), paper_key(row)))
    if not fastest or tolerance <= 0:
        return fastest
    floor = (1 - tolerance) * tflops(fastest[0])
    near = [row for row in fastest if tflops(row) >= floor]  # a prefix: sorted by speed
    simplicity = simplicity or paper_key
    return sorted(near, key=lambda row: (simplicity(row), -tflops(row), paper_key(row))) + fastest[len(near):]


# --- what the sweep calls ------------------------------------------------------------------

MemoryModel = Literal["paper", "calibrated", "profile"]
MEMORY_MODELS: tuple[MemoryModel, ...] = ("paper", "calibrated", "profile")
"""'profile': the calibrated model with measured activations (``advisor.profile_terms``)."""
SECONDS_PER_DAY = 86400.0


def ranking_tolerance() -> float:
    """The shipped tolerance of the throughput ranking (``advisor/calibration.json``)."""
    from advisor.throughput.calibration import load_ranking_tolerance

    return load_ranking_tolerance()["tolerance"]


def timing_fields(model, step, gpus, tp, tokens: float | None = None) -> list[dict]:
    """Per layout: ``step_time_s``, ``tflops_per_gpu``, ``mfu``, ``tokens_per_s`` and, for a token
    budget, ``budget_fields``."""
    import numpy as np

    numbers = model.throughput(step, gpus, tp)
    n = np.broadcast(*numbers.values()).shape
    # Python floats, a column at a time: a numpy scalar per row and field costs more than the row
    columns = [np.broadcast_to(np.asarray(v, dtype=float), n).reshape(-1).tolist() for v in numbers.values()]
    rows = [dict(zip(numbers, values)) for values in zip(*columns)]
    if tokens is not None:
        for row, gpu_count in zip(rows, np.broadcast_to(np.asarray(gpus, dtype=float), n).reshape(-1).tolist()):
            row.update(budget_fields(tokens, row["tokens_per_s"], gpu_count))
    return rows


def budget_fields(tokens: float, tokens_per_s: float, gpus: float) -> dict:
    """A token budget's keys of a timed row, dense or MoE: ``tokens`` (the budget, so that a
    launch can derive its schedule: ``launch.job.Schedule``), ``days`` (the budget at the row's
    ``tokens_per_s``) and ``gpu_hours`` (those days on all ``gpus``)."""
    seconds = tokens / tokens_per_s
    # a count of tokens: written whole (1T is 1000000000000, not 1000000000000.0 or CSV's 1e+12);
    # --tokens is whole (TokenCount); a fraction from elsewhere (a row file) is kept as given
    count = int(tokens) if float(tokens).is_integer() else float(tokens)
    return {"tokens": count, "days": seconds / SECONDS_PER_DAY, "gpu_hours": seconds / 3600.0 * gpus}


def cost_usd(gpu_hours: float, gpu_hour_price: float) -> float:
    """--gpu-hour-price's ``cost_usd`` of a row's ``gpu_hours`` (dense or MoE)."""
    return gpu_hours * gpu_hour_price


def check_memory_model(memory_model: str, measured) -> None:
    if memory_model not in MEMORY_MODELS:
        raise AdvisorError(f"--memory-model must be one of {', '.join(MEMORY_MODELS)}, got {memory_model!r}")
    if (memory_model == "profile") != (measured is not None):
        raise AdvisorError("--memory-model profile and --profile DIR go together")


def default_rank_by(timed: bool) -> RankBy:
    """The ranking asked for by no ``--rank-by``: the fastest first where the rows are timed (a
    GPU preset), else the paper's rule (nothing else orders rows by speed without a time model)."""
    return "throughput" if timed else "paper"


def judge_rows(rows, spec, workload, memory_gib: float, *, memory_model: MemoryModel = "paper",
               threshold: float = DEFAULT_THRESHOLD, memory_calibration=None, measured=None, assessments=None):
    """The sweep's rows with their verdicts and no rank: Eq. 18's 80% rule (``threshold``) with
    ``memory_model`` 'paper', else the calibrated model's ('profile': with the ``measured``
    activations). ``assessments``: the calibrated model's, one per row, already computed (the
    sweep does it for all rows at once, ``advisor.verdicts.assess_stages``); without them each
    row is assessed alone, with its own options (its recomputation)."""
    from dataclasses import replace

    from advisor.verdicts import assess

    check_memory_model(memory_model, measured)
    if assessments is None and memory_model != "paper":
        assessments = [assess(row.estimate, spec, workload.seq_len, row.parallel.mbs, row.parallel.tp,
                              row.parallel.cp, memory_gib, row.options, memory_calibration, measured) for row in rows]
    if assessments is None:
        return [replace(row, verdict=classify(row.estimate.total_gib, memory_gib, threshold), rank=None)
                for row in rows]
    return [replace(row, verdict=a.verdict, assessment=a, rank=None) for row, a in zip(rows, assessments)]


def rank_rows(rows, rank_by: RankBy):
    """Judged rows (``judge_rows``) in ``order``'s order, ranked from 1 (throughput: by each row's
    timing, with the shipped tolerance), then the rows not expected to run, least memory first
    (the memory their verdict judged)."""
    from dataclasses import replace

    ranked = order(
        rows, rank_by, verdict=lambda r: r.verdict, paper_key=ranking_key,
        tflops=lambda r: r.timing["tflops_per_gpu"] if r.timing else None, usage_gib=lambda r: r.judged_gib,
        tolerance=ranking_tolerance() if rank_by == "throughput" else 0.0, simplicity=simplicity_key,
    )
    ranked = [replace(r, rank=i) for i, r in enumerate(ranked, start=1)]
    chosen = {id(r.parallel) for r in ranked}  # replace keeps each row's ParallelConfig
    rest = sorted((r for r in rows if id(r.parallel) not in chosen), key=lambda r: r.judged_gib)
    return ranked + rest
