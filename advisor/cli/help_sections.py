"""--help in titled sections: a long command's options grouped by topic, in an order that teaches
(what to train, on what, laid out how; then the levers), as Megatron-LM's own argparse groups its
flags (megatron/training/arguments.py: _add_distributed_args, _add_mixed_precision_args, ...).

The one place that says which option goes where: ``ADVISOR_SECTIONS`` by the option's name in the
command (``click.Parameter.name``), the same whichever bundle declares it (``model_options``,
``memory_options``, ``moe_options``, ...). An option named nowhere lands in "Other", with --help.
Only the layout changes: every option and its help text are click's own (``get_help_record``).
"""

from __future__ import annotations

import click

Sections = tuple[tuple[str, tuple[str, ...]], ...]

OTHER = "Other"
"""The last section: the options no section names (--megatron-version, --help)."""

ADVISOR_SECTIONS: Sections = (
    ("Model and run", ("model", "seq_len", "gbs", "tokens", "gpu_hour_price", "from_command", "profiles")),
    ("Cluster", ("gpus", "gpu", "mem", "gpus_per_node")),
    ("Layout", ("tp", "pin_tp", "cp", "pin_cp", "pp", "pin_pp", "ep", "etp", "dp", "mbs", "pin_mbs", "vpp",
                "layers_per_stage", "split", "mode", "merge_to")),
    ("Model overrides", ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                         "vocab_size", "tie_embeddings", "vocab_divisible_by")),
    ("Memory and precision levers", (
        "distributed_optimizer", "use_megatron_fsdp", "data_parallel_sharding_strategy", "fsdp_main_params_dtype",
        "fsdp_grad_comm_dtype", "use_torch_fsdp2", "sharding", "recompute", "recompute_method",
        "recompute_num_layers", "recompute_modules", "sequence_parallel", "fp8_format", "fp8_recipe",
        "fp8_param_gather", "grad_dtype", "grad_reduce_in_bf16", "grads_in_fp32", "bf16",
        "use_precision_aware_optimizer", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype",
        "optimizer_cpu_offload", "optimizer_offload_fraction")),
    ("Kernels and fusions", ("flash_attn", "dataloader_mask", "cross_entropy_loss_fusion",
                             "cross_entropy_fusion_impl", "no_bias_swiglu_fusion")),
    ("Communication overlap", (
        "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap", "tp_comm_overlap_cfg",
        # training_flags.TP_COMM_SWITCHES, by name: importing it here would load the training options at start-up
        "disable_tp_comm_overlap_ag", "disable_tp_comm_overlap_rs", "tp_comm_overlap_rs_dgrad",
        "disable_tp_comm_bulk_dgrad", "disable_tp_comm_bulk_wgrad")),
    ("Mixture of experts", ("dispatcher", "flex_backend", "moe_routing", "capacity_factor", "pad_to_capacity",
                            "moe_imbalance", "mtp_num_layers", "aux_loss_coeff", "a2a_overlap",
                            "shared_expert_overlap", "delay_wgrad", "dispatcher_sms", "permute_fusion",
                            "router_fusion")),
    ("Prediction and ranking", ("memory_model", "threshold", "profile_dir", "rank_by", "objective", "predictor",
                                "compare_best")),
    ("Output", ("fmt", "output", "show_all", "top", "detail", "plot", "png", "wide")),
)
"""The advisor's sections, in the order --help shows them, and within each the options' order."""

SECTIONED_FROM = 30
"""The fewest options a command lists in sections; a shorter page (advisor models, profile show,
profile plan) stays one "Options" list, which sections would only cut up."""

COL_MAX = 30
"""click's widest names column (``HelpFormatter.write_dl``'s ``col_max``)."""


def sectioned(records: list[tuple[str, tuple[str, str]]], sections: Sections) -> list[tuple[str, list]]:
    """``records`` (each option's name and help record) under the titles of ``sections``, each
    section's in its order there, the rest under "Other" as the command declares them; empty
    sections left out."""
    order = {name: (index, position) for index, (_, names) in enumerate(sections)
             for position, name in enumerate(names)}
    grouped: dict[str, list] = {title: [] for title, _ in sections}
    grouped[OTHER] = []
    for name, record in sorted(records, key=lambda item: order.get(item[0], (len(sections), 0))):
        grouped[sections[order[name][0]][0] if name in order else OTHER].append(record)
    return [(title, rows) for title, rows in grouped.items() if rows]


def write_sections(formatter: click.HelpFormatter, sections: list[tuple[str, list]]) -> None:
    """Each section as click writes its "Options" list, with one names column for them all: click
    sizes the column per list, so each section's spacing makes it the widest's, as one list has it
    (a row wider than ``COL_MAX`` goes on its own line, as click does)."""
    widest = min(max(click.formatting.term_len(first) for _, rows in sections for first, _ in rows), COL_MAX)
    for title, rows in sections:
        own = min(max(click.formatting.term_len(first) for first, _ in rows), COL_MAX)
        with formatter.section(title):
            formatter.write_dl(rows, col_max=COL_MAX, col_spacing=2 + widest - own)


class SectionedHelp:
    """Mix into a click Command: --help lists its options in ``help_sections`` (when it has at
    least ``sectioned_from``), else as click does."""

    help_sections: Sections = ADVISOR_SECTIONS
    sectioned_from: int = SECTIONED_FROM

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        records = [(param.name, record) for param in self.get_params(ctx)
                   if not isinstance(param, click.Argument) and (record := param.get_help_record(ctx))]
        if len(records) < self.sectioned_from:
            super().format_options(ctx, formatter)
            return
        write_sections(formatter, sectioned(records, self.help_sections))


def with_sections(command: click.Command) -> None:
    """Make ``command`` and its subcommands ``SectionedHelp`` (their class changed in place, as
    ``spellings.one_value_each`` does: the commands are declared with click's plain decorators)."""
    if not isinstance(command, SectionedHelp) and not isinstance(command, click.Group):
        command.__class__ = type(type(command).__name__, (SectionedHelp, type(command)), {})
    for sub in getattr(command, "commands", {}).values():
        with_sections(sub)
