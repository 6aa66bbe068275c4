"""DeepSeek-V3's complementary sequence-wise balance loss beside its expert bias.

Its config.json says ``"seq_aux": true, "aux_loss_alpha": 0.001`` (tests/data/moe/deepseek-v3.json,
kimi-k2-instruct.json). DeepSeek-V2's modeling_deepseek.py MoEGate, whose keys V3 keeps, computes
the loss over each sequence's tokens where seq_aux, else over the batch's, weighted by
aux_loss_alpha; the V3 report trains with that sequence-wise loss beside the bias
(arXiv:2412.19437 Sections 2.1.2, 4.2: alpha 0.0001), and Megatron-Bridge's DeepSeekV3Bridge builds
``moe_router_load_balancing_type = "seq_aux_loss"`` with ``moe_router_enable_expert_bias = True``
and the config's aux_loss_alpha (NVIDIA-NeMo/Megatron-Bridge@067f987d
src/megatron/bridge/models/deepseek/deepseek_v3_bridge.py:68-74; KimiK2Bridge the same type,
kimi/kimi_bridge.py:60-62, its weight through the base bridge's CONFIG_MAPPING
('aux_loss_alpha', 'moe_aux_loss_coeff'), conversion/model_bridge.py:483).

What the loss keeps (megatron-core core_v0.15.2 and core_v0.19.0 ``router.py`` ``routing``,
``_apply_seq_aux_loss``; ``moe_utils.compute_routing_scores_for_aux_loss``): the sigmoid's FP32
output over all E experts (4E) and the FP32 sum that normalises it (4) per token, as aux_loss does;
the per-sequence reshape is a view and its sums are b x E wide per micro-batch, not per token.
"""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from advisor.models import load_model
from advisor.row_flags import flag_values

DATA = Path(__file__).parent / "data" / "moe"
KIMI = DATA / "kimi-k2-instruct.json"
DSV3 = DATA / "deepseek-v3.json"
# DeepSeek-V3 on 256 H100s: TP 1, PP 16 split as NeMo's DeepSeek-V3 recipe (3 dense layers first,
# 4 layers in the middle stages, 2 in the last), EP 8, sequence 4096, MBS 1
LAYOUT = ["--gpus", "256", "--gpu", "h100-80gb", "--tp", "1", "--pp", "16", "--layers-per-stage", "3,4x14,2",
          "--ep", "8", "--etp", "1", "--seq-len", "4096", "--gbs", "1024"]


def _config(tmp_path, path: Path = DSV3, drop: tuple[str, ...] = (), **changes) -> str:
    """The committed config.json (without _source) with top-level changes and keys dropped;
    Kimi K2's with the YaRN beta_fast Megatron-LM's MLA fixes (32; test_moe_released_configs)."""
    config = {key: value for key, value in json.loads(path.read_text()).items() if key not in ("_source", *drop)}
    if path == KIMI:
        config["rope_scaling"] = {**config["rope_scaling"], "beta_fast": 32.0}
    config.update(changes)
    out = tmp_path / f"{path.stem}-{len(list(tmp_path.iterdir()))}.json"
    out.write_text(json.dumps(config))
    return str(out)



# --- reading ------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [DSV3, KIMI])
def test_the_config_reads_as_the_expert_bias_with_the_sequence_wise_loss(tmp_path, path):
    spec = load_model(_config(tmp_path, path))
    assert (spec.expert_bias, spec.load_balancing, spec.aux_loss_coeff) == (True, ("seq_aux_loss",), 0.001)


def test_the_preset_balances_as_its_config(tmp_path):
    preset, read = load_model("deepseek-v3"), load_model(_config(tmp_path))
    for field in ("expert_bias", "load_balancing", "aux_loss_coeff", "score_function"):
        assert getattr(preset, field) == getattr(read, field), field


@pytest.mark.parametrize("changes, drop, balancing, weight", [
    ({"seq_aux": False}, (), ("aux_loss",), 0.001),       # MoEGate's batch-wise loss: Megatron's aux_loss
    ({"aux_loss_alpha": 0.0001}, (), ("seq_aux_loss",), 0.0001),
    ({"aux_loss_alpha": 0}, (), None, 0.0),               # the bias alone: type none, as before
    ({"aux_loss_alpha": 0, "seq_aux": False}, (), None, 0.0),
    ({}, ("seq_aux", "aux_loss_alpha"), ("seq_aux_loss",), 0.001),  # configuration_deepseek.py's defaults
])
def test_seq_aux_and_aux_loss_alpha_decide_the_type_and_its_weight(tmp_path, changes, drop, balancing, weight):
    spec = load_model(_config(tmp_path, drop=drop, **changes))
    assert (spec.load_balancing, spec.aux_loss_coeff, spec.expert_bias) == (balancing, weight, True)


@pytest.mark.parametrize("changes, line", [
    ({"seq_aux": "yes"}, "seq_aux must be true or false, got 'yes'"),
    ({"seq_aux": 1}, "seq_aux must be true or false, got 1"),
    ({"aux_loss_alpha": -0.1}, "aux_loss_alpha must be a number from 0 to 1000, got -0.1"),
    ({"aux_loss_alpha": True}, "aux_loss_alpha must be a number from 0 to 1000, got true"),
])
def test_a_bad_balancing_key_is_one_error_line(advisor, tmp_path, changes, line):
    path = _config(tmp_path, **changes)
    assert advisor.error("estimate", "--model", path, *LAYOUT) == f"Error: {path}: {line}"


def test_parameter_counts_do_not_change(tmp_path):
    """The loss is no parameter: the counts of the preset and the config read as they were
    (test_moe_models, test_moe_released_configs count them by hand)."""
    from advisor.moe.params import active_parameters, total_parameters

    for spec in (load_model("deepseek-v3"), load_model(_config(tmp_path))):
        bias_only = replace(spec, load_balancing=None, aux_loss_coeff=0.0)
        assert total_parameters(spec) == total_parameters(bias_only)
        assert active_parameters(spec) == active_parameters(bias_only)


# --- memory, by hand ----------------------------------------------------------------------------


def test_the_loss_keeps_its_fp32_scores_per_moe_layer_and_microbatch_in_flight(advisor):
    """Per token and MoE layer: sigmoid's FP32 output over E = 256 experts, 4 x 256 = 1024, and its
    FP32 sum, 4: 1028 bytes. Sequence 4096, MBS 1, TP 1, CP 1: N = 4096 tokens a microbatch, so
    4096 x 1028 = 4,210,688 bytes (4.016 MiB) a MoE layer and microbatch in flight. 1F1B over 16
    stages: stage i holds 16 - i microbatches. Stage 0 (the 3 dense layers): nothing. Stage 1 (4
    MoE layers, 15 in flight): 4 x 15 x 4,210,688 = 252,641,280 bytes = 0.2353 GiB. The last
    stage (2 MoE layers, 1 in flight): 2 x 4,210,688 = 8,421,376 bytes. A weight of 0 (the bias
    alone: Megatron computes no loss) keeps none of it; the weight's size changes nothing kept."""
    per_layer = 4096 * (4 * 256 + 4)
    assert per_layer == 4_210_688
    with_loss = advisor.json("estimate", "--model", "deepseek-v3", *LAYOUT)
    bias_only = advisor.json("estimate", "--model", "deepseek-v3", *LAYOUT, "--moe-aux-loss-coeff", "0")
    report = advisor.json("estimate", "--model", "deepseek-v3", *LAYOUT, "--moe-aux-loss-coeff", "0.0001")
    gib = 2 ** 30
    extra = [a["activations_gib"] - b["activations_gib"] for a, b in zip(with_loss["stages"], bias_only["stages"])]
    assert extra[0] == 0.0
    assert extra[1] == pytest.approx(4 * 15 * per_layer / gib, rel=1e-9) == pytest.approx(252_641_280 / gib)
    assert extra[15] == pytest.approx(2 * 1 * per_layer / gib, rel=1e-9) == pytest.approx(8_421_376 / gib)
    for stage in range(2, 15):
        assert extra[stage] == pytest.approx(4 * (16 - stage) * per_layer / gib, rel=1e-9)
    assert [s["activations_gib"] for s in report["stages"]] == [s["activations_gib"] for s in with_loss["stages"]]
    assert [s["model_states_gib"] for s in with_loss["stages"]] == [s["model_states_gib"] for s in bias_only["stages"]]


# --- flags -------------------------------------------------------------------------------------


def test_the_loss_is_launched_with_its_weight_and_the_option_sets_it(advisor):
    """--moe-aux-loss-coeff works for DeepSeek-V3 now that its router has an aux-loss type (it was
    refused as 'type none'); a weight of 0 launches the type alone, Megatron's default weight."""
    row = advisor.json("estimate", "--model", "deepseek-v3", *LAYOUT)
    args = row["megatron_args"]
    assert flag_values(args)["--moe-router-load-balancing-type"] == ("seq_aux_loss",)
    assert flag_values(args)["--moe-aux-loss-coeff"] == ("0.001",)
    assert "--moe-router-enable-expert-bias" in args
    assert row["model"]["load_balancing"] == ["seq_aux_loss"] and row["model"]["aux_loss_coeff"] == 0.001
    report = advisor.json("estimate", "--model", "deepseek-v3", *LAYOUT, "--moe-aux-loss-coeff", "0.0001")
    assert flag_values(report["megatron_args"])["--moe-aux-loss-coeff"] == ("0.0001",)
    off = advisor.json("estimate", "--model", "deepseek-v3", *LAYOUT, "--moe-aux-loss-coeff", "0")
    assert flag_values(off["megatron_args"])["--moe-router-load-balancing-type"] == ("seq_aux_loss",)
    assert "--moe-aux-loss-coeff" not in off["megatron_args"]
    assert advisor.error("estimate", "--model", "deepseek-v3", *LAYOUT, "--moe-aux-loss-coeff", "0.001", "0.01") == (
        "Error: --moe-aux-loss-coeff gives 2 weights for deepseek-v3's 1 load-balancing type (seq_aux_loss): "
        "megatron-core takes one weight per type, in order")


def test_a_config_without_a_weight_still_refuses_one(advisor, tmp_path):
    """aux_loss_alpha 0: the bias alone, type none, which takes no weight (router.py reads one only
    for the aux-loss types)."""
    path = _config(tmp_path, aux_loss_alpha=0, num_nextn_predict_layers=0)  # no MTP note before the error
    assert advisor.error("estimate", "--model", path, *LAYOUT, "--moe-aux-loss-coeff", "0.001") == (
        f"Error: --moe-aux-loss-coeff: {path} balances with its expert bias (load-balancing type none), which "
        "takes no weight (megatron-core weighs only aux_loss, seq_aux_loss, global_aux_loss: router.py)")


@pytest.mark.xdist_group("megatron-validator")
def test_core_v0_15_2_builds_the_router_as_priced(advisor, tmp_path):
    """The rows' flags through the real core_v0.15.2 parse_args + validate_args
    (launch.megatron_check): seq_aux_loss with the expert bias and the weight, for the preset, the
    report's weight and Kimi K2's config.json."""
    from megatron_real import NO_TRANSFORMER_ENGINE, checkout, validate

    release = checkout("core_v0.15.2")
    runs = [("deepseek-v3", (), 0.001, 129280), ("deepseek-v3", ("--moe-aux-loss-coeff", "0.0001"), 0.0001, 129280),
            (_config(tmp_path, KIMI), (), 0.001, 163840)]
    cases = []
    for model, extra, _, vocab in runs:
        row = advisor.json("estimate", "--model", model, "--gpus", "1024", "--gpu", "h100-80gb", "--tp", "2",
                           "--pp", "16", "--ep", "64", "--etp", "1", "--seq-len", "4096", "--gbs", "8192", *extra)
        cases.append({"args": [*row["megatron_args"], *NO_TRANSFORMER_ENGINE, "--mock-data", "--tokenizer-type",
                               "NullTokenizer", "--vocab-size", str(vocab), "--train-iters", "10"],
                      "world_size": 1024, "env": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}})
    results = validate(release, cases)
    assert all(result["ok"] for result in results), [result.get("error") for result in results]
    for (model, _, weight, _), result in zip(runs, results):
        derived = result["derived"]
        kinds, weights = derived["moe_router_load_balancing_type"], derived["moe_aux_loss_coeff"]
        assert (kinds if isinstance(kinds, str) else kinds[0]) == "seq_aux_loss", model
        assert (weights if isinstance(weights, float) else weights[0]) == weight, model
        assert derived["moe_router_enable_expert_bias"] is True, model
        assert derived["moe_router_score_function"] == "sigmoid", model
