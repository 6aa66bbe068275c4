"""``python -m tables.splits``: price the splits of every case, write the PNG and rewrite the
README's section."""

from __future__ import annotations

import time
from pathlib import Path

import click

from advisor.cli.options import OneLineCommand, OutDirectory
from advisor.fileio import atomic_write_text
from tables.readme import read_readme, replace_between
from tables.splits.compare import CASES, price
from tables.splits.report import BEGIN, END, figure, markdown

TABLES_DIR = Path(__file__).resolve().parent.parent
DEFAULT_OUT = TABLES_DIR / "out"
DEFAULT_README = TABLES_DIR / "README.md"


def results():
    return [(case, *price(case)) for case in CASES]


@click.command(cls=OneLineCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--out", type=OutDirectory(path_type=Path), default=DEFAULT_OUT,
              show_default="tables/out", help="Folder for splits.png and splits.md.")
@click.option("--readme", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=DEFAULT_README,
              show_default="tables/README.md", help="Markdown file whose splits section is rewritten.")
@click.option("--no-readme", is_flag=True, help="Leave the README alone; write only under --out.")
def main(out: Path, readme: Path, no_readme: bool) -> None:
    """Compare pipeline splits: even, Megatron's --account-for-embedding/loss-in-pipeline-split,
    the memory-optimal and MadPipe's time-optimal, for Llama-3.1-8B/70B/405B on a few GPU counts.

    \b
    Examples:
      python -m tables.splits
      python -m tables.splits --out /tmp/splits --no-readme
    """
    started = time.perf_counter()
    original = None if no_readme else read_readme(readme, BEGIN, END)
    found = results()
    section = markdown(found)
    new_readme = None if original is None else replace_between(original, BEGIN, END, section)
    out.mkdir(parents=True, exist_ok=True)
    written = [atomic_write_text(out / "splits.md", section), figure(found, out / "splits.png")]
    if new_readme is not None:
        atomic_write_text(readme, new_readme)
    click.echo(f"{', '.join(map(str, written))}{'' if no_readme else f'; {readme} rewritten'} "
               f"({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main(prog_name="python -m tables.splits")
