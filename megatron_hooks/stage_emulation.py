"""Emulate pipeline stages on the CPU, with real megatron-core modules and the layer hooks on.

Megatron's pipeline schedules allocate on ``"cuda"`` by name, so a pipeline cannot run on a
CPU. One stage can: ``emulate_stages`` builds stage ``i`` of a partitioning (its global layer
numbers; the embedding on the first stage; the final norm, output layer and loss on the last)
and runs its microbatches in Megatron's 1F1B order, without the neighbours:

- stage ``i`` of ``p`` with ``m`` microbatches runs ``w = min(p - i - 1, m)`` warm-up forwards,
  then ``m - w`` times one forward and one backward, then ``w`` cool-down backwards, so it
  holds at most ``min(p - i, m)`` microbatches at once (seed 004, Section 3.2.2; MadPipe's 1F1B);
- a stage that is not the first gets a random hidden state ``[s, b, h]`` that requires grad,
  where Megatron would receive the previous stage's output; a stage that is not the last
  back-propagates a random output gradient, where Megatron would receive the next stage's;
- after the microbatches, gradients are all-reduced over the data-parallel group and a
  ``torch.optim.Adam`` steps (unsharded: ``distributed_optimizer`` is false in the header).

The symbolic backend (``backend="symbolic"``, ``megatron_hooks/symbolic.py``) runs the same
stages on fake tensors at any size, with megatron-core's own optimizer and the stand-ins of
``kernels.py``; it also runs what the CPU backend cannot: sequence and context parallelism, the
distributed optimizer, and the Transformer Engine spec.

TP > 1 and DP > 1 run as ``tp x dp`` real gloo processes (``torch.multiprocessing``, or the
processes of ``torchrun`` when ``python -m megatron_hooks.emulate`` runs under it: see
``emulate_under_torchrun``). Each process writes the rank file that the same rank of a real
``tp x pp x dp`` run would write (Megatron's rank order tp, cp, dp, pp), with ``emulated: true``,
so emulating every stage into one directory gives a profile that ``advisor.profiles.load_run``
reads as one run.

Python:

    from megatron_hooks.stage_emulation import StageEmulation, emulate_stages
    config = StageEmulation(model=spec, layers_per_stage=(3, 5, 4, 4), seq_len=512,
                            micro_batch_size=1, num_microbatches=8, tp=2, dp=1,
                            output_dir="profiles/uneven")
    emulate_stages(config, stages=[1])      # one stage; stages=None runs all of them

Command line (``megatron_hooks/emulate.py``; ``--help`` lists every option):

    python -m megatron_hooks.emulate --model llama3.1-8b --num-layers 4 --hidden-size 256 \\
        --layers-per-stage 1,2,1 --stage 1 --seq-len 128 --num-microbatches 4 --tp 2 --out DIR
"""

from __future__ import annotations

import contextlib
import gc
import os
import socket
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import torch

from advisor.errors import AdvisorError
from advisor.models import LlamaSpec
from advisor.parallel import ParallelConfig
from advisor.profiles import PARAMS_DTYPES
from advisor.render import counts_text

@dataclass(frozen=True, kw_only=True, slots=True)
class StageEmulation:
    """A pipeline partitioning to emulate, stage by stage."""

    model: LlamaSpec
    layers_per_stage: tuple[int, ...]
    """Decoder layers on each stage, first to last; they sum to ``model.num_layers``."""
    seq_len: int
    output_dir: Path
    """The run directory that receives ``rank{RANK:05d}.jsonl`` files."""
    micro_batch_size: int = 1
    num_microbatches: int = 1
    """Microbatches per iteration (m)."""
    iterations: int = 2
    tp: int = 1
    dp: int = 1
    cp: int = 1
    params_dtype: str = "float32"
    sequence_parallel: bool = False
    """Megatron's --sequence-parallel (with TP > 1); the symbolic backend's TE spec only."""
    distributed_optimizer: bool = False
    """Megatron's --use-distributed-optimizer: Adam states sharded over DP x CP (symbolic backend)."""
    layer_spec: str = "local"
    """"local" (megatron-core's modules) or "transformer_engine" (stood in for, symbolic backend)."""
    bias_swiglu_fusion: bool = True
    """False: the campaign's --no-bias-swiglu-fusion, the eager SwiGLU on the transformer_engine
    spec too (the local spec always runs it: megatron_hooks.model)."""
    backend: str = "cpu"
    """"cpu": real tensors and the storage tracker; "symbolic": fake tensors (symbolic.py)."""
    kernels: str | None = None
    """Whose kernels the symbolic backend stands in for: "cuda" (default there) or "cpu" (torch's
    CPU paths, for comparison with the CPU backend); the CPU backend runs "cpu"."""
    megatron_optimizer: bool | None = None
    """megatron-core's DDP and optimizer (the symbolic backend's default), or torch's fused Adam
    on plain gradients (the CPU backend's; the symbolic backend's for comparing with it)."""
    threads: int | None = None
    """Intra-op threads per process; default: OMP_NUM_THREADS where set, else the machine's cores /
    (tp x dp) (``intra_op_threads``)."""
    seed: int = 1234
    run_id: str = field(default_factory=lambda: f"emulated-{uuid.uuid4().hex[:12]}")
    every_microbatch: bool = False
    """Run all ``num_microbatches`` of each iteration. Off, the symbolic backend runs only those
    that reach a new state of the 1F1B schedule (``steady_microbatches``); the CPU backend always
    runs them all (its times are means over them)."""
    memory_limit_bytes: int | None = None
    """The memory of the emulated GPU: an allocation that takes the tracked bytes of a process
    above it raises ``torch.OutOfMemoryError``, which the rank file records (status "oom").
    CPU only; None: no limit."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers_per_stage", tuple(self.layers_per_stage))
        object.__setattr__(self, "output_dir", Path(self.output_dir))
        counts = self.layers_per_stage
        if not counts or any(not isinstance(c, int) or c < 1 for c in counts):
            raise AdvisorError(f"layers per stage must be positive integers, got {list(counts)}")
        if sum(counts) != self.model.num_layers:
            raise AdvisorError(
                f"layers per stage {counts_text(counts)} sum to {sum(counts)}, "
                f"but the model has {self.model.num_layers} layers"
            )
        for name in ("seq_len", "micro_batch_size", "num_microbatches", "iterations", "tp", "dp", "cp", "threads",
                     "memory_limit_bytes"):
            value = getattr(self, name)
            if name in ("threads", "memory_limit_bytes") and value is None:
                continue
            if not isinstance(value, int) or value < 1:
                raise AdvisorError(f"{name.replace('_', ' ')} must be a positive integer, got {value!r}")
        spec, tp = self.model, self.tp
        for what, size in (("attention heads", spec.num_attention_heads), ("query groups", spec.num_query_groups),
                           ("vocabulary size", spec.vocab_size), ("FFN hidden size", spec.ffn_hidden_size)):
            if size % tp:
                raise AdvisorError(f"TP {tp} does not divide the {what} ({size})")
        if self.params_dtype not in PARAMS_DTYPES:
            raise AdvisorError(f"params dtype must be one of {', '.join(PARAMS_DTYPES)}, got {self.params_dtype!r}")
        symbolic = self.backend == "symbolic"
        object.__setattr__(self, "kernels", self.kernels or ("cuda" if symbolic else "cpu"))
        object.__setattr__(self, "megatron_optimizer",
                           symbolic if self.megatron_optimizer is None else self.megatron_optimizer)
        if problem := self._problem():
            raise AdvisorError(problem)

    def _problem(self) -> str | None:
        """Why this emulation cannot run as asked, or None."""
        choices = {"backend": ("cpu", "symbolic"), "kernels": ("cpu", "cuda"),
                   "layer_spec": ("local", "transformer_engine")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                return f"{name.replace('_', ' ')} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}"
        sequence = self.seq_len // self.cp
        if self.seq_len % (2 * self.cp) if self.cp > 1 else False:
            return f"context parallelism splits the sequence into 2 x CP chunks: CP {self.cp} needs a sequence " \
                   f"length divisible by {2 * self.cp}, got {self.seq_len}"
        if self.sequence_parallel and self.tp > 1 and sequence % self.tp:
            return f"sequence parallelism splits the {sequence} tokens per CP rank over TP {self.tp}, which does " \
                   f"not divide them"
        if self.backend == "cpu":
            cpu_cannot = [("the symbolic backend's kernel stand-ins", self.kernels != "cpu"),
                          ("megatron-core's optimizer", bool(self.megatron_optimizer)),
                          ("the Transformer Engine spec", self.layer_spec != "local"),
                          ("sequence parallelism", self.sequence_parallel and self.tp > 1),
                          ("context parallelism", self.cp > 1),
                          ("the distributed optimizer with DP > 1", self.distributed_optimizer and self.dp > 1)]
            for what, asked in cpu_cannot:
                if asked:
                    return f"the CPU backend cannot run {what}; use the symbolic backend"
            return None
        if self.layer_spec == "local":
            from advisor.capture.campaign_run import local_spec_problem

            if problem := local_spec_problem(self.tp, self.cp, self.sequence_parallel):
                return f"{problem}: use the transformer_engine layer spec"
        elif self.kernels == "cpu":
            return "the transformer_engine layer spec runs on CUDA kernel stand-ins: kernels must be cuda"
        if self.distributed_optimizer and not self.megatron_optimizer:
            return "the distributed optimizer is megatron-core's: it needs megatron_optimizer"
        return None

    @property
    def pp(self) -> int:
        return len(self.layers_per_stage)

    def in_flight(self, stage: int) -> int:
        """Microbatches that 1F1B keeps on ``stage`` at once: min(p - i, m)."""
        from advisor.memory import in_flight_microbatches

        return int(in_flight_microbatches(stage, self.pp, 1, self.num_microbatches))

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    @property
    def symbolic(self) -> bool:
        return self.backend == "symbolic"

    def global_rank(self, stage: int, tp_rank: int, dp_rank: int, cp_rank: int = 0) -> int:
        """The rank in a real tp x cp x dp x pp run (Megatron's order tp-cp-ep-dp-pp)."""
        return tp_rank + self.tp * (cp_rank + self.cp * (dp_rank + self.dp * stage))

    @property
    def tokens_per_rank(self) -> int:
        """Sequence positions a rank's layers hold between them: s / CP, and / TP with SP."""
        sp = self.tp if self.sequence_parallel and self.tp > 1 else 1
        return self.seq_len // (self.cp * sp)


CUDA_SEED = 1234
"""The seed of megatron-core's CUDA RNG tracker in an emulation on GPUs."""


def one_f_one_b(stage: int, stages: int, microbatches: int) -> list[tuple[str, int]]:
    """The order in which a 1F1B stage runs its microbatches: [("F", 0), ("F", 1), ("B", 0), ...]."""
    warmup = min(stages - stage - 1, microbatches)
    order = [("F", k) for k in range(warmup)]
    for k in range(microbatches - warmup):
        order += [("F", warmup + k), ("B", k)]
    order += [("B", k) for k in range(microbatches - warmup, microbatches)]
    return order


def steady_microbatches(stage: int, stages: int, microbatches: int) -> int:
    """How many microbatches of a 1F1B stage reach every memory state of its iteration: the
    warm-up forwards and one steady forward-backward pair, ``w + 1`` (or all ``m`` when the
    warm-up is all of them). Each later steady pair starts and ends holding the same ``w``
    microbatches' activations and runs the same shapes, so it repeats the first pair's
    allocations exactly, and the cool-down of ``w`` backwards is the same after any number of
    pairs; the per-module terms are maxima over microbatches and the iteration's peak a maximum
    over time, which the repeats cannot raise. The one thing that grows with each pair is the
    last stage's list of loss scalars, which ``_Stage.iteration`` holds for the microbatches not
    run. ``tests/test_symbolic.py`` runs every microbatch and compares, byte for byte."""
    return min(microbatches, min(stages - stage - 1, microbatches) + 1)


# --- the worker: one process of the tp x dp group ----------------------------------------


def _run_info(config: StageEmulation, stage: int):
    from megatron.core import parallel_state

    from megatron_hooks.recorder import RunInfo

    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    cp_rank = parallel_state.get_context_parallel_rank()
    dp_rank = parallel_state.get_data_parallel_rank()
    return RunInfo(
        run_id=config.run_id, model=config.model,
        parallel=ParallelConfig(tp=config.tp, cp=config.cp, pp=config.pp, dp=config.dp, mbs=config.micro_batch_size),
        seq_len=config.seq_len, global_batch_size=config.num_microbatches * config.micro_batch_size * config.dp,
        num_microbatches=config.num_microbatches, layers_per_stage=config.layers_per_stage,
        rank=config.global_rank(stage, tp_rank, dp_rank, cp_rank), world_size=config.world_size,
        coords={"tp": tp_rank, "cp": cp_rank, "pp": stage, "dp": dp_rank},
        in_flight_microbatches=config.in_flight(stage), params_dtype=config.params_dtype, emulated=True,
        layer_spec=config.layer_spec, sequence_parallel=config.sequence_parallel and config.tp > 1,
        distributed_optimizer=config.distributed_optimizer,
    )


class _Stage:
    """One stage's model and optimizer, and its 1F1B iteration with stand-ins for its neighbours."""

    def __init__(self, config: StageEmulation, stage: int, probe=None) -> None:
        from megatron.core import parallel_state

        from megatron_hooks.model import DTYPES, build_gpt_model, causal_mask, stage_layers

        self.config, self.stage, self.probe = config, stage, probe
        self.first, self.last = stage == 0, stage == config.pp - 1
        self.dtype = DTYPES[config.params_dtype]
        torch.manual_seed(config.seed + stage)
        self.model = build_gpt_model(config.model, seq_len=config.seq_len,
                                     layers=stage_layers(config.layers_per_stage, stage), pre_process=self.first,
                                     post_process=self.last, params_dtype=self.dtype, layer_spec=config.layer_spec,
                                     sequence_parallel=config.sequence_parallel and config.tp > 1,
                                     # meta tensors, even where CUDA is available
                                     **({"use_cpu_initialization": True} if config.symbolic else {}),
                                     # TransformerConfig's field for --no-bias-swiglu-fusion (arguments.py,
                                     # core_transformer_config_from_args)
                                     **({} if config.bias_swiglu_fusion else {"bias_activation_fusion": False}))
        if config.megatron_optimizer:
            from megatron_hooks.symbolic import megatron_ddp_and_optimizer

            self.module, self.optimizer = megatron_ddp_and_optimizer(
                self.model, distributed_optimizer=config.distributed_optimizer, dtype=self.dtype)
        else:
            # Megatron's DDP keeps every gradient in a buffer allocated once, before training (its
            # main_grad), and its optimizer is a fused Adam (Transformer Engine's or Apex's) that
            # updates in place. So the gradients are allocated here and zeroed, not freed, at each
            # iteration, and torch's fused Adam (no per-tensor temporaries) steps: a stage's static
            # memory is the same all through an iteration, as on a Megatron rank.
            for param in self.model.parameters():
                param.grad = torch.zeros_like(param)
            self.module = self.model
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-4, fused=True)
        # The same data on every TP rank of a DP replica, as Megatron broadcasts it; drawn on the
        # CPU (the same numbers on every device) and moved to the model's device.
        self.data = torch.Generator().manual_seed(config.seed * 7919 + parallel_state.get_data_parallel_rank())
        self.device = next(self.model.parameters()).device
        # A CP rank receives its s / CP positions of each sequence (megatron's get_batch_on_this_cp_rank).
        s, b = config.seq_len // config.cp, config.micro_batch_size
        # TE's attention is causal by its mask type and takes no mask; the local spec's takes one.
        self.mask = causal_mask(s, self.device) if config.layer_spec == "local" else None
        self.positions = torch.arange(s, device=self.device).unsqueeze(0).expand(b, s)

    def _draw(self, make, *args, **kwargs) -> torch.Tensor:
        """A random tensor from the stage's CPU generator, on the model's device."""
        return make(*args, generator=self.data, **kwargs).to(self.device)

    def forward(self) -> torch.Tensor:
        config, s, b = self.config, self.config.seq_len // self.config.cp, self.config.micro_batch_size
        tokens = self._draw(torch.randint, 0, config.model.vocab_size, (b, s))
        labels = self._draw(torch.randint, 0, config.model.vocab_size, (b, s)) if self.last else None
        if not self.first:  # what the previous stage would send
            received = self._draw(torch.randn, config.tokens_per_rank, b, config.model.hidden_size, dtype=self.dtype)
            self.model.set_input_tensor(received.requires_grad_())
        output = self.module(tokens if self.first else None, self.positions, self.mask, labels=labels)
        return output.float().mean() / config.num_microbatches if self.last else output

    def backward(self, output: torch.Tensor) -> None:
        if self.last:
            output.backward()
        else:  # what the next stage would send back
            torch.autograd.backward(output, grad_tensors=self._draw(torch.randn, output.shape, dtype=output.dtype))

    def iteration(self) -> float | None:
        """One training iteration; the loss on the last stage (None under the symbolic backend,
        whose loss has no value)."""
        if self.config.megatron_optimizer:  # as Megatron-LM's train_step
            self.module.zero_grad_buffer()
            self.optimizer.zero_grad()
        else:
            self.optimizer.zero_grad(set_to_none=False)
        config, microbatches = self.config, self.config.num_microbatches
        if config.symbolic and not config.every_microbatch:
            microbatches = steady_microbatches(self.stage, config.pp, microbatches)
        # Megatron's last stage keeps each microbatch's loss (a 4-byte FP32 scalar) to the end of
        # the iteration: those of the microbatches not run are held from the start.
        losses = [torch.zeros((), device=self.device) for _ in range(config.num_microbatches - microbatches)] \
            if self.last else []
        outputs = {}
        # An optimizer-only probe (symbolic_run.StepProbe) runs no microbatch: the step alone.
        order = [] if self.probe is not None and self.probe.optimizer_only else \
            one_f_one_b(self.stage, config.pp, microbatches)
        for kind, k in order:
            if kind == "F":
                outputs[k] = self.forward()
                if self.last:
                    losses.append(outputs[k].detach())
            else:
                self.backward(outputs.pop(k))
        if self.config.megatron_optimizer:
            self.module.finish_grad_sync()
        else:
            all_reduce_gradients(self.model, self.config.dp)
        if self.probe is not None:
            self.probe.before_step()
        self.optimizer.step()
        if self.probe is not None:
            self.probe.after_step()
        return float(sum(losses)) if self.last and not self.config.symbolic else None


def run_stage(config: StageEmulation, stage: int, probe=None) -> Path:
    """Emulate one stage in this process, which ``process_group`` (``symbolic.fake_world`` for
    the symbolic backend) has set up; returns its rank file. Raises what the stage raised (an
    OOM after recording it, with status "oom"). ``probe``: a ``symbolic_run.StepProbe`` that
    reads the memory around each optimizer step (symbolic backend)."""
    with contextlib.ExitStack() as context:
        if config.symbolic:
            from megatron_hooks.kernels import cuda_kernels
            from megatron_hooks.symbolic import SymbolicBackend

            backend = SymbolicBackend(config.kernels, config.memory_limit_bytes)
            # megatron's compiled functions (the fused SwiGLU) run eagerly, as they always have
            # here (torch.compile skips every frame under the tracker's dispatch mode, and
            # compiled for FakeTensorMode they crashed at real size).
            context.enter_context(torch._dynamo.config.patch(disable=True))
            context.enter_context(backend.mode)  # every tensor on the meta device
            if config.kernels == "cuda":
                context.enter_context(cuda_kernels())
            return _run_stage(config, stage, backend, probe)
        return _run_stage(config, stage, None)


def _run_stage(config: StageEmulation, stage: int, backend, probe=None) -> Path:
    """``run_stage`` with ``backend``, or (None) the backend of the device the stage is built on."""
    from megatron.core import parallel_state

    from megatron_hooks.backends import select_backend
    from megatron_hooks.hooks import LayerMemoryHooks
    from megatron_hooks.recorder import ProfileRecorder

    # Every rank of a real run has its own global memory buffer (the unfused attention's input
    # buffer of the score product), allocated in its first forward pass. A process that runs
    # several stages, or several runs, must not hand one stage's buffer to the next.
    parallel_state.get_global_memory_buffer().buffer.clear()
    emulated = _Stage(config, stage, probe)
    device = next(emulated.model.parameters()).device
    backend = backend or select_backend(device, config.memory_limit_bytes)
    hooks = LayerMemoryHooks(emulated.module, optimizer=emulated.optimizer, backend=backend).install()
    if probe is not None:
        probe.attach(hooks, backend)
    try:
        recorder = ProfileRecorder(hooks, _run_info(config, stage), config.output_dir).start()
        for iteration in range(1, config.iterations + 1):
            # The CPU backend counts a storage until it is freed; one held in a reference cycle
            # is freed whenever Python's collector happens to run, which differs between ranks.
            # As Megatron-LM's --manual-gc: no automatic collection inside an iteration, one
            # before it, so that the bytes measured are the same on every run and TP rank.
            gc.collect()
            gc.disable()
            try:
                with recorder.iteration(iteration) as step:
                    step.loss = emulated.iteration()
            finally:
                gc.enable()
        return recorder.finish()
    finally:
        hooks.remove()
        parallel_state.get_global_memory_buffer().buffer.clear()


def all_reduce_gradients(model: torch.nn.Module, dp: int) -> None:
    """Average the gradients over the data-parallel group (megatron-core's DDP allocates on CUDA)."""
    if dp == 1:
        return
    from megatron.core import parallel_state

    group = parallel_state.get_data_parallel_group()
    for param in model.parameters():
        if param.grad is not None:
            torch.distributed.all_reduce(param.grad, group=group)
            param.grad.div_(dp)


def intra_op_threads(threads: int | None, world_size: int) -> int:
    """Intra-op threads for one rank: ``threads`` where given, else OMP_NUM_THREADS where the user
    set it to a positive count (its first value: libgomp reads "4,2" as nested levels), else the
    machine's cores shared over the ``world_size`` ranks. torch.set_num_threads overrides the
    environment, so the user's setting is honoured here or not at all."""
    if threads:
        return threads
    first = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if first.isdecimal() and int(first) > 0:
        return int(first)
    return max(1, (os.cpu_count() or 1) // world_size)


@contextlib.contextmanager
def process_group(local_rank: int, world_size: int, port: int | None, tp: int, threads: int | None = None
                  ) -> Iterator[None]:
    """This process as rank ``local_rank`` of a ``tp x dp`` gloo group, with megatron-core's
    parallel state (TP ``tp``, one pipeline stage) and, without CUDA, the CPU shim; all undone on
    exit. Any number of runs with this TP and DP may use it, one after the other."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    from megatron_hooks.cpu_shim import CpuShim, needs_shim

    if port is not None:  # spawned here; under torchrun the environment is already set
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(intra_op_threads(threads, world_size))
    shim = CpuShim().install() if needs_shim() else None
    on_cuda = shim is None
    if on_cuda:  # one GPU per process, as torchrun's LOCAL_RANK; NCCL, which runs megatron's collectives
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", local_rank)) % torch.cuda.device_count())
    dist.init_process_group("nccl" if on_cuda else "gloo", rank=local_rank, world_size=world_size)
    try:
        parallel_state.initialize_model_parallel(tp, 1)
        if on_cuda:
            # Megatron-LM's initialize does this: the RNG tracker's model-parallel state, which
            # every dropout region forks (on a CPU the shim makes fork a no-op instead).
            from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

            model_parallel_cuda_manual_seed(CUDA_SEED)
        yield
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
        if shim is not None:
            shim.restore()


def freeze_what_is_imported() -> None:
    """Collect, then move every object alive to the collector's permanent generation (``gc.freeze``).

    An emulation collects garbage before each iteration and after each stage (``_run_stage``:
    as Megatron-LM's --manual-gc, so that a storage a reference cycle holds is freed at the same
    moment on every rank). Each full collection walks every object torch and megatron-core's
    imports made, 0.15 s here: a third of a small symbolic run's time. Frozen, they are not walked
    again. Called as each run starts (``run_stages``, ``run_symbolic``, ``measure_moe_layer``), before
    its first stage is built: every storage its hooks track is born later, so none can be held by a
    frozen cycle (a frozen object is still freed by its reference count); in a process that runs a
    campaign, what earlier runs left alive (megatron-core's caches) is frozen with the imports."""
    import megatron.core.models.gpt.gpt_layer_specs  # noqa: F401 (what megatron_hooks.model builds from)

    gc.collect()
    gc.freeze()


def run_stages(config: StageEmulation, stages: Sequence[int], *, after_oom: str = "raise") -> list[Path]:
    """``run_stage`` for each stage, in a ``process_group`` of ``config``'s TP and DP. With
    ``after_oom="continue"`` a stage that runs out of memory (recorded in its rank file) does not
    stop the others, so that every rank of the run has a file; other errors are raised."""
    from megatron_hooks.recorder import is_out_of_memory

    freeze_what_is_imported()

    written = []
    for stage in stages:
        try:
            written.append(run_stage(config, stage))
        except Exception as exc:
            if after_oom != "continue" or not is_out_of_memory(exc):
                raise
        finally:
            gc.collect()
    return written


def quiet_megatron() -> None:
    """megatron-core's notices on a CPU build (no Apex / Transformer Engine) say nothing about a run."""
    for category in (UserWarning, DeprecationWarning, FutureWarning):
        warnings.filterwarnings("ignore", category=category, module="megatron")


def _worker(local_rank: int, world_size: int, port: int | None, config: StageEmulation, stages: list[int]) -> None:
    quiet_megatron()
    with process_group(local_rank, world_size, port, config.tp, config.threads):
        run_stages(config, stages)


EPHEMERAL_PORTS = Path("/proc/sys/net/ipv4/ip_local_port_range")
"""Linux's range of the ports it gives outgoing connections (and bind to port 0)."""


def _ephemeral_low() -> int:
    try:
        return int(EPHEMERAL_PORTS.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default low end (IANA's dynamic ports, 49152 up, lie above it too)


def free_port() -> int:
    """A TCP port that is free on this machine now, for a rendezvous that binds it seconds later
    (the processes start and import torch first): one below the kernel's ephemeral range, which
    no outgoing connection is given in between. Port 0's pick comes from that range, and in CI
    another test's gloo connection took it first (EADDRINUSE in a spawned emulation's TCPStore,
    and in a torchrun's --master-port). Checked on every interface, as the store binds."""
    import random

    low = _ephemeral_low()
    below = range(max(1024, low // 2), low)  # none under 1024: privileged
    for port in random.sample(below, min(64, len(below))):
        with socket.socket() as sock:
            try:
                sock.bind(("", port))
            except OSError:  # taken, or in TIME_WAIT (no SO_REUSEADDR here: skipped too)
                continue
            return port
    with socket.socket() as sock:  # a range that leaves none: the kernel's pick, as before
        sock.bind(("", 0))
        return sock.getsockname()[1]


def _checked(config: StageEmulation, stages: Sequence[int] | None) -> list[int]:
    """The stages to run (default: all), checked; the output directory, created."""
    stages = list(range(config.pp)) if stages is None else list(stages)
    for stage in stages:
        if not 0 <= stage < config.pp:
            raise AdvisorError(f"stage {stage} is not in a pipeline of {config.pp} stages (0..{config.pp - 1})")
    config.output_dir.mkdir(parents=True, exist_ok=True)
    return stages


def emulate_stages(config: StageEmulation, stages: Sequence[int] | None = None) -> list[Path]:
    """Emulate ``stages`` (default: all) of ``config`` in ``tp x dp`` spawned processes.

    Returns the rank files written. Raises the worker's exception (an OOM is recorded in the
    rank file first, with status "oom").
    """
    stages = _checked(config, stages)
    world = config.tp * config.dp
    torch.multiprocessing.start_processes(_worker, args=(world, free_port(), config, stages), nprocs=world,
                                          start_method="spawn", join=True)
    from advisor.profiles import rank_file_name

    return [config.output_dir / rank_file_name(config.global_rank(stage, t, d))
            for stage in stages for d in range(config.dp) for t in range(config.tp)]


def emulate_under_torchrun(config: StageEmulation, stages: Sequence[int] | None = None) -> None:
    """Run this process's share when ``torchrun --nproc-per-node tp*dp`` started it."""
    world = int(os.environ["WORLD_SIZE"])
    if world != config.tp * config.dp:
        raise AdvisorError(f"torchrun started {world} processes; TP x DP = {config.tp * config.dp}")
    _worker(int(os.environ["RANK"]), world, None, config, _checked(config, stages))

