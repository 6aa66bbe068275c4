"""The profiling partitionings: CAPTURE's Description 1, generalised, and a reduced set.

Seed 000, Section III-A1, Description 1 (L layers on G GPUs, L divisible by G, q = L/G):

    1   [1, 1, eq(L-2, G-2)]
    2   [2, 1, eq(L-3, G-2)]
    4   [q, 1, 1, eq(L-(q+2), G-3)]
    5   [q+1, 1, 1, eq(L-(q+3), G-3)]        (printed as eq(L-(q+2), ...), which sums to L+1)
    7   = line 4
    8   [q, 2, 1, eq(L-(q+3), G-3)]
    10  [q, q, 1, 1, eq(L-(2q+2), G-4)]
    11  [q, q+1, 1, 1, eq(L-(2q+3), G-4)]
    14  [q, ..., q, 1, 1]
    15  [q, ..., q-1, 1, 2]

Read as a procedure, over *stages* (GPUs, or sub-meshes for the DP/TP sets):

1. Main sweeps, for x = 0 .. S-3: stages before x hold their even share; stage x holds
   k = 1 .. share_x + 1 layers, so the growing ranges give M_a of its layers and of the first
   layer of the next sweep (line 5); the next stage holds one layer alone (M_i); the rest is
   spread evenly. For k >= share_x two stages hold one layer each (lines 4-5, 10-11), which
   makes the k = share_x run the same partitioning as the next sweep's k = 1 run (line 4 =
   line 7), so it is run once.
2. Tail (lines 14-15, which the paper leaves as "..."): stage S-2 grows from its share's first
   layer while the last stage holds the rest (M_a up to layer L-1); layers of the tail that
   never sat alone get a run with the layer alone on stage S-2; and M_a(L) comes from the last
   stage holding L-1..L (line 15) against L-1 alone (line 14).
3. Closure: any statistic still missing gets the smallest run that measures it (a layer alone,
   or the pair l-1..l), with the stages around it as even as possible.

L not divisible by S: the shares are eq(L, S) with the remainder on the *last* stages (see
``layout.even_split``), and everything above uses those shares. Every partitioning puts at least
one layer on every stage. With S >= 3 every M_i and M_a is covered (a property test checks this
for all L <= 80, S <= 16); with S = 2 only the ends can sit alone, and the uncovered statistics
are reported, not invented.

The reduced set (the issue's "Profiling cost"): Llama layers are identical, so the position-aware
predictor learns its per-layer terms from the hooks' layer records and only needs a few stage
observations per scenario: the even split, a split in which every stage position holds a
different layer count (two counts per position), and the first and last stages with one layer
each (the embedding and the LM head with the least around them).
"""

from __future__ import annotations

from advisor.capture.coverage import sources, stage_ranges
from advisor.capture.layout import even_split


def _fill(prefix: list[int], grow: int, singles: int, units: int, stages: int) -> list[int] | None:
    """prefix + [grow] + [1] * singles + eq(rest, stages left), or None if some stage would be empty."""
    used = sum(prefix) + grow + singles
    left = stages - len(prefix) - 1 - singles
    rest = units - used
    if left < 0 or rest < left or (left == 0 and rest != 0):
        return None
    return prefix + [grow] + [1] * singles + even_split(rest, left)


def _sweeps(units: int, stages: int) -> list[list[int]]:
    """Steps 1 and 2 of the procedure: the main sweeps, the last one run to the tail."""
    shares = even_split(units, stages)
    last = max(stages - 3, 0)
    found = []
    for x in range(last + 1):
        prefix = shares[:x]
        start = sum(prefix) + 1
        if stages == 2:  # no stage to hold a layer alone: the first stage grows, the last takes the rest
            top, singles = units - 1, 0
        elif x == last:  # run to the tail: one layer alone on stage S-2, the rest (>= 1) on the last
            top, singles = units - start - 1, 1
        else:
            top, singles = shares[x] + 1, 1
        for grow in range(1, top + 1):
            two = _fill(prefix, grow, 2, units, stages) if singles and grow >= shares[x] else None
            if partition := two or _fill(prefix, grow, singles, units, stages):
                found.append(partition)
    return found


def _alone(layer: int, span: int, units: int, stages: int) -> list[int] | None:
    """A partitioning with layers layer-span+1 .. layer on one stage and the others as even as
    possible; the stage sits where the layer sits in the model, as far as the others allow."""
    before, after = layer - span, units - layer
    low = 0 if before == 0 else max(1, stages - 1 - after)
    high = stages - 1 if after == 0 else min(stages - 2, before)
    if before == 0:
        high = 0
    if after == 0:
        low = stages - 1
    position = min(max(round(before * (stages - 1) / max(units - span, 1)), low), high)
    if low > high or position > before or stages - 1 - position > after:
        return None
    return even_split(before, position) + [span] + even_split(after, stages - 1 - position)


def _closure(found: list[list[int]], units: int, stages: int) -> list[list[int]]:
    extra: list[list[int]] = []
    for _ in range(2):  # M_a's closure can need an M_i run, whose closure is then the second pass
        measured = [r for p in found + extra for r in stage_ranges(p)]
        no_mi, no_ma = sources(measured).missing(units)
        for layer in no_mi:
            if p := _alone(layer, 1, units, stages):
                extra.append(p)
        for layer in no_ma:
            for p in (_alone(layer, 2, units, stages), _alone(layer - 1, 1, units, stages)):
                if p:
                    extra.append(p)
    return extra


def _unique(partitions: list[list[int]]) -> list[tuple[int, ...]]:
    seen: dict[tuple[int, ...], None] = {}
    for partition in partitions:
        seen.setdefault(tuple(partition), None)
    return list(seen)


def description1(units: int, stages: int) -> list[tuple[int, ...]]:
    """The generalised Description 1 partitionings of ``units`` layers over ``stages`` stages,
    in generation order, each one once. Needs units >= stages."""
    if stages == 1:
        return [(units,)]
    found = _sweeps(units, stages)
    found += _closure(found, units, stages)
    return _unique(found)


def reduced(units: int, stages: int) -> list[tuple[int, ...]]:
    """Even split; every position with a second layer count; first and last stages with one layer."""
    even = even_split(units, stages)
    shifted = list(even)
    for i in range(0, stages - 1, 2):
        if shifted[i + 1] >= 2:
            shifted[i] += 1
            shifted[i + 1] -= 1
        elif shifted[i] >= 2:
            shifted[i] -= 1
            shifted[i + 1] += 1
    if stages % 2 and stages > 1:
        # The odd last stage pairs with the first, which then moves by two.
        if shifted[-1] >= 2:
            shifted[-1] -= 1
            shifted[0] += 1
        elif shifted[0] >= 2:
            shifted[-1] += 1
            shifted[0] -= 1
    found = [even, shifted]
    if stages >= 3 and units >= stages:
        found.append([1] + even_split(units - 2, stages - 2) + [1])
    elif stages == 2 and units >= 3:
        found += [[1, units - 1], [units - 1, 1]]
    return _unique(found)
