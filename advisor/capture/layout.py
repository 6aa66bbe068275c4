"""Pipeline layouts: what the predictors price and the planners produce.

A *stage* holds a contiguous group of decoder layers (1-based, inclusive, as Megatron's
``layer_number``) on ``tp x dp`` GPUs. ``Scenario`` is CAPTURE's (type of parallelism, degree)
without the layer group (seed 000, Section III-B: a "stage config" is a layer group plus a
scenario). The first stage also holds the embedding and the last the final norm, LM head and
loss, as in Megatron.

Batch sizes are *pipeline microbatches*: the sequences of one microbatch entering a stage.
A data-parallel stage of degree d splits it over its d GPUs (CAPTURE's DP stage, Alpa's
semantics); Megatron's uniform DP d with ``--micro-batch-size b`` is the same per GPU as a
pipeline of DP-d stages fed microbatches of b x d. One coordinate serves both.
"""

from __future__ import annotations

from dataclasses import dataclass

from advisor.errors import AdvisorError


@dataclass(frozen=True, kw_only=True, slots=True, order=True)
class Scenario:
    """Per-stage parallelism: ``tp``-way tensor and ``dp``-way data parallel. (1, 1) is a
    pipeline-only stage (CAPTURE's "pipeline-parallel stage")."""

    tp: int = 1
    dp: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "dp"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1 or value & (value - 1):
                raise AdvisorError(f"{name} degree must be a power of 2, got {value!r}")

    @property
    def gpus(self) -> int:
        return self.tp * self.dp

    @property
    def name(self) -> str:
        """'pp', 'tp2', 'dp4', or 'tp2dp4'."""
        if self.gpus == 1:
            return "pp"
        return (f"tp{self.tp}" if self.tp > 1 else "") + (f"dp{self.dp}" if self.dp > 1 else "")


PIPELINE = Scenario()
PROFILED_DEGREES = (2, 4)
"""CAPTURE profiles 2- and 4-way DP and TP only; its predictor extrapolates above 4."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StageSpec:
    first: int
    """First decoder layer (1-based)."""
    last: int
    """Last decoder layer (inclusive)."""
    scenario: Scenario = PIPELINE

    @property
    def num_layers(self) -> int:
        return self.last - self.first + 1


@dataclass(frozen=True, kw_only=True, slots=True)
class PipelineLayout:
    """One pipeline: its stages in order, the microbatch entering it, and the number of
    microbatches per iteration."""

    stages: tuple[StageSpec, ...]
    pipeline_microbatch: int
    num_microbatches: int

    def __post_init__(self) -> None:
        if not self.stages:
            raise AdvisorError("a pipeline needs at least one stage")
        expected = 1
        for index, stage in enumerate(self.stages):
            if stage.first != expected or stage.last < stage.first:
                raise AdvisorError(f"stage {index} holds layers {stage.first}..{stage.last}; expected to start at "
                                   f"layer {expected} with at least one layer")
            expected = stage.last + 1
        if self.pipeline_microbatch < 1 or self.num_microbatches < 1:
            raise AdvisorError("the microbatch size and the number of microbatches must be positive")

    @property
    def num_layers(self) -> int:
        return self.stages[-1].last

    @property
    def layers_per_stage(self) -> tuple[int, ...]:
        return tuple(stage.num_layers for stage in self.stages)

    def in_flight(self, stage: int) -> int:
        """Microbatches whose activations stage ``stage`` holds at once under 1F1B: p - i,
        at most m (seed 004, Section 3.2.2; MadPipe's 1F1B* with equal stage times)."""
        return in_flight_microbatches(stage, len(self.stages), self.num_microbatches)

    @classmethod
    def from_counts(
        cls, layers_per_stage: tuple[int, ...] | list[int], pipeline_microbatch: int, num_microbatches: int,
        scenarios: tuple[Scenario, ...] | Scenario = PIPELINE,
    ) -> PipelineLayout:
        if isinstance(scenarios, Scenario):
            scenarios = (scenarios,) * len(layers_per_stage)
        stages, first = [], 1
        for count, scenario in zip(layers_per_stage, scenarios, strict=True):
            stages.append(StageSpec(first=first, last=first + count - 1, scenario=scenario))
            first += count
        return cls(stages=tuple(stages), pipeline_microbatch=pipeline_microbatch, num_microbatches=num_microbatches)


def in_flight_microbatches(stage: int, num_stages: int, num_microbatches: int) -> int:
    """1F1B: stage i of p warms up with p - i - 1 forwards, then holds one more in its steady
    state, so p - i microbatches in flight; never more than the m that exist."""
    return min(num_stages - stage, num_microbatches)


def even_split(units: int, parts: int) -> list[int]:
    """CAPTURE's eq(k, g): ``units`` over ``parts`` as evenly as possible by number. The
    remainder goes to the *last* parts, because under 1F1B the front stages already hold the
    most microbatches (and the first one the embedding)."""
    if parts == 0:
        if units:
            raise AdvisorError(f"cannot place {units} layers on no stages")
        return []
    base, extra = divmod(units, parts)
    return [base] * (parts - extra) + [base + 1] * extra
