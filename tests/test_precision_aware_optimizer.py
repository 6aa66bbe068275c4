"""Megatron's precision-aware optimizer (--use-precision-aware-optimizer with --main-params-dtype,
--exp-avg-dtype, --exp-avg-sq-dtype): the optimizer states' bytes against a hand count, its rules
as megatron-core states them, its flags read back, and its launch needing Transformer Engine.

The hand count: Llama 3.1 8B has 8,030,261,248 parameters (Meta's model card: 8.03B), of which
32 x 2 + 1 RMSNorm weights of 4,096 are not split by TP; at TP 2 one GPU holds
(8,030,261,248 - 266,240) / 2 + 266,240 = 4,015,263,744 (no padding: 128,256 divides by 2).
Under the distributed optimizer over DP 4 each holds a quarter of the optimizer states:
FP32 master, momentum and variance 12 bytes a parameter; with the precision-aware optimizer the
master weight of a BF16 weight is its 2-byte remainder (Transformer Engine's
store_param_remainders), so 2 + 4 + 4 = 10, and with BF16 moments 2 + 2 + 2 = 6."""

from __future__ import annotations

import json
import math

import pytest

from advisor.options import TrainingOptions, parse_training_args, training_args

GIB = 2**30
PARAMETERS_PER_GPU = (8_030_261_248 - 266_240) // 2 + 266_240
LAYOUT = ["--gpus", "8", "--tp", "2", "--pp", "1", "--mbs", "1", "--gpu", "h100-80gb", "--format", "json"]


def _estimate(advisor, *options: str) -> dict:
    return json.loads(advisor("estimate", *LAYOUT, *options).stdout)


@pytest.mark.parametrize("options, state_bytes", [
    ((), 12),
    (("--use-precision-aware-optimizer",), 2 + 4 + 4),
    (("--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"), 2 + 2 + 2),
    (("--use-precision-aware-optimizer", "--main-params-dtype", "fp16", "--exp-avg-dtype", "fp8",
      "--exp-avg-sq-dtype", "fp16"), 2 + (1 + 1) + 2),  # an FP8 moment: E4M3 data and its transpose
    # FP8 moments cost what BF16 ones do on the GPU: TE 2.x's Float8Tensor state keeps its
    # transpose beside its data (Float8Quantizer's default column-wise usage), 1 + 1 bytes each
    (("--use-precision-aware-optimizer", "--exp-avg-dtype", "fp8", "--exp-avg-sq-dtype", "fp8"), 2 + 2 + 2),
    # FP8 with current scaling: megatron-core keeps its own FP32 master shard (no remainders)
    (("--use-precision-aware-optimizer", "--fp8-format", "hybrid", "--fp8-recipe", "tensorwise",
      "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"), 4 + 2 + 2),
    # Megatron hands --fp8-recipe to the optimizer FP8 or not: a BF16 run with 'tensorwise' (as
    # Megatron-Bridge's BF16 recipes carry it) keeps megatron-core's FP32 masters
    (("--use-precision-aware-optimizer", "--fp8-recipe", "tensorwise", "--exp-avg-dtype", "bf16",
      "--exp-avg-sq-dtype", "bf16"), 4 + 2 + 2),
    # offloaded share aside, the HybridDeviceOptimizer keeps FP32 states
    (("--optimizer-cpu-offload", "--optimizer-offload-fraction", "0.5"), 12 * 0.5),
])
def test_optimizer_states_by_hand(advisor, options, state_bytes):
    estimate = _estimate(advisor, *options)
    [stage] = estimate["stages"]
    if "--fp8-format" not in options:  # FP8 adds its weight copies
        assert stage["weights_gib"] * GIB == pytest.approx(2 * PARAMETERS_PER_GPU, rel=1e-12)
    assert stage["optimizer_gib"] * GIB == pytest.approx(state_bytes * PARAMETERS_PER_GPU / 4, rel=1e-12)


def test_the_states_saved_come_off_the_total_and_nothing_else_moves(advisor):
    plain = _estimate(advisor)
    low = _estimate(advisor, "--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16")
    saved = 6 * PARAMETERS_PER_GPU / 4 / GIB
    assert plain["total_gib"] - low["total_gib"] == pytest.approx(saved, rel=1e-9)
    assert low["activations_gib"] == plain["activations_gib"]
    # the Adam step moves more bytes, not fewer: TE's FusedAdam unscales each BF16 moment into an
    # FP32 copy and scales it back (2 + 4, the kernel's 4 + 4, then 4 + 2 + 2 + 2: 24 each), and the
    # master's remainder is read and written with the BF16 weight read (6), and the kernel writes the
    # weight (2) where megatron-core's copy reads its FP32 master (4) and writes it (2), against 8 a
    # FP32 state: 4 + 4 + 2 + 6 + 24 + 24 = 64 against 4 + 4 + (4 + 2) + 3 x 8 = 38 an element of
    # the DP 4 shard; the FP32 gradient buffer zeroed whole beside both, 4 x 4 = 16 a shard element
    ratio = low["time_parts"]["optimizer_s"] / plain["time_parts"]["optimizer_s"]
    assert ratio == pytest.approx((64 + 16) / (38 + 16), rel=1e-9)
    assert "--use-precision-aware-optimizer" in low["megatron_args"]


def test_moe_states_shrink_alike(advisor):
    """Dense parts over DP x CP and experts over the expert-data-parallel group alike: BF16
    moments and the master's remainder take each stage's optimizer states to 6/12."""
    args = ["estimate", "--model", "qwen3-30b-a3b", "--gpus", "16", "--tp", "1", "--pp", "2", "--ep", "8",
            "--gpu", "h100-80gb", "--format", "json"]
    plain = json.loads(advisor(*args).stdout)
    low = json.loads(advisor(*args, "--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16",
                             "--exp-avg-sq-dtype", "bf16").stdout)
    for before, after in zip(plain["stages"], low["stages"]):
        assert after["optimizer_gib"] == pytest.approx(before["optimizer_gib"] * 6 / 12, rel=1e-12)
        assert after["weights_gib"] == before["weights_gib"]


@pytest.mark.parametrize("options, message", [
    (["--exp-avg-dtype", "bf16"], "--exp-avg-dtype bf16 needs --use-precision-aware-optimizer"),
    (["--use-precision-aware-optimizer", "--no-distributed-optimizer"], "needs --use-distributed-optimizer"),
    (["--use-precision-aware-optimizer", "--use-megatron-fsdp"], "with FSDP is not priced"),
    (["--optimizer-cpu-offload", "--use-precision-aware-optimizer", "--exp-avg-sq-dtype", "bf16"],
     "no effect with --optimizer-cpu-offload"),
])
def test_what_megatron_refuses_is_one_line(advisor, options, message):
    result = advisor("estimate", *LAYOUT, *options, expect=2)
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("Error: ") and message in result.stderr


def test_flags_read_back_and_bf16_main_gradients_are_bf16_reduction():
    options = TrainingOptions().with_(precision_aware_optimizer=True, exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16")
    argv = training_args(options, tp=2)
    assert argv[argv.index("--use-precision-aware-optimizer"):][:5] == [
        "--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"]
    assert parse_training_args([*argv, "--tensor-model-parallel-size", "2"])[0] == options
    # validate_args: --main-grads-dtype bf16 leaves --accumulate-allreduce-grads-in-fp32 off, so the
    # gradient buffer is BF16, as with --grad-reduce-in-bf16
    read, unpriced = parse_training_args(["--bf16", "--use-distributed-optimizer", "--use-precision-aware-optimizer",
                                          "--main-grads-dtype", "bf16", "--exp-avg-dtype", "bf16"])
    assert read.precision.grad_reduce_dtype == "bf16" and read.optimizer_states.exp_avg_dtype == "bf16"
    assert unpriced == [] and read.optimizer_bytes == 2 + 2 + 4
    with pytest.raises(Exception, match="needs --use-precision-aware-optimizer"):
        parse_training_args(["--bf16", "--use-distributed-optimizer", "--main-grads-dtype", "bf16"])
    with pytest.raises(Exception, match="refuses them together"):
        parse_training_args(["--bf16", "--use-distributed-optimizer", "--use-precision-aware-optimizer",
                             "--main-grads-dtype", "bf16", "--accumulate-allreduce-grads-in-fp32"])


def test_offload_states_the_switch_it_implies_once():
    """--optimizer-cpu-offload runs only with the precision-aware optimizer: one description either way."""
    implied = TrainingOptions().with_(optimizer_cpu_offload=True)
    stated = TrainingOptions().with_(optimizer_cpu_offload=True, precision_aware_optimizer=True)
    assert implied == stated and stated.precision_aware_optimizer
    assert training_args(implied, tp=1).count("--use-precision-aware-optimizer") == 1
    assert math.isclose(stated.optimizer_bytes, 12)


def test_the_launch_needs_transformer_engine_whatever_the_implementation():
    """megatron-core's OptimizerConfig asks Transformer Engine's version and imports its FusedAdam
    for the precision-aware optimizer, after the model is built: checked before anything starts."""
    from launch.megatron_versions import VERSIONS
    from launch.preflight import Setup, transformer_engine_problems

    args = ("--transformer-impl", "local", "--use-precision-aware-optimizer")
    setup = Setup(rules=VERSIONS[-1], checkout=None, args=args, cp=1, gpus_per_node=8)
    [line] = transformer_engine_problems(setup, importable=lambda module: False)
    assert "which --use-precision-aware-optimizer needs" in line
    assert transformer_engine_problems(setup, importable=lambda module: True) == []


def test_the_recipe_kept_for_the_masters_is_launched_and_read_back():
    options = TrainingOptions().with_(precision_aware_optimizer=True, fp8_recipe="tensorwise")
    argv = training_args(options, tp=1)
    assert argv[argv.index("--fp8-recipe") + 1] == "tensorwise" and "--fp8-format" not in argv
    assert parse_training_args(argv)[0] == options and options.optimizer_bytes == 4 + 4 + 4
    # without the precision-aware optimizer it does nothing: one description, nothing written
    assert TrainingOptions().with_(fp8_recipe="tensorwise") == TrainingOptions()


def test_an_offloaded_commands_state_dtypes_are_named_and_priced_fp32():
    """Megatron accepts --exp-avg-dtype with --optimizer-cpu-offload and ignores it (its
    HybridDeviceOptimizer is built instead of the precision-aware FusedAdam): read back, it is
    named and priced FP32, where the advisor's own options refuse it."""
    read, unpriced = parse_training_args(["--bf16", "--use-distributed-optimizer", "--use-precision-aware-optimizer",
                                          "--optimizer-cpu-offload", "--exp-avg-dtype", "bf16"])
    assert read.offload.optimizer_cpu_offload and read.optimizer_bytes == 12
    assert unpriced == ["--exp-avg-dtype bf16 (ignored by Megatron with --optimizer-cpu-offload: its "
                        "HybridDeviceOptimizer keeps FP32 states, as priced)"]


def test_the_first_step_makes_the_masters_fusedadam_holds():
    """A fresh run's first iteration lacks what the first optimizer step makes: Adam's moments,
    and, where Transformer Engine's FusedAdam holds them, the masters too (initialize_state runs
    in its first step); megatron-core's own FP32 masters exist from the start."""
    assert TrainingOptions().first_step_bytes == 8
    bf16 = dict(precision_aware_optimizer=True, exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16")
    assert TrainingOptions().with_(**bf16).first_step_bytes == 2 + 2 + 2
    assert TrainingOptions().with_(**bf16, fp8_recipe="tensorwise").first_step_bytes == 2 + 2
