"""config.json files of released mixtures of experts that are not presets (tests/data/moe/
kimi-k2-instruct.json and qwen3-coder-480b-a35b.json; each file's _source says where its values
come from): read by the families' readers, counted by hand from the file, compared with the
published counts, swept, and a swept row's flags through the real core_v0.15.2 parser; and the MoE
families this tool does not read refused in one line.

Convention (advisor.moe.params): every weight counts, the input embedding and the untied LM head
included; no multi-token-prediction module (DeepSeek-type: priced only with --mtp-num-layers);
DeepSeek-type expert-bias buffers are not parameters (megatron-core router.py registers them as
buffers)."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from advisor.models import load_model
from advisor.moe.params import active_parameters, total_parameters

DATA = Path(__file__).parent / "data" / "moe"
KIMI = DATA / "kimi-k2-instruct.json"
QWEN3_CODER = DATA / "qwen3-coder-480b-a35b.json"


def _copy(tmp_path, path: Path, name: str = "config.json", **changes) -> str:
    """The committed config.json (without _source) with top-level changes; rope_scaling changes
    merge into its object."""
    config = {key: value for key, value in json.loads(path.read_text()).items() if key != "_source"}
    for key, value in changes.items():
        config[key] = {**config[key], **value} if key == "rope_scaling" else value
    out = tmp_path / name
    out.write_text(json.dumps(config))
    return str(out)


def _kimi_with_megatrons_yarn(tmp_path, **changes) -> str:
    """Kimi K2's config.json with the YaRN beta_fast Megatron-LM's MLA fixes (32, where Kimi K2 has
    1): the one change that lets Megatron-LM build it (test_kimi_k2_as_published_is_refused_...)."""
    return _copy(tmp_path, KIMI, rope_scaling={"beta_fast": 32.0}, **changes)


# --- Kimi K2, by hand from its config.json -----------------------------------------------------
# h 7168, 64 heads, q_lora_rank 1536, kv_lora_rank 512, qk_nope 128, qk_rope 64, v 128; 61 layers,
# first_k_dense_replace 1 (a SwiGLU of 18432), 60 MoE layers of 384 experts of 2048, 1 shared, top-8;
# vocab 163840, embeddings untied.
KIMI_MLA = (7168 * 1536 + 1536 + 1536 * 64 * (128 + 64)    # q down, q latent norm, q up
            + 7168 * (512 + 64) + 512 + 512 * 64 * (128 + 128)  # kv down (+ the rope key), kv latent norm, kv up
            + 64 * 128 * 7168)                              # output projection: 101,124,096
KIMI_DENSE_LAYER = KIMI_MLA + 2 * 7168 + 3 * 7168 * 18432
KIMI_EXPERT = 3 * 7168 * 2048
KIMI_MOE_LAYER_DENSE_PART = KIMI_MLA + 2 * 7168 + 384 * 7168 + KIMI_EXPERT  # + router + the shared expert
KIMI_ENDS = 2 * 163840 * 7168 + 7168                                        # embedding, LM head, final norm
KIMI_TOTAL = KIMI_ENDS + KIMI_DENSE_LAYER + 60 * (KIMI_MOE_LAYER_DENSE_PART + 384 * KIMI_EXPERT)
KIMI_ACTIVE = KIMI_ENDS + KIMI_DENSE_LAYER + 60 * (KIMI_MOE_LAYER_DENSE_PART + 8 * KIMI_EXPERT)

# The published checkpoint's safetensors hold 1,026,470,731,056 elements (the report the fixture's
# _source names, tensor by tensor). Beyond the weights above they hold FP32 scales of its FP8
# 128x128 blocks ([ceil(rows/128), ceil(cols/128)] per linear layer, not the router nor the
# embeddings) and buffers:
KIMI_FP8_SCALES = (61 * (5 * 56 + 128 * 4 + 56 * 64 + 12 * 56 + 96 * 12)  # kv_a 576x7168, kv_b, o, q_a, q_b
                   + 3 * 144 * 56                                       # the dense layer's gate, up, down
                   + 60 * (384 + 1) * 3 * 16 * 56)                      # each routed and shared expert's three
KIMI_BUFFERS = 60 * 384 + 61 * 56  # e_score_correction_bias (the expert bias), rotary_emb.inv_freq
KIMI_SAFETENSORS = 1_026_470_731_056

# Qwen3-Coder-480B-A35B, by hand: h 6144, 96 heads and 8 KV heads of 128, per-head Q/K RMSNorms
# (128 each), 62 layers of 160 experts of 2560, top-8, vocab 151936 untied.
QWEN3_CODER_LAYER_DENSE_PART = (6144 * (96 * 128 + 2 * 8 * 128) + 96 * 128 * 6144  # q, k, v; o
                                + 2 * 128 + 2 * 6144 + 160 * 6144)                 # q/k norms, 2 norms, router
QWEN3_CODER_EXPERT = 3 * 6144 * 2560
QWEN3_CODER_ENDS = 2 * 151936 * 6144 + 6144
QWEN3_CODER_TOTAL = QWEN3_CODER_ENDS + 62 * (QWEN3_CODER_LAYER_DENSE_PART + 160 * QWEN3_CODER_EXPERT)
QWEN3_CODER_ACTIVE = QWEN3_CODER_ENDS + 62 * (QWEN3_CODER_LAYER_DENSE_PART + 8 * QWEN3_CODER_EXPERT)


def test_kimi_k2_reads_as_deepseek_v3_with_its_own_routing(tmp_path):
    """model_type kimi_k2 (architectures DeepseekV3ForCausalLM): one dense layer, group-limited
    routing of one group (n_group 1, topk_group 1), routed_scaling_factor 2.827, YaRN factor 32,
    no MTP module; the same spec as the file relabelled deepseek_v3."""
    spec = load_model(_kimi_with_megatrons_yarn(tmp_path))
    assert (spec.num_layers, spec.first_dense_layers, spec.num_experts, spec.moe_router_topk) == (61, 1, 384, 8)
    assert (spec.moe_ffn_hidden_size, spec.shared_expert_size, spec.ffn_hidden_size) == (2048, 2048, 18432)
    assert (spec.router_num_groups, spec.router_group_topk, spec.router_topk_scaling_factor) == (1, 1, 2.827)
    assert (spec.score_function, spec.expert_bias, spec.num_attention_heads, spec.vocab_size) == (
        "sigmoid", True, 64, 163840)
    assert (spec.rotary_base, spec.yarn.factor, spec.config_mtp_num_layers, spec.mtp_num_layers) == (50000.0, 32.0, 0, 0)
    relabelled = load_model(_kimi_with_megatrons_yarn(tmp_path, name="deepseek.json", model_type="deepseek_v3"))
    assert replace(relabelled, name=spec.name) == spec


def test_kimi_k2_as_published_is_refused_by_its_yarn_beta_fast(advisor):
    """Kimi K2's rope_scaling has beta_fast 1 (DeepSeek-V3's: 32); Megatron-LM has no flag for it
    in either release (core_v0.15.2 and core_v0.19.0 transformer_config.py: MLATransformerConfig
    fixes beta_fast = 32; core_v0.19.0's --yarn-beta-fast is GPTModel's non-MLA YaRN), so a launch
    would train another RoPE: refused in one line naming the key."""
    line = advisor.error("estimate", "--model", KIMI, "--gpus", 1024, "--gpu", "h100-80gb", "--ep", 64, "--pp", 16)
    assert "rope_scaling.beta_fast is 1.0: Megatron-LM's MLA fixes it at 32" in line


def test_kimi_k2_counts_by_hand_and_against_its_checkpoint(tmp_path):
    spec = load_model(_kimi_with_megatrons_yarn(tmp_path))
    assert KIMI_MLA == 101_124_096
    assert total_parameters(spec) == KIMI_TOTAL == 1_026_408_209_408
    assert active_parameters(spec) == KIMI_ACTIVE == 32_861_477_888
    # the published checkpoint: the weights counted here, its FP8 scales and its two buffers, exactly
    assert KIMI_TOTAL + KIMI_FP8_SCALES + KIMI_BUFFERS == KIMI_SAFETENSORS
    # the technical report (arXiv 2507.20534): 32.6B activated; the model card's "1T" and "32B" are rounded
    assert KIMI_ACTIVE / 1e9 == pytest.approx(32.6, rel=0.02)
    assert round(KIMI_TOTAL / 1e12) == 1


def test_qwen3_coder_480b_reads_and_counts(tmp_path):
    """62 layers of 160 experts, top-8, no shared expert (shared_expert_intermediate_size 0, a key
    Qwen3MoeConfig does not read), per-head QK norms; published 480B total, 35B activated."""
    spec = load_model(str(QWEN3_CODER))
    assert (spec.num_layers, spec.num_experts, spec.moe_router_topk, spec.moe_ffn_hidden_size) == (62, 160, 8, 2560)
    assert (spec.shared_expert_size, spec.first_dense_layers, spec.qk_layernorm, spec.kv_channels) == (0, 0, True, 128)
    assert (spec.num_attention_heads, spec.num_query_groups, spec.rotary_base, spec.router_pre_softmax) == (
        96, 8, 1e7, False)
    assert total_parameters(spec) == QWEN3_CODER_TOTAL == 480_154_875_392
    assert active_parameters(spec) == QWEN3_CODER_ACTIVE == 35_474_765_312
    assert QWEN3_CODER_TOTAL / 1e9 == pytest.approx(480, rel=0.005)
    assert QWEN3_CODER_ACTIVE / 1e9 == pytest.approx(35, rel=0.02)


# Configs of MoE families this tool does not read, with their published architectural keys as
# each family's config.json names them (the model_type is what refuses them, before any other key).
UNREAD = {
    "qwen2_moe": {"num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
                  "shared_expert_intermediate_size": 5632},                                  # Qwen1.5-MoE-A2.7B
    "deepseek_v2": {"n_routed_experts": 64, "num_experts_per_tok": 6, "n_shared_experts": 2, "q_lora_rank": None,
                    "kv_lora_rank": 512, "topk_method": "greedy"},                            # DeepSeek-V2-Lite
    "llama4": {"text_config": {"num_local_experts": 16, "interleave_moe_layer_step": 1}},     # Llama-4-Scout
    "gpt_oss": {"num_local_experts": 32, "num_experts_per_tok": 4, "sliding_window": 128},    # gpt-oss-20b
    "glm4_moe": {"n_routed_experts": 128, "num_experts_per_tok": 8, "first_k_dense_replace": 1,
                 "partial_rotary_factor": 0.5},                                              # GLM-4.5-Air
    "olmoe": {"num_experts": 64, "num_experts_per_tok": 8},
    "granitemoe": {"num_local_experts": 40, "num_experts_per_tok": 8},
    "kimi_k25": {"text_config": {"model_type": "kimi_k2"}},                                   # Kimi K2.5 (nested)
}


@pytest.mark.parametrize("model_type", UNREAD)
def test_moe_families_not_read_are_refused_in_one_line(advisor, tmp_path, model_type):
    config = {"model_type": model_type, "hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 16,
              "intermediate_size": 5632, "vocab_size": 151936, **UNREAD[model_type]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    line = advisor.error("estimate", "--model", tmp_path / "config.json", "--gpus", 8)
    assert f"model_type {model_type!r} is not" in line and "deepseek_v3, kimi_k2" in line


@pytest.mark.xdist_group("megatron-validator")
def test_released_configs_sweep_and_their_rows_pass_megatrons_parser(tmp_path):
    """Kimi K2 on 1024 H100s and Qwen3-Coder-480B on 256 (sequence 4096, Kimi K2's pretraining
    length): rows come back, and the top two of each, launched as advisor-launch writes them,
    pass core_v0.15.2's parse_args + validate_args and build the TransformerConfig priced
    (the expert groups, the routing, MLA, the stages' layers)."""
    from megatron_real import NO_TRANSFORMER_ENGINE, checkout, validate
    from test_moe_megatron import _expected, _one, _rows

    from advisor.moe.spec import spec_from_dict

    rows = [(model, row) for model, gpus in ((_kimi_with_megatrons_yarn(tmp_path), 1024), (str(QWEN3_CODER), 256))
            for row in _rows(model, gpus, "--top", "2")]
    assert len(rows) == 4 and {row["model"]["num_experts"] for _, row in rows} == {384, 160}
    cases = [{"args": [*row["megatron_args"], *NO_TRANSFORMER_ENGINE, "--mock-data", "--tokenizer-type",
                       "NullTokenizer", "--vocab-size", str(load_model(model).vocab_size), "--train-iters", "10"],
              "world_size": row["gpus"], "env": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}} for model, row in rows]
    results = validate(checkout("core_v0.15.2"), cases)
    assert all(result["ok"] for result in results), [result.get("error") for result in results]
    for (model, row), result in zip(rows, results):
        expected = _expected(spec_from_dict(row["model"]), row)
        wrong = {key: (result["derived"].get(key), value) for key, value in expected.items()
                 if _one(key, result["derived"].get(key)) != value}
        assert not wrong, (model, wrong)
