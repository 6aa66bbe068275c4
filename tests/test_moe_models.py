"""MoE model specs and parameter counts (advisor.moe.spec, advisor.moe.params): the committed
config.json files (tests/data/moe, values of the Hugging Face hub's files) read back to the
presets; totals within 0.5% and active counts within 2% of the published figures; active
counts exact against the hand computations written out below (embeddings included, the expert
bias buffer not counted)."""

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from advisor.cli import cli
from advisor.errors import AdvisorError
from advisor.models import load_model
from advisor.moe.params import active_parameters, total_parameters
from advisor.moe.spec import PRESETS

DATA = Path(__file__).parent / "data" / "moe"

# name: (published total, published active) in billions (model cards; DeepSeek-V3's 671B is
# without its MTP module, the technical report's count)
PUBLISHED = {"mixtral-8x7b": (46.7, 12.9), "mixtral-8x22b": (141, 39), "qwen3-30b-a3b": (30.5, 3.3),
             "qwen3-235b-a22b": (235, 22), "deepseek-v3": (671, 37)}

# Hand computations, per layer: attention + 2 norms (2h) + router (E h) + shared + k experts (3 h f)
MIXTRAL_8X7B_ACTIVE = 32 * (4096 * (4096 + 2 * 1024 + 4096) + 2 * 4096 + 8 * 4096 + 2 * 3 * 4096 * 14336) \
    + 2 * 32000 * 4096 + 4096
MIXTRAL_8X22B_ACTIVE = 56 * (6144 * (6144 + 2 * 1024 + 6144) + 2 * 6144 + 8 * 6144 + 2 * 3 * 6144 * 16384) \
    + 2 * 32768 * 6144 + 6144
QWEN3_30B_ACTIVE = 48 * (2048 * (4096 + 2 * 512 + 4096) + 2 * 128 + 2 * 2048 + 128 * 2048 + 8 * 3 * 2048 * 768) \
    + 2 * 151936 * 2048 + 2048
QWEN3_235B_ACTIVE = 94 * (4096 * (8192 + 2 * 512 + 8192) + 2 * 128 + 2 * 4096 + 128 * 4096
                          + 8 * 3 * 4096 * 1536) + 2 * 151936 * 4096 + 4096
MLA = (7168 * 1536 + 1536 + 1536 * 128 * 192          # q down, q norm, q up (128 heads x (128 + 64))
       + 7168 * (512 + 64) + 512 + 512 * 128 * 256     # kv down (+ rope key), kv norm, kv up (K nope + V)
       + 128 * 128 * 7168)                             # output projection
DEEPSEEK_V3_ACTIVE = (3 * (MLA + 2 * 7168 + 3 * 7168 * 18432)
                      + 58 * (MLA + 2 * 7168 + 256 * 7168 + 3 * 7168 * 2048 + 8 * 3 * 7168 * 2048)
                      + 2 * 129280 * 7168 + 7168)
HAND_ACTIVE = {"mixtral-8x7b": MIXTRAL_8X7B_ACTIVE, "mixtral-8x22b": MIXTRAL_8X22B_ACTIVE,
               "qwen3-30b-a3b": QWEN3_30B_ACTIVE, "qwen3-235b-a22b": QWEN3_235B_ACTIVE,
               "deepseek-v3": DEEPSEEK_V3_ACTIVE}


# The MTP layers each committed config.json declares (deepseek-ai/DeepSeek-V3's
# num_nextn_predict_layers is 1; the others have no such key): read, never priced by default
CONFIG_MTP = {"deepseek-v3": 1}


@pytest.mark.parametrize("name", PRESETS)
def test_config_json_reads_back_to_the_preset(name):
    """Every field the preset has, and priced as it (mtp_num_layers 0); DeepSeek-V3's declared MTP
    layer is carried apart, in config_mtp_num_layers."""
    spec = load_model(str(DATA / f"{name}.json"))
    assert spec.config_mtp_num_layers == CONFIG_MTP.get(name, 0) and spec.mtp_num_layers == 0
    assert replace(spec, name=name, config_mtp_num_layers=0) == PRESETS[name]


@pytest.mark.parametrize("name", PRESETS)
def test_counts_against_published_and_hand(name):
    spec = PRESETS[name]
    total, active = PUBLISHED[name]
    assert total_parameters(spec) / 1e9 == pytest.approx(total, rel=0.005)
    assert active_parameters(spec) == HAND_ACTIVE[name]
    assert active_parameters(spec) / 1e9 == pytest.approx(active, rel=0.02)


def test_deepseek_mtp_is_an_option():
    spec = PRESETS["deepseek-v3"]
    with_mtp = replace(spec, mtp_num_layers=1)
    module = 3 * 7168 + 2 * 7168 * 7168 + MLA + 2 * 7168 + 256 * 7168 + 257 * 3 * 7168 * 2048
    assert total_parameters(with_mtp) - total_parameters(spec) == module


def _write(tmp_path, name, **changes):
    config = {k: v for k, v in json.loads((DATA / f"{name}.json").read_text()).items() if k != "_source"}
    config.update(changes)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


@pytest.mark.parametrize("name, key, value", [
    ("deepseek-v3", "scoring_func", "softmax"),
    ("deepseek-v3", "topk_method", "greedy"),
    ("qwen3-30b-a3b", "mlp_only_layers", [0]),
    ("deepseek-v3", "norm_topk_prob", False),
    ("mixtral-8x7b", "router_jitter_noise", 0.1),
    ("mixtral-8x7b", "sliding_window", 4096),
    # a JSON true is no layer frequency, nor 1 a true (found by fuzzing: Python's True == 1 let them through)
    ("qwen3-30b-a3b", "decoder_sparse_step", True),
    ("deepseek-v3", "moe_layer_freq", True),
    ("deepseek-v3", "norm_topk_prob", 1),
])
def test_unpriced_keys_refused_by_name(tmp_path, name, key, value):
    with pytest.raises(AdvisorError, match=key):
        load_model(_write(tmp_path, name, **{key: value}))


@pytest.mark.parametrize("changes, message", [
    ({"topk_group": 9}, "topk_group (--moe-router-group-topk) must be at most n_group (--moe-router-num-groups) = 8, "
                        "got 9: there are 8 groups"),
    ({"n_group": 7}, "n_group (--moe-router-num-groups) = 7 must divide n_routed_experts (--num-experts) = 256"),
    ({"topk_group": 1, "num_experts_per_tok": 40}, "topk_group (--moe-router-group-topk) = 1: the 1 chosen groups of "
                                                    "32 experts hold fewer than num_experts_per_tok (--moe-router-topk) "
                                                    "= 40"),
    ({"first_k_dense_replace": 61}, "first_k_dense_replace (--moe-layer-freq) must be at most 60, got 61"),
])
def test_deepseek_routing_keys_are_range_checked(tmp_path, changes, message):
    """Group-limited routing that megatron-core's group_limited_topk cannot run, and a model
    without an MoE layer, refused in one line (before: priced)."""
    with pytest.raises(AdvisorError, match=re.escape(message)):
        load_model(_write(tmp_path, "deepseek-v3", **changes))


def test_llama_with_experts_is_refused_not_priced_dense(tmp_path):
    path = _write(tmp_path, "mixtral-8x7b", model_type="llama")
    with pytest.raises(AdvisorError, match="num_local_experts"):
        load_model(path)


def test_models_json_has_total_and_active(tmp_path):
    from click.testing import CliRunner

    from advisor.cli import cli

    rows = json.loads(CliRunner().invoke(cli, ["models", "--format", "json"]).output)
    by_name = {row["name"]: row for row in rows}
    assert by_name["llama3.1-8b"]["active_parameters_billions"] == by_name["llama3.1-8b"]["parameters_billions"]
    assert by_name["deepseek-v3"]["active_parameters_billions"] == pytest.approx(DEEPSEEK_V3_ACTIVE / 1e9)


def test_mla_latent_norms_need_qk_layernorm():
    """DeepSeek-V3's q_a_layernorm and kv_a_layernorm exist in Megatron only with --qk-layernorm
    (gpt_layer_specs.py builds the up projections as layer-norm linears then): the preset sets
    it, its rows emit it, and without it each layer has q_lora + kv_lora = 1536 + 512 weights fewer."""
    from advisor.moe.flags import model_flags
    from advisor.moe.params import attention_parameters

    spec = PRESETS["deepseek-v3"]
    assert spec.qk_layernorm and "--qk-layernorm" in model_flags(spec)
    assert attention_parameters(spec) - attention_parameters(replace(spec, qk_layernorm=False)) == 1536 + 512


def test_the_aux_loss_weight_is_read_from_config_json_and_bad_values_are_one_line_errors(tmp_path):
    from click.testing import CliRunner

    from advisor.cli import cli

    # Transformers' default where the key is absent (MixtralConfig, Qwen3MoeConfig: 0.001)
    config = {k: v for k, v in json.loads((DATA / "mixtral-8x7b.json").read_text()).items()
              if k not in ("_source", "router_aux_loss_coef")}
    (tmp_path / "plain.json").write_text(json.dumps(config))
    assert load_model(str(tmp_path / "plain.json")).aux_loss_coeff == 0.001
    assert load_model(_write(tmp_path, "qwen3-30b-a3b", router_aux_loss_coef=0.01)).aux_loss_coeff == 0.01
    for bad in (-0.1, "0.01", True, 1e9):
        result = CliRunner().invoke(cli, ["estimate", "--model", _write(tmp_path, "mixtral-8x7b", router_aux_loss_coef=bad),
                                          "--gpus", "8", "--ep", "8"])
        assert result.exit_code == 2, result.output
        assert "router_aux_loss_coef" in result.output and "Traceback" not in result.output
        assert len(result.output.strip().splitlines()) == 1


def test_a_commands_aux_loss_weight_reads_back_and_a_bad_one_is_refused(tmp_path):
    from click.testing import CliRunner

    from advisor.cli import cli

    base = ("--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
            "--group-query-attention --num-query-groups 8 --seq-length 4096 --max-position-embeddings 4096 "
            "--swiglu --normalization RMSNorm --micro-batch-size 1 --global-batch-size 256 --bf16 "
            "--tokenizer-type NullTokenizer --vocab-size 31999 --num-experts 8 --moe-router-topk 2 "
            "--moe-grouped-gemm --expert-model-parallel-size 8 --moe-aux-loss-coeff ")
    good = CliRunner().invoke(cli, ["estimate", "--from-command", "-", "--gpus", "8", "--mem", "80", "--format",
                                    "json"], input=base + "0.02")
    assert good.exit_code == 0, good.output
    assert json.loads(good.stdout)["model"]["aux_loss_coeff"] == 0.02
    bad = CliRunner().invoke(cli, ["estimate", "--from-command", "-", "--gpus", "8", "--mem", "80"], input=base + "-1")
    assert bad.exit_code == 2 and "--moe-aux-loss-coeff" in bad.output and "Traceback" not in bad.output, bad.output


def test_a_deepseek_routing_key_is_one_line_and_exit_2_on_the_command_line(advisor, tmp_path):
    line = advisor.error("estimate", "--model", _write(tmp_path, "deepseek-v3", topk_group=9), "--gpus", 64,
                         "--pp", 8, "--ep", 8, "--mem", 80)
    assert "topk_group (--moe-router-group-topk) must be at most n_group (--moe-router-num-groups) = 8" in line


def test_mlp_only_layers_not_empty_says_what_it_means(tmp_path):
    """Dense Qwen3MoeMLP layers among the MoE layers: refused as not priced, not as 'a list'."""
    with pytest.raises(AdvisorError, match=re.escape("mlp_only_layers is [0, 47], not empty: it puts dense MLP layers "
                                                     "among the MoE layers, which this tool does not price")):
        load_model(_write(tmp_path, "qwen3-30b-a3b", mlp_only_layers=[0, 47]))
    assert load_model(_write(tmp_path, "qwen3-30b-a3b", mlp_only_layers=None)).num_experts == 128  # Qwen3MoeConfig: []


@pytest.mark.parametrize("value, pre_softmax", [(True, False), (False, True), (None, True)])
def test_norm_topk_prob_is_megatrons_pre_softmax(tmp_path, value, pre_softmax):
    """Hugging Face's Qwen3-MoE router: softmax over all experts, top-k, divided by their sum where
    norm_topk_prob (Transformers' default false: None here is the key left out). megatron-core's
    topk_routing_with_score_function: with --moe-router-pre-softmax the softmax over all and the
    top-k, as is; without, the softmax over the k logits, which is the renormalised one."""
    changes = {"norm_topk_prob": value} if value is not None else {}
    path = _write(tmp_path, "qwen3-30b-a3b", **changes)
    if value is None:
        config = json.loads(Path(path).read_text())
        del config["norm_topk_prob"]
        Path(path).write_text(json.dumps(config))
    assert load_model(path).router_pre_softmax is pre_softmax


def test_pre_softmax_keeps_the_softmax_over_every_expert(tmp_path):
    """By hand: the router saves 4 E bytes per token (the FP32 softmax over all E) in place of 4 k
    (over the k picked), 4 (128 - 8) = 480 more per token and MoE layer; at TP = CP = PP = 1, seq
    8192, MBS 1: 480 x 8192 x 48 layers = 0.17578125 GiB more activations. Time is unchanged."""
    def estimate(path):
        result = CliRunner().invoke(cli, ["estimate", "--model", path, "--gpus", "16", "--ep", "8", "--gpu",
                                          "h100-80gb", "--format", "json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    renormalised = estimate(_write(tmp_path, "qwen3-30b-a3b", norm_topk_prob=True))
    pre_softmax = estimate(_write(tmp_path, "qwen3-30b-a3b", norm_topk_prob=False))
    assert (pre_softmax["seq_len"], pre_softmax["mbs"], pre_softmax["pp"]) == (8192, 1, 1)
    assert pre_softmax["stages"][0]["activations_gib"] - renormalised["stages"][0]["activations_gib"] == pytest.approx(
        480 * 8192 * 48 / 2**30)
    assert pre_softmax["step_time_s"] == renormalised["step_time_s"]
    assert "--moe-router-pre-softmax" in pre_softmax["megatron_args"]
    assert "--moe-router-pre-softmax" not in renormalised["megatron_args"]


def test_mlp_only_layers_are_named_as_written(tmp_path):
    """A string layer index is shown as the string it is (found by fuzzing: ["0"] read as [0])."""
    with pytest.raises(AdvisorError, match=re.escape("mlp_only_layers is ['0', 1, true], not empty")):
        load_model(_write(tmp_path, "qwen3-30b-a3b", mlp_only_layers=["0", 1, True]))
