"""M_i, M_a and the layer merger worked by hand; bad profile data gets an error naming it."""

from dataclasses import replace

import pytest
from capture_synth import TINY, Truth, write_run

from advisor.capture.layout import PIPELINE
from advisor.capture.observations import SET_ASIDE_WHY, load_profile_set, profile_set, set_aside_groups
from advisor.capture.statistics import apply_groups, capture_statistics, merge_groups
from advisor.models import with_overrides
from advisor.profiles import ProfileError, load_run

THREE = with_overrides(TINY, num_layers=3)


@pytest.fixture
def hand_runs(tmp_path):
    """Three runs of a 3-layer model with peaks chosen by hand (stage index = rank here)."""
    truth = Truth(spec=THREE)
    write_run(tmp_path, truth, [1, 1, 1], mbs=1, peak_override={(0, 0): 10, (1, 1): 7, (2, 2): 9})
    write_run(tmp_path, truth, [2, 1], mbs=1, peak_override={(0, 0): 15, (1, 1): 8})
    write_run(tmp_path, truth, [1, 2], mbs=1, peak_override={(0, 0): 11, (1, 1): 12})
    return tmp_path


def test_mi_and_ma_by_hand(hand_runs):
    stats = capture_statistics(load_profile_set([hand_runs]), PIPELINE, 1)
    # PM(1) was measured twice (10 and 11): the larger counts; PM(3) likewise (9 and 8).
    assert stats.isolated == (11, 7, 9)
    # M_a(2) = PM(1..2) - PM(1) = 15 - 11; M_a(3) = PM(2..3) - PM(2) = 12 - 7 (n = 1, the only one).
    assert stats.added == (None, 4, 5)


def test_missing_statistics_name_the_layer(tmp_path):
    truth = Truth(spec=THREE)
    write_run(tmp_path, truth, [1, 1, 1], mbs=1)
    write_run(tmp_path, truth, [2, 1], mbs=1)
    with pytest.raises(ProfileError, match=r"M_a\(3\) is unknown"):
        capture_statistics(load_profile_set([tmp_path]), PIPELINE, 1)
    other = tmp_path / "other"
    write_run(other, truth, [2, 1], mbs=1)
    write_run(other, truth, [1, 2], mbs=1)
    with pytest.raises(ProfileError, match=r"no run held layer 2 alone on a stage, so M_i\(2\) is unknown"):
        capture_statistics(load_profile_set([other]), PIPELINE, 1)
    with pytest.raises(ProfileError, match="pipeline microbatch 4: no finished profile run"):
        capture_statistics(load_profile_set([other]), PIPELINE, 4)


def _run(tmp_path, **kwargs):
    return load_run(write_run(tmp_path, Truth(spec=THREE), kwargs.pop("layers", [2, 1]), mbs=1, **kwargs))


def _with_peak(run, stage, peak):
    ranks = list(run.ranks)
    iterations = (replace(ranks[stage].iterations[0], peak_allocated_bytes=peak),)
    ranks[stage] = replace(ranks[stage], iterations=iterations)
    return replace(run, ranks=tuple(ranks))


@pytest.mark.parametrize("peak,message", [
    (-5, "rank 1: peak_allocated_bytes is -5"),
    (float("nan"), "rank 1: peak_allocated_bytes is nan"),
])
def test_negative_and_nan_peaks_name_the_run_and_rank(tmp_path, peak, message):
    run = _with_peak(_run(tmp_path, name="r1"), 1, peak)
    with pytest.raises(ProfileError, match=f"run r1, {message}"):
        profile_set([run])


def test_negative_layer_terms_name_the_module(tmp_path):
    run = _run(tmp_path, name="r1")
    rank = run.ranks[0]
    layers = (replace(rank.layers[1], activation_bytes=-1),) + rank.layers[2:] + rank.layers[:1]
    bad = replace(run, ranks=(replace(rank, layers=layers),) + run.ranks[1:])
    with pytest.raises(ProfileError, match="run r1, rank 0, decoder.layers.0, iteration 1: activation_bytes is -1"):
        profile_set([bad])


def test_missing_stage_and_missing_layer(tmp_path):
    run = _run(tmp_path, name="r1")
    with pytest.raises(ProfileError, match=r"run r1: no rank file for rank 1 of its world of 2; every GPU"):
        profile_set([replace(run, ranks=run.ranks[:1])])
    rank = run.ranks[0]
    dropped = tuple(layer for layer in rank.layers if layer.layer_number != 2)
    with pytest.raises(ProfileError, match="rank 0, iteration 1: missing decoder layer 2"):
        profile_set([replace(run, ranks=(replace(rank, layers=dropped),) + run.ranks[1:])])


def test_mismatched_batch_sizes_and_setups(tmp_path):
    run = _run(tmp_path, name="r1")
    assert profile_set([run]).runs  # as written, its batch adds up: only the edit below is refused
    ranks = tuple(replace(rank, header=replace(rank.header, global_batch_size=7)) for rank in run.ranks)
    with pytest.raises(ProfileError, match="mismatched batch sizes: global batch 7 != micro-batch 1 x DP 1 x 2"):
        profile_set([replace(run, ranks=ranks)])
    other = load_run(write_run(tmp_path, Truth(spec=THREE), [1, 2], mbs=1, name="r2"))
    longer = replace(other, ranks=tuple(replace(r, header=replace(r.header, seq_len=64)) for r in other.ranks))
    with pytest.raises(ProfileError, match="run r2 differs from run r1 in seq_len"):
        profile_set([run, longer])


def test_unfinished_runs_are_set_aside(tmp_path):
    _run(tmp_path, name="ok", layers=[1, 1, 1])
    _run(tmp_path, name="oom", status="oom")
    profiles = load_profile_set([tmp_path])
    assert [run.run for run in profiles.runs] == ["ok"]
    assert profiles.skipped == (("oom", "oom"),)
    only_oom = tmp_path / "only"
    _run(only_oom, name="oom", status="oom")
    with pytest.raises(ProfileError, match=r"the one profile run did not finish \('ok'\): oom out of memory"):
        load_profile_set([only_oom])



def test_set_aside_runs_are_grouped_once_for_the_caption_and_the_error():
    """One grouping for recommend's caption and the none-finished error: per status in
    SET_ASIDE_WHY's order (running, oom, error), whatever the runs' order, at most ``shown`` names
    and the count of the rest; a status none has is left out."""
    skipped = [("e1", "error"), ("r1", "running"), ("r2", "running"), ("r3", "running"), ("r4", "running")]
    assert set_aside_groups(skipped, shown=3) == [("r1, r2, r3 and 1 more", SET_ASIDE_WHY["running"]),
                                                  ("e1", SET_ASIDE_WHY["error"])]
    assert set_aside_groups(skipped[:2], shown=1) == [("r1", SET_ASIDE_WHY["running"]), ("e1", SET_ASIDE_WHY["error"])]

def test_layer_merger_by_hand():
    isolated, added = [10, 8, 9, 12], [None, 3, 2, 5]
    # Candidates: (1,2): 10 + 3 = 13; (2,3): 8 + 2 = 10; (3,4): 9 + 5 = 14 -> merge 2 and 3.
    assert merge_groups(isolated, added, 3) == ((1, 1), (2, 3), (4, 4))
    # Then (1, 2-3): 10 + (3 + 2) = 15 and (2-3, 4): 10 + 5 = 15, a tie: the leftmost pair.
    assert merge_groups(isolated, added, 2) == ((1, 3), (4, 4))
    assert merge_groups(isolated, added, 4) == ((1, 1), (2, 2), (3, 3), (4, 4))


def test_merged_statistics_by_hand(hand_runs):
    stats = capture_statistics(load_profile_set([hand_runs]), PIPELINE, 1)  # M_i (11, 7, 9), M_a (-, 4, 5)
    merged = apply_groups(stats, ((1, 2), (3, 3)))
    assert merged.isolated == (11 + 4, 9) and merged.added == (None, 5)
    merged = apply_groups(stats, ((1, 1), (2, 3)))
    assert merged.isolated == (11, 7 + 5) and merged.added == (None, 4 + 5)
