"""Optimizer state and gradient bytes, per parameter, for torch's and Megatron's optimizers."""

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install -e '.[megatron]')")

from megatron_hooks.static import (  # noqa: E402
    gradient_bytes, gradient_of, optimizer_bytes_by_parameter, optimizer_tensors, parameter_bytes,
)


def params(*sizes, dtype=torch.float32):
    return [torch.nn.Parameter(torch.zeros(size, dtype=dtype)) for size in sizes]


def stepped(optimizer, parameters):
    for p in parameters:
        p.grad = torch.ones_like(p)
    optimizer.step()
    return optimizer


def test_adam_holds_two_fp32_moments_and_a_step_counter():
    a, b = params(100, (3, 5))
    held = optimizer_bytes_by_parameter(stepped(torch.optim.Adam([a, b]), [a, b]))
    assert held == {id(a): 2 * 100 * 4 + 4, id(b): 2 * 15 * 4 + 4}
    assert parameter_bytes([a, b]) == gradient_bytes([a, b]) == 115 * 4
    assert optimizer_bytes_by_parameter(None) == {}


def test_sgd_with_momentum_and_an_empty_state():
    a, = params(10)
    assert optimizer_bytes_by_parameter(torch.optim.SGD([a], lr=0.1, momentum=0.9)) == {id(a): 0}
    assert optimizer_bytes_by_parameter(stepped(torch.optim.SGD([a], lr=0.1, momentum=0.9), [a])) == {id(a): 40}


def test_megatron_main_grad_is_the_gradient():
    a, = params(8, dtype=torch.bfloat16)
    a.main_grad = torch.zeros(8, dtype=torch.float32)  # Megatron's DDP: FP32 grads in a buffer
    assert gradient_of(a) is a.main_grad and gradient_bytes([a]) == 32


class DistributedOptimizerLayout:
    """The attribute layout of megatron-core's DistributedOptimizer (distrib_optimizer.py),
    which cannot be built on a CPU (it requires torch.cuda tensor types): per group, the model
    parameters this data-parallel rank owns a shard of, and their main shards (FP32 copies for
    BF16 parameters, views of the parameter for FP32 ones), stepped by an inner torch Adam."""

    def __init__(self, bf16, fp32, shard):
        self.model_float16_groups = [bf16]
        self.shard_fp32_from_float16_groups = [[p.detach().view(-1)[shard].clone().float() for p in bf16]]
        self.model_fp32_groups = [fp32]
        self.shard_fp32_groups = [[p.detach().view(-1)[shard] for p in fp32]]
        self.shard_float16_groups = [[p.detach().view(-1)[shard] for p in bf16]]
        mains = self.shard_fp32_from_float16_groups[0] + self.shard_fp32_groups[0]
        self.optimizer = stepped(torch.optim.Adam(mains), mains)


def test_the_distributed_optimizer_counts_this_ranks_shard():
    """A rank owning elements 0..24 of each 100-element parameter holds, for a BF16 parameter,
    the FP32 master shard and two FP32 moments (12 bytes per owned element, seed 004's
    12/(dc)), and for an FP32 parameter only the moments (its shard is a view)."""
    bf16, fp32, elsewhere = params(100, dtype=torch.bfloat16), params(100), params(100)
    layout = DistributedOptimizerLayout(bf16, fp32, slice(0, 25))
    held = optimizer_bytes_by_parameter(layout)
    assert held == {id(bf16[0]): 25 * 12 + 4, id(fp32[0]): 25 * 8 + 4}
    assert id(elsewhere[0]) not in held  # no shard on this rank
    chained = type("ChainedOptimizer", (), {"chained_optimizers": [layout, layout]})()
    assert optimizer_bytes_by_parameter(chained) == {key: 2 * value for key, value in held.items()}
    assert sum(t.numel() * t.element_size() for t in optimizer_tensors(layout)) == 25 * 4 * 2 + 25 * 8 * 2 + 8


def test_the_float16_optimizer_counts_full_fp32_master_copies():
    """megatron-core's Float16OptimizerWithFloat16Params layout (CUDA-only, so the same kind of
    stand-in): full FP32 copies of the BF16 parameters; FP32 parameters are their own mains."""
    bf16, fp32 = params(10, dtype=torch.bfloat16), params(6)
    masters = [p.detach().float() for p in bf16]
    layout = type("Float16OptimizerWithFloat16Params", (), {
        "float16_groups": [bf16], "fp32_from_float16_groups": [masters], "fp32_from_fp32_groups": [fp32],
        "optimizer": stepped(torch.optim.Adam(masters + fp32), masters + fp32)})()
    assert optimizer_bytes_by_parameter(layout) == {id(bf16[0]): 10 * 12 + 4, id(fp32[0]): 6 * 8 + 4}
    wrapped = type("FP32Optimizer", (), {"optimizer": layout.optimizer})()
    assert optimizer_bytes_by_parameter(wrapped) == {id(masters[0]): 10 * 8 + 4, id(fp32[0]): 6 * 8 + 4}


def test_an_unknown_optimizer_is_refused():
    with pytest.raises(TypeError, match="cannot find the parameters of optimizer object"):
        optimizer_bytes_by_parameter(object())
