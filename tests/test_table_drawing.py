"""Where a table lands decides how it is drawn (``render.Drawing``). On a terminal: box-drawing
borders, the verdicts coloured unless NO_COLOR. In a pipe or a file: plain ASCII, a byte a column,
so that a width check that counts bytes sees what the terminal shows (a 100-column sweep table
had 34 lines of 100 to 118 bytes: a box-drawing character is three bytes in UTF-8). The terminal
here is a real pseudo-terminal (``pty``), the advisor a real process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import ROOT
from table_text import read_table
from terminal import STYLE, on_a_terminal

SWEEP = ["sweep", "--gpus", "64", "--gpu", "h100-80gb", "--top", "5"]


def _env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in ("NO_COLOR", "TERM", "PYTHONIOENCODING")}
    return {**env, "COLUMNS": "100", "TERM": "xterm-256color", **extra}


def _on_a_terminal(args: list[str], **extra: str) -> str:
    return on_a_terminal(*args, env={"NO_COLOR": None, "PYTHONIOENCODING": None, "COLUMNS": "100",
                                     "TERM": "xterm-256color", **extra})


def _piped(args: list[str], **extra: str) -> str:
    done = subprocess.run([sys.executable, "-m", "advisor", *args], capture_output=True, cwd=ROOT, env=_env(**extra),
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.decode("ascii")  # raises on any byte over 127


def test_a_piped_table_is_ascii_a_byte_a_column():
    text = _piped(SWEEP)
    lines = text.splitlines()
    assert max(len(line.encode()) for line in lines) <= 100
    assert "\x1b[" not in text  # no colour either
    table = read_table(text)
    assert table.headers[:7] == ["rank", "TP", "CP", "PP", "VPP", "MBS", "DP"] and len(table.rows) == 5


def test_a_terminal_gets_box_drawing_and_colour():
    styled = _on_a_terminal(SWEEP)
    text = STYLE.sub("", styled)
    assert "┏━━━━━━┳" in text and "┃ rank ┃" in text and "+------+" not in text
    # the same geometry as the ASCII table: as many columns, line for line
    assert [len(line) for line in text.splitlines()] == [len(line) for line in _piped(SWEEP).splitlines()]
    assert "\x1b[32mfits" in styled  # the verdict in green


def test_no_color_keeps_the_boxes_and_drops_the_colour():
    text = _on_a_terminal(SWEEP, NO_COLOR="1")
    assert "┃ rank ┃" in text and "\x1b[" not in text


def test_a_terminal_that_cannot_encode_them_gets_ascii():
    text = STYLE.sub("", _on_a_terminal(SWEEP, PYTHONIOENCODING="ascii"))
    assert "┃" not in text and "| rank |" in text


@pytest.mark.parametrize("command", [SWEEP, ["models"]], ids=["sweep", "models"])
def test_output_to_a_file_from_a_terminal_is_ascii(tmp_path, command):
    """--output writes what a pipe gets, whatever standard output is. (recommend's and profile
    plan's --output takes their JSON; their table stays on standard output.)"""
    out = tmp_path / "table.txt"
    _on_a_terminal([*command, "--output", str(out)])
    text = out.read_bytes().decode("ascii")
    assert read_table(text).headers and "\x1b[" not in text
