"""The estimator against hand calculations (seed 004, Eq. 3, 10, 17) and the cited extensions."""

import math

import pytest

from advisor.equations import model_parameters
from advisor.errors import AdvisorError
from advisor.memory import GIB, MemoryOptions, estimate_memory, in_flight_microbatches
from advisor.models import PRESETS, with_overrides
from advisor.parallel import ParallelConfig, Workload

L8B = PRESETS["llama3.1-8b"]
S = 8192

# Llama-3.1-8B on TP 2, worked by hand (h 4096, a 32, k 8, h_ffn 14336, L 32, v 128256):
#   embedding + LM head 2hv/t       = 2 * 4096 * 128256 / 2          =   525,336,576
#   final norm h                                                     =         4,096
#   per layer: 2h^2(1 + k/a)/t      = 2 * 4096^2 * 1.25 / 2          =    20,971,520
#              3 h h_ffn / t        = 3 * 4096 * 14336 / 2           =    88,080,384
#              2h (norms)                                            =         8,192
#   32 layers                       = 32 * 109,060,096               = 3,489,923,072
PARAMS_TP2 = 525_336_576 + 4_096 + 3_489_923_072  # = 4,015,263,744
# Activations, Eq. 17 with p = 1: sbh/t ((12 + 4k/a + 8h_ffn/h) L + 8 + 4(1 + v/h))
#   sbh/t = 8192 * 4096 / 2 = 16,777,216;  (12 + 1 + 28) * 32 + 8 + 4 * 32.3125 = 1449.25
SBH_T2 = 16_777_216
ACTIVATIONS_TP2 = SBH_T2 * 1449.25


def tp2_dp2(**options):
    return estimate_memory(L8B, ParallelConfig(tp=2, dp=2), Workload(seq_len=S), MemoryOptions(**options))


def test_public_code_test_case():
    """okoge-kaz/Megatron-LM v0.9.0-abci: 44.87 GiB model states, 22.64 GiB activations."""
    result = tp2_dp2()
    assert round(result.model_states_gib, 2) == 44.87
    assert round(result.activations_gib, 2) == 22.64
    (stage,) = result.stages
    assert stage.parameters == PARAMS_TP2
    assert stage.model_states_bytes == PARAMS_TP2 * (6 + 12 / 2)  # Eq. 10, d = 2, c = 1
    assert stage.activations_bytes == ACTIVATIONS_TP2


def test_no_distributed_optimizer_keeps_all_18_bytes():
    """Eq. 4 / Megatron's theoretical_memory_usage.py: 18 bytes per parameter unsharded."""
    assert tp2_dp2(distributed_optimizer=False).peak.model_states_bytes == 18 * PARAMS_TP2


def test_bf16_gradients_take_2_bytes():
    """okoge-kaz fork: 2 + 2 + 12/(dc) bytes without FP32 gradient accumulation."""
    stage = tp2_dp2(gradient_bytes=2).peak
    assert stage.gradients_bytes == 2 * PARAMS_TP2
    assert stage.model_states_bytes == PARAMS_TP2 * (2 + 2 + 12 / 2)


def test_without_flash_attention_the_softmax_output_is_kept_and_selective_removes_it():
    """Korthikanti et al.: softmax output 2as^2b per layer (Llama: no dropout), and the copies of K
    and V expanded to every head that unfused attention saves (equations.expanded_kv_bytes);
    selective recomputation of core attention removes both, which FlashAttention already does."""
    scores = 32 * 2 * 32 * S * S / 2  # L layers * 2 a s^2 b / t  = 64 GiB
    assert scores == 64 * GIB
    # and K and V expanded from k = 8 to a = 32 heads of d = 128: L layers * 4 s b (a - k) d / t = 1.5 GiB
    expanded = 32 * 4 * S * 24 * 128 / 2
    assert expanded == 1.5 * GIB
    assert tp2_dp2(flash_attention=False).peak.activations_bytes == ACTIVATIONS_TP2 + scores + expanded
    assert tp2_dp2(flash_attention=False, recompute="selective").peak.activations_bytes == ACTIVATIONS_TP2
    assert tp2_dp2(recompute="selective").peak.activations_bytes == ACTIVATIONS_TP2


def test_without_sequence_parallelism_tp_leaves_8sbh_per_layer_whole():
    """Korthikanti et al. 2023, Sec. 4.2.2: TP alone splits the attention and MLP internals, not
    the norm inputs and the inputs of the QKV and first FFN projections (8sbh)."""
    sbh = 8192 * 4096
    per_layer = (41 - 8) / 2 + 8  # (Eq. 12 - 8) / t + 8, in units of sbh
    logits = 4 * 8192 * 128256 / 2  # split over the vocabulary-parallel LM head
    expected = sbh * (32 * per_layer + 8 + 4) + logits  # embedding 8sbh and LM-head inputs 4sbh whole
    assert tp2_dp2(sequence_parallel=False).peak.activations_bytes == expected
    assert tp2_dp2(sequence_parallel=False).peak.model_states_bytes == tp2_dp2().peak.model_states_bytes


def test_context_parallel_without_flash_attention_is_rejected():
    with pytest.raises(AdvisorError):
        estimate_memory(L8B, ParallelConfig(cp=2), Workload(seq_len=S), MemoryOptions(flash_attention=False))


@pytest.mark.parametrize(
    "method,n,stored_layers_of_full,checkpoints,rebuilt",
    [
        # rebuilt: during its backward pass a recomputed unit is rebuilt for one microbatch (its
        # input is the checkpoint itself, so one checkpoint less), after the units above it
        # have freed their checkpoints
        ("uniform", 1, 0, 32, (1, -1)),  # every layer checkpointed: Korthikanti Table 2, 2sbhL
        ("uniform", 4, 0, 8, (4, -1)),  # ceil(32 / 4) chunk inputs; the last unit rebuilds 4 layers
        ("uniform", 5, 0, 7, (5, -2)),  # ceil(32 / 5); the last unit has 2 layers, the one before 5
        ("block", 8, 24, 8, (0, 0)),  # the first 8 layers checkpointed, 24 kept whole (freed first)
        ("block", 40, 0, 32, (1, -1)),  # capped at the layers on the stage; the last one is rebuilt first
    ],
)
def test_full_recomputation(method, n, stored_layers_of_full, checkpoints, rebuilt):
    layer_full = SBH_T2 * 41  # Eq. 12 / t: sbh(12 + 1 + 28) / t
    checkpoint = 2 * SBH_T2  # 2sbh / t
    head_and_embedding = SBH_T2 * (8 + 4 * 32.3125)
    stage = tp2_dp2(recompute="full", recompute_method=method, recompute_num_layers=n).peak
    transient = rebuilt[0] * layer_full + rebuilt[1] * checkpoint
    assert stage.activations_bytes == (stored_layers_of_full * layer_full + checkpoints * checkpoint + transient
                                       + head_and_embedding)


def test_interleaving_matches_megatrons_penalty_on_the_first_stage():
    """Megatron-LM theoretical_memory_usage.py: first stage x (1 + (p - 1)/(p v))."""
    plain = estimate_memory(L8B, ParallelConfig(tp=2, pp=4, dp=1), Workload(seq_len=S))
    interleaved = estimate_memory(L8B, ParallelConfig(tp=2, pp=4, dp=1, vpp=2), Workload(seq_len=S))
    penalty = 1 + 3 / 8
    first, first_v = plain.stages[0], interleaved.stages[0]
    assert first_v.layer_activations_bytes == pytest.approx(first.layer_activations_bytes * penalty, rel=1e-12)
    # The embedding lives in the first chunk only: warm-up runs chunk 0 on microbatches 0-3, chunk 1
    # on 0-3, then chunk 0 on 4-6 (2(p - 1) + (v - 1)p + 1 = 11 forward passes), so 7 = 2p - 1 of
    # them, not 11 / v = 5.5 (the penalty that upstream's formula applies to it as well).
    assert first_v.embedding_activations_bytes == first.embedding_activations_bytes * 7 / 4
    assert first_v.model_states_bytes == first.model_states_bytes
    # The last stage warms up (v - 1) p = 4 chunks plus one: 5 chunks of 1/2 stage each.
    assert interleaved.stages[3].in_flight_microbatches == 2.5
    assert plain.stages[3].in_flight_microbatches == 1


def test_fewer_microbatches_than_stages_scales_activations_by_m_over_p():
    """Megatron-LM theoretical_memory_usage.py: activations x min(1, m/p) without interleaving."""
    parallel = ParallelConfig(tp=2, pp=8, dp=1)
    full = estimate_memory(L8B, parallel, Workload(seq_len=S, global_batch_size=1024)).stages[0]
    starved = estimate_memory(L8B, parallel, Workload(seq_len=S, global_batch_size=4)).stages[0]
    assert starved.in_flight_microbatches == 4 and full.in_flight_microbatches == 8
    assert starved.layer_activations_bytes == full.layer_activations_bytes * 4 / 8
    assert starved.embedding_activations_bytes == full.embedding_activations_bytes * 4 / 8


def test_vocab_padding_follows_megatron():
    """make-vocab-size-divisible-by 128 with t = 8: multiple of 1024, 128256 -> 126 * 1024."""
    padded = 126 * 1024
    assert padded == 129024
    parallel = ParallelConfig(tp=8, pp=2, dp=1)
    plain = estimate_memory(L8B, parallel, Workload(seq_len=S)).stages
    padded_run = estimate_memory(L8B, parallel, Workload(seq_len=S), MemoryOptions(vocab_divisible_by=128)).stages
    extra_rows = (padded - 128256) * 4096 / 8
    assert padded_run[0].parameters - plain[0].parameters == extra_rows
    assert padded_run[1].parameters - plain[1].parameters == extra_rows
    # the FP32 logits of Eq. 14 are over the padded vocabulary too: 4sb(v' - v) / t
    assert padded_run[1].output_activations_bytes - plain[1].output_activations_bytes == 4 * S * (padded - 128256) / 8


def test_tied_embeddings_hold_one_matrix_on_a_single_stage_and_a_copy_with_pipelining():
    tied = PRESETS["llama3.2-1b"]
    untied = with_overrides(tied, tie_embeddings=False)
    hv = 2048 * 128256
    single = [estimate_memory(spec, ParallelConfig(), Workload(seq_len=S)).stages[0] for spec in (tied, untied)]
    assert single[1].parameters - single[0].parameters == hv
    piped = [estimate_memory(spec, ParallelConfig(pp=2), Workload(seq_len=S)).stages for spec in (tied, untied)]
    assert [s.parameters for s in piped[0]] == [s.parameters for s in piped[1]]


def test_uneven_layers_per_stage():
    """Each layer moved between stages moves its states and its activations times the stage's
    microbatches in flight (4, 3, 2, 1 at PP 4), by hand at TP 1, DP 1: 218,112,000 parameters
    a layer (Eq. 6) x 18 bytes (Eq. 10, d = 1) = 3,926,016,000; Eq. 12, sbh (12 + 1 + 28) =
    8192 x 4096 x 41 = 1,375,731,712 bytes a microbatch."""
    result = estimate_memory(L8B, ParallelConfig(pp=4), Workload(seq_len=S), layers_per_stage=(6, 9, 9, 8))
    assert [stage.layers for stage in result.stages] == [6, 9, 9, 8]
    even = estimate_memory(L8B, ParallelConfig(pp=4), Workload(seq_len=S))
    states, layer = 218_112_000 * 18, 8192 * 4096 * 41
    moved = [even_stage.total_bytes - stage.total_bytes for even_stage, stage in zip(even.stages, result.stages)]
    # two layers fewer on stage 0 (4 in flight), one more on stages 1 (3) and 2 (2), stage 3 as even
    assert moved == [2 * (states + 4 * layer), -(states + 3 * layer), -(states + 2 * layer), 0]


@pytest.mark.parametrize(
    "parallel,workload,layers,message",
    [
        (ParallelConfig(tp=3), Workload(), None, "TP 3 must divide"),
        (ParallelConfig(cp=3), Workload(seq_len=8192), None, "divisible by 2 x CP"),
        (ParallelConfig(pp=3), Workload(), None, "cannot be split evenly over PP 3"),
        (ParallelConfig(pp=4, vpp=3), Workload(), None, "x 3 virtual stages"),
        (ParallelConfig(vpp=2), Workload(), None, "need PP > 1"),
        (ParallelConfig(dp=3), Workload(global_batch_size=1024), None, "not divisible"),
        (ParallelConfig(pp=2), Workload(), (10, 10), "sum to 32"),
        (ParallelConfig(pp=2), Workload(), (32,), "--layers-per-stage lists 1 stage, but PP is 2"),
        (ParallelConfig(tp=8), Workload(seq_len=8196), None, "divisible by TP 8"),
    ],
)
def test_impossible_layouts_are_refused(parallel, workload, layers, message):
    with pytest.raises(AdvisorError, match=message):
        estimate_memory(L8B, parallel, workload, layers_per_stage=layers)


def test_in_flight_microbatches_under_1f1b():
    assert [in_flight_microbatches(i, 4) for i in range(4)] == [4, 3, 2, 1]
    assert in_flight_microbatches(0, 4, num_microbatches=2) == 2
    assert math.isclose(in_flight_microbatches(0, 4, vpp=2), 4 * (1 + 3 / 8))


def test_parameters_of_a_tied_model_count_the_embedding_once():
    tied = PRESETS["llama3.2-1b"]
    assert model_parameters(with_overrides(tied, tie_embeddings=False)) - model_parameters(tied) == 2048 * 128256


def test_element_size_scales_weights_and_activations_but_not_logits_or_token_ids():
    """An FP32 run (element_bytes 4) doubles the BF16 weights and every BF16 activation of
    Eq. 12-14 (2sbh per layer checkpoint, the LM head's 4sbh inputs), and leaves what no dtype
    changes: FP32 gradients and Adam states, the 4sbv FP32 logits, Eq. 13's int64 input."""
    spec = PRESETS["llama3.1-8b"]
    parallel = ParallelConfig(tp=2, cp=1, pp=2, mbs=1, dp=1)
    workload = Workload(seq_len=4096, global_batch_size=4)
    bf16, fp32 = (estimate_memory(spec, parallel, workload, MemoryOptions(element_bytes=n)) for n in (2, 4))
    s, b, h, t = 4096, 1, spec.hidden_size, 2
    for low, high in zip(bf16.stages, fp32.stages):
        assert high.weights_bytes == 2 * low.weights_bytes
        assert (high.gradients_bytes, high.optimizer_bytes) == (low.gradients_bytes, low.optimizer_bytes)
        assert high.layer_activations_bytes == 2 * low.layer_activations_bytes
        assert high.embedding_activations_bytes == low.embedding_activations_bytes
    # Last stage: the hidden inputs (4sbh, split over TP with SP) double, the logits do not.
    extra = fp32.stages[-1].output_activations_bytes - bf16.stages[-1].output_activations_bytes
    assert extra == 4 * s * b * h / t
    with pytest.raises(AdvisorError, match="element_bytes"):
        MemoryOptions(element_bytes=1)


def test_the_local_attention_keeps_megatron_cores_global_memory_buffer_once_per_stage():
    """--transformer-impl local (``fused_norms`` False): megatron-core's DotProductAttention takes the
    input of its score product, [b a/t, s, s] BF16, from the process's global memory buffer, which
    it keeps (equations.local_attention_buffer_bytes). By hand, Llama-3.1-8B (a 32, h 4096):
    - b 2, s 4096, t 1 (the H200 runs): 2 x 2 x 32 x 4096^2 = 2,147,483,648 bytes, 2 GiB;
    - t 2 halves the heads: 1 GiB;
    - with SP at t 2 the linear layers' all-gather asks the same buffer for [s, b, h]: at s 128, b 1
      the scores' 2 x 16 x 128^2 = 524,288 and the gathered input's 2 x 128 x 4096 = 1,048,576,
      the larger is kept; at t 1 nothing is gathered.
    Per stage: once on a stage with decoder layers, whatever their number or the microbatches in
    flight or the recomputation, none on a stage without; FP32 (4-byte) activations double it;
    Transformer Engine's spec (its unfused backend allocates the input per call) keeps none."""
    from advisor import equations as eq

    assert eq.local_attention_buffer_bytes(L8B, 4096, 2, 1) == 2 * 2 * 32 * 4096**2 == 2_147_483_648 == 2 * GIB
    assert eq.local_attention_buffer_bytes(L8B, 4096, 2, 2) == GIB
    assert eq.local_attention_buffer_bytes(L8B, 128, 1, 2) == 2 * 16 * 128**2 == 524_288
    assert eq.local_attention_buffer_bytes(L8B, 128, 1, 2, sequence_parallel=True) == 2 * 128 * 4096 == 1_048_576
    assert eq.local_attention_buffer_bytes(L8B, 128, 1, 1, sequence_parallel=True) == 2 * 32 * 128**2 == 1_048_576

    spec = with_overrides(L8B, num_layers=4)
    workload = Workload(seq_len=4096, global_batch_size=8)
    unfused = dict(flash_attention=False, sequence_parallel=False)

    def stage_totals(layers, **options):
        estimate = estimate_memory(spec, ParallelConfig(pp=2, mbs=2), workload, MemoryOptions(**unfused, **options),
                                   layers)
        return [stage.total_bytes for stage in estimate.stages]

    for layers in ((3, 1), (4, 0)):
        te, local = stage_totals(layers), stage_totals(layers, fused_norms=False)
        assert [a - b for a, b in zip(local, te)] == [2 * GIB if n else 0 for n in layers]
    te, local = stage_totals((2, 2), element_bytes=4), stage_totals((2, 2), element_bytes=4, fused_norms=False)
    assert [a - b for a, b in zip(local, te)] == [4 * GIB, 4 * GIB]
    for recompute in ({"recompute": "full"}, {"recompute": "selective"}):
        te, local = stage_totals((2, 2), **recompute), stage_totals((2, 2), fused_norms=False, **recompute)
        assert [a - b for a, b in zip(local, te)] == [2 * GIB, 2 * GIB]
