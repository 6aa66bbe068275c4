"""CAPTURE's predictor, as published (seed 000, Section III-B).

    M_p(l .. l+n, 1) = M_i(l) + sum_{k=l+1}^{l+n} M_a(k)                         (III-B1)

for a stage of layers l..l+n, from the statistics of its scenario; then

- the batch (Description 2): the straight line through the predictions at the two profiled
  pipeline microbatches (the lowest and the highest, if more were profiled), sampled at the
  target; a profiled microbatch is used as measured;
- the degree (III-B3): 2- and 4-way stages like pipeline-only ones, from their own statistics;
  above 4, y = a + b ln(degree) through the predictions at degrees 2 and 4 of the same kind.

Every step is linear in the statistics, so we fit each layer's M_i and M_a and then sum: the
same numbers as fitting each stage's sum, with O(1) range sums for the planners. The prediction
ignores where the stage sits in the pipeline, as the paper's does (its Section IV-B names this
as a cause of mispredictions under 1F1B); ``predict_1f1b`` does not.

CAPTURE profiles DP and TP stages separately, so it has no prediction for a stage with both
(Megatron's TP 2 x DP 4); asking for one is an error.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from advisor.capture import costs
from advisor.capture.fits import log_at
from advisor.capture.layout import PROFILED_DEGREES, PipelineLayout, Scenario
from advisor.capture.predictor import ProfiledPredictor, UnprofiledScenario
from advisor.capture.statistics import CaptureStatistics, apply_groups, capture_statistics
from advisor.errors import AdvisorError


class CapturePredictor(ProfiledPredictor):
    """Position-free stage memory from M_i and M_a."""

    name = "capture"

    def statistics(self, scenario: Scenario, pipeline_microbatch: int) -> CaptureStatistics:
        stats = capture_statistics(self.profiles, scenario, pipeline_microbatch)
        return apply_groups(stats, self.groups) if self.groups else stats

    @cache  # noqa: B019 (a predictor lives as long as one recommendation)
    def unit_statistics(self, scenario: Scenario, batch: float) -> tuple[np.ndarray, np.ndarray]:
        """(M_i, M_a) of every unit at the target microbatch; M_a[0] is 0 (never used)."""
        if scenario in self.profiled:
            return self._at_batch(scenario, batch)
        if scenario.tp > 1 and scenario.dp > 1:
            raise AdvisorError(f"CAPTURE profiles DP and TP stages separately; it cannot predict {scenario.name} "
                               f"(use the 1F1B-aware predictor)")
        kind = "tp" if scenario.tp > 1 else "dp"
        pair = [Scenario(**{kind: degree}) for degree in PROFILED_DEGREES]
        if scenario.gpus > max(PROFILED_DEGREES) and all(s in self.profiled for s in pair):
            (mi2, ma2), (mi4, ma4) = (self._at_batch(s, batch) for s in pair)
            d1, d2 = PROFILED_DEGREES
            return log_at(d1, mi2, d2, mi4, scenario.gpus), log_at(d1, ma2, d2, ma4, scenario.gpus)  # III-B3
        raise UnprofiledScenario(f"no profile runs for scenario {scenario.name}; profiled: "
                           f"{', '.join(s.name for s in self.profiled) or 'none'}")

    def _at_batch(self, scenario: Scenario, batch: float) -> tuple[np.ndarray, np.ndarray]:
        return self.at_batch(scenario, batch, lambda b: self._arrays(self.statistics(scenario, b)),
                             lambda low, high, fit: (fit(low[0], high[0]), fit(low[1], high[1])))

    @staticmethod
    def _arrays(stats: CaptureStatistics) -> tuple[np.ndarray, np.ndarray]:
        added = np.array([0.0 if value is None else value for value in stats.added])
        return np.array(stats.isolated, dtype=float), added

    # --- predictions -------------------------------------------------------------------

    def stage_bytes(self, first_unit: int, last_unit: int, scenario: Scenario, pipeline_microbatch: float) -> float:
        """M_p of units first..last (III-B1) at the target microbatch."""
        isolated, added = self.unit_statistics(scenario, pipeline_microbatch)
        return float(isolated[first_unit - 1] + added[first_unit:last_unit].sum())

    def predict(self, layout: PipelineLayout) -> tuple[float, ...]:
        """Per-GPU bytes of every stage of ``layout`` (its layers must fall on unit boundaries)."""
        starts = {first: index + 1 for index, (first, _) in enumerate(self.units)}
        ends = {last: index + 1 for index, (_, last) in enumerate(self.units)}
        predicted = []
        for stage in layout.stages:
            if stage.first not in starts or stage.last not in ends:
                raise AdvisorError(f"stage {stage.first}..{stage.last} splits a merged unit")
            predicted.append(self.stage_bytes(starts[stage.first], ends[stage.last], stage.scenario,
                                              layout.pipeline_microbatch))
        return tuple(predicted)

    def cost_table(self, scenario: Scenario, pipeline_microbatch: float, num_microbatches: int,
                   max_stages: int) -> costs.CostTable:
        """One position-free row: M_i(l) + M_a(l+1) + ... + M_a(r)."""
        del num_microbatches, max_stages  # CAPTURE's prediction does not depend on the position
        isolated, added = self.unit_statistics(scenario, pipeline_microbatch)
        units = len(isolated)
        cumulative = np.concatenate([[0.0], np.cumsum(added)])  # cumulative[u] = M_a(1) + ... + M_a(u)
        values = costs.empty(units, 1)
        first, last = costs.upper(units)
        values[0, first, last] = isolated[first - 1] + cumulative[last] - cumulative[first]
        return costs.CostTable(values, self.units)
