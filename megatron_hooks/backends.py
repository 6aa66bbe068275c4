"""Where the memory numbers come from: CUDA's allocator statistics, or a tracker of live CPU storages.

Both backends answer the same questions, which is all the layer hooks ask:

- ``allocated()``: bytes of tensor memory in use now;
- ``peak()``: the most bytes in use since the last ``reset_peak()``;
- ``peak_reserved()`` and ``alloc_retries()``: the allocator's reserved peak since the last
  reset and its cumulative count of retries after a failed allocation (None on the CPU, which
  has neither);
- ``clock()`` and ``seconds(start, end)``: a time mark now (a recorded CUDA event on a GPU,
  which times the device's work without synchronising; ``time.perf_counter()`` on the CPU) and
  the seconds between two marks, read once the iteration's work is done (``synchronize()``).

The symbolic backend (``megatron_hooks/symbolic.py``) is the CPU tracker over meta tensors,
with no clock: nothing is computed, so there is nothing to time.

``select_backend(device)`` picks one from the device that holds the model: CUDA when the
parameters are on a CUDA device, the CPU tracker otherwise.

**CUDA** (``CudaBackend``) reads ``torch.cuda.memory_allocated``, ``max_memory_allocated``,
``max_memory_reserved`` and ``memory_stats()["num_alloc_retries"]`` and resets the peaks with
``torch.cuda.reset_peak_memory_stats``. These are host-side counters of the caching
allocator: reading them does not synchronise the device.

**CPU** (``CpuBackend``) has no allocator statistics to read, so it follows tensor storages
itself, as ``torch.distributed._tools.mem_tracker.MemTracker`` does: a ``TorchDispatchMode``
sees the result of every aten op, adds each new storage's ``nbytes()`` when it first appears
and subtracts it when the storage is freed (a weak reference to the storage, which torch keeps
alive exactly as long as its C++ ``StorageImpl``). We do not use ``MemTracker`` itself: it
refuses a root module that runs more than once between resets, which every schedule with
several microbatches does; it attributes memory by module nesting, where the profile needs one
flat region per layer; and it snapshots every module's memory by category at every op, which
made a training step 1.5 times as long in ``benchmarks/bench_hooks.py`` (8 layers, hidden 512).
The tracker below keeps only the running total and its peak, and skips ops whose results alias
an input (views, in-place and ``out=`` ops), so its cost is one Python call per aten op.
Tensors that existed before tracking began are counted once ``track()`` is given them (the
hooks pass parameters, gradients, optimizer states, buffers and each microbatch's inputs).

A storage is counted until it is freed, wherever that happens, so a tensor freed at a moment that
depends on thread scheduling makes the count differ between identical runs. Collectives did that:
gloo's worker thread holds the tensors of an all-reduce until its work object dies, after the
caller's ``wait()`` has returned, so when the program had dropped its own reference (megatron-core's
row-parallel output after the residual add, its cross entropy's [s, b] sums) the storage died in
the worker thread a little later or a lot later. On a loaded machine the two TP ranks of one run
disagreed by a [s, b] tensor (256 bytes in the tiny test model: the flaky
``test_tp2_halves_everything_megatron_splits``) and runs of a campaign by a [s, b, h] one (up to
64 KiB). The tracker therefore runs every c10d collective on untracked copies of its tensors, waits
for it, and copies the results back in place: the communication thread holds only the copies, and
the program's tensors live exactly as long as the program keeps them, as the CUDA caching
allocator counts a tensor that NCCL reduces in place. The symbolic backend runs them on the tensors
themselves: torch's fake process group has no thread and keeps no tensor.

Point-to-point ops (``send``, ``recv_``, ``recv_any_source_``: pipeline parallelism) go through
untouched. Their tensors are not held by a worker thread (the work object holds them, and the
caller drops it after its own ``wait()``), and they cannot be waited for here: gloo counts
completions on a send or receive buffer, so the caller's second ``wait()`` on the same work waits
for a second message that never comes, and every PP >= 2 run hung at its first send.
"""

from __future__ import annotations

import time
import weakref
from typing import Iterable, Literal, Protocol

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from advisor.errors import AdvisorError


class MemoryBackend(Protocol):
    name: Literal["cuda", "cpu", "symbolic"]
    device: str
    kernels: Literal["cuda", "cpu"]
    """Whose kernels the measured run executes (the profile header's ``kernels``)."""

    def start(self) -> None:
        """Begin measuring (called when an iteration begins)."""

    def synchronize(self) -> None:
        """Wait for the device, so that a wall time covers the work."""

    def stop(self) -> None:
        """Stop measuring (called when an iteration ends or fails)."""

    def track(self, tensors: Iterable[torch.Tensor]) -> None:
        """Count tensors that were allocated before measuring began."""

    def allocated(self) -> int: ...

    def peak(self) -> int: ...

    def reset_peak(self) -> None: ...

    def peak_reserved(self) -> int | None: ...

    def alloc_retries(self) -> int | None: ...

    def clock(self) -> object | None:
        """A time mark now (None: this backend does not time)."""

    def seconds(self, start, end) -> float:
        """Seconds between two marks of ``clock()``, after ``synchronize()``."""


class CudaBackend:
    """torch.cuda's caching-allocator statistics for one device."""

    name: Literal["cuda"] = "cuda"
    kernels: Literal["cuda"] = "cuda"

    def __init__(self, device: torch.device | int | str) -> None:
        self._device = torch.device(device)
        if self._device.type != "cuda":
            raise ValueError(f"CudaBackend needs a CUDA device, got {self._device}")
        self.device = str(self._device)

    def start(self) -> None:
        self.device = f"{self._device} ({torch.cuda.get_device_name(self._device)})"

    def stop(self) -> None:
        pass

    def synchronize(self) -> None:
        torch.cuda.synchronize(self._device)

    def track(self, tensors: Iterable[torch.Tensor]) -> None:
        pass  # the allocator already counts every tensor on the device

    def allocated(self) -> int:
        return torch.cuda.memory_allocated(self._device)

    def peak(self) -> int:
        return torch.cuda.max_memory_allocated(self._device)

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self._device)

    def peak_reserved(self) -> int | None:
        return torch.cuda.max_memory_reserved(self._device)

    def alloc_retries(self) -> int | None:
        return int(torch.cuda.memory_stats(self._device).get("num_alloc_retries", 0))

    def clock(self) -> torch.cuda.Event:
        # An event on the current stream: the hooks of the backward pass run on the autograd
        # engine's thread, whose current stream is the one the backward kernels run on.
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        return start.elapsed_time(end) / 1000.0


# aten op -> whether its results are fresh storages (not aliases of an input); computed once.
_FRESH_RESULTS: dict[object, bool] = {}


def _returns_fresh_storage(func) -> bool:
    fresh = _FRESH_RESULTS.get(func)
    if fresh is None:
        fresh = _FRESH_RESULTS[func] = all(ret.alias_info is None for ret in func._schema.returns)
    return fresh


class StorageTracker(TorchDispatchMode):
    """Bytes of live CPU tensor storages that this mode has seen, and their peak; with a limit,
    an op whose results take the bytes above it raises ``torch.OutOfMemoryError``."""

    def __init__(self, limit: int | None = None) -> None:
        super().__init__()
        self.live: dict[int, weakref.ref] = {}
        self.current = 0
        self.peak = 0
        self.limit = limit
        self.collectives_on_copies = True
        """c10d collectives run on untracked copies (module docstring); off under the symbolic
        backend, whose fake process group has no thread to hold a tensor."""
        self.uncounted: frozenset = frozenset()
        """Ops whose results are not counted (the symbolic backend's wrapped Python numbers)."""

    def add(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = id(storage)
        if key in self.live:
            return
        nbytes = storage.nbytes()
        self.live[key] = weakref.ref(storage, self._release(key, nbytes))
        self.current += nbytes
        if self.current > self.peak:
            self.peak = self.current

    def _release(self, key: int, nbytes: int):
        def release(_ref) -> None:
            if self.live.pop(key, None) is not None:
                self.current -= nbytes
        return release

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "c10d" and func._opname not in _POINT_TO_POINT:
            if self.collectives_on_copies:
                return _collective_on_copies(func, args, kwargs)
            return _waited(func(*args, **kwargs))
        out = func(*args, **kwargs)
        if _returns_fresh_storage(func) and func not in self.uncounted:
            if isinstance(out, torch.Tensor):
                self.add(out)
            elif isinstance(out, (tuple, list)):
                for item in out:
                    if isinstance(item, torch.Tensor):
                        self.add(item)
            if self.limit is not None and self.current > self.limit:
                # What the CUDA caching allocator raises when a device is full; the results
                # are dropped with the exception, as a failed allocation never existed.
                raise torch.OutOfMemoryError(
                    f"emulated out of memory: {func} needs {self.current} bytes in all; the emulated device "
                    f"has {self.limit} (memory limit)"
                )
        return out


_POINT_TO_POINT = frozenset({"send", "recv_", "recv_any_source_"})
"""c10d ops that the tracker passes through (module docstring)."""


def _lend(value, lent: dict):
    """``value`` with each tensor replaced by a copy; ``lent`` maps id(copy) -> (tensor, copy)."""
    if isinstance(value, torch.Tensor):
        copy = value.detach().clone()
        lent[id(copy)] = (value, copy)
        return copy
    if isinstance(value, (list, tuple)):
        return type(value)(_lend(item, lent) for item in value)
    return value


def _give_back(value, lent: dict):
    """``value`` with each copy replaced by the tensor it was made from."""
    if isinstance(value, torch.Tensor):
        return lent.get(id(value), (value,))[0]
    if isinstance(value, (list, tuple)):
        return type(value)(_give_back(item, lent) for item in value)
    return value


def _waited(out):
    """A c10d op's result, its work handles waited for."""
    for item in out if isinstance(out, (list, tuple)) else (out,):
        if hasattr(item, "wait") and not isinstance(item, torch.Tensor):
            item.wait()
    return out


def _collective_on_copies(func, args: tuple, kwargs: dict):
    """Run the c10d op ``func`` on copies of its tensor arguments (made inside the dispatch handler,
    so untracked), wait for it, copy every argument back into the caller's tensor, and return its
    result with the caller's tensors in place of the copies (see the module docstring). No closure
    over the tensors: a reference cycle would keep them until the next garbage collection, which
    the emulator runs only between iterations."""
    lent: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    out = _waited(func(*_lend(args, lent), **{key: _lend(value, lent) for key, value in kwargs.items()}))
    for original, copy in lent.values():  # c10d schemas do not mark what they write: all of it
        original.copy_(copy)
    try:
        return _give_back(out, lent)
    finally:
        lent.clear()


class CpuBackend:
    """Live CPU tensor storages, followed with a dispatch mode while an iteration runs.

    ``memory_limit`` (bytes) emulates a GPU of that size: an aten op whose results take the
    tracked bytes above it raises ``torch.OutOfMemoryError``, as CUDA's allocator would (tensors
    counted by ``track`` never raise; a full device shows at the next op). For provoking and
    testing out-of-memory outcomes on a CPU; it has no fragmentation or reserved memory."""

    name: Literal["cpu", "symbolic"] = "cpu"
    device = "cpu"
    kernels: Literal["cuda", "cpu"] = "cpu"
    tracked_device = "cpu"
    """The device type of the tensors ``track`` counts (the symbolic backend's: meta)."""

    def __init__(self, memory_limit: int | None = None) -> None:
        self._tracker = StorageTracker(memory_limit)
        self._active = False

    def start(self) -> None:
        if not self._active:
            self._tracker.__enter__()
            self._active = True

    def stop(self) -> None:
        if self._active:
            self._tracker.__exit__(None, None, None)
            self._active = False

    def synchronize(self) -> None:
        pass

    def track(self, tensors: Iterable[torch.Tensor]) -> None:
        for tensor in tensors:
            if isinstance(tensor, torch.Tensor) and tensor.device.type == self.tracked_device:
                self._tracker.add(tensor)

    def allocated(self) -> int:
        return self._tracker.current

    def peak(self) -> int:
        return self._tracker.peak

    def reset_peak(self) -> None:
        self._tracker.peak = self._tracker.current

    def peak_reserved(self) -> int | None:
        return None

    def alloc_retries(self) -> int | None:
        return None

    def clock(self) -> float | None:
        return time.perf_counter()

    def seconds(self, start: float, end: float) -> float:
        return end - start


def select_backend(device: torch.device | str, memory_limit: int | None = None) -> MemoryBackend:
    """The backend for a model whose parameters live on ``device``; ``memory_limit`` (bytes)
    emulates a GPU of that size on the CPU (a real GPU has its own)."""
    device = torch.device(device)
    if device.type == "cuda":
        if memory_limit is not None:
            raise AdvisorError(f"a memory limit emulates a GPU's memory on the CPU; this model is on {device}")
        return CudaBackend(device)
    if device.type == "cpu":
        return CpuBackend(memory_limit=memory_limit)
    raise ValueError(f"no memory backend for device type {device.type!r} (supported: cuda, cpu)")
