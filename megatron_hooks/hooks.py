"""Per-layer memory hooks on the model chunks that Megatron builds.

``LayerMemoryHooks(chunks)`` finds the megatron-core ``GPTModel`` in each chunk (inside any
DDP / Float16Module wrappers; a list of chunks for interleaved pipelines) and splits each into
regions that run one after the other:

- ``embedding``: ``GPTModel.embedding`` (first pipeline stage only);
- ``decoder.layers.<i>``: each ``TransformerLayer``, ``i`` its position among this rank's
  layers, keyed by Megatron's global 1-based ``layer_number``;
- ``output``: from the final RMSNorm to the end of ``GPTModel.forward``, i.e. the final norm,
  the output layer and the cross-entropy loss (last stage only).

What each record field means (the profile schema is in ``advisor/profiles.py``):

``parameter_bytes``, ``gradient_bytes``, ``optimizer_bytes``
    This rank's share of the region's parameters, their gradients (``main_grad`` under
    Megatron's DDP, else ``grad``) and their optimizer state, after the iteration's optimizer
    step (``static.py`` says what counts as optimizer state).
``activation_bytes``
    Bytes that one microbatch's forward pass through the region keeps for the backward pass.
    Counted with ``torch.autograd.graph.saved_tensors_hooks``: every tensor autograd saves is
    seen once, at the moment it is saved, and its whole storage counts (a saved view keeps its
    storage alive). A storage counts once per microbatch, in the first region that saves it,
    if the forward pass's graph still holds it at the end (a node that dies in the forward pass,
    a branch whose output is unused, keeps nothing; ``static.SavedStorages``); parameters and
    buffers never count. This is exact where an allocation tracker is not:
    what the region *keeps* is what autograd saved, not what was allocated and freed, and the
    region's output (the next region's input) counts where it is saved. The same count runs on
    CUDA and on the CPU. Tensors that a custom ``autograd.Function`` keeps as plain ``ctx``
    attributes instead of ``save_for_backward`` are not seen; megatron-core's local-spec Llama
    layers keep none (``ctx.main_grad`` is the gradient buffer). The largest of the
    iteration's microbatches is reported (they are equal for a fixed shape).
``forward_peak_bytes``, ``backward_peak_bytes``
    The highest allocated memory during the region's forward (backward) pass, minus the
    allocated memory when it began. The backward pass of a region runs from the moment the
    gradient of its output is complete to the moment the next region's begins (or the
    backward pass ends). The largest over the iteration's microbatches is reported. On the
    first iteration the backward peak includes the gradients that the backward allocates.
``forward_time_s``, ``backward_time_s``
    The time one microbatch spends in the region's forward (backward) pass, over the same
    intervals as the peaks, the mean over the iteration's microbatches: CUDA events on a GPU
    (device time, read after the iteration's one synchronisation), wall time on the CPU, None
    under the symbolic backend.

Per iteration: ``parameter_bytes``, ``gradient_bytes``, ``optimizer_bytes`` summed over the
chunks; ``peak_allocated_bytes`` (and on CUDA ``peak_reserved_bytes`` and
``alloc_retries``, the retries during the iteration) from the backend, over the whole
iteration; ``step_time_s`` from ``begin_iteration`` to ``end_iteration``; ``loss`` as given
(null off the last stage, or when it is not finite).

The hooks are forward pre/post hooks on the region modules and tensor hooks on region outputs
that fire when their gradient is complete; none of them changes a tensor, so training is
unchanged bit for bit. ``remove()`` takes every hook off. A forward outside
``begin_iteration`` / ``end_iteration``, with gradients off, or inside a backward pass
(activation recomputation) is not measured.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Literal, Sequence

import torch
from torch.utils._pytree import tree_leaves

from advisor.profiles import IterationRecord, LayerRecord
from megatron_hooks.backends import MemoryBackend, select_backend
from megatron_hooks.static import (
    SavedStorages, gradient_bytes, gradient_of, optimizer_bytes_by_parameter, optimizer_tensors, parameter_bytes,
    storage_key, untyped_storage_key,
)

Phase = Literal["forward", "backward"]


@dataclass(eq=False, slots=True)
class Region:
    """One measured part of a model chunk, and what it measured in the current iteration."""

    name: str
    kind: Literal["embedding", "decoder", "output"]
    layer_number: int | None
    params: list[torch.nn.Parameter]
    activation_bytes: int = 0
    forward_peak_bytes: int = 0
    backward_peak_bytes: int = 0
    times: dict = field(default_factory=dict)
    """phase -> [seconds in all, intervals] in the current iteration."""

    @property
    def label(self) -> str:
        return f"{self.name} (layer {self.layer_number})" if self.layer_number else self.name


@dataclass(eq=False, slots=True)
class _Microbatch:
    index: int
    saved: SavedStorages = field(default_factory=SavedStorages)
    """What autograd saved in this microbatch's forward pass, labelled id(region)."""


@dataclass(frozen=True, slots=True)
class IterationMeasurement:
    layers: tuple[LayerRecord, ...]
    iteration: IterationRecord


def _find_gpt_models(chunk: torch.nn.Module) -> list[torch.nn.Module]:
    from megatron.core.models.gpt import GPTModel

    return [module for module in chunk.modules() if isinstance(module, GPTModel)]


def _queue_end_of_backward(callback) -> None:
    # The engine runs queued callbacks once the current backward pass has finished.
    torch.autograd.Variable._execution_engine.queue_callback(callback)


class LayerMemoryHooks:
    """Measures memory per layer on one rank; see the module docstring for what each number is."""

    def __init__(self, chunks: torch.nn.Module | Sequence[torch.nn.Module], *,
                 backend: MemoryBackend | None = None, optimizer=None) -> None:
        self.chunks = list(chunks) if isinstance(chunks, (list, tuple)) else [chunks]
        self.models = [model for chunk in self.chunks for model in _find_gpt_models(chunk)]
        if not self.models:
            raise ValueError("no megatron-core GPTModel found in the model chunks")
        device = next(p.device for model in self.models for p in model.parameters())
        self.backend = backend or select_backend(device)
        self.optimizer = optimizer
        self.regions: list[Region] = []
        self._model_regions: dict[int, tuple[Region | None, Region | None]] = {}
        for model in self.models:
            self._model_regions[id(model)] = self._build_regions(model)
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._installed = False
        self._reset_iteration(None)
        self.max_in_flight = 0
        self.where = "before the first iteration"

    # --- stage description -------------------------------------------------------------

    def _build_regions(self, model) -> tuple[Region | None, Region | None]:
        embedding = output = None
        if model.pre_process:
            embedding = Region("embedding", "embedding", None, list(model.embedding.parameters()))
            self.regions.append(embedding)
        for layer in model.decoder.layers:
            count = sum(region.kind == "decoder" for region in self.regions)
            self.regions.append(Region(f"decoder.layers.{count}", "decoder", int(layer.layer_number),
                                       list(layer.parameters())))
        if model.post_process:
            params = [] if model.decoder.final_layernorm is None else list(model.decoder.final_layernorm.parameters())
            params += [p for p in model.output_layer.parameters()]
            output = Region("output", "output", None, params)
            self.regions.append(output)
        return embedding, output

    @property
    def stage_layers(self) -> tuple[int, ...]:
        return tuple(region.layer_number for region in self.regions if region.kind == "decoder")

    @property
    def in_flight_microbatches(self) -> int:
        """The most microbatches held at once so far: forward run, backward not yet (0 before
        any); with interleaving, model-chunk forwards divided by the chunks, rounded up."""
        return math.ceil(self.max_in_flight / len(self.models))

    @property
    def first_stage(self) -> bool:
        return any(model.pre_process for model in self.models)

    @property
    def last_stage(self) -> bool:
        return any(model.post_process for model in self.models)

    # --- install / remove --------------------------------------------------------------

    def install(self) -> "LayerMemoryHooks":
        if self._installed:
            raise RuntimeError("the layer memory hooks are already installed")
        decoder_regions = iter(region for region in self.regions if region.kind == "decoder")
        for model in self.models:
            embedding, output = self._model_regions[id(model)]
            self._hook(model, self._root_pre, self._root_post(output))
            if embedding is not None:
                self._hook(model.embedding, self._opener(embedding), self._closer(embedding))
            for layer in model.decoder.layers:
                region = next(decoder_regions)
                self._hook(layer, self._opener(region), self._closer(region))
            if output is not None:
                first = model.decoder.final_layernorm or model.output_layer
                self._handles.append(first.register_forward_pre_hook(self._opener(output), with_kwargs=True))
        self._installed = True
        return self

    def _hook(self, module, pre, post) -> None:
        self._handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        self._handles.append(module.register_forward_hook(post, with_kwargs=True))

    def remove(self) -> None:
        self.abort()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._installed = False

    def __enter__(self) -> "LayerMemoryHooks":
        return self.install()

    def __exit__(self, *exc) -> None:
        self.remove()

    # --- iterations --------------------------------------------------------------------

    def _reset_iteration(self, iteration: int | None) -> None:
        self.iteration = iteration
        self._microbatches = 0
        self._in_flight = 0
        self._forward_mb: _Microbatch | None = None
        self._saved_hooks = None
        self._open: tuple[Region, Phase, int, object] | None = None  # region, phase, allocated and clock at entry
        self._intervals: list[tuple[Region, Phase, object, object]] = []
        self._last_forward_region: Region | None = None
        self._static_storages: set[int] = set()
        self._peak = 0
        self._peak_reserved: int | None = None
        for region in self.regions:
            region.activation_bytes = region.forward_peak_bytes = region.backward_peak_bytes = 0
            region.times = {}

    def begin_iteration(self, iteration: int, *, optimizer=None) -> None:
        """Start measuring iteration ``iteration`` (1-based)."""
        if optimizer is not None:
            self.optimizer = optimizer
        self._reset_iteration(iteration)
        persistent = [t for model in self.models for t in (*model.parameters(), *model.buffers())]
        self._static_storages = {storage_key(t) for t in persistent}
        self.backend.start()
        self.backend.track(persistent)
        self.backend.track(gradient_of(p) for model in self.models for p in model.parameters())
        self.backend.track(optimizer_tensors(self.optimizer))
        self.backend.reset_peak()
        self._retries = self.backend.alloc_retries()
        self._started = time.perf_counter()
        self.where = f"iteration {iteration}, before the first forward"

    def end_iteration(self, *, loss: float | None = None) -> IterationMeasurement:
        """Stop measuring; the records of this iteration."""
        if self.iteration is None:
            raise RuntimeError("end_iteration() without begin_iteration()")
        self.backend.synchronize()
        step_time = time.perf_counter() - self._started
        self._fold_peak(self._close())
        self._sum_times()
        retries = self.backend.alloc_retries()
        self.backend.stop()
        measurement = self._measure(loss, step_time, None if retries is None else retries - self._retries)
        self.where = f"iteration {self.iteration}, after the optimizer step"
        self._reset_iteration(None)
        return measurement

    def abort(self) -> None:
        """Undo what an interrupted iteration left active (an OOM inside the forward pass)."""
        if self._saved_hooks is not None:
            self._saved_hooks.__exit__(None, None, None)
            self._saved_hooks = None
        self.backend.stop()
        self._reset_iteration(None)

    def _sum_times(self) -> None:
        """The regions' times from the clock marks (each read only now, after the iteration's
        synchronisation)."""
        for region, phase, start, end in self._intervals:
            total = region.times.setdefault(phase, [0.0, 0])
            total[0] += self.backend.seconds(start, end)
            total[1] += 1

    def _measure(self, loss, step_time, retries) -> IterationMeasurement:
        optimizer_held = optimizer_bytes_by_parameter(self.optimizer)
        records = []
        for region in self.regions:
            records.append(LayerRecord(
                iteration=self.iteration, name=region.name, kind=region.kind, layer_number=region.layer_number,
                parameter_bytes=parameter_bytes(region.params), gradient_bytes=gradient_bytes(region.params),
                optimizer_bytes=sum(optimizer_held.get(id(p), 0) for p in region.params),
                activation_bytes=region.activation_bytes, forward_peak_bytes=region.forward_peak_bytes,
                backward_peak_bytes=region.backward_peak_bytes,
                forward_time_s=_mean_time(region, "forward"), backward_time_s=_mean_time(region, "backward"),
            ))
        params = [p for model in self.models for p in model.parameters()]
        iteration = IterationRecord(
            iteration=self.iteration, parameter_bytes=parameter_bytes(params), gradient_bytes=gradient_bytes(params),
            optimizer_bytes=sum(optimizer_held.values()), peak_allocated_bytes=self._peak,
            peak_reserved_bytes=self._peak_reserved, alloc_retries=retries,
            step_time_s=step_time, loss=loss if loss is not None and math.isfinite(loss) else None,  # JSON has no NaN
        )
        return IterationMeasurement(tuple(records), iteration)

    # --- the peak meter ----------------------------------------------------------------

    def peak_so_far(self) -> int:
        """The iteration's peak up to now (reads the backend, resets nothing)."""
        return max(self._peak, self.backend.peak())

    def _fold_peak(self, peak: int | None = None) -> None:
        """Fold the backend's peak since the last reset (``peak`` if the caller just read it)."""
        self._peak = max(self._peak, self.backend.peak() if peak is None else peak)
        reserved = self.backend.peak_reserved()
        if reserved is not None:
            self._peak_reserved = max(self._peak_reserved or 0, reserved)

    def _enter(self, region: Region, phase: Phase, microbatch: int) -> None:
        self.where = f"iteration {self.iteration}, microbatch {microbatch}, {phase}, {region.label}"
        self._fold_peak(self._close())
        self.backend.reset_peak()
        self._open = (region, phase, self.backend.allocated(), self.backend.clock())

    def _close(self) -> int | None:
        """Close the open region's transient peak; the backend's peak it read, if any (on CUDA
        each read is a call into the allocator's statistics)."""
        if self._open is None:
            return None
        region, phase, entry, started = self._open
        if started is not None:
            self._intervals.append((region, phase, started, self.backend.clock()))
        peak = self.backend.peak()
        rise = max(0, peak - entry)
        if phase == "forward":
            region.forward_peak_bytes = max(region.forward_peak_bytes, rise)
        else:
            region.backward_peak_bytes = max(region.backward_peak_bytes, rise)
        self._open = None
        return peak

    # --- forward -----------------------------------------------------------------------

    def _measuring_forward(self) -> bool:
        return self._installed and self._forward_mb is not None

    def _root_pre(self, model, args, kwargs):
        if not self._installed or self.iteration is None or not torch.is_grad_enabled() or self._forward_mb:
            return
        self._microbatches += 1
        self._forward_mb = _Microbatch(self._microbatches)
        pipeline_input = getattr(model.decoder, "input_tensor", None)
        self.backend.track(tree_leaves((args, kwargs, pipeline_input)))
        self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        self._saved_hooks.__enter__()

    def _root_post(self, output_region: Region | None):
        def hook(model, args, kwargs, output):
            if not self._measuring_forward():
                return
            microbatch = self._forward_mb
            self._saved_hooks.__exit__(None, None, None)
            self._saved_hooks = None
            self._close()
            self._forward_mb = None
            self._last_forward_region = None
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
            kept = microbatch.saved.kept()  # what the forward pass's graph still holds
            for region in self.regions:
                region.activation_bytes = max(region.activation_bytes, kept.get(id(region), 0))
            self.where = f"iteration {self.iteration}, microbatch {microbatch.index}, after the forward"
            tensor = output if isinstance(output, torch.Tensor) else output[0]
            self._watch_backward(tensor, output_region, microbatch, root=True)
        return hook

    def _opener(self, region: Region):
        def hook(module, args, kwargs):
            if self._measuring_forward():
                self._enter(region, "forward", self._forward_mb.index)
                self._last_forward_region = region
        return hook

    def _closer(self, region: Region):
        def hook(module, args, kwargs, output):
            if not self._measuring_forward():
                return
            self._close()
            tensor = output if isinstance(output, torch.Tensor) else output[0]  # TransformerLayer: (hidden, context)
            self._watch_backward(tensor, region, self._forward_mb, root=False)
        return hook

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        microbatch, region = self._forward_mb, self._last_forward_region
        if microbatch is None or region is None:
            return tensor
        storage = tensor.untyped_storage()
        key = untyped_storage_key(storage)
        if key not in self._static_storages:
            # by address, with weak references: an address freed by a dead node can come back
            microbatch.saved.add(tensor, key, id(region), storage.nbytes())
        return tensor

    # --- backward ----------------------------------------------------------------------

    def _watch_backward(self, tensor, region: Region | None, microbatch: _Microbatch, *, root: bool) -> None:
        if not isinstance(tensor, torch.Tensor) or not tensor.requires_grad:
            return
        iteration = self.iteration

        def on_gradient(grad):
            if not self._installed or self.iteration != iteration:
                return None
            if root:
                _queue_end_of_backward(lambda: self._backward_done(microbatch, iteration))
            if region is not None:
                self._enter(region, "backward", microbatch.index)
            return None

        tensor.register_hook(on_gradient)

    def _backward_done(self, microbatch: _Microbatch, iteration: int) -> None:
        if not self._installed or self.iteration != iteration:
            return
        self._close()
        self._in_flight -= 1
        self.where = f"iteration {iteration}, after the backward of microbatch {microbatch.index}"


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _mean_time(region: Region, phase: Phase) -> float | None:
    seconds, count = region.times.get(phase, (0.0, 0))
    return seconds / count if count else None
