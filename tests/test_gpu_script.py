"""benchmarks/gpu/measure_layers.py, the unattended GPU measurement, run on the CPU with a tiny
model (--device cpu --tiny) so that its errors show here and not on the lent GPU."""

import json
import subprocess
import sys

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install -e '.[megatron]')")

import warm_python  # noqa: E402
from conftest import ROOT  # noqa: E402


def test_every_part_runs_on_the_cpu(tmp_path):
    out = tmp_path / "layers"
    done = warm_python.run(["benchmarks/gpu/measure_layers.py", out, "--device", "cpu", "--tiny"], timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["parts"]) == {"cuda", "symbolic", "peaks", "overhead", "times", "stand_ins"}
    assert all(part["ok"] for part in summary["parts"].values())
    # On the CPU the real run and the symbolic one with CPU kernels keep the same bytes per module.
    for module, values in summary["parts"]["symbolic"]["result"]["activation_bytes"].items():
        assert values["cpu"] == values["symbolic-cpu"], module
    overhead = summary["parts"]["overhead"]["result"]
    assert overhead["with_hooks"]["n"] == overhead["without_hooks"]["n"] == 9
    comparison = json.loads((out / "comparison.json").read_text())
    assert len(comparison) == 3 and all({"cpu", "symbolic-cuda", "symbolic-cpu"} <= set(e["modules"]) for e in comparison)
    # The run exits 2 (one line) on a directory that already holds results (a fresh interpreter's
    # stderr: nothing else said).
    again = subprocess.run([sys.executable, "benchmarks/gpu/measure_layers.py", str(out), "--device", "cpu", "--tiny"],
                           cwd=ROOT, capture_output=True, text=True)
    assert again.returncode == 2 and again.stderr.strip().endswith("is not empty")
