"""config.json files of released mixtures of experts that are not presets (tests/data/moe/
kimi-k2-instruct.json; each file's _source says where its values come from): read by the
families' readers, counted by hand from the file and compared with the published counts.

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
