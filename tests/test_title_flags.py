"""A sweep's title names the training options it was given as the Megatron flags they change
(``advisor.options.flags.changed_args``), not as the advisor's field names: what a Megatron user
reads in the rows' ``megatron_args``."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from advisor.cli import cli
from advisor.options import TrainingOptions
from advisor.options.flags import changed_args


@pytest.mark.parametrize("changes, flags", [
    ({}, ""),
    # with --bf16 Megatron reduces in FP32 unless told otherwise: the one flag swaps for the other
    ({"grad_reduce_dtype": "bf16"}, "--grad-reduce-in-bf16, no --accumulate-allreduce-grads-in-fp32"),
    ({"tp_comm_overlap": True}, "--tp-comm-overlap"),
    ({"distributed_optimizer": False, "overlap_param_gather": False},
     "no --use-distributed-optimizer, no --overlap-param-gather"),
    ({"fsdp_strategy": "optim_grads"},
     "--use-megatron-fsdp, --data-parallel-sharding-strategy optim_grads, --ckpt-format fsdp_dtensor"),
    ({"vocab_divisible_by": 128}, "--make-vocab-size-divisible-by 128"),
])
def test_changed_options_read_as_the_flags_they_change(changes, flags):
    assert changed_args(TrainingOptions().with_(**changes)) == flags


def test_the_sweep_title_says_the_flags_not_the_fields():
    result = CliRunner().invoke(cli, ["sweep", "--gpus", "8", "--gpu", "h100-80gb", "--grad-dtype", "bf16",
                                      "--tp-comm-overlap", "--top", "1"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    title = result.stdout.splitlines()[0]
    assert title.endswith("; --grad-reduce-in-bf16, --tp-comm-overlap, no --accumulate-allreduce-grads-in-fp32")
    assert "grad_reduce_dtype" not in result.stdout
