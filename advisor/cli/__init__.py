"""``advisor``: the command line, one module per command group, thin over the core.

    estimate.py    advisor sweep, advisor estimate      (seed 004's estimator)
    models.py      advisor models, advisor gpus         (the built-in model and GPU presets)
    profile.py     advisor profile show | plan | run    (layer profiles, CAPTURE's campaign)
    recommend.py   advisor recommend                    (CAPTURE's planner)
    compare_log.py advisor compare-log                  (a training log against the estimate)
    from_command.py estimate --from-command's reading of a user's launch
    options.py     what they share: option bundles, one-line errors, output
    progress.py    the progress of a running campaign

Only click is imported at start-up; numpy, rich and matplotlib load inside the commands that
need them, so ``advisor --help`` starts fast.
"""

from __future__ import annotations

import click

from advisor.cli import compare_log, estimate, models, profile, recommend
from advisor.cli.options import EPILOG, OneLineErrors


class AdvisorGroup(OneLineErrors, click.Group):
    """The ``advisor`` group: every input error as one line with exit status 2."""


@click.group(cls=AdvisorGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="megatron-4d-advisor", prog_name="advisor")
def cli() -> None:
    """Plan 4D parallelism (TP, CP, PP, DP, micro-batch, and EP for mixtures of experts) for
    training with Megatron-LM, before spending a cluster-hour.

    \b
      advisor sweep --gpus 64 --mem 40            which layouts fit on 64 GPUs of 40 GiB, ranked
      advisor sweep --gpus 64 --gpu h100-80gb     which run and how fast on 64 H100s
      advisor estimate --tp 2 --pp 2 --mbs 1 --gpus 8 --gpu h100-80gb
                                                  one layout, stage by stage, and its step time
      advisor estimate --from-command train.sh    the same for your own launch script
      advisor report sweep --gpus 64 --gpu h100-80gb -o report.html
                                                  one self-contained page to share
      advisor models, advisor gpus                the model and GPU presets

    Memory comes from the analytical estimator of "Accelerating LLM Training with 4D
    Parallelism and Memory Consumption Estimator" (Eq. 1-18), in GiB, extended to today's
    training options; time from a calibrated model of Megatron-LM's iteration.
    """


for command in (models.models, models.gpus, estimate.sweep, estimate.estimate, profile.profile,
                recommend.recommend, compare_log.compare_log):
    cli.add_command(command)
cli.add_command(__import__("advisor.cli.report", fromlist=["report"]).report)  # issue 25: HTML report


def main() -> None:
    cli(prog_name="advisor")
