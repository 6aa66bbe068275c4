"""``advisor report``: one self-contained HTML page for a sweep, an estimate or a plan.

    inputs.py          what a report is made of; reading a saved sweep, estimate or plan
    details.py         one layout in detail: memory per stage, the step's parts, rank times
    figures.py         heatmap, time-memory scatter, stage memory, time parts (matplotlib SVG)
    schedule_figure.py the pipeline schedule per rank (advisor.schedule.timeline)
    profile.py         measured against predicted for profiled runs (advisor.profile_report)
    table.py           the rows as a sortable, filterable HTML table with their flags
    page.py            the sections; static.py the inline style and script

matplotlib loads only here (``advisor sweep`` never imports it).
"""

from __future__ import annotations

import html

from advisor.report.inputs import ReportInput, read_input

__all__ = ["ReportInput", "build_page", "read_input"]

TOP = 3
"""Layouts drawn in detail by default."""


def build_page(report: ReportInput, top: int = TOP) -> str:
    """The whole page as one string."""
    from advisor.report import figures, page
    from advisor.report.details import layout_detail

    sections: list[str] = []
    first = report.document if report.kind == "plan" else report.rows[0]
    shared: dict = {}
    rows_html = ""
    if report.rows:
        _, per_node = page.gpu_facts(first.get("gpu"), None, first.get("gpus_per_node"))
        rows_html, shared = page.rows_section(report.rows, per_node, report.kind)
    sections.append(page.headline(report))
    if report.kind == "sweep":
        memory = report.rows[0].get("memory_gib")
        count, differ = figures.shared_cells(report.rows)
        leanest = (f" {count} cells hold several rows (differing in {', '.join(differ) or 'other options'}): each "
                   "shows the one with the least memory; the rows below have them all." if count else "")
        sections.append('<h2 id="space">The space</h2>' + page.figure_block(
            figures.heatmap(report.rows, memory),
            "Predicted memory of every layout in the rows, as the 4D paper's tables colour them: (TP, CP, PP) down, "
            "MBS across. Green (little memory) to yellow (up to 100%, the GPU's memory): within the limit; "
            "orange-red just over it to dark red at 150% and beyond, each cell with a dot: over the limit; blank where "
            "no row has that layout." + leanest)
            + page.figure_block(figures.scatter(report.rows, top), "Predicted step time against memory of every "
                           "row, coloured by verdict; rings: the best ranked, numbered by rank; the line: the GPU's memory."))
    sections.append(rows_html)
    if report.kind == "plan":
        text, detail = page.plan_section(report.document)
        sections.append(text + page.details_section([detail]))
    else:
        chosen = [row for row in report.rows if row.get("rank")][:top] or report.rows[:1]
        sections.append(page.details_section([layout_detail(row) for row in chosen]))
    if report.profiles:
        sections.append(_profile_section(report))
    # the answer first; the question and its assumptions (about 30 rows) last, folded
    sections.append(page.assumptions_section(page.assumptions(report, first, shared)))
    title = f"advisor report: {report.kind} of {_subject(first)}"
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{_css()}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>"
        '<p id="status" role="status" aria-live="polite" class="note"></p>'
        + "".join(sections)
        + f"<script>{_js()}</script></body></html>\n"
    )


def _subject(first: dict) -> str:
    model = first.get("model")
    name = model.get("name") if isinstance(model, dict) else model
    gpus = first.get("gpus")
    gpu = first.get("gpu")
    return f"{name} on {gpus} GPUs" + (f" ({gpu})" if gpu else "")


def _css() -> str:
    from advisor.report.static import CSS
    from advisor.report.table import verdict_css

    return CSS + verdict_css()


def _js() -> str:
    from advisor.report.static import JS

    return JS


def _profile_section(report: ReportInput) -> str:
    from advisor.report.page import figure_block
    from advisor.report.profile import compare_profiles, layer_figure, stage_figure
    from advisor.report.table import plain_table

    comparison = compare_profiles(report.profiles)
    runs = "".join(f"<li>{html.escape(line)}</li>" for line in comparison.runs)
    columns = [("run", "run", ""), ("rank", "rank", "d"), ("term", "term", ""), ("equation", "equation", ""),
               ("measured_bytes", "measured bytes", ",.0f"), ("estimated_bytes", "predicted bytes", ",.0f"),
               ("ratio", "measured / predicted", ".3f")]
    return ('<h2 id="profile">Measured against predicted</h2>'
            f"<ul>{runs}</ul>"
            + figure_block(stage_figure(comparison), "Per profiled rank: the measured peak beside Eq. 18's prediction.")
            + figure_block(layer_figure(comparison), "Per layer: measured over predicted weights and activations.")
            + plain_table(comparison.stages, columns, "Per stage, every term", "profile-stages-table"))
