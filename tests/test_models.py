import json

import pytest

from advisor.equations import model_parameters
from advisor.errors import AdvisorError
from advisor.models import PRESETS, load_hf_config, load_model, preset, with_overrides

# Exact parameter counts published with each checkpoint (Hugging Face safetensors metadata):
# an independent check of Eq. 3 and of the presets' hyper-parameters.
PUBLISHED_PARAMETERS = {
    "llama2-7b": 6_738_415_616,
    "llama2-13b": 13_015_864_320,
    "llama2-70b": 68_976_648_192,
    "llama3-8b": 8_030_261_248,
    "llama3.1-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
    "llama3.1-70b": 70_553_706_496,
    "llama3.1-405b": 405_853_388_800,
    "llama3.2-1b": 1_235_814_400,
    "llama3.2-3b": 3_212_749_824,
}


@pytest.mark.parametrize("name,count", PUBLISHED_PARAMETERS.items())
def test_presets_match_published_parameter_counts(name, count):
    assert model_parameters(PRESETS[name]) == count


def test_preset_names_are_forgiving():
    assert preset("meta-llama/Meta-Llama-3.1-8B") is PRESETS["llama3.1-8b"]
    assert preset("Llama-3.2-1B") is PRESETS["llama3.2-1b"]


def test_unknown_preset_suggests_close_names():
    with pytest.raises(AdvisorError, match="did you mean.*llama3.1-8b"):
        preset("llama3.1-8c")


def write_config(tmp_path, **config):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


LLAMA_31_8B_CONFIG = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "rope_theta": 500000.0,
}


def test_hf_config_reads_the_llama_keys(tmp_path):
    spec = load_model(str(write_config(tmp_path, **LLAMA_31_8B_CONFIG)))
    reference = PRESETS["llama3.1-8b"]
    for field in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                  "num_query_groups", "vocab_size", "tie_embeddings"):
        assert getattr(spec, field) == getattr(reference, field), field


def test_hf_config_defaults_follow_llamaconfig(tmp_path):
    config = {k: v for k, v in LLAMA_31_8B_CONFIG.items() if k not in ("num_key_value_heads", "tie_word_embeddings")}
    spec = load_hf_config(write_config(tmp_path, **config))
    assert spec.num_query_groups == 32  # no GQA
    assert spec.tie_embeddings is False


@pytest.mark.parametrize(
    "change,message",
    [
        ({"num_hidden_layers": None}, "missing required key.*num_hidden_layers"),
        ({"model_type": "gpt2"}, "not a Llama-family model"),
        ({"hidden_size": -4096}, "hidden_size must be a positive integer"),
        ({"num_key_value_heads": 5}, "multiple of num_query_groups"),
        ({"head_dim": 64}, "head_dim x num_attention_heads"),
        ({"tie_word_embeddings": "yes"}, "tie_word_embeddings must be true or false"),
    ],
)
def test_hf_config_errors(tmp_path, change, message):
    config = {**LLAMA_31_8B_CONFIG, **change}
    config = {k: v for k, v in config.items() if v is not None}
    with pytest.raises(AdvisorError, match=message):
        load_hf_config(write_config(tmp_path, **config))


def test_malformed_json_names_the_position(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"hidden_size": 4096,')
    with pytest.raises(AdvisorError, match="malformed JSON at line 1"):
        load_hf_config(path)


def test_overrides_rename_the_spec_and_validate():
    spec = with_overrides(PRESETS["llama3.1-8b"], num_layers=16, hidden_size=None)
    assert spec.num_layers == 16 and spec.hidden_size == 4096
    assert spec.name == "llama3.1-8b[num_layers=16]"
    assert with_overrides(spec) is spec
    with pytest.raises(AdvisorError, match="multiple of num_query_groups"):
        with_overrides(spec, num_query_groups=7)
