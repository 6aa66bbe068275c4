"""``advisor models``: the built-in Llama presets."""

from __future__ import annotations

from pathlib import Path

import click

from advisor.cli.options import EPILOG, drawing_for, emit, output_options
from advisor.render import Drawing

DERIVED = ("parameters_billions", "active_parameters_billions")
"""What ``advisor models`` adds to each spec's fields, after them."""


@click.command(epilog=EPILOG)
@output_options
def models(fmt: str, output: Path | None) -> None:
    """List the built-in presets (Llama, Qwen3 and mixtures of experts) and their hyper-parameters;
    total and active parameters (equal for dense models; MoE: top-k experts, embeddings included).

    \b
    Examples:
      advisor models
      advisor models --format json
          # parameters_billions, active_parameters_billions, ...
      advisor models --format csv
          # the same fields, MLA and YaRN as mla.* and yarn.* columns
      advisor sweep --gpus 64 --gpu h100-80gb --model mixtral-8x7b
          # a preset by its name
    """
    from advisor import render

    rows = _rows()
    if fmt == "table":
        text = _table(rows, drawing_for(output))
    elif fmt == "json":
        text = render.to_json(rows)
    else:
        text = render.to_csv(_flat(rows, _csv_columns()))
    emit(text, output)


def _rows() -> list[dict]:
    """Each preset's fields and its parameter counts, dense models first (the JSON rows)."""
    from advisor.models import PRESETS
    from advisor.moe import params as moe_params
    from advisor.moe.spec import PRESETS as MOE_PRESETS

    rows = [{**spec.to_dict(), "parameters_billions": moe_params.every_parameter(spec) / 1e9,
             "active_parameters_billions": moe_params.every_parameter(spec) / 1e9} for spec in PRESETS.values()]
    rows += [{**spec.to_dict(), "parameters_billions": moe_params.every_parameter(spec) / 1e9,
              "active_parameters_billions": moe_params.active_parameters(spec) / 1e9} for spec in MOE_PRESETS.values()]
    return rows


def _csv_columns() -> list[str]:
    """Every field a preset can have, in the order an MoE row's JSON has them (``MoESpec.to_dict``,
    read off the preset that has every one, DeepSeek-V3's: a dense spec's fields first, then the
    MoE fields), MLA's and YaRN's as dotted columns, then ``DERIVED``. Not taken from the rows: a
    CSV header is the first row's keys, and a dense first row had left out every MoE column. The
    fields only a user's command sets (``max_position_embeddings``) are not in it: no preset has them."""
    from dataclasses import fields

    from advisor.moe.spec import MLA, PRESETS as MOE_PRESETS, YarnScaling

    nested = {"mla": MLA, "yarn": YarnScaling}
    columns = []
    for name in MOE_PRESETS["deepseek-v3"].to_dict():
        kind = nested.get(name)
        columns += [f"{name}.{inner.name}" for inner in fields(kind)] if kind else [name]
    return columns + list(DERIVED)


def _flat(rows: list[dict], columns: list[str]) -> list[dict]:
    """Each row with every column, in ``columns``' order: a nested value (MLA, YaRN) spread over
    its dotted columns, so that a spreadsheet gets numbers, not JSON; a list (DeepSeek-V3's
    load_balancing, seq_aux_loss) its items space-separated, as Megatron's flag takes them; a
    field the model does not have (a dense model's MoE fields, MLA where there is none) None, an
    empty cell."""
    def value(row: dict, column: str):
        outer, _, inner = column.partition(".")
        found = (row.get(outer) or {}).get(inner) if inner else row.get(column)
        return " ".join(map(str, found)) if isinstance(found, (list, tuple)) else found

    return [{column: value(row, column) for column in columns} for row in rows]


def _table(rows: list[dict], drawing: Drawing) -> str:
    """The presets as a table under a legend of its abbreviations; the routed experts' width
    beside the dense MLP's (Qwen3-30B-A3B: h_ffn 6144 is config.json's, the experts are 768)."""
    from advisor import render

    columns = [
        render.Column("name", "model", justify="left"),
        render.Column("num_layers", "L"),
        render.Column("hidden_size", "h"),
        render.Column("ffn_hidden_size", "h_ffn"),
        render.Column("num_attention_heads", "a"),
        render.Column("num_query_groups", "kv"),
        render.Column("vocab_size", "v"),
        render.Column("experts", "k/E", justify="left"),
        render.Column("moe_ffn_hidden_size", "h_exp"),
        render.Column("parameters_billions", "params B", ".2f"),
        render.Column("active_parameters_billions", "active B", ".2f"),
    ]
    # k/E in one cell; JSON and CSV have moe_router_topk and num_experts as numbers
    shown = [{**row, "experts": f"{row['moe_router_topk']}/{row['num_experts']}"} if "num_experts" in row else row
             for row in rows]
    return render.to_table(shown, columns, caption=_legend(rows), drawing=drawing)


def _legend(rows: list[dict]) -> str:
    """What the table's headers mean, and the three things a column would say of a few models
    only: which MoE models have dense layers (where h_ffn applies), which tie their embeddings,
    which norm each Q and K head (MLA's latent norms, the same flag, are not that)."""
    from advisor import render

    moe = [row for row in rows if "num_experts" in row]
    dense_first = [f"{row['first_dense_layers']} in {row['name']}" for row in moe if row["first_dense_layers"]]
    tied = [row["name"] for row in rows if row["tie_embeddings"]]
    lines = [
        "L layers, h hidden size, a attention heads, kv key-value heads (query groups), v vocabulary",
        "h_ffn dense MLP width; MoE models use it only in leading dense layers"
        + (f" ({render.listed(dense_first)}, else none)" if dense_first else ""),
        "k/E each token goes to k of E routed experts, each an MLP h_exp wide",
        "params B: billions of parameters; active B: those one token uses (top-k experts, embeddings too)",
    ]
    if tied:
        lines.append(f"input and output embeddings tied (one matrix): {render.listed(tied)}")
    if normed := [row["name"] for row in rows if row.get("qk_layernorm") and not row.get("mla")]:
        lines.append(f"an RMSNorm on each Q and K head (--qk-layernorm): {render.listed(normed)}")
    return "\n".join(lines)


@click.command(epilog=EPILOG)
@output_options
def gpus(fmt: str, output: Path | None) -> None:
    """List the GPU presets for --gpu: memory, dense BF16/FP8 TFLOP/s, HBM, NVLink and network
    bandwidth, GPUs per node, and the vendor specification each number comes from (JSON).

    \b
    Examples:
      advisor gpus --wide
      advisor gpus --format json   # with each number's source
      advisor sweep --gpus 64 --gpu h200-141gb   # a preset by its name
    """
    from advisor import render
    from advisor.hardware import load_gpus

    presets = list(load_gpus().values())
    if fmt == "table":
        rows = [{**gpu.to_dict(), "sources": len(gpu.sources)} for gpu in presets]
        columns = [
            render.Column("name", "name", justify="left"),
            render.Column("memory_gib", "GiB", "g"),
            render.Column("bf16_dense_tflops", "BF16", "g"),
            render.Column("fp8_dense_tflops", "FP8", "g"),
            render.Column("hbm_tb_per_s", "HBM", "g"),
            render.Column("nvlink_bidirectional_gb_per_s", "NVLink", "g"),
            render.Column("network_gb_per_s", "net", "g"),
            render.Column("gpus_per_node", "/node"),
            render.Column("description", "what", justify="left", drop=1),
        ]
        text = render.to_table(rows, columns, caption="BF16, FP8: dense TFLOP/s (no sparsity); HBM TB/s; NVLink GB/s "
                               "both directions; net GB/s per GPU; sources: advisor gpus --format json",
                               drawing=drawing_for(output))
    else:
        rows = [gpu.to_dict() for gpu in presets]
        if fmt == "csv":
            rows = [{**row, "sources": " | ".join(row["sources"])} for row in rows]
        text = render.to_json(rows) if fmt == "json" else render.to_csv(rows)
    emit(text, output)
