"""Routed experts' GEMMs on one GPU, run the ways megatron-core's expert MLPs run them.

Question (docs/validation.md, the Qwen3-30B-A3B misses): what does one layer's grouped GEMM of
many thin experts cost beyond its arithmetic, and how much of the per-expert cost do Transformer
Engine's GEMM streams hide? TE's ``GroupedLinear`` (``TEGroupedMLP``) runs one cuBLAS GEMM per
local expert, round-robin over 4 compute streams (``general_grouped_gemm``,
``multi_stream_cublas_gemm``), joined at the end of each call. Transformer Engine is not on the
GPU machine, so the same cuBLAS GEMMs are issued through torch (``torch.matmul``; FP8 through
``torch._scaled_mm``, cuBLASLt's FP8 GEMM, per-tensor scales), in these modes:

- ``one``: a single GEMM of all G x m rows against one weight: the same arithmetic in one kernel
  (the dense-rate reference; forward and dgrad shapes only).
- ``serial``: G GEMMs on one stream, captured in a CUDA graph (no host time).
- ``streams4``: G GEMMs round-robin over 4 streams, forked from and joined to the caller's stream,
  in a CUDA graph: TE's multi-stream grouped GEMM without its host time.
- ``eager``: ``serial`` issued from Python each time (the host launches every GEMM, as
  ``SequentialMLP`` does): an upper bound on the host's share.
- ``grouped_mm``: ``torch._grouped_mm``, one CUTLASS grouped-GEMM kernel (the kernel the advisor's
  tile model describes); off (``GROUPED_MM``).
- ``fp8_serial``, ``fp8_streams4``: ``serial`` and ``streams4`` with E4M3 operands (the casts are
  not timed: TE fuses them into kernels of their own, priced as memory traffic elsewhere).

Per shape (G local experts of hidden h and expert width f, m token copies each), the six GEMM
calls of one MoE layer and microbatch: FC1 and FC2 forward ([m, h] x [h, 2f], [m, f] x [f, h]),
their data gradients and their weight gradients. Each time is the median of ``REPLAYS`` timed runs
(CUDA events) after warm-ups; random normal data (never zeros).

    python3 benchmarks/gpu/moe_grouped_gemm.py OUT.json            # 8 s of timing on one H200 (2026-11-28)
    python3 benchmarks/gpu/moe_grouped_gemm.py OUT.json --device cpu --tiny   # a check of the script

The advisor is not fitted to the result; ``tables/moe_gemm_probe.py`` sets it beside the model.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

import script_cli  # this folder's shared timing (run as a script, the folder is on the path)

STREAMS = 4
"""Transformer Engine's GEMM streams (``num_streams`` of its multi-stream cuBLAS GEMM)."""
REPLAYS, WARMUPS = 15, 3
DEADLINE_S = 150.0
GROUPED_MM = False
"""torch._grouped_mm is left out: on torch 2.11 (H200, 2026-11-28) a run with it ended in an illegal
memory access that took the CUDA context, and every later shape, with it."""

# (model, h, f, G local experts, m copies per expert): the published runs' layouts at balanced
# routing (tables/published_moe.py), then an m sweep of Qwen3-30B-A3B's experts for the fixed cost.
SHAPES = (
    ("qwen3-30b-a3b", 2048, 768, 8, 4096),     # EP 16, MBS 1
    ("qwen3-30b-a3b", 2048, 768, 16, 2048),    # EP 8, MBS 1
    ("qwen3-30b-a3b", 2048, 768, 16, 4096),    # EP 8, MBS 2
    ("qwen3-235b-a22b", 4096, 1536, 4, 4096),  # EP 32, TP 2 (SP)
    ("deepseek-v3", 7168, 2048, 4, 4096),      # EP 64, TP 2 (SP)
    ("mixtral-8x7b", 4096, 14336, 1, 8192),    # EP 8
    ("qwen3-30b-a3b", 2048, 768, 16, 128),
    ("qwen3-30b-a3b", 2048, 768, 16, 512),
    ("qwen3-30b-a3b", 2048, 768, 16, 1024),
    ("qwen3-30b-a3b", 2048, 768, 16, 8192),    # B200 EP 8, MBS 4
    ("qwen3-30b-a3b", 2048, 768, 32, 2048),
    ("qwen3-235b-a22b", 4096, 1536, 16, 4096),
    ("deepseek-v3", 7168, 2048, 8, 4096),
)
TINY = (("tiny", 64, 32, 4, 48), ("tiny", 64, 32, 2, 16))


def operands(h: int, f: int, m: int) -> dict[str, tuple[int, int, int]]:
    """The six GEMM calls of one expert as (rows, inner, columns)."""
    return {"fc1_fwd": (m, h, 2 * f), "fc2_fwd": (m, f, h), "fc2_dgrad": (m, h, f), "fc2_wgrad": (f, m, h),
            "fc1_dgrad": (m, 2 * f, h), "fc1_wgrad": (h, m, 2 * f)}


class Call:
    """One call's operands for G experts, BF16 and FP8, allocated once."""

    def __init__(self, groups: int, rows: int, inner: int, cols: int, device: str) -> None:
        self.groups, self.shape = groups, (rows, inner, cols)
        make = lambda *s: torch.randn(*s, device=device, dtype=torch.bfloat16)  # noqa: E731
        self.a = [make(rows, inner) for _ in range(groups)]
        self.b = [make(inner, cols) for _ in range(groups)]
        self.out = [torch.empty(rows, cols, device=device, dtype=torch.bfloat16) for _ in range(groups)]
        self.fp8 = device == "cuda" and hasattr(torch, "_scaled_mm")
        if self.fp8:  # _scaled_mm wants A row-major and B column-major
            self.a8 = [a.to(torch.float8_e4m3fn) for a in self.a]
            self.b8 = [b.t().contiguous().to(torch.float8_e4m3fn).t() for b in self.b]
            self.scale = torch.ones((), device=device, dtype=torch.float32)

    def gemm(self, i: int) -> None:
        torch.matmul(self.a[i], self.b[i], out=self.out[i])

    def gemm_fp8(self, i: int) -> None:
        self.out[i] = torch._scaled_mm(self.a8[i], self.b8[i], scale_a=self.scale, scale_b=self.scale,
                                       out_dtype=torch.bfloat16)

    def flops(self) -> float:
        rows, inner, cols = self.shape
        return 2.0 * self.groups * rows * inner * cols


def run_streams(call: Call, gemm, streams: list) -> None:
    """Round-robin over ``streams``, forked from and joined to the current stream (TE's pattern)."""
    main = torch.cuda.current_stream()
    fork = torch.cuda.Event()
    fork.record(main)
    for s in streams:
        s.wait_event(fork)
    for i in range(call.groups):
        with torch.cuda.stream(streams[i % len(streams)]):
            gemm(i)
    for s in streams:
        done = torch.cuda.Event()
        done.record(s)
        main.wait_event(done)


def median_seconds(fn, device: str) -> tuple[float, float]:
    """(median, interquartile range) of ``REPLAYS`` runs of ``fn`` after ``WARMUPS``."""
    times = script_cli.sample_seconds(fn, device, REPLAYS, WARMUPS)
    quartiles = statistics.quantiles(times, n=4)
    return statistics.median(times), quartiles[2] - quartiles[0]


def graphed(fn, device: str):
    """``fn`` captured in a CUDA graph and replayed (no host launches); on the CPU, ``fn``."""
    if device != "cuda":
        return fn
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture (cuBLAS workspaces, handles)
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def modes(call: Call, device: str, streams: list, precisions: str) -> dict:
    """Each mode's callable for one call."""
    serial = lambda gemm: (lambda: [gemm(i) for i in range(call.groups)])  # noqa: E731
    found = {}
    if precisions in ("bf16", "all"):
        found = {"eager": serial(call.gemm), "serial": graphed(serial(call.gemm), device)}
        if device == "cuda":
            found["streams4"] = graphed(lambda: run_streams(call, call.gemm, streams), device)
    if device == "cuda" and precisions in ("fp8", "all"):
        if call.fp8:
            found["fp8_serial"] = graphed(serial(call.gemm_fp8), device)
            found["fp8_streams4"] = graphed(lambda: run_streams(call, call.gemm_fp8, streams), device)
    return found


def one_and_grouped(call: Call, device: str) -> dict:
    """The single-GEMM reference and torch's grouped GEMM (rows-stacked shapes only)."""
    rows, inner, cols = call.shape
    found = {}
    stacked = torch.cat(call.a)
    out = torch.empty(stacked.shape[0], cols, device=device, dtype=torch.bfloat16)
    found["one"] = graphed(lambda: torch.matmul(stacked, call.b[0], out=out), device)
    if device == "cuda" and GROUPED_MM and hasattr(torch, "_grouped_mm"):
        offsets = torch.arange(1, call.groups + 1, device=device, dtype=torch.int32) * rows
        weights = torch.stack([b.t().contiguous() for b in call.b]).transpose(-2, -1)  # [G, inner, cols]
        try:  # the layouts this torch's kernel takes differ by release: column-major first
            torch._grouped_mm(stacked, weights, offs=offsets, out_dtype=torch.bfloat16)
        except RuntimeError:
            weights = torch.stack(call.b)
            torch._grouped_mm(stacked, weights, offs=offsets, out_dtype=torch.bfloat16)  # fails here, not in capture
        found["grouped_mm"] = graphed(lambda: torch._grouped_mm(stacked, weights, offs=offsets,
                                                                out_dtype=torch.bfloat16), device)
    return found


def measure_shape(model: str, h: int, f: int, groups: int, m: int, device: str, streams: list,
                  precisions: str) -> list[dict]:
    rows_out = []
    for name, (rows, inner, cols) in operands(h, f, m).items():
        call = Call(groups, rows, inner, cols, device)
        found = modes(call, device, streams, precisions)
        if not name.endswith("wgrad") and precisions != "fp8":
            try:
                found.update(one_and_grouped(call, device))
            except Exception as exc:  # noqa: BLE001 - a missing kernel is a result, not a stop
                rows_out.append({"model": model, "call": name, "mode": "grouped_mm", "error": repr(exc)[:300]})
        for mode, fn in found.items():
            try:
                seconds, iqr = median_seconds(fn, device)
                if device == "cuda":
                    torch.cuda.synchronize()  # an error is this mode's, not the next one's
            except Exception as exc:  # noqa: BLE001
                rows_out.append({"model": model, "call": name, "mode": mode, "error": repr(exc)[:300]})
                continue
            rows_out.append({"model": model, "h": h, "f": f, "groups": groups, "m": m, "call": name,
                             "rows": rows, "inner": inner, "cols": cols, "mode": mode, "seconds": seconds,
                             "iqr_seconds": iqr, "tflops": call.flops() / seconds / 1e12})
        del call, found
    return rows_out


def machine(device: str) -> dict:
    info = {"torch": torch.__version__, "device": device}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(name=props.name, sms=props.multi_processor_count, cuda=torch.version.cuda,
                    blas=str(torch.backends.cuda.preferred_blas_library()))
    return info


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (a check of the script)")
    parser.add_argument("--deadline", type=float, default=DEADLINE_S, help="seconds; later shapes are skipped")
    parser.add_argument("--precisions", choices=("bf16", "fp8", "all"), default="all",
                        help="the modes to run: an error that takes the CUDA context ends only its own process")
    args = parser.parse_args()
    started = time.perf_counter()
    streams = [torch.cuda.Stream() for _ in range(STREAMS)] if args.device == "cuda" else []
    result = {"machine": machine(args.device), "streams": STREAMS, "replays": REPLAYS, "rows": [], "skipped": [],
              "errors": []}
    for shape in TINY if args.tiny else SHAPES:
        if time.perf_counter() - started > args.deadline:
            result["skipped"].append(shape)
            continue
        try:
            result["rows"] += measure_shape(*shape, args.device, streams, args.precisions)
        except Exception:  # noqa: BLE001 - keep the other shapes
            result["errors"].append({"shape": shape, "traceback": traceback.format_exc()[-2000:]})
        result["seconds"] = time.perf_counter() - started
        args.out.write_text(json.dumps(result, indent=1) + "\n")  # after each shape: a crash keeps the rest
        if args.device == "cuda":
            torch.cuda.empty_cache()
    for row in result["rows"]:
        if "seconds" in row and row["call"] in ("fc1_fwd", "fc1_wgrad"):
            print(f"{row['model']:>16} G{row['groups']:<3} m{row['m']:<5} {row['call']:<9} {row['mode']:<12} "
                  f"{row['seconds'] * 1e6:9.1f} us {row['tflops']:7.1f} TF/s")
    print(f"{len(result['rows'])} rows, {len(result['errors'])} errors, {len(result['skipped'])} skipped, "
          f"{result['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
