"""Real megatron-core Llama layers on one GPU against their symbolic profile and seed 004.

Unattended, one GPU, under 8 minutes; each part is guarded, so that one failure keeps the rest:

1. ``cuda``: the CUDA backend's records of real megatron-core Llama-3.1-8B layers (hidden 4096,
   FFN 14336, 32 heads, 8 KV heads, vocabulary 128256) at sequence 8192, MBS 1, BF16, local spec
   (no Transformer Engine on the machine), three 1-layer stages (first: embedding; middle; last:
   final norm, LM head, loss), 2 microbatches in 1F1B order, 2 iterations
   (``megatron_hooks.stage_emulation``; the rank files go to ``OUT/cuda``).
2. ``symbolic``: the same configuration under the symbolic backend, with the CUDA kernel
   stand-ins (``OUT/symbolic-cuda``) and with torch's CPU paths (``OUT/symbolic-cpu``), and every
   per-layer term of both against the CUDA records and against seed 004's Eq. 12-14 / Eq. 6-9
   (``advisor.profile_report.compare_rank``): ``OUT/comparison.json``.
3. ``peaks``: each CUDA iteration's peak allocated against its peak reserved (what the caching
   allocator holds beyond the tensors) and its allocation retries.
4. ``overhead``: the hooks' cost on a GPU training step (8B-shaped, 4 layers, sequence 4096,
   2 microbatches): rounds of steps without and with the hooks in alternating blocks; medians,
   interquartile ranges and per-round ratios.
5. ``times``: per-layer forward and backward times (CUDA events) from the records of part 1 and
   of the profiled steps of part 4, against each step's time.
6. ``stand_ins``: the saved tensors (shapes, dtypes) of torch's CUDA RMSNorm against the
   symbolic backend's stand-in.

Run on the GPU machine, from the repository root, with a copy of Megatron-LM core_v0.15.2 first
on the path (Python 3.12, torch 2.11, no Transformer Engine or Apex)::

    PYTHONPATH=/tmp/megatron-lm-core_v0.15.2:. python3 benchmarks/gpu/measure_layers.py OUT

and commit ``OUT`` as ``benchmarks/gpu/data/h100_layers/``. On a CPU, ``--device cpu --tiny``
runs every part on a tiny model in about two minutes (what the tests do, to catch errors).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

DEADLINE_S = 450.0
"""Parts not started by then are skipped (the machine's limit is 10 minutes a command)."""


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="directory for the results (created; must not hold results)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a tiny model and sequence (a quick check of the script)")
    parser.add_argument("--deadline", type=float, default=DEADLINE_S,
                        help="seconds after which parts not started are skipped")
    return parser.parse_args()


def shapes(tiny: bool) -> dict:
    from advisor.models import preset, with_overrides

    if tiny:
        spec = with_overrides(preset("llama3.1-8b"), num_layers=3, hidden_size=64, ffn_hidden_size=224,
                              num_attention_heads=4, num_query_groups=2, vocab_size=512)
        return {"spec": spec, "seq": 64, "overhead": (with_overrides(spec, num_layers=4), 32), "rounds": 3}
    spec = with_overrides(preset("llama3.1-8b"), num_layers=3)  # three 8B layers: one per stage
    return {"spec": spec, "seq": 8192, "overhead": (with_overrides(spec, num_layers=4), 4096), "rounds": 8}


def stage_config(spec, seq: int, out: Path, **changes):
    from megatron_hooks.stage_emulation import StageEmulation

    values = dict(model=spec, layers_per_stage=(1,) * spec.num_layers, seq_len=seq, output_dir=out,
                  micro_batch_size=1, num_microbatches=2, iterations=2, params_dtype="bfloat16", threads=None,
                  run_id=f"measure-layers-{out.name}")
    values.update(changes)
    return StageEmulation(**values)


@contextlib.contextmanager
def one_process(device: str):
    """This process as the one rank of an emulation (NCCL on a GPU, gloo on the CPU)."""
    from megatron_hooks.stage_emulation import free_port, process_group

    if device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    with process_group(0, 1, free_port(), 1, None):
        yield
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()


def part_cuda(args, shape) -> dict:
    from advisor.profiles import load_run
    from megatron_hooks.stage_emulation import run_stages

    config = stage_config(shape["spec"], shape["seq"], args.out / args.device)
    config.output_dir.mkdir(parents=True)
    started = time.perf_counter()
    with one_process(args.device):
        run_stages(config, range(config.pp))
    run = load_run(config.output_dir)
    return {"seconds": time.perf_counter() - started, "status": run.status, "backend": run.header.backend,
            "device": run.header.device, "ranks": len(run.ranks)}


def _byte_terms(rank, iteration) -> dict:
    fields = ("parameter_bytes", "gradient_bytes", "optimizer_bytes", "activation_bytes", "forward_peak_bytes",
              "backward_peak_bytes")
    return {r.name: {f: getattr(r, f) for f in fields} for r in rank.layers_of(iteration)}


def part_symbolic(args, shape) -> dict:
    from advisor.profile_report import compare_rank
    from advisor.profiles import load_run
    from megatron_hooks.symbolic_run import run_symbolic

    result, runs = {}, {}
    for kernels in ("cuda", "cpu"):
        config = stage_config(shape["spec"], shape["seq"], args.out / f"symbolic-{kernels}", backend="symbolic",
                              kernels=kernels, megatron_optimizer=False)  # the emulator's optimizer, as part 1
        config.output_dir.mkdir(parents=True)
        started = time.perf_counter()
        run_symbolic(config, range(config.pp))
        result[f"{kernels}_kernels_seconds"] = time.perf_counter() - started
        runs[f"symbolic-{kernels}"] = load_run(config.output_dir)
    cuda_dir = args.out / args.device
    if any(cuda_dir.glob("rank*.jsonl")):
        runs[args.device] = load_run(cuda_dir)
    comparison = []
    for rank_index in range(shape["spec"].num_layers):
        entry = {"rank": rank_index, "modules": {}, "seed004": {}}
        for name, run in runs.items():
            rank = next(r for r in run.ranks if r.header.rank == rank_index)
            last = max(it.iteration for it in rank.iterations)
            entry["modules"][name] = _byte_terms(rank, last)
            entry["seed004"][name] = [row.to_dict() for row in compare_rank(rank)]
            entry.setdefault("iterations", {})[name] = [
                {"iteration": it.iteration, "peak_allocated_bytes": it.peak_allocated_bytes,
                 "peak_reserved_bytes": it.peak_reserved_bytes, "static_bytes": it.static_bytes}
                for it in rank.iterations]
        comparison.append(entry)
    (args.out / "comparison.json").write_text(json.dumps(comparison, indent=1) + "\n")
    if args.device in runs:  # the headline: the stand-ins' activations against the GPU's, per module
        result["activation_bytes"] = {
            f"rank {e['rank']} {module}": {name: e["modules"][name][module]["activation_bytes"] for name in runs}
            for e in comparison for module in e["modules"][args.device]}
    return result


def part_peaks(args, shape) -> dict:
    from advisor.profiles import load_run

    run = load_run(args.out / args.device)
    rows = []
    for rank in run.ranks:
        for it in rank.iterations:
            rows.append({"rank": rank.header.rank, "iteration": it.iteration,
                         "peak_allocated_bytes": it.peak_allocated_bytes, "peak_reserved_bytes": it.peak_reserved_bytes,
                         "reserved_over_allocated": (it.peak_reserved_bytes / it.peak_allocated_bytes
                                                     if it.peak_reserved_bytes else None),
                         "alloc_retries": it.alloc_retries})
    return {"iterations": rows}


def _step_seconds(stage, sync) -> float:
    sync()
    started = time.perf_counter()
    stage.iteration()
    sync()
    return time.perf_counter() - started


def part_overhead(args, shape) -> dict:
    import torch

    from megatron_hooks.stage_emulation import _Stage
    from megatron_hooks.hooks import LayerMemoryHooks

    spec, seq = shape["overhead"]
    config = stage_config(spec, seq, args.out / "overhead", layers_per_stage=(spec.num_layers,))
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    plain, hooked, ratios, layer_times = [], [], [], []
    with one_process(args.device):
        stage = _Stage(config, 0)
        hooks = LayerMemoryHooks(stage.module, optimizer=stage.optimizer)
        for _ in range(2):  # warm-up: allocator, cuBLAS handles, the optimizer's states
            _step_seconds(stage, sync)
        for _ in range(shape["rounds"]):
            without = [_step_seconds(stage, sync) for _ in range(3)]
            hooks.install()
            with_hooks = []
            for step in range(3):
                hooks.begin_iteration(step + 1, optimizer=stage.optimizer)
                seconds = _step_seconds(stage, sync)
                measured = hooks.end_iteration()
                with_hooks.append(seconds)
                layer_times.append({"step_s": seconds, "layers": [
                    {"name": r.name, "forward_time_s": r.forward_time_s, "backward_time_s": r.backward_time_s}
                    for r in measured.layers]})
            hooks.remove()
            plain += without
            hooked += with_hooks
            ratios.append(statistics.median(with_hooks) / statistics.median(without) - 1)
        del stage, hooks
        gc.collect()

    def summary(values):
        q = statistics.quantiles(values, n=4)
        return {"median_s": statistics.median(values), "q1_s": q[0], "q3_s": q[2], "n": len(values)}

    return {"model": spec.to_dict(), "seq_len": seq, "microbatches": config.num_microbatches,
            "without_hooks": summary(plain), "with_hooks": summary(hooked),
            "overhead": statistics.median(hooked) / statistics.median(plain) - 1,
            "per_round": ratios, "profiled_steps": layer_times}


def part_times(args, shape, overhead: dict | None) -> dict:
    from advisor.profiles import load_run

    run = load_run(args.out / args.device)
    stages = []
    for rank in run.ranks:
        last = max(it.iteration for it in rank.iterations)
        it = next(i for i in rank.iterations if i.iteration == last)
        records = rank.layers_of(last)
        stages.append({"rank": rank.header.rank, "step_time_s": it.step_time_s,
                       "microbatches": rank.header.num_microbatches,
                       "layers": [{"name": r.name, "forward_time_s": r.forward_time_s,
                                   "backward_time_s": r.backward_time_s} for r in records],
                       "inside_regions_s": rank.header.num_microbatches * sum(
                           (r.forward_time_s or 0) + (r.backward_time_s or 0) for r in records)})
    return {"stages": stages, "overhead_steps": (overhead or {}).get("profiled_steps", [])[-3:]}


def part_stand_ins(args, shape) -> dict:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from megatron_hooks.kernels import fused_rms_norm

    def saved(device, fake):
        out = []
        hooks = torch.autograd.graph.saved_tensors_hooks(lambda t: out.append([list(t.shape), str(t.dtype)]) or t,
                                                         lambda t: t)
        context = FakeTensorMode() if fake else contextlib.nullcontext()
        with context:
            x = torch.randn(512, 1, 4096, dtype=torch.bfloat16, device=device, requires_grad=True)
            norm = torch.nn.RMSNorm(4096, eps=1e-5, device=device, dtype=torch.bfloat16)
            with hooks:
                (fused_rms_norm(x, (4096,), norm.weight, 1e-5) if fake else norm(x)).sum()
        return out

    real = saved(args.device, fake=False)
    stand_in = saved("cpu", fake=True)
    return {"torch_rms_norm_on_" + args.device: real, "stand_in": stand_in, "equal": sorted(real) == sorted(stand_in)}


def main() -> int:
    args = parse()
    warnings.filterwarnings("ignore")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: use --device cpu", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    if any(args.out.iterdir()):
        print(f"{args.out} is not empty", file=sys.stderr)
        return 2
    from megatron_hooks.stage_emulation import quiet_megatron
    from megatron_hooks.recorder import megatron_core_version

    quiet_megatron()
    shape = shapes(args.tiny)
    summary = {"command": " ".join(sys.argv), "device": torch.cuda.get_device_name() if args.device == "cuda" else
               "cpu", "torch": torch.__version__, "megatron_core": megatron_core_version(),
               "python": sys.version.split()[0], "model": shape["spec"].to_dict(), "seq_len": shape["seq"],
               "parts": {}}
    started = time.perf_counter()
    parts = [("cuda", lambda: part_cuda(args, shape)), ("symbolic", lambda: part_symbolic(args, shape)),
             ("peaks", lambda: part_peaks(args, shape)), ("overhead", lambda: part_overhead(args, shape)),
             ("times", lambda: part_times(args, shape, summary["parts"].get("overhead", {}).get("result"))),
             ("stand_ins", lambda: part_stand_ins(args, shape))]
    for name, run in parts:
        if time.perf_counter() - started > args.deadline:
            summary["parts"][name] = {"ok": False, "error": f"skipped: past the {args.deadline:.0f} s deadline"}
            continue
        began = time.perf_counter()
        try:
            summary["parts"][name] = {"ok": True, "result": run()}
        except BaseException as exc:  # one part's failure must not lose the others
            summary["parts"][name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                                      "traceback": traceback.format_exc()[-4000:]}
            if isinstance(exc, KeyboardInterrupt):
                break
        summary["parts"][name]["seconds"] = time.perf_counter() - began
        gc.collect()
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
        print(f"{name}: {'ok' if summary['parts'][name]['ok'] else summary['parts'][name]['error']} "
              f"({summary['parts'][name]['seconds']:.1f} s)", flush=True)
    return 0 if all(part["ok"] for part in summary["parts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
