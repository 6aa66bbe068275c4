"""Start-up stays cheap: ``advisor --help`` lists every command without importing any command's
module (nor numpy, rich, torch, the tables or the file reader), and ``advisor sweep`` imports
neither torch nor the modules of the other commands (the report, profiling, matplotlib), nor,
for a dense model, the MoE pricing, nor scipy, rich or the reader of a command's flags; a
mixture of experts' sweep (advisor.moe.space) imports not the dense search."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "matplotlib", "megatron", "launch", "megatron_hooks")


def _modules_after(argv: list[str]) -> tuple[set[str], str]:
    code = ("import sys\nfrom advisor.cli import cli\n"
            f"try: cli({argv!r}, prog_name='advisor')\n"
            "except SystemExit: pass\n"
            "print(' '.join(sorted(sys.modules)), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(done.stderr.split("\n")[-2].split()), done.stdout


def test_help_lists_every_command_and_imports_none_of_them():
    from advisor.cli import COMMANDS

    modules, shown = _modules_after(["--help"])
    for name, lazy in COMMANDS.items():
        assert f"  {name}  " in shown and lazy.short_help[:20] in shown.replace("\n", " ")
        assert lazy.module not in modules
    assert not modules & {"numpy", "rich", *HEAVY}
    assert not modules & {"advisor.render", "advisor.fileio", "json"}  # the tables, the file reader: the commands'


def test_sweep_imports_only_what_it_needs():
    modules, shown = _modules_after(["sweep", "--gpus", "8", "--mem", "80", "--top", "1", "--format", "json"])
    assert '"tp"' in shown
    assert not modules & {*HEAVY, "advisor.report", "advisor.cli.report", "advisor.cli.profile",
                          "advisor.cli.compare_log", "advisor.cli.recommend", "advisor.profiles",
                          "advisor.moe.stage", "advisor.moe.memory", "advisor.moe.transient",
                          "advisor.moe.time",  # a dense model's sweep
                          "scipy", "rich",  # neither the JSON nor the search needs them
                          # a command's reader (--from-command): the sweep's MoE flags do not need it
                          "advisor.shell_command", "advisor.megatron_layout", "shlex", "advisor.cli.from_command",
                          "advisor.cli.estimate_csv",  # the estimate's CSV
                          "advisor.sweep_columns"}  # the table's columns


def test_moe_sweep_imports_not_the_dense_search():
    modules, shown = _modules_after(["sweep", "--model", "mixtral-8x7b", "--gpus", "8", "--mem", "80", "--top", "1",
                                     "--format", "json"])
    assert '"ep"' in shown
    assert not modules & {"advisor.sweep", "advisor.space_search", "advisor.space_pricer", "advisor.rank_times"}
