"""``advisor models``: the built-in Llama presets."""

from __future__ import annotations

from pathlib import Path

import click

from advisor.cli.options import EPILOG, color_wanted, emit, output_options


@click.command(epilog=EPILOG)
@output_options
def models(fmt: str, output: Path | None) -> None:
    """List the built-in Llama presets and their hyper-parameters."""
    from advisor import render
    from advisor.equations import model_parameters
    from advisor.models import PRESETS

    rows = [{**spec.to_dict(), "parameters_billions": model_parameters(spec) / 1e9} for spec in PRESETS.values()]
    if fmt == "table":
        columns = [
            render.Column("name", "model", justify="left"),
            render.Column("num_layers", "L"),
            render.Column("hidden_size", "h"),
            render.Column("ffn_hidden_size", "h_ffn"),
            render.Column("num_attention_heads", "a"),
            render.Column("num_query_groups", "k"),
            render.Column("vocab_size", "v"),
            render.Column("tie_embeddings", "tied"),
            render.Column("parameters_billions", "params (B)", ".2f"),
        ]
        text = render.to_table(rows, columns, color=color_wanted(output))
    else:
        text = render.to_json(rows) if fmt == "json" else render.to_csv(rows)
    emit(text, output)
