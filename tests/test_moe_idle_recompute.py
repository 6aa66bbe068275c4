"""--recompute-modules that recompute nothing in an MoE model: accepted, as Megatron accepts them,
priced as nothing, and said in one line on stderr.

megatron-core (core_v0.15.2 and core_v0.19.0) builds no shared experts without
--moe-shared-expert-intermediate-size (moe_layer.py, ``use_shared_expert``), so 'shared_experts'
has nothing to recompute on Mixtral; its 'mlp' sets ``recompute_mlp`` only where the layer's MLP
is not an MoE layer (transformer_layer.py), and every Mixtral layer is one. DeepSeek-V3 has both:
shared experts, and three dense layers first."""

from __future__ import annotations

import json

from click.testing import CliRunner

from advisor.cli import cli

MIXTRAL = ["estimate", "--model", "mixtral-8x7b", "--gpus", "64", "--pp", "4", "--ep", "8", "--gpu", "h100-80gb",
           "--format", "json"]
DEEPSEEK = ["estimate", "--model", "deepseek-v3", "--gpus", "2048", "--pp", "16", "--ep", "64", "--gpu", "h800-80gb",
            "--format", "json"]


def run(argv: list[str]) -> tuple[dict, str]:
    result = CliRunner(env={"COLUMNS": "400"}).invoke(cli, argv)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), result.stderr


def test_shared_experts_on_a_model_without_them_is_said_and_priced_as_nothing():
    none, quiet = run(MIXTRAL)
    row, said = run([*MIXTRAL, "--recompute", "selective", "--recompute-modules", "shared_experts"])
    assert quiet == ""
    assert said == ("advisor estimate: --recompute-modules shared_experts recomputes nothing on mixtral-8x7b (it has "
                    "no shared experts), and is priced so\n")
    assert (row["total_gib"], row["step_time_s"]) == (none["total_gib"], none["step_time_s"])


def test_mlp_on_an_all_moe_model_is_said_beside_the_modules_that_work():
    layernorm, _ = run([*MIXTRAL, "--recompute", "selective", "--recompute-modules", "layernorm"])
    row, said = run([*MIXTRAL, "--recompute", "selective", "--recompute-modules", "mlp", "layernorm"])
    assert said.startswith("advisor estimate: --recompute-modules mlp recomputes nothing on mixtral-8x7b (Megatron's "
                           "mlp is the dense MLP, and every layer is an MoE layer") and said.count("\n") == 1
    assert (row["total_gib"], row["step_time_s"]) == (layernorm["total_gib"], layernorm["step_time_s"])
    both = CliRunner(env={"COLUMNS": "400"}).invoke(cli, [*MIXTRAL, "--recompute", "selective", "--recompute-modules",
                                                          "shared_experts", "mlp"])
    assert "--recompute-modules shared_experts and mlp recompute nothing on mixtral-8x7b" in both.stderr


def test_a_model_with_shared_experts_and_dense_layers_is_not_told():
    none, _ = run(DEEPSEEK)
    row, said = run([*DEEPSEEK, "--recompute", "selective", "--recompute-modules", "mlp", "shared_experts"])
    assert said == ""
    assert row["step_time_s"] > none["step_time_s"]  # both recompute something


def test_the_sweep_says_it_once():
    result = CliRunner(env={"COLUMNS": "400"}).invoke(cli, ["sweep", "--model", "mixtral-8x7b", "--gpus", "64", "--gpu",
                                                            "h100-80gb", "--recompute-modules", "shared_experts",
                                                            "--top", "1", "--format", "json"])
    assert result.exit_code == 0, result.output
    assert result.stderr.count("recomputes nothing on mixtral-8x7b") == 1
