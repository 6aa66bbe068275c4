"""Static memory: the bytes of parameters, gradients and optimizer state that each module holds.

Parameters and gradients count ``numel x element_size`` per tensor, not per storage: Megatron's
DDP keeps all gradients (``param.main_grad``) and, with the distributed optimizer, all
parameters as views of one contiguous buffer, and each view is that parameter's share of it.

Optimizer state is this rank's share, found through the pairs (model parameter, main
parameter) that the optimizer updates:

- a plain ``torch.optim.Optimizer``: the main parameter is the model parameter itself, and its
  state is every tensor in ``optimizer.state[param]`` (Adam: ``exp_avg``, ``exp_avg_sq``, and
  the ``step`` scalar);
- megatron-core's ``DistributedOptimizer``: the FP32 shard of each parameter that this data
  parallel rank owns (``shard_fp32_from_float16_groups`` for BF16/FP16 parameters,
  ``shard_fp32_groups`` for FP32 ones); a parameter with no shard here counts nothing;
- megatron-core's ``Float16OptimizerWithFloat16Params``: the full FP32 master copy
  (``fp32_from_float16_groups``);
- ``FP32Optimizer`` and ``ChainedOptimizer``: what their inner optimizers hold.

A main parameter that is a separate tensor (an FP32 master copy of a BF16 weight) counts as
optimizer state, as in seed 004's 12 bytes per parameter (master weight, momentum, variance);
one that shares the model parameter's storage (an FP32 shard view) does not.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator

import torch


def storage_key(tensor: torch.Tensor) -> int:
    """One key per storage (the address of its ``StorageImpl``), shared by every view of it.
    Not ``data_ptr()``: the fake tensors of the symbolic backend have no data, and all report 0."""
    return untyped_storage_key(tensor.untyped_storage())


def untyped_storage_key(storage: torch.UntypedStorage) -> int:
    """``storage_key`` for a storage already in hand (the saved-tensors hook has it)."""
    return storage._cdata


class SavedStorages:
    """The storages autograd saved during one forward pass, each once, under the label of its
    first saver, and which of them are still kept.

    A storage is known by its address (``storage_key``), which a later storage can take once
    the first is freed: a tensor saved by an autograd node that dies during the forward pass (a
    branch whose output is not used) is freed with it, and its address can come back for a new
    storage that must count anew. So each storage is remembered with weak references to the
    tensor objects saved from it (a saved-tensors hook that returns the tensor keeps that object
    alive as long as its node): a known address whose saved tensors are all gone is a new
    storage, and ``kept()`` counts only what is still alive."""

    __slots__ = ("entries",)

    def __init__(self) -> None:
        self.entries: dict[int, tuple[object, int, list[weakref.ref]]] = {}

    def add(self, tensor: torch.Tensor, key: int, label: object, nbytes: int) -> bool:
        """Remember ``tensor`` (storage ``key`` of ``nbytes``); True if its storage is new here."""
        known = self.entries.get(key)
        if known is not None and any(ref() is not None for ref in known[2]):
            known[2].append(weakref.ref(tensor))
            return False
        self.entries[key] = (label, nbytes, [weakref.ref(tensor)])
        return True

    def kept(self) -> dict:
        """Bytes per label of the saved storages still alive."""
        counted: dict = {}
        for label, nbytes, refs in self.entries.values():
            if any(ref() is not None for ref in refs):
                counted[label] = counted.get(label, 0) + nbytes
        return counted


def tensor_bytes(tensor: torch.Tensor | None) -> int:
    return 0 if tensor is None else tensor.numel() * tensor.element_size()


def gradient_of(param: torch.nn.Parameter) -> torch.Tensor | None:
    """Megatron's DDP accumulates into ``main_grad``; plain torch into ``grad``."""
    main_grad = getattr(param, "main_grad", None)
    return main_grad if main_grad is not None else param.grad


def parameter_bytes(params: Iterable[torch.nn.Parameter]) -> int:
    return sum(tensor_bytes(p) for p in params)


def gradient_bytes(params: Iterable[torch.nn.Parameter]) -> int:
    return sum(tensor_bytes(gradient_of(p)) for p in params)


def _zip_groups(model_groups, main_groups, inner) -> Iterator[tuple]:
    for model_group, main_group in zip(model_groups, main_groups, strict=True):
        for model_param, main_param in zip(model_group, main_group, strict=True):
            yield model_param, main_param, inner


def main_parameter_pairs(optimizer) -> Iterator[tuple[torch.Tensor, torch.Tensor | None, torch.optim.Optimizer]]:
    """(model parameter, the tensor the optimizer updates for it, the torch optimizer holding its state)."""
    if optimizer is None:
        return
    if isinstance(optimizer, torch.optim.Optimizer):
        for group in optimizer.param_groups:
            for param in group["params"]:
                yield param, param, optimizer
    elif hasattr(optimizer, "chained_optimizers"):
        for inner in optimizer.chained_optimizers:
            yield from main_parameter_pairs(inner)
    elif hasattr(optimizer, "shard_fp32_from_float16_groups"):  # DistributedOptimizer
        yield from _zip_groups(optimizer.model_float16_groups, optimizer.shard_fp32_from_float16_groups,
                               optimizer.optimizer)
        yield from _zip_groups(optimizer.model_fp32_groups, optimizer.shard_fp32_groups, optimizer.optimizer)
    elif hasattr(optimizer, "fp32_from_float16_groups"):  # Float16OptimizerWithFloat16Params
        yield from _zip_groups(optimizer.float16_groups, optimizer.fp32_from_float16_groups, optimizer.optimizer)
        for group in optimizer.fp32_from_fp32_groups:
            for param in group:
                yield param, param, optimizer.optimizer
    elif hasattr(optimizer, "optimizer"):  # FP32Optimizer and other wrappers
        yield from main_parameter_pairs(optimizer.optimizer)
    else:
        raise TypeError(f"cannot find the parameters of optimizer {type(optimizer).__name__}")


def _state_tensors(inner: torch.optim.Optimizer, main: torch.Tensor) -> Iterator[torch.Tensor]:
    for value in inner.state.get(main, {}).values():
        if isinstance(value, torch.Tensor):
            yield value


def optimizer_bytes_by_parameter(optimizer) -> dict[int, int]:
    """id(model parameter) -> bytes of optimizer state held on this rank for it."""
    held: dict[int, int] = {}
    for model_param, main_param, inner in main_parameter_pairs(optimizer):
        if main_param is None:  # a precision-aware optimizer keeps main params inside itself
            continue
        total = sum(tensor_bytes(t) for t in _state_tensors(inner, main_param))
        if storage_key(main_param) != storage_key(model_param):
            total += tensor_bytes(main_param)
        held[id(model_param)] = held.get(id(model_param), 0) + total
    return held


def optimizer_tensors(optimizer) -> Iterator[torch.Tensor]:
    """Every tensor the optimizer holds (main parameters and state), for the CPU tracker."""
    for _, main_param, inner in main_parameter_pairs(optimizer):
        if main_param is not None:
            yield main_param
            yield from _state_tensors(inner, main_param)
