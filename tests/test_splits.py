"""The alike-layer split planners (advisor.splits) against brute force over every split."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from advisor.splits import Pipelines, caps, fastest_within, fill, lowest_memory, min_max


def compositions(layers: int, ranks: int, lowest: int):
    for cuts in itertools.combinations(range(layers - ranks * lowest + ranks - 1), ranks - 1):
        bounds = (-1,) + cuts + (layers - ranks * lowest + ranks - 1,)
        yield tuple(bounds[i + 1] - bounds[i] - 1 + lowest for i in range(ranks))


def table_cost(table: np.ndarray):
    """A cost from a (K, P, L + 1) table: cost[k, i, n] = table[k, i, n]."""
    def cost(n):
        n = np.clip(n, 0, table.shape[2] - 1)
        return np.take_along_axis(table[:, :n.shape[1]], n[:, :, None], axis=2)[:, :, 0]
    return cost


@st.composite
def problems(draw):
    layers = draw(st.integers(1, 10))
    vpp = draw(st.sampled_from([1, 1, 2]))
    pp = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**32 - 1))
    coarse = draw(st.booleans())  # few distinct values: many ties
    rng = np.random.default_rng(seed)
    steps = rng.integers(1, 3 if coarse else 1000, size=(2, 1, 4, layers + 1)).astype(float)
    memory, time = np.cumsum(steps[0], axis=2), np.cumsum(steps[1], axis=2)  # strictly increasing in n
    limit = draw(st.floats(1, 4 * float(memory.max())))
    return Pipelines(pp=np.array([pp]), vpp=np.array([vpp]), layers=layers), memory, time, limit


def brute(pipelines, key, allowed):
    p, v, layers = int(pipelines.pp[0]), int(pipelines.vpp[0]), pipelines.layers
    best = None
    for split in compositions(layers, p, v) if p * v <= layers else ():
        if allowed(split):
            value = key(split)
            best = value if best is None else min(best, value)
    return best


@settings(max_examples=300, deadline=None)
@given(problems())
def test_lowest_memory_is_the_best_split(problem):
    pipelines, memory, _, _ = problem
    result = lowest_memory(table_cost(memory), pipelines)
    best = brute(pipelines, lambda s: max(memory[0, i, n] for i, n in enumerate(s)), lambda s: True)
    if best is None:
        assert not result.feasible[0]
        return
    assert result.feasible[0] and result.value[0] == best
    counts = result.counts[0, :int(pipelines.pp[0])]
    assert counts.sum() == pipelines.layers and counts.min() >= pipelines.vpp[0]
    assert max(memory[0, i, n] for i, n in enumerate(counts)) == best


@settings(max_examples=300, deadline=None)
@given(problems())
def test_fastest_within_the_limit_is_the_best_split(problem):
    pipelines, memory, time, limit = problem
    result = fastest_within(table_cost(time), table_cost(memory), pipelines, limit)
    fits = lambda s: all(memory[0, i, n] <= limit for i, n in enumerate(s))  # noqa: E731
    best = brute(pipelines, lambda s: max(time[0, i, n] for i, n in enumerate(s)), fits)
    if best is None:
        assert not result.feasible[0]
        return
    assert result.feasible[0] and result.value[0] == best
    counts = result.counts[0, :int(pipelines.pp[0])]
    assert counts.sum() == pipelines.layers and fits(counts)
    assert max(time[0, i, n] for i, n in enumerate(counts)) == best


def test_many_layouts_at_once_each_as_alone():
    rng = np.random.default_rng(7)
    pp, vpp = np.array([1, 2, 3, 4, 4, 16]), np.array([1, 1, 2, 1, 3, 1])
    pipelines = Pipelines(pp=pp, vpp=vpp, layers=24)
    table = np.cumsum(rng.integers(1, 50, size=(len(pp), 16, 25)), axis=2).astype(float)
    together = lowest_memory(table_cost(table), pipelines)
    for k in range(len(pp)):
        alone = lowest_memory(table_cost(table[k:k + 1, :int(pp[k])]), Pipelines(pp[k:k + 1], vpp[k:k + 1], 24))
        assert alone.value[0] == together.value[k]
        assert (alone.counts[0] == together.counts[k, :int(pp[k])]).all()


def test_fill_is_the_evenest_with_the_rest_on_the_last_ranks():
    pipelines = Pipelines(pp=np.array([4, 4, 3]), vpp=np.array([1, 1, 1]), layers=10)
    cap = np.array([[10, 10, 10, 10], [1, 10, 10, 10], [3, 3, 4, 0]])
    assert fill(cap, pipelines).tolist() == [[2, 2, 3, 3], [1, 3, 3, 3], [3, 3, 4, 0]]


def test_infeasible_layouts_say_so():
    pipelines = Pipelines(pp=np.array([4, 2]), vpp=np.array([2, 1]), layers=6)  # 4 x 2 chunks > 6 layers
    table = np.tile(np.arange(7, dtype=float), (2, 4, 1))
    result = fastest_within(table_cost(table), table_cost(table), pipelines, 2.5)  # each rank at most 2
    assert result.feasible.tolist() == [False, False]
    assert min_max(table_cost(table), pipelines).feasible.tolist() == [False, True]


@settings(max_examples=300, deadline=None)
@given(problems())
def test_the_evenest_bracket_gives_the_same_splits(problem):
    """min_max brackets from the evenest split in wide problems (``splits.WIDE``): the walk ends
    at the caps of the min-max from any bracket, so the splits (and values) are those of the
    full bracket, for the lowest memory and MadPipe within a limit alike."""
    from advisor import splits

    pipelines, memory, time, limit = problem
    plans = []
    for wide in (1 << 60, 0):  # never, always
        splits.WIDE = wide
        try:
            plans.append([lowest_memory(table_cost(memory), pipelines),
                          fastest_within(table_cost(time), table_cost(memory), pipelines, limit)])
        finally:
            splits.WIDE = 1 << 16
    for full, evenest in zip(*plans):
        assert np.array_equal(full.counts, evenest.counts) and np.array_equal(full.value, evenest.value)
        assert np.array_equal(full.feasible, evenest.feasible)


@settings(max_examples=300, deadline=None)
@given(problems())
def test_halving_stops_at_any_count_with_the_same_splits(problem):
    """min_max stops halving once few costs lie between its bounds' caps (``splits.WALK``): the
    walk then takes the rest from the same non-achievable lower bound, so never stopping early
    (-1, the fixed count of halvings), the default and never halving at all give the same splits,
    bracketed from the evenest split (``splits.WIDE`` 0) or from the ceilings (WIDE never)."""
    from advisor import splits

    pipelines, memory, time, limit = problem
    plans = []
    for walk, wide in itertools.product((-1, splits.WALK, 1 << 60), (0, 1 << 60)):
        defaults, (splits.WALK, splits.WIDE) = (splits.WALK, splits.WIDE), (walk, wide)
        try:
            plans.append([lowest_memory(table_cost(memory), pipelines),
                          fastest_within(table_cost(time), table_cost(memory), pipelines, limit)])
        finally:
            splits.WALK, splits.WIDE = defaults
    for never, *others in zip(*plans):
        for other in others:
            assert np.array_equal(never.counts, other.counts) and np.array_equal(never.value, other.value)
            assert np.array_equal(never.feasible, other.feasible)


@settings(max_examples=300, deadline=None)
@given(problems(), st.lists(st.floats(0, 1), min_size=3, max_size=3))
def test_caps_within_a_known_bracket_are_the_caps(problem, fractions):
    """caps bisects from the counts its caller already knows (``within``: caps at a lower bound,
    ``beyond``: caps at a higher one, plus one): the same caps as from [low - 1, high + 1], each
    the most layers a rank holds within the bound, by brute force over the cost table."""
    pipelines, memory, _, _ = problem
    cost, pp = table_cost(memory), int(pipelines.pp[0])
    low, high = pipelines.lowest[:, :pp], pipelines.highest[:, :pp]
    lower, bound, higher = (np.array([[f * 1.1 * float(memory.max())]]) for f in sorted(fractions))
    within, beyond = caps(cost, lower, low, high), caps(cost, higher, low, high) + 1
    found = caps(cost, bound, low, high, within=within, beyond=beyond)
    expected = [max((n for n in range(int(low[0, i]), int(high[0, i]) + 1) if memory[0, i, n] <= bound[0, 0]),
                    default=int(low[0, i]) - 1) for i in range(pp)]
    assert found[0].tolist() == expected == caps(cost, bound, low, high)[0].tolist()


def test_walk_steps_count_the_distinct_costs_of_the_next_layers():
    """Ranks with equal costs step together in min_max's walk: with caps [2, 3, 3, 3, 1] and a
    gap of one layer on ranks 0-3, the next layers cost 10 (rank 0: 3 layers x 3 + 1) and 13
    (ranks 1-3 alike: 4 x 3 + 1), so the walk takes at most 2 steps where the gaps add to 4;
    rank 4, without a gap, counts no cost (its next layer lies beyond the upper bound)."""
    from advisor.splits import _walk_steps

    def cost(n):
        return 3.0 * n + 1.0

    cap = np.array([[2, 3, 3, 3, 1]])
    assert _walk_steps(cost, cap, np.array([[1, 1, 1, 1, 0]])) == 2
    assert _walk_steps(cost, cap, np.array([[0, 0, 0, 0, 0]])) == 0
    assert _walk_steps(cost, cap, np.array([[1, 0, 0, 0, 1]])) == 2  # 10 and 7


@pytest.mark.parametrize("layers, pp, vpp, fewer", [(126, 64, 1, True), (126, 16, 2, True), (40, 32, 1, True),
                                                    (61, 8, 1, False)])
def test_alike_ranks_halve_less_to_the_same_splits(layers, pp, vpp, fewer):
    """MadPipe's times, a pipeline's middle ranks alike (``rank_times``: one beta for them, other
    betas on the first and last ranks): min_max stops halving once the walk's distinct steps
    are few (``_walk_steps``), fewer cost evaluations than counting every rank's gap, and the
    same splits and values as never stopping early (``WALK`` -1) and as every rank's gap counted.
    Measured: 33 evaluations instead of 39 at PP 64, 43 instead of 45 at PP 16 x VPP 2, 20 instead
    of 26 at PP 32; at PP 8 the gaps' sum is within ``WALK`` first (34 either way)."""
    from advisor import splits

    rng = np.random.default_rng(layers * pp)
    k = 40
    alpha, rho = rng.uniform(1, 2, size=(k, 1)), rng.uniform(0.2, 0.5, size=(k, 1))
    beta = np.repeat(rng.uniform(0, 3, size=(k, 1)), pp, axis=1)
    beta[:, 0] += rng.uniform(2, 9, size=k)  # the embedding
    beta[:, -1] += rng.uniform(2, 9, size=k)  # the LM head and loss
    recomputable = vpp * rng.integers(0, 3, size=(k, 1))
    calls = []

    def time(n):
        calls.append(1)
        n = np.asarray(n, dtype=float)
        return alpha * n + rho * np.minimum(n, recomputable) + beta

    pipelines = Pipelines(pp=np.full(k, pp), vpp=np.full(k, vpp), layers=layers)
    ceiling = np.minimum(pipelines.highest, rng.integers(layers // pp + 2, layers, size=(k, pp)))
    plans, counted = [], []
    for walk, steps in ((-1, splits._walk_steps), (splits.WALK, lambda *_: 1 << 60), (splits.WALK, splits._walk_steps)):
        defaults, splits.WALK, splits._walk_steps = (splits.WALK, splits._walk_steps), walk, steps
        calls.clear()
        try:
            plans.append(min_max(time, pipelines, ceiling))
        finally:
            splits.WALK, splits._walk_steps = defaults
        counted.append(len(calls))
    for plan in plans[1:]:
        assert np.array_equal(plan.counts, plans[0].counts) and np.array_equal(plan.value, plans[0].value)
        assert np.array_equal(plan.feasible, plans[0].feasible)
    assert plans[0].feasible.any()
    assert counted[2] < counted[1] if fewer else counted[2] == counted[1]
