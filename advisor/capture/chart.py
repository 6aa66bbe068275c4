"""Per-GPU memory of a plan beside the even split, as a PNG (like CAPTURE's Fig. 6).

One bar per GPU of a pipeline (hybrid plans) or per pipeline stage (Megatron plans, whose
TP x CP x DP GPUs of a stage all hold the same), the plan's bars beside the even split's, with a
dotted line at each one's peak and, if given, a solid line at the GPU's memory.
"""

from __future__ import annotations

import io
from pathlib import Path

from advisor.capture.plan import Plan
from advisor.memory import GIB


def _series(plan: Plan) -> tuple[str, list[str], list[float], list[float] | None]:
    """Axis label, tick labels, this plan's bars and the baseline's, in GiB."""
    baseline = [value / GIB for value in plan.baseline.stage_bytes] if plan.baseline else None
    if plan.mode == "megatron":
        ours = [stage.predicted_bytes / GIB for stage in plan.stages]
        ticks = [f"{stage.stage}\n{stage.layers} L" for stage in plan.stages]
        return "pipeline stage (L: its layers in this plan)", ticks, ours, baseline
    ours, ticks = [], []
    for stage in plan.stages:
        devices = len(stage.gpus) // stage.cp
        degree = "PP" if devices == 1 else (f"TP{stage.tp}" if stage.tp > 1 else f"DP{stage.dp}")
        ours += [stage.predicted_bytes / GIB] * devices
        ticks += [f"{len(ticks) + k}\ns{stage.stage} {degree}" for k in range(devices)]
    axis = "GPU, and its stage in this plan" if plan.cp == 1 else f"CP group of {plan.cp} GPUs, and its stage"
    return axis, ticks, ours, baseline


def draw(plan: Plan, path: str | Path, memory_gib: float | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from advisor.fileio import atomic_write_bytes

    axis_label, ticks, ours, baseline = _series(plan)
    count = max(len(ours), len(baseline or []))
    figure, axes = plt.subplots(figsize=(max(6.5, 0.45 * count + 2.5), 4.8), dpi=120)
    positions = np.arange(count)
    width = 0.4 if baseline else 0.7
    name = "this plan" + ("" if plan.launchable else " (hybrid, not launchable on stock Megatron)")
    if baseline:
        axes.bar(positions[:len(baseline)] - width / 2, baseline, width, color="#4C72B0",
                 label=f"{plan.baseline.label}: peak {max(baseline):.2f} GiB")
        axes.axhline(max(baseline), color="#4C72B0", linestyle=":", linewidth=1.5)
    axes.bar(positions[:len(ours)] + (width / 2 if baseline else 0), ours, width, color="#55A868",
             label=f"{name}: peak {max(ours):.2f} GiB")
    axes.axhline(max(ours), color="#55A868", linestyle=":", linewidth=1.5)
    if memory_gib:
        axes.axhline(memory_gib, color="#C44E52", linewidth=1.2, label=f"GPU memory {memory_gib:g} GiB")
    axes.set_xticks(positions)
    axes.set_xticklabels(ticks + [str(i) for i in range(len(ticks), count)], fontsize=7 if count > 16 else 9)
    axes.set_xlabel(axis_label)
    axes.set_ylabel("predicted memory per GPU (GiB)")
    degrees = f"TP {plan.tp}, DP {plan.dp}, " if plan.tp else "per-stage TP/DP, "
    axes.set_title(f"{plan.model.name}: {plan.gpus} GPUs, {degrees}PP {plan.pp}, {plan.predictor} predictor",
                   fontsize=10)
    axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.24), ncol=2, fontsize=8, frameon=False)
    axes.set_ylim(0, max(ours + (baseline or []) + [memory_gib or 0]) * 1.12)
    axes.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    plt.close(figure)
    return atomic_write_bytes(path, buffer.getvalue())
