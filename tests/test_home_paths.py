"""A leading '~' in a path option is the user's home, as a shell would make it: click.Path never
expands it, and a shell leaves it alone where it is quoted ('~/x'), so --profile-dir '~/x' made a
directory named '~' in the current one, and --from '~/s.json' was not found. Every option and
argument that names a file or directory has the one type (``advisor.cli.options.UserPath``,
``InputPath`` among them) that expands it. HOME is a temporary directory here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import click
import pytest
from launch_support import launcher, make_checkout

from conftest import ROOT


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """$HOME, and a current directory apart from it (where a literal '~' would land)."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    yield home
    assert list(work.iterdir()) == []  # no directory named '~', nothing else


def test_rows_pages_and_pictures_written_and_read_under_home(advisor, home):
    advisor("sweep", "--gpus", 8, "--mem", 80, "--format", "json", "-o", "~/s.json", "--plot", "~/s.png")
    assert json.loads((home / "s.json").read_text())[0]["rank"] == 1
    assert (home / "s.png").read_bytes().startswith(b"\x89PNG")
    advisor("report", "--from", "~/s.json", "-o", "~/r.html")
    assert (home / "r.html").read_text().lstrip().lower().startswith("<!doctype html")


def test_a_model_config_and_a_campaign_under_home(advisor, home):
    shutil.copy(ROOT / "tests" / "fixtures" / "hf_configs" / "llama3.2-1b.json", home / "config.json")
    by_path = advisor.json("estimate", "--model", "~/config.json", "--gpus", 8, "--mem", 80, "--tp", 2)
    by_name = advisor.json("estimate", "--model", "llama3.2-1b", "--gpus", 8, "--mem", 80, "--tp", 2)
    assert by_path["total_gib"] == by_name["total_gib"]
    advisor("profile", "plan", "--gpus", 8, "--gpus-per-node", 8, "--mode", "reduced", "-o", "~/c.json")
    assert json.loads((home / "c.json").read_text())


def test_launch_profile_dir_under_home(advisor, home, tmp_path, monkeypatch):
    from tests.test_launch_cli import read_torchrun, shell_words

    monkeypatch.setattr("launch.process.run_process_group", lambda *args, **kwargs: pytest.fail("started"))
    checkout = make_checkout(home / "Megatron-LM", 15)
    advisor("sweep", "--gpus", 8, "--mem", 80, "--format", "json", "-o", "~/s.json")
    result = launcher()("torchrun", "--from", "~/s.json", "--rank", 1, "--megatron-lm", checkout,
                        "--profile-dir", "~/prof", "--mock-data", "--dry-run")
    _, entry, _ = read_torchrun(shell_words(result.stdout))
    assert entry.profile_dir == str(home / "prof")


def test_an_unknown_user_stays_as_given(advisor, home):
    line = advisor.error("report", "--from", "~no-such-user-here/s.json", "-o", "~/r.html")
    assert line == "Error: ~no-such-user-here/s.json: no such file"


def _commands(command: click.Command, ctx: click.Context):
    yield command
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            yield from _commands(sub, click.Context(sub, parent=ctx, info_name=name))


def test_every_path_option_has_the_type_that_expands_it():
    from advisor.cli import cli
    from advisor.cli.options import UserPath
    from advisor.cli.runners import megatron_runner
    from launch.cli import cli as launch_cli
    from launch.slurm_array import main as slurm_array
    from megatron_hooks.emulate import main as emulate

    roots = [cli, launch_cli, slurm_array, emulate, megatron_runner(lambda **options: 0)]
    paths = [(command.name, param.name, param.type) for root in roots
             for command in _commands(root, click.Context(root, info_name=root.name))
             for param in command.params if isinstance(param.type, click.Path)]
    assert len(paths) > 20  # -o on every command, --from, --profile, --plot, --out, ...
    assert [(command, name) for command, name, kind in paths if not isinstance(kind, UserPath)] == []
