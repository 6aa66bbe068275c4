"""``advisor estimate --format csv``, dense and MoE alike: the stage rows with the run's verdict and
time beside them."""

from __future__ import annotations

ESTIMATE_RUN_KEYS = ("verdict", "memory_model", "threshold", "memory_gib", "memory_fraction", "usage_gib", "margin_gib",
                    "peak_stage", "calibrated_peak_stage", "step_time_s", "tflops_per_gpu", "mfu", "tokens_per_s",
                    "days", "gpu_hours", "cost_usd")
"""The estimate's own JSON keys that its CSV repeats on every stage's row, where its JSON has them:
the verdict and what it judged, and the time figures (their parts follow, ``estimate_csv``)."""


def estimate_csv(row: dict, stages: list[dict]) -> str:
    """'advisor estimate --format csv', dense or MoE: one row per pipeline stage, its columns first
    as ever, then the run's verdict and time figures (``ESTIMATE_RUN_KEYS``) and its step's parts
    as ``time_parts.<part>`` (pandas' ``json_normalize`` name for the JSON's nested keys), the same
    on every stage's row: one table a reader filters or groups without a summary row to skip. A
    run's key that a stage also has (its ``total_gib``, an MoE stage's ``usage_gib``) stays the
    stage's own: the run's is its peak stage's (``peak_stage``; the calibrated usage's,
    ``calibrated_peak_stage``)."""
    from advisor import render

    own = {key for stage in stages for key in stage}
    run = {key: row[key] for key in ESTIMATE_RUN_KEYS if key in row and key not in own}
    run.update({f"time_parts.{part}": seconds for part, seconds in (row.get("time_parts") or {}).items()})
    return render.to_csv([{**stage, **run} for stage in stages])
