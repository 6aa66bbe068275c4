"""The cost per iteration of a profiled training's rank file, over a long run (issue 17).

A rank of an 8B-sized stage (32 decoder layers, embedding and output) writes its file as
``megatron_hooks.recorder`` does: ``advisor.profiles.RankFileWriter`` appends each iteration (its
layer records for the first ``limits.PROFILE_LAYER_ITERATIONS``, then its iteration record) in
one write. The benchmark appends ITERATIONS iterations and reports the median time of one append
in the first and the last thousand (target: the same, a constant cost), the file's size, and
the time to read it back. For comparison, the previous writer rewrote the whole file atomically
after each iteration: its cost per iteration is measured at a few lengths, and grows with them.

    python benchmarks/bench_rank_file.py [--iterations 100000]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from advisor import limits
from advisor.fileio import atomic_write_text
from advisor.models import PRESETS
from advisor.parallel import ParallelConfig
from advisor.profiles import IterationRecord, LayerRecord, RankFileWriter, RankHeader, RankProfile, read_rank_file

SPEC = replace(PRESETS["llama3.1-8b"], name="llama3.1-8b")


def header() -> RankHeader:
    layers = SPEC.num_layers
    return RankHeader(
        run_id="bench", created="2026-11-24T00:00:00+00:00", backend="cuda", device="NVIDIA H100", kernels="cuda",
        torch_version="2.13.0", megatron_core_version="0.16.1", emulated=False, params_dtype="bfloat16",
        layer_spec="transformer_engine", sequence_parallel=False, recompute="none", distributed_optimizer=True,
        model=SPEC, parallel=ParallelConfig(dp=8, mbs=1), seq_len=8192, global_batch_size=1024,
        num_microbatches=128, layers_per_stage=(layers,), rank=0, world_size=8,
        coords={"tp": 0, "cp": 0, "pp": 0, "dp": 0}, stage_layers=tuple(range(1, layers + 1)), first_stage=True,
        last_stage=True, in_flight_microbatches=1,
    )


def layers_of(iteration: int) -> list[LayerRecord]:
    if iteration > limits.PROFILE_LAYER_ITERATIONS:
        return []
    names = [("embedding", "embedding", None)] + [(f"decoder.layers.{i}", "decoder", i + 1)
                                                 for i in range(SPEC.num_layers)] + [("output", "output", None)]
    return [LayerRecord(iteration=iteration, name=name, kind=kind, layer_number=number, parameter_bytes=436207616,
                        gradient_bytes=872415232, optimizer_bytes=654311424, activation_bytes=1207959552,
                        forward_peak_bytes=1342177280, backward_peak_bytes=939524096, forward_time_s=0.0123,
                        backward_time_s=0.0246) for name, kind, number in names]


def iteration_of(number: int) -> IterationRecord:
    return IterationRecord(iteration=number, parameter_bytes=16060522496, gradient_bytes=32121044992,
                           optimizer_bytes=12045391872, peak_allocated_bytes=71940702208,
                           peak_reserved_bytes=75161927680, alloc_retries=0, step_time_s=5.123456, loss=2.345678,
                           in_flight_microbatches=1)


def appended(directory: Path, iterations: int) -> tuple[list[float], Path]:
    writer = RankFileWriter(directory, header()).start()
    times = []
    for number in range(1, iterations + 1):
        layers, record = layers_of(number), iteration_of(number)
        started = time.perf_counter()
        writer.append(layers, record)
        times.append(time.perf_counter() - started)
    return times, writer.end("ok")


def rewritten(directory: Path, iterations: int, at: tuple[int, ...]) -> dict[int, float]:
    """The previous writer: the whole file, atomically, after each iteration; the median time of
    the ten iterations before each length in ``at``."""
    layers, records, times, out = [], [], [], {}
    for number in range(1, iterations + 1):
        layers += layers_of(number)
        records.append(iteration_of(number))
        profile = RankProfile(header=header(), layers=tuple(layers), iterations=tuple(records), status="running")
        started = time.perf_counter()
        atomic_write_text(directory / "rank00000.jsonl", profile.to_jsonl())
        times.append(time.perf_counter() - started)
        if number in at:
            out[number] = statistics.median(times[-10:])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        times, path = appended(Path(tmp), args.iterations)
        block = min(1000, args.iterations // 2)
        first, last = statistics.median(times[:block]), statistics.median(times[-block:])
        size = path.stat().st_size
        started = time.perf_counter()
        profile = read_rank_file(path)
        read = time.perf_counter() - started
        assert len(profile.iterations) == args.iterations and profile.status == "ok"
        print(f"append, {args.iterations:,} iterations of a 32-layer stage: median {first * 1e6:.1f} us per "
              f"iteration in the first {block:,}, {last * 1e6:.1f} us in the last {block:,} (ratio {last / first:.2f}); "
              f"total {sum(times):.2f} s; file {size / 2**20:.1f} MiB, read back and checked in {read:.2f} s")
    lengths = (100, 1000, 2000)
    with tempfile.TemporaryDirectory() as tmp:
        costs = rewritten(Path(tmp), max(lengths), lengths)
    growth = ", ".join(f"{costs[n] * 1e3:.2f} ms at iteration {n:,}" for n in lengths)
    per_iteration = costs[max(lengths)] / max(lengths)
    print(f"whole-file rewrite (the previous writer): {growth}; at that rate ({per_iteration * 1e6:.2f} us per "
          f"iteration held) {args.iterations:,} iterations would cost about "
          f"{per_iteration * args.iterations ** 2 / 2 / 3600:.1f} h of writing in all")


if __name__ == "__main__":
    main()
