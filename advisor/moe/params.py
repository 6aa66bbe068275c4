"""Parameter counts of MoE decoders, one function per module, in elements.

Convention (the published totals' and the tests'): every weight of the decoder counts, the
input embedding and the untied LM head included; DeepSeek-V3's expert bias is a buffer in
megatron-core (``transformer/moe/router.py``, ``TopKRouter.__init__``: ``register_buffer
('expert_bias')``), not a parameter, and is not counted (256 elements per layer). Active
parameters are those one token passes through: attention, norms, the router, the shared
experts and top-k of the routed experts, plus the embedding and the LM head.
"""

from __future__ import annotations

from advisor import equations as eq
from advisor.moe.spec import MoESpec


def attention_parameters(spec: MoESpec, tp: int = 1) -> float:
    """One layer's attention on one GPU. Multi-latent attention
    (``transformer/multi_latent_attention.py``, ``MLASelfAttention.__init__``): the down
    projections h x q_lora and h x (kv_lora + d_rope) and the q/kv latent layernorms (with --qk-layernorm) are
    'duplicated' over TP (Transformer Engine's spec); the up projections q_lora x a(d_nope +
    d_rope) and kv_lora x a(d_nope + d_v) and the output projection a d_v x h split over t.
    Otherwise seed 004's Eq. 1 with Qwen3's per-head Q and K RMSNorms (``eq.qk_norm_parameters``)."""
    mla = spec.mla
    if mla is None:
        return eq.attention_parameters(spec, tp)
    a, h = spec.num_attention_heads, spec.hidden_size
    q_head = mla.qk_head_dim + mla.qk_pos_emb_head_dim
    norms = ((mla.q_lora_rank or 0) + mla.kv_lora_rank) if spec.qk_layernorm else 0
    if mla.q_lora_rank is None:
        replicated, split = norms, h * a * q_head
    else:
        replicated, split = h * mla.q_lora_rank + norms, mla.q_lora_rank * a * q_head
    replicated += h * (mla.kv_lora_rank + mla.qk_pos_emb_head_dim)
    split += mla.kv_lora_rank * a * (mla.qk_head_dim + mla.v_head_dim) + a * mla.v_head_dim * h
    return replicated + split / tp


def expert_parameters(spec: MoESpec) -> int:
    """One routed expert: a SwiGLU MLP, h x 2 h_moe (gate and up, fused FC1) and h_moe x h
    (FC2) (``transformer/moe/experts.py``, ``TEGroupedMLP``/``SequentialMLP``)."""
    return 3 * spec.hidden_size * spec.moe_ffn_hidden_size


def local_expert_parameters(spec: MoESpec, ep: int = 1, etp: int = 1) -> float:
    """The routed experts on one GPU: E/ep experts (``experts.py``: num_local_experts =
    num_moe_experts // ep), each split over the expert tensor parallel group (FC1 by columns,
    FC2 by rows, ``expert_tensor_parallel_size``)."""
    return spec.num_experts / ep * expert_parameters(spec) / etp


def shared_expert_parameters(spec: MoESpec, tp: int = 1) -> float:
    """The shared experts: one SwiGLU MLP of --moe-shared-expert-intermediate-size, split over the
    dense TP group (``transformer/moe/shared_experts.py``, ``SharedExpertMLP``: an ``MLP``)."""
    return 3 * spec.hidden_size * spec.shared_expert_size / tp


def router_parameters(spec: MoESpec) -> int:
    """The router's E x h gate weight, replicated on every rank (``router.py``, ``Router.__init__``)."""
    return spec.num_experts * spec.hidden_size


def moe_layer_dense_parameters(spec: MoESpec, tp: int = 1) -> float:
    """What of one MoE layer is sharded like a dense layer (TP, and DP x CP for the optimizer):
    attention, the two RMSNorms, the router and the shared experts."""
    return (attention_parameters(spec, tp) + eq.layer_norm_parameters(spec) + router_parameters(spec)
            + shared_expert_parameters(spec, tp))


def dense_layer_parameters(spec: MoESpec, tp: int = 1) -> float:
    """One of the first dense layers: attention, two norms and a SwiGLU of ffn_hidden_size."""
    return attention_parameters(spec, tp) + eq.mlp_parameters(spec, tp) + eq.layer_norm_parameters(spec)


def mtp_parameters(spec: MoESpec) -> float:
    """One multi-token-prediction module (``transformer/multi_token_prediction.py``,
    ``MultiTokenPredictionLayer``): the enorm and hnorm (h each), the eh projection 2h x h, one
    MoE transformer layer and its final norm (h); it shares the embedding and the LM head."""
    h = spec.hidden_size
    return 3 * h + 2 * h * h + moe_layer_dense_parameters(spec) + local_expert_parameters(spec)


def _ends(spec: MoESpec) -> float:
    embeddings = 1 if spec.tie_embeddings else 2
    return embeddings * eq.embedding_parameters(spec) + eq.final_norm_parameters(spec)


def total_parameters(spec: MoESpec, mtp: bool | None = None) -> float:
    """Every parameter: the ends, the dense layers, the MoE layers with all E experts, and the
    MTP modules when ``mtp`` (default: when the spec has them)."""
    with_mtp = spec.mtp_num_layers if mtp is None else (spec.mtp_num_layers if mtp else 0)
    return (_ends(spec) + spec.first_dense_layers * dense_layer_parameters(spec)
            + spec.moe_layers * (moe_layer_dense_parameters(spec) + local_expert_parameters(spec))
            + with_mtp * mtp_parameters(spec))


def every_parameter(spec) -> float:
    """Every parameter of a dense model (Eq. 3, ``equations.model_parameters``) or of a mixture of
    experts (``total_parameters``, every expert and the MTP modules): what a checkpoint holds."""
    if isinstance(spec, MoESpec):
        return total_parameters(spec)
    return eq.model_parameters(spec)


def active_parameters(spec: MoESpec) -> float:
    """Parameters one token passes through (top-k routed experts), embeddings included, no MTP."""
    return (_ends(spec) + spec.first_dense_layers * dense_layer_parameters(spec)
            + spec.moe_layers * (moe_layer_dense_parameters(spec) + spec.moe_router_topk * expert_parameters(spec)))
