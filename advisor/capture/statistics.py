"""CAPTURE's memory statistics and layer merger (seed 000, Section III-A1 and III-A3).

    M_i(l) = PM(l)                                  (III-A1)
    M_a(l) = PM(l-n .. l) - PM(l-n .. l-1)          (III-A1; may be negative)

per scenario (pipeline-only, DP-K or TP-K) and per profiled pipeline microbatch. PM(a..b) is the
peak of a stage that held layers a..b; when several runs measured the same range (at different
pipeline positions) we take the largest, since the peak is what runs out of memory. The choice
of n is ``coverage.sources``' (the largest available).

Layer merger (III-A3), down to L_m units: repeatedly merge the two adjacent units whose merged
M_i is lowest (ties: the leftmost pair),

    M_i(l, l+1) = M_i(l) + M_a(l+1)
    M_a(l, l+1) = M_a(l) + M_a(l+1)

where M_a of the first unit stays undefined (it always starts a stage). The paper merges on the
pipeline-only statistics; the same groups then apply to every scenario (``apply_groups``).
"""

from __future__ import annotations

from dataclasses import dataclass

from advisor.capture.coverage import sources
from advisor.capture.layout import Scenario
from advisor.capture.observations import ProfileSet
from advisor.errors import AdvisorError
from advisor.profiles import ProfileError


@dataclass(frozen=True, kw_only=True, slots=True)
class CaptureStatistics:
    """M_i and M_a of every unit for one scenario and pipeline microbatch, in bytes."""

    scenario: Scenario
    pipeline_microbatch: float
    isolated: tuple[float, ...]
    """M_i of unit 1..U (index u - 1)."""
    added: tuple[float | None, ...]
    """M_a of unit 1..U; None for the first, which never joins preceding units."""
    groups: tuple[tuple[int, int], ...]
    """The layers (first, last) of each unit; one layer per unit unless merged."""


def peaks_by_range(profiles: ProfileSet, scenario: Scenario, pipeline_microbatch: int) -> dict[tuple[int, int], int]:
    """PM(a..b) for every layer range measured on a stage of this scenario and microbatch."""
    peaks: dict[tuple[int, int], int] = {}
    for stage in profiles.observations:
        if stage.scenario == scenario and stage.pipeline_microbatch == pipeline_microbatch:
            key = (stage.spec.first, stage.spec.last)
            peaks[key] = max(peaks.get(key, 0), stage.peak_bytes)
    return peaks


FULL_CAMPAIGN = ("profile the full campaign ('advisor profile plan --mode full'), or use the 1f1b predictor "
                 "(recommend's default), which reads a reduced campaign")
"""What to do where CAPTURE's statistics are missing: audit, a reduced campaign (docs/profiling.md's
quick start) given to --predictor capture was sent to profile the full campaign (318 runs instead
of 30, docs/capture.md), though the default predictor reads it."""


def capture_statistics(profiles: ProfileSet, scenario: Scenario, pipeline_microbatch: int) -> CaptureStatistics:
    """M_i and M_a of every layer (III-A1); a clear error names the first layer without one."""
    peaks = peaks_by_range(profiles, scenario, pipeline_microbatch)
    where = f"scenario {scenario.name}, pipeline microbatch {pipeline_microbatch}"
    if not peaks:
        raise ProfileError(f"{where}: no finished profile run")
    found = sources(peaks)
    no_mi, no_ma = found.missing(profiles.num_layers)
    if no_mi:
        raise ProfileError(f"{where}: no run held layer {no_mi[0]} alone on a stage, so M_i({no_mi[0]}) is unknown"
                           + (f" (nor for {len(no_mi) - 1} more layers)" if len(no_mi) > 1 else "")
                           + f"; {FULL_CAMPAIGN}")
    if no_ma:
        layer = no_ma[0]
        raise ProfileError(f"{where}: no pair of runs held layers a..{layer} and a..{layer - 1} on a stage, so "
                           f"M_a({layer}) is unknown" + (f" (nor for {len(no_ma) - 1} more layers)" if len(no_ma) > 1
                                                        else "") + f"; {FULL_CAMPAIGN}")
    isolated = tuple(float(peaks[(layer, layer)]) for layer in range(1, profiles.num_layers + 1))
    added = (None,) + tuple(
        float(peaks[(a, layer)] - peaks[(a, layer - 1)])
        for layer, a in sorted(found.neighbours.items()) if layer >= 2
    )
    return CaptureStatistics(
        scenario=scenario, pipeline_microbatch=pipeline_microbatch, isolated=isolated, added=added,
        groups=tuple((layer, layer) for layer in range(1, profiles.num_layers + 1)),
    )


# --- layer merger (III-A3) ---------------------------------------------------------------


def merge_groups(isolated: list[float] | tuple[float, ...], added: list | tuple, target_units: int
                 ) -> tuple[tuple[int, int], ...]:
    """The unit groups (first, last; 1-based) after merging down to ``target_units``."""
    if not 1 <= target_units <= len(isolated):
        raise AdvisorError(f"the layer merger can leave 1 to {len(isolated)} units, not {target_units}")
    groups = [(layer, layer) for layer in range(1, len(isolated) + 1)]
    mi, ma = list(isolated), list(added)
    while len(groups) > target_units:
        merged = [mi[u] + ma[u + 1] for u in range(len(groups) - 1)]
        u = merged.index(min(merged))  # the leftmost of equals
        groups[u:u + 2] = [(groups[u][0], groups[u + 1][1])]
        mi[u:u + 2] = [merged[u]]
        ma[u:u + 2] = [None if ma[u] is None else ma[u] + ma[u + 1]]
    return tuple(groups)


def apply_groups(stats: CaptureStatistics, groups: tuple[tuple[int, int], ...]) -> CaptureStatistics:
    """The statistics of merged units: M_i(group) = M_i(first) + sum of M_a of the rest;
    M_a(group) = sum of its M_a (None for the group holding layer 1)."""
    if stats.groups != tuple((layer, layer) for layer in range(1, len(stats.isolated) + 1)):
        raise AdvisorError("merge from per-layer statistics")
    isolated, added = [], []
    for first, last in groups:
        rest = sum(stats.added[layer - 1] for layer in range(first + 1, last + 1))
        isolated.append(stats.isolated[first - 1] + rest)
        added.append(None if first == 1 else stats.added[first - 1] + rest)
    return CaptureStatistics(scenario=stats.scenario, pipeline_microbatch=stats.pipeline_microbatch,
                             isolated=tuple(isolated), added=tuple(added), groups=tuple(groups))
