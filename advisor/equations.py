"""The terms of seed 004, Section 3, one function each: the one place where the equations live.

Parameter counts are in elements, activations in bytes, both for one GPU after the sharding
that the paper applies (tensor parallel size t, context parallel size c). ``memory.py``
assembles them into pipeline stages (Eq. 7-10, 16-18). Extensions that the paper does not
cover (flash attention off, recomputation) cite their own source.
"""

from __future__ import annotations

import numpy as np

from advisor.models import LlamaSpec

# --- parameters (seed 004, Section 3.1) -------------------------------------------------


def attention_parameters(spec: LlamaSpec, tp: int = 1) -> float:
    """Eq. 1: W_Q and W_O are h x h, W_K and W_V are h x h*k/a; all four split over t.

    In general W_Q and W_O are h x ad and W_K, W_V h x kd for a head size d (Megatron's
    --kv-channels), which is Eq. 1 when d = h/a: 2hd(a + k). Biases on Q, K and V
    (--add-qkv-bias) add (a + 2k)d, split over t with their columns; the QK norms'
    weights (``qk_norm_parameters``) are whole on every rank."""
    h, k, a, d = spec.hidden_size, spec.num_query_groups, spec.num_attention_heads, spec.head_dim
    weights = 2 * h * h * (1 + k / a) if d * a == h else 2 * h * d * (a + k)
    bias = (a + 2 * k) * d if spec.add_qkv_bias else 0
    return (weights + bias) / tp + qk_norm_parameters(spec)


def qk_norm_parameters(spec: LlamaSpec) -> int:
    """Qwen3's per-head Q and K RMSNorm weights (--qk-layernorm), d each, 0 without them: one norm
    of hidden size d shared by every head (megatron-core ``transformer/attention.py``,
    ``SelfAttention.__init__``: q_layernorm and k_layernorm built with hidden_size
    hidden_size_per_attention_head), not split over t (``TENorm``/``FusedLayerNorm`` weights are
    replicated; their gradients are all-reduced with sequence parallelism). For grouped-query
    attention; multi-latent attention's latent norms are ``advisor.moe.params``'."""
    return 2 * spec.head_dim if spec.qk_layernorm else 0


def mlp_parameters(spec: LlamaSpec, tp: int = 1) -> float:
    """Eq. 2: SwiGLU's gate, up (h x h_ffn) and down (h_ffn x h) projections, split over t."""
    return 3 * spec.hidden_size * spec.ffn_hidden_size / tp


def layer_norm_parameters(spec: LlamaSpec) -> int:
    """The two RMSNorm weights of a layer (the 2h of Eq. 3); replicated, not split over t."""
    return 2 * spec.hidden_size


def layer_parameters(spec: LlamaSpec, tp: int = 1) -> float:
    """One transformer layer on one GPU: 2h^2((1 + k/a + 3/2 h_ffn/h)/t + 1/h), Eq. 6."""
    return attention_parameters(spec, tp) + mlp_parameters(spec, tp) + layer_norm_parameters(spec)


def embedding_parameters(spec: LlamaSpec, tp: int = 1, vocab: int | None = None) -> float:
    """hv/t: the input embedding, or the untied LM head (Eq. 7 and 9)."""
    return spec.hidden_size * (spec.vocab_size if vocab is None else vocab) / tp


def final_norm_parameters(spec: LlamaSpec) -> int:
    """h: the final RMSNorm, on the last stage (Eq. 9)."""
    return spec.hidden_size


def model_parameters(spec: LlamaSpec, vocab: int | None = None) -> float:
    """Eq. 3: 2hv + h + 2Lh^2(1 + k/a + 3/2 h_ffn/h + 1/h), with hv once if tied."""
    embeddings = 1 if spec.tie_embeddings else 2
    return (
        embeddings * embedding_parameters(spec, vocab=vocab)
        + final_norm_parameters(spec)
        + spec.num_layers * layer_parameters(spec)
    )


MEGATRON_VOCAB_DIVISIBLE_BY = 128
"""Megatron-LM's --make-vocab-size-divisible-by default (and Megatron-Bridge's and NeMo's
``make_vocab_size_divisible_by``), which the paper's and the published runs kept."""


def padded_vocab_size(vocab_size: int, divisible_by: int | None, tp):
    """The rows Megatron builds: v padded up to a multiple of make-vocab-size-divisible-by x t
    (megatron/training/tokenizer ``_vocab_size_with_padding`` in core_v0.15.2,
    megatron/training/vocab_utils ``calculate_padded_vocab_size`` in core_v0.19.0). Even with
    divisible-by 1 the embedding splits over t, so v pads to a multiple of t; None means 1 (the
    paper's models divide by every t it uses, so its tables are unchanged). ``tp`` may be an
    array of layouts."""
    multiple = (divisible_by or 1) * tp
    return -(-vocab_size // multiple) * multiple  # ceil, in integers (also for arrays)


# --- bytes per parameter (seed 004, Eq. 4, 5, 10) ---------------------------------------

WEIGHT_BYTES = 2
"""BF16 weights."""
ADAM_MOMENT_BYTES = 8
"""The FP32 momentum and variance of Adam (Section 3.1; the master weight and the other state
dtypes: ``memory_levers.optimizer_state_bytes``): made at the first optimizer step (torch.optim.Adam
``_init_group``; TE's FusedAdam likewise), unlike the master weights, which Megatron's optimizer
makes when it is built. A fresh run's first forward and backward run without them."""


# --- activations of one microbatch, unsharded (seed 004, Section 3.2) -------------------


def attention_activation_bytes(spec: LlamaSpec, seq_len: int, mbs: int, fused_norms: bool = True,
                               flash_attention: bool = True) -> float:
    """Eq. 11: 6sbh + 4sbh k/a. Input X, Q, K and V, and the attention output, in BF16;
    FlashAttention stores neither QK^T nor the softmax.

    With an explicit head size d, Q and the attention output are sb x ad and K, V sb x kd:
    2sbh + 4sb ad + 4sb kd, which is Eq. 11 when ad = h. With --qk-layernorm (Qwen3), plus
    ``qk_norm_activation_bytes`` (``fused_norms`` False: --transformer-impl local;
    ``flash_attention`` False: unfused attention). Unfused attention keeps K and V expanded to
    every head instead of Eq. 11's: ``unfused_attention_bytes``."""
    s, b, h = seq_len, mbs, spec.hidden_size
    if spec.query_size == h:
        eq11 = 6 * s * b * h + 4 * s * b * h * spec.num_query_groups / spec.num_attention_heads
    else:
        eq11 = 2 * s * b * h + 4 * s * b * spec.query_size + 4 * s * b * spec.num_query_groups * spec.head_dim
    return eq11 + qk_norm_activation_bytes(spec, s, b, fused_norms, flash_attention)


def qk_norm_activation_bytes(spec: LlamaSpec, seq_len: int, mbs, fused_norms: bool = True,
                             flash_attention: bool = True) -> float:
    """What the per-head Q and K RMSNorms of --qk-layernorm keep for their backward, 0 without
    them; split over t with the heads (megatron-core ``transformer/attention.py``,
    ``SelfAttention.get_query_key_value_tensors``, core_v0.15.2 lines 1097-1111, core_v0.19.0
    1905-1925: q_layernorm(query), k_layernorm(key) before RoPE). ``query.reshape`` copies Q (its
    groups are not contiguous in the QKV output with GQA, a > k, as in every Qwen3), so the Q norm
    keeps a BF16 copy, 2sbad; ``key`` is a view of the QKV output; each norm keeps an FP32 rstd per
    head and token, 4sb(a + k).

    - Transformer Engine's spec with flash or cuDNN attention (``fused_norms`` and
      ``flash_attention``, the defaults): 2sbad + 4sb(a + k). K's view adds no bytes: cuDNN
      attention saves V, a view of the same QKV output, which keeps all of it anyway
      (tests/test_symbolic.py, measured on a real-size Qwen3-8B layer). 2sb(a + k)d, both inputs
      as new and no rstd, until 2026-11-30.
    - Unfused attention (``fused_norms`` False, --transformer-impl local, whose core attention is
      always unfused; or ``flash_attention`` False, Transformer Engine's --attention-backend
      unfused): 4sb(a + k)d + 4sb(a + k). Both unfused kernels expand K and V for GQA
      (``repeat_interleave``, whose backward saves nothing) and save the expanded copies, never
      V's view (``unfused_attention_bytes``), so K's saved view is what keeps the whole QKV
      output, 2sb(a + 2k)d, alive: 2sbad + 2sb(a + 2k)d + 4sb(a + k). The local spec's norm is
      torch's ``RMSNorm`` (``WrappedTorchNorm``: the local spec takes it for RMSNorm even with
      Apex, models/backends.py ``LocalSpecProvider.layer_norm``), whose CUDA kernel saves the
      input, the weight and the FP32 rstd, as TE's (megatron_hooks/kernels.py, read on an H100);
      the local spec allows neither sequence parallelism (torch_norm.py) nor CP
      (dot_product_attention.py), so the heads split over t alone. Measured to the byte on a
      real-size Qwen3-8B layer of the local spec (tests/test_symbolic.py). TE's norm (``TENorm``)
      saves its input as well, a view of the same QKV output, and its unfused backend
      (``UnfusedDotProductAttention``) saves expanded K and V likewise (TransformerEngine v2.9
      transformer_engine/pytorch/attention/dot_product_attention/backends.py, 70f5366, lines
      350-359 and 523), read from the source: no TE here to measure it.

    Dense Qwen3 and the MoE model's Qwen3-MoE alike (the MoE model prices the local spec's
    attention as flash attention, but with ``fused_norms`` False)."""
    if not spec.qk_layernorm:
        return 0
    s, b, a, k, d = seq_len, mbs, spec.num_attention_heads, spec.num_query_groups, spec.head_dim
    rstd = 4 * s * b * (a + k)  # FP32, one per head and token, both norms
    if fused_norms and flash_attention:
        return 2 * s * b * a * d + rstd  # the Q copy
    return 2 * s * b * a * d + 2 * s * b * (a + 2 * k) * d + rstd  # the Q copy, the whole QKV output


def attention_scores_bytes(spec: LlamaSpec, seq_len: int, mbs: int) -> float:
    """Without FlashAttention: the BF16 softmax output, 2as^2b, kept for the softmax backward
    and for attention-over-V (Korthikanti et al. 2023, Section 4.1; Llama has no attention
    dropout, so the as^2b mask and the second 2as^2b copy are absent: torch's dropout with p 0
    returns its input, ATen ``dropout``). One copy with Megatron-LM's defaults: the fused
    scale-mask-softmax kernels save only their BF16 output (megatron-core
    ``fusions/fused_softmax.py``; Transformer Engine v2.9 ``attention/dot_product_attention/
    softmax.py``, ``ScaledMaskedSoftmax``), and megatron-core's PyTorch fallback computes in BF16
    unless --attention-softmax-in-fp32 (off in Megatron-LM's arguments, on in a bare
    ``TransformerConfig``), which adds its FP32 output, 4as^2b; Transformer Engine's fallback
    (s of 16384 or more) always does (``FusedScaleMaskSoftmax(softmax_in_fp32=True)``)."""
    return 2 * spec.num_attention_heads * seq_len * seq_len * mbs


def expanded_kv_bytes(spec: LlamaSpec, seq_len: int, mbs) -> float:
    """What unfused attention keeps of K and V beyond Eq. 11's 2sbkd each: 4sb(a - k)d, 0 without
    GQA. Both unfused kernels expand K and V to every query head before the score and context
    products (``repeat_interleave``) and those products save the expanded copies, 2sbad each,
    while the unexpanded ones are saved by nothing (the expansion's backward saves none):
    megatron-core's ``DotProductAttention`` (--transformer-impl local; core_v0.15.2
    transformer/dot_product_attention.py lines 159-165, baddbmm 184, bmm 229; core_v0.19.0 lines
    169-175) and Transformer Engine's ``UnfusedDotProductAttention`` (--attention-backend unfused;
    TransformerEngine v2.9 transformer_engine/pytorch/attention/dot_product_attention/backends.py,
    70f5366, lines 350-359, baddbmm 410, bmm 523). Measured to the byte on real-size Llama-3.1-8B
    layers of the local spec (tests/test_symbolic.py). With a = k (no GQA) nothing is expanded
    and V's saved view keeps the whole QKV output, as under flash attention: Eq. 11's own
    approximation, not this term's."""
    a, k, d = spec.num_attention_heads, spec.num_query_groups, spec.head_dim
    return 4 * seq_len * mbs * (a - k) * d


def unfused_attention_bytes(spec: LlamaSpec, seq_len: int, mbs) -> float:
    """What core attention keeps without a fused kernel beyond Eq. 11, one layer and microbatch,
    unsharded: the softmax output (``attention_scores_bytes``) and K and V expanded to every head
    (``expanded_kv_bytes``). Recomputing core attention (--recompute-modules core_attn) keeps
    none of it: the checkpoint saves the unexpanded Q, K and V that Eq. 11 counts."""
    return attention_scores_bytes(spec, seq_len, mbs) + expanded_kv_bytes(spec, seq_len, mbs)


def local_attention_buffer_bytes(spec: LlamaSpec, seq_len: int, mbs, tp, sequence_parallel: bool = False):
    """megatron-core's global memory buffer on one GPU under --transformer-impl local, in BF16
    bytes: 2 b (a/t) s^2, or with sequence parallelism at t > 1 the larger of that and 2 s b h.

    megatron-core's own ``DotProductAttention`` takes the input of its score product,
    [b a/t, s, s] in the activations' dtype, from the process's ``GlobalMemoryBuffer`` under the
    name "mpu" (core_v0.15.2 transformer/dot_product_attention.py lines 179-190, core_v0.19.0 and
    the megatron-core 0.16.1 wheel 189-200: ``get_tensor(...)``, then ``torch.baddbmm(
    buffer, ..., beta=0.0)``, whose result is a new tensor: the scores that
    ``attention_scores_bytes`` prices). The buffer (utils.py ``GlobalMemoryBuffer.get_tensor``)
    is allocated at the first request and kept for the rest of the run, grown only when a larger
    one comes: one per process, shared by every layer and microbatch, whatever the recomputation
    (a recomputed attention asks for the same shape). The only other "mpu" request in a dense
    model is sequence parallelism's all-gather in megatron-core's own linear layers
    (tensor_parallel/layers.py ``LinearWithGradAccumulationAndAsyncCommunication``, core_v0.15.2
    lines 474 and 511, core_v0.19.0 570 and 614, the 0.16.1 wheel 482 and 519): the gathered input, [s, b, h], with the same
    dtype and name, so the buffer is the larger of the two (the local spec allows SP only for
    LayerNorm models: ``options.local_spec``). Context parallelism is refused by the local
    attention (dot_product_attention.py asserts CP 1). Measured to the byte on the CPU emulator
    (tests/test_emulate.py); on the H200 (b 2, a 32, s 4096, t 1) it is 2 GiB of the stage's peak
    (tests/test_gpu_megatron_launch_data.py).

    Transformer Engine's unfused backend (--attention-backend unfused) allocates the same input
    with ``torch.empty`` at every call (TransformerEngine backends.py,
    ``UnfusedDotProductAttention.forward``): freed as the product returns, a transient inside a
    layer's forward, not a buffer the stage keeps, and not priced here."""
    s, b, t = seq_len, mbs, np.asarray(tp)
    scores = 2 * b * (spec.num_attention_heads / t) * s * s  # [b a/t, s, s], the score product's input
    if not sequence_parallel:
        return scores
    gathered = np.where(t > 1, 2 * s * b * spec.hidden_size, 0)  # [s, b, h], SP's all-gather of a linear input
    return np.maximum(scores, gathered)


def mlp_activation_bytes(spec: LlamaSpec, seq_len: int, mbs: int) -> float:
    """2sb(h + 4h_ffn): the input, the gate and up outputs, the SiLU output and the input of
    the down projection (Section 3.2, FFN)."""
    return 2 * seq_len * mbs * (spec.hidden_size + 4 * spec.ffn_hidden_size)


def unfused_swiglu_bytes(spec: LlamaSpec, seq_len: int, mbs, ffn_hidden_size: int | None = None) -> float:
    """What the MLP keeps with --no-bias-swiglu-fusion beyond Eq. 12's count of its h_ffn-wide
    tensors, one layer and microbatch, unsharded (split over t with h_ffn, and over c, with or
    without sequence parallelism: FC1's output is [s, b, 2 h_ffn / t]): 2 s b h_ffn, one BF16
    h_ffn tensor. ``ffn_hidden_size``: another MLP's width (an MoE model's shared experts,
    ``advisor.moe.memory``); default the spec's h_ffn.

    Eq. 12 counts 8 s b h_ffn (gate, up, SiLU output, FC2's input: 4 elements a token). Unfused,
    megatron-core's ``glu`` (``transformer/mlp.py``, core_v0.15.2 lines 203-211, core_v0.19.0
    323-331, the same code) runs ``silu(x_glu) * (x_linear + glu_linear_offset)``: SiLU saves its
    input, a view of FC1's output (2 h_ffn, kept whole), the product saves both factors, the SiLU
    output (h_ffn) and the sum ``x_linear + 0.0``, a new tensor (h_ffn), and FC2 saves the product
    (h_ffn): 5 elements, one more than Eq. 12 (the H200 runs' fifth h_ffn tensor,
    tests/test_gpu_megatron_launch_data.py). Fused (Megatron's default,
    ``fusions/fused_bias_swiglu.py``) it keeps 3, one fewer than Eq. 12, which the calibrated model
    corrects (``memory_terms.swiglu_fusion_fraction``): the two differ by 4 s b h_ffn, what a real
    one-rank CPU launch of core_v0.15.2 measured (32,768 bytes at s 32, b 2, h_ffn 128). The
    extra tensors stay BF16 with FP8 GEMMs (Transformer Engine casts only FC2's own input), and a
    recomputed MLP (--recompute-modules mlp) keeps none of them."""
    return 2 * seq_len * mbs * (spec.ffn_hidden_size if ffn_hidden_size is None else ffn_hidden_size)


def norm_activation_bytes(spec: LlamaSpec, seq_len: int, mbs: int) -> float:
    """4sbh: the inputs of the two RMSNorms (Section 3.2, Layer Norm)."""
    return 4 * seq_len * mbs * spec.hidden_size


def layer_activation_bytes(spec: LlamaSpec, seq_len: int, mbs: int, fused_norms: bool = True,
                           flash_attention: bool = True) -> float:
    """Eq. 12: sbh(12 + 4k/a + 8h_ffn/h), one transformer layer, one microbatch (``fused_norms``
    False: --transformer-impl local, and ``flash_attention`` False, which price Qwen3's QK norms
    differently; unfused attention's own terms are ``unfused_attention_bytes``)."""
    return (
        attention_activation_bytes(spec, seq_len, mbs, fused_norms, flash_attention)
        + mlp_activation_bytes(spec, seq_len, mbs)
        + norm_activation_bytes(spec, seq_len, mbs)
    )


def tensor_parallel_replicated_activation_bytes(spec: LlamaSpec, seq_len: int, mbs: int) -> float:
    """8sbh: what tensor parallelism alone does not split (Korthikanti et al. 2023, Sec. 4.2.2):
    the inputs of the two RMSNorms and of the QKV and first FFN projections. Sequence
    parallelism splits them too, which Eq. 15 assumes."""
    return 8 * seq_len * mbs * spec.hidden_size


def layer_checkpoint_bytes(spec: LlamaSpec, seq_len: int, mbs: int) -> float:
    """2sbh: the BF16 layer input, all that full recomputation keeps of a layer
    (Korthikanti et al. 2023, Table 2, 'full activation recomputation': 2sbhL)."""
    return 2 * seq_len * mbs * spec.hidden_size


def recomputed_module_bytes(spec: LlamaSpec, seq_len: int, mbs, modules, fused_norms: bool = True):
    """(hidden, ffn): the bytes of Eq. 12 that selective recomputation of ``modules``
    (--recompute-modules) stops keeping in a dense layer, one microbatch, unsharded: ``hidden``
    the h-sized projection inputs, ``ffn`` the MLP's h_ffn-sized tensors (megatron-core
    core_v0.15.2 and core_v0.19.0 ``transformer_layer.py``).

    - mlp: the MLP runs under ``tensor_parallel.checkpoint`` (``_forward_mlp``), which keeps only
      its input, and the MLP's own tensors go: Eq. 12's 8sbh_ffn (gate, up, SiLU, the down
      projection's input). With Transformer Engine's spec the pre-MLP norm is fused into
      linear_fc1 (``TELayerNormColumnParallelLinear``; pre_mlp_layernorm is IdentityOp), so the
      checkpoint's input is the norm's input (Eq. 12's norm term, still kept) and the norm's
      output, FC1's input (Eq. 12's 2sbh MLP input), goes too. With --transformer-impl local the
      norm is a module of its own and its output is the checkpoint's input: kept.
    - layernorm: the norms that are modules of their own run under ``CheckpointWithoutOutput``,
      whose output is freed once the next block has run (``discard_output_and_register_recompute``):
      with --transformer-impl local, the inputs of linear_qkv and linear_fc1, 2sbh each (with mlp
      too, the pre-MLP one is the checkpoint's input, so it goes as well). Transformer Engine's
      dense spec has no such norm (both fused), and Megatron recomputes nothing.
    - core_attn frees no Eq. 12 term (its s^2 scores and expanded K and V are
      ``unfused_attention_bytes``')."""
    s, b, h = seq_len, mbs, spec.hidden_size
    hidden = 0.0
    if "layernorm" in modules and not fused_norms:
        hidden += 4 * s * b * h  # input_layernorm's and pre_mlp_layernorm's outputs
    mlp = "mlp" in modules
    if mlp and fused_norms:
        hidden += 2 * s * b * h  # FC1's input, the fused norm's output
    ffn = 8 * s * b * spec.ffn_hidden_size if mlp else 0.0
    return hidden, ffn


def embedding_activation_bytes(spec: LlamaSpec, seq_len: int, mbs: int) -> float:
    """Eq. 13 per microbatch: 8sbh, the int64 input of the embedding as seed 004 counts it.

    The first stage holds it for every microbatch in flight (8sbhp in Eq. 13). Megatron-LM's
    own ``theoretical_memory_usage.py`` counts the token ids as 8sb; we keep the seed's term,
    which its tables use."""
    return 8 * seq_len * mbs * spec.hidden_size


def output_hidden_activation_bytes(spec: LlamaSpec, seq_len: int, mbs: int) -> float:
    """4sbh of Eq. 14: the inputs of the final RMSNorm and of the LM head (2sbh each)."""
    return 4 * seq_len * mbs * spec.hidden_size


def logits_bytes(spec: LlamaSpec, seq_len: int, mbs: int, vocab: int | None = None) -> float:
    """4sbv of Eq. 14: the FP32 logits that the cross-entropy loss keeps."""
    return 4 * seq_len * mbs * (spec.vocab_size if vocab is None else vocab)


def output_activation_bytes(spec: LlamaSpec, seq_len: int, mbs: int, vocab: int | None = None) -> float:
    """Eq. 14: 4sbh(1 + v/h), the LM head's activations for one microbatch."""
    return output_hidden_activation_bytes(spec, seq_len, mbs) + logits_bytes(spec, seq_len, mbs, vocab)
