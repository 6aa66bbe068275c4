"""Wall and CPU time of the reduced symbolic campaign of Llama-3.1-8B on 8 GPUs (issue 24, item 6).

The campaign is the README's (``advisor profile plan --gpus 8 --gpus-per-node 4 --mode reduced
--mbs 2 --gbs 256``: 34 runs, 272 rank files; BF16, distributed optimizer, sequence
parallelism), profiled by ``advisor profile run --backend symbolic`` in one process. Prints the
wall seconds, the CPU seconds of the runner (``getrusage`` of the children: wall over CPU is the
machine's load), how many stage profiles ran in full and how many optimizer-only (a build and
two optimizer steps, from which DP ranks under the distributed optimizer are derived) against
how many rank files were written (the rest are copies of symmetric ranks,
``megatron_hooks/symbolic_run.py``), and how many layer-microbatch passes (forward and backward
of one decoder layer on one microbatch, both iterations) ran against the full 1F1B schedules'
(``stage_emulation.steady_microbatches``).
``--runs ID ...`` keeps only those runs of the campaign (a quick sample).

Measured on meta tensors (2026-11-26): on a fresh clone, the machine idle, 69 s wall and 70 s of
CPU against the issue's 2-minute target (on the shared machine, load average 2.8-3.8: 84 s of
CPU, 143 s wall); on FakeTensorMode the same stage runs took 336 s of CPU, and 437 s before the
shortcuts (docs/performance.md).

    python benchmarks/bench_symbolic_campaign.py [--runs pp-b1-4x8 tp4-b1-16x2 ...]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PLAN = ["profile", "plan", "--gpus", "8", "--gpus-per-node", "4", "--mode", "reduced", "--mbs", "2", "--gbs", "256"]


def stage_profiles(run: dict, distributed_optimizer: bool) -> tuple[int, int, int, int, int]:
    """(stage profiles run in full, optimizer-only stage runs, rank files written,
    layer-microbatch passes run, passes of the full schedules) for one campaign run: TP ranks
    are copied, and DP ranks too without the distributed optimizer; with it, DP rank 0 runs in
    full and every DP rank once optimizer-only; each stage runs its warm-up and one steady pair."""
    from megatron_hooks.stage_emulation import steady_microbatches

    layers, m, cp, dp = run["layers_per_stage"], run["num_microbatches"], run.get("cp", 1), run["dp"]
    optimizer_only = len(layers) * cp * dp if distributed_optimizer and dp > 1 else 0
    passes = sum(n * steady_microbatches(i, len(layers), m) for i, n in enumerate(layers))
    return (len(layers) * cp, optimizer_only, len(layers) * run["tp"] * cp * dp, 2 * cp * passes,
            2 * cp * dp * sum(layers) * m)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="*", help="Campaign run ids to keep (default: all 34).")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        campaign = Path(tmp) / "campaign.json"
        subprocess.run([sys.executable, "-m", "advisor", *PLAN, "-o", str(campaign)], check=True,
                       stdout=subprocess.DEVNULL)
        document = json.loads(campaign.read_text())
        if args.runs:
            document["runs"] = [run for run in document["runs"] if run["id"] in set(args.runs)]
            campaign.write_text(json.dumps(document))
        distributed = bool(document["setup"].get("distributed_optimizer"))
        ran, optimizer_only, files, passes, full = map(
            sum, zip(*(stage_profiles(run, distributed) for run in document["runs"])))
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "advisor", "profile", "run", str(campaign), "--out", f"{tmp}/runs",
                        "--backend", "symbolic"], check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        print(f"{len(document['runs'])} runs, {ran} stage profiles run in full and {optimizer_only} optimizer-only "
              f"for {files} rank files, {passes} of {full} layer-microbatch passes: {wall:.0f} s wall, "
              f"{usage.ru_utime + usage.ru_stime:.0f} s CPU")


if __name__ == "__main__":
    main()
