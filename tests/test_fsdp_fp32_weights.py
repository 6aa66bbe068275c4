"""FP32 model weights (no --bf16, no --fp16): the model weight's write after Adam at the weight's
own dtype (``TrainingOptions._weight_write_bytes``, ``terms.optimizer_step_bytes``' weight_write_bytes).

Megatron-FSDP keeps its model-weight buffer in the parameters' dtype (core_v0.15.2
megatron_fsdp/param_and_grad_buffer.py:1812-1834, ``dtype=param_dtype``; core_v0.19.0
:2624-2651), and ``copy_main_weights_to_model_weights`` writes the main weight into it
(``model_param.data.copy_(main_weight...)``, core_v0.15.2 :2524, core_v0.19.0 :3561): 4 bytes an
element for FP32 weights, not a BF16 weight's 2. Megatron's DDP and torch FSDP2 with FP32 weights
step the weights themselves (the distributed optimizer steps a view of each FP32 parameter,
core_v0.15.2 optimizer/distrib_optimizer.py:416-419; FP32Optimizer the parameters): the weight's
read and write are the FP32 master's 8 bytes, and no second write follows.

Hand count, Llama 3.1 70B, TP 4, PP 4, DP 8 (tests/test_grad_cast.py): the heaviest stage holds
P = 4,541,194,240 parameters on a GPU, and Adam steps P / 8 = 567,649,280 of them on a rank.
"""

from __future__ import annotations

import pytest
from test_grad_cast import H100, _optimizer_s  # the same 70B layout and its hand count (P, SHARD there)

from advisor.options import TrainingOptions, parse_training_args, training_args
from advisor.throughput import load_calibration


def test_megatron_fsdp_writes_fp32_weights_at_4_bytes_by_hand():
    """optim_grads_params, FP32 weights, FP32 gradients, FP32 main weights: Adam reads the FP32
    gradient (4), the norm reads it again (4), the copy reads the FP32 main weight (4) and writes
    the FP32 weight (4), the three FP32 states move 8 each (24): 40 bytes an element of the shard
    (a BF16 weight's write, 2, would make it 38); the sharded FP32 gradient buffer is zeroed (4):
    (40 + 4) x 567,649,280 = 24,976,568,320 bytes at the H100's achievable HBM rate."""
    fp32 = TrainingOptions().with_(params_dtype="float32", fsdp_strategy="optim_grads_params")
    assert fp32.step_bytes == 4 + 4 + 4 + 4 + 24
    hbm = load_calibration().hbm_efficiency * H100.hbm_bytes_per_s
    assert _optimizer_s(params_dtype="float32", fsdp_strategy="optim_grads_params") == pytest.approx(
        24_976_568_320 / hbm, rel=1e-9)


@pytest.mark.parametrize("strategy", ["no_shard", "optim", "optim_grads", "optim_grads_params"])
def test_every_strategy_writes_the_fp32_weight(strategy):
    """no_shard copies into the parameter itself (``to_local_if_dtensor(param)``, core_v0.15.2
    :2508, core_v0.19.0 :3509), the others into the FP32 model-weight buffer: 4 + 4 + 4 + 4 + 24 =
    40 every time, 2 more than BF16 weights' 38 (4 + 4 + 4 + 2 + 24)."""
    fsdp = TrainingOptions().with_(fsdp_strategy=strategy)
    assert fsdp.with_(params_dtype="float32").step_bytes == 40
    assert fsdp.step_bytes == 38


def test_fp32_weights_under_a_2_byte_main_weight_buffer():
    """core_v0.19.0's --megatron-fsdp-main-params-dtype bf16 with FP32 weights (FP32 gradients): the
    cast of the FP32 gradient into BF16 (read 4, write 2), Adam reads the BF16 copy (2) and the norm
    again (2), the copy reads the BF16 main weight (2) and writes the FP32 weight (4), the main
    weight moves 2 + 2 and the FP32 moments 8 + 8: 6 + 2 + 2 + 2 + 4 + 4 + 16 = 36."""
    options = TrainingOptions().with_(params_dtype="float32", fsdp_strategy="optim", fsdp_main_params_dtype="bf16")
    assert options.step_bytes == (4 + 2) + 2 + 2 + 2 + 4 + (2 + 2) + 16


def test_ddp_steps_fp32_weights_in_place_by_hand():
    """Megatron's DDP with the distributed optimizer and FP32 weights: Adam reads the FP32
    gradient (4) and the norm again (4), and the three FP32 states move 8 each, the master being
    the weight itself (24): no copy read, no second write, 32 x 567,649,280 = 18,164,776,960; the
    whole FP32 gradient buffer zeroed, 4 x 4,541,194,240 = 18,164,776,960: 36,329,553,920 bytes."""
    assert TrainingOptions().with_(params_dtype="float32").step_bytes == 4 + 4 + 24
    hbm = load_calibration().hbm_efficiency * H100.hbm_bytes_per_s
    assert _optimizer_s(params_dtype="float32") == pytest.approx(36_329_553_920 / hbm, rel=1e-9)


def test_offloaded_fp32_weights():
    """--optimizer-cpu-offload: HybridDeviceOptimizer makes FP32 copies only of weights that are not
    FP32 (``if self.param_update_in_fp32 and param.dtype != torch.float32``,
    cpu_offloading/hybrid_optimizer.py:277), so under Megatron's DDP its GPU share steps the FP32
    weights in place: 4 + 4 (the FP32 gradient twice) + 24 (the states) = 32, no copy back
    (Megatron-FSDP with the offload cannot run: ``advisor.options.training.FSDP_OFFLOAD``). BF16
    weights, for contrast: the FP32 copy read (4) and the BF16 weight written (2) by the step
    post-hook (hybrid_optimizer.py:129-148), 4 + 4 + 4 + 2 + 24 = 38."""
    offload = TrainingOptions().with_(optimizer_cpu_offload=True)
    assert offload.with_(params_dtype="float32").step_bytes == 4 + 4 + 24
    assert offload.step_bytes == 4 + 4 + 4 + 2 + 24


def test_a_command_reaches_fp32_weights_under_megatron_fsdp():
    """No --bf16 and no --fp16 in a Megatron-FSDP command: FP32 weights, priced 40 bytes a step."""
    options, unpriced = parse_training_args(["--use-megatron-fsdp", "--data-parallel-sharding-strategy",
                                             "optim_grads_params", "--use-distributed-optimizer"])
    assert (options.precision.params_dtype, options.step_bytes, unpriced) == ("float32", 40, [])


@pytest.mark.parametrize("tag", ["core_v0.15.2", "core_v0.19.0"])
def test_megatron_takes_fp32_weights_with_megatron_fsdp(tag):
    """The real parse_args/validate_args (launch.megatron_check): the FP32 Megatron-FSDP options as a
    launch writes them are accepted on both releases, with FP32 weights and an FP32 main-weight
    buffer (the copy priced above runs: ``copy_main_weights_to_model_weights`` skips only a group
    without one)."""
    from megatron_real import TINY_MODEL_ARGS as base, checkout, validate

    release = checkout(tag)  # skips without it
    options = TrainingOptions().with_(params_dtype="float32", fsdp_strategy="optim_grads_params")
    args = training_args(options, tp=1)
    assert "--bf16" not in args and "--fp16" not in args
    [result] = validate(release, [{"args": [*base, *args], "world_size": 8, "env": {}}])
    assert result.get("error") is None
    derived = result["derived"]
    assert (derived["params_dtype"], derived["use_megatron_fsdp"], derived["fsdp_main_params_dtype"]) == (
        "float32", True, "float32")


# --- memory: the weight is its own master ---------------------------------------------------

FP32_COMMAND = ("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 16 --hidden-size 2048 --ffn-hidden-size 8192 "
                "--num-attention-heads 32 --group-query-attention --num-query-groups 8 --seq-length 8192 "
                "--max-position-embeddings 131072 --micro-batch-size 1 --global-batch-size 64 "
                "--use-distributed-optimizer --swiglu --normalization RMSNorm --position-embedding-type rope "
                "--untie-embeddings-and-output-weights --disable-bias-linear --vocab-size 128256")
"""Llama 3.2 1B's shape, no --bf16: FP32 weights, on 8 GPUs (DP 8)."""


def test_fp32_weights_keep_8_optimizer_bytes_a_parameter_by_hand(advisor, tmp_path):
    """The distributed optimizer's FP32 shards are views of the FP32 weights (core_v0.15.2
    optimizer/distrib_optimizer.py:416-419, ``shard_model_param = model_param.view(-1)[...]``;
    FP32Optimizer steps the parameters): Adam's two FP32 moments, 8 bytes a parameter, not Eq. 10's
    12 with an FP32 master of its own (the estimate kept 12, while profile show's FP32_OPTIMIZER
    reason already said 8). Parameters by hand: embedding and untied output 2 x 128,256 x 2,048 =
    525,336,576; a layer's QKV 2,048 x (2,048 + 2 x 512) = 6,291,456, projection 4,194,304, MLP
    3 x 2,048 x 8,192 = 50,331,648, two norms 4,096: 60,821,504 x 16 = 973,144,064; the final norm
    2,048: 1,498,482,688. Over DP 8 at 8 bytes: 1,498,482,688 bytes = 1.39557 GiB (12 bytes:
    2.09336 GiB); the BF16 weights' run keeps 12 (their FP32 master is a copy)."""
    command = tmp_path / "train.sh"
    command.write_text(FP32_COMMAND + "\n")
    stage, = advisor.json("estimate", "--from-command", command, "--gpu", "h100-80gb")["stages"]
    assert stage["parameters"] == 525_336_576 + 16 * 60_821_504 + 2_048 == 1_498_482_688
    assert stage["optimizer_gib"] * 2**30 == pytest.approx(8 * 1_498_482_688 / 8, rel=1e-12)
    command.write_text(FP32_COMMAND + " --bf16\n")
    bf16, = advisor.json("estimate", "--from-command", command, "--gpu", "h100-80gb")["stages"]
    assert bf16["optimizer_gib"] * 2**30 == pytest.approx(12 * 1_498_482_688 / 8, rel=1e-12)


def test_the_fp32_weight_as_master_moves_the_same_step_bytes():
    """Memory drops the master, the step does not: the weight is read and written in its place
    (4 + 4), the moments 8 each, the gradient twice: 32, under DDP and torch FSDP2."""
    for changes in ({}, {"torch_fsdp2": True, "distributed_optimizer": False, "overlap_param_gather": False}):
        options = TrainingOptions().with_(params_dtype="float32", **changes)
        assert options.optimizer_bytes == 8 and options.step_bytes == 4 + 4 + 8 + 8 + 8


def test_megatron_fsdp_auto_main_weights_of_fp32_weights_step_them_in_place():
    """core_v0.19.0's --megatron-fsdp-main-params-dtype auto keeps no main-weight buffer: Adam
    steps the model weights, here FP32 (``if mbuf is None: continue``, no copy back). The weight
    read and written (4 + 4), the moments 8 each, the FP32 gradient twice (4 + 4): 32 bytes. It
    was priced as a BF16 weight's read (2) plus an FP32 write of its own (4): 30."""
    options = TrainingOptions().with_(params_dtype="float32", fsdp_strategy="optim_grads_params",
                                      fsdp_main_params_dtype="auto")
    assert options.step_bytes == 4 + 4 + 8 + 8 + 8
    assert options.optimizer_bytes == 8  # the moments; the weights are counted as weights
