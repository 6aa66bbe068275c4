"""Llama-family model specs: presets, Hugging Face ``config.json`` files, overrides.

The symbols follow seed 004, Table 1: L layers, hidden size h, FFN hidden size h_ffn,
a attention heads, k key-value heads (query groups), vocabulary v. Field names follow
Megatron-LM's argument names, so that a spec maps one-to-one onto its flags.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from advisor.errors import AdvisorError


@dataclass(frozen=True, kw_only=True, slots=True)
class LlamaSpec:
    """The architecture of one Llama-family decoder (RMSNorm, SwiGLU, GQA, RoPE, no biases)."""

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

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "int" and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise AdvisorError(f"model {self.name!r}: {f.name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_query_groups:
            raise AdvisorError(
                f"model {self.name!r}: num_attention_heads ({self.num_attention_heads}) must be a "
                f"multiple of num_query_groups ({self.num_query_groups})"
            )
        if self.hidden_size % self.num_attention_heads:
            raise AdvisorError(
                f"model {self.name!r}: hidden_size ({self.hidden_size}) must be a multiple of "
                f"num_attention_heads ({self.num_attention_heads})"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def to_dict(self) -> dict:
        return asdict(self)


def _preset(name: str, L: int, h: int, ffn: int, a: int, k: int, v: int, tied: bool = False) -> LlamaSpec:
    return LlamaSpec(
        name=name, num_layers=L, hidden_size=h, ffn_hidden_size=ffn,
        num_attention_heads=a, num_query_groups=k, vocab_size=v, tie_embeddings=tied,
    )


# Values from each model's Hugging Face config.json (meta-llama/<Model>). Llama 3's 405B was
# described in the Llama 3 paper (Dubey et al. 2024, Table 3) and released as Llama 3.1.
PRESETS: dict[str, LlamaSpec] = {
    spec.name: spec
    for spec in (
        _preset("llama2-7b", 32, 4096, 11008, 32, 32, 32000),
        _preset("llama2-13b", 40, 5120, 13824, 40, 40, 32000),
        _preset("llama2-70b", 80, 8192, 28672, 64, 8, 32000),
        _preset("llama3-8b", 32, 4096, 14336, 32, 8, 128256),
        _preset("llama3-70b", 80, 8192, 28672, 64, 8, 128256),
        _preset("llama3-405b", 126, 16384, 53248, 128, 8, 128256),
        _preset("llama3.1-8b", 32, 4096, 14336, 32, 8, 128256),
        _preset("llama3.1-70b", 80, 8192, 28672, 64, 8, 128256),
        _preset("llama3.1-405b", 126, 16384, 53248, 128, 8, 128256),
        _preset("llama3.2-1b", 16, 2048, 8192, 32, 8, 128256, tied=True),
        _preset("llama3.2-3b", 28, 3072, 8192, 24, 8, 128256, tied=True),
    )
}

DEFAULT_MODEL = "llama3.1-8b"

# Hugging Face LlamaConfig key -> LlamaSpec field.
_HF_KEYS = {
    "num_hidden_layers": "num_layers",
    "hidden_size": "hidden_size",
    "intermediate_size": "ffn_hidden_size",
    "num_attention_heads": "num_attention_heads",
    "vocab_size": "vocab_size",
}
_HF_MODEL_TYPES = {"llama", "mistral"}


def _normalise(name: str) -> str:
    """'meta-llama/Meta-Llama-3.1-8B' -> 'llama3.1-8b'."""
    name = name.strip().lower().rsplit("/", 1)[-1]
    name = name.removeprefix("meta-")
    return re.sub(r"^llama-(\d)", r"llama\1", name)


def preset(name: str) -> LlamaSpec:
    key = _normalise(name)
    if key in PRESETS:
        return PRESETS[key]
    close = difflib.get_close_matches(key, PRESETS, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise AdvisorError(f"unknown model {name!r}{hint} (run 'advisor models' for the presets, or pass a config.json)")


def load_hf_config(path: str | Path) -> LlamaSpec:
    """Read a Hugging Face Llama ``config.json``."""
    from advisor.fileio import read_json

    path = Path(path)
    config = read_json(path)
    if not isinstance(config, dict):
        raise AdvisorError(f"{path}: expected a JSON object, got {type(config).__name__}")
    model_type = config.get("model_type")
    if model_type is not None and model_type not in _HF_MODEL_TYPES:
        raise AdvisorError(
            f"{path}: model_type {model_type!r} is not a Llama-family model (expected one of "
            f"{', '.join(sorted(_HF_MODEL_TYPES))})"
        )
    missing = [key for key in _HF_KEYS if key not in config]
    if missing:
        raise AdvisorError(f"{path}: missing required key(s): {', '.join(missing)}")
    values = {field: config[key] for key, field in _HF_KEYS.items()}
    # Hugging Face's LlamaConfig defaults: no GQA, untied embeddings.
    values["num_query_groups"] = config.get("num_key_value_heads") or config["num_attention_heads"]
    values["tie_embeddings"] = config.get("tie_word_embeddings", False)
    if not isinstance(values["tie_embeddings"], bool):
        raise AdvisorError(f"{path}: tie_word_embeddings must be true or false")
    head_dim = config.get("head_dim")
    if head_dim is not None and isinstance(values["hidden_size"], int) and isinstance(values["num_attention_heads"], int):
        if head_dim * values["num_attention_heads"] != values["hidden_size"]:
            raise AdvisorError(
                f"{path}: head_dim x num_attention_heads ({head_dim} x {values['num_attention_heads']}) "
                f"!= hidden_size ({values['hidden_size']}); seed 004's equations assume they are equal"
            )
    return LlamaSpec(name=str(path), **values)


def load_model(name_or_path: str) -> LlamaSpec:
    """A preset name, or the path of a Hugging Face ``config.json``."""
    if name_or_path.endswith(".json") or Path(name_or_path).is_file():
        return load_hf_config(name_or_path)
    return preset(name_or_path)


def with_overrides(spec: LlamaSpec, **overrides: int | bool | None) -> LlamaSpec:
    """The spec with the given fields replaced; ``None`` values are ignored."""
    changed = {key: value for key, value in overrides.items() if value is not None and getattr(spec, key) != value}
    if not changed:
        return spec
    suffix = ",".join(f"{key}={value}" for key, value in changed.items())
    return replace(spec, name=f"{spec.name}[{suffix}]", **changed)
