"""--tp-comm-overlap's userbuffers in the calibrated memory model (``memory_terms.userbuffers_bytes``),
against bytes counted by hand from the sources.

Megatron-LM (core_v0.15.2 ``megatron/training/initialize.py``, ``_initialize_tp_communicators``)
gives ``initialize_ub`` the shape [s b // c, h] and no dtype (BF16); TE 2.9's ``initialize_ub``
(``pytorch/module/base.py``) calls ``add_ub`` for all 12 buffer names, each uint8 in an FP8 run
where ``fp8_buf`` (the all-gathers, and a reduce-scatter of TE's ``methods["pipeline"]`` list the
file marks), else BF16;
``CommOverlapBase::initialize`` registers the whole shape and ``CommOverlapP2PBase::initialize``
(ring exchange) 2 t - 1 chunks of 1/t of it for a reduce-scatter
(``common/comm_gemm_overlap/comm_gemm_overlap.cpp``).

Llama 3.1 70B (h 8192), s 8192, b 1, c 1, t 8: the shape is 8192 x 8192, 64 MiB a byte.
"""

import numpy as np
import pytest

from advisor import memory_terms
from advisor.models import load_model
from advisor.options import TrainingOptions
from advisor.options.ub_config import TE_DEFAULTS, parse_userbuffers
from advisor.throughput.calibration import load_memory_calibration
from advisor.verdicts import calibrated_terms

MIB = 2**20
SPEC = load_model("llama3.1-70b")


def _bytes(config=TE_DEFAULTS, fp8=False, tp=8, cp=1):
    return float(memory_terms.userbuffers_bytes(config, SPEC, 8192, 1, tp, cp, fp8))


def test_default_bf16_run_holds_twelve_whole_bf16_buffers():
    """12 buffers of 8192 x 8192 BF16, 128 MiB each: 1536 MiB."""
    assert _bytes() == 1536 * MIB


def test_default_fp8_run_holds_the_all_gathers_in_one_byte():
    """The 8 all-gather buffers (qkv/proj/fc1/fc2 fprop or dgrad or wgrad) at 64 MiB, the 4
    reduce-scatters (proj_fprop, fc2_fprop, qkv_wgrad, fc1_wgrad) at 128 MiB: 1024 MiB."""
    assert _bytes(fp8=True) == 1024 * MIB


def test_a_ring_exchange_reduce_scatter_keeps_two_t_minus_one_chunks():
    """proj_fprop by ring exchange: 15 chunks of 128 / 8 = 16 MiB, 240 MiB, beside 11 x 128 MiB."""
    config = parse_userbuffers("ub.yaml", {"proj_fprop": {"method": "ring_exchange"}})
    assert _bytes(config) == (11 * 128 + 240) * MIB


def test_a_pipelined_qkv_dgrad_leaves_its_wgrad_buffer_bf16():
    """FP8, qkv_dgrad pipelined without fp8_buf: it becomes a BF16 reduce-scatter (128 MiB), and
    qkv_wgrad is still made, BF16 (not an all-gather buffer): 7 x 64 + 5 x 128 = 1088 MiB."""
    config = parse_userbuffers("ub.yaml", {"qkv_dgrad": {"method": "pipeline"}})
    assert _bytes(config, fp8=True) == 1088 * MIB


def test_fp8_buf_is_decided_by_te_s_method_list():
    """FP8. fc2_fprop by ring exchange with fp8_buf: still in TE's ``methods["pipeline"]`` list, so
    uint8: 15 chunks of 64 / 8 = 8 MiB, 120 MiB where the default holds 128 MiB; qkv_wgrad set to
    pipeline with fp8_buf: in TE's "bulk" list, so BF16, 128 MiB as by default: 1024 - 8 = 1016 MiB."""
    config = parse_userbuffers("ub.yaml", {"fc2_fprop": {"method": "ring_exchange", "fp8_buf": True},
                                           "qkv_wgrad": {"method": "pipeline", "fp8_buf": True}})
    assert _bytes(config, fp8=True) == 1016 * MIB


def test_nothing_at_tp_1_and_half_with_cp_2():
    assert _bytes(tp=1) == 0.0
    assert _bytes(cp=2) == 768 * MIB


@pytest.mark.parametrize(("fp8", "mib"), [(None, 1536), ("hybrid", 1024)])
def test_every_stage_of_an_overlap_run_adds_the_buffers(fp8, mib):
    """Through the options: the calibrated model adds the buffers to each of 4 stages at TP 8,
    and nothing to a TP 1 layout of the same options (Megatron refuses the overlap there)."""
    plain = TrainingOptions().with_(fp8_format=fp8) if fp8 else TrainingOptions()
    overlap = plain.with_(tp_comm_overlap=True)
    calibration, stages, pp = load_memory_calibration(), np.arange(4), 4

    def added(options, tp):
        terms = calibrated_terms(SPEC, 8192, 1, tp, 1, stages, pp, False, options.memory_options(), calibration, 80.0)
        return np.broadcast_to(terms.added, (pp,))

    assert added(overlap, 8) - added(plain, 8) == pytest.approx([mib * MIB] * 4)
    assert added(overlap, 1) - added(plain, 1) == pytest.approx([0.0] * 4)
