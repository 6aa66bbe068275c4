"""The sweep's working set, bounded: ``advisor.space_search.search`` plans its bases in chunks.

The planner's arrays are (variants, deepest pipeline) wide: 1,048,576 GPUs of a 4,096-layer model
gave 374,679 (base, VPP) variants next to PP 4,096 ranks, one (374679, 4096) int64 array of
11.4 GiB. Chunks of bases sorted by PP keep each chunk's arrays near their own depth and under
``ELEMENTS`` cells; the result is the same as one search (each base is planned on its own), put
back in the bases' order.
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np

ELEMENTS = 1 << 21
"""Cells of one (variants, ranks) array of a chunk: 16 MiB of int64 or float64 each."""


def chunks(pp: np.ndarray, group_base: np.ndarray, timed: bool) -> list[np.ndarray]:
    """Index arrays of the bases, shallow pipelines first, each chunk's variants x its deepest
    pipeline at most ``ELEMENTS`` (a single base beyond it is a chunk alone). Without a time model
    only VPP 1 is planned, one variant per base."""
    variants = np.bincount(group_base, minlength=len(pp)) if timed else np.ones(len(pp), dtype=np.int64)
    variants = np.maximum(variants, 1)
    order = np.argsort(pp, kind="stable")
    out, start, count = [], 0, 0
    for position, base in enumerate(order.tolist()):
        count += int(variants[base])
        if position > start and count * int(pp[base]) > ELEMENTS:
            out.append(np.sort(order[start:position]))
            start, count = position, int(variants[base])
    if start < len(order) or not out:
        out.append(np.sort(order[start:]))
    return out


def order(parts: list) -> np.ndarray:
    """The positions that put the chunks' rows, concatenated, back in the bases' order."""
    return np.argsort(np.concatenate([where for _, where in parts]), kind="stable")


def merge(parts: list):
    """One ``SpaceResult`` from the chunks' (result, indices of its bases) ``parts``, in the
    bases' order, every array as wide as the deepest pipeline. The merged values have the
    parts' own types (this module serves ``advisor.space_search`` and does not import it)."""
    from advisor.stage_model import StageTerms

    if len(parts) == 1:
        return parts[0][0]
    results = [result for result, _ in parts]
    back = order(parts)
    width = max(result.chosen.counts.shape[1] for result in results)

    def rows(arrays):  # concatenated along the bases, wider ones padded with zeros, in base order
        if arrays[0].ndim == 2:
            arrays = [np.pad(a, ((0, 0), (0, width - a.shape[1]))) for a in arrays]
        return np.concatenate(arrays)[back]

    chosen = [result.chosen for result in results]
    terms = StageTerms(**{f.name: rows([getattr(c.terms, f.name) for c in chosen]) for f in fields(StageTerms)})
    steps = None
    if chosen[0].steps is not None:
        steps = type(chosen[0].steps)(**{f.name: rows([np.asarray(getattr(c.steps, f.name)) for c in chosen])
                                         for f in fields(chosen[0].steps)})
    Bases, Chosen, SpaceResult = type(results[0].bases), type(chosen[0]), type(results[0])
    merged = Chosen(**{name: rows([getattr(c, name) for c in chosen])
                       for name in ("vpp", "recompute", "recompute_method", "recompute_layers", "counts", "step_time")},
                    terms=terms, steps=steps)
    return SpaceResult(bases=Bases(*(rows([getattr(r.bases, f.name) for r in results]) for f in fields(Bases))),
                       chosen=merged, considered=sum(r.considered for r in results),
                       evaluated=sum(r.evaluated for r in results))
