"""``python -m tables.seed004``: end to end, and its numbers recomputed independently.

The independent sources: the paper's cells (tables/data/seed004_tables.csv, read here with
the csv module), Eq. 18 of seed 004 written out below from the paper and the models'
Hugging Face config.json, and ``advisor sweep --all --format json`` through the real CLI.
"""

import csv
import json
import shutil
from functools import lru_cache
from statistics import fmean

import pytest

from conftest import ROOT, Invoker
from tables.seed004 import heatmap, report
from tables.seed004.__main__ import main
from tables.seed004.results import analyse

DATA = ROOT / "tables" / "data"
PAPER_SPACE = ("--split", "even", "--vpp", "1", "--recompute", "none")  # the paper's space
MEMORY_GIB = {"A100-40GB": 40, "H100-94GB": 94}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TABLES = (2, 3, 4, 5, 6, 7, 8, 9, 10, 11)

# Hugging Face config.json: hidden, layers, heads, KV heads, FFN, vocabulary.
MODELS = {
    "llama3.1-8b": (4096, 32, 32, 8, 14336, 128256),
    "llama3.1-70b": (8192, 80, 64, 8, 28672, 128256),
}


def eq18_gib(model: str, seq_len: int, tp: int, cp: int, pp: int, mbs: int, gpus: int) -> float:
    """Seed 004, Eq. 18 (Eq. 10 + Eq. 17) for the first pipeline stage. With PP = 1 the one
    stage also holds the LM head (hv/t) and the final norm (h): Eq. 10 counts the first stage, and
    with one stage it is also the last."""
    h, L, a, k, ffn, v = MODELS[model]
    t, c, p, b, s = tp, cp, pp, mbs, seq_len
    d = gpus // (t * c * p)
    parameters = h * v / t + 2 * (L / p) * h**2 * ((1 + k / a + 1.5 * ffn / h) / t + 1 / h)
    if p == 1:
        parameters += h * v / t + h
    states = (6 + 12 / (d * c)) * parameters
    activations = s * b * h / (t * c) * ((12 + 4 * k / a + 8 * ffn / h) * L + 8 * p + (4 * (1 + v / h) if p == 1 else 0))
    return (states + activations) / 2**30


def paper_rows(kind: str) -> list[dict]:
    with open(DATA / "seed004_tables.csv", newline="") as handle:
        return [r for r in csv.DictReader(handle) if r["kind"] == kind and r["value"] != "-"]


def layout(row: dict) -> tuple:
    return tuple(int(row[k]) for k in ("tp", "cp", "pp", "mbs"))


def cell_key(row: dict) -> tuple:
    return (int(row["table"]), layout(row), int(row["gpus"]))


@lru_cache(maxsize=None)
def sweep_json(invoke: Invoker, model: str, seq_len: str, gpus: str, memory: int) -> dict:
    rows = invoke.json("sweep", "--all", *PAPER_SPACE, "--model", model, "--seq-len", seq_len, "--gpus", gpus,
                       "--mem", memory)
    return {(r["tp"], r["cp"], r["pp"], r["mbs"]): r for r in rows}


def swept(invoke: Invoker, row: dict) -> dict:
    """The sweep row (verdict, rank, total) of a paper cell's layout, from the CLI's JSON."""
    return sweep_json(invoke, row["model"], row["seq_len"], row["gpus"], MEMORY_GIB[row["gpu"]])[layout(row)]


@pytest.fixture(scope="module")
def cli() -> Invoker:
    return Invoker()


@pytest.fixture(scope="module")
def results():
    return analyse(with_validation=True)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """One end-to-end run into a temporary folder, with a copy of the README."""
    base = tmp_path_factory.mktemp("seed004")
    readme = base / "README.md"
    shutil.copy(ROOT / "tables" / "README.md", readme)
    readme.write_text(readme.read_text().replace(report.END, "stale text\n" + report.END))
    result = Invoker(main)("--out", base / "out", "--readme", readme)
    return base, result


# --- end to end ----------------------------------------------------------------------------


def test_the_command_writes_every_artefact(run_dir):
    base, result = run_dir
    out = base / "out"
    expected = {f"table{n:02d}.{ext}" for n in TABLES for ext in ("md", "csv", "png")} | {
        "RESULTS.md", "summary.json", "throughput_scatter.png"}
    assert {p.name for p in out.iterdir()} == expected
    assert f"{len(expected)} files in {out}" in result.stdout
    for png in out.glob("*.png"):
        assert png.read_bytes()[:8] == PNG_SIGNATURE, png


def test_each_csv_has_one_row_per_printed_cell(run_dir):
    out = run_dir[0] / "out"
    for n in TABLES:
        printed = [r for r in paper_rows("estimate") + paper_rows("measured_tflops") if int(r["table"]) == n]
        with open(out / f"table{n:02d}.csv", newline="") as handle:
            written = list(csv.DictReader(handle))
        assert [cell_key(r) for r in written] == [cell_key(r) for r in printed]


def test_the_readme_section_is_rewritten_with_the_results(run_dir, results):
    base, _ = run_dir
    text = (base / "README.md").read_text()
    assert "stale text" not in text
    assert report.results_markdown(results) in text
    assert (base / "out" / "RESULTS.md").read_text() in text
    assert text.startswith("# ")  # the hand-written part is kept


def test_heatmaps_are_coloured_the_papers_way(run_dir):
    """Table 7 has fits, tight and oom cells: each colour is drawn."""
    import numpy as np
    from matplotlib.colors import to_rgb
    from matplotlib.image import imread

    pixels = imread(run_dir[0] / "out" / "table07.png")[..., :3]
    for verdict in ("fits", "tight", "oom"):
        colour = np.array(to_rgb(heatmap.COLOURS[verdict]))
        assert (np.abs(pixels - colour).max(axis=-1) < 0.02).sum() > 1000, verdict


def test_heatmaps_frame_exactly_the_misprints(results):
    for table in results.estimated:
        framed = {(table.paper.number, *key) for key, cell in heatmap.estimated_cells(table).items() if cell.flagged}
        assert framed == {key for key in results.found_misprints if key[0] == table.paper.number}


# --- the misprints -------------------------------------------------------------------------


def test_ours_is_eq18_in_every_printed_cell(results):
    for table in results.estimated:
        p = table.paper
        for cell in table.cells:
            expected = eq18_gib(p.model, p.seq_len, *cell.paper.layout, cell.paper.gpus)
            assert cell.ours_gib == pytest.approx(expected, rel=1e-12), (p.number, cell.paper)


def test_the_misprints_found_are_the_cells_that_disagree_with_eq18(results):
    disagree = {
        cell_key(r)
        for r in paper_rows("estimate")
        if abs(eq18_gib(r["model"], int(r["seq_len"]), *layout(r), int(r["gpus"])) - float(r["value"])) > 0.01
    }
    with open(DATA / "seed004_misprints.csv", newline="") as handle:
        listed = {cell_key(r) for r in csv.DictReader(handle)}
    assert len(disagree) == 5
    assert results.found_misprints == disagree == listed
    assert not results.listed_but_agreeing and not results.found_without_evidence


# --- the 80% rule --------------------------------------------------------------------------


def test_the_confusion_table_adds_up_to_the_measured_runs(run_dir):
    runs = paper_rows("measured_tflops")
    assert len(runs) == 454  # the paper's count (abstract), from the CSV
    rule = json.loads((run_dir[0] / "out" / "summary.json").read_text())["rule"]
    counts = rule["counts"]
    assert rule["runs"] == sum(n for row in counts.values() for n in row.values()) == len(runs)
    assert sum(row["OOM"] for row in counts.values()) == sum(r["value"] == "OOM" for r in runs)


def test_the_confusion_table_matches_the_sweep_json(cli, results):
    expected = {}
    for r in paper_rows("measured_tflops"):
        key = (swept(cli, r)["verdict"], "OOM" if r["value"] == "OOM" else "ran")
        expected[key] = expected.get(key, 0) + 1
    assert {k: n for k, n in results.rule.counts.items() if n} == expected
    exceptions = {k: n for k, n in expected.items() if k in (("fits", "OOM"), ("oom", "ran"))}
    assert len(results.rule.fits_that_oomed) + len(results.rule.oom_that_ran) == sum(exceptions.values())
    tight = expected.get(("tight", "ran"), 0) + expected.get(("tight", "OOM"), 0)
    assert results.rule.tight_ran_fraction == expected.get(("tight", "ran"), 0) / tight


# --- the ranking ---------------------------------------------------------------------------


def test_the_ranking_figures_recomputed_from_the_csv_and_the_sweep_json(cli, results):
    columns: dict[tuple, list[dict]] = {}
    for r in paper_rows("measured_tflops"):
        columns.setdefault((int(r["table"]), int(r["gpus"])), []).append(r)
    fractions = {}
    for key, rows in columns.items():
        ranked = [r for r in rows if swept(cli, r)["rank"] is not None]
        measured = [0.0 if r["value"] == "OOM" else float(r["value"]) for r in rows]
        if not ranked or max(measured) == 0:
            continue
        pick = min(ranked, key=lambda r: swept(cli, r)["rank"])
        fractions[key] = (0.0 if pick["value"] == "OOM" else float(pick["value"])) / max(measured)
    ours = {(c.table.number, c.gpus): c.fraction for c in results.ranking.scored}
    assert ours == pytest.approx(fractions)
    assert results.ranking.mean == pytest.approx(fmean(fractions.values()))
    assert results.ranking.minimum == pytest.approx(min(fractions.values()))
    assert len(results.ranking.columns) == len(columns) == 24


# --- the committed README ------------------------------------------------------------------


def test_the_committed_readme_quotes_what_the_code_computes_now(results):
    """Fails after an estimator change until `python -m tables.seed004` is run again."""
    text = (ROOT / "tables" / "README.md").read_text()
    committed = text[text.index(report.BEGIN): text.index(report.END) + len(report.END)] + "\n"
    assert committed == report.results_markdown(results)


# --- bad input -----------------------------------------------------------------------------


def test_a_readme_without_markers_is_an_error_and_nothing_is_written(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# no markers\n")
    line = Invoker(main).error("--out", tmp_path / "out", "--readme", readme)
    assert "no results markers" in line
    assert not (tmp_path / "out").exists()
    assert readme.read_text() == "# no markers\n"


def test_an_out_path_that_is_a_file_is_an_error(tmp_path):
    (tmp_path / "out").write_text("")
    line = Invoker(main).error("--out", tmp_path / "out", "--no-readme")
    assert "--out" in line and "is a file" in line


def test_a_missing_readme_is_an_error(tmp_path):
    line = Invoker(main).error("--out", tmp_path / "out", "--readme", tmp_path / "missing.md")
    assert "missing.md" in line and "does not exist" in line


def test_another_out_leaves_the_committed_readme_alone(tmp_path, results, monkeypatch):
    """`python -m tables.seed004 --out DIR` used to rewrite tables/README.md too (issue 17)."""
    import tables.seed004.__main__ as command

    monkeypatch.setattr(command, "analyse", lambda with_validation: results)
    written = []
    monkeypatch.setattr(command, "atomic_write_text", lambda path, text: written.append(str(path)))
    # The figures are recorded as written, not drawn: run_dir's run drew them (8 s of CPU here)
    # and the tests above check them; what this test checks is where each file goes.
    monkeypatch.setattr(command.heatmap, "estimated_heatmap", lambda table, path: written.append(str(path)))
    monkeypatch.setattr(command.heatmap, "measured_heatmap", lambda table, columns, path: written.append(str(path)))
    monkeypatch.setattr(command.validation_report, "scatter", lambda validation, path: written.append(str(path)))
    result = Invoker(main)("--out", tmp_path / "out")
    assert written and all(path.startswith(str(tmp_path / "out")) for path in written)
    assert sum(path.endswith(".png") for path in written) == len(TABLES) + 1  # a heatmap a table, the scatter
    assert "rewritten" not in result.stdout
