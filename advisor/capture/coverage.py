"""Which CAPTURE statistics a set of measured layer ranges yields (seed 000, Section III-A1).

    M_i(l) = PM(l)                                  a stage that held layer l alone
    M_a(l) = PM(l-n .. l) - PM(l-n .. l-1)          the same neighbours l-n..l-1, with and without l

PM(a..b) is the peak memory of a stage that held layers a..b. The paper collects M_a "once for
each layer, for a single value of n" without saying which n when several are available. We take
the largest n (the most neighbours, the nearest to a real stage of about L/G layers); the campaign
generator and the statistics both use this one rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True, slots=True)
class Sources:
    """For each layer, the ranges its statistics come from."""

    isolated: frozenset[int]
    """Layers l with PM(l..l) measured: M_i(l) is known."""
    neighbours: dict[int, int]
    """l -> a: M_a(l) = PM(a..l) - PM(a..l-1), with the smallest a (largest n) measured."""

    def missing(self, num_layers: int) -> tuple[list[int], list[int]]:
        """(layers without M_i, layers without M_a); the first layer never needs M_a, since it
        always starts a stage."""
        no_mi = [layer for layer in range(1, num_layers + 1) if layer not in self.isolated]
        no_ma = [layer for layer in range(2, num_layers + 1) if layer not in self.neighbours]
        return no_mi, no_ma


def sources(ranges: Iterable[tuple[int, int]]) -> Sources:
    measured = set(ranges)
    isolated = frozenset(first for first, last in measured if first == last)
    neighbours: dict[int, int] = {}
    for first, last in sorted(measured):
        if first < last and (first, last - 1) in measured:
            neighbours.setdefault(last, first)  # sorted: the first hit has the smallest a
    return Sources(isolated, neighbours)


def stage_ranges(layers_per_stage: Iterable[int]) -> list[tuple[int, int]]:
    """[3, 2] -> [(1, 3), (4, 5)]."""
    ranges, first = [], 1
    for count in layers_per_stage:
        ranges.append((first, first + count - 1))
        first += count
    return ranges
