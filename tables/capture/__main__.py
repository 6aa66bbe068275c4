"""``python -m tables.capture measure | analyse``."""

from __future__ import annotations

from pathlib import Path

import click

from advisor import limits
from advisor.cli.options import Bounded, OneLineGroup, OutDirectory
from tables.readme import read_readme, replace_between

TABLES_DIR = Path(__file__).resolve().parent.parent
DEFAULT_DATA = TABLES_DIR / "data" / "capture"


@click.group(cls=OneLineGroup, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """CAPTURE's prediction accuracy (seed 000, Section IV-B, Fig. 7) and profiling cost, on a tiny
    Llama emulated on the CPU: measure once (minutes), analyse from the data (seconds)."""


@main.command()
@click.option("--data", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_DATA,
              show_default="tables/data/capture", help="Where the campaigns and the runs go.")
@click.option("--threads", type=Bounded(limits.threads()), default=None,
              help="Intra-op threads per emulated GPU (default: the runner's).")
def measure(data: Path, threads: int | None) -> None:
    """Plan the campaigns and run them (the profiling runs and the held-out layouts).

    \b
    Resumable: run it again after an interruption. Example:
      python -m tables.capture measure
    """
    from tables.capture.measure import measure as run

    record = run(data, threads)
    click.echo(f"measured in {record['total_seconds']:.0f} s on {record['machine']}")


@main.command()
@click.option("--data", type=click.Path(file_okay=False, exists=True, path_type=Path), default=DEFAULT_DATA,
              show_default="tables/data/capture", help="The measurements ('measure' writes them).")
@click.option("--out", type=OutDirectory(path_type=Path), default=TABLES_DIR / "out" / "capture",
              show_default="tables/out/capture", help="Folder for the PNGs, RESULTS.md and summary.json.")
@click.option("--readme", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              default=TABLES_DIR / "README.md", show_default="tables/README.md",
              help="Markdown file whose CAPTURE results section (between its markers) is rewritten.")
@click.option("--no-readme", is_flag=True, help="Leave the README alone; write only under --out.")
def analyse(data: Path, out: Path, readme: Path, no_readme: bool) -> None:
    """Recompute every figure and table from the measurements (seconds).

    \b
    Writes under --out:
      histograms-pp4.png   per-GPU and per-plan error histograms of both
                           predictors on the held-out PP-4 layouts (like
                           CAPTURE's Fig. 7)
      by-position.png      per-GPU error by microbatches in flight, PP 2/4/8
      profiling-cost.png   accuracy against the number of profiling runs
      RESULTS.md, summary.json
    and rewrites the results section of tables/README.md.

    \b
    Examples:
      python -m tables.capture analyse
      python -m tables.capture analyse --out /tmp/capture --no-readme
    """
    import json
    import time

    from advisor.fileio import atomic_write_text
    from advisor.render import to_json
    from tables.capture import figures, report
    from tables.capture.accuracy import evaluate

    started = time.perf_counter()
    original = None if no_readme else read_readme(readme, report.BEGIN, report.END)
    evaluations, costs = evaluate(data)
    measured = json.loads((data / "measure.json").read_text(encoding="utf-8"))
    section = report.results_markdown(evaluations, costs, measured)
    new_readme = None if no_readme else replace_between(original, report.BEGIN, report.END, section)
    out.mkdir(parents=True, exist_ok=True)
    full = [e for e in evaluations if e.campaign == "full"]
    written = [
        figures.histograms([e for e in full if e.held_out == "heldout-pp4"],
                           "Held-out PP-4 layouts, both predictors from the full campaign's profiles",
                           out / "histograms-pp4.png"),
        figures.by_position(full, out / "by-position.png"),
        figures.profiling_cost(evaluations, costs, out / "profiling-cost.png"),
        atomic_write_text(out / "RESULTS.md", section),
        atomic_write_text(out / "summary.json", to_json(report.summary(evaluations, costs))),
    ]
    if new_readme is not None:
        atomic_write_text(readme, new_readme)
    headline = next(e for e in full if e.predictor == "1f1b" and e.held_out == "heldout-pp4")
    capture = next(e for e in full if e.predictor == "capture" and e.held_out == "heldout-pp4")
    click.echo(f"{len(written)} files in {out}{'' if no_readme else f'; results section of {readme} rewritten'}\n"
               f"held-out PP 4, per GPU within 5%: 1F1B-aware {report.pct(headline.gpu.within[1])}, "
               f"CAPTURE {report.pct(capture.gpu.within[1])}\n{time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main(prog_name="python -m tables.capture")
