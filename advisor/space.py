"""The launchable search space: every layout stock Megatron-LM can run on a GPU count.

A *layout* is (TP, CP, PP, DP, MBS) with, per pipeline rank, its decoder layers, the model
chunks per rank (VPP) and the recomputation:

- TP a power of 2 up to a node, dividing the attention and KV heads; CP a power of 2 with the
  sequence divisible by 2 CP (and, with sequence parallelism, by TP per CP rank); any PP from 1
  to L that leaves DP = GPUs / (TP CP PP) whole; MBS a power of 2 with the global batch
  divisible by MBS x DP (``launchable``);
- any split of the L layers over the PP ranks (Megatron's ``--pipeline-model-parallel-layout``
  builds any), at least one layer per model chunk; ``split="even"`` keeps Megatron's default
  split only (PP dividing L, no split flag: the paper's space);
- VPP: 1, or 2 .. L/PP model chunks per rank where Megatron's interleaved schedule runs (PP > 1,
  the microbatches a multiple of PP);
- recomputation: none; full with the block method and N = 1, 2, ... layers per chunk
  (``--recompute-method block --recompute-num-layers N``: N recomputed layers, each
  checkpointed alone, the fewest extra forward passes for a given saving, as MAP's checkpoint
  solver chooses what to recompute, seed 003 Section 5.2, within what Megatron can express);
  selective (core attention) where it saves memory, i.e. without FlashAttention.

This module says what the space holds: ``SpaceOptions`` (which parts of it to search),
``launchable`` (its (TP, CP, PP, DP, MBS) bases), ``_groups`` (their VPPs), ``_families`` and
``_recompute_range`` (their recomputation), ``Variants`` (sets of them). ``advisor.space_pricer``
prices variants; ``advisor.space_search`` picks each base's row (``search``) and prunes what cannot
win.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from advisor.memory import MemoryOptions, tp_problem
from advisor.models import LlamaSpec
from advisor.parallel import Pinned, Workload, sequence_splits

RecomputeChoice = Literal["auto", "none", "selective", "full"]
SplitChoice = Literal["auto", "even"]


@dataclass(frozen=True, kw_only=True, slots=True)
class SpaceOptions:
    """Which parts of the space to search; the defaults search all of it."""

    split: SplitChoice = "auto"
    """'auto': any split (the planner's); 'even': Megatron's default split only (PP divides L)."""
    vpp: int | None = None
    """None: searched (needs a time model to win anything); a number pins it."""
    recompute: RecomputeChoice = "auto"
    """'auto': none, or what is needed to fit (or, with a time model, what is faster)."""
    recompute_method: Literal["uniform", "block"] | None = None
    """Pins --recompute-method with ``recompute='full'``; None: block, N searched."""
    recompute_num_layers: int | None = None
    """Pins --recompute-num-layers with ``recompute='full'``; None: searched."""
    sharding: Literal["auto", "fixed"] = "fixed"
    """'auto': when no layout fits with the options given, ``advisor.sweep`` (and for an MoE model
    ``advisor.cli.moe.sweep``) tries Megatron-FSDP and optimizer CPU offload (``advisor.escalation``);
    'fixed': the options given only."""
    overlap_param_gather_given: bool = False
    """The user chose --overlap-param-gather or --no-overlap-param-gather: a rung of the ladder
    keeps that choice; else it takes the default the same lever given by hand would
    (``DataParallel.overlap_param_gather_for``: on where the rung turns the distributed optimizer on)."""
    chunk_multiple: int = 1
    """With ``split='even'``: only layouts whose model chunks hold a multiple of this many layers
    (the pinned uniform N on a release that fails on others: ``advisor.sweep._chunk_multiple``)."""
    pinned: Pinned = Pinned()
    """TP, CP, PP or MBS fixed by the user; the rest searched."""


PAPER_SPACE = SpaceOptions(split="even", vpp=1, recompute="none")
"""Seed 004's space: Megatron's even split (PP divides L), no interleaving, no recomputation."""


@dataclass(frozen=True, slots=True)
class Bases:
    """(TP, CP, PP, DP, MBS) layouts as arrays, with their microbatches per iteration (inf when
    the global batch is unknown)."""

    tp: np.ndarray
    cp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    mbs: np.ndarray
    microbatches: np.ndarray

    def __len__(self) -> int:
        return len(self.tp)

    def take(self, index) -> Bases:
        return Bases(*(getattr(self, name)[index] for name in self.__dataclass_fields__))


def _powers_of_two(limit: int) -> list[int]:
    return [1 << k for k in range(max(limit, 0).bit_length())]


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def launchable(spec: LlamaSpec, workload: Workload, gpus: int, max_tp: int, options: MemoryOptions,
               split: SplitChoice = "auto", chunk_multiple: int = 1, pinned: Pinned = Pinned()) -> Bases:
    """Every (TP, CP, PP, DP, MBS) Megatron-LM can run on ``gpus`` GPUs (see the module docstring);
    with the even split, its stages' layers a multiple of ``chunk_multiple`` (``SpaceOptions``);
    the ``pinned`` degrees only."""
    s, gbs, layers = workload.seq_len, workload.global_batch_size, spec.num_layers
    max_mbs = gbs or s  # without a global batch, any MBS is allowed
    rows = []
    for t in pinned.values("tp", _powers_of_two(min(max_tp, gpus))):
        if gpus % t or tp_problem(spec, t):
            continue
        for c in pinned.values("cp", _powers_of_two(gpus // t)):
            if gpus % (t * c) or not sequence_splits(s, c, t) or (c > 1 and not options.flash_attention):
                continue
            for p in pinned.values("pp", _divisors(gpus // (t * c))):
                if gpus % (t * c * p) or p > layers or (
                        split == "even" and (layers % p or (layers // p) % chunk_multiple)):
                    continue
                d = gpus // (t * c * p)
                for b in pinned.values("mbs", _powers_of_two(max_mbs // d)):
                    if gbs is None or gbs % (b * d) == 0:
                        rows.append((t, c, p, d, b, gbs // (b * d) if gbs else math.inf))
    if not rows:
        return Bases(*(np.zeros(0) for _ in range(6)))
    table = np.array(rows, dtype=float)
    return Bases(*(table[:, k] if k == 5 else table[:, k].astype(np.int64) for k in range(6)))


@dataclass(frozen=True, slots=True)
class Variants:
    """Layouts with their interleaving and recomputation: ``base`` indexes ``bases``. One
    recomputation family per set: selective, or full with the block (or pinned uniform) method
    and N layers per chunk (N = 0: none)."""

    base: np.ndarray
    bases: Bases
    vpp: np.ndarray
    recompute_layers: np.ndarray
    selective: bool = False
    uniform: bool = False

    def __len__(self) -> int:
        return len(self.base)

    def __getattr__(self, name):  # tp, cp, pp, dp, mbs, microbatches of each variant's base
        if name in Bases.__dataclass_fields__:
            return getattr(self.bases, name)[self.base]
        raise AttributeError(name)

    # The constructor, not dataclasses.replace: the planners take thousands of sets (replace
    # costs five times as much, looking up every field by name).
    def take(self, index) -> Variants:
        return Variants(self.base[index], self.bases, self.vpp[index], self.recompute_layers[index], self.selective,
                        self.uniform)

    def with_recompute(self, layers) -> Variants:
        return Variants(self.base, self.bases, self.vpp,
                        np.broadcast_to(np.asarray(layers, dtype=np.int64), self.base.shape), self.selective,
                        self.uniform)

    def recomputed(self, model_layers: int) -> np.ndarray:
        """Layers per chunk that full recomputation re-runs (the time model's count)."""
        from advisor.rank_times import recomputed_per_chunk

        return recomputed_per_chunk("full", "uniform" if self.uniform else "block", self.recompute_layers,
                                    model_layers) * (self.recompute_layers > 0)

    def options(self, options: MemoryOptions) -> MemoryOptions:
        """The estimator's options of this set (recompute_layers go per variant)."""
        return _family_options(options, self.selective, self.uniform)


@functools.lru_cache(maxsize=64)
def _family_options(options: MemoryOptions, selective: bool, uniform: bool) -> MemoryOptions:
    """``Variants.options``, made once per search: every pricer of a family asks for the same."""
    if selective:
        return replace(options, recompute="selective")
    return replace(options, recompute="none", recompute_method="uniform" if uniform else "block")


def _groups(spec: LlamaSpec, bases: Bases, space: SpaceOptions) -> tuple[np.ndarray, np.ndarray]:
    """Every (base, VPP) Megatron runs: 1, or 2 .. L/PP chunks per rank where the interleaved
    schedule runs (PP > 1, the microbatches a multiple of PP); with the even split, its chunks
    whole and a multiple of ``space.chunk_multiple`` (``Recomputation.chunk_problem``'s test)."""
    layers, p, m = spec.num_layers, bases.pp, bases.microbatches
    with np.errstate(invalid="ignore"):  # inf microbatches: no cap
        interleavable = (p > 1) & (np.isinf(m) | ((m >= p) & (np.fmod(m, p) == 0)))
    top = np.where(interleavable, layers // np.maximum(p, 1), 1).astype(np.int64)
    if space.vpp is not None:
        base, vpp = np.flatnonzero(space.vpp <= top), np.full(int((space.vpp <= top).sum()), space.vpp)
    else:  # 1 .. top for each base, in base order (412,000 of them at 1,048,576 GPUs)
        base = np.repeat(np.arange(len(top)), top)
        vpp = np.arange(len(base)) - np.repeat(np.cumsum(top) - top, top) + 1
    if space.split != "auto":
        chunks = p[base] * vpp
        keep = (layers % chunks == 0) & ((layers // chunks) % space.chunk_multiple == 0)
        base, vpp = base[keep], vpp[keep]
    return base.astype(np.int64), vpp.astype(np.int64)


def _families(space: SpaceOptions, options: MemoryOptions) -> list[tuple[bool, bool]]:
    """The recomputation families searched, as (selective, uniform): full (block, or the pinned
    uniform method) with N = 0 meaning none; selective where asked, or, with ``auto``, where it
    saves memory (without FlashAttention: the s^2 scores; with --recompute-modules naming more than
    core_attn: what they free, ``equations.recomputed_module_bytes``)."""
    if space.recompute == "selective":
        return [(True, False)]
    families = [(False, space.recompute == "full" and space.recompute_method == "uniform")]
    if space.recompute == "auto" and (not options.flash_attention or options.recompute_modules - {"core_attn"}):
        families.append((True, False))
    return families


def _recompute_range(pp: np.ndarray, vpp: np.ndarray, layers: int, space: SpaceOptions, selective: bool):
    """(lowest, highest) N per (base, VPP): 0 (none) .. the largest chunk any split can have (more
    recomputes nothing more); one value where recomputation is off or pinned."""
    largest_chunk = -(-(layers - (pp - 1) * vpp) // vpp)
    if selective or space.recompute == "none":
        return np.zeros_like(pp), np.zeros_like(pp)
    if space.recompute == "full" and space.recompute_num_layers is not None:
        pinned = np.full_like(pp, space.recompute_num_layers)
        return pinned, pinned
    return np.full_like(pp, 1 if space.recompute == "full" else 0), largest_chunk
