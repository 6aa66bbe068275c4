"""advisor.schedule against an event-by-event replay of Megatron-LM's pipeline schedules.

The replay follows megatron/core/pipeline_parallel/schedules.py: ``get_schedule_table`` orders
the forward passes (groups of PP microbatches, every chunk in turn), backward passes visit the
chunks in reverse, a rank runs its warm-up forwards (``get_pp_rank_microbatches``), then one
forward and one backward per step, then the cool-down backwards. Activations are held from a
chunk's forward pass to its backward pass."""

import itertools

import numpy as np
import pytest

from advisor import schedule


def schedule_table(m: int, v: int, group: int) -> list[tuple[int, int]]:
    table = []
    for low in range(0, m, group):
        high = m if low + group >= m else low + group
        table += [(mb, chunk) for chunk in range(v) for mb in range(low, high)]
    return table


def replay(p: int, v: int, m: int, rank: int, chunk_layers: list[int]) -> tuple[list[int], int, int]:
    """(passes of each chunk held at the warm-up peak, that peak's layer level, the highest level)."""
    table = schedule_table(m, v, p)
    total = m * v
    warmup = min(p - rank - 1 if v == 1 else 2 * (p - rank - 1) + (v - 1) * p, total)
    forward = [chunk for _, chunk in table]
    backward = [v - 1 - chunk for _, chunk in table]
    held = [0] * v
    level = highest = 0
    for step in range(warmup):
        held[forward[step]] += 1
        level += chunk_layers[forward[step]]
        highest = max(highest, level)
    at_peak = None
    for step in range(total - warmup):
        held[forward[warmup + step]] += 1
        level += chunk_layers[forward[warmup + step]]
        highest = max(highest, level)
        if at_peak is None:
            at_peak = (list(held), level)
        held[backward[step]] -= 1
        level -= chunk_layers[backward[step]]
    if at_peak is None:  # every microbatch in warm-up
        at_peak = (list(held), level)
    return at_peak[0], at_peak[1], highest


CASES = [(p, v, k * p) for p in range(2, 7) for v in range(1, 5) for k in (1, 2, 3)] + \
        [(p, 1, m) for p in (4, 8) for m in (1, 2, 3, 5)]  # fewer microbatches than stages (1F1B only)


@pytest.mark.parametrize("p,v,m", CASES)
def test_in_flight_counts_match_megatrons_order(p, v, m):
    for rank in range(p):
        held, _, _ = replay(p, v, m, rank, [1] * v)
        in_flight = schedule.InFlight.at(rank, p, v, m)
        assert in_flight.passes == sum(held)
        assert in_flight.first_chunk() == held[0]
        for r in range(v):
            assert in_flight.last_chunks(r) == sum(held[v - r:])


@pytest.mark.parametrize("p,v,m", [(p, v, k * p) for p in range(2, 9) for v in range(2, 5) for k in (1, 2, 4)])
def test_remainder_on_the_last_chunks_keeps_the_peak_at_the_end_of_warm_up(p, v, m):
    """Why the chunk rule puts the remainder last: the warm-up peak is then the iteration's peak."""
    for rank, extra in itertools.product(range(p), range(v)):
        layers = [3 + (chunk >= v - extra) for chunk in range(v)]
        _, at_peak, highest = replay(p, v, m, rank, layers)
        assert at_peak == highest


def test_remainder_on_the_first_chunks_would_not():
    _, at_peak, highest = replay(2, 3, 4, 0, [4, 4, 3])
    assert highest > at_peak


def test_broadcasts_over_layouts():
    stages, pp, vpp = np.array([0, 1, 3]), np.array([2, 2, 4]), np.array([1, 2, 2])
    # p - i; 2(p - i - 1) + (v - 1)p + 1 = 0 + 2 + 1; = 0 + 4 + 1
    assert schedule.forward_passes_in_flight(stages, pp, vpp, np.inf).tolist() == [2, 3, 5]


@pytest.mark.parametrize("layers,vpp,m", [((9, 7, 8, 8), 2, 8), ((5, 9, 9, 9), 4, 4), ((7, 10, 7, 8), 3, 12),
                                          ((4, 12, 16), 1, 2)])
def test_uneven_interleaved_stages_are_priced_at_the_replayed_peak(layers, vpp, m):
    """The estimator's layer activations of every rank = the highest level of the replay, in layers
    held x one layer's activations (chunks by megatron_args.chunk_layers, as Megatron builds them)."""
    from advisor.megatron_args import chunk_layers
    from advisor.memory import estimate_memory
    from advisor.models import PRESETS, with_overrides
    from advisor.parallel import ParallelConfig, Workload

    p = len(layers)
    spec = with_overrides(PRESETS["llama3.1-8b"], num_layers=sum(layers))
    parallel = ParallelConfig(pp=p, vpp=vpp, dp=1)
    estimate = estimate_memory(spec, parallel, Workload(seq_len=1024, global_batch_size=m), layers_per_stage=layers)
    one_layer = estimate_memory(with_overrides(spec, num_layers=1), ParallelConfig(), Workload(seq_len=1024,
                                global_batch_size=1)).stages[0].layer_activations_bytes
    chunks = chunk_layers(layers, vpp)
    for rank, stage in enumerate(estimate.stages):
        _, _, highest = replay(p, vpp, m, rank, [chunks[k * p + rank] for k in range(vpp)])
        assert stage.layer_activations_bytes == highest * one_layer


def test_rounds_rest_and_filled_are_the_whole_divisions():
    """InFlight.at divides whole numbers by a float division and its floor: np.divmod's quotient
    and remainder and //'s quotient, bit for bit, over every stage, PP, VPP and microbatches."""
    stage, pp, vpp = np.arange(64)[None, :, None, None], np.arange(1, 65)[:, None, None, None], np.arange(1, 9)[:, None]
    m = np.array([1.0, 2.0, 3.0, 7.0, 8.0, 64.0, 1000.0, np.inf])
    in_flight = schedule.InFlight.at(np.minimum(stage, pp - 1), pp, vpp, m)
    rounds, rest = np.divmod(in_flight.passes, vpp * pp)
    assert np.array_equal(in_flight.rounds, rounds) and np.array_equal(in_flight.rest, rest)
    assert np.array_equal(in_flight.filled, rest // pp) and not np.signbit(in_flight.rest).any()
