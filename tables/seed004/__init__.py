"""Seed 004 ("Accelerating LLM Training with 4D Parallelism and Memory Consumption Estimator"):
its Tables 2-11 regenerated from the advisor's own estimator and sweep, and the advisor scored
against the paper's 454 real runs. Run ``python -m tables.seed004`` (see tables/README.md).

Modules: ``paper`` (the printed cells), ``estimates`` (ours next to them, misprints),
``reality`` (80% rule and ranking against the runs), ``results`` (all of it in one value),
``report`` (Markdown, CSV, the README section), ``heatmap`` (PNGs).
"""
