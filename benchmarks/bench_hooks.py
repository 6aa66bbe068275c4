"""Overhead of the layer memory hooks on the step time of a CPU training step.

Target (issue 4): under 3% for a model of at least 8 layers and hidden size 512, on the CPU.

One megatron-core Llama GPTModel (local spec, FP32, gloo with one rank) trains with
``torch.optim.Adam``; a step is zero_grad, the forward and backward passes of its microbatches,
and the optimizer step. A *hooked* step also runs everything the plugin does in a real run:
``LayerMemoryHooks`` installed with the CPU backend (the storage tracker follows every aten
op), the iteration bracketed by ``ProfileRecorder.iteration`` and the rank file rewritten
atomically afterwards. The hooks are removed for the plain steps, so both kinds run on the
same model, weights and data.

Method: warm-up steps of both kinds, then ROUNDS rounds of a block of plain steps and a block
of hooked steps (the hooks stay installed through their block, as through a training run),
the order alternating from round to round so that drift and neighbours on a shared machine
fall on both alike; the first step of each block, which follows a step of the other kind, is
discarded. glibc is told to keep freed memory (``keep_freed_memory``), as the CUDA caching
allocator does: otherwise page faults make identical steps differ by 10%. Reported: each
kind's median and interquartile range, the overhead as the ratio of the medians, and the
spread of the per-round ratios. For the record, a few steps under
``torch.distributed._tools.mem_tracker.MemTracker`` show why the CPU backend does not use it
(``--memtracker-steps 0`` skips them).

    python benchmarks/bench_hooks.py --threads 1     # ~4 minutes
    python benchmarks/bench_hooks.py --seq-len 512 --rounds 4
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from advisor.models import LlamaSpec  # noqa: E402
from advisor.parallel import ParallelConfig  # noqa: E402

TARGET = 0.03


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__} with {torch.get_num_threads()} threads, "
            f"Python {platform.python_version()}")


def keep_freed_memory() -> str:
    """Make glibc keep freed memory for reuse, as PyTorch's CUDA caching allocator does.

    By default glibc serves the large tensors of a step with fresh mmap()s and returns them on
    free, so every step page-faults its activations in again (about 450,000 minor faults per
    step at sequence 1024 here). How many depends on the heap's layout, which small Python
    objects change: identical steps varied by 10%, in either direction, with or without the
    hooks. With mmap off and the trim threshold at 1 GiB, a step faults almost nothing, and
    its time measures computation.
    """
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
        if libc.mallopt(M_MMAP_MAX, 0) == 1 and libc.mallopt(M_TRIM_THRESHOLD, 2**30) == 1:
            return "glibc keeps freed memory (mallopt: no mmap, trim threshold 1 GiB)"
    except (OSError, AttributeError):
        pass
    return "allocator left as it is (mallopt unavailable)"


def load() -> str:
    try:
        return open("/proc/loadavg").read().split()[0]
    except OSError:
        return "?"


class Bench:
    def __init__(self, spec: LlamaSpec, seq_len: int, microbatches: int, directory: Path) -> None:
        from megatron_hooks.model import build_gpt_model, causal_mask

        torch.manual_seed(0)
        self.spec, self.seq_len, self.microbatches, self.directory = spec, seq_len, microbatches, directory
        self.model = build_gpt_model(spec, seq_len=seq_len)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-5)
        generator = torch.Generator().manual_seed(1)
        self.data = [(torch.randint(0, spec.vocab_size, (1, seq_len), generator=generator),
                      torch.randint(0, spec.vocab_size, (1, seq_len), generator=generator)) for _ in range(microbatches)]
        self.positions = torch.arange(seq_len).unsqueeze(0)
        self.mask = causal_mask(seq_len)
        self.iteration = 0

    def _train(self) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for tokens, labels in self.data:
            loss = self.model(tokens, self.positions, self.mask, labels=labels).mean() / self.microbatches
            loss.backward()
            total += loss.item()
        self.optimizer.step()
        return total

    def plain_block(self, steps: int) -> list[float]:
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            self._train()
            times.append(time.perf_counter() - start)
        return times

    def hooked_block(self, steps: int) -> list[float]:
        """The hooks stay installed through the block, as through a training run."""
        from megatron_hooks.hooks import LayerMemoryHooks
        from megatron_hooks.recorder import ProfileRecorder, RunInfo

        hooks = LayerMemoryHooks(self.model, optimizer=self.optimizer).install()
        run = RunInfo(run_id="bench", model=self.spec, parallel=ParallelConfig(), seq_len=self.seq_len,
                      global_batch_size=self.microbatches, num_microbatches=self.microbatches,
                      layers_per_stage=(self.spec.num_layers,), rank=0, world_size=1,
                      coords={"tp": 0, "cp": 0, "pp": 0, "dp": 0}, in_flight_microbatches=1)
        recorder = ProfileRecorder(hooks, run, self.directory).start()
        times = []
        try:
            for _ in range(steps):
                self.iteration += 1
                start = time.perf_counter()
                with recorder.iteration(self.iteration) as step:
                    step.loss = self._train()
                times.append(time.perf_counter() - start)
        finally:
            hooks.remove()
        return times

    def memtracker(self) -> float:
        from torch.distributed._tools.mem_tracker import MemTracker

        tracker = MemTracker()
        tracker.track_external(self.model, self.optimizer)
        start = time.perf_counter()
        with tracker:
            self._train()
        return time.perf_counter() - start


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, q2, q3 = statistics.quantiles(values, n=4)
    return q1, q2, q3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden-size", type=int, default=512)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--microbatches", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads (default: torch's)")
    parser.add_argument("--default-malloc", action="store_true",
                        help="leave glibc's allocator as it is (steps then vary by page faults)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--block", type=int, default=2, help="measured steps per block")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--memtracker-steps", type=int, default=3)
    options = parser.parse_args()
    warnings.filterwarnings("ignore")  # megatron-core's deprecation notes, MemTracker's hook notes
    if options.threads:
        torch.set_num_threads(options.threads)
    allocator = "glibc defaults" if options.default_malloc else keep_freed_memory()

    import torch.distributed as dist
    from megatron.core import parallel_state

    from megatron_hooks.cpu_shim import CpuShim
    from megatron_hooks.stage_emulation import free_port

    h = options.hidden_size
    spec = LlamaSpec(name=f"bench-L{options.layers}-h{h}", num_layers=options.layers, hidden_size=h,
                     ffn_hidden_size=7 * h // 2, num_attention_heads=h // 64, num_query_groups=max(1, h // 256),
                     vocab_size=options.vocab_size)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    with CpuShim(), tempfile.TemporaryDirectory() as directory:
        dist.init_process_group("gloo", rank=0, world_size=1)
        parallel_state.initialize_model_parallel(1, 1)
        bench = Bench(spec, options.seq_len, options.microbatches, Path(directory))
        print(f"machine: {machine()}; {allocator}; load average {load()} at the start")
        print(f"model: {spec.num_layers} layers, hidden {h}, FFN {spec.ffn_hidden_size}, {spec.num_attention_heads} "
              f"heads, {spec.num_query_groups} KV heads, vocab {spec.vocab_size}, FP32, local spec; sequence "
              f"{options.seq_len}, micro-batch 1, {options.microbatches} microbatch(es) per step")
        bench.plain_block(options.warmup), bench.hooked_block(options.warmup)
        plain, hooked, ratios = [], [], []
        for round_ in range(options.rounds):
            # Alternating blocks; each block's first step, which follows the other kind, is a warm-up.
            blocks = [("plain", bench.plain_block), ("hooked", bench.hooked_block)]
            times = dict((name, run(options.block + 1)[1:]) for name, run in blocks[:: 1 if round_ % 2 == 0 else -1])
            plain += times["plain"]
            hooked += times["hooked"]
            ratios.append(statistics.median(times["hooked"]) / statistics.median(times["plain"]) - 1)
            print(f"round {round_ + 1:2d}: plain {statistics.median(times['plain']):.3f} s, hooked "
                  f"{statistics.median(times['hooked']):.3f} s ({ratios[-1]:+.2%})", flush=True)
        tracked = [bench.memtracker() for _ in range(options.memtracker_steps)]
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
    q1, per_round, q3 = quartiles(ratios)
    overhead = statistics.median(hooked) / statistics.median(plain) - 1
    for name, times in (("plain step: ", plain), ("hooked step:", hooked)):
        low, middle, high = quartiles(times)
        print(f"{name} median {middle:.3f} s of {len(times)} (interquartile {low:.3f} .. {high:.3f}, "
              f"min {min(times):.3f}, max {max(times):.3f})")
    print(f"overhead: {overhead:+.2%} (median hooked / median plain - 1); per round: median {per_round:+.2%}, "
          f"interquartile {q1:+.2%} .. {q3:+.2%}")
    if tracked:
        print(f"torch MemTracker, for comparison: median {statistics.median(tracked):.3f} s per step, "
              f"{statistics.median(tracked) / statistics.median(plain):.1f}x the plain step")
    print(f"load average {load()} at the end")
    passed = overhead < TARGET
    print(f"{'PASS' if passed else 'FAIL'}: overhead {overhead:+.2%} (target < {TARGET:.0%})")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
