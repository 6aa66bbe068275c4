"""Megatron-FSDP with optimizer CPU offload: refused on both releases, whose validate_args accept
it but whose get_megatron_optimizer cannot build it (``advisor.options.training.FSDP_OFFLOAD``
has the trace through megatron-core, with file:line for core_v0.15.2 and core_v0.19.0)."""

import shlex

import pytest

from advisor.errors import AdvisorError
from advisor.escalation import LADDER, climb
from advisor.options import TrainingOptions, training_args
from advisor.options.training import FSDP_OFFLOAD

REFUSED = f"Error: {FSDP_OFFLOAD}"
LAYOUT = ["--model", "llama3.1-70b", "--tp", "4", "--pp", "4", "--dp", "8", "--mbs", "1", "--gbs", "512",
          "--gpu", "h100-80gb"]
MOE_LAYOUT = ["--model", "mixtral-8x7b", "--gpus", "64", "--gpu", "h100-80gb", "--tp", "2", "--pp", "4", "--ep", "4",
              "--etp", "1", "--mbs", "1", "--seq-len", "4096", "--gbs", "256"]
OFFLOAD = ["--optimizer-cpu-offload", "--use-precision-aware-optimizer"]


@pytest.mark.parametrize("release", ["0.15", "0.19"])
@pytest.mark.parametrize("strategy", ["optim_grads", "optim_grads_params"])
@pytest.mark.parametrize("fraction", [[], ["--optimizer-offload-fraction", "0.5"],
                                      ["--optimizer-offload-fraction", "0"]])
def test_the_estimate_refuses_it_in_one_line(advisor, release, strategy, fraction):
    """Dense, each strategy the ladder climbs, on both releases, at Megatron's default fraction (1.0),
    a part (0.5: HybridDeviceOptimizer pins the first parameters up to half the elements) and 0
    (nothing pinned, nothing offloaded; refused too: ``FSDP_OFFLOAD``)."""
    assert advisor.error("estimate", *LAYOUT, "--megatron-version", release, "--use-megatron-fsdp",
                         "--data-parallel-sharding-strategy", strategy, *OFFLOAD, *fraction) == REFUSED


@pytest.mark.parametrize("release", ["0.15", "0.19"])
def test_the_sweep_refuses_it_in_one_line(advisor, release):
    assert advisor.error("sweep", "--gpus", "64", "--mem", "40", "--megatron-version", release,
                         "--use-megatron-fsdp", "--optimizer-cpu-offload") == REFUSED


def test_the_moe_estimate_refuses_it_in_one_line(advisor):
    """Mixtral on core 0.19 (the release that prices Megatron-FSDP on an MoE model): get_megatron_optimizer
    builds one HybridDeviceOptimizer over the dense and the expert DTensors (core_v0.19.0
    optimizer/__init__.py:1083-1135), which fails as the dense one does."""
    assert advisor.error("estimate", *MOE_LAYOUT, "--use-megatron-fsdp", "--data-parallel-sharding-strategy",
                         "optim_grads_params", "--optimizer-cpu-offload") == REFUSED


def test_a_command_with_both_is_refused(advisor):
    """--from-command: a torchrun line that validate_args takes (the test below) is refused as the
    flags given to estimate are."""
    line = shlex.join(["torchrun", "--nproc-per-node", "8", "pretrain_gpt.py", "--num-layers", "80", "--hidden-size",
                       "8192", "--ffn-hidden-size", "28672", "--num-attention-heads", "64", "--group-query-attention",
                       "--num-query-groups", "8", "--seq-length", "8192", "--max-position-embeddings", "8192",
                       "--micro-batch-size", "1", "--global-batch-size", "512", "--tensor-model-parallel-size", "4",
                       "--pipeline-model-parallel-size", "4", "--swiglu", "--normalization", "RMSNorm",
                       "--position-embedding-type", "rope", "--disable-bias-linear",
                       "--untie-embeddings-and-output-weights", "--bf16", "--use-distributed-optimizer",
                       "--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads", *OFFLOAD])
    result = advisor.runner.invoke(advisor.command, ["estimate", "--from-command", "-", "--gpus", "128", "--gpu",
                                                     "h100-80gb", "--vocab-size", "128256"], input=line)
    assert result.exit_code == 2 and result.stderr == f"Error: --from-command stdin: {FSDP_OFFLOAD}\n"


def test_the_options_refuse_it_whichever_way_they_are_built():
    for changes in ({"fsdp_strategy": "optim_grads"},
                    {"fsdp_strategy": "no_shard", "optimizer_offload_fraction": 0.25}):
        with pytest.raises(AdvisorError) as error:
            TrainingOptions().with_(optimizer_cpu_offload=True, **changes)
        assert str(error.value) == FSDP_OFFLOAD


def test_the_ladder_never_climbs_to_both():
    """``--sharding auto`` from DDP options on which nothing runs: the three rungs are swept, in
    order, and none has Megatron-FSDP and the offload together (the offload rung starts from the
    user's options, which have no FSDP: ``climb`` stops where they already use a lever)."""
    swept = []
    found, attempts = climb(lambda options: swept.append(options), lambda sweep: False, TrainingOptions())
    assert found is None and [label for label, _ in attempts] == [label for label, _ in LADDER]
    assert [(o.data_parallel.fsdp_strategy, o.offload.optimizer_cpu_offload) for o in swept] == [
        ("optim_grads", False), ("optim_grads_params", False), (None, True)]
    fsdp_given = TrainingOptions().with_(fsdp_strategy="optim_grads")
    assert climb(lambda options: swept.append(options), lambda sweep: False, fsdp_given) == (None, ())


def test_a_dtensor_has_no_pin_memory(megatron_world):
    """What HybridDeviceOptimizer does to each offloaded parameter (hybrid_optimizer.py:274, both
    releases: ``param.detach().clone().cpu().pin_memory()``), on a DTensor as Megatron-FSDP hands
    the optimizer (``make_fsdp_dtensor``: a Shard(0) DTensor over the rank's slice). torch refuses it
    in DTensor's sharding propagation, before any device is touched ('NYI: aten._pin_memory'), so
    a CPU-only torch shows what a GPU run meets (NVIDIA/Megatron-LM issue #1986). The first step's
    gradient copy into a plain pinned tensor (:108-114) is refused too."""
    import torch
    from torch.distributed.tensor import DeviceMesh, DTensor, Shard

    mesh = DeviceMesh("cpu", [0])
    param = DTensor.from_local(torch.ones(4, 3, dtype=torch.bfloat16), mesh, [Shard(0)])
    with pytest.raises(RuntimeError, match="_pin_memory"):
        param.detach().clone().cpu().pin_memory()
    with pytest.raises(RuntimeError, match="mixed torch.Tensor and DTensor"):
        torch.empty(param.shape, dtype=param.dtype).data.copy_(param)


@pytest.mark.parametrize("tag", ["core_v0.15.2", "core_v0.19.0"])
def test_megatron_validate_args_accepts_what_the_advisor_refuses(tag):
    """Why the advisor refuses it itself: the real parse_args/validate_args (launch.megatron_check)
    take Megatron-FSDP with --optimizer-cpu-offload --use-precision-aware-optimizer on both releases
    (arguments.py checks only the precision-aware optimizer and FP8 with the offload)."""
    from megatron_real import TINY_MODEL_ARGS as base, checkout, validate

    release = checkout(tag)  # skips without it
    args = [*training_args(TrainingOptions().with_(fsdp_strategy="optim_grads"), tp=1), *OFFLOAD]
    [result] = validate(release, [{"args": [*base, *args], "world_size": 8, "env": {}}])
    assert result.get("error") is None
    derived = result["derived"]
    assert (derived["use_megatron_fsdp"], derived["optimizer_cpu_offload"]) == (True, True)
