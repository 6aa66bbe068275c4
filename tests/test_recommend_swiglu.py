"""'advisor recommend --profile': the plan launches the SwiGLU its profiles ran. A Megatron-LM run
records it (header ``swiglu_fusion``, profile schema v4: megatron_hooks.recorder.swiglu_fusion, from
the model's TransformerConfig); so does the symbolic backend's Transformer Engine spec, which builds
the campaign's SwiGLU (StageEmulation.bias_swiglu_fusion). Profiles of Megatron-LM runs with
--no-bias-swiglu-fusion measured the eager SwiGLU's memory (two more h_ffn-wide tensors a layer),
and the plan from them launched the fused one: its setup was built without the header's field.
The CPU emulator and the local spec run the eager SwiGLU whatever was asked (megatron_hooks.model
turns bias_activation_fusion off) and stand in for Megatron-LM's default, fused: their plans are as
before (the doc examples' among them, tests/doc_examples.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from capture_synth import TINY, Truth, write_run

from advisor.capture.partitionings import reduced

UNFUSED = "--no-bias-swiglu-fusion"
MEGATRON = dict(emulated=False, backend="cuda", device="cuda", kernels="cuda", layer_spec="transformer_engine")
SYMBOLIC_TE = dict(emulated=True, backend="symbolic", device="meta", kernels="cuda", layer_spec="transformer_engine")
SYMBOLIC_LOCAL = dict(emulated=True, backend="symbolic", device="meta", kernels="cuda", layer_spec="local")
CPU_EMULATOR: dict = {}  # capture_synth's headers: emulated, the local spec, the CPU backend
RECOMMEND = ["--gpus", 4, "--pp", 4, "--mbs", 2, "--gbs", 8]


def write_profiles(root: Path, **header_fields) -> Path:
    """The reduced campaign of the 8-layer model on 4 stages, every rank's header with ``header_fields``."""
    for layers_per_stage in reduced(8, 4):
        write_run(root, Truth(spec=TINY), layers_per_stage, mbs=2, **header_fields)
    return root


def before_v4(root: Path, runs: str = "*") -> None:
    """Rewrite the rank files' headers of the ``runs`` under ``root`` as profile schema v3 wrote
    them: no ``swiglu_fusion``."""
    paths = list(root.glob(f"{runs}/rank*.jsonl"))
    assert paths
    for path in paths:
        first, rest = path.read_text().split("\n", 1)
        header = json.loads(first)
        assert header["type"] == "header" and header["version"] == 4
        del header["swiglu_fusion"]
        path.write_text(json.dumps({**header, "version": 3}) + "\n" + rest)


@pytest.mark.parametrize("made_by, recorded, unfused", [
    (MEGATRON, False, True),  # Megatron-LM with --no-bias-swiglu-fusion
    (MEGATRON, True, False),  # Megatron-LM's default
    (MEGATRON, "v3", False),  # a file before v4 does not say: Megatron-LM's default
    (SYMBOLIC_TE, False, True),  # a campaign planned with --no-bias-swiglu-fusion, built as asked
    (SYMBOLIC_TE, True, False),
    (SYMBOLIC_LOCAL, False, False),  # the local spec's eager SwiGLU, whatever the campaign asked
    (CPU_EMULATOR, False, False),  # the CPU emulator's: stands in for the fused one
    (CPU_EMULATOR, "v3", False),
], ids=["megatron-eager", "megatron-fused", "megatron-v3", "symbolic-te-eager", "symbolic-te-fused", "symbolic-local",
        "cpu-emulator", "cpu-emulator-v3"])
def test_the_plan_launches_the_swiglu_the_profiles_ran(advisor, tmp_path, made_by, recorded, unfused):
    """One truth: the plan's setup, its options and its Megatron-LM arguments (read back by
    advisor.options' parser, as 'advisor launch' hands them to Megatron-LM) all say the SwiGLU of
    the profiles, and --no-bias-swiglu-fusion appears exactly when it was the eager one."""
    from advisor.options import parse_training_args

    root = write_profiles(tmp_path / "runs", **made_by, swiglu_fusion=None if recorded == "v3" else recorded)
    if recorded == "v3":
        before_v4(root)
    plan = advisor.json("recommend", "--profile", root, *RECOMMEND)
    assert plan["launchable"] is True
    assert plan["megatron_args"].count(UNFUSED) == int(unfused)
    # the setup states it only when off, as a campaign file does (MegatronSetup.to_dict)
    assert plan["setup"].get("bias_swiglu_fusion", True) is (not unfused)
    assert ("bias_swiglu_fusion" in plan["setup"]) is unfused
    assert plan["options"]["bias_swiglu_fusion"] is (not unfused)
    options, _ = parse_training_args(plan["megatron_args"], "0.15")
    assert options.fusions.bias_swiglu_fusion is (not unfused)


def test_the_swiglu_changes_nothing_else_in_the_plan(advisor, tmp_path):
    """The same measurements recorded fused and unfused: the same split and peaks (the profiles are
    the memory model), and the arguments differ by the one flag."""
    fused = advisor.json("recommend", "--profile", write_profiles(tmp_path / "fused", **MEGATRON, swiglu_fusion=True),
                         *RECOMMEND)
    eager = advisor.json("recommend", "--profile",
                         write_profiles(tmp_path / "eager", **MEGATRON, swiglu_fusion=False), *RECOMMEND)
    assert eager["layers_per_stage"] == fused["layers_per_stage"]
    assert eager["peak_predicted_gib"] == fused["peak_predicted_gib"]
    assert [arg for arg in eager["megatron_args"] if arg != UNFUSED] == fused["megatron_args"]


def test_a_directory_mixing_the_fused_and_the_eager_swiglu_is_refused(advisor, tmp_path):
    """Runs of both SwiGLUs measure two memories (the eager one's two more h_ffn tensors a layer):
    no one plan launches both, so recommend refuses them in one line naming the two runs (exit 2),
    as it refuses other setups that differ (observations.check_one_setup)."""
    root = tmp_path / "runs"
    write_run(root, Truth(spec=TINY), (2, 2, 2, 2), mbs=2, name="a-fused", **MEGATRON, swiglu_fusion=True)
    write_run(root, Truth(spec=TINY), (2, 2, 2, 2), mbs=4, name="b-eager", **MEGATRON, swiglu_fusion=False)
    line = advisor.error("recommend", "--profile", root, *RECOMMEND)
    assert line == ("Error: run b-eager differs from run a-fused in bias_swiglu_fusion (False vs True); profile one "
                    "setup at a time")


def test_a_file_before_v4_and_a_fused_one_are_one_setup(advisor, tmp_path):
    """Megatron-LM's default, fused, recorded (v4) or not (v3): one setup, planned fused."""
    root = write_profiles(tmp_path / "runs", **MEGATRON, swiglu_fusion=True)
    runs = sorted(path.name for path in root.iterdir())
    before_v4(root, runs[0])
    plan = advisor.json("recommend", "--profile", root, *RECOMMEND)
    assert UNFUSED not in plan["megatron_args"] and "bias_swiglu_fusion" not in plan["setup"]
    assert sorted(plan["predictor"]["profile_runs"]) == runs  # the v3 run among them


def test_a_symbolic_campaign_refuses_a_run_of_the_other_swiglu_under_out(tmp_path):
    """The symbolic backend's Transformer Engine spec builds the campaign's SwiGLU, so its runs
    are compared as Megatron-LM's are: under an eager campaign's --out, a fused run of the same id
    is another run (campaign_run._mismatch compared Megatron-LM runs only), and a fused run of
    another id is another setup, which recommend would refuse beside the campaign's runs."""
    from test_campaign_run import CPU, campaign, write_rank

    from advisor.capture.campaign_run import backend_fields, scan
    from advisor.errors import AdvisorError

    fused = campaign(layouts=[(2, 2)])
    eager = campaign(layouts=[(2, 2)], setup=replace(CPU, bias_swiglu_fusion=False))
    run = fused["runs"][0]
    made_by = backend_fields("symbolic", "transformer_engine")
    te = {key: SYMBOLIC_TE[key] for key in ("emulated", "backend", "layer_spec")}
    (tmp_path / "same" / run["id"]).mkdir(parents=True)
    for stage in (0, 1):
        write_rank(tmp_path / "same" / run["id"], run, stage, swiglu_fusion=True, **te)
    assert scan(fused, tmp_path / "same", made_by)[run["id"]].state == "complete"
    with pytest.raises(AdvisorError, match="rank 0 has swiglu_fusion True, the campaign's run False; choose another"):
        scan(eager, tmp_path / "same", made_by)
    other = {**run, "id": "pp-b1-other"}
    (tmp_path / "other" / other["id"]).mkdir(parents=True)
    for stage in (0, 1):
        write_rank(tmp_path / "other" / other["id"], other, stage, swiglu_fusion=True, **te)
    with pytest.raises(AdvisorError, match=r"holds run pp-b1-other of another setup, bias_swiglu_fusion \(True vs "
                                           r"False\) \(its vs this campaign's\)"):
        scan(eager, tmp_path / "other", made_by)
    assert scan(fused, tmp_path / "other", made_by)[run["id"]].state == "absent"
    # the CPU emulator's runs (the local spec's eager SwiGLU, recorded false) stand for the fused
    # one whatever the campaign: another campaign's run under its --out is of the same setup
    (tmp_path / "cpu" / other["id"]).mkdir(parents=True)
    for stage in (0, 1):
        write_rank(tmp_path / "cpu" / other["id"], other, stage, swiglu_fusion=False)
    for document in (fused, eager):
        assert scan(document, tmp_path / "cpu", backend_fields("cpu"))[run["id"]].state == "absent"


@pytest.mark.parametrize("made_by, recorded, unfused", [
    (MEGATRON, False, True), (MEGATRON, True, False), (SYMBOLIC_TE, False, True),
    (SYMBOLIC_LOCAL, False, False), (CPU_EMULATOR, False, False),
], ids=["megatron-eager", "megatron-fused", "symbolic-te-eager", "symbolic-local", "cpu-emulator"])
def test_the_tables_title_says_the_plan_launches_the_unfused_swiglu(advisor, tmp_path, monkeypatch, made_by, recorded,
                                                                     unfused):
    """The table says what the plan's flags say: where the profiles ran the eager SwiGLU (and the
    plan launches --no-bias-swiglu-fusion), its title names it; fused plans' titles are as before
    (the local spec's eager SwiGLU stands for the fused one: no words)."""
    from advisor.cli.recommend import UNFUSED_SWIGLU_WORDS

    monkeypatch.setenv("COLUMNS", "200")  # the title on one line

    root = write_profiles(tmp_path / "runs", **made_by, swiglu_fusion=recorded)
    table = advisor("recommend", "--profile", root, *RECOMMEND).stdout
    title = table.splitlines()[0]
    assert title.startswith("tiny: megatron plan, 4 GPUs, TP 1, CP 1, DP 1, PP 4, MBS 2")
    assert title.rstrip().endswith(f"(1f1b predictor, {UNFUSED_SWIGLU_WORDS})" if unfused else "(1f1b predictor)")
    assert UNFUSED_SWIGLU_WORDS == "unfused SwiGLU: --no-bias-swiglu-fusion"
    plan = advisor.json("recommend", "--profile", root, *RECOMMEND)
    assert (UNFUSED in plan["megatron_args"]) is unfused  # the title and the flags agree


def test_the_analytic_plans_title_says_the_unfused_swiglu_it_priced(advisor, monkeypatch):
    """Without profiles the plan is priced and launched with the --no-bias-swiglu-fusion given."""
    monkeypatch.setenv("COLUMNS", "200")
    args = ["recommend", "--gpus", 8, "--pp", 2, "--gbs", 16, "--seq-len", 2048]
    fused = advisor(*args).stdout.splitlines()[0]
    eager = advisor(*args, UNFUSED).stdout.splitlines()[0]
    assert UNFUSED in advisor.json(*args, UNFUSED, "--format", "json")["megatron_args"]
    assert fused.rstrip().endswith("(analytic estimates, no profiles)")
    assert eager.rstrip().endswith("(analytic estimates, no profiles, unfused SwiGLU: --no-bias-swiglu-fusion)")
