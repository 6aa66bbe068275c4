"""Time and memory of a symbolic campaign against the CPU backend's, and of real-size profiles.

1. The same campaign (the end-to-end test's reduced campaign: 16 layers, hidden 128, FFN 512,
   4 heads, 2 KV heads, vocabulary 32000, sequence 128, FP32, no distributed optimizer or SP;
   PP 4 at microbatches 1 and 2: 6 runs, 24 stages) through ``advisor profile run`` with
   ``--backend cpu`` and with ``--backend symbolic --layer-spec local``: wall time and the
   runner's peak resident memory (``getrusage`` of the children), the median of REPEAT.
2. One Llama-3.1-8B layer (the middle one of three one-layer stages: hidden 4096, sequence S,
   MBS 1, BF16, local spec, 2 iterations)
   measured by the CPU backend (real tensors) and profiled symbolically with the CPU kernels
   (the same work, byte for byte): wall time and peak memory of each, a fresh process each, for
   S = 1024 and 2048 (the CPU backend's memory grows with s^2 and its time with the FLOPs; the
   symbolic backend's stay flat).
3. The real-size symbolic profiles of examples/symbolic (Llama-3.1-8B PP 4; 70B and 405B layers),
   wall time and peak memory, a fresh process each.

    python benchmarks/bench_symbolic.py [--repeat 3] [--skip-real-size]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from advisor.capture.campaign import plan_campaign
from advisor.megatron_args import MegatronSetup
from advisor.models import LlamaSpec

SPEC = LlamaSpec(name="tiny", num_layers=16, hidden_size=128, ffn_hidden_size=512, num_attention_heads=4,
                 num_query_groups=2, vocab_size=32000)
# The middle stage of three one-layer stages: one 8B layer, without the embedding and LM head.
EIGHT_B_LAYER = ["--model", "llama3.1-8b", "--num-layers", "3", "--layers-per-stage", "1x3", "--stage", "1",
                 "--dtype", "bfloat16", "--threads", "1"]
REAL_SIZE = {
    "llama3.1-8b, PP 4 (4 stages of 8 layers, 4 microbatches)":
        ["--model", "llama3.1-8b", "--layers-per-stage", "8x4", "--num-microbatches", "4"],
    "llama3.1-70b, TP 8 + SP (3 one-layer stages)":
        ["--model", "llama3.1-70b", "--layers-per-stage", "1x80", "--stage", "0", "--stage", "40", "--stage", "79",
         "--num-microbatches", "2", "--tp", "8", "--sequence-parallel"],
    "llama3.1-405b, TP 8 + SP, CP 2 (3 one-layer stages x 2 CP ranks)":
        ["--model", "llama3.1-405b", "--layers-per-stage", "1x126", "--stage", "0", "--stage", "63", "--stage", "125",
         "--num-microbatches", "2", "--tp", "8", "--cp", "2", "--sequence-parallel"],
}
SYMBOLIC_TE = ["--seq-len", "8192", "--distributed-optimizer", "--dtype", "bfloat16", "--backend", "symbolic",
               "--layer-spec", "transformer_engine"]


def measured(command: list[str]) -> tuple[float, float]:
    """Wall seconds and peak resident GiB of ``command`` (run in a fresh process tree)."""
    code = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
            "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
            "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    done = subprocess.run([sys.executable, "-c", code, *command], check=True, capture_output=True, text=True)
    seconds, kib = done.stdout.split()
    return float(seconds), int(kib) / 2**20


def show(label: str, samples: list[tuple[float, float]]) -> None:
    seconds = statistics.median(s for s, _ in samples)
    gib = max(g for _, g in samples)
    print(f"{seconds:8.1f} s {gib:6.2f} GiB  {label} (runs: {', '.join(f'{s:.1f}' for s, _ in samples)} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-real-size", action="store_true")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, {platform.platform()}")
    campaign = plan_campaign(SPEC, gpus=4, gpus_per_node=1, seq_len=128, micro_batch_size=4, global_batch_size=16,
                             mode="reduced", setup=MegatronSetup(params_dtype="float32", distributed_optimizer=False,
                                                                 sequence_parallel=False))
    stages = sum(len(run.layers_per_stage) for run in campaign.runs)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "campaign.json"
        path.write_text(json.dumps(campaign.to_dict()))
        print(f"1. advisor profile run, {len(campaign.runs)} runs, {stages} stages:")
        for label, backend in (("--backend cpu", ["--backend", "cpu", "--threads", "1"]),
                               ("--backend symbolic --layer-spec local", ["--backend", "symbolic", "--layer-spec",
                                                                          "local"])):
            show(label, [measured([sys.executable, "-m", "advisor", "profile", "run", str(path), "--out",
                                   f"{tmp}/{backend[1]}{i}", *backend]) for i in range(args.repeat)])
        print("2. one Llama-3.1-8B layer (local spec, BF16), a fresh process each:")
        for seq in (1024, 2048):
            for label, backend in (("CPU backend", []), ("symbolic, CPU kernels", ["--backend", "symbolic",
                                                                                  "--kernels", "cpu"])):
                show(f"seq {seq}, {label}",
                     [measured([sys.executable, "-m", "megatron_hooks.emulate", *EIGHT_B_LAYER, "--seq-len", str(seq),
                                *backend, "--out", f"{tmp}/layer-{seq}-{len(backend)}-{i}"])
                      for i in range(1 if not backend else args.repeat)])
        if not args.skip_real_size:
            print("3. real size, symbolic (TE spec, BF16, distributed optimizer, seq 8192), a fresh process each:")
            for i, (label, flags) in enumerate(REAL_SIZE.items()):
                show(label, [measured([sys.executable, "-m", "megatron_hooks.emulate", *flags, *SYMBOLIC_TE,
                                       "--out", f"{tmp}/real-{i}-{r}"]) for r in range(args.repeat)])


if __name__ == "__main__":
    main()
