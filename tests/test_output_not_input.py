"""-o that names a file the command reads is refused before any work (``advisor.fileio.refuse_overwriting``):
'advisor report --from a.json -o a.json' replaced the sweep with its page, and 'advisor-launch k8s
--from a.json -o a.json' with YAML, both with exit status 0. 'advisor report' also refuses a name
that says another format (-o x.json for its HTML), as 'advisor sweep' does (--format json -o x.csv)."""

import os
from pathlib import Path

import pytest
from conftest import Invoker
from launch_support import launcher, sweep_file

SWEEP = ("--gpus", "8", "--gpu", "h100-80gb", "--top", "3")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return sweep_file(Invoker(), tmp_path_factory.mktemp("sweep") / "a.json", *SWEEP)


def _refusal(path, option: str) -> str:
    return f"Error: -o {path} is the file {option} reads: writing it would replace the input; give another file name"


def test_report_from_onto_itself(advisor, saved):
    before = saved.read_bytes()
    assert advisor.error("report", "--from", saved, "-o", saved) == _refusal(saved, "--from")
    assert saved.read_bytes() == before


def test_another_spelling_or_a_link_is_the_same_file(advisor, saved, tmp_path):
    link = tmp_path / "link.json"
    os.symlink(saved, link)
    before = saved.read_bytes()
    assert advisor.error("report", "--from", link, "-o", saved) == _refusal(saved, "--from")
    spelled = saved.parent / "." / saved.name
    assert advisor.error("report", "--from", saved, "-o", spelled) == _refusal(spelled, "--from")
    assert saved.read_bytes() == before


def test_launch_manifest_onto_its_input(saved):
    before = saved.read_bytes()
    line = launcher().error("k8s", "--from", saved, "--image", "img", "--megatron-lm", "/opt/Megatron-LM",
                            "-o", saved)
    assert line == _refusal(saved, "--from")
    assert saved.read_bytes() == before


def test_estimate_onto_its_command_file(advisor, tmp_path):
    command = tmp_path / "train.sh"
    command.write_text("pretrain_gpt.py --tensor-model-parallel-size 2 --num-layers 4 --hidden-size 256 "
                       "--num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 "
                       "--micro-batch-size 1 --global-batch-size 8\n")
    before = command.read_bytes()
    assert advisor.error("estimate", "--from-command", command, "-o", command) == _refusal(command, "--from-command")
    assert command.read_bytes() == before


def test_a_config_json_under_a_tilde_is_the_file_model_reads(advisor, tmp_path, monkeypatch):
    """--model=~/cfg.json --output=~/cfg.json: no shell expands a '~' after '=', the model's loader
    does, and the check read '~/cfg.json' as written (no such file): the config was replaced."""
    monkeypatch.setenv("HOME", str(tmp_path))
    config = tmp_path / "cfg.json"
    config.write_text((Path(__file__).parent / "fixtures" / "hf_configs" / "llama3.2-1b.json").read_text())
    before = config.read_bytes()
    line = advisor.error("sweep", "--model=~/cfg.json", *SWEEP, "--format", "json", "--output=~/cfg.json")
    assert line == _refusal(config, "--model")
    assert config.read_bytes() == before


def test_other_files_are_written(advisor, saved, tmp_path):
    page = tmp_path / "page.html"
    advisor("report", "--from", saved, "-o", page)
    assert page.read_text().lstrip().lower().startswith("<!doctype html")


@pytest.mark.parametrize("name", ["x.json", "x.CSV", "x.yaml", "x.png"])
def test_report_refuses_a_name_of_another_format(advisor, saved, tmp_path, name):
    path = tmp_path / name
    wanted = path.with_suffix(".html")
    assert advisor.error("report", "--from", saved, "-o", path) == \
        f"Error: advisor report would write HTML into {path}: name the file {wanted}"
    assert advisor.error("report", "sweep", *SWEEP, "-o", path) == \
        f"Error: advisor report would write HTML into {path}: name the file {wanted}"
    assert not path.exists()


@pytest.mark.parametrize("command, extra, name, line", [
    ("k8s", ("--image", "img", "--megatron-lm", "/opt/Megatron-LM"), "m.json",
     "Error: advisor-launch k8s would write YAML into {out}: name the file {stem}.yaml"),
    ("skypilot", ("--megatron-lm", "/opt/Megatron-LM"), "m.html",
     "Error: advisor-launch skypilot would write YAML into {out}: name the file {stem}.yaml"),
    ("sbatch", ("--dry-run",), "a.json", "Error: advisor-launch sbatch would write a script into {out}: name the file "
                                          "{stem}.sh"),
])
def test_launch_refuses_a_name_of_another_format(saved, tmp_path, command, extra, name, line):
    """k8s -o m.json wrote YAML into a .json file (exit 0), as the advisor's commands no longer do."""
    out = tmp_path / name
    got = launcher().error(command, "--from", saved, *extra, "-o", out)
    assert got == line.format(out=out, stem=out.with_suffix(""))
    assert not out.exists()
