"""One MoE layer's transient peaks on fake tensors: what megatron-core holds beyond what it keeps.

``LiveStorages`` records, in order, each tensor storage's creation and release (a
``TorchDispatchMode`` seeing every op's fresh results; a weak reference to each storage says when
it goes), with marks where the MoE block's forward starts and ends and where the backward starts.
From that record, ``TransientPeaks``:

- ``forward_peak``: the highest live bytes during the MoE block's forward (``MoELayer``, from the
  router to the combined output) above the bytes live when it started, less the storages born in
  it that autograd keeps for the backward pass (``kept``): the dispatcher's and the experts'
  buffers at their peak, and a buffer that outlives the layer without being kept (the allgather
  dispatcher's global buffer);
- ``backward_peak``: the highest live bytes during the layer's backward above the bytes live when
  it started, the parameters' gradients left out (megatron accumulates them into its
  preallocated ``main_grad`` buffers: model states), plus the MoE block's unkept survivors (the
  global buffer again, still allocated).

What the layer runs instead of Transformer Engine's grouped GEMM (``grouped_experts``): TE's
``GroupedLinear`` (``TEGroupedMLP``, --moe-grouped-gemm) makes one FC1 and one FC2 output for all
local experts, saves its input, and in the backward makes one input gradient (its weight
gradients go into main_grad); megatron-core's weighted SwiGLU (``fused_bias_swiglu.py``,
``weighted_bias_swiglu_impl``) is a compiled kernel that saves its input and the probabilities
and makes its output (its backward: the input's and the probabilities' gradients), where the
eager stand-in of ``moe_fake`` makes intermediates that the kernel does not. megatron-core's
``SequentialMLP`` runs expert by expert, splitting and concatenating: its buffers are not the
grouped GEMM's. What each keeps is the same.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass
from typing import Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensor

from megatron_hooks.backends import StorageTracker


class _GroupedLinear(torch.autograd.Function):
    """TE's GroupedLinear over all local experts: one output, its input saved; the backward's
    input gradient, and weight gradients (new tensors here; main_grad in megatron, left out)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, out_features: int, *weights: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.weight_shapes = [w.shape for w in weights]
        return x.new_empty(x.shape[0], out_features)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (x,) = ctx.saved_tensors
        return (grad.new_empty(x.shape), None, *(grad.new_empty(shape) for shape in ctx.weight_shapes))


class _WeightedSwiGLU(torch.autograd.Function):
    """megatron-core's compiled weighted SwiGLU: saves its input and the probabilities."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(y, probs)
        return y.new_empty(y.shape[0], y.shape[1] // 2)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        y, probs = ctx.saved_tensors
        return grad.new_empty(y.shape), probs.new_empty(probs.shape)


def _grouped_forward(sequential_forward):
    """``SequentialMLP.forward`` as ``TEGroupedMLP.forward`` runs it (experts.py: FC1, the weighted
    SwiGLU with the probabilities, FC2), on fake tensors of a SwiGLU layer; else unchanged."""
    def forward(self, hidden: torch.Tensor, tokens_per_expert, probs: torch.Tensor):
        if not isinstance(hidden, FakeTensor) or not self.config.gated_linear_unit:
            return sequential_forward(self, hidden, tokens_per_expert, probs)
        fc1 = [expert.linear_fc1.weight for expert in self.local_experts]
        fc2 = [expert.linear_fc2.weight for expert in self.local_experts]
        intermediate = _GroupedLinear.apply(hidden, fc1[0].shape[0], *fc1)
        activated = _WeightedSwiGLU.apply(intermediate, probs.unsqueeze(-1))
        return _GroupedLinear.apply(activated, fc2[0].shape[0], *fc2), None
    return forward


@contextlib.contextmanager
def grouped_experts() -> Iterator[None]:
    """The experts as TE's grouped GEMM and the fused weighted SwiGLU run them (module
    docstring); undone on exit."""
    from megatron.core.transformer.moe import experts

    sequential_forward = experts.SequentialMLP.forward
    experts.SequentialMLP.forward = _grouped_forward(sequential_forward)
    try:
        yield
    finally:
        experts.SequentialMLP.forward = sequential_forward


class LiveStorages(StorageTracker):
    """Each storage's creation and release in order: ``events`` holds (serial, +bytes) at its
    creation and (serial, -bytes) at its release; ``mark`` names a point of the record."""

    def __init__(self) -> None:
        super().__init__()
        self.collectives_on_copies = False  # the fake process group (backends.StorageTracker)
        self.events: list[tuple[int, int]] = []
        self.serial: dict[int, int] = {}
        """id of a live storage -> its serial (ids come back once a storage is freed)."""
        self.marks: dict[str, int] = {}
        self.saved: set[int] = set()
        """Serials of the storages autograd saved (``pack``)."""

    def add(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = id(storage)
        if key in self.live:
            return
        serial, nbytes = len(self.events), storage.nbytes()
        self.live[key] = weakref.ref(storage, self._freed(key, serial, nbytes))
        self.serial[key] = serial
        self.events.append((serial, nbytes))

    def _freed(self, key: int, serial: int, nbytes: int):
        def release(_ref) -> None:
            if self.live.pop(key, None) is not None:
                self.serial.pop(key, None)
                self.events.append((serial, -nbytes))
        return release

    def mark(self, name: str) -> None:
        self.marks.setdefault(name, len(self.events))

    def serials(self, tensors) -> set[int]:
        """The serials of the live storages of ``tensors``."""
        return {self.serial[id(t.untyped_storage())] for t in tensors if id(t.untyped_storage()) in self.serial}

    def pack(self, tensor: torch.Tensor) -> None:
        """Notes a tensor autograd saves (call from a saved-tensors pack hook)."""
        self.saved |= self.serials([tensor])

    def alive(self) -> set[int]:
        return set(self.serial.values())


@dataclass(frozen=True, slots=True)
class TransientPeaks:
    """Reads a ``LiveStorages`` record with marks "moe_start", "moe_end", "backward_start"."""

    live: LiveStorages
    kept: set[int]
    """Serials of the storages autograd keeps for the backward pass."""
    after_forward: set[int]
    """Serials alive when the forward pass ended."""

    def _rise(self, start: int, end: int, skip: frozenset[int] = frozenset()) -> int:
        """The highest running sum of the events in [start, end) (0 if it never rises)."""
        current = peak = 0
        for serial, nbytes in self.live.events[start:end]:
            if serial not in skip:
                current += nbytes
                peak = max(peak, current)
        return peak

    def unkept_survivors(self) -> int:
        """Bytes born in the MoE block, alive after the forward, not kept for the backward."""
        start, end = self.live.marks["moe_start"], self.live.marks["moe_end"]
        return sum(n for s, n in self.live.events[start:end]
                   if n > 0 and s >= start and s in self.after_forward and s not in self.kept)

    def forward_peak(self) -> int:
        """The highest rise of the storages the backward does not keep, moment by moment: a kept
        storage is left out of the running sum from its birth (subtracting every kept byte from the
        highest total understated a peak that came before some were made)."""
        start, end = self.live.marks["moe_start"], self.live.marks["moe_end"]
        return self._rise(start, end, frozenset(self.kept & self.after_forward))

    def backward_peak(self, gradients: set[int]) -> int:
        """``gradients``: the serials of the parameters' gradients, left out."""
        start = self.live.marks["backward_start"]
        return self._rise(start, len(self.live.events), frozenset(gradients)) + self.unkept_survivors()
