"""advisor.space: the launchable space, its pruning, and the closed forms it relies on."""

import numpy as np
import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from advisor.errors import AdvisorError
from advisor.memory import MemoryOptions
from advisor.stage_model import StageModel
from advisor.models import PRESETS
from advisor.parallel import Workload
from advisor.splits import caps


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(["llama3.1-8b", "llama3.1-70b", "llama3.1-405b"]), st.sampled_from([1, 2, 4, 8]),
       st.sampled_from([1, 2, 4]), st.integers(1, 32), st.integers(0, 40), st.integers(1, 4),
       st.floats(1.0, 200.0), st.booleans(), st.integers(1, 6), st.sampled_from([1, 2, 3]),
       st.sampled_from([None, "no_shard", "optim", "optim_grads", "optim_grads_params", "torch_fsdp2"]), st.sampled_from([1, 4, 64]),
       st.sampled_from([None, "hybrid"]), st.sampled_from([2, 4]))
def test_the_closed_form_inverse_is_the_bisection(model, tp, cp, pp, recompute, mbs, gib, sequence_parallel, vpp,
                                                  groups, fsdp, dp, fp8, gradient_bytes):
    """StageModel.most_layers (lines in q and r, and Megatron-FSDP's buffers as the smallest of
    lines, then corrected) = bisection over n on total() = brute force over every n."""
    spec = PRESETS[model]
    vpp = vpp if pp > 1 else 1
    options = MemoryOptions(sequence_parallel=sequence_parallel, recompute_method="block", fsdp_strategy=fsdp,
                            fp8_format=fp8, gradient_bytes=gradient_bytes)
    stage = np.arange(pp)[None, :]
    model = StageModel(spec, 8192, options, tp=tp, cp=cp, dp=dp, mbs=mbs, pp=pp, vpp=vpp,
                       num_microbatches=groups * pp, stage=stage, recompute_layers=recompute)
    low, high = np.full((1, pp), vpp, np.int64), np.full((1, pp), spec.num_layers, np.int64)
    bound = np.full((1, 1), gib * 2**30)
    closed = model.most_layers(bound, low, high)
    assert closed is not None  # settled: the planner did not fall back to bisection
    assert (closed == caps(model.total, bound, low, high)).all()
    every = np.arange(vpp, spec.num_layers + 1)[:, None]
    within = model.total(every) <= bound[0, 0]  # (L, pp): rank i holding n layers
    assert closed[0].tolist() == [int(every[within[:, i], 0].max(initial=vpp - 1)) for i in range(pp)]


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["llama3.1-8b", "llama3.1-70b"]), st.sampled_from([1, 2, 8]), st.integers(1, 16),
       st.integers(0, 20), st.integers(1, 4), st.floats(1.0, 300.0), st.integers(1, 4), st.sampled_from([4096, 16384]))
def test_the_closed_form_inverse_is_the_bisection_with_the_local_attentions_buffer(model, tp, pp, recompute, mbs, gib,
                                                                                   vpp, seq_len):
    """--transformer-impl local: a rank with layers keeps megatron-core's global memory buffer once
    (StageModel.layer_activations), a step at the first layer that the closed form's lines carry in
    their fixed part; the inverse still settles and equals the brute force (CP 1, no SP: the local
    attention and torch's RMSNorm refuse them)."""
    spec = PRESETS[model]
    vpp = vpp if pp > 1 else 1
    options = MemoryOptions(fused_norms=False, flash_attention=False, sequence_parallel=False,
                            recompute_method="block")
    model = StageModel(spec, seq_len, options, tp=tp, cp=1, dp=1, mbs=mbs, pp=pp, vpp=vpp, num_microbatches=2 * pp,
                       stage=np.arange(pp)[None, :], recompute_layers=recompute)
    low, high = np.full((1, pp), vpp, np.int64), np.full((1, pp), spec.num_layers, np.int64)
    bound = np.full((1, 1), gib * 2**30)
    closed = model.most_layers(bound, low, high)
    assert closed is not None
    every = np.arange(vpp, spec.num_layers + 1)[:, None]
    within = model.total(every) <= bound[0, 0]
    assert closed[0].tolist() == [int(every[within[:, i], 0].max(initial=vpp - 1)) for i in range(pp)]


def _plan_every_variant(spec, workload, gpus, memory_gib, timing, calibration=None, measured=None):
    """Per base layout, every (VPP, N) the space offers, planned without any pruning: its MadPipe
    split within 80% of the memory (calibrated: within 1 - band of it, by the calibrated model)
    and that split's step (the space's own planner and pricing)."""
    from advisor.space import SpaceOptions, Variants, _groups, _recompute_range, launchable
    from advisor.space_pricer import _Pricer

    options = MemoryOptions()
    bases = launchable(spec, workload, gpus, 8, options)
    group_base, group_vpp = _groups(spec, bases, SpaceOptions())
    low, high = _recompute_range(bases.pp[group_base], group_vpp, spec.num_layers, SpaceOptions(), False)
    owner = np.repeat(np.arange(len(group_base)), high - low + 1)
    n = np.concatenate([np.arange(a, b + 1) for a, b in zip(low, high)])
    variants = Variants(group_base[owner], bases, group_vpp[owner], n)
    times = timing.layouts(tp=bases.tp, cp=bases.cp, dp=bases.dp, mbs=bases.mbs, pp=bases.pp, selective=False)
    calibrated = None if calibration is None else (calibration, memory_gib, measured)
    pricer = _Pricer(spec, workload, options, variants, times, calibrated=calibrated)
    split = pricer.fastest(_limit(memory_gib, calibration))
    step = np.full(len(variants), np.inf)
    ok = np.flatnonzero(split.feasible)
    step[ok] = pricer.step_time(split.counts, ok)
    best = np.full(len(bases), np.inf)
    np.minimum.at(best, variants.base, step)
    return bases, best


def _limit(memory_gib, calibration):
    return (0.8 if calibration is None else 1 - calibration.band) * memory_gib * 2**30


def _usage(spec, workload, chosen, bases, memory_gib, calibration, measured=None):
    """Each row's peak bytes per GPU: Eq. 18, or the calibrated model's (``advisor.verdicts``)."""
    if calibration is None:
        return chosen.terms.total.max(axis=1)
    from advisor.verdicts import calibrated_terms

    col = (slice(None), None)
    width = chosen.terms.total.shape[1]
    terms = calibrated_terms(spec, workload.seq_len, bases.mbs[col], bases.tp[col], bases.cp[col],
                             np.arange(width)[None, :], bases.pp[col], chosen.recompute_layers[col] > 0,
                             MemoryOptions(), calibration, memory_gib, measured)
    t = chosen.terms
    usage = terms.stage_bytes(t.model_states, t.layer_activations, t.embedding_activations, t.output_activations)
    return np.where(np.arange(width)[None, :] < bases.pp[col], usage, -np.inf).max(axis=1)


def _measured(spec):
    """Profiled activation ratios (``--memory-model profile``): overall, and others at TP 2."""
    from advisor.profile_terms import ActivationRatios, MeasuredActivations

    return MeasuredActivations(
        model=spec, source="hand", layer_spec="transformer_engine", sequence_parallel=True, params_dtype="bfloat16",
        backends=("symbolic",), overall=ActivationRatios(decoder=1.3, embedding=None, output=0.9, samples=3),
        by_layout={(2, 1): ActivationRatios(decoder=0.7, embedding=0.01, output=None, samples=2)})


def test_profiled_ratios_per_layout_in_the_vectorised_terms():
    """The planners' calibrated terms take the profiled ratios of each row's own (TP, CP), the
    overall ratio where that layout's profiles lack a module, and the calibrated model's
    correction where no profile measured it; fully recomputed layers keep Eq. 12's input."""
    from advisor import memory_terms
    from advisor.verdicts import MemoryCalibration, calibrated_terms

    spec = PRESETS["llama3.1-8b"]
    calibration = MemoryCalibration(reserve_fraction=0.07, activation_factor=1.2, band=0.05)
    tp, cp = np.array([[1], [2], [2], [4]]), np.array([[1], [1], [2], [1]])
    terms = calibrated_terms(spec, 8192, 1, tp, cp, np.arange(4)[None, :], 4, np.array([[False], [False], [True],
                             [False]]), MemoryOptions(), calibration, 80.0, _measured(spec))
    factor = 1.2
    assert np.broadcast_to(terms.layer_factor, (4, 4))[:, 0] == pytest.approx(factor * np.array([1.3, 0.7, 1, 1.3]))
    ids = memory_terms.embedding_ids_fraction(spec)
    assert np.ravel(terms.embedding_factor) == pytest.approx(factor * np.array([ids, 0.01, ids, ids]))
    assert np.ravel(terms.output_factor) == pytest.approx([factor * 0.9] * 4)
    plain = calibrated_terms(spec, 8192, 1, tp, cp, np.arange(4)[None, :], 4, False, MemoryOptions(), calibration,
                             80.0)
    assert np.ravel(plain.layer_factor) == pytest.approx([factor * memory_terms.swiglu_fusion_fraction(spec)])
    assert np.array_equal(terms.added, plain.added)  # the ratios change activations only


@pytest.mark.parametrize("calibrated", [False, True, "profile"])
@pytest.mark.parametrize("model,gpus,gbs,memory", [("llama3.2-1b", 8, 64, 16), ("llama3.2-3b", 16, 128, 24),
                                                   ("llama3.1-8b", 32, 256, 40)])
def test_the_time_chooser_loses_no_layouts_best_variant(model, gpus, gbs, memory, calibrated):
    """With the time model, each row is the fastest (VPP, recomputation, split) of its layout that
    fits (Eq. 18's 80%, or the calibrated model's 'fits', with profiled activations too): the
    pruning (bounds, the period rule for N) drops nothing that would have won."""
    from advisor.hardware import get_gpu
    from advisor.rank_times import Timing
    from advisor.space_search import search
    from advisor.throughput import TimeModel
    from advisor.verdicts import MemoryCalibration

    spec = PRESETS[model]
    workload = Workload(seq_len=4096, global_batch_size=gbs)
    timing = Timing(TimeModel(spec, get_gpu("h100-80gb"), 4096, gbs), 8)
    calibration = MemoryCalibration(reserve_fraction=0.08, activation_factor=1.15, band=0.04) if calibrated else None
    measured = _measured(spec) if calibrated == "profile" else None
    bases, best = _plan_every_variant(spec, workload, gpus, memory, timing, calibration, measured)
    result = search(spec, workload, gpus, memory, threshold=0.8, max_tp=8, options=MemoryOptions(), timing=timing,
                    memory_calibration=calibration, measured=measured)
    assert len(result.bases) == len(bases) and result.evaluated < result.considered
    fits = _usage(spec, workload, result.chosen, bases, memory, calibration, measured) <= _limit(memory, calibration)
    assert np.isfinite(best).any()
    for b in range(len(bases)):
        if np.isfinite(best[b]):
            assert fits[b] and result.chosen.step_time[b] == pytest.approx(best[b], rel=1e-12), b
        else:
            assert not fits[b]


@pytest.mark.parametrize("model,gpus,memory", [("llama3.1-8b", 16, 24), ("llama3.1-70b", 64, 40),
                                               ("llama3.1-405b", 1024, 80)])
def test_without_a_time_model_each_row_recomputes_the_fewest_layers_that_fit(model, gpus, memory):
    from advisor.space import Variants
    from advisor.space_pricer import _Pricer
    from advisor.space_search import search

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


def test_the_pinned_uniform_method_takes_the_least_n_that_fits_though_memory_is_not_monotone_in_n():
    """--recompute-method uniform: N layers per checkpointed unit; fewer checkpoints but a larger
    unit rebuilt, so memory does not fall with N (no bisection): every N is tried."""
    from advisor.space import SpaceOptions, Variants, _recompute_range
    from advisor.space_pricer import _Pricer
    from advisor.space_search import search

    spec, memory = PRESETS["llama3.1-70b"], 34.5  # where some layouts fit with N = 2 or 3 only
    workload = Workload(seq_len=8192, global_batch_size=1024)
    space = SpaceOptions(recompute="full", recompute_method="uniform")
    options = MemoryOptions()
    result = search(spec, workload, 64, memory, threshold=0.8, max_tp=8, options=options, space=space)
    bases, chosen = result.bases, result.chosen
    low, high = _recompute_range(bases.pp, np.ones(len(bases), np.int64), spec.num_layers, space, False)
    every, ok, totals = np.arange(1, int(high.max()) + 1), [], []
    # every (N, base), ten N per pricer (each row is planned as alone: test_splits); one N per
    # pricer spent its time in numpy's per-call overhead, all 80 in one in first-touch page faults
    for some in np.array_split(every, -(-len(every) // 10)):
        base, n = np.tile(np.arange(len(bases)), len(some)), np.repeat(some, len(bases))
        pricer = _Pricer(spec, workload, options, Variants(base, bases, np.ones(len(base), np.int64), n, uniform=True))
        ok.append((pricer.fits(0.8 * memory * 2**30) & (n <= high[base])).reshape(len(some), len(bases)))
        totals.append(pricer.lowest().value.reshape(len(some), len(bases)))
    ok, totals = np.concatenate(ok), np.concatenate(totals)  # (N, base)
    least = np.where(ok.any(axis=0), every[ok.argmax(axis=0)], -1)  # the least N that fits, per base
    assert (least > 1).any() and (np.diff(totals, axis=0) > 0).any()  # not monotone
    fits = chosen.terms.total.max(axis=1) <= 0.8 * memory * 2**30
    assert (np.where(fits, chosen.recompute_layers, -1) == least).all()
    assert set(chosen.recompute_method[fits]) == {"uniform"}


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["llama3.1-8b", "llama3.1-70b"]), st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2]),
       st.integers(1, 8), st.integers(1, 3), st.integers(0, 4), st.integers(1, 4), st.booleans())
def test_the_planners_calibrated_stage_model_is_the_verdicts_usage(model, tp, cp, pp, vpp, recompute, mbs, mask):
    """StageModel(calibrated=...) scales Eq. 18's activation terms inside the planner; per stage it
    is what ``advisor.verdicts`` computes from the same layout's estimate."""
    from advisor.memory import estimate_memory
    from advisor.parallel import ParallelConfig
    from advisor.verdicts import MemoryCalibration, calibrated_stage_bytes, calibrated_terms

    spec, memory = PRESETS[model], 80.0
    vpp = vpp if pp > 1 else 1
    options = MemoryOptions(recompute="full" if recompute else "none", recompute_method="block",
                            recompute_num_layers=max(recompute, 1))
    calibration = MemoryCalibration(reserve_fraction=0.07, activation_factor=1.2, band=0.05, dataloader_mask=mask)
    parallel = ParallelConfig(tp=tp, cp=cp, pp=pp, dp=2, mbs=mbs, vpp=vpp)
    workload = Workload(seq_len=8192, global_batch_size=2 * mbs * pp * 4)
    layers = [spec.num_layers // pp + (i < spec.num_layers % pp) for i in range(pp)]
    estimate = estimate_memory(spec, parallel, workload, options, tuple(layers))
    expected = calibrated_stage_bytes(estimate, spec, 8192, mbs, tp, cp, options, calibration, memory)
    stage = np.arange(pp)
    terms = calibrated_terms(spec, 8192, mbs, tp, cp, stage, pp, recompute > 0, options, calibration, memory)
    planner = StageModel(spec, 8192, options, tp=tp, cp=cp, dp=2, mbs=mbs, pp=pp, vpp=vpp,
                         num_microbatches=workload.num_microbatches(parallel), stage=stage, calibrated=terms)
    assert planner.total(np.array(layers)) == pytest.approx(expected, rel=1e-12)


def test_the_sweep_plans_against_the_profile_model_that_judges_it():
    """With --memory-model profile the space is planned with the profiled ratios: every layout
    that a plan made for the calibrated model would fit under the profile model fits as planned,
    and some fit only because they were planned against the ratios they are judged by."""
    from advisor.ranking import judge_rows
    from advisor.sweep import sweep

    spec, workload = PRESETS["llama3.1-70b"], Workload(seq_len=8192, global_batch_size=256)
    measured = _measured(spec)
    planned = sweep(spec, workload, 128, 40, memory_model="profile", measured=measured).rows
    naive = sweep(spec, workload, 128, 40, memory_model="calibrated").rows
    rejudged = judge_rows(naive, spec, workload, 40, memory_model="profile", measured=measured)

    def verdicts(rows):
        return {(r.parallel.tp, r.parallel.cp, r.parallel.pp, r.parallel.dp, r.parallel.mbs): r.verdict for r in rows}

    planned, rejudged = verdicts(planned), verdicts(rejudged)
    assert planned.keys() == rejudged.keys()
    assert all(planned[key] == "fits" for key, verdict in rejudged.items() if verdict == "fits")
    assert sum(v == "fits" for v in planned.values()) > sum(v == "fits" for v in rejudged.values())


@pytest.mark.parametrize("profiled", [False, True])
def test_the_sweeps_vectorised_assessments_are_each_rows_own(profiled):
    """The sweep judges all its rows at once (verdicts.assess_stages); each row's assessment is
    what advisor.verdicts.assess computes from that row alone (its estimate and recomputation)."""
    from advisor.sweep import sweep
    from advisor.throughput.calibration import load_memory_calibration
    from advisor.verdicts import assess

    spec, workload = PRESETS["llama3.1-70b"], Workload(seq_len=8192, global_batch_size=256)
    measured = _measured(spec) if profiled else None
    rows = sweep(spec, workload, 128, 40, memory_model="profile" if profiled else "calibrated",
                 measured=measured).rows
    assert {row.options.recompute for row in rows} >= {"none", "full"} and len({row.parallel.pp for row in rows}) > 3
    calibration = load_memory_calibration()
    for row in rows:
        p = row.parallel
        alone = assess(row.estimate, spec, workload.seq_len, p.mbs, p.tp, p.cp, 40, row.options, calibration, measured)
        assert row.assessment.usage_gib == pytest.approx(alone.usage_gib, rel=1e-12)
        assert (row.assessment.peak_stage, row.assessment.verdict, row.verdict) == (alone.peak_stage, alone.verdict,
                                                                                     alone.verdict)


def test_a_chunked_search_gives_the_same_rows(monkeypatch):
    """Issue 24: the search plans its bases in chunks of bounded (variants, ranks) arrays; with
    tiny chunks (dozens of them) every row, verdict, rank and step time is the single search's."""
    from advisor import space_chunks
    from advisor.hardware import get_gpu
    from advisor.models import preset
    from advisor.parallel import Workload
    from advisor.sweep import sweep

    def rows():
        result = sweep(preset("llama3.1-8b"), Workload(), 8, 40, gpu=get_gpu("a100-40gb"), memory_model="calibrated")
        return [(r.parallel, r.layers_per_stage, r.verdict, r.rank, r.timing["step_time_s"], r.options)
                for r in result.rows], result.considered, result.evaluated

    whole = rows()
    calls = []
    original = space_chunks.chunks
    monkeypatch.setattr(space_chunks, "chunks", lambda *a: calls.append(original(*a)) or calls[-1])
    monkeypatch.setattr(space_chunks, "ELEMENTS", 50)
    assert rows() == whole and len(calls[0]) > 5


def _every_variant_fits(spec, workload, gpus, memory_gib, options, space, calibration):
    """Whether any (base, VPP, recomputation family, N) the space offers fits within all of the
    memory, every one of them priced with no pruning at all (the brute force behind may_fit)."""
    from advisor.space import _families, _groups, launchable
    from advisor.space_pricer import _Pricer

    options = options.memory_options()
    bases = launchable(spec, workload, gpus, 8, options, space.split)
    group_base, group_vpp = _groups(spec, bases, space)
    calibrated = None if calibration is None else (calibration, memory_gib, None)
    for selective, uniform in _families(space, options):
        variants = _every_n(spec, bases, group_base, group_vpp, space, selective, uniform)
        if variants is None:
            continue
        pricer = _Pricer(spec, workload, options, variants, even=space.split == "even",
                         calibrated=calibrated)
        if pricer.fits(memory_gib * 2**30).any():
            return True
    return False


def _every_n(spec, bases, group_base, group_vpp, space, selective, uniform):
    """Every (base, VPP) with every N of its range in one recomputation family (None: none)."""
    from advisor.space import Variants, _recompute_range

    low, high = _recompute_range(bases.pp[group_base], group_vpp, spec.num_layers, space, selective)
    owner = np.repeat(np.arange(len(group_base)), np.maximum(high - low + 1, 0))
    if not owner.size:
        return None
    n = np.concatenate([np.arange(a, b + 1) for a, b in zip(low, high)])
    return Variants(group_base[owner], bases, group_vpp[owner], n, selective, uniform)


_RUNGS = [{}, {"fsdp_strategy": "optim_grads"}, {"fsdp_strategy": "optim_grads_params"},
          {"optimizer_cpu_offload": True}]


@settings(max_examples=120, deadline=None)
@given(st.sampled_from(["llama3.2-1b", "llama3.2-3b", "llama3.1-8b"]), st.sampled_from([1, 2, 4, 8, 16]),
       st.floats(1.0, 60.0), st.sampled_from(range(len(_RUNGS))), st.booleans(),
       st.sampled_from([("auto", None, "auto", None), ("auto", None, "none", None), ("even", 1, "none", None),
                        ("auto", 2, "auto", None), ("auto", None, "full", "uniform"), ("auto", None, "selective", None),
                        ("even", None, "auto", None)]),
       st.booleans(), st.sampled_from([1024, 4096, 16384]), st.sampled_from([16, 64]))
@example("llama3.2-3b", 16, 54.0, 0, True, ("even", 1, "none", None), False, 16384, 16)
def test_a_rung_that_may_fit_skips_never_has_a_layout_that_fits(model, gpus, memory, rung, calibrated, space_args,
                                                                  flash, seq_len, gbs):
    """advisor.space_search.may_fit (the bound that lets the escalation skip a rung, issue 24) says
    False only where no variant at all fits, by brute force over every (base, VPP, family, N),
    and where the whole sweep of that rung ranks no row (so escalate would not have taken it)."""
    from advisor.options import TrainingOptions
    from advisor.space import SpaceOptions
    from advisor.space_search import may_fit
    from advisor.sweep import sweep
    from advisor.throughput.calibration import load_memory_calibration

    split, vpp, recompute, method = space_args
    space = SpaceOptions(split=split, vpp=vpp, recompute=recompute, recompute_method=method)
    spec, workload = PRESETS[model], Workload(seq_len=seq_len, global_batch_size=gbs)
    attention = {} if flash else {"flash_attention": False, "dataloader_mask": "cached"}
    options = TrainingOptions().with_(**attention, **_RUNGS[rung])
    # the calibration the sweep below judges with (a made-up one let may_fit and the sweep disagree)
    calibration = load_memory_calibration() if calibrated else None
    bound = may_fit(spec, workload, gpus, memory, max_tp=8, options=options.memory_options(), space=space,
                    memory_calibration=calibration)
    brute = _every_variant_fits(spec, workload, gpus, memory, options, space, calibration)
    assert bound or not brute
    event(f"may fit: {bound}, some variant fits: {brute}")
    if not bound:
        try:
            rows = sweep(spec, workload, gpus, memory, max_tp=8, options=options, space=space,
                         memory_model="calibrated" if calibrated else "paper").rows
        except AdvisorError:
            return  # nothing launchable at all: the escalation skips such a rung too
        assert not any(row.rank for row in rows)


@pytest.mark.parametrize("memory,expected", [(16.0, False), (20.0, True)])
def test_may_fit_says_both(memory, expected):
    """The bound is not vacuous: Llama-3.1-8B on 8 GPUs has no layout within 16 GiB and some
    within 20 GiB (TP 4, PP 2, MBS 2 with full recomputation: the sweep ranks it)."""
    from advisor.space_search import may_fit

    assert may_fit(PRESETS["llama3.1-8b"], Workload(), 8, memory, max_tp=8, options=MemoryOptions()) is expected


@pytest.mark.parametrize("gpu", [None, "a100-40gb"])
def test_where_nothing_fits_the_unplanned_rows_are_the_planned_ones(monkeypatch, gpu):
    """Issue 24: where no layout can fit (``_fits_somewhere`` False), the search skips planning;
    every row (split, VPP, recomputation, memory, verdict, step time) is what the whole search,
    planning every variant in vain, gives. The check prices each layout's least-memory variants,
    which the search would price too, so it counts no more variants priced (fewer with a time
    model, whose bounds price every VPP)."""
    from advisor import space, space_search
    from advisor.hardware import get_gpu
    from advisor.space_pricer import _Priced
    from advisor.sweep import sweep

    def rows():
        # 67 of the 125 layouts' model states fit in 24 GiB, but none of them with 65,536 tokens
        result = sweep(PRESETS["llama3.1-8b"], Workload(seq_len=65536, global_batch_size=64), 8, 24.0,
                       gpu=gpu and get_gpu(gpu),
                       memory_model="calibrated" if gpu else "paper", space=space.SpaceOptions(sharding="fixed"))
        return [(r.parallel, r.layers_per_stage, r.verdict, r.rank, r.options, r.estimate.terms, r.timing)
                for r in result.rows], result.evaluated

    checks = []
    original = space_search._fits_somewhere
    monkeypatch.setattr(space_search, "_fits_somewhere", lambda *a: checks.append(original(*a)) or checks[-1])
    skipped, evaluated = rows()
    assert checks[0][0] is False and not any(row[3] for row in skipped)
    monkeypatch.setattr(space_search, "_fits_somewhere", lambda *a: (True, _Priced()))  # plan as before the shortcut
    planned, planned_evaluated = rows()
    assert repr(skipped) == repr(planned) and 0 < evaluated <= planned_evaluated
    assert (evaluated < planned_evaluated) == (gpu is not None)


@pytest.mark.parametrize("split,vpp", [("auto", None), ("even", None), ("auto", 2), ("even", 3), ("auto", 1)])
@pytest.mark.parametrize("model,gpus,gbs", [("llama3.2-1b", 24, 16), ("llama3.1-70b", 512, 1024),
                                            ("llama3.1-405b", 16384, 2048), ("llama3.1-8b", 64, None),
                                            ("llama3.1-8b", 33, 1024)])
def test_the_groups_are_every_vpp_megatron_interleaves(model, gpus, gbs, split, vpp):
    """space._groups (vectorised) lists, base by base, VPP 1 or 1 .. L/PP where the interleaved
    schedule runs (PP > 1, microbatches a multiple of PP, or unknown), as a plain loop does."""
    from advisor.space import SpaceOptions, _groups, launchable

    spec, workload = PRESETS[model], Workload(seq_len=8192, global_batch_size=gbs)
    bases, space = launchable(spec, workload, gpus, 8, MemoryOptions(), split), SpaceOptions(split=split, vpp=vpp)
    expected = []
    for b in range(len(bases)):
        p, m = int(bases.pp[b]), float(bases.microbatches[b])
        top = spec.num_layers // p if p > 1 and (m == float("inf") or (m >= p and m % p == 0)) else 1
        expected += [(b, v) for v in ([vpp] if vpp else range(1, top + 1))
                     if v <= top and (split == "auto" or spec.num_layers % (p * v) == 0)]
    base, vpps = _groups(spec, bases, space)
    assert list(zip(base.tolist(), vpps.tolist())) == expected and base.dtype == vpps.dtype == np.int64


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["llama3.2-1b", "llama3.1-8b", "llama3.1-70b"]), st.sampled_from([8, 32, 64, 256]),
       st.sampled_from([None, "optim_grads", "optim_grads_params"]), st.sampled_from([None, "hybrid"]),
       st.booleans(), st.booleans(), st.sampled_from(["none", "some", "all"]), st.integers(0, 2**32 - 1))
def test_stage_models_taken_for_some_variants_are_the_ones_built_for_them(model, gpus, fsdp, fp8, calibrated, uniform,
                                                                           recomputing, seed):
    """_Search.reuse: the pricer of some of the variants, at another N, takes its stage models
    from those built once for all of them (StageModel.take); its caps, splits, steps and terms
    are those of a pricer built for them anew, calibrated or not, with the levers' buffers."""
    from advisor.hardware import get_gpu
    from advisor.rank_times import Timing
    from advisor.space import SpaceOptions, Variants, _groups, launchable
    from advisor.space_pricer import _Pricer
    from advisor.space_search import _Search
    from advisor.throughput import TimeModel
    from advisor.throughput.calibration import load_memory_calibration

    spec, workload, rng = PRESETS[model], Workload(seq_len=4096, global_batch_size=512), np.random.default_rng(seed)
    options = MemoryOptions(fsdp_strategy=fsdp, fp8_format=fp8, recompute_method="uniform" if uniform else "block")
    bases = launchable(spec, workload, gpus, 8, options)
    group_base, group_vpp = _groups(spec, bases, SpaceOptions())
    all_of_them = Variants(group_base, bases, group_vpp, np.zeros(len(group_base), np.int64), False, uniform)
    search = _Search(spec, workload, options, Timing(TimeModel(spec, get_gpu("h100-80gb"), 4096, 512), 8), False,
                     (load_memory_calibration(), 80.0, None) if calibrated else None)
    search.reuse(all_of_them)
    some = np.flatnonzero(rng.random(len(all_of_them)) < 0.5)
    if not some.size:
        some = np.array([0])
    largest = spec.num_layers // np.maximum(all_of_them.pp[some] * all_of_them.vpp[some], 1)
    n = {"none": np.zeros(len(some), np.int64), "all": rng.integers(1, largest + 1),
         "some": rng.integers(0, largest + 1)}[recomputing]
    part = all_of_them.take(some).with_recompute(n)
    taken = search.pricer(part)
    mixed = calibrated and 0 < (n > 0).sum() < len(n)
    assert (search._built(part) is None) == mixed  # taken unless the calibrated factor differs per layout
    built = _Pricer(spec, workload, options, part, search.times[False], False, search.calibrated)
    limit = 60 * 2**30
    assert (taken.memory_caps(limit) == built.memory_caps(limit)).all()
    assert (taken.fits(limit) == built.fits(limit)).all()
    for mine, theirs in ((taken.fastest(limit), built.fastest(limit)), (taken.lowest(), built.lowest())):
        assert (mine.counts == theirs.counts).all() and (mine.feasible == theirs.feasible).all()
        assert np.array_equal(mine.value, theirs.value)
    counts = theirs.counts  # built.lowest()'s, planned once
    assert np.array_equal(taken.step_time(counts), built.step_time(counts))
    if not calibrated:
        mine, theirs = taken.terms(counts), built.terms(counts)
        assert all(np.array_equal(getattr(mine, f), getattr(theirs, f)) for f in mine.__dataclass_fields__)
    event(f"taken: {search._built(part) is not None}")


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(["llama3.2-1b", "llama3.2-3b", "llama3.1-8b"]), st.sampled_from([8, 16, 32, 64]),
       st.floats(2.0, 60.0), st.sampled_from(range(len(_RUNGS))), st.booleans(),
       st.sampled_from([("auto", None, "auto", None), ("auto", None, "full", "uniform"), ("auto", None, "selective", None),
                        ("even", None, "auto", None), ("auto", None, "full", None)]), st.booleans())
# found by this test: VPP 2 fits at 13 GiB where VPP 1 fits at no N (space_search._least_memory_variants)
@example("llama3.2-3b", 32, 13.0, 2, True, ("auto", None, "full", "uniform"), True)
def test_a_base_whose_least_memory_variants_do_not_fit_has_no_variant_that_fits(model, gpus, memory, rung, calibrated,
                                                                              space_args, flash):
    """space_search._drop_unfit_bases: per base, where its least-memory variants (its smallest VPP, every
    VPP with the uniform method) fit at none of their least-memory N, no (VPP, N) of the same
    recomputation family fits, every one of them priced."""
    from advisor.options import TrainingOptions
    from advisor.space import SpaceOptions, _families, _groups, launchable
    from advisor.space_pricer import _Pricer
    from advisor.space_search import _least_memory_variants, _may_fit_at_all, _Search
    from advisor.throughput.calibration import load_memory_calibration

    spec, workload = PRESETS[model], Workload(seq_len=4096, global_batch_size=64)
    split, vpp, recompute, method = space_args
    space = SpaceOptions(split=split, vpp=vpp, recompute=recompute, recompute_method=method)
    attention = {} if flash else {"flash_attention": False, "dataloader_mask": "cached"}
    options = TrainingOptions().with_(**attention, **_RUNGS[rung]).memory_options()
    bases = launchable(spec, workload, gpus, 8, options, space.split)
    group_base, group_vpp = _groups(spec, bases, space)
    if not len(group_base):
        return
    calibrated = (load_memory_calibration(), memory, None) if calibrated else None
    search, limit = _Search(spec, workload, options, None, split == "even", calibrated), memory * 2**30
    present = np.unique(group_base)
    for selective, uniform in _families(space, options):
        least = _least_memory_variants(bases, group_base, group_vpp, present, selective, uniform)
        may = np.zeros(len(bases), dtype=bool)
        np.logical_or.at(may, least.base, _may_fit_at_all(search, least, space, limit))
        every = _every_n(spec, bases, group_base, group_vpp, space, selective, uniform)
        if every is None:
            continue
        fits = _Pricer(spec, workload, options, every, even=split == "even", calibrated=calibrated).fits(limit)
        some = np.zeros(len(bases), dtype=bool)
        np.logical_or.at(some, every.base, fits)
        assert not (some & ~may).any()
        event(f"bases that fit: {int(some.sum()) > 0}, bases ruled out: {int((~may[present]).sum()) > 0}")


@pytest.mark.parametrize("model,gpus,gbs,fsdp,calibrated", [("llama3.1-8b", 64, 512, None, True),
                                                            ("llama3.1-70b", 256, 1024, "optim_grads", True),
                                                            ("llama3.1-70b", 128, 512, None, False)])
def test_planning_several_n_ahead_gives_the_same_rows_and_counts(monkeypatch, model, gpus, gbs, fsdp, calibrated):
    """space_search.AHEAD: planning the next N of the last variants together, then stopping N by N,
    chooses what planning one N per round chooses, and counts the same variants planned."""
    from advisor import space_search
    from advisor.hardware import get_gpu
    from advisor.rank_times import Timing
    from advisor.throughput import TimeModel
    from advisor.throughput.calibration import load_memory_calibration

    spec, workload = PRESETS[model], Workload(seq_len=8192, global_batch_size=gbs)
    timing = Timing(TimeModel(spec, get_gpu("h100-80gb"), 8192, gbs), 8)

    rounds, plan_at = [], space_search._plan_at
    monkeypatch.setattr(space_search, "_plan_at", lambda *args: rounds.append(len(args[2])) or plan_at(*args))

    def result():
        rounds.clear()
        found = space_search.search(spec, workload, gpus, 80.0, threshold=0.8, max_tp=8,
                             options=MemoryOptions(fsdp_strategy=fsdp, gradient_bytes=2 if fsdp else 4), timing=timing,
                             memory_calibration=load_memory_calibration() if calibrated else None)
        return found, len(rounds)

    ahead, together = result()
    monkeypatch.setattr(space_search, "AHEAD", 1)
    alone, one_by_one = result()
    assert together < one_by_one  # some rounds planned several N
    assert ahead.evaluated == alone.evaluated and ahead.considered == alone.considered
    for name in ("vpp", "recompute", "recompute_layers", "counts", "step_time"):
        assert np.array_equal(getattr(ahead.chosen, name), getattr(alone.chosen, name), equal_nan=name == "step_time")


def test_without_a_time_model_the_uniform_method_interleaves_where_only_that_fits():
    """With the uniform method a unit rebuilds at most its chunk's layers, so a smaller chunk can
    need less (space_search._least_memory_variants): llama3.2-3b at TP 8, CP 2, PP 2, MBS 32 fits 13 GiB
    (calibrated) at VPP 2 only, and the sweep without a time model must not call it oom; at
    14 GiB VPP 1 fits, and interleaving is not chosen where it is not needed."""
    from advisor.options import TrainingOptions
    from advisor.space import SpaceOptions
    from advisor.sweep import sweep

    spec, workload = PRESETS["llama3.2-3b"], Workload(seq_len=4096, global_batch_size=64)
    space = SpaceOptions(split="auto", vpp=None, recompute="full", recompute_method="uniform")
    # the loader's mask kept (768 MiB on the end stages at MBS 32), as when this case was found
    options = TrainingOptions().with_(fsdp_strategy="optim_grads_params", dataloader_mask="cached")

    def row(memory):
        rows = sweep(spec, workload, 32, memory, max_tp=8, options=options, space=space, memory_model="calibrated").rows
        return next(r for r in rows if (r.parallel.tp, r.parallel.cp, r.parallel.pp, r.parallel.mbs) == (8, 2, 2, 32))

    tight, roomy = row(13.0), row(14.0)
    assert tight.rank is not None and tight.parallel.vpp == 2 and tight.verdict == "likely fits"
    assert roomy.rank is not None and roomy.parallel.vpp == 1


def test_the_escalation_ladder_climbs_from_options_without_the_distributed_optimizer(advisor):
    """--no-distributed-optimizer with nothing fitting: the Megatron-FSDP rungs were built outside
    the ladder's error handling without the distributed optimizer they need, and the sweep ended
    on 'Megatron-FSDP runs with --use-distributed-optimizer' (exit 2). Each rung now states what
    it runs with; this 70B case climbs to the CPU offload, as it does with the default options,
    with the distributed optimizer its precision-aware optimizer needs (megatron-core refuses the
    offload without it)."""
    import json

    rows = json.loads(advisor("sweep", "--model", "llama3.1-70b", "--gpus", 8, "--mem", 80,
                              "--no-distributed-optimizer", "--top", 1, "--format", "json").stdout)
    default = json.loads(advisor("sweep", "--model", "llama3.1-70b", "--gpus", 8, "--mem", 80, "--top", 1,
                                 "--format", "json").stdout)
    assert rows[0]["rank"] == 1 and rows[0]["options"]["optimizer_cpu_offload"]
    assert "distributed_optimizer" not in rows[0]["options"] and default[0]["options"]["optimizer_cpu_offload"]
    assert "--use-distributed-optimizer" in rows[0]["megatron_args"]


@pytest.mark.parametrize("memory", [4.0, 8.0, 40.0])
def test_the_check_that_something_fits_prices_the_likeliest_parts_first(memory):
    """``_fits_any`` (``may_fit``'s check) prices the variants in parts of doubling size, the least
    model states per GPU first: it answers as pricing them all at once does, stops at the part
    that holds the likeliest variant that fits, and where none fits has priced every variant
    (Llama-3.1-8B on 64 GPUs, 682 least-memory variants: none fits in 4 GiB, 14 in 8, 213 in 40)."""
    from advisor.space import SpaceOptions, _groups, launchable
    from advisor.space_pricer import _states_lower_bound
    from advisor.space_search import FIRST_PART, _fits, _fits_any, _least_memory_variants, _Search

    spec, workload, options = PRESETS["llama3.1-8b"], Workload(), MemoryOptions()
    bases = launchable(spec, workload, 64, 8, options)
    group_base, group_vpp = _groups(spec, bases, SpaceOptions())
    variants = _least_memory_variants(bases, group_base, group_vpp, np.arange(len(bases)), False, False)
    floor, limit = _states_lower_bound(spec, bases, options), memory * 2**30
    fits = _fits(_Search(spec, workload, options, None, False), variants, limit)
    search = _Search(spec, workload, options, None, False)
    assert _fits_any(search, variants, limit, floor) == fits.any()
    priced = sum(keys.shape[1] for keys in search.priced._keys)
    if not fits.any():
        assert priced == len(variants)
        return
    likeliest = int(np.flatnonzero(fits[np.argsort(floor[variants.base], kind="stable")])[0])
    end, size = FIRST_PART, FIRST_PART
    while end <= likeliest:
        size *= 2
        end += size
    assert priced == min(end, len(variants)) < len(variants)
