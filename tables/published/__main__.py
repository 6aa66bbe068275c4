"""``python -m tables.published``: print the published-runs report as Markdown (``--format json``
for machines)."""

from __future__ import annotations

import json

import click

from advisor.cli.options import OneLineCommand


def markdown(rows: list[dict], summary: dict) -> str:
    """The per-run table and the summary lines, as tables/README.md shows them."""
    from tables.published.runs import MAPE_TARGET, TARGETS

    lines = ["| run | GPUs | layout | published s | predicted s | error | verdict (GiB) |",
             "|---|---:|---|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['run']} | {r['gpus']:,} | {r['layout']} | {r['published_s']:.2f} | {r['predicted_s']:.2f} | "
                     f"{r['error']:+.1%} | {r['verdict']} ({r['usage_gib']:.1f}) |")
    lines.append("")
    for precision, s in summary.items():
        target = f"each within {TARGETS[precision]:.0%}" + (f", MAPE <= {MAPE_TARGET:.0%}" if precision == "bf16" else "")
        lines.append(f"- {precision.upper()}: {s['runs']} runs, MAPE {s['mape']:.1%}, largest error {s['max_error']:.1%}, "
                     f"{s['within_target']} of {s['runs']} within target ({target}); {s['verdicts_ok']} of {s['runs']} "
                     "called fits or likely fits (every one ran).")
    return "\n".join(lines) + "\n"


@click.command(cls=OneLineCommand)
@click.option("--format", "fmt", type=click.Choice(["markdown", "json"]), default="markdown", show_default=True)
def main(fmt: str) -> None:
    """Price every run of tables/published/dense_runs.csv and compare its step time; then Meta's
    Llama 3 405B TFLOP/s (tables/published/meta405b.py)."""
    from tables.published import meta405b
    from tables.published.runs import load, report

    rows, summary = report(load())
    if fmt == "json":
        click.echo(json.dumps({"runs": rows, "summary": summary, "meta_405b": meta405b.rows()}, indent=1))
        return
    click.echo(markdown(rows, summary))
    click.echo(meta405b.markdown(), nl=False)


if __name__ == "__main__":
    main()
