"""Executing a profiling campaign: which runs are done, the loop, and the progress events.

Pure Python (no torch): the loop runs inside the runner process on the torch side
(``python -m megatron_hooks.campaign_runner``), which hands it an *executor*, and
``advisor profile run`` reads the runner's events to draw its progress.

Output layout: one directory per campaign run, ``OUT/<run id>/rank{RANK:05d}.jsonl`` (schema
``megatron-4d-advisor/profile``), so ``advisor recommend --profile OUT`` reads them all.

A run directory is

- *absent*: no rank files;
- *complete*: every rank of the run (TP x CP x DP x PP files) has ended "ok" or "oom". An OOM
  is an outcome of the run, not a failure of the campaign; the recommender sets such runs aside;
- *partial*: anything else (missing ranks, a rank still "running" because the run was killed, a
  rank ended in "error", an unreadable file). The runner deletes its rank files and runs it again.

A directory whose rank files describe another run (another model, sequence, split, batch,
degrees, dtype or optimizer; with ``made_by``, another backend) is an error: nothing is deleted,
the user chooses another ``--out``.

Events, one JSON object per line on the runner's stdout (schema
``megatron-4d-advisor/campaign-events``, version 1), in this order:

    {"event": "campaign", "schema", "version", "runs": N, "complete": K, "out": DIR}
    {"event": "start", "id", "index"}                      per run to execute (index 1-based)
    {"event": "run", "id", "index", "status": "ok" | "oom" | "error", "seconds", "where", "error"}
    {"event": "done", "ok", "oom", "error", "skipped", "seconds"}

``skipped`` counts the runs that were complete before (status ok or oom). ``where`` says how far
an OOM or failed run got (its first such rank), ``error`` the exception; both null for "ok".
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Literal, Protocol, Sequence

from advisor.capture.campaign_cost import available_memory, emulation_cost
from advisor.capture.observations import (header_setup, setup_difference, stands_for_swiglu_fusion,
                                          swiglu_as_asked)
from advisor.errors import AdvisorError
from advisor.models import LlamaSpec
from advisor.profiles import ProfileError, ProfileRun, load_run, read_rank_file
from advisor.row_flags import flag_values

EVENTS_SCHEMA = "megatron-4d-advisor/campaign-events"
EVENTS_VERSION = 1
State = Literal["absent", "partial", "complete"]


@dataclass(frozen=True, kw_only=True, slots=True)
class RunCheck:
    state: State
    status: str | None = None
    """"ok" or "oom" when complete."""
    reason: str | None = None
    """Why a run is partial."""
    profile: ProfileRun | None = field(default=None, compare=False, repr=False)
    """The rank files, as read, for the outcome (absent and unreadable runs have none)."""


class Executor(Protocol):
    """Runs one campaign run into its directory (rank files); raises only if it could not run
    it at all (an OOM or an error inside the run is written to the rank files)."""

    def run(self, campaign: dict, run: dict, directory: Path) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class EmulationBudget:
    """What the CPU emulator may spend: runs estimated (``campaign_cost``) to take longer than
    ``limits.CPU_EMULATION_SECONDS`` or more memory than is available are refused."""

    threads: int | None = None
    memory_limit_bytes: float | None = None

    def cost(self, campaign: dict, out: Path):
        states = scan(campaign, out)
        pending = [run for run in campaign["runs"] if states[run["id"]].state != "complete"]
        return emulation_cost(campaign, pending, threads=self.threads, memory_limit_bytes=self.memory_limit_bytes)

    def refusal(self, campaign: dict, out: Path) -> str | None:
        return self.cost(campaign, out).problem(available_memory())


BACKENDS = ("cpu", "symbolic", "megatron")
"""How a campaign's runs execute: the CPU emulator, the symbolic backend (fake tensors), or the
user's Megatron-LM on GPUs."""
LAYER_SPECS = ("transformer_engine", "local")


def prepare(path: Path, out: Path, *, backend: str = "cpu", layer_spec: str | None = None,
            budget: EmulationBudget | None = None) -> dict:
    """The campaign at ``path``, checked (``read_campaign``; for the CPU emulator every
    incompatibility at once, and with a ``budget`` whether its runs not yet complete under
    ``out`` can finish on this machine; for the symbolic backend ``layer_spec``'s), and ``out``
    checked: a directory, or nothing yet. AdvisorError otherwise, before any work. (Runs of
    another campaign under ``out`` are found by ``scan``, which ``execute`` calls first.)"""
    from advisor.capture.campaign import read_campaign
    from advisor.capture.campaign_check import emulation_problems

    document = read_campaign(path)
    if out.exists() and not out.is_dir():
        raise AdvisorError(f"--out {out} is not a directory")
    if backend == "cpu":
        problems = emulation_problems(document)
        if budget is not None and (refusal := budget.refusal(document, out)):
            problems.append(refusal)
        if problems:
            raise AdvisorError(f"{path}: the CPU emulator cannot run this campaign as planned: " + "; ".join(problems))
    if backend == "symbolic" and (problem := symbolic_problem(document, layer_spec or LAYER_SPECS[0])):
        raise AdvisorError(f"{path}: {problem}")
    return document


def world_size(run: dict) -> int:
    return run["tp"] * run["dp"] * run.get("cp", 1) * len(run["layers_per_stage"])


def local_spec_problem(tp: int, cp: int, sequence_parallel: bool) -> str | None:
    """What megatron-core refuses with its local layer spec (megatron/core/transformer/torch_norm.py:
    no sequence parallelism; dot_product_attention.py: no context parallelism), or None."""
    if sequence_parallel and tp > 1:
        return "megatron-core's local spec has no sequence parallelism (its torch norms refuse it)"
    if cp > 1:
        return "megatron-core's local spec has no context parallelism (only TE's attention has it)"
    return None


def symbolic_problem(campaign: dict, layer_spec: str) -> str | None:
    """Why the symbolic backend cannot run this campaign with ``layer_spec``, or None."""
    if layer_spec not in LAYER_SPECS:
        return f"layer spec must be one of {', '.join(LAYER_SPECS)}, got {layer_spec!r}"
    if layer_spec == "local":
        setup = campaign.get("setup", {})
        for run in campaign["runs"]:
            if problem := local_spec_problem(run["tp"], run.get("cp", 1), bool(setup.get("sequence_parallel"))):
                return f"run {run['id']}: {problem}; use --layer-spec transformer_engine (Megatron-LM's default)"
    return None


def _mismatch(profile: ProfileRun, campaign: dict, run: dict, model: LlamaSpec,
              made_by: dict[str, str] | None = None) -> str | None:
    """What in the rank files differs from the campaign run (of ``model``, the campaign's, which
    ``check_campaign`` checked), or None. The setup counts too: a run id names the layout and
    batch, not the dtype or the optimizer, so a BF16 campaign's run under an --out of the FP32
    campaign's has the same id (audit: it read as complete, and recommend priced FP32 profiles).
    ``made_by`` (header field: value) is what this command's backend writes (``backend_fields``)."""
    setup = campaign.get("setup", {})
    for rank in profile.ranks:
        h = rank.header
        if replace(h.model, name="") != replace(model, name=""):
            return f"rank {h.rank} profiles another model ({h.model.name!r})"
        found = {
            "seq_len": h.seq_len, "layers_per_stage": list(h.layers_per_stage),
            "tp": h.parallel.tp, "dp": h.parallel.dp, "cp": h.parallel.cp, "micro_batch_size": h.parallel.mbs,
            "num_microbatches": h.num_microbatches, "params_dtype": h.params_dtype,
            "distributed_optimizer": h.distributed_optimizer,
        }
        wanted = {
            "seq_len": campaign["seq_len"], "layers_per_stage": run["layers_per_stage"],
            "tp": run["tp"], "dp": run["dp"], "cp": run.get("cp", 1), "micro_batch_size": run["micro_batch_size"],
            "num_microbatches": run["num_microbatches"],
            "params_dtype": setup.get("params_dtype", h.params_dtype),
            "distributed_optimizer": setup.get("distributed_optimizer", h.distributed_optimizer),
        }
        if run["tp"] > 1:  # Megatron turns --sequence-parallel off at TP 1 (arguments.py), so only TP > 1 says
            found["sequence_parallel"] = h.sequence_parallel
            wanted["sequence_parallel"] = setup.get("sequence_parallel", h.sequence_parallel)
        # Megatron-LM and the symbolic TE spec build the campaign's SwiGLU; the local spec, its own
        if swiglu_as_asked(h.emulated, h.layer_spec) and h.swiglu_fusion is not None:
            found["swiglu_fusion"] = h.swiglu_fusion
            wanted["swiglu_fusion"] = setup.get("bias_swiglu_fusion", True)
        for key, value in found.items():
            if value != wanted[key]:
                return f"rank {h.rank} has {key} {value!r}, the campaign's run {wanted[key]!r}"
        for key, value in (made_by or {}).items():
            if key == "emulated" and h.emulated != value:
                if h.emulated:
                    return (f"rank {h.rank} was emulated (advisor profile run without --megatron-lm), this command "
                            f"runs Megatron-LM")
                return f"rank {h.rank} was run by Megatron-LM (--megatron-lm), this command emulates it"
            if getattr(h, key) != value:
                return f"rank {h.rank} was profiled with {key} {getattr(h, key)!r}, this command's is {value!r}"
    return None


CAMPAIGN_RECOMPUTE = "none"
"""What every campaign run's header says of recomputation: a campaign plans none (its runs'
arguments are ``MegatronSetup.training_options``'), the emulators write none, and a Megatron-LM
campaign's launch refuses the user's recomputation flags after -- as conflicts with the run's
own arguments (``launch.arguments.DECIDED_FLAGS``)."""


def backend_fields(backend: str, layer_spec: str | None = None,
                   user_args: Sequence[str] = ()) -> dict[str, str | bool]:
    """The header fields that this command's runs write, known before they run (``advisor/profiles.py``):
    ``emulated`` (the CPU and symbolic backends emulate the stages, Megatron-LM runs its own
    schedule), ``recompute`` (``CAMPAIGN_RECOMPUTE``), ``layer_spec`` (the CPU emulator builds the
    local spec, the symbolic backend ``layer_spec``'s, Megatron-LM the --transformer-impl of the
    user's arguments after -- (``user_args``), by default transformer_engine), and the emulators'
    ``backend``; a Megatron-LM run's backend is its node's device (cuda, or cpu under the GPU test
    double), not known here. Without ``emulated``, a Megatron-LM campaign resumed into the
    emulator's --out read its runs as complete and ran nothing (and the emulator took Megatron-LM's
    CPU runs as its own)."""
    if backend == "cpu":
        return {"emulated": True, "backend": "cpu", "layer_spec": "local", "recompute": CAMPAIGN_RECOMPUTE}
    if backend == "symbolic":
        return {"emulated": True, "backend": "symbolic", "layer_spec": layer_spec or LAYER_SPECS[0],
                "recompute": CAMPAIGN_RECOMPUTE}
    impl = (flag_values(user_args).get("--transformer-impl") or (LAYER_SPECS[0],))[-1]  # argparse keeps the last
    return {"emulated": False, "layer_spec": impl, "recompute": CAMPAIGN_RECOMPUTE}


def check_run(directory: Path, campaign: dict, run: dict, made_by: dict[str, str] | None = None) -> RunCheck:
    """The state of one run's directory; AdvisorError if it holds another run (``made_by``: by
    another backend, see ``backend_fields``), or is not a directory."""
    if directory.is_symlink() or (directory.exists() and not directory.is_dir()):
        raise AdvisorError(f"{directory} is not a directory (a run's directory must be one); choose another --out")
    if not directory.is_dir() or not any(directory.glob("rank*.jsonl")):
        return RunCheck(state="absent")
    try:
        profile = load_run(directory)
    except ProfileError as exc:
        return RunCheck(state="partial", reason=str(exc))
    expected = LlamaSpec(**campaign["model"])
    if reason := _mismatch(profile, campaign, run, expected, made_by):
        raise AdvisorError(f"{directory} holds another run than campaign run {run['id']}: {reason}; "
                           f"choose another --out")
    ranks = {rank.header.rank for rank in profile.ranks}
    missing = sorted(set(range(world_size(run))) - ranks)
    if missing:
        return RunCheck(state="partial", reason=f"no rank file for rank {missing[0]}"
                        + (f" and {len(missing) - 1} more" if len(missing) > 1 else ""), profile=profile)
    unfinished = [rank for rank in profile.ranks if rank.status not in ("ok", "oom")]
    if unfinished:
        rank = unfinished[0]
        return RunCheck(state="partial", reason=f"rank {rank.header.rank} ended {rank.status!r}", profile=profile)
    return RunCheck(state="complete", status=profile.status, profile=profile)


def clear_run(directory: Path) -> None:
    """Delete a partial run's rank files (and the temporary files of interrupted writes)."""
    for path in [*directory.glob("rank*.jsonl"), *directory.glob(".rank*.tmp")]:
        path.unlink()


def outcome(directory: Path, campaign: dict, run: dict) -> dict:
    """The result of an executed run, from its rank files: status, where, error."""
    check = check_run(directory, campaign, run)
    if check.state == "complete" and check.status == "ok":
        return {"status": "ok", "where": None, "error": None}
    if check.state == "complete":
        rank = next(rank for rank in check.profile.ranks if rank.status == "oom")
        return {"status": "oom", "where": f"rank {rank.header.rank}: {rank.where}", "error": rank.error}
    failed = [rank for rank in check.profile.ranks if rank.status == "error"] if check.profile else []
    if failed:
        rank = failed[0]
        return {"status": "error", "where": f"rank {rank.header.rank}: {rank.where}", "error": rank.error}
    return {"status": "error", "where": None, "error": f"the run left no complete profile ({check.reason or 'no files'})"}


def scan(campaign: dict, out: Path, made_by: dict[str, str] | None = None) -> dict[str, RunCheck]:
    """Every run's state under ``out``, in campaign order (AdvisorError for foreign runs, and with
    ``made_by`` for runs another backend made: ``backend_fields``, and for the other runs under
    ``out`` that profile another setup: ``other_setup``)."""
    states = {run["id"]: check_run(out / run["id"], campaign, run, made_by) for run in campaign["runs"]}
    if made_by is not None and (problem := other_setup(campaign, out, made_by)):
        raise AdvisorError(problem)
    return states


def campaign_setup(campaign: dict, made_by: dict[str, str | bool], found: dict) -> dict:
    """The setup this campaign's runs will have, in the shape of ``found`` (a run's
    ``observations.header_setup``, with ``emulated``): what the campaign decides (model,
    sequence, CP, and its setup's dtype, optimizer and SwiGLU, the last as this command's runs
    will stand for it: ``stands_for_swiglu_fusion``) and what this command's runs write
    (``made_by``: ``backend_fields``); ``found``'s own value where neither decides (a Megatron-LM
    run's device)."""
    setup = campaign.get("setup", {})
    swiglu = stands_for_swiglu_fusion(bool(made_by["emulated"]), str(made_by["layer_spec"]),
                                      setup.get("bias_swiglu_fusion", True))
    decided = {"model": replace(LlamaSpec(**campaign["model"]), name=""), "seq_len": campaign["seq_len"],
               "cp": campaign.get("cp", 1), **{key: setup[key] for key in ("params_dtype", "distributed_optimizer")
                                                if key in setup}, "bias_swiglu_fusion": swiglu, **made_by}
    if unknown := sorted(set(decided) - set(found)):  # one list of the fields: header_setup's
        raise ValueError(f"not fields of a run's setup: {', '.join(unknown)}")
    return {**found, **decided}


def other_setup(campaign: dict, out: Path, made_by: dict[str, str | bool]) -> str | None:
    """Why a run directory under ``out`` that is none of the campaign's runs makes ``out`` unfit
    for it, or None: it profiles another setup than this campaign's runs will
    (``campaign_setup``), in any field that 'advisor recommend --profile OUT' compares when it
    reads every run under OUT as one setup (``observations.check_one_setup``, by the same
    ``header_setup``), or was made by another backend. Otherwise a campaign run into another
    campaign's --out (another model: other run ids) ran to the end and recommend then refused the
    mix, as it did for a recomputation or a layer spec this check did not compare. A run that
    does not read is left alone (it is not this campaign's; recommend says what is wrong with it)."""
    ids = {run["id"] for run in campaign["runs"]}
    for child in sorted(out.iterdir()) if out.is_dir() else ():
        first = None if child.name in ids or child.is_symlink() or not child.is_dir() else \
            min(child.glob("rank*.jsonl"), default=None)  # one rank's header says the run's setup
        if first is None:
            continue
        try:
            h = read_rank_file(first).header
        except ProfileError:
            continue
        found = {"emulated": h.emulated, **header_setup(h)}
        wanted = campaign_setup(campaign, made_by, found)
        # what the campaign decides first, then who made the runs (emulated, then the backend, whose
        # spec and recomputation follow from it)
        order = [*(key for key in found if key not in made_by), *made_by]
        if key := next((key for key in order if found[key] != wanted[key]), None):
            return (f"{out} holds run {child.name} of another setup, {setup_difference(key, found[key], wanted[key])} "
                    f"(its vs this campaign's): 'advisor recommend --profile' reads every run under it as one "
                    f"setup; choose another --out")
    return None


def execute(campaign: dict, out: Path, executor: Executor, emit: Callable[[dict], None],
            states: dict[str, RunCheck] | None = None) -> int:
    """Run every run of ``campaign`` that is not complete under ``out``; returns the number of
    runs that failed (status "error"). ``states``: the caller's ``scan`` of ``out``, where it
    checked it before any work (a runner, against its backend), so that it is not read again."""
    started = time.perf_counter()
    states = scan(campaign, out) if states is None else states
    complete = sum(check.state == "complete" for check in states.values())
    emit({"event": "campaign", "schema": EVENTS_SCHEMA, "version": EVENTS_VERSION, "runs": len(states),
          "complete": complete, "out": str(out)})
    counts = {"ok": 0, "oom": 0, "error": 0}
    index = complete
    try:
        for run in campaign["runs"]:
            if states[run["id"]].state == "complete":
                continue
            index += 1
            directory = out / run["id"]
            directory.mkdir(parents=True, exist_ok=True)
            clear_run(directory)
            emit({"event": "start", "id": run["id"], "index": index})
            began = time.perf_counter()
            try:
                executor.run(campaign, run, directory)
                result = outcome(directory, campaign, run)
            except Exception as exc:  # the executor could not run it at all (a worker died)
                result = {"status": "error", "where": None, "error": f"{type(exc).__name__}: {exc}"[:500]}
            counts[result["status"]] += 1
            emit({"event": "run", "id": run["id"], "index": index, **result,
                  "seconds": round(time.perf_counter() - began, 2)})
    finally:
        executor.close()
    emit({"event": "done", **counts, "skipped": complete, "seconds": round(time.perf_counter() - started, 2)})
    return counts["error"]


def event_line(event: dict) -> str:
    return json.dumps(event, allow_nan=False)


def event_stream():
    """For a runner process: the real stdout, for events only; everything else printed from
    now on (Python, C, or child processes that inherit it) goes to stderr."""
    sys.stdout.flush()
    events = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return events


def run_campaign(campaign: dict, out: Path, executor: Executor, states: dict[str, RunCheck] | None = None) -> int:
    """A runner's main loop: events on the real stdout (everything else to stderr), the runs
    under ``out`` (``states``: as ``execute`` takes them); returns the runner's exit status (1 if
    a run failed)."""
    events = event_stream()
    out.mkdir(parents=True, exist_ok=True)
    failed = execute(campaign, out, executor, lambda event: events.write(event_line(event) + "\n"), states)
    events.close()
    return 1 if failed else 0
