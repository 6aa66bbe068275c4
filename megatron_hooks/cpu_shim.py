"""The two patches that let megatron-core's real modules run on a CPU, and nothing more.

megatron-core assumes a CUDA device in two places that a CPU run reaches:

1. ``torch.cuda.current_device()`` names the device of new tensors (the rotary embedding, the
   global memory buffer of the unfused attention, the gradient buffers of Megatron's DDP). On a
   CPU build it raises; the shim makes it return ``"cpu"``.
2. The RNG tracker's ``fork()`` swaps CUDA generator states around dropout regions. The shim
   replaces ``fork`` on the tracker *instance* with a no-op context. Patching the module function
   ``get_cuda_rng_tracker`` would not do: ``dot_product_attention`` calls it through the
   ``tensor_parallel`` package namespace.

Use it as a context manager, or ``install()`` / ``restore()``; ``restore`` puts back exactly
what ``install`` replaced. Do not install it on a machine that runs the model on CUDA.
"""

from __future__ import annotations

import contextlib

import torch

_MISSING = object()


def _no_fork(*args, **kwargs) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


def _cpu_device() -> str:
    return "cpu"


class CpuShim:
    """Patches ``torch.cuda.current_device`` and the RNG tracker's ``fork``; undoes both."""

    def __init__(self) -> None:
        self._saved: list[tuple[object, str, object]] = []

    @property
    def installed(self) -> bool:
        return bool(self._saved)

    def _patch(self, owner: object, name: str, value: object) -> None:
        self._saved.append((owner, name, owner.__dict__.get(name, _MISSING)))
        setattr(owner, name, value)

    def install(self) -> "CpuShim":
        if self.installed:
            raise RuntimeError("the CPU shim is already installed")
        from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

        self._patch(torch.cuda, "current_device", _cpu_device)
        # An instance attribute shadows the class's fork(); restore() deletes it again.
        self._patch(get_cuda_rng_tracker(), "fork", _no_fork)
        return self

    def restore(self) -> None:
        for owner, name, old in reversed(self._saved):
            if old is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, old)
        self._saved.clear()

    def __enter__(self) -> "CpuShim":
        return self.install()

    def __exit__(self, *exc) -> None:
        self.restore()


def needs_shim() -> bool:
    """True on a machine without CUDA, where megatron-core needs the shim."""
    return not torch.cuda.is_available()
