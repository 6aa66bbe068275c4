"""The Llama-family model spec (``LlamaSpec``) and the reading of a Hugging Face ``config.json``'s
decoder fields, which dense (``advisor.models``) and MoE (``advisor.moe.spec``) models share.

The symbols follow seed 004, Table 1: L layers, hidden size h, FFN hidden size h_ffn,
a attention heads, k key-value heads (query groups), vocabulary v. Field names follow
Megatron-LM's argument names, so that a spec maps one-to-one onto its flags.
"""

from __future__ import annotations

import contextlib
import functools
import math
import string
from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass
from pathlib import Path

from advisor import limits
from advisor.errors import AdvisorError


# Bounds on a model's sizes and RoPE numbers live in advisor/limits.py, each with its reason. Each
# is far above any released model (Llama-3.1-405B: 126 layers, h 16384, h_ffn 53248, 128 heads,
# v 128256) and keeps every product the estimator forms a finite float.
MODEL_LIMITS = {key: int(bound.high) for key, bound in limits.MODEL.items()}
ROTARY_BASE_LIMIT = limits.ROTARY_BASE.high
ROPE_SCALING_LIMIT = limits.ROPE_SCALING.high
_NAME_CHARS = 4096  # PATH_MAX: a spec read from a config.json is named by its path


def _describe(value) -> str:
    """A config.json value for a one-line message: 'missing' for a key the document leaves out
    (``limits.ABSENT``), an object or a list by its kind, else ``limits.json_text``."""
    if value is limits.ABSENT:
        return "missing"
    if isinstance(value, (dict, list)):
        return {dict: "an object", list: "a list"}[type(value)]
    return limits.json_text(value)


def _positive_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


class FieldError(AdvisorError):
    """A spec field's bad value. The words name any other field they mention as ``{field}``, and
    take their values positionally (``{0}``), so that a config.json reader can name each field by
    the key it read it from (``_Config.naming``); ``str()`` names them as the spec does, after the
    model's name when ``model`` is given."""

    def __init__(self, field: str, words: str, *values: object, model: str | None = None) -> None:
        self.field, self.words, self.values, self.model = field, words, values, model
        text = self.worded()
        super().__init__(text if model is None else f"model {model!r}: {text}")

    def worded(self, name: Callable[[str], str] = str) -> str:
        """The message without the model's name, each field named by ``name(field)``."""
        return f"{name(self.field)} {_Naming(name).vformat(self.words, self.values, {})}"

    def about(self, model: str) -> FieldError:
        """The same error, said of the model ``model``."""
        return FieldError(self.field, self.words, *self.values, model=model)

    def __reduce__(self):  # pickled (a worker process's error) as it was made, not from its message
        return functools.partial(FieldError, model=self.model), (self.field, self.words, *self.values)


class _Naming(string.Formatter):
    """``str.format`` whose named fields are spec fields (dotted ones too: ``mla.kv_lora_rank``),
    each replaced by ``name(field)``."""

    def __init__(self, name: Callable[[str], str]) -> None:
        self.name = name

    def get_field(self, field_name: str, args, kwargs):
        return (args[int(field_name)] if field_name.isdecimal() else self.name(field_name)), field_name


def check_field(value: object, field: str, bound: limits.Bound, *, top: str | None = None, number: bool = False,
                low_open: bool = False) -> int | float:
    """``limits.check_int`` (``check_float`` with ``number``) of a spec field, refused as a
    ``FieldError``; ``top``: the field whose value the bound's top is (named in the message)."""
    try:
        if number:
            return limits.check_float(value, "", bound, low_open=low_open)
        return limits.check_int(value, "", bound)
    except AdvisorError as error:
        words = str(error)
    at_most = "must be at most "
    if top is not None and words.startswith(at_most):
        raise FieldError(field, at_most + "{" + top + "} = {0}", words.removeprefix(at_most))
    raise FieldError(field, "{0}", words)


def from_fields(kind: type, values: object, what: str):
    """``kind(**values)`` for a spec dataclass read from JSON; a value that is not an object, or a
    missing or unknown field, in one line (dataclasses raise TypeError)."""
    if not isinstance(values, dict):
        raise AdvisorError(f"{what} must be an object, got {_describe(values)}")
    known = kind.__dataclass_fields__
    if unknown := sorted((str(key) for key in values if key not in known)):
        raise AdvisorError(f"{what} has an unknown field, {_describe(unknown[0])}")
    if missing := sorted(name for name, field in known.items() if name not in values
                         and field.default is MISSING and field.default_factory is MISSING):
        raise AdvisorError(f"{what} lacks the field {missing[0]!r}")
    return kind(**values)


@dataclass(frozen=True, kw_only=True, slots=True)
class LlamaSpec:
    """The architecture of one Llama-family decoder (RMSNorm, SwiGLU, GQA, RoPE, no MLP biases).

    Every field that Megatron-LM has a flag for is here, so that the launched network is the one
    the user named (``advisor.megatron_args.model_args`` writes them)."""

    name: str
    """Preset name, or where the spec came from."""
    num_layers: int
    """L: transformer layers."""
    hidden_size: int
    """h."""
    ffn_hidden_size: int
    """h_ffn: the SwiGLU intermediate size."""
    num_attention_heads: int
    """a."""
    num_query_groups: int
    """k: key-value heads (k = a without grouped-query attention)."""
    vocab_size: int
    """v, before any padding."""
    tie_embeddings: bool = False
    """Whether the LM head shares the input embedding's weight (Llama 3.2 1B/3B do)."""
    kv_channels: int | None = None
    """d, the size of one attention head (Megatron's --kv-channels, Hugging Face's head_dim);
    None: h/a. Mistral-NeMo has a x d = 4096 with h = 5120."""
    add_qkv_bias: bool = False
    """Biases on the Q, K and V projections only (Megatron's --add-qkv-bias; Qwen2)."""
    qk_layernorm: bool = False
    """RMSNorm on each Q and K head before RoPE (Qwen3, dense and MoE; Megatron's --qk-layernorm,
    megatron-core ``transformer/attention.py``, ``SelfAttention.get_query_key_value_tensors``).
    With MLA (``advisor.moe``) the same flag builds the q and kv latent norms instead."""
    rotary_base: float = 10000.0
    """RoPE's theta (--rotary-base; Hugging Face's rope_theta). 10000 is both defaults."""
    rope_scaling_factor: float | None = None
    """Llama 3.1's RoPE frequency scaling, with this factor (--use-rope-scaling
    --rope-scaling-factor; Megatron implements Llama 3's low 1 / high 4 / 8192 variant only)."""
    norm_epsilon: float = 1e-5
    """The RMSNorm epsilon (--norm-epsilon; Hugging Face's rms_norm_eps)."""
    max_position_embeddings: int | None = None
    """--max-position-embeddings where a user's command gives one above its --seq-length (a RoPE
    model's context, 40960 for Qwen3); None: the sequence length. With RoPE it builds no tensor and
    changes neither memory nor time (gpt_model.py keeps it for export; rotary_pos_embedding.py
    sizes RoPE by the sequence), but Megatron saves it in the checkpoint and compares it when one is
    loaded (checkpointing.py, ``check_checkpoint_args``), so a launch writes the user's value."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or len(self.name) > _NAME_CHARS:
            raise AdvisorError(f"model name must be a string of at most {_NAME_CHARS} characters, got "
                               f"{_describe(self.name)}")
        try:
            self._check_fields()
        except FieldError as error:
            raise error.about(self.name) from None

    def _check_fields(self) -> None:
        """Every field's type and range, and what Megatron needs of them together; a FieldError."""
        for key, limit in MODEL_LIMITS.items():
            value = getattr(self, key)
            if value is None and key == "kv_channels":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise FieldError(key, "must be a positive integer, got {0}", _describe(value))
            if value > limit:
                raise FieldError(key, "is {0}, more than this tool handles ({1})", _describe(value), limit)
        for key in ("tie_embeddings", "add_qkv_bias", "qk_layernorm"):
            if not isinstance(getattr(self, key), bool):
                raise FieldError(key, "must be true or false, got {0}", _describe(getattr(self, key)))
        if not _positive_number(self.rotary_base) or self.rotary_base > ROTARY_BASE_LIMIT:
            raise FieldError("rotary_base", "must be a positive number up to {0:g}, got {1}", ROTARY_BASE_LIMIT,
                             _describe(self.rotary_base))
        if self.rope_scaling_factor is not None and not (
                _positive_number(self.rope_scaling_factor) and 1 <= self.rope_scaling_factor <= ROPE_SCALING_LIMIT):
            raise FieldError("rope_scaling_factor", "must be a number from 1 to {0:g}, got {1}", ROPE_SCALING_LIMIT,
                             _describe(self.rope_scaling_factor))
        context = self.max_position_embeddings
        if context is not None and (not isinstance(context, int) or isinstance(context, bool)
                                    or not 1 <= context <= limits.SEQ_LEN.high):
            raise FieldError("max_position_embeddings", "must be a positive integer up to {0}, or null, got {1}",
                             int(limits.SEQ_LEN.high), _describe(context))
        if not _positive_number(self.norm_epsilon) or self.norm_epsilon >= 1:
            raise FieldError("norm_epsilon", "must be a number between 0 and 1, got {0}",
                             _describe(self.norm_epsilon))
        if self.num_attention_heads % self.num_query_groups:
            raise FieldError("num_attention_heads", "= {0} must be a multiple of {num_query_groups} = {1}",
                             self.num_attention_heads, self.num_query_groups)
        if self.kv_channels is None and self.hidden_size % self.num_attention_heads:
            raise FieldError("hidden_size", "= {0} must be a multiple of {num_attention_heads} = {1}, or give "
                             "{kv_channels}", self.hidden_size, self.num_attention_heads)

    @property
    def head_dim(self) -> int:
        """d: kv_channels, else h/a (Megatron's default for --kv-channels)."""
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def query_size(self) -> int:
        """a x d: the width of Q and of the attention output (h unless head_dim is explicit)."""
        return self.num_attention_heads * self.head_dim

    def to_dict(self) -> dict:
        fields = asdict(self)
        if fields["max_position_embeddings"] is None:  # the sequence length: files written before the field say so
            del fields["max_position_embeddings"]
        if not fields["qk_layernorm"]:  # files written before the field (every Llama's) say so by leaving it out
            del fields["qk_layernorm"]
        return fields


# Hugging Face config.json -> LlamaSpec. The model types whose decoder is Llama's (pre-RMSNorm,
# SwiGLU, RoPE, GQA); their configuration classes (LlamaConfig, MistralConfig, Qwen2Config,
# Qwen3Config) share these keys and defaults: no GQA without num_key_value_heads, untied
# embeddings, rope_theta 10000, rms_norm_eps 1e-6, hidden_act silu, head_dim h/a (Qwen3's 128:
# ``_HEAD_DIM_DEFAULTS``).
HF_KEYS = {
    "num_layers": "num_hidden_layers",
    "hidden_size": "hidden_size",
    "ffn_hidden_size": "intermediate_size",
    "num_attention_heads": "num_attention_heads",
    "vocab_size": "vocab_size",
    "num_query_groups": "num_key_value_heads",
    "kv_channels": "head_dim",
    "tie_embeddings": "tie_word_embeddings",
    "rotary_base": "rope_theta",
    "rope_scaling_factor": "rope_scaling.factor",
    "norm_epsilon": "rms_norm_eps",
}
"""Each LlamaSpec field read from a config.json -> the key it is read from (``dense_values``), for
every model type; an error about the field names the key (``_Config.naming``)."""
FIELD_FLAGS = {
    "num_layers": "--num-layers",
    "ffn_hidden_size": "--ffn-hidden-size",
    "num_query_groups": "--num-query-groups",
    "rotary_base": "--rotary-base",
    "rope_scaling_factor": "--rope-scaling-factor",
    "norm_epsilon": "--norm-epsilon",
}
"""Megatron-LM's flag of each field whose config.json key is named otherwise, said after the key.
Not kv_channels: "or give head_dim (--kv-channels)" pointed at a flag no advisor command has;
head_dim, in the config.json, is what its reader can give."""
_HF_REQUIRED = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "vocab_size")
_HF_FIELDS = {key: field for field, key in HF_KEYS.items()}
_HF_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
_QK_NORM_TYPES = ("qwen3", "qwen3_moe")
"""The model types with an RMSNorm on each Q and K head (Transformers' Qwen3Attention and
Qwen3MoeAttention: q_norm, k_norm over head_dim, before RoPE): Megatron's --qk-layernorm."""
_HEAD_DIM_DEFAULTS = {"qwen3": 128}
"""head_dim where a config.json leaves it out and its configuration class does not default it to
h/a: Transformers' Qwen3Config has head_dim 128 (configuration_qwen3.py). Not qwen3_moe:
Qwen3MoeConfig has no head_dim field and Qwen3MoeAttention takes ``getattr(config, "head_dim",
hidden_size // num_attention_heads)`` (modeling_qwen3_moe.py), so h/a, as read here."""
_HF_DEFAULTS = {"tie_word_embeddings": False, "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "hidden_act": "silu"}
# The only RoPE scaling Megatron-LM implements (--use-rope-scaling): Llama 3's, with these
# constants fixed (megatron/core/models/common/embeddings/rotary_pos_embedding.py, _apply_scaling).
_LLAMA3_ROPE_SCALING = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


class _Config:
    """One config.json, with messages that name the file and the key."""

    def __init__(self, path: Path, config: dict) -> None:
        self.path, self.config = path, config
        self.scaling_key = "rope_scaling"
        """The key the RoPE scaling was read from, as errors name it."""
        if config.get("rope_parameters") is not None:
            self.config = self._with_rope_parameters(config)

    def _with_rope_parameters(self, config: dict) -> dict:
        """The document with Transformers 5's ``rope_parameters`` (rope_theta, rope_type and the
        scaling's keys in one object, where older files have rope_theta and rope_scaling) read as
        the older keys, so that a new file's RoPE base is not taken for the default 10000 (every
        launched --rotary-base would be wrong). Per-layer-type objects ({'full_attention': {...}})
        and a top-level key that disagrees are refused by name."""
        params = config["rope_parameters"]
        if not isinstance(params, dict) or any(isinstance(value, dict) for value in params.values()):
            raise self.error("rope_parameters", limits.must_be("one object of RoPE settings (not one per layer type)",
                                                               params, _describe))
        out = dict(config)
        for key in ("rope_theta", "partial_rotary_factor"):  # the same names at the top level
            if key in params:
                if config.get(key) is not None and config[key] != params[key]:
                    raise self.error(f"rope_parameters.{key}", f"is {_describe(params[key])} and {key} "
                                                               f"{_describe(config[key])}: give one")
                out[key] = params[key]
        if params.get("rope_type", "default") != "default":  # the scaling: llama3 read, any other refused
            if config.get("rope_scaling") is not None and config["rope_scaling"] != params:
                raise self.error("rope_parameters", "and rope_scaling both give a RoPE scaling: give one")
            out["rope_scaling"], self.scaling_key = params, "rope_parameters"
        return out

    def error(self, key: str, why: str) -> AdvisorError:
        return AdvisorError(f"{self.path}: {key} {why}")

    @contextlib.contextmanager
    def naming(self, keys: dict[str, str] = HF_KEYS, flags: dict[str, str] = FIELD_FLAGS):
        """A ``FieldError`` of the specs built inside, as one line that names each field by the key
        it was read from (``keys``: field -> key) and its Megatron flag (``flags``) where that helps."""
        try:
            yield
        except FieldError as error:
            raise AdvisorError(f"{self.path}: {error.worded(functools.partial(_key_name, keys, flags))}") from None

    def get(self, key: str):
        return self.config.get(key, _HF_DEFAULTS.get(key))

    def present(self, key: str):
        """The key's value, its default, or ``limits.ABSENT`` (said 'missing', not null)."""
        return self.config.get(key, _HF_DEFAULTS.get(key, limits.ABSENT))

    def integer(self, key: str) -> int:
        value = self.present(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise self.error(key, limits.must_be("a positive integer", value, _describe))
        limit = MODEL_LIMITS[_HF_FIELDS[key]]
        if value > limit:
            raise self.error(key, f"is {_describe(value)}, more than this tool handles ({limit})")
        return value

    def number(self, key: str) -> float:
        value = self.present(key)
        if not _positive_number(value):
            raise self.error(key, limits.must_be("a positive number", value, _describe))
        return float(value)

    def flag(self, key: str) -> bool:
        value = self.get(key)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise self.error(key, f"must be true or false, got {_describe(value)}")
        return value

    def rope_scaling(self) -> float | None:
        """Llama 3's RoPE scaling factor, or None; any other scaling is refused by name."""
        scaling, name = self.config.get("rope_scaling"), self.scaling_key
        if scaling is None:
            return None
        if not isinstance(scaling, dict):
            raise self.error(name, f"must be an object or null, got {_describe(scaling)}")
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind != "llama3":
            raise self.error(name, f"of type {kind!r}: Megatron-LM implements only Llama 3's "
                                   "(rope_type 'llama3', --use-rope-scaling)")
        for key, fixed in _LLAMA3_ROPE_SCALING.items():
            if (value := scaling.get(key, limits.ABSENT)) != fixed:
                raise self.error(f"{name}.{key}", f"is {_describe(value)}: Megatron-LM's "
                                                  f"--use-rope-scaling fixes it at {fixed:g}")
        factor = scaling.get("factor", limits.ABSENT)
        if not _positive_number(factor) or not 1 <= factor <= ROPE_SCALING_LIMIT:
            raise self.error(f"{name}.factor", limits.must_be(f"a number from 1 to {ROPE_SCALING_LIMIT:g}",
                                                              factor, _describe))
        return float(factor)

    def refuse(self, model_type: str) -> None:
        """What the Llama decoder Megatron builds here cannot be: one line naming the key."""
        if self.get("hidden_act") != "silu":
            raise self.error("hidden_act", f"is {_describe(self.get('hidden_act'))}: this tool models SwiGLU "
                                           "(silu), Megatron's --swiglu")
        if model_type != "qwen2" and self.flag("attention_bias"):
            raise self.error("attention_bias", "true puts biases on Q, K, V and the output projection; Megatron-LM "
                                               "has --add-qkv-bias (Q, K, V only) or --add-bias-linear (every linear "
                                               "layer), neither is this model")
        if self.flag("mlp_bias"):
            raise self.error("mlp_bias", "true: this tool models bias-free SwiGLU layers (--disable-bias-linear)")
        if model_type in ("mistral", "mixtral") and self.config.get("sliding_window") is not None:
            raise self.error("sliding_window", f"is {_describe(self.config['sliding_window'])}: this tool and "
                                               "pretrain_gpt.py's Llama layers attend over the whole sequence; "
                                               "set it to null if that is the model you train")
        if model_type in ("qwen2", "qwen3", "qwen3_moe") and self.flag("use_sliding_window"):
            raise self.error("use_sliding_window", "true: this tool and pretrain_gpt.py's Llama layers attend "
                                                   "over the whole sequence")
        if model_type == "qwen3":
            self._refuse_sliding_layers()
        partial = self.config.get("partial_rotary_factor", 1.0)
        if partial != 1.0:
            raise self.error("partial_rotary_factor", f"is {_describe(partial)}: this tool models RoPE on whole heads")

    def _refuse_sliding_layers(self) -> None:
        """Qwen3Config's layer_types (each layer's 'full_attention' or 'sliding_attention'; Transformers
        derives it from use_sliding_window where it is absent): only full attention is priced."""
        kinds = self.config.get("layer_types")
        if kinds is None:
            return
        if not isinstance(kinds, list):
            raise self.error("layer_types", limits.must_be("a list or null", kinds, _describe))
        if other := [kind for kind in kinds if kind != "full_attention"]:
            raise self.error("layer_types", f"has {_describe(other[0])}: this tool and pretrain_gpt.py's Llama layers "
                                            "attend over the whole sequence ('full_attention' in every layer)")


def _key_name(keys: dict[str, str], flags: dict[str, str], field: str) -> str:
    """A spec field as a config.json names it: its key, then the Megatron flag unless the key
    already reads as the flag (kv_lora_rank, --kv-lora-rank)."""
    key = keys.get(field, field)
    flag = flags.get(field)
    return f"{key} ({flag})" if flag and flag != "--" + key.replace("_", "-") else key


def dense_values(config: _Config, model_type: str, rope_scaling: bool = True) -> dict:
    """The LlamaSpec fields of a config.json's decoder (every model type shares them)."""
    document = config.config
    missing = [HF_KEYS[field] for field in _HF_REQUIRED if HF_KEYS[field] not in document]
    if missing:
        raise AdvisorError(f"{config.path}: missing required key(s): {', '.join(missing)}")
    values = {field: config.integer(HF_KEYS[field]) for field in _HF_REQUIRED}
    heads = values["num_attention_heads"]
    groups = HF_KEYS["num_query_groups"]
    values["num_query_groups"] = heads if document.get(groups) is None else config.integer(groups)
    head_dim = _HEAD_DIM_DEFAULTS.get(model_type)
    if document.get(HF_KEYS["kv_channels"]) is not None:
        head_dim = config.integer(HF_KEYS["kv_channels"])
    if head_dim is not None and head_dim * heads != values["hidden_size"]:  # else it is Megatron's default, h/a
        values["kv_channels"] = head_dim
    config.refuse(model_type)
    values["tie_embeddings"] = config.flag(HF_KEYS["tie_embeddings"])
    values["add_qkv_bias"] = model_type == "qwen2"  # Qwen2Attention: biases on q, k, v; none on o
    values["qk_layernorm"] = model_type in _QK_NORM_TYPES
    values["rotary_base"] = config.number(HF_KEYS["rotary_base"])
    values["rope_scaling_factor"] = config.rope_scaling() if rope_scaling else None
    values["norm_epsilon"] = config.number(HF_KEYS["norm_epsilon"])
    return values
