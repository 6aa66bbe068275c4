"""A DeepSeek-V3 config.json's multi-token-prediction layers (num_nextn_predict_layers): read into
``MoESpec.config_mtp_num_layers``, not priced (the config prices as the deepseek-v3 preset, 671B
without MTP), and said in one line on stderr by every command that prices the model, naming the
key and the flag that prices it; --mtp-num-layers, 0 included, silences it. A bad value is one
line naming the key, exit status 2.

Why a line and not MTP by default: Megatron-Bridge's DeepSeekV3Bridge sets ``mtp_num_layers``
from ``num_nextn_predict_layers`` (src/megatron/bridge/models/deepseek/deepseek_v3_bridge.py),
while Megatron-LM's --mtp-num-layers defaults to none (core_v0.15.2 training/arguments.py,
core_v0.19.0 TransformerConfig.mtp_num_layers): a user of either may expect either, so the price says which it is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from advisor.cli import cli
from advisor.models import load_model, spec_from_dict
from advisor.moe.spec import PRESETS

DATA = Path(__file__).resolve().parent / "data" / "moe"
LAYOUT = ["--gpus", "64", "--pp", "8", "--ep", "8", "--mem", "80"]


def _config(tmp_path: Path, **changes) -> str:
    """deepseek-ai/DeepSeek-V3's config.json (committed, num_nextn_predict_layers 1), changed."""
    document = {key: value for key, value in json.loads((DATA / "deepseek-v3.json").read_text()).items()
                if key != "_source"}
    document.update(changes)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(document))
    return str(path)


def _run(*args: str):
    result = CliRunner(env={"COLUMNS": "400"}).invoke(cli, list(args))
    assert result.exit_code == 0, result.output
    return result


def _line(path: str, layers: int = 1) -> str:
    them, s = ("it", "") if layers == 1 else ("them", "s")
    return (f"{path} has {layers} multi-token-prediction layer{s} (num_nextn_predict_layers), priced without "
            f"{them}: --mtp-num-layers {layers} prices {them}")


def test_the_reader_carries_the_key_apart_from_what_is_priced(tmp_path):
    spec = load_model(_config(tmp_path, num_nextn_predict_layers=2))
    assert (spec.config_mtp_num_layers, spec.mtp_num_layers) == (2, 0)
    absent = {key: value for key, value in json.loads(Path(_config(tmp_path)).read_text()).items()
              if key != "num_nextn_predict_layers"}
    Path(tmp_path / "config.json").write_text(json.dumps(absent))
    assert load_model(str(tmp_path / "config.json")).config_mtp_num_layers == 0


def test_to_dict_has_it_only_where_a_config_declared_it(tmp_path):
    """The presets' files (advisor models --format json, every row's 'model') read as before; a
    config's row says what the config declared, and reads back to the same spec."""
    spec = load_model(_config(tmp_path))
    assert spec.to_dict()["config_mtp_num_layers"] == 1 and spec.to_dict()["mtp_num_layers"] == 0
    assert spec_from_dict(spec.to_dict()) == spec
    assert all("config_mtp_num_layers" not in preset.to_dict() for preset in PRESETS.values())
    rows = json.loads(_run("models", "--format", "json").stdout)
    assert all("config_mtp_num_layers" not in row for row in rows)


def test_estimate_says_it_in_one_line_and_prices_as_the_preset(tmp_path):
    path = _config(tmp_path)
    config = _run("estimate", "--model", path, *LAYOUT, "--format", "json")
    preset = _run("estimate", "--model", "deepseek-v3", *LAYOUT, "--format", "json")
    assert config.stderr == f"advisor estimate: {_line(path)}\n"
    assert preset.stderr == ""
    row, preset_row = json.loads(config.stdout), json.loads(preset.stdout)
    # machine-readable: what the config declares beside what was priced
    assert (row["model"]["config_mtp_num_layers"], row["model"]["mtp_num_layers"]) == (1, 0)
    assert row["stages"] == preset_row["stages"]
    assert "--mtp-num-layers" not in row["megatron_args"]
    table = _run("estimate", "--model", path, *LAYOUT)
    assert table.stderr == f"advisor estimate: {_line(path)}\n"


@pytest.mark.parametrize("given", ["0", "1"])
def test_the_flag_given_silences_it(tmp_path, given):
    path = _config(tmp_path)
    result = _run("estimate", "--model", path, *LAYOUT, "--mtp-num-layers", given, "--format", "json")
    assert result.stderr == ""
    row = json.loads(result.stdout)
    assert row["model"]["mtp_num_layers"] == int(given)
    with_flag = json.loads(_run("estimate", "--model", "deepseek-v3", *LAYOUT, "--mtp-num-layers", given,
                                "--format", "json").stdout)
    assert row["stages"] == with_flag["stages"]  # priced as the preset with the same flag


def test_two_layers_are_said_in_the_plural(tmp_path):
    path = _config(tmp_path, num_nextn_predict_layers=2)
    assert _run("estimate", "--model", path, *LAYOUT).stderr == f"advisor estimate: {_line(path, 2)}\n"


def test_the_sweep_says_it_once(tmp_path):
    path = _config(tmp_path)
    result = _run("sweep", "--model", path, "--gpus", "256", "--gpu", "h100-80gb", "--top", "1",
                  "--format", "json")
    assert result.stderr.count(_line(path)) == 1
    assert json.loads(result.stdout)[0]["model"]["config_mtp_num_layers"] == 1
    quiet = _run("sweep", "--model", path, "--gpus", "256", "--gpu", "h100-80gb", "--top", "1",
                 "--mtp-num-layers", "1", "--format", "json")
    assert "num_nextn_predict_layers" not in quiet.stderr


@pytest.mark.parametrize("value, words", [
    (-1, "num_nextn_predict_layers must be an integer of at least 0, got -1"),
    (1.5, "num_nextn_predict_layers must be an integer of at least 0, got 1.5"),
    (True, "num_nextn_predict_layers must be an integer of at least 0, got true"),
    ("1", "num_nextn_predict_layers must be an integer of at least 0, got '1'"),
    (None, "num_nextn_predict_layers must be an integer of at least 0, got null"),
    (17, "num_nextn_predict_layers (--mtp-num-layers) must be at most 16, got 17"),
])
def test_a_bad_value_is_one_line_naming_the_key(advisor, tmp_path, value, words):
    path = _config(tmp_path, num_nextn_predict_layers=value)
    assert advisor.error("estimate", "--model", path, *LAYOUT) == f"Error: {path}: {words}" + (
        ": DeepSeek-V3 trains one multi-token-prediction layer" if value == 17 else "")
