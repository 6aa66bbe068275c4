"""--sharding auto's ladder (advisor.escalation), dense and MoE sweeps alike: one record of the
rungs climbed in vain (``Sweep.ladder``, ``SweepResult.ladder``), worded by one function
(``advisor.cli.sweep_table.ladder_text``) in both nothing-fits lines."""

from __future__ import annotations

from advisor.escalation import LADDER
from advisor.hardware import get_gpu
from advisor.models import PRESETS
from advisor.parallel import Workload

FSDP2, FSDP3, OFFLOAD = (label for label, _ in LADDER)
BOUND = "no layout can fit with it"  # advisor.escalation.escalate: the rung may_fit says cannot fit


def _dense(gpus: int, gpu: str, **workload):
    from advisor.space import SpaceOptions
    from advisor.sweep import sweep

    return sweep(PRESETS["llama3.1-70b"], Workload(**workload), gpus, get_gpu(gpu).memory_gib, gpu=get_gpu(gpu),
                 memory_model="calibrated", space=SpaceOptions(sharding="auto"))


def test_the_dense_sweep_keeps_the_rungs_it_climbed_in_vain():
    """70B on 8 H800s: gpus.json gives the H800 no host memory bandwidth, so the offload rung is
    passed with that reason (``climb``); the FSDP rungs are skipped by the bound. Nothing runs:
    the result is the first sweep, carrying all three attempts."""
    result = _dense(8, "h800-80gb")
    assert result.escalation is None and not any(row.rank for row in result.rows)
    assert result.ladder == ((FSDP2, BOUND), (FSDP3, BOUND),
                             (OFFLOAD, "h800-80gb has no host link or host memory bandwidth to time it (gpus.json)"))


def test_a_climbed_dense_sweep_keeps_the_rungs_below_its_lever():
    """70B on 8 H100s at 4,096 tokens: the FSDP rungs fit nothing, the offload does (the README's
    case); the rows carry the offload and the ladder the two rungs before it."""
    result = _dense(8, "h100-80gb", seq_len=4096, global_batch_size=64)
    assert result.escalation == OFFLOAD and any(row.rank for row in result.rows)
    assert [label for label, _ in result.ladder] == [FSDP2, FSDP3]


def test_dense_and_moe_lines_word_the_ladder_with_one_function(advisor):
    """The dense line's words for the ladder are ``ladder_text`` of the sweep's own record, as
    the MoE line's are (tests/test_moe_escalation.py)."""
    from advisor.cli.sweep_table import ladder_text

    line = advisor("sweep", "--model", "llama3.1-70b", "--gpus", 8, "--gpu", "h800-80gb", expect=1).stderr
    words = ladder_text(_dense(8, "h800-80gb").ladder)
    assert words.startswith("; --sharding auto did not try Megatron-FSDP optim_grads or optim_grads_params: ")
    assert words + ". Try " in line
    fixed = advisor("sweep", "--model", "llama3.1-70b", "--gpus", 8, "--gpu", "h800-80gb", "--sharding", "fixed",
                    expect=1).stderr
    assert "--sharding auto did not try" not in fixed and ladder_text(()) == ""
