"""What a newcomer meets first: ``advisor models`` in CSV carries what its JSON does (the MoE
fields were dropped: the CSV header was the first, dense, row's keys), its table says what its
headers mean and how wide the experts are, ``recommend -o plan.csv`` is refused rather than
given JSON, and a bare ``advisor`` (or command group) prints its help with exit status 0."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner
from conftest import ROOT, Invoker
from table_text import read_table

from advisor.cli import AdvisorGroup, cli

RECOMMEND = ("recommend", "--model", "llama3.1-8b", "--gpus", 64, "--tp", 2, "--pp", 4, "--gpu", "h100-80gb")


# --- 1. models --format csv carries every field of --format json -----------------------------


def _flattened(row: dict) -> dict:
    """A JSON row with each nested object's fields as dotted keys (mla.kv_lora_rank)."""
    flat = {}
    for key, value in row.items():
        if isinstance(value, dict):
            flat.update({f"{key}.{inner}": item for inner, item in value.items()})
        else:
            flat[key] = value
    return flat


def _cell(text: str):
    """A CSV cell read back: empty is None, True/False bools, then int, float, else the text."""
    if text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


@pytest.fixture(scope="module")
def both():
    invoke = Invoker()
    rows = json.loads(invoke("models", "--format", "json").stdout)
    table = list(csv.reader(io.StringIO(invoke("models", "--format", "csv").stdout)))
    return rows, table[0], [dict(zip(table[0], line, strict=True)) for line in table[1:]]


def test_every_json_field_is_a_csv_column_with_the_same_value(both):
    """Each JSON key is a CSV column, or (an object: MLA, YaRN) its dotted columns, empty where
    the JSON has null; the values read back equal, type and all."""
    rows, header, lines = both
    assert [line["name"] for line in lines] == [row["name"] for row in rows]
    for row, line in zip(rows, lines):
        covered = set()
        for key, value in row.items():
            columns = [key] if key in header else [column for column in header if column.startswith(key + ".")]
            assert columns, f"{row['name']}: {key} missing from the CSV"
            covered.update(columns)
            wanted = _flattened({key: value}) if isinstance(value, dict) else dict.fromkeys(columns, value)
            assert set(wanted) == set(columns), f"{row['name']} {key}: {sorted(columns)}"
            for column, value in wanted.items():
                # a list (load_balancing) as its items space-separated, Megatron's nargs spelling
                cell = [_cell(item) for item in line[column].split()] if isinstance(value, list) \
                    else _cell(line[column])
                assert cell == value and type(cell) is type(value), \
                    f"{row['name']} {column}: CSV {cell!r}, JSON {value!r}"
        # a field the model does not have (a dense model's MoE fields) is an empty cell
        assert [key for key in header if key not in covered and line[key] != ""] == [], row["name"]


def test_the_moe_presets_carry_their_moe_fields_in_csv(both):
    _, _, lines = both
    by_name = {line["name"]: line for line in lines}
    assert by_name["mixtral-8x7b"]["num_experts"] == "8" and by_name["mixtral-8x7b"]["moe_router_topk"] == "2"
    assert by_name["qwen3-30b-a3b"]["moe_ffn_hidden_size"] == "768"
    deepseek = by_name["deepseek-v3"]
    assert (deepseek["shared_expert_size"], deepseek["first_dense_layers"]) == ("2048", "3")
    assert (deepseek["mla.q_lora_rank"], deepseek["mla.kv_lora_rank"]) == ("1536", "512")
    assert deepseek["yarn.factor"] == "40.0"
    # its balancing: the sequence-wise loss beside the expert bias (config.json seq_aux, aux_loss_alpha)
    assert (deepseek["load_balancing"], deepseek["aux_loss_coeff"], deepseek["expert_bias"]) == (
        "seq_aux_loss", "0.001", "True")
    assert by_name["llama3.1-8b"]["num_experts"] == "" and by_name["llama3.1-8b"]["mla.kv_lora_rank"] == ""


def test_the_csv_columns_are_the_widest_json_rows_in_order(both):
    """One header whatever the rows: the dense fields, the MoE fields, then the counts, in the
    order a (flattened) MoE row's JSON has them."""
    rows, header, _ = both
    assert header == list(_flattened(rows[-1]))
    assert header[:3] == ["name", "num_layers", "hidden_size"]
    # the table's k/E cell ('2/8') is not a field: moe_router_topk and num_experts say it as numbers
    assert header[-3:] == ["mtp_num_layers", "parameters_billions", "active_parameters_billions"]
    assert all("experts" not in row for row in rows)


# --- 2. the models table: a legend, the experts' width, within the terminal ------------------


def _table_parts(text: str) -> tuple[list[str], dict[str, dict[str, str]], list[str]]:
    """The headers, each model's cells by header, and the lines under the table."""
    table = read_table(text)
    return table.headers, {row[0]: record for row, record in zip(table.rows, table.records())}, table.caption_lines


def test_the_models_table_explains_its_headers(advisor, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    text = advisor("models").stdout
    header, _, legend = _table_parts(text)
    assert max(len(line.encode()) for line in text.splitlines()) <= 100  # bytes too: ASCII off a terminal
    assert legend and all(len(line) <= 100 for line in legend)
    words = " ".join(legend).split()
    explained = {word.rstrip(":,") for word in words}
    assert [name for name in header[1:] if name.split()[0] not in explained] == []
    assert "k" not in header  # 'k' was the KV heads beside 'k/E's top-k: now 'kv'


def test_the_expert_width_stands_beside_the_dense_width(advisor, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    _, cells, legend = _table_parts(advisor("models").stdout)
    specs = {row["name"]: row for row in advisor.json("models")}
    for name, row in cells.items():
        spec = specs[name]
        assert row["h_ffn"] == str(spec["ffn_hidden_size"])
        assert row["h_exp"] == str(spec.get("moe_ffn_hidden_size", "-"))
    assert (cells["qwen3-30b-a3b"]["h_ffn"], cells["qwen3-30b-a3b"]["h_exp"]) == ("6144", "768")
    # which MoE models have dense layers at all, from the specs: only there does h_ffn apply
    dense_first = [f"{spec['first_dense_layers']} in {name}" for name, spec in specs.items()
                   if spec.get("first_dense_layers")]
    assert dense_first == ["3 in deepseek-v3"]
    assert any("h_ffn" in line and "3 in deepseek-v3" in line for line in legend)
    tied = [name for name, spec in specs.items() if spec["tie_embeddings"]]
    assert any("tied" in line and all(name in line for name in tied) for line in legend)


# --- 3. recommend -o plan.csv: JSON in a .csv file is refused --------------------------------


@pytest.mark.parametrize("name", ["plan.csv", "PLAN.CSV"])
def test_recommend_refuses_a_csv_name(advisor, tmp_path, name):
    path = tmp_path / name
    line = advisor.error(*RECOMMEND, "-o", path)
    assert line == f"Error: advisor recommend would write JSON into {path}: name the file {path.with_suffix('.json')}"
    assert list(tmp_path.iterdir()) == []


def test_every_one_document_command_refuses_a_csv_name(advisor, tmp_path):
    # compare-log writes one JSON document too (the shared document_options)
    from tests.test_compare_log import REAL_COMMAND, REAL_LOG

    path = tmp_path / "check.csv"
    line = advisor.error("compare-log", REAL_LOG, "--from-command", REAL_COMMAND, "-o", path)
    assert line == f"Error: advisor compare-log would write JSON into {path}: name the file {tmp_path / 'check.json'}"
    assert list(tmp_path.iterdir()) == []


def test_recommend_writes_its_plan_to_a_json_name(advisor, tmp_path):
    path = tmp_path / "plan.json"
    advisor(*RECOMMEND, "-o", path)
    plan = json.loads(path.read_text())
    assert plan["schema"] == "megatron-4d-advisor/plan" and len(plan["stages"]) == 4


# --- 4. a bare command prints its help, exit status 0 ----------------------------------------


@pytest.mark.parametrize("group", [[], ["profile"], ["report"]], ids=["advisor", "profile", "report"])
def test_a_bare_group_prints_its_help(group):
    runner = CliRunner()
    bare = runner.invoke(cli, group, prog_name="advisor")
    helped = runner.invoke(cli, [*group, "--help"], prog_name="advisor")
    assert (bare.exit_code, bare.stderr) == (0, "")
    assert bare.stdout == helped.stdout and bare.stdout.startswith(f"Usage: {' '.join(['advisor', *group])} ")


@pytest.mark.parametrize("module", ["advisor", "advisor.cli"])
def test_bare_advisor_as_a_program_exits_zero(module):
    """The exit status a shell sees (CliRunner catches the SystemExit); python -m advisor.cli,
    the module pyproject.toml's entry point names, runs it too (it was 'No module named
    advisor.cli.__main__')."""
    done = subprocess.run([sys.executable, "-m", module], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("Usage: advisor [OPTIONS] COMMAND [ARGS]...")


@pytest.mark.parametrize("args, line", [
    (["nope"], "Error: No such command 'nope'. (see 'advisor --help')"),
    (["profile", "nope"], "Error: No such command 'nope'. (see 'advisor profile --help')"),
    # a misspelt command names the ones it may mean, as click does for a misspelt option
    (["sweeep", "--gpus", "8"], "Error: No such command 'sweeep'; did you mean sweep? (see 'advisor --help')"),
    (["model"], "Error: No such command 'model'; did you mean models? (see 'advisor --help')"),
    (["profile", "shwo"], "Error: No such command 'shwo'; did you mean show? (see 'advisor profile --help')"),
    (["report", "estimat"], "Error: No such command 'estimat'; did you mean estimate? (see 'advisor report --help')"),
    (["--gpus", "8"], "Error: No such option '--gpus'. (see 'advisor --help')"),  # an option: click's own line
])
def test_an_unknown_command_stays_an_error(args, line):
    result = CliRunner().invoke(cli, args, prog_name="advisor")
    assert (result.exit_code, result.stdout, result.stderr.strip()) == (2, "", line)


def test_a_misspelt_launch_command_names_the_one_meant():
    from launch.cli import cli as launch_cli

    result = CliRunner().invoke(launch_cli, ["torchrn", "--from", "sweep.json"], prog_name="advisor-launch")
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr.strip() == "Error: No such command 'torchrn'; did you mean torchrun? (see 'advisor-launch --help')"


def test_report_without_a_source_still_says_what_it_needs(advisor):
    """``advisor report`` with options but neither --from nor a subcommand: its one-line error."""
    assert advisor.error("report", "--profile", "examples/launch/profiles") == (
        "Error: give --from FILE, or a subcommand: advisor report sweep|estimate|recommend ...")


def test_a_group_with_its_own_bare_action_still_runs_it():
    """``python -m tables.splits`` and the calibration are AdvisorGroups that run their callback
    with no arguments: they are not turned into their help."""
    ran = []

    @click.group(cls=AdvisorGroup, invoke_without_command=True)
    def tool() -> None:
        ran.append(True)

    result = CliRunner().invoke(tool, [])
    assert (result.exit_code, result.stdout, ran) == (0, "", [True])


def test_completion_of_a_group_prints_no_help():
    """Shell completion resolves 'advisor profile' too (resilient parsing): it lists profile's
    commands, it does not print the help nor exit."""
    from click.shell_completion import ShellComplete

    names = [item.value for item in ShellComplete(cli, {}, "advisor", "_ADVISOR_COMPLETE")
             .get_completions(["profile"], "")]
    assert {"plan", "run", "show"} <= set(names)


def test_bare_advisor_launch_prints_its_help():
    from launch.cli import cli as launch_cli

    result = CliRunner().invoke(launch_cli, [])
    assert (result.exit_code, result.stderr) == (0, "")
    assert result.stdout == CliRunner().invoke(launch_cli, ["--help"]).stdout


def test_a_csv_header_is_every_rows_keys_not_the_first_rows():
    # the cause of the dropped MoE columns, in the one CSV writer every command uses
    from advisor import render

    text = render.to_csv([{"name": "dense", "h": 1}, {"name": "moe", "h": 2, "experts": "2/8"}])
    assert text.splitlines() == ["name,h,experts", "dense,1,", "moe,2,2/8"]
