"""A mixture of experts in a profiling campaign: ``advisor profile plan`` gives its runs EP and ETP
and the MoE flags (skipping the scenarios whose ranks cannot hold the expert groups); ``advisor
profile run`` and ``advisor recommend`` refuse MoE in one line (the profilers build dense stages
and the CAPTURE recommender plans dense layers) rather than price it as dense. No torch."""

import json

import pytest

from click.testing import CliRunner

from advisor.cli import cli

PLAN = ["profile", "plan", "--model", "mixtral-8x7b", "--gpus", "8", "--gpus-per-node", "8", "--mode", "reduced",
        "--seq-len", "4096", "--mbs", "2", "--gbs", "16"]


def _one_line_error(result, *words):
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and all(word in lines[0] for word in words), result.output


def test_the_runs_carry_ep_and_etp_and_their_flags_read_back(tmp_path):
    runner = CliRunner()
    result = runner.invoke(cli, [*PLAN, "--ep", "4", "--format", "json"])
    assert result.exit_code == 0, result.output
    campaign = json.loads(result.stdout)
    runs = campaign["runs"]
    # megatron-core's expert groups: EP x ETP divides the TP x CP x DP ranks of every run
    assert runs and all(run["ep"] == 4 and run["etp"] == 1 and (run["tp"] * run["dp"]) % 4 == 0 for run in runs)
    assert {s["scenario"] for s in campaign["skipped"]} == {"pp", "dp2", "tp2"}
    assert all("does not divide its TP x CP x DP" in s["reason"] for s in campaign["skipped"])
    from advisor.megatron_readback import read_run
    from advisor.moe.spec import PRESETS

    for run in runs:  # Megatron's flags read back (advisor.megatron_readback, as --from-command does)
        read = read_run(run["megatron_args"], name=run["id"], vocab_size=32000)
        assert (read.moe.ep, read.moe.etp, read.layout.tp, read.unpriced) == (4, 1, run["tp"], ())
        assert list(read.layout.layers_per_stage) == run["layers_per_stage"]
        mixtral = PRESETS["mixtral-8x7b"]
        for field in ("num_layers", "hidden_size", "num_experts", "moe_router_topk", "moe_ffn_hidden_size"):
            assert getattr(read.spec, field) == getattr(mixtral, field), field


def test_the_planners_fields_are_those_the_campaign_check_knows():
    """``advisor.capture.campaign_check``'s CAMPAIGN_FIELDS and RUN_FIELDS, which it refuses any
    other field than, are what ``advisor profile plan`` writes, dense and MoE (EP and ETP)."""
    from advisor.capture.campaign_check import CAMPAIGN_FIELDS, RUN_FIELDS

    documents = [json.loads(CliRunner().invoke(cli, [*PLAN, *args, "--format", "json"]).stdout)
                 for args in (("--ep", "4"), ("--model", "llama3.2-1b"))]
    assert {key for document in documents for key in document} == set(CAMPAIGN_FIELDS)
    assert {key for document in documents for run in document["runs"] for key in run} == set(RUN_FIELDS)


def test_a_dense_campaign_is_unchanged_and_refuses_ep():
    runner = CliRunner()
    dense = json.loads(runner.invoke(cli, ["profile", "plan", "--gpus", "8", "--mode", "reduced",
                                           "--format", "json"]).stdout)
    assert all("ep" not in run and "--num-experts" not in run["megatron_args"] for run in dense["runs"])
    _one_line_error(runner.invoke(cli, ["profile", "plan", "--gpus", "8", "--ep", "2"]), "--ep/--etp", "dense")
    _one_line_error(runner.invoke(cli, [*PLAN, "--ep", "3"]), "EP 3 must divide the 8 experts")
    _one_line_error(runner.invoke(cli, [*PLAN, "--ep", "8"]), "no scenario's TP x CP x DP ranks", "EP x ETP = 8")


def test_running_or_recommending_moe_is_refused_in_one_line(tmp_path):
    runner = CliRunner()
    assert runner.invoke(cli, [*PLAN, "--ep", "2", "-o", str(tmp_path / "campaign.json")]).exit_code == 0
    for backend in ("cpu", "symbolic"):
        _one_line_error(runner.invoke(cli, ["profile", "run", str(tmp_path / "campaign.json"), "--out",
                                            str(tmp_path / "runs"), "--backend", backend]),
                        "mixtral-8x7b is a mixture of experts", "rank files hold a dense model")
    assert not (tmp_path / "runs").exists()
    _one_line_error(runner.invoke(cli, ["recommend", "--model", "mixtral-8x7b", "--gpus", "8", "--pp", "2", "--mbs", "1",
                                        "--gbs", "16"]), "mixtral-8x7b is a mixture of experts", "advisor estimate")


@pytest.mark.parametrize("model", ["llama3.1-8b", "qwen3-235b-a22b"])
def test_a_campaign_of_no_runs_names_why(model):
    """1,024 GPUs: every scenario's stages outnumber the layers. A dense plan printed an empty
    table with exit 0; an MoE plan advised a smaller EP, of 1 already."""
    from advisor.models import load_model

    layers = load_model(model).num_layers
    _one_line_error(CliRunner().invoke(cli, ["profile", "plan", "--model", model, "--gpus", "1024"]),
                    f"pp: {layers} layers cannot fill 1024 stages", f"profile on at most {layers} GPUs")
