"""A profiling campaign as one Slurm job array: one array task per run not yet complete.

    python -m launch.slurm_array CAMPAIGN --out DIR --megatron-lm DIR [--mock-data] [--train-iters N]
        [--partition P] [--account A] [--time T] [--qos Q] [--rdzv-port P] [-o FILE] [--dry-run]
        [-- MEGATRON_ARGS...]

``advisor profile run CAMPAIGN --slurm-array ...`` starts this module. The script asks, for every
task, for the widest run's nodes (the campaign's GPUs per node each, whole nodes); task i runs
``python -m launch.campaign_runner CAMPAIGN --out DIR --slurm --run ID_i``: the runner's own
loop, resuming and srun of one torchrun per node, restricted to that run. Resumable by
resubmission: runs already complete under --out get no task (and a task whose run completed in
the meantime finds it complete and does nothing); a run a task left partial (killed, scancel'd,
a node lost) is run again from scratch. The campaign, --out and the checkout must be on a file
system the nodes share; the job inherits the submitting environment (torch and this package).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Sequence

import click

from advisor.capture.campaign import PROFILING_ITERATIONS
from advisor.capture.campaign_run import backend_fields, prepare, scan
from advisor.cli.options import (MEGATRON_CHECKOUT, TCP_PORT, TRAIN_ITERS, OneLineCommand, UserPath,
                                 output_option)
from advisor.errors import AdvisorError
from launch.commands import DEFAULT_RDZV_PORT, ShellWord, SlurmJob, Topology, wrap
from launch.process import write_or_submit

RUNNER = "launch.campaign_runner"
TASK_RUN = ShellWord('"${runs[$SLURM_ARRAY_TASK_ID]}"')


def array_script(job: SlurmJob, nodes: Topology, run_ids: Sequence[str], runner: Sequence[str],
                 megatron: Sequence[str], *, description: str) -> str:
    """The batch script: ``runs`` holds the run ids, task ``SLURM_ARRAY_TASK_ID`` runs one with
    ``runner`` (the runner's argv, --run appended) and the user's Megatron-LM arguments."""
    directives = job.directives(nodes, logs="%x-%A_%a")
    directives.insert(1, f"#SBATCH --array=0-{len(run_ids) - 1}")
    return "\n".join([
        "#!/bin/bash",
        f"# Written by advisor profile run --slurm-array: {' '.join(description.splitlines())}.",
        "# Submit with: sbatch THIS_FILE; submit again (advisor profile run ... --slurm-array) after a",
        "# failure or scancel: complete runs are skipped, partial ones redone.",
        *directives,
        "set -euo pipefail",
        "",
        "runs=(",
        *(f"    {shlex.quote(run_id)}" for run_id in run_ids),
        ")",
        "",
        " \\\n".join(wrap([*runner, "--run", TASK_RUN, *(["--", *megatron] if megatron else [])], first="exec")),
        "",
    ])


@click.command(cls=OneLineCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("campaign", type=UserPath(dir_okay=False, path_type=Path))
@click.option("--out", required=True, type=UserPath(file_okay=False, path_type=Path))
@click.option("--megatron-lm", type=MEGATRON_CHECKOUT, metavar="DIR", default=None)
@click.option("--mock-data", is_flag=True)
@click.option("--train-iters", type=TRAIN_ITERS, default=PROFILING_ITERATIONS)
@click.option("--partition", default=None)
@click.option("--account", default=None)
@click.option("--time", default=None)
@click.option("--qos", default=None)
@click.option("--rdzv-port", type=TCP_PORT, default=DEFAULT_RDZV_PORT)
@output_option("Write the script here (atomically) and submit this file; '-' prints it.")
@click.option("--dry-run", is_flag=True)
@click.argument("user_args", nargs=-1, type=click.UNPROCESSED)
def main(campaign: Path, out: Path, megatron_lm: str | None, mock_data: bool, train_iters: int,
         partition: str | None, account: str | None, time: str | None, qos: str | None, rdzv_port: int,
         output: Path | None, dry_run: bool, user_args: tuple[str, ...]) -> None:
    """Write (and submit) a campaign's job array; see the module docstring."""
    from launch.campaign_runner import SlurmAllocation, TorchrunExecutor, launch_problem, topology
    from launch.checkout import resolve_release

    # the #SBATCH settings first (--time's format among them), with the other inputs
    job = SlurmJob(job_name=f"profile-{campaign.stem}", partition=partition, account=account, time=time, qos=qos,
                   signal_time_s=None, rdzv_port=rdzv_port)
    document = prepare(campaign, out, backend="megatron")
    widest = max(topology(document, run).nnodes for run in document["runs"])
    if problem := launch_problem(document, slurm_nodes=widest):
        raise AdvisorError(problem)
    release = resolve_release(megatron_lm, None, need_checkout=True)
    # Each task runs the runner with --slurm (array_script): srun of torchrun per node, meeting on the
    # allocation's first node. Build the same commands here, the allocation's job and head node
    # stand-ins known only inside the job, so that a multi-node run needs no --rdzv-endpoint.
    allocation = SlurmAllocation(job_id="SLURM_JOB_ID", nodes=widest, head_node="HEAD_NODE", rdzv_port=rdzv_port)
    executor = TorchrunExecutor(release, mock_data=mock_data, train_iters=train_iters, extras=user_args,
                                slurm=allocation)
    for run in document["runs"]:  # a conflict with the user's arguments, before anything is submitted
        executor.argv(document, run, out / run["id"])
    # the emulator's runs under --out are not these, nor runs of another setup (another --transformer-impl)
    states = scan(document, out, backend_fields("megatron", user_args=user_args))
    pending = [run["id"] for run in document["runs"] if states[run["id"]].state != "complete"]
    if not pending:
        click.echo(f"every run of {campaign} is complete under {out}: nothing to submit", err=True)
        return
    runner = [sys.executable, "-m", RUNNER, str(campaign.resolve()), "--out", str(out.resolve()), "--megatron-lm",
              str(release.checkout.resolve()), "--train-iters", str(train_iters), "--slurm", "--rdzv-port",
              str(rdzv_port), *(["--mock-data"] if mock_data else [])]
    nodes = Topology(nnodes=widest, nproc_per_node=document["gpus_per_node"])
    script = array_script(job, nodes, pending, runner, user_args, description=(
        f"the {len(pending)} runs of {campaign} ({len(document['runs'])} in all) not complete under {out}"))
    status = write_or_submit(script, output, dry_run=dry_run)
    if status is not None:
        sys.exit(status)


if __name__ == "__main__":
    main(prog_name="python -m launch.slurm_array")
