"""advisor.space: the launchable space, its pruning, and the closed forms it relies on."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from advisor.memory import MemoryOptions, StageModel
from advisor.models import PRESETS
from advisor.parallel import Workload
from advisor.splits import caps


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["llama3.1-8b", "llama3.1-70b", "llama3.1-405b"]), st.sampled_from([1, 2, 4, 8]),
       st.sampled_from([1, 2, 4]), st.integers(1, 32), st.integers(0, 40), st.integers(1, 4),
       st.floats(1.0, 200.0), st.booleans(), st.integers(1, 6), st.sampled_from([1, 2, 3]))
def test_the_closed_form_inverse_is_the_bisection(model, tp, cp, pp, recompute, mbs, gib, sequence_parallel, vpp,
                                                  groups):
    """StageModel.most_layers (lines in q and r, then corrected) = bisection over n on total()."""
    spec = PRESETS[model]
    vpp = vpp if pp > 1 else 1
    options = MemoryOptions(sequence_parallel=sequence_parallel, recompute_method="block")
    stage = np.arange(pp)[None, :]
    model = StageModel(spec, 8192, options, tp=tp, cp=cp, dp=4, mbs=mbs, pp=pp, vpp=vpp,
                       num_microbatches=groups * pp, stage=stage, recompute_layers=recompute)
    low, high = np.full((1, pp), vpp, np.int64), np.full((1, pp), spec.num_layers, np.int64)
    bound = np.full((1, 1), gib * 2**30)
    closed = model.most_layers(bound, low, high)
    assert (closed == caps(model.total, bound, low, high)).all()
    every = np.arange(vpp, spec.num_layers + 1)[:, None]
    within = model.total(every) <= bound[0, 0]  # (L, pp): rank i holding n layers
    assert closed[0].tolist() == [int(every[within[:, i], 0].max(initial=vpp - 1)) for i in range(pp)]


def _plan_every_variant(spec, workload, gpus, memory_gib, timing):
    """Per base layout, every (VPP, N) the space offers, planned without any pruning: its MadPipe
    split within 80% of the memory and that split's step (the space's own planner and pricing)."""
    from advisor.space import SpaceOptions, Variants, _groups, _Pricer, _recompute_range, launchable

    options = MemoryOptions()
    bases = launchable(spec, workload, gpus, 8, options)
    group_base, group_vpp = _groups(spec, bases, SpaceOptions())
    low, high = _recompute_range(bases.pp[group_base], group_vpp, spec.num_layers, SpaceOptions(), False)
    owner = np.repeat(np.arange(len(group_base)), high - low + 1)
    n = np.concatenate([np.arange(a, b + 1) for a, b in zip(low, high)])
    variants = Variants(group_base[owner], bases, group_vpp[owner], n)
    times = timing.layouts(tp=bases.tp, cp=bases.cp, dp=bases.dp, mbs=bases.mbs, pp=bases.pp, selective=False)
    pricer = _Pricer(spec, workload, options, variants, times)
    split = pricer.fastest(0.8 * memory_gib * 2**30)
    step = np.full(len(variants), np.inf)
    ok = np.flatnonzero(split.feasible)
    step[ok] = pricer.step_time(split.counts, ok)
    best = np.full(len(bases), np.inf)
    np.minimum.at(best, variants.base, step)
    return bases, best


@pytest.mark.parametrize("model,gpus,gbs,memory", [("llama3.2-1b", 8, 64, 16), ("llama3.2-3b", 16, 128, 24),
                                                   ("llama3.1-8b", 32, 256, 40)])
def test_the_time_chooser_loses_no_layouts_best_variant(model, gpus, gbs, memory):
    """With the time model, each row is the fastest (VPP, recomputation, split) of its layout that
    fits: the pruning (bounds, the period rule for N) drops nothing that would have won."""
    from advisor.hardware import get_gpu
    from advisor.rank_times import Timing
    from advisor.space import search
    from advisor.throughput import TimeModel

    spec = PRESETS[model]
    workload = Workload(seq_len=4096, global_batch_size=gbs)
    timing = Timing(TimeModel(spec, get_gpu("h100-80gb"), 4096, gbs), 8)
    bases, best = _plan_every_variant(spec, workload, gpus, memory, timing)
    result = search(spec, workload, gpus, memory, threshold=0.8, max_tp=8, options=MemoryOptions(), timing=timing)
    assert len(result.bases) == len(bases) and result.evaluated < result.considered
    fits = result.chosen.terms.total.max(axis=1) <= 0.8 * memory * 2**30
    assert np.isfinite(best).any()
    for b in range(len(bases)):
        if np.isfinite(best[b]):
            assert fits[b] and result.chosen.step_time[b] == pytest.approx(best[b], rel=1e-12), b
        else:
            assert not fits[b]


@pytest.mark.parametrize("model,gpus,memory", [("llama3.1-8b", 16, 24), ("llama3.1-70b", 64, 40),
                                               ("llama3.1-405b", 1024, 80)])
def test_without_a_time_model_each_row_recomputes_the_fewest_layers_that_fit(model, gpus, memory):
    from advisor.space import SpaceOptions, Variants, _Pricer, search

    spec = PRESETS[model]
    workload = Workload(seq_len=8192, global_batch_size=1024)
    result = search(spec, workload, gpus, memory, threshold=0.8, max_tp=8, options=MemoryOptions())
    bases, chosen = result.bases, result.chosen
    assert (chosen.vpp == 1).all()
    fits = chosen.terms.total.max(axis=1) <= 0.8 * memory * 2**30
    for n in range(0, 1 + spec.num_layers):  # every N for every layout, no pruning
        variants = Variants(np.arange(len(bases)), bases, np.ones(len(bases), np.int64), np.full(len(bases), n))
        ok = _Pricer(spec, workload, MemoryOptions(), variants).fits(0.8 * memory * 2**30)
        assert not (ok & fits & (chosen.recompute_layers > n)).any()  # a smaller N would have fit
        assert not (ok & ~fits).any()  # a row marked not fitting that some N fits
    assert fits.any()
