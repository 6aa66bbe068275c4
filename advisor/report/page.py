"""The page: one HTML document with its style, script and figures inline.

Sections: the answer (the best layout, the estimate's verdict or the plan's peak: step time and
memory); for a sweep the memory heatmap, the time against memory scatter and the ranked rows; the
chosen layouts in detail (memory per stage, the step's parts, the pipeline schedule); a plan's
stages; measured against predicted for profiles; last, folded, the question and every assumption.
"""

from __future__ import annotations

import hashlib
import html
import shlex
from dataclasses import asdict

from advisor.paper_rule import percent
from advisor.report import figures
from advisor.report.details import LayoutDetail, paper_threshold, plan_detail, row_label
from advisor.report.inputs import ReportInput
from advisor.saved_row import number, row_options, row_spec
from advisor.report.schedule_figure import schedule, unit_note
from advisor.report.table import (
    common_flags, flag_codes, flag_groups, flag_script, flags_text, header, key_value_table, plain_table, rows_table,
    split_columns,
)

LAUNCH = ("CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nnodes=NODES --nproc-per-node=PPN --rdzv-backend=c10d "
          "--rdzv-endpoint=$MASTER_ADDR:29500 $MEGATRON_LM/pretrain_gpt.py FLAGS "
          "--data-path ... --tokenizer-type ... --train-iters ...")
"""What 'copy launch' fills in (advisor-launch torchrun --from FILE does the same and more)."""


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("megatron-4d-advisor")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _calibration() -> list[tuple[str, object]]:
    from advisor.fileio import read_json
    from advisor.throughput.calibration import CALIBRATION_FILE

    data = CALIBRATION_FILE.read_bytes()
    document = read_json(CALIBRATION_FILE)
    return [("calibration file", CALIBRATION_FILE.name), ("calibration schema", document.get("schema")),
            ("calibration SHA-256", hashlib.sha256(data).hexdigest()),
            ("memory calibration", document.get("memory"))]


def gpu_facts(name: str | None, memory: float | None, per_node: int | None = None) -> tuple[dict | None, int]:
    """(the GPU preset as priced, GPUs per node): ``per_node`` is the input's own 'gpus_per_node'
    (--gpus-per-node, or a --from-command launch's ranks per node), where it records one; else
    the preset's, else the sweep's default."""
    from advisor.parallel import DEFAULT_GPUS_PER_NODE

    if not name:
        return None, per_node or DEFAULT_GPUS_PER_NODE
    from advisor.hardware import get_gpu

    gpu = get_gpu(name).with_overrides(memory_gib=memory, gpus_per_node=per_node)
    return gpu.to_dict(), gpu.gpus_per_node


def assumptions(report: ReportInput, first: dict, shared: dict) -> str:
    """The question and everything the answer assumed."""
    per_node = first.get("gpus_per_node") if report.kind != "plan" else None  # a row's, checked (inputs._FIELDS)
    gpu, per_node = gpu_facts(first.get("gpu"), number(first, "memory_gib"), per_node)
    pairs: list[tuple[str, object]] = [("question", report.question), ("answer", report.kind)]
    model = first.get("model")
    if isinstance(model, dict):
        pairs += [(f"model: {key}", value) for key, value in model.items()]
    else:
        pairs.append(("model", model))
    pairs += [("GPU preset", gpu or "none (no time model)"), ("GPUs per node", per_node)]
    for key in ("gpus", "world_size", "memory_gib", "memory_limit_gib", "seq_len", "global_batch_size",
                "memory_model", "objective", "mode", "launchable", "not_launchable_reason"):
        if key in first:
            pairs.append((key, first[key]))
    if "tp" in first and "model" in first and isinstance(first.get("model"), dict) and report.kind != "plan":
        options = asdict(row_options(first))
        if report.kind == "sweep":  # each row recomputes as its own column says: not the first row's for all
            options.pop("recomputation", None)
        pairs.append(("training options (all)" if report.kind != "sweep"
                      else "training options (every row; its recomputation in its column)", options))
    if first.get("memory_model", "paper") == "paper" and report.kind != "plan":
        pairs.append(("verdict rule", _paper_rule(first)))
    # the threshold is in the verdict rule above, where it judged; elsewhere it is null; the GPUs
    # per node are the row above
    pairs += [(f"{key} (every row)", value) for key, value in shared.items()
              if key not in dict(pairs) and key not in ("threshold", "gpus_per_node")]
    pairs += [("advisor version", _version()), *_calibration()]
    return key_value_table(pairs, "The question and every assumption", "assumptions")


def assumptions_section(table: str) -> str:
    """The assumptions folded at the end of the page: the answer comes first (audit: about 30
    rows of them opened the page); every row stays, one click away."""
    return ('<details id="assumptions-section"><summary><h2 id="question">The question and its assumptions</h2>'
            "</summary>" + table + "</details>")


def headline(report: ReportInput) -> str:
    """The answer in a few lines, before any figure: a sweep's best ranked layout, an estimate's
    verdict, a plan's peak, each with its step time and memory."""
    if report.kind == "plan":
        plan = report.document
        pairs = [(name, plan.get(key)) for key, name in (
            ("peak_predicted_gib", "peak predicted memory (GiB)"), ("memory_limit_gib", "memory limit (GiB)"),
            ("predicted_step_time_s", "predicted step time (s)"), ("layers_per_stage", "layers per stage"))
            if plan.get(key) is not None]
        return '<h2 id="answer">The answer: the plan</h2>' + key_value_table(pairs, "The plan's prediction", "headline")
    ranked = [row for row in report.rows if row.get("rank")]
    row = min(ranked, key=lambda r: r["rank"]) if ranked else report.rows[0]
    if report.kind == "sweep":
        verdicts = {}
        for other in report.rows:
            verdicts[other.get("verdict")] = verdicts.get(other.get("verdict"), 0) + 1
        counts = ", ".join(f"{count} {verdict}" for verdict, count in verdicts.items())
        title = (f"The answer: {row_label(row)}" if ranked
                 else "The answer: no layout is ranked (none is expected to fit)")
        pairs = [("best layout" if ranked else "first row", row_label(row)),
                 ("layouts", f"{len(report.rows)} rows: {counts}")]
    else:
        title, pairs = f"The answer: {row.get('verdict')}", [("layout", row_label(row))]
    pairs += _headline_numbers(row)
    return f'<h2 id="answer">{html.escape(title)}</h2>' + key_value_table(pairs, "The answer", "headline")


def _headline_numbers(row: dict) -> list[tuple[str, object]]:
    """A row's verdict, step time, throughput and memory, where the row has them."""
    pairs: list[tuple[str, object]] = [("verdict", row.get("verdict"))]
    if (step := number(row, "step_time_s")) is not None:
        pairs.append(("step time", f"{step:.3f} s per iteration"))
    if (tflops := number(row, "tflops_per_gpu")) is not None:
        pairs.append(("throughput", f"{tflops:.0f} TFLOP/s per GPU"))
    memory, usage = number(row, "memory_gib"), number(row, "usage_gib")
    used = usage if usage is not None else number(row, "total_gib")
    if used is not None:
        share = f" of {memory:g} GiB ({used / memory:.0%})" if memory else ""
        which = "predicted" if usage is not None else "Eq. 18"
        pairs.append(("memory per GPU", f"{used:.1f} GiB {which}{share}"))
    return pairs


def _paper_rule(first: dict) -> str:
    """The paper's rule as the rows were judged by it: their recorded --threshold, or the default
    where they do not record one (saved before sweeps and estimates did)."""
    given = ("the rows' --threshold" if first.get("threshold") is not None
             else "the default; these rows do not record --threshold")
    return f"the 4D paper's: fits <= {percent(paper_threshold(first))} of memory ({given}), tight <= 100%, oom"


def verdict_meanings(rows: list[dict]) -> str:
    """What each verdict on the page means, as the rows were judged (``advisor.verdicts``: the
    calibrated model's band; ``advisor.paper_rule``: the paper's threshold), in percent of the
    GPU's memory and, where every row has the same memory, in GiB: 'likely oom' read as 'will
    not run' or as 'fine' alike without it (audit)."""
    first = rows[0] if rows else {}
    memories = {number(row, "memory_gib") for row in rows}
    memory = memories.pop() if len(memories) == 1 else None

    def at(fraction: float) -> str:
        return f"{percent(fraction)} ({fraction * memory:.1f} GiB)" if memory else percent(fraction)

    if first.get("memory_model", "paper") == "paper":
        rule = paper_threshold(first)
        meanings = [("fits", f"Eq. 18's total at most {at(rule)} of the GPU's memory (the 4D paper's rule)"),
                    ("tight", f"above {percent(rule)}, at most 100%: it may run, with little room to spare"),
                    ("oom", "Eq. 18's total over the GPU's memory: it will not run")]
        basis = "Eq. 18's total of the peak stage"
    else:
        from advisor.throughput.calibration import load_memory_calibration

        band = load_memory_calibration().band
        meanings = [("fits", f"predicted at most {at(1 - band)}: below the limit by more than the model's "
                             f"uncertainty (±{percent(band)}, fitted on measured runs)"),
                    ("likely fits", f"above {percent(1 - band)}, at most 100%: expected to run, but nearer the "
                                    "limit than the model can vouch for"),
                    ("likely oom", f"above 100%, at most {at(1 + band)}: predicted over the memory, within the "
                                   "model's uncertainty: expect an out-of-memory error, though it may still run; "
                                   "no launch is offered"),
                    ("oom", f"predicted over {percent(1 + band)}: it will not run; no launch is offered")]
        basis = f"the calibrated prediction ({header('usage_gib')}) of the peak stage"
    items = "".join(f'<dt><span style="background:{figures.COLOURS.get(v, "#eee")}">{html.escape(v)}</span></dt>'
                    f"<dd>{html.escape(text)}</dd>" for v, text in meanings)
    return (f'<details id="verdict-meanings" open><summary>What the verdicts mean ({html.escape(basis)} '
            "against the GPU's memory)</summary><dl class=\"legend\">" + items + "</dl></details>")


def ranking_note(rows: list[dict]) -> str:
    """How the rows were ranked, where they record it: by throughput the rows within the ranking
    tolerance of the fastest come first simplest first (``advisor.ranking.order``), so #1 may be
    predicted slower than #2 (audit: mixtral-8x7b's #1 at 23.60 s, #2 at 22.27 s), and the page
    names the fastest ranked row where it is not #1."""
    ranked = [row for row in rows if row.get("rank") and number(row, "step_time_s") is not None]
    tolerance = number(rows[0], "ranking_tolerance") if rows else None
    if not ranked or not tolerance:
        return ""
    first = min(ranked, key=lambda row: row["rank"])
    fastest = min(ranked, key=lambda row: (row["step_time_s"], row["rank"]))
    text = (f"Ranked by predicted throughput: the rows within {percent(tolerance)} of the fastest's TFLOP/s (the time "
            "model's ranking tolerance, advisor/calibration.json: a gain it cannot order reliably) come first, "
            "simplest first: fewer pipeline chunks (PP x VPP), less recomputation, smaller TP x CP x PP, DDP "
            "before FSDP, no offload, BF16 before FP8, smaller EP.")
    if fastest is not first:
        text += (f" Here the fastest predicted is {row_label(fastest)} ({fastest['step_time_s']:.3f} s per "
                 f"iteration against #{first['rank']}'s {first['step_time_s']:.3f} s).")
    return f'<p id="ranking-note" class="note">{html.escape(text)}</p>'


def figure_block(svg: str | None, caption: str) -> str:
    if svg is None:
        return ""
    return f"<figure>{svg}<figcaption>{html.escape(caption)}</figcaption></figure>"


def _flags(row: dict) -> list[str]:
    args = row.get("megatron_args")
    if isinstance(args, list) and all(isinstance(a, str) for a in args):
        return args
    if isinstance(args, str):
        return args.split()
    from advisor.megatron_args import megatron_args

    return megatron_args(row_spec(row), row["seq_len"], tp=row["tp"], cp=row["cp"],
                         layers_per_stage=row["layers_per_stage"], micro_batch_size=row["mbs"],
                         global_batch_size=row["global_batch_size"], options=row_options(row),
                         virtual_stages=row.get("vpp") or 1)


def rows_section(rows: list[dict], per_node: int, kind: str = "sweep") -> tuple[str, dict]:
    """The rows' table with its flags (``kind`` sweep or estimate: an estimate is one layout, not
    a ranking, and its rank is always '-', so it has neither the heading nor the column)."""
    columns, shared = split_columns(rows)
    if kind == "estimate":
        columns = [key for key in columns if key != "rank"]
    groups = [flag_groups(_flags(row)) for row in rows]
    common = common_flags(groups)
    dictionary, codes = flag_codes(groups)
    nodes = [max(1, -(-int(row.get("gpus") or per_node) // per_node)) for row in rows]
    verdicts = sorted({str(row.get("verdict")) for row in rows if row.get("verdict")})
    options = "".join(f'<option value="{html.escape(v)}">{html.escape(v)}</option>' for v in verdicts)
    legend = "".join(f'<span style="background:{figures.COLOURS.get(v, "#eee")}">{html.escape(v)}</span>'
                     for v in verdicts)
    text = (
        f'<h2 id="rows-heading">{"The layout" if kind == "estimate" else "Ranked layouts"}</h2>'
        f'<p class="legend">Verdicts (colour and word): {legend}</p>'
        + verdict_meanings(rows) +
        "<h3>Megatron-LM flags every row shares</h3>"
        f'<pre id="common-flags">{html.escape(flags_text(common))}</pre>'
        + flag_script(dictionary, common) +
        "<noscript><p>Each row's own flags and its copy buttons are made by the page's script; without it, "
        "the flags above are every row's, and <code>advisor sweep --format json</code> holds each row's "
        "<code>megatron_args</code>.</p></noscript>"
        '<p>Launch template (<b>copy launch</b> fills it in; <code>advisor-launch torchrun --from FILE</code> '
        f'also installs the hooks):</p><pre id="launch-template">{html.escape(LAUNCH)}</pre>'
        '<div class="controls"><label>Filter rows <input id="filter-text" type="search" '
        'placeholder="for example: 8 fits"></label>'
        f'<label>Verdict <select id="filter-verdict"><option value="">any</option>{options}</select></label></div>'
        + (ranking_note(rows) if kind == "sweep" else "")
        + f'<div class="scroll">{rows_table(rows, columns, codes, nodes, per_node, kind)}</div>'
    )
    return text, shared


def details_section(details: list[LayoutDetail]) -> str:
    one = len(details) == 1  # an estimate's, or a sweep that shows one
    parts = [f'<h2 id="details">{"The layout" if one else "The chosen layouts"} in detail</h2>']
    for i, detail in enumerate(details):
        parts.append(figure_block(figures.stage_memory(detail, f"stages-{i}"),
                             f"{detail.label}: memory per pipeline stage ({detail.model_name} terms stacked) "
                             "against the GPU's memory." + (f" {detail.experts}" if detail.experts else "")))
    moe = ("" if not any(d.experts and d.time_parts for d in details) else
           " An MoE layout's compute includes the TP and CP communication inside its layers (the MoE time model "
           "prices them with the layers: advisor.moe.time.step_parts), so it has no tp or cp comm part; its ep comm "
           "is the EP all-to-all left exposed.")
    parts.append(figure_block(figures.time_parts(details), "Where each step's time goes (the time model's parts)." + moe))
    if details:
        chosen = details[0]
        parts.append(f'<h3 id="schedule-heading">Pipeline schedule{"" if one else " of the first"}: '
                     f'{html.escape(chosen.label)}</h3>')
        parts.append(figure_block(schedule(chosen), "Megatron-LM's order per rank (advisor.schedule): forwards blue, "
                             "backwards green, white the bubble; warm-up on the left, cool-down on the right." + unit_note(chosen)))
    return "".join(parts)


def plan_section(plan: dict) -> tuple[str, LayoutDetail]:
    detail = plan_detail(plan)
    baseline = plan.get("baseline") or {}
    even = baseline.get("stage_predicted_gib") or []
    rows = [{**stage, "even": even[i] if i < len(even) else None} for i, stage in enumerate(plan.get("stages", []))]
    columns = [("stage", "stage", "d"), ("first_layer", "first layer", "d"), ("last_layer", "last layer", "d"),
               ("layers", "layers", "d"), ("tp", "TP", ""), ("dp", "DP", ""), ("in_flight_microbatches", "in flight", ""),
               ("predicted_gib", "predicted GiB", ".2f"), ("even", "even split GiB", ".2f"),
               ("predicted_time_s", "s / microbatch", ".4f")]
    summary = [(key, plan.get(key)) for key in ("peak_predicted_gib", "period_s", "predicted_step_time_s",
                                                "layers_per_stage") if key in plan]
    text = ('<h2 id="plan">The plan</h2>' + key_value_table(summary, "The plan's prediction", "plan-summary")
            + plain_table(rows, columns, f"Stages of the plan ({baseline.get('label', 'no baseline')} beside)",
                          "plan-stages")
            + "<h3>Megatron-LM flags</h3>"
            + f'<pre id="plan-flags">{html.escape(shlex.join(plan.get("megatron_args") or []))}</pre>'
            + '<button type="button" class="copy" data-copy="flags" data-target="plan-flags">copy flags</button>')
    return text, detail
