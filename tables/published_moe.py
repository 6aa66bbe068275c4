"""``python -m tables.published_moe``: the MoE model (advisor.moe) against published Megatron-core
MoE runs (``tables/published/moe_runs.csv``, each row with its source and its options as published).

Each run is priced exactly as a user would price it: ``advisor estimate --format json`` with the
run's layout and the ``options`` column (recomputation, dispatcher, routing assumption), through the
CLI's own parsing (``advisor.cli``), so an option the MoE model does not price is refused there, by
name, and never silently dropped.

Roles: ``test`` rows have a published throughput on H100 and are the targets (step time within
15%); ``extra`` rows are timed runs on another GPU with a preset (B200), or with a routing whose
imbalance was not published (natural routing early in training): reported, not targets;
``layout`` rows ran with no throughput published: checked for their verdict only; ``context``
rows are not Megatron runs (DeepSeek-V3's own DualPipe and FP8), shown with what the model says
and why it differs. Every row is *test* data: none was used to fit any constant.

Published step time: the ``published_step_time_s`` column where the source gives it; else global
batch x sequence / (tokens/s per GPU x GPUs); else Megatron's FLOPs count
(``advisor.moe.time.megatron_flops_per_iteration``, as Megatron-LM's TFLOP/s divides it) over the
published TFLOP/s per GPU and the GPUs.

Routing: the ``routing`` column says what each run did (most benchmark recipes force balanced
routing, ``--moe-router-force-load-balancing``; token-drop recipes pad every expert to capacity
factor 1.0) and how it is priced: ``--moe-routing balanced --moe-imbalance 1.0`` for forced and
aux-loss balancing, ``--moe-routing capacity --moe-expert-capacity-factor 1.0`` for token drop.

FP8 runs are priced with their ``fp8_flags`` (Megatron's ``--fp8-format``/``--fp8-recipe``); a
run whose FP8 flags the MoE model refuses is priced in BF16 and marked so (``priced_precision``
bf16, the one-line refusal in ``fp8_refused`` and in the output) and not held to the target.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

import click

from advisor import equations as eq
from advisor.cli.options import OneLineCommand
from advisor.errors import AdvisorError
from tables.published.csv_rows import typed_rows

RUNS = Path(__file__).parent / "published" / "moe_runs.csv"
COLUMNS = ("id", "role", "model", "gpu", "gpus", "tp", "cp", "pp", "vpp", "ep", "etp", "mbs", "gbs", "seq_len",
           "precision", "options", "fp8_flags", "routing", "published_tflops_per_gpu", "published_tokens_per_gpu_s",
           "published_step_time_s", "source", "note")
INTEGERS = ("gpus", "tp", "cp", "pp", "vpp", "ep", "etp", "mbs", "gbs", "seq_len")
ROLES = ("test", "extra", "layout", "context")
TARGET = 0.15
"""Issue 22's target: each H100 test run's step time within 15%."""
RUNNABLE = ("fits", "tight", "likely fits")
"""A run that ran must be called runnable by the default verdict (``--gpu``'s calibrated model:
fits or likely fits); the 4D paper's 80% rule (``--memory-model paper``: fits or tight) is
shown beside it."""
NOT_RUNNABLE = {
    "mb2509-q30-td": "likely oom by the default verdict (85.4 GiB predicted on the last stage, 84.5 on the first, "
                     "of 80; 85.7 before Qwen3's QK norms were priced as measured, 2026-11-30; 85.6 before the "
                     "routing each of the stage's 24 MoE layers' dispatchers holds was priced, 2026-11-29; 89.6 before the recipe's Transformer Engine cross-entropy was priced, "
                     "which keeps the BF16 logits and no FP32 copy): the MoE terms, each a kept tensor megatron-core "
                     "allocates (a real megatron-core Qwen3-30B-A3B MoE layer measured under fake tensors at MBS 2, "
                     "EP 8: 941.2 MB of activations, 938.0 analytic, 942.2 with the balancing loss's FP32 scores, which "
                     "the measured layer, built without one, does not keep; the transient term measured equal the same "
                     "way on four Mixtral and DeepSeek-V3 layers), give 72.4 GiB; the calibration adds its "
                     "dense-fitted allocator reserve (15.5% of "
                     "memory, 12.4 GiB) and runtime (2.5 GiB); with a reserve under 7.0 GiB it would be called "
                     "likely fits. Published reserves of MoE runs on H100, peak reserved less peak allocated "
                     "(Megatron-Bridge's model cards at 067f987d, other architectures): 4.5 GiB (GLM-5.2, 352 "
                     "GPUs), 5.3 (Nemotron 3.5 Lightning, 16), 7.1 (Gemma 4 26B-A4B, 8, expandable segments), "
                     "10.3 and 12.3 (Nemotron 3 Super, 64): the dense-fitted 12.4 sits at their top and 2 of the "
                     "5 are under 7.0; too few, and of other models, to refit the reserve on",
    "mb2511-q30": "oom by the default verdict (86.3 GiB: mb2509-q30-td's layout, one more layer in flight with "
                  "the all-to-all overlap, a whole chunk at VP 24; 86.6 before Qwen3's QK norms were priced as "
                  "measured, 2026-11-30; 86.3 before the routing every MoE layer's "
                  "dispatcher holds was priced, likely oom at 85.7 before the MoE transient was measured, "
                  "both 2026-11-29)",
}
"""Runs that ran but that the default verdict does not call runnable: a missed target, stated
with its cause and shown under the table, never hidden."""
MISSES = {
    "mb2511-q30": "predicted faster (-59.1%), and a data conflict: the same layout was published at 12.5 s (25.09, "
                  "token drop: -5.2% here, mb2509-q30-td) and 24.8 s (25.11, dropless, the all-to-all "
                  "overlapped), 2x apart. Not the dropless dispatcher's host wait for its token counts "
                  "(priced: 0 s here, the fused permutation and the other microbatch's MLP backward are "
                  "queued on the GPU when it comes)",
    "mb2602-q30": "predicted faster (-29.7%), against 26.02.01's 9,058 tokens/s per GPU; 26.02 published "
                  "5,113 for this layout (a data conflict). Priced with the flex dispatcher (DeepEP) that "
                  "the layout's recipe sets (Megatron-Bridge v0.3.0, QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1), "
                  "at line rate; as the alltoall dispatcher it is -24.8%. Qwen3-30B-A3B's experts (768 wide, 8 "
                  "to 16 per GPU) run at 97-99% of the dense rate by their shapes. Not the expert GEMMs either: "
                  "timed on one H200 as Transformer Engine issues them (one cuBLAS GEMM per expert over 4 "
                  "streams; tables/moe_gemm_probe.py), this layout's BF16 GEMMs take 0.99 of the modelled "
                  "time, and its FP8 GEMMs 1.24 of it, about 2 points of the miss if charged as measured",
    "mb2606-q30-ep16": "predicted faster (-31%), and not in the EP all-to-all: NVIDIA's BF16 runs of this "
                       "layout and dispatcher, forced balanced, took 25.1 s without the EP overlap "
                       "(mbcard0718-q30-hybridep, -15.7% here) and 21.0 s with it (mbcard0725-q30-overlap, "
                       "-14.6%); the overlap saves 3.2 s here and 3.7 s in NVIDIA's matched A/B (24.71 s to "
                       "20.99 s). This FP8 run took 29.7 s, 18% longer than BF16, where the model makes FP8 "
                       "0.8 s faster (20.4 s against 21.2 s; 1.9 s before Transformer Engine's current-scaling "
                       "quantisation was priced at its 6 bytes an element, 2026-11-29). Not FP8's GEMMs: timed on one H200 at this layout's "
                       "shapes (tables/moe_gemm_probe.py), FP8 expert GEMMs run 1.6x BF16 and take 1.11 of "
                       "the modelled time; charged as measured, 0.8 points less. Left: Transformer Engine's "
                       "current-scaling quantisation of each expert's inputs and gradients beyond its "
                       "bytes, four kernels per expert and tensor (not timed: no Transformer Engine on that "
                       "machine), or the run's other "
                       "container and harness (26.06). "
                       "HybridEP is priced with DeepEP's deduplication (+7.1% when priced as one copy per "
                       "routed expert) and DeepEP's host wait for its receive counts (0.06 s)",
    "mbcard0718-q30-hybridep": "predicted faster (-15.7%), as every Qwen3-30B-A3B run: NVIDIA's BF16 model "
                               "card run, EP 16 with HybridEP, forced balanced, no EP overlap. Within 15% "
                               "(-10.9%) while core attention's fixed cost was charged three times a layer; "
                               "it is charged once a call, forward and backward together, as the dense model "
                               "and the probe it comes from have it. Not the per-expert GEMMs: timed on one H200 "
                               "at these shapes, one cuBLAS GEMM per expert over 4 streams takes 0.93 of the "
                               "modelled time (tables/moe_gemm_probe.py). Where the time goes, from NVIDIA's "
                               "own Nsight profile of this recipe (its matched A/B, 24.71 s; Megatron-Bridge "
                               "skills/nemo-mbridge-perf-moe-comm-overlap/SKILL.md at 067f987d): rank 0's GPU "
                               "ran kernels 22.82 s, 8.3 s of it communication kernels (the 9.1 ms they shared "
                               "with GEMMs or attention is 0.11% of them), so about 14.6 s computing and 1.9 s "
                               "idle; the model charges 15.1 s of compute, 4.4 s of EP communication and 1.7 s "
                               "of per-microbatch overhead. Compute agrees within 4%; the miss is in the "
                               "HybridEP dispatch and combine kernels, about 1.9x their line-rate price (read "
                               "as one profiled step, which its 22.8 s of GPU activity suggests). DeepEP's own "
                               "kernels measure 43% of line rate off-node at EP 16 on 2 H800 nodes but 87-89% at "
                               "EP 32 and 64 (DeepEP docs/legacy.md; third-party H100 and H200 runs on 2-4 nodes, "
                               "DeepEP issues #397 and #493, 41-46%): not priced, a dependence on EP the model "
                               "has no term for; the flex dispatcher stays at line rate",
}
"""Test runs outside the target, each with why (docs/validation.md shows them); never tuned away."""


@dataclass(frozen=True, slots=True)
class MoERun:
    id: str
    role: str
    model: str
    gpu: str
    gpus: int
    tp: int
    cp: int
    pp: int
    vpp: int
    ep: int
    etp: int
    mbs: int
    gbs: int
    seq_len: int
    precision: str
    options: str
    fp8_flags: str
    routing: str
    published_tflops_per_gpu: str
    published_tokens_per_gpu_s: str
    published_step_time_s: str
    source: str
    note: str


def load(path: Path = RUNS) -> list[MoERun]:
    """The runs of ``path``, every column present and typed; a bad row is an error naming it."""
    runs = []
    for line, values in typed_rows(path, COLUMNS, INTEGERS):
        run = MoERun(**values)
        if run.role not in ROLES or run.precision not in ("bf16", "fp8") or (run.precision == "fp8") != bool(
                run.fp8_flags):
            raise AdvisorError(f"{path}:{line}: role must be one of {', '.join(ROLES)}, precision bf16 or fp8, "
                               "and fp8_flags given exactly for fp8 runs")
        runs.append(run)
    return runs


def estimate_args(run: MoERun) -> list[str]:
    """The ``advisor estimate`` arguments of the run: its layout, the vocabulary padding every
    run's recipe kept (Megatron-LM's and Megatron-Bridge's default divisible-by 128; the advisor's
    own launches use 1), and its ``options``."""
    args = ["estimate", "--model", run.model, "--gpu", run.gpu, "--gpus", str(run.gpus), "--tp", str(run.tp),
            "--cp", str(run.cp), "--pp", str(run.pp), "--ep", str(run.ep), "--etp", str(run.etp), "--mbs",
            str(run.mbs), "--gbs", str(run.gbs), "--seq-len", str(run.seq_len), "--format", "json"]
    if run.vpp > 1:
        args += ["--vpp", str(run.vpp)]
    return args + ["--vocab-divisible-by", str(eq.MEGATRON_VOCAB_DIVISIBLE_BY)] + shlex.split(run.options)


def _estimate(args: list[str]) -> tuple[dict | None, str]:
    """(advisor estimate's JSON, '') or (None, its one-line refusal)."""
    from click.testing import CliRunner

    from advisor.cli import cli

    result = CliRunner().invoke(cli, args, prog_name="advisor", catch_exceptions=False)
    if result.exit_code == 0:
        return json.loads(result.stdout), ""
    if result.exit_code == 2:
        return None, result.stderr.strip().removeprefix("Error: ")
    raise AdvisorError(f"advisor {shlex.join(args)} exited {result.exit_code}: {result.output.strip()}")


def price(run: MoERun) -> tuple[dict, str, str]:
    """(the estimate, the precision it priced, the refusal of the run's FP8 flags or '')."""
    args = estimate_args(run)
    fp8_refused = ""
    if run.precision == "fp8":
        estimate, fp8_refused = _estimate(args + shlex.split(run.fp8_flags))
        if estimate is not None:
            return estimate, "fp8", ""
    estimate, refused = _estimate(args)
    if estimate is None:
        raise AdvisorError(f"{run.id}: {refused}")
    return estimate, "bf16", fp8_refused


def published_step(run: MoERun) -> float | None:
    """The published step time in seconds (the module docstring's three ways), or None."""
    if run.published_step_time_s:
        return float(run.published_step_time_s)
    if run.published_tokens_per_gpu_s:
        return run.gbs * run.seq_len / (float(run.published_tokens_per_gpu_s) * run.gpus)
    if not run.published_tflops_per_gpu:
        return None
    from advisor.moe.spec import PRESETS
    from advisor.moe.time import megatron_flops_per_iteration

    spec = PRESETS[run.model]
    vocab = eq.padded_vocab_size(spec.vocab_size, eq.MEGATRON_VOCAB_DIVISIBLE_BY, run.tp)
    flops = megatron_flops_per_iteration(spec, run.seq_len, run.gbs, vocab)
    return flops / (float(run.published_tflops_per_gpu) * 1e12 * run.gpus)


def rows(path: Path = RUNS) -> list[dict]:
    """One result per published run: our peak memory and verdicts (the default, calibrated, and
    the paper's 80% rule), our step time, the error, and whether it is held to the target (an H100
    test run priced in its own precision)."""
    from advisor.paper_rule import classify

    out = []
    for run in load(path):
        ours, priced, refused = price(run)
        published = published_step(run)
        error = None if published is None else ours["step_time_s"] / published - 1
        targeted = run.role == "test" and run.gpu == "h100-80gb" and priced == run.precision
        dp = run.gpus // (run.tp * run.cp * run.pp)
        out.append({"id": run.id, "role": run.role, "precision": run.precision, "priced_precision": priced,
                    "fp8_refused": refused, "gpu": run.gpu, "gpus": run.gpus, "routing": run.routing,
                    "layout": f"TP{run.tp} PP{run.pp}" + (f" VP{run.vpp}" if run.vpp > 1 else "")
                    + f" EP{run.ep}" + (f" MBS{run.mbs}" if run.mbs > 1 else "") + f" GBS{run.gbs}", "dp": dp,
                    "total_gib": ours["total_gib"], "usage_gib": ours.get("usage_gib", ours["total_gib"]),
                    "verdict": ours["verdict"], "paper_verdict": classify(ours["total_gib"], ours["memory_gib"]),
                    "runnable": ours["verdict"] in RUNNABLE,
                    "step_time_s": ours["step_time_s"], "published_step_time_s": published, "error": error,
                    "targeted": targeted, "within_target": None if error is None else abs(error) <= TARGET,
                    "known_miss": MISSES.get(run.id)})
    return out


def markdown(results: list[dict] | None = None) -> str:
    """The comparison table and its notes (within 100 columns), as docs/moe.md shows it."""
    import textwrap

    results = rows() if results is None else results
    lines = ["| run | role | GPUs, layout | prec. | GiB | verdict | ours s | publ. s | error |",
             "|---|---|---|---|---:|---|---:|---:|---:|"]  # GiB and verdict: the default (calibrated) model's
    for r in results:
        published = "-" if r["published_step_time_s"] is None else f"{r['published_step_time_s']:.1f}"
        unpriced = r["priced_precision"] != r["precision"]
        error = "-" if r["error"] is None else f"{r['error']:+.{0 if abs(r['error']) >= 1 else 1}%}"
        lines.append(f"| {r['id']} | {r['role']} | {r['gpus']} {r['layout']} | {r['precision']}{'*' if unpriced else ''} "
                     f"| {r['usage_gib']:.0f} | {r['verdict']} | {r['step_time_s']:.1f} | {published} | {error} |")
    tests = [r for r in results if r["targeted"]]
    within = sum(bool(r["within_target"]) for r in tests)
    unpriced = sum(r["role"] == "test" and not r["targeted"] for r in results)
    ran = [r for r in results if r["role"] != "context"]
    not_runnable = [r["id"] for r in ran if not r["runnable"]]
    paper = all(r["paper_verdict"] in ("fits", "tight") for r in ran)
    notes = ["Layouts: MBS 1 unless shown; DP = GPUs / (TP x PP). GiB and verdict: the default (calibrated) "
             "memory model's. Sources, options and routing: tables/published/moe_runs.csv.",
             f"H100 test runs priced in their own precision: {within} of {len(tests)} within 15%. {unpriced} FP8 test "
             "runs are priced in BF16 (*: their FP8 flags refused, as below) and not held to the target yet.",
             *(f"FP8 refused: {why}" for why in sorted({r["fp8_refused"] for r in results} - {""})),
             "Every Megatron run (test, extra, layout) called runnable by the default verdict: "
             + ("yes." if not not_runnable else f"NO, {len(not_runnable)} of {len(ran)} ({', '.join(not_runnable)}).")
             + " By the 80% rule (--memory-model paper): " + ("yes." if paper else "NO."),
             *(f"Not runnable, {key}: {why}." for key, why in NOT_RUNNABLE.items()),
             *(f"Known miss, {key}: {why}." for key, why in MISSES.items())]
    return "\n".join(lines + [""] + [textwrap.fill(note, 100) for note in notes]) + "\n"


@click.command(cls=OneLineCommand)
def main() -> None:
    """Price every run of tables/published/moe_runs.csv and print the comparison as Markdown."""
    click.echo(markdown(), nl=False)


if __name__ == "__main__":
    main()
