"""Run a profiling campaign on GPUs: every run through torchrun and the user's Megatron-LM.

    python -m launch.campaign_runner CAMPAIGN --out DIR --megatron-lm DIR [--mock-data]
        [--train-iters N] [--slurm [--rdzv-port P]] [--run ID] [-- MEGATRON_ARGS...]

``advisor profile run --megatron-lm DIR`` starts this module as a subprocess and draws its
progress from the events it prints on stdout; the loop, resuming and what counts as done are
``advisor.capture.campaign_run``'s, shared with the CPU emulator's runner
(``megatron_hooks.campaign_runner``). Each campaign run becomes one
``torchrun --standalone --nproc-per-node N -m launch.entry --profile-dir DIR/<run id> ...``:
the user's ``pretrain_gpt.py`` with the run's Megatron-LM flags (from ``advisor profile plan``),
``--train-iters`` (2 by default, CAPTURE's profiling runs), no evaluation (``no_evaluation``) and
the user's own arguments, with
``megatron_hooks`` writing one rank file per GPU, in the environment Megatron demands for the
run's layout (``launch.megatron_versions``: CUDA_DEVICE_MAX_CONNECTIONS=1 with TP or CP > 1) and
with the flags of the checkout's release. A run that runs out of memory is recorded by
the hooks; its outcome is "oom" and the campaign goes on.

Where the runs go:

- one node (the default): ``torchrun --standalone`` on this node; a campaign planned for more
  GPUs than a node has (its --gpus over its --gpus-per-node) is refused before anything starts;
- ``--slurm``, inside a Slurm allocation (``salloc``, or a batch script): each run is
  ``srun --nodes N --ntasks-per-node 1`` of one torchrun per node (N = the run's GPUs / the
  campaign's GPUs per node), meeting at a c10d rendezvous on the allocation's first node, as
  ``advisor-launch sbatch`` does for one run. The allocation must hold N nodes.

torchrun's own output goes to stderr as it comes, and into the run's ``launch.log`` beside its
rank files (``LAUNCH_LOG``); a run that fails before any rank profiles names that file and its
first error line. This process imports no torch.

Exit status: 0 when every run ended ok or oom, 1 when a run failed, 2 on bad input.
"""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from advisor.capture.campaign import PROFILING_ITERATIONS
from advisor.capture.campaign_run import prepare, run_campaign, world_size
from advisor.errors import AdvisorError
from advisor.models import LlamaSpec
from launch.arguments import compose, flag_values
from launch.checkout import Release
from launch.commands import DEFAULT_RDZV_PORT, Rendezvous, Topology, entry_options, split_world, torchrun_argv
from launch.evaluation import check_values as check_evaluation
from launch.job import check_length, check_rates
from launch.megatron_versions import LaunchShape, environment
from launch.process import TORCH_ENVIRONMENT, require_program, run_process_group



def topology(campaign: dict, run: dict) -> Topology:
    """The nodes of one run: its GPUs on nodes of the campaign's GPUs per node."""
    world, per_node = world_size(run), campaign["gpus_per_node"]
    return split_world(world, per_node, f"run {run['id']} needs {world} GPUs, not a whole number of nodes of {per_node}")


def launch_problem(campaign: dict, *, slurm_nodes: int | None) -> str | None:
    """Why this runner cannot run the campaign as planned (on one node, or on an allocation of
    ``slurm_nodes`` nodes), or None. The campaign is one ``read_campaign`` checked (its
    gpus_per_node a positive integer)."""
    per_node = campaign["gpus_per_node"]
    for run in campaign["runs"]:
        if not run.get("launchable", True):
            return f"run {run['id']} is not launchable on stock Megatron-LM"
        if not isinstance(run.get("megatron_args"), list):
            return f"run {run['id']} has no megatron_args (plan the campaign with advisor profile plan)"
        nodes = topology(campaign, run).nnodes
        if slurm_nodes is None and nodes > 1:
            return (f"run {run['id']} needs {world_size(run)} GPUs, more than a node's {per_node}; without --slurm "
                    f"each run starts on this node: use --slurm inside an allocation of {nodes} nodes, or plan "
                    f"the campaign with --gpus at most the GPUs of a node")
        if slurm_nodes is not None and nodes > slurm_nodes:
            return (f"run {run['id']} needs {nodes} nodes of {per_node} GPUs; this Slurm allocation has "
                    f"{slurm_nodes} (SLURM_NNODES)")
    return None


@dataclass(frozen=True, kw_only=True, slots=True)
class SlurmAllocation:
    """The allocation this runner is inside: its job, its node count, its first node."""

    job_id: str
    nodes: int
    head_node: str
    rdzv_port: int = DEFAULT_RDZV_PORT
    cpus_per_task: str | None = None
    """The node's CPUs for its one task (srun no longer inherits sbatch's since Slurm 22.05)."""

    @classmethod
    def from_environment(cls, rdzv_port: int) -> "SlurmAllocation":
        job_id, nodes, node_list = (os.environ.get(name) for name in ("SLURM_JOB_ID", "SLURM_NNODES",
                                                                       "SLURM_JOB_NODELIST"))
        if not job_id or not node_list:
            raise AdvisorError("--slurm runs inside a Slurm allocation (salloc, or a batch script): "
                               "SLURM_JOB_ID and SLURM_JOB_NODELIST are not set")
        if not (nodes or "").isdecimal():
            raise AdvisorError(f"SLURM_NNODES must be a node count, got {nodes!r}")
        for program in ("srun", "scontrol"):
            require_program(program, "--slurm runs inside a Slurm allocation")
        hosts = subprocess.run(["scontrol", "show", "hostnames", node_list], capture_output=True, text=True)
        if hosts.returncode != 0 or not hosts.stdout.split():
            raise AdvisorError(f"scontrol show hostnames {node_list} failed: {hosts.stderr.strip() or 'no hosts'}")
        cpus = os.environ.get("SLURM_CPUS_PER_TASK") or os.environ.get("SLURM_CPUS_ON_NODE")
        return cls(job_id=job_id, nodes=int(nodes), head_node=hosts.stdout.split()[0], rdzv_port=rdzv_port,
                   cpus_per_task=cpus if (cpus or "").isdecimal() else None)

    def wrap(self, nodes: Topology, entry: Sequence[str], megatron: Sequence[str], run_id: str) -> list[str]:
        """srun of one torchrun per node, meeting on the first node."""
        rendezvous = Rendezvous(host=self.head_node, port=self.rdzv_port, rdzv_id=f"{self.job_id}-{run_id}")
        cpus = [f"--cpus-per-task={self.cpus_per_task}"] if self.cpus_per_task else []
        return ["srun", f"--nodes={nodes.nnodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1", *cpus,
                *torchrun_argv(nodes, entry, megatron, rendezvous)]


def early_exit_problem(extras: Sequence[str], train_iters: int) -> str | None:
    """Why the user's arguments would end a campaign run before its ``train_iters`` iterations, or
    None. Megatron-LM's train loop returns after an iteration that --exit-interval divides, or once
    --exit-duration-in-mins minutes have passed (megatron/training/training.py, core_v0.15.2 and
    core_v0.19.0: ``if args.exit_interval and iteration % args.exit_interval == 0``), and the
    script exits with status 0: every rank file then ends "ok" after fewer iterations, which the
    campaign counts as complete and the recommender reads (core_v0.15.2 on the CPU, --exit-interval
    1 with --train-iters 2: one iteration recorded, the last stage's peak 7.30 MiB against 9.46 with
    both). A value argparse refuses is left to ``compose``, which says so."""
    values = flag_values(extras)
    for flag in ("--exit-interval", "--exit-duration-in-mins"):
        given = values.get(flag, ())
        if not given or not given[0].isdecimal() or int(given[0]) == 0:  # 0 or none: Megatron never exits early
            continue
        if flag == "--exit-interval" and int(given[0]) >= train_iters:
            continue
        ends = (f"ends each run after iteration {given[0]} of its {train_iters}" if flag == "--exit-interval"
                else f"can end a run after {given[0]} minutes, before its {train_iters} iterations")
        return (f"{flag} {given[0]} (after --) {ends} (--train-iters), with exit status 0, so its profile would "
                f"read as complete: leave it out of a profiling campaign")
    return None


def no_evaluation(given: dict, train_iters: int) -> tuple[str, ...]:
    """The flags that keep Megatron-LM from evaluating in a profiling run, each unless the user
    gives it after ``--``: ``--eval-iters 0`` (core_v0.15.2's default, 100 at the end on the
    validation and on the test set, 200 forward-only iterations after a 2-iteration run: nothing
    a profile measures), and ``--eval-interval`` (core_v0.19.0 has none by default and its data
    setup divides by it: ``get_train_valid_test_num_samples``, training.py, fails with a TypeError
    without one; ``advisor.evaluation``)."""
    flags = () if "--eval-iters" in given else ("--eval-iters", "0")
    return flags + (() if "--eval-interval" in given else ("--eval-interval", str(max(train_iters, 1))))


LAUNCH_LOG = "launch.log"
"""Each run's torchrun output, stdout and stderr together, in its directory beside the ranks'
profiles (also on this process's stderr as it comes): a failed run's reason outlives the
terminal, and a campaign's runs do not share one scrolled-away stream."""


_ERROR_LINE = re.compile(r"\b(\w*Error|error)\b:")


def _last_line(log: Path) -> str:
    """'; first error: ...' where a rank's first error line in the run's log says why it failed
    (argparse's 'pretrain_gpt.py: error: ...', a Python exception's last line), not torchrun's
    own summary of its failed children, which always comes last; else '; last line: ...'; ''
    for an empty or unreadable log."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines()]
    except OSError:
        return ""
    for line in lines:
        if _ERROR_LINE.search(line) and "ChildFailedError" not in line and "torch.distributed.elastic" not in line:
            return f"; first error: {line[:200]}"
    told = [line for line in lines if line.strip("=-_ ")]
    return f"; last line: {told[-1][:200]}" if told else ""


class TorchrunExecutor:
    """Campaign runs on this node's GPUs through ``launch.entry``; see the module docstring."""

    def __init__(self, release: Release, *, mock_data: bool, train_iters: int, extras: Sequence[str],
                 slurm: SlurmAllocation | None = None) -> None:
        self.release, self.mock_data, self.extras, self.slurm = release, mock_data, tuple(extras), slurm
        values = flag_values(extras)
        self.iterations = () if "--train-iters" in values else ("--train-iters", str(train_iters))
        if values.get("--train-iters", ("",))[0].isdecimal():  # the user's own, which Megatron-LM then runs
            train_iters = int(values["--train-iters"][0])
        self.iterations += no_evaluation(values, train_iters)
        if problem := early_exit_problem(extras, train_iters):
            raise AdvisorError(problem)
        # values Megatron-LM takes and then fails on at every rank, refused before any run as
        # advisor-launch refuses them (the campaign writes its own length; the user's may replace it)
        check_evaluation(extras)
        check_length(extras, release.rules)
        check_rates(extras)

    def argv(self, campaign: dict, run: dict, directory: Path) -> tuple[list[str], dict[str, str]]:
        """The command of one campaign run (torchrun on this node, or srun of torchrun per node)
        and the environment Megatron-LM demands for its layout."""
        model = LlamaSpec(**campaign["model"])
        megatron = compose(f"campaign run {run['id']}", [*run["megatron_args"], *self.iterations],
                           rules=self.release.rules, model=model, mock_data=self.mock_data, extras=self.extras)
        env = environment(self.release.rules, LaunchShape.of(run["tp"], run["cp"], megatron.args))
        run_id = f"{run['id']}-{uuid.uuid4().hex[:8]}"
        entry = entry_options(self.release.checkout, profile_dir=directory, run_id=run_id)
        nodes = topology(campaign, run)
        if self.slurm is not None:
            return self.slurm.wrap(nodes, entry, megatron.args, run_id), env.settings
        return torchrun_argv(nodes, entry, megatron.args), env.settings

    def run(self, campaign: dict, run: dict, directory: Path) -> None:
        argv, env = self.argv(campaign, run, directory)
        log = directory / LAUNCH_LOG
        status = run_process_group(argv, raise_on_signal=True, environment=env, log=log)
        if status != 0 and not any(directory.glob("rank*.jsonl")):
            raise RuntimeError(f"torchrun exited with status {status} before any rank wrote its profile (its output: "
                               f"{log}{_last_line(log)})")

    def close(self) -> None:
        pass


def run(campaign: Path, out: Path, megatron_lm: str | None = None, mock_data: bool = False,
        train_iters: int | None = None, slurm: bool = False, rdzv_port: int | None = None,
        only: str | None = None, user_args: Sequence[str] = ()) -> int:
    """Run a campaign through torchrun and Megatron-LM into ``out`` (``only``: one run of it, a job
    array's task; ``train_iters`` None: ``PROFILING_ITERATIONS``, ``rdzv_port`` None:
    ``DEFAULT_RDZV_PORT``); returns the exit status (module docstring). Bad input raises
    AdvisorError before any run starts."""
    from launch.checkout import resolve_release
    from launch.preflight import Setup, import_problems, python_problems

    document = prepare(campaign, out, backend="megatron")  # bad input before any work
    if only is not None:
        document = {**document, "runs": [each for each in document["runs"] if each["id"] == only]}
        if not document["runs"]:
            raise AdvisorError(f"--run {only!r}: {campaign} has no such run")
    port = DEFAULT_RDZV_PORT if rdzv_port is None else rdzv_port
    allocation = SlurmAllocation.from_environment(port) if slurm else None
    if problem := launch_problem(document, slurm_nodes=allocation.nodes if allocation else None):
        raise AdvisorError(problem)
    release = resolve_release(megatron_lm, None, need_checkout=True)
    # the preflight's Python and imports (launch.preflight), as one line: advisor profile run relays it
    setup = Setup(rules=release.rules, checkout=release.checkout, args=tuple(user_args), cp=1, gpus_per_node=1)
    if problems := python_problems(setup) + import_problems(setup):
        raise AdvisorError("; ".join(problems))
    executor = TorchrunExecutor(release, mock_data=mock_data, train_iters=train_iters or PROFILING_ITERATIONS,
                                extras=user_args, slurm=allocation)
    for each in document["runs"]:  # a conflict with the user's arguments, before any run starts
        executor.argv(document, each, Path(out) / each["id"])
    require_program("torchrun", TORCH_ENVIRONMENT)
    return run_campaign(document, Path(out), executor)


if __name__ == "__main__":  # the command line is the one CLI's (advisor.cli.runners)
    from advisor.cli.runners import megatron_runner

    megatron_runner(run).main(prog_name="python -m launch.campaign_runner")
