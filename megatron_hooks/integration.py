"""Install the layer hooks into a Megatron-LM run without editing the user's checkout.

Megatron-LM's ``pretrain_gpt.py`` calls ``megatron.training.pretrain``, whose signature
changed: core_v0.15.2 takes ``(datasets_provider, model_provider, model_type, forward_step, ...)``
and builds the model chunks with ``get_model(model_provider)``; core_v0.19.0 takes
``(config_container, datasets_provider, model_type, forward_step, model_provider=None, ...)`` and
its ``pretrain_gpt.py`` passes no provider: the model is built from the config container by a
model builder. Both build the chunks inside ``setup_model_and_optimizer``, which returns them,
and both run ``megatron.training.training.train_step(...)`` once per iteration.
``install(output_dir)`` patches exactly these names, before the script runs, and so hooks the
model however it is built, without depending on ``pretrain``'s arguments:

- ``megatron.training.training.setup_model_and_optimizer`` (which ``pretrain`` looks up when it
  runs) becomes a wrapper that puts the hooks on the chunks it returns (unless a wrapped model
  provider already did);
- ``megatron.training.pretrain`` and ``megatron.training.training.pretrain`` (the script does
  ``from megatron.training import pretrain``) become a wrapper that writes the final status when
  training ends, whatever arguments it takes (none after Ctrl-C: the file stays "running");
- ``megatron.training.training.train_step`` (which ``train()`` looks up at each call) becomes a
  wrapper that brackets every iteration: ``LayerMemoryHooks.begin_iteration`` /
  ``end_iteration`` around the original, records written after each one, and an OOM recorded
  with how far it got before it propagates.

The launcher then runs the user's script in-process::

    from megatron_hooks import integration
    session = integration.install("profiles/run-1")
    runpy.run_path(f"{megatron_lm}/pretrain_gpt.py", run_name="__main__")
    session.uninstall()

The run's description (model, parallel sizes and coordinates, sequence length, micro and
global batch size, microbatches, layers per stage, dtype, layer spec, sequence parallelism,
recomputation, distributed optimizer, the iterations it was asked to run) comes from Megatron's parsed arguments
(``megatron.training.get_args()``), ``megatron.core.parallel_state`` and
``megatron.core.num_microbatches_calculator``, read at the first iteration. The run id is rank
0's, broadcast to every rank then. Each rank writes ``output_dir/rank{RANK:05d}.jsonl``.
"""

from __future__ import annotations

import contextlib
import functools
import math
import uuid
from pathlib import Path
from typing import Any, Callable

import torch

from advisor.megatron_log import MIB
from advisor.memory import in_flight_microbatches
from advisor.models import LlamaSpec
from advisor.parallel import ParallelConfig
from megatron_hooks.backends import MemoryBackend
from megatron_hooks.hooks import LayerMemoryHooks
from megatron_hooks.model import dtype_name
from megatron_hooks.recorder import ProfileRecorder, RunInfo

_ACTIVE: "Session | None" = None


class Session:
    """The hooks, the recorder and the patches of one profiled Megatron run on this rank."""

    def __init__(self, output_dir: str | Path, run_id: str | None = None,
                 backend: MemoryBackend | None = None) -> None:
        self.output_dir = Path(output_dir)
        self.run_id = run_id
        self.backend = backend
        self.chunks: list[torch.nn.Module] = []
        self.hooks: LayerMemoryHooks | None = None
        self.recorder: ProfileRecorder | None = None
        self.iterations = 0
        self._patches: list[tuple[object, str, object]] = []

    # --- model provider ----------------------------------------------------------------

    def wrap_model_provider(self, model_provider: Callable) -> Callable:
        """A provider that builds each chunk with ``model_provider`` and puts the hooks on it."""

        @functools.wraps(model_provider)
        def provider(*args, **kwargs):
            chunk = model_provider(*args, **kwargs)
            self.add_chunks(chunk if isinstance(chunk, list) else [chunk])
            return chunk

        return provider

    def add_chunks(self, chunks: list[torch.nn.Module]) -> None:
        """Hook these chunks too (Megatron builds one per virtual pipeline stage)."""
        self.chunks += chunks
        if self.hooks is not None:
            self.hooks.remove()
        self.hooks = LayerMemoryHooks(self.chunks, backend=self.backend).install()

    # --- iterations ----------------------------------------------------------------------

    def wrap_train_step(self, train_step: Callable) -> Callable:
        @functools.wraps(train_step)
        def step(forward_step_func, data_iterator, model, optimizer, *args, **kwargs):
            if self.hooks is None:  # the model provider was not wrapped: hook what train_step gets
                self.add_chunks(list(model) if isinstance(model, (list, tuple)) else [model])
            if self.recorder is None:
                self.recorder = ProfileRecorder(self.hooks, self._run_info(), self.output_dir).start()
            self.iterations += 1
            with self.recorder.iteration(self.iterations, optimizer=optimizer) as result:
                returned = train_step(forward_step_func, data_iterator, model, optimizer, *args, **kwargs)
                result.loss = _loss_of(returned)
            return returned

        return step

    def finish(self) -> None:
        """Write the final status ("ok" unless an iteration failed); the ranks Megatron's memory
        report prints for print their peaks (``peak_line``)."""
        if self.recorder is None:
            return
        self.recorder.finish()
        if self.recorder.iterations and self.recorder.run.coords.get("dp", 0) == 0:
            print(peak_line(self.recorder, self.hooks.backend.name, rank=_rank()), flush=True)

    def interrupt(self) -> None:
        """Ctrl-C between iterations is a kill, as inside one (``ProfileRecorder.interrupt``): the
        file stays "running", so the run is redone. Audit: a real run stopped after 2 of its 4
        iterations, outside ``train_step``, ended "ok"; 'advisor profile run' then counted it
        complete and skipped it on resuming, and 'recommend' priced it."""
        if self.recorder is not None:
            self.recorder.interrupt()

    def _run_info(self) -> RunInfo:
        from megatron.training import get_args

        return run_info_from_megatron(get_args(), self.hooks, self._agreed_run_id())

    def _agreed_run_id(self) -> str:
        run_id = [self.run_id or f"megatron-{uuid.uuid4().hex[:12]}"]
        if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            torch.distributed.broadcast_object_list(run_id, src=0)
        return run_id[0]

    # --- patches -------------------------------------------------------------------------

    def patch(self) -> "Session":
        import megatron.training
        import megatron.training.training as training

        pretrain = self._wrap_pretrain(training.pretrain)
        self._set(megatron.training, "pretrain", pretrain)
        self._set(training, "pretrain", pretrain)
        self._set(training, "setup_model_and_optimizer", self._wrap_setup(training.setup_model_and_optimizer))
        self._set(training, "train_step", self.wrap_train_step(training.train_step))
        return self

    def _wrap_setup(self, setup: Callable) -> Callable:
        @functools.wraps(setup)
        def setup_with_hooks(*args, **kwargs):
            model, *rest = setup(*args, **kwargs)
            if self.hooks is None:  # built by core_v0.19.0's model builder, or by an unwrapped provider
                self.add_chunks(list(model) if isinstance(model, (list, tuple)) else [model])
            return (model, *rest)

        return setup_with_hooks

    def _wrap_pretrain(self, pretrain: Callable) -> Callable:
        @functools.wraps(pretrain)
        def profiled_pretrain(*args, **kwargs):
            # Megatron's --exit-interval, --exit-duration-in-mins and SIGTERM leave train() by
            # sys.exit, and a failed iteration by its exception: each still ends the profile
            try:
                result = pretrain(*args, **kwargs)
            except KeyboardInterrupt:
                self.interrupt()
                raise
            except BaseException:
                with contextlib.suppress(Exception):  # the run's own exception is the one to see
                    self.finish()
                raise
            self.finish()
            return result

        return profiled_pretrain

    def _set(self, owner: object, name: str, value: object) -> None:
        self._patches.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def uninstall(self) -> None:
        """Undo the patches and take the hooks off the model."""
        global _ACTIVE
        for owner, name, old in reversed(self._patches):
            setattr(owner, name, old)
        self._patches.clear()
        if self.hooks is not None:
            self.hooks.remove()
        if _ACTIVE is self:
            _ACTIVE = None


def _rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def peak_line(recorder: ProfileRecorder, backend: str, *, rank: int) -> str:
    """This rank's peak over the run's completed iterations, in Megatron's units, printed by the
    ranks Megatron's ``report_memory`` prints for (data-parallel rank 0, every CP rank: core_v0.15.2
    ``training/utils.py``, ``get_data_parallel_rank(with_context_parallel=False)``; core_v0.19.0
    its ``pg_collection.dp``), and read by ``advisor compare-log`` (``advisor.megatron_log``). On
    CUDA the hooks reset torch's peak counters at every layer's entry (``LayerMemoryHooks._enter``:
    there is no other way to read one layer's transient peak), so Megatron's own "max allocated"
    lines, which read ``torch.cuda.max_memory_allocated``, count only from the last reset: on an
    H200, core_v0.19.0 printed 42,462 MB after iteration 2, whose peak was 56,035 MB
    (benchmarks/gpu/data/h200_megatron_launch). Rank 0's line says so."""
    reserved = recorder.peak_reserved_bytes
    line = (f"megatron_hooks: [Rank {rank}] peak over {recorder.iterations} iterations: "
            f"{recorder.peak_allocated_bytes / MIB:.2f} MB allocated"
            + (f", {reserved / MIB:.2f} MB reserved" if reserved is not None else ""))
    if rank == 0:
        line += f" (every rank's: advisor profile show {recorder.directory})"
        if backend == "cuda":
            line += ("; the hooks reset torch's peak counters at each layer, so Megatron's 'max allocated' "
                     "lines above count only since the last layer began")
    return line


def install(output_dir: str | Path, *, run_id: str | None = None, backend: MemoryBackend | None = None) -> Session:
    """Patch ``megatron.training`` so that the next ``pretrain(...)`` call is profiled.

    Call it after the user's checkout is importable (on ``sys.path``) and before their
    ``pretrain_gpt.py`` runs; ``Session.uninstall()`` undoes it. ``run_id`` defaults to a new
    id from rank 0; ``backend`` to the one that suits the model's device.
    """
    global _ACTIVE
    if _ACTIVE is not None:
        raise RuntimeError("megatron_hooks is already installed; call uninstall() first")
    _ACTIVE = Session(output_dir, run_id, backend).patch()
    return _ACTIVE


def wrap_model_provider(model_provider: Callable, output_dir: str | Path | None = None) -> Callable:
    """Wrap a Megatron model provider so that the hooks go on every chunk it builds.

    Inside an ``install()``-ed run this joins that session; otherwise it starts one that writes
    to ``output_dir`` and whose iterations are bracketed by ``Session.wrap_train_step``.
    """
    global _ACTIVE
    if _ACTIVE is None:
        if output_dir is None:
            raise ValueError("wrap_model_provider needs an output_dir when megatron_hooks is not installed")
        _ACTIVE = Session(output_dir)
    return _ACTIVE.wrap_model_provider(model_provider)


def _loss_of(returned: Any) -> float | None:
    """The LM loss in ``train_step``'s result (a dict of reduced losses, on the last stage)."""
    losses = returned[0] if isinstance(returned, tuple) and returned else None
    if not isinstance(losses, dict) or not losses:
        return None
    value = losses.get("lm loss", next(iter(losses.values())))
    return float(value.item() if isinstance(value, torch.Tensor) else value)


# --- the run's description, from Megatron's arguments --------------------------------------


def spec_from_args(args) -> LlamaSpec:
    """The model Megatron built, from its parsed arguments (the vocabulary as padded)."""
    heads = args.num_attention_heads
    kv_channels = getattr(args, "kv_channels", None)
    return LlamaSpec(
        name=f"megatron-args[L={args.num_layers},h={args.hidden_size}]",
        num_layers=args.num_layers, hidden_size=args.hidden_size,
        ffn_hidden_size=args.ffn_hidden_size or 4 * args.hidden_size, num_attention_heads=heads,
        num_query_groups=args.num_query_groups if getattr(args, "group_query_attention", False) else heads,
        vocab_size=getattr(args, "padded_vocab_size", None) or args.vocab_size,
        tie_embeddings=not getattr(args, "untie_embeddings_and_output_weights", False),
        kv_channels=None if kv_channels in (None, args.hidden_size // heads) else kv_channels,
        add_qkv_bias=bool(getattr(args, "add_qkv_bias", False)),
        qk_layernorm=bool(getattr(args, "qk_layernorm", False)),
        rotary_base=float(getattr(args, "rotary_base", 10000)),
        rope_scaling_factor=float(args.rope_scaling_factor) if getattr(args, "use_rope_scaling", False) else None,
        norm_epsilon=float(getattr(args, "norm_epsilon", 1e-5)),
    )


def layers_per_stage(config, pp: int, vpp: int | None) -> tuple[int, ...]:
    """Decoder layers on each pipeline rank, as megatron-core splits them."""
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    layout = getattr(config, "pipeline_model_parallel_layout", None)
    if layout is not None:
        return tuple(sum(chunk.count(LayerType.decoder) for chunk in layout.layout[rank]) for rank in range(pp))
    ends = (config.num_layers_in_first_pipeline_stage, config.num_layers_in_last_pipeline_stage)
    if pp == 1 and ends == (None, None):  # with uneven ends, PP 1 builds the end's count (get_num_layers_to_build)
        return (config.num_layers,)
    stages = range(vpp) if vpp else [None]
    return tuple(sum(get_num_layers_to_build(config, vp_stage=v, pp_rank=rank) for v in stages) for rank in range(pp))


def run_info_from_megatron(args, hooks: LayerMemoryHooks, run_id: str) -> RunInfo:
    from megatron.core import parallel_state as ps

    try:
        from megatron.core.num_microbatches_calculator import get_num_microbatches

        microbatches = get_num_microbatches()
    except (ImportError, AssertionError, AttributeError):
        microbatches = args.global_batch_size // (args.micro_batch_size * args.data_parallel_size)
    vpp = getattr(args, "virtual_pipeline_model_parallel_size", None)
    pp = args.pipeline_model_parallel_size
    parallel = ParallelConfig(tp=args.tensor_model_parallel_size, cp=getattr(args, "context_parallel_size", 1),
                              pp=pp, dp=args.data_parallel_size, mbs=args.micro_batch_size, vpp=vpp or 1)
    pp_rank = ps.get_pipeline_model_parallel_rank()
    return RunInfo(
        run_id=run_id, model=spec_from_args(args), parallel=parallel, seq_len=args.seq_length,
        global_batch_size=args.global_batch_size, num_microbatches=microbatches,
        layers_per_stage=layers_per_stage(hooks.models[0].config, pp, vpp),
        rank=torch.distributed.get_rank(), world_size=torch.distributed.get_world_size(),
        coords={"tp": ps.get_tensor_model_parallel_rank(), "cp": ps.get_context_parallel_rank(), "pp": pp_rank,
                "dp": ps.get_data_parallel_rank()},
        # What the schedule should hold (seed 004, Section 3.2.2); the hooks' measurement replaces it.
        in_flight_microbatches=math.ceil(in_flight_microbatches(pp_rank, pp, vpp or 1, microbatches)),
        params_dtype=dtype_name(args.params_dtype), layer_spec=getattr(args, "transformer_impl", "transformer_engine"),
        sequence_parallel=bool(getattr(args, "sequence_parallel", False)),
        recompute=getattr(args, "recompute_granularity", None) or "none",
        distributed_optimizer=bool(getattr(args, "use_distributed_optimizer", False)),
        asked_iterations=asked_iterations(args),
    )


def asked_iterations(args) -> int | None:
    """The iterations Megatron's ``train`` loops over in this process: ``while iteration <
    args.train_iters`` from ``iteration = args.iteration`` (the checkpoint's, 0 for a fresh run;
    core_v0.15.2 ``megatron/training/training.py``, ``train``). With --train-samples,
    ``update_train_iters`` has set ``args.train_iters`` before the first iteration; where it is
    still None, unknown (None)."""
    total = getattr(args, "train_iters", None)
    if total is None:
        return None
    return max(int(total) - int(getattr(args, "iteration", 0) or 0), 0)
