"""Megatron-FSDP's optim_grads queue on MoE stages (``advisor.moe.fsdp_replay``): the layer's
weights against the advisor's parameter counts, a toy MoE stage traced by hand, the engine's
MoE additions (``StageWeights.pre_arrival``, the numpy cut of several groups, ``stage_peak``)
against a plain reference replay, and Qwen3-30B-A3B at DP 2048, derived by hand."""

import dataclasses
import random

import numpy as np
import pytest

from advisor import memory_levers as levers
from advisor import equations as eq
from advisor.memory import MemoryOptions
from advisor.models import load_model
from advisor.moe import fsdp, fsdp_replay, params
from tests.test_fsdp_optim_grads_replay import random_stage, reference_stage_peak

W = lambda size, group=0: (float(size), group, False, False)  # noqa: E731

TOY = levers.StageWeights((), (W(4), W(3, 1), W(3, 1), W(2)), (), (2, 1, 3, 0))
"""A toy MoE layer: dense d0 4, routed e1 3, e2 3, dense d1 2; backward e2, e1, d1, d0."""


def test_a_toy_moe_stage_by_hand():
    """Two layers, bucket 5, queue 6. The groups apart: g0 [d0 d1 = 6] per layer, g1 [e1 e2 = 6]
    per layer: B0 (L0 d), B1 (L0 e), B2 (L1 d), B3 (L1 e). Backward L1: e2 opens B3 (6), e1
    completes it (queued: space 6), d1 opens B2 (12), d0 completes it (6 > 6 no: space 12); L0:
    e2 opens B1 (18), e1 completes it (pops B3: held 12, space 6; appended), d1 opens B0 (18),
    d0 completes it (pops B2). Peak 18. One group instead (all g0), the cut falls mid-layer:
    [d0 e1 = 7], [e2 d1 = 5] per layer; backward L1: e2 opens its [e2 d1] (5), e1 opens [d0 e1]
    (12), d1 completes the first (space 5), d0 the second (space 12); L0: e2 opens (17), e1 opens
    (24): peak 24. The groups' separate cuts change the peak."""
    assert reference_stage_peak(TOY, 2, 5.0, 6.0) == 18.0
    assert levers._stage_peaks(TOY, 2, 5.0, 6.0)[2] == 18.0
    assert levers.stage_peak(TOY, 2, 5.0, 6.0) == 18.0
    one = TOY._replace(layer=tuple(W(w[0]) for w in TOY.layer))
    assert reference_stage_peak(one, 2, 5.0, 6.0) == 24.0 == levers.stage_peak(one, 2, 5.0, 6.0)


def test_dense_layers_before_the_moe_layers_by_hand():
    """pre = one dense layer [a 4, b 4] produced b then a (``pre_arrival`` (1, 0), here as the
    default) or a then b ((0, 1)); one toy layer; bucket 100 (one bucket a group), queue 0.
    g0's bucket [a b d0 d1 = 14] opens at the layer's d1, g1's [e1 e2 = 6] at e2: held 20,
    the peak, either order; with bucket 4 each weight of a, b is a bucket of its own: a then b
    opens a (4) while b's bucket is queued, popped at a's completion: the order moves no peak
    over the layer's 6 + 6 here, so the oracle and the engine must agree on both."""
    for order in ((1, 0), (0, 1)):
        stage = levers.StageWeights((W(4), W(4)), TOY.layer, (), TOY.arrival, order)
        assert levers.stage_peak(stage, 1, 100.0, 0.0) == 20.0 == reference_stage_peak(stage, 1, 100.0, 0.0)
        for bucket in (4.0, 5.0, 9.0):
            assert levers._stage_peaks(stage, 1, bucket, 0.0) == tuple(
                reference_stage_peak(stage, n, bucket, 0.0) for n in range(2))


def random_mixed_stage(rng: random.Random) -> levers.StageWeights:
    """``random_stage`` (``tests.test_fsdp_optim_grads_replay``) with two groups forced in the
    layer and a few dense-layer weights added to ``pre`` in a random order of arrival; half of
    them an MTP stage's (``random_mtp_ends``)."""
    stage = random_stage(rng, fractional=False)
    layer = stage.layer + (W(rng.randint(0, 12), 1), W(rng.randint(0, 12), 0))
    arrival = tuple(rng.sample(range(len(layer)), len(layer)))
    pre = stage.pre + tuple(W(rng.randint(0, 12)) for _ in range(rng.randint(0, 4)))
    pre_arrival = tuple(rng.sample(range(len(pre)), len(pre))) if rng.random() < 0.7 else ()
    stage = levers.StageWeights(pre, layer, stage.post, arrival, pre_arrival)
    return random_mtp_ends(rng, stage) if rng.random() < 0.5 else stage


def random_mtp_ends(rng: random.Random, stage: levers.StageWeights) -> levers.StageWeights:
    """``stage`` with an MTP stage's ends: a few weights of either group added to ``post`` and
    backward producing ``post`` in a random order, with the first ``pre`` weight among them
    (the embedding copy) where it has one, more often than not."""
    post = stage.post + tuple(W(rng.randint(0, 12), rng.randrange(2)) for _ in range(rng.randint(1, 5)))
    order = [len(stage.pre) + k for k in range(len(post))]
    if stage.pre and rng.random() < 0.7:
        order.append(0)
    rng.shuffle(order)
    return stage._replace(post=post, post_arrival=tuple(order))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("numpy_weights", [levers.NUMPY_WEIGHTS, 0])
def test_random_moe_stages_are_the_reference_replay(seed, numpy_weights, monkeypatch):
    """Random stages of two or three groups with dense weights before the layers: every count
    (``_stage_peaks``) and the full stage alone (``stage_peak``) as the plain replay gives them,
    with the per-weight bookkeeping in Python and (``NUMPY_WEIGHTS`` 0) in numpy."""
    monkeypatch.setattr(levers, "NUMPY_WEIGHTS", numpy_weights)
    levers._stage_peaks.cache_clear(), levers._stage_replay.cache_clear(), levers.stage_peak.cache_clear()
    rng = random.Random(seed)
    for _ in range(150):
        stage = random_mixed_stage(rng)
        bucket, queue, layers = rng.choice([float(rng.randint(1, 30)), np.inf]), float(rng.randint(0, 80)), \
            rng.randint(0, 8)
        expected = [reference_stage_peak(stage, n, bucket, queue) for n in range(layers + 1)]
        assert list(levers._stage_peaks(stage, layers, bucket, queue)) == expected, (stage, bucket, queue)
        assert levers.stage_peak(stage, layers, bucket, queue) == expected[-1]
    levers._stage_peaks.cache_clear(), levers._stage_replay.cache_clear(), levers.stage_peak.cache_clear()


def test_a_bad_pre_arrival_is_refused():
    with pytest.raises(ValueError, match="pre_arrival"):
        levers._stage_peaks(levers.StageWeights((W(1), W(2)), TOY.layer, (), TOY.arrival, (0, 0)), 1, 5.0, 0.0)


@pytest.mark.parametrize("name,tp,ep,etp", [("qwen3-30b-a3b", 1, 8, 1), ("qwen3-30b-a3b", 4, 32, 2),
                                            ("deepseek-v3", 1, 64, 1), ("deepseek-v3", 8, 8, 1),
                                            ("deepseek-v3", 2, 256, 1)])
@pytest.mark.parametrize("grouped", [True, False])
def test_the_weights_sum_to_the_advisors_counts(name, tp, ep, etp, grouped):
    """Group 0 sums to ``params.moe_layer_dense_parameters``, group 1 to
    ``params.local_expert_parameters``, a dense layer to ``params.dense_layer_parameters``;
    each arrival covers its layer once; the routed experts come first in backward."""
    spec = load_model(name)
    layer, arrival = fsdp_replay.moe_layer_weights(spec, tp, ep, etp, grouped)
    assert sum(w[0] for w in layer if w[1] == 0) == params.moe_layer_dense_parameters(spec, tp)
    assert sum(w[0] for w in layer if w[1] == 1) == params.local_expert_parameters(spec, ep, etp)
    assert sorted(arrival) == list(range(len(layer)))
    assert sum(1 for w in layer if w[1] == 1) == 2 * spec.num_experts // ep
    assert all(layer[i][1] == 1 for i in arrival[:2 * spec.num_experts // ep])
    dense, dense_arrival = fsdp_replay.dense_layer_weights(spec, tp)
    assert sum(w[0] for w in dense) == params.dense_layer_parameters(spec, tp)
    assert sorted(dense_arrival) == list(range(len(dense)))


def test_a_dense_layer_of_grouped_query_attention_is_the_dense_models():
    spec = load_model("qwen3-30b-a3b")
    dense, arrival = fsdp_replay.dense_layer_weights(spec, 2)
    assert tuple(w[0] for w in dense) == tuple(float(w) for w in levers.layer_weights(spec, 2))
    assert arrival == levers.LAYER_WEIGHT_ARRIVAL


def test_deepseek_v3s_mla_layer_order():
    """DeepSeek-V3 at TP 1, EP 64: input norm 7168, linear_proj 128 x 128 x 7168, q_down 7168 x
    1536, q_up 1536 x 128 x 192 + its norm 1536, kv_down 7168 x (512 + 64), kv_up 512 x 128 x 256
    + its norm 512, pre-MLP norm 7168, router 256 x 7168, 4 experts' FC1 2 x 7168 x 2048 then
    their FC2 2048 x 7168 (group 1), the shared experts' FC1 2 x 7168 x 2048 and FC2 2048 x 7168."""
    layer, arrival = fsdp_replay.moe_layer_weights(load_model("deepseek-v3"), 1, 64, 1)
    assert [w[0] for w in layer] == [7168, 128 * 128 * 7168, 7168 * 1536, 1536 * 128 * 192 + 1536, 7168 * 576,
                                     512 * 128 * 256 + 512, 7168, 256 * 7168] + [2 * 7168 * 2048] * 4 \
        + [2048 * 7168] * 4 + [2 * 7168 * 2048, 2048 * 7168]
    assert [w[1] for w in layer] == [0] * 8 + [1] * 8 + [0, 0]
    # backward: routed FC2 then FC1, router, shared FC2, FC1, pre-MLP norm, proj, kv_up, q_up, kv_down, q_down, input norm
    assert arrival == (12, 13, 14, 15, 8, 9, 10, 11, 7, 17, 16, 6, 1, 5, 3, 4, 2, 0)


def test_mla_without_a_q_lora_produces_q_proj_before_kv_down():
    """DeepSeek-V3 without a q LoRA (as Moonlight, DeepSeek-V2-Lite) at TP 1, EP 64: input norm,
    linear_proj, linear_q_proj 7168 x 128 x 192, kv_down, kv_up + its norm, pre-MLP norm, router,
    4 + 4 experts, shared FC1, FC2. Forward runs kv_down, then q_proj, then kv_up
    (multi_latent_attention.py core_v0.19.0 :662, :860, :866), so backward produces proj, kv_up,
    q_proj, kv_down (read on megatron-core's local spec: tests/test_moe_layer_order.py)."""
    spec = load_model("deepseek-v3")
    spec = dataclasses.replace(spec, mla=dataclasses.replace(spec.mla, q_lora_rank=None))
    layer, arrival = fsdp_replay.moe_layer_weights(spec, 1, 64, 1)
    assert [w[0] for w in layer][:6] == [7168, 128 * 128 * 7168, 7168 * 128 * 192, 7168 * 576,
                                         512 * 128 * 256 + 512, 7168]
    # routed FC2 then FC1, router, shared FC2, FC1, pre-MLP norm, proj, kv_up, q_proj, kv_down, input norm
    assert arrival == (11, 12, 13, 14, 7, 8, 9, 10, 6, 16, 15, 5, 1, 4, 2, 3, 0)


def test_qwen3_30b_a3b_at_dp_2048_holds_its_whole_stage():
    """Qwen3-30B-A3B, TP 1, PP 1, EP 8, DP 2048, --overlap-grad-reduce: buckets of 2.048e9 and a
    queue of 2.048e9 (max(1e9, 1M x 2048)). Group 0 (embedding 151936 x 2048, 48 dense parts,
    final norm, output layer: 1.54e9) never reaches the bucket size: one bucket, opened by the
    output layer's gradient first and completed by the embedding's last. Group 1 (48 x 16 experts
    x 3 x 2048 x 768 = 3.62e9) is two buckets, the later-named one produced first. So when the
    earlier expert bucket opens, all three are allocated: the whole stage, 5.16e9 elements. The
    old form: queue + the largest unit = 2.048e9 + 94.6e6."""
    spec = load_model("qwen3-30b-a3b")
    options = MemoryOptions(fsdp_strategy="optim_grads", overlap_grad_reduce=True, fsdp_budget_from_units=True)
    vocab = eq.padded_vocab_size(spec.vocab_size, 128, 1)
    layer = params.moe_layer_dense_parameters(spec, 1) + params.local_expert_parameters(spec, 8, 1)
    whole = 48 * layer + 2 * 2048 * vocab + 2048
    stages = fsdp_replay.ReplayedStages(spec, 1, 1, 8, 1, 0, vocab, 48, 0)
    assert fsdp_replay.queued_elements(options, stages, 0, 2048, 2.048e9) == whole
    _, old, _ = fsdp.buffer_bytes(options, (params.moe_layer_dense_parameters(spec, 1),
                                            params.local_expert_parameters(spec, 8, 1), 0.0), 0, 48, 2048)
    _, new, share = fsdp.buffer_bytes(options, (params.moe_layer_dense_parameters(spec, 1),
                                                params.local_expert_parameters(spec, 8, 1), 0.0), 0, 48, 2048, stages)
    assert old == 4 * (2.048e9 + layer) and new == 4 * whole
    assert share == pytest.approx((whole - 48 * params.local_expert_parameters(spec, 8, 1)) / whole)


def test_a_toy_mtp_stage_by_hand():
    """A last stage at PP > 1 holding one toy layer and an MTP block: pre the embedding copy E 5
    (a bucket of its own, ``shared_embedding``), post the final norm N 1, MTP weights A 2 (g0) and
    X 3 (g1), the output layer O 6; backward O, X, A, E, N (``post_arrival`` (4, 3, 2, 0, 1)), then
    the layer e2, e1, d1, d0. Bucket 5, queue 6. Cut: B0 [E] 5; g0 [d0 d1] 6, g1 [e1 e2] 6, then
    g0 [N A O] 9 (closed by O) and g1 [X] 3. O opens [N A O] (9); X opens and completes [X] (12,
    queued 3); A; E opens and completes [E] (17, queued 8); N completes [N A O]: 8 > 6 pops [X]
    (14, queued 5), appended (14); e2 opens [e1 e2] (20, the peak); e1 completes it: pops [E],
    [N A O] (6), appended; d1 opens [d0 d1] (12), d0 completes it. 20. Produced last, as a stage
    without MTP has it (``post_arrival`` empty: O, X, A, N, the layer, E), the copy opens when
    [e1 e2] has been queued and two buckets freed: 18."""
    stage = levers.StageWeights(((5.0, 0, True, False),), TOY.layer, (W(1), W(2), W(3, 1), W(6)), TOY.arrival,
                                (), (4, 3, 2, 0, 1))
    assert reference_stage_peak(stage, 1, 5.0, 6.0) == 20.0 == levers.stage_peak(stage, 1, 5.0, 6.0)
    assert levers._stage_peaks(stage, 1, 5.0, 6.0) == (levers.stage_peak(stage, 0, 5.0, 6.0), 20.0)
    late = stage._replace(post_arrival=())
    assert reference_stage_peak(late, 1, 5.0, 6.0) == 18.0 == levers.stage_peak(late, 1, 5.0, 6.0)


@pytest.mark.parametrize("tp,pp,ep,tied", [(8, 16, 8, False), (1, 16, 64, False), (2, 1, 64, False),
                                           (8, 16, 8, True), (1, 1, 64, True)])
def test_an_mtp_stage_holds_what_its_states_count(tp, pp, ep, tied):
    """DeepSeek-V3's last stage with one MTP layer (``moe_stage(..., mtp=1)``): every weight the
    replay holds is counted once in ``advisor.moe.stage.model_states`` (the dense part with the
    ends, the MTP layer's norms, eh_proj and, untied at PP > 1, the embedding copy; the experts),
    and ``fsdp.replayed_ends`` is the dense part beside the layers; the copy is a bucket of its own
    at PP > 1, produced after the MTP's enorm and before the decoder's final norm."""
    from advisor.moe.stage import MoEOptions, model_states

    spec = dataclasses.replace(load_model("deepseek-v3"), mtp_num_layers=1, tie_embeddings=tied)
    options = MoEOptions()
    vocab = eq.padded_vocab_size(spec.vocab_size, options.training.vocab_divisible_by, tp)
    moe, dense = (4, 0) if pp > 1 else (spec.moe_layers, spec.first_dense_layers)
    stage = pp - 1
    states = model_states(spec, options, tp, 1, pp, ep, 1, 2048 // (tp * pp), stage, dense, moe, 1)
    ends = levers.stage_ends(spec, tp, pp, stage, vocab)
    weights = fsdp_replay.moe_stage(spec, tp, ep, 1, dense, float(ends.matrix), int(ends.position), mtp=1)
    total = sum(w[0] for w in weights.pre + weights.post) + moe * sum(w[0] for w in weights.layer)
    assert total == pytest.approx(float(states.dense_parameters + states.expert_parameters), rel=1e-12)
    replayed = fsdp_replay.ReplayedStages(spec, tp, pp, ep, 1, stage, vocab, moe, 1)
    held = dense * params.dense_layer_parameters(spec, tp) + (moe + 1) * params.moe_layer_dense_parameters(spec, tp)
    assert float(fsdp.replayed_ends(replayed)) + held == pytest.approx(float(states.dense_parameters), rel=1e-12)
    if pp > 1:
        assert weights.pre[0] == (float(ends.matrix), 0, True, tied)
        order = weights.post_order()
        assert order[-2:] == [0, len(weights.pre)]  # the copy, then the final norm


def test_stages_alike_replay_once_and_as_their_own():
    """``queued_elements`` sets a middle stage's vocabulary and the EP and ETP of a stage of no MoE
    layers alike (they move nothing) and keeps each distinct stage's replay: every layout's value
    is still ``stage_peak`` of its own ``moe_stage``, ends, experts and all."""
    spec = load_model("deepseek-v3")
    options = MemoryOptions(fsdp_strategy="optim_grads", overlap_grad_reduce=True, fsdp_budget_from_units=True)
    tp, ep, etp = np.array([1, 1, 2, 2, 1, 1]), np.array([8, 64, 8, 8, 8, 64]), np.array([1, 1, 1, 2, 1, 1])
    pp, stage = np.array([4, 4, 8, 8, 4, 4]), np.array([1, 2, 3, 0, 0, 3])
    vocab, moe = np.array([129280, 131072, 129280, 129280, 129280, 129280]), np.array([15, 15, 0, 0, 0, 0])
    dense = np.where(stage == 0, 3, 0)
    stages = fsdp_replay.ReplayedStages(spec, tp, pp, ep, etp, stage, vocab, moe, np.zeros(6))
    values = fsdp_replay.queued_elements(options, stages, dense, 256, 1e9)
    for j in range(6):
        position = (levers.FIRST if stage[j] == 0 else 0) + (levers.LAST if stage[j] == pp[j] - 1 else 0)
        own = fsdp_replay.moe_stage(spec, int(tp[j]), int(ep[j]), int(etp[j]), int(dense[j]),
                                    spec.hidden_size * float(vocab[j]) / tp[j], position)
        assert values[j] == levers.stage_peak(own, int(moe[j]), float(levers.ddp_bucket_size(256)), 1e9), j
