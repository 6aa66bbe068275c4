"""The README's Launch section shows real output: every command block followed by an output block
is replayed here (in a directory where `Megatron-LM` is the real core_v0.15.2 checkout of
shared/megatron-lm, beside the repository's examples/), and the last command's output must be
the block's."""

import re
import shlex

from click.testing import CliRunner
from conftest import ROOT

from advisor.cli import cli as advisor_cli
from launch.cli import cli as launch_cli

PROGRAMS = {"advisor": advisor_cli, "advisor-launch": launch_cli}
NOT_A_FENCE = r"(?:(?!```).)*?"


def launch_examples() -> list[tuple[str, str]]:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Launch (`advisor-launch`)")
    section = text[start:text.index("\n## ", start + 1)]
    return re.findall(rf"```bash\n({NOT_A_FENCE})\n```\n```text\n({NOT_A_FENCE})```", section, re.S)


def replay(commands: str) -> str:
    """Run each command of a block in-process; the last one's stdout (stderr if it failed)."""
    runner = CliRunner()
    for line in commands.replace("\\\n", " ").splitlines():
        program, *args = shlex.split(line)
        result = runner.invoke(PROGRAMS[program], args, catch_exceptions=False)
    return result.stdout if result.exit_code == 0 else result.stderr


def in_example_directory(path, monkeypatch):
    from megatron_real import checkout

    (path / "Megatron-LM").symlink_to(checkout("core_v0.15.2").path)  # read only: the commands are dry runs
    (path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(path)
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)


def test_the_launch_examples_show_real_output(tmp_path, monkeypatch):
    in_example_directory(tmp_path, monkeypatch)
    examples = launch_examples()
    assert len(examples) == 3
    for commands, shown in examples:
        assert replay(commands) == shown, commands
