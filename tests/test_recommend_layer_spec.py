"""'advisor recommend --profile': the plan launches the layer spec its profiles ran. Profiles of
Megatron-LM runs with --transformer-impl local (header ``layer_spec`` local, written from
``args.transformer_impl``: megatron_hooks.integration) measured megatron-core's own modules, whose
unfused attention keeps the s x s scores (docs/estimator.md, --transformer-impl local), and the
plan from them recorded ``transformer_impl`` transformer_engine in its options and launched
Transformer Engine: its setup had no layer spec. The symbolic backend builds the --layer-spec
asked, so its local runs are planned local too. The CPU emulator builds the local spec whatever
is asked (it cannot build Transformer Engine's) and stands in for Megatron-LM's default, as its
eager SwiGLU stands in for the fused one (test_recommend_swiglu): its plans are as before."""

from __future__ import annotations

import json

import pytest
from test_recommend_swiglu import CPU_EMULATOR, MEGATRON, RECOMMEND, SYMBOLIC_LOCAL, SYMBOLIC_TE, write_profiles

LOCAL = ["--transformer-impl", "local", "--no-persist-layer-norm"]
MEGATRON_LOCAL = {**MEGATRON, "layer_spec": "local"}


@pytest.mark.parametrize("made_by, local", [
    (MEGATRON_LOCAL, True),  # Megatron-LM with --transformer-impl local after --
    (MEGATRON, False),  # Megatron-LM's default
    (SYMBOLIC_LOCAL, True),  # the symbolic backend's --layer-spec local
    (SYMBOLIC_TE, False),
    (CPU_EMULATOR, False),  # the CPU emulator's local spec: stands in for Transformer Engine
], ids=["megatron-local", "megatron-te", "symbolic-local", "symbolic-te", "cpu-emulator"])
def test_the_plan_reports_and_launches_the_layer_spec_the_profiles_ran(advisor, tmp_path, made_by, local):
    """One truth: the plan's setup (only when local, as the flags state it), its options (what it
    says it was priced with) and its arguments, read back by advisor.options' parser and by
    advisor-launch."""
    from launch_support import launcher

    from advisor.options import parse_training_args

    root = write_profiles(tmp_path / "runs", **made_by, swiglu_fusion=True)
    path = tmp_path / "plan.json"
    advisor("recommend", "--profile", root, *RECOMMEND, "-o", path)
    plan = json.loads(path.read_text())
    impl = "local" if local else "transformer_engine"
    assert plan["options"]["transformer_impl"] == impl
    assert plan["setup"].get("transformer_impl", "transformer_engine") == impl
    assert ("transformer_impl" in plan["setup"]) is local
    args = plan["megatron_args"]
    assert all(flag in args for flag in LOCAL) is local and ("--transformer-impl" in args) is local
    options, _ = parse_training_args(args, "0.15")
    assert options.attention.transformer_impl == impl
    launched = json.loads(launcher()("args", "--from", path, "--format", "json").stdout)
    assert ("--transformer-impl" in launched) is local
    if local:  # the launch builds what was profiled
        assert launched[launched.index("--transformer-impl") + 1] == "local"



@pytest.mark.parametrize("tag", ["core_v0.15.2", "core_v0.19.0"])
def test_a_local_plan_builds_in_megatron_as_priced(advisor, tmp_path, tag):
    """The local plan's arguments (--transformer-impl local --no-persist-layer-norm, sequence
    parallelism off at TP 1) through the release's own parse_args and validate_args
    (launch.megatron_check): accepted, and Megatron derives what the plan priced (the local spec,
    no persistent layer norm)."""
    from megatron_real import NO_TRANSFORMER_ENGINE, assert_built_as_priced, checkout, priced_input

    from advisor.options import TrainingOptions
    from launch.inputs import read_input
    from launch.megatron_versions import named

    release = checkout(tag)  # skips without the checkout or its Python
    root = write_profiles(tmp_path / "runs", **MEGATRON_LOCAL, swiglu_fusion=True)
    path = tmp_path / "plan.json"
    advisor("recommend", "--profile", root, *RECOMMEND, "-o", path)
    plan = json.loads(path.read_text())
    assert plan["launchable"] and all(flag in plan["megatron_args"] for flag in LOCAL)
    item = priced_input(read_input(path), named(tag), label="local plan",
                        options=TrainingOptions.from_dict(plan["options"]),
                        extras=[arg for arg in NO_TRANSFORMER_ENGINE if arg != "--no-persist-layer-norm"],
                        num_microbatches=plan["num_microbatches"])
    assert item.args.count("--no-persist-layer-norm") == 1
    assert_built_as_priced(release, [item])
