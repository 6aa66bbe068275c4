"""The sweep's working set at the largest inputs ``advisor.limits`` allows (issue 24).

Before the chunked search (``advisor/space_chunks.py``), ``--gpus 1048576 --gpu h100-80gb
--num-layers 4096 --seq-len 16777216 --gbs 16777216`` allocated 11.4 GiB (one (374679, 4096)
int64 array), and ``--gpus 16384 --num-layers 1024 --gbs 65536`` took 18 s and 4 GB. Where nothing
fits (the first and third cases) the sweep skips its planning and the escalation's rungs that cannot
help (``advisor.space_search.may_fit``); before that, the first did not finish in 19 minutes. Target:
each within 2 GB of peak resident memory and 30 s of wall time, as a user runs them (the
installed console script in a fresh process; peak memory from the child's rusage).
"""

from __future__ import annotations

import os
import platform
import resource
import subprocess
import sys
import time

CASES = [
    ["--gpus", "1048576", "--gpu", "h100-80gb", "--num-layers", "4096", "--seq-len", "16777216", "--gbs", "16777216"],
    ["--gpus", "16384", "--gpu", "h100-80gb", "--num-layers", "1024", "--gbs", "65536"],
    ["--gpus", "65536", "--gpu", "h100-80gb", "--num-layers", "1024", "--seq-len", "1048576", "--gbs", "65536"],
]
LIMIT_S, LIMIT_BYTES = 30.0, 2 * 2**30


def run(args: list[str]) -> tuple[float, float, int, int]:
    """(wall seconds, CPU seconds, peak resident bytes, exit status) of one sweep in a fresh process.
    CPU seconds too: on a shared, loaded machine the wall time says more about the neighbours."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    before, cpu = usage.ru_maxrss, usage.ru_utime + usage.ru_stime
    start = time.perf_counter()
    status = subprocess.run(["advisor", "sweep", *args, "--top", "3"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL).returncode
    wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak = usage.ru_maxrss  # KiB on Linux; the largest child so far (an upper bound for the later cases)
    return wall, usage.ru_utime + usage.ru_stime - cpu, max(peak, before) * 1024, status


def main() -> int:
    print(f"{platform.node()}: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, Python {sys.version.split()[0]}")
    ok = True
    for args in CASES:
        wall, cpu, peak, status = run(args)
        met = wall <= LIMIT_S and peak <= LIMIT_BYTES and status in (0, 1)
        ok &= met
        print(f"advisor sweep {' '.join(args)}: {wall:.1f} s ({cpu:.1f} s CPU), peak {peak / 2**30:.2f} GiB, exit {status} "
              f"-> {'met' if met else 'MISSED'} (< {LIMIT_S:.0f} s, < 2 GiB)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
