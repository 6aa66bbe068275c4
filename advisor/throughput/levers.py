"""Time terms of the training levers beyond the paper's stack: Megatron-FSDP's per-microbatch
collectives, optimizer CPU offload, FP8 GEMMs. Same conventions as ``terms.py``: seconds on one
GPU, bytes, numpy arrays that broadcast over layouts.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from advisor.errors import AdvisorError
from advisor.hardware import GpuSpec
from advisor.throughput.terms import BF16, Rates, elementwise_time, ring_collective_time

FP8_EFFICIENCY_NOTE = (
    "FP8 GEMMs are priced at the GPU's dense FP8 peak times the same sustained fraction the calibration "
    "measured for BF16 GEMMs on that architecture: Transformer Engine's FP8 GEMMs are assumed to reach the same "
    "fraction of their (twice as high) peak as BF16 ones do of theirs. Measured on one H200 (per-tensor FP8 "
    "cuBLAS GEMMs of MoE experts, casts not timed): within 6% for hidden sizes of 4096 and more, 11-24% "
    "optimistic for Qwen3-30B-A3B's thin experts (hidden 2048, width 768), where FP8 ran 1.5-1.7x BF16.")
"""The stated assumption behind ``fp8_rates`` (issue 21 asks for it to be said), and what one GPU
measurement says of it (``python -m tables.moe_gemm_probe``)."""


MXFP8_ARCHITECTURES = ("blackwell",)
"""MXFP8's block scales (32 elements per E8M0 scale) are a Blackwell tensor-core format:
Transformer Engine refuses the recipe on earlier GPUs (transformer_engine/pytorch/fp8.py,
``check_mxfp8_support``: compute capability 10.0 or newer)."""


def fp8_rates(rates: Rates, gpu: GpuSpec, recipe: str = "delayed") -> Rates:
    """The rates with the GEMMs at FP8: the sustained BF16 GEMM rate scaled by the vendor's FP8 to
    BF16 dense peak ratio (``FP8_EFFICIENCY_NOTE``); attention stays BF16 (Transformer Engine runs
    core attention in BF16 unless FP8 attention is asked for). AdvisorError for FP8 the GPU cannot
    run."""
    if gpu.fp8_dense_tflops is None:
        raise AdvisorError(f"{gpu.name} has no FP8 tensor cores (gpus.json lists no FP8 rate): drop --fp8-format")
    if recipe == "mxfp8" and gpu.architecture not in MXFP8_ARCHITECTURES:
        raise AdvisorError(f"--fp8-recipe mxfp8 needs Blackwell tensor cores; {gpu.name} is {gpu.architecture}: "
                           "use --fp8-recipe delayed, tensorwise or blockwise")
    return replace(rates, gemm_flops_per_s=rates.gemm_flops_per_s * gpu.fp8_dense_tflops / gpu.bf16_dense_tflops)


def fp8_cast_bytes(spec, tokens, tp):
    """(forward, backward) HBM bytes of Transformer Engine's FP8 casts in one layer: each of the
    four GEMMs (QKV, proj, FC1, FC2) reads its BF16 input and writes it in FP8 (3 bytes per
    element) forward, and its BF16 output gradient the same way backward. Inputs: h (QKV), a d
    (proj), h (FC1), h_ffn (FC2); output gradients: (a + 2k) d (QKV), h (proj), 2 h_ffn (FC1),
    h (FC2); all split over TP. Weight casts are once per step and left out."""
    h, a, k, d, f = spec.hidden_size, spec.num_attention_heads, spec.num_query_groups, spec.head_dim, spec.ffn_hidden_size
    t = np.asarray(tp, dtype=float)
    forward = 3 * tokens * (2 * h + a * d + f) / t
    backward = 3 * tokens * ((a + 2 * k) * d + 2 * h + 2 * f) / t
    return forward, backward


def fsdp_microbatch_time(parameters, shards, bandwidth, rates: Rates, strategy: str | None, param_bytes=BF16,
                         grad_bytes=4):
    """(forward, backward) Megatron-FSDP collective time per microbatch over the DP x CP group,
    for ``parameters`` on one GPU of a stage: optim_grads_params all-gathers each layer's weights
    before its forward and again before its backward (they are freed after use), and
    optim_grads and optim_grads_params reduce-scatter each layer's gradients after its backward
    (their gradient buffer is sharded: ``megatron_fsdp.py``, ``_register_backward_hooks`` and
    the all-gather pipeline). Ring collectives as ``terms.ring_collective_time``. Zero for the
    strategies that shard no gradients."""
    zero = 0.0 * np.asarray(parameters, dtype=float)
    if strategy not in ("optim_grads", "optim_grads_params"):
        return zero, zero
    scatter = ring_collective_time(grad_bytes * parameters, shards, bandwidth, rates)
    if strategy == "optim_grads":
        return zero, scatter
    gather = ring_collective_time(param_bytes * parameters, shards, bandwidth, rates)
    return gather, gather + scatter


def host_link(gpu: GpuSpec) -> tuple[float, float]:
    """(host link bytes/s one direction, host memory bytes/s) of one GPU; AdvisorError where the
    preset does not say."""
    if gpu.host_link_gb_per_s is None or gpu.host_memory_gb_per_s is None:
        raise AdvisorError(f"{gpu.name}: gpus.json gives no host link or host memory bandwidth, so optimizer CPU "
                           "offload cannot be timed; use a preset that does (advisor gpus)")
    return gpu.host_link_gb_per_s * 1e9, gpu.host_memory_gb_per_s * 1e9


CPU_ADAM_BYTES = 30
"""Host memory traffic of one CPU Adam update per parameter: read the FP32 gradient, read and
write the FP32 master weight, momentum and variance (4 + 3 x 8), and write the BF16 copy sent
back (2): as ``terms.optimizer_time``'s 30 bytes, on the host."""


def offload_time(shard, fraction: float, gradient_bytes, link_bytes_per_s: float, memory_bytes_per_s: float):
    """Seconds of the offloaded part of an optimizer step (Megatron's HybridDeviceOptimizer,
    megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py): ``fraction`` of the rank's
    ``shard`` of parameters copies its gradients to pinned host memory (D2H, ``gradient_bytes``
    each), runs torch's AdamW on the CPU, and copies the BF16 parameters back (H2D, 2 bytes).
    The CPU step is priced at the host memory bandwidth available to one GPU (a roofline bound:
    torch's CPU AdamW does not beat it); the copies at the host link's one-direction rate, not
    overlapped with the CPU step (the bound the other way)."""
    offloaded = fraction * np.asarray(shard, dtype=float)
    copies = offloaded * (gradient_bytes + BF16) / link_bytes_per_s
    return copies + offloaded * CPU_ADAM_BYTES / memory_bytes_per_s


def gpu_optimizer_time(shard, fraction: float, rates: Rates, step_bytes: float = 38.0):
    """The GPU's part of the step: ``terms.optimizer_time``'s bytes per parameter over the
    parameters not offloaded."""
    return elementwise_time(step_bytes * (1.0 - fraction) * np.asarray(shard, dtype=float), rates)
