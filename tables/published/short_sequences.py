"""Part of ``python -m tables.published`` (alone: ``python -m tables.published.short_sequences``):
the time model's per-microbatch overhead checked at sequence 2048-4096.

``microbatch_overhead_s`` (``advisor/calibration.json``, about 26 ms per microbatch per pipeline
stage) was fitted on runs at sequence 8192 and longer. At shorter sequences a microbatch computes
less, so the same constant is a larger share of the step; if it were an artefact of long-sequence
runs, short-sequence runs would come out too slow with it and about right without it.

``short_sequence_runs.csv`` holds published NeMo (Megatron-core) runs on H100 at sequence 2048 and
4096 whose source states the whole layout (TP, PP, CP, VP, MBS, GBS), each with its source. Each run
is written as a torchrun line and priced through ``advisor estimate --from-command``'s path, as
``tables/published/runs.py`` prices the dense runs: once with the shipped constants, once with the
overhead at 0. None of these runs was used to fit anything. The columns ``model_flags`` and
``approximations`` state how each model is written: a non-gated MLP (GPT-3's GELU, Nemotron's
squared ReLU) becomes SwiGLU at 2/3 of its width, which has the same GEMM FLOPs and weights; the
rest (LayerNorm, learned positions, biases, dropout, partial RoPE) is written as published and
priced as the advisor prices it (the run's ``unpriced`` notes name each).

The runs fall into three groups (``GROUPS``); only the first one tests the overhead:
``mbs1`` (GPT-3 175B and Llama 2 at MBS 1); ``mbs1-nemotron`` (Nemotron-4 340B at MBS 1), kept
apart because Nemotron runs come out too fast at every MBS, so they cannot separate the
overhead from the approximated model; ``mbs>1`` (MBS 2-4), where the overhead is 4-17% of the
step and the runs come out too fast whatever it is.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import statistics
from dataclasses import dataclass
from pathlib import Path

import click

from advisor.cli.options import OneLineCommand
from advisor.errors import AdvisorError
from tables.published.csv_rows import typed_rows
from tables.published.runs import PublishedLayout, price_line, torchrun_line

DATA = Path(__file__).with_name("short_sequence_runs.csv")
COLUMNS = ("run", "group", "model", "gpu", "model_flags", "approximations", "gpus", "precision", "seq_len",
           "global_batch_size", "micro_batch_size", "tp", "pp", "cp", "vpp", "published", "published_unit",
           "training_flags", "note", "source")
INTEGERS = ("gpus", "seq_len", "global_batch_size", "micro_batch_size", "tp", "pp", "cp", "vpp")
GROUPS = {
    "mbs1": "MBS 1: GPT-3 175B and Llama 2 7B, 13B, 70B (the check)",
    "mbs1-nemotron": "MBS 1, Nemotron-4 340B (apart: Nemotron runs come out too fast at every MBS)",
    "mbs>1": "MBS 2-4: GPT-3 5B, 20B, 175B, Nemotron-4 15B, Nemotron 8B, 22B (apart: too fast at any overhead)",
}
UNITS = ("s/step", "tokens/s/GPU")


@dataclass(frozen=True, kw_only=True, slots=True)
class ShortRun(PublishedLayout):
    """A row of short_sequence_runs.csv: the model as Megatron flags, how they approximate it, and
    the published figure in its own unit."""
    group: str
    model: str
    model_flags: str
    approximations: str
    published: float
    published_unit: str
    note: str

    @property
    def step_time_s(self) -> float:
        """The published step time; a throughput in tokens per second per GPU (the NeMo
        performance summary's unit) is the global batch's tokens over it."""
        if self.published_unit == "s/step":
            return self.published
        return self.global_batch_size * self.seq_len / (self.published * self.gpus)


def load(path: Path = DATA) -> list[ShortRun]:
    """The runs of ``path``, every column present and typed."""
    runs = []
    for line, values in typed_rows(path, COLUMNS, INTEGERS, ("published",)):
        if values["group"] not in GROUPS or values["published_unit"] not in UNITS:
            raise AdvisorError(f"{path}:{line}: group must be one of {', '.join(GROUPS)} and published_unit "
                               f"one of {', '.join(UNITS)}")
        runs.append(ShortRun(**values))
    return runs


def command_line(run: ShortRun) -> str:
    """The run as the torchrun line a user would paste: the model's flags, the layout and the
    training options."""
    model = [*shlex.split(run.model_flags), "--seq-length", str(run.seq_len),
             "--max-position-embeddings", str(run.seq_len)]
    return torchrun_line(model, run, int(model[model.index("--num-layers") + 1]))


def price(run: ShortRun) -> dict:
    """One row: the run's published and predicted step times with the shipped overhead and with it
    at 0, both errors, the overhead's share of the step, and the overhead constant that would
    have predicted the run exactly (the step time is linear in it)."""
    from advisor.throughput import load_calibration

    shipped = load_calibration()
    fitted = shipped.microbatch_overhead_s
    line = command_line(run)
    estimate = price_line(line, run.run, run.gpu)
    bare = price_line(line, run.run, run.gpu, dataclasses.replace(shipped, microbatch_overhead_s=0.0))
    assert bare["time_parts"]["overhead_s"] == 0, "the constants given did not reach the time model"
    published, predicted, without = run.step_time_s, estimate["step_time_s"], bare["step_time_s"]
    return {"run": run.run, "group": run.group, "seq_len": run.seq_len, "precision": run.precision,
            "micro_batch_size": run.micro_batch_size, "gpus": run.gpus,
            "layout": f"TP {run.tp} PP {run.pp} CP {run.cp} VP {run.vpp} MBS {run.micro_batch_size} "
                      f"GBS {run.global_batch_size}",
            "published_s": published, "predicted_s": predicted, "predicted_without_overhead_s": without,
            "error": predicted / published - 1, "error_without_overhead": without / published - 1,
            "overhead_share": estimate["time_parts"]["overhead_s"] / predicted,
            "implied_overhead_s": fitted * (published - without) / (predicted - without),
            "verdict": estimate["verdict"], "unpriced": estimate["unpriced"]}


def rows(runs: list[ShortRun] | None = None) -> list[dict]:
    """Every run of ``short_sequence_runs.csv`` (or ``runs``) priced, in the file's order."""
    return [price(run) for run in (load() if runs is None else runs)]


def summary(priced: list[dict]) -> dict:
    """Per group: the runs, the errors with the overhead and without it (mean, mean absolute,
    range), the overhead's share of the step, and the implied constant (median, range)."""
    out = {}
    for group in GROUPS:
        members = [r for r in priced if r["group"] == group]
        if not members:
            continue
        entry = {"runs": len(members)}
        for key in ("error", "error_without_overhead"):
            values = [r[key] for r in members]
            entry[key] = {"mean": statistics.fmean(values), "mape": statistics.fmean(abs(v) for v in values),
                          "min": min(values), "max": max(values)}
        shares = [r["overhead_share"] for r in members]
        implied = [r["implied_overhead_s"] for r in members]
        entry["overhead_share"] = {"min": min(shares), "max": max(shares)}
        entry["implied_overhead_s"] = {"median": statistics.median(implied), "min": min(implied), "max": max(implied)}
        out[group] = entry
    return out


def markdown(priced: list[dict], groups: dict) -> str:
    """One table per group, then one line per group with its statistics."""
    from advisor.throughput import load_calibration

    fitted = load_calibration().microbatch_overhead_s
    lines = [f"The per-microbatch overhead ({1e3 * fitted:.1f} ms, fitted at sequence >= 8192) against published "
             f"runs at sequence 2048-4096 (tables/published/short_sequence_runs.csv):", ""]
    for group, title in GROUPS.items():
        lines += [f"**{title}**", "", *_table([r for r in priced if r["group"] == group]), ""]
    lines += [_group_line(group, s) for group, s in groups.items()]
    return "\n".join(lines) + "\n"


def _table(priced: list[dict]) -> list[str]:
    lines = ["| run | seq | layout | published s | predicted s | error | error without the overhead | "
             "overhead's share of the step |", "|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in priced:
        layout = f"{r['gpus']:,} GPUs, {r['layout']}, {r['precision'].upper()}"
        lines.append(f"| {r['run']} | {r['seq_len']} | {layout} | {r['published_s']:.2f} | {r['predicted_s']:.2f} | "
                     f"{r['error']:+.1%} | {r['error_without_overhead']:+.1%} | {r['overhead_share']:.0%} |")
    return lines


def _group_line(group: str, s: dict) -> str:
    e, bare, share, implied = s["error"], s["error_without_overhead"], s["overhead_share"], s["implied_overhead_s"]
    return (f"- {group}, {s['runs']} runs: with the overhead, mean error {e['mean']:+.1%}, MAPE {e['mape']:.1%} "
            f"({e['min']:+.1%} to {e['max']:+.1%}); without it, mean {bare['mean']:+.1%}, MAPE {bare['mape']:.1%} "
            f"({bare['min']:+.1%} to {bare['max']:+.1%}); the overhead {100 * share['min']:.0f}-"
            f"{100 * share['max']:.0f}% of the step; the constant each run implies: median "
            f"{1e3 * implied['median']:.0f} ms ({1e3 * implied['min']:.0f}-{1e3 * implied['max']:.0f}).")


def report() -> dict:
    """The JSON form: every run priced and the per-group statistics."""
    priced = rows()
    return {"runs": priced, "summary": summary(priced)}


@click.command(cls=OneLineCommand)
@click.option("--format", "fmt", type=click.Choice(["markdown", "json"]), default="markdown", show_default=True)
def main(fmt: str) -> None:
    """Price every run of tables/published/short_sequence_runs.csv with the per-microbatch overhead
    and without it.

    \b
    Examples:
      python -m tables.published.short_sequences
      python -m tables.published.short_sequences --format json
    """
    result = report()
    if fmt == "json":
        click.echo(json.dumps(result, indent=1))
        return
    click.echo(markdown(result["runs"], result["summary"]), nl=False)


if __name__ == "__main__":
    main()
