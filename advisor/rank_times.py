"""A pipeline rank's time per microbatch, as the split planners need it, from the one time model
(``advisor.throughput.TimeModel``, issue 16): no time term lives here.

``TimeModel.stage`` prices a rank from its layer count, its ends (the embedding on the first
rank, the LM head and loss on the last) and its recomputed layers, and is affine in both counts.
So, per (layout, rank), a rank holding n layers, N of them recomputed per model chunk (at most
v N per rank), takes

    U(n) = alpha n + rho min(n, v N) + beta_i

with alpha one layer's forward and backward, rho one layer's extra forward when recomputed, and
beta_i what rank i carries besides layers (its ends, the boundary sends, the per-microbatch
overhead). The planners minimise the slowest rank's U, the period; ``step`` prices a whole split
with ``TimeModel.step_from_stage_arrays``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from advisor.splits import per_rank
from advisor.throughput import StageTimes, StepTime, TimeModel


@dataclass(frozen=True, slots=True)
class RankTimes:
    """U(n) for (K, P) arrays of layer counts; every coefficient broadcasts to (K, P)."""

    alpha: np.ndarray
    rho: np.ndarray
    beta: np.ndarray
    recomputable: np.ndarray
    """v N: the most layers a rank recomputes."""

    def __call__(self, layers) -> np.ndarray:
        layers = np.asarray(layers, dtype=float)  # once, not per term
        return self.alpha * layers + self.rho * np.minimum(layers, self.recomputable) + self.beta

    def inverse(self, bound, low, high) -> np.ndarray:
        """The most layers in [low, high] with U(n) <= bound (low - 1 where none): two lines in n,
        then corrected by evaluating U beside the estimate, so rounding cannot move the answer."""
        free = bound - self.beta  # both lines' first difference, computed once (the same values)
        recomputing = np.floor(free / (self.alpha + self.rho))
        beyond = np.floor((free - self.rho * self.recomputable) / self.alpha)
        estimate = np.where(recomputing >= self.recomputable, np.maximum(beyond, self.recomputable), recomputing)
        estimate = np.minimum(np.maximum(estimate, low - 1), high).astype(np.int64)  # np.clip, without its wrapper
        for _ in range(3):
            up = (estimate < high) & (self(np.minimum(estimate + 1, high)) <= bound)
            down = (estimate >= low) & (self(np.maximum(estimate, low)) > bound)
            if not (up.any() or down.any()):
                break
            estimate = estimate + up - down
        return estimate


class LayoutTimes:
    """The time model's coefficients for layouts (TP, CP, DP, MBS, PP as (B,) arrays), computed
    once; ``ranks`` and ``step`` then serve any of them with any VPP, recomputation and split."""

    def __init__(self, model: TimeModel, *, tp, cp, dp, mbs, pp, selective: bool, gpus_per_node: int) -> None:
        self.model, self.kind = model, "selective" if selective else "full"
        self.tp, self.cp, self.dp, self.mbs, self.pp = (np.asarray(x) for x in (tp, cp, dp, mbs, pp))
        # As TimeModel.step: boundary sends cross nodes once the layout spans more than a node.
        self.cross = self.tp * self.cp * self.dp * self.pp > gpus_per_node
        plain = self._stage(0, False, False, 0).total
        self.alpha = self._stage(1, False, False, 0).total - plain
        self.rho = self._stage(0, False, False, 1).total - plain
        self.beta = {(first, last): self._stage(0, first, last, 0).total for first in (False, True) for last in (False, True)}

    def _stage(self, layers, embedding, head, recompute_layers, index=slice(None)) -> StageTimes:
        return self.model.stage(self.tp[index], self.cp[index], self.mbs[index], layers, embedding=embedding,
                                head=head, recompute=self.kind, recompute_layers=recompute_layers,
                                pipeline_cross_node=self.cross[index], pipeline_parallel=self.pp[index] > 1)

    def ranks(self, index: np.ndarray, vpp: np.ndarray, recompute_layers: np.ndarray, width: int) -> RankTimes:
        """U(n) of layouts ``index`` (K,) with their VPP and N, over ``width`` rank columns."""
        stage = np.arange(width)[None, :]
        pp = self.pp[index][:, None]
        first, last = stage == 0, stage == pp - 1
        beta = np.select([first & last, first, last], [self.beta[True, True][index][:, None],
                                                       self.beta[True, False][index][:, None],
                                                       self.beta[False, True][index][:, None]],
                         self.beta[False, False][index][:, None])
        recomputable = np.asarray(vpp) * np.asarray(recompute_layers, dtype=float)  # a float, as U's terms
        return RankTimes(alpha=per_rank(self.alpha[index][:, None], beta.shape),
                         rho=per_rank(self.rho[index][:, None], beta.shape), beta=beta,
                         recomputable=per_rank(recomputable[:, None], beta.shape))

    def stage_times(self, index: np.ndarray, vpp: np.ndarray, recompute_layers: np.ndarray,
                    counts: np.ndarray) -> list[StageTimes]:
        """Each rank's per-microbatch ``StageTimes`` of layouts ``index`` (one pipeline depth:
        ``counts`` is (K, PP)), in pipeline order."""
        parts = self._stage_arrays(index, vpp, recompute_layers, counts)
        return [StageTimes(**{f.name: getattr(parts, f.name)[:, i] for f in fields(StageTimes)})
                for i in range(counts.shape[1])]

    def _stage_arrays(self, index: np.ndarray, vpp: np.ndarray, recompute_layers: np.ndarray,
                      counts: np.ndarray) -> StageTimes:
        """``stage_times`` as one ``StageTimes`` of (K, PP) arrays, the ranks along the last axis."""
        ranks = counts.shape[1]
        stage = np.arange(ranks)[None, :]
        column = (slice(None), None)
        times = self.model.stage(
            self.tp[index][column], self.cp[index][column], self.mbs[index][column], counts, embedding=stage == 0,
            head=stage == ranks - 1, recompute=self.kind,
            recompute_layers=np.minimum(counts, (np.asarray(vpp) * np.asarray(recompute_layers))[column]),
            pipeline_cross_node=self.cross[index][column], pipeline_parallel=ranks > 1)
        return StageTimes(**{f.name: np.broadcast_to(getattr(times, f.name), counts.shape) for f in fields(StageTimes)})

    def step(self, index: np.ndarray, vpp: np.ndarray, recompute_layers: np.ndarray, counts: np.ndarray,
             parameters: np.ndarray, hiding_counts: np.ndarray | None = None) -> StepTime:
        """The iteration of layouts ``index`` (one pipeline depth: ``counts`` is (K, PP)) with
        ``parameters`` (K,) on one GPU of their largest rank, with its parts; ``hiding_counts``,
        where given, the split whose first rank the DP overlap hides behind instead."""
        stages = self._stage_arrays(index, vpp, recompute_layers, counts)
        hiding = None if hiding_counts is None else self._stage_arrays(index, vpp, recompute_layers, hiding_counts)
        return self.model.step_from_stage_arrays(stages, self.tp[index], self.cp[index], self.dp[index],
                                                 self.mbs[index], np.asarray(vpp), parameters=parameters, hiding=hiding)


def recomputed_per_chunk(recompute: str, method: str, layers_per_chunk, model_layers: int):
    """How many layers of a model chunk full recomputation re-runs: the block method's N, every
    layer with the uniform method (it checkpoints units of N layers but recomputes them all);
    none otherwise. Broadcasts over arrays of N."""
    if recompute != "full":
        return np.zeros_like(np.asarray(layers_per_chunk))
    return np.asarray(layers_per_chunk) if method == "block" else np.full_like(np.asarray(layers_per_chunk),
                                                                                  model_layers)


class Timing:
    """The time model of one run (model, GPU, sequence, global batch), for the planners."""

    def __init__(self, model: TimeModel, gpus_per_node: int) -> None:
        self.model, self.gpus_per_node = model, gpus_per_node

    def layouts(self, *, tp, cp, dp, mbs, pp, selective: bool) -> LayoutTimes:
        return LayoutTimes(self.model, tp=tp, cp=cp, dp=dp, mbs=mbs, pp=pp, selective=selective,
                           gpus_per_node=self.gpus_per_node)
