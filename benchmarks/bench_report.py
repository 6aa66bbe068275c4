"""Wall and CPU time of ``advisor report`` for the issue's large case: Llama 3.1 405B on 16,384
H100s, global batch 2048, every row (--all: 1,992 rows, every one in the table, the heatmap and
the scatter). Target (issue 25): the page written in < 3 s.

Cases, each a fresh process of the installed console script, REPEAT times, interleaved so that a
shared machine's load falls on all alike:

- report --from: the page from the saved sweep JSON (what the target is about);
- report sweep: the sweep and the page in one command;
- sweep --format json -o: the sweep alone, for the ratio (page / sweep) that a loaded machine
  keeps when its wall times do not.

The median is compared with the target; the machine's load average is printed beside it.
"""

from __future__ import annotations

import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPEAT = 5
TARGET_S = 3.0
SWEEP = ["--model", "llama3.1-405b", "--gpus", "16384", "--gpu", "h100-80gb", "--gbs", "2048", "--all"]


def run(argv: list[str]) -> tuple[float, float]:
    """(wall, CPU user + system) seconds of one run."""
    before = os.times()
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = os.times()
    return wall, after.children_user - before.children_user + after.children_system - before.children_system


def main() -> int:
    advisor = shutil.which("advisor")
    if advisor is None:
        print("install the package first: pip install -e .", file=sys.stderr)
        return 2
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}; load average {os.getloadavg()[0]:.1f} at the start")
    with tempfile.TemporaryDirectory() as tmp:
        saved, page = Path(tmp, "sweep.json"), Path(tmp, "report.html")
        cases = {
            "sweep --format json -o FILE": [advisor, "sweep", *SWEEP, "--format", "json", "-o", str(saved)],
            "report --from FILE -o FILE.html": [advisor, "report", "--from", str(saved), "-o", str(page)],
            "report sweep ... -o FILE.html": [advisor, "report", "sweep", *SWEEP, "-o", str(page)],
        }
        subprocess.run(cases["sweep --format json -o FILE"], check=True, capture_output=True)
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
        for _ in range(REPEAT):
            for name, argv in cases.items():
                results[name].append(run(argv))
        size = page.stat().st_size
    print(f"load average {os.getloadavg()[0]:.1f} at the end; the page: {size / 1e6:.2f} MB (limit 5 MB)")
    medians = {}
    for name, samples in results.items():
        wall = statistics.median(s[0] for s in samples)
        cpu = statistics.median(s[1] for s in samples)
        medians[name] = (wall, cpu)
        print(f"  {name:34s} median {wall:6.2f} s wall, {cpu:5.2f} s CPU (max {max(s[0] for s in samples):.2f} s)")
    wall, cpu = medians["report --from FILE -o FILE.html"]
    sweep_wall, sweep_cpu = medians["sweep --format json -o FILE"]
    print(f"ratio page / sweep: {wall / sweep_wall:.2f} wall, {cpu / sweep_cpu:.2f} CPU")
    passed = wall < TARGET_S and size < 5_000_000
    print(f"{'PASS' if passed else 'FAIL'}: report --from in {wall:.2f} s (target < {TARGET_S} s)")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
