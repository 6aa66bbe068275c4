"""The MoE model's data-parallel collectives and their parameter counts (advisor/moe/time.py,
``_parameters`` and ``_data_parallel``).

Two things were wrong before 2026-11-30: the parameters were read back from the states' bytes
at 12 Adam bytes a parameter, which undercounts them under --use-precision-aware-optimizer
(its BF16 moments keep 8 bytes, not 12: a third fewer parameters reduced and gathered); and
Megatron's DDP without the distributed optimizer was priced as a reduce-scatter and an
all-gather, where it all-reduces the gradients (twice a reduce-scatter's traffic) and gathers
nothing."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from advisor.cli import cli
from advisor.moe import stage as st
from advisor.moe import time as moe_time
from advisor.moe.spec import PRESETS
from advisor.options import TrainingOptions
from advisor.throughput.terms import Rates

# Mixtral 8x7B at TP 1, PP 1, EP 8 on 16 GPUs (DP 16, expert DP 2), by hand: the embedding and the
# untied head 2 x 32,000 x 4,096 = 262,144,000 and the final norm 4,096; a layer's attention
# 4,096 x (4,096 + 2 x 1,024) + 4,096 x 4,096 = 41,943,040, two norms 8,192 and the router 8 x 4,096 =
# 32,768: 41,984,000 x 32 = 1,343,488,000. One expert a GPU a layer: 3 x 4,096 x 14,336 x 32.
DENSE = 262_144_000 + 4_096 + 32 * 41_984_000
EXPERTS = 32 * 3 * 4_096 * 14_336
LAYOUT = ["--model", "mixtral-8x7b", "--gpus", "16", "--gpu", "h100-80gb", "--tp", "1", "--pp", "1", "--ep", "8",
          "--mbs", "1", "--seq-len", "4096", "--gbs", "64", "--no-overlap-grad-reduce"]


def _rates() -> Rates:
    return Rates(gemm_flops_per_s=1e15, gemm_latency_s=0.0, attention_flops_per_s=1e15, attention_latency_s=0.0,
                 hbm_bytes_per_s=1e12, nvlink_bytes_per_s=400e9, network_bytes_per_s=50e9,
                 collective_latency_s=0.0, gpus_per_node=8, host_mask_s_per_element=0.0)


def _exposed(**changes) -> float:
    columns = {k: np.array([float(v)]) for k, v in dict(tp=1, cp=1, dp=16, ep=8, etp=1).items()}
    training = TrainingOptions().with_(overlap_grad_reduce=False, overlap_param_gather=False, **changes)
    exposed, _ = moe_time._data_parallel(columns, training, (float(DENSE), float(EXPERTS)), 0.0, _rates())
    return float(exposed[0])


def test_the_hand_counts_are_the_stages():
    assert DENSE == 1_605_636_096 and EXPERTS == 5_637_144_576
    for training in (TrainingOptions(), TrainingOptions().with_(precision_aware_optimizer=True, exp_avg_dtype="bf16",
                                                                exp_avg_sq_dtype="bf16")):
        b = st.stage_bytes(PRESETS["mixtral-8x7b"], 4096, st.MoEOptions(training=training), tp=1, cp=1, pp=1, ep=8,
                           etp=1, dp=16, mbs=1, num_microbatches=4, stage=0)
        assert (float(b.dense_parameters), float(b.expert_parameters)) == (DENSE, EXPERTS)


def test_without_the_distributed_optimizer_the_gradients_are_all_reduced_by_hand():
    """The 16 ranks span two nodes. The dense DP group has 8 GPUs a node: 8 NICs of 50 GB/s,
    400 GB/s; the expert DP group (ranks 8 apart, EP 8 inside a node) 1 a node, 50 GB/s.
    All-reduce of FP32 gradients, a ring: 2 x (n - 1)/n x 4 bytes a parameter, no all-gather."""
    all_reduce = 2 * (15 / 16 * 4 * DENSE / 400e9) + 2 * (1 / 2 * 4 * EXPERTS / 50e9)
    assert _exposed(distributed_optimizer=False) == pytest.approx(all_reduce, rel=1e-12)
    # with it: the FP32 reduce-scatter and the BF16 all-gather of the parameters
    sharded = 15 / 16 * (4 + 2) * DENSE / 400e9 + 1 / 2 * (4 + 2) * EXPERTS / 50e9
    assert _exposed() == pytest.approx(sharded, rel=1e-12)


def _time_parts(*extra) -> dict:
    result = CliRunner().invoke(cli, ["estimate", *LAYOUT, *extra, "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["time_parts"]


def test_the_precision_aware_optimizer_reduces_as_many_parameters():
    """How Adam keeps its states does not change what the data-parallel group reduces and
    gathers: the same exposed DP time with BF16 moments (8 state bytes) as with FP32 ones (12);
    read back from the states' bytes at 12 a parameter, the count came out smaller. Its step moves more bytes (BF16 states are cast to
    FP32 and back), so its optimizer time is larger."""
    plain = _time_parts()
    aware = _time_parts("--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16")
    assert aware["dp_comm_s"] == pytest.approx(plain["dp_comm_s"], rel=1e-12) and plain["dp_comm_s"] > 0
    assert aware["optimizer_s"] > plain["optimizer_s"]
