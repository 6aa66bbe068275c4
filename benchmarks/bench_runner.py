"""Campaign runner speed: one runner process for a whole campaign against a fresh process per run.

The campaign: the reduced campaign of the end-to-end test's model (16 layers, hidden 128, FFN 512,
4 heads, 2 KV heads, vocabulary 32000, sequence 128, FP32; PP 4 at microbatches 1 and 2: 6 runs,
24 emulated stages). Timed, wall clock, each REPEAT times, the median:

- ``advisor profile run`` (one runner process: torch and megatron-core imported once);
- the same runs, each by ``python -m megatron_hooks.emulate`` in its own process (what a runner
  that starts a process per run would cost).

    python benchmarks/bench_runner.py [--repeat 3] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from advisor.capture.campaign import plan_campaign
from advisor.megatron_args import MegatronSetup
from advisor.models import LlamaSpec

SPEC = LlamaSpec(name="tiny", num_layers=16, hidden_size=128, ffn_hidden_size=512, num_attention_heads=4,
                 num_query_groups=2, vocab_size=32000)
MODEL_FLAGS = ["--model", "llama3.1-8b", "--num-layers", "16", "--hidden-size", "128", "--ffn-hidden-size", "512",
               "--num-attention-heads", "4", "--num-query-groups", "2", "--vocab-size", "32000"]


def timed(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    campaign = plan_campaign(SPEC, gpus=4, gpus_per_node=1, seq_len=128, micro_batch_size=4, global_batch_size=16,
                             mode="reduced", setup=MegatronSetup(params_dtype="float32", distributed_optimizer=False,
                                                                 sequence_parallel=False))
    threads = ["--threads", str(args.threads)] if args.threads else []
    runner, fresh = [], []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "campaign.json"
        path.write_text(json.dumps(campaign.to_dict()))
        for repeat in range(args.repeat):
            runner.append(timed([sys.executable, "-m", "advisor", "profile", "run", str(path), "--out",
                                 f"{tmp}/runner{repeat}", *threads]))
            fresh.append(sum(
                timed([sys.executable, "-m", "megatron_hooks.emulate", *MODEL_FLAGS, *threads, "--layers-per-stage",
                       ",".join(map(str, run.layers_per_stage)), "--seq-len", "128", "--mbs",
                       str(run.pipeline_microbatch), "--num-microbatches", str(run.num_microbatches), "--out",
                       f"{tmp}/fresh{repeat}/{run.id}"])
                for run in campaign.runs))
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, {platform.platform()}")
    stages = sum(len(run.layers_per_stage) for run in campaign.runs)
    for label, times in (("advisor profile run (one process)", runner), ("a fresh process per run", fresh)):
        median = statistics.median(times)
        print(f"{median:7.1f} s  {label}: {len(campaign.runs)} runs, {stages} stages, "
              f"{median / stages:.2f} s per stage (runs: {', '.join(f'{t:.1f}' for t in times)})")


if __name__ == "__main__":
    main()
