"""``advisor``: the command line, one module per command group, thin over the core.

    estimate.py    advisor sweep, advisor estimate      (seed 004's estimator)
    models.py      advisor models, advisor gpus         (the built-in model and GPU presets)
    profile.py     advisor profile show | plan | run    (layer profiles, CAPTURE's campaign)
    recommend.py   advisor recommend                    (CAPTURE's planner)
    compare_log.py advisor compare-log                  (a training log against the estimate)
    from_command.py estimate --from-command's reading of a user's launch
    options.py     what they share: option bundles, one-line errors, output
    progress.py    the progress of a running campaign

Only click and ``options`` are imported at start-up: each command's module loads when that
command runs (``COMMANDS``, click's "lazily loading subcommands" pattern), and numpy, rich and
matplotlib inside the commands that need them, so ``advisor --help`` starts fast.
"""

from __future__ import annotations

import importlib
import sys
from typing import NamedTuple

import click

from advisor.cli.help_sections import with_sections
from advisor.cli.options import EPILOG, CloseCommands, OneLineErrors
from advisor.cli.spellings import add_megatron_spellings, megatron_flag_message, megatron_nargs, one_value_each


class Lazy(NamedTuple):
    module: str
    attribute: str
    short_help: str
    """What ``advisor --help`` lists; the one place it is written (the command gets it too)."""


COMMANDS = {
    "compare-log": Lazy("advisor.cli.compare_log", "compare_log",
                        "Measured against predicted: the step time, TFLOP/s per GPU and peak memory per pipeline "
                        "stage of a Megatron-LM training log, beside the advisor's estimate of its command."),
    "estimate": Lazy("advisor.cli.estimate", "estimate",
                     "Per-GPU memory of one configuration, stage by stage; with --gpu, its step time too."),
    "gpus": Lazy("advisor.cli.models", "gpus",
                 "List the GPU presets for --gpu: memory, dense BF16/FP8 TFLOP/s, HBM, NVLink and network bandwidth, "
                 "GPUs per node, and the vendor specification each number comes from (JSON)."),
    "models": Lazy("advisor.cli.models", "models",
                   "List the built-in presets (Llama, Qwen3 and mixtures of experts) and their hyper-parameters; total and "
                   "active parameters (equal for dense models; MoE: top-k experts, embeddings included)."),
    "profile": Lazy("advisor.cli.profile", "profile", "Plan, run and read layer-by-layer memory profiles of Megatron runs."),
    "recommend": Lazy("advisor.cli.recommend", "recommend",
                      "Recommend the layers per stage (and, in hybrid mode, per-stage degrees) with the lowest "
                      "predicted peak memory, or with the shortest predicted period under the memory limit."),
    "report": Lazy("advisor.cli.report", "report",
                   "One self-contained HTML page (no network at view time) for a sweep, an estimate or a plan."),
    "sweep": Lazy("advisor.cli.estimate", "sweep",
                  "Every layout Megatron-LM can launch on N GPUs (--gpus), one row per (TP, CP, PP, DP, MBS) with its "
                  "layers per stage, interleaving (VPP) and recomputation; judge which run, and rank them."),
}
"""Every command: where it lives and its short help. A command's module (and what it imports:
the training options, MoE, the report) loads only when that command is asked for."""


class AdvisorGroup(OneLineErrors, CloseCommands):
    """The ``advisor`` group: every input error as one line with exit status 2; commands load
    on demand (``COMMANDS``)."""

    def main(self, args=None, *rest, **extra):
        """Megatron's space-separated --recompute-modules taken as the advisor's repeated option."""
        return super().main(megatron_nargs(sys.argv[1:] if args is None else list(args)), *rest, **extra)

    def no_such_option(self, exc: click.NoSuchOption, message: str) -> str:
        """A Megatron-LM flag the command has no option for: where a whole Megatron command is read."""
        worded = super().no_such_option(exc, message)
        return (megatron_flag_message(exc) or worded) if worded == message else worded

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.commands and name in COMMANDS:
            lazy = COMMANDS[name]
            command = getattr(importlib.import_module(lazy.module), lazy.attribute)
            command.short_help = lazy.short_help
            add_megatron_spellings(command)
            one_value_each(command)
            with_sections(command)  # a long --help in titled sections
            self.add_command(command, name)
        return self.commands.get(name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands with their short help from ``COMMANDS``, without importing them."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(name) for name in names)
        # a stand-in Command shortens the help as click does (click 8.5 deprecates make_default_short_help)
        rows = [(name, (click.Command(name, help=COMMANDS[name].short_help) if name in COMMANDS
                        else self.get_command(ctx, name)).get_short_help_str(limit)) for name in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=AdvisorGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="megatron-4d-advisor", prog_name="advisor")
def cli() -> None:
    """Plan 4D parallelism (TP, CP, PP, DP, micro-batch, and EP for mixtures of experts) for
    training with Megatron-LM, before spending a cluster-hour.

    \b
      advisor sweep --gpus 64 --mem 40
          which layouts fit on 64 GPUs of 40 GiB, ranked
      advisor sweep --gpus 64 --gpu h100-80gb
          which run and how fast on 64 H100s
      advisor estimate --tp 2 --pp 2 --mbs 1 --gpus 8 --gpu h100-80gb
          one layout, stage by stage, and its step time
      advisor estimate --from-command train.sh
          the same for your own launch script
      advisor report sweep --gpus 64 --gpu h100-80gb -o report.html
          one self-contained page to share
      advisor models, advisor gpus
          the model and GPU presets

    Memory comes from the analytical estimator of "Accelerating LLM Training with 4D
    Parallelism and Memory Consumption Estimator" (Eq. 1-18), in GiB, extended to today's
    training options; time from a calibrated model of Megatron-LM's iteration.
    """



def main() -> None:
    cli(prog_name="advisor")
