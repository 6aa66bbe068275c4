"""``python -m tables.moe_gemm_probe``: the MoE time model's grouped GEMMs against one GPU's timings.

The measurement (``benchmarks/gpu/moe_grouped_gemm.py``, committed in
``benchmarks/gpu/data/h200_moe_grouped_gemm_{bf16,fp8}.json``: one H200, torch 2.11.0+cu130,
2026-11-28) issues each local expert's cuBLAS GEMM round-robin over 4 streams, as Transformer
Engine's ``GroupedLinear`` does, for the six GEMM calls of one MoE layer and microbatch (FC1 and FC2
forward, data and weight gradients). The model (``advisor.moe.time.grouped_gemm_time``: 128 x 128
tiles in waves over the SMs at the calibrated dense rate, or the HBM roofline, plus one kernel
cost per call) prices the same shapes with the ``h200-141gb`` preset, backward as twice the
forward (``expert_gemm_time``); FP8 at ``throughput.levers.fp8_rates``. Nothing here is fitted:
the calibration comes from dense runs, the probe is an independent check.

Shapes: the published runs' (``tables/published_moe.py``, balanced routing), then an m sweep of
Qwen3-30B-A3B's experts, which no published run has.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from advisor.hardware import get_gpu
from advisor.hardware import streaming_multiprocessors
from advisor.moe.time import grouped_gemm_time
from advisor.throughput.calibration import load_calibration
from advisor.throughput.levers import fp8_rates
from advisor.throughput.terms import Rates

DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "data"
FILES = {"bf16": DATA / "h200_moe_grouped_gemm_bf16.json", "fp8": DATA / "h200_moe_grouped_gemm_fp8.json"}
GPU = "h200-141gb"
PUBLISHED_SHAPES = {("qwen3-30b-a3b", 8, 4096): "Qwen3-30B-A3B EP 16", ("qwen3-30b-a3b", 16, 2048): "Qwen3-30B-A3B EP 8",
                    ("qwen3-30b-a3b", 16, 4096): "Qwen3-30B-A3B EP 8, MBS 2",
                    ("qwen3-235b-a22b", 4, 4096): "Qwen3-235B-A22B EP 32, TP 2",
                    ("deepseek-v3", 4, 4096): "DeepSeek-V3 EP 64, TP 2", ("mixtral-8x7b", 1, 8192): "Mixtral 8x7B EP 8"}
"""The shapes of the published H100 runs, (model, local experts, token copies per expert)."""
FORWARD = ("fc1_fwd", "fc2_fwd")
CALLS = FORWARD + ("fc2_dgrad", "fc2_wgrad", "fc1_dgrad", "fc1_wgrad")


@dataclass(frozen=True)
class ShapeResult:
    model: str
    groups: int
    m: int
    measured_s: dict[str, float]
    """One layer and microbatch (the six calls), per mode, seconds."""
    forward_s: float
    """The measured forward (FC1 + FC2) over 4 streams."""
    modelled_s: dict[str, float]
    """The model's layer time: "bf16" and "fp8"."""

    @property
    def published(self) -> str | None:
        return PUBLISHED_SHAPES.get((self.model, self.groups, self.m))


def load(files: dict[str, Path] = FILES) -> list[ShapeResult]:
    """Every shape measured in every mode, with the model's times beside."""
    by_shape: dict[tuple, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    sizes = {}
    for path in files.values():
        for row in json.loads(path.read_text())["rows"]:
            if "seconds" in row:
                key = (row["model"], row["groups"], row["m"])
                by_shape[key][row["mode"]][row["call"]] = row["seconds"]
                sizes[key] = (row["h"], row["f"])
    gpu = get_gpu(GPU)
    rates = Rates.of(gpu, load_calibration())
    rates8, sms = fp8_rates(rates, gpu), streaming_multiprocessors(gpu.architecture)
    results = []
    for (model, groups, m), modes in by_shape.items():
        h, f = sizes[model, groups, m]

        def layer(r: Rates, element_bytes: float) -> float:  # forward, and backward twice it
            forward = grouped_gemm_time(groups, m, h, 2 * f, r, sms, element_bytes) \
                + grouped_gemm_time(groups, m, f, h, r, sms, element_bytes)
            return 3 * float(forward)

        measured = {mode: sum(calls.values()) for mode, calls in modes.items() if set(calls) == set(CALLS)}
        results.append(ShapeResult(model, groups, m, measured, sum(modes["streams4"][c] for c in FORWARD),
                                   {"bf16": layer(rates, 2), "fp8": layer(rates8, 1)}))
    return results


def rows(results: list[ShapeResult]) -> list[list[str]]:
    out = []
    for r in results:
        t = r.measured_s
        out.append([r.published or f"{r.model}, m sweep", str(r.groups), str(r.m),
                    f"{t['streams4'] * 1e3:.2f}", f"{t['serial'] / t['streams4']:.2f}",
                    f"{(t['streams4'] - 3 * r.forward_s) / (3 * r.forward_s):+.0%}",
                    f"{r.modelled_s['bf16'] * 1e3:.2f}", f"{t['streams4'] / r.modelled_s['bf16']:.2f}",
                    f"{t['fp8_streams4'] * 1e3:.2f}", f"{t['fp8_streams4'] / r.modelled_s['fp8']:.2f}",
                    f"{t['streams4'] / t['fp8_streams4']:.2f}"])
    return out


HEADER = ["shape", "G", "m", "BF16 ms", "1/4 str", "bwd-2f", "model ms", "meas/mod", "FP8 ms", "meas/mod",
          "BF16/FP8"]


NOTE = """
One layer and microbatch of routed-expert GEMMs (six calls), one H200, a cuBLAS GEMM per expert over
4 streams as Transformer Engine issues them. G local experts, m token copies each. '1/4 str': one
stream over four. 'bwd-2f': the backward's four calls against twice the forward. Model:
advisor.moe.time.grouped_gemm_time at the h200-141gb preset (calibrated on dense runs, not on this)."""


def markdown(results: list[ShapeResult] | None = None) -> str:
    body = rows(load() if results is None else results)
    lines = ["| " + " | ".join(HEADER) + " |", "|---|" + "---:|" * (len(HEADER) - 1)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in body])


def main() -> None:
    print(markdown())
    print(NOTE)


if __name__ == "__main__":
    main()
