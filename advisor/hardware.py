"""GPU presets as cited data (``advisor/gpus.json``) and their one strict loader.

Every entry carries the vendor specification it was copied from; the loader refuses an
unknown or missing key, a wrong type or a non-positive number, so the data file cannot
drift silently. ``--gpu NAME`` looks a preset up; ``--mem`` and ``--gpus-per-node`` override
its memory and node size (``GpuSpec.with_overrides``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from functools import lru_cache
from pathlib import Path

from advisor.errors import AdvisorError
from advisor import limits
from advisor.fileio import read_json

GPUS_FILE = Path(__file__).resolve().parent / "gpus.json"
SCHEMA = "advisor-gpus/1"


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuSpec:
    """One GPU as the time and memory models see it. Units are in the names."""

    name: str
    description: str
    architecture: str
    """Selects the kernel efficiencies measured for this architecture (advisor/calibration.json)."""
    memory_gib: float
    """Device memory, GiB (what --mem means)."""
    bf16_dense_tflops: float
    """Dense BF16 tensor-core peak (no sparsity), 10^12 FLOP/s: the MFU denominator."""
    fp8_dense_tflops: float | None
    """Dense FP8 peak; None where the GPU has no FP8 tensor cores."""
    hbm_tb_per_s: float
    """Device-memory bandwidth, 10^12 bytes/s."""
    nvlink_bidirectional_gb_per_s: float
    """Aggregate NVLink (Infinity Fabric) bandwidth of one GPU, both directions, 10^9 bytes/s."""
    network_gb_per_s: float
    """Scale-out (InfiniBand / Ethernet) bandwidth per GPU, one direction, 10^9 bytes/s."""
    gpus_per_node: int
    """GPUs in one NVLink domain (a node): the fast-link boundary for TP and CP."""
    host_dram_mt_per_s: float | None
    """The node's DRAM data rate, MT/s, where its cluster documents it (None: the calibration's
    reference rate). Scales the host-side data-loader time."""
    host_link_gb_per_s: float | None
    """The GPU's link to its host CPU, one direction, 10^9 bytes/s (PCIe x16, or NVLink-C2C):
    what optimizer CPU offload copies over; None where the platform does not fix it."""
    host_memory_gb_per_s: float | None
    """Host DRAM bandwidth available to one GPU, 10^9 bytes/s: its CPU socket's channels x data
    rate x 8 bytes, over the GPUs that socket serves; what CPU Adam runs at. None: not published."""
    sources: tuple[str, ...]
    hbm_note: str | None = None
    """How a bandwidth the vendor does not publish was derived."""

    @property
    def peak_flops(self) -> float:
        return self.bf16_dense_tflops * 1e12

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_tb_per_s * 1e12

    @property
    def nvlink_bytes_per_s(self) -> float:
        """One direction: half the aggregate the vendor quotes."""
        return self.nvlink_bidirectional_gb_per_s * 1e9 / 2

    @property
    def network_bytes_per_s(self) -> float:
        return self.network_gb_per_s * 1e9

    def with_overrides(self, memory_gib: float | None = None, gpus_per_node: int | None = None) -> "GpuSpec":
        """The preset with --mem and --gpus-per-node applied (None keeps the preset's value)."""
        changes = {}
        if memory_gib is not None:
            changes["memory_gib"] = limits.check_float(memory_gib, "GPU memory (GiB)", limits.GPU_MEMORY_GIB,
                                                       low_open=True)
        if gpus_per_node is not None:
            changes["gpus_per_node"] = limits.check_int(gpus_per_node, "GPUs per node", limits.GPUS_PER_NODE)
        return replace(self, **changes) if changes else self

    def to_dict(self) -> dict:
        return asdict(self)


_NUMBERS = ("memory_gib", "bf16_dense_tflops", "hbm_tb_per_s", "nvlink_bidirectional_gb_per_s", "network_gb_per_s")
_REQUIRED = {f.name for f in fields(GpuSpec) if f.name != "hbm_note"}


def _positive(value, where: str, key: str, integer: bool = False) -> None:
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type or not math.isfinite(value) or value <= 0:
        kind = "a positive integer" if integer else "a positive number"
        raise AdvisorError(f"{where}: {key} must be {kind}, got {limits.json_text(value)}")


def _parse_entry(entry, where: str) -> GpuSpec:
    if not isinstance(entry, dict):
        raise AdvisorError(f"{where}: each GPU must be a JSON object")
    unknown = set(entry) - _REQUIRED - {"hbm_note"}
    missing = _REQUIRED - set(entry)
    if unknown:
        raise AdvisorError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    if missing:
        raise AdvisorError(f"{where}: missing key(s) {', '.join(sorted(missing))}")
    for key in ("name", "description", "architecture"):
        if not isinstance(entry[key], str) or not entry[key]:
            raise AdvisorError(f"{where}: {key} must be a non-empty string")
    for key in _NUMBERS:
        _positive(entry[key], where, key)
    if entry["fp8_dense_tflops"] is not None:
        _positive(entry["fp8_dense_tflops"], where, "fp8_dense_tflops")
    _positive(entry["gpus_per_node"], where, "gpus_per_node", integer=True)
    limits.check_float(entry["memory_gib"], "memory_gib", limits.GPU_MEMORY_GIB, where, low_open=True)
    limits.check_int(entry["gpus_per_node"], "gpus_per_node", limits.GPUS_PER_NODE, where)
    for key in ("host_dram_mt_per_s", "host_link_gb_per_s", "host_memory_gb_per_s"):
        if entry[key] is not None:
            _positive(entry[key], where, key)
    sources = entry["sources"]
    if not isinstance(sources, list) or not sources or not all(isinstance(s, str) and s for s in sources):
        raise AdvisorError(f"{where}: sources must be a non-empty list of citations")
    note = entry.get("hbm_note")
    if note is not None and not isinstance(note, str):
        raise AdvisorError(f"{where}: hbm_note must be a string")
    return GpuSpec(**{**entry, "sources": tuple(sources)})


def parse_gpus(data, where: str = "GPU data") -> dict[str, GpuSpec]:
    """Presets from the parsed JSON document, by name; AdvisorError on anything unexpected."""
    if not isinstance(data, dict) or set(data) != {"schema", "notes", "gpus"}:
        raise AdvisorError(f"{where}: expected an object with exactly the keys schema, notes, gpus")
    if data["schema"] != SCHEMA:
        raise AdvisorError(f"{where}: schema must be {SCHEMA!r}, got {data['schema']!r}")
    if not isinstance(data["gpus"], list) or not data["gpus"]:
        raise AdvisorError(f"{where}: gpus must be a non-empty list")
    presets: dict[str, GpuSpec] = {}
    for i, entry in enumerate(data["gpus"]):
        gpu = _parse_entry(entry, f"{where}, gpus[{i}]")
        if gpu.name in presets:
            raise AdvisorError(f"{where}: GPU {gpu.name!r} is listed twice")
        presets[gpu.name] = gpu
    return presets


@lru_cache(maxsize=None)
def load_gpus(path: Path = GPUS_FILE) -> dict[str, GpuSpec]:
    """The presets of ``advisor/gpus.json`` (or another file of the same schema)."""
    return parse_gpus(read_json(path), str(path))


def get_gpu(name: str) -> GpuSpec:
    """A preset by name (case-insensitive), or AdvisorError with the closest names."""
    presets = load_gpus()
    key = name.strip().lower()
    if key in presets:
        return presets[key]
    from advisor.errors import close_names

    close = close_names(key, presets, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise AdvisorError(f"unknown GPU {name!r}{hint} (advisor gpus lists {len(presets)} presets)")


STREAMING_MULTIPROCESSORS = {"ampere": 108, "hopper": 132, "blackwell": 148}
"""SMs per GPU by architecture: A100 108 (NVIDIA A100 Tensor Core GPU Architecture whitepaper),
H100 SXM5 132 (NVIDIA H100 Tensor Core GPU Architecture whitepaper, also H800 and H200), B200
148 (NVIDIA Blackwell Architecture Technical Brief)."""


def streaming_multiprocessors(architecture: str) -> int:
    """``STREAMING_MULTIPROCESSORS`` of the architecture (Hopper's where none is listed)."""
    return STREAMING_MULTIPROCESSORS.get(architecture, STREAMING_MULTIPROCESSORS["hopper"])
