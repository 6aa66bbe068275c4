"""Every launchable layout for a GPU count, classified and ranked: one row per (TP, CP, PP, DP,
MBS) with its split, interleaving and recomputation (``advisor.space_search``).

Verdicts (seed 004, Section 4.1): ``fits`` at most threshold x memory (80%: no run OOMed
there), ``tight`` above it and up to the memory, ``oom`` above the memory.

Ranking without a time model (seed 004, Section 4.2: "the parallel configurations that achieve
high TFLOP/s are those with the minimal combination of TP x CP x PP that does not result in
out-of-memory", and a larger micro-batch size raised throughput in every such case):

1. ``fits`` before ``tight``; ``oom`` rows are not ranked;
2. no recomputation before recomputation (it costs a forward pass of what it recomputes);
3. the smallest TP x CP x PP;
4. the larger MBS;
5. the smaller TP (the paper found TP+CP and TP+PP slightly faster than TP alone);
6. the smaller PP (fewer pipeline bubbles, Section 4.2.1), then fewer recomputed layers, then
   the lower peak memory.

With a GPU preset (``gpu``: the time model), ``advisor.ranking`` orders the rows, by default
the highest predicted throughput first; ``memory_model="calibrated"`` judges them by the
calibrated memory model (``advisor.verdicts``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from advisor.errors import AdvisorError
from advisor.memory import MemoryEstimate, MemoryOptions
from advisor.stage_model import StageTerms
from advisor.models import LlamaSpec
from advisor.options import TrainingOptions
from advisor.paper_rule import DEFAULT_THRESHOLD, classify
from advisor.parallel import DEFAULT_GPUS_PER_NODE, ParallelConfig, Workload, check_whole_nodes

if TYPE_CHECKING:
    from advisor.rank_times import Timing
    from advisor.space import SpaceOptions

@dataclass(frozen=True, slots=True)
class SweepRow:
    """One layout: its parallel sizes, split, interleaving and recomputation (``options``), its
    memory estimate, verdict and rank, and, with a time model, its predicted step."""

    parallel: ParallelConfig
    num_microbatches: int | None
    estimate: MemoryEstimate
    memory_gib: float | None
    """The GPU's memory; None for an estimate made without one."""
    verdict: str | None
    """fits | tight | oom (Eq. 18, the 80% rule), or fits | likely fits | likely oom | oom
    (the calibrated model, ``advisor.verdicts``)."""
    rank: int | None = None
    options: MemoryOptions = MemoryOptions()
    """The estimator's options of this row, its recomputation included."""
    assessment: object | None = None
    """The calibrated model's ``advisor.verdicts.Assessment`` (usage and margin), if it judged."""
    timing: dict | None = None
    """Predicted step time, TFLOP/s per GPU, MFU, tokens/s (``advisor.ranking.timing_fields``)."""
    training: TrainingOptions = TrainingOptions()
    """The training options this row was priced with (its recomputation included): what its
    Megatron-LM flags state (``advisor.options``)."""

    @property
    def memory_fraction(self) -> float | None:
        return None if self.memory_gib is None else self.estimate.total_gib / self.memory_gib

    @property
    def judged_gib(self) -> float:
        """The memory its verdict judged: the calibrated model's usage where that model judged,
        else Eq. 18's total."""
        return self.assessment.usage_gib if self.assessment else self.estimate.total_gib

    @property
    def layers_per_stage(self) -> tuple[int, ...]:
        return self.estimate.layers

    @property
    def recomputed_layers(self) -> int:
        """N of full recomputation (0 without it)."""
        return self.options.recompute_num_layers if self.options.recompute == "full" else 0

    def to_dict(self) -> dict:
        p, options = self.parallel, self.options
        peak = self.estimate.peak
        total = peak.total_bytes / 2**30
        full = options.recompute == "full"
        return {
            "rank": self.rank,
            "tp": p.tp,
            "cp": p.cp,
            "pp": p.pp,
            "mbs": p.mbs,
            "dp": p.dp,
            "ep": 1,  # dense: no experts (advisor.moe's rows carry their EP and ETP)
            "etp": 1,
            "gpus": p.gpus,
            "vpp": p.vpp,
            "layers_per_stage": list(self.layers_per_stage),
            "recompute": options.recompute,
            "recompute_method": options.recompute_method if full else None,
            "recompute_num_layers": options.recompute_num_layers if full else None,
            "num_microbatches": self.num_microbatches,
            "total_gib": total,
            "model_states_gib": peak.model_states_bytes / 2**30,
            "activations_gib": peak.activations_bytes / 2**30,
            "peak_stage": peak.stage,
            "memory_fraction": None if self.memory_gib is None else total / self.memory_gib,
            "verdict": self.verdict,
            **(self.assessment.to_dict() if self.assessment is not None else {}),
            **(self.timing or {}),
        }


@dataclass(frozen=True, slots=True)
class Sweep:
    """The rows, ranked ones first in rank order, then the oom ones by memory; and how much of the
    space the search considered and pruned (``advisor.space_search``)."""

    rows: list[SweepRow]
    considered: int
    """Layout variants in the space: (TP, CP, PP, DP, MBS) x VPP x recomputation."""
    evaluated: int
    """Variants priced; the others were pruned as unable to fit or to win."""
    escalation: str | None = None
    """The lever the rows use because nothing fit without it (``advisor.escalation``), or None."""
    ladder: tuple = ()
    """The rungs of ``advisor.escalation.LADDER`` climbed in vain, each (label, why it was not
    swept; None: swept, and nothing ran): the nothing-fits line's words (``sweep_table.ladder_text``)."""

    @property
    def pruned(self) -> int:
        return self.considered - self.evaluated


def _row_options(options: TrainingOptions, recompute: str, method: str, layers: int) -> TrainingOptions:
    if recompute == "none":  # --recompute-modules belong to the selective rows alone
        return options.with_(recompute="none", recompute_method="uniform", recompute_num_layers=1,
                             recompute_modules=None)
    if recompute == "selective":
        return options.with_(recompute="selective", recompute_method="uniform", recompute_num_layers=1)
    return options.with_(recompute="full", recompute_method=method, recompute_num_layers=int(layers),
                         recompute_modules=None)


def _check_inputs(spec: LlamaSpec, workload: Workload, gpus: int, memory_gib: float, *, threshold: float,
                  memory_model: str, measured, whole_node: int, max_tp: int, space: SpaceOptions,
                  release) -> SpaceOptions:
    """One line (AdvisorError) for a sweep that cannot be asked, before anything is priced (pinned
    degrees no layout can have: ``Pinned.problem``); else the space the search takes
    (``_chunk_multiple``)."""
    from advisor.ranking import check_memory_model

    if gpus < 1:
        raise AdvisorError(f"the GPU count must be positive, got {gpus}")
    if not memory_gib > 0 or math.isinf(memory_gib):
        raise AdvisorError(f"GPU memory must be a positive number of GiB, got {memory_gib}")
    if not 0 < threshold <= 1:
        raise AdvisorError(f"the threshold must be in (0, 1], got {threshold}")
    check_memory_model(memory_model, measured)
    check_whole_nodes(gpus, whole_node)
    if problem := space.pinned.problem(gpus, heads=spec.num_attention_heads, kv_heads=spec.num_query_groups,
                                       layers=spec.num_layers, seq_len=workload.seq_len,
                                       global_batch_size=workload.global_batch_size, max_tp=max_tp):
        raise AdvisorError(problem)
    return _chunk_multiple(space, release)


def _chunk_multiple(space: SpaceOptions, release) -> SpaceOptions:
    """``space`` with the multiple of layers every model chunk needs on ``release``
    (``Recomputation.chunk_multiple``: the pinned uniform N on core 0.15, else 1), or one line
    where the search would choose what that release fails on: N (the uniform method's, searched),
    or an uneven split (the planners' splits take any count). With --split even the search keeps
    the layouts whose chunks N divides (``space._groups``)."""
    from advisor.options import Recomputation, release_defaults
    from advisor.options.training import uniform_chunk_rule

    if space.recompute != "full" or space.recompute_method != "uniform" \
            or release_defaults(release).uniform_recompute_any_n:
        return space
    if space.recompute_num_layers is None:
        raise AdvisorError("advisor sweep needs --recompute-num-layers N with --recompute-method uniform here (it "
                           f"would choose N per layout; 1 runs on every one): {uniform_chunk_rule(release)}")
    multiple = Recomputation(recompute="full", recompute_method="uniform",
                             recompute_num_layers=space.recompute_num_layers).chunk_multiple(release)
    if multiple > 1 and space.split == "auto":
        raise AdvisorError(f"advisor sweep needs --split even with --recompute-method uniform --recompute-num-layers "
                           f"{multiple} here (its planned splits give a chunk any count of layers; the even split "
                           f"is kept where N divides its chunks): {uniform_chunk_rule(release)}")
    return replace(space, chunk_multiple=multiple)


def run_timing(spec: LlamaSpec, workload: Workload, gpu, time_options, time_constants=None) -> Timing:
    """The time model of a run on ``gpu`` (``advisor.rank_times.Timing``): what plans and prices
    the sweep's rows, and one layout's (``advisor.pricing.layout_times``); AdvisorError without a
    global batch (a step's microbatches, hence its time, need it). ``time_constants``: the fitted
    constants (``advisor.throughput.Calibration``; None: the shipped ones)."""
    from advisor.rank_times import Timing
    from advisor.throughput import TimeModel

    if workload.global_batch_size is None:
        raise AdvisorError("predicting time needs a global batch size (--gbs)")
    return Timing(TimeModel(spec, gpu, workload.seq_len, workload.global_batch_size, time_constants, time_options),
                  gpu.gpus_per_node)


def _no_layout(spec: LlamaSpec, workload: Workload, gpus: int, max_tp: int, space: SpaceOptions) -> AdvisorError:
    """Why no (TP, CP, PP, MBS) is launchable: every rule a layout must meet, in one line."""
    split = "PP must divide" if space.split == "even" else "PP at most"
    return AdvisorError(
        f"no valid (TP, CP, PP, MBS) for {gpus} GPUs with {spec.name}: DP = GPUs / (TP x CP x PP) "
        f"must be whole, {split} {spec.num_layers} layers, TP (at most {max_tp}) must divide "
        f"{spec.num_attention_heads} heads and {spec.num_query_groups} KV heads, and the global "
        f"batch {workload.global_batch_size} must be divisible by MBS x DP"
        + (f"; VPP {space.vpp} needs PP > 1, at least {space.vpp} layers per stage and the microbatches a "
           f"multiple of PP" if space.vpp not in (None, 1) else "")
        + (f"; with --recompute-method uniform --recompute-num-layers {space.chunk_multiple}, every model chunk's "
           f"layers a multiple of it" if space.chunk_multiple > 1 else "")
        + (f"; pinned: {space.pinned.text()}" if space.pinned.given() else "")
    )


def _rows(bases, chosen, training: TrainingOptions, memory_gib: float, threshold: float, timing,
          tokens: float | None, release=None, assessments=None) -> list[SweepRow]:
    """One ``SweepRow`` per base of the search's result, judged as ``advisor.ranking.judge_rows``
    would judge it: by the calibrated model's ``assessments`` (one per base) where given, else by
    the paper's verdict (Eq. 18's rule); made once, not made and then judged."""
    from advisor.ranking import timing_fields

    row_options = {}  # few distinct recomputations among thousands of rows
    rows = []
    columns = np.arange(chosen.terms.parameters.shape[1])[None, :]
    totals = np.where(columns < bases.pp[:, None], chosen.terms.total, -np.inf)
    timings = (timing_fields(timing.model, chosen.steps, bases.tp * bases.cp * bases.pp * bases.dp, bases.tp, tokens)
               if timing is not None else [None] * len(bases))
    terms = [getattr(chosen.terms, name) for name in StageTerms.__dataclass_fields__]
    # Python lists, read once: a numpy scalar per row and field costs more than the row's own work
    recomputes = zip(chosen.recompute.tolist(), chosen.recompute_method.tolist(), chosen.recompute_layers.tolist())
    assessments = assessments or [None] * len(bases)
    for b, (tp, cp, pp, dp, mbs, m, vpp, counts, peak, total, recompute, timed, assessed) in enumerate(zip(
            bases.tp.tolist(), bases.cp.tolist(), bases.pp.tolist(), bases.dp.tolist(), bases.mbs.tolist(),
            bases.microbatches.tolist(), chosen.vpp.tolist(), chosen.counts.tolist(), totals.argmax(axis=1).tolist(),
            (totals.max(axis=1) / 2**30).tolist(), recomputes, timings, assessments)):
        if recompute not in row_options:
            trained = _row_options(training, *recompute)
            row_options[recompute] = trained, trained.memory_options(release)
        rows.append(SweepRow(
            parallel=ParallelConfig(tp=tp, cp=cp, pp=pp, dp=dp, mbs=mbs, vpp=vpp),
            num_microbatches=None if math.isinf(m) else int(m),
            estimate=MemoryEstimate(StageTerms(*[term[b, :pp] for term in terms]), tuple(counts[:pp]), peak),
            memory_gib=memory_gib, assessment=assessed,
            verdict=classify(total, memory_gib, threshold) if assessed is None else assessed.verdict,
            options=row_options[recompute][1], training=row_options[recompute][0], timing=timed))
    return rows


def sweep(
    spec: LlamaSpec,
    workload: Workload,
    gpus: int,
    memory_gib: float,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    max_tp: int = DEFAULT_GPUS_PER_NODE,
    options: TrainingOptions = TrainingOptions(),
    space: SpaceOptions | None = None,
    gpu=None,
    memory_model: str = "paper",
    rank_by: str | None = None,
    time_options=None,
    tokens: float | None = None,
    measured=None,
    release=None,
) -> Sweep:
    """One row per launchable (TP, CP, PP, DP, MBS), with its best split, VPP and recomputation,
    priced with the training ``options`` (``advisor.options``: memory and time both read them;
    ``time_options`` overrides the time model's view, for the tables that reproduce a paper).

    With a GPU preset (``gpu``, an ``advisor.hardware.GpuSpec``) the time model plans each row
    (MadPipe's splits, interleaving and recomputation where they are faster) and prices it;
    verdicts and ranking come from ``advisor.ranking`` (``judge_rows``' rules, ``memory_model`` 'paper':
    Eq. 18 and the 80% rule, 'calibrated', or 'profile' with ``measured`` activations,
    ``advisor.profile_terms``; the space is planned against the same model, its variants and
    splits chosen to fit by the verdicts' own rule; ``rank_rows``, ``rank_by`` throughput | memory |
    paper, default ``default_rank_by``); the rows run on Megatron-LM ``release``
    (``advisor.options.release_defaults``; None: the newest)."""
    from advisor.ranking import default_rank_by, rank_rows
    from advisor import space_chunks
    from advisor.space import SpaceOptions
    from advisor.space_search import may_fit, search_parts

    space = space or SpaceOptions()
    space = _check_inputs(spec, workload, gpus, memory_gib, threshold=threshold, memory_model=memory_model,
                          measured=measured, whole_node=gpu.gpus_per_node if gpu is not None else max_tp,
                          max_tp=max_tp, space=space, release=release)
    training, options = options, options.memory_options(release)
    timing = run_timing(spec, workload, gpu, time_options or training.time_options()) if gpu is not None else None
    memory_calibration = None
    if memory_model in ("calibrated", "profile"):  # plan against the model that judges the rows
        from advisor.throughput.calibration import load_memory_calibration

        memory_calibration = load_memory_calibration()
    parts = search_parts(spec, workload, gpus, memory_gib, threshold=threshold, max_tp=max_tp, options=options,
                         space=space, timing=timing, memory_calibration=memory_calibration, measured=measured)
    rows = []
    for result, _ in parts:  # chunk by chunk: merged, the (rows, deepest PP) arrays grow to GBs
        bases, chosen = result.bases, result.chosen
        assessments = None
        if memory_calibration is not None:  # the calibrated (or profile) model judges a chunk's rows at once
            from advisor.verdicts import assess_stages

            assessments = assess_stages(spec, workload.seq_len, chosen.terms, bases.pp, bases.mbs, bases.tp, bases.cp,
                                        chosen.recompute == "full", memory_gib, options, memory_calibration, measured)
        rows += _rows(bases, chosen, training, memory_gib, threshold, timing, tokens, release, assessments)
    if not rows:
        raise _no_layout(spec, workload, gpus, max_tp, space)
    back = space_chunks.order(parts).tolist()  # the bases' order
    ranked = rank_rows([rows[i] for i in back], rank_by or default_rank_by(timing is not None))
    swept = Sweep(rows=ranked, considered=sum(result.considered for result, _ in parts),
                  evaluated=sum(result.evaluated for result, _ in parts))
    if space.sharding != "auto":
        return swept
    from advisor.escalation import escalate

    fixed = replace(space, sharding="fixed")
    return escalate(swept, lambda lever: sweep(
        spec, workload, gpus, memory_gib, threshold=threshold, max_tp=max_tp, options=lever, space=fixed, gpu=gpu,
        memory_model=memory_model, rank_by=rank_by, time_options=time_options, tokens=tokens, measured=measured,
        release=release),
        training, gpu, may_help=lambda lever: may_fit(
            spec, workload, gpus, memory_gib, max_tp=max_tp, options=lever.memory_options(release), space=fixed,
            memory_calibration=memory_calibration, measured=measured), gather_given=space.overlap_param_gather_given)
