"""The time terms, one function each, with its source; the one place they live.

Every function takes numpy arrays (or scalars) for the layout quantities and broadcasts, with
no Python branch on their values, so that a sweep prices thousands of layouts in one call.
Times are seconds on one GPU; sizes are bytes; ``rates`` is a ``Rates``: the GPU preset's
numbers and the calibration's, resolved once.

Rank order: Megatron-LM builds its groups in the order tp-cp-ep-dp-pp (``parallel_state``,
``order="tp-cp-ep-dp-pp"``), so a TP group is ``tp`` consecutive ranks, a CP group strides by
tp, a DP group by tp x cp, and pipeline neighbours are tp x cp x dp ranks apart. A group uses
NVLink when it fits in one node of ``gpus_per_node`` GPUs, the network otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from advisor.hardware import GpuSpec
from advisor.models import LlamaSpec
from advisor.throughput.calibration import Calibration
from advisor.throughput.flops import attention_executed_flops, layer_gemm_shapes

BF16 = 2
"""Bytes per BF16 element (activations, weights, TP/CP/PP messages)."""


@dataclass(frozen=True, slots=True)
class Rates:
    """What the terms need from a GPU preset and a calibration, in seconds, bytes and FLOPs."""

    gemm_flops_per_s: float
    gemm_latency_s: float
    attention_flops_per_s: float
    attention_latency_s: float
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float
    network_bytes_per_s: float
    collective_latency_s: float
    gpus_per_node: int
    host_mask_s_per_element: float
    network_efficiency: float = 1.0
    """The fitted efficiency already in ``nvlink_bytes_per_s`` and ``network_bytes_per_s``
    (``Calibration.network_efficiency``, fitted on seed 004's ring collectives): a rate measured
    against the line rate itself (``moe.ep_time.A2A_NETWORK_FRACTION``) divides it out (``line_network_bytes_per_s``)."""

    @property
    def line_network_bytes_per_s(self) -> float:
        """The network's line rate a GPU, the preset's (the fitted efficiency divided out)."""
        return self.network_bytes_per_s / self.network_efficiency

    @classmethod
    def of(cls, gpu: GpuSpec, cal: Calibration, flash2: bool = False) -> "Rates":
        kernels = cal.kernels_for(gpu.architecture)
        # The fitted attention factor is how FlashAttention-2 ran inside the paper's 2024 stack
        # (Transformer Engine 1.9); a current fused kernel gets the GEMMs' in-run factor instead.
        attention = kernels.attention_flash2 * cal.attention_factor if flash2 else kernels.attention * cal.compute_factor
        host = cal.host_mask_ns_per_element * 1e-9
        if gpu.host_dram_mt_per_s:
            host *= cal.host_reference_mt_per_s / gpu.host_dram_mt_per_s
        return cls(
            gemm_flops_per_s=cal.compute_factor * kernels.gemm * gpu.peak_flops,
            gemm_latency_s=cal.gemm_latency_s,
            attention_flops_per_s=attention * gpu.peak_flops,
            attention_latency_s=cal.attention_latency_s,
            hbm_bytes_per_s=cal.hbm_efficiency * gpu.hbm_bytes_per_s,
            nvlink_bytes_per_s=cal.network_efficiency * gpu.nvlink_bytes_per_s,
            network_bytes_per_s=cal.network_efficiency * gpu.network_bytes_per_s,
            collective_latency_s=cal.collective_latency_s,
            gpus_per_node=gpu.gpus_per_node,
            host_mask_s_per_element=host,
            network_efficiency=cal.network_efficiency,
        )


# --- compute -------------------------------------------------------------------------------


def gemm_time(m, k, n, rates: Rates):
    """One BF16 GEMM [m, k] x [k, n]: 2mkn FLOPs at the sustained tensor-core rate plus a fixed
    kernel cost (the lead's H100 probe fits this form to 4.9% over 239 Llama shapes)."""
    return 2.0 * m * k * n / rates.gemm_flops_per_s + rates.gemm_latency_s


def layer_gemm_time(spec: LlamaSpec, tokens, tp, rates: Rates):
    """(forward, backward) GEMM time of one layer: the four projections forward, and for each
    a data-gradient and a weight-gradient GEMM of the same size backward (Narayanan et al.
    2021, Appendix: 'each GEMM is performed 3 times')."""
    forward = sum(gemm_time(m, k, n, rates) for m, k, n in layer_gemm_shapes(spec, tokens, tp))
    return forward, 2.0 * forward


def attention_time(spec: LlamaSpec, seq_len, mbs, tp, cp, rates: Rates):
    """(forward, backward) time of causal flash attention for one layer: executed FLOPs
    (``attention_executed_flops``; backward 2.5x, FlashAttention-2 Section 3) at the kernel's
    sustained rate, plus one call's fixed cost per CP ring step (TE's P2P context parallelism
    calls the kernel once per step, ``cp`` steps)."""
    return attention_kernel_time(attention_executed_flops(spec, seq_len, mbs, tp, cp), cp, rates)


def attention_kernel_time(forward_flops, cp, rates: Rates):
    """(forward, backward) of the flash-attention calls of one layer executing ``forward_flops``
    forward (``attention_time``): 2.5 times the FLOPs backward, one call's fixed cost per CP ring
    step, split between the passes as the FLOPs are."""
    rate = rates.attention_flops_per_s
    latency = rates.attention_latency_s * np.asarray(cp)
    return forward_flops / rate + latency / 3.5, 2.5 * forward_flops / rate + 2.5 * latency / 3.5


def unfused_attention_time(spec: LlamaSpec, seq_len, mbs, tp, rates: Rates):
    """(forward, backward) of core attention without a fused kernel for one layer (--no-flash-attn:
    ``baddbmm`` for the scores, one fused scale-mask-softmax kernel, ``bmm`` with V, as Transformer
    Engine's unfused backend and megatron-core's ``DotProductAttention`` with Apex's kernels run it,
    core_v0.15.2 ``transformer/dot_product_attention.py``; megatron-core's PyTorch softmax, above
    4096 tokens or without Apex, measured 3.7-4.2x this on one H200: ``advisor.megatron_readback.
    UNFUSED_LOCAL_MEASURED``). Every one of the s x s
    scores of the a / t heads of the rank's b sequences is computed (the causal mask is applied
    to them, not skipped), and each s x s matrix passes through HBM in BF16. Each batched GEMM
    (2 s^2 d FLOPs a head) takes the slower of the GEMM rate and the HBM roofline of the s x s
    matrix it writes or reads, plus one kernel cost. Forward: S = QK^T (writes S), the softmax
    (reads S, writes P), PV (reads P). Backward: dP = dO V^T (writes dP), dV = P^T dO (reads P),
    the softmax's backward (reads P and dP, writes dS), dQ = dS K and dK = dS^T Q (read dS)."""
    elements = np.asarray(mbs) * spec.num_attention_heads / np.asarray(tp) * float(seq_len) ** 2
    matrix = BF16 * elements / rates.hbm_bytes_per_s  # one pass of an s x s matrix of every head
    gemm = np.maximum(2.0 * spec.head_dim * elements / rates.gemm_flops_per_s, matrix) + rates.gemm_latency_s
    return 2 * gemm + 2 * matrix, 4 * gemm + 3 * matrix


def layer_elementwise_bytes(spec: LlamaSpec, tokens, tp, bias_swiglu_fusion: bool = True):
    """HBM bytes the memory-bound kernels of one layer move forward, on one GPU: the two RMSNorms
    (read and write h each), the two residual adds (read 2h, write h), RoPE on Q and K (read and
    write (a + k) d), Qwen3's Q and K norms (``qk_norm_elements``), SwiGLU
    (``swiglu_elements``), all BF16 and split over the TP ranks (sequence parallelism splits the
    norms and residuals, TP the rest)."""
    h, a, k, d = spec.hidden_size, spec.num_attention_heads, spec.num_query_groups, spec.head_dim
    elements = 4 * h + 6 * h + 2 * (a + k) * d + qk_norm_elements(spec) \
        + swiglu_elements(spec.ffn_hidden_size, bias_swiglu_fusion)
    return BF16 * elements * tokens / np.asarray(tp, dtype=float)


def swiglu_elements(ffn_hidden_size: int, bias_swiglu_fusion: bool = True, linear_offset: bool = True) -> int:
    """Elements per token that a SwiGLU of ``ffn_hidden_size`` reads and writes forward. Fused (Megatron's default,
    ``fusions/fused_bias_swiglu.py``): one kernel, read 2 h_ffn, write h_ffn: 3 h_ffn. Unfused
    (--no-bias-swiglu-fusion: ``transformer/mlp.py``'s ``glu``, ``silu(x_glu) * (x_linear +
    glu_linear_offset)``, both releases): three kernels, SiLU (read h_ffn, write h_ffn), the
    offset's add (read h_ffn, write h_ffn: adding 0.0 still copies) and the product (read 2 h_ffn,
    write h_ffn): 7 h_ffn. ``linear_offset`` False: an eager SwiGLU without the offset's add,
    ``silu(x[0]) * x[1]`` (megatron-core's shared experts under --moe-shared-expert-overlap,
    ``linear_fc1_forward_and_act``, core_v0.15.2 transformer/moe/shared_experts.py:208-212,
    core_v0.19.0 :293-297): SiLU and the product, 5 h_ffn. The backward is priced as twice the
    forward, as every element-wise kernel here (``TimeModel.layer_parts``)."""
    if bias_swiglu_fusion:
        return 3 * ffn_hidden_size
    return (7 if linear_offset else 5) * ffn_hidden_size


def qk_norm_elements(spec: LlamaSpec) -> int:
    """Elements per token that the per-head Q and K RMSNorms (--qk-layernorm, Qwen3 dense and MoE)
    read and write forward: 2 (a + k) d, 0 without them. Grouped-query attention's; the MoE model
    prices multi-latent attention's latent norms itself (``advisor.moe.time``)."""
    return 2 * (spec.num_attention_heads + spec.num_query_groups) * spec.head_dim if spec.qk_layernorm else 0


def elementwise_time(bytes_moved, rates: Rates):
    """Memory-bound time: bytes over the achievable HBM bandwidth (roofline, bandwidth side)."""
    return bytes_moved / rates.hbm_bytes_per_s


def lm_head_time(spec: LlamaSpec, tokens, tp, vocab, rates: Rates):
    """(forward, backward) of the final RMSNorm, the LM head GEMM [tokens, h] x [h, v/t] and
    Megatron's vocab-parallel cross-entropy, which reads the BF16 logits and makes FP32 copies:
    22 bytes per logit forward, 6 backward, as core_v0.15.2's fused kernels move them
    (``fusions/fused_cross_entropy.py``; tests/test_terms_by_hand.py sums them). Without
    --cross-entropy-loss-fusion, Megatron's default, ``tensor_parallel/cross_entropy.py`` makes
    more passes (about 38 and 14 bytes): not priced apart (docs/time.md, a known simplification)."""
    logits = tokens * vocab / np.asarray(tp, dtype=float)
    gemm = gemm_time(tokens, spec.hidden_size, vocab / np.asarray(tp, dtype=float), rates)
    norm = elementwise_time(BF16 * 2 * spec.hidden_size * tokens / np.asarray(tp, dtype=float), rates)
    return gemm + norm + elementwise_time(22 * logits, rates), 2 * gemm + 2 * norm + elementwise_time(6 * logits, rates)


def embedding_time(spec: LlamaSpec, tokens, tp, rates: Rates):
    """(forward, backward) of the embedding lookup (write tokens x h) and its gradient's
    scatter-add (read and write tokens x h), memory-bound."""
    size = BF16 * spec.hidden_size * tokens / np.asarray(tp, dtype=float)
    return elementwise_time(size, rates), elementwise_time(2 * size, rates)


# --- communication ------------------------------------------------------------------------


def link_bandwidth(group_span, rates: Rates, ranks_per_node=1):
    """Achievable one-direction bandwidth of a ring over a group spanning ``group_span``
    consecutive ranks: NVLink inside a node; across nodes, the network, where NCCL's rings
    (one per NIC) carry the group's data over the NICs of all its ``ranks_per_node`` GPUs in
    a node (a node's inter-node share is its NICs' sum), up to NVLink's rate."""
    across = np.minimum(rates.network_bytes_per_s * np.maximum(1.0, np.asarray(ranks_per_node, dtype=float)),
                        rates.nvlink_bytes_per_s)
    return np.where(np.asarray(group_span) <= rates.gpus_per_node, rates.nvlink_bytes_per_s, across)


def ranks_per_node(shards, stride, gpus_per_node):
    """The GPUs of one data-parallel group in one node, for ``link_bandwidth``: the group's ranks
    are ``stride`` apart (megatron-core ``parallel_state.RankGenerator``, order tp-cp-ep-dp-pp: TP
    for the dense DP x CP group; ETP x EP for the expert-data-parallel group, whose generator has
    tp = ETP and no CP), so a node holds gpus_per_node / stride of them, at least one and at most
    the group's ``shards``."""
    return np.minimum(shards, np.maximum(1.0, gpus_per_node / np.asarray(stride, dtype=float)))


def ring_collective_time(size_bytes, ranks, bandwidth, rates: Rates):
    """All-gather or reduce-scatter of a ``size_bytes`` tensor over a ring of ``ranks``: each
    rank sends (n - 1)/n of it (Patarasuk and Yuan 2009; NCCL's bus-bandwidth model), plus one
    latency per step. Zero for one rank."""
    n = np.asarray(ranks, dtype=float)
    steps = n - 1
    return steps / n * size_bytes / bandwidth + steps * rates.collective_latency_s


@dataclass(frozen=True, slots=True)
class TpBytes:
    """Bytes per element of the [tokens, h] activation that each sequence-parallel collective of a
    layer moves (``levers.fp8_tp_bytes`` under --fp8-format, ``BF16_TP`` otherwise)."""

    input_gather: float
    """The all-gathers of QKV's and FC1's inputs, forward (and their re-gathers for wgrad)."""
    output_scatter: float
    """The reduce-scatters of the projection's and FC2's outputs, forward."""
    grad_gather: float
    """The all-gathers of the projection's and FC2's output gradients, backward."""
    dgrad_scatter: float
    """The reduce-scatters of QKV's and FC1's input gradients, backward."""
    fp8_scatter: float
    """A reduce-scatter through a userbuffers buffer with ``fp8_buf`` (``Userbuffer.fp8_buf``)."""


BF16_TP = TpBytes(BF16, BF16, BF16, BF16, BF16)
"""Every collective in BF16: a run without --fp8-format."""


def tp_collective_time(spec: LlamaSpec, tokens, tp, rates: Rates, element_bytes: float = BF16):
    """One ring collective (all-gather or reduce-scatter) of the layer's [tokens, h] activation at
    ``element_bytes`` an element (``TpBytes``)."""
    return ring_collective_time(element_bytes * tokens * spec.hidden_size, tp, link_bandwidth(tp, rates), rates)


def tp_block_time(spec: LlamaSpec, tokens, tp, rates: Rates, sizes: TpBytes = BF16_TP):
    """(forward, backward) TP communication of one block of a layer with sequence parallelism,
    attention or an MLP (Korthikanti et al. 2023, Section 4.2.2): forward an all-gather of the
    block's [tokens, h] input before its column-parallel linear (QKV, FC1) and a reduce-scatter of
    its row-parallel linear's output (the output projection, FC2); backward the all-gather of the
    row-parallel linear's output gradient and the reduce-scatter of the column-parallel one's input
    gradient; each at ``sizes``' bytes an element (FP8 gathers under --fp8-format,
    ``levers.fp8_tp_bytes``). A layer's attention and MLP move the same [tokens, h] activation, so
    one block's price serves either (``tensor_parallel_time``; the MoE model's
    ``LayerTimes.attention_tp`` but MLA's, ``moe.time.mla_attention_tp_time``, ``dense_mlp_tp``
    and ``shared_tp``)."""
    forward = tp_collective_time(spec, tokens, tp, rates, sizes.input_gather) \
        + tp_collective_time(spec, tokens, tp, rates, sizes.output_scatter)
    backward = tp_collective_time(spec, tokens, tp, rates, sizes.grad_gather) \
        + tp_collective_time(spec, tokens, tp, rates, sizes.dgrad_scatter)
    return forward, backward


def tensor_parallel_time(spec: LlamaSpec, tokens, tp, rates: Rates, sizes: TpBytes = BF16_TP):
    """(forward, backward) exposed TP communication of one layer with sequence parallelism: its
    attention's and its MLP's collectives (``tp_block_time``, twice: 4 collectives of the layer's
    [tokens, h] activation each way). Megatron runs them on the compute stream without
    --tp-comm-overlap, so they add to the layer's time; the inputs' re-gathers for wgrad run
    asynchronously behind dgrad and are left out."""
    forward, backward = tp_block_time(spec, tokens, tp, rates, sizes)
    return 2 * forward, 2 * backward  # 2 (g + s) == 2 g + 2 s exactly: scaling by 2 rounds nothing


def context_parallel_time(spec: LlamaSpec, seq_len, mbs, tp, cp, rates: Rates, attention_forward, attention_backward):
    """(forward, backward) exposed CP communication of one layer: Transformer Engine's P2P ring
    (``AttnFuncWithCPAndKVP2P``) sends this rank's K and V chunk (2 x tokens x k d / t) to the
    next rank at each of the c - 1 steps while the step's attention runs, and backward sends
    K, V and their gradients (twice the bytes). Only what outlasts the step's compute shows."""
    c = np.asarray(cp, dtype=float)
    tokens = np.asarray(mbs) * seq_len / c
    kv = 2 * BF16 * tokens * spec.num_query_groups * spec.head_dim / np.asarray(tp, dtype=float)
    bandwidth = link_bandwidth(np.asarray(tp) * np.asarray(cp), rates)
    send = kv / bandwidth + rates.collective_latency_s
    steps = c - 1
    forward = steps * np.maximum(0.0, send - attention_forward / c)
    backward = steps * np.maximum(0.0, 2 * send - attention_backward / c)
    return forward, backward


def pipeline_p2p_time(spec: LlamaSpec, tokens, tp, cross_node, rates: Rates):
    """One send (or receive) of a stage boundary's activation, [tokens, h] split over the TP
    ranks by sequence parallelism; 1F1B's steady state waits for it."""
    size = BF16 * tokens * spec.hidden_size / np.asarray(tp, dtype=float)
    bandwidth = np.where(cross_node, rates.network_bytes_per_s, rates.nvlink_bytes_per_s)
    return size / bandwidth + rates.collective_latency_s


def tied_embedding_allreduce_time(spec: LlamaSpec, tp, cp, dp, pp, vocab, rates: Rates, grad_bytes=4):
    """The all-reduce of the tied word embedding's gradient between the first and the last
    stage, once per iteration after the DP collectives, nothing to hide it: tied at PP > 1 the
    last stage keeps its own copy of the embedding (``stage_model.head_shares_embedding``), and
    megatron-core's finalize_model_grads adds the two stages' gradients, h x v/t main-grad
    elements (``grad_bytes``: FP32, or BF16 with --grad-reduce-in-bf16), over the two-rank
    embedding group (core_v0.15.2 and core_v0.19.0 distributed/finalize_model_grads.py,
    ``_allreduce_word_embedding_grads``). The pair's ranks are (pp - 1) t c d apart (RankGenerator
    order tp-cp-ep-dp-pp): NVLink when the model's t c d p ranks fit a node, else one NIC per
    pair (every GPU of a node is in a pair of its own). A ring all-reduce of two ranks, a
    reduce-scatter and an all-gather: S / bandwidth plus two latencies. Zero untied or at PP 1."""
    p = np.asarray(pp, dtype=float)
    t = np.asarray(tp, dtype=float)
    size = grad_bytes * spec.hidden_size * np.asarray(vocab, dtype=float) / t
    bandwidth = link_bandwidth(t * np.asarray(cp, dtype=float) * np.asarray(dp, dtype=float) * p, rates)
    time = 2 * ring_collective_time(size, 2, bandwidth, rates)
    return np.where(spec.tie_embeddings & (p > 1), time, 0.0)


def data_parallel_time(parameters, shards, span, rates: Rates, grad_bytes=4, distributed_optimizer=True,
                       ranks_per_node=1, param_bytes=BF16):
    """(gradient reduction, parameter all-gather) of one iteration over the DP x CP group
    (Megatron's distributed optimizer shards over it): a reduce-scatter of the gradients, in
    FP32 with --accumulate-allreduce-grads-in-fp32 (``grad_bytes``), and an all-gather of the
    BF16 parameters (Rajbhandari et al. 2020, ZeRO-1; Megatron ``DistributedOptimizer``).
    Without the distributed optimizer, one all-reduce: twice the reduce-scatter, no gather.
    ``ranks_per_node``: the group's GPUs in one node (gpus_per_node / tp when it spans nodes);
    ``param_bytes`` 1 with --fp8-param-gather (the all-gather moves the FP8 weights)."""
    bandwidth = link_bandwidth(span, rates, ranks_per_node)
    reduce = ring_collective_time(grad_bytes * parameters, shards, bandwidth, rates)
    gather = ring_collective_time(param_bytes * parameters, shards, bandwidth, rates)
    if distributed_optimizer:
        return reduce, gather
    return 2 * reduce, 0.0 * gather


STATE_STEP_BYTES = {"fp32": 8, "remainder": 6, "bf16": 24, "fp16": 40, "fp8": 22, "fsdp_half": 4, "fsdp_none": 2,
                    "fp32_weight": 8}
"""HBM bytes per parameter one Adam step moves for one optimizer state, by how it is kept
(Transformer Engine's ``FusedAdam.step``, ``fused_adam.py``): FP32, read and written by the
kernel (4 + 4); an FP32 master as the remainder of a BF16 weight, the int16 read and written and
the BF16 weight read to rebuild it (2 + 2 + 2; the weight's write is the step's own); a lowered
state is unscaled into an FP32 copy first and scaled back after the kernel: BF16 ``.float()``
(2 + 4), the kernel (4 + 4), ``.bfloat16()`` and ``copy_`` (4 + 2 + 2 + 2); FP16 (momentum,
variance or master) the same with its scale applied both ways (``mul_``, 4 + 4 each) and its
amax found (``aminmax``, 4) and a copy at 2 bytes; FP8 dequantised (1 + 4), the kernel, its
amax (4) and quantised back (4 + 1). Megatron-FSDP's main weight in a 2-byte buffer (fsdp_half) is the
parameter the kernel reads and writes itself (2 + 2), as the FP32 one is (4 + 4); with none
(fsdp_none) the kernel steps the BF16 weight directly: its read (2; the write is the step's own). An FP32
weight stepped in place (fp32_weight) is read and written as an FP32 master is (4 + 4)."""


def optimizer_step_bytes(states: tuple[str, str, str] = ("fp32", "fp32", "fp32"), grad_bytes: float = 4.0,
                         master_read_bytes: float = 4.0, weight_write_bytes: float = 2.0) -> float:
    """HBM bytes per optimizer element (of the rank's shard) of one Adam step: read the gradient
    Adam is handed (``grad_bytes``: 4 for FP32, the cast copy or FP32 main gradients; 2 for BF16
    main gradients handed uncast), read that gradient again for the gradient norm (``grad_bytes``:
    ``get_main_grads_for_grad_norm`` reads the optimizer parameter's ``grad``, or its
    ``decoupled_grad``, optimizer/optimizer.py, both releases), write the model weight
    (``weight_write_bytes``, ``TrainingOptions._weight_write_bytes``: 2 for a BF16 one, 4 for an
    FP32 one that Megatron-FSDP copies its main weight into, 0 where Adam steps the FP32 weight
    itself, its write then the master's own), read the updated master weight for that write where
    a separate pass copies it
    (``master_read_bytes``, ``TrainingOptions._master_copy_read_bytes``: 4 from megatron-core's FP32
    masters, 0 where Transformer Engine's FusedAdam writes the weight in its own kernel), and each
    of the master weight, momentum and variance as it is kept (``STATE_STEP_BYTES``): 38 in FP32.
    Lowered states move more, not less: the step unscales and rescales them. The main-gradient
    buffer's zeroing is not here: it covers what the buffer holds, not the shard
    (``grad_zero_time``)."""
    return (grad_bytes + grad_bytes + weight_write_bytes + master_read_bytes
            + sum(STATE_STEP_BYTES[state] for state in states))


DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
"""Bytes per element of the dtypes main gradients and main weights take (Megatron DDP's and Megatron-FSDP's)."""


def grad_cast_bytes(main_grads: str, main_weights: str | None) -> float:
    """HBM bytes per parameter of the optimizer's shard that the cast of its main gradients into
    its main weights' dtype moves once per step, before Adam. Megatron's DDP: ``.float()`` into
    the FP32 masters (``TrainingOptions._grad_cast_bytes``). Megatron-FSDP's ``update_main_grads``
    (``finish_grad_sync`` -> ``attach_grad_to_optimizer_state``; core_v0.15.2 megatron_fsdp/param_and_grad_buffer.py:2398-2431, core_v0.19.0 :3343-3373). It
    hands the optimizer the main-gradient buffer's slice of each parameter (``get_item``: a view,
    the rank's shard, every element under no_shard, as many as Adam steps) and, where a main-weight
    buffer exists, ``optimizer_grad.to(param.dtype)``, ``param`` being the main weight. A cast:
    read the gradient, write it in the main weight's dtype (FP32 main weights with BF16 gradients,
    2 + 4 = 6; BF16 ones with FP32 gradients, 4 + 2 = 6; FP16 ones with BF16 gradients, 2 + 2).
    Zero, no copy made, where the dtypes match (``Tensor.to`` returns the tensor itself: FP32
    gradients into FP32 main weights, the advisor's default on both releases) or where there is no
    main-weight buffer to cast to (``main_weights`` None: core_v0.19.0's
    --megatron-fsdp-main-params-dtype auto, param_and_grad_buffer.py:2681-2686 makes none, and
    the gradient goes to Adam uncast; or no cast asked: core_v0.19.0's ``use_decoupled_grad``,
    :3369, set by --use-precision-aware-optimizer, training.py:2002, and core_v0.15.2 with that
    flag builds no main-weight buffer, training.py:975-976, ``preserve_fp32_weights=False``)."""
    if main_weights is None or main_weights == main_grads:
        return 0.0
    return float(DTYPE_BYTES[main_grads] + DTYPE_BYTES[main_weights])


def optimizer_time(parameters, shards, rates: Rates, distributed_optimizer=True, step_bytes: float = 38.0,
                   zeroed_bytes: float = 0.0, grads_sharded=False):
    """Adam on this rank's shard, memory-bound: ``step_bytes`` (``optimizer_step_bytes``) an
    element of the shard (the rank's ``parameters``, TP/PP-local, over ``shards`` where the
    optimizer is distributed), and the main-gradient buffer's zeroing at each step's start
    (``grad_zero_time``'s bytes, in the same pass over HBM)."""
    parameters = np.asarray(parameters, dtype=float)
    shards = np.asarray(shards, dtype=float)
    shard = parameters / np.where(distributed_optimizer, shards, 1.0)
    return elementwise_time(step_bytes * shard + _grad_zero_bytes(parameters, shards, zeroed_bytes, grads_sharded),
                            rates)


def grad_zero_time(parameters, shards, rates: Rates, zeroed_bytes: float, grads_sharded=False):
    """The main-gradient buffer zeroed at each step's start, memory-bound: ``zeroed_bytes`` (its
    dtype's, ``TrainingOptions.grad_zero_bytes``) an element of that buffer: every one of the
    rank's ``parameters`` (TP/PP-local) under Megatron's DDP, distributed optimizer or not
    (``zero_grad_buffer``, training.py ``train_step``: core_v0.15.2 :1248, core_v0.19.0 :2361 ->
    ``_ParamAndGradBuffer.reset``, ``self.grad_data.zero_()``: core_v0.15.2
    distributed/param_and_grad_buffer.py:873-877, core_v0.19.0 :1611-1615; ``grad_data`` is the
    whole buffer, the reduce-scatter only writes the rank's shard into it), and Megatron-FSDP's
    no_shard and optim; the shard, over ``shards``, where that buffer is sharded
    (``grads_sharded``: Megatron-FSDP's optim_grads and optim_grads_params, whose
    ``main_grad_buffer`` is built ``is_data_distributed``, its ``data`` the shard:
    megatron_fsdp/param_and_grad_buffer.py ``zero_grad``, core_v0.15.2 :2261-2277, core_v0.19.0
    :3181-3214). 0 with no buffer (torch FSDP2). Apart from Adam where Adam is not all on the GPU
    (``levers.offload_time``: the buffer stays on the GPU, whatever share of Adam is offloaded)."""
    return elementwise_time(_grad_zero_bytes(np.asarray(parameters, dtype=float), np.asarray(shards, dtype=float),
                                             zeroed_bytes, grads_sharded), rates)


def _grad_zero_bytes(parameters, shards, zeroed_bytes: float, grads_sharded):
    """HBM bytes ``grad_zero_time`` prices: ``zeroed_bytes`` an element of the buffer."""
    return zeroed_bytes * (parameters / np.where(grads_sharded, shards, 1.0))


def host_mask_time(seq_len, rates: Rates, workers: int = 2):
    """Seconds per sample that Megatron's data loader spends building the s x s attention mask
    when it cannot cache it (``gpt_dataset._get_ltor_masks_and_position_ids``: an FP32 ones
    matrix, tril, the per-document zeroing, a comparison), shared by --num-workers processes
    (2 by default). The mask is built per data-parallel replica; with the loader running
    ahead, a replica cannot step faster than its samples arrive."""
    return rates.host_mask_s_per_element * float(seq_len) ** 2 / workers


def data_loader_bound(step, rebuilt: bool, samples_per_replica, seq_len, rates: Rates, workers: int = 2):
    """The step time no faster than a replica's data loader builds its samples' masks, where it
    cannot cache them (--dataloader-mask rebuilt; ``host_mask_time``); ``step`` otherwise."""
    if not rebuilt:
        return step
    return np.maximum(step, samples_per_replica * host_mask_time(seq_len, rates, workers))
