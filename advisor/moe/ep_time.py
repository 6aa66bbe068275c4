"""Time terms of expert parallelism's token dispatch, per GPU and MoE layer, vectorised over
layouts: the EP all-to-all of each dispatcher, the token permutations around it, the dropless
dispatcher's host wait, and megatron-core's combined 1F1B that overlaps the communication with
the other microbatch's compute. ``advisor.moe.time`` assembles them into a layer's time.

Assumptions, stated once:
- The EP all-to-all (dispatch and combine, forward and backward: four per layer): alltoall sends
  one copy per routed expert, across nodes at NCCL's all-to-all rate as nccl-tests measured it
  elsewhere (``A2A_NETWORK_FRACTION``, ``A2A_PEER_S``), not the line rate; flex (DeepEP / HybridEP)
  one per remote node and one per destination rank (``flex_destinations``; routing uniform, as
  forced balancing draws it); allgather gathers every token of the expert TP x EP group and
  reduce-scatters the combine (``allgather_dispatch_time``). Exposed on the compute stream
  (``token_dispatcher.py``), except with --overlap-moe-expert-parallel-comm: combined 1F1B
  (``overlapped_layer_time``) in the steady state, plain in the fill and drain.
- The token permutations as megatron-core runs them unfused (no --moe-permute-fusion): the
  permutation by expert and its inverse at ``PERMUTE_HBM_FRACTION`` of the HBM rate, measured on
  one GPU elsewhere (``python -m tables.moe_kernel_probe``).
- The dropless dispatcher's host wait for the token counts (``host_sync_idle``): one per MoE
  layer forward, the GPU idle for the launches after it until it has work, at ``HOST_LAUNCH_S``
  each (the documented upper end of a launch's host time).
"""

from __future__ import annotations

import numpy as np

from advisor.hardware import streaming_multiprocessors
from advisor.moe import memory as mm
from advisor.moe.spec import MoESpec
from advisor.throughput import terms
from advisor.throughput.terms import Rates

A2A_NETWORK_FRACTION = 0.834
"""What a multi-node NCCL all-to-all reaches of the network's line rate at large messages, and
what each message to a peer on another node costs besides (``A2A_PEER_S``): fitted on nccl-tests'
alltoall_perf on 2-8 nodes of H100s by ``python -m tables.published.alltoall_rate`` (measured
elsewhere; none of the MoE runs checked against enters it). NCCL's maintainers call line rate the
best case (nccl-tests #130, #267): an all-to-all cannot aggregate NICs and sends every peer its
own message. Not applied to the flex dispatcher, whose DeepEP kernels forward over NVLink."""
A2A_PEER_S = 10.4e-6


def all_to_all_time(spec: MoESpec, copies, ep, etp, rates: Rates, dispatcher: str = "alltoall"):
    """One all-to-all of ``copies`` tokens (2h bytes each) over an EP group of ``ep`` ranks,
    ``etp`` apart (the expert rank order tp-ep-dp-pp: ``parallel_state``, expert RankGenerator).
    alltoall: one copy per routed expert (``MoEAlltoAllTokenDispatcher`` permutes by local
    expert and sends every (token, expert) pair); the (ep - 1)/ep that leaves the rank splits
    into the peers inside the node, over NVLink, and those outside, over the GPU's network
    share at NCCL's measured all-to-all rate (``A2A_NETWORK_FRACTION`` of it, plus ``A2A_PEER_S``
    a remote peer). (The allgather dispatcher's is ``allgather_dispatch_time``.) flex (DeepEP,
    ``fused_a2a.py``: ``get_dispatch_layout``'s
    ``num_tokens_per_rdma_rank`` and ``is_token_in_rank``): each token once per remote node over
    RDMA and once per destination rank over NVLink (``flex_destinations``). The slower of the
    two links paces it."""
    ep, etp = np.asarray(ep, dtype=float), np.asarray(etp, dtype=float)
    size = copies * mm.BF16 * spec.hidden_size
    in_node = np.minimum(ep, np.maximum(1.0, rates.gpus_per_node / etp))
    if dispatcher == "flex":
        ranks, remote_nodes = flex_destinations(spec, ep, in_node)
        per_token = size / spec.moe_router_topk  # the copies of one token carry it k times
        inside = per_token * ranks * (in_node - 1) / in_node / rates.nvlink_bytes_per_s
        outside = per_token * remote_nodes / rates.line_network_bytes_per_s  # DeepEP at line rate
    else:
        inside = size * (in_node - 1) / ep / rates.nvlink_bytes_per_s
        # NCCL's measured fraction of the line rate, not of the rate the ring collectives' fitted
        # efficiency leaves (both applied, the network was discounted twice)
        outside = (size * (ep - in_node) / ep / (A2A_NETWORK_FRACTION * rates.line_network_bytes_per_s)
                   + (ep - in_node) * A2A_PEER_S)
    return np.where(ep > 1, np.maximum(inside, outside) + rates.collective_latency_s, 0.0)


def allgather_dispatch_time(spec: MoESpec, tokens, ep, etp, rates: Rates):
    """Dispatch and combine of the allgather dispatcher, one layer forward
    (``MoEAllGatherTokenDispatcher``, core_v0.15.2 ``token_dispatcher.py``): over its
    ``tp_ep_group``, the expert TP x EP group of g = etp ep ranks (consecutive in the expert rank
    order), the dispatch all-gathers every rank's N tokens (2h), their probabilities (4E, FP32
    with --moe-router-dtype fp32) and routing map (E); the combine reduce-scatters the g N
    unpermuted rows in the probabilities' dtype (4h). Rings (``terms.ring_collective_time``)
    over NVLink inside a node, else the network."""
    g = np.asarray(ep, dtype=float) * np.asarray(etp, dtype=float)
    link = terms.link_bandwidth(g, rates, np.minimum(g, rates.gpus_per_node))
    h, experts = spec.hidden_size, spec.num_experts
    dispatch = terms.ring_collective_time(g * tokens * (mm.BF16 * h + 5 * experts), g, link, rates)
    combine = terms.ring_collective_time(g * tokens * 4 * h, g, link, rates)
    return np.where(g > 1, dispatch + combine, 0.0)


def distinct_bins(bins, items, draws):
    """Expected bins hit when ``draws`` distinct items are drawn uniformly from ``items`` spread
    evenly over ``bins``: bins x (1 - C(items - items/bins, draws) / C(items, draws)), the
    hypergeometric chance that a bin gets none, as a product over the draws."""
    bins, items = np.asarray(bins, dtype=float), np.asarray(items, dtype=float)
    i = np.arange(int(draws)).reshape((-1,) + (1,) * np.ndim(bins * items))
    missed = np.prod(np.clip((items - items / bins - i) / (items - i), 0.0, None), axis=0)
    return bins * (1.0 - missed)


def flex_destinations(spec: MoESpec, ep, in_node):
    """(EP ranks, remote nodes) one token goes to under balanced routing, expected: its k experts
    drawn uniformly (Megatron's forced balancing draws random logits,
    ``moe_utils.apply_random_logits``) from the E experts, E / ep per rank, ``in_node`` ranks per
    node. Group-limited routing (``--moe-router-num-groups`` G, ``--moe-router-group-topk`` g,
    DeepSeek-V3's 8 and 4) first picks g of the G groups of contiguous experts: where every node
    holds whole groups a token reaches the nodes of g groups, taken as each getting one of its
    experts; where every group spans whole ranks it reaches the ranks of g E / G experts."""
    ep, in_node = np.asarray(ep, dtype=float), np.asarray(in_node, dtype=float)
    experts, k = spec.num_experts, spec.moe_router_topk
    nodes = ep / in_node
    ranks = distinct_bins(ep, experts, k)
    hit_nodes = distinct_bins(nodes, experts, k)
    groups, chosen = spec.router_num_groups, spec.router_group_topk
    if groups and chosen:
        whole_groups = (groups % nodes == 0) & (nodes > 1)
        hit_nodes = np.where(whole_groups, distinct_bins(np.where(whole_groups, nodes, 1.0), groups, chosen),
                             hit_nodes)
        spans = (ep % groups == 0)
        ranks = np.where(spans, distinct_bins(np.maximum(chosen * ep / groups, 1.0), chosen * experts / groups, k),
                         ranks)
    return ranks, hit_nodes * (nodes - 1) / nodes


PERMUTE_HBM_FRACTION = 0.42
"""What megatron-core's unfused permutation by expert and its inverse (``moe_utils.permute`` /
``unpermute``: index gathers, and the unpermutation's scatter-add of every routed copy,
``index_add``-style with atomics) reach of the calibrated HBM rate. Measured on one H200 at
Qwen3-30B-A3B's shape (4096 tokens, 32,768 routed copies of 2048 values, forward and backward):
0.99 ms of kernels against 0.42 ms at the rate (``benchmarks/gpu/time_moe_kernels.py``, derived by
``python -m tables.moe_kernel_probe``; no published run enters it). Held out, the same measurement
at Mixtral 8x7B's and DeepSeek-V3's shapes gave 0.38 and 0.46. The alltoall dispatcher's
second pair, the sort by local expert (``sort_chunks_by_idxs``: split and concatenate, plain
copies), measured 1.3 times faster than the rate: it keeps the rate."""


def permutation_time(spec: MoESpec, copies, ep, rates: Rates, dispatcher: str = "alltoall", fused: bool = False):
    """One layer's token permutations forward (``permutation_pairs``): unfused, the permutation by
    expert and its inverse at ``PERMUTE_HBM_FRACTION`` of the HBM rate, the alltoall dispatcher's
    sort by local expert at the rate; ``fused`` (--moe-permute-fusion: Transformer Engine's
    permutation kernels, ``moe_utils.fused_permute``), every pair at the rate (not measured here)."""
    by_expert, by_local_expert = permutation_pairs(spec, copies, ep, dispatcher)
    fraction = 1.0 if fused else PERMUTE_HBM_FRACTION
    return terms.elementwise_time(by_expert, rates) / fraction + terms.elementwise_time(by_local_expert, rates)


def permutation_pairs(spec: MoESpec, copies, ep, dispatcher: str = "alltoall"):
    """(by expert, by local expert): HBM bytes of one layer's two pairs of token permutations
    forward, each permutation reading and writing every token copy (2h bytes). The first, the
    permutation by expert before the dispatch and its inverse after the combine; the second, with
    the alltoall dispatcher and more than one local expert only (``token_dispatcher.py``,
    ``MoEAlltoAllTokenDispatcher``: 'Permutation 2: Sort tokens by local expert' after the
    all-to-all, 'Unpermutation 2' before the combine; the flex dispatcher's DeepEP receives them
    unsorted and permutes once)."""
    pair = 4 * np.asarray(copies, dtype=float) * mm.BF16 * spec.hidden_size
    second = (dispatcher == "alltoall") & (spec.num_experts / np.asarray(ep, dtype=float) > 1)
    return pair, pair * second


HOST_LAUNCH_S = 20e-6
"""Host time of one kernel launch from PyTorch: 'usually ... between 5-20 microseconds' on the
CPU side (Holistic Trace Analysis documentation, facebookresearch/HolisticTraceAnalysis
``docs/source/features/cuda_kernel_launch_stats.rst``). The upper end, an assumption: it bounds
what a host synchronisation in the dispatcher can leave the GPU idle for."""


def host_sync_idle(spec: MoESpec, tokens, rates: Rates, dispatcher: str = "alltoall",
                   routing: mm.RoutedTokens = mm.RoutedTokens()):
    """Seconds the GPU idles per MoE layer forward, one microbatch, while the host waits on the
    device for the dropless dispatcher's token counts (megatron-core core_v0.15.2 and
    core_v0.19.0 ``token_dispatcher.py``): the kernels the host launches after the wait, until
    the GPU has work again, times ``HOST_LAUNCH_S``. The backward's all-to-all and grouped GEMMs
    reuse the host copies: no wait there.
    - alltoall: one wait (``_maybe_dtoh_and_synchronize``'s ``d2h_event.synchronize()`` before
      the EP all-to-all, or before returning at EP x TP 1), after permutation 1 of the rank's
      N k copies (2h bytes each, read and written) is queued: idle only where one launch
      outlasts that permutation.
    - allgather: ``local_map.sum().cpu()`` before its permutation, nothing queued: one launch.
    - flex: DeepEP's normal-mode dispatch waits on the host for the receive counts
      (``fused_a2a.py``: 'the CPU will wait for GPU's signal to arrive') before launching the
      dispatch kernel: one launch.
    - alltoall with capacity routing padded to capacity, as the token-drop recipes run it
      (--moe-pad-expert-input-to-capacity): the counts are known on the host (``preprocess``'s
      drop_and_pad branch), no wait; not padded it waits as a dropless one does, and the
      allgather dispatcher copies its counts to the host whether padded or not."""
    tokens = np.asarray(tokens, dtype=float)
    if dispatcher == "alltoall" and routing.routing == "capacity" and routing.pad_to_capacity:
        return np.zeros_like(tokens)
    if dispatcher == "alltoall":
        permutation = terms.elementwise_time(2 * tokens * spec.moe_router_topk * mm.BF16 * spec.hidden_size, rates)
        return np.maximum(0.0, HOST_LAUNCH_S - permutation)
    return np.full_like(tokens, HOST_LAUNCH_S)


def overlapped_layer_time(rest, expert, comm, comm_sm_share=0.0, *, rest_again=0.0, expert_again=0.0,
                          rest_tp=(0.0, 0.0)):
    """One MoE layer's forward and backward, communication included, under
    --overlap-moe-expert-parallel-comm: ``rest`` and ``expert`` the forward's compute outside and
    inside the MLP, ``rest_again`` and ``expert_again`` what selective recomputation runs again in
    their backward (``advisor.moe.time.recomputed_forward``), ``comm`` the plain layer's
    communication (dispatch and combine, forward and backward). megatron-core's combined 1F1B
    (``models/common/model_chunk_schedule_plan.py``, ``TransformerLayerSchedulePlan.run``;
    core_v0.15.2) runs microbatch i + 1's forward of the layer beside microbatch i's backward,
    the communication on its own stream: combine backward beside attention forward (a), dispatch
    forward beside the MLP's backward, dispatch backward beside the MLP's forward (2x and x, in
    either order: --delay-wgrad-compute moves the MLP's weight gradient from the one to the
    other), combine forward beside attention backward (2a). Each communication c = comm / 4
    against its partner's compute w; a communication kernel holding a share f of the SMs
    (``comm_sm_share``: DeepEP's, ``DEEPEP_SMS``) slows w by f while both run:
    max(c, w + f c) per pair. ``rest_tp``: the rest's TP collectives (attention's, ``advisor.moe.time.
    tp_comm``), forward and in its backward node, on the compute stream with its work and so part of
    it, not priced at twice the forward. With no communication it is the plain compute 3a + 3x; with
    no compute, comm."""
    c = np.asarray(comm) / 4
    tp_forward, tp_backward = rest_tp
    return sum(paired_time(c, w, comm_sm_share)
               for w in (rest + tp_forward, expert, 2 * expert + expert_again, 2 * rest + rest_again + tp_backward))


def paired_time(comm, work, comm_sm_share=0.0):
    """Seconds of ``comm`` on one stream beside ``work`` on another: the longer of the two, the
    work slowed by the share f of the SMs the communication kernel holds while both run
    (``comm_sm_share``): max(c, w + f c). In series they take c + w; the pair saves
    min(w, (1 - f) c), never less than 0 and never more than the shorter of the two."""
    return np.maximum(comm, work + comm_sm_share * comm)


def shared_expert_hidden(pairs, comm_sm_share=0.0):
    """(forward, backward) seconds that --moe-shared-expert-overlap saves one MoE layer and
    microbatch: each (shared experts' work w, EP communication c) pair of ``pairs``
    (``advisor.moe.time.LayerTimes.shared_pairs``) runs as ``paired_time`` instead of in series,
    forward w beside c, backward 2w (every part's backward is priced at twice its forward) beside
    the same c. megatron-core (``shared_experts.py``, core_v0.15.2 and core_v0.19.0) runs the shared
    experts on their own CUDA stream inside the dispatcher's steps (``token_dispatcher.py``):
    ``linear_fc1_forward_and_act`` once the dispatch all-to-all is launched, ``linear_fc2_forward``
    once the combine's is; core_v0.19.0 says so ('Make sure the shared experts fc1 is overlapped
    with dispatch A2A'), and orders the backward the same way (``set_tensor_grad_fn_sequence_sr``:
    'Backward launch order: probs A2A -> tokens A2A -> shared experts fc1'; autograd runs each
    backward on its forward's stream)."""
    forward = sum(w + c - paired_time(c, w, comm_sm_share) for w, c in pairs)
    backward = sum(2 * w + c - paired_time(c, 2 * w, comm_sm_share) for w, c in pairs)
    return forward, backward


DEEPEP_SMS = 20
"""SMs DeepEP's dispatch and combine kernels take unless --moe-deepep-num-sms says otherwise
(megatron-core ``transformer_config.py``, ``moe_deepep_num_sms`` default 20, core_v0.15.2;
core_v0.19.0's ``token_dispatcher.py`` sets 20 when ``moe_flex_dispatcher_num_sms`` is unset),
which compute beside them loses. NCCL's all-to-all (the alltoall dispatcher) also runs on SMs, a
number NCCL picks: not priced."""


def comm_sm_share(dispatcher: str, architecture: str, sms: int | None = None) -> float:
    """The share of the SMs the overlapped EP communication takes from compute: the flex
    dispatcher's ``sms`` (--moe-deepep-num-sms; default ``DEEPEP_SMS``) of the GPU's."""
    if dispatcher != "flex":
        return 0.0
    return (DEEPEP_SMS if sms is None else sms) / streaming_multiprocessors(architecture)


def dispatcher_sms_problem(sms: int | None, dispatcher: str, architecture: str, gpu: str | None = None, *,
                           unnamed: str = "without --gpu, which sets it") -> str | None:
    """Why --moe-deepep-num-sms cannot be priced, or None: only the flex dispatcher reads it
    (megatron-core hands it to DeepEP's ``Buffer.set_num_sms``, ``fused_a2a.py``), DeepEP asserts
    an even count ('The SM count must be even', ``deep_ep/buffer.py``), and the kernels must leave
    the GPU some SMs to overlap with. ``gpu``: the preset's name, which the message names; None:
    ``architecture`` is assumed, and the message says so (``unnamed``: why, and what sets it)."""
    if sms is None:
        return None
    if dispatcher != "flex":
        return (f"--moe-deepep-num-sms {sms}: only the flex dispatcher's DeepEP kernels take it; give "
                "--moe-token-dispatcher-type flex, or leave it out")
    if sms % 2:
        return f"--moe-deepep-num-sms {sms}: DeepEP takes an even number of SMs"
    if sms >= (total := streaming_multiprocessors(architecture)):
        owner = (f"the {gpu} has {total} SMs" if gpu is not None
                 else f"the GPU has {total} SMs (a {architecture.capitalize()} GPU's, assumed {unnamed})")
        return f"--moe-deepep-num-sms {sms}: {owner}, and compute needs some of them"
    return None
