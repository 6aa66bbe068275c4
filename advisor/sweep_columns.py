"""The sweep tables' columns, dense and MoE alike: one layout per row. The terminal's tables
(``advisor.cli``) and the HTML report's headers (``advisor.report.table``) both take them from
here, so a page and a table name a number alike. Where the terminal is narrow, the answer goes
last: the layout (TP, CP, PP, VPP, EP, ETP, MBS) never, then the verdict, the columns the ranking
orders by (TFLOP/s ranked by throughput, the margin or share of memory ranked by memory), what the
user asked for (a token budget's days, --gpu-hour-price's cost), DP (a degree: the audit read a
table without it as missing the layout), the recomputation (part of what is launched), TFLOP/s
where it is not the ranking, how close the row is to the memory limit and whether its split is
uneven (marked on its PP). Before them go the memory used in GiB (the margin says it against the
limit), the memory's parts and the secondary times."""

from __future__ import annotations


def uneven_split(row: dict) -> str:
    """A row's layers per stage where its stages differ ('5,7,10,10'), else '': an even split is
    the layers over PP, which the row's PP already says."""
    from advisor.render import counts_text

    stages = row.get("layers_per_stage") or ()
    return counts_text(stages) if len(set(stages)) > 1 else ""


RANKING_COLUMNS = {"paper": ("verdict", "recompute_text"), "memory": ("margin_gib", "memory_fraction"),
                   "throughput": ("tflops_per_gpu",)}
"""The columns a ranking orders by (``advisor.ranking.order``): the paper's rule by the verdict,
then no recomputation before any, then the fewest model-parallel GPUs (the layout, always shown);
memory by the usage (its margin, or the 80% rule's share of memory); throughput by TFLOP/s."""


def sweep_columns(calibrated: bool = False, timed: bool = False, tokens: bool = False, priced: bool = False,
                  experts: bool = False, rank_by: str = "paper") -> list:
    """``render.Column``s of a sweep table: ``calibrated`` the calibrated model's usage and
    margin beside the analytic total (Eq. 18 for dense models), else the 80% rule's share of
    memory; ``timed`` the time model's columns; ``tokens`` and ``priced`` the token budget's
    days, GPU-hours and cost; ``experts`` EP and ETP (MoE rows). ``drop``: the highest is left
    out first; the answer last (``_answer_first``)."""
    from advisor.render import Column, Fold

    # The rank stays (a table's first column always does): the report's '#3', and '-' on a row
    # --all shows unranked. The degrees and MBS are the layout: never left out.
    columns = [Column("rank", "rank"), Column("tp", "TP", keep=True), Column("cp", "CP", keep=True),
               Column("pp", "PP", keep=True), Column("vpp", "VPP", keep=True)]
    if experts:
        columns += [Column("ep", "EP", keep=True), Column("etp", "ETP", keep=True)]
    split = Fold("pp", uneven_split, "an uneven split's layers per stage follow its PP", drop=4, mark="*",
                 mark_note="PP* marks an uneven split")
    columns += [
        Column("mbs", "MBS", keep=True),
        Column("dp", "DP", drop=-1),
        Column("num_microbatches", "m", drop=9),
        Column("split", "layers", justify="left", drop=5, fold=split),
        Column("recompute_text", "recompute", justify="left", drop=0),
        Column("model_states_gib", "states", ".1f", drop=10, unit="GiB"),
        Column("activations_gib", "act.", ".1f", drop=10, unit="GiB"),
    ]
    # each column its own unit: the margin was a bare '+22.2' wherever the usage, the one header
    # that said 'GiB', was left out (at 100 columns with --tokens)
    columns.append(Column("total_gib", "analytic" if experts else "Eq.18", ".1f" if calibrated else ".2f",
                          drop=8 if calibrated else 7, unit="GiB"))
    if calibrated:
        columns += [Column("usage_gib", "used", ".1f", drop=7, unit="GiB"),
                    Column("margin_gib", "margin", "+.1f", drop=3, unit="GiB")]
    else:
        columns.append(Column("memory_fraction", "of mem", ".0%", drop=3))
    columns.append(Column("verdict", "verdict", justify="left", drop=-4))
    if timed:
        columns += [Column("tflops_per_gpu", "TFLOP/s", ".0f", drop=1, unit="per GPU"),
                    Column("mfu", "MFU", ".0%", drop=9), Column("step_time_s", "step", ".2f", drop=8, unit="s")]
    if tokens:
        columns += [Column("days", "days", ".1f", drop=-2), Column("gpu_hours", "GPU-h", ",.0f", drop=9)]
    if priced:
        columns.append(Column("cost_usd", "cost", ",.0f", drop=-2, unit="$"))
    return _answer_first(columns, RANKING_COLUMNS.get(rank_by, ()))


def _answer_first(columns: list, ranking: tuple[str, ...]) -> list:
    """The columns with the ones the ranking orders by kept to the last but the verdict (drop -3):
    a table titled 'ranked by throughput' that left TFLOP/s out at 60 columns showed a ranking
    without its reason (audit). Last of all the verdict (-4), then the ranking's columns (-3), what
    the user asked for (--tokens' days, --gpu-hour-price's cost: -2), DP (-1, a degree that follows
    from the others), the recomputation (0)."""
    from dataclasses import replace

    return [replace(column, drop=-3) if column.key in ranking and column.drop > -3 else column
            for column in columns]
