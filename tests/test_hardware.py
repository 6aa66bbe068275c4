"""GPU presets: the data file, its strict loader, overrides, and ``advisor gpus``."""

import copy
import json

import pytest

from advisor.errors import AdvisorError
from advisor.hardware import GPUS_FILE, get_gpu, load_gpus, parse_gpus

DOCUMENT = json.loads(GPUS_FILE.read_text())


def test_every_preset_loads_with_sources_and_units():
    presets = load_gpus()
    assert len(presets) >= 10
    for gpu in presets.values():
        assert gpu.sources and all(isinstance(s, str) and len(s) > 20 for s in gpu.sources)
        assert gpu.nvlink_bytes_per_s == gpu.nvlink_bidirectional_gb_per_s * 1e9 / 2
        assert gpu.peak_flops == gpu.bf16_dense_tflops * 1e12


def test_the_papers_two_clusters():
    """Seed 004: A100-SXM 40 GB, 8 per node (ABCI); H100 SXM 94 GB, 4 per node (TSUBAME 4.0)."""
    a100, h100 = get_gpu("a100-40gb-abci"), get_gpu("h100-94gb")
    assert (a100.memory_gib, a100.gpus_per_node, h100.memory_gib, h100.gpus_per_node) == (40, 8, 94, 4)
    assert any("TSUBAME" in s for s in h100.sources) and any("ABCI" in s for s in a100.sources)


def test_dense_peaks_are_the_tensor_core_arithmetic():
    """Independent of the data file: SMs x dense BF16 FLOPs per SM per clock x clock."""
    assert get_gpu("a100-40gb").bf16_dense_tflops == pytest.approx(108 * 2048 * 1.41e9 / 1e12, rel=0.002)
    assert get_gpu("h100-80gb").bf16_dense_tflops == pytest.approx(132 * 4096 * 1.83e9 / 1e12, rel=0.002)
    # Sparse figures are exactly twice the dense ones the file keeps (datasheets quote both).
    assert get_gpu("h100-80gb").fp8_dense_tflops == pytest.approx(2 * get_gpu("h100-80gb").bf16_dense_tflops, rel=0.001)


def _broken(mutate):
    doc = copy.deepcopy(DOCUMENT)
    mutate(doc)
    with pytest.raises(AdvisorError) as info:
        parse_gpus(doc, "gpus.json")
    return str(info.value)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["gpus"][0].update(tflops=1), "unknown key(s) tflops"),
    (lambda d: d["gpus"][0].pop("memory_gib"), "missing key(s) memory_gib"),
    (lambda d: d["gpus"][0].update(memory_gib="40"), "memory_gib must be a positive number"),
    (lambda d: d["gpus"][0].update(memory_gib=-1), "memory_gib must be a positive number"),
    (lambda d: d["gpus"][0].update(gpus_per_node=2.5), "gpus_per_node must be a positive integer"),
    (lambda d: d["gpus"][0].update(gpus_per_node=100_000), "gpus_per_node must be at most 1,024"),  # limits.py
    (lambda d: d["gpus"][0].update(memory_gib=1e9), "memory_gib must be at most 16384"),
    (lambda d: d["gpus"][0].update(bf16_dense_tflops=True), "bf16_dense_tflops must be a positive number"),
    (lambda d: d["gpus"][0].update(sources=[]), "sources must be a non-empty list"),
    (lambda d: d["gpus"].append(copy.deepcopy(d["gpus"][0])), "listed twice"),
    (lambda d: d.update(schema="advisor-gpus/0"), "schema must be"),
    (lambda d: d.update(extra=1), "exactly the keys"),
])
def test_the_loader_refuses_what_it_does_not_know(mutate, message):
    assert message in _broken(mutate)


def test_overrides_and_lookup():
    gpu = get_gpu("H100-80GB").with_overrides(memory_gib=64, gpus_per_node=4)
    assert (gpu.memory_gib, gpu.gpus_per_node, gpu.bf16_dense_tflops) == (64, 4, 989)
    with pytest.raises(AdvisorError, match="did you mean h100-80gb"):
        get_gpu("h100-80")
    with pytest.raises(AdvisorError, match="GPU memory \\(GiB\\) must be a finite number, got nan"):
        get_gpu("h100-80gb").with_overrides(memory_gib=float("nan"))
    with pytest.raises(AdvisorError, match="GPUs per node must be at most 1,024, got 4096: an NVLink domain"):
        get_gpu("h100-80gb").with_overrides(gpus_per_node=4096)


def test_advisor_gpus_lists_the_interface_keys(advisor):
    rows = advisor.json("gpus")
    assert [r["name"] for r in rows] == list(load_gpus())
    for row in rows:
        assert {"name", "memory_gib", "bf16_dense_tflops", "gpus_per_node"} <= row.keys()
    assert "h100-94gb" in advisor("gpus").stdout
    assert advisor("gpus", "--format", "csv").stdout.splitlines()[0].startswith("name,")


@pytest.mark.parametrize("given, first", [("h100", "h100-80gb, h100-94gb, h100-nvl-94gb"), ("H100", "h100-80gb"),
                                          ("a100", "a100-40gb, a100-40gb-abci, a100-80gb"), ("b200", "b200-180gb")])
def test_a_family_name_suggests_its_presets_in_the_files_order(given, first):
    """'--gpu h100' suggested h100-94gb (TSUBAME's HBM2e node) before h100-80gb, the H100 SXM most
    clusters have: difflib ranks them alike and lists ties in its own order."""
    with pytest.raises(AdvisorError) as error:
        get_gpu(given)
    assert f"did you mean {first}" in str(error.value)
