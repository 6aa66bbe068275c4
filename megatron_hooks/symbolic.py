"""The symbolic backend: real megatron-core stages on fake tensors, at any size, with no GPU.

MAP's symbolic profiler (seed 003, Section 4.1) follows the autograd graph with tensors that
carry a shape and a dtype but no storage, and counts what each operator saves, keeps and frees.
torch has every piece of it, and this module only assembles them around megatron-core:

- ``FakeTensorMode`` (torch._subclasses): every tensor made while it is active is a fake CPU
  tensor whose storage has a size and no data; aten ops run their meta kernels, autograd
  records and saves as usual, and a saved-tensor hook or a dispatch mode sees each storage.
- torch's fake process group (``FakeStore``, backend ``"fake"``): a world of TP x CP x DP
  ranks of which this process is one, with no peers; collectives return at once and move no
  data, so megatron-core builds and runs each rank's real shapes (TP, SP and CP splits).
- The layer hooks (``hooks.py``) and the CPU backend's storage tracker, unchanged: the
  ``SymbolicBackend`` below is that tracker over fake storages, without a clock, run inside
  the fake mode (``TrackingFakeTensorMode``) rather than as a dispatch mode of its own above it,
  which costs a second Python dispatch per op.

A stage runs as on the CPU backend (``emulate.run_stage``: 1F1B order, stand-ins for its
neighbours), with, by default, megatron-core's own DDP (FP32 gradient buffer) and optimizer
(the distributed optimizer when asked), and the CUDA kernel stand-ins of ``kernels.py``, so the
records say what a GPU rank of the user's run would hold. With ``kernels="cpu"`` and
``megatron_optimizer=False`` it runs exactly what the CPU backend runs, and the two agree byte
for byte (``tests/test_symbolic.py``).

What the symbolic backend cannot know, it leaves out and says so: no time (``forward_time_s``
null), no loss, no allocator (no reserved memory, fragmentation or retries), and no memory of
the collectives' own buffers (NCCL's). A few steps of megatron-core cannot run on fake CPU
tensors and are replaced while a symbolic world is open (``_megatron_on_fake_tensors``):
``all_gather_object`` (every rank of this world holds this rank's object); the
``"torch.cuda.*"`` type names megatron's mixed-precision optimizers check and ``Tensor.cuda()``
(a fake tensor stands for a CUDA one); the pinned host copy of the CP rank's RoPE chunk index
(made on the CPU); torch's ``_coalescing_manager`` (which has no fake kernel for coalesced
reduce-scatters; the collectives run one by one); and the gradient norm and the FP16 overflow
check, which read a number off the gradients (0.0 and "no overflow"; a few scalars on a GPU).

Which ranks run and which are written as copies: ``symbolic_run.run_symbolic``.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from megatron_hooks.backends import CpuBackend


class TrackingFakeTensorMode(FakeTensorMode):
    """``FakeTensorMode`` that, while ``tracking``, counts the storages of each op's results in
    ``tracker`` (a ``backends._StorageTracker``), as that tracker does when it is a dispatch mode
    of its own above the fake mode: the same ops (those dispatched from outside both modes; what
    the fake mode runs inside an op is not seen, ``depth``), the same counts, one Python
    dispatch per op instead of two (a fifth of a stage's CPU time)."""

    def __init__(self, tracker) -> None:
        super().__init__()
        self.tracker, self.tracking, self.depth = tracker, False, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.tracking or self.depth:
            return super().__torch_dispatch__(func, types, args, kwargs)
        self.depth += 1
        try:
            return self.tracker.run(func, args, kwargs or {},
                                    lambda *a, **k: FakeTensorMode.__torch_dispatch__(self, func, types, a, k))
        finally:
            self.depth -= 1


class SymbolicBackend(CpuBackend):
    """The CPU backend's storage tracker over fake tensors: exact bytes, no clock. ``mode``: the
    fake mode the stage runs under, which does the tracking (``TrackingFakeTensorMode``)."""

    name = "symbolic"

    def __init__(self, kernels: str, memory_limit: int | None = None) -> None:
        super().__init__(memory_limit=memory_limit)
        self.kernels = kernels
        self.device = f"fake CPU tensors ({'CUDA kernel stand-ins' if kernels == 'cuda' else 'CPU kernels'})"
        # torch's fake process group moves nothing and keeps no tensor: the collectives run on
        # the tensors themselves, not on copies (a third of a TP 4 stage's CPU time).
        self._tracker.collectives_on_copies = False
        self.mode = TrackingFakeTensorMode(self._tracker)

    def start(self) -> None:
        self.mode.tracking = True

    def stop(self) -> None:
        self.mode.tracking = False

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
        if dtype is None and isinstance(self, FakeTensor) and self.device.type == "cpu":
            return tensor_type(self).replace("torch.", "torch.cuda.", 1)
        return tensor_type(self, dtype, non_blocking, **kwargs)

    def fake_cuda(self, *args, **kwargs):
        return self if isinstance(self, FakeTensor) else tensor_cuda(self, *args, **kwargs)

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
                (MixedPrecisionOptimizer, "_unscale_main_grads_and_check_for_nan", lambda self: False)]
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
