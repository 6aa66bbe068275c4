"""Time terms of the training levers beyond the paper's stack: Megatron-FSDP's per-microbatch
collectives, optimizer CPU offload, FP8 GEMMs. Same conventions as ``terms.py``: seconds on one
GPU, bytes, numpy arrays that broadcast over layouts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from advisor.errors import AdvisorError
from advisor.hardware import GpuSpec
from advisor.throughput.terms import (BF16, Rates, TpBytes, elementwise_time, grad_zero_time, optimizer_time,
                                      ring_collective_time)

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


NON_TN_FP8_ARCHITECTURES = ("blackwell",)
"""Where an FP8 GEMM takes operands in any layout, so no transposed copy is written
(``nvte_is_non_tn_fp8_gemm_supported``: compute capability 10.0 and up); Hopper and Ada take TN only."""


@dataclass(frozen=True)
class Fp8Casts:
    """HBM bytes per element Transformer Engine moves to quantise one BF16 GEMM operand to FP8
    (``fp8_casts``): ``operand``, an operand quantised by a kernel of its own (a GEMM input that
    no TE norm produced, every output gradient); ``normed``, the input of a LayerNormLinear
    (QKV, a dense FC1, MLA's up projections with their norm), beyond the BF16 write of the
    norm priced as an elementwise term. A sequence-parallel operand that TE all-gathers (TP > 1:
    a column-parallel layer's input, a row-parallel layer's output gradient) is quantised on the
    local shard at ``gathered_operand`` (``gathered_normed``) per element, and the gathered
    tensor (TP times the shard) transposed for wgrad at ``transpose`` per element
    (``gathered_cast_bytes``)."""
    operand: float
    normed: float
    gathered_operand: float
    gathered_normed: float
    transpose: float


def fp8_casts(recipe: str, architecture: str) -> Fp8Casts:
    """``Fp8Casts`` of an FP8 recipe on a GPU, from Transformer Engine v2.8's dispatch (commit
    40c69e75; v2.5-v2.7 checked where they differ). A training GEMM needs each operand row-wise
    (fprop, dgrad) and column-wise (wgrad); on Hopper an FP8 GEMM takes only the TN layout
    (``nvte_is_non_tn_fp8_gemm_supported``, common/transformer_engine.cpp:715-723: compute
    capability 10.0 and up), so the per-tensor recipes write a transposed FP8 copy too, in the
    same kernel (``cast_transpose``, common/transpose/cast_transpose.cu; pytorch/csrc/
    quantizer.cpp:325-345). Per element, read BF16 (2), write FP8 (1) and on Hopper its
    transpose (1):
    - delayed: one kernel, the scale from the amax history: 4 (3 on Blackwell); normed, the norm
      writes FP8 itself, 1 byte instead of its BF16 2, and on Hopper ``nvte_transpose`` reads and
      writes it again (rmsnorm_api.cpp:96-104): +1 (-1 on Blackwell);
    - tensorwise (current scaling): first a full read for the amax (``amax_kernel``,
      recipe/current_scaling.cu; ``Float8CurrentScalingQuantizer::quantize_impl``, quantizer.cpp:
      497-549), then the cast: 6 (5); normed, the norm finds the amax as it writes (v2.7 and up,
      csrc/extensions/normalization.cpp), then the cast: 4 (3);
    - blockwise (1 x 128 blocks) and mxfp8 (32-element E8M0 blocks): one kernel writing both
      directions with their scales, FP32 per 128 (2 x 4 / 128) or one byte per 32 (2 / 32):
      4.0625 either way, normed or not (the norm writes BF16).
    With sequence parallelism (Transformer Engine 2.9, core_v0.15.2's pin; TE 1.11, NeMo 24.09/24.12's,
    the same for delayed scaling) a gathered operand is cast on the local shard before the FP8
    all-gather and the wgrad copy made after it, over the gathered tensor: the per-tensor recipes
    cast row-wise only (``_Linear.forward``, ``_LayerNormLinear.forward``: ``set_usage(columnwise=
    False)`` where ``supports_only_rowwise_all_gather``; ``_all_gather_fp8`` for the gradient), so
    1 byte less (the norm's ``nvte_transpose`` gone too), and on Hopper transpose the gathered
    tensor, read 1 and write 1 (``_all_gather_fp8``/``Float8TensorStorage.update_usage``:
    ``_create_transpose``; TE 1.11, ``tex.fp8_transpose`` of ``ln_out_total`` and of the
    gathered gradient in ``grad_output_preprocess``); blockwise casts both directions in its
    compact format, gathers both and transposes the gathered column-wise data, read 1 and write 1
    on any GPU (``_post_process_fp8_blockwise_gather``, ``_transpose_columnwise_data``: its
    scales need no transpose, the row-wise scales' 2 x 4 / 128 are left out); MXFP8 gathers both
    GEMM-ready, no transpose (``_all_gather_mxfp8``).
    Left out: the bias gradients' separate sum under current scaling, and whether a small
    expert's slice leaves L2 between the amax pass and the cast."""
    transposed = 0.0 if architecture in NON_TN_FP8_ARCHITECTURES else 1.0
    if recipe == "tensorwise":
        return Fp8Casts(operand=5 + transposed, normed=3 + transposed, gathered_operand=5, gathered_normed=3,
                        transpose=2 * transposed)
    if recipe == "delayed":
        return Fp8Casts(operand=3 + transposed, normed=-1 + 2 * transposed, gathered_operand=3, gathered_normed=-1,
                        transpose=2 * transposed)
    both = 4 + 2 * 4 / 128 if recipe == "blockwise" else 4 + 2 / 32
    return Fp8Casts(operand=both, normed=both, gathered_operand=both, gathered_normed=both,
                    transpose=2.0 if recipe == "blockwise" else 0.0)


def gathered_cast_bytes(tokens, width, tp, casts: Fp8Casts, normed: bool = False):
    """(cast, transpose) HBM bytes on one GPU of quantising an operand [tokens, width] that
    sequence parallelism all-gathers before its GEMM (``fp8_casts``): the cast on the local
    shard, tokens / t rows, where the operand is made (the forward for an input, the backward
    for a gradient), and the backward's transpose of the gathered tensor, all tokens, for wgrad.
    At TP 1 nothing is gathered: the plain cast over all tokens, no transpose."""
    t = np.asarray(tp, dtype=float)
    gathered = t > 1
    plain, local = (casts.normed, casts.gathered_normed) if normed else (casts.operand, casts.gathered_operand)
    elements = np.asarray(tokens, dtype=float) * width
    return elements * np.where(gathered, local, plain) / t, elements * np.where(gathered, casts.transpose, 0.0)


SCALE_BYTES = {"delayed": 0.0, "tensorwise": 0.0, "blockwise": 4 / 128, "mxfp8": 1 / 32}
"""Scale bytes per element an FP8 all-gather moves beside the data, one direction: none for the
per-tensor recipes (one scale, the same on every rank: ``_all_gather_fp8`` copies it, no
collective), an FP32 per 1 x 128 block (``_all_gather_fp8_blockwise``), an E8M0 byte per 32
(``_all_gather_mxfp8``)."""


def fp8_tp_bytes(recipe: str) -> TpBytes:
    """Bytes per element of each sequence-parallel collective of a layer under an FP8 recipe, from
    Transformer Engine 2.9 (the release core_v0.15.2 pins; TE 1.11, NeMo 24.09/24.12's, the same for
    delayed scaling, its only recipe). ``LayerNormLinear.forward`` (QKV, FC1) quantises the norm's
    output on the local shard before ``gather_along_first_dim``, row-wise only, so the input
    all-gather moves FP8 (1 byte and the recipe's scales, ``SCALE_BYTES``; the same for the
    backward's re-gather, ``_LayerNormLinear.backward``, and with userbuffers, whose all-gather
    buffers are FP8 whenever FP8 runs: ``initialize_ub``, ``fp8_buf`` on every
    ``layers_all_gather_overlap`` buffer). ``grad_output_preprocess`` (projection, FC2) quantises the
    output gradient before its all-gather: row-wise only for the per-tensor recipes (the Hopper
    transpose is made after the gather, ``_all_gather_fp8``), both directions for the block-scaled
    ones, which cannot transpose scales (``_all_gather_fp8_blockwise``, ``_all_gather_mxfp8``):
    2 x (1 + scales), above BF16's 2; with userbuffers MXFP8 gathers the row-wise copy by ring
    exchange and the column-wise one beside the same dgrad (``_Linear.backward``,
    ``bulk_overlap_ag_with_external_gemm``): the same bytes. The reduce-scatters sum partial
    outputs in BF16 (``reduce_scatter_along_first_dim`` of the GEMM's activation-dtype output);
    through a userbuffers buffer with ``fp8_buf`` (``Userbuffer.fp8_buf``) the GEMM writes FP8 and
    the buffer is reduced in FP8 (``split_overlap_rs``, ``reducescatter2_userbuff_stridedoutput_fp8``;
    ring exchange's ``reduce_fp8_in_bf16_out``), which only delayed scaling's fused FP8-output GEMM
    can feed (``gemm.cpp``: every other recipe's output is quantised after a BF16 GEMM): 1 byte under
    delayed, BF16 otherwise."""
    scale = SCALE_BYTES[recipe]
    grad_gather = 1.0 if recipe in ("delayed", "tensorwise") else 2 * (1 + scale)
    return TpBytes(input_gather=1 + scale, output_scatter=BF16, grad_gather=grad_gather, dgrad_scatter=BF16,
                   fp8_scatter=1.0 if recipe == "delayed" else BF16)


@dataclass(frozen=True)
class Fp8Gemms:
    """What --fp8-format changes in a layer's time, one fact for the dense and the MoE models:
    the linear layers' GEMM ``rates`` (``fp8_rates``), the ``casts`` that quantise their
    operands (``fp8_casts``), and the ``recipe`` whose sequence-parallel collectives move FP8
    (``collectives``)."""
    rates: Rates
    casts: Fp8Casts
    recipe: str = "delayed"

    @property
    def collectives(self) -> TpBytes:
        """Bytes per element of the layer's sequence-parallel collectives (``fp8_tp_bytes``)."""
        return fp8_tp_bytes(self.recipe)


def fp8_gemms(rates: Rates, gpu: GpuSpec, recipe: str) -> Fp8Gemms:
    """``Fp8Gemms`` of an FP8 recipe on ``gpu``; AdvisorError where the GPU cannot run it."""
    return Fp8Gemms(fp8_rates(rates, gpu, recipe), fp8_casts(recipe, gpu.architecture), recipe)


class CastBytes(NamedTuple):
    """HBM bytes of FP8 casts on one GPU: the ``forward``'s, the ``backward``'s, and of those the
    backward's ``transposes`` of sequence-parallel gathered operands (``gathered_cast_bytes``),
    which a model pricing its backward from its forward adds on its own."""
    forward: object
    backward: object
    transposes: object


def fp8_attention_cast_bytes(spec, tokens, tp, casts: Fp8Casts) -> CastBytes:
    """``CastBytes`` of GQA attention's two GEMMs, ``casts`` per element: forward QKV's input h
    (its LayerNormLinear's, normed, gathered) and the projection's a d; backward their output
    gradients (a + 2k) d and h (the projection's, row-parallel, gathered) and the transposes of
    the two gathered operands (``gathered_cast_bytes``); the rest split over TP."""
    h, a, k, d = spec.hidden_size, spec.num_attention_heads, spec.num_query_groups, spec.head_dim
    t = np.asarray(tp, dtype=float)
    qkv_input, qkv_transpose = gathered_cast_bytes(tokens, h, tp, casts, normed=True)
    proj_gradient, proj_transpose = gathered_cast_bytes(tokens, h, tp, casts)
    transposes = qkv_transpose + proj_transpose
    return CastBytes(qkv_input + tokens * casts.operand * a * d / t,
                     casts.operand * tokens * (a + 2 * k) * d / t + proj_gradient + transposes, transposes)


def fp8_mlp_cast_bytes(hidden: int, ffn, tokens, tp, casts: Fp8Casts, normed: bool = True) -> CastBytes:
    """``CastBytes`` of a SwiGLU MLP's two GEMMs, ``casts`` per element: forward FC1's input
    ``hidden`` (normed where FC1 is a LayerNormLinear, a dense layer's; an MoE layer's pre-MLP
    norm is a module of its own; gathered) and FC2's ``ffn``; backward their output gradients
    2 ``ffn`` and ``hidden`` (FC2's, gathered) and the transposes of the two gathered operands
    (``gathered_cast_bytes``); the rest split over TP (``tp`` 1 for tokens already split and not
    gathered, as the routed experts' copies)."""
    t = np.asarray(tp, dtype=float)
    fc1_input, fc1_transpose = gathered_cast_bytes(tokens, hidden, tp, casts, normed=normed)
    fc2_gradient, fc2_transpose = gathered_cast_bytes(tokens, hidden, tp, casts)
    transposes = fc1_transpose + fc2_transpose
    return CastBytes(fc1_input + tokens * casts.operand * ffn / t,
                     casts.operand * tokens * 2 * ffn / t + fc2_gradient + transposes, transposes)


def fp8_cast_bytes(spec, tokens, tp, casts: Fp8Casts) -> CastBytes:
    """``CastBytes`` of Transformer Engine's FP8 casts in one layer (``casts`` per element):
    attention's (``fp8_attention_cast_bytes``) and the MLP's (``fp8_mlp_cast_bytes``); forward h
    and h normed (gathered), a d and h_ffn on their own; backward (a + 2k) d, h (gathered), 2 h_ffn,
    h (gathered), and the four gathered operands' transposes. Weight casts are once per step and
    left out."""
    attention = fp8_attention_cast_bytes(spec, tokens, tp, casts)
    mlp = fp8_mlp_cast_bytes(spec.hidden_size, spec.ffn_hidden_size, tokens, tp, casts)
    return CastBytes(*(a + b for a, b in zip(attention, mlp)))


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


def times_offload(gpu: GpuSpec) -> bool:
    """Whether ``gpu``'s preset gives both rates optimizer CPU offload is timed with (``host_link``):
    three presets lack the host memory bandwidth (gpus.json: h800-80gb, h100-nvl-94gb, mi300x-192gb)."""
    return gpu.host_link_gb_per_s is not None and gpu.host_memory_gb_per_s is not None


def host_link(gpu: GpuSpec) -> tuple[float, float]:
    """(host link bytes/s one direction, host memory bytes/s) of one GPU; AdvisorError where the
    preset does not say."""
    if not times_offload(gpu):
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


def optimizer_step_time(parameters, shards, rates: Rates, opts, host: tuple[float, float] | None = None):
    """The optimizer step of one optimizer over the rank's ``parameters`` (TP/PP-local), sharded
    over ``shards`` where the optimizer is distributed (not Megatron-FSDP's no_shard): Adam on the
    GPU (``terms.optimizer_time``), or, offloaded (``host``: ``host_link``'s rates, with
    ``opts.optimizer_host_fraction`` > 0), the GPU's share (``gpu_optimizer_time``) plus the host's
    (``offload_time``), with the main-gradient buffer zeroed on the GPU apart
    (``terms.grad_zero_time``: it stays on the GPU, whatever share of Adam is offloaded).
    ``opts``: the time model's options (``advisor.throughput.TimeOptions``). The dense model prices
    its one optimizer with it; the MoE model (``advisor.moe.time``) its dense and its expert one,
    each a HybridDeviceOptimizer of the same --optimizer-offload-fraction over its own shard
    (megatron-core optimizer/__init__.py ``get_megatron_optimizer``)."""
    sharded = opts.distributed_optimizer and opts.fsdp_strategy != "no_shard"
    grads_sharded = opts.fsdp_strategy in ("optim_grads", "optim_grads_params")
    if host is None:
        return optimizer_time(parameters, shards, rates, sharded, opts.optimizer_step_bytes, opts.grad_zero_bytes,
                              grads_sharded)
    parameters = np.asarray(parameters, dtype=float)
    shard = parameters / np.where(sharded, np.asarray(shards, dtype=float), 1.0)
    fraction = opts.optimizer_host_fraction
    zeroing = grad_zero_time(parameters, shards, rates, opts.grad_zero_bytes, grads_sharded)
    gpu = gpu_optimizer_time(shard, fraction, rates, opts.optimizer_step_bytes)
    return zeroing + gpu + offload_time(shard, fraction, opts.grad_reduce_bytes, *host)
