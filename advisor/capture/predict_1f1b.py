"""A 1F1B-aware stage-memory predictor, from the per-module terms the hooks measure.

Model. A stage holds modules a..b in order (its decoder layers; the embedding on the first
stage; the final norm, LM head and loss, "output", on the last). Per module j the hooks measure
(``advisor.profiles.LayerRecord``): static_j = parameter + gradient + optimizer bytes, act_j =
what one microbatch keeps for the backward pass, F_j = the rise above the level at j's entry
during its forward pass (act_j included: it is allocated there), B_j = the rise above the level at
the start of j's backward pass (act_j still held). Stage j-th from the end of a pipeline with m
microbatches holds n = min(j, m) microbatches under 1F1B (seed 004 Section 3.2.2; MadPipe's 1F1B*
with equal stage times, seed 001 Section 4.1), and its per-GPU peak is reached while it runs its
n-th forward pass (n - 1 microbatches held) or the backward pass of the oldest (n held):

    M(stage) = S + (n - 1) ACT + max_{a<=j<=b} max(A_{<j} + F_j, A_{<=j} + B_j) + c0 + c1 n

with S = sum static, ACT = sum act, A_{<j} (A_{<=j}) the activations of the stage's modules
before j (up to j) in this microbatch: in the forward pass the modules before j have saved theirs;
in the backward pass the modules after j have freed theirs. This is the step-by-step level of
Megatron's 1F1B order, maximised in closed form (tests/capture_synth.py simulates the order
event by event and agrees). Static memory is taken as held all through the iteration, as with
Megatron's persistent gradient buffers and in-place fused optimizer (the emulator does the same).

c0 + c1 n is what no module owns: communication and pipeline buffers, the received input of each
in-flight microbatch, megatron-core's attention buffer, allocator rounding. c0 and c1 are
fitted per scenario and microbatch by least squares on every profiled stage's residual
PM - (the rest), with n the stage's recorded in-flight count (c1 = 0 when all stages had the
same n). The terms come from the last recorded iteration (the steady state).

Terms for a scenario and microbatch come from the runs of that scenario (the largest value
measured for each module). Where the target differs:

- another microbatch: each term on the line through the lowest and highest profiled microbatch
  (Description 2, term by term); a profiled microbatch is used as measured;
- DP d on a stage whose TP t was profiled without it: each GPU runs the TP-t stage on 1/d of the
  microbatch, and the distributed optimizer shards its states d ways (Megatron's
  DistributedOptimizer; without it nothing is sharded). This composes Megatron's TP x DP.
- TP above the profiled degrees: each term on y = F + A/t through the two largest profiled TP
  degrees (``fits.hyperbola_at``: a replicated part plus a part split t ways).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache

import numpy as np

from advisor.capture import costs
from advisor.capture.fits import hyperbola_at
from advisor.capture.layout import PipelineLayout, Scenario, in_flight_microbatches
from advisor.capture.observations import ProfileSet, StageObservation
from advisor.capture.predictor import ProfiledPredictor, UnprofiledScenario
from advisor.errors import AdvisorError
from advisor.profiles import ProfileError

ARRAYS = ("static", "optimizer", "activation", "forward", "backward")


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class ModuleTable:
    """Per-module terms, index 0 = embedding, 1..L = decoder layers, L + 1 = output; bytes."""

    static: np.ndarray
    optimizer: np.ndarray
    activation: np.ndarray
    forward: np.ndarray
    """F: the forward pass's rise above the module's entry level (its kept activations included)."""
    backward: np.ndarray
    """B: the backward pass's rise above the level at its start."""
    constant: float
    """c0."""
    per_microbatch: float
    """c1."""

    def combine(self, other: ModuleTable, function) -> ModuleTable:
        """Apply ``function(self_value, other_value)`` to every term (a two-point fit)."""
        values = {name: function(getattr(self, name), getattr(other, name)) for name in ARRAYS}
        return ModuleTable(**values, constant=float(function(self.constant, other.constant)),
                           per_microbatch=float(function(self.per_microbatch, other.per_microbatch)))


@dataclass(frozen=True, kw_only=True, slots=True)
class FitSummary:
    """How well c0 + c1 n closed the gap on the profiled stages of one scenario and microbatch."""

    scenario: str
    pipeline_microbatch: int
    stages: int
    constant: float
    per_microbatch: float
    rms_error_bytes: float
    max_error_bytes: float

    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def _extent(first: int, last: int, num_layers: int) -> tuple[int, int]:
    """Module indices (inclusive) of a stage of layers first..last."""
    return (0 if first == 1 else first), (num_layers + 1 if last == num_layers else last)


class PositionAwarePredictor(ProfiledPredictor):
    """Stage memory by 1F1B position, from hook-measured module terms (see the module docstring)."""

    name = "1f1b"

    def __init__(self, profiles: ProfileSet, groups: tuple[tuple[int, int], ...] | None = None) -> None:
        super().__init__(profiles, groups)
        self.fits: list[FitSummary] = []

    # --- terms measured at a profiled scenario and microbatch ---------------------------

    @cache  # noqa: B019 (a predictor lives as long as one recommendation)
    def measured(self, scenario: Scenario, batch: int) -> ModuleTable:
        """The largest value of each module term over the runs of this scenario and microbatch,
        with c0 and c1 fitted to their stages."""
        stages = [s for s in self.profiles.observations if s.scenario == scenario and s.pipeline_microbatch == batch]
        where = f"scenario {scenario.name}, pipeline microbatch {batch}"
        size = self.num_layers + 2
        arrays = {name: np.full(size, np.nan) for name in ARRAYS}
        for stage in stages:
            for key, terms in stage.modules.items():
                index = 0 if key == "embedding" else size - 1 if key == "output" else key
                values = {"static": terms.static_bytes, "optimizer": terms.optimizer_bytes,
                          "activation": terms.activation_bytes, "forward": terms.forward_peak_bytes,
                          "backward": terms.backward_peak_bytes}
                for name, value in values.items():
                    arrays[name][index] = np.fmax(arrays[name][index], value)
        missing = np.flatnonzero(np.isnan(arrays["static"]))
        if missing.size:
            index = int(missing[0])
            module = "embedding" if index == 0 else "output" if index == size - 1 else f"decoder layer {index}"
            raise ProfileError(f"{where}: no layer record for the {module}")
        table = ModuleTable(**arrays, constant=0.0, per_microbatch=0.0)
        return self._fit_constants(table, stages, scenario, batch)

    def _base(self, table: ModuleTable, first: int, last: int, in_flight: float) -> float:
        """The model's M without c0 + c1 n, module by module (the cost table does it in bulk)."""
        low, high = _extent(first, last, self.num_layers)
        part = slice(low, high + 1)
        held = np.cumsum(table.activation[part])  # A_{<=j}
        rise = np.maximum(held - table.activation[part] + table.forward[part], held + table.backward[part])
        return float(table.static[part].sum() + (in_flight - 1) * held[-1] + rise.max())

    def _fit_constants(self, table: ModuleTable, stages: list[StageObservation], scenario: Scenario,
                       batch: int) -> ModuleTable:
        n = np.array([stage.in_flight for stage in stages], dtype=float)
        residual = np.array([stage.peak_bytes - self._base(table, stage.spec.first, stage.spec.last, stage.in_flight)
                             for stage in stages])
        if len(set(n)) > 1:
            design = np.column_stack([np.ones_like(n), n])
            (c0, c1), *_ = np.linalg.lstsq(design, residual, rcond=None)
        else:
            c0, c1 = float(residual.mean()), 0.0
        errors = residual - (c0 + c1 * n)
        self.fits.append(FitSummary(
            scenario=scenario.name, pipeline_microbatch=batch, stages=len(stages), constant=float(c0),
            per_microbatch=float(c1), rms_error_bytes=float(np.sqrt(np.mean(errors**2))),
            max_error_bytes=float(np.abs(errors).max()),
        ))
        return replace(table, constant=float(c0), per_microbatch=float(c1))

    @cache  # noqa: B019
    def terms(self, scenario: Scenario, batch: float) -> ModuleTable:
        """The module terms at any scenario and pipeline microbatch (see the module docstring)."""
        if scenario in self.profiled:
            return self.at_batch(scenario, batch, lambda b: self.measured(scenario, b),
                                 lambda low, high, fit: low.combine(high, fit))
        if scenario.dp > 1:
            replica = self.terms(Scenario(tp=scenario.tp), batch / scenario.dp)
            if not self.profiles.setup.distributed_optimizer:
                return replica
            shard = replica.optimizer / scenario.dp
            return replace(replica, static=replica.static - replica.optimizer + shard, optimizer=shard)
        degrees = sorted(s.tp for s in self.profiled if s.dp == 1)
        if len(degrees) >= 2 and scenario.tp > degrees[-1]:
            t1, t2 = degrees[-2], degrees[-1]
            low, high = (self.terms(Scenario(tp=t), batch) for t in (t1, t2))
            return low.combine(high, lambda y1, y2: hyperbola_at(t1, y1, t2, y2, scenario.tp))
        raise UnprofiledScenario(f"no profile runs for scenario {scenario.name}, nor any to derive it from; profiled: "
                           f"{', '.join(s.name for s in self.profiled)}")

    # --- predictions -------------------------------------------------------------------

    def stage_bytes(self, first: int, last: int, scenario: Scenario, batch: float, in_flight: int) -> float:
        """Per-GPU bytes of a stage of layers first..last holding ``in_flight`` microbatches."""
        table = self.terms(scenario, batch)
        return self._base(table, first, last, in_flight) + table.constant + table.per_microbatch * in_flight

    def predict(self, layout: PipelineLayout) -> tuple[float, ...]:
        if layout.num_layers != self.num_layers:
            raise AdvisorError(f"the layout has {layout.num_layers} layers, the profiles {self.num_layers}")
        return tuple(
            self.stage_bytes(stage.first, stage.last, stage.scenario, layout.pipeline_microbatch, layout.in_flight(i))
            for i, stage in enumerate(layout.stages)
        )

    def cost_table(self, scenario: Scenario, pipeline_microbatch: float, num_microbatches: int,
                   max_stages: int) -> costs.CostTable:
        """Rows j = 1 .. min(m, max_stages): the stage j-th from the end holds min(j, m)."""
        table = self.terms(scenario, pipeline_microbatch)
        layers = self.num_layers
        static = np.concatenate([[0.0], np.cumsum(table.static)])  # static[k] = sum of modules 0..k-1
        activation = np.concatenate([[0.0], np.cumsum(table.activation)])  # A before module k
        first, last = costs.upper(layers)
        low = np.where(first == 1, 0, first)
        high = np.where(last == layers, layers + 1, last)
        # max(A_{<j} + F_j, A_{<=j} + B_j) counted from module 0; a stage starting at module
        # `low` subtracts the A before it.
        rise = np.maximum(activation[:-1] + table.forward, activation[1:] + table.backward)
        held = activation[high + 1] - activation[low]
        fixed = static[high + 1] - static[low] + _range_max(rise)[low, high] - activation[low] - held + table.constant
        per_microbatch = held + table.per_microbatch
        rows = max(1, min(num_microbatches, max_stages))
        values = costs.empty(layers, rows)
        for j in range(1, rows + 1):
            values[j - 1, first, last] = fixed + in_flight_microbatches(0, j, num_microbatches) * per_microbatch
        full = costs.CostTable(values, tuple((layer, layer) for layer in range(1, layers + 1)))
        return costs.unit_table(values, self.groups) if self.groups else full


def _range_max(values: np.ndarray) -> np.ndarray:
    """result[a, b] = max(values[a..b]) for a <= b."""
    size = len(values)
    result = np.full((size, size), -np.inf)
    for a in range(size):
        result[a, a:] = np.maximum.accumulate(values[a:])
    return result

