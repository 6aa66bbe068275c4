"""advisor.rank_times: the planners' view of the one time model (advisor.throughput)."""

import numpy as np
import pytest

from advisor.hardware import get_gpu
from advisor.models import PRESETS
from advisor.rank_times import Timing
from advisor.splits import caps
from advisor.throughput import TimeModel

SPEC = PRESETS["llama3.1-70b"]


def timing() -> Timing:
    return Timing(TimeModel(SPEC, get_gpu("h100-80gb"), 8192, 1024), 8)


@pytest.mark.parametrize("selective", [False, True])
def test_a_ranks_time_is_the_time_models_stage(selective):
    """U(n) = alpha n + rho min(n, vN) + beta_i is TimeModel.stage, for every rank and count."""
    tp, cp, dp, mbs, pp = (np.array([8, 4, 2]), np.array([1, 2, 1]), np.array([4, 2, 8]), np.array([1, 2, 1]),
                           np.array([4, 8, 1]))
    layouts = timing().layouts(tp=tp, cp=cp, dp=dp, mbs=mbs, pp=pp, selective=selective)
    vpp, recompute = np.array([2, 1, 1]), np.array([0 if selective else 2, 0, 0 if selective else 5])
    ranks = layouts.ranks(np.arange(3), vpp, recompute, 8)
    model = timing().model
    for k in range(3):
        for i in range(int(pp[k])):
            for n in (1, 3, 4, 9, 20):
                stage = model.stage(tp[k], cp[k], mbs[k], n, embedding=i == 0, head=i == pp[k] - 1,
                                    recompute="selective" if selective else "full",
                                    recompute_layers=min(n, vpp[k] * recompute[k]),
                                    pipeline_cross_node=tp[k] * cp[k] * dp[k] * pp[k] > 8,
                                    pipeline_parallel=pp[k] > 1)
                assert ranks(np.array([[n]]))[k, i] == pytest.approx(float(stage.total), rel=1e-12)


def test_the_inverse_is_the_bisection():
    tp, cp, dp, mbs, pp = (np.array([8, 2]), np.array([1, 1]), np.array([4, 8]), np.array([1, 1]), np.array([16, 4]))
    ranks = timing().layouts(tp=tp, cp=cp, dp=dp, mbs=mbs, pp=pp, selective=False).ranks(
        np.arange(2), np.array([1, 2]), np.array([1, 3]), 16)
    low, high = np.full((2, 16), 1), np.full((2, 16), 80)
    for seconds in np.linspace(0.01, 2.0, 37):
        bound = np.full((2, 1), seconds)
        assert (ranks.inverse(bound, low, high) == caps(ranks, bound, low, high)).all()


def test_step_is_step_from_stages():
    tp, cp, dp, mbs, pp = (np.array([8, 8]), np.array([1, 2]), np.array([8, 4]), np.array([1, 1]), np.array([4, 4]))
    layouts = timing().layouts(tp=tp, cp=cp, dp=dp, mbs=mbs, pp=pp, selective=False)
    counts = np.array([[19, 21, 21, 19], [17, 21, 21, 21]])
    vpp, recompute, parameters = np.array([1, 2]), np.array([0, 1]), np.array([3e9, 3.1e9])
    got = layouts.step(np.arange(2), vpp, recompute, counts, parameters).total_s
    model = timing().model
    for k in range(2):
        stages = [model.stage(8, cp[k], 1, counts[k, i], embedding=i == 0, head=i == 3, recompute="full",
                              recompute_layers=min(counts[k, i], vpp[k] * recompute[k]),
                              pipeline_cross_node=True, pipeline_parallel=True) for i in range(4)]
        want = model.step_from_stages(stages, 8, cp[k], dp[k], 1, vpp[k], parameters=parameters[k]).total_s
        assert got[k] == pytest.approx(float(want), rel=1e-12)


def _list_step(model, stages, tp, cp, dp, mbs, vpp, parameters, hiding):
    """The step as the list of stages adds it, one stage after another in Python (how
    step_from_stages summed before it stacked the stages): the reference the arrays must equal."""
    total = sum(s.total for s in stages)
    slowest = np.maximum.reduce(np.broadcast_arrays(*[s.total for s in stages]))
    first = stages[0] if hiding is None else hiding
    return model._schedule(total, slowest, float(len(stages)), lambda f: sum(getattr(s, f) for s in stages), tp, cp,
                           len(stages), dp, mbs, vpp, first.forward, first.backward, np.asarray(parameters, float))


def test_the_stage_arrays_step_is_the_list_step_bit_for_bit():
    """step_from_stage_arrays (one call per part over a (K, PP) array) adds the stages in the
    list's order: every part equal to step_from_stages' to the last bit, on a pipeline deep enough
    (PP 32) that numpy's pairwise sum would differ from adding one stage at a time."""
    rng = np.random.default_rng(7)
    depth = 32
    tp, cp, dp, mbs, pp = (np.array([8, 4, 2]), np.array([1, 2, 1]), np.array([2, 1, 8]), np.array([1, 1, 2]),
                           np.full(3, depth))
    layouts = timing().layouts(tp=tp, cp=cp, dp=dp, mbs=mbs, pp=pp, selective=False)
    counts = np.column_stack([np.full(3, 1), rng.integers(1, 4, (3, depth - 2)), np.full(3, 2)])
    hiding = np.column_stack([SPEC.num_layers - (depth - 1) * np.ones(3, np.int64), np.ones((3, depth - 1), np.int64)])
    vpp, recompute, parameters = np.array([1, 2, 1]), np.array([0, 1, 2]), np.array([1.1e9, 2.3e9, 0.7e9])
    index = np.arange(3)
    for hidden in (None, hiding):
        got = layouts.step(index, vpp, recompute, counts, parameters, hidden)
        stages = layouts.stage_times(index, vpp, recompute, counts)
        first = None if hidden is None else layouts.stage_times(index, vpp, recompute, hidden)[0]
        want = _list_step(timing().model, stages, tp, cp, dp, mbs, vpp, parameters, first)
        for name, value in want.parts().items():
            assert np.array_equal(got.parts()[name], value), name
