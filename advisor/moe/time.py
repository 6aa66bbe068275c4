"""Time terms of MoE layers and the iteration of an MoE layout, vectorised over layouts.

Assumptions, stated once:
- Grouped GEMMs from their shapes (``grouped_gemm_time``): 128 x 128 output tiles in waves over
  the GPU's SMs (tile and wave quantisation of M rows per expert and the expert's width) at the
  dense GEMM rate, or the HBM roofline of the weights and activations where that is slower. No
  constant fitted; the dense rate is the calibration's (fitted on dense runs, none of these).
- The EP dispatch (all-to-all, permutations, the dropless dispatcher's host wait, the combined
  1F1B overlap): ``advisor.moe.ep_time``, with its own assumptions.
- Load imbalance: the busiest rank's expert GEMMs and all-to-all scale by
  ``RoutedTokens.imbalance`` (--moe-imbalance, default 1, balanced: the published runs this is
  checked against force balanced routing or use aux-loss balancing after warm-up).
- The router as megatron-core runs it unfused (no --moe-router-fusion): its small kernels at a
  fixed cost (``ROUTER_KERNELS_S``), measured on one GPU elsewhere (``python -m
  tables.moe_kernel_probe``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import numpy as np

from advisor import equations as eq
from advisor.hardware import STREAMING_MULTIPROCESSORS, streaming_multiprocessors
from advisor.moe import fp8 as fp8_terms
from advisor.moe import ep_time
from advisor.moe import memory as mm
from advisor.moe import mtp as mtp_terms
from advisor.moe import params
from advisor.moe import userbuffers as ub
from advisor.moe.spec import MoESpec
from advisor.moe.stage import longest_and_last
from advisor.throughput import terms
from advisor.throughput.terms import Rates
from advisor.throughput.levers import Fp8Gemms



TILE = 128
"""Output tile of a Hopper grouped GEMM, rows and columns: CUTLASS's Hopper grouped GEMM
(``examples/57_hopper_grouped_gemm``) tiles 128 x 128, one thread block per tile, one tile per SM
at a time. Transformer Engine's ``GroupedLinear`` runs one cuBLAS GEMM per expert over several
streams instead, which fills the SMs across experts the same way; an assumption, not a probe."""


def grouped_gemm_time(groups, m, k, n, rates: Rates, sms: int, element_bytes: float = mm.BF16):
    """One grouped GEMM of ``groups`` experts, each [m, k] x [k, n] (m the token copies per local
    expert), from its shapes: the TILE x TILE output tiles, ceil(m / T) ceil(n / T) per expert,
    run in waves of one per SM, so the tensor cores do useful work for groups m n / (waves x
    sms x T^2) of the time (tile and wave quantisation) at the dense GEMM rate; or, where it
    takes longer, the HBM roofline of its bytes (each expert's weights k n and input m k in
    ``element_bytes``, its BF16 output m n). Plus one kernel cost."""
    m = np.asarray(m, dtype=float)
    tiles = groups * np.ceil(m / TILE) * np.ceil(n / TILE)
    waves = np.ceil(tiles / sms)
    useful = groups * m * n / np.maximum(waves * sms * TILE * TILE, 1.0)
    compute = 2.0 * groups * m * k * n / (rates.gemm_flops_per_s * np.maximum(useful, 1e-9))
    memory = groups * (k * n * element_bytes + m * k * element_bytes + m * n * mm.BF16) / rates.hbm_bytes_per_s
    return np.maximum(compute, memory) + rates.gemm_latency_s


def expert_gemm_time(spec: MoESpec, copies, ep, etp, rates: Rates, sms: int = STREAMING_MULTIPROCESSORS["hopper"],
                     element_bytes: float = mm.BF16):
    """(forward, backward) of the routed experts' two grouped GEMMs (``experts.py``,
    ``TEGroupedMLP``: one GEMM per local expert in one call): FC1 [M, h] x [h, 2 h_moe / etp] and
    FC2 [M, h_moe / etp] x [h_moe / etp, h] per local expert, M = copies / (E / ep), each from its
    shapes (``grouped_gemm_time``); backward twice the forward."""
    local = spec.num_experts / np.asarray(ep, dtype=float)
    width = spec.moe_ffn_hidden_size / np.asarray(etp, dtype=float)
    m = copies / local
    forward = (grouped_gemm_time(local, m, spec.hidden_size, 2 * width, rates, sms, element_bytes)
               + grouped_gemm_time(local, m, width, spec.hidden_size, rates, sms, element_bytes))
    return forward, 2 * forward


def attention_flops(spec: MoESpec, seq_len: int, mbs, tp, cp):
    """Causal attention's executed FLOPs forward on one GPU: QK^T and attention x V, half the
    s x s square, 2 s^2 b a (d_qk + d_v) / 2 over t c (MLA: d_qk = d_nope + d_rope)."""
    if spec.mla is not None:
        qk, v = spec.mla.qk_head_dim + spec.mla.qk_pos_emb_head_dim, spec.mla.v_head_dim
    else:
        qk = v = spec.head_dim
    return 2.0 * seq_len * seq_len * np.asarray(mbs) * spec.num_attention_heads * (qk + v) / 2 / (
        np.asarray(tp) * np.asarray(cp))


class LayerTimes(NamedTuple):
    """One layer's forward, one microbatch, in seconds (``layer_times``)."""

    dense: object
    """A dense layer (attention and MLP), its TP collectives aside (``attention_tp``, ``dense_mlp_tp``)."""
    moe: object
    """An MoE layer, its EP communication included (``comm``), its TP collectives aside
    (``attention_tp``, ``shared_tp``)."""
    comm: object
    """The MoE layer's EP communication: dispatch and combine, with the ETP gathers."""
    expert: object
    """The routed and shared experts' GEMMs (--overlap-moe-expert-parallel-comm's ``mlp`` node)."""
    block: object
    """The MoE block's compute, what --recompute-modules moe runs again (``moe_layer.py``,
    ``MoELayer.forward``'s checkpointed custom_forward): router, permutations, routed and shared
    experts; its communication is ``comm``."""
    core: object
    """Core attention (--recompute-modules core_attn): ``terms.attention_kernel_time``'s forward."""
    core_backward_extra: object
    """Core attention's backward beyond the twice its forward that every part's backward is
    priced at: FlashAttention-2 executes 2.5 times the forward's FLOPs."""
    norm: object
    """One RMSNorm over the layer's tokens (--recompute-modules layernorm, ``recomputed_forward``)."""
    mla_up: object
    """MLA's up projections with their latent norms and RoPE (--recompute-modules mla_up_proj)."""
    moe_act: object
    """The routed experts' SwiGLU (--recompute-modules moe_act)."""
    shared: object
    """The shared experts (--recompute-modules shared_experts)."""
    dense_mlp: object
    """A dense layer's MLP (--recompute-modules mlp), its sequence-parallel gather and scatter aside
    (``dense_mlp_tp``)."""
    dense_transposes: object = 0.0
    """Under --fp8-format with TP > 1, a dense layer's backward transposes of its sequence-parallel
    gathered FP8 operands (attention's and the MLP's, ``levers.gathered_cast_bytes``): backward
    work beyond the twice its forward that every part's backward is priced at."""
    moe_transposes: object = 0.0
    """The same in an MoE layer: attention's and the shared experts' (the routed experts' inputs
    are not gathered)."""
    shared_pairs: tuple = ()
    """What --moe-shared-expert-overlap runs side by side, forward (``ep_time.shared_expert_hidden``):
    (the shared experts' FC1 with their SwiGLU and FP8 casts, the dispatch all-to-all with the ETP
    all-gather after it) and (their FC2, the combine all-to-all). megatron-core launches FC1 on the
    shared experts' stream right after the tokens' all-to-all (core_v0.19.0 ``token_dispatch``;
    core_v0.15.2 in ``dispatch_postprocess``, before its ETP gather), and FC2 after the combine's
    (``token_combine``, ``combine_postprocess``); core_v0.19.0 makes the shared stream wait for the
    main one before each all-to-all, so FC2 does not run beside the routed experts' GEMMs
    (core_v0.15.2 does not wait: its FC2 may start there, priced as core_v0.19.0 runs it). The
    shared experts' own sequence-parallel gather and scatter are not in ``shared`` nor paired:
    ``shared_tp``."""
    attention_tp: object = 0.0
    """The attention block's sequence-parallel collectives forward, in a dense and an MoE layer
    alike: the all-gather of its input before QKV and the reduce-scatter of the output
    projection's output (``terms.tp_block_time``, FP8 gathers under --fp8-format as
    ``levers.fp8_tp_bytes`` has them); MLA's at their own widths and count
    (``mla_attention_tp_time``: its up projections' and the rotary key's gathers, the same
    scatter). In none of the compute fields nor ``dense`` or ``moe``: communication, run once
    per forward that runs attention (again with full recomputation) and once in the backward
    (``attention_tp_backward``), not priced as twice the forward (``tp_comm``). Under
    --tp-comm-overlap (``advisor.moe.userbuffers``) this and the other TP fields of the blocks that
    get userbuffers hold what they leave exposed plus the slowdown of the GEMMs beside them."""
    attention_tp_backward: object = 0.0
    """Its backward: the all-gather of the output projection's output gradient and the
    reduce-scatters of the gathered inputs' gradients (QKV's; MLA's up projections' and the
    rotary key's)."""
    mla_up_tp: object = 0.0
    """MLA's up projections' sequence-parallel all-gathers of their latents, forward (part of
    ``attention_tp``), which --recompute-modules mla_up_proj runs again in the backward
    (``tp_comm``); 0 without MLA."""
    dense_mlp_tp: object = 0.0
    """A dense layer's MLP's sequence-parallel all-gather of FC1's input and reduce-scatter of FC2's
    output, forward (``terms.tp_block_time``, as ``attention_tp``); run once per forward that runs
    the MLP (again with full recomputation, or selective with mlp) and once in the backward
    (``dense_mlp_tp_backward``)."""
    dense_mlp_tp_backward: object = 0.0
    """Its backward: the all-gather of FC2's output gradient and the reduce-scatter of FC1's input
    gradient."""
    shared_tp: object = 0.0
    """The shared experts' sequence-parallel all-gather of their input and reduce-scatter of their
    output, forward (``shared_expert_tp_time``); not in ``moe``, ``shared``, ``block`` or the
    pairs: communication, run once per forward (again where the shared experts are recomputed) and
    once in the backward (``shared_tp_backward``), not priced as twice the forward (``tp_comm``)."""
    shared_tp_backward: object = 0.0
    """Their backward: the all-gather of FC2's output gradient and the reduce-scatter of FC1's input
    gradient."""


def layer_times(spec: MoESpec, seq_len: int, *, tp, cp, ep, etp, mbs, rates: Rates,
                fp8: Fp8Gemms | None = None, dispatcher: str = "alltoall",
                sms: int = STREAMING_MULTIPROCESSORS["hopper"], routing: mm.RoutedTokens = mm.RoutedTokens(),
                permute_fusion: bool = False, router_fusion: bool = False, bias_swiglu_fusion: bool = True,
                shared_expert_overlap: bool = False, tp_overlap: ub.TpOverlap | None = None):
    """``LayerTimes`` of one layer, one microbatch; backward is twice the compute (core attention's
    ``core_backward_extra`` besides) and the same communication. ``fp8``: with --fp8-format
    (``throughput.levers.fp8_gemms``), the linear layers' GEMMs at its rates (attention
    projections, dense and shared MLPs and the routed experts' grouped GEMMs; core attention and
    the router stay BF16) and Transformer Engine's forward casts of their inputs at its bytes
    per element, each in the part that runs them (``advisor.moe.fp8``: attention, a dense
    layer's MLP, the experts, MLA's up projections); the backward, priced as twice the forward,
    carries twice the forward casts where the backward's own are 1.3-1.7 times those bytes, and
    with TP > 1 the transposes of the sequence-parallel gathered operands besides
    (``LayerTimes.dense_transposes``, ``moe_transposes``). ``routing``: the
    copies the memory prices (``memory.expert_token_copies``: balanced x its imbalance, or padded
    to capacity or not), but dropless's as balanced (its worst case bounds memory, not the steady
    state's pace). ``permute_fusion``, ``router_fusion``: --moe-permute-fusion, --moe-router-fusion
    (``ep_time.permutation_time``; the fused router without ``ROUTER_KERNELS_S``);
    ``bias_swiglu_fusion`` False: --no-bias-swiglu-fusion, ``shared_expert_overlap``:
    --moe-shared-expert-overlap's eager shared SwiGLU (``elementwise_bytes``). ``tp_overlap``:
    --tp-comm-overlap's userbuffers (``advisor.moe.userbuffers``: attention's, a dense layer's MLP's
    and the shared experts' TP fields then hold what the overlap leaves exposed and the SMs it takes
    from their GEMMs); None without it."""
    gemm_rates = fp8.rates if fp8 else rates
    tp, cp = np.asarray(tp, dtype=float), np.asarray(cp, dtype=float)
    tokens_cp = np.asarray(mbs, dtype=float) * seq_len / cp  # the TP group's tokens
    # every projection's FLOPs split over t: the column/row-parallel ones by their weights, MLA's
    # duplicated down projections by their sequence-parallel tokens
    attention_gemm = 2.0 * tokens_cp * params.attention_parameters(spec) / tp / gemm_rates.gemm_flops_per_s \
        + 4 * rates.gemm_latency_s
    core, core_backward = terms.attention_kernel_time(attention_flops(spec, seq_len, mbs, tp, cp), cp, rates)
    attention_tp, (block_tp, block_tp_backward), (shared_tp, shared_tp_backward) = _tp_times(
        spec, tokens_cp, tp, rates, gemm_rates, fp8, sms, tp_overlap, shared_expert_overlap)
    tokens = mm.tokens_per_rank(seq_len, mbs, tp, cp)
    pace = replace(routing, routing="balanced") if routing.routing == "dropless" else routing
    copies = mm.expert_token_copies(spec, tokens, ep, etp, pace)
    elementwise, dense_swiglu, moe_act, shared_swiglu = (terms.elementwise_time(b, rates) for b in elementwise_bytes(
        spec, tokens_cp, tp, copies, etp, bias_swiglu_fusion, shared_expert_overlap))
    cp_comm, _ = terms.context_parallel_time(spec, seq_len, mbs, tp, cp, rates, core, core_backward)
    casts = _cast_times(spec, tokens_cp, tp, copies, etp, fp8, rates)
    attention = attention_gemm + core + elementwise + cp_comm + casts.attention
    dense_mlp = terms.gemm_time(tokens_cp, spec.hidden_size, 3 * spec.ffn_hidden_size / tp, gemm_rates) \
        + dense_swiglu + casts.dense_mlp
    expert_f, _ = expert_gemm_time(spec, copies, ep, etp, gemm_rates, sms, 1 if fp8 else mm.BF16)
    expert_f = expert_f + casts.routed
    shared = 2.0 * tokens_cp * params.shared_expert_parameters(spec, tp) / gemm_rates.gemm_flops_per_s \
        + shared_swiglu + casts.shared
    # the backward is priced as twice the forward: a third of the router's small kernels forward
    router = 2.0 * tokens * spec.hidden_size * spec.num_experts / rates.gemm_flops_per_s \
        + (0.0 if router_fusion else ROUTER_KERNELS_S[spec.score_function] / 3)
    permute = ep_time.permutation_time(spec, copies, ep, rates, dispatcher, fused=permute_fusion)
    a2a, gather = _dispatch_times(spec, tokens, copies, ep, etp, rates, dispatcher)
    moe = attention + expert_f + moe_act + shared + router + permute + a2a + 2 * gather
    shared_fc2 = 2.0 * tokens_cp * spec.hidden_size * spec.shared_expert_size / tp / gemm_rates.gemm_flops_per_s
    norm = terms.elementwise_time(mm.BF16 * 2 * spec.hidden_size * tokens_cp / tp, rates)  # read h, write h
    return LayerTimes(dense=attention + dense_mlp, moe=moe, comm=a2a + 2 * gather, expert=expert_f + moe_act + shared,
                      block=expert_f + moe_act + shared + router + permute, core=core,
                      core_backward_extra=core_backward - 2 * core, norm=norm,
                      mla_up=mla_up_time(spec, tokens_cp, tp, gemm_rates, rates) + casts.mla_up, moe_act=moe_act,
                      shared=shared,
                      dense_mlp=dense_mlp, dense_transposes=casts.dense_transposes,
                      moe_transposes=casts.moe_transposes,
                      shared_pairs=((shared - shared_fc2, a2a / 2 + gather), (shared_fc2, a2a / 2)),
                      attention_tp=attention_tp.forward, attention_tp_backward=attention_tp.backward,
                      mla_up_tp=attention_tp.up_gathers,
                      dense_mlp_tp=block_tp, dense_mlp_tp_backward=block_tp_backward,
                      shared_tp=shared_tp, shared_tp_backward=shared_tp_backward)


def _dispatch_times(spec: MoESpec, tokens, copies, ep, etp, rates: Rates, dispatcher: str) -> tuple:
    """(the EP dispatch and combine, one expert-TP gather of the routed tokens) of one layer and
    microbatch: the allgather dispatcher's gather over the expert TP x EP group is its dispatch;
    the others' all-to-all both ways, and with ETP > 1 the routed tokens gathered over ETP."""
    if dispatcher == "allgather":
        return ep_time.allgather_dispatch_time(spec, tokens, ep, etp, rates), 0.0
    a2a = 2 * ep_time.all_to_all_time(spec, copies / np.asarray(etp, dtype=float), ep, etp, rates, dispatcher)
    gather = terms.ring_collective_time(copies * mm.BF16 * spec.hidden_size, etp, terms.link_bandwidth(etp, rates),
                                        rates)
    return a2a, gather


def _tp_times(spec: MoESpec, tokens_cp, tp, rates: Rates, gemm_rates: Rates, fp8: Fp8Gemms | None, sms: int,
              tp_overlap: ub.TpOverlap | None, shared_expert_overlap: bool):
    """(attention's ``AttentionTp``, a dense MLP's (forward, backward), the shared experts'), each
    priced once. Without --tp-comm-overlap (``tp_overlap`` None), the collectives' whole time: a
    dense MLP's and grouped-query attention's the same [tokens, h] activation each
    (``terms.tp_block_time``), MLA's its own (``mla_attention_tp_time``), the shared experts'
    (``shared_expert_tp_time``); FP8 moves the gathers in FP8 (``levers.fp8_tp_bytes``), as the
    dense model's. With it, userbuffers where megatron-core gives them (``advisor.moe.userbuffers``):
    grouped-query attention's, a dense MLP's and the shared experts', at the GEMMs' rates
    ``gemm_rates`` (FP8's under --fp8-format, as the dense model prices them); the shared experts'
    as without it under --moe-shared-expert-overlap, which takes their userbuffers away. With MLA
    megatron-core takes them away from all but one projection a model chunk, which the CLI refuses
    (``userbuffers.mla_problem``): priced as without the overlap."""
    sizes = fp8.collectives if fp8 else terms.BF16_TP
    if tp_overlap is None or spec.mla is not None:
        block = terms.tp_block_time(spec, tokens_cp, tp, rates, sizes)
        attention = mla_attention_tp_time(spec, tokens_cp, tp, rates, sizes) if spec.mla is not None \
            else AttentionTp(*block, 0.0)
        return attention, block, shared_expert_tp_time(spec, tokens_cp, tp, rates, fp8, shared_expert_overlap)
    attention = AttentionTp(*ub.attention_tp(spec, tokens_cp, tp, gemm_rates, sms, tp_overlap, sizes), 0.0)
    dense = ub.dense_mlp_tp(spec, tokens_cp, tp, gemm_rates, sms, tp_overlap, sizes)
    shared = shared_expert_tp_time(spec, tokens_cp, tp, rates, fp8, True) if shared_expert_overlap \
        else ub.shared_tp(spec, tokens_cp, tp, gemm_rates, sms, tp_overlap, sizes)
    return attention, dense, shared


def shared_expert_tp_time(spec: MoESpec, tokens_cp, tp, rates: Rates, fp8: Fp8Gemms | None = None,
                          shared_expert_overlap: bool = False):
    """(forward, backward) seconds of the shared experts' tensor-parallel communication, one MLP
    block's (``terms.tp_block_time``): megatron-core's SharedExpertMLP is an MLP over the TP
    group (``shared_experts.py``, core_v0.15.2 and core_v0.19.0: column-parallel FC1, row-parallel
    FC2), so with sequence parallelism (which Megatron requires for MoE at TP > 1) its FC1
    all-gathers the [tokens, h] input and FC2 reduce-scatters the output forward, and backward
    all-gathers FC2's output gradient and reduce-scatters FC1's input gradient, as a dense MLP.
    With --moe-shared-expert-overlap the linears lose their parallel mode and ``pre_forward_comm``
    / ``post_forward_comm`` run the same collectives themselves (``gather_from_sequence_parallel_
    region``, ``reduce_scatter_to_sequence_parallel_region``) on the shared experts' stream, in
    BF16 (a high-precision tensor, not Transformer Engine's FP8 gather); FC1 waits for the gather
    on that stream, so neither is paired with the all-to-all (each may run beside a permutation,
    not priced). FP8 collectives otherwise as the dense MLP's (``levers.fp8_tp_bytes``). Zero at
    TP 1 and without shared experts. The routed experts' path adds no TP collective at ETP 1: the
    dispatcher's TP group is the expert-TP group (``token_dispatcher.py``, ``pg_collection.expt_tp``)."""
    if not spec.shared_expert_size:
        return 0.0, 0.0
    sizes = fp8.collectives if fp8 is not None and not shared_expert_overlap else terms.BF16_TP
    return terms.tp_block_time(spec, tokens_cp, tp, rates, sizes)


class AttentionTp(NamedTuple):
    """Seconds of an attention block's sequence-parallel collectives, one microbatch
    (``mla_attention_tp_time``)."""

    forward: object
    backward: object
    up_gathers: object
    """The forward's gathers that --recompute-modules mla_up_proj runs again: the up projections'."""


def mla_attention_tp_time(spec: MoESpec, tokens_cp, tp, rates: Rates,
                          sizes: terms.TpBytes = terms.BF16_TP) -> AttentionTp:
    """``AttentionTp`` of multi-latent attention with sequence parallelism, each collective a ring
    of its own (``terms.ring_collective_time``, one latency a step each). megatron-core's Transformer
    Engine spec (``gpt_layer_specs.py``, core_v0.15.2:146-155, core_v0.19.0:300-309) builds the
    down projections as ``TELinear`` with parallel_mode 'duplicated' (``multi_latent_attention.py``
    core_v0.15.2:371-372 and 410-411, core_v0.19.0:525-526 and 572-573): no collective, each rank
    projects its own t-th of the tokens. The gathers come after them (core_v0.15.2:532-571,
    core_v0.19.0:637-754): the up projections, column-parallel (``TEColumnParallelLinear``, or
    ``TELayerNormColumnParallelLinear`` with the latent norms), all-gather their inputs
    [tokens, q_lora_rank] and [tokens, kv_lora_rank] (without q_lora_rank, Q's one projection
    ``linear_q_proj`` gathers [tokens, h]), at ``sizes.input_gather`` an element (Transformer
    Engine quantises a column-parallel linear's input before its gather under FP8, as QKV's), and
    ``gather_from_sequence_parallel_region(k_pos_emb)`` gathers the rotary key [tokens, d_rope] in
    BF16 (megatron's own collective, on the split of the down projection's output); the output
    projection reduce-scatters [tokens, h] as any attention's (``sizes.output_scatter``). Backward
    the mirror: the output gradient's all-gather (``sizes.grad_gather``), the up projections' input
    gradients' reduce-scatters (``sizes.dgrad_scatter``) and the rotary key's (BF16,
    ``_GatherFromSequenceParallelRegion.backward``); the wgrad re-gathers run behind dgrad, left
    out as the dense model's (``terms.tensor_parallel_time``). ``up_gathers``: the up projections'
    two, inside ``qkv_up_proj_and_rope_apply``, which mla_up_proj checkpoints
    (core_v0.15.2:783-786, core_v0.19.0:972-976); the rotary key's gather runs before the
    checkpoint, on its input. Only the Transformer Engine spec: the local spec's column-parallel
    down projections would gather [tokens, h] each (``gpt_layer_specs.py``, core_v0.15.2:262-271,
    core_v0.19.0:420-429), but it builds an RMSNorm model's norms (DeepSeek's, Kimi K2's) as
    torch's, which refuses sequence parallelism, which an MoE needs at TP > 1
    (``advisor.options.local_spec``). The fused down projection of core_v0.19.0's
    --mla-down-proj-fusion (off by default) is not priced, but named (``advisor.moe.readback.NAMED``).
    Zeros at TP 1."""
    mla, h = spec.mla, spec.hidden_size
    bandwidth = terms.link_bandwidth(tp, rates)

    def ring(width, element_bytes):  # one all-gather or reduce-scatter of [tokens, width]
        return terms.ring_collective_time(element_bytes * tokens_cp * width, tp, bandwidth, rates)

    q = mla.q_lora_rank or h  # without q_lora_rank, linear_q_proj gathers the layer's input
    up = ring(q, sizes.input_gather) + ring(mla.kv_lora_rank, sizes.input_gather)
    rope = ring(mla.qk_pos_emb_head_dim, mm.BF16)
    forward = up + rope + ring(h, sizes.output_scatter)
    backward = ring(h, sizes.grad_gather) + ring(q, sizes.dgrad_scatter) \
        + ring(mla.kv_lora_rank, sizes.dgrad_scatter) + rope
    return AttentionTp(forward, backward, up)


class _CastTimes(NamedTuple):
    """Seconds of Transformer Engine's forward FP8 casts in each part of a layer (``layer_times``), and
    the backward's transposes of the gathered operands in a dense and in an MoE layer."""
    attention: object
    dense_mlp: object
    routed: object
    shared: object
    mla_up: object
    dense_transposes: object
    moe_transposes: object


def _cast_times(spec: MoESpec, tokens_cp, tp, copies, etp, fp8: Fp8Gemms | None, rates: Rates) -> _CastTimes:
    """``_CastTimes`` at ``fp8``'s bytes per element (``advisor.moe.fp8``), zeros without FP8."""
    if fp8 is None:
        return _CastTimes(*[0.0] * 7)
    casts = fp8.casts
    attention = fp8_terms.attention_cast_bytes(spec, tokens_cp, tp, casts)
    dense_mlp = fp8_terms.dense_mlp_cast_bytes(spec, tokens_cp, tp, casts)
    shared = fp8_terms.shared_expert_cast_bytes(spec, tokens_cp, tp, casts)
    return _CastTimes(*(terms.elementwise_time(b, rates) for b in (
        attention.forward, dense_mlp.forward, fp8_terms.routed_expert_cast_bytes(spec, copies, etp, casts).forward,
        shared.forward, fp8_terms.mla_up_cast_bytes(spec, tokens_cp, tp, casts),
        attention.transposes + dense_mlp.transposes, attention.transposes + shared.transposes)))


def mla_up_time(spec: MoESpec, tokens_cp, tp, gemm_rates: Rates, rates: Rates):
    """MLA's up projections forward on one GPU, what --recompute-modules mla_up_proj runs again
    (``multi_latent_attention.py``, ``qkv_up_proj_and_rope_apply`` under ``CheckpointWithoutOutput``):
    the Q and KV up projections [tokens, rank] x [rank, a d / t], column-parallel (Q's whole
    projection [h, a (d_nope + d_rope)] where the model has no q_lora_rank), the latent norms
    fused into them (``qk_layernorm``) and RoPE on the rotary parts, at ``elementwise_bytes``'
    bytes; the Q/K concatenations are not counted. 0 without MLA."""
    mla = spec.mla
    if mla is None:
        return np.zeros_like(np.asarray(tokens_cp, dtype=float))
    a, t = spec.num_attention_heads, np.asarray(tp, dtype=float)
    q_rank = mla.q_lora_rank or spec.hidden_size
    up = q_rank * a * (mla.qk_head_dim + mla.qk_pos_emb_head_dim) + mla.kv_lora_rank * a * (mla.qk_head_dim
                                                                                           + mla.v_head_dim)
    return (2.0 * tokens_cp * up / t / gemm_rates.gemm_flops_per_s + 2 * rates.gemm_latency_s
            + terms.elementwise_time(mm.BF16 * _rope_and_qk_norm_elements(spec) * tokens_cp / t, rates))


ROUTER_KERNELS_S = {"softmax": 0.24e-3, "sigmoid": 0.50e-3}
"""The router's kernels besides its gating GEMM, one MoE layer and microbatch, forward and
backward, by score function (``router.py`` ``TopKRouter``, unfused): top-k, the scores, the
auxiliary loss or the expert bias, forced balancing's random logits, the token counts and their
copies, 46-49 kernels of a few microseconds each besides the GEMMs. Measured on one H200 (``python -m
tables.moe_kernel_probe``; the GEMMs left out, the FP32 casts around them, about 0.06 ms of which
Transformer Engine's ``te_general_gemm`` avoids the forward's, kept): softmax top-8 at
Qwen3-30B-A3B's 4096 tokens x 128 experts, 0.239 ms, and, held out, Mixtral 8x7B's softmax top-2
over 8 experts, 0.241 ms: a fixed cost while the tensors are this small (2 MiB of FP32 logits), the
kernels bound by their launch and latency, not their bytes; DeepSeek-V3's sigmoid scores with
expert bias and group-limited top-8 over 256 experts, 0.496 ms (measured on that model alone: the
other sigmoid routers are priced as it, an assumption). Seconds on an H200, priced alike on every
GPU (launch- and latency-bound kernels; not measured elsewhere)."""


def elementwise_bytes(spec: MoESpec, tokens_cp, tp, copies, etp, bias_swiglu_fusion: bool = True,
                      shared_expert_overlap: bool = False):
    """(attention block, dense MLP, routed experts, shared experts) HBM bytes of one layer's
    memory-bound kernels forward on one GPU, BF16, each tensor read and written once: the two
    RMSNorms and residual adds (10h per token, as ``terms.layer_elementwise_bytes`` counts a dense
    layer's), RoPE on Q and K (read and write (a + k) d; MLA only its rotary parts, a d_rope +
    d_rope) and the QK norms (Qwen3's on (a + k) d; MLA's on its latents, q_lora_rank +
    kv_lora_rank), all over t (sequence parallel or head split);
    SwiGLU, read 2f and write f: the dense MLP's (f = h_ffn per token over t), the routed experts'
    (f = h_moe over etp per token copy) and the shared experts' (f = h_shared per token over t).
    With --no-bias-swiglu-fusion (``bias_swiglu_fusion`` False) each SwiGLU runs eagerly
    (``terms.swiglu_elements``: 7f), and the routed experts' then weigh by the FP32 probs in
    two kernels more (``experts.py``, ``bias_act_func``): the product (read f BF16, write f FP32)
    and its cast back (read f FP32, write f BF16), 12 bytes per element of f: 13f BF16 elements in
    all, where the fused ``weighted_bias_swiglu_impl`` applies them inside its one kernel. The
    shared experts' eager SwiGLU under --moe-shared-expert-overlap (``shared_expert_overlap``) has
    no offset's add: 5f (``terms.swiglu_elements``, ``linear_offset``)."""
    h, t = spec.hidden_size, np.asarray(tp, dtype=float)
    per_token = 10 * h + _rope_and_qk_norm_elements(spec)
    attention = mm.BF16 * per_token * tokens_cp / t
    dense = mm.BF16 * terms.swiglu_elements(spec.ffn_hidden_size, bias_swiglu_fusion) * tokens_cp / t
    weighted = 0 if bias_swiglu_fusion else (2 + 4 + 4 + 2) * spec.moe_ffn_hidden_size  # bytes: product and cast
    routed = (mm.BF16 * terms.swiglu_elements(spec.moe_ffn_hidden_size, bias_swiglu_fusion) + weighted) \
        * copies / np.asarray(etp, dtype=float)
    shared = mm.BF16 * terms.swiglu_elements(spec.shared_expert_size, bias_swiglu_fusion,
                                             linear_offset=not shared_expert_overlap) * tokens_cp / t
    return attention, dense, routed, shared


def _rope_and_qk_norm_elements(spec: MoESpec) -> int:
    """Elements per token that RoPE and the QK norms read and write (``elementwise_bytes``)."""
    a, mla = spec.num_attention_heads, spec.mla
    if mla is None:  # RoPE on Q and K, and Qwen3's per-head norms as a dense layer's (shared term)
        return 2 * (a + spec.num_query_groups) * spec.head_dim + terms.qk_norm_elements(spec)
    # MLA's QK norms are its latent norms (q_a, kv_a layernorm): the LoRA ranks
    rotary, normed = (a + 1) * mla.qk_pos_emb_head_dim, (mla.q_lora_rank or 0) + mla.kv_lora_rank
    return 2 * rotary + (2 * normed if spec.qk_layernorm else 0)


def megatron_flops_per_iteration(spec: MoESpec, seq_len: int, global_batch_size: int, padded_vocab: int) -> float:
    """Training FLOPs of one iteration as Megatron-LM counts them for its TFLOP/s
    (``training/training.py``, ``num_floating_point_operations``, transformer_flops; core_v0.15.2),
    term by term, with the D = --mtp-num-layers MTP layers counted as Megatron does (L' = L + D
    layers, the D counted as MoE layers since the last layer is one): 12 L' h (1.5 h_ffn (dense
    share) + 1.5 h_moe k (MoE share) + 1.5 h_shared (MoE share)) for the MLPs; attention
    12 L' h^2 (1 + k/a + s/(2h)) (a d / h) for GQA, or MLA's 6 L' (q term + kv term + h d_rope +
    a d_v h + s a (d_nope + d_rope)/2 + s a d_v/2); the MTP norms and eh projection
    6 D (3h + 2h^2); the logits 6 h v (D + 1); all per token, times gbs x s."""
    h, a, mtp = spec.hidden_size, spec.num_attention_heads, spec.mtp_num_layers
    L = spec.num_layers + mtp
    moe_layers = spec.moe_layers + mtp
    mlp = 12 * L * h * 1.5 * (spec.ffn_hidden_size * spec.first_dense_layers / L
                               + (spec.moe_ffn_hidden_size * spec.moe_router_topk + spec.shared_expert_size)
                               * moe_layers / L)
    mla = spec.mla
    if mla is None:
        d = spec.head_dim
        attention = 12 * L * h * h * (1 + spec.num_query_groups / a + seq_len / h / 2) * (d * a / h)
    else:
        q_head = mla.qk_head_dim + mla.qk_pos_emb_head_dim
        q_term = h * a * q_head if mla.q_lora_rank is None else mla.q_lora_rank * (h + a * q_head + 1)
        attention = 6 * L * (q_term + mla.kv_lora_rank * (h + a * (mla.qk_head_dim + mla.v_head_dim) + 1)
                             + h * mla.qk_pos_emb_head_dim + a * mla.v_head_dim * h
                             + seq_len * a * q_head / 2 + seq_len * a * mla.v_head_dim / 2)
    mtp_terms = 6 * mtp * (3 * h + 2 * h * h)
    return global_batch_size * seq_len * (mlp + attention + mtp_terms + 6 * h * padded_vocab * (mtp + 1))


def recomputed_forward(spec: MoESpec, layer: LayerTimes, modules: frozenset[str]):
    """(a dense layer's, an MoE layer's outside its MLP, an MoE layer's inside it) forward seconds,
    one microbatch, that selective recomputation of ``modules`` runs again in the backward
    (megatron-core core_v0.15.2; ``moe`` is the whole block, ``_moe_layer_paces``):
    - core_attn: core attention (``attention.py``, ``_checkpointed_attention_forward``);
    - layernorm: the RMSNorms that are modules of their own (``transformer_layer.py``: a
      TransformerLayer recomputes its input_layernorm and pre_mlp_layernorm unless they are
      IdentityOp). In the Transformer Engine layer specs (``gpt_layer_specs.py``) the input norm is
      one only with MLA (otherwise fused into linear_qkv), and the pre-MLP norm only in MoE layers
      (fused into a dense MLP's linear_fc1);
    - mla_up_proj: ``mla_up_time``;
    - mlp: a dense layer's MLP (MoE layers ignore it: ``not isinstance(self.mlp, MoELayer)``);
    - moe_act: the routed experts' activation (``experts.py``); shared_experts: the shared experts
      (``shared_experts.py``).
    Compute only: the TP collectives that mlp, shared_experts and mla_up_proj run again are ``tp_comm``'s."""
    mla = spec.mla is not None
    attention = ("core_attn" in modules) * layer.core + ("mla_up_proj" in modules) * layer.mla_up
    norms = "layernorm" in modules
    dense = attention + norms * mla * layer.norm + ("mlp" in modules) * layer.dense_mlp
    moe_rest = attention + norms * (1 + mla) * layer.norm
    moe_expert = ("moe_act" in modules) * layer.moe_act + ("shared_experts" in modules) * layer.shared
    return dense, moe_rest, moe_expert


class TpComm(NamedTuple):
    """Seconds of one layer's tensor-parallel collectives per microbatch, forwards and backward
    (``tp_comm``), by block: a dense layer's are ``attention`` + ``dense_mlp``, an MoE layer's
    ``attention`` + ``shared``."""

    attention: object
    dense_mlp: object
    shared: object


def tp_comm(layer: LayerTimes, recompute: str, modules: frozenset[str]) -> TpComm:
    """Each block's tensor-parallel collectives per microbatch (``LayerTimes.attention_tp``,
    ``dense_mlp_tp``, ``shared_tp``), once per forward that runs the block and once in the
    backward (as many collectives backward as forward, the gradients' gathers and scatters:
    ``terms.tp_block_time``), not at twice the forward as compute is priced. Full recomputation runs every block's forward
    again (megatron-core ``transformer_block.py``, ``_checkpointed_forward``: the whole layer under
    ``tensor_parallel.checkpoint``); selective (``modules``) runs again a dense layer's MLP with mlp
    (``transformer_layer.py``, ``_forward_mlp``) and the shared experts with moe (the whole block
    is checkpointed, ``moe_layer.py``) and with shared_experts (``MoELayer.shared_experts_compute``),
    each: with both the shared experts' checkpoint is nested in the block's, and runs its forward
    in the block's recomputation and again in its own backward (``tensor_parallel/random.py``,
    ``CheckpointFunction``: forward under no_grad, backward reruns it; core_v0.15.2 and
    core_v0.19.0), three forwards, as ``LayerTimes.block`` and ``recomputed_forward`` price their
    compute. core_attn and layernorm checkpoint parts between attention's collectives, no
    collective again; mla_up_proj's up projections gather their latents again in the backward
    (``LayerTimes.mla_up_tp``: ``multi_latent_attention.py``, ``qkv_up_proj_and_rope_apply`` under
    ``CheckpointWithoutOutput``, in FP8 under --fp8-format, its recomputation under
    ``fp8_autocast``: ``tensor_parallel/random.py``, both releases), once."""
    full = recompute == "full"
    modules = frozenset() if full else modules  # Megatron reads --recompute-modules with selective only
    mlp_forwards = 2.0 if full or "mlp" in modules else 1.0
    shared_forwards = 1.0 + (full or "moe" in modules) + ("shared_experts" in modules)
    return TpComm(attention=(1.0 + full) * layer.attention_tp + layer.attention_tp_backward
                  + ("mla_up_proj" in modules) * layer.mla_up_tp,
                  dense_mlp=mlp_forwards * layer.dense_mlp_tp + layer.dense_mlp_tp_backward,
                  shared=shared_forwards * layer.shared_tp + layer.shared_tp_backward)


def step_times(spec: MoESpec, seq_len: int, global_batch_size: int, columns: dict, recompute: str, *, gpu, options,
               first_stage, layers_per_stage: tuple[int, ...] | None = None, bases=None,
               with_parts: bool = False) -> dict:
    """Step time of MoE layouts (``columns``: tp, cp, pp, ep, etp, dp, mbs, vpp arrays): 1F1B over
    the stages (Narayanan et al. 2021: m x the slowest stage + the others' fill and drain), the
    interleaved schedule's fill and drain divided by v, each chunk's boundary sends
    (``terms.pipeline_p2p_time``, forward and backward, across nodes where the PP neighbours,
    t c d ranks apart, are) and the calibration's overhead per microbatch and stage; the last stage with the LM head
    and the MTP layers (``advisor.moe.mtp.extra_time``); the DP gradient reduce-scatter and
    parameter all-gather (dense parts over DP x CP, experts over EDP; in the gradient dtype, FP8
    weights with --fp8-param-gather), hidden behind the first stage's backward and forward where
    --overlap-grad-reduce / --overlap-param-gather are on, else exposed; Adam on the shards.
    ``first_stage``: ``stage.stage_bytes`` of stage 0 (its parameters). Communication of a layer
    runs once forward and once backward (and again when fully recomputed); with
    --overlap-moe-expert-parallel-comm the steady state's MoE layers are ``ep_time.overlapped_layer_time``'s.
    ``layers_per_stage``: one layout's own split (its largest and its last stage) instead of
    ``stage.split_layers``. ``bases``: (index, inverse) where many layouts are variants (VPP) of
    one base layout (the columns at ``index`` are the bases, ``inverse`` maps each layout to its
    own): all but the interleaved schedule's terms are priced once per base. ``with_parts``: also
    ``time_parts``, where the step goes (``step_parts``)."""
    from advisor.throughput import levers
    from advisor.throughput.calibration import load_calibration

    cal = load_calibration()
    training = options.training
    opts = training.time_options()  # once: it reads --tp-comm-overlap-cfg's file
    c = {k: np.asarray(v, dtype=float) for k, v in columns.items()}
    vpp = c["vpp"]
    b, base_of, spread = _by_base(c, bases)
    rates, gemm_rates, layer = _rates_and_layer(spec, seq_len, b, gpu, options, cal, opts)
    moe_f = layer.moe + layer.attention_tp + layer.shared_tp  # the forward the DP communication hides behind
    moe_t, steady, exposed = _moe_layer_paces(spec, seq_len, b, recompute, options, gpu, rates, layer)
    dense_t = _dense_layer_pace(spec, recompute, options, layer)
    most, last_layers = longest_and_last(spec.num_layers, b["pp"], layers_per_stage)
    tokens_cp = b["mbs"] * seq_len / b["cp"]
    vocab = eq.padded_vocab_size(spec.vocab_size, training.vocab_divisible_by, b["tp"])  # the rows Megatron builds
    head_f, head_b = terms.lm_head_time(spec, tokens_cp, b["tp"], vocab, rates)
    emb_f, emb_b = terms.embedding_time(spec, tokens_cp, b["tp"], rates)
    cross = b["tp"] * b["cp"] * b["dp"] >= rates.gpus_per_node
    p2p = spread(np.where(b["pp"] > 1, terms.pipeline_p2p_time(spec, tokens_cp, b["tp"], cross, rates), 0.0))
    chunk = vpp * 2 * p2p + cal.microbatch_overhead_s  # per microbatch on a rank: its chunks' sends, its overhead

    def stages(layer):  # (all stages' work, the slowest stage's) with one MoE layer's time ``layer``
        # the MTP layers' MoE layer is one of the chunk's layers in the combined schedule too
        # (``TransformerModelChunkSchedulePlan`` builds a layer plan for each MTP layer)
        mtp = spec.mtp_num_layers * mtp_terms.extra_time(
            spec, tokens_cp, b["tp"], layer, head_f + head_b, emb_f + emb_b,
            lambda m, k, n: terms.gemm_time(m, k, n, gemm_rates))
        ends = head_f + head_b + mtp
        last = spread(last_layers * layer + ends)
        total = spread(spec.first_dense_layers * dense_t + spec.moe_layers * layer + ends) + c["pp"] * chunk
        return total, np.maximum(np.where(c["pp"] == 1, total, np.maximum(spread(most * layer), last) + chunk),
                                 total / c["pp"])

    total, _ = stages(moe_t)
    _, slowest = stages(steady)
    m = global_batch_size / (c["mbs"] * c["dp"])
    # the steady state's m passes at the slowest stage's pace; the fill and drain (no forward
    # beside a backward to overlap with) at the plain pace, shrunk v-fold by interleaving
    pipeline = m * slowest + (total - slowest) / vpp
    host = levers.host_link(gpu) if training.offload.host_fraction > 0 else None  # offload's rates, as the dense model's
    parameters = base_of(first_stage.dense_parameters), base_of(first_stage.expert_parameters)
    dp_comm, optimizer = _data_parallel(b, training, parameters, most * moe_f, rates,
                                        global_batch_size / (b["mbs"] * b["dp"]), host, opts)
    step = terms.data_loader_bound(pipeline + spread(dp_comm) + spread(optimizer), training.attention.dataloader_mask
                                   == "rebuilt", global_batch_size / c["dp"], seq_len, rates)
    flops = spread(megatron_flops_per_iteration(spec, seq_len, global_batch_size, vocab))
    tflops = flops / (step * c["tp"] * c["cp"] * c["pp"] * c["dp"]) / 1e12
    ep_comm = m * spec.moe_layers / c["pp"] * spread(exposed)
    out = {"step_time_s": step, "tflops_per_gpu": tflops, "mfu": tflops / gpu.bf16_dense_tflops,
           "tokens_per_s": global_batch_size * seq_len / step, "ep_comm_s": ep_comm}
    if with_parts:
        out["time_parts"] = step_parts(step, m=m, slowest=slowest, total=total, vpp=vpp,
                                       pp_comm=m * vpp * 2 * p2p, overhead=m * cal.microbatch_overhead_s,
                                       ep_comm=ep_comm, dp_comm=spread(dp_comm), optimizer=spread(optimizer))
    return out


def _rates_and_layer(spec: MoESpec, seq_len: int, b: dict, gpu, options, cal, opts):
    """(the GPU's rates under the calibration ``cal``, the GEMMs' rates: FP8's where the run's
    GEMMs are FP8, one layer's times at the base layouts ``b``); ``opts``: the run's
    ``TimeOptions``, whose userbuffers --tp-comm-overlap uses."""
    from advisor.throughput import levers

    rates = terms.Rates.of(gpu, cal)
    training = options.training
    fp8_gemms = (levers.fp8_gemms(rates, gpu, training.precision.fp8_recipe)
                 if training.precision.fp8_format is not None else None)
    layer = layer_times(spec, seq_len, tp=b["tp"], cp=b["cp"], ep=b["ep"], etp=b["etp"], mbs=b["mbs"], rates=rates,
                        fp8=fp8_gemms, dispatcher=options.dispatcher,
                        sms=streaming_multiprocessors(gpu.architecture), routing=options.routing,
                        permute_fusion=options.fused_permutation, router_fusion=options.router_fusion,
                        bias_swiglu_fusion=training.fusions.bias_swiglu_fusion,
                        shared_expert_overlap=options.shared_expert_overlap,
                        tp_overlap=ub.TpOverlap(opts.userbuffers, opts.tp_overlaps) if opts.tp_comm_overlap else None)
    return rates, fp8_gemms.rates if fp8_gemms else rates, layer


def _dense_layer_pace(spec: MoESpec, recompute: str, options, layer: LayerTimes):
    """A dense layer's forward and backward per microbatch: the forward once more with full
    recomputation, its selective modules' forward (``recomputed_forward``) with selective; its TP
    collectives once per forward that runs them and once backward (``tp_comm``)."""
    modules = options.recomputed_modules(spec, recompute)
    tp = tp_comm(layer, recompute, modules)
    pace = (3.0 + (recompute == "full")) * layer.dense + layer.core_backward_extra + layer.dense_transposes \
        + tp.attention + tp.dense_mlp
    if recompute == "selective":
        pace = pace + recomputed_forward(spec, layer, modules)[0]
    return pace


def _moe_layer_paces(spec: MoESpec, seq_len: int, b: dict, recompute: str, options, gpu, rates: Rates,
                     layer: LayerTimes):
    """(an MoE layer's forward and backward, the same in 1F1B's steady state, the EP communication
    the steady state leaves exposed) in seconds per microbatch (``step_times``' terms): the
    steady state overlapped where Megatron overlaps it (--overlap-moe-expert-parallel-comm, which
    Megatron refuses with full recomputation: ``layout_problem``). Full recomputation, and
    selective recomputation of ``moe``, run the dispatch and combine again in the backward
    (``moe_layer.py``: the whole block is checkpointed), with the host wait for the token counts;
    ``moe`` also runs the block's compute again (``LayerTimes.block``), in series with the
    overlapped pairs (the recomputed communication is not one the combined schedule pairs); the
    other modules run their own forward again in their node's backward (``recomputed_forward``).
    --moe-shared-expert-overlap hides the shared experts beside the dispatch and combine of every
    forward and the backward (``_shared_expert_hidden``). The TP collectives, attention's and the
    shared experts' (``LayerTimes.attention_tp``, ``shared_tp``), run once per forward that runs
    them and once backward (``tp_comm``), in series; under the EP overlap attention's in its node,
    beside the all-to-all as the rest of its work, the shared experts' in the MLP node, unpaired."""
    comm, expert = layer.comm, layer.expert
    compute = layer.moe - comm
    modules = options.recomputed_modules(spec, recompute)
    again = "moe" in modules
    forwards = 2.0 if recompute == "full" or again else 1.0
    idle = forwards * ep_time.host_sync_idle(spec, mm.tokens_per_rank(seq_len, b["mbs"], b["tp"], b["cp"]), rates,
                                     options.dispatcher, options.routing)
    _, rest_again, expert_again = recomputed_forward(spec, layer, modules)
    if recompute == "full":
        rest_again, expert_again = compute - expert, expert
    block = layer.block if again else 0.0
    # attention's backward is in the rest's node; the FP8 transposes with it (the shared experts' few among them)
    rest_again = rest_again + layer.core_backward_extra + layer.moe_transposes
    tp = tp_comm(layer, recompute, modules)
    work = 3.0 * compute + rest_again + expert_again + block + tp.attention + tp.shared
    plain = work + (forwards + 1.0) * comm + idle - _shared_expert_hidden(layer, options, gpu, forwards)
    steady = plain
    if options.a2a_overlap:
        share = ep_time.comm_sm_share(options.dispatcher, gpu.architecture, options.dispatcher_sms)
        # attention's collectives in its node: its forward's, and its backward's with any recomputed forward's
        rest_tp = (layer.attention_tp, tp.attention - layer.attention_tp)
        steady = ep_time.overlapped_layer_time(compute - expert, expert, 2 * comm, share, rest_again=rest_again,
                                               expert_again=expert_again, rest_tp=rest_tp) \
            + idle + (block + comm if again else 0.0) + tp.shared  # on the compute stream in the MLP node, in series
    return plain, steady, steady - idle - work


def _shared_expert_hidden(layer: LayerTimes, options, gpu, forwards: float):
    """Seconds --moe-shared-expert-overlap hides of one MoE layer's forward and backward
    (``ep_time.shared_expert_hidden``), each forward's (``forwards``: 2 where the layer's forward
    runs again, its dispatch and combine with it) and the backward's; 0 without the overlap, or
    without shared experts (their work is 0). The EP all-to-all overlap, which would pair the same
    communication, is refused with it (``advisor.moe.overlap``)."""
    if not options.shared_expert_overlap:
        return 0.0
    share = ep_time.comm_sm_share(options.dispatcher, gpu.architecture, options.dispatcher_sms)
    forward, backward = ep_time.shared_expert_hidden(layer.shared_pairs, share)
    return forwards * forward + backward


def step_parts(step, *, m, slowest, total, vpp, pp_comm, overhead, ep_comm, dp_comm, optimizer) -> dict:
    """Where an MoE step goes, in seconds, the parts adding up to ``step``: the m microbatches of
    1F1B's steady state at the slowest stage's pace (its layers' compute, TP and CP communication
    inside the layers included; the EP all-to-all left exposed; each microbatch's stage-boundary
    sends and overhead), the fill and drain (``bubble_s``), the exposed DP communication, the
    optimizer, and the wait for the data loader where it bounds the step. ``step_times`` names
    each input."""
    pipeline = m * slowest + (total - slowest) / vpp
    return {"total_s": step, "compute_s": m * slowest - pp_comm - overhead - ep_comm, "ep_comm_s": ep_comm,
            "pp_comm_s": pp_comm, "overhead_s": overhead, "bubble_s": (total - slowest) / vpp, "dp_comm_s": dp_comm,
            "optimizer_s": optimizer, "data_wait_s": step - (pipeline + dp_comm + optimizer)}


def _by_base(c: dict, bases):
    """(the bases' columns, a layout array's base values, a base term gathered to every layout)
    for ``step_times``' ``bases``; without them every layout is its own base."""
    if bases is None:
        return c, lambda x: x, lambda x: x
    index, inverse = bases
    return {k: v[index] for k, v in c.items()}, lambda x: x[index], lambda x: x[inverse] if np.ndim(x) else x


def _data_parallel(c: dict, training, parameters: tuple, forward_s, rates: Rates, m=1.0,
                   host: tuple[float, float] | None = None, opts=None):
    """(exposed DP communication, optimizer) seconds of the first stage, from its (dense, expert)
    ``parameters`` on one GPU (``ModelStates.dense_parameters``, ``expert_parameters``): the dense
    model's collectives (``throughput.data_parallel.exposed_time``) over two groups, the dense parts
    over DP x CP and the experts over the expert-data-parallel group EDP = t c d / (etp ep), each
    on its own rings, hidden behind the first stage's MoE layers' backward (twice ``forward_s``) and
    forward; Megatron-FSDP's per-microbatch collectives where its strategy shards the gradients,
    ``m`` microbatches a step; ``host``: the GPU's host link and memory rates (``levers.host_link``)
    where --optimizer-cpu-offload moves a share of each optimizer's step to the CPU. ``opts``: the
    run's ``TimeOptions`` (``training.time_options()`` where not given), whose DP fields are the
    training options' own for every run the MoE model prices (it refuses --use-torch-fsdp2, which
    alone ``time_options`` prices as another strategy, ``advisor.cli.moe._levers_not_priced``)."""
    from advisor.throughput import data_parallel, levers

    dense_params, expert_params = parameters
    span = c["tp"] * c["cp"] * c["dp"]
    edp = span / (c["etp"] * c["ep"])
    opts = opts or training.time_options()  # step_times passes the one it made
    # across nodes each group's rings use the NICs of all its GPUs in a node, as the dense model's
    # (priced at one NIC before 2026-11-30: 8x slower for Mixtral's dense DP group at TP 1)
    groups = (data_parallel.DpGroup(dense_params, c["dp"] * c["cp"],
                                    terms.ranks_per_node(c["dp"] * c["cp"], c["tp"], rates.gpus_per_node)),
              data_parallel.DpGroup(expert_params, edp,
                                    terms.ranks_per_node(edp, c["etp"] * c["ep"], rates.gpus_per_node)))
    exposed = data_parallel.exposed_time(groups, span, rates, opts, m, forward_s, 2 * forward_s)
    # the dense model's optimizer step (levers.optimizer_step_time), once per optimizer: megatron-core
    # builds one for the dense parameters over DP x CP and one for the experts over the expert DP
    # group from the same OptimizerConfig (core_v0.15.2 optimizer/__init__.py:602-614 and :636-649;
    # core_v0.19.0 :1164-1178 and :1203-1217), so with --optimizer-cpu-offload each is a
    # HybridDeviceOptimizer of the same fraction (core_v0.15.2 :310-351, core_v0.19.0 :502-543) that
    # DistributedOptimizer rebuilds over its rank's shard (distrib_optimizer.py core_v0.15.2
    # :598-601, core_v0.19.0 :778-781) and offloads that fraction of (hybrid_optimizer.py:258-273,
    # both releases); ChainedOptimizer steps them one after the other (optimizer.py core_v0.15.2
    # :1238-1248, core_v0.19.0 :1635-1644). Megatron-FSDP builds one over both
    # (core_v0.15.2 :545-580, core_v0.19.0 :1083-1136): the same fraction of the same total, the same price
    step = levers.optimizer_step_time
    return exposed, (step(dense_params, c["dp"] * c["cp"], rates, opts, host) + step(expert_params, edp, rates, opts, host))
