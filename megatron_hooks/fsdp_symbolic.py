"""Megatron-FSDP's real buffers on the symbolic backend: megatron-core's
``FullyShardedDataParallel`` (``--use-megatron-fsdp``) and its distributed optimizer built around
a real Llama stage under ``FakeTensorMode`` and torch's fake process group, as rank 0 of a
DP-rank world, and the bytes each buffer holds: ``measure_fsdp``. ``tests/test_symbolic_fsdp.py``
compares them with the advisor's analytic terms (``advisor.memory_levers``).

What is measured, each from megatron-core's own objects (``megatron/core/distributed/fsdp/src/
megatron_fsdp/param_and_grad_buffer.py``, ``ParamAndGradBuffer.parameter_groups``):
- ``model_weight_buffer`` (the BF16 weights; sharded under optim_grads_params),
  ``main_weight_buffer`` (the FP32 master weights), ``main_grad_buffer`` (the FP32 gradients);
- the Adam states, after megatron-core's own ``DistributedOptimizer
  ._init_optimizer_states_with_dummy_values`` (the step it takes before loading a checkpoint);
- the unsharded bucket of one FSDP unit (a transformer layer), fetched as the all-gather
  (weights) and the reduce-scatter (gradients) fetch it: ``DataParallelBuffer.fetch_bucket``.

``measure_grad_cast`` runs megatron-core's own ``ParamAndGradBuffer.update_main_grads`` and
reads whether the optimizer's gradients are views of the main-gradient buffer or copies.

Not measured: how many units are gathered or queued at once (the prefetch budget and the
reduce-scatter queue are constants of ``megatron_fsdp.py``, read into ``advisor.memory_levers``),
which needs the forward and backward hooks on CUDA streams.

FP8 cannot be built here: megatron-core's FP8 layers are Transformer Engine's, and
``import transformer_engine.pytorch`` fails on this machine (``ModuleNotFoundError: No module
named 'transformer_engine'``; Transformer Engine builds only against CUDA).

Megatron-FSDP expects a CUDA device; a few of its steps are replaced while a measurement runs
(``_fsdp_on_fake_tensors``), each because a fake CPU tensor stands for a CUDA one.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from dataclasses import dataclass
from typing import Iterator

import torch

FSDP_STRATEGIES = ("optim", "optim_grads", "optim_grads_params")
"""The sharding strategies measured (no_shard keeps megatron-core's DDP layout in Megatron-FSDP's
buffers and is not measured here)."""


@dataclass(frozen=True)
class FsdpMeasurement:
    """Bytes on one rank of a Megatron-FSDP stage (rank 0 of DP), from megatron-core's objects."""

    strategy: str
    dp: int
    parameters: int
    """The stage's parameters on this rank, unsharded (sum of ``numel`` over the module)."""
    weights: int
    """``model_weight_buffer``: the model's weights (BF16), a shard under optim_grads_params."""
    main_weights: int
    """``main_weight_buffer``: the FP32 master weights."""
    gradients: int
    """``main_grad_buffer``: the gradients, in the gradient reduction dtype."""
    adam_states: int
    """Momentum and variance of the optimizer's (sharded) parameters."""
    unit_weights: int
    """The unsharded weight bucket of the last FSDP unit (what its all-gather fills); 0 when the
    weights are not sharded (no temporary bucket is made)."""
    unit_gradients: int
    """The unsharded gradient bucket of the last FSDP unit (what its reduce-scatter reads); 0
    when the gradients are not sharded."""

    @property
    def optimizer(self) -> int:
        """Master weights and Adam states: the advisor's 12 bytes per parameter."""
        return self.main_weights + self.adam_states


def measure_fsdp(spec, *, layers: int, strategy: str, dp: int, grad_reduce_in_fp32: bool = True,
                 seq_len: int = 1024) -> FsdpMeasurement:
    """Build ``layers`` decoder layers of ``spec`` (a middle stage: no embedding, no head) in BF16
    with Megatron-FSDP ``strategy`` over ``dp`` fake ranks, and measure rank 0's buffers."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from megatron_hooks.model import build_gpt_model
    from megatron_hooks.symbolic import fake_world

    if strategy not in FSDP_STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(FSDP_STRATEGIES)}, got {strategy!r}")
    with fake_world(1, 1, dp, 0), FakeTensorMode(allow_non_fake_inputs=True):
        model = build_gpt_model(spec, seq_len=seq_len, layers=range(1, layers + 1), pre_process=False,
                                post_process=False, params_dtype=torch.bfloat16, use_cpu_initialization=True)
        parameters = sum(p.numel() for p in model.parameters())
        with _fsdp_on_fake_tensors():
            return _measure(model, parameters, strategy, dp, grad_reduce_in_fp32)


def _measure(model, parameters: int, strategy: str, dp: int, grad_reduce_in_fp32: bool) -> FsdpMeasurement:
    """Rank 0's buffers of ``model`` wrapped in Megatron-FSDP (inside the fake world)."""
    fsdp, optimizer = _megatron_fsdp_and_optimizer(model, strategy, grad_reduce_in_fp32, dp)
    groups = fsdp.param_and_grad_buffer.parameter_groups
    optimizer._init_optimizer_states_with_dummy_values()
    last = groups[-1]
    return FsdpMeasurement(
        strategy=strategy, dp=dp, parameters=parameters,
        weights=sum(_bytes(g.model_weight_buffer) for g in groups),
        main_weights=sum(_bytes(g.main_weight_buffer) for g in groups),
        gradients=sum(_bytes(g.main_grad_buffer) for g in groups),
        adam_states=sum(_nbytes(value) for state in optimizer.optimizer.state.values()
                        for value in state.values() if torch.is_tensor(value) and value.dim() > 0),
        unit_weights=_bucket_bytes(last.model_weight_buffer),
        unit_gradients=_bucket_bytes(last.main_grad_buffer),
    )


@dataclass(frozen=True)
class GradCast:
    """What Megatron-FSDP's ``update_main_grads`` (``finish_grad_sync`` before each optimizer
    step) hands rank 0's optimizer: its gradient elements, and the bytes read and written where a
    gradient is a copy, not a view of the main-gradient buffer (``optimizer_grad.to(param.dtype)``
    into the main weight's dtype): each element read at the buffer's size, written at the copy's."""

    elements: int
    """The optimizer's gradient elements on this rank (its parameter shard)."""
    copied_bytes: int
    """Bytes read and written by the copies; 0 where every gradient shares the buffer's storage."""


def measure_grad_cast(spec, *, layers: int, strategy: str, dp: int, grad_reduce_in_fp32: bool) -> GradCast:
    """Build ``layers`` decoder layers as ``measure_fsdp`` does, run megatron-core's own
    ``ParamAndGradBuffer.update_main_grads`` and read what the optimizer's parameters got."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from megatron_hooks.model import build_gpt_model
    from megatron_hooks.symbolic import fake_world

    with fake_world(1, 1, dp, 0), FakeTensorMode(allow_non_fake_inputs=True):
        model = build_gpt_model(spec, seq_len=1024, layers=range(1, layers + 1), pre_process=False,
                                post_process=False, params_dtype=torch.bfloat16, use_cpu_initialization=True)
        with _fsdp_on_fake_tensors():
            buffer = _megatron_fsdp_and_optimizer(model, strategy, grad_reduce_in_fp32, dp)[0].param_and_grad_buffer
            buffer.update_main_grads()
            elements = copied = 0
            for _, param in buffer.optimizer_named_parameters:
                if param.grad is None:  # no element of this parameter in rank 0's shard
                    continue
                grad = _local(param.grad)
                source = buffer.parameter_groups[buffer.param_to_param_group[param.orig_param]].main_grad_buffer.data
                elements += grad.numel()
                if grad.untyped_storage()._cdata != source.untyped_storage()._cdata:
                    copied += grad.numel() * (source.element_size() + grad.element_size())
    return GradCast(elements=elements, copied_bytes=copied)


def _megatron_fsdp_and_optimizer(model, strategy: str, grad_reduce_in_fp32: bool, dp: int):
    """megatron-core's Megatron-FSDP wrapper and optimizer, as Megatron-LM's
    ``setup_model_and_optimizer`` builds them with --use-megatron-fsdp
    --data-parallel-sharding-strategy STRATEGY --use-distributed-optimizer --bf16."""
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.distributed.fsdp.mcore_fsdp_adapter import FullyShardedDataParallel
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=grad_reduce_in_fp32, use_distributed_optimizer=True, use_megatron_fsdp=True,
        data_parallel_sharding_strategy=strategy, overlap_grad_reduce=True, overlap_param_gather=True,
        # Megatron-LM's default with --overlap-grad-reduce (training.py, get_model).
        bucket_size=max(40_000_000, 1_000_000 * dp))
    fsdp = FullyShardedDataParallel(model.config, ddp_config, model, device=torch.device("cpu"))
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=1e-4, bf16=True, params_dtype=torch.bfloat16,
                        use_distributed_optimizer=True),
        [fsdp], use_gloo_process_groups=False)
    return fsdp, optimizer


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return getattr(tensor, "_local_tensor", tensor)  # a DTensor's shard on this rank


def _nbytes(tensor: torch.Tensor) -> int:
    tensor = _local(tensor)
    return tensor.numel() * tensor.element_size()


def _bytes(buffer) -> int:
    return 0 if buffer is None or buffer.data is None else _nbytes(buffer.data)


def _bucket_bytes(buffer) -> int:
    if buffer is None or not buffer.is_data_distributed:
        return 0
    return _nbytes(buffer.fetch_bucket().data)


class _NoStream:
    """A stand-in for ``torch.cuda.Stream``: Megatron-FSDP makes side streams for its copies and
    collectives; fake tensors run no kernels, so there is nothing to order."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def wait_stream(self, stream) -> None:
        pass

    def synchronize(self) -> None:
        pass


@contextlib.contextmanager
def _fsdp_on_fake_tensors() -> Iterator[None]:
    """Megatron-FSDP on fake CPU tensors; every replacement undone on exit:
    - the device meshes are made on the CPU (``DeviceMesh.from_group(device_type="cuda")`` in
      ``mcore_fsdp_adapter._init_dist_index``) from the fake process groups' real rank lists,
      with fake mode off for the mesh's own small index tensors (their values are read);
    - ``torch.cuda.current_device`` is 0 (the CPU shim's "cpu" would make "cuda:cpu") and
      ``torch.cuda.Stream`` a stand-in; ``Module.to`` leaves the (already CPU) fake model as it
      is (torch refuses to swap fake parameters in place);
    - ``validate_uneven_dtensor`` is skipped: it all-gathers shard offsets and checks their
      values, which fake collectives do not carry."""
    import megatron.core.distributed.fsdp.mcore_fsdp_adapter as adapter
    import megatron.core.distributed.fsdp.src.megatron_fsdp.param_and_grad_buffer as buffers
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh

    from megatron_hooks.symbolic import replacing

    def real(function):
        @functools.wraps(function)
        def outside_fake_mode(*args, **kwargs):
            with unset_fake_temporarily():
                return function(*args, **kwargs)
        return outside_fake_mode

    from_group = DeviceMesh.from_group
    replaced = [(adapter.FullyShardedDataParallel, "_init_dist_index",
                 real(adapter.FullyShardedDataParallel._init_dist_index)),
                (DeviceMesh, "from_group",
                 staticmethod(lambda *args, device_type="cuda", **kwargs: from_group(*args, device_type="cpu", **kwargs))),
                (buffers, "validate_uneven_dtensor", lambda tensor: None),
                (torch.cuda, "Stream", _NoStream), (torch.cuda, "current_device", lambda: 0),
                (torch.nn.Module, "to", lambda self, *args, **kwargs: self)]
    for name, value in vars(DeviceMesh).items():
        if isinstance(value, property):
            replaced.append((DeviceMesh, name, property(real(value.fget))))
        elif inspect.isfunction(value) and name not in ("__init__", "from_group"):
            replaced.append((DeviceMesh, name, real(value)))
    with replacing(replaced):
        yield
