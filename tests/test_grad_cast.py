"""The gradient cast before Adam (``terms.grad_cast_bytes``), by hand: Megatron-FSDP's, and
Megatron's DDP's (``test_ddp_bf16_gradients_cast_to_fp32_masters_by_hand``).

What megatron-core does, once per step (``finish_grad_sync`` -> ``attach_grad_to_optimizer_state``
-> ``ParamAndGradBuffer.update_main_grads``; core_v0.15.2 megatron_fsdp/param_and_grad_buffer.py
2398-2431, core_v0.19.0 3343-3373): each optimizer parameter gets the main-gradient buffer's slice
of it (``get_item``, a view; the rank's shard, or all of it under no_shard, as many elements as
Adam steps) and, where a main-weight buffer exists and the gradient is not decoupled,
``optimizer_grad.to(param.dtype)`` with ``param`` the main weight. ``Tensor.to`` to the tensor's
own dtype returns the tensor itself: nothing moves. Another dtype: a new tensor, the gradient read
and written again in the main weight's dtype. megatron-core's DistributedOptimizer then copies no
gradient of its own (``_copy_model_grads_to_main_grads`` returns early with Megatron-FSDP,
core_v0.19.0 optimizer/distrib_optimizer.py:2757).

Hand count, Llama 3.1 70B, TP 4, PP 4, DP 8 (tests/test_option_states_70b_by_hand.py): stage 0
holds N = 4,541,186,048 parameters on a GPU; the time model's heaviest stage is the last, N + 8,192
(the final norm) = P = 4,541,194,240, and Adam steps P / 8 = 567,649,280 of them on a rank.

Adam's bytes are per element of that shard (``terms.optimizer_step_bytes``: the gradient read twice,
the BF16 weight written, the master read for that write where a separate copy makes it, the states);
the main-gradient buffer's zeroing is per element of the buffer (``terms.optimizer_time``): all P
under Megatron's DDP and Megatron-FSDP's no_shard and optim, the shard under optim_grads and
optim_grads_params, whose gradient buffer is sharded.
"""

from __future__ import annotations

import pytest

from advisor.hardware import get_gpu
from advisor.models import PRESETS
from advisor.options import TrainingOptions
from advisor.throughput import TimeModel, load_calibration
from advisor.throughput.terms import grad_cast_bytes

N = 4_541_186_048
P = N + 8192
SHARD = 567_649_280  # P / 8
H100 = get_gpu("h100-80gb")
STRATEGIES = ("no_shard", "optim", "optim_grads", "optim_grads_params")


def _optimizer_s(**changes) -> float:
    """The 70B step's optimizer time at TP 4, CP 1, PP 4, DP 8, MBS 1."""
    options = TrainingOptions().with_(**changes)
    model = TimeModel(PRESETS["llama3.1-70b"], H100, 8192, 512, options=options.time_options())
    return float(model.step(4, 1, 4, 8, 1).optimizer_s)


def test_the_shard_by_hand():
    assert SHARD * 8 == P


def test_bf16_gradients_cast_to_fp32_main_weights_by_hand():
    """--grad-dtype bf16 (core 0.15's --grad-reduce-in-bf16, core 0.19's main-gradient dtype 'auto'
    for BF16 weights) with FP32 main weights under optim_grads_params: update_main_grads reads the
    BF16 gradient shard (2 bytes) and writes an FP32 copy (4): 6 bytes. Adam then reads that FP32
    copy (4), the gradient norm reads the copy (4), copy_main_weights_to_model_weights reads the FP32
    main weight (4) and writes the BF16 weight (2), and the three FP32 states move 8 each (24):
    38 + 6 = 44; the BF16 main-gradient buffer, sharded here, is zeroed (2): 46 x 567,649,280 =
    26,111,866,880 bytes at the H100's achievable HBM rate. FP32 gradients into FP32 main weights:
    4 + 4 + 2 + 4 + 24 = 38, no cast, and an FP32 buffer zeroed (4): 42; the difference is
    6 - 2 = 4 x 567,649,280 = 2,270,597,120."""
    hbm = load_calibration().hbm_efficiency * H100.hbm_bytes_per_s
    cast = _optimizer_s(fsdp_strategy="optim_grads_params", grad_reduce_dtype="bf16")
    assert cast == pytest.approx(26_111_866_880 / hbm, rel=1e-9)
    uncast = _optimizer_s(fsdp_strategy="optim_grads_params")  # FP32 gradients into FP32 main weights
    assert cast - uncast == pytest.approx(2_270_597_120 / hbm, rel=1e-9)


# Adam with 2-byte main weights reads the 2-byte cast copy (2), the norm reads the copy (2), the
# copy to the model reads the 2-byte main weight (2) and writes the weight (2), the main weight moves
# 2 + 2 and the FP32 moments 8 + 8; plus the cast, read in the gradients' dtype and written in 2 bytes.
# optim keeps the gradient buffer whole: zeroed in its dtype over all P = 8 x SHARD elements.
@pytest.mark.parametrize("grads, main, step_bytes, zeroed", [
    ("fp32", "bf16", 2 + 2 + 2 + 2 + 4 + 16 + (4 + 2), 4),  # the FP32 gradient cast, an FP32 buffer zeroed
    ("fp32", "fp16", 2 + 2 + 2 + 2 + 4 + 16 + (4 + 2), 4),
    ("bf16", "fp16", 2 + 2 + 2 + 2 + 4 + 16 + (2 + 2), 2),  # BF16 -> FP16 is a cast too, 2 bytes each way
])
def test_core_019_main_weights_take_a_cast_gradient(grads, main, step_bytes, zeroed):
    """core_v0.19.0's --megatron-fsdp-main-params-dtype in another dtype than the main gradients."""
    hbm = load_calibration().hbm_efficiency * H100.hbm_bytes_per_s
    seconds = _optimizer_s(fsdp_strategy="optim", grad_reduce_dtype=grads, fsdp_main_params_dtype=main)
    assert seconds == pytest.approx((step_bytes * SHARD + zeroed * P) / hbm, rel=1e-9)


def test_no_shard_casts_every_parameter():
    """no_shard: Adam steps all P parameters on every rank (``only_shard=False``), and the cast
    with them, and its whole gradient buffer is zeroed: (38 + 6 + 2) x 4,541,194,240 bytes (as
    test_bf16_gradients_cast_to_fp32_main_weights_by_hand)."""
    hbm = load_calibration().hbm_efficiency * H100.hbm_bytes_per_s
    seconds = _optimizer_s(fsdp_strategy="no_shard", grad_reduce_dtype="bf16")
    assert seconds == pytest.approx(46 * P / hbm, rel=1e-9)


# (gradient dtype, weights, main weights, Adam's own bytes by hand). Adam reads the gradient it is
# handed (g) and the gradient norm reads it again (g), copy_main_weights_to_model_weights reads the main
# weight (4 from an FP32 buffer, 2 from a 2-byte one, 0 with none: Adam steps the weight in place) and
# writes the weight in its own dtype (2 for BF16 and FP16, 4 for FP32: the model-weight buffer is the
# parameters' dtype, core_v0.15.2 megatron_fsdp/param_and_grad_buffer.py:1812-1834), and the states move: FP32 moments 8 + 8, the main weight 8 in FP32, 4 in a
# 2-byte buffer (2 + 2), 2 with none ('auto': the BF16 weight read; tests/test_fsdp_dtypes.py). The
# buffer's zeroing is priced over the buffer, apart (``grad_zero_bytes``: g).
NO_OPS = [
    ("fp32", "bfloat16", "fp32", 4 + 4 + (4 + 2) + 8 + 16),  # 38, the default: .to(torch.float32) of an FP32 tensor
    ("bf16", "bfloat16", "bf16", 2 + 2 + (2 + 2) + 4 + 16),  # 28, BF16 into BF16
    ("fp32", "bfloat16", "auto", 4 + 4 + (0 + 2) + 2 + 16),  # 28, no main-weight buffer: nothing to cast to
    ("bf16", "bfloat16", "auto", 2 + 2 + (0 + 2) + 2 + 16),  # 24
    ("fp16", "float16", "fp16", 2 + 2 + (2 + 2) + 4 + 16),   # 28, --fp16 without FP32 accumulation, FP16 main weights
    ("fp16", "float16", "auto", 2 + 2 + (0 + 2) + 2 + 16),   # 24
    ("fp32", "float32", "fp32", 4 + 4 + (4 + 4) + 8 + 16),   # 40, an FP32 run: the copy writes the FP32 weight
]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("grads, weights, main, step_bytes", NO_OPS)
def test_no_op_casts_add_nothing(strategy, grads, weights, main, step_bytes):
    """Where the gradient already has the main weights' dtype, or there is none to cast to, the
    optimizer's bytes are Adam's alone, for every strategy, reading the gradient in its own dtype."""
    changes = dict(fsdp_strategy=strategy, grad_reduce_dtype=grads, params_dtype=weights, fsdp_main_params_dtype=main)
    time = TrainingOptions().with_(**changes).time_options()
    assert time.optimizer_step_bytes == step_bytes
    assert time.grad_zero_bytes == {"fp32": 4, "bf16": 2, "fp16": 2}[grads]


def test_offload_casts_into_its_fp32_copies():
    """--optimizer-cpu-offload (it implies --use-precision-aware-optimizer), under Megatron's DDP:
    Megatron-FSDP with it cannot run (``advisor.options.training.FSDP_OFFLOAD``). Megatron builds
    HybridDeviceOptimizer with ``param_update_in_fp32=True`` (core_v0.15.2 optimizer/__init__.py:348),
    whose GPU share steps FP32 copies handed ``grad.to(fp32_param.dtype)``
    (cpu_offloading/hybrid_optimizer.py:91-93): BF16 gradients read (2) and written in FP32 (4).
    Adam then reads that FP32 copy (4), the norm reads the copy (4), the step post-hook copies the
    FP32 copy back into the weight (read 4, write 2, hybrid_optimizer.py:129-148), FP32 states 24:
    38 + 6 = 44. FP32 gradients: ``.to`` returns the tensor, 4 + 4 + 4 + 2 + 24 = 38. The buffer's
    zeroing is apart (``grad_zero_bytes``)."""
    offload = TrainingOptions().with_(optimizer_cpu_offload=True)
    assert offload.with_(grad_reduce_dtype="bf16").time_options().optimizer_step_bytes == 44
    assert offload.time_options().optimizer_step_bytes == 38


@pytest.mark.parametrize("grads, main", [("fp32", "fp32"), ("bf16", "bf16"), ("fp16", "fp16"),
                                         ("fp32", None), ("bf16", None), ("fp16", None)])
def test_the_term_is_zero_without_a_cast(grads, main):
    assert grad_cast_bytes(grads, main) == 0.0


def test_torch_fsdp2_casts_its_bf16_gradients():
    """torch FSDP2 does not run Megatron-FSDP's update_main_grads, but its gradients are BF16
    whatever --grad-reduce-in-bf16 says (FSDP2 reduces in the weights' dtype: no
    MixedPrecisionPolicy), and Float16OptimizerWithFloat16Params hands Adam
    ``model_param.grad.float()`` (optimizer.py:757-758, core_v0.15.2; tests/test_torch_fsdp2_grads.py
    runs it on FSDP2's own gradients). Per element of the shard: the cast reads 2 and writes 4 (6),
    Adam reads the FP32 copy (4), the norm reads the copy (4), ``_copy_main_params_to_model_params``
    reads the FP32 master (4) and writes the BF16 weight shard (2), three FP32 states 24: 4 + 4 + 4
    + 2 + 24 + 6 = 44, with or without --grad-reduce-in-bf16; no gradient buffer to zero (0:
    TorchFullyShardedDataParallel.zero_grad_buffer is ``pass``, the BF16 gradients are freed,
    ``model_param.grad = None``)."""
    fsdp2 = TrainingOptions().with_(torch_fsdp2=True, distributed_optimizer=False, overlap_param_gather=False)
    assert fsdp2.time_options().optimizer_step_bytes == 44
    assert fsdp2.with_(grad_reduce_dtype="bf16").time_options().optimizer_step_bytes == 44
    assert fsdp2.time_options().grad_zero_bytes == 0
    # an FP32 run: FP32 gradients, FP32Optimizer hands them as they are and steps the weights
    # themselves (no master to copy, no second write: the weight's read and write are the FP32
    # master's 8 of the 24): 4 + 4 + 0 + 0 + 24 = 32
    assert fsdp2.with_(params_dtype="float32").time_options().optimizer_step_bytes == 32


def test_ddp_bf16_gradients_cast_to_fp32_masters_by_hand():
    """Megatron's DDP with --grad-reduce-in-bf16: the distributed optimizer hands Adam
    ``shard_model_grad.float()`` (core_v0.15.2 optimizer/distrib_optimizer.py,
    ``_copy_model_grads_to_main_grads``; core_v0.19.0 the same), a new FP32 tensor from the BF16
    main-gradient shard: 2 + 4 = 6 bytes a parameter of the shard, beside Adam's 4 + 4 + 4 + 2 + 24
    = 38 (the FP32 copy read twice, the FP32 master read and the BF16 weight written by
    ``_copy_main_params_to_model_params``, the states): 44 x 567,649,280 = 24,976,568,320; and the
    whole BF16 buffer zeroed, 2 x 4,541,194,240 = 9,082,388,480: 34,058,956,800 in all. FP32 main
    gradients: ``.float()`` returns the tensor itself, 38 x 567,649,280 = 21,570,672,640, and the
    FP32 buffer zeroed, 4 x 4,541,194,240 = 18,164,776,960: 39,735,449,600."""
    hbm = load_calibration().hbm_efficiency * H100.hbm_bytes_per_s
    cast = _optimizer_s(grad_reduce_dtype="bf16")
    assert cast == pytest.approx(34_058_956_800 / hbm, rel=1e-9)
    assert _optimizer_s() == pytest.approx(39_735_449_600 / hbm, rel=1e-9)


def test_ddp_hands_transformer_engines_adam_the_gradient_uncast():
    """With the precision-aware optimizer keeping its own BF16 master weights
    (``use_precision_aware_optimizer_no_fp8_or_ds_fp8``), the distributed optimizer sets
    ``decoupled_grad = shard_model_grad``, no copy (distrib_optimizer.py, both releases); with FP32
    weights FP32Optimizer hands ``main_grad`` itself (optimizer.py), whatever its dtype."""
    aware = dict(precision_aware_optimizer=True, main_params_dtype="fp16", exp_avg_dtype="bf16",
                 exp_avg_sq_dtype="bf16")
    assert TrainingOptions().with_(**aware, grad_reduce_dtype="bf16")._grad_cast_bytes == 0.0
    assert TrainingOptions().with_(grad_reduce_dtype="bf16")._grad_cast_bytes == 6.0
    assert TrainingOptions().with_(params_dtype="float32")._grad_cast_bytes == 0.0


def test_decoupled_bf16_gradients_are_read_in_bf16():
    """The precision-aware optimizer with its default FP32 masters kept as remainders
    (``_te_holds_masters``): Transformer Engine's FusedAdam reads ``decoupled_grad``, a view of the
    main-gradient shard in its own dtype (distrib_optimizer.py), and so does the gradient norm
    (``get_main_grads_for_grad_norm``: ``param.decoupled_grad``, optimizer.py:149-150 core_v0.15.2).
    States: the remainder 2 + 2 + 2 and two FP32 moments 8 + 8 (22). FusedAdam's kernel writes the
    BF16 weight itself (2; no separate copy, no master read). BF16 main gradients: read 2, norm 2,
    weight 2: 28. FP32 ones: 4 + 4 + 2 + 22 = 32. The buffer zeroed apart, in its dtype."""
    aware = TrainingOptions().with_(precision_aware_optimizer=True)
    assert aware.with_(grad_reduce_dtype="bf16").time_options().optimizer_step_bytes == 28
    assert aware.time_options().optimizer_step_bytes == 32
