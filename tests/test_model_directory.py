"""--model DIR: a Hugging Face snapshot is a directory (``huggingface-cli download
meta-llama/Llama-3.2-1B --include config.json --local-dir ./llama1b``), and --model took only the
config.json inside it ("llama1b is a directory, not a model config.json"). The directory now names
its config.json; one without a config.json is one line naming it, and -o onto DIR/config.json is
still refused as the file --model reads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

CONFIG = Path(__file__).parent / "fixtures" / "hf_configs" / "llama3.2-1b.json"
EST = ("estimate", "--gpus", "8", "--mem", "80", "--tp", "2", "--seq-len", "4096", "--gbs", "64", "--format", "json")


@pytest.fixture
def snapshot(tmp_path) -> Path:
    """A directory as huggingface-cli download --local-dir leaves it: config.json and other files."""
    directory = tmp_path / "llama1b"
    directory.mkdir()
    shutil.copy(CONFIG, directory / "config.json")
    (directory / "generation_config.json").write_text('{"bos_token_id": 128000}\n')
    return directory


@pytest.mark.parametrize("spelled", ["{d}", "{d}/"], ids=["dir", "dir-slash"])
def test_a_directory_prices_its_config_json(advisor, snapshot, spelled):
    by_directory = json.loads(advisor(*EST, "--model", spelled.format(d=snapshot)).stdout)
    by_file = json.loads(advisor(*EST, "--model", snapshot / "config.json").stdout)
    assert by_directory == by_file
    model = by_directory["model"]  # the released Llama-3.2-1B's sizes, from its config.json
    assert (model["num_layers"], model["hidden_size"], model["ffn_hidden_size"]) == (16, 2048, 8192)
    assert (model["num_attention_heads"], model["num_query_groups"], model["vocab_size"]) == (32, 8, 128256)


def test_sweep_takes_a_directory(advisor, snapshot):
    rows = json.loads(advisor("sweep", "--gpus", "8", "--mem", "80", "--seq-len", "4096", "--gbs", "64",
                              "--top", "1", "--format", "json", "--model", snapshot).stdout)
    assert rows[0]["model"]["num_layers"] == 16


def test_a_directory_without_config_json_is_one_line(advisor, tmp_path):
    empty = tmp_path / "download"
    empty.mkdir()
    (empty / "model.safetensors").write_bytes(b"")
    line = advisor.error(*EST, "--model", empty)
    assert line.startswith(f"Error: {empty} is a directory without a config.json")


def test_output_onto_the_directory_config_json_is_refused(advisor, snapshot):
    config = snapshot / "config.json"
    before = config.read_bytes()
    for model in (snapshot, f"{snapshot}/"):
        line = advisor.error(*EST, "--model", model, "-o", config)
        assert line == (f"Error: -o {config} is the file --model reads: writing it would replace the input; "
                        "give another file name")
    assert config.read_bytes() == before


def test_output_beside_the_config_json_is_written(advisor, snapshot):
    written = snapshot / "estimate.json"
    advisor(*EST, "--model", snapshot, "-o", written)
    assert json.loads(written.read_text())["model"]["hidden_size"] == 2048


@pytest.mark.parametrize("spelled", ["{t}/llama1b", "./llama1b", "llama1b/", "{t}/models/llama1b/config"],
                         ids=["absolute", "dot-slash", "trailing-slash", "deep"])
def test_a_path_that_does_not_exist_is_named_as_a_path(advisor, tmp_path, monkeypatch, spelled):
    """A mistyped download directory was 'unknown model ...: huggingface-cli download ./llama1b
    config.json', advice for a Hugging Face id ('org/name') that downloads nothing for a path."""
    monkeypatch.chdir(tmp_path)
    model = spelled.format(t=tmp_path)
    line = advisor.error(*EST, "--model", model)
    assert line == (f"Error: {model}: no such file or directory (--model takes a preset, a Hugging Face "
                    "config.json, or the directory holding one)")


def test_a_hugging_face_id_is_still_a_hugging_face_id(advisor, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # 'org/name' names no file here: a model id, as before
    assert "huggingface-cli download meta-llama/Llama-9-8B config.json" in advisor.error(
        *EST, "--model", "meta-llama/Llama-9-8B")
    by_id = json.loads(advisor(*EST, "--model", "meta-llama/Llama-3.1-8B").stdout)
    assert by_id["model"]["name"] == "llama3.1-8b"
