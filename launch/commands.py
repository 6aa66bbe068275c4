"""The commands ``advisor-launch`` runs or prints: torchrun on one node or on many, and a Slurm
batch script that runs torchrun on every node of its allocation.

Every command is an argument list, quoted for a shell only when printed (``shlex``); torchrun
starts ``python -m launch.entry`` on each GPU, which runs the user's ``pretrain_gpt.py``.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from advisor import limits
from advisor.errors import AdvisorError
from advisor.parallel import DEFAULT_GPUS_PER_NODE
from advisor.row_flags import flag_values

if TYPE_CHECKING:
    from launch.inputs import LaunchInput

ENTRY_MODULE = "launch.entry"
DEFAULT_RDZV_PORT = 29500
WIDTH = 100


# --- how many nodes, how many GPUs each ------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Topology:
    nnodes: int
    nproc_per_node: int

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node


def split_world(world: int, per_node: int, uneven: str) -> Topology:
    """``world`` GPUs on nodes of at most ``per_node``: one node if they fit, else whole nodes
    (AdvisorError ``uneven`` if they do not divide)."""
    if world <= per_node:
        return Topology(nnodes=1, nproc_per_node=world)
    if world % per_node:
        raise AdvisorError(uneven)
    return Topology(nnodes=world // per_node, nproc_per_node=per_node)


def resolve_topology(config: LaunchInput, *, nnodes: int | None, per_node: int | None,
                     names: tuple[str, str] = ("--nnodes", "--nproc-per-node")) -> Topology:
    """Nodes x GPUs per node = the input's world size. Unset sizes are derived: GPUs per node
    default to the plan's (else 8), capped at the world size; ``names`` are the options' names
    for the messages."""
    world = config.world_size
    needs = (f"{config.source} needs {world} GPUs (TP {config.tp} x CP {config.cp} x PP {config.pp} "
             f"x DP {config.dp})")
    if per_node is None:
        if nnodes is None:
            per_node = min(world, config.gpus_per_node or DEFAULT_GPUS_PER_NODE)
        elif world % nnodes == 0:
            per_node = world // nnodes
        else:
            raise AdvisorError(f"{needs}, which {names[0]} {nnodes} nodes cannot share equally")
    if nnodes is None:
        return split_world(world, per_node, f"{needs}, not a whole number of nodes of {names[1]} {per_node}")
    if nnodes * per_node != world:
        raise AdvisorError(f"{needs}; {names[0]} {nnodes} x {names[1]} {per_node} = {nnodes * per_node}")
    return Topology(nnodes=nnodes, nproc_per_node=per_node)


# --- the entry's arguments -------------------------------------------------------------------


class ShellWord(str):
    """A word printed as it is, for the shell to expand (not quoted)."""


CHECKOUT_FROM_ENVIRONMENT = ShellWord('"$MEGATRON_LM"')


def shell_join(words: Sequence[str]) -> str:
    """``shlex.join``, but ShellWords as they are."""
    return " ".join(word if isinstance(word, ShellWord) else shlex.quote(word) for word in words)


def entry_options(checkout: Path | str | None, *, profile_dir: Path | None = None, run_id: str | None = None) -> list[str]:
    """``launch.entry``'s own options (the Megatron-LM arguments follow ``--``); without a
    checkout (a dry run that names none) the printed command takes it from ``$MEGATRON_LM``."""
    args = ["--megatron-lm", str(checkout) if checkout is not None else CHECKOUT_FROM_ENVIRONMENT]
    if profile_dir is not None:
        args += ["--profile-dir", str(profile_dir)]
    if run_id is not None:
        args += ["--run-id", run_id]
    return args


# --- torchrun ---------------------------------------------------------------------------------

_HOST = re.compile(r"[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]", re.ASCII)
"""A rendezvous host: a host name, an IPv4 address, or an IPv6 one in brackets (torch's
parse_rendezvous_endpoint strips them)."""
RDZV_ID_BYTES = limits.NAME_BYTES - len("_XXXXXXXX")
"""The longest --rdzv-id: torchrun names each node's log directory after it,
``tempfile.mkdtemp(prefix=f"{run_id}_")`` (torch/distributed/elastic/multiprocessing/api.py,
``DefaultLogsSpecs._make_log_dir``), eight random characters after the prefix."""


def check_rdzv_id(rdzv_id: str) -> str:
    """What torchrun would fail on, on every node once they have met: a '/' (the directory's
    parent does not exist), a name past NAME_MAX, or a leading '-' (argparse takes it for an
    option: 'expected one argument'). Blanks and newlines are fine: a store key and a file name."""
    if "/" in rdzv_id or rdzv_id.startswith("-") or len(os.fsencode(rdzv_id)) > RDZV_ID_BYTES:
        raise AdvisorError(f"--rdzv-id {rdzv_id!r}: torchrun names a log directory after the id and reads it as an "
                           f"option's value: give at most {RDZV_ID_BYTES} bytes, without '/', not starting with '-' "
                           "(e.g. the scheduler's job id)")
    return rdzv_id


@dataclass(frozen=True, kw_only=True, slots=True)
class Rendezvous:
    """Where the nodes of a multi-node torchrun meet. With ``node_rank``, torchrun's static
    rendezvous (Megatron-LM's examples: ``--node-rank --master-addr --master-port``, a different
    command per node); without, the c10d backend (the same command on every node)."""

    host: str
    port: int
    node_rank: int | None = None
    rdzv_id: str | None = None

    @classmethod
    def parse(cls, endpoint: str, *, node_rank: int | None = None, rdzv_id: str | None = None) -> "Rendezvous":
        host, sep, port = endpoint.rpartition(":")
        if not sep or not host or not port.isdecimal() or not 0 < int(port) < 65536:
            # 'node001:99999' is HOST:PORT in form: say what is wrong with it (the port), as --rdzv-port does
            port_range = " with PORT from 1 to 65,535 (a TCP port)" if sep and host and port.isdecimal() else ""
            raise AdvisorError(f"--rdzv-endpoint must be HOST:PORT{port_range}, got {endpoint!r}")
        if not _HOST.fullmatch(host):  # 'node 001' or 'node001\n' was launched, and failed to resolve on every node
            raise AdvisorError(f"--rdzv-endpoint {endpoint!r}: HOST must be a host name or an address (letters, digits, "
                               "'.', '-' and '_'; an IPv6 address in brackets)")
        return cls(host=host, port=int(port), node_rank=node_rank,
                   rdzv_id=None if rdzv_id is None else check_rdzv_id(rdzv_id))

    def args(self) -> list[str]:
        if self.node_rank is not None:
            return ["--node-rank", str(self.node_rank), "--master-addr", self.host, "--master-port", str(self.port)]
        args = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{self.host}:{self.port}"]
        return args + (["--rdzv-id", self.rdzv_id] if self.rdzv_id else [])


def torchrun_argv(topology: Topology, entry: Sequence[str], megatron: Sequence[str],
                  rendezvous: Rendezvous | None = None) -> list[str]:
    """``torchrun`` on this node, starting ``launch.entry`` with its options ``entry`` and the
    Megatron-LM arguments: ``--standalone`` alone on one node, else with the rendezvous."""
    argv = ["torchrun", "--nproc-per-node", str(topology.nproc_per_node)]
    if rendezvous is None:
        if topology.nnodes > 1:
            raise AdvisorError(
                f"{topology.nnodes} nodes of {topology.nproc_per_node} GPUs need a rendezvous: give --rdzv-endpoint "
                "HOST:PORT (run the same command on every node), or use 'advisor-launch sbatch'")
        argv.append("--standalone")
    else:
        if rendezvous.node_rank is not None and rendezvous.node_rank >= topology.nnodes:
            raise AdvisorError(f"--node-rank {rendezvous.node_rank} is not below --nnodes {topology.nnodes}")
        argv += ["--nnodes", str(topology.nnodes), *rendezvous.args()]
    return [*argv, "-m", ENTRY_MODULE, *entry, "--", *megatron]


# --- printing ---------------------------------------------------------------------------------


def _is_option(token: str) -> bool:
    if not token.startswith("-") or token == "-":
        return False
    try:
        float(token)
        return False  # a negative number is a value
    except ValueError:
        return True


def units(tokens: Sequence[str]) -> list[list[str]]:
    """Each option with the values that follow it."""
    grouped: list[list[str]] = []
    for token in tokens:
        if not grouped or _is_option(token) or grouped[-1] == ["--"]:
            grouped.append([token])
        else:
            grouped[-1].append(token)
    return grouped


def wrap(tokens: Sequence[str], *, width: int = WIDTH, indent: str = "    ", first: str = "",
         break_before: frozenset[str] = frozenset(), break_after: frozenset[str] = frozenset()) -> list[str]:
    """Shell-quoted lines of at most about ``width`` characters, never splitting an option from
    its values."""
    lines, current = [], first
    for unit in units(tokens):
        text = shell_join(unit)
        head = unit[0]
        if current.strip() and (len(current) + 1 + len(text) > width or head in break_before):
            lines.append(current)
            current = indent
        current = f"{current} {text}" if current.strip() else current + text
        if head in break_after:
            lines.append(current)
            current = indent
    if current.strip():
        lines.append(current)
    return lines


def format_command(argv: Sequence[str], environment: Mapping[str, str] | None = None, *, width: int = WIDTH) -> str:
    """A copy-pasteable command: shell-quoted, continued over lines with backslashes (each line
    within ``width`` where its words allow), a new line before the entry and after ``--``;
    ``environment`` as ``NAME=value`` before it."""
    prefix = [f"{name}={value}" for name, value in (environment or {}).items()]
    lines = wrap([*prefix, *argv], width=width - 2, break_before=frozenset({"-m"}), break_after=frozenset({"--"}))
    return " \\\n".join(lines) + "\n"


# --- Slurm ------------------------------------------------------------------------------------

_SLURM_VALUE = re.compile(r"^[\w.:@%+/=,-]+$")
# sbatch(1) --time: minutes, minutes:seconds, hours:minutes:seconds, days-hours, days-hours:minutes,
# days-hours:minutes:seconds; "UNLIMITED" or "INFINITE" in any case (Slurm's
# src/common/parse_time.c time_str2secs, which checks no field's range).
_SLURM_TIME = re.compile(r"\d+(:\d+){0,2}|\d+-\d+(:\d+){0,2}|unlimited|infinite", re.IGNORECASE | re.ASCII)


SLURM_TIME_S = 2**31 - 1 - 59
"""The longest time limit Slurm keeps, in seconds (24855-03:13:08): time_str2secs counts in a C
int and rounds up to minutes by adding 59, so a longer one wraps around; sbatch takes it without
a word and the job gets another limit (Slurm 22.05: 99999999:00:00 became 2973620-03:43:00)."""


def check_slurm_time(value: str) -> str:
    """A Slurm time limit (#SBATCH --time) as sbatch accepts it and keeps, else AdvisorError in
    one line."""
    seconds = slurm_time_seconds(value)
    if seconds is not None and seconds > SLURM_TIME_S:
        raise AdvisorError(f"--time {value!r} is longer than Slurm can keep (24855-03:13:08, about 68 years; it wraps "
                           "a longer limit around into another): give UNLIMITED for no limit")
    return value


def slurm_time_seconds(value: str) -> int | None:
    """A Slurm time limit in seconds; None for no limit (UNLIMITED, INFINITE, or 0, which Slurm
    reads as none); AdvisorError in one line where sbatch would refuse it."""
    if not _SLURM_TIME.fullmatch(value):
        raise AdvisorError(f"--time {value!r} is not a Slurm time limit: give minutes, MM:SS, HH:MM:SS, D-HH, "
                           "D-HH:MM, D-HH:MM:SS or UNLIMITED (e.g. 02:00:00 or 1-12:00:00)")
    if value.isalpha():
        return None
    days, _, clock = value.rpartition("-")
    fields = [int(field) for field in clock.split(":")]
    if days:  # D-HH, D-HH:MM, D-HH:MM:SS
        hours, minutes, seconds = (fields + [0, 0])[:3]
    elif len(fields) == 3:  # HH:MM:SS
        hours, minutes, seconds = fields
    else:  # MM, MM:SS
        hours, (minutes, seconds) = 0, (fields + [0])[:2]
    return ((int(days or 0) * 24 + hours) * 3600 + minutes * 60 + seconds) or None


SIGNAL_TIME_S = 300
"""Seconds before the time limit that Slurm sends SIGTERM (``#SBATCH --signal=TERM@300``): one
iteration and a checkpoint save. Slurm may send it up to 60 s earlier (its event resolution)."""
EXIT_SIGNAL_HANDLER = "--exit-signal-handler"


def signal_at_start_warning(time: str | None, signal_time_s: int) -> str | None:
    """A warning where the time limit is no longer than Slurm's SIGTERM lead (and its 60 s of
    resolution): the job is told to stop as it starts, and Megatron (--exit-signal-handler) saves
    and exits after its first iteration. None without a limit, or where the limit leaves time."""
    limit = None if time is None else slurm_time_seconds(time)
    if limit is None or limit > signal_time_s + 60:
        return None
    return (f"warning: --time {time} is {limit:,} s and Slurm sends SIGTERM --signal-time {signal_time_s} s before "
            "it (up to 60 s earlier): Megatron stops after its first iteration; give a longer --time or a shorter "
            "--signal-time")
NODE_CPUS = ShellWord('--cpus-per-task="${SLURM_CPUS_PER_TASK:-$SLURM_CPUS_ON_NODE}"')


@dataclass(frozen=True, kw_only=True, slots=True)
class SlurmJob:
    """The #SBATCH settings that ``advisor-launch sbatch`` writes besides nodes and GPUs.

    The signal before the time limit: ``--signal=TERM@S`` without ``B:``, so that Slurm signals
    the job step's tasks (torchrun on every node), not the batch shell (bash would not pass it on
    to srun). SIGTERM because it is the one signal that reaches Megatron's handler on both paths:
    torchrun forwards only TERM/INT/HUP/QUIT to its workers (``--signals-to-handle``' default),
    and core_v0.15.2's ``--exit-signal-handler`` catches only SIGTERM (core_v0.19.0's
    ``--exit-signal`` defaults to it). torchrun kills its workers a shutdown timeout after
    forwarding (30 s by default): the script sets it to S (``shutdown_environment``), so Megatron
    has until the limit to finish its iteration, save (with ``--save``) and exit."""

    job_name: str
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    qos: str | None = None
    cpus_per_task: int | None = None
    """CPUs of each node's one task (torchrun and its ranks); None: every CPU of the node."""
    signal_time_s: int | None = SIGNAL_TIME_S
    """None: no signal (a job array's short profiling runs: a killed one is redone)."""
    requeue: bool = False
    rdzv_port: int = DEFAULT_RDZV_PORT

    def __post_init__(self) -> None:
        for name in ("job_name", "partition", "account", "time", "qos"):
            value = getattr(self, name)
            if value == "":
                raise AdvisorError(f"--{name.replace('_', '-')} is empty: give a value, or leave the option out")
            if value is not None and not _SLURM_VALUE.match(value):
                raise AdvisorError(f"--{name.replace('_', '-')} {value!r}: use letters, digits and . : @ % + / = , - _")
        if self.time is not None:
            check_slurm_time(self.time)
        if not limits.TCP_PORT.low <= self.rdzv_port <= limits.TCP_PORT.high:
            raise AdvisorError(f"--rdzv-port must be a TCP port, got {self.rdzv_port}")

    def directives(self, topology: Topology, *, logs: str = "%x-%j") -> list[str]:
        """The #SBATCH lines; ``logs``: the output and error files' stem (%x the job name, %j its
        id, %A_%a an array task). ``--mem=0`` beside ``--exclusive``: sbatch(1) --exclusive
        allocates every CPU and GRES of a node but only the memory requested (the partition's
        DefMemPerNode, on a cluster that schedules memory), and --mem=0 is all of each node's
        memory; Megatron-Bridge's Slurm executor does the same (scripts/performance/executors.py:
        mem="0", exclusive=True)."""
        settings = [("job-name", self.job_name), ("nodes", topology.nnodes), ("ntasks-per-node", 1),
                    ("gpus-per-node", topology.nproc_per_node), ("exclusive", True), ("mem", 0),
                    ("cpus-per-task", self.cpus_per_task), ("output", f"{logs}.out"), ("error", f"{logs}.err"),
                    ("signal", self.signal_time_s and f"TERM@{self.signal_time_s}"), ("requeue", self.requeue or None),
                    ("partition", self.partition), ("account", self.account), ("qos", self.qos), ("time", self.time)]
        return [f"#SBATCH --{key}" if value is True else f"#SBATCH --{key}={value}"
                for key, value in settings if value is not None]

    def srun(self) -> list[str]:
        """srun of one task per node with the node's CPUs (srun no longer inherits sbatch's
        --cpus-per-task since Slurm 22.05; with --exclusive, SLURM_CPUS_ON_NODE is all of them),
        every task killed when one fails."""
        return ["srun", "--kill-on-bad-exit=1", NODE_CPUS]

    def shutdown_environment(self) -> dict[str, str]:
        """torchrun waits the signal's lead before it kills the ranks it forwarded SIGTERM to. The
        variable, not torchrun's ``--shutdown-timeout``: torch reads TORCH_ELASTIC_SHUTDOWN_TIMEOUT
        where the flag is not given (``torch/distributed/launcher/api.py``), and the releases
        before both (PyTorch PR #172596) ignore the variable, where the flag would stop torchrun
        on every node with 'unrecognized arguments' (they wait their fixed 30 s)."""
        return {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(self.signal_time_s)} if self.signal_time_s else {}


def with_exit_signal_handler(groups: Sequence[tuple[str, Sequence[str]]]) -> list[tuple[str, Sequence[str]]]:
    """The Megatron-LM argument groups with ``--exit-signal-handler`` (unless given) before the
    last group (the user's own, which stay last): Megatron then saves (with --save) and exits at
    the end of the iteration in which SIGTERM came. Its comment says which: without --save
    Megatron exits and saves nothing (training.py, checkpoint_and_decide_exit)."""
    if any(EXIT_SIGNAL_HANDLER in args for _, args in groups):
        return list(groups)
    # --save=DIR is argparse's too: the flags as parsed, not the words
    saves = any("--save" in flag_values(args) for _, args in groups)
    then = "save, exit" if saves else "exit (no --save: nothing is saved)"
    handler = (f"Slurm's SIGTERM before the time limit: finish the iteration, {then}", (EXIT_SIGNAL_HANDLER,))
    return [*groups[:-1], handler, *groups[-1:]]


def _exports(reason: str, environment: Mapping[str, str] | None) -> list[str]:
    """A commented block of ``export`` lines (nothing without variables)."""
    if not environment:
        return []
    return [f"# {reason}", *(f"export {name}={shlex.quote(value)}" for name, value in environment.items()), ""]


def sbatch_script(job: SlurmJob, topology: Topology, entry_options: Sequence[str],
                  megatron: Sequence[tuple[str, Sequence[str]]], *, description: str,
                  environment: Mapping[str, str] | None = None, environment_reason: str = "") -> str:
    """A batch script: one torchrun per node (``srun --ntasks-per-node=1``), meeting at a c10d
    rendezvous on the allocation's first node, each starting ``launch.entry`` on its GPUs.
    ``entry_options`` are the entry's own options; ``megatron`` the Megatron-LM arguments in
    labelled groups (the input's, ``--mock-data``'s, the user's); ``environment`` what every rank
    needs (exported before srun, which passes the job's environment on), for
    ``environment_reason``."""
    def comment(text: str) -> str:  # a file name may hold a newline; a comment may not
        return " ".join(text.splitlines())

    array = []
    for label, args in (with_exit_signal_handler(megatron) if job.signal_time_s else megatron):
        if args:
            array += [f"    # {comment(label)}", *wrap(args, first="    ")]
    torchrun = ["torchrun", "--nnodes", str(topology.nnodes), "--nproc-per-node", str(topology.nproc_per_node),
                "--rdzv-backend", "c10d"]
    launch_line = (
        f"{shell_join(job.srun())} \\\n    {shlex.join(torchrun)} \\\n"
        f'    --rdzv-endpoint "${{head_node}}:{job.rdzv_port}" --rdzv-id "$SLURM_JOB_ID" \\\n'
        f"    {shell_join(['-m', ENTRY_MODULE, *entry_options])} \\\n"
        f'    -- "${{megatron_args[@]}}"'
    )
    return "\n".join([
        "#!/bin/bash",
        f"# Written by advisor-launch: {comment(description)}.",
        "# Submit with: sbatch THIS_FILE (Slurm passes your environment, with torch and this package, to the job).",
        *job.directives(topology),
        "set -euo pipefail",
        "",
        "# torchrun's c10d rendezvous runs on the first node of the allocation.",
        # sed, not head: head exits after one line and, under pipefail, scontrol's broken pipe
        # would fail the script.
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',
        "",
        *_exports(comment(environment_reason), environment),
        *_exports(f"torchrun waits {job.signal_time_s} s after forwarding SIGTERM before it kills the ranks (older "
                  "torch: 30 s)", job.shutdown_environment()),
        "megatron_args=(",
        *array,
        ")",
        "",
        launch_line,
        "",
    ])
