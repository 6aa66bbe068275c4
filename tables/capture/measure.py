"""The slow step: plan the experiment's campaigns and run them with ``advisor profile run``.

Layout of the data directory (committed: rank files are small JSON Lines):

    campaigns/<name>.json    the campaign documents (full, reduced, heldout-pp4, -pp2, -pp8)
    profiles/<run id>/       the profiling runs of the full and the reduced campaigns (shared
                             directory: a run in both is measured once)
    <held-out name>/<run id>/  the held-out measurements
    measure.json             the machine, the wall time of each campaign, the versions

Each campaign runs through the real CLI in a subprocess, so a measurement that stops resumes
where it stopped when the command runs again.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

from advisor.cli import progress
from advisor.capture.relay import relay
from advisor.errors import AdvisorError
from advisor.fileio import atomic_write_text
from advisor.render import to_json
from tables.capture.experiment import PROFILING, campaigns

MEASURE_SCHEMA = "capture-measure/1"


def run_directory(data: Path, name: str) -> Path:
    return data / ("profiles" if name in PROFILING else name)


def write_campaigns(data: Path) -> dict[str, Path]:
    """Write every campaign document; returns their paths by name."""
    (data / "campaigns").mkdir(parents=True, exist_ok=True)
    return {name: atomic_write_text(data / "campaigns" / f"{name}.json", to_json(campaign.to_dict()))
            for name, campaign in campaigns().items()}


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}"


def measure(data: Path, threads: int | None = None) -> dict:
    """Run every campaign into ``data``; returns (and writes) the timing record. A campaign that
    was already complete keeps the time recorded when it ran."""
    from importlib.metadata import version  # not importing torch here: the runner does

    previous = data / "measure.json"
    old = json.loads(previous.read_text())["campaigns"] if previous.exists() else {}
    paths = write_campaigns(data)
    timed = {}
    for name, path in paths.items():
        started = time.perf_counter()
        # The runner advisor profile run starts, with its events read here (one line per run).
        status, summary, last = relay(path, run_directory(data, name), ["--threads", str(threads)] if threads else [],
                                      progress.view(False))
        if status != 0 or summary.counts["error"]:
            raise AdvisorError(f"campaign {name} did not complete (runner exit status {status}): {last}")
        counts = {"executed": summary.counts["ok"] + summary.counts["oom"], "skipped": summary.skipped}
        timed[name] = {**counts, "seconds": round(time.perf_counter() - started, 1)}
        if counts["executed"] == 0 and name in old:
            timed[name] = old[name]
    record = {"schema": MEASURE_SCHEMA, "machine": _machine(), "torch": version("torch"),
              "megatron_core": version("megatron-core"), "threads": threads, "campaigns": timed,
              "total_seconds": round(sum(entry["seconds"] for entry in timed.values()), 1)}
    atomic_write_text(previous, json.dumps(record, indent=1) + "\n")
    return record
