"""advisor.options: one description of a run's training options, its flags and back."""

import pytest

from advisor.errors import AdvisorError
from advisor.options import TrainingOptions, parse_training_args, release_defaults, training_args

LEVERS = TrainingOptions().with_(grad_reduce_dtype="bf16", fsdp_strategy="optim_grads", fp8_format="hybrid",
                                 fp8_param_gather=True, optimizer_cpu_offload=True, recompute="full",
                                 recompute_method="block", recompute_num_layers=3, tp_comm_overlap=True)


@pytest.mark.parametrize("options", [TrainingOptions(), LEVERS,
                                     TrainingOptions().with_(flash_attention=False, dataloader_mask="rebuilt"),
                                     TrainingOptions().with_(distributed_optimizer=False, overlap_param_gather=False,
                                                             overlap_grad_reduce=False, vocab_divisible_by=128)])
@pytest.mark.parametrize("tp", [1, 8])
def test_flags_read_back_as_the_same_options(options, tp):
    argv = [*training_args(options, tp=tp), "--tensor-model-parallel-size", str(tp)]
    for release in ("core_v0.15.2", "0.19"):
        assert parse_training_args(argv, release) == (options.at_tp(tp), [])


def test_the_release_decides_what_a_left_out_flag_means():
    argv = ["--bf16", "--use-megatron-fsdp"]
    assert parse_training_args(argv, "0.15")[0].data_parallel.fsdp_strategy == "no_shard"
    assert parse_training_args(argv, "0.19")[0].data_parallel.fsdp_strategy == "optim_grads_params"
    bare, _ = parse_training_args([], "0.19")  # Megatron's defaults: FP32, no DP overlap, mask kept, 128 padding
    assert bare.precision.params_dtype == "float32" and not bare.data_parallel.distributed_optimizer
    assert not bare.data_parallel.overlap_grad_reduce and bare.attention.dataloader_mask == "cached"
    assert bare.vocab_divisible_by == 128
    with pytest.raises(AdvisorError, match="not a release"):
        release_defaults("0.12")


def test_flags_that_change_cost_but_are_not_priced_are_named():
    _, unpriced = parse_training_args(["--bf16", "--fp4-format", "e2m1", "--lr", "3e-4", "--cpu-offloading"])
    assert unpriced == ["--fp4-format", "--cpu-offloading"]


@pytest.mark.parametrize("argv, message", [
    (["--overlap-param-gather", "--use-distributed-optimizer"], "needs --overlap-grad-reduce"),
    (["--tp-comm-overlap", "--tensor-model-parallel-size", "2"], "needs --sequence-parallel"),
    (["--tp-comm-overlap", "--sequence-parallel", "--transformer-impl", "local"], "needs Transformer Engine"),
    (["--bf16", "--optimizer-cpu-offload"], "needs --use-precision-aware-optimizer"),
    (["--bf16", "--fp8-format", "e5m2"], "--fp8-format must be"),
])
def test_what_megatron_refuses_is_one_line(argv, message):
    with pytest.raises(AdvisorError, match=message):
        parse_training_args(argv)


def test_flat_view_round_trips_and_reads_old_rows():
    assert TrainingOptions.from_dict(LEVERS.changed()) == LEVERS
    old = TrainingOptions.from_dict({"gradient_bytes": 2, "flash_attention": False})
    assert old.precision.grad_reduce_dtype == "bf16" and old.attention.dataloader_mask == "cached"
    assert TrainingOptions().changed() == {}


@pytest.mark.parametrize("args, message", [
    (["--tp", "2", "--no-sequence-parallel", "--tp-comm-overlap"], "--tp-comm-overlap needs --sequence-parallel"),
    (["--tp", "2", "--gpu", "a100-80gb", "--fp8-format", "hybrid"], "no FP8 tensor cores"),
    (["--tp", "2", "--gpu", "h100-nvl-94gb", "--optimizer-cpu-offload"], "cannot be timed"),
    (["--fp8-param-gather"], "need --fp8-format"),
    (["--data-parallel-sharding-strategy", "optim"], "needs --use-megatron-fsdp"),
    (["--megatron-version", "0.12"], "not a release the advisor knows"),
])
def test_refused_levers_are_one_line(advisor, args, message):
    assert message in advisor.error("estimate", "--gpus", "8", "--mem", "80", *args)


def test_estimate_states_every_priced_option(advisor):
    document = advisor.json("estimate", "--gpus", "8", "--tp", "2", "--mem", "80", "--grad-reduce-in-bf16",
                            "--use-megatron-fsdp", "--megatron-version", "0.15")
    assert document["options"] == {"grad_reduce_dtype": "bf16", "fsdp_strategy": "no_shard"}
    assert parse_training_args(document["megatron_args"], "0.19")[0] == TrainingOptions.from_dict(document["options"])
