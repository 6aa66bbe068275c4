"""MadPipe for Megatron (advisor.madpipe): the exact planner against every split, and its tables."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from advisor.capture.costs import CostTable, empty, upper
from advisor.capture.search import plan_megatron
from advisor.madpipe import analytic_tables, plan_fastest, profile_time_table, stage_times
from advisor.memory import MemoryOptions, estimate_memory
from advisor.models import PRESETS, with_overrides
from advisor.errors import AdvisorError
from advisor.parallel import ParallelConfig, Workload


def random_table(rng, units, rows, high):
    first, last = upper(units)
    values = empty(units, rows)
    values[:, first, last] = rng.integers(1, high, size=(rows, first.size))
    return CostTable(values, tuple((u, u) for u in range(1, units + 1)))


def brute_force(time, memory, units, stages, limit):
    """Every composition in Algorithm 4's order (fewer units first): the smallest period within the
    limit, then the lowest memory levels, then the first."""
    best = None
    for cuts in itertools.combinations(range(1, units), stages - 1):
        bounds = (0,) + cuts + (units,)
        spans = [(bounds[i] + 1, bounds[i + 1]) for i in range(stages)]
        mem = [memory.cost(a, b, stages - i) for i, (a, b) in enumerate(spans)]
        if max(mem) > limit:
            continue
        key = (max(time.cost(a, b, stages - i) for i, (a, b) in enumerate(spans)), tuple(sorted(set(mem), reverse=True)))
        if best is None or key < best[0]:
            best = (key, tuple(b - a + 1 for a, b in spans))
    return best


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 10).flatmap(lambda u: st.tuples(st.just(u), st.integers(1, min(u, 5)))),
       st.integers(0, 2**32 - 1), st.sampled_from([3, 1000]), st.booleans(), st.floats(0.3, 1.0))
def test_the_fastest_plan_is_the_best_split(case, seed, high, positional_time, fraction):
    units, stages = case
    rng = np.random.default_rng(seed)
    time = random_table(rng, units, stages if positional_time else 1, high)
    memory = random_table(rng, units, stages, high)
    limit = fraction * high
    best = brute_force(time, memory, units, stages, limit)
    if best is None:
        with pytest.raises(AdvisorError, match="keeps every stage within"):
            plan_fastest(time, memory, stages, limit)
        return
    plan, period = plan_fastest(time, memory, stages, limit)
    assert (period, plan.levels) == best[0]
    assert plan.units_per_stage == best[1]
    assert max(stage_times(time, plan)) == period


def test_profile_times_add_up_the_modules():
    forward, backward = np.array([1.0, 2, 3, 4, 5]), np.array([0.5, 4, 6, 8, 10])  # embedding, 3 layers, output
    table = profile_time_table(forward, backward)
    assert table.cost(1, 1, 1) == 1.5 + 6 and table.cost(2, 2, 1) == 9  # the embedding; a middle stage
    assert table.cost(2, 3, 1) == 9 + 12 + 15 and table.cost(1, 3, 1) == 1.5 + 6 + 9 + 12 + 15  # the output


@pytest.mark.parametrize("pp,layers", [(1, None), (2, (5, 11)), (4, (3, 4, 4, 5)), (4, (1, 2, 6, 7))])
def test_analytic_memory_is_the_estimators(pp, layers):
    """Every entry a plan can use is what estimate_memory gives that stage in that split."""
    spec = with_overrides(PRESETS["llama3.1-8b"], num_layers=16)
    workload = Workload(seq_len=4096, global_batch_size=64)
    memory, _ = analytic_tables(spec, 4096, MemoryOptions(), tp=2, cp=1, dp=2, mbs=1, pp=pp, num_microbatches=32)
    layers = layers or (16,)
    estimate = estimate_memory(spec, ParallelConfig(tp=2, dp=2, pp=pp), workload, layers_per_stage=layers)
    start = 1
    for index, (count, stage) in enumerate(zip(layers, estimate.stages)):
        assert memory.cost(start, start + count - 1, pp - index) == stage.total_bytes
        start += count


@pytest.mark.parametrize("model,tp,pp,recompute", [("llama3.1-70b", 8, 8, 0), ("llama3.1-405b", 8, 16, 0),
                                                   ("llama3.1-405b", 8, 16, 2), ("llama3.1-8b", 2, 4, 0)])
def test_the_dp_and_the_alike_layer_planner_agree(model, tp, pp, recompute):
    """Two exact planners of the same problem (the DP over tables, advisor.splits over counts) find
    the same period for MadPipe within 80 GiB and the same lowest peak."""
    from advisor.hardware import get_gpu
    from advisor.rank_times import Timing
    from advisor.space import Variants, launchable
    from advisor.space_pricer import _Pricer
    from advisor.throughput import TimeModel

    spec = PRESETS[model]
    options = MemoryOptions(recompute="full" if recompute else "none", recompute_method="block",
                            recompute_num_layers=max(recompute, 1))
    workload = Workload(seq_len=8192, global_batch_size=1024)
    timing = Timing(TimeModel(spec, get_gpu("h100-80gb"), 8192, 1024), 8)
    dp = 8
    memory, time = analytic_tables(spec, 8192, options, tp=tp, cp=1, dp=dp, mbs=1, pp=pp, num_microbatches=128,
                                   timing=timing)
    limit = 64 * 2**30
    plan, period = plan_fastest(time, memory, pp, limit)
    bases = launchable(spec, workload, tp * pp * dp, 8, MemoryOptions())
    index = np.flatnonzero((bases.tp == tp) & (bases.pp == pp) & (bases.cp == 1) & (bases.mbs == 1))[:1]
    variants = Variants(index, bases, np.array([1]), np.array([recompute]))
    times = timing.layouts(tp=bases.tp, cp=bases.cp, dp=bases.dp, mbs=bases.mbs, pp=bases.pp, selective=False)
    split = _Pricer(spec, workload, MemoryOptions(), variants, times).fastest(limit)
    assert split.feasible[0] and split.value[0] == pytest.approx(period, rel=1e-12)
    lowest = _Pricer(spec, workload, MemoryOptions(), variants).lowest()
    assert lowest.value[0] == pytest.approx(plan_megatron(memory, pp).peak, rel=1e-12)


def _timed_profiles(root, seconds):
    from capture_synth import TINY, Truth, write_run

    truth = Truth(spec=with_overrides(TINY, num_layers=4), seconds=seconds)
    for split in ((1, 3), (2, 2), (3, 1)):
        write_run(root, truth, split, mbs=1, num_microbatches=2)
    return truth


SECONDS = {"embedding": (0.001, 0.002), 1: (0.010, 0.020), 2: (0.010, 0.020), 3: (0.011, 0.022),
           4: (0.030, 0.060), "output": (0.004, 0.008)}


def test_recommend_time_from_profiled_layer_times(advisor, tmp_path):
    """The profiles' per-layer times: stage 1..k takes the embedding and its layers, k+1..4 its
    layers and the output. Stage times: (1,3) 0.033 | 0.165; (2,2) 0.063 | 0.135; (3,1) 0.096 | 0.102,
    the shortest period; a limit below (3,1)'s first stage leaves (2,2)."""
    _timed_profiles(tmp_path / "runs", SECONDS)
    common = ["--profile", tmp_path / "runs", "--gpus", 2, "--pp", 2, "--mbs", 1, "--gbs", 2, "--objective", "time"]
    plan = advisor.json("recommend", *common, "--mem", 80)
    assert plan["objective"] == "time" and plan["layers_per_stage"] == [3, 1]
    assert plan["period_s"] == pytest.approx(0.102) and plan["baseline"]["period_s"] == pytest.approx(0.135)
    assert [stage["predicted_time_s"] for stage in plan["stages"]] == pytest.approx([0.096, 0.102])
    three = plan["stages"][0]["predicted_bytes"]
    # a GPU whose memory, less the runtime and the allocator's reserve the profiles do not measure
    # (advisor.cli.recommend._unmeasured_bytes), is just below (3,1)'s first stage
    from advisor.throughput.calibration import load_memory_calibration

    cal = load_memory_calibration()
    mem = (0.999 * three + cal.overhead_gib * 2**30) / (1 - cal.reserve_fraction) / 2**30
    two = advisor.json("recommend", *common, "--mem", mem, "--threshold", 1)
    assert two["layers_per_stage"] == [2, 2] and two["stages"][0]["predicted_bytes"] < three


def test_recommend_time_needs_times_and_a_limit(advisor, tmp_path):
    from capture_synth import TINY, Truth, write_run

    write_run(tmp_path / "untimed", Truth(spec=with_overrides(TINY, num_layers=4)), (2, 2), mbs=1,
              num_microbatches=2)
    common = ["--gpus", 2, "--pp", 2, "--mbs", 1, "--gbs", 2, "--objective", "time"]
    assert ("no profile run recorded per-module times (the symbolic backend computes nothing; schema v1 files "
            "have none); or give --gpu NAME") in advisor.error("recommend", "--profile", tmp_path / "untimed",
                                                               *common, "--mem", 1)
    assert "needs the memory limit" in advisor.error("recommend", "--profile", tmp_path / "untimed", *common)
    # only what is missing: the --mem given is not asked for again (a newcomer's report)
    assert advisor.error("recommend", *common, "--mem", 80) == (
        "Error: --objective time needs stage times (profiles with per-layer times, or --gpu NAME for the time model)")
    assert "the profiles decide the model" in advisor.error("recommend", "--profile", tmp_path / "untimed",
                                                            *common, "--mem", 1, "--model", "llama3.1-70b")
    assert "for --objective memory only" in advisor.error("recommend", "--profile", tmp_path / "untimed", "--gpus",
                                                          2, "--mode", "hybrid", "--objective", "time")


def test_recommend_time_names_the_layouts_that_have_times(advisor, tmp_path):
    """Times are used as measured, never scaled: timed runs at microbatch 1, asked at 2, said 'no
    run measured them; profile that layout' (audit), as if no run had; the line names those that did."""
    from capture_synth import TINY, Truth, write_run

    _timed_profiles(tmp_path / "runs", SECONDS)
    write_run(tmp_path / "runs", Truth(spec=with_overrides(TINY, num_layers=4)), (2, 2), mbs=2, num_microbatches=2)
    line = advisor.error("recommend", "--profile", tmp_path / "runs", "--gpus", 2, "--pp", 2, "--mbs", 2, "--gbs",
                         4, "--objective", "time", "--mem", 1)
    assert line.endswith("at pp, microbatch 2: times are used as measured, never scaled, and the runs measured pp "
                         "at microbatch 1 (the pipeline microbatch is Megatron's --mbs x DP): recommend one of "
                         "those, or profile this layout; or give --gpu NAME to use the time model")


def test_recommend_time_for_405b_on_pp16_is_launchable_and_fits(advisor):
    plan = advisor.json("recommend", "--model", "llama3.1-405b", "--gpus", 16384, "--tp", 8, "--pp", 16, "--gbs",
                        2048, "--objective", "time", "--gpu", "h100-80gb")
    assert plan["launchable"] and sum(plan["layers_per_stage"]) == 126 and len(plan["layers_per_stage"]) == 16
    # --gpu: the calibrated model, whose usage (the allocator's reserve included) may fill the memory
    assert plan["peak_predicted_gib"] <= 80 and plan["stage_limit_gib"] == pytest.approx(80)
    assert plan["memory_limit_gib"] == 80 and plan["verdict"] in ("fits", "likely fits")
    assert plan["predicted_step_time_s"] > 0 and plan["period_s"] == max(s["predicted_time_s"] for s in plan["stages"])
    flags = plan["megatron_args"]
    assert "--pipeline-model-parallel-layout" in flags or "--decoder-first-pipeline-num-layers" in flags
