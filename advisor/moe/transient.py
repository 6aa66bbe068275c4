"""What one MoE layer holds beyond the activations it keeps (``advisor.moe.memory``), on one GPU,
one function each with its source: its transient peaks, forward and backward, one layer at a
time, for each dispatcher, with the grouped GEMM's workspaces; and what every MoE layer's
dispatcher holds between its forwards. Sources: megatron-core core_v0.15.2
``transformer/moe/moe_layer.py``, ``token_dispatcher.py`` and ``moe_utils.py`` (core_v0.19.0's
where marked v0.19), Transformer Engine for the workspaces; measured against the symbolic layer
(docs/profiling.md, docs/moe.md, tests/test_symbolic_moe.py, tests/test_symbolic_moe_held.py).

Sizes are bytes for one microbatch, as in ``advisor.moe.memory``: N the tokens a rank routes
(``tokens_per_rank``), c the token copies its local experts process (``expert_token_copies``),
under a routing assumption (``RoutedTokens``).
"""

from __future__ import annotations

import numpy as np

from advisor.moe.memory import (BF16, PROBS_BYTES, Dispatcher, RoutedTokens, flex_received_tokens,
                                gathered_tokens, local_experts, sent_token_copies)
from advisor.moe.spec import MoESpec


# --- transient buffers (one layer at a time) --------------------------------------------------


def flex_buffer_bytes(spec: MoESpec, copies: float) -> float:
    """The flex dispatcher's buffers (``MoEFlexTokenDispatcher`` with DeepEP, ``fused_a2a.py``):
    DeepEP permutes inside its kernels and sends from its own registered buffers, whose size is
    the received copies (2h each) again. Not measured: DeepEP needs CUDA, and the symbolic layer
    (docs/profiling.md) cannot build this dispatcher; kept as it was priced before the alltoall
    and allgather terms were measured."""
    return copies * BF16 * spec.hidden_size


# The alltoall dispatcher's forward (megatron-core core_v0.15.2 ``transformer/moe/moe_layer.py``,
# ``MoELayer.forward``'s custom_forward and ``routed_experts_compute``; ``token_dispatcher.py``,
# ``MoEAlltoAllTokenDispatcher``; the same in core_v0.19.0). Sizes: S = sent copies x 2h, r =
# c / etp the copies the EP all-to-all brings (c the copies the local experts process), BF16.


def a2a_send_bytes(spec: MoESpec, tokens: float, assumption: RoutedTokens) -> float:
    """The permuted send buffer S (``dispatch_preprocess``'s ``permute``): custom_forward rebinds
    its hidden_states to it (moe_layer.py:274; v0.19 :656), alive until the layer's output.
    The combine's all-to-all output (``token_combine``, token_dispatcher.py:770) is as large."""
    return sent_token_copies(spec, tokens, assumption) * BF16 * spec.hidden_size


def a2a_received_bytes(spec: MoESpec, copies: float, ep, etp) -> np.ndarray:
    """The all-to-all's output (``token_dispatch``, token_dispatcher.py:626; custom_forward's
    ``dispatched_input``, moe_layer.py:275, v0.19 :673, alive until the layer's output), r x 2h,
    where it is not what the experts keep: with several local experts they keep its sorted copy
    (``dispatch_postprocess``, ``sort_chunks_by_idxs``, :692), with etp > 1 its all-gather over the
    expert TP group (:656); with one local expert and etp 1 it is the experts' kept input."""
    etp = np.asarray(etp, dtype=float)
    copy = copies / etp * BF16 * spec.hidden_size
    return np.where((local_experts(spec, ep) > 1) | (etp > 1), copy, 0.0)


def expert_output_bytes(spec: MoESpec, copies: float) -> float:
    """The experts' output, c x 2h (FC2's, saved by nothing): ``routed_experts_compute``'s
    ``expert_output`` (moe_layer.py:231), alive until it returns."""
    return copies * BF16 * spec.hidden_size


def unsort_bytes(spec: MoESpec, copies: float, ep) -> np.ndarray:
    """``combine_preprocess``'s unsort of the experts' output by source rank
    (``sort_chunks_by_idxs``, token_dispatcher.py:727), c x 2h, with several local experts."""
    return np.where(local_experts(spec, ep) > 1, copies * BF16 * spec.hidden_size, 0.0)


def etp_cast_bytes(spec: MoESpec, copies: float, etp) -> np.ndarray:
    """With etp > 1, ``combine_preprocess`` reduce-scatters over the expert TP group a copy of the
    experts' output in the probabilities' dtype, ``hidden_states.to(self.probs.dtype)``
    (token_dispatcher.py:740; v0.19 :822-825): c x h x 4 (FP32)."""
    return np.where(np.asarray(etp) > 1, copies * PROBS_BYTES * spec.hidden_size, 0.0)


def etp_reduce_scatter_bytes(spec: MoESpec, copies: float, etp) -> np.ndarray:
    """The reduce-scatter's FP32 output (``reduce_scatter_to_sequence_parallel_region``,
    token_dispatcher.py:739), r x h x 4, made while its input (``etp_cast_bytes``) is alive."""
    etp = np.asarray(etp, dtype=float)
    return np.where(etp > 1, copies / etp * PROBS_BYTES * spec.hidden_size, 0.0)


def shared_expert_output_bytes(spec: MoESpec, tokens: float) -> float:
    """The shared experts' output, N x 2h: ``custom_forward`` computes it first
    (``shared_experts_compute``, moe_layer.py:273) and adds it to the combined output last."""
    return tokens * BF16 * spec.hidden_size if spec.shared_expert_size else 0.0


def a2a_routing_held_bytes(spec: MoESpec, tokens: float, assumption: RoutedTokens = RoutedTokens()) -> float:
    """What the alltoall dispatcher holds of the router's output (``dispatch_preprocess``:
    self.probs, self.routing_map, token_dispatcher.py:570-571, v0.19 :636-637) until the layer's
    next forward that autograd does not keep, in both peaks: the FP32 probabilities, N x E x 4
    (``permute`` saves their transposed copy, moe_utils.py:298, v0.19 :544), and the bool map,
    N x E, except with capacity routing: there the map is the capacity mask
    (``apply_router_token_dropping``, ``final_probs = routing_probs * final_map``, moe_utils.py:706
    and :710, v0.19 :1015 and :1019), which the product saves, a kept router activation (measured:
    Qwen3-30B-A3B at EP 8, capacity 1.25 padded, 2 MiB held, not 2.5)."""
    held_map = 0.0 if assumption.routing == "capacity" else 1.0
    return tokens * spec.num_experts * (PROBS_BYTES + held_map)


def a2a_received_probs_bytes(spec: MoESpec, copies: float, ep, etp) -> np.ndarray:
    """The all-to-all's received FP32 probabilities, r x 4 (``token_dispatch``'s ``global_probs``,
    token_dispatcher.py:629, v0.19 :711): ``custom_forward`` rebinds its ``probs`` to them
    (moe_layer.py:275, v0.19 :673), alive until the layer's output, unkept where the experts keep
    another tensor (``a2a_received_bytes``' condition: the sorted copy with several local
    experts, the expert-TP all-gather with etp > 1); with one local expert and etp 1 they are the
    probabilities the experts keep. Measured: 1 MiB on Qwen3-30B-A3B dropless at EP 8 (r = 262144)."""
    etp = np.asarray(etp, dtype=float)
    return np.where((local_experts(spec, ep) > 1) | (etp > 1), copies / etp * PROBS_BYTES, 0.0)


def a2a_forward_peak_bytes(spec: MoESpec, tokens: float, copies: float, ep, etp,
                           assumption: RoutedTokens = RoutedTokens()) -> np.ndarray:
    """The alltoall layer's forward peak beyond what it keeps, the larger of two moments, with the
    shared experts' output alive at both: (1) ``combine_preprocess`` (reduce-scattering, or
    unsorting): S, the all-to-all's output, the experts' output, its unsorted copy, the FP32 cast
    and the reduce-scatter's output; (2) ``token_combine``'s all-to-all: S, the all-to-all's output,
    what ``routed_experts_compute`` returned (c x 2h, or r x 2h reduce-scattered with etp > 1) and
    the combine all-to-all's output (S again); and the received probabilities custom_forward holds
    (``a2a_received_probs_bytes``) and the routing the dispatcher holds
    (``a2a_routing_held_bytes``). As megatron-core 0.16.1 and core_v0.19.0 run it (v0.19 moe_layer.py:678:
    ``output = self.combine(output)`` frees the routed output before the unpermute);
    core_v0.15.2's ``combine`` (moe_layer.py:245-249) holds it through the unpermute, N x 2h
    more at that moment, not priced (docs/moe.md)."""
    send = a2a_send_bytes(spec, tokens, assumption)
    received = a2a_received_bytes(spec, copies, ep, etp)
    returned = np.where(np.asarray(etp) > 1, copies / np.asarray(etp, dtype=float), copies) * BF16 * spec.hidden_size
    preprocess = (send + received + expert_output_bytes(spec, copies) + unsort_bytes(spec, copies, ep)
                  + etp_cast_bytes(spec, copies, etp) + etp_reduce_scatter_bytes(spec, copies, etp))
    combine = 2 * send + received + returned
    return np.maximum(preprocess, combine) + shared_expert_output_bytes(spec, tokens) \
        + a2a_received_probs_bytes(spec, copies, ep, etp) + a2a_routing_held_bytes(spec, tokens, assumption)


def a2a_reduce_scatter_backward_bytes(spec: MoESpec, copies: float, etp) -> np.ndarray:
    """With etp > 1, the backward of ``combine_preprocess``'s reduce-scatter (token_dispatcher.py:
    739-741, v0.19 :822-825; ``_ReduceScatterToSequenceParallelRegion.backward``, an all-gather):
    its FP32 output, c x h x 4, beside its incoming gradient (the outer cast's, r x h x 4), then
    beside its own BF16 cast (``hidden_states.to(self.probs.dtype)``'s backward, c x 2h), made
    after autograd frees the incoming one: c 4h + max(r 4h, c 2h). The cast leads at etp > 2
    (measured: Qwen3-30B-A3B at EP 2 ETP 4, 1536 MiB = 1024 + 512, where c 4h + r 4h = 1280 was
    priced before 2026-11-29)."""
    etp = np.asarray(etp, dtype=float)
    gathered = copies * PROBS_BYTES * spec.hidden_size
    incoming = np.maximum(copies / etp * PROBS_BYTES, copies * BF16) * spec.hidden_size
    return np.where(etp > 1, gathered + incoming, 0.0)


def a2a_backward_peak_bytes(spec: MoESpec, tokens: float, copies: float, ep, etp,
                            assumption: RoutedTokens = RoutedTokens()) -> np.ndarray:
    """The alltoall layer's backward peak beyond what it keeps (each moment measured: the symbolic
    layer's ``transient_bytes``, docs/moe.md), with the routing the dispatcher holds
    (``a2a_routing_held_bytes``), the largest of, in the order the backward runs them: the combine
    all-to-all's (the gradient of its output, S, ``unpermute``'s backward, a gather, beside the
    all-to-all's backward output, r x 2h); with etp > 1 the reduce-scatter's
    (``a2a_reduce_scatter_backward_bytes``); with several local experts the unsort's
    (``sort_chunks_by_idxs``'s split, token_dispatcher.py:727, moe_utils.py:419-420: its backward
    concatenates, c x 2h, beside its incoming gradient, c x 2h: the all-to-all's at etp 1, where
    r = c, the cast's at etp > 1); FC2's (``expert_fc2_backward_bytes``: the experts and their
    backward are the allgather dispatcher's, ``routed_experts_compute``, moe_layer.py:231); FC1's
    output gradient (``expert_transient_bytes``). Under balanced routing (r = S / 2h at etp 1) the
    unsort's equals the combine's and FC2's never leads (it is the mean of the unsort's and FC1's
    at etp 1, below the reduce-scatter's or FC1's at etp > 1); with dropless or imbalanced routing
    the busiest rank receives more copies than it sends (c > S / 2h): the unsort's leads with
    several local experts where h > h_moe (Qwen3-30B-A3B dropless at EP 8: 2048 MiB), FC2's with
    one (at EP 128: 2816 MiB; both measured, 896 and 640 MiB above what was priced before
    2026-11-29)."""
    etp = np.asarray(etp, dtype=float)
    combine = a2a_send_bytes(spec, tokens, assumption) + copies / etp * BF16 * spec.hidden_size
    unsort = 2 * unsort_bytes(spec, copies, ep)
    experts = experts_backward_peak_bytes(spec, copies, etp)
    moments = np.maximum(np.maximum(combine, a2a_reduce_scatter_backward_bytes(spec, copies, etp)),
                         np.maximum(unsort, experts))
    return moments + a2a_routing_held_bytes(spec, tokens, assumption)


# The allgather dispatcher (``MoEAllGatherTokenDispatcher``, token_dispatcher.py:203-330, over
# ``tp_ep_group``, the expert TP x EP group): it gathers T = N etp ep tokens, every token of the
# group, when etp ep > 1 (``token_dispatch``, :245). Lines are core_v0.15.2's, as above, and
# core_v0.19.0's where marked v0.19 (megatron-core 0.16.1's, which the symbolic layer runs, differ).


def allgather_buffer_bytes(spec: MoESpec, tokens: float, ep, etp) -> np.ndarray:
    """The gathered tokens, T x 2h, in megatron's global memory buffer (``token_dispatch``,
    ``gather_from_sequence_parallel_region(..., use_global_buffer=True)``, token_dispatcher.py:260,
    v0.19 :297; ``parallel_state.get_global_memory_buffer``, ``utils.py``, ``GlobalMemoryBuffer``):
    allocated once and never freed, so it sits beside every later tensor, the backward's too."""
    return gathered_tokens(tokens, ep, etp) * BF16 * spec.hidden_size


def allgather_map_held_bytes(spec: MoESpec, tokens: float, ep, etp, assumption: RoutedTokens = RoutedTokens(),
                             recomputed: bool = False) -> np.ndarray:
    """The local routing map the allgather dispatcher holds, ``self.local_map`` (token_dispatcher.py:272,
    v0.19 :309): the local experts' columns of the routing map, gathered where etp ep > 1, bool,
    max(T, N) x E / ep, held until the layer's next forward and saved by no autograd node (the
    ``masked_select`` saves its transposed copy, :289, v0.19 :328): alive through the backward, unkept
    (measured: 0.5 MiB on Qwen3-30B-A3B at EP 1, where it is the router's own map: ``.contiguous()``
    of all E columns returns the map itself). With capacity routing the router's map is the capacity
    mask that its product saves (``apply_router_token_dropping``, moe_utils.py:706 and :710, v0.19
    :1015 and :1019), a kept router activation, as the alltoall's (``a2a_routing_held_bytes``): where
    nothing is gathered the local map is that mask, none held beyond, unless the layer is
    ``recomputed`` (its forward without autograd saves nothing). Measured: Qwen3-30B-A3B at EP 1,
    capacity 1.25 padded, both peaks 0.5 MiB under the dropless pricing (tests/test_symbolic_moe.py)."""
    gathered = gathered_tokens(tokens, ep, etp)
    held = np.maximum(gathered, tokens) * local_experts(spec, ep)
    if assumption.routing != "capacity" or recomputed:
        return held
    return np.where(gathered > 0, held, 0.0)


def allgather_routing_held_bytes(spec: MoESpec, tokens: float, ep, etp,
                                 assumption: RoutedTokens = RoutedTokens()) -> np.ndarray:
    """The routing alive through the allgather layer's forward, as megatron-core 0.16.1 and
    core_v0.19.0 run it: ``custom_forward``'s ``routing_map``, the router's, N x E bool
    (``probs, routing_map = self.route(...)``, v0.19 moe_layer.py:655; core_v0.15.2's
    ``router_and_preprocess`` drops it, N x E less, not priced); its ``probs``, rebound to the
    gathered probabilities (``dispatched_input, probs = self.dispatch(...)``, moe_layer.py:275,
    v0.19 :673; the gather, token_dispatcher.py:256, v0.19 :293), max(T, N) x E x 4 (FP32), the
    router's N x E x 4 freed; and where tokens are gathered the dispatcher's local map
    (``allgather_map_held_bytes``), T x E / ep (at T = 0 it is the router's map). The gathered map
    (T x E bool) is freed with ``self.routing_map = None`` (:292) unless it is the local map (ep 1).
    Measured (Qwen3-30B-A3B, N 4096, E 128): 0.5 + 2 at EP 1; 0.5 + 4 + 0.5 at EP 2 (T 8192);
    0.5 + 8 + 1 at EP 2 ETP 2 and 0.5 + 8 + 2 at EP 1 ETP 4 (T 16384) MiB, where N x E x 5 (2.5)
    was priced before 2026-11-29. With capacity routing the router's map is the capacity mask its
    product saves, kept (``allgather_map_held_bytes``), at any EP: 2 at EP 1, 4 + 0.5 at EP 2,
    measured (0.5 more was priced before 2026-11-29)."""
    gathered = gathered_tokens(tokens, ep, etp)
    probs = np.maximum(gathered, tokens) * spec.num_experts * PROBS_BYTES
    local_map = np.where(gathered > 0, allgather_map_held_bytes(spec, tokens, ep, etp), 0.0)
    router_map = 0.0 if assumption.routing == "capacity" else tokens * spec.num_experts
    return router_map + probs + local_map


def allgather_combine_bytes(spec: MoESpec, tokens: float, ep, etp) -> np.ndarray:
    """``token_combine``'s reduce-scatter (token_dispatcher.py:323, v0.19 :362): its input, the
    unpermuted rows (``combine_preprocess``'s ``unpermute``, T x 2h), their copy in the
    probabilities' dtype (``.to(self.local_probs.dtype)``, T x 4h) and its output (N x 4h). Its
    backward holds the same two large tensors: the all-gather's FP32 output (T x 4h) and its BF16
    cast (T x 2h)."""
    gathered = gathered_tokens(tokens, ep, etp)
    return gathered * (BF16 + PROBS_BYTES) * spec.hidden_size \
        + np.where(gathered > 0, tokens, 0.0) * PROBS_BYTES * spec.hidden_size


def allgather_unpermute_bytes(spec: MoESpec, tokens: float, copies: float, ep, etp) -> np.ndarray:
    """``combine_preprocess``'s unpermute (token_dispatcher.py:304, v0.19 :343): its output, a row
    for every token gathered (T x 2h; N x 2h where nothing is gathered), beside the experts' output
    it reads (c x 2h, ``routed_experts_compute``'s local, moe_layer.py:231)."""
    rows = np.maximum(gathered_tokens(tokens, ep, etp), tokens)
    return (copies + rows) * BF16 * spec.hidden_size


def allgather_forward_peak_bytes(spec: MoESpec, tokens: float, copies: float, ep, etp,
                                 assumption: RoutedTokens = RoutedTokens()) -> np.ndarray:
    """The allgather layer's forward peak beyond what it keeps: the global buffer, the shared
    experts' output and the routing held (``allgather_routing_held_bytes``), beside the larger of
    the combine's reduce-scatter (``allgather_combine_bytes``) and the unpermute
    (``allgather_unpermute_bytes``), which leads where nothing is gathered or the copies outnumber
    twice the rows, c > 2 (T + N), k > 2 ep + 2 / etp: top-8 Qwen3-30B-A3B at EP 1 and 2 (measured
    146.5 MiB at EP 1: c 2h 128 + N 2h 16 + 2.5; at EP 2: c 2h 128 + T 2h 32 + the buffer 32 + 5 =
    197), the combine elsewhere (Mixtral at EP 2: T 6h 192 + N 4h 64 + the buffer 64 + 0.3125 =
    320.3125 MiB, measured)."""
    return (allgather_buffer_bytes(spec, tokens, ep, etp) + shared_expert_output_bytes(spec, tokens)
            + allgather_routing_held_bytes(spec, tokens, ep, etp, assumption)
            + np.maximum(allgather_combine_bytes(spec, tokens, ep, etp),
                         allgather_unpermute_bytes(spec, tokens, copies, ep, etp)))


def expert_fc2_backward_bytes(spec: MoESpec, copies: float, etp) -> np.ndarray:
    """FC2's backward (``TEGroupedMLP.forward``'s linear_fc2, experts.py:954): its incoming
    gradient, the experts' output's (c x 2h, made by the unpermute's backward: ``scatter_add_``'s
    gradient is a gather, moe_utils.py:390, v0.19 :566), beside FC2's input gradient
    (c x 2 h_moe / etp), before autograd frees FC2's saved input. Above FC1's output gradient
    (``expert_transient_bytes``) where h > h_moe / etp: Qwen3-30B-A3B's 2048 and 768."""
    return copies * BF16 * (spec.hidden_size + spec.moe_ffn_hidden_size / np.asarray(etp, dtype=float))


def experts_backward_peak_bytes(spec: MoESpec, copies: float, etp) -> np.ndarray:
    """The experts' backward peak, the larger of FC2's moment (``expert_fc2_backward_bytes``) and
    FC1's output gradient (``expert_transient_bytes``): the same whatever the dispatcher, which
    hands the experts their rows and takes their output (``routed_experts_compute``,
    moe_layer.py:231)."""
    return np.maximum(expert_fc2_backward_bytes(spec, copies, etp), expert_transient_bytes(spec, copies, etp))


def allgather_backward_peak_bytes(spec: MoESpec, tokens: float, copies: float, ep, etp,
                                  assumption: RoutedTokens = RoutedTokens()) -> np.ndarray:
    """The allgather layer's backward peak beyond what it keeps (each moment measured: the
    symbolic layer's ``transient_bytes``, docs/moe.md): the global buffer and the local map the
    dispatcher holds (``allgather_map_held_bytes``), beside the largest of, in the order the
    backward runs them: the reduce-scatter's (T x 4h FP32 all-gathered and its T x 2h BF16 cast,
    ``_ReduceScatterToSequenceParallelRegion.backward`` then the cast's; the N x 4h FP32 gradient
    it gathers is freed before the cast, and is no more than T x 2h, T >= 2N); the unpermute's
    (that cast, T x 2h, beside its gather, c x 2h; at T = 0 its incoming gradient is the layer
    output's); FC2's (``expert_fc2_backward_bytes``); the SwiGLU's (FC1's output gradient,
    ``expert_transient_bytes``)."""
    hidden, gathered = spec.hidden_size, gathered_tokens(tokens, ep, etp)
    combine = gathered * (BF16 + PROBS_BYTES) * hidden
    unpermute = (gathered + copies) * BF16 * hidden
    experts = experts_backward_peak_bytes(spec, copies, etp)
    return (allgather_buffer_bytes(spec, tokens, ep, etp) + allgather_map_held_bytes(spec, tokens, ep, etp, assumption)
            + np.maximum(np.maximum(combine, unpermute), experts))


def layer_transient_peaks(spec: MoESpec, tokens: float, copies: float, ep, etp, dispatcher: Dispatcher,
                          assumption: RoutedTokens = RoutedTokens(), flex_backend: str = "deepep") -> tuple:
    """(forward, backward) peaks of one MoE layer beyond what it keeps, for the alltoall and
    allgather dispatchers (measured: the symbolic layer's ``transient_bytes``, docs/profiling.md);
    for flex, its buffers (``flex_buffer_bytes``) and the experts' backward peak
    (``experts_backward_peak_bytes``, as the others') summed, unmeasured, with the routing it holds
    (``flex_held_bytes``) as the others' peaks hold theirs."""
    if dispatcher == "allgather":
        return (allgather_forward_peak_bytes(spec, tokens, copies, ep, etp, assumption),
                allgather_backward_peak_bytes(spec, tokens, copies, ep, etp, assumption))
    if dispatcher == "flex":
        held = flex_held_bytes(spec, tokens, copies, ep, etp, assumption, flex_backend)
        return flex_buffer_bytes(spec, copies) + experts_backward_peak_bytes(spec, copies, etp) + held, 0.0
    return (a2a_forward_peak_bytes(spec, tokens, copies, ep, etp, assumption),
            a2a_backward_peak_bytes(spec, tokens, copies, ep, etp, assumption))


def moe_layer_transient_bytes(spec: MoESpec, tokens: float, copies: float, ep, etp, dispatcher: Dispatcher,
                              assumption: RoutedTokens = RoutedTokens(), grouped_gemm: bool = True,
                              flex_backend: str = "deepep") -> np.ndarray:
    """What one MoE layer holds at its peak beyond what it keeps, one layer at a time: the larger
    of its forward and backward peaks (``layer_transient_peaks``), plus the grouped GEMM's
    workspaces (``grouped_gemm_workspace_bytes``), which the symbolic layer does not allocate."""
    forward, backward = layer_transient_peaks(spec, tokens, copies, ep, etp, dispatcher, assumption, flex_backend)
    return np.maximum(forward, backward) + grouped_gemm_workspace_bytes(grouped_gemm)


# --- what every MoE layer's dispatcher holds between its forwards -----------------------------
# Each MoE layer builds its own dispatcher (``MoELayer.__init__``, moe_layer.py), whose attributes
# hold tensors from the layer's forward until its next forward, set in the forward and never
# cleared: a stage with L MoE layers holds L sets at its peak, whichever layer is at its transient
# peak (measured: three real megatron-core layers on fake tensors hold three times one layer's,
# after the forward and after the backward; tests/test_symbolic_moe_held.py). What autograd
# saves among them is a kept activation while its microbatch is in flight; after the layer's
# backward of that microbatch it is held, no longer kept, in place of the layer's freed
# activations, which are larger, so it never lifts a stage above its microbatches in flight (1F1B
# or interleaved: a layer's newest forward is of a microbatch in flight until the cooldown, when
# fewer are; at PP 1 the layers not yet run hold the previous microbatch's). What no autograd node
# saves is held beyond them at every moment. A recomputed layer (--recompute-granularity full, or
# 'moe' in --recompute-modules: ``tensor_parallel.checkpoint``) runs its forward without autograd:
# nothing is saved, and all of it is held beyond. Lines are core_v0.15.2's, as above.


def alltoall_held_bytes(spec: MoESpec, tokens: float, assumption: RoutedTokens = RoutedTokens(),
                        recomputed: bool = False) -> float:
    """``MoEAlltoAllTokenDispatcher``'s: self.probs and self.routing_map (``a2a_routing_held_bytes``);
    recomputed, the map whatever the routing and self.reversed_local_input_permutation_mapping,
    ``permute``'s int64 sorted indices, one per copy sent (token_dispatcher.py:596,
    moe_utils.py:295; the permutation's index_select saves them otherwise). The rest is host-side
    or per expert (the splits, ``num_global_tokens_per_local_expert``)."""
    if not recomputed:
        return a2a_routing_held_bytes(spec, tokens, assumption)
    return tokens * spec.num_experts * (PROBS_BYTES + 1) + sent_token_copies(spec, tokens, assumption) * 8


def allgather_held_bytes(spec: MoESpec, tokens: float, copies: float, ep, etp, recomputed: bool = False,
                         assumption: RoutedTokens = RoutedTokens()):
    """``MoEAllGatherTokenDispatcher``'s: self.local_map (``allgather_map_held_bytes``; the gathered
    map is dropped, token_dispatcher.py:292; with capacity routing, where nothing is gathered, the
    router's kept capacity mask); recomputed, self.local_probs, the experts' FP32
    probabilities (:289), and self.reversed_local_input_permutation_mapping, int64 (:282), one of
    each per copy its experts process, which the experts and the permutation save otherwise."""
    held = allgather_map_held_bytes(spec, tokens, ep, etp, assumption, recomputed)
    return held + (copies * (PROBS_BYTES + 8) if recomputed else 0.0)


def flex_held_bytes(spec: MoESpec, tokens: float, copies: float, ep, etp,
                    assumption: RoutedTokens = RoutedTokens(), backend: str = "deepep", recomputed: bool = False):
    """``MoEFlexTokenDispatcher``'s manager's, by backend, over k' = etp k and etp E (the map and
    probabilities expanded over the expert-TP ranks, ``_initialize_metadata``, token_dispatcher.py:
    1200). DeepEP (``_DeepepManager``): the top-k FP32 probabilities, N k' 4 (:977; its fused
    dispatch saves only its handle, fused_a2a.py), and of the R tokens it receives
    (``flex_received_tokens``) the int64 indices R k' 8 (:1007) and the multihot FP32
    probabilities and bool map R E / ep 5 (:1106; ``permute`` saves their transposed copies);
    with capacity routing the masked indices, N k' 8 (:981; the top-k saves its own otherwise).
    core_v0.19.0 frees the received indices and probabilities at the combine (:1380-1381): R (k' 8 +
    E / ep 4) less, not priced. HybridEP (megatron-core 0.16.1, v0.19): the expanded map and
    probabilities, N etp E 5 (0.16.1 :1004-1005, v0.19 :1087-1088; its dispatch saves its handle).
    NCCL-EP (v0.19): the top-k probabilities, N k' 4 (:1590). Recomputed, what autograd saves
    otherwise too: DeepEP's top-k indices N k' 8 and permutation indices c 8 (:1116); HybridEP's
    received probabilities c 4; NCCL-EP's top-k indices. Unmeasured: DeepEP needs CUDA."""
    etp = np.asarray(etp, dtype=float)
    topk = tokens * spec.moe_router_topk * etp
    if backend == "hybridep":
        return tokens * etp * spec.num_experts * (PROBS_BYTES + 1) + (copies * PROBS_BYTES if recomputed else 0.0)
    if backend == "ncclep":
        return topk * (PROBS_BYTES + (8 if recomputed else 0))
    received = flex_received_tokens(spec, tokens, copies, ep, etp, assumption)
    indices = topk * 8 if recomputed or assumption.routing == "capacity" else 0.0
    return (topk * PROBS_BYTES + received * (spec.moe_router_topk * etp * 8 + local_experts(spec, ep) * 5)
            + indices + (copies * 8 if recomputed else 0.0))


def dispatcher_held_bytes(spec: MoESpec, tokens: float, copies: float, ep, etp, dispatcher: Dispatcher,
                          assumption: RoutedTokens = RoutedTokens(), recomputed: bool = False,
                          flex_backend: str = "deepep") -> np.ndarray:
    """What one MoE layer's dispatcher holds from its forward until its next beyond what autograd
    keeps (the section's comment): ``alltoall_held_bytes``, ``allgather_held_bytes`` or
    ``flex_held_bytes``. Unrecomputed, each layer's transient peak (``layer_transient_peaks``)
    holds its own."""
    if dispatcher == "allgather":
        return allgather_held_bytes(spec, tokens, copies, ep, etp, recomputed, assumption)
    if dispatcher == "flex":
        return flex_held_bytes(spec, tokens, copies, ep, etp, assumption, flex_backend, recomputed)
    return np.asarray(alltoall_held_bytes(spec, tokens, assumption, recomputed), dtype=float)


def routing_held_by_other_layers_bytes(spec: MoESpec, moe_layers, tokens: float, copies: float, ep, etp,
                                       dispatcher: Dispatcher, assumption: RoutedTokens = RoutedTokens(),
                                       recomputed: bool = False, flex_backend: str = "deepep") -> np.ndarray:
    """What the stage's other MoE layers' dispatchers hold while one is at its transient peak:
    (moe_layers - 1) x ``dispatcher_held_bytes`` (the MTP layers' MoE layers among them). Qwen3-30B-A3B
    at PP 1 (48 layers, N 4096, E 128), alltoall: 47 x N E 5 B = 117.5 MiB; recomputed, 47 x (2.5
    + N k 8 B = 0.25) = 129.25 MiB."""
    others = np.maximum(np.asarray(moe_layers, dtype=float) - 1, 0.0)
    return others * dispatcher_held_bytes(spec, tokens, copies, ep, etp, dispatcher, assumption, recomputed,
                                          flex_backend)


GROUPED_GEMM_WORKSPACE_BYTES = 4 * (32 * 2**20 + 256)
"""Transformer Engine's grouped GEMM gets one cuBLAS workspace per stream
(``transformer_engine/pytorch/module/base.py``, get_multi_stream_cublas_workspace: one
get_cublas_workspace_size_bytes() tensor, 32 MiB + 256 B on Hopper, for each of
tex.get_num_cublas_streams(), 4), allocated once per process."""


def grouped_gemm_workspace_bytes(grouped_gemm: bool = True) -> float:
    """The grouped GEMM's cuBLAS workspaces (``GROUPED_GEMM_WORKSPACE_BYTES``); 0 without --moe-grouped-gemm."""
    return GROUPED_GEMM_WORKSPACE_BYTES if grouped_gemm else 0.0


def expert_transient_bytes(spec: MoESpec, copies: float, etp: int) -> float:
    """FC1's output gradient in the experts' backward (2 h_moe / etp per copy, BF16), beside the
    recomputed or kept SwiGLU input: their backward peak where h <= h_moe / etp
    (``experts_backward_peak_bytes``)."""
    return copies * BF16 * 2 * spec.moe_ffn_hidden_size / etp
