"""The search over the launchable space (``advisor.space``): each (TP, CP, PP, DP, MBS) layout's
row (``search``, chunk by chunk ``search_parts``), and the bound that says no layout can fit
(``may_fit``); variants priced by ``advisor.space_pricer``.

For each (TP, CP, PP, DP, MBS) the space offers one row: its best variant. Without a time model
that is no interleaving, the fewest recomputed layers that fit, and the split with the lowest
peak (``splits.lowest_memory``). With one (``timing``), the variant and split with the shortest
predicted step among those that fit (``splits.fastest_within``, MadPipe's planner). "Fit" is
the verdicts' own rule: Eq. 18 within the threshold (then within the memory: tight), or, with
``memory_calibration``, the calibrated model's usage within 1 - band of the memory (then within
it: likely fits), priced by the same vectorised stage model with ``advisor.verdicts``' terms.

Pruning (only what provably cannot win; counted, and reported by the sweep):

- a layout whose model states alone, spread perfectly over its ranks, exceed the GPU memory
  cannot fit with any split, interleaving or recomputation: only its plain variant is priced,
  to report it as oom;
- without a time model, interleaving can only add memory: every chunk of rank i holds at least
  the p - i microbatches of 1F1B (``advisor.schedule``), and with N recomputed layers per chunk
  the same layers recomputed once per rank (N v) cost no more memory, so no VPP variant can win;
  but with the uniform method, whose unit rebuilds at most its chunk's layers at once, smaller
  chunks can need less (``_least_memory_variants``): there every VPP is priced, and the
  smallest that fits is chosen;
- recomputation beyond the largest chunk recomputes nothing more: N stops there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from advisor import space_chunks
from advisor.memory import GIB, MemoryOptions
from advisor.stage_model import StageTerms
from advisor.models import LlamaSpec
from advisor.parallel import Workload
from advisor.space import Bases, SpaceOptions, Variants, _families, _groups, _recompute_range, launchable
from advisor.space_pricer import _Priced, _Pricer, _states_lower_bound
from advisor.splits import Pipelines, fill
from advisor.verdicts import MemoryCalibration

if TYPE_CHECKING:
    from advisor.rank_times import Timing


@dataclass(frozen=True, slots=True)
class Chosen:
    """The row of each base layout: its variant, split and memory; arrays over bases."""

    vpp: np.ndarray
    recompute: np.ndarray
    """'none', 'selective' or 'full'."""
    recompute_method: np.ndarray
    """'block', 'uniform', or '' without full recomputation."""
    recompute_layers: np.ndarray
    counts: np.ndarray
    """(B, P) layers per rank (0 beyond a layout's PP)."""
    terms: StageTerms
    """(B, P) memory terms of every rank."""
    step_time: np.ndarray
    """(B,) seconds per iteration where a time model priced it (nan elsewhere)."""
    steps: object | None = None
    """With a time model: every row's iteration with its parts (``advisor.throughput``)."""


@dataclass(frozen=True, slots=True)
class SpaceResult:
    bases: Bases
    chosen: Chosen
    considered: int
    """Layout variants in the space: (TP, CP, PP, DP, MBS) x VPP x recomputation."""
    evaluated: int
    """Distinct variants priced (``_Priced``); the others were pruned by the rules above."""

    @property
    def pruned(self) -> int:
        return self.considered - self.evaluated


def may_fit(spec: LlamaSpec, workload: Workload, gpus: int, memory_gib: float, *, max_tp: int,
            options: MemoryOptions, space: SpaceOptions = SpaceOptions(),
            memory_calibration: MemoryCalibration | None = None, measured=None) -> bool:
    """False only where ``search`` with these arguments can find no variant within the memory
    (so every row it returns is oom): a lower bound that lets ``advisor.escalation`` skip a rung.

    Per launchable base, only its least-memory variants are priced, with the search's own
    pricer (``fits``) and limit (all of the memory, the search's second pass):
    - its smallest VPP: a VPP v rank holds at least the 1F1B microbatches on every chunk
      (``schedule``: each chunk p - i or more, the first chunk too) over fewer allowed splits
      (n >= v), so v = 1 never needs more (the module docstring's pruning rule); but every VPP
      with the uniform method (``_least_memory_variants``);
    - per recomputation family, N at both ends of its range: the block method's memory never
      grows with N once N >= 1, the uniform method's never falls with N, and N = 0 (none) is
      priced apart, since a calibrated model scales a recomputing layout's activations by other
      factors than a plain one's;
    - bases whose model states alone exceed the memory are skipped, as the search does.
    ``tests/test_space.py`` checks against whole sweeps that it never says False where one fits."""
    bases = launchable(spec, workload, gpus, max_tp, options, space.split, space.chunk_multiple, space.pinned)
    calibrated = None if memory_calibration is None else (memory_calibration, memory_gib, measured)
    return _fits_somewhere(spec, workload, bases, *_groups(spec, bases, space), memory_gib, options, space,
                           calibrated)[0]


def _fits_somewhere(spec: LlamaSpec, workload: Workload, bases: Bases, group_base: np.ndarray, group_vpp: np.ndarray,
                    memory_gib: float, options: MemoryOptions, space: SpaceOptions,
                    calibrated) -> tuple[bool, _Priced]:
    """``may_fit`` over launchable ``bases`` and their (base, VPP) groups: (whether some base's
    least-memory variant fits, the variants priced to say so: counted only where the search
    plans nothing, so that ``may_fit`` pays no count)."""
    if not len(group_base):
        return False, _Priced()
    memory = memory_gib * GIB
    floor = _states_lower_bound(spec, bases, options)
    candidates = np.flatnonzero(np.isin(np.arange(len(bases)), group_base) & (floor <= memory))
    state = _Search(spec, workload, options, None, space.split == "even", calibrated)
    families = _families(space, options)
    every_vpp = any(uniform for _, uniform in families)  # chunks as wide as the variants checked
    among = np.isin(group_base, candidates)
    for index in space_chunks.chunks(bases.pp[candidates], np.searchsorted(candidates, group_base[among]), every_vpp):
        which = candidates[index]
        for selective, uniform in families:
            variants = _least_memory_variants(bases, group_base, group_vpp, which, selective, uniform)
            low, high = _recompute_range(variants.pp, variants.vpp, spec.num_layers, space, selective)
            for n in _least_memory_recompute(low, high, uniform):
                if _fits_any(state, variants.with_recompute(n), memory, floor):
                    return True, state.priced
    return False, state.priced


FIRST_PART = 64
"""The variants ``_fits_any`` prices first; each part after it twice the last."""


def _fits_any(search: _Search, variants: Variants, limit: float, floor: np.ndarray) -> bool:
    """Whether some of ``variants`` fits within ``limit`` (``_fits``), priced in parts of doubling
    size, the least model states per GPU first (``floor``, per base): the first part that holds a
    fit ends it (the 405B levers sweep on 16,384 GPUs: 57 of the first 64 of 1,283 fit, which
    were all priced before), and where none fits, every variant is priced all the same."""
    order = np.argsort(floor[variants.base], kind="stable")
    start, size = 0, FIRST_PART
    while start < len(order):
        if _fits(search, variants.take(order[start:start + size]), limit).any():
            return True
        start, size = start + size, 2 * size
    return False


@dataclass(frozen=True, slots=True)
class _Search:
    """What every step of one search shares."""

    spec: LlamaSpec
    workload: Workload
    options: MemoryOptions
    timing: Timing | None
    even: bool

    calibrated: tuple | None = None
    """(MemoryCalibration, GPU memory in GiB, MeasuredActivations or None): plan against the
    calibrated (or profile) model's usage."""
    times: dict = field(default_factory=dict)
    """LayoutTimes of every base, per recomputation family (selective or not), made once."""
    steps_unlimited: dict = field(default_factory=dict)
    """Per recomputation family, ``unlimited_steps`` of the variants it priced, by (base, VPP)."""
    priced: _Priced = field(default_factory=_Priced)
    """Every variant priced so far (``memory`` shares it)."""
    reusable: dict = field(default_factory=dict)
    """Per recomputation family, the variants ``reuse`` was given and the pricers built for all
    of them (``pricer`` takes its stage models from those)."""

    def memory(self) -> _Search:
        """The same search without the time model: for pricers that only judge memory (``fits``,
        the memory side of ``fastest``), which then build no rank times."""
        return replace(self, timing=None, times={}) if self.timing is not None else self

    def pricer(self, variants: Variants) -> _Pricer:
        times = None
        if self.timing is not None:
            if variants.selective not in self.times:
                bases = variants.bases
                self.times[variants.selective] = self.timing.layouts(
                    tp=bases.tp, cp=bases.cp, dp=bases.dp, mbs=bases.mbs, pp=bases.pp, selective=variants.selective)
            times = self.times[variants.selective]
        built = self._built(variants)
        if built is not None:
            return built[0].take(built[1], variants, times)
        return _Pricer(self.spec, self.workload, self.options, variants, times, self.even, self.calibrated)

    def unlimited_steps(self, variants: Variants) -> np.ndarray:
        """Per variant, the step of its fastest split with no recomputation and no memory limit
        (inf where it has none): ``_fastest_variants``' bound, which no limit changes, so made
        once for the variants the first limit plans (the second plans some of them again)."""
        key = variants.base * (self.spec.num_layers + 1) + variants.vpp
        known = self.steps_unlimited.get((variants.selective, variants.uniform))
        if known is not None:
            at = np.minimum(np.searchsorted(known[0], key), len(known[0]) - 1)
            if (known[0][at] == key).all():
                return known[1][at]
        free = self.pricer(variants.with_recompute(0))
        self.priced.add(variants, 0)
        unlimited = free.fastest(np.inf)
        bound = np.where(unlimited.feasible, free.steps(unlimited.counts, lower_bound=True)["total_s"], np.inf)
        order = np.argsort(key, kind="stable")
        self.steps_unlimited[variants.selective, variants.uniform] = (key[order], bound[order])
        return bound

    def reuse(self, variants: Variants) -> None:
        """Build the stage models of ``variants`` at most once (per recomputing or not, where
        calibrated): ``pricer`` then takes those of any of them, with any N, from these. The
        planners price the same (base, VPP) at N after N; the models read N alone (1,600 stage
        models were built for the 405B sweep on 16,384 GPUs, 267 of them per search)."""
        key = variants.base * (self.spec.num_layers + 1) + variants.vpp
        order = np.argsort(key, kind="stable")
        self.reusable[variants.selective, variants.uniform] = (variants, key[order], order, {})

    def _built(self, variants: Variants) -> tuple[_Pricer, np.ndarray] | None:
        """(a pricer built for ``reuse``'s variants, the rows of ``variants`` among them) where
        ``variants`` are some of those, all recomputing or none where calibrated."""
        entry = self.reusable.get((variants.selective, variants.uniform))
        if entry is None or not len(variants) or variants.bases is not entry[0].bases:
            return None
        registered, keys, order, built = entry
        recomputing = variants.recompute_layers > 0
        flag = bool(recomputing[0]) if self.calibrated is not None else False
        if self.calibrated is not None and (recomputing != flag).any():
            return None  # the calibrated layer factor reads N > 0 per layout
        key = variants.base * (self.spec.num_layers + 1) + variants.vpp
        at = np.minimum(np.searchsorted(keys, key), len(keys) - 1)
        rows = order[at]
        if not (keys[at] == key).all():
            return None
        if flag not in built:
            built[flag] = _Pricer(self.spec, self.workload, self.options, registered.with_recompute(int(flag)), None,
                                  self.even, self.calibrated)
        return built[flag], rows


def _fits(search: _Search, variants: Variants, limit: float) -> np.ndarray:
    """Per variant, at its own N, whether some split fits within ``limit`` (``_Pricer.fits``),
    planned only where every rank holding its fewest layers is: a split needs that first, and one
    total per rank rules out most of what does not fit (the 405B sweep on 16,384 GPUs: a third)."""
    search.priced.add(variants)
    pricer = search.pricer(variants)
    if search.even:  # one total per rank already
        return pricer.fits(limit)
    ok = np.zeros(len(variants), dtype=bool)
    rest = np.flatnonzero(pricer.floor_within(limit))
    if rest.size == len(variants):
        return pricer.fits(limit)
    if rest.size:
        ok[rest] = search.pricer(variants.take(rest)).fits(limit)
    return ok


def _least_recompute(search: _Search, variants: Variants, low, high, limit) -> np.ndarray:
    """Per variant (its N ignored), the fewest recomputed layers N in [low, high] with which some
    split fits within ``limit`` (-1 where none does): with the block method memory never grows with N, so the lowest first, then bisection; the
    uniform method's does not fall with N (fewer checkpoints, a larger unit rebuilt), so every N
    in turn."""
    search = search.memory()
    if variants.uniform:
        least, n = np.full(len(variants), -1), low.copy()
        open_ = n <= high
        while open_.any():
            index = np.flatnonzero(open_)
            ok = _fits(search, variants.take(index).with_recompute(n[index]), limit)
            least[index[ok]] = n[index[ok]]
            n[index] += 1
            open_[index] = ~ok & (n[index] <= high[index])
        return least
    fits_low = _fits(search, variants.with_recompute(low), limit)  # most need none
    rest = np.flatnonzero(~fits_low & (high > low))
    fits_high = fits_low.copy()
    if rest.size:
        fits_high[rest] = _fits(search, variants.take(rest).with_recompute(high[rest]), limit)
    below, above = np.where(fits_low, low - 1, low), np.where(fits_low, low, np.where(fits_high, high, -1))
    open_ = fits_high & (above - below > 1)
    while open_.any():
        index = np.flatnonzero(open_)
        middle = (below[index] + above[index]) // 2
        ok = _fits(search, variants.take(index).with_recompute(middle), limit)
        below[index] = np.where(ok, below[index], middle)
        above[index] = np.where(ok, middle, above[index])
        open_ = fits_high & (above - below > 1)
    return above


class _Picks:
    """Per base, the chosen variant (-1 family: none yet): arrays over bases."""

    def __init__(self, bases: int, width: int) -> None:
        self.family = np.full(bases, -1)
        self.vpp = np.ones(bases, dtype=np.int64)
        self.recompute_layers = np.zeros(bases, dtype=np.int64)
        self.counts = np.zeros((bases, width), dtype=np.int64)
        self.planned = np.zeros(bases, dtype=bool)
        """Whether ``counts`` holds the split (else it is still to plan)."""
        self.step_time = np.full(bases, np.nan)

    @property
    def open(self) -> np.ndarray:
        return self.family < 0

    def take_best(self, found: list, families: list) -> None:
        """Per open base, the variant with the lowest key over every set in ``found``
        ((family index, variants, N or -1, key, counts or None)); first on ties."""
        rows = [(f, v, n, key, counts) for f, v, n, key, counts in found if len(v)]
        if not rows:
            return
        key = np.concatenate([np.where(n >= 0, k, np.inf) for _, v, n, k, _ in rows])
        base = np.concatenate([v.base for _, v, _, _, _ in rows])
        which = np.concatenate([np.full(len(v), i) for i, (_, v, _, _, _) in enumerate(rows)])
        index = np.concatenate([np.arange(len(v)) for _, v, _, _, _ in rows])
        ok = np.isfinite(key) & self.open[base]
        if not ok.any():
            return
        order = np.flatnonzero(ok)[np.lexsort((key[ok], base[ok]))]
        first = order[np.r_[True, base[order][1:] != base[order][:-1]]]
        for i, (family, variants, n, k, counts) in enumerate(rows):
            chosen = first[which[first] == i]
            at, b = index[chosen], base[chosen]
            self.family[b] = family
            self.vpp[b] = variants.vpp[at]
            self.recompute_layers[b] = n[at]
            if counts is not None:
                self.counts[b, :counts.shape[1]] = counts[at]
                self.planned[b] = True
                self.step_time[b] = k[at]

    def variants(self, members: np.ndarray, bases: Bases, families: list) -> Variants:
        """The picks ``members`` (all of one family) as one set."""
        selective, uniform = families[int(self.family[members[0]])]
        return Variants(members, bases, self.vpp[members], self.recompute_layers[members], selective, uniform)


def search(spec: LlamaSpec, workload: Workload, gpus: int, memory_gib: float, *, threshold: float,
           max_tp: int, options: MemoryOptions, space: SpaceOptions = SpaceOptions(),
           timing: Timing | None = None, memory_calibration: MemoryCalibration | None = None,
           measured=None) -> SpaceResult:
    """One row per launchable (TP, CP, PP, DP, MBS): its best variant and split (module docstring).

    Plans against Eq. 18 with its ``threshold`` (fits, then tight), or, with a
    ``memory_calibration``, against the calibrated model's usage (``advisor.verdicts``: fits,
    within 1 - band of the memory, then likely fits, within all of it), its activations scaled by
    the ``measured`` ratios of ``--memory-model profile`` where given."""
    parts = search_parts(spec, workload, gpus, memory_gib, threshold=threshold, max_tp=max_tp, options=options,
                         space=space, timing=timing, memory_calibration=memory_calibration, measured=measured)
    return space_chunks.merge(parts)


def search_parts(spec: LlamaSpec, workload: Workload, gpus: int, memory_gib: float, *, threshold: float,
                 max_tp: int, options: MemoryOptions, space: SpaceOptions = SpaceOptions(),
                 timing: Timing | None = None, memory_calibration: MemoryCalibration | None = None,
                 measured=None) -> list[tuple[SpaceResult, np.ndarray]]:
    """``search``, chunk by chunk: (the chunk's SpaceResult, the indices of its bases among all
    launchable ones), shallow pipelines first. Each chunk's arrays are as wide as its own deepest
    pipeline: merged, 12,766 bases padded to PP 4,096 took 3 GB (``space_chunks``)."""
    bases = launchable(spec, workload, gpus, max_tp, options, space.split, space.chunk_multiple, space.pinned)
    group_base, group_vpp = _groups(spec, bases, space)
    calibrated = None if memory_calibration is None else (memory_calibration, memory_gib, measured)
    # Where no layout can fit at all (the largest inputs: minutes of planning), skip the planning:
    # every row is its plain variant, as the search would have made it (``may_fit``).
    somewhere, checked = _fits_somewhere(spec, workload, bases, group_base, group_vpp, memory_gib, options, space,
                                         calibrated)
    parts = []
    for index in space_chunks.chunks(bases.pp, group_base, timing is not None and somewhere):  # bounded arrays
        inside = np.isin(group_base, index)
        result, kept = _search_part(spec, workload, bases.take(index), np.searchsorted(index, group_base[inside]),
                                    group_vpp[inside], memory_gib, threshold=threshold, options=options, space=space,
                                    timing=timing, memory_calibration=memory_calibration, measured=measured,
                                    plan=somewhere)
        parts.append((result, index[kept]))
    if not somewhere:  # what the check priced
        priced = checked.count(spec.num_layers, space)
        parts[0] = (replace(parts[0][0], evaluated=parts[0][0].evaluated + priced), parts[0][1])
    return parts


def _search_part(spec: LlamaSpec, workload: Workload, bases: Bases, group_base: np.ndarray, group_vpp: np.ndarray,
                 memory_gib: float, *, threshold: float, options: MemoryOptions, space: SpaceOptions,
                 timing: Timing | None, memory_calibration: MemoryCalibration | None, measured,
                 plan: bool = True) -> tuple:
    """``search`` over some of the bases (``group_base`` indexes them): (SpaceResult, the indices
    of the bases kept, a pinned VPP dropping those that cannot interleave so). Without ``plan``
    (nothing can fit), only the plain variants that do not."""
    layers = spec.num_layers
    calibrated = None if memory_calibration is None else (memory_calibration, memory_gib, measured)
    state = _Search(spec, workload, options, timing, space.split == "even", calibrated)
    kept = np.arange(len(bases))
    if space.vpp is not None:  # a pinned VPP drops the layouts that cannot interleave that way
        kept = np.flatnonzero(np.bincount(group_base))  # np.unique's, without importing numpy.ma (10 ms)
        bases = bases.take(kept)
        group_base = np.searchsorted(kept, group_base)
    possible = _states_lower_bound(spec, bases, options) <= memory_gib * GIB
    first_vpp = np.full(len(bases), np.iinfo(np.int64).max)
    np.minimum.at(first_vpp, group_base, group_vpp)  # each base's smallest VPP
    families = _families(space, options)
    considered = 0
    for selective, _ in families:
        low, high = _recompute_range(bases.pp[group_base], group_vpp, layers, space, selective)
        considered += int(np.maximum(high - low + 1, 0).sum())
    keep = possible[group_base]
    if timing is None and space.vpp is None and not any(uniform for _, uniform in families):
        keep &= group_vpp == 1  # interleaving can only add memory (module docstring)
    group_base, group_vpp = group_base[keep], group_vpp[keep]
    picks = _Picks(len(bases), int(bases.pp.max()) if len(bases) else 1)
    first = threshold if memory_calibration is None else 1 - memory_calibration.band
    for limit in (first * memory_gib * GIB, memory_gib * GIB) if plan else ():
        open_ = picks.open[group_base]
        found = []
        for family, (selective, uniform) in enumerate(families):
            variants = Variants(group_base[open_], bases, group_vpp[open_], np.zeros(int(open_.sum()), np.int64),
                                selective, uniform)
            if not len(variants):
                continue
            if timing is None:  # the fewest recomputed layers; selective before full
                state.reuse(variants)
                low, high = _recompute_range(variants.pp, variants.vpp, layers, space, selective)
                least = _least_recompute(state, variants, low, high, limit)
                # uniform: N is the unit, every layer is recomputed; the smallest VPP that fits first
                key = (variants.vpp - 1) * (layers + 1) + least if uniform else least + 0.5 * selective
                found.append((family, variants, least, key, None))
            else:
                _, chosen, steps, counts = _fastest_variants(state, variants, space, limit, len(bases))
                found.append((family, variants, chosen, steps, counts))
        picks.take_best(found, families)
    # What fits nowhere: its plain variant (its first VPP, no recomputation). Where some split of
    # it might fit within the memory with recomputation, the lowest-memory split shows by how
    # much it misses; where not even the model states fit, any split does, so the evenest.
    missing = np.flatnonzero(picks.open)
    picks.family[missing] = 0
    picks.vpp[missing] = first_vpp[missing]
    picks.recompute_layers[missing] = 0
    plain = Variants(missing, bases, picks.vpp[missing], picks.recompute_layers[missing], *families[0])
    evenest = ~possible[missing]
    if evenest.any():
        pipelines = Pipelines(pp=plain.pp[evenest], vpp=plain.vpp[evenest], layers=layers)
        picks.counts[missing[evenest], :pipelines.width] = fill(pipelines.highest, pipelines)
        picks.planned[missing[evenest]] = True  # pruned, not priced: the model states rule them out
    for family in range(len(families)):  # the lowest-memory split of what is still to plan
        todo = np.flatnonzero(~picks.planned & (picks.family == family))
        if todo.size:
            variants = picks.variants(todo, bases, families)
            split = state.memory().pricer(variants).lowest()
            picks.counts[todo, :split.counts.shape[1]] = split.counts
            picks.planned[todo] = True
    return SpaceResult(bases=bases, chosen=_rows(state, bases, picks, families), considered=considered,
                       evaluated=state.priced.count(layers, space)), kept


def _fastest_variants(search: _Search, variants: Variants, space: SpaceOptions, limit: float, bases: int):
    """With a time model: per base, its fastest (VPP, N, split) within ``limit``.

    Each (base, VPP) has a lower bound, the step of its fastest split with no recomputation and
    no memory limit at all (recomputation and the limit can only slow it). The (base, VPP) are
    planned in two rounds, the one with the lowest bound first, then those others whose bound is
    better than their base's best so far; the rest are pruned. Returns (variants, N, step, counts)."""
    search.reuse(variants)
    bound = search.unlimited_steps(variants)
    order = np.lexsort((bound, variants.base))
    rank = np.empty(len(variants), dtype=np.int64)
    start = np.r_[0, np.flatnonzero(np.diff(variants.base[order])) + 1]  # each base's first position in order
    rank[order] = np.arange(len(variants)) - np.repeat(start, np.diff(np.r_[start, len(variants)]))
    best = np.full(bases, np.inf)
    step = np.full(len(variants), np.inf)
    chosen = np.full(len(variants), -1)
    counts = np.zeros((len(variants), int(variants.pp.max())), dtype=np.int64)
    for first_round in (True, False):  # each base's most promising VPP, then the rest that may beat it
        todo = np.flatnonzero(((rank == 0) if first_round else (rank > 0)) & (bound < best[variants.base]))
        if not first_round and todo.size:
            todo = _drop_unfit_bases(search, variants, todo, best, space, limit)
        if not todo.size:
            continue
        part = variants.take(todo)
        low, high = _recompute_range(part.pp, part.vpp, search.spec.num_layers, space, part.selective)
        least = _least_recompute(search, part, low, high, limit)
        steps, n, part_counts = _fastest_recompute(search, part, least, high, limit)
        step[todo], chosen[todo] = steps, n
        counts[todo, :part_counts.shape[1]] = part_counts
        np.minimum.at(best, part.base, steps)
    return variants, chosen, step, counts


def _drop_unfit_bases(search: _Search, variants: Variants, todo: np.ndarray, best: np.ndarray, space: SpaceOptions,
                      limit: float) -> np.ndarray:
    """The variants ``todo`` less those of bases none of whose variants fits within ``limit``,
    counted as priced where ``_least_recompute`` would have priced them to find that (so the
    count is the rules', not this shortcut's).

    Only bases with no step yet (their first round found no fit) are checked, each by its
    least-memory variants alone (``_least_memory_variants``, at the N that bound their memory:
    ``_least_memory_recompute``). Where these do not fit, no variant of the base does: its
    other VPPs would each have been priced to no avail (the 405B levers sweep on 16,384 GPUs:
    13,300 of its 14,500 second-round variants). ``tests/test_space.py`` checks the rule per
    base against every variant priced."""
    base = variants.base[todo]
    open_ = np.isinf(best[base])
    if not open_.any():
        return todo
    checked = np.flatnonzero(np.bincount(base[open_], minlength=len(best)))
    # every VPP of an open base is among the variants
    least = _least_memory_variants(variants.bases, variants.base, variants.vpp, checked, variants.selective,
                                   variants.uniform)
    fits = np.zeros(len(best), dtype=bool)
    np.logical_or.at(fits, least.base, _may_fit_at_all(search, least, space, limit))
    unfit = np.zeros(len(best), dtype=bool)
    unfit[checked[~fits[checked]]] = True
    if not unfit.any():
        return todo
    drop = unfit[base]
    dropped = variants.take(todo[drop])
    low, high = _recompute_range(dropped.pp, dropped.vpp, search.spec.num_layers, space, dropped.selective)
    # what _least_recompute prices where nothing fits: block, N low and high; uniform, every N
    for n in _least_memory_recompute(low, high, variants.uniform):
        search.priced.add(dropped, n)
    return todo[~drop]


def _least_memory_variants(bases: Bases, base: np.ndarray, vpp: np.ndarray, which: np.ndarray, selective: bool,
                           uniform: bool) -> Variants:
    """Among the (base, VPP) pairs ``base``, ``vpp``, those of the bases ``which`` among which
    each base's least memory lies, with no recomputation yet (``_least_memory_recompute`` gives
    their N): its smallest VPP (``may_fit``), or every VPP with the uniform method. A uniform
    unit rebuilds at most its chunk's layers at once, so smaller chunks can need less: of
    llama3.2-3b's [26, 2] split at TP 8, CP 2, PP 2, 2 microbatches, N = 2, the last rank's 2
    layers rebuild together at VPP 1, one at a time at VPP 2 (one kept layer less for two
    checkpoints more), 12.95 GiB at VPP 2 against 13.03 GiB, VPP 1's least at any N and split
    (``tests/test_space.py`` found it)."""
    pick = np.flatnonzero(np.isin(base, which))
    if not uniform:
        first = np.full(len(bases), np.iinfo(np.int64).max)
        np.minimum.at(first, base[pick], vpp[pick])
        pick = pick[vpp[pick] == first[base[pick]]]
        pick = pick[np.unique(base[pick], return_index=True)[1]]  # one row per base
    return Variants(base[pick], bases, vpp[pick], np.zeros(len(pick), np.int64), selective, uniform)


def _may_fit_at_all(search: _Search, variants: Variants, space: SpaceOptions, limit: float) -> np.ndarray:
    """Per variant, whether it fits within ``limit`` at some N of ``_least_memory_recompute``."""
    low, high = _recompute_range(variants.pp, variants.vpp, search.spec.num_layers, space, variants.selective)
    ok, last = np.zeros(len(variants), dtype=bool), np.full(len(variants), -1)
    for n in _least_memory_recompute(low, high, variants.uniform):
        rest = np.flatnonzero(~ok & (n != last))  # an N clipped to its range is not priced again
        if rest.size:
            ok[rest] = _fits(search.memory(), variants.take(rest).with_recompute(n[rest]), limit)
        last = n
    return ok


def _least_memory_recompute(low: np.ndarray, high: np.ndarray, uniform: bool) -> list[np.ndarray]:
    """Per variant, the N of its range [low, high] among which its least memory lies: the two
    ends with the block method (its memory never grows with N >= 1, N = 0 apart); every N with
    the uniform method, whose memory is not monotone in N (fewer checkpoints, L / N, but a
    larger group rebuilt at once, N layers; tests/test_space.py found a layout fitting at N = 2
    and at no other N of 1..27)."""
    if uniform:
        return [np.clip(n, low, high) for n in range(int(low.min(initial=0)), int(high.max(initial=0)) + 1)]
    return [low, high] if (high != low).any() else [low]


AHEAD = 128
"""(Variant, N) planned together at most when few variants are left to step N: their N, N + 1,
... at once (a round's numpy calls cost the same for 2 rows as for 100), the stopping rule then
applied N by N as if planned one at a time."""


def _fastest_recompute(search: _Search, variants: Variants, least, high, limit):
    """Per variant, from its least N upwards, MadPipe's split within ``limit`` and its step.

    More recomputation can only lengthen every rank's time, and (block method) only lower its
    memory, so the smallest period any N' > N can reach is at least that of the fastest split
    with N's times and the memory of the highest N (uniform: with the memory limit ignored);
    once that is no better than the best period found, no larger N can shorten the period, nor
    the step (which grows with the period and with the sum of the ranks' times, and that sum
    grows with N), and the search stops. The step time picks among the N planned. Where few
    variants are left, the next N of each are planned together (``AHEAD``); what lies beyond a
    variant's stop is dropped unseen. Returns (step, N, counts); each N it stepped through is
    counted as priced."""
    count = len(variants)
    best, best_period = np.full(count, np.inf), np.full(count, np.inf)
    best_n = np.full(count, -1)
    best_counts = np.zeros((count, int(variants.pp.max()) if count else 1), dtype=np.int64)
    n = least.copy()
    open_ = least >= 0
    ceiling = None  # the memory caps at the highest N, made once (the bound below asks every round)
    if not (variants.uniform or search.even or math.isinf(limit)) and open_.any():
        ceiling = np.zeros_like(best_counts)
        at = np.flatnonzero(open_)
        caps = search.memory().pricer(variants.take(at).with_recompute(high[at])).memory_caps(limit)
        ceiling[at, :caps.shape[1]] = caps
    while open_.any():
        index = np.flatnonzero(open_)
        ahead = max(1, min(AHEAD // len(index), int((high[index] - n[index]).max()) + 1))
        which = np.repeat(index, ahead)  # each open variant at N, N + 1, ... (within its range)
        at_n = n[which] + np.tile(np.arange(ahead), len(index))
        keep = at_n <= high[which]
        which, at_n = which[keep], at_n[keep]
        step, counts, period, free = _plan_at(search, variants, which, at_n, limit, ceiling, high)
        for _ in range(ahead):  # the stopping rule, N by N: the rows at each open variant's N
            row = np.flatnonzero(open_[which] & (at_n == n[which]))
            if not row.size:
                break
            mine = which[row]
            search.priced.add(variants.take(mine), n[mine])
            better = step[row] < best[mine]
            best[mine[better]] = step[row[better]]
            best_n[mine[better]] = n[mine[better]]
            best_counts[mine[better], :counts.shape[1]] = counts[row[better]]
            best_period[mine] = np.minimum(best_period[mine], period[row])
            n[mine] += 1
            open_[mine] = (n[mine] <= high[mine]) & (free[row] < best_period[mine])
    return best, best_n, best_counts


def _plan_at(search: _Search, variants: Variants, which: np.ndarray, n: np.ndarray, limit: float, ceiling, high):
    """Variants ``which`` at N ``n``: their steps with MadPipe's split within ``limit`` (inf where
    none fits), the splits, their periods, and the shortest period any larger N could reach
    (``_fastest_recompute``)."""
    pricer = search.pricer(variants.take(which).with_recompute(n))
    split = pricer.fastest(limit)
    step = np.full(len(which), np.inf)
    if split.feasible.any():
        ok = np.flatnonzero(split.feasible)
        step[ok] = pricer.step_time(split.counts, ok)
    if variants.uniform:
        free = pricer.fastest(np.inf).value  # no N' > N has a shorter period than this
    elif ceiling is not None:
        free = pricer.fastest_capped(ceiling[which]).value
    else:
        free = pricer.fastest(limit, memory=search.memory().pricer(
            variants.take(which).with_recompute(high[which]))).value
    return step, split.counts, split.value, free


def _rows(search: _Search, bases: Bases, picks: _Picks, families: list) -> Chosen:
    """Memory terms of every chosen (variant, split), priced together per recomputation family."""
    width = picks.counts.shape[1]
    terms = {name: np.zeros((len(bases), width)) for name in StageTerms.__dataclass_fields__}
    for family in range(len(families)):
        members = np.flatnonzero(picks.family == family)
        if not members.size:
            continue
        pricer = replace(search, timing=None, times={}, calibrated=None, reusable={}).pricer(
            picks.variants(members, bases, families))
        part = pricer.terms(picks.counts[members][:, :pricer.width])
        for name, values in terms.items():
            values[members, :pricer.width] = getattr(part, name)
    steps = None
    if search.timing is not None:  # every row's iteration with its parts, the oom rows' too
        from advisor.throughput import StepTime

        parts: dict[str, np.ndarray] = {}
        for family in range(len(families)):
            members = np.flatnonzero(picks.family == family)
            if members.size:
                pricer = search.pricer(picks.variants(members, bases, families))
                for name, value in pricer.steps(picks.counts[members][:, :pricer.width]).items():
                    parts.setdefault(name, np.full(len(bases), np.nan))[members] = value
        # no base at all (33 GPUs: no launchable layout) leaves no parts: empty arrays, not a TypeError
        steps = StepTime(**{name: parts.get(name, np.zeros(0)) for name in StepTime.__dataclass_fields__})
    n = picks.recompute_layers
    selective = np.array([families[f][0] for f in picks.family], dtype=bool)
    uniform = np.array([families[f][1] for f in picks.family], dtype=bool)
    return Chosen(
        vpp=picks.vpp, recompute=np.where(selective, "selective", np.where(n > 0, "full", "none")),
        recompute_method=np.where(n > 0, np.where(uniform, "uniform", "block"), ""), recompute_layers=n,
        counts=picks.counts, terms=StageTerms(**terms), step_time=picks.step_time, steps=steps)
