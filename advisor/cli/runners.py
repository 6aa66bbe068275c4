"""The command lines of the two campaign runners that ``advisor profile run`` starts as processes:
``python -m megatron_hooks.campaign_runner`` (the CPU emulator and the symbolic backend) and
``python -m launch.campaign_runner`` (torchrun and the user's Megatron-LM).

Their options are parsed here, in the one CLI, and handed to the runner's ``run`` function, a
plain function of the plugin or the launcher (no click there), whose return value is the exit
status; bad input is one line and exit status 2 (``OneLineCommand``). The runner passes its
``run`` in (``megatron_hooks`` and ``launch`` import the core, never the reverse).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import click

from advisor.cli.options import OneLineCommand, OutDirectory, UserPath
from advisor.cli.profile import megatron_options, run_options

HELP = {"help_option_names": ["-h", "--help"]}

CPU_HELP = """Run a profiling campaign (advisor profile plan) by emulating its pipeline stages on the CPU.

Prints one JSON event per line on stdout (advisor profile run draws them as a progress bar).
Runs already complete under --out are skipped; partial ones are run again.

\b
Example:
  python -m megatron_hooks.campaign_runner campaign.json --out runs/
  python -m megatron_hooks.campaign_runner campaign.json --out runs/ \\
      --backend symbolic
"""

MEGATRON_HELP = """Run a profiling campaign (advisor profile plan) through torchrun and Megatron-LM, one run
after another, resuming where it stopped.

Prints one JSON event per line on stdout (advisor profile run draws them as a progress bar).
"""


def cpu_runner(run: Callable[..., int]) -> click.Command:
    """``python -m megatron_hooks.campaign_runner``: ``advisor profile run``'s own options
    (``run_options``: CAMPAIGN, --out, --backend, --layer-spec, --threads, --memory-limit),
    passed to ``run`` by name."""
    @click.command(cls=OneLineCommand, context_settings=HELP, help=CPU_HELP)
    @run_options
    def command(**options) -> int:
        return run(**options)
    return command


def megatron_runner(run: Callable[..., int]) -> click.Command:
    """``python -m launch.campaign_runner``: CAMPAIGN, --out, 'advisor profile run''s
    ``megatron_options`` (None where not given: the launcher's defaults), --run and the user's
    Megatron-LM arguments after '--', passed to ``run`` by name."""
    @click.command(cls=OneLineCommand, context_settings=HELP, help=MEGATRON_HELP)
    @click.argument("campaign", type=UserPath(dir_okay=False, path_type=Path))
    @click.option("--out", required=True, type=OutDirectory(hint="give the directory for the runs", path_type=Path),
                  help="Directory for the runs: OUT/<run id>/rank*.jsonl.")
    @megatron_options
    @click.option("--run", "only", metavar="ID", default=None,
                  help="Only this run of the campaign (a job array's task: launch.slurm_array).")
    @click.argument("user_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- MEGATRON_ARGS...]")
    def command(**options) -> int:
        return run(**options)
    return command
