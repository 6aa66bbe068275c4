"""What seed 004's Eq. 18 leaves out: the terms of the calibrated memory model, one function each.

Eq. 18 (``advisor.memory``) stays exact; these terms are added on top of it, per pipeline stage,
to predict whether a real Megatron-LM run fits (``advisor.verdicts``). Sizes are bytes on one
GPU. Each term cites what it comes from; where megatron-core's behaviour was measured by this
project's hooks (``megatron_hooks/README.md``, the CPU backend on real megatron-core modules),
that is the source.
"""

from __future__ import annotations

import numpy as np

from advisor import equations as eq
from advisor.models import LlamaSpec
from advisor.options.ub_config import DEFAULT_METHODS, UserbuffersConfig

GIB = 2**30


def embedding_ids_fraction(spec: LlamaSpec) -> float:
    """megatron-core's embedding keeps the int64 token ids, 8 s b per microbatch (the hooks measure
    it; Megatron-LM's own ``theoretical_memory_usage.py`` counts the same 8 s b), where Eq. 13
    counts 8 s b h: the fraction 1/h of Eq. 13's embedding activations that is really kept."""
    return 1.0 / spec.hidden_size


def swiglu_fusion_fraction(spec: LlamaSpec, modules: frozenset[str] = frozenset(), fused_norms: bool = True,
                           bias_swiglu_fusion: bool = True, unfused_attention_seq_len: int | None = None) -> float:
    """Megatron's fused SwiGLU (``fusions/fused_bias_swiglu.py``, on by default:
    --bias-swiglu-fusion) saves only its input, the FC1 output (2 h_ffn per token), and FC2 saves
    its own input (h_ffn): 6 s b h_ffn bytes per layer where Eq. 12 counts 8 (up, gate, SiLU and
    the down projection's input). The fraction of Eq. 12's layer activations really kept; fully
    recomputed layers keep only their input, so there is none to correct (``advisor.verdicts``).

    With selective recomputation of ``modules`` the layer keeps Eq. 12 less the part they free
    (``equations.recomputed_module_bytes``): the fraction of that which is really kept. A
    recomputed MLP keeps none of the SwiGLU tensors, so nothing is left to correct (1).

    With --no-bias-swiglu-fusion (``bias_swiglu_fusion`` False) the eager SwiGLU keeps 5 h_ffn
    elements a token, Eq. 12's 4 and the one the layer's bytes add
    (``equations.unfused_swiglu_bytes``): nothing to correct either (1).

    ``unfused_attention_seq_len``: the sequence length of a layer whose core attention runs
    unfused and is kept (no FlashAttention, core_attn not recomputed), which keeps its s^2 scores
    and expanded K and V besides Eq. 12 (``equations.unfused_attention_bytes``, 2as + 4(a - k)d a
    token): the SwiGLU's saving is a share of that larger whole. Taken as a share of Eq. 12 alone,
    the correction also took 17% off an 8B layer's scores at s 4096."""
    if "mlp" in modules or not bias_swiglu_fusion:
        return 1.0
    hidden, ffn = eq.recomputed_module_bytes(spec, 1, 1, modules, fused_norms)
    # Eq. 12 per token (s b = 1), with its attention term for an explicit head size where there is one
    kept = eq.layer_activation_bytes(spec, 1, 1, fused_norms) - hidden - ffn
    if unfused_attention_seq_len is not None:
        kept += eq.unfused_attention_bytes(spec, unfused_attention_seq_len, 1) / unfused_attention_seq_len
    return 1.0 - 2 * spec.ffn_hidden_size / kept


def local_attention_buffer(spec: LlamaSpec, seq_len: int, mbs, tp, options):
    """The global memory buffer that a stage with decoder layers keeps under --transformer-impl
    local (``options.fused_norms`` False), ``equations.local_attention_buffer_bytes`` in the run's
    element size; 0 with Transformer Engine's layers. Not Eq. 12: the calibrated model scales it
    by the allocator's factor alone (``verdicts.CalibratedTerms.buffer_factor``), not by the share
    of Eq. 12 a layer keeps (the fused SwiGLU's), which is about the layers' own tensors."""
    if options.fused_norms:
        return 0.0
    return (eq.local_attention_buffer_bytes(spec, seq_len, mbs, tp, options.sequence_parallel)
            * (options.element_bytes / eq.WEIGHT_BYTES))


def cross_entropy_working_bytes(spec: LlamaSpec, seq_len: int, mbs: int, tp: int, cp: int, vocab: int,
                                fusion: str = "none"):
    """Megatron's vocab-parallel cross-entropy (megatron-core ``tensor_parallel/cross_entropy.py``)
    turns the LM head's BF16 logits into an FP32 copy (``.float()``) and works in place on it:
    exp, softmax, and in backward the gradient (``grad_input = softmax``, ``mul_``). Eq. 14 counts
    that FP32 copy (4 s b v); the BF16 logits stay referenced by the caller through the loss's
    forward, and the backward casts the FP32 gradient back to BF16 for the LM head: 2 s b v / (t c)
    more at the last stage's peak. With Transformer Engine's kernel (``fusion`` 'te') the BF16
    logits are what ``loss_logits_bytes`` keeps, and nothing more."""
    if fusion == "te":
        return 0.0
    return 2.0 * seq_len * mbs * vocab / (tp * cp)


def loss_logits_bytes(spec: LlamaSpec, seq_len: int, mbs, vocab: int, fusion: str = "none"):
    """The logits the loss keeps for the backward, one microbatch, before the t c split: Eq. 14's
    FP32 copy, 4 s b v (Megatron's vocab-parallel cross-entropy, and its 'native' fusion, which
    saves the same FP32 softmax); with --cross-entropy-fusion-impl te (``fusion`` 'te'), 2 s b v:
    megatron-core's ``te_parallel_cross_entropy`` calls Transformer Engine's
    ``parallel_cross_entropy``, whose Triton kernels read the BF16 logits and write their
    gradient into them in place (``transformer_engine/pytorch/triton/cross_entropy.py``), keeping
    only them and three FP32 softmax statistics per token (12 s b bytes, under 0.1 MiB at s b =
    8192: left out)."""
    if fusion == "te":
        return 2.0 * seq_len * mbs * vocab
    return eq.logits_bytes(spec, seq_len, mbs, vocab)


def dataloader_mask_bytes(seq_len: int, mbs: int, cp: int) -> float:
    """Megatron's GPTDataset builds a bool s x s attention mask per sample unless
    --no-create-attention-mask-in-dataloader (``gpt_dataset._get_ltor_masks_and_position_ids``);
    ``get_batch`` moves it to the GPU (b s^2 bytes; broadcast to the other TP ranks) and
    ``get_batch_on_this_cp_rank`` keeps a 1/c slice: b s^2 (1 + 1/c) on the first and the last
    stage while the next microbatch is fetched. Flash attention never reads it."""
    return mbs * float(seq_len) ** 2 * (1.0 + 1.0 / cp)


def userbuffers_bytes(config: UserbuffersConfig, spec: LlamaSpec, seq_len: int, mbs, tp, cp, fp8: bool):
    """Transformer Engine's userbuffers under --tp-comm-overlap, registered outside PyTorch's
    caching allocator on every rank (0 at TP 1, where the overlap does not run).

    Megatron-LM's ``_initialize_tp_communicators`` (core_v0.15.2 and core_v0.19.0
    ``megatron/training/initialize.py``) calls ``initialize_ub`` with shape [s b // c, h] and no
    dtype (TE's default, BF16), and one quantization mode, FP8 in an FP8 run. ``initialize_ub``
    (TE 2.9 ``pytorch/module/base.py``) calls ``add_ub`` once for each of the 12 buffer names,
    external ones included: no two names share a buffer. Each is uint8 where FP8 and its
    ``fp8_buf`` (``Userbuffer.fp8_buf``), else BF16. ``CommOverlapBase::initialize`` (pipeline,
    bulk, external; ``common/comm_gemm_overlap/comm_gemm_overlap.cpp``) registers the whole
    shape, s b h / c elements; ``CommOverlapP2PBase::initialize`` (ring exchange) the same for an
    all-gather, and 2 t - 1 chunks of 1/t of it for a reduce-scatter, which keeps every received
    chunk to reduce at the end. Left out: the allocation granularity the multicast path rounds each
    buffer up to (``register_user_buffer_collective``, 2 MiB: whole at the usual shapes), the one
    communicator's flags (about 3 MiB, shared by all buffers: ``_ub_comm`` is static), and the
    cuBLAS workspace ``initialize_ub`` widens to 3 streams (in PyTorch's allocator)."""
    t = np.asarray(tp)
    whole = np.floor_divide(np.asarray(seq_len) * np.asarray(mbs), np.asarray(cp)) * float(spec.hidden_size)
    total = 0.0
    for name in DEFAULT_METHODS:
        buffer = config.buffer(name)
        size = whole * (1 if fp8 and buffer.fp8_buf else 2)
        # ring exchange's object (CommOverlapP2P) is the file's method's; te_kernel refuses it where the
        # layer runs no ring exchange, so the kernel and the object agree on every file read
        if config.kernel(name) == "ring_exchange" and config.reduce_scatter(name):
            size = np.floor(size / t) * (2 * t - 1)  # buffer_bytes / tp * (2 tp - 1), whole bytes
        total = total + size
    return np.where(t > 1, total, 0.0)


def runtime_overhead_bytes(overhead_gib: float) -> float:
    """Device memory outside PyTorch's tensors: the CUDA context (about 0.5 GiB with CUDA 12),
    NCCL's buffers for each of Megatron's communicators (TP, CP, DP, DP x CP, PP, embedding:
    tens to hundreds of MiB each), cuBLAS and Transformer Engine workspaces. A calibrated
    constant (``MemoryCalibration.overhead_gib``)."""
    return overhead_gib * GIB
