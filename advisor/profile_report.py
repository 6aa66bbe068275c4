"""Summaries of a profile run, and measured/estimated ratios against seed 004's terms.

The estimate for each term is seed 004's equation evaluated for the rank's own model,
parallel layout, sequence length and micro-batch size, with the facts of the run the equations
cannot see given to the estimator as ``MemoryOptions`` (``run_options``): the distributed
optimizer, sequence parallelism and recomputation its header records, the element size of its
weights and activations (``element_bytes``: the paper assumes BF16; a CPU run may use FP32), and
its attention (the local layer spec keeps the s x s softmax output, which FlashAttention does
not; ``flash_attention=False``), and its SwiGLU as the header records it (``swiglu_fusion``, v4:
an unfused run's fifth h_ffn tensor priced, ``equations.unfused_swiglu_bytes``; files before v4
do not say, and are priced fused, Megatron-LM's default). Gradients and optimizer states keep the
paper's assumptions (FP32 gradients, 12-byte Adam states), so a ratio away from 1 there says how
the run differs from the paper, not that the equation is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

from advisor import equations as eq
from advisor.memory import MemoryOptions, estimate_memory
from advisor.stage_model import StageModel, head_shares_embedding
from advisor.parallel import Workload
from advisor.profile_reasons import NONE, Explained, Reason, explain_module, explain_peak, explain_static
from advisor.profiles import LayerRecord, ProfileRun, RankProfile


@dataclass(frozen=True, kw_only=True, slots=True)
class TermComparison:
    """One measured quantity next to the seed-004 term that predicts it, and the known reasons
    (``advisor.profile_reasons``) why the two differ, with the bytes they predict where a hand
    count exists."""

    rank: int
    module: str
    term: str
    equation: str
    measured_bytes: float
    estimated_bytes: float
    expected_bytes: float | None = None
    reasons: tuple[Reason, ...] = ()

    @property
    def ratio(self) -> float | None:
        return self.measured_bytes / self.estimated_bytes if self.estimated_bytes else None

    @property
    def expected_ratio(self) -> float | None:
        """The ratio the reasons predict (None: no reason, or none with a hand count)."""
        if self.expected_bytes is None or not self.estimated_bytes:
            return None
        return self.expected_bytes / self.estimated_bytes

    def to_dict(self) -> dict:
        return {name: [reason.key for reason in self.reasons] if name == "reasons" else getattr(self, name)
                for name in COMPARE_COLUMNS}


COMPARE_COLUMNS = ("rank", "module", "term", "equation", "measured_bytes", "estimated_bytes", "ratio",
                   "expected_ratio", "reasons")
"""The keys of ``TermComparison.to_dict``, in order: the compare section's columns (``reasons``:
the keys of ``reasons_used``; ``expected_bytes`` is shown as its ratio)."""


def reasons_used(rows: list[TermComparison]) -> dict[str, dict]:
    """Each reason the rows name, once: its text and source (``advisor profile show``'s notes)."""
    return {reason.key: {"text": reason.text, "source": reason.source} for row in rows for reason in row.reasons}


LAYER_FIELDS = ("layer_number", "parameter_bytes", "gradient_bytes", "optimizer_bytes", "activation_bytes",
                "forward_peak_bytes", "backward_peak_bytes")
LAYER_COLUMNS = ("rank", "module", *LAYER_FIELDS)
"""The keys of ``layer_rows``: the layers section's columns."""


def run_options(profile: RankProfile) -> MemoryOptions:
    """The estimator's options that describe how this rank ran."""
    h = profile.header
    return MemoryOptions(
        distributed_optimizer=h.distributed_optimizer,
        sequence_parallel=h.sequence_parallel,
        flash_attention=h.layer_spec == "transformer_engine",
        fused_norms=h.layer_spec == "transformer_engine",  # local: megatron-core's own modules and buffer
        recompute=h.recompute,
        element_bytes=profile.element_bytes,
        # as it ran (v4); unknown before v4: priced fused, as before the option was priced
        bias_swiglu_fusion=h.swiglu_fusion is not False,
    )


def last_iteration(profile: RankProfile) -> int | None:
    return max((it.iteration for it in profile.iterations), default=None)


def compare_rank(profile: RankProfile, iteration: int | None = None) -> list[TermComparison]:
    """Per-module and per-stage comparisons for one rank at one iteration (default: the last)."""
    iteration = last_iteration(profile) if iteration is None else iteration
    if iteration is None:
        return []
    h = profile.header
    spec, parallel, s, b = h.model, h.parallel, h.seq_len, h.parallel.mbs
    t = parallel.tp
    options = run_options(profile)
    # One microbatch through a one-stage pipeline: each module's own Eq. 12-14 term, split and
    # sized as this run's (SP, CP, element size).
    single = StageModel(spec, s, options, tp=t, cp=parallel.cp, dp=parallel.dp, mbs=b, pp=1, vpp=1,
                        num_microbatches=1, stage=0)
    # The hooks measure what each module keeps; the local attention's global memory buffer, which
    # Eq. 18's layer activations carry once per stage, is in the stage's peak alone.
    buffer = float(single.attention_buffer)
    layer_activations = float(single.layer_activations(1)) - buffer
    embedding_activations = float(single.embedding_activations)
    output_activations = float(single.output_activations)
    element_bytes = options.element_bytes
    rows: list[TermComparison] = []

    def add(record: LayerRecord, term: str, equation: str, measured: float, estimated: float,
            why: Explained = NONE) -> None:
        rows.append(TermComparison(rank=h.rank, module=record.name, term=term, equation=equation,
                                   measured_bytes=measured, estimated_bytes=estimated,
                                   expected_bytes=why.expected_bytes, reasons=why.reasons))

    for record in profile.layers_of(iteration):
        if record.kind == "decoder":
            parameters = eq.layer_parameters(spec, t)
            add(record, "weights", "Eq. 6", record.parameter_bytes, parameters * element_bytes)
            add(record, "activations", "Eq. 12/15", record.activation_bytes, layer_activations,
                explain_module(profile, record))
        elif record.kind == "embedding":
            parameters = eq.embedding_parameters(spec, t)
            add(record, "weights", "Eq. 7", record.parameter_bytes, parameters * element_bytes)
            add(record, "activations", "Eq. 13", record.activation_bytes, embedding_activations,
                explain_module(profile, record))
        else:
            parameters = eq.final_norm_parameters(spec)
            if not head_shares_embedding(spec, parallel.pp):
                parameters += eq.embedding_parameters(spec, t)
            add(record, "weights", "Eq. 9", record.parameter_bytes, parameters * element_bytes)
            add(record, "activations", "Eq. 14", record.activation_bytes, output_activations,
                explain_module(profile, record))

    stage = stage_estimate(profile)
    it = next(it for it in profile.iterations if it.iteration == iteration)
    stage_record = LayerRecord(iteration=iteration, name="stage", kind="decoder", layer_number=None,
                               parameter_bytes=0, gradient_bytes=0, optimizer_bytes=0, activation_bytes=0,
                               forward_peak_bytes=0, backward_peak_bytes=0)
    add(stage_record, "weights", "Eq. 7-9", it.parameter_bytes, stage.weights_bytes)
    add(stage_record, "gradients", "Eq. 4 (FP32)", it.gradient_bytes, stage.gradients_bytes,
        explain_static(profile, "gradients", stage.gradients_bytes))
    add(stage_record, "optimizer", "Eq. 10", it.optimizer_bytes, stage.optimizer_bytes,
        explain_static(profile, "optimizer", stage.optimizer_bytes))
    measured_activations = in_flight_activation_bytes(profile, iteration)
    stage_buffer = buffer if stage.layers else 0.0
    estimated_activations = (
        stage.layer_activations_bytes - stage_buffer + stage.embedding_activations_bytes
        + (output_activations if h.last_stage else 0.0)
    )
    add(stage_record, "activations in flight", "Eq. 16-17", measured_activations, estimated_activations,
        _in_flight_explained(profile, rows))
    estimated_total = (stage.weights_bytes + stage.gradients_bytes + stage.optimizer_bytes + estimated_activations
                       + stage_buffer)
    add(stage_record, "peak", "Eq. 18", it.peak_allocated_bytes, estimated_total, explain_peak(profile))
    return rows


def _in_flight_explained(profile: RankProfile, rows: list[TermComparison]) -> Explained:
    """The modules' reasons for the activations in flight (Eq. 16-17 sums Eq. 12-14 over what the
    1F1B peak holds, as ``in_flight_activation_bytes`` sums the measurements), and their expected
    bytes summed the same way where every module with a reason has a hand count."""
    modules = [row for row in rows if row.term == "activations"]
    reasons = tuple({reason.key: reason for row in modules for reason in row.reasons}.values())
    if not reasons or any(row.reasons and row.expected_bytes is None for row in modules):
        return Explained(reasons)
    n, kinds = profile.header.in_flight_microbatches, {"embedding": "embedding", "output": "output"}
    total = 0.0
    for row in modules:
        kept = row.estimated_bytes if row.expected_bytes is None else row.expected_bytes
        total += kept * (1 if kinds.get(row.module) == "output" else n)
    return Explained(reasons, total)


def stage_estimate(profile: RankProfile):
    """Seed 004's StageMemory for this rank's stage, with the run's own layer split and batch:
    with fewer microbatches m than stages, stage i holds min(p - i, m) (not p - i)."""
    h = profile.header
    workload = Workload(seq_len=h.seq_len, global_batch_size=h.global_batch_size)
    estimate = estimate_memory(h.model, h.parallel, workload, run_options(profile), tuple(h.layers_per_stage))
    return estimate.stages[h.coords.get("pp", 0)]


def in_flight_activation_bytes(profile: RankProfile, iteration: int) -> float:
    """What the stage keeps at its 1F1B peak: the decoder layers' activations for every
    microbatch in flight, the embedding's likewise, and the output's for one microbatch."""
    n = profile.header.in_flight_microbatches
    total = 0.0
    for record in profile.layers_of(iteration):
        total += record.activation_bytes * (1 if record.kind == "output" else n)
    return total


def rank_summary(profile: RankProfile) -> dict:
    h = profile.header
    layers = h.stage_layers
    return {
        "rank": h.rank, **{f"{axis}_rank": h.coords.get(axis) for axis in ("tp", "cp", "pp", "dp")},
        "layers": f"{layers[0]}-{layers[-1]}" if layers else "-",
        "embedding": h.first_stage, "output": h.last_stage,
        "in_flight_microbatches": h.in_flight_microbatches, "mbs": h.parallel.mbs,
        "num_microbatches": h.num_microbatches, "iterations": len(profile.iterations),
        "asked_iterations": h.asked_iterations,
        "static_bytes": profile.iterations[-1].static_bytes if profile.iterations else None,
        "peak_allocated_bytes": profile.peak_allocated_bytes,
        "peak_reserved_bytes": max((it.peak_reserved_bytes for it in profile.iterations
                                    if it.peak_reserved_bytes is not None), default=None),
        "alloc_retries": max((it.alloc_retries for it in profile.iterations if it.alloc_retries is not None),
                             default=None),
        "status": profile.status, "where": profile.where,
    }


def layer_rows(profile: RankProfile, iteration: int | None = None) -> list[dict]:
    iteration = last_iteration(profile) if iteration is None else iteration
    return [
        {"rank": profile.header.rank, "module": r.name, **{name: getattr(r, name) for name in LAYER_FIELDS}}
        for r in profile.layers_of(iteration)
    ] if iteration is not None else []


def run_status(run: ProfileRun) -> str:
    """The run's status as shown: its ranks' (``ProfileRun.status``: ``oom``, ``error``, ``running``
    or ``ok``), except that a run whose ranks all ended ok but lacks some ranks' files is
    ``partial``, as the campaign runner calls it (a run of some stages only, or one that died
    before a rank started; ``advisor recommend --profile`` refuses it: not every GPU was measured)."""
    return "partial" if run.status == "ok" and run.missing_ranks else run.status


def missing_text(run: ProfileRun, named: int = 8) -> str | None:
    """'no rank file for ranks 1, 4-7 of its world of 8' (at most ``named`` spans, then how many
    more ranks), or None where every rank of the run's world has its file."""
    spans: list[list[int]] = []
    for rank in run.missing_ranks:
        if spans and spans[-1][1] == rank - 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    if not spans:
        return None
    text = ", ".join(str(low) if low == high else f"{low}-{high}" for low, high in spans[:named])
    if rest := sum(high - low + 1 for low, high in spans[named:]):
        text += f" and {rest} more"
    plural = "s" if len(run.missing_ranks) > 1 else ""
    return f"no rank file for rank{plural} {text} of its world of {run.header.world_size}"


def stopped_early_text(run: ProfileRun) -> str | None:
    """'stopped early: 1 of 2 iterations' (the fewest any rank ran) where Megatron ended the run
    itself before the iterations it was asked for (``RankProfile.stopped_early``), or None."""
    early = [(len(rank.iterations), rank.header.asked_iterations) for rank in run.ranks if rank.stopped_early]
    if not early:
        return None
    done, asked = min(early)
    return f"stopped early: {done} of {asked} iterations"


def run_description(run: ProfileRun) -> str:
    h = run.header
    p = h.parallel
    return (
        f"{h.model.name}: TP {p.tp}, CP {p.cp}, PP {p.pp}, DP {p.dp}, MBS {p.mbs}, seq {h.seq_len}, "
        f"{h.params_dtype}, {h.layer_spec} spec, {h.backend}{' (emulated stages)' if h.emulated else ''}; "
        f"run {h.run_id}: {run_status(run)}" + (f", {missing}" if (missing := missing_text(run)) else "")
        + (f", {early}" if (early := stopped_early_text(run)) else "")
    )
