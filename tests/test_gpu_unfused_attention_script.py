"""benchmarks/gpu/time_unfused_attention.py, the GPU timing of megatron-core's unfused attention
against the advisor's price, run on the CPU on small cases (--device cpu --tiny) so that its
errors show here and not on the lent GPU."""

import dataclasses
import json
import re
import subprocess
import sys

import pytest

import warm_python
from conftest import ROOT

SCRIPT = "benchmarks/gpu/time_unfused_attention.py"


def test_the_tiny_cpu_run_times_every_case_beside_the_advisors_price(tmp_path):
    pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install -e '.[megatron]')")
    from advisor.hardware import get_gpu
    from advisor.models import PRESETS
    from advisor.throughput import terms
    from advisor.throughput.calibration import load_calibration

    out = tmp_path / "out"
    done = warm_python.run([SCRIPT, out, "--device", "cpu", "--tiny"], timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["cases"]) == {"s64-tp4", "s64-tp8", "s128-tp4", "s128-tp8"}
    assert summary["masked_softmax_fusion"] is False  # no Apex here: PyTorch's softmax, as stated
    spec = PRESETS["llama3.1-8b"]
    rates = terms.Rates.of(get_gpu("h200-141gb"), load_calibration())
    for name, case in summary["cases"].items():
        assert case["ok"], case.get("error")
        seq_len, tp = (int(number) for number in re.fullmatch(r"s(\d+)-tp(\d+)", name).groups())
        assert case["heads"] == 8 // tp
        assert case["forward_backward"]["median_s"] > 0 and case["forward"]["median_s"] > 0  # CPU timings: noisy
        # the price is the advisor's term for the shrunken model's heads (8 query heads over TP)
        tiny = dataclasses.replace(spec, hidden_size=256, num_attention_heads=8, num_query_groups=8)
        forward, backward = terms.unfused_attention_time(tiny, seq_len, 1, tp, rates)
        assert case["priced"]["forward_backward_s"] == pytest.approx(float(forward + backward))
        assert case["forward_backward_over_priced"] == pytest.approx(
            case["forward_backward"]["median_s"] / case["priced"]["forward_backward_s"])
        assert any(row["name"].startswith("aten::") for row in case["profile"]["top"])


def test_a_bad_argument_is_one_error_line(tmp_path):
    done = subprocess.run([sys.executable, SCRIPT, str(tmp_path / "o"), "--deadline", "0"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("Error:") and len(done.stderr.strip().splitlines()) == 1
    assert done.stdout == ""
