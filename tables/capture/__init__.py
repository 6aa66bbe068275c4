"""CAPTURE (seed 000, Section IV-B): prediction accuracy of CAPTURE's predictor and of the 1F1B-aware
one on held-out layouts of a tiny Llama, emulated on the CPU, and the profiling cost of the full
and the reduced campaigns. See tables/README.md ("CAPTURE").

    python -m tables.capture measure     the slow step (minutes): campaigns -> tables/data/capture/
    python -m tables.capture analyse     the fast step (seconds): figures, tables, README results

Modules: ``experiment`` (the model, the campaigns, the held-out sampling), ``measure`` (runs them
through ``advisor profile run``), ``accuracy`` (errors and scores), ``figures`` (PNGs), ``report``
(Markdown, the README section, summary.json).
"""
