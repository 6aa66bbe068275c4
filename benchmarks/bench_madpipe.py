"""Planning speed of MadPipe for Megatron (``advisor recommend --objective time``, issue 14).

Target: 126 layers (Llama-3.1-405B) on PP 16 in < 1 s. Timed in process, the median of REPEAT:
the cost tables (seed 004's stage memory at every position and the time model's stage times,
``advisor.madpipe.analytic_tables``) and the exact planner (``plan_fastest``: the smallest
period within 80% of 80 GiB, then CAPTURE's memory levels); and as a user runs it, the installed
``advisor recommend ... --objective time --gpu h100-80gb`` in fresh processes.

    python benchmarks/bench_madpipe.py
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys

from bench_planner import REPEAT, median_time  # this folder is the script's sys.path[0]

TARGET = 1.0
COMMAND = ["recommend", "--model", "llama3.1-405b", "--gpus", "16384", "--tp", "8", "--pp", "16", "--gbs", "2048",
           "--objective", "time", "--gpu", "h100-80gb", "--format", "json"]


def main() -> int:
    from advisor.hardware import get_gpu
    from advisor.madpipe import analytic_tables, plan_fastest
    from advisor.memory import MemoryOptions
    from advisor.models import PRESETS
    from advisor.rank_times import Timing
    from advisor.throughput import TimeModel

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, {platform.platform()}")
    spec = PRESETS["llama3.1-405b"]
    timing = Timing(TimeModel(spec, get_gpu("h100-80gb"), 8192, 2048), 8)

    def plan():
        memory, times = analytic_tables(spec, 8192, MemoryOptions(), tp=8, cp=1, dp=128, mbs=1, pp=16,
                                        num_microbatches=16, timing=timing)
        return plan_fastest(times, memory, 16, 0.8 * 80 * 2**30)

    seconds, (solution, period) = median_time(plan)
    ok = seconds < TARGET
    print(f"{'PASS' if ok else 'FAIL'}  {seconds:.3f} s (target < {TARGET} s): tables + exact planner, 126 layers "
          f"on PP 16: period {period * 1e3:.1f} ms, layers {list(solution.units_per_stage)}")
    advisor = shutil.which("advisor")
    if advisor is None:
        print("install the package first: pip install -e .", file=sys.stderr)
        return 2
    before = os.times()
    cli, _ = median_time(lambda: subprocess.run([advisor, *COMMAND], check=True, stdout=subprocess.DEVNULL))
    after = os.times()
    cpu = (after.children_user - before.children_user + after.children_system - before.children_system) / REPEAT
    ok &= cli < TARGET
    print(f"{'PASS' if cli < TARGET else 'FAIL'}  {cli:.3f} s wall, {cpu:.3f} s CPU (target < {TARGET} s): "
          f"advisor {' '.join(COMMAND)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
