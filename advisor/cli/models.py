"""``advisor models``: the built-in Llama presets."""

from __future__ import annotations

from pathlib import Path

import click

from advisor.cli.options import EPILOG, color_wanted, emit, output_options


@click.command(epilog=EPILOG)
@output_options
def models(fmt: str, output: Path | None) -> None:
    """List the built-in presets (Llama and mixtures of experts) and their hyper-parameters;
    total and active parameters (equal for dense models; MoE: top-k experts, embeddings included).

    \b
    Examples:
      advisor models
      advisor models --format json
          # parameters_billions, active_parameters_billions, ...
      advisor sweep --gpus 64 --gpu h100-80gb --model mixtral-8x7b
          # a preset by its name
    """
    from advisor import render
    from advisor.models import PRESETS
    from advisor.moe import params as moe_params
    from advisor.moe.spec import PRESETS as MOE_PRESETS

    rows = [{**spec.to_dict(), "parameters_billions": moe_params.every_parameter(spec) / 1e9,
             "active_parameters_billions": moe_params.every_parameter(spec) / 1e9} for spec in PRESETS.values()]
    rows += [{**spec.to_dict(), "parameters_billions": moe_params.every_parameter(spec) / 1e9,
              "active_parameters_billions": moe_params.active_parameters(spec) / 1e9,
              "experts": f"{spec.moe_router_topk}/{spec.num_experts}"} for spec in MOE_PRESETS.values()]
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
            render.Column("experts", "k/E", justify="left"),
            render.Column("parameters_billions", "params B", ".2f"),
            render.Column("active_parameters_billions", "active B", ".2f"),
        ]
        text = render.to_table(rows, columns, color=color_wanted(output))
    else:
        text = render.to_json(rows) if fmt == "json" else render.to_csv(rows)
    emit(text, output)


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
                               color=color_wanted(output))
    else:
        rows = [gpu.to_dict() for gpu in presets]
        if fmt == "csv":
            rows = [{**row, "sources": " | ".join(row["sources"])} for row in rows]
        text = render.to_json(rows) if fmt == "json" else render.to_csv(rows)
    emit(text, output)
