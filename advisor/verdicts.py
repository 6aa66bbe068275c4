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

import math
from dataclasses import dataclass
from typing import Literal

from advisor.errors import AdvisorError
from advisor.memory import GIB, MemoryEstimate, MemoryOptions
from advisor.models import LlamaSpec
from advisor import memory_terms as terms
from advisor.equations import padded_vocab_size

CalibratedVerdict = Literal["fits", "likely fits", "likely oom", "oom"]
CALIBRATED_VERDICTS: tuple[CalibratedVerdict, ...] = ("fits", "likely fits", "likely oom", "oom")
EXPECTED_TO_RUN = ("fits", "likely fits", "tight")
"""Verdicts a ranking keeps: the calibrated model's two that fit, and the paper's fits/tight."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryCalibration:
    """The calibrated memory model's constants."""

    overhead_gib: float = 2.5
    """Memory outside PyTorch's tensors (CUDA context, NCCL buffers, workspaces), GiB: a
    physical estimate (``memory_terms.runtime_overhead_bytes``), not fitted."""
    reserve_fraction: float = 0.05
    """The caching allocator's reserve and fragmentation, which grow with the device: a
    fraction of the GPU's memory."""
    activation_factor: float = 1.0
    """Allocator fragmentation and reserve on the activations (caching-allocator blocks that
    cannot be reused at the peak): reserved / allocated."""
    band: float = 0.05
    """Half-width of the 'likely' zone around the memory size, as a fraction of it."""
    dataloader_mask: bool = True
    """Count the data loader's s x s mask (Megatron's default creates it)."""
    fitted: tuple[str, ...] = ()
    fitted_on: str = "not fitted: physical estimates"

    def __post_init__(self) -> None:
        for name in ("overhead_gib", "reserve_fraction", "activation_factor", "band"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise AdvisorError(f"memory calibration: {name} must be a non-negative number, got {value!r}")

    def to_dict(self) -> dict:
        return {
            "overhead_gib": self.overhead_gib, "reserve_fraction": self.reserve_fraction,
            "activation_factor": self.activation_factor, "band": self.band,
            "dataloader_mask": self.dataloader_mask, "fitted": list(self.fitted), "fitted_on": self.fitted_on,
        }

    @classmethod
    def from_dict(cls, data: dict, where: str = "memory calibration") -> "MemoryCalibration":
        keys = {"overhead_gib", "reserve_fraction", "activation_factor", "band", "dataloader_mask", "fitted",
                "fitted_on"}
        if not isinstance(data, dict) or set(data) != keys:
            raise AdvisorError(f"{where}: expected exactly the keys {', '.join(sorted(keys))}")
        return cls(**{**data, "fitted": tuple(data["fitted"])})


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


def calibrated_stage_bytes(
    estimate: MemoryEstimate, spec: LlamaSpec, seq_len: int, mbs: int, tp: int, cp: int,
    options: MemoryOptions, calibration: MemoryCalibration, memory_gib: float,
) -> list[float]:
    """Predicted device memory of each pipeline stage on a GPU of ``memory_gib``, bytes."""
    vocab = padded_vocab_size(spec.vocab_size, options.vocab_divisible_by, tp)
    last = len(estimate.stages) - 1
    out = []
    for stage in estimate.stages:
        activations = stage.activations_bytes + terms.swiglu_fusion_correction_bytes(stage, spec, options.recompute) + (
            terms.embedding_ids_correction_bytes(stage, spec) if stage.stage == 0 else 0.0
        )
        extra = terms.runtime_overhead_bytes(calibration.overhead_gib) + calibration.reserve_fraction * memory_gib * GIB
        if stage.stage == last:
            extra += terms.cross_entropy_working_bytes(spec, seq_len, mbs, tp, cp, vocab)
        if calibration.dataloader_mask and stage.stage in (0, last):
            extra += terms.dataloader_mask_bytes(seq_len, mbs, cp)
        out.append(stage.model_states_bytes + calibration.activation_factor * activations + extra)
    return out


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
    options: MemoryOptions = MemoryOptions(), calibration: MemoryCalibration | None = None,
) -> Assessment:
    """The calibrated verdict of one layout's estimate on a GPU of ``memory_gib``."""
    if calibration is None:
        from advisor.throughput.calibration import load_memory_calibration

        calibration = load_memory_calibration()
    per_stage = calibrated_stage_bytes(estimate, spec, seq_len, mbs, tp, cp, options, calibration, memory_gib)
    peak = max(range(len(per_stage)), key=per_stage.__getitem__)
    usage = per_stage[peak] / GIB
    return Assessment(usage_gib=usage, peak_stage=peak, memory_gib=memory_gib,
                      verdict=verdict_for(usage, memory_gib, calibration.band))
