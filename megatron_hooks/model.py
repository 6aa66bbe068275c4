"""Build a megatron-core Llama ``GPTModel`` (one pipeline stage of it) from an advisor ``LlamaSpec``.

The model is what Megatron-LM builds for ``--normalization RMSNorm --swiglu
--group-query-attention --position-embedding-type rope --untie-embeddings-and-output-weights
--disable-bias-linear`` with the *local* layer spec (``get_gpt_layer_local_spec``: unfused
attention that materialises the s x s scores, torch RMSNorm), dropout off and the fusions off,
so that it runs on a CPU as well as on CUDA. Tensor parallelism comes from megatron's
``parallel_state``, which the caller initialises first
(``parallel_state.initialize_model_parallel(tp, 1)``); on a CPU, inside ``CpuShim``.

``layer_spec="transformer_engine"`` builds what Megatron-LM's default ``--transformer-impl
transformer_engine`` builds, for the symbolic backend, where Transformer Engine does not import:
megatron-core's local modules with stand-ins for TE's norms and attention
(``kernels.transformer_engine_spec``), and Megatron-LM's default fusions for that spec (fused
RoPE, fused SwiGLU); these stand-ins run on fake tensors only.

A pipeline stage is chosen with ``layers`` (its global 1-based layer numbers) and
``pre_process`` / ``post_process`` (whether it holds the embedding / the final norm, output
layer and loss). Megatron numbers layers through its pipeline rank; here ``parallel_state``
has one pipeline stage, so the builder builds ``len(layers)`` layers and gives each its global
``layer_number`` (the unfused attention uses it only for query-key layer scaling, which is off).
The output layer's initialisation is scaled by the model's full depth, as Megatron does.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from advisor.models import LlamaSpec

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def dtype_name(dtype: torch.dtype) -> str:
    """The profile schema's name of a torch dtype ("float32", "bfloat16", "float16")."""
    for name, value in DTYPES.items():
        if value == dtype:
            return name
    raise ValueError(f"unsupported params dtype {dtype}; use one of {', '.join(DTYPES)}")


def stage_layers(layers_per_stage: Sequence[int], stage: int) -> tuple[int, ...]:
    """Global 1-based layer numbers of pipeline stage ``stage`` given every stage's layer count.

    >>> stage_layers([3, 5, 4], 1)
    (4, 5, 6, 7, 8)
    """
    if not 0 <= stage < len(layers_per_stage):
        raise ValueError(f"stage {stage} is not in a pipeline of {len(layers_per_stage)} stages")
    if any(count < 0 for count in layers_per_stage):
        raise ValueError(f"layer counts must not be negative: {list(layers_per_stage)}")
    first = sum(layers_per_stage[:stage]) + 1
    return tuple(range(first, first + layers_per_stage[stage]))


def transformer_config(spec: LlamaSpec, *, num_layers: int, params_dtype: torch.dtype = torch.float32,
                       **overrides):
    """The megatron-core ``TransformerConfig`` of a Llama spec (local spec, CPU-safe settings).

    ``overrides`` go to ``TransformerConfig`` unchanged (for example ``recompute_granularity``).
    """
    from megatron.core import parallel_state
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig
    from megatron.core.utils import scaled_init_method_normal

    init_std = 0.02
    values = dict(
        num_layers=num_layers,
        hidden_size=spec.hidden_size,
        ffn_hidden_size=spec.ffn_hidden_size,
        num_attention_heads=spec.num_attention_heads,
        num_query_groups=spec.num_query_groups,
        kv_channels=spec.head_dim,
        add_qkv_bias=spec.add_qkv_bias,
        qk_layernorm=spec.qk_layernorm,  # what --qk-layernorm sets (the layer spec builds the norms)
        layernorm_epsilon=spec.norm_epsilon,
        tensor_model_parallel_size=parallel_state.get_tensor_model_parallel_world_size(),
        context_parallel_size=parallel_state.get_context_parallel_world_size(),
        use_cpu_initialization=not torch.cuda.is_available(),
        params_dtype=params_dtype,
        bf16=params_dtype == torch.bfloat16,
        fp16=params_dtype == torch.float16,
        normalization="RMSNorm",
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        # Fields whose dataclass default is not Megatron-LM's (core_v0.19.0 megatron/training/
        # arguments.py, the 'incompatible defaults in dataclass' list; core_v0.15.2 arguments.py
        # sets them from its own flags, core_transformer_config_from_args):
        # --attention-softmax-in-fp32 is off unless given (or --apply-query-key-layer-scaling), where
        # TransformerConfig defaults it on; on, megatron-core's unfused softmax (fused_softmax.py,
        # forward_torch_softmax) keeps an FP32 copy of the s x s scores, 4 a s^2 b / t bytes a layer,
        # which a run with Megatron-LM's defaults does not (the H200 runs through the launcher,
        # benchmarks/gpu/data/h200_megatron_launch*/: 'attention_softmax_in_fp32 ... False').
        attention_softmax_in_fp32=False,
        # These are on in Megatron-LM's arguments (--no-... turns them off) but stay off here, where
        # their CUDA kernels do not exist; none changes what a layer keeps for the backward:
        # the fused bias-dropout-add saves what the unfused one does (no bias, no dropout: the H200
        # runs had it on and kept this model's layer to the byte), the fused scale-mask-softmax
        # kernel (fused_softmax.py, ScaledUpperTriangMaskedSoftmax) its BF16 output as torch's BF16
        # softmax does, the gradient-accumulation fusion only writes the weight gradient into
        # main_grad in place (a backward transient of one weight's gradient), and
        # persist_layer_norm is Apex's FusedLayerNorm's alone (RMSNorm here). RoPE's fusion does
        # change it (FP32 frequencies kept instead of cos and sin): off, as without Transformer
        # Engine (benchmarks/gpu/megatron_launch.sh passes --no-rope-fusion with --transformer-impl
        # local); the Transformer Engine spec turns it on (_TE_SPEC_FUSIONS). overlap_p2p_comm is
        # for the interleaved schedule's communication only.
        bias_dropout_fusion=False,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        sequence_parallel=False,
        init_method_std=init_std,
        # Megatron scales the output projections by the depth of the whole model.
        output_layer_init_method=scaled_init_method_normal(init_std, spec.num_layers),
    )
    values.update(overrides)
    # Megatron-LM builds an MLATransformerConfig for --multi-latent-attention (core_transformer_config_from_args).
    return (MLATransformerConfig if values.get("multi_latent_attention") else TransformerConfig)(**values)


LAYER_SPECS = ("local", "transformer_engine")

# Megatron-LM's defaults where it builds the Transformer Engine spec: --apply-rope-fusion and
# --bias-swiglu-fusion are on unless --no-rope-fusion / --no-bias-swiglu-fusion.
_TE_SPEC_FUSIONS = {"apply_rope_fusion": True, "bias_activation_fusion": True}


def build_gpt_model(
    spec: LlamaSpec,
    *,
    seq_len: int,
    layers: Sequence[int] | None = None,
    pre_process: bool = True,
    post_process: bool = True,
    params_dtype: torch.dtype = torch.float32,
    vocab_size: int | None = None,
    layer_spec: str = "local",
    **config_overrides,
):
    """One pipeline stage of ``spec`` as a megatron-core ``GPTModel``.

    Args:
        spec: the architecture (``advisor.models.LlamaSpec``).
        seq_len: the sequence length (``max_sequence_length`` of the rotary embedding).
        layers: global 1-based numbers of the consecutive decoder layers on this stage
            (``stage_layers`` computes them); None for all ``spec.num_layers``.
        pre_process: the stage holds the embedding (the first stage).
        post_process: the stage holds the final norm, the output layer and the loss (the last).
        params_dtype: dtype of weights and activations.
        vocab_size: the (padded) vocabulary; default ``spec.vocab_size``. It must divide by TP.
        layer_spec: "local" (megatron-core's own modules) or "transformer_engine" (TE's, stood
            in for on fake tensors; see the module docstring).
        config_overrides: extra ``TransformerConfig`` fields (for example ``sequence_parallel``,
            ``context_parallel_size``).

    Returns the model in training mode, on CUDA when CUDA is available, otherwise on the CPU;
    with BF16 or FP16, every floating tensor in that dtype, as after Megatron's ``Float16Module``.
    """
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    numbers = tuple(range(1, spec.num_layers + 1)) if layers is None else tuple(layers)
    if numbers and numbers != tuple(range(numbers[0], numbers[0] + len(numbers))):
        raise ValueError(f"a stage holds consecutive layers, got {list(numbers)}")
    if numbers and not (1 <= numbers[0] and numbers[-1] <= spec.num_layers):
        raise ValueError(f"layers {numbers[0]}..{numbers[-1]} are outside 1..{spec.num_layers}")
    if layer_spec not in LAYER_SPECS:
        raise ValueError(f"layer spec must be one of {', '.join(LAYER_SPECS)}, got {layer_spec!r}")
    experts = getattr(spec, "num_experts", None)
    mla = getattr(spec, "mla", None) is not None
    qk_layernorm = spec.qk_layernorm  # Qwen3's per-head Q and K norms (dense and MoE)
    if experts:
        config_overrides = {**moe_config_overrides(spec), **config_overrides}
    if layer_spec == "transformer_engine":
        from megatron_hooks.kernels import transformer_engine_spec

        config_overrides = {**_TE_SPEC_FUSIONS, **config_overrides}
        layer_specs = transformer_engine_spec(len(numbers), experts, multi_latent_attention=mla,
                                              qk_layernorm=qk_layernorm)
    elif mla:
        # megatron-core 0.16.1's local spec hands MLA's k_channels to its DotProductAttention,
        # which takes none: only the Transformer Engine spec (stood in for) builds MLA here.
        raise NotImplementedError("multi-latent attention builds with the transformer_engine layer spec only "
                                  "(megatron-core's local DotProductAttention takes no k_channels)")
    else:
        layer_specs = get_gpt_layer_local_spec(num_experts=experts, normalization="RMSNorm", qk_layernorm=qk_layernorm)
    config = transformer_config(spec, num_layers=len(numbers), params_dtype=params_dtype, **config_overrides)
    model = GPTModel(
        config=config,
        transformer_layer_spec=layer_specs,
        vocab_size=vocab_size or spec.vocab_size,
        max_sequence_length=seq_len,
        pre_process=pre_process,
        post_process=post_process,
        share_embeddings_and_output_weights=spec.tie_embeddings,
        position_embedding_type="rope",
        rotary_base=int(spec.rotary_base),
        rope_scaling=spec.rope_scaling_factor is not None,
        rope_scaling_factor=spec.rope_scaling_factor or 8.0,
    )
    for layer, number in zip(model.decoder.layers, numbers, strict=True):
        _renumber(layer, number)
    _place(model, on_gpu=not config.use_cpu_initialization and torch.cuda.is_available(), dtype=params_dtype)
    return model


def _place(model: torch.nn.Module, *, on_gpu: bool, dtype: torch.dtype) -> None:
    """The whole model on the GPU where megatron initialised on it: torch's RMSNorm (the local
    spec's norm) makes its weight on the CPU whatever the flag (seen on an H200, 2026-11-28); and
    in ``dtype``, as Megatron-LM's Float16Module casts the whole model (the RMSNorm weights too)."""
    if on_gpu:
        model.cuda()
    if dtype != torch.float32:
        _cast_floating(model, dtype)


def _cast_floating(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """``model.to(dtype)`` by assigning ``.data``, which is what ``Module.to`` does for plain
    tensors; ``Module.to`` swaps fake tensors instead, which their weak references forbid."""
    for tensor in (*model.parameters(), *model.buffers()):
        if tensor.is_floating_point() and tensor.dtype != dtype:
            tensor.data = tensor.data.to(dtype)


def _renumber(layer: torch.nn.Module, number: int) -> None:
    """Give a TransformerLayer (and its attention) its global layer number."""
    layer.layer_number = number
    attention = layer.self_attention
    attention.layer_number = number
    attention.core_attention.layer_number = number


def causal_mask(seq_len: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Megatron's boolean attention mask, [1, 1, s, s], True where a position is masked."""
    return torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool, device=device), diagonal=1)[None, None]


def moe_config_overrides(spec) -> dict:
    """megatron-core ``TransformerConfig`` fields of an MoE spec, as Megatron-LM's MoE flags set
    them (``--num-experts --moe-router-topk --moe-ffn-hidden-size
    --moe-shared-expert-intermediate-size --moe-router-score-function ...``), dropless, with the
    allgather dispatcher (EP 1) and no auxiliary loss (its scalars keep a few E-sized tensors);
    with MLA, ``--multi-latent-attention`` and its sizes, the q/kv latent RMSNorms
    (``--qk-layernorm``, as Megatron-LM's DeepSeek recipes set it) and YaRN's ``--rope-type yarn``."""
    values = dict(num_moe_experts=spec.num_experts, moe_router_topk=spec.moe_router_topk,
                  moe_ffn_hidden_size=spec.moe_ffn_hidden_size, moe_token_dispatcher_type="allgather",
                  moe_router_load_balancing_type="none", moe_router_score_function=spec.score_function,
                  moe_router_enable_expert_bias=spec.expert_bias, moe_router_dtype="fp32",
                  qk_layernorm=spec.qk_layernorm)
    if spec.shared_expert_size:
        values["moe_shared_expert_intermediate_size"] = spec.shared_expert_size
    if spec.router_num_groups:
        values.update(moe_router_num_groups=spec.router_num_groups, moe_router_group_topk=spec.router_group_topk)
    if spec.router_topk_scaling_factor:
        values["moe_router_topk_scaling_factor"] = spec.router_topk_scaling_factor
    if spec.router_pre_softmax:  # --moe-router-pre-softmax (a config.json's norm_topk_prob false)
        values["moe_router_pre_softmax"] = True
    if spec.mla is not None:
        values.update(_mla_overrides(spec))
    return values


def _mla_overrides(spec) -> dict:
    """``MLATransformerConfig`` fields of a spec with multi-latent attention (``advisor.moe.flags``
    emits the same as Megatron-LM flags)."""
    mla, yarn = spec.mla, spec.yarn
    values = dict(multi_latent_attention=True, q_lora_rank=mla.q_lora_rank, kv_lora_rank=mla.kv_lora_rank,
                  qk_head_dim=mla.qk_head_dim, qk_pos_emb_head_dim=mla.qk_pos_emb_head_dim,
                  v_head_dim=mla.v_head_dim, qk_layernorm=spec.qk_layernorm, rotary_base=spec.rotary_base,
                  rope_type="rope" if yarn is None else "yarn")
    if yarn is not None:
        values.update(rotary_scaling_factor=yarn.factor,
                      original_max_position_embeddings=yarn.original_max_position_embeddings,
                      beta_fast=yarn.beta_fast, beta_slow=yarn.beta_slow, mscale=yarn.mscale,
                      mscale_all_dim=yarn.mscale_all_dim)
    return values
