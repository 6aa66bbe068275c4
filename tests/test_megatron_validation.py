"""Every kind of argument list the advisor writes, through the real Megatron-LM's own parse_args
and validate_args (launch.megatron_check), in the environment advisor-launch gives its ranks,
for both releases: nothing is refused, and what Megatron derives (sizes, DP, microbatches, the
split, VPP, the padded vocabulary, recomputation, SP, the distributed optimizer, the gradient
dtype, and every architectural field of the TransformerConfig) is what the advisor priced.

Kinds: the ranked rows of sweeps of several models (CP > 1, PP > 1, tied embeddings, QKV
biases, an explicit head size, QK norms, MHA, a pinned micro-batch the search does not try), estimates with every extension (uneven splits, VPP,
recomputation, no SP, no distributed optimizer, BF16 gradients, no FlashAttention, padding),
plans of the recommender (uneven splits) and the runs of profiling campaigns.

The arguments are the launcher's own (launch.arguments.compose with --mock-data, the release's
rules) plus what a user of a machine without Transformer Engine adds after '--' (its
TransformerConfig refuses the TE-only rope fusion otherwise)."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
from launch_support import plan_files
from megatron_real import NO_TRANSFORMER_ENGINE, assert_built_as_priced, checkout, priced_input, validate

from advisor.options import TrainingOptions, parse_training_args
from advisor.megatron_args import MegatronSetup
from launch.inputs import read_input
from launch.megatron_versions import named

# One worker under pytest-xdist for the tests of the session's validator processes (megatron_real.validate):
# each worker would start its own (torch and Megatron imported again, 10-13 s of CPU per release).
pytestmark = pytest.mark.xdist_group("megatron-validator")

HF = Path(__file__).parent / "fixtures" / "hf_configs"
SWEEPS = {
    "llama3.1-8b": ["--model", "llama3.1-8b", "--gpus", "32", "--mem", "80", "--gbs", "256"],
    "llama3.2-1b-tied": ["--model", "llama3.2-1b", "--gpus", "8", "--mem", "24", "--gbs", "64"],
    "llama2-7b-mha": ["--model", "llama2-7b", "--gpus", "8", "--mem", "40", "--gbs", "64", "--seq-len", "4096"],
    "qwen2-7b-qkv-bias": ["--model", str(HF / "qwen2-7b.json"), "--gpus", "8", "--mem", "80", "--gbs", "64",
                          "--seq-len", "4096"],
    # dense Qwen3: --qk-layernorm, read back by the TransformerConfig as priced (megatron_real.mismatches)
    "qwen3-8b-qk-layernorm": ["--model", str(HF / "qwen3-8b.json"), "--gpus", "8", "--mem", "80", "--gbs", "64",
                              "--seq-len", "4096"],
    # tied at PP 2: the last stage builds its own output weight (gpt_model.py), as priced
    "qwen3-0.6b-tied-pp2": ["--model", str(HF / "qwen3-0.6b.json"), "--gpus", "8", "--mem", "80", "--gbs", "64",
                            "--seq-len", "4096", "--pp", "2"],
    "qwen3-4b-head-dim-tied": ["--model", str(HF / "qwen3-4b.json"), "--gpus", "8", "--mem", "40", "--gbs", "64",
                               "--seq-len", "4096"],
    "mistral-nemo-head-dim": ["--model", str(HF / "mistral-nemo-12b.json"), "--gpus", "8", "--mem", "80",
                              "--gbs", "64", "--seq-len", "4096"],
    # pinned: MBS 3, which the search alone never tries, with TP, CP and recomputation still searched
    "llama3.1-8b-pinned-mbs3-pp2": ["--model", "llama3.1-8b", "--gpus", "8", "--mem", "80", "--gbs", "48",
                                    "--mbs", "3", "--pp", "2"],
}
ESTIMATE = ["--model", "llama3.1-8b", "--gpus", "32", "--tp", "2", "--cp", "2", "--pp", "4", "--mbs", "1",
            "--gbs", "64"]
EXTENSIONS = {
    "paper": [],
    "uneven-first-last": ["--layers-per-stage", "6,9,9,8"],
    "uneven-layout": ["--layers-per-stage", "5,9,10,8"],
    "vpp": ["--vpp", "2"],
    "no-distributed-optimizer": ["--no-distributed-optimizer"],
    "bf16-gradients": ["--grad-dtype", "bf16"],
    "no-sequence-parallel": ["--no-sequence-parallel"],
    "no-flash-attn": ["--no-flash-attn", "--cp", "1"],  # CP runs inside fused attention only
    "recompute-selective": ["--recompute", "selective"],
    # a dense model's --recompute-modules (TransformerConfig takes mlp and layernorm without MoE)
    "recompute-selective-modules": ["--recompute", "selective", "--recompute-modules", "core_attn",
                                    "--recompute-modules", "mlp", "--recompute-modules", "layernorm"],
    "recompute-full-uniform": ["--recompute", "full", "--recompute-method", "uniform", "--recompute-num-layers", "2"],
    "recompute-full-block": ["--recompute", "full", "--recompute-method", "block", "--recompute-num-layers", "3"],
    "vocab-divisible-by-128": ["--vocab-divisible-by", "128"],
    "tied": ["--tie-embeddings"],
    "odd-vocab": ["--vocab-size", "50257"],  # Megatron pads it to a multiple of TP even with divisible-by 1
    # issue 21's levers: each stated in the flags, derived by Megatron as priced
    "no-overlap": ["--no-overlap-grad-reduce"],
    "grad-reduce-in-bf16": ["--grad-reduce-in-bf16"],
    "fsdp-optim-grads": ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads"],
    "fsdp-release-default": ["--use-megatron-fsdp"],  # 0.19's optim_grads_params, written out for 0.15 too
    # Megatron-FSDP's BF16 main gradients: core_v0.19.0's default, stated there as FP32 ones are
    "fsdp-bf16-gradients": ["--use-megatron-fsdp", "--grad-dtype", "bf16"],
    "torch-fsdp2": ["--use-torch-fsdp2", "--pp", "1"],  # FSDP2 runs without pipeline parallelism
    "cpu-offload": ["--optimizer-cpu-offload", "--optimizer-offload-fraction", "0.5"],
    "mask-rebuilt": ["--dataloader-mask", "rebuilt"],
    "fp8-param-gather": ["--fp8-format", "hybrid", "--fp8-param-gather"],
    "fp8-tensorwise": ["--fp8-format", "e4m3", "--fp8-recipe", "tensorwise"],
    "tp-comm-overlap": ["--tp-comm-overlap"],
    # its sub-options, each written in Megatron's words and read by its parser into the TransformerConfig
    "tp-comm-overlap-no-ag-rs": ["--tp-comm-overlap", "--disable-tp-comm-overlap-ag", "--disable-tp-comm-overlap-rs"],
    "tp-comm-overlap-no-bulk": ["--tp-comm-overlap", "--disable-tp-comm-bulk-dgrad", "--disable-tp-comm-bulk-wgrad"],
    "tp-comm-overlap-rs-dgrad": ["--tp-comm-overlap", "--tp-comm-overlap-rs-dgrad"],
    "cross-entropy-fusion": ["--cross-entropy-loss-fusion"],  # the native kernel (te: core 0.15 only)
    # the precision-aware optimizer: OptimizerConfig (built as the training loop builds it) takes
    # each, down to its Transformer Engine import
    "precision-aware": ["--use-precision-aware-optimizer"],
    "precision-aware-low": ["--use-precision-aware-optimizer", "--main-params-dtype", "fp16", "--exp-avg-dtype",
                            "bf16", "--exp-avg-sq-dtype", "fp8"],
    # BF16 with the recipe Megatron-Bridge's BF16 runs hand the optimizer: megatron-core's masters
    "precision-aware-tensorwise-masters": ["--use-precision-aware-optimizer", "--fp8-recipe", "tensorwise",
                                           "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"],
}


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict:
    """Every file the advisor writes for the argument lists, written once for both releases (the
    documents do not depend on the release; only the launcher's composition does): the sweeps,
    the estimates, the plans and the campaign."""
    from conftest import Invoker

    root, advisor = tmp_path_factory.mktemp("written"), Invoker()
    for name, args in SWEEPS.items():
        advisor("sweep", *args, "--format", "json", "-o", root / f"sweep-{name}.json")
    for name, args in EXTENSIONS.items():
        advisor("estimate", *ESTIMATE, *args, "--format", "json", "-o", root / f"estimate-{name}.json")
    advisor("profile", "plan", "--gpus", "16", "--gpus-per-node", "4", "--mbs", "8", "--gbs", "256", "--mode",
            "reduced", "-o", root / "campaign.json")
    # the eager SwiGLU's campaign: Megatron derives bias_activation_fusion False for its runs (mismatches)
    advisor("profile", "plan", "--gpus", "8", "--gpus-per-node", "4", "--mbs", "4", "--gbs", "64", "--mode",
            "reduced", "--no-bias-swiglu-fusion", "-o", root / "campaign-unfused.json")
    return {"root": root, "plans": plan_files(advisor, root)}


def all_inputs(written: dict, rules) -> list:
    """Every argument list, as advisor-launch would start it on ``rules``' release."""
    root, inputs = written["root"], []
    for name in SWEEPS:
        path = root / f"sweep-{name}.json"
        for row in json.loads(path.read_text()):
            config = read_input(path, row["rank"])
            inputs.append(priced_input(config, rules, label=f"sweep {name} rank {row['rank']}",
                                       options=TrainingOptions.from_dict(row["options"]), extras=NO_TRANSFORMER_ENGINE,
                                       num_microbatches=row["num_microbatches"]))
    for name in EXTENSIONS:
        path = root / f"estimate-{name}.json"
        document = json.loads(path.read_text())
        inputs.append(priced_input(read_input(path), rules, label=f"estimate {name}",
                                   options=TrainingOptions.from_dict(document["options"]), extras=NO_TRANSFORMER_ENGINE,
                                   num_microbatches=document["num_microbatches"]))
    for name, path in written["plans"].items():
        document = json.loads(path.read_text())
        if not document["launchable"]:
            continue
        # A plan records the training options it was priced with, and its flags say the same.
        options = TrainingOptions.from_dict(document["options"])
        assert parse_training_args(document["megatron_args"]) == (options.at_tp(document["tp"]), [])
        inputs.append(priced_input(read_input(path), rules, label=f"plan {name}", options=options,
                                   extras=NO_TRANSFORMER_ENGINE, num_microbatches=document["num_microbatches"]))
    unfused = campaign_inputs(root / "campaign-unfused.json", rules)
    assert all(item.args.count("--no-bias-swiglu-fusion") == 1 and not item.options.fusions.bias_swiglu_fusion
               for item in unfused)
    return inputs + campaign_inputs(root / "campaign.json", rules) + unfused


def campaign_inputs(path: Path, rules) -> list:
    """The runs of a reduced campaign on 16 GPUs (TP and DP scenarios, uneven splits), as
    ``advisor profile run --megatron-lm`` starts them (launch.campaign_runner)."""
    from launch.campaign_runner import TorchrunExecutor
    from launch.checkout import Release
    from launch.inputs import LaunchInput
    from advisor.models import LlamaSpec

    campaign = json.loads(path.read_text())
    setup, spec = MegatronSetup(**campaign["setup"]), LlamaSpec(**campaign["model"])
    executor = TorchrunExecutor(Release(rules=rules, checkout=None, given=None), mock_data=True, train_iters=2,
                                extras=NO_TRANSFORMER_ENGINE)
    inputs = []
    for run in campaign["runs"]:
        config = LaunchInput(kind="plan", origin=f"run {run['id']}", model=spec, seq_len=campaign["seq_len"],
                             tp=run["tp"], cp=run["cp"], pp=run["pp"], dp=run["dp"], vpp=1,
                             micro_batch_size=run["micro_batch_size"], global_batch_size=run["global_batch_size"],
                             layers_per_stage=tuple(run["layers_per_stage"]),
                             megatron_args=tuple(run["megatron_args"]) + tuple(executor.iterations))
        inputs.append(priced_input(config, rules, label=f"campaign run {run['id']}", options=setup.training_options(),
                                   extras=NO_TRANSFORMER_ENGINE, num_microbatches=run["num_microbatches"]))
    return inputs


@pytest.mark.parametrize("tag", ["core_v0.15.2", "core_v0.19.0"])
def test_megatron_accepts_and_builds_what_the_advisor_priced(tag, request):
    release = checkout(tag)  # skips without it, before the files are written
    rules = named(tag)
    inputs = all_inputs(request.getfixturevalue("written"), rules)
    kinds = {item.label.split()[0] for item in inputs}
    assert kinds == {"sweep", "estimate", "plan", "campaign"}
    assert any(item.cp > 1 for item in inputs) and any(item.pp > 1 and len(set(item.layers_per_stage)) > 1
                                                       for item in inputs) and any(item.vpp > 1 for item in inputs)
    assert_built_as_priced(release, inputs)


def test_without_the_launchers_environment_megatron_refuses_tp_and_cp(request):
    """The issue's evidence, reproduced: the same lists without CUDA_DEVICE_MAX_CONNECTIONS=1 are
    refused by validate_args whenever TP > 1 or CP > 1 (and only then)."""
    release = checkout("core_v0.15.2")
    rules = named("core_v0.15.2")
    path = request.getfixturevalue("written")["root"] / "sweep-llama3.1-8b.json"
    inputs = [priced_input(read_input(path, row["rank"]), rules, label=str(row["rank"]),
                           options=TrainingOptions.from_dict(row["options"]),
                           extras=NO_TRANSFORMER_ENGINE, num_microbatches=row["num_microbatches"])
              for row in json.loads(path.read_text())]
    cases = [{**item.case(), "env": {"CUDA_DEVICE_MAX_CONNECTIONS": None}} for item in inputs]
    results = validate(release, cases)
    for item, result in zip(inputs, results):
        needs = item.tp > 1 or item.cp > 1
        assert result["ok"] is not needs, (item.label, result)
        if needs:
            assert "CUDA_DEVICE_MAX_CONNECTIONS to 1" in result["error"]


DETERMINISM_ENVIRONMENTS = [{}, {"NCCL_ALGO": "Tree"}, {"NCCL_ALGO": "Ring"}, {"NCCL_ALGO": "Ring,CollnetDirect"},
                            {"NCCL_ALGO": "^NVLS"}, {"NCCL_ALGO": "Ring", "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "1"},
                            {"NCCL_ALGO": "Ring", "CUBLAS_WORKSPACE_CONFIG": ":0:0"},
                            {"NCCL_ALGO": "Ring", "CUBLAS_WORKSPACE_CONFIG": ":16:8"}]


@pytest.mark.parametrize("tag", ["core_v0.15.2", "core_v0.19.0"])
def test_deterministic_modes_environment_is_refused_exactly_where_megatron_refuses_it(tag, request):
    """--deterministic-mode's environment (launch.megatron_versions.environment) against the
    release's own validate_args, value by value: the launcher refuses (one line) exactly what
    Megatron would refuse on every rank, and accepts what it runs (core_v0.19.0 refuses Tree,
    which core_v0.15.2 takes, and takes NCCL_ALGO unset, which core_v0.15.2 refuses)."""
    from advisor.errors import AdvisorError
    from launch.megatron_versions import LaunchShape, environment

    release = checkout(tag)  # skips without it
    rules = named(tag)
    path = request.getfixturevalue("written")["root"] / "estimate-paper.json"
    document = json.loads(path.read_text())
    item = priced_input(read_input(path), rules, label="estimate paper", options=TrainingOptions(),
                        extras=NO_TRANSFORMER_ENGINE, num_microbatches=document["num_microbatches"])
    item = replace(item, args=[*item.args, "--deterministic-mode"])  # the launcher's env for it is what is tested
    variables = {name for exported in DETERMINISM_ENVIRONMENTS for name in exported}
    cases = [{**item.case(), "env": {**item.env, **dict.fromkeys(variables), **exported}}
             for exported in DETERMINISM_ENVIRONMENTS]
    for exported, result in zip(DETERMINISM_ENVIRONMENTS, validate(release, cases)):
        try:
            environment(rules, LaunchShape.of(item.tp, item.cp, item.args), exported)
            launcher_accepts = True
        except AdvisorError:
            launcher_accepts = False
        assert launcher_accepts == result["ok"], (tag, exported, result.get("error"))


def _validated_paper_estimate(request, tag: str, label: str, options, extras, priced=()) -> dict:
    """The written estimate-paper.json as advisor-launch passes it on ``tag`` with ``extras``,
    through that checkout's real parse_args + validate_args (skips without the checkout);
    ``priced``: flags of an option the input prices, added to its own (the user's after -- may not
    give them: launch.arguments.DECIDED_FLAGS)."""
    from dataclasses import replace

    release = checkout(tag)
    path = request.getfixturevalue("written")["root"] / "estimate-paper.json"
    document = json.loads(path.read_text())
    config = read_input(path)
    config = replace(config, megatron_args=(*config.megatron_args, *priced))
    item = priced_input(config, named(tag), label=label, options=options, extras=extras,
                        num_microbatches=document["num_microbatches"])
    [result] = validate(release, [item.case()])
    return result


@pytest.mark.parametrize("tag", ["core_v0.15.2", "core_v0.19.0"])
def test_te_cross_entropy_where_the_advisor_allows_it(tag, request):
    # --cross-entropy-fusion-impl te: core_v0.15.2's validate_args takes it, core_v0.19.0's refuses
    # it ('disabled due to stability issues'), as advisor.releases says
    from advisor.options import release_defaults

    te = ["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te"]
    result = _validated_paper_estimate(request, tag, "estimate paper, te loss",
                                       TrainingOptions().with_(cross_entropy_fusion="te"), NO_TRANSFORMER_ENGINE, te)
    assert result["ok"] == release_defaults(tag).te_cross_entropy, result.get("error")
    if result["ok"]:
        assert (result["derived"]["cross_entropy_loss_fusion"], result["derived"]["cross_entropy_fusion_impl"]) == (
            True, "te")
    else:
        assert "stability" in result["error"]


@pytest.mark.parametrize("tag", ["core_v0.15.2", "core_v0.19.0"])
def test_evaluation_defaults_are_the_releases_own(tag, request):
    # --eval-iters and --eval-interval as parse_args + validate_args leave them where the command
    # line gives neither: core_v0.15.2 100 and 1000 (arguments.py), core_v0.19.0 100 and None
    # (config/training_config.py, ValidationConfig), as advisor.releases says (launch.evaluation reads them)
    result = _validated_paper_estimate(request, tag, "estimate paper, evaluation defaults", TrainingOptions(),
                                       NO_TRANSFORMER_ENGINE)
    assert result["ok"], result.get("error")
    rules = named(tag)
    assert (result["derived"]["eval_iters"], result["derived"]["eval_interval"]) == (
        rules.eval_iters, rules.eval_interval) == {"core_v0.15.2": (100, 1000), "core_v0.19.0": (100, None)}[tag]
