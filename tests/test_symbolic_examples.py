"""The committed real-size symbolic profiles and the README's comparison made from them (no torch)."""

from advisor.profiles import load_run
from conftest import ROOT
from tables import symbolic


def test_readme_comparison_is_what_the_committed_profiles_give():
    assert symbolic.section() in (ROOT / "docs" / "profiling.md").read_text()


def test_the_examples_are_the_runs_their_commands_describe():
    for name, (_, flags) in symbolic.RUNS.items():
        run = load_run(symbolic.EXAMPLES / name)
        h = run.header
        assert run.status == "ok" and h.run_id == name and h.backend == "symbolic" and h.kernels == "cuda"
        assert (h.seq_len, h.params_dtype, h.layer_spec, h.distributed_optimizer) == (8192, "bfloat16",
                                                                                     "transformer_engine", True)
        assert h.parallel.tp == (int(flags[flags.index("--tp") + 1]) if "--tp" in flags else 1)
        assert h.parallel.cp == (int(flags[flags.index("--cp") + 1]) if "--cp" in flags else 1)
        stages = {r.header.coords["pp"] for r in run.ranks}
        assert len(run.ranks) == len(stages) * h.parallel.tp * h.parallel.cp
        assert all(layer.forward_time_s is None for r in run.ranks for layer in r.layers)
        assert f"--run-id {name}" in (symbolic.EXAMPLES / "README.md").read_text()


def test_the_committed_plan_comes_from_the_committed_campaign_and_launches():
    import json

    from click.testing import CliRunner

    from launch.cli import cli

    folder = symbolic.EXAMPLES / "llama3.1-8b-campaign"
    campaign = json.loads((folder / "campaign.json").read_text())
    plan = json.loads((folder / "plan.json").read_text())
    assert sorted(plan["predictor"]["profile_runs"]) == sorted(run["id"] for run in campaign["runs"])
    assert plan["launchable"] and plan["layers_per_stage"] == [5, 6, 9, 12] and plan["setup"] == campaign["setup"]
    assert plan["peak_predicted_gib"] < 80 < plan["baseline"]["peak_predicted_gib"]
    done = CliRunner().invoke(cli, ["args", "--from", str(folder / "plan.json")])
    assert done.exit_code == 0 and "'E,t*5|t*6|t*9|t*12,L'" in done.stdout, done.output
