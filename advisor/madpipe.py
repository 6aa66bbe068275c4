"""MadPipe for Megatron-LM (seed 001, Sections 3-4): the split of L layers over PP stages with the
smallest period (the slowest stage's forward + backward time per microbatch) such that every
stage's memory, with the microbatches its 1F1B position keeps, stays under a limit; ties go to
the lowest memory (CAPTURE's tie-break, level by level).

Why the period. Megatron-LM's 1F1B step is about (m + p - 1) x the slowest stage's time plus
the point-to-point and data-parallel communication (Narayanan et al. 2021, Section 2.2); the
boundary sends are the same at every boundary of a transformer, so among splits of one layout
the step is smallest exactly where the period is. (The time model's refinement, m x max +
(sum - max)/v, differs from it by the total work, which the split does not change.)

Why not MadPipe's groups. MadPipe's 1F1B* (Section 4.1) builds groups of consecutive stages
whose total time fits in the period T: a stage in group g keeps g microbatches, and its memory
therefore depends on T, which is why MadPipe searches T by bisection (Algorithm 1). Megatron-LM
runs a fixed schedule instead: stage i of p warms up with p - i - 1 forward passes whatever the
stage times (``get_pp_rank_microbatches``), so it keeps p - i microbatches; that is 1F1B* with
every stage alone in its group, which 1F1B* produces when no two neighbouring stages fit in one
period together, as in a balanced pipeline. So the memory of a stage here depends only on its
layers and its position, and one pass of the dynamic program is exact (no search over T, and no
"special processor": Megatron gives every rank the same number of stages; interleaving is the
one non-contiguous allocation it offers, planned by ``advisor.splits``).

The dynamic program is ``capture.search``'s min-max over paths, run twice: first on the times with
every stage over the limit removed (the period T*), then on the memory of the stages that take at
most T* (the lowest peak, and CAPTURE's levels). Both are exact: tests compare them with every
composition.

Cost tables come from the analytic models (``analytic_tables``: seed 004's memory per stage,
``advisor.throughput``'s time) or from profiles (``profile_time_table``: the per-layer times of
profile schema v2, with a predictor's memory table).
"""

from __future__ import annotations

import numpy as np

from advisor.capture.costs import CostTable, empty, upper
from advisor.capture.layout import Scenario
from advisor.capture.search import Solution, plan_megatron
from advisor.errors import AdvisorError, NothingFits
from advisor.memory import MemoryOptions
from advisor.stage_model import StageModel
from advisor.models import LlamaSpec
from advisor.rank_times import RankTimes, recomputed_per_chunk
from advisor.verdicts import calibrated_terms


def plan_fastest(time: CostTable, memory: CostTable, stages: int, limit: float,
                 scenario: Scenario = Scenario()) -> tuple[Solution, float]:
    """(the plan, its period): the smallest period with every stage's memory within ``limit``,
    then the lowest memory levels among the plans with that period. Each stage of the plan carries
    its memory as ``cost``. ``NothingFits`` where no split is within ``limit``, with the lowest
    peak any split reaches (CAPTURE's plan of the same table: one more pass of the planner)."""
    if stages > memory.num_units:
        raise AdvisorError(f"{memory.num_units} layers cannot fill {stages} pipeline stages")
    rows = memory.values.shape[0]
    times = np.broadcast_to(time.values, (max(rows, time.values.shape[0]),) + time.values.shape[1:])
    memories = np.broadcast_to(memory.values, times.shape)
    allowed = memories <= limit
    try:
        period = plan_megatron(CostTable(np.where(allowed, times, np.inf), memory.layers), stages, scenario).peak
    except AdvisorError:
        least = plan_megatron(memory, stages, scenario).peak
        raise NothingFits(f"no split of {memory.num_units} layers over {stages} stages keeps every stage within "
                          f"{limit / 2**30:.2f} GiB; the lowest peak any split reaches is {least / 2**30:.2f} GiB"
                          ) from None
    fastest = CostTable(np.where(allowed & (times <= period), memories, np.inf), memory.layers)
    return plan_megatron(fastest, stages, scenario), float(period)


def stage_times(time: CostTable, solution: Solution) -> tuple[float, ...]:
    """Each planned stage's time per microbatch."""
    count = len(solution.stages)
    return tuple(time.cost(stage.first, stage.last, count - index) for index, stage in enumerate(solution.stages))


def analytic_tables(spec: LlamaSpec, seq_len: int, options: MemoryOptions, *, tp: int, cp: int, dp: int, mbs: int,
                    pp: int, num_microbatches: float, timing=None, calibrated=None
                    ) -> tuple[CostTable, CostTable | None]:
    """(memory, time) cost tables of stages of alike layers: seed 004's stage memory at every
    position (``stage_model.StageModel``; row j is the j-th stage from the end), or, with
    ``calibrated`` (a ``MemoryCalibration`` and the GPU's GiB), the calibrated model's usage, as
    advisor sweep and estimate judge it; and, with ``timing`` (``advisor.rank_times.Timing``),
    the time model's stage time. Entry [l, r] is the stage holding layers l..r; a plan's first
    stage starts at layer 1 (the embedding is priced on the first position's row) and its last
    ends at L (the LM head on the last row)."""
    layers = spec.num_layers
    first, last = upper(layers)
    count = last - first + 1
    stage = (pp - np.arange(1, pp + 1))[:, None]
    terms = None if calibrated is None else calibrated_terms(
        spec, seq_len, mbs, tp, cp, stage, pp, options.recompute == "full", options, *calibrated)
    model = StageModel(spec, seq_len, options, tp=tp, cp=cp, dp=dp, mbs=mbs, pp=pp, vpp=1,
                       num_microbatches=num_microbatches, stage=stage, calibrated=terms)
    memory = empty(layers, pp)
    memory[:, first, last] = model.total(count[None, :])
    table = CostTable(memory, tuple((layer, layer) for layer in range(1, layers + 1)))
    if timing is None:
        return table, None
    times = timing.layouts(tp=np.array([tp]), cp=np.array([cp]), dp=np.array([dp]), mbs=np.array([mbs]),
                           pp=np.array([pp]), selective=options.recompute == "selective")
    ends = np.select([(first == 1) & (last == layers), first == 1, last == layers],
                     [times.beta[True, True][0], times.beta[True, False][0], times.beta[False, True][0]],
                     times.beta[False, False][0])
    duration = empty(layers, 1)
    recompute = recomputed_per_chunk(options.recompute, options.recompute_method, options.recompute_num_layers, layers)
    duration[0, first, last] = RankTimes(alpha=times.alpha[0], rho=times.rho[0], beta=ends,
                                         recomputable=np.asarray(recompute))(count)
    return table, CostTable(duration, table.layers)


def profile_time_table(forward: np.ndarray, backward: np.ndarray) -> CostTable:
    """A position-free time table from per-module times (index 0 the embedding, 1..L the decoder
    layers, L + 1 the output layer with its loss), seconds per microbatch: stage l..r takes the
    sum of its modules' forward and backward times, with the embedding if l = 1 and the output if
    r = L."""
    each = np.asarray(forward, dtype=float) + np.asarray(backward, dtype=float)
    layers = len(each) - 2
    prefix = np.concatenate([[0.0], np.cumsum(each[1:layers + 1])])
    first, last = upper(layers)
    values = empty(layers, 1)
    values[0, first, last] = (prefix[last] - prefix[first - 1] + np.where(first == 1, each[0], 0.0)
                              + np.where(last == layers, each[layers + 1], 0.0))
    return CostTable(values, tuple((layer, layer) for layer in range(1, layers + 1)))


def profiled_times(profiles, scenario: Scenario, pipeline_microbatch: int) -> tuple[np.ndarray, np.ndarray]:
    """Per module (embedding, layers 1..L, output), its forward and backward seconds per
    microbatch measured in the runs of ``scenario`` at ``pipeline_microbatch`` (profile schema v2;
    the slowest GPU of a stage, the slowest run of a module): times are used as measured, on the
    layout they were measured on, never scaled to another."""
    layers = profiles.num_layers
    forward, backward = np.full(layers + 2, np.nan), np.full(layers + 2, np.nan)
    timed: set[tuple[str, int]] = set()  # (scenario, pipeline microbatch) of the runs that recorded times
    for stage in profiles.observations:
        for key, terms in stage.modules.items():
            if terms.forward_time_s is None or terms.backward_time_s is None:
                continue
            timed.add((stage.scenario.name, stage.pipeline_microbatch))
            if stage.scenario == scenario and stage.pipeline_microbatch == pipeline_microbatch:
                index = 0 if key == "embedding" else layers + 1 if key == "output" else key
                forward[index] = np.fmax(forward[index], terms.forward_time_s)
                backward[index] = np.fmax(backward[index], terms.backward_time_s)
    missing = [("embedding" if i == 0 else "output" if i == layers + 1 else f"layer {i}")
               for i in np.flatnonzero(np.isnan(forward + backward)).tolist()]
    if missing:
        raise AdvisorError(f"no time for {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''} at "
                           f"{scenario.name}, microbatch {pipeline_microbatch}: {_untimed_why(timed)}; or give "
                           "--gpu NAME to use the time model")
    return forward, backward


def _untimed_why(timed: set[tuple[str, int]]) -> str:
    """Why a layout has no measured times, and which layouts have them. Audit: symbolic profiles
    (which record none: nothing is computed) were told 'no run measured them; profile that
    layout', and CPU profiles at pipeline microbatches 1 and 2, asked at 4, the same."""
    if not timed:
        return ("no profile run recorded per-module times (the symbolic backend computes nothing; schema v1 "
                "files have none)")
    shown = ", ".join(f"{name} at microbatch {batch}" for name, batch in sorted(timed))
    return (f"times are used as measured, never scaled, and the runs measured {shown} (the pipeline microbatch "
            "is Megatron's --mbs x DP): recommend one of those, or profile this layout")
