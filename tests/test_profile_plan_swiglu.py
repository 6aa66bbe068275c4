"""'advisor profile plan --no-bias-swiglu-fusion': a campaign's runs carry the eager SwiGLU as the
advisor prices it everywhere else. The plan's one description of a run's options
(``MegatronSetup``) writes the runs' flags (``training_options``) and prices them
(``memory_options``, from the same options); the file keeps it (``setup.bias_swiglu_fusion``), and
what 'advisor profile run --megatron-lm' launches from it says it. Megatron-LM's own parsers
(core_v0.15.2, core_v0.19.0) read the runs: tests/test_megatron_validation.py (its campaigns)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from table_text import read_table

from advisor.capture.campaign import read_campaign
from advisor.megatron_args import MegatronSetup
from advisor.memory import estimate_memory
from advisor.models import PRESETS
from advisor.parallel import ParallelConfig, Workload

UNFUSED = "--no-bias-swiglu-fusion"
PLAN = ["profile", "plan", "--gpus", "8", "--gpus-per-node", "4", "--mode", "reduced", "--model", "llama3.2-1b",
        "--format", "json"]


@pytest.fixture(scope="module")
def campaigns(tmp_path_factory) -> dict:
    """The same campaign planned fused (Megatron's default) and unfused, written to files."""
    from conftest import Invoker

    root, advisor = tmp_path_factory.mktemp("campaigns"), Invoker()
    paths = {"fused": root / "fused.json", "unfused": root / "unfused.json"}
    advisor(*PLAN, "-o", paths["fused"])
    advisor(*PLAN, UNFUSED, "-o", paths["unfused"])
    return paths


def test_the_runs_carry_the_flag_exactly_when_asked(campaigns):
    fused, unfused = (json.loads(campaigns[name].read_text()) for name in ("fused", "unfused"))
    # stated only when off, as the flags state it: the default's file is as before the switch
    assert "bias_swiglu_fusion" not in fused["setup"] and unfused["setup"]["bias_swiglu_fusion"] is False
    assert [run["id"] for run in fused["runs"]] == [run["id"] for run in unfused["runs"]]
    assert {"pp", "dp2", "tp2"} <= {run["scenario"] for run in unfused["runs"]}  # TP 1 and TP > 1 runs
    for plain, eager in zip(fused["runs"], unfused["runs"]):
        assert UNFUSED not in plain["megatron_args"]
        assert eager["megatron_args"].count(UNFUSED) == 1
        # the flag and nothing else: every other argument the same, in the same order
        assert [arg for arg in eager["megatron_args"] if arg != UNFUSED] == plain["megatron_args"]


def test_the_table_says_the_eager_swiglu(advisor):
    title = read_table(advisor(*PLAN[:-2], UNFUSED).stdout).title  # wrapped at COLUMNS
    assert title == "llama3.2-1b: reduced profiling campaign, 34 runs on 8 GPUs (4 per node), --no-bias-swiglu-fusion"
    assert "swiglu" not in advisor(*PLAN[:-2]).stdout  # the default says nothing new


def test_the_file_round_trips(campaigns):
    """Read back (read_campaign checks it), the setup is the one planned (the fused one's file, without
    the field, as every campaign written before the switch), and its options are what the runs'
    flags say (advisor.options reads them back)."""
    from advisor.options import parse_training_args

    for name, fused in (("fused", True), ("unfused", False)):
        document = read_campaign(campaigns[name])
        setup = MegatronSetup(**document["setup"])
        assert setup == MegatronSetup(bias_swiglu_fusion=fused)
        assert setup.to_dict() == document["setup"]
        for run in document["runs"]:
            options, unpriced = parse_training_args(run["megatron_args"], "0.15")
            assert options.fusions.bias_swiglu_fusion is fused
            assert options == setup.training_options().at_tp(run["tp"]) and not unpriced, run["id"]


def test_the_runner_launches_what_the_file_says(campaigns):
    """'advisor profile run --megatron-lm' composes each run's megatron_args with the user's
    (launch.campaign_runner.TorchrunExecutor.argv, launch.arguments.compose): the unfused
    campaign's runs launch the eager SwiGLU, once, and a user restating it after '--' agrees; on
    the fused campaign's runs it is the launcher's conflict (two more h_ffn tensors a layer than
    planned), which names the command that plans it."""
    from launch.arguments import compose
    from launch.megatron_versions import named

    from advisor.errors import AdvisorError
    from advisor.models import LlamaSpec

    rules = named("core_v0.15.2")
    for name in ("fused", "unfused"):
        document = read_campaign(campaigns[name])
        spec, run = LlamaSpec(**document["model"]), document["runs"][-1]
        line = compose(f"campaign run {run['id']}", run["megatron_args"], rules=rules, model=spec, mock_data=True,
                       extras=[])
        assert line.args.count(UNFUSED) == (name == "unfused")
        if name == "unfused":
            restated = compose(f"campaign run {run['id']}", run["megatron_args"], rules=rules, model=spec,
                               mock_data=True, extras=[UNFUSED])
            assert restated.args == [*line.args, UNFUSED]
            continue
        with pytest.raises(AdvisorError, match="advisor estimate/sweep/profile plan --no-bias-swiglu-fusion"):
            compose(f"campaign run {run['id']}", run["megatron_args"], rules=rules, model=spec, mock_data=True,
                    extras=[UNFUSED])


def test_the_unfused_runs_are_priced_two_bytes_an_h_ffn_element_more_per_layer_by_hand(campaigns):
    """Each run priced as the rest of the advisor prices a layout (advisor.memory, seed 004's
    Eq. 18 per stage) with the plan's own options (``MegatronSetup.memory_options``): the eager
    SwiGLU keeps one more BF16 h_ffn-wide tensor per token (x_linear + glu_linear_offset, megatron-core
    transformer/mlp.py ``glu``), split over t with h_ffn and over c with the sequence, so each layer
    of each microbatch in flight holds 2 s b h_ffn / (t c) bytes more; nothing else moves.

    llama3.2-1b: s 8192, h_ffn 8192; at TP 2, b 1: 2 x 8192 x 1 x 8192 / (2 x 1) = 67,108,864 bytes
    (64 MiB) a layer. A stage i of p stages in 1F1B holds min(p - i, m) microbatches (seed 004,
    Section 3.2.2)."""
    spec = PRESETS["llama3.2-1b"]
    assert (spec.ffn_hidden_size, spec.num_layers) == (8192, 16)
    setups = {name: MegatronSetup(**read_campaign(campaigns[name])["setup"]) for name in ("fused", "unfused")}
    runs = read_campaign(campaigns["unfused"])["runs"]
    checked = 0
    for run in runs:
        t, c, b, s, m = run["tp"], run["cp"], run["micro_batch_size"], 8192, run["num_microbatches"]
        layers, p = run["layers_per_stage"], run["pp"]
        parallel = ParallelConfig(tp=t, cp=c, pp=p, dp=run["dp"], mbs=b)
        workload = Workload(seq_len=s, global_batch_size=run["global_batch_size"])
        fused, unfused = (estimate_memory(spec, parallel, workload, setups[name].memory_options(), tuple(layers))
                          for name in ("fused", "unfused"))
        per_layer = 2 * s * b * 8192 / (t * c)
        if (t, b) == (2, 1):
            assert per_layer == 67_108_864
        for i, (plain, eager) in enumerate(zip(fused.stages, unfused.stages)):
            assert eager.layer_activations_bytes - plain.layer_activations_bytes == pytest.approx(
                min(p - i, m) * layers[i] * per_layer, rel=1e-12), (run["id"], i)
            assert eager.model_states_bytes == plain.model_states_bytes
            assert eager.embedding_activations_bytes == plain.embedding_activations_bytes
            assert eager.output_activations_bytes == plain.output_activations_bytes
            checked += 1
    assert checked == sum(run["pp"] for run in runs)


def test_the_setup_prices_what_it_launches():
    """One truth: the estimator's options are the launched options' view, the FP32 setup's
    element size included (the hand-built MemoryOptions priced an FP32 setup's activations at
    2 bytes an element)."""
    for setup in (MegatronSetup(), MegatronSetup(bias_swiglu_fusion=False),
                  MegatronSetup(params_dtype="float32", distributed_optimizer=False, sequence_parallel=False)):
        assert setup.memory_options() == setup.training_options().memory_options()
    assert MegatronSetup(bias_swiglu_fusion=False).memory_options().bias_swiglu_fusion is False
    assert MegatronSetup(params_dtype="float32").memory_options().element_bytes == 4


def test_a_megatron_lm_run_of_the_other_swiglu_under_out_is_another_run(tmp_path):
    """A Megatron-LM run records the SwiGLU it ran (header swiglu_fusion, v4): under an unfused
    campaign's --out a fused run of the same id (the ids name layout and batch only) is another
    run, not a complete one; an emulator's runs say their layer spec's SwiGLU, whatever the plan,
    so they are not compared."""
    from test_campaign_run import CPU, campaign, write_rank

    from advisor.capture.campaign_run import scan
    from advisor.errors import AdvisorError

    fused = campaign(layouts=[(2, 2)])
    unfused = campaign(layouts=[(2, 2)], setup=replace(CPU, bias_swiglu_fusion=False))
    run = fused["runs"][0]
    assert unfused["runs"][0]["id"] == run["id"] and UNFUSED in unfused["runs"][0]["megatron_args"]
    launched, emulated = tmp_path / "launched", tmp_path / "emulated"
    for out, values in ((launched, {"emulated": False}), (emulated, {"emulated": True})):
        (out / run["id"]).mkdir(parents=True)
        for stage in (0, 1):
            write_rank(out / run["id"], run, stage, swiglu_fusion=True, **values)
    assert scan(fused, launched)[run["id"]].state == "complete"
    with pytest.raises(AdvisorError, match="rank 0 has swiglu_fusion True, the campaign's run False; choose another"):
        scan(unfused, launched)
    assert scan(unfused, emulated)[run["id"]].state == "complete"


def test_the_symbolic_backend_runs_the_campaigns_swiglu(advisor, tmp_path):
    """--backend symbolic builds the Transformer Engine spec with Megatron-LM's fusions, the fused
    SwiGLU among them; an unfused campaign's runs now build the eager one (TransformerConfig's
    bias_activation_fusion False, what --no-bias-swiglu-fusion sets), and their files say so.
    Measured on fake tensors, a layer of one microbatch keeps 2 more BF16 h_ffn-wide tensors a token
    (the eager glu's 5 against the fused kernel's 3: equations.unfused_swiglu_bytes):
    2 x 2 bytes x s 512 x b x h_ffn 1024 = 2,097,152 b bytes at TP 1."""
    pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install -e '.[megatron]')")
    from advisor.profiles import load_run

    small = ["--model", "llama3.1-8b", "--num-layers", "2", "--hidden-size", "256", "--ffn-hidden-size", "1024",
             "--num-attention-heads", "4", "--num-query-groups", "2", "--vocab-size", "8192", "--seq-len", "512",
             "--gpus", "2", "--gpus-per-node", "1", "--mode", "reduced", "--mbs", "4", "--gbs", "16"]
    kept = {}
    for name, flags in (("fused", []), ("unfused", [UNFUSED])):
        advisor("profile", "plan", *small, *flags, "-o", tmp_path / f"{name}.json")
        advisor("profile", "run", tmp_path / f"{name}.json", "--out", tmp_path / name, "--backend", "symbolic")
        for run in json.loads((tmp_path / f"{name}.json").read_text())["runs"]:
            for rank in load_run(tmp_path / name / run["id"]).ranks:
                assert rank.header.swiglu_fusion is (name == "fused")
                last = rank.layers[-1].iteration
                [layer] = [record for record in rank.layers if record.kind == "decoder" and record.iteration == last]
                kept[name, run["micro_batch_size"], rank.header.rank] = layer.activation_bytes
    assert sorted({b for _, b, _ in kept}) == [1, 2]
    for (name, b, rank), fused in kept.items():
        if name == "fused":
            assert kept["unfused", b, rank] - fused == 2 * 2 * 512 * b * 1024 == 2_097_152 * b
