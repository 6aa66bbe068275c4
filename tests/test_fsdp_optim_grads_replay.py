"""``memory_levers``' fast optim_grads replay (``_bucket_peaks``: every layer count of a stage
from one cut, each count's replay stopped where its queue is the full stage's) against the plain
replay it replaced, kept here as the reference: one weight at a time, one count at a time
(megatron-core's cut and queue as ``fsdp_optim_grads_peak`` cites them). The two must give the
very same floats (the sweep's output is compared byte for byte), over Llama-like layers at TP 1,
2 and 8, 0-80 layers, DP x CP 8-4096 (``ddp_bucket_size``), without overlap (one bucket), and
the queue sizes ``fsdp_communication_unit`` gives."""

import collections
import itertools
import random

import numpy as np
import pytest

from advisor import equations as eq
from advisor import memory_levers as levers
from advisor.memory import MemoryOptions
from advisor.models import preset


def reference_peak(weights: tuple, layers: int, bucket: float, queue: float) -> float:
    """The replay as it was (memory_levers at d06473d): cut in named order, then backward weight
    by weight, allocating a bucket at its first gradient and trimming the queue at its last."""
    of, totals, filled, current = [], [], bucket, -1
    for size in weights * layers:
        if filled >= bucket:
            totals.append(0.0)
            current += 1
            filled = 0.0
        filled += size
        totals[current] = filled
        of.append(current)
    missing, allocated = [0] * len(totals), [False] * len(totals)
    for index in of:
        missing[index] += 1
    queued, space, held, peak = collections.deque(), 0.0, 0.0, 0.0
    width = len(weights)
    for start in range((layers - 1) * width, -1, -width):
        for position in levers.LAYER_WEIGHT_ARRIVAL:
            index = of[start + position]
            if not allocated[index]:
                allocated[index] = True
                held += totals[index]
                if held > peak:
                    peak = held
            missing[index] -= 1
            if not missing[index]:
                while space > queue:
                    oldest = totals[queued.popleft()]
                    space -= oldest
                    held -= oldest
                queued.append(index)
                space += totals[index]
    return peak


MODELS = ("llama3.1-8b", "llama3-70b", "llama3.1-405b")
DP_CP = (8, 64, 100, 128, 512, 1000, 1024, 1500, 2048, 4096)


def stages(name):
    """(weights, bucket, queue) of ``name`` at every TP x DP x CP x overlap x release's queue."""
    for tp, dp_cp, overlap, from_units in itertools.product((1, 2, 8), DP_CP, (True, False), (False, True)):
        options = MemoryOptions(fsdp_strategy="optim_grads", overlap_grad_reduce=overlap,
                                fsdp_budget_from_units=from_units)
        weights = tuple(float(w) for w in levers.layer_weights(preset(name), tp))  # as QueueReplay keys them
        _, queue = levers.fsdp_communication_unit(options, sum(weights), 1, dp_cp)
        yield weights, float(levers.fsdp_bucket_size(options, dp_cp)), float(queue)


@pytest.mark.parametrize("name", MODELS)
def test_every_count_is_the_reference_replay(name):
    cases = list(stages(name))
    assert len(cases) == 3 * len(DP_CP) * 4
    for weights, bucket, queue in cases:
        peaks = levers._bucket_peaks(weights, 80, bucket, queue)
        assert len(peaks) == 81 and peaks[0] == 0.0
        for count in range(81):
            assert peaks[count] == reference_peak(weights, count, bucket, queue), (weights, count, bucket, queue)


def test_a_shorter_replay_agrees_with_the_longer_one():
    # the table of QueueReplay keeps a count once, from whichever replay asked first
    weights = levers.layer_weights(preset("llama3.1-405b"), 8)
    for bucket, queue in ((64e6, 1e9), (2048e6, 2048e6), (np.inf, 1e9)):
        longest = levers._bucket_peaks(weights, 80, bucket, queue)
        for layers in (1, 7, 31, 79):
            assert levers._bucket_peaks(weights, layers, bucket, queue) == longest[:layers + 1]


def test_random_weights_and_sizes():
    """Integer weights of any sizes (the exact regime, cut early), and fractional ones (summed
    in another order they could round differently: replayed to the end, as the reference)."""
    rng = random.Random(20261201)
    for trial in range(300):
        fractional = trial % 3 == 0
        weights = tuple(rng.choice([rng.randint(0, 50), rng.randint(1, 10**4), rng.randint(1, 10**8)])
                        + (rng.random() if fractional else 0) for _ in range(6))
        layer = sum(weights)
        bucket = rng.choice([layer * rng.uniform(0.01, 3.0), float(rng.randint(1, 10**8)), np.inf])
        queue = rng.choice([layer * rng.uniform(0.0, 6.0), float(rng.randint(0, 10**9)), np.inf])
        layers = rng.randint(0, 40)
        peaks = levers._bucket_peaks(weights, layers, bucket, queue)
        assert list(peaks) == [reference_peak(weights, n, bucket, queue) for n in range(layers + 1)], \
            (weights, bucket, queue, layers)


def test_small_integer_weights():
    """Small weights and buckets reach every cut the order of arrival can make (a bucket of the
    output projection alone closes before the QKV bucket above it: the queue is then not yet the
    full stage's when it first pops)."""
    rng = random.Random(7)
    for _ in range(2000):
        weights = tuple(float(rng.randint(0, 12)) for _ in range(6))
        bucket, queue, layers = float(rng.randint(1, 30)), float(rng.randint(0, 80)), rng.randint(0, 12)
        peaks = levers._bucket_peaks(weights, layers, bucket, queue)
        assert list(peaks) == [reference_peak(weights, n, bucket, queue) for n in range(layers + 1)], \
            (weights, bucket, queue, layers)


def test_most_is_the_largest_reference_replay():
    weights = levers.layer_weights(preset("llama3.1-405b"), 8)
    dp_cp = np.array([[8], [64], [128], [2048], [4096]])
    queue = levers.fsdp_communication_unit(MemoryOptions(fsdp_strategy="optim_grads", fsdp_budget_from_units=True),
                                           sum(weights), 1, dp_cp)[1]
    replay = levers.QueueReplay(weights, levers.ddp_bucket_size(dp_cp), queue)
    cap = replay.most(63)
    assert cap.shape == (5, 1)
    for row, dp in enumerate(dp_cp[:, 0].tolist()):
        bucket, size = float(levers.ddp_bucket_size(dp)), float(queue[row, 0])
        assert float(cap[row, 0]) == max(reference_peak(weights, n, bucket, size) for n in range(64))
    # then a count asked alone is read from the table the cap filled, and is the reference's
    assert float(replay.peak(np.full((5, 1), 40))[3, 0]) == reference_peak(weights, 40, 2048e6, 2048e6)


def test_a_replay_to_the_models_layers_gives_every_count_as_a_replay_to_the_count_asked(monkeypatch):
    """QueueReplay(layers=L), StageModel's: a stage is replayed once, to L, at its first ask,
    whatever the count asked; every count read from that replay is the one a replay to the count
    asked gives, the first, middle and last stages with their ends, in any order of asks."""
    spec, options = preset("llama3.1-405b"), MemoryOptions(fsdp_strategy="optim_grads")
    tp, dp_cp, stage = np.array([[1], [2], [8]]), np.array([[64], [512], [2048]]), np.arange(4)[None, :]
    weights = levers.layer_weights(spec, tp)
    bucket = levers.fsdp_bucket_size(options, dp_cp)
    queue = levers.fsdp_communication_unit(options, sum(weights), 1, dp_cp)[1]
    ends = levers.stage_ends(spec, tp, 4, stage, eq.padded_vocab_size(spec.vocab_size, 128, tp))
    asked, eager = (levers.QueueReplay(weights, bucket, queue, ends, layers) for layers in (0, 40))
    rng = np.random.default_rng(20261202)
    asks = [rng.integers(0, 41, size=(3, 4)) for _ in range(8)]
    replayed, original = [], levers._stage_peaks
    monkeypatch.setattr(levers, "_stage_peaks", lambda *a: replayed.append(a[1]) or original(*a))
    eager_peaks = [eager.peak(layers) for layers in asks] + [eager.most(40)]
    assert replayed == [40] * len(set(eager.code.ravel().tolist()))
    asked_peaks = [asked.peak(layers) for layers in asks] + [asked.most(40)]
    assert all(np.array_equal(mine, theirs) for mine, theirs in zip(eager_peaks, asked_peaks))


@pytest.mark.parametrize("rows", [0, 1, 7, 500])
def test_unique_rows_is_numpys(rows):
    """QueueReplay's distinct stages by a lexsort: np.unique's rows (sorted, first column first)
    and inverse, so the stage codes are the ones np.unique gave."""
    rng = np.random.default_rng(rows)
    matrix = rng.choice([0.0, 1.0, 2.5, 4e7, np.inf], size=(rows, 4))
    unique, inverse = levers._unique_rows(matrix)
    expected, expected_inverse = np.unique(matrix, axis=0, return_inverse=True)
    assert unique == expected.tolist() and inverse.tolist() == np.ravel(expected_inverse).tolist()


def reference_stage_peak(stage: levers.StageWeights, layers: int, bucket: float, queue: float) -> float:
    """The plain replay of a stage of ``layers`` layers with ends and groups, written from
    megatron-core's rules alone: ``_get_parameter_groups`` (core_v0.19.0 param_and_grad_buffer.py
    1769-1870) groups the weights in named order, cuts each group apart (a bucket closes at the
    weight bringing it to >= the size; a ``shared_embedding`` weight closes the open bucket and
    takes one alone); backward then produces the ``post`` weights (last named first, or in
    ``post_arrival``'s order, with the ``pre`` weights it names: an MTP stage), the layers from
    the last, then ``pre`` (last named first, or in ``pre_arrival``'s order: an MoE stage's dense
    layers); a bucket is allocated at its first touch and, at its last gradient, the one
    queue is trimmed (> queue: pop the oldest) and it is appended."""
    named = list(stage.pre) + list(stage.layer) * layers + list(stage.post)
    width, tail = len(stage.layer), len(stage.post)
    order, post = stage.pre_order(), stage.post_order()  # post: the output layer's backward first, ...
    last = [post.index(j) - len(post) if j in post else layers * width + order.index(j) for j in range(len(stage.pre))]
    touch = [-len(post) - 1 if w[3] else t for w, t in zip(stage.pre, last)]
    for layer in range(layers):
        for position in range(width):
            last.append((layers - 1 - layer) * width + stage.arrival.index(position))
            touch.append(last[-1])
    for j in range(tail):
        last.append(post.index(len(stage.pre) + j) - len(post))
        touch.append(last[-1])
    buckets, open_bucket = [], {}  # each bucket: [elements, weights]
    of = []
    for size, group, own, _ in named:
        if own:
            open_bucket.pop(group, None)
            buckets.append([size, 1])
            of.append(len(buckets) - 1)
            continue
        if group not in open_bucket:
            buckets.append([0.0, 0])
            open_bucket[group] = len(buckets) - 1
        index = open_bucket[group]
        buckets[index][0] += size
        buckets[index][1] += 1
        of.append(index)
        if buckets[index][0] >= bucket:
            del open_bucket[group]
    missing = [b[1] for b in buckets]
    opened = [False] * len(buckets)
    queued, space, held, peak = collections.deque(), 0.0, 0.0, 0.0
    for time in sorted(set(touch) | set(last)):
        for i in range(len(named)):
            if touch[i] == time and not opened[of[i]]:
                opened[of[i]] = True
                held += buckets[of[i]][0]
                peak = max(peak, held)
        for i in range(len(named)):
            if last[i] == time:
                missing[of[i]] -= 1
                if not missing[of[i]]:
                    while space > queue:
                        oldest = buckets[queued.popleft()][0]
                        space -= oldest
                        held -= oldest
                    queued.append(of[i])
                    space += buckets[of[i]][0]
    return peak


def random_stage(rng: random.Random, fractional: bool) -> levers.StageWeights:
    """A stage of a few weights a layer in one to three groups, with or without an embedding
    (plain, a bucket of its own, or the tied one touched first) and a final norm and output layer
    (plain or a bucket of its own), in a random order of arrival."""
    def size():
        return float(rng.randint(0, 12)) + (rng.random() if fractional else 0.0)
    groups = rng.randint(1, 3)
    width = rng.randint(1, 6)
    layer = tuple((size(), rng.randrange(groups), False, False) for _ in range(width))
    arrival = tuple(rng.sample(range(width), width))
    kind = rng.choice(["none", "plain", "own", "early"])
    pre = () if kind == "none" else ((size(), rng.randrange(groups), kind == "own", kind == "early"),)
    post = rng.choice([(), ((size(), rng.randrange(groups), False, False), (size(), rng.randrange(groups), False, False)),
                       ((size(), rng.randrange(groups), False, False), (size(), rng.randrange(groups), True, False))])
    return levers.StageWeights(pre, layer, post, arrival)


@pytest.mark.parametrize("seed", range(4))
def test_stages_with_ends_and_groups_are_the_reference_replay(seed):
    """Every count of random stages with ends and groups, as the plain replay gives it."""
    rng = random.Random(seed)
    for trial in range(400):
        stage = random_stage(rng, fractional=trial % 5 == 0)
        bucket, queue, layers = rng.choice([float(rng.randint(1, 30)), np.inf]), float(rng.randint(0, 80)), rng.randint(0, 10)
        peaks = levers._stage_peaks(stage, layers, bucket, queue)
        assert list(peaks) == [reference_stage_peak(stage, n, bucket, queue) for n in range(layers + 1)], \
            (stage, bucket, queue, layers)


def test_reference_stage_replay_by_hand():
    """One case traced by hand: pre = embedding 10 (plain), one layer [a 4, b 3] (arrival b
    then a), post = norm 1, output 10; one group, bucket 8, queue 10.
    Cut (named order E a b n O): [E 10] closes (>= 8); [a b n = 8] closes at n; [O 10].
    Backward: O (opens, 10, completes: queue empty, appended: space 10), n (opens [a b n]:
    held 18, the peak), b, a (completes: space 10 <= 10, nothing popped; appended: space 18),
    E (opens: held 28; completes: space 18 > 10 pops O (held 18, space 8), appended).
    The peak: 28."""
    stage = levers.StageWeights(((10.0, 0, False, False),), ((4.0, 0, False, False), (3.0, 0, False, False)),
                                ((1.0, 0, False, False), (10.0, 0, False, False)), (1, 0))
    assert reference_stage_peak(stage, 1, 8.0, 10.0) == 28.0
    assert levers._stage_peaks(stage, 1, 8.0, 10.0)[1] == 28.0
