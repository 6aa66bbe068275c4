"""The fits and both predictors, against hand-worked numbers and the synthetic ground truth."""

import math

import pytest
from capture_synth import TINY, Truth, write_run, write_scenario

from advisor.capture.fits import hyperbola_at, line_at, log_at
from advisor.capture.layout import PipelineLayout, Scenario, in_flight_microbatches
from advisor.capture.observations import load_profile_set
from advisor.capture.partitionings import description1, reduced
from advisor.capture.predict_1f1b import PositionAwarePredictor
from advisor.capture.predict_capture import CapturePredictor
from advisor.errors import AdvisorError
from advisor.models import with_overrides

SIX = with_overrides(TINY, num_layers=6)


def test_line_fit_description_2_by_hand():
    # Through (2, 100) and (4, 160): slope 30 per sequence, so 280 at 8 and 100 at 2.
    assert line_at(2, 100, 4, 160, 8) == 280
    assert line_at(2, 100, 4, 160, 2) == 100


def test_log_fit_by_hand():
    # y = a + b ln d through (2, 10) and (4, 7): b = -3 / ln 2, a = 10 + 3 = 13, so y = 13 - 3 log2 d.
    assert log_at(2, 10, 4, 7, 8) == pytest.approx(4)
    assert log_at(2, 10, 4, 7, 16) == pytest.approx(1)
    assert log_at(2, 10, 4, 7, 6) == pytest.approx(13 - 3 * math.log2(6))


def test_hyperbola_fit_by_hand():
    # y = F + A/d through (2, 10) and (4, 7): A/2 - A/4 = 3, A = 12, F = 4; at 8: 4 + 1.5.
    assert hyperbola_at(2, 10, 4, 7, 8) == pytest.approx(5.5)


def test_in_flight_by_hand():
    # 1F1B: stage i of p holds p - i microbatches, at most m.
    assert [in_flight_microbatches(i, 4, 3) for i in range(4)] == [3, 3, 2, 1]
    assert [in_flight_microbatches(i, 4, 8) for i in range(4)] == [4, 3, 2, 1]


# --- CAPTURE-original ------------------------------------------------------------------


@pytest.fixture(scope="module")
def additive(tmp_path_factory):
    """A truth that is a sum over layers (no transients, one microbatch): CAPTURE's model."""
    root = tmp_path_factory.mktemp("additive")
    truth = Truth(spec=SIX, additive=True)
    write_scenario(root, truth, description1(6, 4), (1, 2))
    for t in (2, 4):
        write_scenario(root, truth, description1(6, 3), (1, 2), tp=t)
    return truth, load_profile_set([root])


def _truth_of(truth, layout, t=1, d=1):
    b = layout.pipeline_microbatch / d
    return tuple(truth.peak(stage.first, stage.last, b, t, d, layout.in_flight(i))
                 for i, stage in enumerate(layout.stages))


@pytest.mark.parametrize("counts", [(1, 2, 3), (3, 3), (6,), (2, 2, 1, 1), (1, 1, 1, 1, 1, 1)])
@pytest.mark.parametrize("batch", [1, 2, 4])
def test_capture_is_exact_when_memory_adds_up(additive, counts, batch):
    truth, profiles = additive
    layout = PipelineLayout.from_counts(counts, batch, 1)
    assert CapturePredictor(profiles).predict(layout) == pytest.approx(_truth_of(truth, layout), abs=1e-6)


def test_capture_stage_formula_and_log_fit(additive):
    _, profiles = additive
    predictor = CapturePredictor(profiles)
    stats = predictor.statistics(Scenario(), 2)
    # III-B1: M_p(2..4) = M_i(2) + M_a(3) + M_a(4).
    assert predictor.stage_bytes(2, 4, Scenario(), 2) == stats.isolated[1] + stats.added[2] + stats.added[3]
    # III-B3: y = a + b ln d through degrees 2 and 4 gives 2 y(4) - y(2) at degree 8.
    y2, y4 = (predictor.stage_bytes(1, 3, Scenario(tp=t), 2) for t in (2, 4))
    assert predictor.stage_bytes(1, 3, Scenario(tp=8), 2) == pytest.approx(2 * y4 - y2)
    with pytest.raises(AdvisorError, match="cannot predict tp2dp2"):
        predictor.stage_bytes(1, 3, Scenario(tp=2, dp=2), 2)
    with pytest.raises(AdvisorError, match="no profile runs for scenario dp2"):
        predictor.stage_bytes(1, 3, Scenario(dp=2), 2)


def test_capture_cost_table_matches_its_predictions(additive):
    _, profiles = additive
    predictor = CapturePredictor(profiles)
    table = predictor.cost_table(Scenario(), 4, 1, 4)
    assert table.position_free
    for first, last in [(1, 1), (2, 5), (1, 6), (6, 6)]:
        assert table.cost(first, last, 3) == pytest.approx(predictor.stage_bytes(first, last, Scenario(), 4))


# --- 1F1B-aware ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def positional(tmp_path_factory):
    """The reduced campaign of a position-dependent truth (1F1B: stage i holds S - i microbatches)."""
    root = tmp_path_factory.mktemp("positional")
    truth = Truth(spec=SIX)
    write_scenario(root, truth, reduced(6, 4), (2, 4))
    for t in (2, 4):
        write_scenario(root, truth, reduced(6, 3), (2, 4), tp=t)
    return truth, load_profile_set([root])


@pytest.mark.parametrize("counts,m", [((1, 2, 3), 8), ((3, 3), 8), ((6,), 4), ((1, 1, 1, 1, 2), 3), ((2, 1, 3), 1)])
@pytest.mark.parametrize("batch", [2, 8])
def test_1f1b_is_exact_on_held_out_layouts(positional, counts, m, batch):
    truth, profiles = positional
    layout = PipelineLayout.from_counts(counts, batch, m)
    assert PositionAwarePredictor(profiles).predict(layout) == pytest.approx(_truth_of(truth, layout), rel=1e-12)


@pytest.mark.parametrize("tp,dp", [(1, 2), (2, 2), (8, 1), (4, 2)])
def test_1f1b_derives_unprofiled_degrees(positional, tp, dp):
    """DP shards the optimizer and splits the microbatch; TP above 4 follows F + A/t, which this
    truth (every term divided by t) is."""
    truth, profiles = positional
    layout = PipelineLayout.from_counts((2, 4), 8, 4, Scenario(tp=tp, dp=dp))
    assert PositionAwarePredictor(profiles).predict(layout) == pytest.approx(_truth_of(truth, layout, tp, dp),
                                                                            rel=1e-12)


def test_1f1b_fit_recovers_the_stage_constants(positional):
    truth, profiles = positional
    predictor = PositionAwarePredictor(profiles)
    predictor.terms(Scenario(), 4)
    fit = predictor.fits[0]
    assert fit.constant == pytest.approx(truth.constant)
    assert fit.per_microbatch == pytest.approx(truth.per_microbatch * 4)  # C1 b, with b = 4
    assert fit.rms_error_bytes < 1e-6


def test_1f1b_position_model_by_hand(tmp_path):
    """Two layers, one run [1, 1] with m = 2; modules (static, activation A, forward rise F, which
    includes A, backward rise B): embedding (100, 10, 15, 4), layer 1 (50, 20, 50, 12), layer 2
    (60, 25, 33, 6), output (200, 40, 110, 20).
    Stage 0 (2 in flight): F0, F1, B0, B1. F1 runs with one microbatch held (30): the embedding
    rises to 150 + 30 + 15 = 195, layer 1 to 150 + 30 + 10 + 50 = 240; B0 starts from 210: layer 1
    222, then the embedding 190 + 4. Peak 240, measured 240 + c0 + 2 c1 = 253.
    Stage 1 (1 in flight): layer 2 260 + 33 = 293, output 260 + 25 + 110 = 395, its backward
    325 + 20. Peak 395, measured 395 + c0 + c1 = 405; so c0 = 7, c1 = 3."""
    two = with_overrides(TINY, num_layers=2)
    # static = 5 P (parameters, gradients, 3 P optimizer); forward = F - A.
    truth = Truth(spec=two, params={"embedding": 20, 1: 10, 2: 12, "output": 40},
                  activation={"embedding": 10, 1: 20, 2: 25, "output": 40},
                  forward={"embedding": 5, 1: 30, 2: 8, "output": 70},
                  backward={"embedding": 4, 1: 12, 2: 6, "output": 20}, constant=7, per_microbatch=3)
    write_run(tmp_path, truth, [1, 1], mbs=1, num_microbatches=2)
    predictor = PositionAwarePredictor(load_profile_set([tmp_path]))
    assert predictor.predict(PipelineLayout.from_counts((1, 1), 1, 2)) == pytest.approx((253, 405))
    # One stage holding everything, one microbatch in flight: the output's forward, 410 + 55 +
    # 110, and 7 + 3.
    assert predictor.predict(PipelineLayout.from_counts((2,), 1, 2)) == pytest.approx((585,))
    # [1, 1] with one microbatch: stage 0 holds 1, layer 1's forward: 150 + 10 + 50 + 7 + 3.
    assert predictor.predict(PipelineLayout.from_counts((1, 1), 1, 1))[0] == pytest.approx(220)


def test_capture_misses_what_1f1b_sees(tmp_path):
    """With 1F1B, M_i(l) measured on one pipeline position is wrong on another; CAPTURE has no
    way to know (its Section IV-B), the position-aware predictor has."""
    truth = Truth(spec=SIX)
    write_scenario(tmp_path, truth, description1(6, 4), (2, 4))
    profiles = load_profile_set([tmp_path])
    layout = PipelineLayout.from_counts((1, 1, 1, 1, 1, 1), 4, 6)  # 6 stages: stage 0 holds 6
    real = _truth_of(truth, layout)
    capture = CapturePredictor(profiles).predict(layout)
    assert PositionAwarePredictor(profiles).predict(layout) == pytest.approx(real, rel=1e-12)
    assert capture[0] < real[0]  # under-predicts the first stage, which holds more than profiled


def test_one_profiled_batch_cannot_be_scaled(tmp_path):
    write_scenario(tmp_path, Truth(spec=SIX), reduced(6, 3), (2,))
    predictor = PositionAwarePredictor(load_profile_set([tmp_path]))
    assert predictor.predict(PipelineLayout.from_counts((3, 3), 2, 2))  # the profiled batch itself
    with pytest.raises(AdvisorError, match="profiled at pipeline microbatch 2 only; the line fit"):
        predictor.predict(PipelineLayout.from_counts((3, 3), 4, 2))


def test_merged_units_price_the_same_stages(additive, positional):
    """The merger's formulas (III-A3) conserve every unit-aligned stage's prediction."""
    groups = ((1, 2), (3, 3), (4, 6))
    _, profiles = additive
    merged, plain = CapturePredictor(profiles, groups), CapturePredictor(profiles)
    assert merged.stage_bytes(1, 2, Scenario(), 4) == pytest.approx(plain.stage_bytes(1, 3, Scenario(), 4))
    assert merged.stage_bytes(2, 3, Scenario(), 4) == pytest.approx(plain.stage_bytes(3, 6, Scenario(), 4))
    _, profiles = positional
    merged = PositionAwarePredictor(profiles, groups).cost_table(Scenario(), 4, 8, 3)
    plain = PositionAwarePredictor(profiles).cost_table(Scenario(), 4, 8, 3)
    assert merged.layers == groups
    for first, last in [(1, 1), (1, 3), (2, 3), (3, 3)]:
        for j in (1, 2, 3):
            assert merged.cost(first, last, j) == plain.cost(groups[first - 1][0], groups[last - 1][1], j)
    assert merged.cost(2, 1, 1) == math.inf
