"""Start-up and sweep wall times of the installed ``advisor`` and ``advisor-launch`` console scripts.

Targets (issue: the estimator): ``advisor --help`` and ``advisor-launch --help`` < 0.5 s, and
``advisor sweep --gpus 16384 --mem 80 --model llama3.1-405b --gbs 2048 --all --format json``
< 1 s; since issue 14 that sweep covers the whole launchable space (any PP with its split,
recomputation), and with ``--gpu h100-80gb`` (issue 16: the time model on every row and the
calibrated verdicts) also interleaving and MadPipe's time-optimal splits, also < 1 s, and with
issue 21's levers (Megatron-FSDP's buffers, FP8) also < 1 s; a DeepSeek-V3 sweep on 2,048 GPUs
with EP and ETP as dimensions (issue 22) < 2 s, issue 22's own command (``--all``, every
layout) and the table a user runs too (the Mixtral 8x7B table beside them, held to the same
target). ``BENCH_ONLY='deepseek|mixtral'`` runs only the commands whose label holds one of those. Each
command runs REPEAT times in a fresh process; the median and the worst are reported, the median
is compared with the target.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

REPEAT = int(os.environ.get("BENCH_REPEAT", 15))
ONLY = tuple(os.environ.get("BENCH_ONLY", "").split("|"))
"""Only the commands whose label holds one of these texts (``BENCH_ONLY='deepseek|mixtral'``);
every one by default."""
CASES = [
    ("advisor --help", ["advisor", "--help"], 0.5),
    (
        "advisor sweep --gpus 16384 --mem 80 --model llama3.1-405b --gbs 2048 --all --format json",
        ["advisor", "sweep", "--gpus", "16384", "--mem", "80", "--model", "llama3.1-405b", "--gbs", "2048", "--all",
         "--format", "json"],
        1.0,
    ),
    (
        "advisor sweep --gpus 16384 --gpu h100-80gb --model llama3.1-405b --gbs 2048 --all --format json "
        "(time model + calibrated verdicts)",
        ["advisor", "sweep", "--gpus", "16384", "--gpu", "h100-80gb", "--model", "llama3.1-405b", "--gbs", "2048",
         "--all", "--format", "json"],
        1.0,
    ),
    (
        "advisor sweep --gpus 16384 --gpu h100-80gb --model llama3.1-405b --gbs 2048 --all --format json "
        "--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads --grad-dtype bf16 --fp8-format hybrid "
        "(issue 21's levers: FSDP buffers, FP8)",
        ["advisor", "sweep", "--gpus", "16384", "--gpu", "h100-80gb", "--model", "llama3.1-405b", "--gbs", "2048",
         "--all", "--format", "json", "--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads",
         "--grad-dtype", "bf16", "--fp8-format", "hybrid"],
        1.0,
    ),
    ("advisor sweep --gpus 64 --mem 40 (table)", ["advisor", "sweep", "--gpus", "64", "--mem", "40"], 1.0),
    (
        "advisor sweep --model deepseek-v3 --gpus 2048 --gpu h100-80gb --seq-len 4096 --gbs 8192 --format json "
        "(issue 22: EP and ETP as dimensions)",
        ["advisor", "sweep", "--model", "deepseek-v3", "--gpus", "2048", "--gpu", "h100-80gb", "--seq-len", "4096",
         "--gbs", "8192", "--format", "json"],
        2.0,
    ),
    (
        "advisor sweep --model deepseek-v3 --gpus 2048 --gpu h100-80gb --all --format json (issue 22's own "
        "command: every layout, 14,248 rows)",
        ["advisor", "sweep", "--model", "deepseek-v3", "--gpus", "2048", "--gpu", "h100-80gb", "--all", "--format",
         "json"],
        2.0,
    ),
    (
        "advisor sweep --model deepseek-v3 --gpus 2048 --gpu h100-80gb (table: what a user runs)",
        ["advisor", "sweep", "--model", "deepseek-v3", "--gpus", "2048", "--gpu", "h100-80gb"],
        2.0,
    ),
    (
        "advisor sweep --model mixtral-8x7b --gpus 64 --gpu h100-80gb --seq-len 4096 --gbs 256 (table)",
        ["advisor", "sweep", "--model", "mixtral-8x7b", "--gpus", "64", "--gpu", "h100-80gb", "--seq-len", "4096",
         "--gbs", "256"],
        2.0,
    ),
    ("advisor-launch --help", ["advisor-launch", "--help"], 0.5),
]


def wall_times(argv: list[str]) -> tuple[list[float], list[float]]:
    """Wall and CPU (user + system) seconds of each run; on a shared machine the CPU time says
    what the command costs when the wall time includes waiting for a core."""
    times, cpu = [], []
    for _ in range(REPEAT):
        before = os.times()
        start = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
        after = os.times()
        cpu.append(after.children_user - before.children_user + after.children_system - before.children_system)
    return times, cpu


def main() -> int:
    programs = {name: shutil.which(name) for name in ("advisor", "advisor-launch")}
    if None in programs.values():
        print("install the package first: pip install -e .", file=sys.stderr)
        return 2
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, {platform.platform()}, load average {os.getloadavg()[0]:.1f} "
          "(on a loaded machine compare the CPU times: the wall times include waiting for a core)")
    ok = True
    results = []
    for label, args, target in CASES:
        if not any(text in label for text in ONLY):
            continue
        times, cpu = wall_times([programs[args[0]], *args[1:]])
        median = statistics.median(times)
        passed = median < target
        ok &= passed
        results.append({"command": label, "median_s": median, "max_s": max(times), "cpu_median_s":
                        statistics.median(cpu), "cpu_min_s": min(cpu), "target_s": target})
        print(f"{'PASS' if passed else 'FAIL'}  median {median:.3f} s, max {max(times):.3f} s, CPU median "
              f"{statistics.median(cpu):.3f} s, min {min(cpu):.3f} s (target < {target} s): {label}")
    for case in CASES[1:3] if ONLY == ("",) else []:
        done = subprocess.run([programs["advisor"], *case[1][1:]], check=True, capture_output=True, text=True)
        print(f"{len(json.loads(done.stdout))} rows; {done.stderr.strip()}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
