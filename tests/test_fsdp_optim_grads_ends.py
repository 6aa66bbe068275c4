"""Megatron-FSDP optim_grads: the first stage's embedding and the last stage's final norm and
output layer in the bucket cut and the reduce-scatter queue (``memory_levers.stage_ends``,
``QueueReplay``'s ``ends``), by hand.

megatron-core's ``_get_parameter_groups`` (core_v0.19.0 megatron_fsdp/param_and_grad_buffer.py
1769-1870; core_v0.15.2 :1239-1384) puts every parameter of the model chunk in one group per
(dtype, expert, requires_grad, FSDP unit: None under optim_grads) in ``named_parameters`` order:
GPTModel's embedding.word_embeddings.weight, decoder.layers.*, decoder.final_layernorm.weight,
output_layer.weight; all BF16 here, so one group, cut at the weight bringing a bucket to >= B.
Backward produces the output layer's gradient first, then the final norm's, the layers from the
last, and the embedding's last. Untied (Llama 3.1 8B) neither end has a bucket of its own
(``shared_embedding`` is set only for tied embeddings at PP > 1: language_module.py
``setup_embeddings_and_output_layer``).

Llama 3.1 8B at TP 1 (per layer in named order: input norm 4,096, proj 16,777,216, QKV
25,165,824, MLP norm 4,096, FC1 117,440,512, FC2 58,720,256: u = 218,112,000; embedding and
output layer 4096 x 128,256 = 525,336,576 each, the vocabulary a multiple of 128 already; final
norm 4,096). Gradients in FP32 (4 bytes)."""

import numpy as np
import pytest

from advisor import equations as eq
from advisor import memory_levers as levers
from advisor.memory import MemoryOptions
from advisor.models import preset

SPEC = preset("llama3.1-8b")
WEIGHTS = levers.layer_weights(SPEC, 1)
U = 218_112_000
V_H = 525_336_576  # 4096 x 128,256
A, B = 75_501_568, 142_610_432  # DP 64: FC2 + next norm + proj; QKV + norm + FC1 (below)

# DP 64, B = 64e6, Q = 1e9. The layers cut as in a middle stage: layer 0's norm, proj, QKV, norm,
# FC1 (159,391,744), then A = FC2_i + norm_{i+1} + proj_{i+1} and B = QKV + norm + FC1, layer by
# layer. Backward, per layer: FC2 completes an A, FC1 opens a B, proj opens the next A, QKV
# completes the B. Steady state (tests/test_fsdp_optim_grads_queue.py, PEAK_64): before an A's
# trim the queue is A B A B A B A B A B (1,090,560,000 > Q), trimmed to 4A + 4B = 872,448,000,
# A appended (947,949,568); the B and the next A opened: 1,166,061,568, the middle stage's peak.
MIDDLE_64 = 5 * A + 5 * B + A
# First stage (embedding + 16 layers): the embedding, >= B, is a bucket alone; layer 0's FC2
# completes the last A (queue 947,949,568), its FC1 opens its bucket of 159,391,744 (held
# 1,107,341,312), completed at its input norm (947,949,568 <= Q: no pop; appended), then the
# embedding's gradient opens its bucket: 1,107,341,312 + 525,336,576 = 1,632,677,888.
FIRST_64 = 5 * A + 4 * B + 159_391_744 + V_H
# Last stage (16 layers + final norm + output): FC2_15 (58,720,256) + norm (4,096) < B, + the
# output layer: one bucket of 584,060,928, opened first (the output layer's backward) and
# completed at FC2_15. Then: FC1_15 opens B (726,671,360), proj_15 opens A (802,172,928), QKV_15
# completes B (584,060,928 <= Q: appended), FC2_14 completes A (726,671,360: appended), layer 14
# opens B and A (1,020,282,880), appends both (no pop: 802,172,928 and 944,783,360 <= Q), layer 13
# opens B and A: 584,060,928 + 3 B + 3 A = 1,238,396,928, the peak; QKV_13's completion pops the
# output's bucket (1,020,282,880 > Q), and the steady state's 1,166,061,568 is below it.
LAST_64 = 584_060_928 + 3 * B + 3 * A
# DP 2048, B = Q = 2.048e9. PP 1: bucket 0 = embedding + layers 0-6 (525,336,576 + 6 u + layer 6
# up to FC1 = 1,993,400,320 < B, + FC2_6) = 2,052,120,576; bucket 1 = layers 7-15 + layer 16 up to
# FC1 = 2,122,399,744; bucket 2 = FC2_16 + layers 17-25 + norm_26 + proj_26 (2,038,509,568) + QKV_26
# = 2,063,675,392; bucket 3 = the rest: norm_26 + FC1_26 + FC2_26 + layers 27-31 + final norm +
# output = 176,164,864 + 1,090,560,000 + 4,096 + 525,336,576 = 1,792,065,536. Backward: the output
# opens bucket 3; MLP norm_26 completes it (appended); proj_26 opens bucket 2 (3,855,740,928);
# FC2_16 completes it (1,792,065,536 <= Q: appended); FC1_16 opens bucket 1: 5,978,140,672, the
# peak; its completion (norm_7) pops buckets 3 and 2, and the embedding's bucket 0 opens on bucket
# 1 alone (4,174,520,320).
PP1_2048 = 1_792_065_536 + 2_063_675_392 + 2_122_399_744
# PP 2, first stage: bucket 0 as above, bucket 1 = layers 7-15 (1,963,008,000, the stage's end);
# FC2_15 opens bucket 1, norm_7 completes it, FC2_6 opens bucket 0: 4,015,128,576.
FIRST_2048 = 9 * U + 2_052_120_576
# PP 2, last stage: bucket 0 = layers 0-8 + layer 9 up to FC1 = 2,122,399,744; bucket 1 = FC2_9 +
# layers 10-15 + final norm + output = 58,720,256 + 1,308,672,000 + 4,096 + 525,336,576 =
# 1,892,732,928, opened by the output layer, completed at FC2_9 (appended); FC1_9 opens bucket 0:
# 4,015,132,672.
LAST_2048 = 1_892_732_928 + 2_122_399_744


def replay(pp, stage, dp):
    options = MemoryOptions(fsdp_strategy="optim_grads", overlap_grad_reduce=True, fsdp_budget_from_units=True)
    vocab = eq.padded_vocab_size(SPEC.vocab_size, options.vocab_divisible_by, 1)
    _, queue = levers.fsdp_communication_unit(options, U, 1, dp)
    ends = levers.stage_ends(SPEC, 1, pp, stage, vocab)
    return levers.QueueReplay(WEIGHTS, levers.fsdp_bucket_size(options, dp), queue, ends)


def sizes(spec, pp, stage):
    return tuple(x.item() for x in levers.end_sizes(*levers.stage_ends(spec, 1, pp, stage, 128_256)))


def test_the_ends_by_hand():
    assert sizes(SPEC, 2, 0) == (V_H, 0.0, 0.0, 0) and sizes(SPEC, 2, 1) == (0.0, 4096.0, V_H, 0)
    assert sizes(SPEC, 1, 0) == (V_H, 4096.0, V_H, 0) and sizes(SPEC, 4, 2) == (0.0, 0.0, 0.0, 0)
    assert A + B == U and MIDDLE_64 == 1_166_061_568
    assert (FIRST_64, LAST_64) == (1_632_677_888, 1_238_396_928)
    assert (PP1_2048, FIRST_2048, LAST_2048) == (5_978_140_672, 4_015_128_576, 4_015_132_672)


@pytest.mark.parametrize("pp, stage, dp, layers, peak", [
    (1, 0, 64, 32, FIRST_64),  # the first stage's end (its last events) is the larger
    (2, 0, 64, 16, FIRST_64), (2, 1, 64, 16, LAST_64),
    (1, 0, 2048, 32, PP1_2048), (2, 0, 2048, 16, FIRST_2048), (2, 1, 2048, 16, LAST_2048)])
def test_llama31_8b_stage_peaks(pp, stage, dp, layers, peak):
    assert float(replay(pp, stage, dp).peak(layers)) == peak
    middle = levers.QueueReplay(WEIGHTS, levers.ddp_bucket_size(dp), 1e9 if dp == 64 else 2.048e9)
    if dp == 64:  # a middle stage of as many layers holds less
        assert float(middle.peak(layers)) == MIDDLE_64 < peak


def test_a_first_stage_of_no_layers_holds_its_embedding():
    assert float(replay(2, 0, 64).peak(0)) == V_H
    assert float(replay(2, 1, 64).peak(0)) == V_H + 4096  # norm and output: one bucket


def test_tied_embeddings_take_buckets_of_their_own_at_pp_2():
    """Llama 3.2 1B ties its embeddings: at PP > 1 both copies are ``shared_embedding``, each a
    bucket alone (``_does_param_require_new_bucket``), the last stage's closing the open bucket
    before it; at PP 1 the one weight is touched first (the output layer) and completes last."""
    spec = preset("llama3.2-1b")
    matrix = spec.hidden_size * 128_256
    assert spec.tie_embeddings
    assert sizes(spec, 2, 1) == (0.0, spec.hidden_size, matrix, levers.TIES["own"])
    assert sizes(spec, 2, 0) == (matrix, 0.0, 0.0, levers.TIES["own"])
    assert sizes(spec, 1, 0) == (matrix, spec.hidden_size, 0.0, levers.TIES["early"])
    # PP 1, no overlap (one bucket): everything in one bucket, held whole
    weights = levers.layer_weights(spec, 1)
    whole = levers.QueueReplay(weights, np.inf, 1e9, levers.stage_ends(spec, 1, 1, 0, 128_256)).peak(spec.num_layers)
    assert float(whole) == spec.num_layers * sum(weights) + spec.hidden_size + matrix


def test_an_own_output_bucket_by_hand():
    """Two layers of one weight 4, final norm 1, output 10; B = 8, Q = 0.
    Plain: cut [4 4] (closed at 8), [1 10]. Backward: the output opens [1 10] (11), the norm
    completes it (appended), layer 1 opens [4 4] (19, the peak), layer 0 completes it (pops [1 10]).
    Own output (``shared_embedding``): [4 4], then the norm's [1], closed by the output, [10].
    The output opens and completes [10] (10, appended), the norm opens [1] (11, the peak) and
    completes it (pops [10]: 1), layer 1 opens [4 4] (9), layer 0 completes it."""
    layer = ((4.0, 0, False, False),)
    plain = levers.StageWeights((), layer, ((1.0, 0, False, False), (10.0, 0, False, False)), (0,))
    own = levers.StageWeights((), layer, ((1.0, 0, False, False), (10.0, 0, True, False)), (0,))
    assert levers._stage_peaks(plain, 2, 8.0, 0.0)[2] == 19.0
    assert levers._stage_peaks(own, 2, 8.0, 0.0)[2] == 11.0


def test_an_arrival_order_must_cover_the_layer():
    """``StageWeights.arrival`` defaults to a dense layer's six weights: another layer must give its own."""
    with pytest.raises(ValueError, match="not an order of the layer's 1 weights"):
        levers._stage_peaks(levers.StageWeights((), ((4.0, 0, False, False),), ()), 2, 8.0, 0.0)
