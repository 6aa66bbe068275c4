"""The symbolic backend: real megatron-core stages on meta tensors, at any size, with no GPU.

MAP's symbolic profiler (seed 003, Section 4.1) follows the autograd graph with tensors that
carry a shape and a dtype but no storage, and counts what each operator saves, keeps and frees.
torch has every piece of it, and this module only assembles them around megatron-core:

- torch's meta device: a meta tensor's storage has a size and no data; aten ops run their meta
  kernels (C++ for nearly all, torch's Python meta registrations for the rest), autograd
  records and saves as usual, and a saved-tensor hook or a dispatch mode sees each storage.
  ``MetaDevice`` puts every tensor a stage makes there, whatever device megatron-core names.
- torch's fake process group (``FakeStore``, backend ``"fake"``): a world of TP x CP x DP
  ranks of which this process is one, with no peers; collectives return at once and move no
  data, so megatron-core builds and runs each rank's real shapes (TP, SP and CP splits).
- The layer hooks (``hooks.py``) and the CPU backend's storage tracker, unchanged: the
  ``SymbolicBackend`` below is that tracker over meta storages, without a clock.

The backend ran on ``FakeTensorMode`` (torch._subclasses: fake CPU tensors over meta ones)
until meta tensors alone proved to give the same records, byte for byte, at a quarter to a
third of the CPU time: the fake mode's Python work per op (its cache key over every argument's
metadata, a new FakeTensor for every result) was most of a stage's time, and a meta op runs in
C++ (docs/performance.md, "Symbolic campaign speed"). A meta tensor names its device "meta",
not "cpu", which is all that the replacements below add for it.

A stage runs as on the CPU backend (``stage_emulation.run_stage``: 1F1B order, stand-ins for its
neighbours), with, by default, megatron-core's own DDP (FP32 gradient buffer) and optimizer
(the distributed optimizer when asked), and the CUDA kernel stand-ins of ``kernels.py``, so the
records say what a GPU rank of the user's run would hold. With ``kernels="cpu"`` and
``megatron_optimizer=False`` it runs exactly what the CPU backend runs, and the two agree byte
for byte (``tests/test_symbolic.py``).

What the symbolic backend cannot know, it leaves out and says so: no time (``forward_time_s``
null), no loss, no allocator (no reserved memory, fragmentation or retries), and no memory of
the collectives' own buffers (NCCL's). A few steps of megatron-core cannot run on fake or meta
tensors and are replaced while a symbolic world is open (``_megatron_on_fake_tensors``):
``all_gather_object`` (every rank of this world holds this rank's object); the
``"torch.cuda.*"`` type names megatron's mixed-precision optimizers check and ``Tensor.cuda()``
(a fake or meta tensor stands for a CUDA one); the device check of torch's fused Adam (which
names the devices it runs on; its meta kernel is exact); the pinned host copy of the CP rank's
RoPE chunk index (made on the CPU); torch's ``_coalescing_manager`` (which has no fake kernel for coalesced
reduce-scatters; the collectives run one by one); and the gradient norm and the FP16 overflow
check, which read a number off the gradients (0.0 and "no overflow"; a few scalars on a GPU).

Which ranks run and which are written as copies: ``symbolic_run.run_symbolic``.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors

from megatron_hooks.backends import CpuBackend


class MetaDevice(TorchFunctionMode):
    """Every tensor that a symbolic stage makes lives on torch's meta device: the factories'
    device (CPU, CUDA or none) becomes "meta" and their generator is dropped (a meta tensor
    draws nothing), ``Tensor.to(device)`` stays on it, and ``Tensor.cuda()`` is the tensor
    (``_megatron_on_fake_tensors``). Function modes are off in autograd's backward pass, where
    megatron-core's own functions make their tensors on ``torch.cuda.current_device()``:
    "meta" while this mode is on (the CPU shim's "cpu" outside it)."""

    def __enter__(self):
        self._current_device = torch.cuda.current_device
        torch.cuda.current_device = _meta_device
        return super().__enter__()

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        torch.cuda.current_device = self._current_device

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _FACTORIES:
            kwargs["device"] = _META
            kwargs.pop("generator", None)
        elif func is torch.Tensor.to:
            args = (args[0], *(_META if _names_device(arg) else arg for arg in args[1:]))
            if "device" in kwargs:
                kwargs["device"] = _META
        return func(*args, **kwargs)


_META = torch.device("meta")
_FACTORIES = frozenset(_device_constructors())
"""torch's functions that take a device and make a tensor (those that ``torch.device(...)`` as a
context redirects)."""


def _meta_device() -> str:
    return "meta"


def _names_device(arg) -> bool:
    # An int is a CUDA device's index; a bool (an int too) is non_blocking or copy.
    return isinstance(arg, (str, torch.device)) or (isinstance(arg, int) and not isinstance(arg, bool))


class SymbolicBackend(CpuBackend):
    """The CPU backend's storage tracker over meta tensors: exact bytes, no clock. ``mode``: the
    function mode the stage runs under (``MetaDevice``); the tracker is a dispatch mode of its
    own while an iteration runs, as on the CPU backend."""

    name = "symbolic"
    tracked_device = "meta"

    def __init__(self, kernels: str, memory_limit: int | None = None) -> None:
        super().__init__(memory_limit=memory_limit)
        self.kernels = kernels
        # The header's words since the backend began (on FakeTensorMode's fake CPU tensors):
        # meta tensors are fake tensors too, with a size and no data, and the records are the same.
        self.device = f"fake CPU tensors ({'CUDA kernel stand-ins' if kernels == 'cuda' else 'CPU kernels'})"
        # torch's fake process group moves nothing and keeps no tensor: the collectives run on
        # the tensors themselves, not on copies (a third of a TP 4 stage's CPU time).
        self._tracker.collectives_on_copies = False
        # A Python number that an op takes as a tensor (``x[mask] = 0``) is made on the
        # tensor's device when that is not the CPU: a meta tensor here, a host scalar under
        # FakeTensorMode, which lifted it uncounted (aten.lift_fresh aliases); not counted.
        self._tracker.uncounted = frozenset({torch.ops.aten.scalar_tensor.default})
        self.mode = MetaDevice()

    def clock(self) -> None:
        return None


@contextlib.contextmanager
def fake_world(tp: int, cp: int, dp: int, rank: int, ep: int = 1, etp: int | None = None) -> Iterator[None]:
    """This process as rank ``rank`` of a fake TP x CP x DP world, with megatron-core's parallel
    state (one pipeline stage, as the emulator's; ``ep``, ``etp``: the expert-parallel and expert
    tensor-parallel sizes, which megatron-core folds out of the same world; ``etp`` None: TP),
    the CPU shim and the fake-tensor replacements of the module docstring; all undone on exit."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from megatron_hooks.cpu_shim import CpuShim

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=tp * cp * dp)
    shim = CpuShim().install()
    try:
        parallel_state.initialize_model_parallel(tp, 1, context_parallel_size=cp, expert_model_parallel_size=ep,
                                                 expert_tensor_parallel_size=etp, create_gloo_process_groups=False)
        with _megatron_on_fake_tensors():
            yield
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
        shim.restore()


@contextlib.contextmanager
def _megatron_on_fake_tensors() -> Iterator[None]:
    import megatron.core.distributed.param_and_grad_buffer as buffers
    import megatron.core.models.common.embeddings.rotary_pos_embedding as rotary
    import torch.distributed as dist
    from megatron.core.optimizer.optimizer import ChainedOptimizer, MegatronOptimizer, MixedPrecisionOptimizer
    from torch._subclasses.fake_tensor import FakeTensor

    tensor_type = torch.Tensor.type

    def gather_object(objects: list, obj, group=None) -> None:
        objects[:] = [obj] * len(objects)

    def cuda_type(self, dtype=None, non_blocking=False, **kwargs):
        if dtype is None and self.is_meta:
            return tensor_type(self).replace("torch.meta.", "torch.cuda.", 1)
        if dtype is None and isinstance(self, FakeTensor) and self.device.type == "cpu":
            return tensor_type(self).replace("torch.", "torch.cuda.", 1)
        return tensor_type(self, dtype, non_blocking, **kwargs)

    def fake_cuda(self, *args, **kwargs):
        return self if self.is_meta or isinstance(self, FakeTensor) else tensor_cuda(self, *args, **kwargs)

    tensor_cuda, make_tensor, cp_chunks = torch.Tensor.cuda, torch.tensor, rotary.get_pos_emb_on_this_cp_rank

    def cp_chunks_on_host(*args, **kwargs):
        # megatron makes the two chunk indices in pinned host memory and copies them to the GPU.
        torch.tensor = lambda data, *rest, pin_memory=False, **options: make_tensor(data, *rest, **options)
        try:
            return cp_chunks(*args, **kwargs)
        finally:
            torch.tensor = make_tensor

    @contextlib.contextmanager
    def one_by_one(group=None, device=None, async_ops=False):
        yield _Done()

    replaced = [(dist, "all_gather_object", gather_object), (torch.Tensor, "type", cuda_type),
                (torch.Tensor, "cuda", fake_cuda), (rotary, "get_pos_emb_on_this_cp_rank", cp_chunks_on_host),
                (buffers, "_coalescing_manager", one_by_one),
                (MegatronOptimizer, "get_grad_norm", lambda self: 0.0),
                (ChainedOptimizer, "get_grad_norm", lambda self: 0.0),
                (MixedPrecisionOptimizer, "_unscale_main_grads_and_check_for_nan", lambda self: False),
                # torch's fused Adam refuses a meta tensor by its device's name; its meta kernel runs.
                (sys.modules["torch.optim.adam"], "_device_dtype_check_for_fused", lambda *args, **kwargs: None)]
    with replacing(replaced):
        yield


@contextlib.contextmanager
def replacing(replaced: list) -> Iterator[None]:
    """Set each (owner, name, value) of ``replaced`` while the block runs; restore on exit."""
    # What each owner defines itself, or None where the name is inherited (torch.Tensor.type
    # comes from torch._C.TensorBase): restoring deletes the replacement there.
    saved = [(owner, name, owner.__dict__.get(name)) for owner, name, _ in replaced]
    for owner, name, value in replaced:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in saved:
            if value is None:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


class _Done:
    """What a coalesced collective returns: a handle whose wait() has nothing to wait for."""

    def wait(self) -> None:
        pass


def megatron_ddp_and_optimizer(model: torch.nn.Module, *, distributed_optimizer: bool, dtype: torch.dtype):
    """megatron-core's DDP around ``model`` (an FP32 gradient buffer, Megatron-LM's
    --accumulate-allreduce-grads-in-fp32) and its Adam (sharded over DP x CP with the
    distributed optimizer, else FP32 master weights on mixed precision), as Megatron-LM's
    ``setup_model_and_optimizer`` builds them; returns (ddp, optimizer).

    Without Transformer Engine or Apex, megatron-core falls back to torch's AdamW, whose default
    on a CPU (and, as foreach, on CUDA) makes temporaries per tensor; a GPU run uses TE's (or
    Apex's) FusedAdam, one kernel over all tensors that updates in place. torch's fused AdamW
    is that kernel's counterpart (the same two FP32 moments per main parameter, no temporaries),
    so the torch optimizers inside are switched to it."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    ddp = DistributedDataParallel(
        model.config,
        DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                      use_distributed_optimizer=distributed_optimizer),
        model,
    )
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=1e-4, bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16,
                        params_dtype=dtype, use_distributed_optimizer=distributed_optimizer),
        [ddp], use_gloo_process_groups=False,
    )
    for inner in _torch_optimizers(optimizer):
        for group in inner.param_groups:
            group.update(fused=True, foreach=False)
    return ddp, optimizer


def _torch_optimizers(optimizer) -> list[torch.optim.Optimizer]:
    if isinstance(optimizer, torch.optim.Optimizer):
        return [optimizer]
    if hasattr(optimizer, "chained_optimizers"):
        return [inner for chained in optimizer.chained_optimizers for inner in _torch_optimizers(chained)]
    return _torch_optimizers(optimizer.optimizer)
