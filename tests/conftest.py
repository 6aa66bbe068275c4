import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from advisor.cli import cli

ROOT = Path(__file__).resolve().parent.parent


class Invoker:
    """Runs a real click command in-process (CliRunner), stdout and stderr apart: by default
    the ``advisor`` group."""

    def __init__(self, command=cli) -> None:
        self.runner = CliRunner()
        self.command = command

    def __call__(self, *args, expect: int = 0):
        result = self.runner.invoke(self.command, [str(arg) for arg in args], catch_exceptions=False)
        assert result.exit_code == expect, f"exit {result.exit_code}\n{result.output}"
        return result

    def json(self, *args):
        return json.loads(self(*args, "--format", "json").stdout)

    def error(self, *args) -> str:
        """Run a command that must fail on bad input: exit 2, one line on stderr, no traceback."""
        result = self(*args, expect=2)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
        assert "Traceback" not in result.output
        assert result.stdout == ""
        return lines[0]


@pytest.fixture
def advisor() -> Invoker:
    return Invoker()
