"""Profile runs -> per-stage observations, checked, for the statistics and the predictors.

A run (``advisor.profiles.ProfileRun``: one directory of rank files) becomes one
``RunObservation``: its ``PipelineLayout`` and, per pipeline stage, PM of CAPTURE (the peak
allocated bytes, ``RankProfile.peak_allocated_bytes``; the maximum over the stage's TP/DP ranks,
since every GPU of the stage must fit) and the per-module terms the hooks measured (in the last
recorded iteration, the steady state; the maximum over ranks). Part of a ``ProfileSet``: all runs of one model and setup.

Bad data is an error that names the run and the rank, stage or layer: a rank without its file, a layer that no
rank reports, a negative or non-finite value, a run without a finished iteration, ranks or runs
that disagree (model, sequence, setup), and batch sizes that do not add up (global batch !=
micro-batch x DP x microbatches). Runs that did not end "ok" (OOM, error, killed) are set aside
as ``skipped`` with their status, not read as measurements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Union

from advisor.capture.layout import PipelineLayout, Scenario, StageSpec
from advisor.megatron_args import MegatronSetup
from advisor.models import LlamaSpec
from advisor.profiles import (ProfileError, ProfileRun, RankHeader, RankProfile, check_complete, check_run_files,
                              directory_problem, load_run)

ModuleKey = Union[str, int]
"""'embedding', a decoder layer number (1-based), or 'output'."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModuleTerms:
    """What the hooks measured for one module on one GPU (``advisor.profiles.LayerRecord``)."""

    parameter_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    """Kept for the backward pass by one microbatch."""
    forward_peak_bytes: int
    """The rise above the level at the module's entry during its forward pass (what it keeps
    included)."""
    backward_peak_bytes: int
    """The rise above the level at the start of its backward pass (its saved tensors still held)."""
    forward_time_s: float | None = None
    """Seconds per microbatch in its forward pass (profile schema v2; None in v1 files)."""
    backward_time_s: float | None = None

    @property
    def static_bytes(self) -> int:
        return self.parameter_bytes + self.gradient_bytes + self.optimizer_bytes


@dataclass(frozen=True, kw_only=True, slots=True)
class StageObservation:
    run: str
    stage: int
    spec: StageSpec
    pipeline_microbatch: int
    in_flight: int
    """Microbatches the stage held at once (the hooks' header)."""
    peak_bytes: int
    """PM: the peak allocated bytes of the stage's worst GPU."""
    modules: dict[ModuleKey, ModuleTerms]

    @property
    def scenario(self) -> Scenario:
        return self.spec.scenario


@dataclass(frozen=True, kw_only=True, slots=True)
class RunObservation:
    run: str
    layout: PipelineLayout
    stages: tuple[StageObservation, ...]
    gpu_peaks: tuple[tuple[int, int, int], ...]
    """(rank, stage, peak allocated bytes) for every GPU, for per-GPU prediction errors."""
    stopped_early: tuple[int, int] | None = None
    """(iterations run, iterations asked) where Megatron ended the run early itself (its
    --exit-interval, --exit-duration-in-mins or --exit-signal-handler; ``RankProfile.stopped_early``):
    its peaks are those of the iterations it ran. None otherwise, or where the files do not say
    (profile schema before v3)."""

    @property
    def stage_peaks(self) -> tuple[int, ...]:
        return tuple(stage.peak_bytes for stage in self.stages)


@dataclass(frozen=True, kw_only=True, slots=True)
class ProfileSet:
    """Runs of one model and setup."""

    model: LlamaSpec
    seq_len: int
    cp: int
    setup: MegatronSetup
    """The runs' dtype, distributed optimizer, sequence parallelism (the TP > 1 runs'; where there
    were none, True but for the local spec, which refuses it), SwiGLU and layer spec (as they stand
    for them: ``header_setup``, ``launched_transformer_impl``): what a plan made from them must launch with."""
    runs: tuple[RunObservation, ...]
    skipped: tuple[tuple[str, str], ...] = ()
    """(run, why) for runs that did not finish: OOM, error, or still running."""

    @property
    def stopped_early(self) -> tuple[tuple[str, int, int], ...]:
        """(run, iterations run, iterations asked) of the runs Megatron ended early itself: used,
        since each iteration they ran was measured (a user's run cut short by its time limit), and
        said (``RunObservation.stopped_early``)."""
        return tuple((run.run, *run.stopped_early) for run in self.runs if run.stopped_early)

    @property
    def observations(self) -> tuple[StageObservation, ...]:
        return tuple(stage for run in self.runs for stage in run.stages)

    @property
    def num_layers(self) -> int:
        return self.model.num_layers

    def scenarios(self) -> dict[Scenario, tuple[int, ...]]:
        """Each profiled scenario with its pipeline microbatches, ascending."""
        found: dict[Scenario, set[int]] = {}
        for run in self.runs:
            for stage in run.layout.stages:
                found.setdefault(stage.scenario, set()).add(run.layout.pipeline_microbatch)
        return {scenario: tuple(sorted(batches)) for scenario, batches in sorted(found.items())}


# --- one run ----------------------------------------------------------------------------


def _count(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ProfileError(f"{what} is {value!r}; expected a non-negative finite number of bytes")
    return int(value)


def _module_terms(profile: RankProfile, where: str) -> dict[ModuleKey, ModuleTerms]:
    """The terms of the last recorded iteration, the steady state: the first one also allocates
    what a rank allocates once (megatron-core's attention buffer in its first layer's forward
    pass, the optimizer states in its step), which the later ones find already there. Every
    iteration's records are checked."""
    last = max((record.iteration for record in profile.layers), default=None)
    terms: dict[ModuleKey, list[int]] = {}
    for record in profile.layers:
        key: ModuleKey = record.layer_number if record.kind == "decoder" else record.kind
        if key is None:
            raise ProfileError(f"{where}: decoder module {record.name!r} has no layer number")
        what = f"{where}, {record.name}, iteration {record.iteration}"
        values = [
            _count(record.parameter_bytes, f"{what}: parameter_bytes"),
            _count(record.gradient_bytes, f"{what}: gradient_bytes"),
            _count(record.optimizer_bytes, f"{what}: optimizer_bytes"),
            _count(record.activation_bytes, f"{what}: activation_bytes"),
            _count(record.forward_peak_bytes, f"{what}: forward_peak_bytes"),
            _count(record.backward_peak_bytes, f"{what}: backward_peak_bytes"),
        ]
        times = [_seconds(getattr(record, name), f"{what}: {name}") for name in ("forward_time_s", "backward_time_s")]
        if record.iteration == last:
            terms[key] = values + times
    return {key: ModuleTerms(parameter_bytes=v[0], gradient_bytes=v[1], optimizer_bytes=v[2],
                             activation_bytes=v[3], forward_peak_bytes=v[4], backward_peak_bytes=v[5],
                             forward_time_s=v[6], backward_time_s=v[7])
            for key, v in terms.items()}


def _seconds(value: object, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ProfileError(f"{what} is {value!r}; expected a non-negative finite number of seconds")
    return float(value)


def _larger(a, b):
    """The larger of two measurements; a time is unknown (None) if either is."""
    if a is None or b is None:
        return None
    return max(a, b)


def _merge_terms(a: dict[ModuleKey, ModuleTerms], b: dict[ModuleKey, ModuleTerms]) -> dict[ModuleKey, ModuleTerms]:
    merged = dict(a)
    for key, terms in b.items():
        if key in merged:
            old = merged[key]
            merged[key] = ModuleTerms(**{name: _larger(getattr(old, name), getattr(terms, name))
                                         for name in ModuleTerms.__dataclass_fields__})
        else:
            merged[key] = terms
    return merged


def _check_rank(profile: RankProfile, name: str) -> None:
    """What the run-wide checks (``advisor.profiles.check_run_files``) leave: the batch adds up, and
    every iteration reports every module."""
    h = profile.header
    p = h.parallel
    if h.global_batch_size is not None and h.global_batch_size != p.mbs * p.dp * h.num_microbatches:
        raise ProfileError(f"run {name}, rank {h.rank}: mismatched batch sizes: global batch {h.global_batch_size} != "
                           f"micro-batch {p.mbs} x DP {p.dp} x {h.num_microbatches} microbatches")
    check_complete(profile)  # profile_set takes ProfileRuns that load_run did not check


def observe_run(run: ProfileRun, name: str | None = None) -> RunObservation:
    """The layout and per-stage peaks of one finished run."""
    name = name or run.directory.name
    if run.status != "ok":
        raise ProfileError(f"run {name} ended {run.status!r}; it has no complete measurement")
    check_run_files(run.ranks, f"run {name}")
    if missing := run.missing_ranks:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise ProfileError(f"run {name}: no rank file for rank {missing[0]}{more} of its world of "
                           f"{run.header.world_size}; every GPU of a run must be measured")
    first = run.ranks[0]
    header = first.header
    layout = PipelineLayout.from_counts(
        header.layers_per_stage, header.parallel.mbs * header.parallel.dp, header.num_microbatches,
        Scenario(tp=header.parallel.tp, dp=header.parallel.dp),
    )
    peaks: dict[int, int] = {}
    terms: dict[int, dict[ModuleKey, ModuleTerms]] = {}
    in_flight: dict[int, int] = {}
    gpu_peaks = []
    for profile in run.ranks:
        _check_rank(profile, name)
        h = profile.header
        stage = h.coords.get("pp")
        where = f"run {name}, rank {h.rank}"
        if stage is None or not 0 <= stage < len(layout.stages):
            raise ProfileError(f"{where}: pipeline coordinate {stage!r} is not a stage of PP {len(layout.stages)}")
        spec = layout.stages[stage]
        if tuple(h.stage_layers) != tuple(range(spec.first, spec.last + 1)):
            raise ProfileError(f"{where}: stage {stage} should hold layers {spec.first}..{spec.last}, "
                               f"the header says {list(h.stage_layers)}")
        peak = profile.peak_allocated_bytes
        if peak is None:
            raise ProfileError(f"{where}: no iteration recorded, so no peak memory")
        peak = _count(peak, f"{where}: peak_allocated_bytes")
        gpu_peaks.append((h.rank, stage, peak))
        peaks[stage] = max(peaks.get(stage, 0), peak)
        terms[stage] = _merge_terms(terms.get(stage, {}), _module_terms(profile, where))
        in_flight[stage] = h.in_flight_microbatches
    stages = tuple(
        StageObservation(
            run=name, stage=index, spec=spec,
            pipeline_microbatch=layout.pipeline_microbatch,
            in_flight=in_flight[index], peak_bytes=peaks[index], modules=terms[index],
        )
        for index, spec in enumerate(layout.stages)
    )
    early = [(len(profile.iterations), profile.header.asked_iterations) for profile in run.ranks
             if profile.stopped_early]
    return RunObservation(run=name, layout=layout, stages=stages, gpu_peaks=tuple(sorted(gpu_peaks)),
                          stopped_early=min(early) if early else None)


# --- a set of runs ----------------------------------------------------------------------


def swiglu_as_asked(emulated: bool, layer_spec: str) -> bool:
    """Whether a run builds the SwiGLU its flags or campaign ask for: a run of Megatron-LM, or an
    emulated stage of the Transformer Engine spec (the symbolic backend builds the campaign's:
    ``StageEmulation.bias_swiglu_fusion``). An emulated stage of the local spec (the CPU
    emulator's) runs the eager SwiGLU whatever was asked: megatron_hooks.model turns
    ``bias_activation_fusion`` off."""
    return not (emulated and layer_spec == "local")


def stands_for_swiglu_fusion(emulated: bool, layer_spec: str, swiglu_fusion: bool | None) -> bool:
    """Whether a run's profile stands for Megatron-LM's fused SwiGLU (``MegatronSetup.bias_swiglu_fusion``):
    where it builds the SwiGLU asked (``swiglu_as_asked``), the one its header records
    (``swiglu_fusion``, profile schema v4; unrecorded before v4: fused, Megatron-LM's default);
    otherwise fused, Megatron-LM's default, which the emulator's eager SwiGLU stands in for (as every
    emulated campaign did before --no-bias-swiglu-fusion)."""
    return not swiglu_as_asked(emulated, layer_spec) or swiglu_fusion is not False


def launched_transformer_impl(emulated: bool, backend: str, layer_spec: str) -> str:
    """The --transformer-impl a plan from a run's profile launches: the layer spec the run built
    (a Megatron-LM run's --transformer-impl, the symbolic backend's --layer-spec), whose memory it
    measured (the local spec's unfused attention keeps the s x s scores that Transformer Engine's
    fused attention does not); the CPU emulator's local spec, which it builds whatever is asked
    (it cannot build Transformer Engine's), stands in for Megatron-LM's default, as its eager SwiGLU
    does (``stands_for_swiglu_fusion``)."""
    return "transformer_engine" if emulated and backend == "cpu" else layer_spec


def header_setup(h: RankHeader) -> dict:
    """The setup that a set of runs must share (``check_one_setup``), as one rank's header says
    it: the one list of its fields, which ``advisor profile run`` also compares the runs already
    under its --out against before a campaign starts (``campaign_run.other_setup``). Its
    ``bias_swiglu_fusion`` is the SwiGLU the runs stand for (``stands_for_swiglu_fusion``): the
    recommended plan launches it (``profile_set``)."""
    return {
        "model": replace(h.model, name=""), "seq_len": h.seq_len, "cp": h.parallel.cp, "params_dtype": h.params_dtype,
        "distributed_optimizer": h.distributed_optimizer, "recompute": h.recompute, "layer_spec": h.layer_spec,
        "backend": h.backend,
        "bias_swiglu_fusion": stands_for_swiglu_fusion(h.emulated, h.layer_spec, h.swiglu_fusion),
    }


SET_ASIDE_WHY = {
    "running": "still 'running': killed midway; run the same 'advisor profile run' to resume",
    "oom": "out of memory: an outcome, not a measurement",
    "error": "failed: 'advisor profile show DIR' says where; run the same 'advisor profile run' to retry",
}
"""Why a profile run that did not end ok is set aside (``profile_set``), by its status, in the
words that say what to do next (the recommender's caption, and the error when none is left)."""


def set_aside_groups(skipped: Iterable[tuple[str, str]], shown: int = 3) -> list[tuple[str, str]]:
    """(the runs named, why) per status of ``SET_ASIDE_WHY`` that ``skipped`` (run, status) holds,
    at most ``shown`` names each: the one grouping of the recommender's caption and of the error
    when no run finished, so that both say the same."""
    skipped, groups = list(skipped), []
    for status, why in SET_ASIDE_WHY.items():
        names = [name for name, run_status in skipped if run_status == status]
        if names:
            more = f" and {len(names) - shown} more" if len(names) > shown else ""
            groups.append((f"{', '.join(names[:shown])}{more}", why))
    return groups


def none_finished(skipped: list[tuple[str, str]], shown: int = 3) -> str:
    """The error when no run ended ok: which runs, and per status what to do (a campaign killed
    in its first run said only "none of the 1 profile runs finished ('ok')")."""
    parts = [f"{names} {why}" for names, why in set_aside_groups(skipped, shown)]
    runs = "the one profile run" if len(skipped) == 1 else f"none of the {len(skipped)} profile runs"
    return f"{runs} {'did not finish' if len(skipped) == 1 else 'finished'} ('ok'): " + "; ".join(parts)


def check_one_setup(runs: Iterable[ProfileRun]) -> None:
    """The runs are of one model and setup (``header_setup``: model shape, sequence, CP, dtype,
    distributed optimizer, recompute, layer spec, backend, SwiGLU), each given once: otherwise a
    ProfileError naming the two runs and the two values that differ. Runs that did not finish
    are checked too: they are still of the set that was given."""
    reference, directories = None, {}
    for run in runs:
        name = run.directory.name
        if name in directories:
            raise ProfileError(f"run {name} is given twice ({directories[name]} and {run.directory}): a run is "
                               f"named by its directory, and counts once")
        directories[name] = run.directory
        setup = header_setup(run.header)
        if reference is None:
            reference = (name, setup)
        for key, value in setup.items():
            if value != reference[1][key]:
                difference = setup_difference(key, value, reference[1][key])
                raise ProfileError(f"run {name} differs from run {reference[0]} in {difference}; profile one setup "
                                   f"at a time")


def setup_difference(key: str, value: object, other: object) -> str:
    """``key (value vs other)``; for a model, each field that differs (``header_setup`` blanks its name)."""
    if isinstance(value, LlamaSpec) and isinstance(other, LlamaSpec):
        fields = [name for name in value.__dataclass_fields__ if getattr(value, name) != getattr(other, name)]
        pairs = ", ".join(f"{name} {getattr(value, name)!r} vs {getattr(other, name)!r}" for name in fields)
        return f"{key} ({pairs})"
    return f"{key} ({value!r} vs {other!r})"


def profile_set(runs: Iterable[ProfileRun]) -> ProfileSet:
    """Observations of finished runs; all runs must share the model and setup (``check_one_setup``),
    which the plans from them launch (``ProfileSet.setup``: the dtype, optimizer, sequence
    parallelism and SwiGLU the runs stand for)."""
    runs = list(runs)
    if not runs:
        raise ProfileError("no profile runs given")
    check_one_setup(runs)
    observed, skipped, sequence_parallel = [], [], None
    for run in runs:
        name = run.directory.name
        if run.status != "ok":
            skipped.append((name, run.status))
            continue
        observed.append(observe_run(run, name))
        if run.header.parallel.tp > 1 and sequence_parallel is None:
            sequence_parallel = run.header.sequence_parallel
    if not observed:
        raise ProfileError(none_finished(skipped))
    setup, first = header_setup(runs[0].header), runs[0].header
    impl = launched_transformer_impl(first.emulated, first.backend, first.layer_spec)
    return ProfileSet(
        model=first.model, seq_len=setup["seq_len"], cp=setup["cp"],
        # without a TP > 1 run, sequence parallelism as Megatron-LM's layer spec takes it: the local
        # spec's torch norms refuse it (megatron-core transformer/torch_norm.py), TE's runs it
        setup=MegatronSetup(params_dtype=setup["params_dtype"], distributed_optimizer=setup["distributed_optimizer"],
                            sequence_parallel=sequence_parallel is True or sequence_parallel is None and impl != "local",
                            bias_swiglu_fusion=setup["bias_swiglu_fusion"], transformer_impl=impl),
        runs=tuple(observed), skipped=tuple(skipped),
    )


def run_directories(paths: Iterable[str | Path]) -> list[Path]:
    """Each path is a run directory (it holds rank*.jsonl) or a directory of run directories."""
    found = []
    for path in map(Path, paths):
        if problem := directory_problem(path):
            raise ProfileError(f"{path}: {problem}")
        if any(path.glob("rank*.jsonl")):
            found.append(path)
            continue
        runs = sorted(child for child in path.iterdir() if child.is_dir() and any(child.glob("rank*.jsonl")))
        if not runs:
            # a campaign's directory before its runs: say how they are made
            hint = (f" (it holds a campaign: advisor profile run {path / 'campaign.json'} --out DIR makes them)"
                    if (path / "campaign.json").is_file() else "")
            raise ProfileError(f"{path}: no profile files (rank*.jsonl) nor run directories holding them{hint}")
        found += runs
    return found


def load_profile_set(paths: Iterable[str | Path]) -> ProfileSet:
    """Read every run under ``paths`` (see ``run_directories``) with ``advisor.profiles.load_run``."""
    return profile_set(load_run(directory) for directory in run_directories(paths))
