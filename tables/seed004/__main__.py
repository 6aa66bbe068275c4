"""``python -m tables.seed004``: regenerate every seed-004 artefact and the README's results."""

from __future__ import annotations

import time
from pathlib import Path

import click

from advisor.cli.options import OneLineCommand, OutDirectory
from advisor.fileio import atomic_write_text
from advisor.render import to_json
from tables.readme import read_readme, replace_between
from tables.seed004 import heatmap, report, validation_report
from tables.seed004.results import Results, analyse

TABLES_DIR = Path(__file__).resolve().parent.parent
DEFAULT_OUT = TABLES_DIR / "out"
DEFAULT_README = TABLES_DIR / "README.md"
SUMMARY_SCHEMA = "seed004-results/1"


def summary(results: Results) -> dict:
    """The machine-readable results: summary.json."""
    return {
        "schema": SUMMARY_SCHEMA,
        "misprints": [
            cell.to_dict(table.paper.number) for table in results.estimated for cell in table.misprints
        ],
        "rule": results.rule.to_dict(),
        "ranking": results.ranking.to_dict(),
        **({"validation": validation_report.summary(results.validation, results.ranking)}
           if results.validation is not None else {}),
    }


def write_artefacts(results: Results, out: Path) -> list[Path]:
    """Markdown, CSV and a PNG per table, RESULTS.md and summary.json, all under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for table in results.estimated:
        stem = out / f"table{table.paper.number:02d}"
        written += [
            atomic_write_text(stem.with_suffix(".md"), report.estimated_markdown(table)),
            atomic_write_text(stem.with_suffix(".csv"), report.estimated_csv(table)),
            heatmap.estimated_heatmap(table, stem.with_suffix(".png")),
        ]
    for table in results.measured:
        stem = out / f"table{table.paper.number:02d}"
        columns = tuple(c for c in results.ranking.columns if c.table is table.paper)
        written += [
            atomic_write_text(stem.with_suffix(".md"), report.measured_markdown(table, columns)),
            atomic_write_text(stem.with_suffix(".csv"), report.measured_csv(table)),
            heatmap.measured_heatmap(table, columns, stem.with_suffix(".png")),
        ]
    if results.validation is not None:
        written.append(validation_report.scatter(results.validation, out / "throughput_scatter.png"))
    written += [
        atomic_write_text(out / "RESULTS.md", report.results_markdown(results)),
        atomic_write_text(out / "summary.json", to_json(summary(results))),
    ]
    return written


# One "Error: ..." line with exit status 2 for bad input, as the `advisor` CLI has; a command,
# not a group: an AdvisorGroup listed the advisor's commands in --help and ran the reproduction
# before any of them ('python -m tables.seed004 models').
@click.command(cls=OneLineCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--out", type=OutDirectory(path_type=Path), default=DEFAULT_OUT,
              show_default="tables/out", help="Folder for the tables, PNGs, RESULTS.md and summary.json.")
@click.option("--readme", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Markdown file whose results section (between its BEGIN/END RESULTS markers) is rewritten. "
                   "Default: tables/README.md when the tables go to tables/out; with another --out, none.")
@click.option("--no-readme", is_flag=True, help="Leave the README alone; write only under --out.")
def main(out: Path, readme: Path | None, no_readme: bool) -> None:
    """Reproduce seed 004's Tables 2-11 and score the advisor against its 454 real runs.

    \b
    Writes under --out, per table N of the paper:
      tableNN.md    the table in the paper's layout, cells marked fits/tight/oom
      tableNN.csv   one row per cell (ours, the paper's, verdict, misprint, ...)
      tableNN.png   heatmap in the paper's green/yellow/red
    and RESULTS.md, summary.json (the 80% rule and the ranking against the
    real runs, the misprints), then rewrites the README's results section.

    \b
    Examples:
      python -m tables.seed004
      python -m tables.seed004 --out /tmp/seed004   # tables/README.md left alone
    """
    started = time.perf_counter()
    if readme is None:  # the committed README quotes the committed tables only
        readme, no_readme = DEFAULT_README, no_readme or out.resolve() != DEFAULT_OUT.resolve()
    # read first, so that a README without markers stops before the work and any write
    original = None if no_readme else read_readme(readme, report.BEGIN, report.END)
    results = analyse(with_validation=True)
    new_readme = None if original is None else replace_between(
        original, report.BEGIN, report.END, report.results_markdown(results)
    )
    written = write_artefacts(results, out)
    if new_readme is not None:
        atomic_write_text(readme, new_readme)
    rule, ranking = results.rule, results.ranking
    click.echo(
        f"{len(written)} files in {out}{'' if no_readme else f'; results section of {readme} rewritten'}\n"
        f"misprints: {len(results.found_misprints)}; runs: {rule.total} "
        f"(fits OOM {rule.count('fits', 'OOM')}, oom ran {rule.count('oom', 'ran')}, "
        f"tight ran {rule.count('tight', 'ran')} of {rule.count('tight')}); "
        f"ranking: mean {report.percent(ranking.mean)}, min {report.percent(ranking.minimum)} "
        f"over {len(ranking.scored)} columns\n"
        + (_validation_line(results) if results.validation is not None else "")
        + f"{time.perf_counter() - started:.1f} s"
    )


def _validation_line(results: Results) -> str:
    s = validation_report.summary(results.validation, results.ranking)
    v, t, r = s["verdicts"], s["throughput"], s["ranking"]["selected"]["combined"]
    return (f"held out by GPU type: verdicts {v['all_correct']}/{v['all']} ({v['tight_correct']}/{v['tight']} tight, "
            f"{len(v['false_fits'])} false fits); ranking mean {report.percent(r['mean'])}, min "
            f"{report.percent(r['min'])}; TFLOP/s MAPE {report.percent(t['mape_tables_3_4_6_10'])} (Tables 3, 4, 6, "
            f"10), Spearman {t['spearman_mean']:.2f}\n")


if __name__ == "__main__":
    main(prog_name="python -m tables.seed004")
