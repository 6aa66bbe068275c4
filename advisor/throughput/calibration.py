"""The time model's constants: the few that are fitted, and where every other one comes from.

``advisor/calibration.json`` holds the values the advisor uses (written by
``python -m tables.seed004.calibrate``, which fits the constants named in ``fitted`` to the
paper's real runs and records on which). Its loader is strict, like the GPU presets'.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from functools import lru_cache
from pathlib import Path

from advisor.errors import AdvisorError
from advisor.fileio import read_json
from advisor.memory_calibration import MemoryCalibration

CALIBRATION_FILE = Path(__file__).resolve().parent.parent / "calibration.json"
SCHEMA = "advisor-calibration/1"


@dataclass(frozen=True, kw_only=True, slots=True)
class Kernels:
    """Sustained fractions of the dense BF16 peak that one GPU architecture's kernels reach,
    measured outside the paper's runs (the source says where)."""

    gemm: float
    """A large BF16 GEMM, time = FLOPs / (gemm x peak) + Calibration.gemm_latency_s."""
    attention: float
    """A current fused causal attention kernel (cuDNN / FlashAttention-3 class), on executed
    FLOPs (forward + 2.5x backward)."""
    attention_flash2: float
    """FlashAttention-2 (the kernel of 2024 stacks such as the paper's: flash-attn 2.5.8 with
    Transformer Engine 1.9)."""
    source: str

    def __post_init__(self) -> None:
        for name in ("gemm", "attention", "attention_flash2"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise AdvisorError(f"calibration: kernel efficiency {name} must be in (0, 1], got {value!r}")


MAMF_SOURCE = ("S. Bekman, Machine Learning Engineering, 'Maximum Achievable Matmul FLOPS comparison table' "
               "(github.com/stas00/ml-engineering, compute/accelerator/README.md): the best BF16 matmul rate "
               "found by mamf-finder.py over all shapes")
LLAMA_SHAPES_OVER_MAMF = 0.7106 / 0.803
"""On the lead's H100 SXM, Llama layer shapes run at 0.7106 of peak (the probe fit) where the best
shape runs at 0.803 (MAMF, H100 SXM): the GEMM efficiency of another architecture is its MAMF
fraction times this ratio."""

_KERNELS = {
    "ampere": Kernels(
        gemm=round(0.869 * LLAMA_SHAPES_OVER_MAMF, 3), attention=0.72, attention_flash2=0.72,
        source=f"GEMM: A100 SXM MAMF 86.9% ({MAMF_SOURCE}) x 0.884 (LLAMA_SHAPES_OVER_MAMF). Attention: "
               "FlashAttention-2 reaches up to 225 of A100's 312 TFLOP/s forward + backward (Dao 2023, "
               "arXiv 2307.08691, Section 4.1), also the best fused kernel on Ampere"),
    "hopper": Kernels(
        gemm=0.7106, attention=0.5684, attention_flash2=0.35,
        source="GEMM and attention: the lead's H100 SXM probe (benchmarks/gpu/data/h100_sxm_gemm_attention.json; "
               "tables.seed004.calibrate probe fits 239 GEMMs and 18 torch SDPA flash calls). "
               "FlashAttention-2 on Hopper: 35% utilisation (Shah et al. 2024, FlashAttention-3, "
               "arXiv 2407.08608, Section 1)"),
    "blackwell": Kernels(
        gemm=round(0.776 * LLAMA_SHAPES_OVER_MAMF, 3), attention=0.5684, attention_flash2=0.35,
        source=f"GEMM: B200 SXM MAMF 77.6% ({MAMF_SOURCE}) x 0.884. Attention: no measurement on file, "
               "Hopper's fractions"),
    "cdna3": Kernels(
        gemm=round(0.601 * LLAMA_SHAPES_OVER_MAMF, 3), attention=0.5684, attention_flash2=0.35,
        source=f"GEMM: MI300X MAMF 60.1% ({MAMF_SOURCE}) x 0.884. Attention: no measurement on file, "
               "Hopper's fractions"),
}


@dataclass(frozen=True, kw_only=True, slots=True)
class Calibration:
    """Constants of the time model. ``FITTED`` ones come from the paper's runs (which ones is
    recorded in ``fitted_on``); every other one from the source in its docstring."""

    kernels: dict = field(default_factory=lambda: dict(_KERNELS), compare=False)
    """Architecture -> ``Kernels``: measured kernel efficiencies."""
    gemm_latency_s: float = 1.38e-05
    """Fixed cost of one GEMM kernel (launch, ramp, last wave): the probe fit, with
    time = FLOPs / (efficiency x peak) + latency (4.9% mean error over 239 shapes)."""
    attention_latency_s: float = 259e-6
    """Fixed cost of one attention call, forward and backward: the probe fit."""
    compute_factor: float = 1.0
    """Fitted: the GEMMs' sustained rate inside a training run over the stand-alone
    measurement (clocks under a whole run's power draw, the run's cuBLAS version)."""
    attention_factor: float = 1.0
    """Fitted: FlashAttention-2's rate inside the paper's runs (Transformer Engine 1.9, 2024) over
    its published stand-alone rate. It applies to the 'flash2' kernel only: a current fused kernel
    (TimeOptions.attention_kernel='fused') runs at its measured rate times ``compute_factor``."""
    hbm_efficiency: float = 0.8
    """Fraction of HBM bandwidth that element-wise kernels (norms, SwiGLU, RoPE, residuals,
    cross-entropy, Adam) reach; STREAM-like copies reach 80-90% on A100 and H100."""
    network_efficiency: float = 0.8
    """Fitted: fraction of a link's one-direction bandwidth that an NCCL ring collective or a
    P2P transfer reaches (NCCL's bus bandwidth)."""
    collective_latency_s: float = 20e-6
    """Latency of one step of a ring collective or one P2P message (NCCL over NVLink and
    InfiniBand: 5-30 us)."""
    microbatch_overhead_s: float = 0.0
    """Fitted: fixed cost per microbatch per pipeline stage: the Python schedule, get_batch and
    its TP broadcast, the loss all-reduce across data-parallel ranks that Megatron-LM's
    ``pretrain_gpt.loss_func`` issues every microbatch."""
    host_mask_ns_per_element: float = 7.0
    """Fitted: CPU time per element of the s x s attention mask that Megatron's GPTDataset
    builds for every sample when it cannot cache it (--reset-attention-mask, --reset-position-ids
    or --eod-mask-loss), on a node with DRAM at ``host_reference_mt_per_s``. Prior: Megatron-LM's
    own ``_get_ltor_masks_and_position_ids`` timed on one core of this project's CPU machine
    (benchmarks/bench_host_mask.py: 7 ns)."""
    host_reference_mt_per_s: float = 3200.0
    """The DRAM data rate (DDR4-3200) ``host_mask_ns_per_element`` refers to; a node with a
    documented faster DRAM (GpuSpec.host_dram_mt_per_s) builds masks proportionally faster."""
    fitted: tuple[str, ...] = ()
    """The constants a fit adjusted."""
    fitted_on: str = "not fitted: every constant from its documented source"
    """Which runs the fitted constants come from."""
    notes: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for name in constant_names():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise AdvisorError(f"calibration: {name} must be a non-negative number, got {value!r}")
            if name.endswith(("_efficiency", "_factor")) and not 0 < value <= 2:
                raise AdvisorError(f"calibration: {name} must be in (0, 2], got {value!r}")
        unknown = set(self.fitted) - set(constant_names())
        if unknown:
            raise AdvisorError(f"calibration: fitted names unknown constants {sorted(unknown)}")
        if not isinstance(self.kernels, dict) or not all(isinstance(k, Kernels) for k in self.kernels.values()):
            raise AdvisorError("calibration: kernels must map architectures to kernel efficiencies")

    def kernels_for(self, architecture: str) -> Kernels:
        try:
            return self.kernels[architecture]
        except KeyError:
            raise AdvisorError(
                f"calibration has no kernel efficiencies for architecture {architecture!r} "
                f"(known: {', '.join(sorted(self.kernels))})"
            ) from None

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, n) for n in constant_names()) + (self.fitted, self.fitted_on)
                    + tuple(sorted((k, v.gemm, v.attention, v.attention_flash2) for k, v in self.kernels.items())))

    def with_values(self, **values) -> "Calibration":
        return replace(self, **values)

    def to_dict(self) -> dict:
        return {
            **{name: getattr(self, name) for name in constant_names()},
            "kernels": {arch: asdict(k) for arch, k in sorted(self.kernels.items())},
            "fitted": list(self.fitted),
            "fitted_on": self.fitted_on,
            "notes": dict(self.notes),
        }


def constant_names() -> tuple[str, ...]:
    """The numeric constants of the model, in declaration order."""
    return tuple(f.name for f in fields(Calibration) if f.name not in ("kernels", "fitted", "fitted_on", "notes"))


def parse_calibration(data, where: str = "calibration") -> Calibration:
    """The time section of a calibration document."""
    if not isinstance(data, dict):
        raise AdvisorError(f"{where}: the time calibration must be a JSON object")
    known = {f.name for f in fields(Calibration)}
    unknown = set(data) - known
    if unknown:
        raise AdvisorError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    missing = (set(constant_names()) | {"kernels", "fitted", "fitted_on"}) - set(data)
    if missing:
        raise AdvisorError(f"{where}: missing key(s) {', '.join(sorted(missing))}")
    values = dict(data)
    if not isinstance(values["fitted"], list) or not isinstance(values.get("notes", {}), dict):
        raise AdvisorError(f"{where}: fitted must be a list and notes an object")
    values["fitted"] = tuple(values["fitted"])
    kernels = values["kernels"]
    if not isinstance(kernels, dict) or not kernels:
        raise AdvisorError(f"{where}: kernels must be a non-empty object of architectures")
    parsed = {}
    for arch, entry in kernels.items():
        if not isinstance(entry, dict) or set(entry) != {f.name for f in fields(Kernels)}:
            raise AdvisorError(f"{where}: kernels.{arch} must have exactly the keys "
                               f"{', '.join(f.name for f in fields(Kernels))}")
        parsed[arch] = Kernels(**entry)
    values["kernels"] = parsed
    return Calibration(**values)


def calibration_document(time: Calibration, memory, ranking: dict | None = None) -> dict:
    """The JSON document of ``advisor/calibration.json``: the time and the memory constants, and
    the ranking's tolerance (``load_ranking_tolerance``) where computed."""
    document = {"schema": SCHEMA, "time": time.to_dict(), "memory": memory.to_dict()}
    return document if ranking is None else {**document, "ranking": ranking}


@lru_cache(maxsize=None)
def _document(path: Path) -> dict:
    data = read_json(path)
    if (not isinstance(data, dict) or not {"schema", "time", "memory"} <= set(data) <= {"schema", "time", "memory", "ranking"}
            or data["schema"] != SCHEMA):
        raise AdvisorError(f"{path}: expected an object with \"schema\": {SCHEMA!r}, \"time\" and \"memory\"")
    return data


def load_calibration(path: Path = CALIBRATION_FILE) -> Calibration:
    """The time model's constants: ``advisor/calibration.json`` (documented defaults if absent)."""
    if not Path(path).exists():
        return Calibration()
    return _parse_cached(Path(path))


@lru_cache(maxsize=None)
def _parse_cached(path: Path) -> Calibration:
    return parse_calibration(_document(path)["time"], f"{path}, time")


def load_ranking_tolerance(path: Path = CALIBRATION_FILE) -> dict:
    """The throughput ranking's tolerance with how it was computed (``ranking`` of the document,
    ``tables.seed004.validation.ordering_tolerance``); 0 (no tolerance) where absent."""
    ranking = _document(Path(path)).get("ranking") if Path(path).exists() else None
    if ranking is None:
        return {"tolerance": 0.0}
    tolerance = ranking.get("tolerance") if isinstance(ranking, dict) else None
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0 <= tolerance < 1:
        raise AdvisorError(f"{path}, ranking: 'tolerance' must be a number in [0, 1), got {tolerance!r}")
    return ranking


def load_memory_calibration(path: Path = CALIBRATION_FILE) -> MemoryCalibration:
    """The calibrated memory model's constants (``advisor.memory_calibration.MemoryCalibration``)."""
    if not Path(path).exists():
        return MemoryCalibration()
    return MemoryCalibration.from_dict(_document(Path(path))["memory"], f"{path}, memory")
