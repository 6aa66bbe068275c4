"""Run a profiling campaign on GPUs: every run through torchrun and the user's Megatron-LM.

    python -m launch.campaign_runner CAMPAIGN --out DIR --megatron-lm DIR [--mock-data]
        [--train-iters N] [-- MEGATRON_ARGS...]

``advisor profile run --megatron-lm DIR`` starts this module as a subprocess and draws its
progress from the events it prints on stdout; the loop, resuming and what counts as done are
``advisor.capture.campaign_run``'s, shared with the CPU emulator's runner
(``megatron_hooks.campaign_runner``). Each campaign run becomes one
``torchrun --standalone --nproc-per-node N -m launch.entry --profile-dir DIR/<run id> ...``:
the user's ``pretrain_gpt.py`` with the run's Megatron-LM flags (from ``advisor profile plan``),
``--train-iters`` (2 by default, CAPTURE's profiling runs) and the user's own arguments, with
``megatron_hooks`` writing one rank file per GPU. A run that runs out of memory is recorded by
the hooks; its outcome is "oom" and the campaign goes on.

One node runs every run: a campaign planned for more GPUs than a node has (its --gpus over its
--gpus-per-node) is refused before anything starts. torchrun's own output goes to stderr. This
process imports no torch.

Exit status: 0 when every run ended ok or oom, 1 when a run failed, 2 on bad input.
"""

from __future__ import annotations

import shutil
import sys
import uuid
from pathlib import Path
from typing import Sequence

import click

from advisor.cli_options import OneLineErrors
from advisor.errors import AdvisorError
from advisor.models import LlamaSpec
from launch.arguments import compose, flag_values
from launch.commands import Topology, entry_options, torchrun_argv
from launch.process import run_process_group

PROFILING_ITERATIONS = 2


def launch_problem(campaign: dict) -> str | None:
    """Why this runner cannot run the campaign as planned, or None."""
    per_node = campaign.get("gpus_per_node")
    for run in campaign["runs"]:
        if not run.get("launchable", True):
            return f"run {run['id']} is not launchable on stock Megatron-LM"
        world = run["tp"] * run.get("cp", 1) * run["dp"] * len(run["layers_per_stage"])
        if isinstance(per_node, int) and world > per_node:
            return (f"run {run['id']} needs {world} GPUs, more than a node's {per_node}; advisor profile run "
                    f"starts each run on one node: plan the campaign with --gpus at most the GPUs of a node")
        if not isinstance(run.get("megatron_args"), list):
            return f"run {run['id']} has no megatron_args (plan the campaign with advisor profile plan)"
    return None


class TorchrunExecutor:
    """Campaign runs on this node's GPUs through ``launch.entry``; see the module docstring."""

    def __init__(self, checkout: Path, *, mock_data: bool, train_iters: int, extras: Sequence[str]) -> None:
        self.checkout, self.mock_data, self.extras = checkout, mock_data, tuple(extras)
        self.iterations = () if "--train-iters" in flag_values(extras) else ("--train-iters", str(train_iters))

    def argv(self, campaign: dict, run: dict, directory: Path) -> list[str]:
        """The torchrun command of one campaign run."""
        model = LlamaSpec(**campaign["model"])
        megatron = compose(f"campaign run {run['id']}", [*run["megatron_args"], *self.iterations],
                           mock_data=model if self.mock_data else None, extras=self.extras)
        world = run["tp"] * run.get("cp", 1) * run["dp"] * len(run["layers_per_stage"])
        entry = entry_options(self.checkout, profile_dir=directory, run_id=f"{run['id']}-{uuid.uuid4().hex[:8]}")
        return torchrun_argv(Topology(nnodes=1, nproc_per_node=world), entry, megatron.args)

    def run(self, campaign: dict, run: dict, directory: Path) -> None:
        status = run_process_group(self.argv(campaign, run, directory), raise_on_signal=True)
        if status != 0 and not any(directory.glob("rank*.jsonl")):
            raise RuntimeError(f"torchrun exited with status {status} before any rank wrote its profile "
                               "(its output is on stderr)")

    def close(self) -> None:
        pass


class RunnerCommand(OneLineErrors, click.Command):
    """Bad input: one line on stderr, exit status 2."""


@click.command(cls=RunnerCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("campaign", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory for the runs: OUT/<run id>/rank*.jsonl.")
@click.option("--megatron-lm", metavar="DIR", default=None,
              help="Your Megatron-LM checkout, holding pretrain_gpt.py (default: $MEGATRON_LM).")
@click.option("--mock-data", is_flag=True, help="Megatron-LM's mock data, with a NullTokenizer sized to the model.")
@click.option("--train-iters", type=click.IntRange(min=1), default=PROFILING_ITERATIONS, show_default=True,
              help="Iterations per profiling run (unless your arguments give --train-iters).")
@click.argument("user_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- MEGATRON_ARGS...]")
def main(campaign: Path, out: Path, megatron_lm: str | None, mock_data: bool, train_iters: int,
         user_args: tuple[str, ...]) -> None:
    """Run a profiling campaign (advisor profile plan) through torchrun and Megatron-LM, one run
    after another, resuming where it stopped.

    Prints one JSON event per line on stdout (advisor profile run draws them as a progress bar).
    """
    from advisor.capture.campaign_run import prepare, run_campaign
    from launch.checkout import resolve_checkout

    document = prepare(campaign, out, emulated=False)  # bad input before any work
    if problem := launch_problem(document):
        raise AdvisorError(problem)
    checkout = resolve_checkout(megatron_lm)
    executor = TorchrunExecutor(checkout, mock_data=mock_data, train_iters=train_iters, extras=user_args)
    for run in document["runs"]:  # a conflict with the user's arguments, before any run starts
        executor.argv(document, run, out / run["id"])
    if shutil.which("torchrun") is None:
        raise AdvisorError("torchrun not found on PATH; activate the environment where torch and this package "
                           "are installed")
    sys.exit(run_campaign(document, out, executor))


if __name__ == "__main__":
    main(prog_name="python -m launch.campaign_runner")
