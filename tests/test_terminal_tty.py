"""Without $COLUMNS, a table on a terminal fits the terminal's own width: interactive shells seldom
export COLUMNS, and the tables were cut at 100 columns in an 80-column terminal."""

from __future__ import annotations

import os
import subprocess
import sys

from terminal import STYLE, on_a_terminal


def _run_on_a_terminal(columns: int, *args: str, program: str = "advisor", cwd=None) -> str:
    """What an ``columns``-wide terminal shows, notes too, without styles."""
    text = on_a_terminal(*args, program=program, columns=columns, stderr_too=True, cwd=cwd,
                         env={"MEGATRON_LM": None})
    return STYLE.sub("", text)


def test_a_table_fits_the_terminal_it_is_printed_on():
    for columns in (80, 120):
        text = _run_on_a_terminal(columns, "estimate", "--tp", "2", "--gpus", "8", "--gpu", "h100-80gb")
        widest = max(len(line) for line in text.splitlines())
        assert widest <= columns and (widest > 100) == (columns > 100), (columns, widest)


def test_notes_and_the_launch_command_fit_the_terminal(tmp_path):
    """The notes on stderr (the sweep's count, the launcher's warnings, some 300 characters) and
    the dry run's command wrap at the terminal's width, continuation lines indented."""
    rows = tmp_path / "sweep.json"
    text = _run_on_a_terminal(80, "sweep", "--gpus", "8", "--gpu", "h100-80gb", "--format", "json", "-o", rows.name,
                              cwd=tmp_path)
    assert text.startswith("advisor sweep: ") and "\n  " in text, text
    assert max(len(line) for line in text.splitlines()) <= 80, text
    text = _run_on_a_terminal(80, "torchrun", "--from", rows.name, "--mock-data", "--dry-run", "--", "--lr", "3e-4",
                              program="launch", cwd=tmp_path)
    assert "warning: " in text and "--tensor-model-parallel-size 2" in text, text
    assert max(len(line) for line in text.splitlines()) <= 80, text


def test_notes_stay_one_line_each_in_a_log(tmp_path):
    """Neither a terminal nor $COLUMNS (a pipe, a CI log): a note is one line, for grep."""
    env = {key: value for key, value in os.environ.items() if key != "COLUMNS"}
    result = subprocess.run([sys.executable, "-m", "advisor", "sweep", "--gpus", "8", "--gpu", "h100-80gb",
                             "--format", "json", "-o", str(tmp_path / "rows.json")],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0 and result.stderr.count("\n") == 2, result.stderr  # the note and "wrote"
    assert len(result.stderr.splitlines()[0]) > 100
