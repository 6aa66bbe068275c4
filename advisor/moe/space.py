"""The MoE layout space: (TP, CP, PP, EP, ETP, DP, MBS, recomputation), vectorised, classified
and ranked; one layout's estimate stage by stage.

Valid layouts follow megatron-core's ``parallel_state.initialize_model_parallel``: the dense
grid is TP x CP x DP x PP; the expert grid reuses the same ranks as ETP x EP x EDP x PP, so
ETP x EP must divide TP x CP x DP (world / PP), and EP must divide the experts. TP divides the
heads (and the KV heads); sequence parallelism is on whenever TP > 1 (Megatron requires it for
MoE with TP); VPP (with a GPU preset, as for dense rows) where Megatron interleaves: PP > 1,
the microbatches a multiple of PP, at least v layers on every stage.

The rows are priced, judged and ranked by the dense rows' own pieces: the training options
(``advisor.options.TrainingOptions``, inside ``stage.MoEOptions``), the verdicts (seed 004's
80% rule, ``advisor.paper_rule.classify``, or the calibrated model, ``advisor.verdicts``:
fits / likely fits / likely oom / oom, with ``calibrated_terms`` on the MoE stage's buckets),
and the ranking (``advisor.ranking.order``: the rows within the stated tolerance of the
fastest ordered by ``advisor.ranking.simplicity``, smaller EP simpler).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

from advisor.errors import AdvisorError
from advisor.hardware import GpuSpec
from advisor.moe import stage as st
from advisor.moe.spec import MoESpec
from advisor.paper_rule import DEFAULT_THRESHOLD
from advisor.verdicts import default_memory_model
from advisor.parallel import (Pinned, Workload, check_whole_nodes, expert_groups_problem, global_batch_problem,
                             heads_problem, model_parallel_problem, sequence_problem, sequence_splits)

if TYPE_CHECKING:
    from advisor.options import TrainingOptions

GIB = 2**30
RECOMPUTES = ("none", "selective", "full")


@dataclass(frozen=True, slots=True)
class Layouts:
    """Columns of layouts (numpy arrays of equal length)."""

    tp: np.ndarray
    cp: np.ndarray
    pp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    dp: np.ndarray
    mbs: np.ndarray
    recompute: np.ndarray
    """Index into RECOMPUTES."""
    vpp: np.ndarray
    base: np.ndarray
    """The (TP, CP, PP, EP, ETP, DP, MBS) each variant belongs to: one row is kept per base."""

    def take(self, which) -> "Layouts":
        which = np.flatnonzero(which) if np.asarray(which).dtype == bool else which  # a mask read once, not per field
        return Layouts(*(getattr(self, f)[which] for f in Layouts.__dataclass_fields__))

    def columns(self, which=slice(None)) -> dict:
        return {k: getattr(self, k)[which] for k in ("tp", "cp", "pp", "ep", "etp", "dp", "mbs", "vpp")}


def layout_problem(spec: MoESpec, workload: Workload, gpus: int, tp: int, cp: int, pp: int, ep: int, etp: int,
                   mbs: int, vpp: int = 1, layers_per_stage: tuple[int, ...] | None = None, *,
                   a2a_overlap: bool = False, recompute: str = "none", dispatcher: str = "alltoall") -> str | None:
    """Why megatron-core cannot run this layout (with ``layers_per_stage``, its own split; with
    --overlap-moe-expert-parallel-comm where ``a2a_overlap``, and ``recompute``; with the
    ``dispatcher``), or None."""
    if problem := heads_problem(tp, spec.num_attention_heads, spec.tp_kv_heads):
        return problem
    if problem := model_parallel_problem(gpus, tp, cp, pp):
        return problem
    if problem := expert_problem(spec, gpus // pp, ep, etp, dispatcher):
        return problem
    if layers_per_stage is not None:
        from advisor.memory import split_problem

        if problem := split_problem(spec.num_layers, pp, vpp, layers_per_stage):
            return problem
    elif pp > spec.num_layers:
        return f"PP {pp} exceeds the {spec.num_layers} layers"
    if problem := sequence_problem(workload.seq_len, cp, tp):
        return problem
    dp = gpus // (tp * cp * pp)
    if problem := global_batch_problem(workload.global_batch_size, mbs, dp):
        return problem
    m = workload.global_batch_size // (mbs * dp)
    if vpp > 1 and (pp == 1 or min(layers_per_stage or st.split_layers(spec.num_layers, pp)) < vpp or m % pp):
        return (f"VPP {vpp} needs PP > 1, at least {vpp} layers on every stage and the microbatches "
                f"({m}) a multiple of PP {pp}")
    return overlap_problem(ep, pp, vpp, recompute) if a2a_overlap else None


def expert_problem(spec: MoESpec, world: int, ep: int, etp: int, dispatcher: str | None) -> str | None:
    """Why megatron-core cannot build EP x ETP expert groups within ``world`` = TP x CP x DP ranks
    (GPUs / PP) with the ``dispatcher`` (None: any), or None: EP divides the experts, EP x ETP the
    ranks, and the flex dispatcher needs EP x ETP > 1."""
    if spec.num_experts % ep:
        return f"EP {ep} must divide the {spec.num_experts} experts"
    if problem := expert_groups_problem(world, ep, etp):
        return problem
    if dispatcher == "flex" and ep * etp == 1:  # token_dispatcher.py, MoEFlexTokenDispatcher (both releases)
        return "the flex dispatcher needs EP x ETP > 1 (megatron-core asserts 'Flex token dispatcher requires TPxEP > 1')"
    return None


def overlap_problem(ep: int, pp: int, vpp: int, recompute: str) -> str | None:
    """Why megatron-core refuses --overlap-moe-expert-parallel-comm on this layout, or None
    (``transformer_config.py``, ``__post_init__``; core_v0.15.2 and core_v0.19.0): it needs EP > 1,
    interleaving where PP > 1, and no full recomputation (nor its method and layer count)."""
    if ep <= 1:
        return "--overlap-moe-expert-parallel-comm needs EP > 1 (megatron-core refuses it without expert parallelism)"
    if pp > 1 and vpp <= 1:
        return "--overlap-moe-expert-parallel-comm with PP > 1 needs --vpp above 1 (megatron-core refuses it otherwise)"
    if recompute == "full":
        return "--overlap-moe-expert-parallel-comm refuses --recompute full (megatron-core refuses it)"
    return None


def _bases(spec: MoESpec, workload: Workload, gpus: int, max_tp: int, pinned: Pinned = Pinned()) -> np.ndarray:
    """Every valid (TP, CP, PP, EP, ETP, DP, MBS) (``layout_problem``'s rules, vectorised), as a
    7 x n array: TP, CP, ETP, MBS powers of 2 (ETP up to TP, MBS up to 8); PP any divisor; EP any
    divisor of the experts; the ``pinned`` degrees only."""
    powers = np.array([2**i for i in range(int(math.log2(gpus)) + 1)])
    small = powers[powers <= max_tp]
    pps = [p for p in range(1, min(gpus, spec.num_layers) + 1) if gpus % p == 0]
    eps = np.array([e for e in range(1, spec.num_experts + 1) if spec.num_experts % e == 0])
    tp, cp, pp, ep, etp, mbs = (x.ravel() for x in np.meshgrid(
        pinned.values("tp", small), pinned.values("cp", powers), pinned.values("pp", pps), eps, small,
        pinned.values("mbs", powers[powers <= 8]), indexing="ij"))
    heads, groups = spec.num_attention_heads, spec.tp_kv_heads
    s, gbs = workload.seq_len, workload.global_batch_size
    ok = (heads % tp == 0) & (groups % tp == 0) & (gpus % (tp * cp * pp) == 0) & (etp <= tp)
    ok &= ((gpus // pp) % (ep * etp) == 0) & sequence_splits(s, cp, tp)
    dp = gpus // np.maximum(tp * cp * pp, 1)
    ok &= (dp >= 1) & (gbs % np.maximum(mbs * dp, 1) == 0)
    if not ok.any():
        raise AdvisorError(f"no layout of {spec.name} on {gpus} GPUs satisfies megatron-core's constraints"
                           + (f" with {pinned.text()}" if pinned.given() else ""))
    return np.stack([tp, cp, pp, ep, etp, dp, mbs])[:, ok]


def enumerate_layouts(spec: MoESpec, workload: Workload, gpus: int, max_tp: int, interleave: bool = False,
                      pinned: Pinned = Pinned()) -> Layouts:
    """Every valid layout (the ``pinned`` degrees only), each with three recomputation choices
    (none; selective: --recompute-modules; full) and, with ``interleave``, every VPP from 2 to the
    fewest layers of a stage where Megatron interleaves (``layout_problem``)."""
    base = _bases(spec, workload, gpus, max_tp, pinned)
    n = base.shape[1]
    vpps = [np.ones(n, dtype=np.int64)]
    if interleave:
        pp, m = base[2], workload.global_batch_size // (base[6] * base[5])
        fewest = spec.num_layers // np.maximum(pp, 1)  # split_layers' smallest stage
        can = (pp > 1) & (m % np.maximum(pp, 1) == 0)
        for v in range(2, int(fewest[can].max(initial=1)) + 1):
            vpps.append(np.where(can & (fewest >= v), v, 0))
    vpp = np.stack(vpps)  # (V, n); 0: not a variant
    index, ks = np.nonzero(vpp.T)  # per base, its VPPs in order
    reps = len(RECOMPUTES)
    which = np.repeat(index, reps)
    return Layouts(*base[:, which], recompute=np.tile(np.arange(reps), len(index)),
                   vpp=np.repeat(vpp[ks, index], reps), base=which)


def _subsets(layouts: Layouts):
    """(recompute name, indices) of each recomputation's subset."""
    for index, name in enumerate(RECOMPUTES):
        which = np.flatnonzero(layouts.recompute == index)
        if which.size:
            yield name, which


def _memory(spec: MoESpec, workload: Workload, layouts: Layouts, options: st.MoEOptions, judge) -> dict:
    """The peak stage of each layout over ``stage.representative_stages``: its total (the MoE
    model's terms) and, with ``judge`` (the calibrated model), its calibrated usage, bytes."""
    n = len(layouts.tp)
    out = {key: np.zeros(n) for key in ("total", "states", "activations", "stage", "usage", "usage_stage")}
    for recompute, which in _subsets(layouts):
        stages = st.representative_stages(spec, layouts.pp[which])
        for i, stage in enumerate(stages):
            # a stage another one named already for a layout (a short pipeline's stages are named
            # several times: at PP 1 all six of DeepSeek-V3's are stage 0) is priced once
            new = ~np.any([stage == named for named in stages[:i]], axis=0) if i else slice(None)
            if len(at := which[new]):
                _stage_peak(spec, workload, layouts, options, judge, recompute, at, stage[new], out)
    return out


def _stage_peak(spec: MoESpec, workload: Workload, layouts: Layouts, options: st.MoEOptions, judge, recompute: str,
                at: np.ndarray, stage: np.ndarray, out: dict) -> None:
    """``_memory``'s peaks at the layouts ``at`` raised to ``stage``'s where it holds more."""
    columns = layouts.columns(at)
    vpp = columns.pop("vpp")
    m = workload.global_batch_size / (columns["mbs"] * columns["dp"])
    b = _ByBase(layouts.base[at], columns).stage_bytes(spec, workload.seq_len, options, stage, recompute, vpp, m)
    states, activations = b.model_states, b.activations  # b.total's sum, each made once
    total = states + activations + b.transient
    pick = total > out["total"][at]
    for key, value in (("total", total), ("states", states), ("activations", activations + b.transient),
                       ("stage", stage)):
        out[key][at] = np.where(pick, value, out[key][at])
    if judge is not None:
        usage = judge(b, columns, stage, recompute)
        pick = usage > out["usage"][at]
        out["usage"][at] = np.where(pick, usage, out["usage"][at])
        out["usage_stage"][at] = np.where(pick, stage, out["usage_stage"][at])


class _ByBase:
    """``stage.stage_bytes`` of layouts of which many are variants (VPP) of one base layout: they
    differ only in their microbatches in flight, so the rest (``stage.stage_parts``) is priced
    once per base and gathered back."""

    def __init__(self, base: np.ndarray, columns: dict):
        _, self.first, inverse = np.unique(base, return_index=True, return_inverse=True)
        self.inverse = inverse.ravel()
        self.shared = len(self.first) < len(base)
        self.columns = {k: v[self.first] if self.shared else v for k, v in columns.items() if k != "vpp"}
        self.pp = columns["pp"]

    def stage_bytes(self, spec: MoESpec, seq_len: int, options: st.MoEOptions, stage, recompute: str, vpp, m,
                    layers_per_stage: tuple[int, ...] | None = None) -> st.StageBytes:
        parts = st.stage_parts(spec, seq_len, options, stage=stage[self.first] if self.shared else stage,
                               recompute=recompute, layers_per_stage=layers_per_stage, **self.columns)
        if self.shared:
            parts = parts.take(self.inverse)
        return parts.with_in_flight(*st.in_flight(options, stage, self.pp, vpp, m))


def calibrated_judge(spec: MoESpec, seq_len: int, options: st.MoEOptions, memory_gib: float):
    """The calibrated model on MoE stage buckets: ``advisor.verdicts.calibrated_terms`` (its
    runtime, allocator and loss terms, and its factors), with the layer activations (the
    transient buffers with them) as counted: MoE terms are the tensors megatron-core keeps."""
    from advisor.throughput.calibration import load_memory_calibration
    from advisor.verdicts import calibrated_terms

    calibration = load_memory_calibration()
    memory_options = options.memory  # the estimator's view of the training options

    def judge(b: st.StageBytes, columns: dict, stage, recompute: str):
        terms = calibrated_terms(spec, seq_len, columns["mbs"], columns["tp"], columns["cp"], stage, columns["pp"],
                                 recompute == "full", memory_options, calibration, memory_gib, layer_share=1.0)
        return terms.stage_bytes(b.model_states, b.layer_activations + b.transient, b.embedding_activations,
                                 b.output_activations)

    return judge, calibration.band


def _verdicts(memory: dict, memory_gib: float, threshold: float, band: float | None) -> np.ndarray:
    """The paper's rule on the totals, or the calibrated verdicts on the usage: the dense rows'
    own functions. Both grow monotonically with the memory, so each is called only where the
    verdict changes (a bisection over the sorted values), not once per layout."""
    from advisor.verdicts import judge as judged

    values = (memory["total"] if band is None else memory["usage"]) / GIB
    judge = functools.partial(judged, memory_gib=memory_gib, band=band, threshold=threshold)
    unique, inverse = np.unique(values, return_inverse=True)
    verdicts = np.empty(len(unique), dtype=object)
    start = 0
    while start < len(unique):
        kind = judge(float(unique[start]))
        low, high = start, len(unique)  # the first index past ``kind``'s run
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if judge(float(unique[middle])) == kind else (low, middle)
        verdicts[start:high] = kind
        start = high
    return verdicts[inverse.ravel()]


def _judged(spec: MoESpec, workload: Workload, layouts: Layouts, options: st.MoEOptions, judge, memory_gib: float,
            threshold: float, band: float | None):
    """(layouts, memory, verdicts) of the variants worth pricing: every one without interleaving,
    and an interleaved one only where its plain sibling (same base and recomputation) is expected
    to run: interleaving only adds memory (rank i holds p + (p - 1)/v - i ... >= p - i stages of
    microbatches, ``schedule.forward_passes_in_flight``), so it cannot fit where that did not."""
    plain = layouts.vpp == 1
    if not plain.any():  # --vpp N pinned: no plain sibling to prune by, every variant priced
        memory = _memory(spec, workload, layouts, options, judge)
        return layouts, memory, _verdicts(memory, memory_gib, threshold, band)
    first = layouts.take(plain)
    memory = _memory(spec, workload, first, options, judge)
    verdict = _verdicts(memory, memory_gib, threshold, band)
    if plain.all():
        return first, memory, verdict
    from advisor.verdicts import EXPECTED_TO_RUN

    runs = np.isin(verdict, EXPECTED_TO_RUN)
    key = first.base * len(RECOMPUTES) + first.recompute
    sibling = np.isin(layouts.base * len(RECOMPUTES) + layouts.recompute, key[runs])
    rest = layouts.take(~plain & sibling)
    if not len(rest.tp):
        return first, memory, verdict
    more = _memory(spec, workload, rest, options, judge)
    index = np.flatnonzero(plain | sibling)  # back in enumeration order: a base's variants together
    merged = layouts.take(index)
    from_first = plain[index]  # where each comes from in (first, rest): a merge of two sorted runs
    order = np.empty(len(index), dtype=np.int64)
    order[from_first] = np.arange(len(first.tp))
    order[~from_first] = len(first.tp) + np.arange(len(rest.tp))
    memory = {k: np.concatenate([memory[k], more[k]])[order] for k in memory}
    verdict = np.concatenate([verdict, _verdicts(more, memory_gib, threshold, band)])[order]
    return merged, memory, verdict


def _one_variant_each(layouts: Layouts, verdict, speed, memory) -> np.ndarray:
    """Per base layout, the variant (recomputation, VPP) kept: the fastest (with a GPU; else the
    least recomputation, no interleaving) among those that fit, else among those expected to run
    (tight, likely fits), else the one that needs the least memory."""
    grade = np.select([verdict == "fits", np.isin(verdict, ("tight", "likely fits"))], [0, 1], 2)
    key = np.where(grade == 2, memory, speed)
    return _first_best(layouts.base, grade, key)


def _first_best(group: np.ndarray, grade: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Per group (in increasing order), the index of the lowest (grade, key), the first on ties:
    ``np.lexsort((key, grade, group))``'s first of each group. A sweep's groups come in order,
    each contiguous: then a minimum per group twice (no sort of the 200,000 variants)."""
    if not len(group) or np.any(group[1:] < group[:-1]) or not np.isfinite(key).all():
        order = np.lexsort((key, grade, group))
        return order[np.r_[True, group[order][1:] != group[order][:-1]]]
    starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    of = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(group)]))  # each variant's group number
    best = grade == np.minimum.reduceat(grade, starts)[of]
    best &= key == np.minimum.reduceat(np.where(best, key, np.inf), starts)[of]
    index = np.flatnonzero(best)
    return index[np.r_[True, group[index][1:] != group[index][:-1]]]


@dataclass(frozen=True, slots=True)
class SweepResult:
    """The ranked layouts as columns (``order``: the ranked ones best first, then the rest by
    memory); rows are made only for what is shown."""

    spec: MoESpec
    layouts: Layouts
    memory: dict
    verdict: np.ndarray
    timing: dict | None
    memory_gib: float
    options: st.MoEOptions
    order: np.ndarray
    ranked: int
    considered: int
    memory_model: str
    tolerance: float | None
    """Throughput's ranking tolerance; None where the rows are ranked otherwise."""
    tokens: float | None = None
    """A token budget (``advisor sweep --tokens``): each timed row's ``budget_fields``."""
    global_batch_size: int = 0
    """The workload's: each row's ``num_microbatches`` is GBS / (MBS x DP)."""
    rank_by: str = "paper"
    """``advisor.ranking.RANK_BY``: what the ranked rows are ordered by."""
    escalation: str | None = None
    """The lever the rows use because nothing fit without it (``escalate``), or None."""
    lever_time_cost: np.ndarray | None = None
    """With ``escalation`` and a time model, per layout the step time it costs against the same
    layout without the lever (NaN where that one was not priced): the rows' ``lever_time_cost_s``."""
    ladder: tuple = ()
    """The rungs of ``advisor.escalation.LADDER`` climbed in vain, each (label, why it was not
    swept; None: swept, and nothing ran)."""

    @property
    def counts(self) -> dict:
        """Verdicts of the layouts kept (one variant each)."""
        from advisor.verdicts import verdict_kinds

        return {v: int((self.verdict[self.order] == v).sum()) for v in verdict_kinds(self.memory_model)}

    def rows(self, include_oom: bool = False, limit: int | None = None) -> list[dict]:
        chosen = (self.order if include_oom else self.order[:self.ranked])[:limit]
        out = _rows(self.spec, self.layouts, chosen, self.memory, self.verdict, self.timing, self.memory_gib,
                    self.options, self.memory_model, tokens=self.tokens, global_batch_size=self.global_batch_size)
        for position, row in enumerate(out[:self.ranked]):
            row["rank"] = position + 1
        return self._with_lever_cost(out, chosen)

    def row(self, i: int) -> dict:
        which = np.array([i])
        return self._with_lever_cost(_rows(self.spec, self.layouts, which, self.memory, self.verdict, self.timing,
                                           self.memory_gib, self.options, self.memory_model, tokens=self.tokens,
                                           global_batch_size=self.global_batch_size), which)[0]

    def _with_lever_cost(self, rows: list[dict], which: np.ndarray) -> list[dict]:
        """``rows`` (the layouts at ``which``), each with its ``lever_time_cost_s`` where priced."""
        if self.lever_time_cost is not None:
            for row, cost in zip(rows, self.lever_time_cost[which].tolist()):
                if math.isfinite(cost):
                    row["lever_time_cost_s"] = cost
        return rows

    def least(self) -> dict:
        """The layout that needs the least memory (for the nothing-fits message)."""
        key = self.memory["total"] if self.memory_model == "paper" else self.memory["usage"]
        return self.row(int(self.order[np.argmin(key[self.order])]))


def may_fit(spec: MoESpec, workload: Workload, gpus: int, memory_gib: float, *, options: st.MoEOptions,
            max_tp: int = 8, ep: int | None = None, etp: int | None = None, even_split: bool = False,
            pinned: Pinned = Pinned()) -> bool:
    """False only where ``sweep`` with these arguments ranks no layout: a lower bound that lets
    ``escalate`` skip a rung, as ``advisor.space_search.may_fit`` does the dense sweep's. A layout
    ranks only if, at every stage the sweep prices (``stage.representative_stages``), its total
    (the paper's rule: model states plus activations and transients) or its calibrated usage
    (model states plus scaled activations and the runtime's and allocator's bytes,
    ``advisor.verdicts.CalibratedTerms.stage_bytes``) is within the memory, so its model states
    alone are. Those depend on neither the micro-batch, the recomputation nor VPP
    (``stage.stage_states``): each (TP, CP, PP, EP, ETP, DP) is priced once, at those stages, over
    a superset of the sweep's layouts (its EP, ETP and even-split choices applied; the overlap's
    and the flex dispatcher's rules not, which only remove layouts). A fraction of a sweep
    (DeepSeek-V3 on 2,048 GPUs: 0.05 to 0.08 s a rung against 0.24 s); ``tests/test_ladder.py``
    checks by brute force that it never skips a rung that has a row."""
    tp, cp, pp, eps, etps, dp, _ = _bases(spec, workload, gpus, max_tp, pinned)
    keep = np.ones(len(tp), dtype=bool)
    for given, column in ((ep, eps), (etp, etps)):
        if given is not None:
            keep &= column == given
    if even_split:
        keep &= spec.num_layers % pp == 0
    layouts = np.unique(np.stack([tp, cp, pp, eps, etps, dp])[:, keep], axis=1)  # the micro-batch changes no state
    tp, cp, pp, eps, etps, dp = layouts
    worst = np.zeros(len(tp))
    for stage in st.representative_stages(spec, pp):
        states = st.stage_states(spec, options, tp=tp, cp=cp, pp=pp, ep=eps, etp=etps, dp=dp, stage=stage)
        worst = np.maximum(worst, states.dense + states.experts + states.fp8_weights)  # StageBytes.model_states
    return bool((worst / GIB <= memory_gib).any())


def escalate(first: SweepResult, run: Callable[[st.MoEOptions], SweepResult], gpu: GpuSpec | None = None,
             problem: Callable[[TrainingOptions], str | None] | None = None, gather_given: bool = False,
             may_help: Callable[[st.MoEOptions], bool] | None = None) -> SweepResult:
    """``first`` where anything in it runs; else the MoE sweep climbs the dense sweep's ladder
    (``advisor.escalation.climb``, one ladder for both): ``run(options)`` sweeps the same space
    with a rung's ``MoEOptions``, a rung for which ``problem(training options)`` gives a reason
    (what the MoE model does not price) is not swept, and the first rung with a layout expected
    to run gives the result, with ``escalation`` and, with a time model, ``lever_time_cost``. The
    result (``first`` where no rung runs) carries the rungs climbed in vain (``ladder``);
    ``gather_given``: the user chose --overlap-param-gather (``advisor.escalation.rung``). A rung
    for which ``may_help(its MoEOptions)`` is False (``may_fit``: no layout can fit on it) is not
    swept: its sweep would rank nothing."""
    from dataclasses import replace

    from advisor.escalation import HOPELESS, climb

    if first.ranked:
        return first
    options = first.options

    def refused(lever: TrainingOptions) -> str | None:
        if problem is not None and (why := problem(lever)):
            return why
        return None if may_help is None or may_help(replace(options, training=lever)) else HOPELESS

    found, attempts = climb(lambda lever: run(replace(options, training=lever)), lambda result: result.ranked > 0,
                            options.training, gpu, refused, gather_given)
    if found is None:
        return replace(first, ladder=attempts)
    label, candidate = found
    return replace(candidate, escalation=label, ladder=attempts, lever_time_cost=_lever_time_cost(first, candidate))


def _lever_time_cost(first: SweepResult, candidate: SweepResult) -> np.ndarray | None:
    """Per layout of ``candidate``, its step time minus that of the same (TP, CP, PP, EP, ETP, DP,
    MBS) in ``first`` (each sweep's one variant per layout, as the dense ladder's cost: the
    lever's row against the one the options given would run); NaN where ``first`` has none; None
    without a time model. Both sweeps enumerate the same bases (``_bases`` reads no options), so
    ``Layouts.base`` names the same (TP, CP, PP, EP, ETP, DP, MBS) in both."""
    if candidate.timing is None or first.timing is None:
        return None
    bases = first.layouts.base[first.order]
    before = np.full(int(max(bases.max(initial=-1), candidate.layouts.base.max(initial=-1))) + 1, np.nan)
    before[bases] = first.timing["step_time_s"][first.order]
    cost = np.full(len(candidate.layouts.tp), np.nan)
    which = candidate.order
    cost[which] = candidate.timing["step_time_s"][which] - before[candidate.layouts.base[which]]
    return cost


def _rank(layouts: Layouts, kept: np.ndarray, verdict, memory: dict, timing, options: st.MoEOptions, memory_model: str,
          tolerance: float, rank_by: str) -> np.ndarray:
    """The kept layouts in ``advisor.ranking.order``'s order (the dense rows' ranking: by
    throughput the fastest first, the rows within ``tolerance`` of it by simplicity; by memory the
    least used first; else the paper's rule), then the rest by memory."""
    from advisor.paper_rule import rule_key
    from advisor.ranking import option_levers, order, simplicity
    from advisor.verdicts import EXPECTED_TO_RUN

    usage = memory["total"] if memory_model == "paper" else memory["usage"]
    levers = option_levers(options.training.memory_options())  # one options for every row: FSDP, offload, FP8
    runs = kept[np.isin(verdict[kept], EXPECTED_TO_RUN)]  # ``order`` ranks only these, in this order
    columns = {k: getattr(layouts, k)[runs].tolist() for k in ("tp", "cp", "pp", "ep", "vpp", "mbs", "recompute")}
    speeds = timing["tflops_per_gpu"][runs].tolist() if timing else [None] * len(runs)
    records = []
    for i, kind, used, speed, tp, cp, pp, ep, vpp, mbs, index in zip(runs.tolist(), verdict[runs].tolist(),
                                                                   usage[runs].tolist(), speeds, *columns.values()):
        recompute = RECOMPUTES[index]
        recomputed = int(recompute == "full")  # full: uniform, 1 layer per chunk (``_RowParts.recomputation``)
        paper = rule_key(verdict=kind, recompute=recompute, tp=tp, cp=cp, pp=pp, mbs=mbs, recomputed_layers=recomputed,
                         memory_gib=used, vpp=vpp, ep=ep)
        simple = simplicity(pp=pp, vpp=vpp, recompute=recompute, recomputed_layers=recomputed,
                            model_parallel=tp * cp * pp, **levers, ep=ep)
        records.append((i, kind, paper, simple, speed, used))
    ranked = order(records, rank_by, verdict=lambda r: r[1], paper_key=lambda r: r[2], tflops=lambda r: r[4],
                   usage_gib=lambda r: r[5], tolerance=tolerance if timing else 0.0, simplicity=lambda r: r[3])
    first = np.array([r[0] for r in ranked], dtype=np.int64)
    ranks = np.zeros(len(layouts.tp), dtype=bool)
    ranks[first] = True
    rest = np.sort(kept[~ranks[kept]])  # np.setdiff1d's order, without its np.unique (which imports numpy.ma)
    return np.concatenate([first, rest[np.argsort(usage[rest], kind="stable")]]), len(first)


def sweep(spec: MoESpec, workload: Workload, gpus: int, memory_gib: float, *, threshold: float = DEFAULT_THRESHOLD,
          max_tp: int = 8, gpu: GpuSpec | None = None, options: st.MoEOptions = st.MoEOptions(),
          ep: int | None = None, etp: int | None = None, even_split: bool = False,
          recompute: str | None = None, memory_model: str | None = None, vpp: int | None = None,
          tolerance: float | None = None, pinned: Pinned = Pinned(), tokens: float | None = None,
          rank_by: str | None = None) -> SweepResult:
    """Every valid layout with the variant (recomputation, VPP) it needs, or with a GPU the
    fastest expected to run, judged (``memory_model`` 'paper' or 'calibrated'; default:
    calibrated with a GPU, as dense rows) and ranked (``_rank``). ``ep``/``etp``/``vpp`` and
    ``pinned`` (TP, CP, PP, MBS) pin those; ``even_split`` keeps PP dividing the layers;
    ``recompute`` pins the recomputation; ``tokens``, a budget, adds the timed rows' days and
    GPU-hours (``advisor.ranking.budget_fields``, as a dense row's); ``rank_by`` (default: throughput
    with a GPU, else the paper's rule) orders the rows expected to run."""
    from advisor.ranking import default_rank_by

    rank_by = rank_by or default_rank_by(gpu is not None)
    _check_sweep(spec, workload, gpus, gpu.gpus_per_node if gpu is not None else max_tp, max_tp, ep, etp,
                 options.dispatcher, pinned)
    memory_model = memory_model or default_memory_model(gpu is not None)
    layouts = enumerate_layouts(spec, workload, gpus, max_tp, interleave=gpu is not None and vpp != 1, pinned=pinned)
    keep = np.ones(len(layouts.tp), dtype=bool)
    for given, column in ((ep, layouts.ep), (etp, layouts.etp), (vpp, layouts.vpp)):
        if given is not None:
            keep &= column == given
    if even_split:
        keep &= spec.num_layers % layouts.pp == 0
    if recompute is not None:
        keep &= layouts.recompute == RECOMPUTES.index(recompute)
    if options.a2a_overlap:  # overlap_problem's rules, vectorised
        keep &= (layouts.ep > 1) & ((layouts.pp == 1) | (layouts.vpp > 1))
        keep &= layouts.recompute != RECOMPUTES.index("full")
    if options.dispatcher == "flex":  # layout_problem's rule, vectorised
        keep &= layouts.ep * layouts.etp > 1
    layouts = layouts if keep.all() else layouts.take(keep)
    if not len(layouts.tp):
        raise AdvisorError(f"no layout of {spec.name} on {gpus} GPUs with these choices ("
                           + (f"{pinned.text()}, " if pinned.given() else "")
                           + f"EP {ep or 'any'}, ETP "
                           f"{etp or 'any'}, VPP {vpp or 'any'}" + (", an even split" if even_split else "")
                           + (f", recompute {recompute}" if recompute else "")
                           + (", --overlap-moe-expert-parallel-comm: EP > 1, VPP > 1 with PP > 1, no full recompute"
                              if options.a2a_overlap else "")
                           + (", the flex dispatcher: EP x ETP > 1" if options.dispatcher == "flex" else "") + ")")
    judge, band = calibrated_judge(spec, workload.seq_len, options, memory_gib) if memory_model == "calibrated" \
        else (None, None)
    layouts, memory, verdict = _judged(spec, workload, layouts, options, judge, memory_gib, threshold, band)
    timing = _timing(spec, workload, layouts, gpu, options) if gpu else None
    if timing:
        speed = timing["step_time_s"]
    else:  # the least recomputation first, no interleaving
        speed = layouts.recompute + layouts.vpp / 100.0
    kept = _one_variant_each(layouts, verdict, speed, memory["total"] if band is None else memory["usage"])
    if tolerance is None:
        from advisor.ranking import ranking_tolerance

        tolerance = ranking_tolerance()
    order, ranked = _rank(layouts, kept, verdict, memory, timing, options, memory_model, tolerance, rank_by)
    return SweepResult(spec, layouts, memory, verdict, timing, memory_gib, options, order, ranked,
                       considered=len(layouts.tp), memory_model=memory_model,
                       tolerance=tolerance if timing and rank_by == "throughput" else None,
                       tokens=tokens, global_batch_size=workload.global_batch_size, rank_by=rank_by)


def _check_sweep(spec: MoESpec, workload: Workload, gpus: int, whole_node: int, max_tp: int, ep: int | None,
                 etp: int | None, dispatcher: str, pinned: Pinned = Pinned()) -> None:
    """One line (AdvisorError) for a sweep that cannot be asked, before anything is priced: GPUs
    that are not whole nodes (the dense sweep's ``check_whole_nodes``), pinned TP, CP, PP or MBS
    no layout can have (``Pinned.problem``), a pinned EP or ETP that no PP lets megatron-core run
    (``expert_problem`` at PP 1, the largest TP x CP x DP; the flex dispatcher's rule where both
    are pinned), or a pinned ETP the search never tries (one that is no power of 2 said first,
    whatever the EP)."""
    check_whole_nodes(gpus, whole_node)
    if problem := pinned.problem(gpus, heads=spec.num_attention_heads, kv_heads=spec.tp_kv_heads,
                                 layers=spec.num_layers, seq_len=workload.seq_len,
                                 global_batch_size=workload.global_batch_size, max_tp=max_tp):
        raise AdvisorError(problem)
    if ep is None and etp is None:
        return
    # an ETP that is no power of 2 is never searched, at any EP: said first, so that --etp 3 alone
    # is not answered with the expert-group rule for an "EP x ETP = 3" the user never gave
    unsearched = (f"ETP {etp} is not searched: the sweep's ETP is a power of 2 up to TP, which is at most {max_tp} "
                  "(--gpus-per-node)")
    if etp is not None and etp & (etp - 1):
        raise AdvisorError(unsearched)
    if problem := expert_problem(spec, gpus, ep or 1, etp or 1, dispatcher if ep and etp else None):
        raise AdvisorError(problem)
    if etp is not None and etp > max_tp:
        raise AdvisorError(unsearched)
    if etp is not None and pinned.tp is not None and etp > pinned.tp:
        raise AdvisorError(f"ETP {etp} is not searched with --tp {pinned.tp}: the sweep's ETP is at most the TP "
                           "(advisor estimate prices a larger one)")


def _timing(spec: MoESpec, workload: Workload, layouts: Layouts, gpu: GpuSpec, options: st.MoEOptions,
            layers_per_stage: tuple[int, ...] | None = None, with_parts: bool = False) -> dict:
    """``time.step_times`` per recomputation's subset, gathered back (``layers_per_stage``: one
    layout's own split; ``with_parts``: ``time_parts`` too, each part an array like the rest)."""
    from advisor.moe import time as mt

    out: dict = {}
    for recompute, which in _subsets(layouts):
        columns = layouts.columns(which)
        m = workload.global_batch_size / (columns["mbs"] * columns["dp"])
        by_base = _ByBase(layouts.base[which], columns)
        first = by_base.stage_bytes(spec, workload.seq_len, options, 0 * columns["pp"], recompute, columns["vpp"], m,
                                    layers_per_stage)
        part = mt.step_times(spec, workload.seq_len, workload.global_batch_size, columns, recompute, gpu=gpu,
                             options=options, first_stage=first, layers_per_stage=layers_per_stage,
                             bases=(by_base.first, by_base.inverse) if by_base.shared else None,
                             with_parts=with_parts)
        for key, value in part.pop("time_parts", {}).items():
            out.setdefault("time_parts", {}).setdefault(key, np.zeros(len(layouts.tp)))[which] = value
        for key, value in part.items():
            out.setdefault(key, np.zeros(len(layouts.tp)))[which] = value
    return out


def _rows(spec, layouts, which, memory, verdict, timing, memory_gib, options, memory_model,
          layers_per_stage=None, tokens: float | None = None, global_batch_size: int = 0) -> list[dict]:
    """The rows of the layouts at ``which``, in that order (``rank`` None). The columns are read
    out as Python values once (not element by element), and what depends only on the
    recomputation, TP > 1 or PP is made once (``_RowParts``). ``tokens``: a budget, each timed
    row's days and GPU-hours from its own tokens/s (``advisor.ranking.budget_fields``); with
    ``global_batch_size``, each row's microbatches per pipeline, GBS / (MBS x DP), as a dense row's."""
    from advisor.ranking import budget_fields

    columns = {k: getattr(layouts, k)[which].tolist() for k in ("tp", "cp", "pp", "ep", "etp", "dp", "mbs", "vpp",
                                                                "recompute")}
    gib = {k: (memory[k][which] / GIB).tolist() for k in ("total", "states", "activations")}
    stage, verdicts = memory["stage"][which].tolist(), verdict[which].tolist()
    calibrated = memory_model != "paper"
    if calibrated:
        usage, usage_stage = (memory["usage"][which] / GIB).tolist(), memory["usage_stage"][which].tolist()
    timed = {key: np.asarray(value, dtype=float)[which].tolist() for key, value in (timing or {}).items()}
    parts = _RowParts(spec, options, layers_per_stage)
    rows = []
    for j, (tp, cp, pp, ep, etp, dp, mbs, vpp, recompute) in enumerate(zip(*columns.values())):
        total = gib["total"][j]
        row = {"rank": None, "tp": tp, "cp": cp, "pp": pp, "ep": ep, "etp": etp, "mbs": mbs, "dp": dp,
               "gpus": tp * cp * pp * dp, "edp": tp * cp * dp // (ep * etp), "vpp": vpp,
               **({"num_microbatches": global_batch_size // (mbs * dp)} if global_batch_size else {}),
               "layers_per_stage": parts.split(pp), **parts.recomputation(recompute), **parts.fixed,
               "options": parts.options(recompute, tp > 1), "total_gib": total, "model_states_gib": gib["states"][j],
               "activations_gib": gib["activations"][j], "peak_stage": int(stage[j]),
               "memory_fraction": total / memory_gib, "verdict": str(verdicts[j])}
        if calibrated:
            row.update(usage_gib=usage[j], margin_gib=memory_gib - usage[j],
                       calibrated_peak_stage=int(usage_stage[j]))
        for key, values in timed.items():
            row[key] = values[j]
        if tokens is not None and timed:
            row.update(budget_fields(tokens, row["tokens_per_s"], row["gpus"]))
        rows.append(row)
    return rows


class _RowParts:
    """The parts of a row that depend on few values (the recomputation, TP > 1, PP), made once
    per value; each row gets its own copy of the lists and dicts (a caller may edit a row)."""

    def __init__(self, spec: MoESpec, options: st.MoEOptions, layers_per_stage):
        routing = options.routing
        capacity = routing.routing == "capacity"
        self.fixed = {"dispatcher": options.dispatcher, "a2a_overlap": options.a2a_overlap,
                      "delay_wgrad": options.delay_wgrad, "dispatcher_sms": options.dispatcher_sms,
                      "permute_fusion": options.permute_fusion, "router_fusion": options.router_fusion,
                      "shared_expert_overlap": options.shared_expert_overlap,
                      "flex_backend": options.flex_backend if options.dispatcher == "flex" else None,
                      "routing": routing.routing,
                      "capacity_factor": routing.capacity_factor if capacity else None,
                      "pad_to_capacity": routing.pad_to_capacity if capacity else None,
                      "gradient_bytes": options.gradient_bytes, "distributed_optimizer": options.distributed_optimizer,
                      "imbalance": routing.imbalance}
        self._spec, self._options, self._layers = spec, options, layers_per_stage
        self._splits: dict = {}
        self._recomputations: dict = {}
        self._changed: dict = {}

    def split(self, pp: int) -> list[int]:
        if pp not in self._splits:
            self._splits[pp] = tuple(self._layers or st.split_layers(self._spec.num_layers, pp))
        return list(self._splits[pp])

    def recomputation(self, index: int) -> dict:
        """``recompute`` and its modules, method and layer count, from its index in RECOMPUTES."""
        if index not in self._recomputations:
            recompute = RECOMPUTES[index]
            modules = sorted(self._options.recompute_modules(self._spec)) if recompute == "selective" else None
            self._recomputations[index] = (recompute, modules, "uniform" if recompute == "full" else None,
                                           1 if recompute == "full" else None)
        recompute, modules, method, layers = self._recomputations[index]
        return {"recompute": recompute, "recompute_modules": None if modules is None else list(modules),
                "recompute_method": method, "recompute_num_layers": layers}

    def options(self, index: int, tp_above_one: bool) -> dict:
        key = index, tp_above_one
        if key not in self._changed:
            self._changed[key] = _changed(self._options.training, RECOMPUTES[index], tp_above_one)
        return dict(self._changed[key])


def estimate_layout(spec: MoESpec, workload: Workload, *, tp: int, cp: int, pp: int, ep: int, etp: int, dp: int,
                    mbs: int, vpp: int = 1, recompute: str = "none", memory_gib: float | None = None,
                    threshold: float = DEFAULT_THRESHOLD, gpu: GpuSpec | None = None,
                    options: st.MoEOptions = st.MoEOptions(), memory_model: str | None = None,
                    layers_per_stage: tuple[int, ...] | None = None, tokens: float | None = None) -> dict:
    """One layout: a sweep row's keys (priced, judged as the sweep does) plus ``stages`` (every
    stage's buckets); AdvisorError when megatron-core cannot run it. ``layers_per_stage``: its
    own split (default ``stage.split_layers``); ``tokens``: a budget, as ``sweep``'s."""
    split = tuple(layers_per_stage) if layers_per_stage is not None else None
    problem = layout_problem(spec, workload, tp * cp * pp * dp, tp, cp, pp, ep, etp, mbs, vpp, split,
                             a2a_overlap=options.a2a_overlap, recompute=recompute, dispatcher=options.dispatcher)
    if problem:
        raise AdvisorError(problem)
    memory_model = memory_model or default_memory_model(gpu is not None and memory_gib is not None)
    layouts = Layouts(*(np.array([x]) for x in (tp, cp, pp, ep, etp, dp, mbs, RECOMPUTES.index(recompute), vpp, 0)))
    m = workload.global_batch_size / (mbs * dp)
    columns = layouts.columns()
    del columns["vpp"]
    b = st.stage_bytes(spec, workload.seq_len, options, num_microbatches=m, stage=np.arange(pp), recompute=recompute,
                       vpp=vpp, layers_per_stage=split, **{k: int(v[0]) for k, v in columns.items()})
    judge, band = (calibrated_judge(spec, workload.seq_len, options, memory_gib) if memory_model == "calibrated"
                   else (None, None))
    usage = judge(b, {k: int(v[0]) for k, v in columns.items()}, np.arange(pp), recompute) if judge else b.total
    stages = [{"stage": i, "layers": int(b.layers[i]), "dense_layers": int(b.dense_layers[i]),
               "in_flight_microbatches": float(b.in_flight[i]),
               **{f"{key}_gib": float(getattr(b, name)[i] / GIB) for name, key in STAGE_TERMS.items()},
               "total_gib": float(b.total[i] / GIB),
               **({"usage_gib": float(usage[i] / GIB)} if judge else {})} for i in range(pp)]
    peak, top = int(np.argmax(b.total)), int(np.argmax(usage))
    memory = {"total": b.total[peak:peak + 1], "states": b.model_states[peak:peak + 1],
              "activations": (b.activations + b.transient)[peak:peak + 1], "stage": np.array([peak]),
              "usage": np.asarray(usage)[top:top + 1], "usage_stage": np.array([top])}
    limit = np.inf if memory_gib is None else memory_gib
    verdict = _verdicts(memory, limit, threshold, band)
    timing = _timing(spec, workload, layouts, gpu, options, split, with_parts=True) if gpu else None
    parts = timing.pop("time_parts") if timing else None
    row = _rows(spec, layouts, np.array([0]), memory, verdict, timing, limit, options, memory_model, split, tokens,
                workload.global_batch_size)[0]
    row.update(model=spec.name, seq_len=workload.seq_len, global_batch_size=workload.global_batch_size,
               gpu=gpu.name if gpu else None, memory_model=memory_model, stages=stages)
    if parts is not None:
        row["time_parts"] = {name: float(value[0]) for name, value in parts.items()}
    if memory_gib is None:
        row.update(verdict=None, memory_fraction=None)
    return row


STAGE_TERMS = {"weights": "weights", "gradients": "gradients", "optimizer": "optimizer",
               "weights_gradients_optimizer": "dense_states", "expert_states": "expert_states",
               "fp8_weights": "fp8_weights", "model_states": "model_states", "layer_activations": "layer_activations",
               "embedding_activations": "embedding_activations", "output_activations": "output_activations",
               "activations": "activations", "transient": "transient"}
"""The per-stage buckets an estimate shows (``stage.StageBytes`` field: its ``<key>_gib``)."""


@functools.lru_cache(maxsize=64)
def _changed(training, recompute: str, tp_above_one: bool) -> tuple:
    """A row's ``options`` (``TrainingOptions.changed`` with its recomputation), once per kind."""
    row = training.with_(recompute=recompute, recompute_method="uniform", recompute_num_layers=1)
    return tuple(row.at_tp(2 if tp_above_one else 1).changed().items())
