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
Rows not expected to run are never ranked.
"""

from __future__ import annotations

from typing import Callable, Literal, Sequence, TypeVar

from advisor.errors import AdvisorError
from advisor.paper_rule import classify, ranking_key
from advisor.verdicts import EXPECTED_TO_RUN

RankBy = Literal["throughput", "memory", "paper"]
RANK_BY: tuple[RankBy, ...] = ("throughput", "memory", "paper")

Row = TypeVar("Row")


def expected_to_run(verdict: str | None) -> bool:
    return verdict in EXPECTED_TO_RUN


def simplicity_key(row) -> tuple:
    """Simpler first, for rows the time model cannot tell apart: fewer pipeline chunks (PP x VPP),
    no recomputation (then selective before full, fewer recomputed layers), smaller TP x CP x PP;
    then, where a row has them (training options, MoE), the distributed optimizer before FSDP
    sharding, no CPU offload, BF16 before FP8, smaller EP. Absent fields take the simple value."""
    p, o = row.parallel, row.options
    sharding = getattr(o, "data_parallel_sharding_strategy", "no_shard") or "no_shard"
    return simplicity(pp=p.pp, vpp=p.vpp, recompute=getattr(o, "recompute", "none"),
                      recomputed_layers=getattr(row, "recomputed_layers", 0), model_parallel=p.tp * p.cp * p.pp,
                      fsdp=bool(getattr(o, "use_megatron_fsdp", False)) or sharding != "no_shard",
                      offload=bool(getattr(o, "optimizer_cpu_offload", False)),
                      fp8=getattr(o, "fp8_format", None) is not None, ep=getattr(p, "ep", 1))


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
    budget, ``days`` and ``gpu_hours``."""
    import numpy as np

    numbers = model.throughput(step, gpus, tp)
    n = np.broadcast(*numbers.values()).shape
    columns = {k: np.broadcast_to(v, n) for k, v in numbers.items()}
    gpus = np.broadcast_to(np.asarray(gpus, dtype=float), n)
    rows = []
    for i in range(n[0] if n else 1):
        row = {k: float(v[i] if n else v) for k, v in columns.items()}
        if tokens is not None:
            seconds = tokens / row["tokens_per_s"]
            row["tokens"] = float(tokens)  # the budget, so that a launch can derive its schedule
            row["days"] = seconds / SECONDS_PER_DAY
            row["gpu_hours"] = seconds / 3600.0 * float(gpus[i] if n else gpus)
        rows.append(row)
    return rows


def check_memory_model(memory_model: str, measured) -> None:
    if memory_model not in MEMORY_MODELS:
        raise AdvisorError(f"--memory-model must be one of {', '.join(MEMORY_MODELS)}, got {memory_model!r}")
    if (memory_model == "profile") != (measured is not None):
        raise AdvisorError("--memory-model profile and --profile DIR go together")


def assess_rows(rows, spec, workload, memory_gib: float, *, gpu=None, memory_model: MemoryModel = "paper",
                rank_by: RankBy | None = None, options=None, time_options=None, tokens: float | None = None,
                threshold: float = 0.8, memory_calibration=None, calibration=None, measured=None,
                assessments=None, tolerance: float | None = None):
    """The sweep's rows with verdicts (Eq. 18's 80% rule, or the calibrated model), predicted
    time where a GPU preset is given, and ranks in ``rank_by`` order (default: throughput with a
    preset, the paper's rule without). Returns the ranked rows first, then the unranked.
    ``assessments``: the calibrated model's, one per row, already computed (the sweep does it for
    all rows at once, ``advisor.verdicts.assess_stages``). ``tolerance``: the throughput ranking's
    (default: the shipped one, ``load_ranking_tolerance``)."""
    from dataclasses import replace

    import numpy as np

    from advisor.memory import MemoryOptions
    from advisor.throughput import TimeModel, TimeOptions
    from advisor.verdicts import assess

    check_memory_model(memory_model, measured)
    rank_by = rank_by or ("throughput" if gpu is not None else "paper")
    options = options or MemoryOptions()
    out = []
    for i, row in enumerate(rows):
        p = row.parallel
        if assessments is not None:
            out.append(replace(row, verdict=assessments[i].verdict, assessment=assessments[i], rank=None))
        elif memory_model in ("calibrated", "profile"):
            row_options = getattr(row, "options", None) or options  # a sweep row carries its own recomputation
            a = assess(row.estimate, spec, workload.seq_len, p.mbs, p.tp, p.cp, memory_gib, row_options,
                       memory_calibration, measured)
            out.append(replace(row, verdict=a.verdict, assessment=a, rank=None))
        else:
            out.append(replace(row, verdict=classify(row.estimate.total_gib, memory_gib, threshold), rank=None))
    if gpu is not None and out:
        if workload.global_batch_size is None:
            raise AdvisorError("predicting time needs a global batch size (--gbs)")
        model = TimeModel(spec, gpu, workload.seq_len, workload.global_batch_size, calibration,
                          time_options or TimeOptions())
        arrays = {k: np.array([getattr(r.parallel, k) for r in out]) for k in ("tp", "cp", "pp", "dp", "mbs", "vpp")}
        recompute = options.recompute if options.recompute in ("none", "selective", "full") else "none"
        step = model.step(arrays["tp"], arrays["cp"], arrays["pp"], arrays["dp"], arrays["mbs"], arrays["vpp"],
                          recompute=recompute)
        gpus = arrays["tp"] * arrays["cp"] * arrays["pp"] * arrays["dp"]
        fields = timing_fields(model, step, gpus, arrays["tp"], tokens)
        out = [replace(r, timing=f) for r, f in zip(out, fields)]
    ranked = order(
        out, rank_by, verdict=lambda r: r.verdict, paper_key=ranking_key,
        tflops=lambda r: r.timing["tflops_per_gpu"] if r.timing else None,
        usage_gib=lambda r: r.judged_gib,
        tolerance=ranking_tolerance() if tolerance is None else tolerance, simplicity=simplicity_key,
    )
    ranked = [replace(r, rank=i) for i, r in enumerate(ranked, start=1)]
    chosen = {id(r.parallel) for r in ranked}
    rest = sorted((r for r in out if id(r.parallel) not in chosen),
                  key=lambda r: r.judged_gib)
    return ranked + rest
