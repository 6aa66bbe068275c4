"""Llama-family model specs: presets, Hugging Face ``config.json`` files, overrides.

The symbols follow seed 004, Table 1: L layers, hidden size h, FFN hidden size h_ffn,
a attention heads, k key-value heads (query groups), vocabulary v. Field names follow
Megatron-LM's argument names, so that a spec maps one-to-one onto its flags.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path

from advisor.errors import AdvisorError
from advisor.model_spec import _HF_MODEL_TYPES, LlamaSpec, _Config, _describe, dense_values, from_fields
from advisor.moe import spec as moe
from advisor.moe.spec import PRESETS as MOE_PRESETS


def _preset(name: str, L: int, h: int, ffn: int, a: int, k: int, v: int, *, rope_theta: float,
            rope_scaling: float | None = None, tied: bool = False, qk_layernorm: bool = False,
            norm_epsilon: float = 1e-5) -> LlamaSpec:
    return LlamaSpec(
        name=name, num_layers=L, hidden_size=h, ffn_hidden_size=ffn,
        num_attention_heads=a, num_query_groups=k, vocab_size=v, tie_embeddings=tied,
        rotary_base=rope_theta, rope_scaling_factor=rope_scaling, norm_epsilon=norm_epsilon,
        qk_layernorm=qk_layernorm,
    )


# Values from each model's Hugging Face config.json (meta-llama/<Model>: Llama-2-7b-hf,
# Llama-2-13b-hf, Llama-2-70b-hf, Meta-Llama-3-8B, Meta-Llama-3-70B, Llama-3.1-8B, -70B, -405B,
# Llama-3.2-1B, -3B): num_hidden_layers, hidden_size, intermediate_size, num_attention_heads,
# num_key_value_heads, vocab_size, tie_word_embeddings, rope_theta (absent in Llama 2's, which
# means LlamaConfig's 10000), rope_scaling (Llama 3.1: llama3 with factor 8; Llama 3.2: factor 32;
# both low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 8192) and
# rms_norm_eps (1e-05 in every one). head_dim is h/a in all of them. Llama 3's 405B was
# described in the Llama 3 paper (Dubey et al. 2024, Table 3: RoPE base 500,000) and released
# only as Llama 3.1; the llama3-405b preset is that paper's pre-training setup, without the 3.1
# release's long-context RoPE scaling. qwen3-8b: Qwen/Qwen3-8B's config.json (model_type qwen3: an
# RMSNorm on each Q and K head, --qk-layernorm; head_dim 128 = h/a; rms_norm_eps 1e-06; untied),
# the file tests/fixtures/hf_configs/qwen3-8b.json holds (tests/test_qwen3.py reads both).
PRESETS: dict[str, LlamaSpec] = {
    spec.name: spec
    for spec in (
        _preset("llama2-7b", 32, 4096, 11008, 32, 32, 32000, rope_theta=10000.0),
        _preset("llama2-13b", 40, 5120, 13824, 40, 40, 32000, rope_theta=10000.0),
        _preset("llama2-70b", 80, 8192, 28672, 64, 8, 32000, rope_theta=10000.0),
        _preset("llama3-8b", 32, 4096, 14336, 32, 8, 128256, rope_theta=500000.0),
        _preset("llama3-70b", 80, 8192, 28672, 64, 8, 128256, rope_theta=500000.0),
        _preset("llama3-405b", 126, 16384, 53248, 128, 8, 128256, rope_theta=500000.0),
        _preset("llama3.1-8b", 32, 4096, 14336, 32, 8, 128256, rope_theta=500000.0, rope_scaling=8.0),
        _preset("llama3.1-70b", 80, 8192, 28672, 64, 8, 128256, rope_theta=500000.0, rope_scaling=8.0),
        _preset("llama3.1-405b", 126, 16384, 53248, 128, 8, 128256, rope_theta=500000.0, rope_scaling=8.0),
        _preset("llama3.2-1b", 16, 2048, 8192, 32, 8, 128256, rope_theta=500000.0, rope_scaling=32.0, tied=True),
        _preset("llama3.2-3b", 28, 3072, 8192, 24, 8, 128256, rope_theta=500000.0, rope_scaling=32.0, tied=True),
        _preset("qwen3-8b", 36, 4096, 12288, 32, 8, 151936, rope_theta=1000000.0, qk_layernorm=True,
                norm_epsilon=1e-6),
    )
}

DEFAULT_MODEL = "llama3.1-8b"
"""The model a command prices without --model."""


HF_REPO_ALIASES = {
    "llama2-7b-hf": "llama2-7b", "llama2-13b-hf": "llama2-13b", "llama2-70b-hf": "llama2-70b",
    "mixtral-8x7b-v0.1": "mixtral-8x7b", "mixtral-8x22b-v0.1": "mixtral-8x22b",
}
"""The Hugging Face repositories the presets' values come from (above, and advisor/moe/spec.py)
whose names are not the preset's (meta-llama/Llama-2-7b-hf, mistralai/Mixtral-8x7B-v0.1), as
``_normalise`` leaves them. Only these: another checkpoint of a family (an -Instruct, a newer
tokenizer) may differ in its config.json, so it is read from there, not guessed."""


def _normalise(name: str) -> str:
    """'meta-llama/Meta-Llama-3.1-8B' -> 'llama3.1-8b'."""
    name = name.strip().lower().rsplit("/", 1)[-1]
    name = name.removeprefix("meta-")
    name = re.sub(r"^llama-(\d)", r"llama\1", name)
    return HF_REPO_ALIASES.get(name, name)


def preset(name: str) -> LlamaSpec:
    key = _normalise(name)
    if key in PRESETS:
        return PRESETS[key]
    if key in MOE_PRESETS:
        return MOE_PRESETS[key]
    from advisor.errors import close_names

    close = close_names(key, [*PRESETS, *MOE_PRESETS])
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    if "/" in name:  # a Hugging Face model id: its config.json prices it exactly
        raise AdvisorError(f"unknown model {name!r}{hint} (a Hugging Face model: huggingface-cli download {name.strip()} "
                           f"config.json --local-dir DIR, then --model DIR; 'advisor models' lists the presets)")
    raise AdvisorError(f"unknown model {name!r}{hint} (run 'advisor models' for the presets, or pass a config.json)")


def load_hf_config(path: str | Path) -> LlamaSpec:
    """Read a Hugging Face ``config.json`` of a Llama-family decoder (llama, mistral, qwen2, qwen3;
    the mixtures of experts through ``moe.load_moe_config``): every field Megatron-LM has a flag
    for, and one line naming the key for anything else."""
    from advisor.fileio import read_json

    path = Path(path)
    document = read_json(path, what="model config.json")
    if not isinstance(document, dict):
        raise AdvisorError(f"{path}: expected a JSON object, got {_describe(document)}")
    config = _Config(path, document)
    if "model_type" not in document:  # Hugging Face writes it; without it, Llama would be a guess
        raise config.error("model_type", f"is missing: give the model's family ({_families()}), as Hugging "
                                         "Face's config.json has it")
    model_type = document["model_type"]
    if not isinstance(model_type, str):
        raise config.error("model_type", f"must be a string, got {_describe(model_type)}")
    if model_type in moe.HF_MODEL_TYPES:
        return moe.load_moe_config(config, model_type)
    if model_type not in _HF_MODEL_TYPES:
        raise config.error("model_type", f"{model_type!r} is not a family this tool prices ({_families()})")
    for key in moe.EXPERT_COUNT_KEYS:  # a dense model type with experts would be priced as dense
        if document.get(key) not in (None, 0, 1):
            raise config.error(key, f"is {_describe(document[key])}: a mixture of experts under model_type "
                                    f"{model_type!r}; this tool prices experts for {', '.join(moe.HF_MODEL_TYPES)}")
    values = dense_values(config, model_type)
    with config.naming():
        return LlamaSpec(name=str(path), **values)


def _families() -> str:
    """The model types a config.json may have, as both the missing and the unknown model_type's
    lines name them (the missing one named the dense four alone, as if experts were refused)."""
    return f"dense: {', '.join(_HF_MODEL_TYPES)}; mixtures of experts: {', '.join(moe.HF_MODEL_TYPES)}"


HF_CONFIG_NAME = "config.json"
"""The file a Hugging Face snapshot directory keeps its config in (``huggingface-cli download
meta-llama/Llama-3.1-8B --include config.json --local-dir DIR`` writes DIR/config.json)."""


def config_file(path: str) -> str:
    """The file a model's path names: the path itself, or the ``config.json`` in it when it is a
    directory (a Hugging Face snapshot), whether or not that file exists."""
    return os.path.join(path, HF_CONFIG_NAME) if os.path.isdir(path) else path


def load_model(name_or_path: str) -> LlamaSpec:
    """A preset name, the path of a Hugging Face ``config.json``, or a directory holding one."""
    # Anything that exists is read as a file: a FIFO is refused by the reader, by name.
    if name_or_path.endswith(".json") or os.path.lexists(name_or_path):
        path = config_file(name_or_path)
        if path != name_or_path and not os.path.lexists(path):
            raise AdvisorError(f"{name_or_path} is a directory without a {HF_CONFIG_NAME}: give a preset, a Hugging "
                               f"Face {HF_CONFIG_NAME}, or the directory it was downloaded into")
        return load_hf_config(path)
    try:
        return preset(name_or_path)
    except AdvisorError:
        if not _is_local_path(name_or_path):
            raise
    raise AdvisorError(f"{name_or_path}: no such file or directory (--model takes a preset, a Hugging Face "
                       f"{HF_CONFIG_NAME}, or the directory holding one)")


def _is_local_path(name: str) -> bool:
    """Whether a --model that names nothing on disk was meant as a path, not a preset or a Hugging
    Face id ('org/name', one slash): './llama', '/models/llama', '~/llama', 'llama/', 'a/b/c'. Such
    a name was told to 'huggingface-cli download ./llama', which downloads nothing."""
    name = name.strip()
    return name.startswith(("/", ".", "~")) or name.endswith("/") or name.count("/") > 1


def spec_from_dict(fields: object) -> LlamaSpec:
    """A spec from its ``to_dict()`` (the 'model' of a sweep row, an estimate, a plan): an MoE spec
    when it has experts; AdvisorError in one line naming the field otherwise."""
    if isinstance(fields, dict) and "num_experts" in fields:
        return moe.spec_from_dict(fields)
    return from_fields(LlamaSpec, fields, "model")


def with_overrides(spec: LlamaSpec, **overrides: int | bool | None) -> LlamaSpec:
    """The spec with the given fields replaced; ``None`` values are ignored."""
    changed = {key: value for key, value in overrides.items() if value is not None and getattr(spec, key) != value}
    if not changed:
        return spec
    suffix = ",".join(f"{key}={value}" for key, value in changed.items())
    return replace(spec, name=f"{spec.name}[{suffix}]", **changed)
