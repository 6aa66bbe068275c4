"""PNGs: the error histograms (like CAPTURE's Fig. 7), the error by pipeline position, and the
accuracy against the number of profiling runs. matplotlib with the Agg backend."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tables.capture.accuracy import LABELS, MARGINS, CampaignCost, Evaluation

CLIP = 25.0
"""Errors beyond +-CLIP % are drawn in the outermost bins."""
COLORS = {"capture": "#d95f02", "1f1b": "#1b9e77"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _within_text(scores) -> str:
    return ", ".join(f"{w:.1%} within {round(m * 100)}%" for m, w in zip(MARGINS, scores.within))


def histograms(evaluations: list[Evaluation], title: str, path: Path) -> Path:
    """Per-GPU and per-plan signed error histograms, one column per evaluation (same runs)."""
    plt = _pyplot()
    edges = np.arange(-CLIP, CLIP + 1, 1.0)
    figure, axes = plt.subplots(2, len(evaluations), figsize=(5.2 * len(evaluations), 6.4), sharex=True,
                                squeeze=False)
    for column, evaluation in enumerate(evaluations):
        panels = (("per GPU", [e for run in evaluation.runs for e in run.gpu_errors], evaluation.gpu),
                  ("per plan", [run.plan_error for run in evaluation.runs], evaluation.plan))
        for row, (kind, errors, scores) in enumerate(panels):
            axis = axes[row][column]
            values = np.clip(100 * np.asarray(errors), -CLIP + 0.5, CLIP - 0.5)
            weights = np.full(len(values), 100 / len(values))
            axis.hist(values, bins=edges, weights=weights, color=COLORS[evaluation.predictor], edgecolor="white")
            for margin in MARGINS:
                for sign in (-1, 1):
                    axis.axvline(sign * 100 * margin, color="grey", linestyle=":", linewidth=0.8)
            axis.set_title(f"{LABELS[evaluation.predictor]}, {kind} ({scores.count})\n{_within_text(scores)}",
                           fontsize=8.5)
            axis.set_ylabel("share of predictions (%)")
            if row == 1:
                axis.set_xlabel("(predicted - measured) / measured, %")
    figure.suptitle(f"{title}\n(errors beyond +-{CLIP:g}% in the end bins; dotted: +-2, 5, 11%)", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def by_position(evaluations: list[Evaluation], path: Path) -> Path:
    """Per-GPU error against the stage's microbatches in flight (1F1B: p - i), every held-out set:
    what CAPTURE cannot see (its Section IV-B) and the 1F1B-aware predictor models."""
    plt = _pyplot()
    figure, axes = plt.subplots(1, 2, figsize=(10.4, 3.8), sharey=True)
    for axis, predictor in zip(axes, ("capture", "1f1b")):
        for evaluation in evaluations:
            if evaluation.predictor != predictor:
                continue
            points = [(in_flight, 100 * error) for run in evaluation.runs
                      for in_flight, error in zip(run.in_flight, run.gpu_errors, strict=True)]
            x, y = np.array(points).T
            jitter = {"heldout-pp2": -0.2, "heldout-pp4": 0.0, "heldout-pp8": 0.2}[evaluation.held_out]
            axis.scatter(x + jitter, np.clip(y, -60, 60), s=9, alpha=0.6, label=evaluation.held_out.split("-")[1].upper())
        axis.axhline(0, color="grey", linewidth=0.8)
        axis.set_title(LABELS[predictor], fontsize=9)
        axis.set_xlabel("microbatches in flight on the stage (1F1B)")
        axis.legend(fontsize=8)
    axes[0].set_ylabel("per-GPU error, % (clipped at +-60)")
    figure.suptitle("Prediction error by pipeline position (profiles: the full campaign, PP 4)", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def profiling_cost(evaluations: list[Evaluation], costs: list[CampaignCost], path: Path) -> Path:
    """Share of per-GPU predictions within 5% (held-out PP 4) against the profiling runs."""
    plt = _pyplot()
    runs = {cost.name: cost.runs for cost in costs}
    figure, axis = plt.subplots(figsize=(5.6, 3.6))
    for evaluation in evaluations:
        if evaluation.held_out != "heldout-pp4" or evaluation.refused:
            continue
        x, y = runs[evaluation.campaign], 100 * evaluation.gpu.within[1]
        axis.scatter([x], [y], s=40, color=COLORS[evaluation.predictor])
        axis.annotate(f"{LABELS[evaluation.predictor].split(' (')[0]}, {evaluation.campaign}\n"
                      f"max |error| {100 * evaluation.gpu.max_abs:.1f}%", (x, y), textcoords="offset points",
                      xytext=(6, -22), fontsize=7.5)
    axis.set_xlim(0, max(runs.values()) * 1.45)
    axis.set_ylim(0, 110)
    axis.set_xlabel("profiling runs")
    axis.set_ylabel("per-GPU predictions within 5% (%)")
    axis.set_title("Accuracy against profiling cost (held-out PP 4)", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
