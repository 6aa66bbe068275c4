"""--sharding auto's ladder (advisor.escalation), dense and MoE sweeps alike: one record of the
rungs climbed in vain (``Sweep.ladder``, ``SweepResult.ladder``), worded by one function
(``advisor.cli.sweep_table.ladder_text``) in both nothing-fits lines."""

from __future__ import annotations

import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

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


# --- a climbed rung is the lever given by hand --------------------------------------------------------

DENSE = ("--model", "llama3.1-70b", "--gpus", 8, "--gpu", "h100-80gb", "--seq-len", 4096, "--gbs", 64, "--top", 5)
MOE = ("--model", "mixtral-8x7b", "--gpus", 64, "--gpu", "h100-80gb", "--mem", 40, "--seq-len", 4096, "--gbs", 256,
       "--pp", 1, "--ep", 8, "--etp", 1, "--top", 5)  # tests/test_moe_escalation.py's case: it climbs to optim_grads
OFFLOAD_FLAGS = ("--optimizer-cpu-offload",)
FSDP_FLAGS = ("--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads")


def _rows(advisor, *args) -> list[dict]:
    """A sweep's JSON rows, without the lever's step-time cost (which only a climbed sweep has)."""
    rows = advisor.json("sweep", *args)
    for row in rows:
        row.pop("lever_time_cost_s", None)
    return rows


def test_the_rung_takes_the_overlap_param_gather_default_of_the_hand_given_lever():
    """--no-distributed-optimizer left --overlap-param-gather off (Megatron refuses it without the
    distributed optimizer); a rung turns the distributed optimizer on, and the CLI's default for
    the lever given by hand is then on (with --overlap-grad-reduce). A user's own choice is kept."""
    from advisor.escalation import LADDER, rung
    from advisor.options import TrainingOptions

    plain = TrainingOptions().with_(distributed_optimizer=False, overlap_param_gather=False)
    for _, changes in LADDER:
        assert rung(plain, changes).data_parallel.overlap_param_gather is True
        assert rung(plain, changes, gather_given=True).data_parallel.overlap_param_gather is False
    no_reduce = plain.with_(overlap_grad_reduce=False)  # Megatron refuses the gather without it: stays off
    assert rung(no_reduce, LADDER[0][1]).data_parallel.overlap_param_gather is False
    assert rung(TrainingOptions(), LADDER[2][1]) == TrainingOptions().with_(**LADDER[2][1])  # the defaults: as before


@pytest.mark.parametrize("case, lever", [(DENSE, OFFLOAD_FLAGS), (MOE, FSDP_FLAGS)], ids=["dense", "moe"])
def test_a_climbed_sweep_from_no_distributed_optimizer_is_the_hand_given_levers(advisor, case, lever):
    """Its rows (options, megatron_args, step times) are those of the lever given by hand: the
    overlapped parameter gather priced and emitted (it was off: Mixtral 3.567 s against 3.366 s)."""
    climbed = _rows(advisor, *case, "--no-distributed-optimizer", "--format", "json")
    assert climbed and climbed == _rows(advisor, *case, *lever, "--format", "json")
    assert all("--overlap-param-gather" in row["megatron_args"] for row in climbed)
    assert climbed == _rows(advisor, *case, "--format", "json")  # as from the default options


@pytest.mark.parametrize("case, lever", [(DENSE, OFFLOAD_FLAGS), (MOE, FSDP_FLAGS)], ids=["dense", "moe"])
def test_an_explicit_no_overlap_param_gather_is_kept_by_the_rung(advisor, case, lever):
    explicit = ("--no-distributed-optimizer", "--no-overlap-param-gather")
    climbed = _rows(advisor, *case, *explicit, "--format", "json")
    assert climbed and climbed == _rows(advisor, *case, *lever, "--no-overlap-param-gather", "--format", "json")
    assert all(row["options"]["overlap_param_gather"] is False and "--overlap-param-gather" not in row["megatron_args"]
               for row in climbed)


# --- the MoE ladder's bound ----------------------------------------------------------------------------

_MOE_RUNGS = ({}, *(changes for _, changes in LADDER))


def _moe_case(model: str, layers: int | None):
    from dataclasses import replace

    from advisor.moe.spec import PRESETS as MOE_PRESETS

    spec = MOE_PRESETS[model]
    return spec if layers is None else replace(spec, num_layers=layers)


@settings(max_examples=80, deadline=None)
@given(st.sampled_from([("mixtral-8x7b", None), ("qwen3-30b-a3b", 12), ("deepseek-v3", 8)]),
       st.sampled_from([8, 16, 32]), st.floats(4.0, 120.0), st.sampled_from(range(len(_MOE_RUNGS))), st.booleans(),
       st.sampled_from([None, 1, 8]), st.booleans(), st.sampled_from([1024, 4096, 32768]))
@example(("mixtral-8x7b", None), 8, 80.0, 1, True, None, False, 4096)  # the H800 case's FSDP rung: skipped
def test_the_moe_bound_never_skips_a_rung_that_has_a_row(model, gpus, memory, rung, calibrated, ep, even, seq_len):
    """advisor.moe.space.may_fit says False only where the whole sweep with those options ranks no
    layout (brute force: the sweep itself, every variant priced), so the ladder skips no rung that
    would have run."""
    from advisor.errors import AdvisorError
    from advisor.moe import stage
    from advisor.moe.space import may_fit, sweep
    from advisor.options import TrainingOptions

    spec, workload = _moe_case(*model), Workload(seq_len=seq_len, global_batch_size=64)
    options = stage.MoEOptions(training=TrainingOptions().with_(**_MOE_RUNGS[rung]))
    layouts = dict(max_tp=8, ep=ep, even_split=even)
    try:
        result = sweep(spec, workload, gpus, memory, options=options, memory_model="calibrated" if calibrated
                       else "paper", **layouts)
    except AdvisorError:
        return  # no layout with these choices: the rung fails as a sweep, bound or not
    bound = may_fit(spec, workload, gpus, memory, options=options, **layouts)
    event(f"may fit: {bound}, ranked: {result.ranked > 0}")
    assert bound or result.ranked == 0


@pytest.mark.parametrize("memory, expected", [(4.0, False), (40.0, True)])
def test_the_moe_bound_says_both(memory, expected):
    """Not vacuous: Mixtral 8x7B on 64 GPUs under Megatron-FSDP optim_grads_params shards every
    state over 64 GPUs: 46.7B parameters x 18 bytes / 64 = 12.2 GiB at the very least, over 4 GiB;
    at 40 GiB a layout fits (the sweep ranks one)."""
    from advisor.moe import stage
    from advisor.moe.space import may_fit, sweep
    from advisor.options import TrainingOptions

    spec, workload = _moe_case("mixtral-8x7b", None), Workload(seq_len=4096, global_batch_size=256)
    options = stage.MoEOptions(training=TrainingOptions().with_(**LADDER[1][1]))
    assert 46.7e9 * 18 / 64 / 2**30 > 4
    assert may_fit(spec, workload, 64, memory, options=options) is expected
    assert (sweep(spec, workload, 64, memory, options=options).ranked > 0) is expected
