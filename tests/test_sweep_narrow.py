"""The sweep table at 80 columns and narrower keeps what an engineer choosing a layout reads: the
layout never dropped (at 30 columns the table dropped TP, CP and PP), DP (a degree), the verdict
and what the ranking orders by (tests/test_narrow_columns.py), and a PP row's uneven split, in
full after its PP where that fits and as a mark where not; the memory in GiB, which the margin
says against the limit, goes first. At 100 columns and more the columns shown before stay."""

from __future__ import annotations

import pytest
from table_text import read_table

from advisor.sweep_columns import sweep_columns
from advisor.render import Column, Fold, to_table

DEFAULT = ("sweep", "--gpus", 64, "--gpu", "h100-80gb")  # the calibrated model and the time model
PAPER = ("sweep", "--gpus", 64, "--mem", 40)  # the paper's 80% rule, no time model
MOE = ("sweep", "--gpus", 64, "--gpu", "h100-80gb", "--model", "mixtral-8x7b")


def _table(text: str) -> tuple[list[str], list[dict[str, str]], str]:
    """The headers, the rows' cells by header, and the caption joined into one line."""
    table = read_table(text)
    return table.headers, table.records(), table.caption


def _show(advisor, monkeypatch, columns: int, *args):
    monkeypatch.setenv("COLUMNS", str(columns))
    text = advisor(*args).stdout
    assert max(len(line.encode()) for line in text.splitlines()) <= columns  # ASCII off a terminal
    return _table(text)


def _uneven(row: dict) -> bool:
    return len(set(row["layers_per_stage"])) > 1


def test_80_columns_keep_dp_and_mark_the_uneven_splits(advisor, monkeypatch):
    headers, cells, caption = _show(advisor, monkeypatch, 80, *DEFAULT)
    assert headers == ["rank", "TP", "CP", "PP", "VPP", "MBS", "DP", "recompute", "verdict", "TFLOP/s per GPU"]
    assert ("not shown to fit 80 columns: m, layers, states GiB, act. GiB, Eq.18 GiB, used GiB, margin GiB, MFU, "
            "step s") in caption
    rows = advisor.json(*DEFAULT)[:len(cells)]
    assert len(cells) == 30 and any(map(_uneven, rows)) and not all(map(_uneven, rows))
    for row, shown in zip(rows, cells):
        assert shown["rank"] == str(row["rank"])
        assert int(shown["DP"]) == 64 // (row["tp"] * row["cp"] * row["pp"])
        assert shown["PP"] == str(row["pp"]) + ("*" if _uneven(row) else "")
    assert "PP* marks an uneven split" in caption


def test_80_columns_of_the_paper_keep_dp_the_share_of_memory_and_mark_the_split(advisor, monkeypatch):
    headers, cells, caption = _show(advisor, monkeypatch, 80, *PAPER, "--top", 8)
    # the total, left out before the parts had to go too, fits again once they are gone
    assert headers == ["rank", "TP", "CP", "PP", "VPP", "MBS", "DP", "recompute", "Eq.18 GiB", "of mem", "verdict"]
    assert "not shown to fit 80 columns: m, layers, states GiB, act. GiB (--wide shows them)" in caption
    rows = advisor.json(*PAPER)[:8]
    assert any(map(_uneven, rows)) and {row["pp"] for row in rows if not _uneven(row)} == {1}
    assert [cell["PP"] for cell in cells] == [f"{row['pp']}{'*' if _uneven(row) else ''}" for row in rows]
    assert [cell["of mem"] for cell in cells] == [f"{row['memory_fraction']:.0%}" for row in rows]


def test_an_uneven_split_follows_its_pp_where_the_layers_column_does_not_fit(advisor, monkeypatch):
    headers, cells, caption = _show(advisor, monkeypatch, 81, *PAPER, "--top", 8)
    assert "layers" not in headers and "of mem" in headers
    assert "an uneven split's layers per stage follow its PP" in caption
    for row, shown in zip(advisor.json(*PAPER)[:8], cells):
        stages = row["layers_per_stage"]
        expected = f"{row['pp']} ({','.join(map(str, stages))})" if _uneven(row) else str(row["pp"])
        assert shown["PP"] == expected


@pytest.mark.parametrize("columns", [100, 120])
def test_100_columns_and_more_keep_what_they_showed(advisor, monkeypatch, columns):
    """The columns shown before where they all fit: at 100 columns the default command's eight best
    rows show everything but the parts and the secondary times; at 120 its thirty add the analytic
    total and the step time, and the paper's add the memory's parts."""
    top = ("--top", 8) if columns == 100 else ()
    headers, _, _ = _show(advisor, monkeypatch, columns, *DEFAULT, *top)
    shown = ["rank", "TP", "CP", "PP", "VPP", "MBS", "DP", "layers", "recompute", "used GiB", "margin GiB", "verdict",
             "TFLOP/s per GPU"]
    assert headers == (shown if columns == 100 else shown[:9] + ["Eq.18 GiB"] + shown[9:] + ["step s"])
    headers, _, _ = _show(advisor, monkeypatch, columns, *PAPER)
    assert headers == ["rank", "TP", "CP", "PP", "VPP", "MBS", "DP"] + ([] if columns == 100 else ["m"]) \
        + ["layers", "recompute"] + ([] if columns == 100 else ["states GiB", "act. GiB"]) \
        + ["Eq.18 GiB", "of mem", "verdict"]


@pytest.mark.parametrize("args, layout", [(DEFAULT, ["TP", "CP", "PP", "VPP", "MBS"]),
                                          (PAPER, ["TP", "CP", "PP", "VPP", "MBS"]),
                                          (MOE, ["TP", "CP", "PP", "VPP", "EP", "ETP", "MBS"])],
                         ids=["calibrated", "paper", "moe"])
@pytest.mark.parametrize("columns", [30, 40, 60])
def test_the_layout_is_never_left_out(advisor, monkeypatch, args, layout, columns):
    monkeypatch.setenv("COLUMNS", str(columns))
    text = advisor(*args, "--top", 5).stdout
    assert max(len(line) for line in text.splitlines()) <= columns
    assert "…" not in text  # rich's squeeze would cut the headers
    headers, cells, caption = _table(text)
    assert [h for h in headers if h in layout] == layout
    rows = advisor.json(*args)[:5]
    for row, shown in zip(rows, cells):
        assert [shown[h].rstrip("*").split(" ")[0] for h in layout] == [str(row[h.lower()]) for h in layout]
    hidden = caption[caption.index("not shown to fit"):caption.index("(--wide")].partition(":")[2]
    assert hidden and not {h.strip() for h in hidden.split(",")} & set(layout)


@pytest.mark.parametrize("args, columns", [(DEFAULT, 20), (DEFAULT, 22), (MOE, 25), (MOE, 29)])
def test_below_thirty_columns_the_rank_goes_before_a_header_is_cut(advisor, monkeypatch, args, columns):
    """Where the layout alone fills the width without padding, the rank (no part of the layout)
    is left out rather than rich cutting the layout's headers to '…' ('|r…|…|M…|' at 20)."""
    monkeypatch.setenv("COLUMNS", str(columns))
    text = advisor(*args, "--top", 3).stdout
    assert "…" not in text and "|TP|" in text and "rank" not in text.split("|TP|")[0][-20:]
    assert max(len(line) for line in text.splitlines()) <= columns


def test_60_columns_keep_what_the_ranking_orders_by(advisor, monkeypatch):
    """A table titled 'ranked by throughput' without TFLOP/s showed a ranking without its reason
    (audit): at 60 columns the recomputation goes before TFLOP/s and DP, and the caption says so."""
    headers, _, caption = _show(advisor, monkeypatch, 60, *DEFAULT, "--top", 8)
    assert headers == ["rank", "TP", "CP", "PP", "VPP", "MBS", "DP", "verdict", "TFLOP/s per GPU"]
    assert "recompute" in caption


# --- the renderer: keep, fold and mark, without the CLI ---------------------------------------

def _rows():
    return [{"name": "a", "pp": 1, "split": "", "note": "x" * 30},
            {"name": "b", "pp": 16, "split": "7,8x14,7", "note": "y"}]


FOLD = Fold("pp", lambda row: row["split"], "folded", drop=1, mark="*", mark_note="marked")
COLUMNS = [Column("name", "name"), Column("pp", "PP", keep=True),
           Column("split", "layers per stage", drop=2, fold=FOLD),
           Column("note", "note", justify="left", drop=3)]


def test_a_fold_stands_after_its_column_then_gives_way_to_its_mark():
    wide = to_table(_rows(), COLUMNS, width=200)
    assert "layers per stage" in wide and "folded" not in wide and "marked" not in wide
    fitted = to_table(_rows(), COLUMNS, width=40)
    assert "layers per stage" in fitted and "|  1 |" in fitted  # the column fits: nothing folds into PP
    folded = to_table(_rows(), COLUMNS, width=30)
    assert "|  1            |" in folded and "| 16 (7,8x14,7) |" in folded  # the numbers in line
    assert "not shown to fit 30 columns: layers per stage, note (--wide shows them); folded" \
        in " ".join(folded.split())
    marked = to_table(_rows(), COLUMNS, width=16)
    assert "|  1  |" in marked and "| 16* |" in marked
    assert "(--wide shows them); marked" in " ".join(marked.split()) and "folded" not in marked
    for text, columns in ((fitted, 40), (folded, 30), (marked, 16)):
        assert max(len(line) for line in text.splitlines()) <= columns


def test_a_fold_with_nothing_to_say_is_not_announced():
    """Rows whose splits are all even fold nothing: the caption does not explain a fold that is not there."""
    even = [{**row, "split": ""} for row in _rows()]
    for width in (30, 16):
        text = " ".join(to_table(even, COLUMNS, width=width).split())
        assert "not shown to fit" in text and "folded" not in text and "marked" not in text and "*" not in text


def test_columns_to_keep_lose_their_padding_before_they_are_left_out():
    columns = [Column("name", "name")] + [Column(key, key.upper(), keep=True) for key in ("tp", "cp", "pp", "vpp")]
    text = to_table([{"name": "row", "tp": 2, "cp": 1, "pp": 16, "vpp": 1}], columns, width=22)
    assert "|name|TP|CP|PP|VPP|" in text and "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 22


def test_the_first_column_and_the_order_of_the_others_stay_as_before():
    """Tables without keep or fold (the estimate's, profile show's) are fitted as before: highest
    drop first, ties the rightmost, never the first column."""
    columns = [Column("a", "aaaa", drop=5), Column("b", "bbbb", drop=1), Column("c", "cccc", drop=1),
               Column("d", "dddd", drop=-1)]
    text = to_table([{"a": 1, "b": 2, "c": 3, "d": 4}], columns, width=15)
    assert "aaaa" in text and "dddd" in text and "not shown to fit 15 columns: bbbb, cccc" in " ".join(text.split())


def test_sweep_columns_rank_the_layout_above_everything_else():
    for experts in (False, True):
        columns = sweep_columns(calibrated=True, timed=True, tokens=True, priced=True, experts=experts,
                                rank_by="throughput")
        kept = [c.header for c in columns if c.keep]
        assert kept == ["TP", "CP", "PP", "VPP"] + (["EP", "ETP"] if experts else []) + ["MBS"]
        drop = {c.name: c.drop for c in columns}
        assert drop["used GiB"] > drop["layers"] > drop["margin GiB"] > drop["recompute"] > drop["DP"] \
            > drop["cost $"] > drop["TFLOP/s per GPU"] > drop["verdict"]
        assert drop["days"] == drop["cost $"]
        memory = {c.name: c.drop for c in sweep_columns(calibrated=True, timed=True, rank_by="memory")}
        assert memory["TFLOP/s per GPU"] > memory["DP"] > memory["margin GiB"] > memory["verdict"]


@pytest.mark.parametrize("args", [DEFAULT + ("--tokens", "1T", "--gpu-hour-price", 2), PAPER, MOE],
                         ids=["calibrated", "paper", "moe"])
def test_every_memory_and_tflops_column_says_its_unit_at_every_width(advisor, monkeypatch, args):
    """At 100 columns with --tokens the margin was a bare '+22.2' (the usage column, the one that
    said 'GiB', was left out) and TFLOP/s said not whether per GPU or in all: each column says its
    own unit under its header, the same at every width; only which columns are shown changes."""
    seen: dict[str, str] = {}
    for columns in (60, 80, 100, 140, 300):
        monkeypatch.setenv("COLUMNS", str(columns))
        for header in read_table(advisor(*args, "--top", 5).stdout).columns:
            assert seen.setdefault(header.split(" ")[0], header) == header, (columns, header)
    memory = {name: header for name, header in seen.items() if name in ("states", "act.", "Eq.18", "analytic", "used",
                                                                         "margin")}
    assert len(memory) == (5 if "--gpu" in args else 3) and all(h.endswith(" GiB") for h in memory.values()), seen
    assert "GiB" not in seen and seen.get("TFLOP/s", "TFLOP/s per GPU") == "TFLOP/s per GPU"
