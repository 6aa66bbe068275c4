import json
from dataclasses import replace
from pathlib import Path

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
    # Llama 3 405B (the Llama 3 paper's pre-training setup) was released only as Llama-3.1-405B,
    # whose architecture it shares: the published count is that checkpoint's.
    "llama3-405b": 405_853_388_800,
    "llama3.2-1b": 1_235_814_400,
    "llama3.2-3b": 3_212_749_824,
    "qwen3-8b": 8_190_735_360,  # Qwen/Qwen3-8B, its QK norms' 2 x 128 a layer included
}


@pytest.mark.parametrize("name,count", PUBLISHED_PARAMETERS.items())
def test_presets_match_published_parameter_counts(name, count):
    assert model_parameters(PRESETS[name]) == count


def test_preset_names_are_forgiving():
    assert preset("meta-llama/Meta-Llama-3.1-8B") is PRESETS["llama3.1-8b"]
    assert preset("Llama-3.2-1B") is PRESETS["llama3.2-1b"]


@pytest.mark.parametrize("repo,name", [
    # the repositories the presets were read from (advisor/models.py, advisor/moe/spec.py)
    ("meta-llama/Llama-2-7b-hf", "llama2-7b"), ("meta-llama/Llama-2-13b-hf", "llama2-13b"),
    ("meta-llama/Llama-2-70b-hf", "llama2-70b"), ("meta-llama/Meta-Llama-3-8B", "llama3-8b"),
    ("meta-llama/Llama-3.1-405B", "llama3.1-405b"), ("mistralai/Mixtral-8x7B-v0.1", "mixtral-8x7b"),
    ("mistralai/Mixtral-8x22B-v0.1", "mixtral-8x22b"), ("Qwen/Qwen3-30B-A3B", "qwen3-30b-a3b"),
    ("deepseek-ai/DeepSeek-V3", "deepseek-v3"),
])
def test_the_presets_hugging_face_ids_name_them(repo, name):
    assert preset(repo).name == name


def test_other_hugging_face_ids_are_read_from_their_config():
    """Another checkpoint of a preset's family (an -Instruct, a later release) is not mapped onto
    the preset by its name, whose config.json may differ: the line says how to read that instead."""
    with pytest.raises(AdvisorError, match=r"did you mean mixtral-8x22b.*huggingface-cli download "
                                           r"mistralai/Mixtral-8x22B-Instruct-v0\.1 config\.json --local-dir DIR"):
        preset("mistralai/Mixtral-8x22B-Instruct-v0.1")


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
        ({"model_type": "gpt2"}, r"'gpt2' is not a family this tool prices \(dense: llama, "),
        ({"hidden_size": -4096}, "hidden_size must be a positive integer"),
        ({"num_key_value_heads": 5}, r"multiple of num_key_value_heads \(--num-query-groups\) = 5"),
        ({"tie_word_embeddings": "yes"}, "tie_word_embeddings must be true or false"),
        # issue 17's model files: one line naming the key, never a traceback or a silent MHA
        ({"hidden_size": 10**400}, r"config.json: line 1: hidden_size = 1000000.*\.\.\. does not fit in 64 bits"),
        ({"head_dim": {}}, "head_dim must be a positive integer, got an object"),
        ({"model_type": ["llama"]}, "model_type must be a string, got a list"),
        ({"num_key_value_heads": 0}, "num_key_value_heads must be a positive integer, got 0"),
        ({"num_key_value_heads": True}, "num_key_value_heads must be a positive integer, got true"),
        ({"rope_theta": "500000"}, "rope_theta must be a positive number, got '500000'"),
        ({"rms_norm_eps": 0}, "rms_norm_eps must be a positive number, got 0"),
        ({"attention_bias": True}, "attention_bias true puts biases on Q, K, V and the output projection"),
        ({"mlp_bias": True}, "mlp_bias true"),
        ({"hidden_act": "gelu"}, "hidden_act is 'gelu'"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling of type 'yarn'"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 2.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 8192}}, "rope_scaling.low_freq_factor is 2.0"),
        ({"rope_scaling": [8.0]}, "rope_scaling must be an object or null, got a list"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor is 0.5"),
        ({"model_type": "mistral", "sliding_window": 4096}, "sliding_window is 4096"),
        ({"model_type": "qwen2", "use_sliding_window": True}, "use_sliding_window true"),
        ({"intermediate_size": 1 << 23}, "intermediate_size is 8388608, more than this tool handles"),
        # Transformers 5's rope_parameters: one object, agreeing with any older key beside it
        ({"rope_parameters": {"full_attention": {"rope_theta": 1e6}}},
         r"rope_parameters must be one object of RoPE settings \(not one per layer type\)"),
        ({"rope_parameters": {"rope_theta": 10000.0}}, "rope_parameters.rope_theta is 10000.0 and rope_theta 500000.0"),
        ({"rope_theta": None, "rope_scaling": None, "rope_parameters": {"rope_type": "yarn", "factor": 4.0}},
         "rope_parameters of type 'yarn'"),
        ({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}}, "partial_rotary_factor is 0.5"),
    ],
)
def test_hf_config_errors(tmp_path, change, message):
    config = {**LLAMA_31_8B_CONFIG, **change}
    config = {k: v for k, v in config.items() if v is not None}
    with pytest.raises(AdvisorError, match=message):
        load_hf_config(write_config(tmp_path, **config))


def test_transformers_5s_rope_parameters_give_the_rope_base_and_scaling(tmp_path, advisor):
    """Files written by Transformers 5 keep rope_theta and the scaling in one rope_parameters object:
    read as the older keys, not taken for LlamaConfig's default base 10000 (which every launched
    --rotary-base would then carry)."""
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}  # Llama 3.1's
    old = {k: v for k, v in LLAMA_31_8B_CONFIG.items() if k != "rope_theta"}
    spec = load_hf_config(write_config(tmp_path, **old, rope_parameters={**scaling, "rope_theta": 500000.0}))
    assert (spec.rotary_base, spec.rope_scaling_factor) == (500000.0, 8.0)
    before = load_hf_config(write_config(tmp_path, **LLAMA_31_8B_CONFIG, rope_scaling=scaling))
    assert replace(spec, name="") == replace(before, name="")
    plain = load_hf_config(write_config(tmp_path, **{**old, "rope_parameters": {"rope_type": "default",
                                                                                   "rope_theta": 1e6}}))
    assert (plain.rotary_base, plain.rope_scaling_factor) == (1e6, None)
    per_layer = write_config(tmp_path, **old, rope_parameters={"sliding_attention": {"rope_theta": 1e4}})
    assert "rope_parameters must be one object of RoPE settings" in advisor.error(
        "estimate", "--model", per_layer, "--gpus", 8, "--mem", 80)  # one line, exit 2


def test_a_number_too_long_for_python_is_one_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"hidden_size": ' + "9" * 5000 + "}")
    with pytest.raises(AdvisorError, match="config.json: line 1: hidden_size = 9999.* does not fit in 64 bits"):
        load_hf_config(path)


FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"
# Exact parameter counts published with each checkpoint (tests/fixtures/hf_configs/README.md).
PUBLISHED_HF = {
    "llama3.1-8b.json": 8_030_261_248,
    "llama3.2-1b.json": 1_235_814_400,
    "qwen2-7b.json": 7_615_616_512,
    "qwen2-0.5b.json": 494_032_768,
    "mistral-nemo-12b.json": 12_247_782_400,
    "qwen3-8b.json": 8_190_735_360,
    "qwen3-4b.json": 4_022_468_096,
}


@pytest.mark.parametrize("name,count", PUBLISHED_HF.items())
def test_released_configs_price_their_published_parameter_counts(name, count):
    assert model_parameters(load_hf_config(FIXTURES / name)) == count


def test_released_configs_carry_every_architectural_field():
    nemo = load_hf_config(FIXTURES / "mistral-nemo-12b.json")
    assert (nemo.kv_channels, nemo.head_dim, nemo.query_size, nemo.hidden_size) == (128, 128, 4096, 5120)
    assert (nemo.rotary_base, nemo.norm_epsilon, nemo.rope_scaling_factor, nemo.add_qkv_bias) == (1e6, 1e-5, None, False)
    qwen = load_hf_config(FIXTURES / "qwen2-7b.json")
    assert qwen.add_qkv_bias and qwen.kv_channels is None and qwen.head_dim == 128 and qwen.norm_epsilon == 1e-6
    small = load_hf_config(FIXTURES / "llama3.2-1b.json")
    assert small.kv_channels is None  # head_dim 64 = 2048 / 32: Megatron's default, no flag needed
    assert (small.tie_embeddings, small.rope_scaling_factor, small.rotary_base) == (True, 32.0, 500000.0)


@pytest.mark.parametrize("name", ["llama3.1-8b", "llama3.2-1b"])
def test_presets_equal_their_released_configs(name):
    """The presets' fields, every one, are the released config.json's (not only the sizes)."""
    from dataclasses import replace

    assert replace(load_hf_config(FIXTURES / f"{name}.json"), name=name) == PRESETS[name]


def test_explicit_head_dim_prices_attention_by_it():
    """Eq. 1 generalised: W_Q, W_O h x ad and W_K, W_V h x kd; QKV biases (a + 2k)d; both over t."""
    from advisor.equations import attention_activation_bytes, attention_parameters
    from advisor.models import LlamaSpec

    spec = LlamaSpec(name="x", num_layers=1, hidden_size=10, ffn_hidden_size=8, num_attention_heads=4,
                     num_query_groups=2, vocab_size=16, kv_channels=3, add_qkv_bias=True)
    by_hand = 10 * 12 + 10 * 6 + 10 * 6 + 12 * 10 + (12 + 6 + 6)  # Q, K, V, O, biases
    assert attention_parameters(spec) == by_hand and attention_parameters(spec, tp=2) == by_hand / 2
    # X (2sbh), Q and attention output (2sb ad each), K and V (2sb kd each), s = b = 1
    assert attention_activation_bytes(spec, 1, 1) == 2 * 10 + 4 * 12 + 4 * 6


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
