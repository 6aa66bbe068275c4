"""Will it run? The calibrated memory model and its four verdicts, with the margin stated.

Per pipeline stage: seed 004's Eq. 18 (``advisor.memory``, unchanged) with its embedding input
and SwiGLU counted as megatron-core keeps them, plus what Eq. 18 leaves out (``advisor.memory_terms``: the
cross-entropy's working set, the data loader's attention mask, the runtime's own memory), with
the activations scaled by the allocator's fragmentation. The peak stage against the GPU's
memory gives

    fits          usage <= (1 - band) x memory
    likely fits   usage <= memory
    likely oom    usage <= (1 + band) x memory
    oom           more

``band`` is the calibration's uncertainty. ``reserve_fraction``, ``activation_factor`` and
``band`` are fitted to real runs (``python -m tables.seed004.calibrate``); the defaults below
are the physical estimates they start from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from advisor.memory import GIB, MemoryEstimate, MemoryOptions
from advisor.memory_calibration import MemoryCalibration
from advisor.models import LlamaSpec
from advisor import memory_terms as terms
from advisor.paper_rule import PAPER_VERDICTS, classify
from advisor.equations import padded_vocab_size

CalibratedVerdict = Literal["fits", "likely fits", "likely oom", "oom"]
CALIBRATED_VERDICTS: tuple[CalibratedVerdict, ...] = ("fits", "likely fits", "likely oom", "oom")
EXPECTED_TO_RUN = ("fits", "likely fits", "tight")
"""Verdicts a ranking keeps: the calibrated model's two that fit, and the paper's fits/tight."""


def verdict_kinds(memory_model: str) -> tuple[str, ...]:
    """The verdicts a memory model gives, best first: the paper's (``memory_model`` 'paper') or
    the calibrated model's ('calibrated', and 'profile' which judges by the same rule)."""
    return PAPER_VERDICTS if memory_model == "paper" else CALIBRATED_VERDICTS


@dataclass(frozen=True, slots=True)
class Assessment:
    """The calibrated model's call for one layout."""

    usage_gib: float
    """Predicted peak device memory of the peak stage."""
    peak_stage: int
    memory_gib: float
    verdict: CalibratedVerdict

    @property
    def margin_gib(self) -> float:
        """Headroom (positive) or shortfall (negative) against the GPU's memory."""
        return self.memory_gib - self.usage_gib

    def to_dict(self) -> dict:
        return {"usage_gib": self.usage_gib, "margin_gib": self.margin_gib, "calibrated_peak_stage": self.peak_stage}


@dataclass(frozen=True, slots=True)
class CalibratedTerms:
    """The calibrated model on top of Eq. 18's terms of a pipeline stage: factors on its three
    activation terms and the bytes it adds. Fields are numbers or numpy arrays that broadcast over
    layouts and stages (the sweep's planners use them vectorised, ``stage_model.StageModel``)."""

    layer_factor: object
    """The allocator's factor times the share of Eq. 12 megatron-core keeps (fused SwiGLU; 1 with
    full recomputation, whose layers keep only their input), or the profiled ratio."""
    embedding_factor: object
    """The allocator's factor times the share of Eq. 13 kept (the int64 token ids), or the profiled ratio."""
    output_factor: object
    added: object
    """Runtime memory and the allocator's reserve on every stage, and --tp-comm-overlap's
    userbuffers; the cross-entropy's BF16 logits on the last; the data loader's mask on the first
    and the last."""
    buffer_factor: object = 1.0
    """The allocator's factor alone, for the local attention's global memory buffer
    (``memory_terms.local_attention_buffer``), which Eq. 18's layer activations carry but which is
    none of Eq. 12's tensors."""

    def stage_bytes(self, model_states, layer_activations, embedding_activations, output_activations,
                    attention_buffer=0.0):
        """``attention_buffer``: the part of ``layer_activations`` that is the local attention's
        buffer (on stages with layers), scaled by ``buffer_factor`` instead of ``layer_factor``."""
        return (model_states + self.layer_factor * (layer_activations - attention_buffer)
                + self.buffer_factor * attention_buffer + self.embedding_factor * embedding_activations
                + self.output_factor * output_activations + self.added)


def _ratio(measured, kind: str, tp, cp, default: float):
    """The profiled ratio measured / Eq. 12-14 of one module kind at each (tp, cp), arrays
    broadcast (``MeasuredActivations.for_layout``); ``default`` where no profile measured it."""
    if measured is None:
        return default
    if np.ndim(tp) == 0 and np.ndim(cp) == 0:
        value = getattr(measured.for_layout(int(tp), int(cp)), kind)
        return default if value is None else value
    tp, cp = np.broadcast_arrays(np.asarray(tp), np.asarray(cp))
    pairs = np.stack([tp.ravel(), cp.ravel()], axis=1)
    unique, inverse = np.unique(pairs, axis=0, return_inverse=True)  # few distinct (TP, CP) among thousands
    values = [getattr(measured.for_layout(int(t), int(c)), kind) for t, c in unique]
    return np.array([default if v is None else v for v in values])[inverse.ravel()].reshape(tp.shape)


def runtime_and_reserve_bytes(calibration: MemoryCalibration, memory_gib: float) -> float:
    """What every stage holds beside PyTorch's allocations, by the calibrated model: the CUDA
    runtime's own memory and the allocator's reserve, a fraction of the GPU's ``memory_gib``. A
    profile's peak allocation leaves both out (``advisor recommend --profile`` adds them)."""
    return terms.runtime_overhead_bytes(calibration.overhead_gib) + calibration.reserve_fraction * memory_gib * GIB


def calibrated_terms(
    spec: LlamaSpec, seq_len: int, mbs, tp, cp, stage, pp, full_recompute, options: MemoryOptions,
    calibration: MemoryCalibration, memory_gib: float, measured=None, layer_share: float | None = None,
) -> CalibratedTerms:
    """The calibrated model's terms for stage ``stage`` of ``pp`` (any of them numpy arrays).
    ``measured`` (``advisor.profile_terms.MeasuredActivations``, ``--memory-model profile``)
    replaces the Eq. 12-14 corrections by the profiled ratios measured / Eq. 12-14; fully
    recomputed layers keep only their input, which no profile here measured: their term stays.
    ``layer_share``: the share of the layer activations megatron-core keeps, where the layer
    terms are not Eq. 12 (MoE layers, ``advisor.moe``, count the kept tensors: 1); default
    ``memory_terms.swiglu_fusion_fraction``."""
    vocab = padded_vocab_size(spec.vocab_size, options.vocab_divisible_by, tp)
    first, last = np.asarray(stage) == 0, np.asarray(stage) == np.asarray(pp) - 1
    added = runtime_and_reserve_bytes(calibration, memory_gib)
    added = added + np.where(last, terms.cross_entropy_working_bytes(spec, seq_len, mbs, tp, cp, vocab,
                                                                      options.cross_entropy_fusion), 0.0)
    if calibration.dataloader_mask and options.dataloader_mask:  # the calibrated model has the term; the run, the mask
        added = added + np.where(first | last, terms.dataloader_mask_bytes(seq_len, mbs, cp), 0.0)
    if options.userbuffers is not None:  # every rank's userbuffers, outside PyTorch's allocator (0 at TP 1)
        added = added + terms.userbuffers_bytes(options.userbuffers, spec, seq_len, mbs, tp, cp,
                                                options.fp8_format is not None)
    factor = calibration.activation_factor
    if layer_share is None:  # selective recomputation's modules free part of Eq. 12 (``layer_bytes``)
        modules = options.recompute_modules if options.recompute == "selective" else frozenset()
        unfused = None if options.flash_attention or "core_attn" in modules else seq_len  # its scores are kept too
        share = terms.swiglu_fusion_fraction(spec, modules, options.fused_norms, options.bias_swiglu_fusion, unfused)
    else:
        share = layer_share
    layer = _ratio(measured, "decoder", tp, cp, share)
    return CalibratedTerms(
        layer_factor=factor * np.where(full_recompute, 1.0, layer),
        embedding_factor=factor * _ratio(measured, "embedding", tp, cp, terms.embedding_ids_fraction(spec)),
        output_factor=factor * _ratio(measured, "output", tp, cp, 1.0), added=added, buffer_factor=factor)


def _attention_buffer(spec: LlamaSpec, seq_len: int, mbs, tp, options: MemoryOptions, layer_activations):
    """The local attention's buffer in each stage's layer activations (stages without layers keep
    none); 0 without --transformer-impl local, with no array built on the sweep's path."""
    if options.fused_norms:
        return 0.0
    return np.where(np.asarray(layer_activations) > 0,
                    terms.local_attention_buffer(spec, seq_len, mbs, tp, options), 0.0)


def calibrated_stage_bytes(
    estimate: MemoryEstimate, spec: LlamaSpec, seq_len: int, mbs: int, tp: int, cp: int,
    options: MemoryOptions, calibration: MemoryCalibration, memory_gib: float, measured=None,
) -> list[float]:
    """Predicted device memory of each pipeline stage on a GPU of ``memory_gib``, bytes
    (``measured``: the profile memory model's, see ``calibrated_terms``)."""
    t, pp = estimate.terms, len(estimate.layers)
    calibrated = calibrated_terms(spec, seq_len, mbs, tp, cp, np.arange(pp), pp, options.recompute == "full", options,
                                  calibration, memory_gib, measured)
    per_stage = calibrated.stage_bytes(t.model_states, t.layer_activations, t.embedding_activations,
                                       t.output_activations,
                                       _attention_buffer(spec, seq_len, mbs, tp, options, t.layer_activations))
    return np.broadcast_to(per_stage, (pp,)).tolist()


def assess_stages(
    spec: LlamaSpec, seq_len: int, terms, pp, mbs, tp, cp, full_recompute, memory_gib: float,
    options: MemoryOptions, calibration: MemoryCalibration, measured=None,
) -> list[Assessment]:
    """``assess`` for many layouts at once: ``terms`` (``stage_model.StageTerms`` of arrays, one row
    per layout, as wide as the deepest pipeline), ``pp`` and the layout quantities are arrays of
    one value per layout (the sweep's rows)."""
    col = (slice(None), None)
    pp = np.asarray(pp)
    width = np.shape(terms.model_states)[1]
    stage = np.arange(width)[None, :]
    calibrated = calibrated_terms(spec, seq_len, np.asarray(mbs)[col], np.asarray(tp)[col], np.asarray(cp)[col],
                                  stage, pp[col], np.asarray(full_recompute)[col], options, calibration, memory_gib,
                                  measured)
    per_stage = calibrated.stage_bytes(terms.model_states, terms.layer_activations, terms.embedding_activations,
                                       terms.output_activations,
                                       _attention_buffer(spec, seq_len, np.asarray(mbs)[col], np.asarray(tp)[col],
                                                         options, terms.layer_activations))
    per_stage = np.where(stage < pp[col], per_stage, -np.inf)
    peak = per_stage.argmax(axis=1)
    usage = (per_stage.max(axis=1) / GIB).tolist()
    return [Assessment(usage_gib=u, peak_stage=p, memory_gib=memory_gib, verdict=verdict_for(u, memory_gib,
                                                                                            calibration.band))
            for u, p in zip(usage, peak.tolist())]


def default_memory_model(gpu_preset: bool) -> str:
    """The memory model without --memory-model: the calibrated one where a GPU preset gives the
    time model and the calibration's reference (advisor sweep, estimate, recommend, compare-log),
    else the paper's Eq. 18 and its 80% rule."""
    return "calibrated" if gpu_preset else "paper"


def judge(gib: float, memory_gib: float, *, band: float | None, threshold: float) -> str:
    """A layout's verdict from the memory its model gives: the calibrated model's usage with its
    ``band`` (``verdict_for``), or, ``band`` None, Eq. 18's total under the paper's rule."""
    if band is None:
        return classify(gib, memory_gib, threshold)
    return verdict_for(gib, memory_gib, band)


def verdict_for(usage_gib: float, memory_gib: float, band: float) -> CalibratedVerdict:
    ratio = usage_gib / memory_gib
    if ratio <= 1 - band:
        return "fits"
    if ratio <= 1:
        return "likely fits"
    if ratio <= 1 + band:
        return "likely oom"
    return "oom"


def assess(
    estimate: MemoryEstimate, spec: LlamaSpec, seq_len: int, mbs: int, tp: int, cp: int, memory_gib: float,
    options: MemoryOptions = MemoryOptions(), calibration: MemoryCalibration | None = None, measured=None,
) -> Assessment:
    """The calibrated verdict of one layout's estimate on a GPU of ``memory_gib`` (with
    ``measured``, the profile memory model's: see ``calibrated_stage_bytes``)."""
    if calibration is None:
        from advisor.throughput.calibration import load_memory_calibration

        calibration = load_memory_calibration()
    per_stage = calibrated_stage_bytes(estimate, spec, seq_len, mbs, tp, cp, options, calibration, memory_gib,
                                       measured)
    peak = max(range(len(per_stage)), key=per_stage.__getitem__)
    usage = per_stage[peak] / GIB
    return Assessment(usage_gib=usage, peak_stage=peak, memory_gib=memory_gib,
                      verdict=verdict_for(usage, memory_gib, calibration.band))
