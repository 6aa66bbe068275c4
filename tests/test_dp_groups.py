"""advisor/throughput/data_parallel.py: the DP collectives of the dense model (one group) and the
MoE model (two: dense parameters over DP x CP, experts over the expert DP group), by hand."""

from __future__ import annotations

import numpy as np
import pytest

from advisor.throughput import data_parallel as dpc
from advisor.throughput.model import TimeOptions
from advisor.throughput.terms import Rates

# NVLink only (a 2-rank group inside an 8-GPU node), no latency: a ring of 2 ranks moves half the
# tensor, so a reduce-scatter of P FP32 gradients takes 1/2 x 4 P / 400e9 = P / 2e11 s and an
# all-gather of P BF16 weights 1/2 x 2 P / 400e9 = P / 4e11 s.
RATES = Rates(gemm_flops_per_s=1e15, gemm_latency_s=0.0, attention_flops_per_s=1e15, attention_latency_s=0.0,
              hbm_bytes_per_s=1e12, nvlink_bytes_per_s=400e9, network_bytes_per_s=50e9, collective_latency_s=0.0,
              gpus_per_node=8, host_mask_s_per_element=0.0)
DENSE = dpc.DpGroup(6e10, 2.0, 1.0)  # reduce 0.3 s, gather 0.15 s
EXPERTS = dpc.DpGroup(1e11, 2.0, 1.0)  # reduce 0.5 s, gather 0.25 s


def _exposed(groups, opts=TimeOptions(), hidden_forward=0.3, hidden_backward=0.6, m=1.0) -> float:
    return float(dpc.exposed_time(groups, 2.0, RATES, opts, m, hidden_forward, hidden_backward))


def test_one_group_hidden_behind_the_first_stage():
    """The dense model's one group: reduce 0.3 s behind 0.6 s of backward, gather 0.15 s behind 0.3 s
    of forward, nothing shows; with both overlaps off all of it, 0.45 s."""
    assert _exposed((DENSE,)) == 0.0
    off = TimeOptions(overlap_grad_reduce=False, overlap_param_gather=False)
    assert _exposed((DENSE,), off) == pytest.approx(0.45, rel=1e-12)


def test_two_groups_are_hidden_together_not_each_apart():
    """Both groups' collectives run one after the other behind the same backward and forward: reduce
    0.3 + 0.5 = 0.8 s behind 0.6 s shows 0.2 s, gather 0.15 + 0.25 = 0.4 s behind 0.3 s shows 0.1 s:
    0.3 s (each group hidden apart would show nothing)."""
    assert _exposed((DENSE, EXPERTS)) == pytest.approx(0.3, rel=1e-12)


def test_fsdp_per_microbatch_with_its_own_gradient_wire_dtype():
    """optim_grads with --megatron-fsdp-grad-comm-dtype bf16 (grad_comm_bytes 2): no step-level
    reduce; each of m = 4 microbatches reduce-scatters 2-byte gradients, 1/2 x 2 P / 400e9 = P / 4e11:
    0.15 + 0.25 = 0.4 s behind 0.6 s of backward, hidden; overlap off, 4 x 0.4 = 1.6 s. The
    step's gather (0.4 s behind 0.3 s of forward) shows 0.1 s either way it overlaps, 0.4 s off."""
    opts = TimeOptions(fsdp_strategy="optim_grads", grad_comm_bytes=2)
    assert opts.grad_wire_bytes == 2 and TimeOptions().grad_wire_bytes == 4
    assert _exposed((DENSE, EXPERTS), opts, m=4.0) == pytest.approx(0.1, rel=1e-12)
    off = TimeOptions(fsdp_strategy="optim_grads", grad_comm_bytes=2, overlap_grad_reduce=False,
                      overlap_param_gather=False)
    assert _exposed((DENSE, EXPERTS), off, m=4.0) == pytest.approx(0.4 + 1.6, rel=1e-12)


def test_the_groups_links_are_their_own():
    """Across nodes (a 16-rank span over 8-GPU nodes) each group's rings use its own GPUs' NICs: the
    dense group with 4 GPUs a node 4 x 50 GB/s = 200 GB/s, the experts with 1, 50 GB/s. Both overlaps
    off, 2 shards: dense reduce 1/2 x 4 x 6e10 / 200e9 = 0.6 s, gather 0.3 s; experts' reduce
    1/2 x 4 x 1e10 / 50e9 = 0.4 s, gather 0.2 s: 1.5 s."""
    off = TimeOptions(overlap_grad_reduce=False, overlap_param_gather=False)
    groups = (dpc.DpGroup(6e10, 2.0, 4.0), dpc.DpGroup(1e10, 2.0, 1.0))
    exposed = dpc.exposed_time(groups, 16.0, RATES, off, 1.0, 0.0, 0.0)
    assert float(np.asarray(exposed)) == pytest.approx(1.5, rel=1e-12)
