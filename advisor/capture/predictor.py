"""What both predictors share: the profiles, the units, and Description 2's choice of batch.

A predictor prices a stage from profile data. Part 2 (and the recommender) use this interface:

    predictor.predict(layout: PipelineLayout) -> tuple[float, ...]     per-GPU bytes of each stage
    predictor.cost_table(scenario, pipeline_microbatch, num_microbatches, max_stages) -> CostTable
    predictor.name, predictor.profiles, predictor.groups (merged units or None)
"""

from __future__ import annotations

from typing import Callable, TypeVar

from advisor.capture.fits import line_at
from advisor.capture.layout import Scenario
from advisor.capture.observations import ProfileSet
from advisor.errors import AdvisorError

T = TypeVar("T")


class UnprofiledScenario(AdvisorError):
    """No profile run of a stage's TP/DP degrees, nor any a predictor derives them from."""


class ProfiledPredictor:
    name = "predictor"

    def __init__(self, profiles: ProfileSet, groups: tuple[tuple[int, int], ...] | None = None) -> None:
        self.profiles = profiles
        self.groups = groups
        self.profiled = profiles.scenarios()

    @property
    def num_layers(self) -> int:
        return self.profiles.num_layers

    @property
    def units(self) -> tuple[tuple[int, int], ...]:
        """(first, last) layer of each unit: the merged groups, or one layer each."""
        return self.groups or tuple((layer, layer) for layer in range(1, self.num_layers + 1))

    def at_batch(self, scenario: Scenario, batch: float, measure: Callable[[int], T],
                 combine: Callable[[T, T, Callable], T]) -> T:
        """Description 2: a profiled microbatch as measured; another on the straight line through
        the lowest and the highest profiled one. ``combine(low, high, f)`` applies the two-point
        fit ``f(y_low, y_high)`` to every value of a measurement."""
        batches = self.profiled.get(scenario, ())
        if batch in batches:
            return measure(int(batch))
        if len(batches) < 2:
            raise AdvisorError(f"scenario {scenario.name} was profiled at pipeline microbatch "
                               f"{', '.join(map(str, batches))} only; the line fit (Description 2) needs two")
        low, high = batches[0], batches[-1]
        return combine(measure(low), measure(high), lambda y1, y2: line_at(low, y1, high, y2, batch))
