"""Part of ``python -m tables.published``: what a step costs per layer and what it costs whatever
the layers, from published runs that differ in their layer count alone.

Two runs with the same model width, precision, sequence, TP, PP, CP, VP, micro-batch, microbatches
per pipeline and flags, but L1 and L2 layers, give two equations t = a + b L: b = (t2 - t1) /
(L2 - L1) is what one more layer of the model costs the step (its compute and communication over
the m microbatches and the bubble it adds; b x PP / m is one layer's time for one microbatch,
where the missing time is compared), a = t1 - b L1 what the step costs whatever the layers
(the embedding and the LM head, the per-microbatch overhead, the DP collectives and the optimizer,
the pipeline's fill and drain). The same two numbers from the advisor's predictions of the same two
runs say where the time model puts the step's time. The pipeline's bubble grows with the stage
time, so it falls in b; the DP collectives grow with the parameters, a small part of either run.

DGX Cloud Benchmarking published Llama 3.1 405B at 96 GPUs with 21 layers and at 192 GPUs with 42,
both at TP 8 PP 3 CP 2 VP 7 and 63 microbatches (``dense_runs.csv``): the only such pairs on file.
None of these runs was used to fit anything; this table fits nothing either.
"""

from __future__ import annotations

from tables.published.runs import PublishedRun

SAME = ("framework", "model", "precision", "seq_len", "micro_batch_size", "tp", "pp", "cp", "vpp", "training_flags")
"""What two runs of a pair share (with their microbatches per pipeline, ``microbatches``)."""


def microbatches(run: PublishedRun) -> int:
    """m = GBS / (MBS x DP), DP = GPUs / (TP x PP x CP)."""
    return run.global_batch_size // (run.micro_batch_size * (run.gpus // (run.tp * run.pp * run.cp)))


def split(t1: float, t2: float, layers1: int, layers2: int) -> tuple[float, float]:
    """(a, b) of t = a + b L through (L1, t1) and (L2, t2)."""
    per_layer = (t2 - t1) / (layers2 - layers1)
    return t1 - per_layer * layers1, per_layer


def pairs(runs: list[PublishedRun], rows: list[dict], overhead_s: float) -> list[dict]:
    """Each pair of ``runs`` equal in ``SAME`` and their microbatches but not in their layers (the
    fewer layers first), with the published and the predicted split (``rows``: ``runs.report``'s,
    the predictions) and the part of the predicted fixed cost that is the per-microbatch overhead
    (m x ``overhead_s``: the constant paces each microbatch once, ``TimeModel.stage``)."""
    predicted = {row["run"]: row["predicted_s"] for row in rows}
    groups: dict[tuple, list[PublishedRun]] = {}
    for run in runs:
        groups.setdefault((*(getattr(run, name) for name in SAME), microbatches(run)), []).append(run)
    found = []
    for members in groups.values():
        by_layers = sorted({run.num_layers: run for run in members}.values(), key=lambda run: run.num_layers)
        if len(by_layers) != 2 or any(predicted.get(run.run) is None for run in by_layers):
            continue
        short, long = by_layers
        published = split(short.step_time_s, long.step_time_s, short.num_layers, long.num_layers)
        model = split(predicted[short.run], predicted[long.run], short.num_layers, long.num_layers)
        # a layer more adds its time to each of the m microbatches on one of the PP stages
        gap = (published[1] - model[1]) * short.pp / microbatches(short)
        found.append({"runs": (short.run, long.run), "layers": (short.num_layers, long.num_layers),
                      "precision": short.precision, "microbatches": microbatches(short), "pp": short.pp,
                      "layer_gap_s": gap,
                      "published": {"fixed_s": published[0], "per_layer_s": published[1]},
                      "predicted": {"fixed_s": model[0], "per_layer_s": model[1]},
                      "overhead_s": microbatches(short) * overhead_s})
    return found


def markdown(found: list[dict]) -> str:
    """The pairs' table and what it says."""
    lines = ["Step time split into a part per layer and a fixed part, from runs that differ in their layers "
             "alone (tables/published/layer_pairs.py; t = a + b x layers through the two runs):", "",
             "| runs | layers | m | published a s | predicted a s (overhead) | published b s | predicted b s | b error "
             "| missing ms a layer and microbatch |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for pair in found:
        pub, pred = pair["published"], pair["predicted"]
        lines.append(f"| {' / '.join(pair['runs'])} | {pair['layers'][0]} / {pair['layers'][1]} | "
                     f"{pair['microbatches']} | {pub['fixed_s']:.2f} | {pred['fixed_s']:.2f} ({pair['overhead_s']:.2f}) "
                     f"| {pub['per_layer_s']:.4f} | {pred['per_layer_s']:.4f} | "
                     f"{pred['per_layer_s'] / pub['per_layer_s'] - 1:+.1%} | {1e3 * pair['layer_gap_s']:.2f} |")
    return "\n".join(lines) + "\n"
