"""The reproduction commands (``python -m tables.*``) take their own options only.

Their groups were the ``advisor`` group's class, which adds the advisor's commands to every group
of it: ``python -m tables.seed004 --help`` listed compare-log, estimate, ... sweep, and
``python -m tables.seed004 models`` ran the whole reproduction, rewriting tables/README.md's results,
before printing the model presets. ``python -m tables.symbolic`` read no option but --profile, so
its ``--help`` rewrote docs/profiling.md's section. tables.published_moe and
tables.seed004.reserve_forms answered a stray argument with click's three-line usage error."""

import importlib

import pytest
from conftest import ROOT, Invoker

ADVISOR_COMMANDS = ("compare-log", "estimate", "gpus", "models", "profile", "recommend", "report", "sweep")
TOOLS = {  # module: its own commands (none for a plain command)
    "tables.seed004.__main__": (),
    "tables.splits.__main__": (),
    "tables.symbolic": (),
    "tables.published_moe": (),
    "tables.seed004.reserve_forms": (),
    "tables.capture.__main__": ("analyse", "measure"),
    "tables.seed004.calibrate": ("probe",),
}
WRITTEN = [ROOT / "tables" / "README.md", ROOT / "docs" / "profiling.md", ROOT / "docs" / "estimator.md",
           ROOT / "advisor" / "calibration.json"]


def _tool(module: str) -> Invoker:
    return Invoker(importlib.import_module(module).main)


def _stamps():
    return [(path.stat().st_mtime_ns, path.read_bytes()) for path in WRITTEN]


@pytest.mark.parametrize("module", TOOLS)
def test_help_lists_only_the_tools_own_commands_and_writes_nothing(module):
    before = _stamps()
    text = _tool(module)("--help").stdout
    assert "Options:" in text
    listed = text.split("Commands:")[1].split() if "Commands:" in text else []
    assert [name for name in ADVISOR_COMMANDS if name in listed] == []
    assert all(name in listed for name in TOOLS[module])
    assert _stamps() == before


@pytest.mark.parametrize("module", TOOLS)
def test_an_advisor_command_name_is_one_line_and_runs_nothing(module):
    before = _stamps()
    line = _tool(module).error("models")
    refusal = "No such command 'models'." if TOOLS[module] else "Got unexpected extra argument (models)"
    assert line == f"Error: {refusal} (see 'main --help')"  # 'main': CliRunner's name for the command
    assert _stamps() == before
