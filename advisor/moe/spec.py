"""MoE model specs: the five presets and Hugging Face ``config.json`` reading (mixtral, qwen3_moe,
deepseek_v3, and kimi_k2 as deepseek_v3). A ``MoESpec`` is a ``LlamaSpec`` (its dense fields keep their meaning: the dense
FFN size is ``ffn_hidden_size``, used by the first dense layers) plus the fields Megatron-LM has
MoE and multi-latent-attention flags for; ``advisor.moe.flags`` writes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from advisor import limits
from advisor.errors import AdvisorError
from advisor.model_spec import (FIELD_FLAGS, HF_KEYS, FieldError, LlamaSpec, _Config, _describe, check_field,
                                 dense_values, from_fields)

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
FLEX_BACKENDS = ("deepep", "hybridep", "ncclep")
"""--moe-flex-dispatcher-backend's choices (core_v0.19.0 ``transformer_config.py``; core_v0.15.2's
flex dispatcher is DeepEP's, with --moe-enable-deepep)."""

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
            check_field(self.q_lora_rank, "mla.q_lora_rank", _WIDTH)
        for key in ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"):
            check_field(getattr(self, key), f"mla.{key}", _WIDTH)


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
        check_field(self.factor, "yarn.factor", limits.ROPE_SCALING, number=True)
        check_field(self.original_max_position_embeddings, "yarn.original_max_position_embeddings", limits.SEQ_LEN)
        for key in ("beta_fast", "beta_slow"):
            check_field(getattr(self, key), f"yarn.{key}", limits.YARN_MSCALE, number=True, low_open=True)
        # 0 is Megatron's default --mscale-all-dim: ``_yarn_get_mscale(scale, 0)`` is 1, no scaling
        for key in ("mscale", "mscale_all_dim"):
            check_field(getattr(self, key), f"yarn.{key}", limits.YARN_MSCALE, number=True)


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
    # qk_layernorm (LlamaSpec's, dense Qwen3 has it too): RMSNorm on each Q and K head (Qwen3;
    # --qk-layernorm). With MLA the same flag builds the q and kv latent norms (DeepSeek-V3's
    # q_a_layernorm, kv_a_layernorm): megatron-core ``gpt_layer_specs.py`` makes the up projections
    # layer-norm linears only with qk_layernorm.
    score_function: ScoreFunction = "softmax"
    router_pre_softmax: bool = False
    """--moe-router-pre-softmax: with the softmax score function, the softmax over all experts
    before the top-k, whose k probabilities are not renormalised (``moe_utils.py``,
    ``topk_routing_with_score_function``): Hugging Face's norm_topk_prob false; without it, the
    softmax over the k picked (norm_topk_prob true). Megatron needs it at top-1 (``flags``)."""
    expert_bias: bool = False
    """Aux-loss-free balancing with a per-expert bias (--moe-router-enable-expert-bias)."""
    aux_loss_coeff: float | tuple[float, ...] = 0.0
    """The auxiliary load-balancing loss's weight (--moe-aux-loss-coeff; Hugging Face's
    router_aux_loss_coef), one per ``load_balancing`` type where it has several (Megatron's
    nargs='+'). Megatron's default, 0, leaves the aux_loss router unbalanced (``router.py``: no
    loss at coefficient 0), so a row priced balanced must launch with it."""
    load_balancing: tuple[str, ...] | None = None
    """--moe-router-load-balancing-type, one type or several (``BALANCING``), as a command or a
    DeepSeek config.json gave it (seq_aux_loss beside the expert bias: ``_deepseek_balancing``);
    None: aux_loss, or none with the expert bias. Its time is not priced (a few FLOPs on E-wide
    tensors); its kept scores are (``memory.aux_loss_saved_bytes``), and it is carried so that what
    is launched is what was read."""
    router_num_groups: int | None = None
    router_group_topk: int | None = None
    router_topk_scaling_factor: float | None = None
    mla: MLA | None = None
    yarn: YarnScaling | None = None
    mtp_num_layers: int = 0
    """Multi-token-prediction layers (--mtp-num-layers): an option, 0 by default (DeepSeek-V3's
    671B is without its one MTP module)."""
    config_mtp_num_layers: int = 0
    """The MTP layers the model's config.json declares (DeepSeek-V3's num_nextn_predict_layers),
    read and not priced: ``mtp_num_layers`` is what is priced, so that a config prices as its
    preset does; the CLI says so in one line where --mtp-num-layers is not given
    (``advisor.cli.moe.config_mtp_line``). 0 for the presets and a command's specs, and then left
    out of ``to_dict`` (their files read as before)."""

    def _check_fields(self) -> None:
        """The dense fields, then every MoE field's type and range, so that a spec read back from
        JSON is priced or refused in one line (never a TypeError deep in the estimator)."""
        LlamaSpec._check_fields(self)
        experts = check_field(self.num_experts, "num_experts", _EXPERTS)
        check_field(self.moe_router_topk, "moe_router_topk",
                    limits.Bound(1, experts, f"top-k picks among the {experts} expert{'s' * (experts != 1)}"), top="num_experts")
        check_field(self.moe_ffn_hidden_size, "moe_ffn_hidden_size", _WIDTH)
        check_field(self.shared_expert_size, "shared_expert_size", limits.Bound(0, _WIDTH.high, _WIDTH.why))
        check_field(self.first_dense_layers, "first_dense_layers",
                    limits.Bound(0, self.num_layers - 1, "at least one layer must be a mixture of experts"))
        check_field(self.mtp_num_layers, "mtp_num_layers", limits.MTP_LAYERS)
        check_field(self.config_mtp_num_layers, "config_mtp_num_layers", limits.MTP_LAYERS)
        for key in ("expert_bias", "router_pre_softmax"):
            if not isinstance(getattr(self, key), bool):
                raise FieldError(key, "must be true or false, got {0}", _describe(getattr(self, key)))
        if self.score_function not in SCORE_FUNCTIONS:
            raise FieldError("score_function", "must be {0}, got {1}", " or ".join(SCORE_FUNCTIONS),
                             _describe(self.score_function))
        if self.expert_bias and self.score_function != "sigmoid":  # transformer_config.py, __post_init__
            raise FieldError("expert_bias", "(--moe-router-enable-expert-bias) needs the sigmoid score function "
                                            "(--moe-router-score-function sigmoid): megatron-core refuses it with "
                                            "softmax")
        self._check_balancing()
        if self.router_topk_scaling_factor is not None:
            check_field(self.router_topk_scaling_factor, "router_topk_scaling_factor", limits.MOE_TOPK_SCALING,
                        number=True, low_open=True)
        self._check_groups()
        for key, kind in (("mla", MLA), ("yarn", YarnScaling)):
            if getattr(self, key) is not None and not isinstance(getattr(self, key), kind):
                raise FieldError(key, "must be an object or null, got {0}", _describe(getattr(self, key)))

    def to_dict(self) -> dict:
        """LlamaSpec's, with qk_layernorm always there and where it stood when it was an MoE field
        (after first_dense_layers), so that MoE rows and files read as before; config_mtp_num_layers
        only where a config.json declared MTP layers."""
        fields = LlamaSpec.to_dict(self)
        fields.pop("qk_layernorm", None)
        if not fields["config_mtp_num_layers"]:
            del fields["config_mtp_num_layers"]
        keys = list(fields)
        at = keys.index("first_dense_layers") + 1
        return {**{key: fields[key] for key in keys[:at]}, "qk_layernorm": self.qk_layernorm,
                **{key: fields[key] for key in keys[at:]}}

    def _check_balancing(self) -> None:
        """The balancing types and their weights: one weight per type where there are several
        (megatron-core ``transformer_config.py``, __post_init__, both releases), one otherwise."""
        types, weights = self.load_balancing, self.aux_loss_coeff
        if types is not None and (not isinstance(types, tuple) or not types
                                  or not all(isinstance(kind, str) and kind in BALANCING for kind in types)):
            raise FieldError("load_balancing", "must be null or a list of {0}, got {1}", ", ".join(BALANCING),
                             _describe(types))
        several = types is not None and len(types) > 1
        if not several and isinstance(weights, tuple):  # a list, even of one, for one type: a number is written
            raise FieldError("aux_loss_coeff", "must be one number for one load-balancing type, got a list of {0}",
                             len(weights))
        if several != isinstance(weights, tuple) or several and len(weights) != len(types):
            given = len(weights) if isinstance(weights, tuple) else 1
            raise FieldError("aux_loss_coeff", "needs one weight per load-balancing type ({0}), got {1} "
                                               "(megatron-core refuses other counts)", len(types or ("",)), given)
        for weight in weights if isinstance(weights, tuple) else (weights,):
            check_field(weight, "aux_loss_coeff", limits.AUX_LOSS_COEFF, number=True)

    def _check_groups(self) -> None:
        """Group-limited routing (--moe-router-num-groups, --moe-router-group-topk) as megatron-core's
        ``group_limited_topk`` (moe/moe_utils.py) can run it: the groups split the experts evenly,
        and the chosen groups hold at least top-k experts."""
        groups, chosen = self.router_num_groups, self.router_group_topk
        if (groups is None) != (chosen is None):
            raise FieldError("router_num_groups", "and {router_group_topk} go together: group-limited routing "
                                                  "needs both")
        if groups is None:
            return
        check_field(groups, "router_num_groups", limits.Bound(1, self.num_experts, "each group holds at least one "
                                                                                   "expert"), top="num_experts")
        if self.num_experts % groups:
            raise FieldError("router_num_groups", "= {0} must divide {num_experts} = {1}", groups, self.num_experts)
        check_field(chosen, "router_group_topk", limits.Bound(1, groups, f"there are {groups} groups"),
                    top="router_num_groups")
        if chosen * (self.num_experts // groups) < self.moe_router_topk:
            raise FieldError("router_group_topk", "= {0}: the {0} chosen groups of {1} experts hold fewer than "
                                                  "{moe_router_topk} = {2}", chosen, self.num_experts // groups,
                             self.moe_router_topk)

    @property
    def tp_kv_heads(self) -> int:
        """The key-value heads TP splits: MLA's per-head keys and values (one per attention head),
        else the query groups."""
        return self.num_attention_heads if self.mla is not None else self.num_query_groups

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


# DeepSeek-V3's balancing: the expert bias and its config.json's "seq_aux": true, "aux_loss_alpha":
# 0.001 (``_deepseek_balancing``); its report trains the loss at 0.0001 (--moe-aux-loss-coeff 0.0001)
DEEPSEEK_V3 = MoESpec(
    name="deepseek-v3", num_layers=61, hidden_size=7168, ffn_hidden_size=18432, num_attention_heads=128,
    num_query_groups=128, vocab_size=129280, rotary_base=10000.0, norm_epsilon=1e-6,
    num_experts=256, moe_router_topk=8, moe_ffn_hidden_size=2048, shared_expert_size=2048,
    first_dense_layers=3, score_function="sigmoid", expert_bias=True, router_num_groups=8, router_group_topk=4,
    router_topk_scaling_factor=2.5, qk_layernorm=True, load_balancing=("seq_aux_loss",), aux_loss_coeff=0.001,
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

_EXPERT_KEYS = ("num_experts", "moe_router_topk", "moe_ffn_hidden_size")
"""The MoESpec fields every family's config.json gives, counts all."""
_MLA_KEYS = {"mla.q_lora_rank": "q_lora_rank", "mla.kv_lora_rank": "kv_lora_rank",
             "mla.qk_head_dim": "qk_nope_head_dim", "mla.qk_pos_emb_head_dim": "qk_rope_head_dim",
             "mla.v_head_dim": "v_head_dim"}
FAMILY_KEYS: dict[str, dict[str, str]] = {
    "mixtral": {"num_experts": "num_local_experts", "moe_router_topk": "num_experts_per_tok",
                "moe_ffn_hidden_size": "intermediate_size", "aux_loss_coeff": "router_aux_loss_coef"},
    "qwen3_moe": {"num_experts": "num_experts", "moe_router_topk": "num_experts_per_tok",
                  "moe_ffn_hidden_size": "moe_intermediate_size", "aux_loss_coeff": "router_aux_loss_coef"},
    "deepseek_v3": {
        "num_experts": "n_routed_experts", "moe_router_topk": "num_experts_per_tok",
        "moe_ffn_hidden_size": "moe_intermediate_size",
        "shared_expert_size": "n_shared_experts x moe_intermediate_size", "first_dense_layers": "first_k_dense_replace",
        "router_num_groups": "n_group", "router_group_topk": "topk_group",
        "router_topk_scaling_factor": "routed_scaling_factor", "config_mtp_num_layers": "num_nextn_predict_layers",
        "aux_loss_coeff": "aux_loss_alpha", "load_balancing": "seq_aux",
        **_MLA_KEYS,
        **{f"yarn.{name}": f"rope_scaling.{name}" for name in YarnScaling.__dataclass_fields__},
    },
}
"""Each family's MoESpec fields -> the config.json key each is read from (the family's reader
reads them by this table; the dense fields are ``HF_KEYS``'s): an error about a field names the
key (``_Config.naming``)."""
MOE_FIELD_FLAGS = {
    "num_experts": "--num-experts", "moe_router_topk": "--moe-router-topk",
    "moe_ffn_hidden_size": "--moe-ffn-hidden-size", "aux_loss_coeff": "--moe-aux-loss-coeff",
    "shared_expert_size": "--moe-shared-expert-intermediate-size",
    "first_dense_layers": "--moe-layer-freq", "router_num_groups": "--moe-router-num-groups",
    "router_group_topk": "--moe-router-group-topk", "router_topk_scaling_factor": "--moe-router-topk-scaling-factor",
    "router_pre_softmax": "--moe-router-pre-softmax", "config_mtp_num_layers": "--mtp-num-layers",
    "mla.q_lora_rank": "--q-lora-rank", "mla.kv_lora_rank": "--kv-lora-rank", "mla.qk_head_dim": "--qk-head-dim",
    "mla.qk_pos_emb_head_dim": "--qk-pos-emb-head-dim", "mla.v_head_dim": "--v-head-dim",
    "yarn.factor": "--rotary-scaling-factor", "yarn.mscale": "--mscale", "yarn.mscale_all_dim": "--mscale-all-dim",
}
"""Megatron-LM's flag of each MoE field a config.json names otherwise (``advisor.moe.flags`` writes them)."""
MODEL_TYPE_FAMILIES = {"kimi_k2": "deepseek_v3"}
"""model_types read as another family's: Kimi K2's config.json names model_type kimi_k2, but its
architecture is DeepSeek-V3's (its config.json has architectures DeepseekV3ForCausalLM and
auto_map configuration_deepseek.DeepseekV3Config, the DeepSeek-V3 keys throughout), and
Megatron-Bridge's KimiK2Bridge builds it as DeepSeek-V3's MLA + MoE GPTModel
(src/megatron/bridge/models/kimi/kimi_bridge.py: get_common_mapping_list of models/deepseek)."""
HF_MODEL_TYPES = (*FAMILY_KEYS, *MODEL_TYPE_FAMILIES)
EXPERT_COUNT_KEYS = tuple(keys["num_experts"] for keys in FAMILY_KEYS.values())
"""The keys by which a config.json says its MLPs are experts (Mixtral, Qwen-MoE, DeepSeek)."""


def _count(config: _Config, key: str, default=limits.ABSENT, low: int = 1) -> int:
    value = config.config.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise config.error(key, limits.must_be(f"an integer of at least {low}", value, _describe))
    if value > 2**22:
        raise config.error(key, f"is {_describe(value)}, more than this tool handles ({2**22})")
    return value


def _expect(config: _Config, key: str, wanted, why: str) -> None:
    """Refuse, naming the key, a value this tool does not price. A JSON true is not the number 1,
    nor 1 a true (Python's True == 1 would take one for the other)."""
    value = config.config.get(key, wanted)
    if value != wanted or isinstance(value, bool) != isinstance(wanted, bool):
        raise config.error(key, f"is {_describe(value)}: {why}")


def _yarn(config: _Config, keys: dict[str, str]) -> YarnScaling:
    scaling = config.config.get("rope_scaling")
    if not isinstance(scaling, dict) or scaling.get("type", scaling.get("rope_type")) != "yarn":
        kind = scaling.get("type", scaling.get("rope_type")) if isinstance(scaling, dict) else scaling
        raise config.error("rope_scaling", f"of type {_describe(kind)}: this tool reads DeepSeek-V3's yarn "
                                           "(Megatron's --rope-type yarn)")
    numbers = {}
    for field in ("factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
        key = keys[f"yarn.{field}"]
        value = scaling.get(key.removeprefix("rope_scaling."), limits.ABSENT)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise config.error(key, limits.must_be("a positive number", value, _describe))
        numbers[field] = float(value)
    original_key = keys["yarn.original_max_position_embeddings"]
    original = scaling.get(original_key.removeprefix("rope_scaling."), limits.ABSENT)
    if not isinstance(original, int) or isinstance(original, bool) or original < 1:
        raise config.error(original_key, limits.must_be("a positive integer", original, _describe))
    # Megatron-LM has no flags for these: MLATransformerConfig fixes them
    # (transformer/transformer_config.py: original_max_position_embeddings 4096, beta_fast 32, beta_slow 1).
    for field, fixed in (("original_max_position_embeddings", 4096), ("beta_fast", 32.0), ("beta_slow", 1.0)):
        value = original if field == "original_max_position_embeddings" else numbers[field]
        if value != fixed:
            raise config.error(keys[f"yarn.{field}"], f"is {_describe(value)}: Megatron-LM's MLA fixes it at {fixed:g}")
    return YarnScaling(original_max_position_embeddings=original, **numbers)


def _expert_fields(config: _Config, keys: dict[str, str]) -> dict:
    """The fields every family gives (``_EXPERT_KEYS``), read by the family's keys."""
    return {field: _count(config, keys[field]) for field in _EXPERT_KEYS}


def _mixtral_fields(config: _Config, keys: dict[str, str]) -> dict:
    _expect(config, "router_jitter_noise", 0.0, "this tool prices routers without input jitter")
    return dict(_expert_fields(config, keys), aux_loss_coeff=_aux_loss_coeff(config, keys["aux_loss_coeff"]))


def _aux_loss_coeff(config: _Config, key: str) -> float:
    """router_aux_loss_coef, or Transformers' default (0.001, MixtralConfig and Qwen3MoeConfig);
    DeepSeek's aux_loss_alpha, whose default in its configuration_deepseek.py is 0.001 too."""
    value = config.config.get(key, 0.001)
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not 0 <= value <= limits.AUX_LOSS_COEFF.high):
        raise config.error(key, f"must be a number from 0 to {limits.AUX_LOSS_COEFF.high:g}, got {_describe(value)}")
    return float(value)


def _qwen3_fields(config: _Config, keys: dict[str, str]) -> dict:
    _expect(config, "decoder_sparse_step", 1, "this tool prices MoE in every layer (Megatron's --moe-layer-freq 1)")
    dense = config.config.get("mlp_only_layers")  # Qwen3MoeConfig: None reads as []
    if dense not in (None, []):  # layers built with a dense Qwen3MoeMLP, not the sparse MoE block
        # as JSON writes them (["0"] is not [0]), at most eight
        shown = f"[{', '.join(map(limits.json_text, dense[:8]))}{', ...' if len(dense) > 8 else ''}]" \
            if isinstance(dense, list) else _describe(dense)
        raise config.error("mlp_only_layers", f"is {shown}, not empty: it puts dense MLP layers among the MoE layers, "
                                              "which this tool does not price (every layer is MoE here)")
    # qk_layernorm: dense_values reads it for qwen3_moe, as for dense qwen3
    return dict(_expert_fields(config, keys), router_pre_softmax=_pre_softmax(config),
                aux_loss_coeff=_aux_loss_coeff(config, keys["aux_loss_coeff"]))


def _pre_softmax(config: _Config) -> bool:
    """Qwen3-MoE's norm_topk_prob (Transformers' Qwen3MoeConfig default: false) as Megatron's
    --moe-router-pre-softmax. Hugging Face takes the softmax over all experts, then the top-k, then
    divides by their sum where norm_topk_prob; Megatron (core_v0.15.2 and core_v0.19.0
    ``topk_routing_with_score_function``) takes, with --moe-router-pre-softmax, the softmax over all
    and the top-k, not renormalised (norm_topk_prob false); without it, the softmax over the top-k
    logits, which is the renormalised softmax over all (norm_topk_prob true): the same experts
    (softmax keeps the order), the same weights."""
    value = config.config.get("norm_topk_prob", False)
    if not isinstance(value, bool):
        raise config.error("norm_topk_prob", limits.must_be("true or false", value, _describe))
    return not value


def _mla(config: _Config, keys: dict[str, str]) -> MLA:
    """MLA's sizes by ``_MLA_KEYS``; without q_lora_rank, Q is projected from h (DeepSeek-V2-Lite)."""
    values = {}
    for name in MLA.__dataclass_fields__:
        key = keys[f"mla.{name}"]
        direct = name == "q_lora_rank" and config.config.get(key) is None
        values[name] = None if direct else _count(config, key)
    return MLA(**values)


def _deepseek_balancing(config: _Config, keys: dict[str, str]) -> dict:
    """DeepSeek's balance loss beside its expert bias: aux_loss_alpha its weight, seq_aux where it
    is taken over each sequence (DeepSeek-V2's modeling_deepseek.py MoEGate, whose config keys V3
    keeps: seq_aux averages the loss of each sequence's tokens, else one loss over the batch's;
    Megatron's seq_aux_loss and aux_loss: megatron-core router.py ``_apply_seq_aux_loss``,
    ``_apply_aux_loss``). DeepSeek-V3 trains so: its report's 'complementary sequence-wise
    auxiliary loss' (arXiv:2412.19437 Sections 2.1.2 and 4.2), and Megatron-Bridge's DeepSeekV3Bridge
    builds seq_aux_loss with the expert bias and aux_loss_alpha's weight
    (src/megatron/bridge/models/deepseek/deepseek_v3_bridge.py:68-74 @ 067f987d). Absent keys take
    configuration_deepseek.py's defaults (0.001, true); a weight of 0 leaves the bias alone
    (type none, as Megatron would run it: no loss at weight 0)."""
    weight = _aux_loss_coeff(config, keys["aux_loss_coeff"])
    per_sequence = config.config.get(keys["load_balancing"], True)
    if not isinstance(per_sequence, bool):
        raise config.error(keys["load_balancing"], limits.must_be("true or false", per_sequence, _describe))
    if not weight:
        return {}
    return {"load_balancing": ("seq_aux_loss" if per_sequence else "aux_loss",), "aux_loss_coeff": weight}


def _deepseek_fields(config: _Config, keys: dict[str, str]) -> dict:
    _expect(config, "scoring_func", "sigmoid", "this tool reads DeepSeek-V3's sigmoid router")
    _expect(config, "topk_method", "noaux_tc", "this tool reads DeepSeek-V3's aux-loss-free routing (noaux_tc)")
    _expect(config, "norm_topk_prob", True, "Megatron's sigmoid router renormalises the top-k scores")
    _expect(config, "moe_layer_freq", 1, "this tool prices MoE in every layer after first_k_dense_replace")
    values = _expert_fields(config, keys)
    shared = _count(config, "n_shared_experts", 0, low=0)  # FAMILY_KEYS: x moe_intermediate_size
    scaling_key = keys["router_topk_scaling_factor"]
    scaling = config.config.get(scaling_key, 1.0)
    if not isinstance(scaling, (int, float)) or isinstance(scaling, bool) or scaling <= 0:
        raise config.error(scaling_key, f"must be a positive number, got {_describe(scaling)}")
    return dict(values, shared_expert_size=shared * values["moe_ffn_hidden_size"],
                first_dense_layers=_count(config, keys["first_dense_layers"], 0, low=0), score_function="sigmoid",
                expert_bias=True, router_num_groups=_count(config, keys["router_num_groups"]),
                router_group_topk=_count(config, keys["router_group_topk"]),
                router_topk_scaling_factor=float(scaling), qk_layernorm=True, mla=_mla(config, keys),
                **_deepseek_balancing(config, keys),
                yarn=_yarn(config, keys) if config.config.get("rope_scaling") is not None else None,
                # read, not priced (config_mtp_num_layers): Megatron-Bridge's DeepSeekV3Bridge sets
                # mtp_num_layers from it, Megatron-LM's own --mtp-num-layers defaults to none
                config_mtp_num_layers=_count(config, keys["config_mtp_num_layers"], 0, low=0))


def load_moe_config(config: _Config, model_type: str) -> MoESpec:
    """A MoE config.json (``advisor.models.load_hf_config`` hands it here by model_type): the dense
    fields as for Llama, the expert fields per family by its ``FAMILY_KEYS``; one line naming the
    key for the rest. A model_type of ``MODEL_TYPE_FAMILIES`` is read as its family."""
    model_type = MODEL_TYPE_FAMILIES.get(model_type, model_type)
    values = dense_values(config, model_type, rope_scaling=model_type != "deepseek_v3")
    family = {"mixtral": _mixtral_fields, "qwen3_moe": _qwen3_fields, "deepseek_v3": _deepseek_fields}[model_type]
    keys = FAMILY_KEYS[model_type]
    with config.naming({**HF_KEYS, **keys}, {**FIELD_FLAGS, **MOE_FIELD_FLAGS}):
        return MoESpec(name=str(config.path), **{**values, **family(config, keys)})  # DeepSeek's qk_layernorm
