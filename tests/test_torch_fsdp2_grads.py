"""torch FSDP2's gradients as Megatron runs it (--use-torch-fsdp2), observed on two gloo processes:
what the advisor prices for them (advisor.memory_levers.SHARDING, TrainingOptions._step_gradient).

megatron-core's ``TorchFullyShardedDataParallel`` calls ``fully_shard(module, mesh=..., reshard_after_forward=...)``
on each transformer layer (and the embedding, RoPE, output layer) and on the root, with no
``mp_policy`` (core_v0.15.2 distributed/torch_fully_sharded_data_parallel.py:82-85, 134, 146; the
same in core_v0.19.0), so FSDP2 reduces in the gradients' own dtype, the weights'
(``foreach_reduce``: ``reduce_dtype = reduce_dtype or grad_dtype``). Megatron-LM runs it without the
distributed optimizer, so its BF16 weights get Float16OptimizerWithFloat16Params: an FP32 main
weight ``param.detach().clone().float()`` of each (sharded) parameter (optimizer.py:670 core_v0.15.2,
:1012 core_v0.19.0) and, before the step, ``main_param.grad = model_param.grad.float()`` (the
parameter has no ``main_grad``: no Megatron gradient buffer), ``model_param.grad = None``.

Here: a two-layer BF16 model wrapped as Megatron wraps it, two microbatches' backward (Megatron
reduce-scatters every microbatch: no ``no_sync`` for FSDP2), then megatron-core's own
``_copy_model_grads_to_main_grads`` (the installed megatron-core's, whose source is the checkouts'
text: asserted below) on FP32 clones of the shards.
"""

import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install -e '.[megatron]')")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from two_ranks import run_two_ranks  # noqa: E402

CHECKOUTS = Path(os.environ.get("MEGATRON_LM_CHECKOUTS", "/work/shared/megatron-lm"))


def _rank(rank: int, init_file: str) -> None:
    """One of two data-parallel ranks; exits 0 when every check holds (an AssertionError exits 1)."""
    import types

    from megatron.core.optimizer.optimizer import Float16OptimizerWithFloat16Params
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    os.environ["OMP_NUM_THREADS"] = "1"
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16, bias=False), torch.nn.Linear(16, 8, bias=False))
        model = model.to(torch.bfloat16)
        mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
        for layer in model:  # as TorchFullyShardedDataParallel: mesh and reshard_after_forward only
            fully_shard(layer, mesh=mesh, reshard_after_forward=True)
        fully_shard(model, mesh=mesh, reshard_after_forward=True)
        torch.manual_seed(1 + rank)
        for _ in range(2):  # two microbatches: the second accumulates into the sharded gradient
            model(torch.randn(4, 8, dtype=torch.bfloat16)).float().sum().backward()
        params = list(model.parameters())
        for param in params:
            grad = param.grad
            # BF16, sharded over the two ranks: half of each weight's rows, as its weight shard
            assert isinstance(grad, DTensor) and grad.dtype == torch.bfloat16, (type(grad), grad.dtype)
            assert grad._local_tensor.shape == param._local_tensor.shape
            assert grad._local_tensor.numel() * 2 == param.numel()
            assert not hasattr(param, "main_grad")  # no Megatron gradient buffer
        mains = [param.detach().clone().float() for param in params]  # optimizer.py:670's master
        fake = types.SimpleNamespace(float16_groups=[params], fp32_from_float16_groups=[mains],
                                     fp32_from_fp32_groups=[])
        Float16OptimizerWithFloat16Params._copy_model_grads_to_main_grads(fake)
        for param, main in zip(params, mains):
            # the BF16 gradient freed, an FP32 copy of the shard handed to Adam: 2 bytes read, 4 written
            assert param.grad is None
            assert main.grad.dtype == torch.float32 and main.grad._local_tensor.numel() * 2 == param.numel()
    finally:
        dist.destroy_process_group()
    sys.exit(0)


def test_megatron_copies_its_own_function_in_both_checkouts():
    """The copy run below is the installed megatron-core's; both checkouts have the same text."""
    import inspect

    from megatron.core.optimizer.optimizer import Float16OptimizerWithFloat16Params

    source = inspect.getsource(Float16OptimizerWithFloat16Params._copy_model_grads_to_main_grads)
    assert "main_param.grad = model_param.grad.float()" in source
    for release in ("core_v0.15.2", "core_v0.19.0"):
        path = CHECKOUTS / release / "megatron/core/optimizer/optimizer.py"
        if not path.exists():
            pytest.skip(f"no Megatron-LM checkout at {path}")
        assert source in path.read_text()


def test_fsdp2_gradients_are_bf16_shards_and_the_optimizer_casts_them(tmp_path):
    """The advisor's torch FSDP2 prices: BF16 sharded gradients, 2 / (DP x CP) bytes a parameter
    (``TrainingOptions.memory_options``: gradient_bytes = the weights'), and an FP32 copy made before
    Adam, 2 + 4 bytes an element of the shard (``_step_gradient``: ('bf16', 'fp32'))."""
    from advisor.options import TrainingOptions

    fsdp2 = TrainingOptions().with_(torch_fsdp2=True, distributed_optimizer=False, overlap_param_gather=False)
    assert fsdp2.memory_options().gradient_bytes == 2 and fsdp2._step_gradient == ("bf16", "fp32")
    run_two_ranks(_rank, __name__, str(tmp_path / "init"))
