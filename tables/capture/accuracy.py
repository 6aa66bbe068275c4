"""Predictions against measurements: per-GPU and per-plan errors, as CAPTURE's Section IV-B.

An error is (predicted - measured) / measured of the peak allocated bytes: per GPU (every rank of
a held-out run against its stage's prediction) and per plan (the highest prediction of the run
against its highest measurement, "the peak across all GPUs for a single plan").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from advisor.capture.campaign import read_campaign
from advisor.capture.observations import RunObservation, load_profile_set, observe_run
from advisor.capture.predict_1f1b import PositionAwarePredictor
from advisor.capture.predict_capture import CapturePredictor
from advisor.errors import AdvisorError
from advisor.profiles import load_run
from tables.capture.experiment import HELD_OUT, PROFILING
from tables.capture.measure import run_directory

MARGINS = (0.02, 0.05, 0.11)
"""CAPTURE's Section IV-B reports the shares within 2%, 5% and 11%."""
PREDICTORS = {"capture": CapturePredictor, "1f1b": PositionAwarePredictor}
LABELS = {"capture": "CAPTURE (as published)", "1f1b": "1F1B-aware (ours)"}


@dataclass(frozen=True, kw_only=True, slots=True)
class RunErrors:
    run: str
    layers_per_stage: tuple[int, ...]
    predicted: tuple[float, ...]
    """Per stage, bytes per GPU."""
    measured: tuple[int, ...]
    """Per stage, the peak of its worst GPU."""
    gpu_errors: tuple[float, ...]
    in_flight: tuple[int, ...]
    """Microbatches in flight on the stage of each per-GPU error (the hooks' header)."""
    plan_error: float


@dataclass(frozen=True, kw_only=True, slots=True)
class Scores:
    count: int
    within: tuple[float, ...]
    """Share of |error| <= each of MARGINS."""
    max_abs: float
    mean: float
    """Mean signed error (negative: under-prediction)."""

    @classmethod
    def of(cls, errors) -> Scores:
        values = np.asarray(errors, dtype=float)
        return cls(count=len(values), within=tuple(float(np.mean(np.abs(values) <= m)) for m in MARGINS),
                   max_abs=float(np.abs(values).max()), mean=float(values.mean()))

    def to_dict(self) -> dict:
        return {"count": self.count, **{f"within_{round(m * 100)}pct": w for m, w in zip(MARGINS, self.within)},
                "max_abs": self.max_abs, "mean": self.mean}


@dataclass(frozen=True, kw_only=True, slots=True)
class Evaluation:
    """One predictor, trained on one campaign, on one held-out set."""

    predictor: str
    campaign: str
    held_out: str
    runs: tuple[RunErrors, ...] = ()
    refused: str | None = None
    """Why the predictor cannot predict from this campaign (None if it can)."""

    @property
    def gpu(self) -> Scores:
        return Scores.of([e for run in self.runs for e in run.gpu_errors])

    @property
    def plan(self) -> Scores:
        return Scores.of([run.plan_error for run in self.runs])


@dataclass(frozen=True, kw_only=True, slots=True)
class CampaignCost:
    name: str
    runs: int
    stage_runs: int
    """Emulated GPUs summed over the runs (what a GPU campaign would occupy)."""
    iteration_seconds: float
    """Wall time of the profiled iterations, summed over every rank (the hooks' step times)."""


def errors_of(predictor, observed: RunObservation) -> RunErrors:
    predicted = predictor.predict(observed.layout)
    gpu = tuple((predicted[stage] - peak) / peak for _, stage, peak in observed.gpu_peaks)
    plan = (max(predicted) - max(observed.stage_peaks)) / max(observed.stage_peaks)
    return RunErrors(run=observed.run, layers_per_stage=observed.layout.layers_per_stage, predicted=predicted,
                     measured=observed.stage_peaks, gpu_errors=gpu,
                     in_flight=tuple(observed.stages[stage].in_flight for _, stage, _ in observed.gpu_peaks),
                     plan_error=plan)


def _campaign(data: Path, name: str) -> dict:
    return read_campaign(data / "campaigns" / f"{name}.json")


def held_out_runs(data: Path, name: str) -> list[RunObservation]:
    directory = run_directory(data, name)
    return [observe_run(load_run(directory / run["id"]), run["id"]) for run in _campaign(data, name)["runs"]]


def profile_cost(data: Path, name: str) -> CampaignCost:
    runs = _campaign(data, name)["runs"]
    seconds = 0.0
    for run in runs:
        for rank in load_run(run_directory(data, name) / run["id"]).ranks:
            seconds += sum(it.step_time_s for it in rank.iterations)
    return CampaignCost(name=name, runs=len(runs), stage_runs=sum(run["world_size"] for run in runs),
                        iteration_seconds=seconds)


def evaluate(data: Path) -> tuple[list[Evaluation], list[CampaignCost]]:
    """Every predictor x profiling campaign x held-out set."""
    held = {h.name: held_out_runs(data, h.name) for h in HELD_OUT}
    evaluations = []
    for campaign in PROFILING:
        ids = [run["id"] for run in _campaign(data, campaign)["runs"]]
        profiles = load_profile_set([run_directory(data, campaign) / name for name in ids])
        for name, cls in PREDICTORS.items():
            predictor = cls(profiles)
            for held_name, observed in held.items():
                try:
                    runs = tuple(errors_of(predictor, run) for run in observed)
                except AdvisorError as exc:
                    evaluations.append(Evaluation(predictor=name, campaign=campaign, held_out=held_name,
                                                  refused=str(exc)))
                    continue
                evaluations.append(Evaluation(predictor=name, campaign=campaign, held_out=held_name, runs=runs))
    return evaluations, [profile_cost(data, name) for name in PROFILING]
