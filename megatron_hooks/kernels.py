"""Stand-ins for the CUDA kernels of a GPU run, for the symbolic backend's meta tensors.

A fake CUDA tensor cannot exist on a CPU-only torch, so the symbolic backend runs megatron-core
on meta tensors, and there torch's paths for devices other than CUDA would run, the CPU's:
torch's CPU RMSNorm decomposes into FP32 ops and keeps two FP32 copies of its input, where the
CUDA kernel keeps the input and one FP32 number per row. What a layer keeps for the backward
pass is what its kernels save, so each kernel that a GPU run would use is replaced here by a
stand-in that allocates the kernel's outputs and saves (``ctx.save_for_backward``, which the
hooks' saved-tensor count sees) exactly the tensors that the CUDA kernel's autograd node
saves, with their shapes and dtypes. The stand-ins compute nothing: they accept meta and fake
tensors only.

========================  =====================================================================
stand-in                  the kernel, and what its autograd node saves
========================  =====================================================================
``fused_rms_norm``        torch's RMSNorm on CUDA (``at::_fused_rms_norm``, aten/src/ATen/native/
                          cuda/layer_norm_kernel.cu; grad_fn ``FusedRmsNormBackward0``): the
                          input, the weight, and ``rstd``, FP32, [N..., 1] (read on the lent H100,
                          coord GPU_FACTS.md). Transformer Engine's RMSNorm (``TENorm``, and the
                          norm inside ``TELayerNormColumnParallelLinear``) keeps the same: the
                          input, the weight and ``rsigma``, FP32, one per row
                          (transformer_engine/pytorch/module/layernorm_linear.py, the
                          ``save_for_backward(inputmat, ln_weight, mu, rsigma, ...)`` of
                          ``_LayerNormLinear``), its output being the GEMM's saved input, as the
                          next linear layer's here.
``CudnnAttention``        Transformer Engine's ``FusedAttention`` (cuDNN, "F16_arbitrary_seqlen"),
                          which TE prefers on Hopper and newer ("Disabling FlashAttention to give
                          FusedAttention preference on Hopper+", transformer_engine/pytorch/
                          attention/dot_product_attention/utils.py): ``FusedAttnFunc`` saves q, k,
                          v as given (no copies in the sbhd layout: v stays a view of the QKV
                          projection's output), the output [s, b, h, d], the softmax statistics
                          FP32 [b, h, s, 1] and the RNG state (2 x uint64); the output is returned
                          as a view, which the output projection saves (backends.py).
``RingAttention``         Transformer Engine's context parallelism by point-to-point exchange of
                          K and V (``AttnFuncWithCPAndKVP2P``, context_parallel.py, BF16, causal,
                          sbhd): saves this rank's q, the last K|V buffer of the ring (K and V
                          concatenated, a new tensor), the corrected output and the FP32 LSE
                          [b, h, s/c], and one RNG state per ring step; forward transients are
                          the ring's receive buffers and the per-step outputs and statistics.
``fused_apply_rotary_pos_emb``  Transformer Engine's fused RoPE (``FusedRoPEFunc``,
                          transformer_engine/pytorch/attention/rope.py, what megatron-core's
                          ``apply_rope_fusion`` calls): a new output, and only the FP32
                          frequencies saved.
========================  =====================================================================

What the stand-ins leave out: the kernels' workspaces (cuDNN's backward workspace, the
reduction buffers of the norm's weight gradient), the cached int32 sequence offsets that TE's
attention passes to cuDNN (b + 1 values per layer) and, in the ring, the FP32 products of the
output correction (modelled as one FP32 copy of the output, then freed). They change transient
peaks, never what a layer keeps. megatron-core's own fusions (the fused SwiGLU and the fused
cross-entropy) are Python and TorchScript, and run on fake tensors unchanged.

``cuda_kernels(...)`` installs the stand-ins that reach megatron-core through functions
(``torch.nn.functional.rms_norm``, which the local spec's torch RMSNorm calls, and megatron-core's
``fused_apply_rotary_pos_emb``); ``transformer_engine_spec(...)`` is the local layer spec with
the TE stand-in modules in place of Transformer Engine's, for a run whose ``--transformer-impl``
is ``transformer_engine`` (Megatron-LM's default) where Transformer Engine does not import.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import torch
from megatron.core.transformer.module import MegatronModule
from torch._subclasses.fake_tensor import FakeTensor

_RNG_STATE = (2,)  # [seed, offset], uint64, in every TE attention kernel's saved state


def _fake_only(*tensors: torch.Tensor) -> None:
    for tensor in tensors:
        if tensor is not None and not (tensor.is_meta or isinstance(tensor, FakeTensor)):
            raise TypeError("the CUDA kernel stand-ins compute nothing: they run on the symbolic backend's fake "
                            "tensors only")


# --- RMSNorm ------------------------------------------------------------------------------


class _FusedRMSNorm(torch.autograd.Function):
    """torch's CUDA RMSNorm (and TE's): out, rstd = kernel(x, weight); saves x, weight, rstd."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor | None, dims: int) -> torch.Tensor:
        _fake_only(x, weight)
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        # The accumulation type of BF16/FP16 is FP32; rstd keeps the normalised dims as size 1.
        rstd = torch.empty((*x.shape[: x.dim() - dims], *(1,) * dims), dtype=torch.float32, device=x.device)
        ctx.save_for_backward(x, weight, rstd)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight, rstd = ctx.saved_tensors
        grad_x = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        grad_weight = None if weight is None else torch.empty(weight.shape, dtype=weight.dtype, device=x.device)
        return grad_x, grad_weight, None


def fused_rms_norm(x: torch.Tensor, normalized_shape: Sequence[int], weight: torch.Tensor | None = None,
                   eps: float | None = None) -> torch.Tensor:
    """``torch.nn.functional.rms_norm`` as the CUDA kernel runs it (see the module docstring)."""
    return _FusedRMSNorm.apply(x, weight, len(tuple(normalized_shape)))


class FusedRMSNorm(torch.nn.Module):
    """Transformer Engine's RMSNorm (``TENorm``) as a megatron-core norm module: the constructor
    of megatron's norms, a weight of ones in the run's dtype (marked for the sequence-parallel
    gradient all-reduce as TE marks it), and the fused kernel's saved tensors."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.config, self.eps = config, eps
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype))
        self.weight.sequence_parallel = config.sequence_parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused_rms_norm(x, self.weight.shape, self.weight, self.eps)


# --- attention ----------------------------------------------------------------------------


class _CudnnAttention(torch.autograd.Function):
    """TE's FusedAttnFunc (cuDNN), BF16, causal, sbhd: q [s, b, hq, d], k and v [s, b, hk, d]."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        _fake_only(q, k, v)
        s, b, heads, _ = q.shape
        # The output has V's head size (MLA: d_v 128 where Q and K have d_nope + d_rope 192).
        out = torch.empty((s, b, heads, v.shape[-1]), dtype=q.dtype, device=q.device)
        stats = torch.empty((b, heads, s, 1), dtype=torch.float32, device=q.device)
        rng_state = torch.empty(_RNG_STATE, dtype=torch.uint64, device=q.device)
        ctx.save_for_backward(q, k, v, out, stats, rng_state)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        q, k, v, *_ = ctx.saved_tensors
        return tuple(torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))


class _RingAttention(torch.autograd.Function):
    """TE's AttnFuncWithCPAndKVP2P, BF16, causal, sbhd, cuDNN per step, on CP rank ``rank`` of
    ``size``: q [s/c, b, hq, d] (two load-balanced halves), k and v [s/c, b, hk, d]."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rank: int, size: int) -> torch.Tensor:
        _fake_only(q, k, v)
        s, b, heads, d = q.shape
        device = q.device
        # FusedAttention makes q, k and v contiguous first (v is a view of the QKV output).
        q, k, v = (t.contiguous() for t in (q, k, v))
        buffers = [torch.cat((k.reshape(-1), v.reshape(-1)))]
        outs, stats, rng_states = [], [], []
        for step in range(size):
            if step < size - 1:
                buffers.append(torch.empty_like(buffers[-1]))  # the next step's K|V, received
            # diagonal (step 0) and lower-triangle steps (step <= rank): all of q against the
            # diagonal block or the first half of K|V; upper-triangle steps: q's second half.
            rows = s if step <= rank else s // 2
            outs.append(torch.empty((rows, b, heads, d), dtype=q.dtype, device=device))
            stats.append(torch.empty((b, heads, rows, 1), dtype=torch.float32, device=device))
            rng_states.append(torch.empty(_RNG_STATE, dtype=torch.uint64, device=device))
        lse = torch.empty((b, heads, s), dtype=torch.float32, device=device)  # the clone of step 0's
        correction = torch.empty((s, b, heads, d), dtype=torch.float32, device=device)  # FP32 products
        out = torch.empty((s, b, heads, d), dtype=q.dtype, device=device)
        del correction, outs, stats
        ctx.save_for_backward(q, buffers[-1], out, lse, *rng_states)
        ctx.shapes = (k.shape, v.shape)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        q, kv, *_ = ctx.saved_tensors
        k_shape, v_shape = ctx.shapes
        dq = torch.empty_like(q)
        ring = [torch.empty((2, *kv.shape), dtype=kv.dtype, device=kv.device) for _ in range(2)]  # K|V and dK|dV
        dk = torch.empty(k_shape, dtype=kv.dtype, device=kv.device)
        dv = torch.empty(v_shape, dtype=kv.dtype, device=kv.device)
        del ring
        return dq, dk, dv, None, None


class TEAttention(MegatronModule):
    """Transformer Engine's ``TEDotProductAttention`` as megatron-core builds it for a GPT layer
    (causal, sbhd, no dropout): cuDNN fused attention, or its context-parallel ring with CP > 1.
    Same constructor and forward signature as megatron-core's ``DotProductAttention``."""

    def __init__(self, config, layer_number: int, attn_mask_type, attention_type: str,
                 attention_dropout: float | None = None, softmax_scale: float | None = None,
                 k_channels: int | None = None, v_channels: int | None = None,
                 cp_comm_type: str | None = None, pg_collection=None) -> None:
        super().__init__(config=config)
        if cp_comm_type not in (None, "p2p"):
            raise ValueError(f"the symbolic backend models TE's p2p context parallelism, not {cp_comm_type!r}")
        if k_channels != v_channels and config.context_parallel_size > 1:
            raise ValueError("the symbolic backend's TE ring attention takes equal K and V head sizes (no MLA)")
        self.layer_number = layer_number

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None) -> torch.Tensor:
        from megatron.core import parallel_state

        if packed_seq_params is not None or attention_bias is not None:
            raise ValueError("the symbolic backend's TE attention takes no packed sequences or attention bias")
        size = parallel_state.get_context_parallel_world_size()
        if size > 1:
            out = _RingAttention.apply(query, key, value, parallel_state.get_context_parallel_rank(), size)
        else:
            out = _CudnnAttention.apply(query, key, value)
        return out.view(*out.shape[:2], -1)  # [s, b, h, d] -> [s, b, h*d], a view, as TE returns it


# --- RoPE ---------------------------------------------------------------------------------


class _FusedRoPE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        _fake_only(t, freqs)
        ctx.save_for_backward(freqs)
        return torch.empty(t.shape, dtype=t.dtype, device=t.device)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return torch.empty(grad.shape, dtype=grad.dtype, device=grad.device), None


def fused_apply_rotary_pos_emb(t: torch.Tensor, freqs: torch.Tensor, transpose_output_memory: bool = False,
                               interleaved: bool = False) -> torch.Tensor:
    """megatron-core's ``fused_apply_rotary_pos_emb`` (TE's FusedRoPEFunc), sbhd."""
    return _FusedRoPE.apply(t, freqs)


# --- MLA's fused YaRN RoPE (Triton) ----------------------------------------------------------


class _FusedMLARoPEQ(torch.autograd.Function):
    """megatron-core's ``ApplyMLARotaryEmbQ`` (fusions/fused_mla_yarn_rope_apply.py, a Triton
    kernel): RoPE on the last d_rope of each query head, in place; saves only cos and sin."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        _fake_only(q, cos, sin)
        ctx.mark_dirty(q)
        ctx.save_for_backward(cos, sin)
        return q

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None, None


class _FusedMLARoPEKV(torch.autograd.Function):
    """megatron-core's ``ApplyMLARotaryEmbKV``: splits the KV up projection's output into a new
    key [.., d_nope + d_rope] (the roped, shared k_pos_emb appended to each head) and a new value
    [.., d_v]; saves only cos and sin."""

    @staticmethod
    def forward(ctx, kv: torch.Tensor, k_pos_emb: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                emb_dim: int, k_dim: int, v_dim: int):
        _fake_only(kv, k_pos_emb, cos, sin)
        ctx.save_for_backward(cos, sin)
        ctx.shapes = (kv.shape, k_pos_emb.shape)
        *lead, heads, _ = kv.shape
        return kv.new_empty((*lead, heads, emb_dim + k_dim)), kv.new_empty((*lead, heads, v_dim))

    @staticmethod
    def backward(ctx, grad_key: torch.Tensor, grad_value: torch.Tensor):
        kv_shape, emb_shape = ctx.shapes
        return grad_key.new_empty(kv_shape), grad_key.new_empty(emb_shape), None, None, None, None, None


def fused_apply_mla_rope_for_q(t, cos, sin, qk_head_dim, emb_dim, cu_seqlens_q=None, cp_rank=0, cp_size=1,
                               rotary_interleaved=False):
    """megatron-core's ``fused_apply_mla_rope_for_q``, sbhd, on fake tensors."""
    if cu_seqlens_q is not None:
        raise ValueError("the symbolic backend's fused MLA RoPE takes no packed sequences")
    return _FusedMLARoPEQ.apply(t, cos, sin)


def fused_apply_mla_rope_for_kv(kv, k_pos_emb, cos, sin, emb_dim, k_dim, v_dim, cu_seqlens_kv=None, cp_rank=0,
                                cp_size=1, rotary_interleaved=False):
    """megatron-core's ``fused_apply_mla_rope_for_kv``, sbhd, on fake tensors."""
    if cu_seqlens_kv is not None:
        raise ValueError("the symbolic backend's fused MLA RoPE takes no packed sequences")
    return _FusedMLARoPEKV.apply(kv, k_pos_emb, cos, sin, emb_dim, k_dim, v_dim)


# --- installing them ----------------------------------------------------------------------


@contextlib.contextmanager
def cuda_kernels() -> Iterator[None]:
    """The stand-ins that megatron-core reaches through functions, installed while the context
    is open: torch's RMSNorm (``F.rms_norm``, which ``torch.nn.RMSNorm`` and so the local spec's
    norm call) and megatron-core's fused RoPE (used when ``apply_rope_fusion`` is set)."""
    import megatron.core.extensions.transformer_engine as extensions
    import megatron.core.models.common.embeddings.rope_utils as rope_utils
    import megatron.core.transformer.multi_latent_attention as mla

    saved = [(torch.nn.functional, "rms_norm", torch.nn.functional.rms_norm),
             (rope_utils, "fused_apply_rotary_pos_emb", rope_utils.fused_apply_rotary_pos_emb),
             (mla, "fused_apply_mla_rope_for_q", mla.fused_apply_mla_rope_for_q),
             (mla, "fused_apply_mla_rope_for_kv", mla.fused_apply_mla_rope_for_kv)]
    torch.nn.functional.rms_norm = fused_rms_norm
    rope_utils.fused_apply_rotary_pos_emb = fused_apply_rotary_pos_emb
    # MLA's fused YaRN RoPE is Triton (None here: Triton needs CUDA).
    mla.fused_apply_mla_rope_for_q = fused_apply_mla_rope_for_q
    mla.fused_apply_mla_rope_for_kv = fused_apply_mla_rope_for_kv
    # megatron-core 0.16.1's MLA sets HAVE_TE when its TE extension module imports, which it does
    # without Transformer Engine (its TE classes are then MagicMocks, and MLASelfAttention's
    # isinstance(linear_proj, TELinear) raises): the extension's own HAVE_TE says TE is absent.
    saved.append((mla, "HAVE_TE", mla.HAVE_TE))
    mla.HAVE_TE = extensions.HAVE_TE
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def transformer_engine_spec(num_layers: int, num_experts: int | None = None, multi_latent_attention: bool = False,
                            qk_layernorm: bool = False):
    """The block spec of a GPT stage with ``--transformer-impl transformer_engine``, from
    megatron-core's local modules where they keep what TE's keep (the column and row parallel
    linears save their local input and weight, as TE's Linear does) and the stand-ins above where
    they do not: the RMSNorms (before attention, before the MLP, and the final one) and the core
    attention. With ``num_experts``, the MLP is megatron-core's ``MoELayer`` with its
    ``SequentialMLP`` experts (TE's grouped GEMM keeps, per token copy, the same FC1 and FC2
    inputs as the experts' linears do one by one). With ``multi_latent_attention``, megatron-core's
    ``MLASelfAttention``: TE's spec fuses the q and kv latent RMSNorms into the up projections
    (``TELayerNormColumnParallelLinear``, which saves the latent, the weight, rsigma and the normed
    latent as its GEMM input), here the RMSNorm stand-in and then the up projection, which save the
    same; the down projections are TE's duplicated ``TELinear`` there, column-parallel linears
    here (the same at TP 1). With ``qk_layernorm`` (Qwen3's --qk-layernorm), the per-head Q and K
    RMSNorms, TE's ``TENorm`` in its spec, the RMSNorm stand-in here."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    layer = get_gpt_layer_local_spec(num_experts=num_experts, moe_grouped_gemm=False, normalization="RMSNorm",
                                     multi_latent_attention=multi_latent_attention,
                                     qk_layernorm=multi_latent_attention or qk_layernorm)
    layer.submodules.input_layernorm = FusedRMSNorm
    layer.submodules.pre_mlp_layernorm = FusedRMSNorm
    attention = layer.submodules.self_attention.submodules
    attention.core_attention = TEAttention
    if multi_latent_attention:
        attention.q_layernorm = attention.kv_layernorm = FusedRMSNorm
    elif qk_layernorm:
        attention.q_layernorm = attention.k_layernorm = FusedRMSNorm
    return TransformerBlockSubmodules(layer_specs=[layer] * num_layers, layer_norm=FusedRMSNorm)
