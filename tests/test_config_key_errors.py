"""A config.json whose values a spec refuses: the error line names the file once and each value by
the file's own key (with Megatron's flag where the names differ), never by the spec's field name.
Preset errors keep the spec's field names, said once."""

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from advisor.cli import cli
from advisor.model_spec import FIELD_FLAGS, HF_KEYS
from advisor.moe.spec import FAMILY_KEYS, MOE_FIELD_FLAGS

DATA = Path(__file__).resolve().parent / "data" / "moe"
LLAMA = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
         "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256, "rope_theta": 500000.0}
YARN = {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096, "type": "yarn"}


def _config(base: str, changes: dict) -> dict:
    if base in ("llama", "mistral", "qwen2"):
        return {**LLAMA, "model_type": base, **changes}
    document = json.loads((DATA / f"{base}.json").read_text())
    return {key: value for key, value in {**document, **changes}.items() if key != "_source"}


def _error(*args) -> str:
    """The CLI's one error line (exit status 2, nothing else on stderr or stdout)."""
    result = CliRunner().invoke(cli, [str(arg) for arg in args], catch_exceptions=False)
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert result.stdout == ""
    return lines[0]


# (base config, changed keys, the file's key named, the spec's field that must not be, words of the line)
CASES = [
    ("qwen3-30b-a3b", {"num_experts_per_tok": 200}, "num_experts_per_tok", "moe_router_topk",
     "num_experts_per_tok (--moe-router-topk) must be at most num_experts = 128, got 200: top-k picks among the "
     "128 experts"),
    ("mixtral-8x7b", {"num_experts_per_tok": 9}, "num_experts_per_tok", "moe_router_topk",
     "num_experts_per_tok (--moe-router-topk) must be at most num_local_experts (--num-experts) = 8, got 9"),
    ("mixtral-8x7b", {"num_local_experts": 20000}, "num_local_experts", "num_experts",
     "num_local_experts (--num-experts) must be at most 16,384, got 20000"),
    ("deepseek-v3", {"n_routed_experts": 20000}, "n_routed_experts", "num_experts",
     "n_routed_experts (--num-experts) must be at most 16,384"),
    ("deepseek-v3", {"qk_rope_head_dim": 0}, "qk_rope_head_dim", "qk_pos_emb_head_dim",
     "qk_rope_head_dim must be an integer of at least 1, got 0"),
    ("deepseek-v3", {"rope_scaling": {**YARN, "factor": 0.5}}, "rope_scaling.factor", "yarn.factor",
     "rope_scaling.factor (--rotary-scaling-factor) must be at least 1, got 0.5"),
    ("deepseek-v3", {"rope_scaling": {**YARN, "mscale": 1e4}}, "rope_scaling.mscale", "yarn.mscale",
     "rope_scaling.mscale (--mscale) must be at most 1000, got 10000"),
    ("deepseek-v3", {"n_group": 7}, "n_group", "router_num_groups",
     "n_group (--moe-router-num-groups) = 7 must divide n_routed_experts (--num-experts) = 256"),
    ("deepseek-v3", {"topk_group": 9}, "topk_group", "router_group_topk",
     "topk_group (--moe-router-group-topk) must be at most n_group (--moe-router-num-groups) = 8, got 9"),
    ("deepseek-v3", {"topk_group": 1, "num_experts_per_tok": 40}, "topk_group", "moe_router_topk",
     "the 1 chosen groups of 32 experts hold fewer than num_experts_per_tok (--moe-router-topk) = 40"),
    ("deepseek-v3", {"first_k_dense_replace": 61}, "first_k_dense_replace", "first_dense_layers",
     "first_k_dense_replace (--moe-layer-freq) must be at most 60, got 61: at least one layer must be a mixture"),
    ("deepseek-v3", {"n_shared_experts": 4096}, "n_shared_experts", "shared_expert_size",
     "n_shared_experts x moe_intermediate_size (--moe-shared-expert-intermediate-size) must be at most 4,194,304"),
    ("deepseek-v3", {"routed_scaling_factor": 1e4}, "routed_scaling_factor", "router_topk_scaling_factor",
     "routed_scaling_factor (--moe-router-topk-scaling-factor) must be at most 1000"),
    ("llama", {"num_key_value_heads": 5}, "num_key_value_heads", "num_query_groups",
     "num_attention_heads = 32 must be a multiple of num_key_value_heads (--num-query-groups) = 5"),
    ("mistral", {"num_key_value_heads": 7}, "num_key_value_heads", "num_query_groups",
     "must be a multiple of num_key_value_heads (--num-query-groups) = 7"),
    ("qwen3-30b-a3b", {"num_key_value_heads": 3}, "num_key_value_heads", "num_query_groups",
     "must be a multiple of num_key_value_heads (--num-query-groups) = 3"),
    ("llama", {"hidden_size": 4097}, "head_dim", "kv_channels",
     "hidden_size = 4097 must be a multiple of num_attention_heads = 32, or give head_dim"),
    ("qwen2", {"rope_theta": 1e13}, "rope_theta", "rotary_base",
     "rope_theta (--rotary-base) must be a positive number up to 1e+12"),
    ("llama", {"rms_norm_eps": 2}, "rms_norm_eps", "norm_epsilon",
     "rms_norm_eps (--norm-epsilon) must be a number between 0 and 1, got 2"),
    ("llama", {"num_hidden_layers": 0}, "num_hidden_layers", "num_layers",
     "num_hidden_layers must be a positive integer, got 0"),
    ("llama", {"intermediate_size": -1}, "intermediate_size", "ffn_hidden_size",
     "intermediate_size must be a positive integer, got -1"),
    ("mixtral-8x7b", {"intermediate_size": 0}, "intermediate_size", "ffn_hidden_size",
     "intermediate_size must be a positive integer, got 0"),
]


@pytest.mark.parametrize("base, changes, key, field, words", CASES,
                         ids=[f"{base}-{'-'.join(changes)}" for base, changes, *_ in CASES])
def test_a_bad_config_json_is_named_by_its_own_keys(tmp_path, base, changes, key, field, words):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_config(base, changes)))
    line = _error("estimate", "--model", path, "--gpus", 8)
    assert line.startswith(f"Error: {path}: ")
    assert line.count(str(path)) == 1
    assert words in line
    assert re.search(rf"(?<![\w.-]){re.escape(key)}(?!\w)", line)
    assert not re.search(rf"(?<![\w.-]){re.escape(field)}(?!\w)", line), line


_DROP = object()
"""A key the test leaves out of the config.json (None writes JSON's null)."""


@pytest.mark.parametrize("base, key, value, words", [
    ("deepseek-v3", "n_routed_experts", _DROP, "n_routed_experts is missing (it must be an integer of at least 1)"),
    ("deepseek-v3", "n_routed_experts", None, "n_routed_experts must be an integer of at least 1, got null"),
    ("mixtral-8x7b", "num_local_experts", _DROP, "num_local_experts is missing (it must be an integer of at least 1)"),
    ("deepseek-v3", "rope_scaling.factor", _DROP, "rope_scaling.factor is missing (it must be a positive number)"),
    ("deepseek-v3", "rope_scaling.factor", None, "rope_scaling.factor must be a positive number, got null"),
    ("llama", "rope_theta", None, "rope_theta must be a positive number, got null"),
], ids=["dsv3 no experts", "dsv3 null experts", "mixtral no experts", "yarn no factor", "yarn null factor",
        "null rope_theta"])
def test_a_config_key_left_out_is_missing_and_a_null_is_null(tmp_path, base, key, value, words):
    """JSON's words: a key the file leaves out is said missing, a null is said null (both were 'got
    null', and Python's None elsewhere)."""
    document = _config(base, {})
    inner, _, name = key.rpartition(".")
    target = document[inner] if inner else document
    if value is _DROP:
        del target[name]
    else:
        target[name] = value
    path = tmp_path / "config.json"
    path.write_text(json.dumps(document))
    line = _error("estimate", "--model", path, "--gpus", 8)
    assert line == f"Error: {path}: {words}"


@pytest.mark.parametrize("args, words", [
    (["--model", "llama3.1-8b", "--num-query-groups", 5],
     "model 'llama3.1-8b[num_query_groups=5]': num_attention_heads = 32 must be a multiple of num_query_groups = 5"),
    (["--model", "deepseek-v3", "--num-layers", 3, "--ep", 8],
     "model 'deepseek-v3[num_layers=3]': first_dense_layers must be at most 2, got 3: at least one layer"),
])
def test_a_bad_preset_keeps_the_spec_names_once(args, words):
    line = _error("estimate", *args, "--gpus", 64)
    assert words in line
    assert line.count("model '") == 1


def test_every_named_field_is_read_by_its_family():
    """The naming tables are the readers' own: each family names its expert count, its top-k and
    its expert width; every flag said after a key is one Megatron-LM has (as written here)."""
    from advisor.megatron_args import model_args
    from advisor.models import MOE_PRESETS, PRESETS
    from advisor.moe.flags import MODEL_FLAGS

    presets = [*PRESETS.values(), *MOE_PRESETS.values()]
    written = set(MODEL_FLAGS) | {flag for spec in presets for flag in model_args(spec, 4096)}
    assert set(FIELD_FLAGS.values()) | set(MOE_FIELD_FLAGS.values()) <= written
    for keys in FAMILY_KEYS.values():
        assert {"num_experts", "moe_router_topk", "moe_ffn_hidden_size"} <= set(keys)
    assert set(FIELD_FLAGS) <= set(HF_KEYS)


def test_a_field_error_pickles_as_it_was_made():
    """A worker process's FieldError reaches the parent whole: its words, values and model."""
    import pickle

    from advisor.model_spec import FieldError

    error = FieldError("moe_router_topk", "must be at most {num_experts} = {0}", "8, got 20", model="m")
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == str(error) == "model 'm': moe_router_topk must be at most num_experts = 8, got 20"
    assert copy.worded(str.upper) == "MOE_ROUTER_TOPK must be at most NUM_EXPERTS = 8, got 20"
