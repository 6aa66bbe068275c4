"""torch FSDP2 (--use-torch-fsdp2) as its own cost (issue 21): the memory terms by hand, the time
model's collectives, the flags and Megatron's rules, and the emitted list through the real
parse_args + validate_args of both checkouts (docs/options.md)."""

import json

import pytest

from advisor.errors import AdvisorError
from advisor.memory_levers import fsdp_buffer_bytes, state_bytes_per_parameter
from advisor.options import TrainingOptions, parse_training_args, training_args

# One worker under pytest-xdist for the tests of the session's validator processes (megatron_real.validate):
# each worker would start its own (torch and Megatron imported again, 10-13 s of CPU per release).
pytestmark = pytest.mark.xdist_group("megatron-validator")

FSDP2 = TrainingOptions().with_(torch_fsdp2=True, distributed_optimizer=False, overlap_param_gather=False)


def test_state_and_buffer_bytes_by_hand():
    """Per parameter over DP x CP = 4: BF16 weight 2/4 and BF16 gradient 2/4 (FSDP2 reduces in the
    weights' dtype), FP32 main weight + Adam 12/4; two layers unsharded of weights and gradients
    (the layer in use and the prefetched one / the one in flight to its reduce-scatter)."""
    options = FSDP2.memory_options()
    assert tuple(float(x) for x in state_bytes_per_parameter(options, 4)) == (0.5, 0.5, 3.0)
    assert tuple(float(x) for x in fsdp_buffer_bytes(options, 1000, 5)) == (4000.0, 4000.0)
    assert tuple(float(x) for x in fsdp_buffer_bytes(options, 1000, 1)) == (2000.0, 2000.0)  # all it holds
    # Without --grad-reduce-in-bf16 Megatron's flag says FP32, but FSDP2 has no FP32 main-grad buffer.
    assert FSDP2.precision.grad_reduce_dtype == "fp32" and options.gradient_bytes == 2


def test_priced_as_zero3_collectives_in_bf16():
    """The time model sees Megatron-FSDP optim_grads_params's per-layer collectives, reduced in
    BF16, overlapped and with the optimizer step on the shard."""
    time = FSDP2.time_options()
    assert (time.fsdp_strategy, time.grad_reduce_bytes, time.distributed_optimizer) == ("optim_grads_params", 2, True)
    assert time.overlap_grad_reduce and time.overlap_param_gather


def test_flags_round_trip_and_megatron_rules():
    args = training_args(FSDP2, tp=2)
    assert "--use-distributed-optimizer" not in args and "--overlap-param-gather" not in args
    start = args.index("--use-torch-fsdp2")
    assert args[start:start + 4] == ["--use-torch-fsdp2", "--no-gradient-accumulation-fusion", "--ckpt-format",
                                     "torch_dist"]
    assert parse_training_args([*args, "--tensor-model-parallel-size", "2"]) == (FSDP2, [])
    with pytest.raises(AdvisorError, match="Megatron-LM refuses the two together"):
        parse_training_args(["--bf16", "--use-torch-fsdp2", "--use-distributed-optimizer"])
    with pytest.raises(AdvisorError, match="without --use-distributed-optimizer"):
        TrainingOptions().with_(torch_fsdp2=True)
    with pytest.raises(AdvisorError, match="--fp16"):
        FSDP2.with_(params_dtype="float16", grad_reduce_dtype="fp16")
    assert FSDP2.layout_problem(pp=1, tie_embeddings=False) is None
    assert "PP 2" in FSDP2.layout_problem(pp=2, tie_embeddings=False)
    assert "untied" in FSDP2.layout_problem(pp=1, tie_embeddings=True)


# Llama 3.1 8B at TP 2, by hand: a layer's GEMM weights 218,103,808 split over TP 2 plus its two
# RMSNorm weights (4096 each, not split); the embedding and the untied head 128,256 x 4096 / 2
# each; the final norm 4096.
LAYER = 218_103_808 // 2 + 2 * 4096
STAGE = 32 * LAYER + 2 * (128_256 * 4096 // 2) + 4096
GIB = 2 ** 30


def test_estimate_by_hand_and_from_command_round_trip(advisor, tmp_path):
    path = tmp_path / "fsdp2.json"
    advisor("estimate", "--model", "llama3.1-8b", "--gpus", "8", "--tp", "2", "--pp", "1", "--mbs", "1", "--gbs",
            "64", "--use-torch-fsdp2", "--gpu", "h100-80gb", "--format", "json", "-o", path)
    row = json.loads(path.read_text())
    stage = row["stages"][0]
    assert stage["parameters"] == STAGE
    assert stage["weights_gib"] == pytest.approx((2 * STAGE / 4 + 2 * 2 * LAYER) / GIB, rel=1e-12)
    assert stage["gradients_gib"] == pytest.approx((2 * STAGE / 4 + 2 * 2 * LAYER) / GIB, rel=1e-12)
    assert stage["optimizer_gib"] == pytest.approx(12 * STAGE / 4 / GIB, rel=1e-12)
    command = tmp_path / "command.sh"
    command.write_text("torchrun --nproc-per-node 8 pretrain_gpt.py " + " ".join(row["megatron_args"]) + "\n")
    path2 = tmp_path / "read.json"
    advisor("estimate", "--from-command", command, "--vocab-size", "128256", "--gpu", "h100-80gb", "--format", "json",
            "-o", path2)
    read = json.loads(path2.read_text())
    assert read["unpriced"] == [] and read["options"] == row["options"]
    assert (read["total_gib"], read["step_time_s"]) == (row["total_gib"], row["step_time_s"])


def test_layouts_megatron_refuses_are_one_line(advisor):
    for command, message in ((["estimate", "--gpus", "8", "--tp", "2", "--pp", "2", "--mbs", "1", "--use-torch-fsdp2"],
                              "without pipeline parallelism"),
                             (["sweep", "--gpus", "8", "--mem", "80", "--use-torch-fsdp2"], "does not search torch FSDP2"),
                             (["estimate", "--gpus", "8", "--pp", "1", "--mbs", "1", "--use-torch-fsdp2",
                               "--use-megatron-fsdp"], "two FSDPs")):
        done = advisor(*command, expect=2)
        assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("tag", ["core_v0.15.2", "core_v0.19.0"])
def test_megatron_accepts_and_builds_the_emitted_fsdp2_list(tag, advisor, tmp_path):
    """The estimate's flags through the release's real parse_args + validate_args, in the
    environment advisor-launch gives its ranks (no CUDA_DEVICE_MAX_CONNECTIONS=1 under FSDP):
    accepted, and use_torch_fsdp2, no gradient-accumulation fusion, no distributed optimizer and
    torch_dist derived as priced."""
    from megatron_real import NO_TRANSFORMER_ENGINE, assert_built_as_priced, checkout, priced_input

    from launch.inputs import read_input
    from launch.megatron_versions import named

    release = checkout(tag)
    path = tmp_path / "fsdp2.json"
    advisor("estimate", "--model", "llama3.1-8b", "--gpus", "16", "--tp", "2", "--cp", "2", "--pp", "1", "--mbs", "1",
            "--gbs", "64", "--use-torch-fsdp2", "--format", "json", "-o", path)
    document = json.loads(path.read_text())
    assert_built_as_priced(release, [priced_input(
        read_input(path), named(tag), label="estimate torch-fsdp2", options=TrainingOptions.from_dict(document["options"]),
        extras=NO_TRANSFORMER_ENGINE, num_microbatches=document["num_microbatches"])])
