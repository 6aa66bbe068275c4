"""Real-size symbolic profiles against seed 004, term by term: ``python -m tables.symbolic``.

Reads the committed profiles of ``examples/symbolic`` (made by the commands in
``examples/symbolic/README.md``; ``--profile`` re-makes them first, about 2 minutes) and writes the
README's section between its markers: each term of the first and the last stage measured, the
estimator's value for the same run (seed 004, Eq. 6-18, as ``advisor profile show`` compares
them), and the ratio. A test checks that the section is what the committed profiles give.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import click

from advisor.cli.options import OneLineCommand
from advisor.profile_report import compare_rank
from advisor.profiles import load_run

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "symbolic"
BEGIN, END = "<!-- symbolic-comparison:begin -->", "<!-- symbolic-comparison:end -->"
RUNS = {
    "llama3.1-8b-pp4": ("Llama-3.1-8B, TP 1, PP 4 (8 layers a stage), 4 microbatches",
                        ["--model", "llama3.1-8b", "--layers-per-stage", "8x4", "--num-microbatches", "4"]),
    "llama3.1-70b-tp8": ("Llama-3.1-70B, TP 8 + SP, one-layer stages 1, 41, 80 of 80, 2 microbatches",
                         ["--model", "llama3.1-70b", "--layers-per-stage", "1x80", "--stage", "0", "--stage", "40",
                          "--stage", "79", "--num-microbatches", "2", "--tp", "8", "--sequence-parallel"]),
    "llama3.1-405b-tp8-cp2": ("Llama-3.1-405B, TP 8 + SP, CP 2, one-layer stages 1, 64, 126 of 126, 2 microbatches",
                              ["--model", "llama3.1-405b", "--layers-per-stage", "1x126", "--stage", "0", "--stage",
                               "63", "--stage", "125", "--num-microbatches", "2", "--tp", "8", "--cp", "2",
                               "--sequence-parallel"]),
}
COMMON = ["--seq-len", "8192", "--distributed-optimizer", "--dtype", "bfloat16", "--backend", "symbolic",
          "--layer-spec", "transformer_engine"]
# (module kind, term) rows of the table, in order, and the stage they are read on.
ROWS = [("first", "embedding", "weights"), ("first", "embedding", "activations"), ("first", "layer", "weights"),
        ("first", "layer", "activations"), ("last", "output", "weights"), ("last", "output", "activations"),
        ("first", "stage", "gradients"), ("first", "stage", "optimizer"), ("first", "stage", "activations in flight"),
        ("first", "stage", "peak"), ("last", "stage", "activations in flight"), ("last", "stage", "peak")]


def command(name: str) -> list[str]:
    return [sys.executable, "-m", "megatron_hooks.emulate", *RUNS[name][1], *COMMON, "--run-id", name,
            "--out", str(EXAMPLES / name)]


def comparisons(name: str) -> dict[tuple[str, str, str], tuple[float, float]]:
    """(stage, module, term) -> (measured, estimated) bytes, TP rank 0 of the first and last
    stage profiled; "layer" is the stage's second decoder layer where it has one (the first also
    keeps RoPE's frequencies, which every layer's RoPE saves), else its only one."""
    run = load_run(EXAMPLES / name)
    ranks = sorted(run.ranks, key=lambda r: r.header.rank)
    found = {}
    for stage, rank in (("first", ranks[0]), ("last", ranks[-1])):
        layer = "decoder.layers.1" if len(rank.header.stage_layers) > 1 else "decoder.layers.0"
        for row in compare_rank(rank):
            module = "layer" if row.module == layer else row.module
            found[(stage, module, row.term)] = (row.measured_bytes, row.estimated_bytes, row.equation)
    return found


def section() -> str:
    names = list(RUNS)
    data = {name: comparisons(name) for name in names}
    lines = [BEGIN, "", "| stage | term | 4D paper | " + " | ".join(
        f"{RUNS[name][0].split(',')[0]}: measured / estimated GiB (ratio)" for name in names) + " |",
        "|---|---|---|" + "---|" * len(names)]
    for stage, module, term in ROWS:
        equation = next(data[name][(stage, module, term)][2] for name in names if (stage, module, term) in data[name])
        cells = []
        for name in names:
            value = data[name].get((stage, module, term))
            if value is None:
                cells.append("-")
                continue
            measured, estimated, _ = value
            ratio = f"{measured / estimated:.3f}" if estimated else "-"
            cells.append(f"{measured / 2**30:.3f} / {estimated / 2**30:.3f} ({ratio})")
        what = f"{module} {term}" if module != "stage" else term
        lines.append(f"| {stage} | {what} | {equation} | " + " | ".join(cells) + " |")
    lines += ["", "Runs: " + "; ".join(f"{name}: {RUNS[name][0]}" for name in names) + ". Sequence 8192, MBS 1, "
              "BF16, distributed optimizer, Transformer Engine spec (symbolic stand-ins), TP rank 0.", "", END]
    return "\n".join(lines) + "\n"


# A click command: it took any argument as 'write the section' ('--help' rewrote docs/profiling.md).
@click.command(cls=OneLineCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--profile", is_flag=True,
              help="Re-make the committed profiles of examples/symbolic first (about 2 minutes).")
def main(profile: bool) -> None:
    """Write docs/profiling.md's section comparing the real-size symbolic profiles of
    examples/symbolic with seed 004's estimator, term by term.

    \b
    Examples:
      python -m tables.symbolic
      python -m tables.symbolic --profile   # re-make the profiles first
    """
    from advisor.fileio import atomic_write_text
    from tables.readme import read_readme, replace_between

    readme = ROOT / "docs" / "profiling.md"
    original = read_readme(readme, BEGIN, END)  # before the profiles: a file without markers stops first
    if profile:
        for name in RUNS:
            shutil.rmtree(EXAMPLES / name, ignore_errors=True)
            subprocess.run(command(name), check=True, cwd=ROOT)
    atomic_write_text(readme, replace_between(original, BEGIN, END, section()))
    click.echo(f"wrote the comparison section of {readme}")


if __name__ == "__main__":
    main()
