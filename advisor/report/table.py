"""The rows as an HTML table: every scalar field of the rows, known ones first and formatted,
any other one (a field a newer advisor adds) as it comes; fields equal in every row move to the
assumptions instead. Each cell keeps its raw value (``data-v``) for sorting, each verdict its
colour and its word, each row its Megatron flags as runs of indices into the flag groups the
page keeps once (``flag_codes``; the page's script rebuilds, shows and copies them)."""

from __future__ import annotations

import functools
import html
import json
import shlex

from advisor.plots import COLOURS
from advisor.render import counted, counts_text, recompute_text
from advisor.report.inputs import memory_share
from advisor.saved_row import is_moe_row

NO_LAUNCH = ("oom", "likely oom")
"""Verdicts (``advisor.verdicts``) whose rows offer no 'copy launch': the estimate says the layout
does not fit, and its launch would only find that out on the cluster (advisor-launch warns on such
a row). 'copy flags' stays, to read or change them."""


def verdict_css() -> str:
    """One rule per verdict: the colours of the terminal's plot (advisor.plots), always with the word."""
    return "".join(f"td.v-{name.replace(' ', '-')}{{background:{colour}}}" for name, colour in COLOURS.items() if name)

KNOWN = {  # key: format, in the columns' order; the headers are ``header``'s
    "rank": "d", "verdict": "", "tp": "d", "cp": "d", "pp": "d", "vpp": "d", "ep": "d", "etp": "d", "mbs": "d",
    "dp": "d", "num_microbatches": "d", "layers_per_stage": "", "recompute": "", "model_states_gib": ".2f",
    "activations_gib": ".2f", "total_gib": ".2f", "usage_gib": ".1f", "margin_gib": "+.1f", "memory_fraction": ".0%",
    "peak_stage": "d", "step_time_s": ".3f", "tflops_per_gpu": ".0f", "mfu": ".1%", "tokens_per_s": ",.0f",
    "days": ".1f", "gpu_hours": ",.0f",
}
LABELS = {"layers_per_stage": "layers per stage", "recompute": "recompute", "memory_fraction": "Eq.18 / mem",
          "peak_stage": "peak stage", "tokens_per_s": "tokens/s", "edp": "EDP", "ep_comm_s": "EP comm s",
          "recompute_modules": "recompute modules", "ranking_tolerance": "ranking tolerance", "gpus": "GPUs",
          "seq_len": "seq len", "global_batch_size": "GBS", "memory_gib": "GPU GiB", "gpus_per_node": "GPUs per node"}
"""Headers of the columns the terminal's sweep table has not (``header`` takes the others' from
it); without one a column is headed by its JSON key ('ep_comm_s', audit). The share of memory is
Eq. 18's here, where the calibrated usage stands beside it (the terminal shows it alone, as 'of mem')."""
HIDDEN = {"megatron_args", "model", "recompute_method", "recompute_num_layers", "calibrated_peak_stage", "stages",
          "time_parts"}
"""Shown elsewhere: the flags per row, the model in the assumptions, recomputation in one cell."""
EXPERT_COLUMNS = ("ep", "etp")
"""A mixture of experts' columns: a dense model's rows all carry 1 (DESIGN.md: dense rows have
ep = etp = 1), two columns of ones on every dense page that say nothing (shots helper)."""


def header(key: str, experts: bool = False) -> str:
    """A column's header: the terminal's sweep table's words where it has the column ('used GiB',
    'TFLOP/s per GPU': ``advisor.sweep_columns``, its header and unit as a caption names them),
    so that a page and a table name a number alike; else ``LABELS``'. MoE rows' memory is the
    analytic model's, not seed 004's Eq. 18 (as in the terminal's table)."""
    text = _terminal_headers(experts).get(key) or LABELS.get(key, key)
    return text.replace("Eq.18", "analytic") if experts else text


@functools.cache
def _terminal_headers(experts: bool) -> dict[str, str]:
    """The terminal's sweep table's column names by key, every column it can show: EP and ETP
    too (a page shows them wherever they vary), its memory total named as for ``experts``."""
    from advisor.sweep_columns import sweep_columns

    every = dict(calibrated=True, timed=True, tokens=True, priced=True)
    return {column.key: column.name
            for column in [*sweep_columns(**every, experts=True), *sweep_columns(**every, experts=experts)]}


def _scalar(value) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def cell_value(row: dict, key: str):
    """The value a column shows: recomputation as one word, a split as runs, options as JSON."""
    value = row.get(key)
    if key == "recompute" and value is not None:
        return recompute_text(row)
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return counts_text(value)
    if isinstance(value, dict):  # options: name=value, what the row changes (recomputation has its column)
        return " ".join(f"{k}={v}" for k, v in sorted(value.items()) if not k.startswith("recompute")) or None
    if isinstance(value, list):
        return json.dumps(value, separators=(",", ":"))
    return value


def split_columns(rows: list[dict]) -> tuple[list[str], dict]:
    """(the columns that vary between rows, known first; the fields every row shares)."""
    keys: dict[str, None] = {}
    for row in rows:
        keys.update(dict.fromkeys(row))
    shared, varying = {}, []
    first = rows[0] if rows else {}
    experts = any(is_moe_row(row) for row in rows)
    for key in keys:
        if key in HIDDEN or key in EXPERT_COLUMNS and not experts and all(row.get(key, 1) == 1 for row in rows):
            continue
        # as shown: a row's options differ only in their recomputation, which has its own column
        shown = cell_value(first, key)
        same = len(rows) > 1 and all(cell_value(row, key) == shown for row in rows)
        if same and key not in KNOWN:
            shared[key] = cell_value(first, key)
        elif key in KNOWN or all(_scalar(cell_value(row, key)) for row in rows):
            varying.append(key)
    order = list(KNOWN)
    varying.sort(key=lambda k: order.index(k) if k in order else len(order))
    return varying, shared


def _format(value, spec: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not spec:  # a field without its own format (ep_comm_s): 4 figures
        spec = ".4g"
    if isinstance(value, bool) or not spec:
        return str(value)
    try:
        return format(value, spec)
    except (TypeError, ValueError):
        return str(value)


def flag_groups(args: list[str]) -> list[tuple[str, ...]]:
    """An argument list as (flag, values...) groups."""
    groups: list[list[str]] = []
    for token in args:
        if token.startswith("--") or not groups:
            groups.append([token])
        else:
            groups[-1].append(token)
    return [tuple(group) for group in groups]


def common_flags(groups: list[list[tuple]]) -> list[tuple[str, ...]]:
    """The flag groups every row carries, in the first row's order."""
    if not groups:
        return []
    common = set(groups[0])
    for mine in groups[1:]:
        common.intersection_update(mine)
    return [group for group in groups[0] if group in common]


def flags_text(groups) -> str:
    """The groups' flags as a shell reads them back (a word like DeepSeek-V3's --moe-layer-freq
    ([0]*3+[1]*58) quoted), as the page's script quotes a row's (``static.JS``'s ``shellLine``)."""
    return " ".join(shlex.join(group) for group in groups)


def flag_codes(groups: list[list[tuple]]) -> tuple[list[tuple[str, ...]], list[str]]:
    """(every distinct flag group, each row's groups as runs of indices into them): a row's whole
    argument list, in its own order, in a few characters. The DeepSeek-V3 sweep's 6,949 rows
    spelled out their own flags in 1.9 MB of a 8.4 MB page; the page's script rebuilds each list
    (``static.JS``'s ``rowArgs``). The first row's groups come first, so a row that shares most
    of them in the same order is one or a few runs ('0-f 1o h-1x': base 36, inclusive)."""
    index: dict[tuple, int] = {}
    codes = []
    for mine in groups:
        numbers = [index.setdefault(group, len(index)) for group in mine]
        runs: list[list[int]] = []
        for number in numbers:
            if runs and number == runs[-1][1] + 1:
                runs[-1][1] = number
            else:
                runs.append([number, number])
        codes.append(" ".join(_base36(a) if a == b else f"{_base36(a)}-{_base36(b)}" for a, b in runs))
    return list(index), codes


def _base36(number: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    text = ""
    while True:
        number, digit = divmod(number, 36)
        text = digits[digit] + text
        if not number:
            return text


def flag_script(dictionary: list[tuple[str, ...]], common: list[tuple]) -> str:
    """The flag groups the rows' codes point into, and which of them every row shares, as JSON
    for the page's script (``<`` escaped: the text sits inside a script element)."""
    where = {group: i for i, group in enumerate(dictionary)}
    data = {"groups": [list(group) for group in dictionary], "common": [where[group] for group in common]}
    text = json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")
    return f'<script type="application/json" id="row-flags">{text}</script>'


def rows_table(rows: list[dict], columns: list[str], codes: list[str], nodes: list[int], gpus_per_node: int,
               kind: str = "sweep") -> str:
    """The table; the last column holds each row's flags as ``codes`` (``flag_codes``), from
    which the page's script rebuilds them, shows the row's own and makes the buttons that copy
    them whole (``kind`` estimate: its one layout, captioned as such). The GPUs per node, and
    the nodes where every row has as many, are the table's, not each row's."""
    # an MoE model's rows, not rows with an 'ep' field: dense rows carry ep = 1 too, and their
    # total is seed 004's Eq. 18 (the terminal's table, advisor.sweep_columns, says so as well)
    experts = any(is_moe_row(row) for row in rows)
    head = "".join(
        f'<th scope="col" data-key="{key}" aria-sort="none"><button type="button">'
        f"{html.escape(header(key, experts))}</button></th>" for key in columns)
    uniform = len(set(nodes)) == 1
    body = []
    for row, code, node_count in zip(rows, codes, nodes):
        cells = [_cell(row, key) for key in columns]
        cells.append(f'<td class="flags" data-f="{code}"{_no_launch(row)}>')
        own_nodes = "" if uniform else f' data-nodes="{node_count}"'
        # HTML lets a cell's and a row's end tags go where the next cell, row or the body's end
        # closes them (WHATWG HTML, 'Optional tags'): the browser builds the same table, and
        # 28 cells x 5 bytes a row are a megabyte of the DeepSeek-V3 page's 6,949 rows.
        body.append(f'<tr{own_nodes}>{"".join(cells)}')
    what = "The estimated layout" if kind == "estimate" else f"{counted(len(rows), 'row')}, best ranked first"
    table_nodes = f' data-nodes="{nodes[0]}"' if uniform and nodes else ""
    return (f'<table id="rows"{table_nodes} data-ppn="{gpus_per_node}"><caption>{what}. Click a header to sort; '
            f'each row\'s flags add to the common flags above.</caption><thead><tr>{head}'
            f'<th scope="col">Megatron flags</th></tr></thead><tbody>{"".join(body)}</tbody></table>')


def _cell(row: dict, key: str) -> str:
    value = cell_value(row, key)
    spec = KNOWN.get(key, "") if not isinstance(value, str) else ""
    shown = _format(value, spec)
    raw = "" if value is None else format(value, ".6g") if isinstance(value, float) else str(value)
    # The raw value only where it differs from the text (the script sorts a '-' as blank): the
    # 405B sweep has 2,000 rows, DeepSeek-V3's 6,949.
    data = "" if raw == shown or value is None else f' data-v="{html.escape(raw, quote=True)}"'
    if key == "verdict":
        return f'<td{data} class="verdict v-{str(value).replace(" ", "-")}">{html.escape(shown)}'
    return f"<td{data}>{html.escape(shown)}"


def _no_launch(row: dict) -> str:
    """Why the row offers no 'copy launch' (the script disables its button, this its title),
    where its verdict says the layout does not fit (``NO_LAUNCH``); nothing elsewhere."""
    verdict = row.get("verdict")
    if verdict not in NO_LAUNCH:
        return ""
    share = memory_share(row)
    predicted = f", {share:.0%} of GPU memory predicted" if share is not None else ""
    why = f"No launch: the layout {'likely ' if verdict == 'likely oom' else ''}does not fit ({verdict}{predicted})"
    return f' data-no="{html.escape(why, quote=True)}"'


def key_value_table(pairs: list[tuple[str, object]], caption: str, table_id: str) -> str:
    """A two-column table of settings, each name a row header."""
    body = "".join(f'<tr><th scope="row">{html.escape(str(name))}</th><td>{html.escape(_text(value))}</td></tr>'
                   for name, value in pairs)
    return f'<table id="{table_id}" class="kv"><caption>{html.escape(caption)}</caption><tbody>{body}</tbody></table>'


def _text(value) -> str:
    """A setting as text: an object (a GPU preset, the training options) as readable 'key: value'
    lines, nested keys joined by dots (shown one a line: table.kv td keeps the line breaks)."""
    if isinstance(value, dict):
        return "\n".join(_lines(value, ""))
    if isinstance(value, (list, tuple)):
        if not any(isinstance(v, (dict, list, tuple)) or isinstance(v, str) and len(v) > 40 for v in value):
            return ", ".join(_text(v) for v in value)  # short items (a split, the fitted names) on one line
        return "\n".join(_text(v) for v in value)
    if isinstance(value, float):
        return format(value, ".6g")
    return "-" if value is None else str(value)


def _lines(value: dict, prefix: str) -> list[str]:
    lines = []
    for key in sorted(value):
        name, item = f"{prefix}{key}", value[key]
        if isinstance(item, dict) and item:
            lines += _lines(item, f"{name}.")
        elif isinstance(item, (list, tuple)) and any(isinstance(v, (dict, list, tuple)) or isinstance(v, str)
                                                      and len(v) > 40 for v in item):
            lines.append(f"{name}:")  # long texts (a preset's sources) each on a line of their own
            lines += [f"  - {json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v}" for v in item]
        else:
            lines.append(f"{name}: {_text(item) if not isinstance(item, str) else item}")
    return lines


def plain_table(rows: list[dict], columns: list[tuple[str, str, str]], caption: str, table_id: str) -> str:
    """A small table of dicts: columns are (key, header, format)."""
    head = "".join(f'<th scope="col">{html.escape(header)}</th>' for _, header, _ in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_format(row.get(key), spec))}</td>" for key, _, spec in columns)
                   + "</tr>" for row in rows)
    return (f'<table id="{table_id}"><caption>{html.escape(caption)}</caption><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table>")
