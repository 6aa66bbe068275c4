"""Sequence parallelism's collectives under --fp8-format (``levers.fp8_tp_bytes``), hand-derived.

Transformer Engine 2.9 (and 1.11 for delayed scaling) quantises a column-parallel layer's input
and a row-parallel layer's output gradient before their all-gathers, so those move 1 byte an
element (plus the block recipes' scales); the reduce-scatters stay BF16 unless a pipelined
userbuffers buffer sets fp8_buf (delayed scaling only).
"""

import numpy as np
import pytest

from advisor.hardware import get_gpu
from advisor.models import PRESETS
from advisor.options.ub_config import TE_DEFAULTS, parse_userbuffers
from advisor.throughput import load_calibration
from advisor.throughput import terms, userbuffers
from advisor.throughput.levers import fp8_tp_bytes

H100 = get_gpu("h100-80gb")
RATES = terms.Rates.of(H100, load_calibration())
SPEC = PRESETS["llama3.1-70b"]
TOKENS, TP = 8192.0, 8  # one sequence of 8192 at TP 8 (CP 1)


def _ring(element_bytes):
    """One ring collective of [8192, 8192] at ``element_bytes`` over 8 NVLink ranks, by hand:
    7/8 of the tensor over the link, plus 7 latencies."""
    return 7 / 8 * element_bytes * 8192 * 8192 / RATES.nvlink_bytes_per_s + 7 * RATES.collective_latency_s


def test_the_bytes_each_recipe_moves():
    # per-tensor recipes: FP8 gathers, one scale copied (no bytes); BF16 reduce-scatters
    assert fp8_tp_bytes("delayed") == terms.TpBytes(1, 2, 1, 2, 1)
    assert fp8_tp_bytes("tensorwise") == terms.TpBytes(1, 2, 1, 2, 2)  # fp8_buf needs delayed's fused FP8 GEMM
    # block recipes: an FP32 scale per 128 or an E8M0 byte per 32; the gradient gathered both ways
    assert fp8_tp_bytes("blockwise") == terms.TpBytes(1.03125, 2, 2.0625, 2, 2)
    assert fp8_tp_bytes("mxfp8") == terms.TpBytes(1.03125, 2, 2.0625, 2, 2)


def test_plain_collectives_at_tp_8_hand_derived():
    """Llama 3.1 70B, TP 8, delayed scaling: forward 2 FP8 gathers + 2 BF16 reduce-scatters,
    backward 2 FP8 gradient gathers + 2 BF16 reduce-scatters; BF16 is 4 + 4 of 2 bytes."""
    forward, backward = terms.tensor_parallel_time(SPEC, TOKENS, TP, RATES, fp8_tp_bytes("delayed"))
    assert forward == pytest.approx(2 * _ring(1) + 2 * _ring(2), rel=1e-12)
    assert backward == pytest.approx(2 * _ring(1) + 2 * _ring(2), rel=1e-12)
    bf16 = terms.tensor_parallel_time(SPEC, TOKENS, TP, RATES)
    assert bf16 == pytest.approx((4 * _ring(2), 4 * _ring(2)), rel=1e-12)
    # MXFP8: gathers at 1 + 1/32 forward, 2 x (1 + 1/32) backward
    forward, backward = terms.tensor_parallel_time(SPEC, TOKENS, TP, RATES, fp8_tp_bytes("mxfp8"))
    assert backward == pytest.approx(2 * _ring(2.0625) + 2 * _ring(2), rel=1e-12)
    assert forward == pytest.approx(2 * _ring(1.03125) + 2 * _ring(2), rel=1e-12)


def _no_gemms(monkeypatch):
    """GEMMs of zero seconds: every collective fully exposed, so its ring time shows whole
    (ring exchange: comm - 0; pipeline: max(comm / 4, comm - 0); bulk: comm)."""
    monkeypatch.setattr(userbuffers, "gemm_time", lambda m, k, n, rates: 0.0)


def test_userbuffers_at_tp_8_hand_derived(monkeypatch):
    """With TE's default buffers and nothing to hide behind, the exposed time is the collectives
    themselves: FP8 all-gather buffers (qkv/fc1_fprop, proj/fc2_dgrad), BF16 reduce-scatters."""
    _no_gemms(monkeypatch)
    forward, backward, _, _ = userbuffers.tp_overlap_time(SPEC, TOKENS, TP, RATES, 132, TE_DEFAULTS,
                                                          fp8_tp_bytes("delayed"))
    assert forward == pytest.approx(2 * _ring(1) + 2 * _ring(2), rel=1e-12)
    assert backward == pytest.approx(2 * _ring(1) + 2 * _ring(2), rel=1e-12)


def test_fp8_buf_makes_the_pipelined_reduce_scatters_fp8(monkeypatch):
    """The DGX Cloud 405B recipe's fp8_buf on proj_fprop and fc2_fprop (pipeline): under delayed
    scaling both forward reduce-scatters move 1 byte; fp8_buf on a bulk buffer is ignored, as
    initialize_ub ignores it; without FP8 it changes nothing."""
    _no_gemms(monkeypatch)
    config = parse_userbuffers("cfg", {"proj_fprop": {"method": "pipeline", "fp8_buf": True},
                                       "fc2_fprop": {"method": "pipeline", "fp8_buf": 1},
                                       "qkv_wgrad": {"method": "bulk", "fp8_buf": True}})
    assert config.buffer("proj_fprop").fp8_buf and not config.buffer("qkv_wgrad").fp8_buf
    forward, backward, _, _ = userbuffers.tp_overlap_time(SPEC, TOKENS, TP, RATES, 132, config,
                                                          fp8_tp_bytes("delayed"))
    assert forward == pytest.approx(4 * _ring(1), rel=1e-12)
    assert backward == pytest.approx(2 * _ring(1) + 2 * _ring(2), rel=1e-12)
    bf16 = userbuffers.tp_overlap_time(SPEC, TOKENS, TP, RATES, 132, config)[0]
    assert bf16 == pytest.approx(4 * _ring(2), rel=1e-12)
    tensorwise = userbuffers.tp_overlap_time(SPEC, TOKENS, TP, RATES, 132, config, fp8_tp_bytes("tensorwise"))[0]
    assert tensorwise == pytest.approx(2 * _ring(1) + 2 * _ring(2), rel=1e-12)


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise", "blockwise", "mxfp8"])
@pytest.mark.parametrize("tp", [2, 4, 8, 16])
def test_fp8_never_costs_more_than_bf16(recipe, tp):
    """Per collective for the per-tensor recipes; for the block-scaled ones every collective but
    the gradient gather (both directions, 2.0625 bytes), and the layer's total in every case."""
    tokens = np.array([4096.0, 8192.0, 32768.0])
    sizes = fp8_tp_bytes(recipe)
    fp8 = terms.tensor_parallel_time(SPEC, tokens, tp, RATES, sizes)
    bf16 = terms.tensor_parallel_time(SPEC, tokens, tp, RATES)
    assert np.all(fp8[0] <= bf16[0]) and np.all(fp8[0] + fp8[1] <= bf16[0] + bf16[1])
    per_collective = [sizes.input_gather, sizes.output_scatter, sizes.dgrad_scatter, sizes.fp8_scatter]
    if recipe in ("delayed", "tensorwise"):
        per_collective.append(sizes.grad_gather)
    assert all(size <= terms.BF16 for size in per_collective)


def test_fp8_buf_follows_te_s_method_lists_not_the_file_s_method(monkeypatch):
    """TE 2.9 ``initialize_ub`` (pytorch/module/base.py): ``fp8_buf = (name in
    layers_all_gather_overlap) or (user_ub_cfg[name].get("fp8_buf", False) and name in
    methods["pipeline"])``, decided before ``ub_cfg.update(user_ub_cfg[name])``, with ``methods`` TE's
    default table ("pipeline": ["proj_fprop", "fc2_fprop"]), which only a non-bulk qkv/fc1_dgrad
    leaves (``methods[new_method].append(name)``). So fc2_fprop by ring exchange with fp8_buf is an
    FP8 buffer (its reduce-scatter moves 1 byte under delayed scaling), and qkv_wgrad (TE's "bulk"
    list) set to pipeline with fp8_buf is not; a qkv_dgrad moved to pipeline is, but its layer
    all-gathers FP8 input there (bulk, ``ub_config.ROLES``): no reduce-scatter FP8, and without
    fp8_buf it stays a BF16 all-gather buffer (refused in an FP8 run)."""
    _no_gemms(monkeypatch)
    config = parse_userbuffers("cfg", {"fc2_fprop": {"method": "ring_exchange", "fp8_buf": True},
                                       "qkv_wgrad": {"method": "pipeline", "fp8_buf": True}})
    assert config.buffer("fc2_fprop").fp8_buf and not config.buffer("qkv_wgrad").fp8_buf
    assert config.fp8_reduce_scatters() == ("fc2_fprop",)
    forward, backward, _, _ = userbuffers.tp_overlap_time(SPEC, TOKENS, TP, RATES, 132, config,
                                                          fp8_tp_bytes("delayed"))
    # qkv/fc1 gathers and fc2's reduce-scatter at 1 byte, proj's reduce-scatter at 2
    assert forward == pytest.approx(3 * _ring(1) + _ring(2), rel=1e-12)
    # gradient gathers at 1 byte, qkv_wgrad's and fc1_wgrad's reduce-scatters at 2
    assert backward == pytest.approx(2 * _ring(1) + 2 * _ring(2), rel=1e-12)
    moved = parse_userbuffers("cfg", {"qkv_dgrad": {"method": "pipeline", "fp8_buf": True}})
    assert moved.buffer("qkv_dgrad").fp8_buf and moved.fp8_reduce_scatters() == () == moved.bf16_all_gathers()
    assert parse_userbuffers("cfg", {"qkv_dgrad": {"method": "pipeline"}}).bf16_all_gathers() == ("qkv_dgrad",)
