"""-o FILE ending in .json or .csv, without --format, writes that format (``file_format`` in
advisor.cli.options): 'advisor sweep -o sweep.json' wrote the table into sweep.json, and
'advisor-launch --from sweep.json' then failed on malformed JSON. A --format given that differs
from the name's is refused before any work; '-o -' and other names keep --format's default."""

import csv
import io
import json

import pytest

SWEEP = ("sweep", "--gpus", "8", "--gpu", "h100-80gb", "--top", "5")
ESTIMATE = ("estimate", "--gpus", "8", "--gpu", "h100-80gb", "--tp", "2", "--pp", "1", "--mbs", "1")


def test_sweep_json_name_writes_json(advisor, tmp_path):
    named, given = tmp_path / "x.json", tmp_path / "given.out"
    advisor(*SWEEP, "-o", named)
    advisor(*SWEEP, "--format", "json", "-o", given)
    rows = json.loads(named.read_text())
    assert rows and isinstance(rows, list)
    assert named.read_text() == given.read_text()


def test_suffix_case_is_ignored(advisor, tmp_path):
    upper = tmp_path / "X.JSON"
    advisor("gpus", "-o", upper)
    assert json.loads(upper.read_text()) == advisor.json("gpus")


def test_estimate_csv_name_writes_csv(advisor, tmp_path):
    named = tmp_path / "x.csv"
    advisor(*ESTIMATE, "-o", named)
    given = advisor(*ESTIMATE, "--format", "csv").stdout
    header = next(csv.reader(io.StringIO(named.read_text())))
    assert header[:3] == ["stage", "position", "layers"]
    assert named.read_text() == given


@pytest.mark.parametrize("fmt, name, written, wanted", [
    ("table", "x.json", "a table", "json"),
    ("csv", "x.json", "CSV", "json"),
    ("json", "x.csv", "JSON", "csv"),
    ("table", "x.CSV", "a table", "csv"),
])
def test_format_against_the_name_is_refused(advisor, tmp_path, fmt, name, written, wanted):
    path = tmp_path / name
    line = advisor.error(*SWEEP, "--format", fmt, "-o", path)
    assert line == (f"Error: --format {fmt} would write {written} into {path}: give --format {wanted}, "
                    "or another file name")
    assert not path.exists()


def test_explicit_matching_format_is_kept(advisor, tmp_path):
    path = tmp_path / "x.csv"
    advisor("models", "--format", "csv", "-o", path)
    assert path.read_text() == advisor("models", "--format", "csv").stdout


def test_other_names_keep_the_table(advisor, tmp_path):
    path = tmp_path / "x.txt"
    advisor(*SWEEP, "-o", path)
    text = path.read_text()
    assert text == advisor(*SWEEP).stdout
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


def test_stdout_keeps_the_table(advisor):
    assert advisor("models", "-o", "-").stdout == advisor("models").stdout


def test_help_says_so(advisor):
    assert "ending in .json or .csv" in " ".join(advisor("sweep", "--help").stdout.split())
