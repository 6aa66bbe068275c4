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


# Every name that says a format the command does not write is refused, by one check
# (``refuse_named``): JSON under x.html was written, while JSON under x.csv was refused.
@pytest.mark.parametrize("args, name, written, wanted", [
    (("--format", "json"), "x.html", "JSON", "x.json"),
    (("--format", "json"), "x.HTM", "JSON", "x.json"),
    (("--format", "csv"), "x.yaml", "CSV", "x.csv"),
    ((), "x.yml", "a table", "x.txt"),
    ((), "x.png", "a table", "x.txt"),
])
def test_sweep_and_estimate_refuse_every_other_format(advisor, tmp_path, args, name, written, wanted):
    path = tmp_path / name
    for command in (SWEEP, ESTIMATE):
        fmt = args[1] if args else "table"
        line = advisor.error(*command, *args, "-o", path)
        assert line.startswith(f"Error: --format {fmt} would write {written} into {path}: "
                               f"name the file {tmp_path / wanted}")
    assert list(tmp_path.iterdir()) == []


RECOMMEND = ("recommend", "--model", "llama3.1-8b", "--gpus", "64", "--tp", "2", "--pp", "4")


@pytest.mark.parametrize("name", ["plan.csv", "plan.html", "plan.YAML", "plan.yml", "plan.png"])
def test_one_document_commands_refuse_every_other_format(advisor, tmp_path, name):
    path = tmp_path / name
    line = advisor.error(*RECOMMEND, "-o", path)
    assert line.startswith(f"Error: advisor recommend would write JSON into {path}: "
                           f"name the file {tmp_path / 'plan.json'}")
    assert list(tmp_path.iterdir()) == []


def test_html_refusal_points_at_the_page(advisor, tmp_path):
    path = tmp_path / "x.html"
    assert advisor.error(*SWEEP, "--format", "json", "-o", path).endswith("or use 'advisor report' for a page")


def test_names_of_no_format_are_written(advisor, tmp_path):
    path = tmp_path / "plan.out"
    advisor(*RECOMMEND, "-o", path)
    assert json.loads(path.read_text())["schema"] == "megatron-4d-advisor/plan"
