"""Per-layer MoE memory terms (advisor.moe.memory, advisor.moe.transient) against hand-derived values."""

import dataclasses
import math

import pytest

from advisor.moe import memory as mm
from advisor.moe import transient as tr
from advisor.moe.spec import PRESETS

MIXTRAL = PRESETS["mixtral-8x7b"]
DSV3 = PRESETS["deepseek-v3"]


def test_model_states_shard_experts_over_expert_dp_and_the_rest_over_dp_cp():
    """Three MoE layers of Mixtral on a middle stage, TP 2, EP 4, ETP 2, DP 32 (so the expert DP
    group is 2 x 32 / (2 x 4) = 8 ranks), by hand: 8 experts of 3 x 4096 x 14336 over EP 4, ETP 2
    (2 experts, half of each, per GPU) at 2 + 4 bytes plus Adam's 12 over 8; the rest of each layer
    (attention 4096 x (4096 + 2 x 1024 + 4096) over TP 2, two norms and the router 8 x 4096 whole)
    at 2 + 4 plus 12 over DP x CP = 32. By kind, the same bytes split as weights, gradients and
    optimizer."""
    from advisor.moe.stage import MoEOptions, model_states

    local = 3 * 2 * 3 * 4096 * 14336 / 2
    rest = 3 * (4096 * 10240 / 2 + 2 * 4096 + 8 * 4096)
    states = model_states(MIXTRAL, MoEOptions(), tp=2, cp=1, pp=3, ep=4, etp=2, dp=32, stage=1, dense=0,
                          moe_layers=3, mtp=0)
    assert states.experts == pytest.approx(local * (2 + 4 + 12 / 8), rel=1e-12)
    assert states.dense == pytest.approx(rest * (2 + 4 + 12 / 32), rel=1e-12)
    assert (states.weights, states.gradients, states.optimizer) == pytest.approx(
        ((local + rest) * 2, (local + rest) * 4, local * 12 / 8 + rest * 12 / 32), rel=1e-12)
    assert states.fp8_weights == 0


def test_deepseek_v3_model_states_at_tp_4_keep_mlas_down_projections_whole():
    """Three MoE layers of DeepSeek-V3 on a middle stage, TP 4, EP 8, ETP 1, DP 16 (expert DP
    4 x 16 / 8 = 8), by hand from megatron-core core_v0.15.2: MLASelfAttention.__init__
    (transformer/multi_latent_attention.py) builds the down projections as TELinear with
    parallel_mode 'duplicated' (gpt_layer_specs.py: backend.linear()), so h x q_lora and
    h x (kv_lora + d_rope) are whole on every TP rank, as are the q and kv latent norms fused
    into the up projections' LayerNormColumnParallelLinear (weights of q_lora and kv_lora); the
    up projections and linear_proj are column/row parallel: over t. The shared expert is an MLP
    (transformer/moe/shared_experts.py, SharedExpertMLP): 3 h f_shared over t. The router's
    E x h gate and the two RMSNorms (2h) are whole.
      duplicated: 7168 x 1536 + 7168 x (512 + 64) + (1536 + 512)     =  15,140,864
      split:      1536 x 128 x (128 + 64) + 512 x 128 x (128 + 128)
                  + 128 x 128 x 7168 = 171,966,464, over 4             =  42,991,616
      norms 2 x 7168 + router 256 x 7168 + shared 3 x 7168 x 2048 / 4 =  12,859,392
      a layer's dense part                                           =  70,991,872
      routed: 256 / 8 = 32 experts of 3 x 7168 x 2048 = 1,409,286,144 a layer
    A mutant that splits the duplicated projections over t, or leaves the shared expert whole,
    changes the dense bytes by over 1%."""
    from advisor.moe.stage import MoEOptions, model_states

    h = 7168
    duplicated = h * 1536 + h * (512 + 64) + (1536 + 512)
    split = 1536 * 128 * (128 + 64) + 512 * 128 * (128 + 128) + 128 * 128 * h
    rest = 3 * (duplicated + split / 4 + 2 * h + 256 * h + 3 * h * 2048 / 4)
    assert rest == 3 * 70_991_872
    local = 3 * 32 * 3 * h * 2048
    states = model_states(DSV3, MoEOptions(), tp=4, cp=1, pp=4, ep=8, etp=1, dp=16, stage=1, dense=0,
                          moe_layers=3, mtp=0)
    assert states.dense == pytest.approx(rest * (2 + 4 + 12 / 16), rel=1e-12)
    assert states.experts == pytest.approx(local * (2 + 4 + 12 / 8), rel=1e-12)


def test_deepseek_v3_shared_expert_activations_split_over_tp_and_cp_by_hand():
    """The shared expert is an MLP under TP (core_v0.15.2 transformer/moe/shared_experts.py,
    SharedExpertMLP; mlp.py): with sequence parallelism FC1 (column parallel) sees the gathered
    s b / c tokens of this CP rank and writes 2 f_s / t columns, which the fused SwiGLU keeps as its
    input (fusions/fused_bias_swiglu.py), and FC2 (row parallel) keeps its f_s / t wide input: 2
    bytes each, 6 s b f_s / (t c). DeepSeek-V3 (f_s 2048), s 4096, b 1, TP 2, CP 2:
    6 x 4096 x 2048 / 4 = 12,582,912 bytes, what --recompute-modules shared_experts frees from the
    layer. (test_moe_layer_profile checks the 6 f_s per token at TP 1 against the measured layer;
    this checks the split, which a mutant dropping t passed.)"""
    shared = 6 * 4096 * 2048 / (2 * 2)
    assert shared == 12_582_912
    assert mm.shared_expert_activation_bytes(DSV3, 4096, 1, 2, 2) == shared
    kept = mm.moe_layer_activation_bytes(DSV3, 4096, 1, 2, 2, 8, 1)
    recomputed = mm.moe_layer_activation_bytes(DSV3, 4096, 1, 2, 2, 8, 1,
                                               recompute_modules=frozenset({"shared_experts"}))
    assert kept - recomputed == pytest.approx(shared, rel=1e-12)


def test_the_estimates_stages_split_their_states_by_kind_as_dense_estimates_do():
    """weights_gib + gradients_gib + optimizer_gib + fp8_weights_gib is each stage's model_states_gib
    (the dense estimate's keys), FP8 and MTP included."""
    import json

    from click.testing import CliRunner

    from advisor.cli import cli

    result = CliRunner().invoke(cli, ["estimate", "--model", "deepseek-v3", "--gpus", "256", "--pp", "4", "--ep", "8",
                                      "--mtp-num-layers", "1", "--fp8-format", "hybrid", "--gpu", "h100-80gb",
                                      "--format", "json"])
    assert result.exit_code == 0, result.output
    for stage in json.loads(result.stdout)["stages"]:
        kinds = stage["weights_gib"] + stage["gradients_gib"] + stage["optimizer_gib"] + stage["fp8_weights_gib"]
        assert kinds == pytest.approx(stage["model_states_gib"], rel=1e-12)
        assert stage["gradients_gib"] == pytest.approx(2 * stage["weights_gib"], rel=1e-12)  # FP32 main grads


def test_routed_token_copies_per_assumption():
    n = mm.tokens_per_rank(4096, 2, tp=2, cp=2)  # 4096 x 2 / 4 = 2048
    assert n == 2048
    assert mm.expert_token_copies(MIXTRAL, n, 4, 1, mm.RoutedTokens()) == 2048 * 2
    assert mm.expert_token_copies(MIXTRAL, n, 4, 2, mm.RoutedTokens(routing="capacity", capacity_factor=1.5)) \
        == 1.5 * 2048 * 2 * 2
    # capacity, by hand from get_capacity (moe_utils.py): each source rank's N = 2048 tokens give
    # every expert C = ceil(N k f / E) = ceil(2048 x 2 x f / 8) slots against a balanced share of
    # 2048 x 2 / 8 = 512 copies; this rank's 8/4 = 2 experts hear from ep x etp = 8 source ranks
    share, local, sources = 512, 2, 4 * 2
    for f, capacity in ((1.5, 768), (0.5, 256)):
        padded = mm.RoutedTokens(routing="capacity", capacity_factor=f)
        unpadded = mm.RoutedTokens(routing="capacity", capacity_factor=f, pad_to_capacity=False)
        assert mm.expert_token_copies(MIXTRAL, n, 4, 2, padded) == local * sources * capacity
        assert mm.expert_token_copies(MIXTRAL, n, 4, 2, unpadded) == local * sources * min(share, capacity)
    # dropless worst case: every token of the 4 EP ranks sends min(k = 2, 8/4 local) copies here
    assert mm.expert_token_copies(MIXTRAL, n, 4, 1, mm.RoutedTokens(routing="dropless")) == 2048 * 4 * 2
    assert mm.expert_token_copies(MIXTRAL, n, 8, 1, mm.RoutedTokens(routing="dropless")) == 2048 * 8 * 1


def test_mixtral_layer_activations_by_hand():
    s, b = 4096, 1
    attention = 6 * s * 4096 + 4 * s * 4096 * 8 / 32 + 2 * s * 4096   # Eq. 11 + the norm input
    # the pre-MLP norm's input, rstd and output (4h + 4); top-k indices and softmax (12k = 24); the
    # aux loss's FP32 softmax over E (32, Mixtral's --moe-aux-loss-coeff 0.02)
    router = s * (2 * 2 * 4096 + 4 + 24 + 32)
    dispatch = s * 5 * 8  # the alltoall permutation's masked_select: FP32 probabilities and bool map, E each
    copies = s * 2
    experts = copies * (2 * (4096 + 3 * 14336) + 12) + dispatch
    assert mm.moe_layer_activation_bytes(MIXTRAL, s, b, 1, 1, 8, 1) == attention + router + experts
    # moe recomputed: the checkpointed block keeps its input (the pre-MLP norm's output) and the
    # norm, outside it (transformer_layer._forward_mlp), its own input: 2h per token each
    assert mm.moe_layer_activation_bytes(MIXTRAL, s, b, 1, 1, 8, 1, recompute_modules=frozenset({"moe"})) \
        == attention + 2 * s * 2 * 4096
    # with layernorm too, the norm's output is discarded, and with it the block's input
    assert mm.moe_layer_activation_bytes(MIXTRAL, s, b, 1, 1, 8, 1, recompute_modules=frozenset({"moe", "layernorm"})) \
        == attention + s * 2 * 4096
    # layernorm drops pre_mlp_layernorm's output and rstd (its forward runs under no_grad in the
    # checkpoint): with GQA, Transformer Engine fuses the input norm into the QKV projection
    # (gpt_layer_specs: input_layernorm IdentityOp), not recomputed
    assert mm.moe_layer_activation_bytes(MIXTRAL, s, b, 1, 1, 8, 1, recompute_modules=frozenset({"layernorm"})) \
        == attention + router + experts - s * (2 * 4096 + 4)
    # moe_act drops FC2's input (h_moe per copy)
    assert mm.moe_layer_activation_bytes(MIXTRAL, s, b, 1, 1, 8, 1, recompute_modules=frozenset({"moe_act"})) \
        == attention + router + experts - copies * 2 * 14336


def test_expert_activations_under_expert_tensor_parallelism_by_hand():
    """ETP 2: each copy's FC1 output, SwiGLU and FC2 input are half as wide; the all-gather over the
    expert TP group doubles the copies the experts process (with their FP32 probabilities), but
    the permutation's int64 index is made before it, once per copy this rank routes (N k)."""
    n, k, h, f = 2048, 2, 4096, 14336
    copies = mm.expert_token_copies(MIXTRAL, n, 4, 2, mm.RoutedTokens())
    assert copies == n * k * 2
    assert mm.expert_activation_bytes(MIXTRAL, copies, 2) == copies * (2 * (h + 3 * f / 2) + 4) + n * k * 8


def test_mla_attention_activations_by_hand():
    s, t = 4096, 2
    per_token_split = 2 * (2 * 7168 + 1536 + 512 + 64) / t
    # the normed latents over t too: TE's LayerNormColumnParallelLinear saves its local norm output
    # under sequence parallelism and gathers it again in the backward (ln_out_needs_gather)
    latents = 2 * (1536 + 512) / t
    heads = 2 * 128 * (2 * 192 + 128) + 2 * 128 * 128
    assert mm.attention_activation_bytes(DSV3, s, 1, t, 1) == pytest.approx(s * (per_token_split + latents + heads / t))
    up = 2 * 128 * (2 * 192 + 128)
    assert mm.attention_activation_bytes(DSV3, s, 1, t, 1, recompute_up_proj=True) == pytest.approx(
        s * (per_token_split + latents + (heads - up) / t))


def test_layernorm_recomputation_frees_mlas_own_input_norm():
    # MLA's input_layernorm is a module of its own (gpt_layer_specs, MLA branch), so layernorm
    # recomputation discards its output, the down projections' input: 2h per token, sequence
    # parallel over t; and pre_mlp_layernorm's, the router's input, as for GQA
    s, t, h = 4096, 2, 7168
    tokens = s / t
    full = mm.moe_layer_activation_bytes(DSV3, s, 1, t, 1, 8, 1)
    assert mm.moe_layer_activation_bytes(DSV3, s, 1, t, 1, 8, 1, recompute_modules=frozenset({"layernorm"})) \
        == pytest.approx(full - 2 * tokens * 2 * h - tokens * 4)  # and the pre-MLP norm's rstd
    assert mm.input_norm_recomputed_bytes(DSV3, tokens, frozenset({"layernorm"})) == tokens * 2 * h
    assert mm.input_norm_recomputed_bytes(MIXTRAL, tokens, frozenset({"layernorm"})) == 0.0


MiB = 2**20
WORKSPACE = 4 * (32 * 2**20 + 256)


def transient_mib(spec, seq_len, tp, ep, etp, dispatcher="alltoall"):
    tokens = mm.tokens_per_rank(seq_len, 1, tp, 1)
    copies = mm.expert_token_copies(spec, tokens, ep, etp, mm.RoutedTokens())
    forward, backward = tr.layer_transient_peaks(spec, tokens, copies, ep, etp, dispatcher)
    total = tr.moe_layer_transient_bytes(spec, tokens, copies, ep, etp, dispatcher)
    return float(forward) / MiB, float(backward) / MiB, float(total - WORKSPACE) / MiB


def test_transient_peaks_alltoall_deepseek_v3():
    """DeepSeek-V3 at TP 2 (N = 2048 tokens a rank, k 8, h 7168): S = N k 2h = 224 MiB, shared
    experts' output N 2h = 28 MiB, by hand from megatron-core's alltoall path.
    EP 64 (4 local experts, c = r = 16384 copies): at the unsort, S + the all-to-all's output (224)
    + the experts' output (224) + its unsorted copy (224) = 896; at the combine all-to-all 2 S + 224
    + 224 = 896; + 28 = 924. Backward: S + r 2h = 448 above c 2 2 h_moe = 16384 x 8192 = 128 MiB.
    EP 256 (1 local expert: the all-to-all's output is the kept expert input, nothing to sort):
    max(S + 224, 2 S + 224) + 28 = 700; backward 448.
    EP 64 ETP 2 (c = 32768, r = 16384): S 224 + all-to-all output 224 + experts' output c 2h 448 +
    unsorted 448 + FP32 cast c h 4 = 896 + reduce-scatter output r h 4 = 448 = 2688, + 28 = 2716;
    the combine 2 S + 224 + r 2h 224 = 896. Backward: the cast and reduce-scatter 896 + 448 = 1344
    (the combine's 448, FC1's gradient 32768 x 4 x 1024 = 128 MiB).
    In both peaks, the routing the dispatcher holds: N x 256 experts x (4 + 1) B = 2.5 MiB; in the
    forward's, the received FP32 probabilities custom_forward holds, r x 4 B = 0.0625 MiB, except at
    EP 256, where they are the one local expert's kept input probabilities."""
    assert transient_mib(DSV3, 4096, 2, 64, 1) == pytest.approx((926.5625, 450.5, 926.5625))
    assert transient_mib(DSV3, 4096, 2, 256, 1) == pytest.approx((702.5, 450.5, 702.5))
    assert transient_mib(DSV3, 4096, 2, 64, 2) == pytest.approx((2718.5625, 1346.5, 2718.5625))


def test_transient_peaks_mixtral_and_allgather():
    """Mixtral 8x7B TP 2 EP 4 ETP 2 (N 2048, k 2, h 4096, 2 local experts, c = 8192, r = 4096, no
    shared experts): S = 2048 x 2 x 8192 B = 32 MiB, all-to-all output r 2h = 32, experts' output
    c 2h = 64, unsorted 64, FP32 cast c h 4 = 128, reduce-scatter output r h 4 = 64: 384; the
    combine 2 S + 32 + 32 = 128. Backward: FC1's gradient c 2 2 h_moe / 2 = 8192 x 28672 B = 224 MiB
    above the cast's 192 and the combine's 64; with the held routing, 2048 x 8 x 5 B = 0.078125 MiB,
    and in the forward the received FP32 probabilities r x 4 B = 0.015625 MiB.
    allgather, DeepSeek-V3 EP 64 (T = 2048 x 64 = 131072 rows): the global buffer T 2h = 1792 MiB,
    the unpermuted rows T 2h 1792 and their FP32 copy T 4h 3584, the gathered FP32 probabilities
    T 256 x 4 = 128, the reduce-scatter's output 2048 x 7168 x 4 = 56, the shared output 28, the
    router's map N x 256 B = 0.5 and the local map, T x 4 local experts B = 0.5: 7381 (7380 before
    2026-11-29, the two maps unpriced). Backward: 1792 + T 6h 5376 + the local map 0.5: 7168.5."""
    assert transient_mib(MIXTRAL, 4096, 2, 4, 2) == pytest.approx((384.09375, 224.078125, 384.09375))
    assert transient_mib(DSV3, 4096, 2, 64, 1, "allgather") == pytest.approx((7381, 7168.5, 7381))


def test_alltoall_backward_moments_beyond_the_combine():
    """The alltoall backward's moments after the combine all-to-all's (S + r 2h), by hand from
    megatron-core's path (Qwen3-30B-A3B: N 4096, k 8, h 2048, h_moe 768, E 128; S = N k 2h = 128
    MiB; the held routing N E 5 = 2.5 MiB):
    dropless at EP 128 (one local expert, c = N x 128 x min(8, 1) = 524288): FC2's, the experts'
    output gradient c 2h = 2048 beside FC2's input gradient c 2 h_moe = 768: 2816, above the
    combine's 128 + 2048 and FC1's output gradient c 4 h_moe = 1536 (2178.5 priced before
    2026-11-29), and above the forward's 2 S + c 2h = 2304: the layer's transient;
    dropless at EP 8 (16 local experts, c = 262144): the unsort's, c 2h + c 2h = 2048, above FC2's
    1408 and the combine's 1152 (the forward's 3200 leads);
    balanced at EP 2 ETP 4 (c = 131072, r = 32768): the reduce-scatter's all-gathered FP32 gradient
    c 4h = 1024 beside its BF16 cast c 2h = 512 (r 4h = 256 is freed first): 1536, above 1280."""
    qwen, n, routed = PRESETS["qwen3-30b-a3b"], 4096.0, mm.RoutedTokens(routing="dropless")

    def peaks(ep, etp, assumption):
        copies = mm.expert_token_copies(qwen, n, ep, etp, assumption)
        return tuple(float(peak) / MiB for peak in tr.layer_transient_peaks(qwen, n, copies, ep, etp, "alltoall",
                                                                            assumption))

    assert peaks(128, 1, routed) == (2304 + 2.5, 2816 + 2.5)
    assert peaks(8, 1, routed)[1] == 2048 + 2.5
    assert peaks(2, 4, mm.RoutedTokens())[1] == 1536 + 2.5


def test_alltoall_capacity_routing_holds_the_probabilities_alone():
    """With capacity routing the dispatcher's routing map is the router's capacity mask, which the
    router's product with the probabilities saves (moe_utils.py apply_router_token_dropping): kept,
    so the held routing is the FP32 probabilities alone, N x E x 4. Qwen3-30B-A3B at EP 8, capacity
    1.25 padded (N 4096, k 8, 16 local experts, c = r = 1.25 N k = 40960, h 2048): the unsort's
    moment S + the all-to-all's output + the experts' output + its unsorted copy, 4 x 160 MiB, +
    the received probabilities r x 4 B 0.15625 + the probabilities N E 4 B 2 = 642.15625 MiB (the
    symbolic layer measured 642.157: the 1 KiB beside it a CPU count tensor). Dropless, the map
    too: N E 5."""
    qwen, n = PRESETS["qwen3-30b-a3b"], 4096.0
    capacity = mm.RoutedTokens(routing="capacity", capacity_factor=1.25)
    assert tr.a2a_routing_held_bytes(qwen, n, capacity) == n * 128 * 4
    assert tr.a2a_routing_held_bytes(qwen, n, mm.RoutedTokens(routing="dropless")) == n * 128 * 5
    copies = mm.expert_token_copies(qwen, n, 8, 1, capacity)
    assert copies == 40960
    forward = tr.layer_transient_peaks(qwen, n, copies, 8, 1, "alltoall", capacity)[0]
    assert float(forward) / MiB == 4 * 160 + 0.15625 + 2


def test_transient_flex_and_workspace():
    """flex keeps its unmeasured sum: DeepEP's buffers (the received copies, 2h each) plus FC1's
    gradient (2 h_moe / etp per copy): Mixtral, 2048 copies at ETP 2; with the routing DeepEP's
    manager holds (k' = etp k = 4 over 2 local experts): the top-k FP32 probabilities N k' 4, and
    of R = min(c, N ep etp) = 2048 received tokens the indices R k' 8 and the multihot probabilities
    and map R 2 (4 + 1)."""
    n, copies = 1024.0, 2048.0
    forward, backward = tr.layer_transient_peaks(MIXTRAL, n, copies, 4, 2, "flex")
    held = 1024 * 4 * 4 + 2048 * (4 * 8 + 2 * 5)
    assert forward == 2048 * 2 * 4096 + 2048 * 2 * 14336 + held
    assert tr.grouped_gemm_workspace_bytes() == WORKSPACE
    assert tr.moe_layer_transient_bytes(MIXTRAL, n, copies, 4, 2, "flex", grouped_gemm=False) == forward


def test_the_routing_each_dispatcher_holds_between_forwards_by_hand():
    """What one MoE layer's dispatcher holds from its forward to its next beyond what autograd keeps
    (megatron-core core_v0.15.2 / 0.16.1 token_dispatcher.py). Qwen3-30B-A3B, N 4096, E 128, k 8:
    alltoall, self.probs N E 4 + self.routing_map N E = 2.5 MiB (2 with capacity routing, the map
    the router's saved capacity mask); recomputed (no autograd in the forward), the map and the
    permutation's indices too, N k 8 per sent copy: 2.75, and 2.5 + 1.25 x 0.25 padded to capacity
    1.25. allgather, the local map max(T, N) E / ep bool: 0.5 at EP 1 and 2 (T = 8192 rows over 64
    local experts), 1 at EP 2 ETP 2 (T = 16384); recomputed, + c (4 + 8) for the experts'
    probabilities and the permutation's indices: 0.5 + 0.375 at EP 1; with capacity routing at EP 1
    the local map is the router's kept capacity mask, none held (recomputed, the mask and 1.25 x
    0.375), at EP 2 the gathered one, 0.5. The flex dispatcher's
    managers (unmeasured): DeepEP, DeepSeek-V3 at TP 2 EP 64 (N 2048, k' = 8 at ETP 1, 4 local
    experts): N k' 4 + R (k' 8 + 4 x 5), R the group's N ep tokens with one of their 8 random
    experts among the 4 (1 - C(252, 8) / C(256, 8) of them, 15,720; dropless the bound, every token
    of the group, N ep = 131072, below its c = N ep 4 copies);
    HybridEP, Qwen3 at EP 16, the map and probabilities N E 5 = 2.5 MiB; NCCL-EP, N k' 4 = 128 KiB;
    Mixtral at EP 4 (E 8, k 2, 2 local experts, N 4096): 1 - C(6, 2) / C(8, 2) = 13 / 28 of the
    group's 16384 tokens, 7607, under its 8192 copies (a token with both its experts there counts
    once)."""
    qwen, n = PRESETS["qwen3-30b-a3b"], 4096.0
    balanced, capacity = mm.RoutedTokens(), mm.RoutedTokens(routing="capacity", capacity_factor=1.25)

    def held(spec, tokens, ep, etp, dispatcher, assumption=balanced, recomputed=False, backend="deepep"):
        copies = mm.expert_token_copies(spec, tokens, ep, etp, assumption)
        return float(tr.dispatcher_held_bytes(spec, tokens, copies, ep, etp, dispatcher, assumption, recomputed,
                                              backend)) / MiB

    assert held(qwen, n, 16, 1, "alltoall") == 2.5
    assert held(qwen, n, 8, 1, "alltoall", capacity) == 2.0
    assert held(qwen, n, 16, 1, "alltoall", recomputed=True) == 2.75
    assert held(qwen, n, 8, 1, "alltoall", capacity, recomputed=True) == 2.5 + 1.25 * 0.25
    assert [held(qwen, n, ep, etp, "allgather") for ep, etp in ((1, 1), (2, 1), (2, 2))] == [0.5, 0.5, 1.0]
    assert held(qwen, n, 1, 1, "allgather", recomputed=True) == 0.5 + 0.375
    assert held(qwen, n, 1, 1, "allgather", capacity) == 0.0
    assert held(qwen, n, 1, 1, "allgather", capacity, recomputed=True) == 0.5 + 1.25 * 0.375
    assert held(qwen, n, 2, 1, "allgather", capacity) == 0.5
    received = 2048 * 64 * (1 - math.comb(252, 8) / math.comb(256, 8))
    assert round(received) == 15720
    assert held(DSV3, 2048.0, 64, 1, "flex") == pytest.approx((2048 * 8 * 4 + received * 84) / MiB, rel=1e-12)
    dropless = mm.RoutedTokens(routing="dropless")
    assert held(DSV3, 2048.0, 64, 1, "flex", dropless) == (2048 * 8 * 4 + 131072 * 84) / MiB
    assert float(mm.flex_received_tokens(MIXTRAL, 4096.0, 8192.0, 4, 1)) == pytest.approx(16384 * 13 / 28)
    assert held(qwen, n, 16, 1, "flex", backend="hybridep") == 2.5
    assert held(qwen, n, 16, 1, "flex", backend="ncclep") == 0.125
    # the stage's other layers: Qwen3-30B-A3B at PP 1, 47 besides the one at its peak
    copies = mm.expert_token_copies(qwen, n, 16, 1, balanced)
    others = tr.routing_held_by_other_layers_bytes(qwen, 48, n, copies, 16, 1, "alltoall")
    assert float(others) / MiB == 47 * 2.5
    assert float(tr.routing_held_by_other_layers_bytes(qwen, 1, n, copies, 16, 1, "alltoall")) == 0.0


# --- the router's and the dispatcher's saved tensors, by hand per routing family ---------------
# Per token, from megatron-core core_v0.15.2's code paths (moe_utils.topk_routing_with_score_function,
# compute_routing_scores_for_aux_loss, apply_router_token_dropping, permute; token_dispatcher.py),
# BF16 2 B, FP32 4 B, int64 8 B, bool 1 B; the norm's input, rstd and output are 2h + 4 + 2h.


def test_softmax_top_k_router_and_dispatch_by_hand():
    """Mixtral 8x7B (E 8, k 2) and Qwen3-30B-A3B (E 128, k 8): softmax after the top-k."""
    n = 1000
    # Mixtral: top-k indices 8 x 2 = 16, softmax output 4 x 2 = 8, aux loss softmax 4 x 8 = 32
    assert mm.router_activation_bytes(MIXTRAL, n) == n * (4 * 4096 + 4 + 16 + 8 + 32)
    assert mm.router_activation_bytes(MIXTRAL, n, aux_loss=False) == n * (4 * 4096 + 4 + 24)
    # alltoall: masked_select keeps the transposed FP32 probabilities (4 x 8) and bool map (8)
    assert mm.dispatch_activation_bytes(MIXTRAL, n, n * 2, 8, 1, "alltoall") == n * 40
    qwen = PRESETS["qwen3-30b-a3b"]
    # Qwen3: indices 8 x 8 = 64, softmax 4 x 8 = 32, aux loss softmax 4 x 128 = 512; 2h = 4096
    assert mm.router_activation_bytes(qwen, n) == n * (2 * 4096 + 4 + 64 + 32 + 512)
    assert mm.dispatch_activation_bytes(qwen, n, n * 8, 8, 1, "alltoall") == n * 640


def test_sigmoid_group_limited_router_by_hand():
    """DeepSeek-V3 (E 256, k 8): sigmoid with the expert bias and group-limited top-k, and its
    sequence-wise balance loss (config.json seq_aux true, aux_loss_alpha 0.001)."""
    n = 1000
    # sigmoid output 4 x 256 = 1024; gather index 8 x 8 = 64; picked scores 4 x 8 = 32 and their
    # sum 4; the group selection's nodes die (its values are dropped): nothing; 4h = 28672;
    # seq_aux_loss: its sigmoid 4 x 256 and sum 4, 1028
    assert mm.aux_loss_enabled(DSV3) and DSV3.load_balancing == ("seq_aux_loss",)
    assert mm.router_activation_bytes(DSV3, n) == n * (4 * 7168 + 4 + 1024 + 64 + 32 + 4 + 1028)
    # the expert bias alone (a weight of 0: no loss, router.py): none of the loss's scores
    alone = dataclasses.replace(DSV3, load_balancing=None, aux_loss_coeff=0.0)
    assert not mm.aux_loss_enabled(alone)
    assert mm.router_activation_bytes(alone, n) == n * (4 * 7168 + 4 + 1124)
    # without the expert bias the top-k's values are used: the group mask (bool, 256) stays
    plain = dataclasses.replace(DSV3, expert_bias=False, load_balancing=("none",))
    assert mm.router_activation_bytes(plain, n) == n * (4 * 7168 + 4 + 1124 + 256)


def test_fused_router_saves_its_map_and_intermediate():
    """--moe-router-fusion (Transformer Engine FusedTopkScoreFunction): the bool map (E) and the
    FP32 intermediate (4E) whatever the score function; its aux-loss scores an FP32 intermediate (4E)."""
    n = 1000
    assert mm.router_activation_bytes(MIXTRAL, n, fused=True) == n * (4 * 4096 + 4 + 40 + 32)
    # DeepSeek-V3 with its seq_aux_loss: the map and intermediate 256 + 1024, the loss's 1024
    assert mm.router_activation_bytes(DSV3, n, fused=True) == n * (4 * 7168 + 4 + 1280 + 1024)


def test_capacity_routing_keeps_its_mask_and_the_padded_permutation_its_index():
    """Mixtral, capacity factor 1.25: the router keeps the bool capacity mask (E = 8) padded or not;
    padded, the alltoall permutation keeps an int64 1-D index per padded copy sent (1.25 N k) and
    no masked_select; not padded, the masked_select (5E); the allgather always its masked_select."""
    n = 1024
    padded = mm.RoutedTokens(routing="capacity", capacity_factor=1.25)
    unpadded = mm.RoutedTokens(routing="capacity", capacity_factor=1.25, pad_to_capacity=False)
    for routing in (padded, unpadded):
        assert mm.router_activation_bytes(MIXTRAL, n, routing, aux_loss=False) == n * (4 * 4096 + 4 + 24 + 8)
    assert mm.dispatch_activation_bytes(MIXTRAL, n, 0, 8, 1, "alltoall", padded) == 1.25 * n * 2 * 8
    assert mm.dispatch_activation_bytes(MIXTRAL, n, 0, 8, 1, "alltoall", unpadded) == n * 40
    assert mm.dispatch_activation_bytes(MIXTRAL, n, 0, 1, 1, "allgather", padded) == n * 40


def test_allgather_and_flex_dispatchers_by_hand():
    """allgather at EP 2 gathers T = 2N tokens and keeps their local experts' (E / 2 = 4) transposed
    FP32 probabilities and bool map; flex (DeepEP) at EP 8, balanced: the top-k indices (8 k), the
    received tokens' valid-index mask (k each), two int64 index vectors per copy and the local
    masked_select (5 E / ep per received token)."""
    n = 1000
    assert mm.dispatch_activation_bytes(MIXTRAL, n, 0, 2, 1, "allgather") == 2 * n * 4 * 5
    copies = n * 2
    received = float(mm.flex_received_tokens(MIXTRAL, n, copies, 8, 1))
    # of the 8 N tokens of the EP group, those with one of their 2 experts among this rank's 1:
    # 8 N (1 - C(7, 2) / C(8, 2)) = 8 N / 4 = 2 N, the copies c
    assert received == 2 * n
    assert mm.dispatch_activation_bytes(MIXTRAL, n, copies, 8, 1, "flex") == pytest.approx(
        n * 2 * 8 + received * (2 + 1 * 5) + copies * 16)
