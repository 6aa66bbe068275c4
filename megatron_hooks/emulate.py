"""``python -m megatron_hooks.emulate``: the pipeline-stage emulator's command line.

The emulator itself is ``megatron_hooks/stage_emulation.py``; this module imports it (and torch)
only when a run starts, so ``--help`` needs neither, and a run without them is one line and exit
status 2, not a traceback (``require_runtime``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from advisor import limits
from advisor.cli.options import GIB as GIB_TYPE
from advisor.cli.options import (Bounded, NonEmpty, OneLineCommand, OutDirectory, model_options, parse_layer_counts,
                                 wrote)
from advisor.memory import GIB
from advisor.profiles import PARAMS_DTYPES


def _layer_counts(ctx, param, value: str) -> tuple[int, ...]:
    try:
        return parse_layer_counts(value)
    except ValueError as error:
        raise click.BadParameter(str(error)) from None


def require_runtime() -> None:
    """Exit with one line (status 2) unless torch and megatron-core can be imported."""
    from advisor.capture.relay import missing_modules

    if missing := missing_modules():
        click.echo(f"Error: python -m megatron_hooks.emulate needs torch and megatron-core, and "
                   f"{' and '.join(missing)} cannot be imported here: pip install torch && pip install -e '.[megatron]'",
                   err=True)
        sys.exit(2)


@click.command(cls=OneLineCommand, context_settings={"help_option_names": ["-h", "--help"]})
@model_options
@click.option("--layers-per-stage", type=NonEmpty("give one layer count per stage, for example 7,9,9,7"),
              required=True, callback=_layer_counts, metavar="N,N,...",
              help="Decoder layers on each pipeline stage, first to last (they sum to the model's layers); "
                   "LxN is N stages of L layers.")
@click.option("--stage", "stages", type=Bounded(limits.STAGE_INDEX), multiple=True,
              help="0-based stage to emulate (repeat for several). Default: every stage.")
@click.option("--seq-len", type=Bounded(limits.SEQ_LEN), required=True, help="Sequence length s.")
@click.option("--mbs", type=Bounded(limits.MICRO_BATCH), default=1, show_default=True, help="Micro-batch size b.")
@click.option("--num-microbatches", type=Bounded(limits.PROFILING_MICROBATCHES), default=1, show_default=True,
              help="Microbatches per iteration (m).")
@click.option("--iterations", type=Bounded(limits.PROFILING_ITERATIONS), default=2, show_default=True)
@click.option("--tp", type=Bounded(limits.DEGREE), default=1, show_default=True, help="Tensor parallel size.")
@click.option("--dp", type=Bounded(limits.DEGREE), default=1, show_default=True, help="Data parallel size.")
@click.option("--cp", type=Bounded(limits.DEGREE), default=1, show_default=True,
              help="Context parallel size (symbolic backend, transformer_engine spec).")
@click.option("--dtype", type=click.Choice(PARAMS_DTYPES), default="float32",
              show_default=True, help="Dtype of weights and activations.")
@click.option("--backend", type=click.Choice(["cpu", "symbolic"]), default="cpu", show_default=True,
              help="cpu: real tensors, measured; symbolic: fake tensors (no storage), any size, in this process.")
@click.option("--layer-spec", type=click.Choice(["local", "transformer_engine"]), default="local",
              show_default=True, help="megatron-core's local modules, or Transformer Engine's (symbolic: stand-ins).")
@click.option("--kernels", type=click.Choice(["cuda", "cpu"]), default=None,
              help="Symbolic backend: stand-ins for the CUDA kernels (default) or torch's CPU paths.")
@click.option("--sequence-parallel", is_flag=True, help="Megatron's --sequence-parallel (symbolic backend).")
@click.option("--distributed-optimizer", is_flag=True,
              help="Megatron's --use-distributed-optimizer (symbolic backend).")
@click.option("--optimizer", type=click.Choice(["megatron", "torch"]), default=None,
              help="megatron-core's DDP and Adam (symbolic default) or torch's fused Adam on plain gradients (cpu).")
@click.option("--threads", type=Bounded(limits.threads()), default=None,
              help="Intra-op threads per process (default: cores / (TP x DP)).")
@click.option("--memory-limit", type=GIB_TYPE, default=None, metavar="GIB",
              help="Memory of the emulated GPU in GiB: a rank that needs more records an OOM (default: none).")
@click.option("--run-id", type=NonEmpty("give the run's id, or leave it out for a new one"), default=None,
              help="Run id in the headers (default: a new one).")
@click.option("--out", "output_dir", type=OutDirectory(path_type=Path), required=True,
              help="Run directory for the rank*.jsonl files.")
def main(spec, layers_per_stage, stages, seq_len, mbs, num_microbatches, iterations, tp, dp, cp, dtype, backend,
         layer_spec, kernels, sequence_parallel, distributed_optimizer, optimizer, threads, memory_limit, run_id,
         output_dir) -> None:
    """Emulate pipeline stages of a Llama model on the CPU and profile memory layer by layer.

    Each stage runs its microbatches in 1F1B order with real megatron-core modules, in TP x DP
    gloo processes (spawned here, or the processes of torchrun when it started this), and
    writes the rank files that the same ranks of a real run would write (emulated: true).
    With --backend symbolic the stages run on fake tensors in this process, at any size, with
    megatron-core's optimizer and stand-ins for the CUDA kernels (megatron_hooks/symbolic.py).

    \b
    Examples:
      python -m megatron_hooks.emulate --model llama3.1-8b --num-layers 8 --hidden-size 256 \\
          --ffn-hidden-size 512 --num-attention-heads 4 --num-query-groups 2 --vocab-size 1024 \\
          --layers-per-stage 3,3,2 --seq-len 128 --num-microbatches 4 --out profiles/uneven
      python -m megatron_hooks.emulate ... --stage 1 --tp 2 --out profiles/stage1
      python -m megatron_hooks.emulate --model llama3.1-8b --layers-per-stage 8,8,8,8 --seq-len 8192 \\
          --num-microbatches 4 --dtype bfloat16 --backend symbolic --layer-spec transformer_engine \\
          --out profiles/8b-pp4
    """
    require_runtime()
    from torch.multiprocessing import ProcessExitedException, ProcessRaisedException

    from megatron_hooks.stage_emulation import StageEmulation, emulate_stages, emulate_under_torchrun, quiet_megatron

    quiet_megatron()

    values = dict(model=spec, layers_per_stage=layers_per_stage, seq_len=seq_len, output_dir=output_dir,
                  micro_batch_size=mbs, num_microbatches=num_microbatches, iterations=iterations, tp=tp, dp=dp,
                  cp=cp, params_dtype=dtype, backend=backend, layer_spec=layer_spec, kernels=kernels,
                  sequence_parallel=sequence_parallel, distributed_optimizer=distributed_optimizer,
                  megatron_optimizer=None if optimizer is None else optimizer == "megatron", threads=threads,
                  memory_limit_bytes=None if memory_limit is None else int(memory_limit * GIB))
    under_torchrun = "WORLD_SIZE" in os.environ and "RANK" in os.environ
    # Every process of one run needs the same id; torchrun gives its processes one.
    run_id = run_id or (os.environ.get("TORCHELASTIC_RUN_ID") if under_torchrun else None)
    if run_id:
        values["run_id"] = run_id
    config = StageEmulation(**values)
    chosen = list(stages) or None
    if config.symbolic:
        from advisor.profiles import load_run
        from megatron_hooks.stage_emulation import _checked
        from megatron_hooks.symbolic_run import run_symbolic


        for path in run_symbolic(config, _checked(config, chosen), after_oom="continue"):
            wrote(path)
        oom = [rank for rank in load_run(output_dir).ranks if rank.status == "oom"]
        if oom:  # recorded in the rank files, as the CPU emulator's workers do
            raise click.ClickException(f"rank {oom[0].header.rank} ran out of the emulated memory at {oom[0].where} "
                                       f"({len(oom)} rank(s) in all; see the rank files in {output_dir})")
        return
    if under_torchrun:
        emulate_under_torchrun(config, chosen)
        return
    try:
        paths = emulate_stages(config, chosen)
    except (ProcessRaisedException, ProcessExitedException) as exc:
        # Not bad input: a worker died (an OOM among others); its rank file records how far it got.
        last = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise click.ClickException(f"an emulation process failed: {last} (see the rank files in {output_dir})")
    for path in paths:
        wrote(path)


if __name__ == "__main__":
    main()
