"""Measured against predicted, for profiled runs (``--profile DIR``: one run or a campaign's
directory of runs): per stage (weights, gradients, optimizer, activations in flight, peak) and
per layer (each module's weights and activations), the comparison of ``advisor.profile_report``
against seed 004's terms for each run's own model, layout and dtype."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from advisor.report.svg import figure_svg

if TYPE_CHECKING:
    from advisor.profiles import ProfileRun


@dataclass(frozen=True, slots=True)
class ProfileComparison:
    runs: list[str]
    """Each run's one-line description."""
    stages: list[dict]
    """Per (run, rank): the stage terms, measured and estimated bytes."""
    layers: list[dict]
    """Per (run, rank, module): weights and activations, measured and estimated bytes."""


def load_profiles(paths: tuple[Path, ...]) -> list[ProfileRun]:
    """Every run under ``paths`` (a run, or a campaign's directory of runs), checked to be of one
    model and setup as ``advisor recommend --profile`` checks its set
    (``capture.observations.check_one_setup``): one page sets one setup against its prediction,
    and a ProfileError names the two runs and the two values that differ."""
    from advisor.capture.observations import check_one_setup, run_directories
    from advisor.profiles import load_run

    runs = [load_run(directory) for directory in run_directories(list(paths))]
    check_one_setup(runs)
    return runs


def compare_profiles(paths: tuple[Path, ...]) -> ProfileComparison:
    from advisor.profile_report import compare_rank, run_description

    runs, stages, layers = [], [], []
    for run in load_profiles(paths):
        runs.append(run_description(run))
        for rank in run.ranks:
            for row in compare_rank(rank):
                entry = {"run": run.header.run_id, "stage": rank.header.coords.get("pp", 0), **row.to_dict()}
                (stages if row.module == "stage" else layers).append(entry)
    return ProfileComparison(runs=runs, stages=stages, layers=layers)


def stage_figure(comparison: ProfileComparison) -> str:
    """Measured against predicted peak of every profiled rank, MiB (the ratio printed above)."""
    peaks = [row for row in comparison.stages if row["term"] == "peak"]

    def draw(figure):
        figure.subplots_adjust(left=0.08, right=0.82, bottom=0.4, top=0.97)
        ax = figure.add_subplot()
        x = range(len(peaks))
        ax.bar([i - 0.2 for i in x], [r["measured_bytes"] / 2**20 for r in peaks], width=0.4, color="#4c72b0",
               label="measured peak")
        ax.bar([i + 0.2 for i in x], [r["estimated_bytes"] / 2**20 for r in peaks], width=0.4, color="#dd8452",
               label="predicted (Eq. 18)")
        for i, r in enumerate(peaks):
            if r["ratio"] is not None:
                ax.text(i, max(r["measured_bytes"], r["estimated_bytes"]) / 2**20, f"{r['ratio']:.2f}",
                        ha="center", va="bottom", fontsize=5.5)
        ax.set_xticks(list(x), [f"{r['run']}\nrank {r['rank']}" for r in peaks], rotation=90, fontsize=5)
        ax.set_ylabel("MiB per GPU")
        ax.legend(frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1))

    return figure_svg("profile-stages", f"Measured against predicted peak memory of {len(peaks)} profiled ranks "
                      "(ratio measured / predicted above each pair)", (8, 3.4), draw)


def layer_figure(comparison: ProfileComparison) -> str:
    """Measured / predicted per module and term: 1 is the equation exactly."""
    terms = sorted({row["term"] for row in comparison.layers})
    colours = {"weights": "#4c72b0", "activations": "#dd8452"}

    def draw(figure):
        figure.subplots_adjust(left=0.08, right=0.86, bottom=0.3, top=0.97)
        ax = figure.add_subplot()
        modules = sorted({row["module"] for row in comparison.layers},
                         key=lambda name: (name != "embedding", name == "output", len(name), name))
        for term in terms:
            mine = [row for row in comparison.layers if row["term"] == term and row["ratio"] is not None]
            ax.scatter([modules.index(r["module"]) for r in mine], [r["ratio"] for r in mine], s=10,
                       color=colours.get(term, "#55a868"), label=term, alpha=0.7, edgecolors="none")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(modules)), modules, rotation=90, fontsize=5)
        ax.set_ylabel("measured / predicted")
        ax.legend(frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1))

    return figure_svg("profile-layers", f"Measured over predicted per layer for {len(comparison.layers)} module "
                      "terms (1 means the equation exactly)", (8, 3.0), draw)
