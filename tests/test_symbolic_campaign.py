"""``advisor profile run --backend symbolic`` end to end at the real layer size: a campaign of
Llama-3.1-8B-shaped layers (hidden 4096, FFN 14336, 32 heads, 8 KV heads, vocabulary 128256,
sequence 8192, BF16, distributed optimizer, SP) profiled on fake tensors, recommended from, and
the plan's launch written by advisor-launch; and the command's refusals."""

import json

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install -e '.[megatron]')")

from advisor.capture.observations import load_profile_set  # noqa: E402
from advisor.profiles import load_run  # noqa: E402
from conftest import ROOT  # noqa: E402

EIGHT_B_SHAPED = ["--model", "llama3.1-8b", "--num-layers", "4"]  # 8B layers, 4 of them: a quick campaign


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    from conftest import Invoker

    root = tmp_path_factory.mktemp("symbolic-campaign")
    advisor = Invoker()
    advisor("profile", "plan", *EIGHT_B_SHAPED, "--gpus", "4", "--gpus-per-node", "2", "--mode", "reduced", "--mbs",
            "2", "--gbs", "64", "-o", root / "campaign.json")
    result = advisor("profile", "run", root / "campaign.json", "--out", root / "runs", "--backend", "symbolic")
    return root, json.loads((root / "campaign.json").read_text()), result


def test_every_rank_of_every_run_is_profiled_symbolically(campaign):
    root, document, result = campaign
    runs = document["runs"]
    assert f": {len(runs)} ok, 0 oom, 0 failed, 0 already complete" in result.stdout
    for run in runs:
        profile = load_run(root / "runs" / run["id"])
        assert len(profile.ranks) == run["tp"] * run["dp"] * len(run["layers_per_stage"])
        h = profile.header
        assert (h.backend, h.kernels, h.layer_spec, h.params_dtype, h.distributed_optimizer) == (
            "symbolic", "cuda", "transformer_engine", "bfloat16", True)
        assert h.sequence_parallel == (run["tp"] > 1) and h.model.hidden_size == 4096
    assert load_profile_set([root / "runs"]).runs  # what recommend reads


def test_recommend_and_launch_from_a_symbolic_campaign(campaign, advisor):
    root, document, _ = campaign
    advisor("recommend", "--profile", root / "runs", "--gpus", "16", "--gpus-per-node", "2",
            "--pp", "2", "--mbs", "2", "--gbs", "64", "-o", root / "plan.json")
    plan = json.loads((root / "plan.json").read_text())
    assert plan["launchable"] and plan["pp"] == 2 and sum(plan["layers_per_stage"]) == 4
    assert plan["setup"] == document["setup"]
    from click.testing import CliRunner

    from launch.cli import cli as launch

    done = CliRunner().invoke(launch, ["args", "--from", str(root / "plan.json"), "--format", "json"])
    assert done.exit_code == 0, done.output
    args = json.loads(done.stdout)
    for flag in ("--bf16", "--use-distributed-optimizer", "--seq-length"):
        assert flag in args
    assert ("--sequence-parallel" in args) == (plan["tp"] > 1)
    assert args[args.index("--pipeline-model-parallel-size") + 1] == "2"


@pytest.mark.parametrize("flags,message", [
    (["--backend", "symbolic", "--megatron-lm", str(ROOT)], "--backend symbolic profiles without GPUs"),
    (["--backend", "symbolic", "--threads", "2"], "--threads is the CPU backend's"),
    (["--layer-spec", "local"], "--layer-spec is the symbolic backend's"),
    (["--backend", "symbolic", "--layer-spec", "local"], "local spec has no sequence parallelism"),
])
def test_refusals_are_one_line(advisor, tmp_path, flags, message):
    advisor("profile", "plan", *EIGHT_B_SHAPED, "--gpus", "4", "--gpus-per-node", "2", "--mode", "reduced",
            "-o", tmp_path / "campaign.json")
    assert message in advisor.error("profile", "run", tmp_path / "campaign.json", "--out", tmp_path / "runs", *flags)
