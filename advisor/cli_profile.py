"""``advisor profile``: layer-by-layer memory profiles of Megatron runs (see advisor/profiles.py)."""

from __future__ import annotations

from pathlib import Path

import click

from advisor.capture.cli import plan_command, run_command
from advisor.cli_options import InputError, color_wanted, emit, output_options

SECTIONS = ("ranks", "layers", "compare")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def profile() -> None:
    """Plan, run and read layer-by-layer memory profiles of Megatron runs.

    Profiles are written by the Megatron plugin (megatron_hooks), one JSON Lines file per
    rank; their schema is documented in advisor/profiles.py.
    """


@profile.command()
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--section", type=click.Choice(("all", *SECTIONS)), default="all", show_default=True,
              help="ranks: one row per rank; layers: one row per module; compare: measured / seed 004.")
@click.option("--rank", "ranks", type=int, multiple=True, help="Only these ranks (repeatable).")
@click.option("--iteration", type=click.IntRange(min=0), default=None,
              help="Which recorded iteration to show per layer (default: the last).")
@output_options
def show(directory: Path, section: str, ranks: tuple[int, ...], iteration: int | None, fmt: str,
         output: Path | None) -> None:
    """Summarise a profile run directory: per rank, per layer, and against seed 004.

    \b
    ranks    peak allocated (and reserved, allocator retries on CUDA), static memory, status
    layers   per module: weights, gradients, optimizer share, activations kept for backward
             by one microbatch, transient forward/backward peaks
    compare  each measured term / the seed-004 term for this run's model, layout and dtype:
             Eq. 6-9 (weights), Eq. 12/15 (a layer's activations), Eq. 13 (embedding),
             Eq. 14 (LM head), Eq. 16-17 (activations in flight), Eq. 18 (peak)

    \b
    Examples:
      advisor profile show runs/tp2
      advisor profile show runs/tp2 --section compare --rank 0 --format csv
    """
    from advisor import render
    from advisor.profile_report import compare_rank, layer_rows, rank_summary, run_description
    from advisor.profiles import load_run

    run = load_run(directory)
    profiles = [rank for rank in run.ranks if not ranks or rank.header.rank in ranks]
    if not profiles:
        raise InputError(f"no rank {', '.join(map(str, ranks))} in {directory}")
    for rank in profiles:
        known = {it.iteration for it in rank.iterations}
        if iteration is not None and iteration not in known:
            raise InputError(f"rank {rank.header.rank} recorded no iteration {iteration} (it has {sorted(known)})")
    tables = {
        "ranks": [rank_summary(rank) for rank in profiles],
        "layers": [row for rank in profiles for row in layer_rows(rank, iteration)],
        "compare": [row.to_dict() for rank in profiles for row in compare_rank(rank, iteration)],
    }
    chosen = SECTIONS if section == "all" else (section,)
    if fmt == "json":
        text = render.to_json({"run": run.header.to_dict(), "status": run.status,
                               **{name: tables[name] for name in chosen}})
    elif fmt == "csv":
        if section == "all":
            raise InputError("--format csv needs one --section (ranks, layers or compare)")
        text = render.to_csv(tables[section])
    else:
        text = "\n".join(
            _table(name, tables[name], run_description(run) if name == chosen[0] else None, color_wanted(output))
            for name in chosen
        )
    emit(text, output)


def _table(name: str, rows: list[dict], title: str | None, color: bool) -> str:
    from advisor.render import Column, byte_unit, to_table

    def byte_columns(keys_and_headers):
        unit, size = byte_unit(row[key] for row in rows for key, _ in keys_and_headers)
        return [Column(key, f"{header} {unit}", ".2f", scale=size) for key, header in keys_and_headers]

    if name == "ranks":
        columns = [Column("rank", "rank"), Column("tp_rank", "tp"), Column("cp_rank", "cp"),
                   Column("pp_rank", "pp"), Column("dp_rank", "dp"), Column("layers", "layers"),
                   Column("in_flight_microbatches", "in flight"), Column("num_microbatches", "m"),
                   *byte_columns([("static_bytes", "static"), ("peak_allocated_bytes", "peak alloc."),
                                  ("peak_reserved_bytes", "peak reserved")]),
                   Column("alloc_retries", "retries"), Column("status", "status", justify="left")]
        caption = "; ".join(f"rank {row['rank']}: {row['where']}" for row in rows if row["where"]) or None
        return to_table(rows, columns, title=title, caption=caption, color=color)
    if name == "layers":
        columns = [Column("rank", "rank"), Column("module", "module", justify="left"),
                   Column("layer_number", "layer"),
                   *byte_columns([("parameter_bytes", "weights"), ("gradient_bytes", "grads"),
                                  ("optimizer_bytes", "optimizer"), ("activation_bytes", "act./mb"),
                                  ("forward_peak_bytes", "fwd peak"), ("backward_peak_bytes", "bwd peak")])]
        return to_table(rows, columns, title=title, color=color)
    columns = [Column("rank", "rank"), Column("module", "module", justify="left"),
               Column("term", "term", justify="left"), Column("equation", "seed 004", justify="left"),
               *byte_columns([("measured_bytes", "measured"), ("estimated_bytes", "estimated")]),
               Column("ratio", "measured/est.", ".3f")]
    return to_table(rows, columns, title=title, color=color,
                    caption="estimates: seed 004 for this run's model, layout, sequence, micro-batch and dtype")


profile.add_command(plan_command)
profile.add_command(run_command)
