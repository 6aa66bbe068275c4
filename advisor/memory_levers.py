"""Memory terms of the training levers beyond seed 004: Megatron-FSDP's sharding and its
buffers, optimizer CPU offload, and Transformer Engine FP8. Each is per GPU, in bytes, and
broadcasts over numpy layouts like ``advisor.memory``; with every lever off each term is zero
(or the paper's value), so seed 004's tables stay exact.
"""

from __future__ import annotations

import numpy as np

from advisor import equations as eq
from advisor.models import LlamaSpec

FSDP_AG_PREFETCH_ELEMENTS = 500_000_000
"""Megatron-FSDP's all-gather prefetch budget: ``suggested_AG_prefetch_size`` =
``suggested_communication_unit_size // 2``, and that size is ``ddp_config.suggested_communication_unit_size
or 1_000_000_000`` (megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py, both checkouts)."""
FSDP_RS_QUEUE_ELEMENTS = 1_000_000_000
"""Megatron-FSDP's reduce-scatter queue: ``suggested_RS_queue_capacity`` (same place): unsharded
gradient buckets wait there until this many elements are queued."""

SHARDING = {None: None, "no_shard": (False, False, False), "optim": (True, False, False),
            "optim_grads": (True, True, False), "optim_grads_params": (True, True, True)}
"""(optimizer states and main weights, gradients, weights) sharded, per Megatron-FSDP strategy:
``ParamAndGradBuffer._init_each_parameter_group_buffers`` (is_main_weight_buffer_distributed,
is_grad_buffer_distributed, is_model_weight_buffer_distributed) in param_and_grad_buffer.py."""


def state_bytes_per_parameter(options, shards):
    """(weights, gradients, optimizer) bytes per parameter on one GPU, over ``shards`` = DP x CP.

    DDP (seed 004, Eq. 4 and 10): BF16 weights, the main-gradient buffer (FP32, or BF16 with
    --grad-reduce-in-bf16), 12 bytes of FP32 master weight, momentum and variance, divided by
    DP x CP with the distributed optimizer. Megatron-FSDP divides what its strategy shards
    (``SHARDING``): no_shard nothing, optim the 12 bytes, optim_grads also the gradients,
    optim_grads_params also the weights. CPU offload keeps ``optimizer_host_fraction`` of the
    optimizer states in host memory (Megatron's HybridDeviceOptimizer moves those parameters'
    master weights and Adam states to the CPU), so only the rest stays on the GPU."""
    shards = np.asarray(shards, dtype=float)
    sharding = SHARDING[options.fsdp_strategy]
    if sharding is None:
        optimizer_sharded, grads_sharded, weights_sharded = options.distributed_optimizer, False, False
    else:
        optimizer_sharded, grads_sharded, weights_sharded = sharding
    weights = options.element_bytes / np.where(weights_sharded, shards, 1.0)
    gradients = options.gradient_bytes / np.where(grads_sharded, shards, 1.0)
    optimizer = eq.optimizer_bytes_per_parameter(np.where(optimizer_sharded, shards, 1.0))
    return weights, gradients, optimizer * (1.0 - options.optimizer_host_fraction)


def fsdp_buffer_bytes(options, unit_parameters, layers):
    """(gathered weights, queued gradients): the unsharded buffers Megatron-FSDP holds at a
    rank's peak, for ``layers`` decoder layers of ``unit_parameters`` each (its FSDP unit is the
    transformer layer).

    optim_grads_params gathers a unit's weights before it runs and prefetches the next units up
    to ``FSDP_AG_PREFETCH_ELEMENTS``: the unit in use plus min(prefetch budget, the other
    layers). optim_grads and optim_grads_params produce each unit's full gradient and queue it
    for the reduce-scatter until ``FSDP_RS_QUEUE_ELEMENTS`` are queued: min(all layers, the
    queue plus the unit being produced). Both in the stage's element and gradient dtypes."""
    sharding = SHARDING[options.fsdp_strategy]
    layers = np.asarray(layers, dtype=float)
    zero = 0.0 * layers * unit_parameters
    if sharding is None:
        return zero, zero
    _, grads_sharded, weights_sharded = sharding
    held = layers * unit_parameters
    gathered = np.minimum(held, unit_parameters + np.minimum(FSDP_AG_PREFETCH_ELEMENTS, held - unit_parameters))
    queued = np.minimum(held, FSDP_RS_QUEUE_ELEMENTS + unit_parameters)
    weights = options.element_bytes * np.maximum(gathered, 0.0) if weights_sharded else zero
    gradients = options.gradient_bytes * queued if grads_sharded else zero
    return weights + zero, gradients + zero


def linear_parameters(spec: LlamaSpec, tp) -> float:
    """The GEMM weights of one layer on one GPU (QKV, output projection, FC1 with gate, FC2):
    Eq. 6 without the two RMSNorm weights; what Transformer Engine runs in FP8."""
    return eq.layer_parameters(spec, tp) - eq.layer_norm_parameters(spec)


FP8_SCALE_BYTES = {"delayed": 0.0, "tensorwise": 0.0, "blockwise": 0.0, "mxfp8": 1 / 32}
"""Scale bytes per FP8 element: MXFP8 keeps one E8M0 scale per 32 elements (Transformer Engine,
'Using FP8 with Transformer Engine', MXFP8 recipe); per-tensor and 128-element block scales
are a few bytes per tensor or per 128 x 128 block, which we count as zero."""
AMAX_TENSORS_PER_LAYER = 4 * 3
"""Delayed scaling's FP8 tensors per layer: the 4 GEMM modules (QKV, proj, FC1, FC2) each
scale their input, weight and output-gradient (Transformer Engine ``fp8_meta``, forward and
backward ``amax_history``)."""


def fp8_weight_bytes_per_layer(spec: LlamaSpec, tp, options):
    """The FP8 weight copies Transformer Engine keeps per layer beyond the BF16 weights, and its
    amax history. With FP8 GEMMs on Hopper, TE caches each weight quantized twice, row-wise for
    the forward GEMM and column-wise (the transpose) for the data-gradient GEMM: 2 bytes per
    GEMM weight (plus MXFP8's scales). --fp8-param-gather keeps the weight only in FP8 (no BF16
    copy), so the BF16 bytes of those weights come off. Delayed scaling keeps
    ``--fp8-amax-history-len`` FP32 amax values plus a scale and its inverse per FP8 tensor."""
    if options.fp8_format is None:
        return 0.0 * np.asarray(tp, dtype=float)
    linear = linear_parameters(spec, tp)
    copies = 2 * (1 + FP8_SCALE_BYTES[options.fp8_recipe]) * linear
    dropped = options.element_bytes * linear if options.fp8_param_gather else 0.0
    amax = 4 * (options.fp8_amax_history_len + 2) * AMAX_TENSORS_PER_LAYER if options.fp8_recipe == "delayed" else 0
    return copies - dropped + amax


def fp8_activation_saving(spec: LlamaSpec, seq_len: int, mbs, options):
    """(saved with SP/TP split, saved that stays whole per TP rank without SP): bytes that one
    layer's activations shrink by for one microbatch when the GEMM inputs are saved in FP8.
    Transformer Engine saves each FP8 GEMM's input quantized (1 byte, plus MXFP8's scales) for
    its weight-gradient GEMM instead of BF16 (2 bytes): the QKV input (sbh), the attention
    output entering the projection (sb a d), the FC1 input (sbh) and the SwiGLU output entering
    FC2 (sb h_ffn) of Eq. 11-12. The QKV and FC1 inputs are among the 8sbh that tensor
    parallelism alone leaves whole."""
    zero = 0.0 * np.asarray(mbs, dtype=float)
    if options.fp8_format is None:
        return zero, zero
    per_element = 1 - FP8_SCALE_BYTES[options.fp8_recipe]  # 2 bytes become 1 (+ scale)
    tokens = seq_len * np.asarray(mbs, dtype=float)
    split = per_element * tokens * (spec.query_size + spec.ffn_hidden_size)
    whole = per_element * tokens * 2 * spec.hidden_size
    return split + zero, whole + zero


def host_optimizer_bytes(parameters, shards, options):
    """Host (CPU) memory of the offloaded optimizer per GPU: its share of the FP32 master weight,
    momentum and variance (12 bytes per parameter, divided by DP x CP as on the GPU), plus the
    pinned FP32 gradient and parameter copies HybridDeviceOptimizer keeps (``cpu_copy_map_grad``,
    pinned params: 4 + 4 bytes)."""
    sharding = SHARDING[options.fsdp_strategy]
    sharded = options.distributed_optimizer if sharding is None else sharding[0]
    per_gpu = np.asarray(parameters, dtype=float) / np.where(sharded, np.asarray(shards, dtype=float), 1.0)
    return options.optimizer_host_fraction * per_gpu * (eq.OPTIMIZER_BYTES + 8)
