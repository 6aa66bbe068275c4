"""The space's variants (``advisor.space``) priced thousands at once, for ``advisor.space_search``.

``_Pricer`` builds, per pipeline depth, one vectorised stage model (``stage_model.StageModel``, with
``advisor.verdicts``' calibrated terms where asked) and the time model's rank times, and plans
splits on them (``advisor.splits``: the lowest peak, MadPipe's fastest within a memory limit,
Megatron's even split); ``_states_lower_bound`` is the model states' floor that no split,
interleaving or recomputation goes below; ``_Priced`` counts the distinct variants a search priced.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from advisor import equations as eq
from advisor.memory import MemoryOptions
from advisor.stage_model import StageModel, StageTerms, head_shares_embedding
from advisor.memory_levers import state_bytes_per_parameter
from advisor.models import LlamaSpec
from advisor.parallel import Workload
from advisor.space import Bases, SpaceOptions, Variants, _recompute_range
from advisor.splits import Pipelines, Split, fastest_within, lowest_memory, memory_caps, min_max
from advisor.verdicts import calibrated_terms

if TYPE_CHECKING:
    from advisor.rank_times import LayoutTimes


class _Pricer:
    """Stage models and planners over a set of variants, one group per pipeline depth (arrays are
    as wide as their deepest pipeline; grouping keeps shallow ones from paying for deep ones)."""

    def __init__(self, spec: LlamaSpec, workload: Workload, options: MemoryOptions, variants: Variants,
                 times: LayoutTimes | None = None, even: bool = False, calibrated=None) -> None:
        self.variants, self.layers, self.even = variants, spec.num_layers, even
        self.width = int(variants.pp.max()) if len(variants) else 1
        self.groups = []
        col = (slice(None), None)
        for depth in sorted(set(variants.pp.tolist())):  # np.unique imports numpy.ma (10 ms)
            index = np.flatnonzero(variants.pp == depth)
            part = variants.take(index)
            layout = dict(tp=part.tp[col], cp=part.cp[col], dp=part.dp[col], mbs=part.mbs[col], pp=depth,
                          vpp=part.vpp[col], stage=np.arange(depth)[None, :], recompute_layers=part.recompute_layers[col])
            if calibrated is not None:  # (MemoryCalibration, GPU memory, profiled ratios): the calibrated usage
                layout["calibrated"] = calibrated_terms(
                    spec, workload.seq_len, layout["mbs"], layout["tp"], layout["cp"], layout["stage"], depth,
                    layout["recompute_layers"] > 0, part.options(options), *calibrated)
            model = StageModel(spec, workload.seq_len, part.options(options), num_microbatches=part.microbatches[col],
                               **layout)
            ranks = None if times is None else times.ranks(part.base, part.vpp, part.recomputed(spec.num_layers), depth)
            self.groups.append((index, model, ranks, Pipelines(pp=part.pp, vpp=part.vpp, layers=spec.num_layers)))
        self.times = times

    def take(self, rows: np.ndarray, variants: Variants, times: LayoutTimes | None) -> _Pricer:
        """The pricer of ``variants``, which are this one's variants ``rows`` (in any order, any
        of them more than once) with their own N, the same recomputing or not as here where
        calibrated: its stage models taken from these (``StageModel.take``) instead of built,
        the rank times ``times``'."""
        new = object.__new__(_Pricer)
        new.variants, new.layers, new.even, new.times = variants, self.layers, self.even, times
        new.width = int(variants.pp.max()) if len(variants) else 1
        new.groups = []
        group, local = np.empty(len(self.variants), np.int64), np.empty(len(self.variants), np.int64)
        for number, (index, *_) in enumerate(self.groups):
            group[index], local[index] = number, np.arange(len(index))
        for number, (index, model, _, _) in enumerate(self.groups):
            mine = np.flatnonzero(group[rows] == number)
            if not mine.size:
                continue
            at = local[rows[mine]]
            part = variants.take(mine)
            depth = model.in_flight.passes.shape[1]
            ranks = None if times is None else times.ranks(part.base, part.vpp, part.recomputed(self.layers), depth)
            new.groups.append((mine, model.take(at, len(index), part.recompute_layers[:, None]), ranks,
                               Pipelines(pp=part.pp, vpp=part.vpp, layers=self.layers)))
        return new

    def _each(self, plan, memory: _Pricer | None = None) -> Split:
        """``plan(memory model, times, pipelines)`` per group; the memory models of ``memory``
        (a pricer of the same bases and VPP) where given."""
        counts = np.zeros((len(self.variants), self.width), dtype=np.int64)
        value, feasible = np.full(len(self.variants), np.inf), np.zeros(len(self.variants), dtype=bool)
        models = [group[1] for group in (memory or self).groups]
        for (index, _, times, pipelines), model in zip(self.groups, models):
            split = plan(model, times, pipelines, index)
            counts[index, :split.counts.shape[1]] = split.counts
            value[index], feasible[index] = split.value, split.feasible
        return Split(counts=counts, value=value, feasible=feasible)

    def _even(self, cost, pipelines: Pipelines, limit=np.inf) -> Split:
        """Megatron's default split (every rank L/PP layers) priced by ``cost``; feasible where
        its memory is within ``limit``."""
        counts = np.where(pipelines.active, (self.layers // pipelines.pp)[:, None], 0)
        value = np.where(pipelines.active, cost(counts), -np.inf).max(axis=1)
        return Split(counts=counts, value=value, feasible=np.isfinite(value))

    def fits(self, limit: float) -> np.ndarray:
        ok = np.zeros(len(self.variants), dtype=bool)
        for index, model, _, pipelines in self.groups:
            if self.even:
                ok[index] = self._even(model.total, pipelines).value <= limit
                continue
            cap = memory_caps(model.total, pipelines, limit, model.most_layers)
            ok[index] = pipelines.possible & (cap >= pipelines.lowest).all(axis=1) & (cap.sum(axis=1) >= self.layers)
        return ok

    def floor_within(self, limit: float) -> np.ndarray:
        """Per variant, whether every rank holding its fewest layers is within ``limit``: what
        ``fits`` needs first (caps at least the fewest), at one total per rank."""
        ok = np.zeros(len(self.variants), dtype=bool)
        for index, model, _, pipelines in self.groups:
            least = model.total(np.where(pipelines.active, pipelines.lowest, 1))
            ok[index] = pipelines.possible & ((least <= limit) | ~pipelines.active).all(axis=1)
        return ok

    def lowest(self) -> Split:
        if self.even:
            return self._each(lambda model, times, pipelines, _: self._even(model.total, pipelines))
        return self._each(lambda model, times, pipelines, _: lowest_memory(model.total, pipelines, model.most_layers))

    def fastest(self, limit: float, memory: _Pricer | None = None) -> Split:
        """MadPipe's split within ``limit`` bytes per GPU (inf: memory ignored); the memory of
        ``memory``'s variants (the same bases and VPP) where given."""
        def plan(model, times, pipelines, _):
            if self.even:
                split = self._even(times, pipelines)
                fits = self._even(model.total, pipelines).value <= limit
                return replace(split, feasible=split.feasible & fits)
            if math.isinf(limit):
                return min_max(times, pipelines, inverse=times.inverse)
            return fastest_within(times, model.total, pipelines, limit, time_inverse=times.inverse,
                                  memory_inverse=model.most_layers)
        return self._each(plan, memory)

    def memory_caps(self, limit: float) -> np.ndarray:
        """(K, width): the most layers each rank of each variant can hold within ``limit`` (the
        planner's split; beyond a variant's PP, 0)."""
        cap = np.zeros((len(self.variants), self.width), dtype=np.int64)
        for index, model, _, pipelines in self.groups:
            cap[index, :pipelines.width] = memory_caps(model.total, pipelines, limit, model.most_layers)
        return cap

    def fastest_capped(self, cap: np.ndarray) -> Split:
        """MadPipe's split with each rank at most ``cap`` layers (``memory_caps`` of a pricer of
        the same variants, rows aligned): ``fastest(limit, memory=that pricer)``, its caps made once."""
        return self._each(lambda model, times, pipelines, index: min_max(
            times, pipelines, cap[index, :pipelines.width], inverse=times.inverse))

    def steps(self, counts: np.ndarray, which: np.ndarray | None = None,
              lower_bound: bool = False) -> dict[str, np.ndarray]:
        """The time model's iteration of the variants ``which`` (default all) with ``counts``
        layers per rank: each ``StepTime`` part as an array over the variants. ``lower_bound``:
        the DP collectives and Adam priced as no split can beat them (a rank's mean parameters,
        not its largest; the DP overlap hidden behind a first rank with the most layers it can
        hold, the others one per chunk), so that with the period-optimal split, whose pipeline
        part no split beats, the step is a lower bound on every split's."""
        which = np.arange(len(self.variants)) if which is None else which
        parts: dict[str, np.ndarray] = {}
        for index, model, _, _ in self.groups:
            at = np.flatnonzero(np.isin(index, which))
            if not at.size:
                continue
            rows = index[at]
            part, variants = counts[rows, :model.in_flight.passes.shape[1]], self.variants.take(rows)
            # the largest rank's parameters on one GPU: what the DP collectives and Adam move
            parameters = part * model.layer_parameters[at] + model.end_parameters[at]
            hiding = None
            if lower_bound:
                depth = part.shape[1]
                hiding = np.broadcast_to(variants.vpp[:, None], part.shape).copy()
                hiding[:, 0] = self.layers - (depth - 1) * variants.vpp
            step = self.times.step(variants.base, variants.vpp, variants.recomputed(self.layers), part,
                                   parameters.mean(axis=1) if lower_bound else parameters.max(axis=1), hiding)
            for name, value in step.parts().items():
                parts.setdefault(name, np.full(len(self.variants), np.nan))[rows] = value
        return {name: value[which] for name, value in parts.items()}

    def step_time(self, counts: np.ndarray, which: np.ndarray | None = None) -> np.ndarray:
        """Seconds per iteration of the variants ``which`` (default all) with ``counts`` layers
        per rank (the time model)."""
        return self.steps(counts, which)["total_s"]

    def terms(self, counts: np.ndarray) -> StageTerms:
        """(K, width) memory terms of each variant's ranks holding ``counts`` layers."""
        out = {name: np.zeros((len(self.variants), self.width)) for name in StageTerms.__dataclass_fields__}
        for index, model, _, _ in self.groups:
            depth = model.in_flight.passes.shape[1]
            part = model.terms(counts[index, :depth])
            for name, values in out.items():
                values[index, :depth] = np.broadcast_to(getattr(part, name), (len(index), depth))
        return StageTerms(**out)


def _states_lower_bound(spec: LlamaSpec, bases: Bases, options: MemoryOptions) -> np.ndarray:
    """Bytes per GPU of the model states of the whole model spread evenly over the PP ranks: no
    split, interleaving or recomputation brings the peak rank below it."""
    t = bases.tp
    vocab = eq.padded_vocab_size(spec.vocab_size, options.vocab_divisible_by, t)
    embedding = eq.embedding_parameters(spec, t, vocab)
    head = np.where(head_shares_embedding(spec, bases.pp), 0, embedding)
    parameters = spec.num_layers * eq.layer_parameters(spec, t) + embedding + head + eq.final_norm_parameters(spec)
    weights, gradients, optimizer = state_bytes_per_parameter(options, bases.dp * bases.cp)
    return parameters * (weights + gradients + optimizer) / bases.pp


class _Priced:
    """The distinct variants (recomputation family, base, VPP, N) a search priced: what it did
    not prune. The planners price some of them more than once (the second memory limit plans
    again what the first left open; the uniform method tries every N), so a count of pricings
    can exceed the space: 3,862 layouts considered and "-1,351 pruned" on 64 GPUs with
    ``--recompute-method uniform``."""

    def __init__(self) -> None:
        self._keys: list[np.ndarray] = []
        self._bases: Bases | None = None

    def add(self, variants: Variants, n=None) -> None:
        """``variants``, each at its own N or at ``n``."""
        if not len(variants):
            return
        self._bases = variants.bases
        n = variants.recompute_layers if n is None else n
        family = 2 * variants.selective + variants.uniform
        self._keys.append(np.stack(np.broadcast_arrays(np.int64(family), variants.base, variants.vpp,
                                                       np.asarray(n, dtype=np.int64))))

    def count(self, layers: int, space: SpaceOptions) -> int:
        """How many distinct variants were priced among those ``considered`` counts: per family,
        N within its range (a bound priced at N = 0 without recomputation lies outside a family
        that always recomputes)."""
        if not self._keys:
            return 0
        keys = np.concatenate(self._keys, axis=1)
        keys = keys[:, np.unique(np.ravel_multi_index(tuple(keys), tuple(keys.max(axis=1) + 1)),
                                 return_index=True)[1]]
        family, base, vpp, n = keys
        inside = np.zeros(len(base), dtype=bool)
        for code in sorted(set(family.tolist())):  # np.unique would import numpy.ma (10 ms)
            at = np.flatnonzero(family == code)
            low, high = _recompute_range(self._bases.pp[base[at]], vpp[at], layers, space, bool(code >= 2))
            inside[at] = (n[at] >= low) & (n[at] <= high)
        return int(inside.sum())
