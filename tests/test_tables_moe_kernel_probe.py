"""tables.moe_kernel_probe: the MoE router's and permutations' constants in advisor.moe.time are
what the committed H200 profiles give (benchmarks/gpu/data/h200_moe_kernels/)."""

import json

import pytest

from advisor.moe import ep_time
from advisor.moe import time as moe_time
from tables import moe_kernel_probe


@pytest.fixture(scope="module")
def models():
    return moe_kernel_probe.load()


@pytest.fixture(scope="module")
def derived(models):
    return models["qwen3-30b-a3b"]


def test_the_constants_are_the_measurements_rounded(models, derived):
    assert moe_time.ROUTER_KERNELS_S["softmax"] == pytest.approx(derived.router_kernels_s, abs=0.005e-3)
    assert moe_time.ROUTER_KERNELS_S["sigmoid"] == pytest.approx(models["deepseek-v3"].router_kernels_s, abs=0.005e-3)
    assert ep_time.PERMUTE_HBM_FRACTION == pytest.approx(derived.permute_hbm_fraction, abs=0.005)


def test_the_held_out_models_check_what_they_did_not_set(models):
    """Mixtral 8x7B (8 experts, top-2, hidden 4096) and DeepSeek-V3 (256 experts, hidden 7168) were
    measured as Qwen3-30B-A3B was and enter no constant they check: the softmax router's fixed cost
    holds on Mixtral within 1%, the permutations' rate within 11% on both (the numbers docs/moe.md
    and the probe print)."""
    mixtral, deepseek = models["mixtral-8x7b"], models["deepseek-v3"]
    assert mixtral.router_kernels_s / moe_time.ROUTER_KERNELS_S["softmax"] == pytest.approx(1.0, abs=0.01)
    for held_out, ratio in ((mixtral, 1.11), (deepseek, 0.92)):
        priced = held_out.permute_priced_s / ep_time.PERMUTE_HBM_FRACTION
        assert held_out.permute_measured_s / priced == pytest.approx(ratio, abs=0.005)


def test_the_measurement_agrees_with_itself_and_with_megatron_core(derived):
    summary = json.loads(moe_kernel_probe.SUMMARY.read_text())  # Qwen3-30B-A3B's
    # megatron-core 0.15.2 on an H200 without Transformer Engine, Qwen3-30B-A3B at sequence 4096
    assert (summary["device"], summary["megatron_core"], summary["model"], summary["seq_len"]) == (
        "NVIDIA H200", "0.15.2", "qwen3-30b-a3b", 4096)
    assert summary["router"]["moe_router_force_load_balancing"] and not summary["moe_permute_fusion"]
    # both dispatchers run the same router: their non-GEMM kernels agree within 2%
    routers = [moe_kernel_probe.profile_of(summary, f"{d}-router") for d in ("alltoall", "allgather")]
    small = [p["kernel_s"] - p["gemm_kernel_s"] for p in routers]
    assert small[0] == pytest.approx(small[1], rel=0.02)
    # the alltoall dispatcher's kernels less its sort by local expert are the allgather's first pair
    assert derived.alltoall_first_pair_s == pytest.approx(derived.permute_measured_s, rel=0.02)
    # 32,768 routed copies of 2048 BF16 values, permuted and back: 536,870,912 bytes forward, at
    # 80% of an H200's 4.8 TB/s, three times (forward and a backward of twice it): 0.419 ms
    assert derived.permute_priced_s == pytest.approx(3 * 4 * 32768 * 2 * 2048 / (0.8 * 4.8e12), rel=1e-3)
    assert derived.sort_measured_s < derived.sort_priced_s  # the sort's copies beat the rate: kept at it


def test_the_probe_prints_both_constants(capsys):
    moe_kernel_probe.main()
    out = capsys.readouterr().out
    assert "ROUTER_KERNELS_S['softmax'] = 0.24 ms" in out and "ROUTER_KERNELS_S['sigmoid'] = 0.50 ms" in out
    assert "PERMUTE_HBM_FRACTION 0.423 (advisor: 0.42)" in out and "mixtral-8x7b router" in out
