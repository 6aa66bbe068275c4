"""The throughput ranking's documented rule (``advisor.ranking``): the rows within the tolerance
of the fastest rank simplest first, and a layout sharded by Megatron-FSDP or with its optimizer
offloaded to the host is less simple than the same layout on DDP's distributed optimizer."""

from __future__ import annotations

import pytest

from advisor.memory import MemoryOptions, estimate_memory
from advisor.models import preset
from advisor.parallel import ParallelConfig, Workload
from advisor.ranking import rank_rows, ranking_tolerance
from advisor.sweep import SweepRow

LEVERS = {"Megatron-FSDP optim_grads": MemoryOptions(fsdp_strategy="optim_grads"),
          "Megatron-FSDP no_shard": MemoryOptions(fsdp_strategy="no_shard"),
          "torch FSDP2": MemoryOptions(fsdp_strategy="torch_fsdp2"),
          "optimizer CPU offload": MemoryOptions(optimizer_host_fraction=1.0)}


def _row(options: MemoryOptions, tflops: float) -> SweepRow:
    """One 8B layout on 8 GPUs (each row its own ParallelConfig, as the sweep's rows have)."""
    spec, workload = preset("llama3.1-8b"), Workload(seq_len=4096, global_batch_size=64)
    parallel = ParallelConfig(tp=1, cp=1, pp=1, dp=8, mbs=1)
    return SweepRow(parallel, workload.num_microbatches(parallel), estimate_memory(spec, parallel, workload, options),
                    80.0, "fits", options=options, timing={"tflops_per_gpu": tflops})


@pytest.mark.parametrize("lever", LEVERS)
def test_a_sharded_or_offloaded_row_within_the_tolerance_ranks_after_the_plain_one(lever):
    """Predicted a little faster (half the tolerance), the row with the lever still ranks second:
    the time model cannot tell the two apart, and the plain one is simpler. Nor does a sharded
    row's lower memory (the paper's rule, the tie-break, prefers it) decide within the band."""
    tolerance = ranking_tolerance()
    plain, levered = _row(MemoryOptions(), 500.0 * (1 - tolerance / 2)), _row(LEVERS[lever], 500.0)
    ranked = rank_rows([levered, plain], "throughput")
    assert [row.options for row in ranked] == [plain.options, levered.options]
    assert [row.rank for row in ranked] == [1, 2]


@pytest.mark.parametrize("lever", LEVERS)
def test_outside_the_tolerance_the_faster_row_ranks_first_whatever_its_levers(lever):
    tolerance = ranking_tolerance()
    plain, levered = _row(MemoryOptions(), 500.0 * (1 - 2 * tolerance)), _row(LEVERS[lever], 500.0)
    assert [row.options for row in rank_rows([plain, levered], "throughput")] == [levered.options, plain.options]
