"""benchmarks/gpu/measure_moe_layers.py, the unattended GPU measurement of real megatron-core MoE
layers, run on the CPU on shrunken presets (--device cpu --tiny) so that its errors show here and
not on the lent GPU; and the cuda backend's allocator readings in the moe-layer schema."""

import json
import subprocess
import sys

import pytest

import warm_python
from conftest import ROOT

from advisor.errors import AdvisorError
from advisor.moe import layer_profile

PAIRS = [f"{model}-{dispatcher}" for model in ("qwen3-30b-a3b", "mixtral-8x7b")
         for dispatcher in ("allgather", "alltoall")]
BACKENDS = ("cpu", "symbolic", "symbolic-local-cuda", "symbolic-local-cpu")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install -e '.[megatron]')")
    out = tmp_path_factory.mktemp("moe") / "layers"
    done = warm_python.run(["benchmarks/gpu/measure_moe_layers.py", out, "--device", "cpu", "--tiny"], timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return out, json.loads((out / "summary.json").read_text())


def test_every_part_runs_and_writes_a_profile(tiny_run):
    out, summary = tiny_run
    assert set(summary["parts"]) == {f"{pair}-{backend}" for pair in PAIRS for backend in BACKENDS}
    assert all(part["ok"] for part in summary["parts"].values())
    for name in summary["parts"]:  # each readable by advisor profile show
        profile = layer_profile.load(out / name)
        assert profile.backend == ("cpu" if name.endswith("-cpu") and "symbolic" not in name else "symbolic")
        assert profile.seq_len == 32 and profile.ep == 1 and profile.cuda_memory is None


def test_each_model_has_every_part_per_backend_and_the_comparison(tiny_run):
    _, summary = tiny_run
    assert set(summary["models"]) == set(PAIRS)
    for pair, model in summary["models"].items():
        activations = model["activation_bytes"]
        assert set(activations) == set(layer_profile.PARTS)
        for part, values in activations.items():
            assert set(values) == set(BACKENDS), (pair, part)
            # no shared experts in Qwen3-30B-A3B or Mixtral; every other part keeps something
            assert all(v == 0 if part == "shared_experts" else v > 0 for v in values.values()), (pair, part)
        rows = {row["term"]: row for row in model["compare"]}
        assert rows["layer activations"]["measured_bytes"] == sum(v["cpu"] for v in activations.values())
        weights = rows["layer weights (BF16)"]
        # every weight, Qwen3's per-head Q and K RMSNorm weights (--qk-layernorm) included
        assert weights["analytic_bytes"] == weights["measured_bytes"], pair
        assert model["cuda_memory"] is None  # the cpu backend has no caching allocator to read


def test_the_cpu_backend_keeps_what_the_symbolic_one_does_with_the_same_spec_and_kernels(tiny_run):
    """The claim of tests/test_symbolic_moe.py (test_the_cpu_backend_measures_what_the_symbolic_one_does):
    at EP 1, the real layer on the CPU and the symbolic one with the local spec on torch's CPU
    paths keep the same bytes per part, and hold the same parameters and gradients."""
    out, summary = tiny_run
    for pair, model in summary["models"].items():
        assert set(model["real_minus_symbolic"]["symbolic-local-cpu"].values()) == {0}, pair
        cpu, symbolic = (json.loads((out / f"{pair}-{b}" / layer_profile.FILENAME).read_text())
                         for b in ("cpu", "symbolic-local-cpu"))
        for key in ("parameter_bytes", "activation_bytes", "gradient_bytes"):
            assert cpu[key] == symbolic[key], (pair, key)


def test_a_second_run_into_the_same_directory_is_refused_in_one_line(tiny_run):
    out, _ = tiny_run
    again = subprocess.run([sys.executable, "benchmarks/gpu/measure_moe_layers.py", str(out), "--device", "cpu",
                            "--tiny"], cwd=ROOT, capture_output=True, text=True)
    assert again.returncode == 2 and again.stderr.strip() == f"Error: {out} is not empty"


def _profile_doc(**changes) -> dict:
    from advisor.moe.spec import PRESETS

    profile = layer_profile.MoELayerProfile(
        model=PRESETS["mixtral-8x7b"], seq_len=4096, mbs=1, ep=1, dispatcher="allgather", backend="cuda",
        parameter_bytes=dict.fromkeys(layer_profile.PARTS, 2), activation_bytes=dict.fromkeys(layer_profile.PARTS, 4),
        gradient_bytes=10, cuda_memory=dict.fromkeys(layer_profile.CUDA_MEMORY, 7))
    return {**profile.to_dict(), **changes}


def test_the_cuda_backends_allocator_readings_round_trip_and_bad_ones_are_refused():
    doc = _profile_doc()
    assert layer_profile.from_dict(doc, "x").cuda_memory == dict.fromkeys(layer_profile.CUDA_MEMORY, 7)
    assert "cuda_memory" not in layer_profile.from_dict(_profile_doc(cuda_memory=None), "x").to_dict()
    with pytest.raises(AdvisorError, match="cuda_memory must map exactly"):
        layer_profile.from_dict(_profile_doc(cuda_memory={"peak_allocated_bytes": 1}), "x")
    with pytest.raises(AdvisorError, match="cuda_memory.alloc_retries"):
        layer_profile.from_dict(_profile_doc(cuda_memory={**doc["cuda_memory"], "alloc_retries": -1}), "x")


def test_moe_layer_cuda_backend_without_a_gpu_is_refused_in_one_line(tmp_path):
    """``python -m megatron_hooks.moe_layer --backend cuda`` on a machine without a GPU (the real
    module, in its own process): exit 2, one line on stderr and no traceback, nothing on stdout,
    and no profile left in --out (the refusal comes before the layer is built)."""
    pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install -e '.[megatron]')")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the cuda backend would run")
    out = tmp_path / "layer"
    done = subprocess.run([sys.executable, "-m", "megatron_hooks.moe_layer", "mixtral-8x7b", "--backend", "cuda",
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == ["Error: mixtral-8x7b: the CUDA backend needs a GPU, and torch sees "
                                                "none (torch.cuda.is_available() is False)"]
    assert not (out / layer_profile.FILENAME).exists()
