"""MoE model specs: the five presets and Hugging Face ``config.json`` reading (mixtral, qwen3_moe,
deepseek_v3). A ``MoESpec`` is a ``LlamaSpec`` (its dense fields keep their meaning: the dense
FFN size is ``ffn_hidden_size``, used by the first dense layers) plus the fields Megatron-LM has
MoE and multi-latent-attention flags for; ``advisor.moe.flags`` writes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from advisor import limits
from advisor.errors import AdvisorError
from advisor.model_spec import LlamaSpec, _Config, _describe, dense_values, from_fields

ScoreFunction = Literal["softmax", "sigmoid"]
SCORE_FUNCTIONS = ("softmax", "sigmoid")
BALANCING = ("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none", "quantile_balancing")
"""--moe-router-load-balancing-type's values: core_v0.15.2's choices, and core_v0.19.0's
quantile_balancing (``router.py``)."""
_WIDTH = limits.MODEL["ffn_hidden_size"]
_EXPERTS = limits.Bound(1, limits.EXPERTS, "DeepSeek-V3 routes over 256 experts; 2^14 is 64 times that")


RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
"""Megatron's --recompute-modules values (core_v0.15.2 arguments.py; ``transformer_config.py``
__post_init__'s allowed modules in both releases)."""

@dataclass(frozen=True, kw_only=True, slots=True)
class MLA:
    """Multi-latent attention's sizes (DeepSeek-V2/V3; Megatron's --multi-latent-attention with
    --q-lora-rank --kv-lora-rank --qk-head-dim --qk-pos-emb-head-dim --v-head-dim)."""

    q_lora_rank: int | None
    """None: Q projected directly from h (no compression, DeepSeek-V2-Lite)."""
    kv_lora_rank: int
    qk_head_dim: int
    """The non-rotary part of a Q/K head (HF qk_nope_head_dim)."""
    qk_pos_emb_head_dim: int
    """The rotary part (HF qk_rope_head_dim), shared by all heads on the K side."""
    v_head_dim: int

    def __post_init__(self) -> None:
        if self.q_lora_rank is not None:
            limits.check_int(self.q_lora_rank, "mla.q_lora_rank", _WIDTH)
        for key in ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"):
            limits.check_int(getattr(self, key), f"mla.{key}", _WIDTH)


@dataclass(frozen=True, kw_only=True, slots=True)
class YarnScaling:
    """DeepSeek-V3's YaRN RoPE (Megatron's --rope-type yarn --rotary-scaling-factor --mscale
    --mscale-all-dim, and the original context as --original-max-position-embeddings)."""

    factor: float
    original_max_position_embeddings: int
    beta_fast: float
    beta_slow: float
    mscale: float
    mscale_all_dim: float

    def __post_init__(self) -> None:
        limits.check_float(self.factor, "yarn.factor", limits.ROPE_SCALING)
        limits.check_int(self.original_max_position_embeddings, "yarn.original_max_position_embeddings",
                         limits.SEQ_LEN)
        for key in ("beta_fast", "beta_slow"):
            limits.check_float(getattr(self, key), f"yarn.{key}", limits.YARN_MSCALE, low_open=True)
        # 0 is Megatron's default --mscale-all-dim: ``_yarn_get_mscale(scale, 0)`` is 1, no scaling
        for key in ("mscale", "mscale_all_dim"):
            limits.check_float(getattr(self, key), f"yarn.{key}", limits.YARN_MSCALE)


@dataclass(frozen=True, kw_only=True, slots=True)
class MoESpec(LlamaSpec):
    """A decoder whose MLPs are mixtures of experts (Megatron's MoELayer), from layer
    ``first_dense_layers`` on (--moe-layer-freq with leading zeros)."""

    num_experts: int
    moe_router_topk: int
    moe_ffn_hidden_size: int
    """One routed expert's SwiGLU intermediate size (--moe-ffn-hidden-size)."""
    shared_expert_size: int = 0
    """The shared experts' total intermediate size (--moe-shared-expert-intermediate-size); 0: none."""
    first_dense_layers: int = 0
    """Leading dense layers (HF first_k_dense_replace), priced by the dense terms."""
    qk_layernorm: bool = False
    """RMSNorm on each Q and K head (Qwen3; --qk-layernorm). With MLA the same flag builds the q and
    kv latent norms (DeepSeek-V3's q_a_layernorm, kv_a_layernorm): megatron-core
    ``gpt_layer_specs.py`` makes the up projections layer-norm linears only with qk_layernorm."""
    score_function: ScoreFunction = "softmax"
    expert_bias: bool = False
    """Aux-loss-free balancing with a per-expert bias (--moe-router-enable-expert-bias)."""
    aux_loss_coeff: float | tuple[float, ...] = 0.0
    """The auxiliary load-balancing loss's weight (--moe-aux-loss-coeff; Hugging Face's
    router_aux_loss_coef), one per ``load_balancing`` type where it has several (Megatron's
    nargs='+'). Megatron's default, 0, leaves the aux_loss router unbalanced (``router.py``: no
    loss at coefficient 0), so a row priced balanced must launch with it."""
    load_balancing: tuple[str, ...] | None = None
    """--moe-router-load-balancing-type, one type or several (``BALANCING``), as a command gave
    it; None: aux_loss, or none with the expert bias (the presets and config.json). Not priced
    (a few FLOPs on E-wide tensors): carried so that what is launched is what was read."""
    router_num_groups: int | None = None
    router_group_topk: int | None = None
    router_topk_scaling_factor: float | None = None
    mla: MLA | None = None
    yarn: YarnScaling | None = None
    mtp_num_layers: int = 0
    """Multi-token-prediction layers (--mtp-num-layers): an option, 0 by default (DeepSeek-V3's
    671B is without its one MTP module)."""

    def __post_init__(self) -> None:
        LlamaSpec.__post_init__(self)
        try:
            self._check_moe_fields()
        except AdvisorError as error:
            raise AdvisorError(f"model {self.name!r}: {error}") from None

    def _check_moe_fields(self) -> None:
        """Every MoE field's type and range, so that a spec read back from JSON is priced or
        refused in one line (never a TypeError deep in the estimator)."""
        experts = limits.check_int(self.num_experts, "num_experts", _EXPERTS)
        limits.check_int(self.moe_router_topk, "moe_router_topk",
                         limits.Bound(1, experts, f"top-k picks among the {experts} experts"))
        limits.check_int(self.moe_ffn_hidden_size, "moe_ffn_hidden_size", _WIDTH)
        limits.check_int(self.shared_expert_size, "shared_expert_size", limits.Bound(0, _WIDTH.high, _WIDTH.why))
        limits.check_int(self.first_dense_layers, "first_dense_layers",
                         limits.Bound(0, self.num_layers - 1, "at least one layer must be a mixture of experts"))
        limits.check_int(self.mtp_num_layers, "mtp_num_layers", limits.MTP_LAYERS)
        for key in ("qk_layernorm", "expert_bias"):
            if not isinstance(getattr(self, key), bool):
                raise AdvisorError(f"{key} must be true or false, got {_describe(getattr(self, key))}")
        if self.score_function not in SCORE_FUNCTIONS:
            raise AdvisorError(f"score_function must be {' or '.join(SCORE_FUNCTIONS)}, got "
                               f"{_describe(self.score_function)}")
        if self.expert_bias and self.score_function != "sigmoid":  # transformer_config.py, __post_init__
            raise AdvisorError("expert_bias (--moe-router-enable-expert-bias) needs the sigmoid score function "
                               "(--moe-router-score-function sigmoid): megatron-core refuses it with softmax")
        self._check_balancing()
        if self.router_topk_scaling_factor is not None:
            limits.check_float(self.router_topk_scaling_factor, "router_topk_scaling_factor",
                               limits.MOE_TOPK_SCALING, low_open=True)
        self._check_groups()
        for key, kind in (("mla", MLA), ("yarn", YarnScaling)):
            if getattr(self, key) is not None and not isinstance(getattr(self, key), kind):
                raise AdvisorError(f"{key} must be an object or null, got {_describe(getattr(self, key))}")

    def _check_balancing(self) -> None:
        """The balancing types and their weights: one weight per type where there are several
        (megatron-core ``transformer_config.py``, __post_init__, both releases), one otherwise."""
        types, weights = self.load_balancing, self.aux_loss_coeff
        if types is not None and (not isinstance(types, tuple) or not types
                                  or not all(isinstance(kind, str) and kind in BALANCING for kind in types)):
            raise AdvisorError(f"load_balancing must be null or a list of {', '.join(BALANCING)}, got "
                               f"{_describe(types)}")
        several = types is not None and len(types) > 1
        if several != isinstance(weights, tuple) or several and len(weights) != len(types):
            given = len(weights) if isinstance(weights, tuple) else 1
            raise AdvisorError(f"aux_loss_coeff needs one weight per load-balancing type ({len(types or ('',))}), "
                               f"got {given} (megatron-core refuses other counts)")
        for weight in weights if isinstance(weights, tuple) else (weights,):
            limits.check_float(weight, "aux_loss_coeff", limits.AUX_LOSS_COEFF)

    def _check_groups(self) -> None:
        """Group-limited routing (--moe-router-num-groups, --moe-router-group-topk) as megatron-core's
        ``group_limited_topk`` (moe/moe_utils.py) can run it: the groups split the experts evenly,
        and the chosen groups hold at least top-k experts."""
        groups, chosen = self.router_num_groups, self.router_group_topk
        if (groups is None) != (chosen is None):
            raise AdvisorError("group-limited routing needs both router_num_groups and router_group_topk")
        if groups is None:
            return
        limits.check_int(groups, "router_num_groups",
                         limits.Bound(1, self.num_experts, "each group holds at least one expert"))
        if self.num_experts % groups:
            raise AdvisorError(f"router_num_groups ({groups}) must divide num_experts ({self.num_experts})")
        limits.check_int(chosen, "router_group_topk", limits.Bound(1, groups, f"there are {groups} groups"))
        if chosen * (self.num_experts // groups) < self.moe_router_topk:
            raise AdvisorError(f"router_group_topk ({chosen}) groups of {self.num_experts // groups} experts "
                               f"hold fewer than moe_router_topk ({self.moe_router_topk})")

    @property
    def moe_layers(self) -> int:
        return self.num_layers - self.first_dense_layers

    @property
    def is_moe(self) -> bool:
        return True


def is_moe(spec: LlamaSpec) -> bool:
    return isinstance(spec, MoESpec)


def spec_from_dict(fields: object) -> MoESpec:
    """A MoESpec from its ``to_dict()`` (a sweep row's or an estimate's 'model'); AdvisorError,
    in one line naming the field, when it is not one."""
    if not isinstance(fields, dict):
        raise AdvisorError(f"model must be an object (a model spec), got {_describe(fields)}")
    values = dict(fields)
    for key in ("load_balancing", "aux_loss_coeff"):  # JSON's lists, the spec's tuples
        if isinstance(values.get(key), list):
            values[key] = tuple(values[key])
    for key, kind in (("mla", MLA), ("yarn", YarnScaling)):
        if values.get(key) is not None:
            values[key] = from_fields(kind, values[key], f"model {key}")
    return from_fields(MoESpec, values, "model")


# --- presets ------------------------------------------------------------------------------------
# Values of each model's Hugging Face config.json (mistralai/Mixtral-8x7B-v0.1,
# mistralai/Mixtral-8x22B-v0.1, Qwen/Qwen3-30B-A3B, Qwen/Qwen3-235B-A22B, deepseek-ai/DeepSeek-V3);
# the same values are committed as tests/data/moe/*.json and read back in the tests.

def _mixtral(name, L, h, ffn, a, v, aux) -> MoESpec:
    return MoESpec(name=name, num_layers=L, hidden_size=h, ffn_hidden_size=ffn, num_attention_heads=a,
                   num_query_groups=8, vocab_size=v, rotary_base=1e6, norm_epsilon=1e-5,
                   num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=ffn, aux_loss_coeff=aux)


def _qwen3(name, L, h, ffn, a, moe_ffn) -> MoESpec:
    return MoESpec(name=name, num_layers=L, hidden_size=h, ffn_hidden_size=ffn,
                   num_attention_heads=a, num_query_groups=4, vocab_size=151936, kv_channels=128,
                   rotary_base=1e6, norm_epsilon=1e-6, num_experts=128, moe_router_topk=8,
                   moe_ffn_hidden_size=moe_ffn, qk_layernorm=True, aux_loss_coeff=0.001)


DEEPSEEK_V3 = MoESpec(
    name="deepseek-v3", num_layers=61, hidden_size=7168, ffn_hidden_size=18432, num_attention_heads=128,
    num_query_groups=128, vocab_size=129280, rotary_base=10000.0, norm_epsilon=1e-6,
    num_experts=256, moe_router_topk=8, moe_ffn_hidden_size=2048, shared_expert_size=2048,
    first_dense_layers=3, score_function="sigmoid", expert_bias=True, router_num_groups=8, router_group_topk=4,
    router_topk_scaling_factor=2.5, qk_layernorm=True,
    mla=MLA(q_lora_rank=1536, kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128),
    yarn=YarnScaling(factor=40.0, original_max_position_embeddings=4096, beta_fast=32.0, beta_slow=1.0,
                     mscale=1.0, mscale_all_dim=1.0),
)

PRESETS: dict[str, MoESpec] = {spec.name: spec for spec in (
    _mixtral("mixtral-8x7b", 32, 4096, 14336, 32, 32000, 0.02),
    _mixtral("mixtral-8x22b", 56, 6144, 16384, 48, 32768, 0.001),
    _qwen3("qwen3-30b-a3b", 48, 2048, 6144, 32, 768),
    _qwen3("qwen3-235b-a22b", 94, 4096, 12288, 64, 1536),
    DEEPSEEK_V3,
)}


# --- Hugging Face config.json ------------------------------------------------------------------

HF_MODEL_TYPES = ("mixtral", "qwen3_moe", "deepseek_v3")
EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
"""The keys by which a config.json says its MLPs are experts (Mixtral, Qwen-MoE, DeepSeek)."""


def _count(config: _Config, key: str, default=None, low: int = 1) -> int:
    value = config.config.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise config.error(key, f"must be an integer of at least {low}, got {_describe(value)}")
    if value > 2**22:
        raise config.error(key, f"is {_describe(value)}, more than this tool handles ({2**22})")
    return value


def _expect(config: _Config, key: str, wanted, why: str) -> None:
    """Refuse, naming the key, a value this tool does not price."""
    value = config.config.get(key, wanted)
    if value != wanted:
        raise config.error(key, f"is {_describe(value)}: {why}")


def _yarn(config: _Config) -> YarnScaling:
    scaling = config.config.get("rope_scaling")
    if not isinstance(scaling, dict) or scaling.get("type", scaling.get("rope_type")) != "yarn":
        kind = scaling.get("type", scaling.get("rope_type")) if isinstance(scaling, dict) else scaling
        raise config.error("rope_scaling", f"of type {_describe(kind)}: this tool reads DeepSeek-V3's yarn "
                                           "(Megatron's --rope-type yarn)")
    numbers = {}
    for key in ("factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
        value = scaling.get(key)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise config.error(f"rope_scaling.{key}", f"must be a positive number, got {_describe(value)}")
        numbers[key] = float(value)
    original = scaling.get("original_max_position_embeddings")
    if not isinstance(original, int) or isinstance(original, bool) or original < 1:
        raise config.error("rope_scaling.original_max_position_embeddings",
                           f"must be a positive integer, got {_describe(original)}")
    # Megatron-LM has no flags for these: MLATransformerConfig fixes them
    # (transformer/transformer_config.py: original_max_position_embeddings 4096, beta_fast 32, beta_slow 1).
    for key, fixed in (("original_max_position_embeddings", 4096), ("beta_fast", 32.0), ("beta_slow", 1.0)):
        value = original if key == "original_max_position_embeddings" else numbers[key]
        if value != fixed:
            raise config.error(f"rope_scaling.{key}", f"is {_describe(value)}: Megatron-LM's MLA fixes it at {fixed:g}")
    return YarnScaling(original_max_position_embeddings=original, **numbers)


def _mixtral_fields(config: _Config) -> dict:
    _expect(config, "router_jitter_noise", 0.0, "this tool prices routers without input jitter")
    experts = _count(config, "num_local_experts")
    return dict(num_experts=experts, moe_router_topk=_count(config, "num_experts_per_tok"),
                moe_ffn_hidden_size=_count(config, "intermediate_size"), aux_loss_coeff=_aux_loss_coeff(config))


def _aux_loss_coeff(config: _Config) -> float:
    """router_aux_loss_coef, or Transformers' default (0.001, MixtralConfig and Qwen3MoeConfig)."""
    value = config.config.get("router_aux_loss_coef", 0.001)
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not 0 <= value <= limits.AUX_LOSS_COEFF.high):
        raise config.error("router_aux_loss_coef", f"must be a number from 0 to {limits.AUX_LOSS_COEFF.high:g}, "
                                                   f"got {_describe(value)}")
    return float(value)


def _qwen3_fields(config: _Config) -> dict:
    _expect(config, "decoder_sparse_step", 1, "this tool prices MoE in every layer (Megatron's --moe-layer-freq 1)")
    _expect(config, "mlp_only_layers", [], "this tool prices MoE in every layer")
    _expect(config, "norm_topk_prob", True, "Megatron's softmax router renormalises the top-k probabilities")
    return dict(num_experts=_count(config, "num_experts"), moe_router_topk=_count(config, "num_experts_per_tok"),
                moe_ffn_hidden_size=_count(config, "moe_intermediate_size"), qk_layernorm=True,
                aux_loss_coeff=_aux_loss_coeff(config))


def _deepseek_fields(config: _Config) -> dict:
    _expect(config, "scoring_func", "sigmoid", "this tool reads DeepSeek-V3's sigmoid router")
    _expect(config, "topk_method", "noaux_tc", "this tool reads DeepSeek-V3's aux-loss-free routing (noaux_tc)")
    _expect(config, "norm_topk_prob", True, "Megatron's sigmoid router renormalises the top-k scores")
    _expect(config, "moe_layer_freq", 1, "this tool prices MoE in every layer after first_k_dense_replace")
    q_lora = config.config.get("q_lora_rank")
    mla = MLA(q_lora_rank=None if q_lora is None else _count(config, "q_lora_rank"),
              kv_lora_rank=_count(config, "kv_lora_rank"), qk_head_dim=_count(config, "qk_nope_head_dim"),
              qk_pos_emb_head_dim=_count(config, "qk_rope_head_dim"), v_head_dim=_count(config, "v_head_dim"))
    shared = _count(config, "n_shared_experts", 0, low=0)
    moe_ffn = _count(config, "moe_intermediate_size")
    scaling = config.config.get("routed_scaling_factor", 1.0)
    if not isinstance(scaling, (int, float)) or isinstance(scaling, bool) or scaling <= 0:
        raise config.error("routed_scaling_factor", f"must be a positive number, got {_describe(scaling)}")
    groups, chosen = _count(config, "n_group"), _count(config, "topk_group")
    if chosen > groups:
        raise config.error("topk_group", f"is {chosen}, more than the n_group ({groups}) it chooses among")
    return dict(num_experts=_count(config, "n_routed_experts"), moe_router_topk=_count(config, "num_experts_per_tok"),
                moe_ffn_hidden_size=moe_ffn, shared_expert_size=shared * moe_ffn,
                first_dense_layers=_count(config, "first_k_dense_replace", 0, low=0), score_function="sigmoid",
                expert_bias=True, router_num_groups=groups,
                router_group_topk=chosen, router_topk_scaling_factor=float(scaling),
                qk_layernorm=True, mla=mla, yarn=_yarn(config) if config.config.get("rope_scaling") is not None else None)


def load_moe_config(config: _Config, model_type: str) -> MoESpec:
    """A MoE config.json (``advisor.models.load_hf_config`` hands it here by model_type): the dense
    fields as for Llama, the expert fields per family; one line naming the key for the rest."""
    values = dense_values(config, model_type, rope_scaling=model_type != "deepseek_v3")
    family = {"mixtral": _mixtral_fields, "qwen3_moe": _qwen3_fields, "deepseek_v3": _deepseek_fields}[model_type]
    fields = family(config)
    if fields["num_experts"] > _EXPERTS.high:
        raise config.error(EXPERT_COUNT_KEYS[0], f"is {fields['num_experts']}, more than this tool handles "
                                                 f"({_EXPERTS.high:g})")
    try:
        return MoESpec(name=str(config.path), **values, **fields)
    except AdvisorError as error:
        raise AdvisorError(f"{config.path}: {error}") from None
