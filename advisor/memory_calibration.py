"""The calibrated memory model's constants (``advisor.verdicts`` uses them; the calibration
document, ``advisor.throughput.calibration``, stores and loads them). Apart from both so that
neither needs the other's module to describe them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from advisor.errors import AdvisorError


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
