"""Memory terms of the training levers beyond seed 004: Megatron-FSDP's sharding and its
buffers, optimizer CPU offload, and Transformer Engine FP8. Each is per GPU, in bytes, and
broadcasts over numpy layouts like ``advisor.memory``; with every lever off each term is zero
(or the paper's value), so seed 004's tables stay exact.
"""

from __future__ import annotations

import bisect
import collections
import functools
from typing import NamedTuple

import numpy as np

from advisor import equations as eq
from advisor.models import LlamaSpec

FSDP_COMMUNICATION_UNIT = 1_000_000_000
"""Megatron-FSDP's ``suggested_communication_unit_size`` unless --suggested-communication-unit-size
sets it: core_v0.15.2's always (``ddp_config.suggested_communication_unit_size or 1_000_000_000``,
megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py:362-364), core_v0.19.0's least
(:438-441, 'Cap to 1B elements', ``max(1_000_000_000, ...)``; ``fsdp_communication_unit``)."""
FSDP_RS_QUEUE_ELEMENTS = FSDP_COMMUNICATION_UNIT
"""Megatron-FSDP's reduce-scatter queue at ``FSDP_COMMUNICATION_UNIT``: ``suggested_RS_queue_capacity
= suggested_communication_unit_size`` (same place): unsharded gradient buckets wait there until
more than this many elements are queued (``fsdp_queued_units``)."""


def fsdp_sized_by_units(strategy: str | None, release) -> bool:
    """Whether Megatron-FSDP under ``strategy`` sizes its prefetch and queue from the model's
    units (``fsdp_communication_unit``) on ``release`` (anything with ``fsdp_budget_from_units``:
    a ``MegatronRelease``, the estimator's ``MemoryOptions``), not at fixed sizes."""
    return bool(release.fsdp_budget_from_units) and strategy == "optim_grads_params"


DDP_BUCKET_FLOOR = 40_000_000
"""Megatron-LM's smallest default DDP bucket, in elements (``max(40000000, ...)``: core_v0.19.0
training.py:1562, core_v0.15.2 training.py:984-990)."""
DDP_BUCKET_PER_RANK = 1_000_000
"""Elements a DP x CP rank adds to Megatron-LM's default DDP bucket (``1000000 * dp_cp_size``, same
places), 'to ensure that chunks used in NCCL ring-reduce implementations are large enough'."""


def ddp_bucket_size(dp_cp):
    """Megatron-LM's DDP bucket size in elements where --ddp-bucket-size and --ddp-num-buckets are not
    given (the advisor prices neither: ``options.flags.UNPRICED``) and --overlap-grad-reduce is:
    max(40M, 1M x DP x CP) (core_v0.19.0 training.py:1552-1567, ``resolve_ddp_bucket_size``)."""
    return np.maximum(float(DDP_BUCKET_FLOOR), DDP_BUCKET_PER_RANK * np.asarray(dp_cp, dtype=float))


def fsdp_communication_unit(options, held, units, dp_cp=1) -> tuple:
    """(all-gather prefetch budget, reduce-scatter queue capacity) in elements, for a rank whose
    ``units`` FSDP units hold ``held`` parameters (TP/EP-local) in all, in a DP x CP group of
    ``dp_cp`` ranks (the dense one: ``resolve_ddp_bucket_size`` takes ``pg_collection.dp_cp``;
    1 by default, the 1e9 floor), as the release prices them (``options.fsdp_budget_from_units``,
    ``MegatronRelease.fsdp_budget_from_units``).

    core_v0.19.0 (megatron_fsdp.py:420-444): with optim_grads_params twice the mean unit's elements,
    ``total_param_elements // total_fsdp_module * 2`` over the modules of ``fsdp_unit_modules``, the
    rank's transformer layers only (mcore_fsdp_adapter.py:160-164: ``[TransformerLayer,
    MoETransformerLayer, MambaLayer]``; the embedding and output layer are no units), each counted
    with its TP-local shape (the buffer is built before the parameters become shards:
    param_and_grad_buffer.py:2941 ``.view(p_local.shape)``); else ``self.bucket_size``
    (megatron_fsdp.py:312, ``ddp_config.bucket_size``), which training.py:1850-1855 sets to
    ``ddp_bucket_size`` with --overlap-grad-reduce (``options.overlap_grad_reduce``) and to None
    without, which takes 1e9; at least 1e9 either way ('Cap to 1B elements'), the prefetch half
    (``// 2``). So 1e9 up to DP x CP = 1,000, and 1M x DP x CP beyond: DP x CP = 2048 queues
    2,048,000,000 elements and prefetches 1,024,000,000. A model chunk after the first (virtual
    pipeline stages) is built with ``disable_bucketing`` (training.py:1861-1864; megatron_fsdp.py:313)
    and keeps 1e9: not priced apart, the rank's budget is its first chunk's. core_v0.15.2:
    ``FSDP_COMMUNICATION_UNIT`` always. Layouts broadcast; 0 units: the floor (no buffers held)."""
    held = np.asarray(held, dtype=float)
    size = np.full_like(held, float(FSDP_COMMUNICATION_UNIT))
    if fsdp_sized_by_units(options.fsdp_strategy, options):
        mean = np.floor(held / np.maximum(np.asarray(units, dtype=float), 1.0))  # the integer division
        size = np.maximum(size, 2.0 * mean)
    elif options.fsdp_budget_from_units and options.overlap_grad_reduce:
        size = np.maximum(size, ddp_bucket_size(dp_cp))
    return np.floor(size / 2.0), size


def fsdp_queued_units(unit_parameters, queue=FSDP_RS_QUEUE_ELEMENTS):
    """Megatron-FSDP's un-sharded gradient buckets alive at once at most, in units of
    ``unit_parameters`` (optim_grads, optim_grads_params; each microbatch reduces them):
    floor(queue / u) + 2. When a unit's bucket is ready, ``GradReducePipeline.reduce_gradients``
    first trims the queue (``wait_for_previous_grad_reduce``: ``while queue_space >
    suggested_queue_capacity`` pop, wait and free the oldest), so at most floor(queue / u) whole
    buckets stay; then it reduce-scatters the new one and appends it to the queue
    (``_bucket_group_gradient_reduce``, ``async_op=True``), where it stays while the next unit's
    backward fills its own bucket: one more each (core_v0.15.2 megatron_fsdp/param_and_grad_buffer.py
    reduce_gradients 2724-2763, wait_for_previous_grad_reduce 2765-2797, the append 3004-3009;
    core_v0.19.0 reduce_gradients 3872, wait_for_previous_grad_reduce 3916-3946, the append 4246).
    Nothing frees a queued bucket earlier: a finished reduce-scatter waits in the queue until trimmed.
    ``queue``: the queue's capacity in elements (the release's: ``fsdp_communication_unit``)."""
    u = np.maximum(np.asarray(unit_parameters, dtype=float), 1.0)
    return np.floor(queue / u) + 2.0


def fsdp_queued_elements(options, unit_parameters, queue=FSDP_RS_QUEUE_ELEMENTS):
    """The un-sharded gradient elements Megatron-FSDP's reduce-scatter queue holds at most, beside
    the bucket being filled (``fsdp_queued_units``'s count). optim_grads_params: one bucket per
    FSDP unit, the layer (``tests/test_symbolic_fsdp.py`` measures it): (floor(queue / u) + 2) u.
    optim_grads has no FSDP units: its buckets close at the parameter that crosses
    --ddp-bucket-size, so the bucket just queued and the one being filled are not layers; where the
    layer's weights are known (``layer_weights``) ``fsdp_held_buffer_bytes`` replays the cut and
    the queue (``fsdp_optim_grads_peak``). This form, queue + u, remains for a caller that gives
    none (an MoE stage holding MTP layers: ``advisor.moe.fsdp``; the other MoE stages are replayed,
    ``advisor.moe.fsdp_replay``): right while the bucket size is below the largest
    weight (each bucket a few weights, at most about half a layer), underpriced beyond it (Llama
    3.1 8B at TP 1: DP x CP over about 117) or without --overlap-grad-reduce (one bucket a chunk)."""
    u = np.asarray(unit_parameters, dtype=float)
    if options.fsdp_strategy == "optim_grads_params":
        return fsdp_queued_units(u, queue) * u
    return queue + u


LAYER_WEIGHT_ARRIVAL = (5, 4, 3, 1, 2, 0)
"""The order in which backward produces a decoder layer's weight gradients, as indices into
``layer_weights``: FC2, FC1, the MLP norm, then the attention's output projection before QKV (the
projection runs last in forward, so its gradient comes first), then the input norm."""


def layer_weights(spec: LlamaSpec, tp) -> tuple:
    """A decoder layer's weights on one GPU (TP-local elements) in megatron-core's
    ``named_parameters`` order, which Megatron-FSDP's optim_grads buckets follow: input norm h,
    output projection h a d / t, QKV h (a + 2k) d / t (its bias and QK norms, a few thousand
    elements, folded in), MLP norm h, FC1 (gate and up) 2 h h_ffn / t, FC2 h h_ffn / t. Their sum
    is ``equations.layer_parameters``. The order is the local spec's, read from a real
    ``named_parameters()`` (the fsdpqueue helper's layout on core_v0.15.2 and core_v0.19.0); with
    Transformer Engine the input norm is fused into QKV (``layer_norm_weight``) and sits after the
    projection, h elements that can move a bucket's cut by one weight only where a cut falls there."""
    h, k, a, d = spec.hidden_size, spec.num_query_groups, spec.num_attention_heads, spec.head_dim
    t = np.asarray(tp, dtype=float)
    bias = (a + 2 * k) * d if spec.add_qkv_bias else 0
    qkv = (h * (a + 2 * k) * d + bias) / t + eq.qk_norm_parameters(spec)
    mlp = spec.hidden_size * spec.ffn_hidden_size / t
    return (float(h), h * a * d / t, qkv, float(h), 2 * mlp, mlp)


def fsdp_bucket_size(options, dp_cp):
    """Megatron-FSDP's ``suggested_bucket_size`` under optim_grads, in elements: ``ddp_bucket_size``
    with --overlap-grad-reduce, else inf (training.py sets None: core_v0.15.2 :984-990, core_v0.19.0
    ``resolve_ddp_bucket_size`` :1552-1567, and ``_get_parameter_groups`` then keeps the chunk's
    weights in one bucket)."""
    if options.overlap_grad_reduce:
        return ddp_bucket_size(dp_cp)
    return np.full_like(np.asarray(dp_cp, dtype=float), np.inf)


NUMPY_WEIGHTS = 4096
"""Above this many weights a stage's per-weight bookkeeping (``_full_cut``'s totals and starts,
``_arrival_times``) runs in numpy, the same integers and floats: an MoE stage's tens of
thousands of weights (``advisor.moe.fsdp_replay``), where a Python loop per weight costs seconds
over a sweep."""
EXACT_ELEMENTS = 2.0 ** 53
"""Below this many elements a stage's integer weight sizes add up exactly in float64, in any order."""


class StageWeights(NamedTuple):
    """A stage's weights for the optim_grads replay, each ``(elements, group, own, early)``:
    ``pre`` named before the decoder layers (the first stage's embedding), ``layer`` one decoder
    layer's (repeated), ``post`` after them (the last stage's final norm and output layer), in
    megatron-core's ``named_parameters`` order; ``arrival`` the order in which backward produces
    a layer's (indices into ``layer``, ``LAYER_WEIGHT_ARRIVAL``). ``group``: the parameter group
    (``_get_parameter_groups`` keys dtype, expert or not, requires_grad: each group is cut on its
    own, all share the one queue); ``own``: a bucket of its own (``shared_embedding``, tied
    embeddings at PP > 1: it closes its group's open bucket); ``early``: touched first in backward
    though produced last (the embedding the output layer reuses at PP 1). Backward produces the
    ``post`` weights first (last named first), then the layers from the last, then ``pre`` in
    ``pre_arrival``'s order (indices into ``pre``; empty: the last named first, as the dense
    model's embedding alone needs; an MoE stage's dense layers before its MoE layers are ``pre``
    weights, each layer's produced in its own order: ``advisor.moe.fsdp_replay``).
    ``post_arrival``: the order backward produces ``post`` in, as indices into ``pre`` + ``post``
    (``len(pre) + k``: ``post[k]``; below ``len(pre)``: a ``pre`` weight produced among them, which
    ``pre_order`` then leaves out); empty: ``post``'s last named first. A last stage holding MTP
    layers: the decoder's final norm is named before the MTP layers and produced after them, and
    the stage's embedding copy (named first) after the MTP's enorm (``advisor.moe.fsdp_replay``)."""

    pre: tuple
    layer: tuple
    post: tuple
    arrival: tuple = LAYER_WEIGHT_ARRIVAL
    pre_arrival: tuple = ()
    post_arrival: tuple = ()

    def pre_order(self) -> list:
        """``pre``'s indices in the order backward produces them after the layers (``pre_arrival``),
        those produced among ``post`` (``post_arrival``) left out."""
        order = list(self.pre_arrival) if self.pre_arrival else list(range(len(self.pre) - 1, -1, -1))
        late = {i for i in self.post_arrival if i < len(self.pre)}
        return [j for j in order if j not in late] if late else order

    def post_order(self) -> list:
        """The indices into ``pre`` + ``post`` backward produces first, before the layers
        (``post_arrival``)."""
        return list(self.post_arrival) or list(range(len(self.pre) + len(self.post) - 1, len(self.pre) - 1, -1))


def dense_stage(weights) -> StageWeights:
    """``layer_weights`` alone (a middle stage): one group, no ends."""
    return StageWeights((), tuple((float(w), 0, False, False) for w in weights), ())


def _stage_cut(weights, bucket: float, state: dict, next_id: int) -> tuple[list, list, int]:
    """Each weight's bucket and its bucket's elements up to it, cutting each group apart (a bucket
    closes at the weight bringing it to >= ``bucket``; an ``own`` weight closes the open one and
    takes one alone). ``state`` (group -> [bucket, elements]) is carried on, ``next_id`` the next
    new bucket's number."""
    of, running = [], []
    if not weights:
        return of, running, next_id
    for size, group, own, _ in weights:
        current = state.get(group)
        if own or current is None or current[1] >= bucket:
            current = state[group] = [next_id, 0.0]
            next_id += 1
        current[1] += size
        if own:
            current[1] = np.inf  # closed: the next weight opens a new bucket
        of.append(current[0])
        running.append(size if own else current[1])
    return of, running, next_id


def _arrival_times(stage: StageWeights, layers: int) -> list:
    """When backward produces the gradient of each weight of ``pre`` + ``layers`` layers, in named
    order, on the full stage's clock (layer l at (``layers`` - 1 - l) x width + its rank, ``pre``
    after them in ``pre_order``): a bucket opens at its soonest, completes at its latest. An
    ``early`` weight's bucket opens before every other (``_stage_events``, ``_count_specials``)."""
    width, rank = len(stage.layer), [0] * len(stage.layer)
    for position, p in enumerate(stage.arrival):  # the inverse permutation (tuple.index is quadratic)
        rank[p] = position
    last = [0] * len(stage.pre)
    for position, j in enumerate(stage.pre_order()):
        last[j] = layers * width + position
    post = stage.post_order()
    for position, j in enumerate(post):
        if j < len(stage.pre):  # produced among post (an MTP stage's embedding): before the layers
            last[j] = position - len(post)
    if layers * width > NUMPY_WEIGHTS:  # an MoE stage's many weights: the same integers by numpy
        times = (np.arange(layers - 1, -1, -1)[:, None] * width + np.asarray(rank)[None, :]).ravel().tolist()
    else:
        times = [(layers - 1 - layer) * width + r for layer in range(layers) for r in rank]
    return last + times


def _stage_events(stage: StageWeights, layers: int, every: list, last: list) -> tuple[list, list, list]:
    """(time, bucket, whether it completes) in time order (an opening first): each bucket opens at
    its first touch (its storage allocated; an ``early`` weight's before every other) and completes
    at its last gradient. ``every``: each weight's bucket, ``last``: its gradient's time (named
    order, ``post`` included); backward runs ``post`` from its last, the layers from the last
    (``arrival`` within each), then ``pre`` from its last."""
    if len({weight[1] for weight in stage.pre + stage.layer + stage.post}) > 1 or stage.post_arrival:
        return _grouped_events(stage, every, last)
    pre, width, count = len(stage.pre), len(stage.layer), len(every)
    order = list(range(count - 1, pre + layers * width - 1, -1))
    order += [base + position for base in range(pre + (layers - 1) * width, pre - 1, -width)
              for position in stage.arrival]
    order += stage.pre_order()
    buckets_count = max(every, default=-1) + 1
    missing, seen = [0] * buckets_count, bytearray(buckets_count)
    for index in every:
        missing[index] += 1
    times, buckets, closes = [], [], []
    for j, weight in enumerate(stage.pre):
        if weight[3] and not seen[every[j]]:  # the output layer's backward touches it first
            seen[every[j]] = 1
            times.append(-len(stage.post_order()) - 1)
            buckets.append(every[j])
            closes.append(False)
    add_time, add_bucket, add_close = times.append, buckets.append, closes.append  # the sweep's per-stage loop
    for weight in order:
        index, time = every[weight], last[weight]
        if not seen[index]:
            seen[index] = 1
            add_time(time)
            add_bucket(index)
            add_close(False)
        missing[index] -= 1
        if not missing[index]:
            add_time(time)
            add_bucket(index)
            add_close(True)
    return times, buckets, closes


def _grouped_events(stage: StageWeights, every: list, last: list) -> tuple[list, list, list]:
    """``_stage_events`` with numpy (an MoE stage's several groups, many weights): every weight's
    time is its own, so backward's order is the times' and each bucket opens at its weights' least
    time (an ``early`` weight's bucket before every other) and completes at their greatest; at one
    time a bucket's opening comes before its completion (a bucket of one weight)."""
    index, time = np.asarray(every, dtype=np.int64), np.asarray(last, dtype=np.int64)
    count = int(index.max(initial=-1)) + 1
    opens, closes = np.full(count, np.iinfo(np.int64).max), np.full(count, np.iinfo(np.int64).min)
    np.minimum.at(opens, index, time)
    np.maximum.at(closes, index, time)
    for j, weight in enumerate(stage.pre):
        if weight[3]:  # the output layer's backward touches it first
            opens[every[j]] = -len(stage.post_order()) - 1
    times = np.concatenate([opens, closes])
    kinds = np.repeat(np.array([0, 1], dtype=np.int64), count)
    order = np.lexsort((kinds, times))
    buckets = np.concatenate([np.arange(count), np.arange(count)])[order]
    return times[order].tolist(), buckets.tolist(), (kinds[order] == 1).tolist()


def _suffix_peaks(events: tuple, totals: list, queue: float) -> tuple[list, list, float]:
    """The full stage's replay: at each event the most held after it (0 past the last), after
    each completion the oldest bucket queued (a queue is a run of the latest completions), and
    what it holds at the end."""
    times, buckets, closes = events
    after, oldest = [0.0] * (len(times) + 1), [None] * len(times)
    queued, space, held = collections.deque(), 0.0, 0.0
    for event, index in enumerate(buckets):
        if not closes[event]:
            held += totals[index]
            after[event] = held
            continue
        while space > queue:
            size = totals[queued.popleft()]
            space -= size
            held -= size
        queued.append(index)
        space += totals[index]
        oldest[event] = queued[0]
    for event in range(len(times) - 1, -1, -1):  # a comparison, not max(): a call per event of every stage
        if after[event + 1] > after[event]:
            after[event] = after[event + 1]
    return after, oldest, held


def _count_specials(stage: StageWeights, cut: tuple, count: int, first: int, bucket: float) -> tuple:
    """A stage of ``count`` layers against the full stage's cut ``cut`` = (of, totals, starts,
    touch, the groups' states after ``pre`` + each count of layers): (its special buckets, those
    not opened or not sized as in the full stage's replay, with their sizes; its events before
    ``first`` as (time, opens 0 / completes 1, bucket); the later openings of its special
    buckets as (time, bucket)). Its cut is the full one's prefix, each group's open bucket then
    continued by ``post`` (or closed by an ``own`` weight); ``post``'s new buckets are numbered
    from the full cut's count on."""
    of, totals, starts, touch, states = cut
    if not stage.post and not any(weight[3] for weight in stage.pre):  # nothing before the layers in backward:
        return _open_buckets(stage, cut, count, bucket)  # each group's open bucket alone is its own
    state = {group: list(value) for group, value in states[count].items()}
    boundary = {group: value[0] for group, value in state.items() if value[1] < bucket}
    post_of, post_running, _ = _stage_cut(stage.post, bucket, state, len(totals))
    sizes = {index: states[count][group][1] for group, index in boundary.items()}
    head = len(stage.post)
    opens = {}
    for j, (index, running) in enumerate(zip(post_of, post_running)):
        sizes[index] = running
        opens[index] = min(opens.get(index, first), first - 1 - j)  # the last named first
    closes = {}  # a bucket of ``post`` weights alone completes at its last one, before the layers
    for j, index in enumerate(post_of):
        if index >= len(totals):
            closes[index] = max(closes.get(index, first - 1 - j), first - 1 - j)
    for j, weight in enumerate(stage.pre):
        if weight[3]:
            opens[of[j]] = first - head - 1
    end, lo = len(stage.pre) + count * len(stage.layer), len(stage.pre) + (count - 1) * len(stage.layer)
    for group, index in boundary.items():
        if index not in opens:
            # its weights in the last layer come first; a group with none there, its earlier ones
            opens[index] = _soonest(of, touch, index, lo if count else 0, starts[index], end)
    events = sorted([(t, 0, b) for b, t in opens.items() if t < first] + [(t, 1, b) for b, t in closes.items()])
    pending = sorted((t, b) for b, t in opens.items() if t >= first)
    return {index: sizes.get(index, totals[index] if index < len(totals) else 0.0) for index in opens}, events, pending


def _shifted_specials(stage: StageWeights, cut: tuple, count: int, first: int, bucket: float, memo: dict) -> tuple:
    """``_count_specials``, kept in ``memo`` (one stage's) relative to the count's start ``first`` and
    its open bucket (-1) for a stage without ``pre`` whose layers are of one group: there it depends
    on the count only through that bucket's elements and where it starts in the last layer (its
    weights run on from there; ``post``'s new buckets are numbered from the full cut's count on),
    which repeat from count to count as the layers' cut does (one value over 126 layers at most of
    the levers sweep's stages), so the count's own is the kept one shifted."""
    of, totals, starts, _, states = cut
    if stage.pre or count == 0 or len(states[count]) != 1:
        return _count_specials(stage, cut, count, first, bucket)
    (index, filled), = states[count].values()
    key = (filled, max(starts[index] - (count - 1) * len(stage.layer), -1))
    kept = memo.get(key)
    if kept is None:
        changed, events, pending = _count_specials(stage, cut, count, first, bucket)
        if any(other != index and other < len(totals) for other in changed):
            return changed, events, pending  # a bucket not the open one nor post's: nothing to shift
        def mark(other):
            return -1 if other == index else other
        kept = memo[key] = ([(mark(b), size) for b, size in changed.items()],
                            [(t - first, kind, mark(b)) for t, kind, b in events],
                            [(t - first, mark(b)) for t, b in pending])
    changed, events, pending = kept
    return ({index if b < 0 else b: size for b, size in changed},
            [(t + first, kind, index if b < 0 else b) for t, kind, b in events],
            [(t + first, index if b < 0 else b) for t, b in pending])


def _open_buckets(stage: StageWeights, cut: tuple, count: int, bucket: float) -> tuple:
    """``_count_specials`` of a stage without ``post`` or an ``early`` weight: its special buckets
    are the groups' open ones at its last layer (truncated there), each opened at its soonest
    weight in that layer (or before it, for a group with none there)."""
    of, _, starts, touch, states = cut
    pre, width = len(stage.pre), len(stage.layer)
    # no layer: every weight of ``pre`` may be its bucket's soonest (``pre_arrival`` need not be
    # the named order reversed)
    end, lo, sizes, pending = pre + count * width, pre + (count - 1) * width if count else 0, {}, []
    for index, filled in states[count].values():
        if filled < bucket:
            sizes[index] = filled
            pending.append((_soonest(of, touch, index, lo, starts[index], end), index))
    return sizes, [], sorted(pending)


def _soonest(of: list, touch: list, index: int, low: int, start: int, end: int):
    """The soonest touch of bucket ``index``'s weights among named ``max(start, low)``..``end``
    (its first weight ``start``), or among ``start``..``end`` where it has none there. A slice that
    is the bucket's alone (one group: its weights run on) takes its ``min`` at C speed."""
    for lo in (max(start, low), start):
        if lo < end:
            if of[lo:end].count(index) == end - lo:
                return min(touch[lo:end])
            soonest = min((touch[i] for i in range(lo, end) if of[i] == index), default=None)
            if soonest is not None:
                return soonest
    raise ValueError(f"bucket {index} has no weight before {end}")


def _replay(events: tuple, full: tuple, count: tuple, queue: float, start: int, converge: bool) -> tuple:
    """Replays a stage of some count of layers (``count``: ``_count_specials``' sizes, specials,
    events before its layers and later openings), then ``events`` from ``start``: (peak, the event
    after which its state is the full stage's, or None). With ``converge`` (exact sums) it stops
    once every special bucket has been popped and its queue starts where the full stage's does
    (``full``: its most held after each event, its oldest queued, what it holds at the end): the
    same buckets queued and open, the same sizes, so every later value is the full stage's. Also
    what the stage holds after its last event."""
    times, buckets, closes = events
    sizes, special, head, pending, unpopped = count
    _, oldest, end = full
    queued, state = collections.deque(), [0.0, 0.0, 0.0, unpopped]  # space, held, peak, specials to pop
    for _, completes, index in head:
        _step(queued, state, sizes, special, index, completes, queue)
    space, held, peak, unpopped = state
    waiting, due = 0, pending[0][0] if pending else np.inf
    for event in range(start, len(times)):  # _step inlined: the sweep's hot loop
        index = buckets[event]
        if times[event] >= due:
            for _, opened in pending[waiting:]:
                if times[event] < due:
                    break
                held += sizes[opened]
                peak = max(peak, held)
                waiting += 1
                due = pending[waiting][0] if waiting < len(pending) else np.inf
        if not closes[event]:
            if not special[index]:
                held += sizes[index]
                if held > peak:
                    peak = held
            continue
        while space > queue:
            popped = queued.popleft()
            space -= sizes[popped]
            held -= sizes[popped]
            unpopped -= special[popped]
        queued.append(index)
        space += sizes[index]
        if converge and not unpopped and queued[0] == oldest[event]:
            return peak, event + 1, end
    return peak, None, held


def _step(queued, state: list, sizes: list, special: list, index: int, completes: bool, queue: float) -> None:
    """One event: a bucket opens (allocated), or completes (the queue trimmed to ``queue``
    elements, oldest first, then it is appended); ``state``: space, held, peak, specials queued
    or to come."""
    if not completes:
        state[1] += sizes[index]
        state[2] = max(state[2], state[1])
        return
    while state[0] > queue:
        oldest = queued.popleft()
        state[0] -= sizes[oldest]
        state[1] -= sizes[oldest]
        state[3] -= special[oldest]
    queued.append(index)
    state[0] += sizes[index]


def _plain_cut(sizes: list, bucket: float, group, state: dict) -> tuple[list, list, int]:
    """``_stage_cut`` of weights of one ``group`` and none of its own (``sizes``), from bucket 0."""
    of, running, filled, current = [], [], bucket, -1
    add_of, add_running = of.append, running.append
    for size in sizes:
        if filled >= bucket:
            current += 1
            filled = 0.0
        filled += size
        add_of(current)
        add_running(filled)
    if of:
        state[group] = [current, filled]
    return of, running, current + 1


def _integral(weights) -> bool:
    """Whether every weight's elements are a whole number (their sums exact in any order)."""
    return all(float(weight[0]).is_integer() and weight[0] >= 0 for weight in weights)


def _grouped_cut(stage: StageWeights, layers: int, bucket: float, state: dict) -> tuple[list, list, int]:
    """``_stage_cut`` of ``pre`` + ``layers`` layers of several groups and no ``own`` weight, whole
    numbers of elements (an MoE stage: ``advisor.moe.fsdp_replay``), by group with numpy: a bucket
    starting at a group's weight i ends at the first weight whose cumulative sum reaches the sum
    before i plus ``bucket`` (one ``searchsorted`` for every i, exact below 2**53 as the weights'
    sums are), and the buckets chain from the group's first weight; they are numbered in the order
    they open in named order, as ``_stage_cut`` numbers them."""
    sizes = np.concatenate([np.array([w[0] for w in stage.pre], dtype=float),
                            np.tile(np.array([w[0] for w in stage.layer], dtype=float), layers)])
    groups = np.concatenate([np.array([w[1] for w in stage.pre], dtype=np.int64),
                             np.tile(np.array([w[1] for w in stage.layer], dtype=np.int64), layers)])
    of, running, firsts, lasts = np.zeros(len(sizes), dtype=np.int64), np.zeros(len(sizes)), [], {}
    for group in dict.fromkeys(w[1] for w in stage.pre + stage.layer):
        where = np.flatnonzero(groups == group)
        if not len(where):
            continue
        total = np.cumsum(sizes[where])
        before = total - sizes[where]
        ends = np.minimum(np.maximum(np.searchsorted(total, before + bucket, side="left"), np.arange(len(where))),
                          len(where) - 1).tolist()
        starts, i = [], 0
        while i < len(ends):  # the chain of buckets: one step a bucket
            starts.append(i)
            i = ends[i] + 1
        opened = np.zeros(len(where), dtype=np.int64)
        opened[starts] = 1
        local = np.cumsum(opened) - 1
        of[where] = len(firsts) + local
        running[where] = total - before[starts][local]
        firsts.extend(where[starts].tolist())
        lasts[group] = (len(firsts) - 1, float(running[where[-1]]))
    order = np.argsort(np.array(firsts, dtype=np.int64), kind="stable")
    number = np.empty(len(firsts), dtype=np.int64)
    number[order] = np.arange(len(firsts))
    for group, (index, filled) in lasts.items():
        state[group] = [int(number[index]), filled]
    return number[of].tolist(), running.tolist(), len(firsts)


def _full_cut(stage: StageWeights, layers: int, bucket: float) -> tuple:
    """The full stage's cut (``pre`` + ``layers`` layers + ``post``): (each weight's bucket, each
    bucket's elements, each bucket's first weight, the groups' states after ``pre`` + each count
    of layers), in named order."""
    state, named = {}, stage.pre + stage.layer
    if len({weight[1] for weight in named}) == 1 and not any(weight[2] for weight in named):
        of, running, top = _plain_cut([weight[0] for weight in stage.pre] + [weight[0] for weight in stage.layer] * layers,
                                      bucket, named[0][1], state)
    elif _integral(named) and not any(weight[2] for weight in named):
        of, running, top = _grouped_cut(stage, layers, bucket, state)
    else:
        of, running, top = _stage_cut(stage.pre + stage.layer * layers, bucket, state, 0)
    more, filled, top = _stage_cut(stage.post, bucket, state, top)
    pre, width = len(stage.pre), len(stage.layer)
    # each group's state after pre + c layers: its last weight's bucket and fill there (inf: closed
    # by an own weight; a layer's weights are never their own)
    states = [{stage.pre[j][1]: (of[j], np.inf if stage.pre[j][2] else running[j]) for j in range(pre)}]
    in_layer = {weight[1]: p for p, weight in enumerate(stage.layer)}.items()
    for base in range(pre, pre + layers * width, width):
        state = dict(states[0])
        for group, p in in_layer:
            state[group] = (of[base + p], running[base + p])
        states.append(state)
    every = of + more
    if len(every) > NUMPY_WEIGHTS:  # an MoE stage's many weights: each bucket's last fill and first weight by numpy
        index = np.asarray(every, dtype=np.int64)
        _, from_end = np.unique(index[::-1], return_index=True)
        _, first = np.unique(index, return_index=True)
        return of, more, np.asarray(running + filled)[len(every) - 1 - from_end].tolist(), first.tolist(), states
    totals, starts = [0.0] * top, [0] * top
    for index, size in zip(every, running + filled):
        totals[index] = size
    for position in range(len(every) - 1, -1, -1):
        starts[every[position]] = position
    return of, more, totals, starts, states


@functools.lru_cache(maxsize=4096)
def _stage_peaks(stage: StageWeights, layers: int, bucket: float, queue: float) -> tuple:
    """``fsdp_optim_grads_peak`` of ``stage`` for every count of 0..``layers`` layers (cached: a
    sweep repeats a few stages; ``_stage_replay``'s). An embedding that is a bucket alone (its
    own, or at least ``bucket``) changes no other bucket and opens last, when everything else has
    completed: the stage without it, then its bucket on what that holds at the end. A stage whose
    ``post`` takes weights of ``pre`` (``post_arrival``: an MTP stage) replays each count whole."""
    if stage.post_arrival:
        return tuple(stage_peak(stage, count, bucket, queue) for count in range(layers + 1))
    if len(stage.pre) == 1 and not stage.pre[0][3] and (stage.pre[0][2] or stage.pre[0][0] >= bucket):
        peaks, ends = _stage_replay(stage._replace(pre=(), pre_arrival=()), layers, bucket, queue)
        return tuple(max(peak, end + stage.pre[0][0]) for peak, end in zip(peaks, ends))
    return _stage_replay(stage, layers, bucket, queue)[0]


@functools.lru_cache(maxsize=4096)
def _stage_replay(stage: StageWeights, layers: int, bucket: float, queue: float) -> tuple[tuple, tuple]:
    """(``_stage_peaks``, what each count holds after its last event) by replaying. A stage of c layers cuts the full stage's prefix (``pre`` and its
    c layers, then ``post``) and its layers' backward events are the full stage's last ones, so
    each count replays its own ``post`` and its special buckets from there until its state is the
    full stage's (``_replay``; exact where every sum is an integer below 2**53, as the weights'
    are), then takes the full replay's most from there on."""
    if layers < 0:
        return (), ()
    width = len(stage.layer)
    (of, _, totals, starts, states), last, events, full = _full_replay(stage, layers, bucket, queue)
    elements = [w[0] for w in stage.pre + stage.layer + stage.post]
    total = sum(w[0] for w in stage.pre + stage.post) + layers * sum(w[0] for w in stage.layer)
    converge = all(float(s).is_integer() and s >= 0 for s in elements) and total < EXACT_ELEMENTS
    # one list of sizes and of specials for every count, each count's specials set and then reset
    sizes, special = totals + [0.0] * len(stage.post), bytearray(len(totals) + len(stage.post))
    times, peaks, ends, memo = events[0], [], [], {}
    for count in range(layers + 1):
        first = (layers - count) * width
        changed, head_events, pending = _shifted_specials(stage, (of, totals, starts, last, states), count, first,
                                                          bucket, memo)
        for index, size in changed.items():
            sizes[index], special[index] = size, 1
        peak, rest, end = _replay(events, full, (sizes, special, head_events, pending, len(changed)), queue,
                                  bisect.bisect_left(times, first), converge)
        peaks.append(peak if rest is None else max(peak, full[0][rest]))
        ends.append(end)
        for index in changed:
            special[index] = 0
            if index < len(totals):
                sizes[index] = totals[index]
    return tuple(peaks), tuple(ends)


@functools.lru_cache(maxsize=4096)
def stage_peak(stage: StageWeights, layers: int, bucket: float, queue: float) -> float:
    """``_stage_peaks(stage, layers, bucket, queue)[layers]`` alone: the full stage's replay
    (``_suffix_peaks``' most held from its first event), without replaying every smaller count;
    for a caller that needs one count of each stage (an MoE stage: ``advisor.moe.fsdp_replay``)."""
    if layers < 0:
        raise ValueError(f"no replay of {layers} layers")
    return _full_replay(stage, layers, bucket, queue)[3][0][0]


def _full_replay(stage: StageWeights, layers: int, bucket: float, queue: float) -> tuple:
    """The full stage's replay, which ``_stage_replay`` and ``stage_peak`` share: (``_full_cut``,
    each weight's gradient time, the events, ``_suffix_peaks``)."""
    width = len(stage.layer)
    if sorted(stage.arrival) != list(range(width)):
        raise ValueError(f"arrival {stage.arrival} is not an order of the layer's {width} weights")
    post, pre = stage.post_order(), len(stage.pre)
    if sorted(stage.pre_order() + [j for j in post if j < pre]) != list(range(pre)):
        raise ValueError(f"pre_arrival {stage.pre_arrival} is not an order of the {pre} weights before the layers")
    if sorted(j for j in post if j >= pre) != list(range(pre, pre + len(stage.post))):
        raise ValueError(f"post_arrival {stage.post_arrival} is not an order of the {len(stage.post)} weights after them")
    cut = _full_cut(stage, layers, bucket)
    last = _arrival_times(stage, layers)
    post_times = [0] * len(stage.post)  # by default backward produces the last named first
    for position, j in enumerate(post):
        if j >= pre:
            post_times[j - pre] = position - len(post)
    events = _stage_events(stage, layers, cut[0] + cut[1], last + post_times)
    return cut, last, events, _suffix_peaks(events, cut[2], queue)


def _bucket_peaks(weights: tuple, layers: int, bucket: float, queue: float) -> tuple:
    """``_stage_peaks`` of a middle stage of ``layer_weights`` (``dense_stage``)."""
    if layers <= 0:
        return (0.0,) * (max(layers, 0) + 1)
    return _stage_peaks(dense_stage(weights), layers, bucket, queue)


def fsdp_optim_grads_peak(weights, layers, bucket, queue):
    """The unsharded gradient elements Megatron-FSDP holds at most under optim_grads for a stage
    of ``layers`` decoder layers of ``weights`` (``layer_weights``) in a model chunk, with buckets
    of ``bucket`` elements (``fsdp_bucket_size``) and a reduce-scatter queue of ``queue``
    (``fsdp_communication_unit``), by replaying megatron-core's bucket cut and queue.

    Under optim_grads the adapter gives no FSDP units (mcore_fsdp_adapter.py:93-96 / :161-164),
    so every weight of the chunk is one parameter group in ``named_parameters`` order, cut into
    buckets each closed at the weight that brings it to >= ``bucket`` (``_get_parameter_groups``,
    core_v0.15.2 param_and_grad_buffer.py:1300-1384, core_v0.19.0 :1786-1866). Backward produces
    the gradients layer by layer from the last (``LAYER_WEIGHT_ARRIVAL`` within a layer); a
    bucket's whole storage is allocated at its first gradient (core_v0.19.0 ``main_grad_getter``
    -> ``fetch_bucket`` -> ``allocate_bucket_storage``, :3086-3104, :1291-1411); at its last,
    ``reduce_gradients`` (:3872-3914) first pops and frees the oldest queued buckets while the
    queue holds more than ``queue`` elements (``wait_for_previous_grad_reduce``, :3916-3946),
    then appends it (:4246). The peak is the most allocated at once. Element counts as the
    weights' (megatron-core pads each bucket a little more: 2.8% at Llama 3.1 8B, DP 2048). This
    is a middle stage's; ``QueueReplay``'s ``ends`` (``stage_ends``) add the first stage's embedding
    and the last stage's final norm and output layer (``StageWeights``). The further chunks of
    virtual pipeline stages (built with ``disable_bucketing``: one bucket each) are not replayed.
    Layouts broadcast (``QueueReplay``: one replay per distinct stage)."""
    return QueueReplay(weights, bucket, queue).peak(layers)


def _unique_rows(matrix: np.ndarray) -> tuple[list, np.ndarray]:
    """``np.unique(matrix, axis=0, return_inverse=True)`` (the rows sorted, as lists) by a lexsort
    of the columns: np.unique sorts the rows as void scalars, 88 ms of the levers sweep's 59 replays
    (about 48,000 rows), this about 1 ms each."""
    order = np.lexsort(matrix.T[::-1])  # the first column the primary key, as np.unique orders rows
    rows = matrix[order]
    new = np.ones(len(rows), dtype=bool)
    new[1:] = (rows[1:] != rows[:-1]).any(axis=1)
    inverse = np.empty(len(rows), dtype=np.int64)
    inverse[order] = np.cumsum(new) - 1
    return rows[new].tolist(), inverse


class QueueReplay:
    """``fsdp_optim_grads_peak`` for fixed layouts (their ``layer_weights``, bucket and queue
    sizes, and the stage's embedding, final norm and output layer: ``stage_ends``; broadcasting),
    fast over layer counts: the layouts' distinct stages are found once here,
    and each replay is kept by stage and layer count (a sweep prices the same few thousands of
    times). ``take`` gives the one of some layouts, sharing what was replayed."""

    def __init__(self, weights, bucket, queue, ends: StageEnds | None = None, layers: int = 0) -> None:
        """``ends``: the stages' embedding, final norm and output layer (``stage_ends``); none: middle
        stages. The distinct layouts are found over the layouts' columns alone, each then one stage
        per position (``FIRST`` | ``LAST``): the stage axis adds no rows to sort. ``layers``: the
        most layers a stage of these layouts holds (``StageModel``'s: the model's), to which a stage
        is replayed at its first ask, every count below coming with it: the split search asks a
        stage for count after count and then for every count (``most``), each a replay of its own
        otherwise. 0: to the count asked."""
        ends = ends or StageEnds(0.0, 0.0, 0, False)
        columns = np.broadcast_arrays(*(np.asarray(w, dtype=float) for w in weights),
                                      np.asarray(ends.matrix, dtype=float),
                                      np.asarray(bucket, dtype=float), np.asarray(queue, dtype=float))
        unique, inverse = _unique_rows(np.stack([c.ravel() for c in columns], axis=1))
        self.rows, self.ends = unique, (ends.norm, ends.tied)  # each row: the weights, v h / t, bucket, queue
        self.code = np.reshape(inverse, columns[0].shape) * 4 + np.asarray(ends.position)  # stage = row x 4 + position
        # peaks by stage and layer count (NaN: not replayed yet; 0 layers of a middle stage hold none)
        table = np.zeros((4 * len(unique), 1))
        table[np.arange(4 * len(unique)) % 4 > 0, 0] = np.nan
        self.shared = {"table": table}  # shared by ``take``
        self.layers = layers

    def take(self, rows: np.ndarray, count: int) -> QueueReplay:
        """This replay for layouts ``rows`` of ``count`` (the leading axis), sharing the peaks."""
        new = object.__new__(QueueReplay)
        new.rows, new.ends, new.shared, new.layers = self.rows, self.ends, self.shared, self.layers
        new.code = self.code.take(rows, axis=0) if self.code.ndim and self.code.shape[0] == count else self.code
        return new

    def peak(self, layers):
        """The peak unsharded gradient elements of stages of ``layers`` decoder layers."""
        layers = np.maximum(np.asarray(layers, dtype=float), 0.0).astype(np.int64)
        table = self._table(int(layers.max(initial=0)))
        # table[code, layers] as a flat take (the indices broadcast): the same cells, without numpy's
        # index iterator for each element (every total of a sweep asks)
        cells = self.code * table.shape[1] + layers
        values = table.take(cells)
        missing = np.isnan(values)
        if missing.any():
            code, layers = np.broadcast_arrays(self.code, layers)
            wanted = {}
            for stage, count in set(zip(code[missing].tolist(), layers[missing].tolist())):
                wanted[stage] = max(count, wanted.get(stage, 0))
            self._replay(wanted)
            values = table.take(cells)
        return values

    def most(self, layers: int):
        """The largest peak of these layouts' stages over every count from 0 to ``layers``: a cap
        that no stage of at most ``layers`` layers exceeds (``fsdp_buffer_lines``)."""
        table = self._table(layers)
        unready = np.isnan(table[:, :layers + 1]).any(axis=1)
        self._replay({stage: layers for stage in set(np.ravel(self.code).tolist()) if unready[stage]})
        return table[:, :layers + 1].max(axis=1)[self.code]  # a stage never replayed is NaN, never read

    def _table(self, most: int) -> np.ndarray:
        """The shared peaks by stage and layer count, at least to ``most`` layers and ``layers``
        (NaN: not yet)."""
        table, most = self.shared["table"], max(most, self.layers)
        if most >= table.shape[1]:
            table = np.concatenate([table, np.full((len(table), most + 1 - table.shape[1]), np.nan)], axis=1)
            self.shared["table"] = table
        return table

    def _replay(self, wanted: dict) -> None:
        """Replays each stage of ``wanted`` once, to its count there (at least ``layers``): every
        count below comes with it."""
        table = self.shared["table"]
        for stage, count in wanted.items():
            count = max(count, self.layers)
            row, position = self.rows[stage // 4], stage % 4
            weights = _with_ends(tuple(row[:-3]), row[-3], self.ends[0], position, self.ends[1])
            table[stage, :count + 1] = _stage_peaks(weights, count, row[-2], row[-1])


TIES = {"untied": 0, "early": 1, "own": 2}
"""How a stage's embedding and output layer share a weight (``end_sizes``): not at all; at PP 1
one weight, the embedding's, which the output layer reuses (its gradient starts in the output
layer's backward, first, and ends in the embedding's, last: megatron-core's
``setup_embeddings_and_output_layer`` sets ``zero_out_wgrad``, no ``shared_embedding``); at PP > 1
a copy on the first and the last stage, each ``shared_embedding``: a bucket of its own
(``_get_parameter_groups``' ``_does_param_require_new_bucket``)."""
FIRST, LAST = 1, 2
"""``StageEnds.position``'s bits: the stage is the first (the embedding), the last (the final
norm and output layer); both at PP 1, neither in the middle."""


class StageEnds(NamedTuple):
    """What a pipeline stage holds beside its decoder layers, for the optim_grads replay: the
    embedding and output layer's v h / t elements on one GPU (``matrix``, per layout), the final
    norm's h, the stage's ``position`` (``FIRST`` | ``LAST``, per layout and stage) and whether the
    model ties its embeddings."""

    matrix: object
    norm: float
    position: object
    tied: bool


def stage_ends(spec: LlamaSpec, tp, pp, stage, vocab) -> StageEnds:
    """``StageEnds`` of pipeline stage ``stage`` of ``pp`` at TP ``tp`` (``vocab`` padded as the
    estimator pads it); layouts broadcast."""
    t, p, i = (np.asarray(x) for x in (tp, pp, stage))
    position = np.where(i == 0, FIRST, 0) + np.where(i == p - 1, LAST, 0)
    return StageEnds(spec.hidden_size * np.asarray(vocab, dtype=float) / t, float(spec.hidden_size), position,
                     bool(spec.tie_embeddings))


def end_sizes(matrix, norm, position, tied: bool) -> tuple:
    """(embedding, final norm, output layer, tie (``TIES``)) elements of a stage at ``position``
    (``StageEnds``' fields), 0 where it has none: the embedding on the first stage, the final norm
    and the output layer on the last, no output weight where it reuses the embedding (tied, PP 1)."""
    position = np.asarray(position)
    first, last = (position & FIRST) > 0, (position & LAST) > 0
    only = first & last  # PP 1
    tie = np.where(only, TIES["early"], TIES["own"]) if tied else np.zeros_like(position)
    output = np.where(last & ~(only & tied), matrix, 0.0)
    return np.where(first, matrix, 0.0), np.where(last, norm, 0.0), output, tie


@functools.lru_cache(maxsize=4096)
def _with_ends(weights: tuple, matrix: float, norm: float, position: int, tied: bool) -> StageWeights:
    """``dense_stage`` of ``weights`` with its ends (``end_sizes``): the embedding before the
    layers, the final norm and output layer after them, all of the one BF16 group. Cached:
    ``QueueReplay._replay`` builds every stage it is asked for, a few hundred distinct in a sweep,
    and ``end_sizes``' numpy calls on scalars cost more than the replay's cache hit that follows."""
    pre, post = end_weights(matrix, norm, position, tied)
    return dense_stage(weights)._replace(pre=pre, post=post)


def end_weights(matrix: float, norm: float, position: int, tied: bool, group=0) -> tuple[tuple, tuple]:
    """(``StageWeights.pre``, ``.post``) of a stage's ends (``end_sizes``) in parameter group
    ``group``: the embedding (its own bucket where tied at PP > 1, touched first where tied at
    PP 1), the final norm and the output layer; none where the stage has no such weight."""
    embedding, norm, output, tie = (x.item() for x in end_sizes(matrix, norm, position, tied))
    pre = ((embedding, group, tie == TIES["own"], tie == TIES["early"]),) if embedding else ()
    post = tuple(w for w in ((norm, group, False, False), (output, group, tie == TIES["own"], False)) if w[0])
    return pre, post


SHARDING = {None: None, "no_shard": (False, False, False), "optim": (True, False, False),
            "optim_grads": (True, True, False), "optim_grads_params": (True, True, True),
            "torch_fsdp2": (True, True, True)}
"""(optimizer states and main weights, gradients, weights) sharded, per Megatron-FSDP strategy:
``ParamAndGradBuffer._init_each_parameter_group_buffers`` (is_main_weight_buffer_distributed,
is_grad_buffer_distributed, is_model_weight_buffer_distributed) in param_and_grad_buffer.py.
'torch_fsdp2' is torch FSDP2 (--use-torch-fsdp2): megatron-core's ``TorchFullyShardedDataParallel``
calls ``fully_shard`` on every transformer layer (and the embedding, RoPE and output layer), which
shards the weights and their gradients over DP x CP; Megatron's (non-distributed) mixed-precision
optimizer then keeps its FP32 main weights and Adam states for those shards only."""
TORCH_FSDP2_UNITS_IN_FLIGHT = 2
"""torch FSDP2's unsharded layers at once, for weights and for gradients: forward prefetches the
next layer's all-gather while the current one runs (torch ``_fully_shard/_fsdp_param_group.py``,
"Overlapping all-gather copy-in and all-gather": the current output is kept until the next
copy-in), backward prefetches the next likewise, and one reduce-scatter input may stay in flight
while the next layer's gradients are produced (``reduce_scatter_max_input_buffers``, default 1)."""


STATE_BYTES = {"fp32": 4, "remainder": 2, "fp16": 2, "bf16": 2, "fp8": 2, "fsdp_half": 2, "fsdp_none": 0,
               "fp32_weight": 0}
"""Bytes of one optimizer-state element by how it is kept (``optimizer_state_kinds``): its
--main-params-dtype / --exp-avg-dtype / --exp-avg-sq-dtype, or 'remainder', an FP32 master kept as
the 16 bits its BF16 weight lacks. fp8: TE 2.x's FusedAdam keeps an E4M3 ``Float8Tensor``
(``_initialize_state``: ``Float8Quantizer(scale, amax, fp8_dtype=kFloat8E4M3).make_empty(param.shape)``),
and ``Float8Quantizer`` is built with ``columnwise=True`` by default, so ``make_empty`` allocates
the FP8 data and its transpose (``data_transpose``, as many bytes: ``tensor/float8_tensor.py``),
and every ``quantize_``/``copy_`` of the state writes both: 1 + 1 bytes, as a BF16 state.
fsdp_half, fsdp_none: Megatron-FSDP's main weights in a BF16 or FP16 buffer, or in none (core_v0.19.0's
--megatron-fsdp-main-params-dtype bf16/fp16 or auto; ``advisor.options.training.FSDP_MAIN_WEIGHT_KINDS``).
fp32_weight: the master of an FP32 weight that the optimizer steps in place is the weight itself, no
bytes of its own (``TrainingOptions._steps_fp32_weights_in_place``: the distributed optimizer's FP32
shards are views of the weights, ``shard_model_param = model_param.view(-1)[...]``, core_v0.15.2
optimizer/distrib_optimizer.py:416-419; FP32Optimizer steps the parameters): 8 of the 12 bytes."""


def optimizer_state_kinds(precision_aware: bool, main_params_dtype: str = "fp32", exp_avg_dtype: str = "fp32",
                          exp_avg_sq_dtype: str = "fp32", *, bf16_weights: bool = True,
                          te_holds_masters: bool = True) -> tuple[str, str, str]:
    """How the master weight, momentum and variance are kept (keys of ``STATE_BYTES``).

    Without the precision-aware optimizer: FP32 all three, 12 bytes (seed 004, Section 3.1). With
    it (--use-precision-aware-optimizer) each takes its dtype, and the FP32 master of a BF16
    weight is its remainder where Transformer Engine's FusedAdam holds it (``te_holds_masters``:
    megatron-core's ``use_precision_aware_optimizer_no_fp8_or_ds_fp8``): megatron-core passes
    ``store_param_remainders`` (OptimizerConfig, default True with TE >= 2.1), and FusedAdam then
    keeps only the 16 low bits the BF16 weight lacks, as int16 (``fused_adam.py``,
    ``_initialize_state``). Otherwise megatron-core keeps its own FP32 master shard
    (``distrib_optimizer.py``, ``shard_main_param``). The FP32 scale per state tensor that
    FusedAdam adds for FP16 and FP8 states is a scalar per tensor: not counted."""
    if not precision_aware:
        return ("fp32", "fp32", "fp32")
    remainder = main_params_dtype == "fp32" and bf16_weights and te_holds_masters
    return ("remainder" if remainder else main_params_dtype, exp_avg_dtype, exp_avg_sq_dtype)


def optimizer_state_bytes(kinds: tuple[str, str, str]) -> float:
    """Bytes per parameter of the master weight, momentum and variance kept as ``kinds``
    (``optimizer_state_kinds``), before any sharding: 12 in FP32."""
    return float(sum(STATE_BYTES[kind] for kind in kinds))


def _sharded(options) -> tuple:
    """(optimizer states and main weights, gradients, weights) sharded over DP x CP: as the FSDP
    strategy shards them (``SHARDING``), or under DDP only the distributed optimizer's states."""
    sharding = SHARDING[options.fsdp_strategy]
    return (options.distributed_optimizer, False, False) if sharding is None else sharding


def state_bytes_per_parameter(options, shards):
    """(weights, gradients, optimizer) bytes per parameter on one GPU, over ``shards`` = DP x CP.

    DDP (seed 004, Eq. 4 and 10): BF16 weights, the main-gradient buffer (FP32, or BF16 with
    --grad-reduce-in-bf16), 12 bytes of FP32 master weight, momentum and variance (fewer with the
    precision-aware optimizer: ``optimizer_state_bytes``), divided by DP x CP with the
    distributed optimizer. Megatron-FSDP divides what its strategy shards
    (``SHARDING``): no_shard nothing, optim the 12 bytes, optim_grads also the gradients,
    optim_grads_params also the weights. CPU offload keeps ``optimizer_host_fraction`` of the
    optimizer states in host memory (Megatron's HybridDeviceOptimizer moves those parameters'
    master weights and Adam states to the CPU), so only the rest stays on the GPU."""
    shards = np.asarray(shards, dtype=float)
    optimizer_sharded, grads_sharded, weights_sharded = _sharded(options)
    weights = options.element_bytes / np.where(weights_sharded, shards, 1.0)
    gradients = options.gradient_bytes / np.where(grads_sharded, shards, 1.0)
    optimizer = options.optimizer_bytes / np.where(optimizer_sharded, shards, 1.0)
    return weights, gradients, optimizer * (1.0 - options.optimizer_host_fraction)


def bucket_bytes(options) -> int:
    """Bytes of one element of Megatron-FSDP's un-sharded gradient buckets where it shards the
    gradients: the communication dtype's (core_v0.19.0's --megatron-fsdp-grad-comm-dtype:
    ``main_grad_getter`` fetches them with ``dtype=mp_policy.grad_comm_dtype``), else the main
    gradients' (``MemoryOptions.grad_comm_bytes``)."""
    return options.gradient_bytes if options.grad_comm_bytes is None else options.grad_comm_bytes


def fsdp_buffer_bytes(options, unit_parameters, layers, dp_cp=1, layer_weights=None):
    """(gathered weights, queued gradients): the unsharded buffers Megatron-FSDP holds at a
    rank's peak, for ``layers`` decoder layers of ``unit_parameters`` each (its FSDP unit is the
    transformer layer), with the release's budgets (``fsdp_communication_unit``: all units alike,
    the mean is one unit).

    optim_grads_params gathers a unit's weights before it runs and prefetches the next units up
    to the prefetch budget: the unit in use plus min(prefetch budget, the other layers).
    optim_grads and optim_grads_params produce each unit's full gradient and queue it for the
    reduce-scatter until more than the queue's capacity is queued: min(all layers, the buckets
    the queue keeps, the one just queued and the one being produced: ``fsdp_queued_elements``).
    Both in the stage's element and gradient bucket dtypes (``bucket_bytes``). torch FSDP2
    ('torch_fsdp2') keeps two layers of each, in the weights' dtype. ``dp_cp``: the DP x CP group's
    ranks (``fsdp_communication_unit``). ``layer_weights``: a layer's weights in order
    (``layer_weights``), with which optim_grads's queue is replayed over its buckets
    (``fsdp_optim_grads_peak``) instead of queue + u."""
    layers = np.asarray(layers, dtype=float)
    return fsdp_held_buffer_bytes(options, unit_parameters, layers * unit_parameters, layers, dp_cp, layer_weights)


def fsdp_buffers_alike(options, other, unit_parameters, layers, dp_cp=1, layer_weights=None) -> bool:
    """Whether two estimator views (``MemoryOptions``: one run's on two Megatron-LM releases) price
    the same Megatron-FSDP buffers (``fsdp_buffer_bytes``) for stages of ``layers`` decoder layers
    of ``unit_parameters`` each in a DP x CP group of ``dp_cp`` ranks. The releases' budgets differ
    only where core_v0.19.0's exceed core_v0.15.2's fixed 1e9 (``fsdp_communication_unit``: a unit
    over 5e8 elements under optim_grads_params, DP x CP over 1,000 under optim_grads with
    --overlap-grad-reduce), and then only what the strategy leaves unsharded; under optim_grads
    only where the larger queue keeps a bucket the smaller trims (``layer_weights``: the layer's
    weights, ``fsdp_optim_grads_peak``, as ``fsdp_buffer_bytes`` takes them)."""
    mine = fsdp_buffer_bytes(options, unit_parameters, layers, dp_cp, layer_weights)
    theirs = fsdp_buffer_bytes(other, unit_parameters, layers, dp_cp, layer_weights)
    return all(np.array_equal(a, b) for a, b in zip(mine, theirs))


def fsdp_held_buffer_bytes(options, unit_parameters, held, units, dp_cp=1, layer_weights=None):
    """``fsdp_buffer_bytes`` for a rank whose ``units`` FSDP units hold ``held`` parameters in all,
    the largest of them ``unit_parameters``: the same buffers where the units differ in size (an
    MoE stage's dense and MoE layers, ``advisor.moe.fsdp``). The prefetch and the queue count a
    bucket's elements whatever unit it belongs to (``AllGatherPipeline``'s
    ``prefetch_all_gather_size``, ``GradReducePipeline``'s queue: same sources), and the release
    sizes both from the units and the DP x CP group's ``dp_cp`` ranks (``fsdp_communication_unit``).
    ``layer_weights`` (``layer_weights``; only where the ``units`` units are alike layers of those
    weights, ``held`` their sum): optim_grads's queued gradients replayed over the stage's buckets
    (``fsdp_optim_grads_peak``; or a ``QueueReplay`` of them, built for ``options`` and ``dp_cp``:
    ``StageModel``'s, which keeps its replays); without them queue + u (``fsdp_queued_elements``)."""
    sharding = SHARDING[options.fsdp_strategy]
    held = np.asarray(held, dtype=float)
    zero = 0.0 * held  # every buffer as wide as the layers and units broadcast (0 where not held)
    if sharding is None:
        return zero, zero
    _, grads_sharded, weights_sharded = sharding
    if options.fsdp_strategy == "torch_fsdp2":
        # Two layers unsharded at once, weights and gradients (TORCH_FSDP2_UNITS_IN_FLIGHT), both
        # in the weights' dtype: Megatron passes fully_shard no MixedPrecisionPolicy, so FSDP2
        # reduces in the parameters' dtype (``MixedPrecisionPolicy.reduce_dtype`` None).
        unsharded = options.element_bytes * np.minimum(held, TORCH_FSDP2_UNITS_IN_FLIGHT * unit_parameters)
        return unsharded + zero, unsharded + zero
    if options.fsdp_strategy == "optim_grads" and layer_weights is not None:
        # the queue replayed over the buckets, the weights whole (nothing gathered); a QueueReplay
        # given is sized already, so the budgets are not computed for it (every total of a sweep)
        replay = layer_weights if isinstance(layer_weights, QueueReplay) \
            else QueueReplay(layer_weights, fsdp_bucket_size(options, dp_cp),
                             fsdp_communication_unit(options, held, units, dp_cp)[1])
        return zero, bucket_bytes(options) * replay.peak(units) + zero
    # each as wide as ``held`` already (it broadcasts the units): nothing to add to widen them
    weights, gradients = zero, zero
    prefetch, queue = fsdp_communication_unit(options, held, units, dp_cp)
    if weights_sharded:
        gathered = np.minimum(held, unit_parameters + np.minimum(prefetch, held - unit_parameters))
        weights = options.element_bytes * np.maximum(gathered, 0.0)
    if grads_sharded:
        gradients = bucket_bytes(options) * np.minimum(held, fsdp_queued_elements(options, unit_parameters, queue))
    return weights, gradients


def fsdp_buffer_lines(options, unit_parameters, dp_cp=1, layer_weights=None, queue_cap=None,
                      end_elements=0.0) -> list[tuple]:
    """``fsdp_buffer_bytes`` as lines in the layers n: each buffer is the smaller of two lines,
    n units (slope u, nothing at 0) or its cap (slope 0): gathered = min(n u, u + prefetch)
    (for n >= 1, u + min(prefetch, (n - 1) u) is that; at 0 both are 0) and queued = min(n u,
    ``fsdp_queued_elements``, constant in n). The budgets are constant in n too: the mean of n
    equal units is one unit (``fsdp_communication_unit`` of one). Their sum is the smallest of the
    (slope, intercept) bytes of every choice of one line per buffer, which this lists (one zero
    line where a buffer is not held).

    optim_grads with ``layer_weights`` (``fsdp_optim_grads_peak``, not a line in n): its queue
    lines bound the replay from above, so the split search's lines never undercut ``total``:
    min(n u, Q + 3 b), b = the bucket size + the largest weight (a bucket closes within one weight
    of the size). At a peak the queue holds at most Q after its trim plus the bucket appended
    since; besides it the bucket being filled and, where a cut falls between the projection and
    QKV (which backward produces in the other order, ``LAYER_WEIGHT_ARRIVAL``), the next one
    opened while that one waits for QKV: three buckets. Without --overlap-grad-reduce the whole
    stage is one bucket: n u alone. ``queue_cap``: a tighter cap in elements where the caller
    knows one (``QueueReplay.most``, the replay's largest over the layer counts it searches, which
    the split search needs to settle within a few steps: ``StageModel.most_layers``).
    ``end_elements``: the stage's embedding, final norm and output layer (``stage_ends``), which
    the replay holds beside the layers: optim_grads's n u line starts there (n u + ends bounds
    the replay)."""
    _, grads_sharded, weights_sharded = _sharded(options)
    u = np.asarray(unit_parameters, dtype=float)
    if options.fsdp_strategy == "torch_fsdp2":  # min(n u, 2 u) of each, in the weights' dtype
        each = [(options.element_bytes * u, 0.0), (0.0, options.element_bytes * TORCH_FSDP2_UNITS_IN_FLIGHT * u)]
        return [(a + c, b + d) for a, b in each for c, d in each]
    prefetch, queue = fsdp_communication_unit(options, u, 1, dp_cp)
    gathered = [(options.element_bytes * u, 0.0), (0.0, options.element_bytes * (u + prefetch))] \
        if weights_sharded else [(0.0, 0.0)]
    queued = [(bucket_bytes(options) * u, 0.0)] if grads_sharded else [(0.0, 0.0)]
    if grads_sharded and options.fsdp_strategy == "optim_grads" and layer_weights is not None:
        queued = [(bucket_bytes(options) * u, bucket_bytes(options) * end_elements)]
        if options.overlap_grad_reduce:  # else one bucket a group: n u + ends alone
            largest = functools.reduce(np.maximum, (np.asarray(w, dtype=float) for w in layer_weights),
                                       np.asarray(end_elements, dtype=float))  # an end weight may be the largest
            cap = queue + 3.0 * (fsdp_bucket_size(options, dp_cp) + largest) if queue_cap is None else queue_cap
            queued.append((0.0, bucket_bytes(options) * cap))
    elif grads_sharded:
        queued.append((0.0, bucket_bytes(options) * fsdp_queued_elements(options, u, queue)))
    return [(a + c, b + d) for a, b in gathered for c, d in queued]


def linear_parameters(spec: LlamaSpec, tp) -> float:
    """The GEMM weights of one layer on one GPU (QKV, output projection, FC1 with gate, FC2):
    Eq. 6 without the two RMSNorm weights (and Qwen3's Q and K norms); what Transformer Engine runs
    in FP8."""
    return eq.layer_parameters(spec, tp) - eq.layer_norm_parameters(spec) - eq.qk_norm_parameters(spec)


FP8_SCALE_BYTES = {"delayed": 0.0, "tensorwise": 0.0, "blockwise": 0.0, "mxfp8": 1 / 32}
"""Scale bytes per FP8 element: MXFP8 keeps one E8M0 scale per 32 elements (Transformer Engine,
'Using FP8 with Transformer Engine', MXFP8 recipe); per-tensor and 128-element block scales
are a few bytes per tensor or per 128 x 128 block, which we count as zero."""
AMAX_TENSORS_PER_LAYER = 4 * (3 + 2)
"""Delayed scaling's FP8 tensors per layer: each of the 4 GEMM modules (QKV and FC1 as
LayerNormLinear, proj and FC2 as Linear, one GEMM each) scales 3 forward tensors (input,
weight, output) and 2 backward ones (output gradient, input gradient): Transformer Engine
``module/base.py``, ``init_fp8_meta_tensors``: ``num_gemms * 3`` if forward else ``num_gemms * 2``."""
AMAX_FLOATS_PER_TENSOR_EXTRA = 1
"""FP32 values per FP8 tensor beside its ``--fp8-amax-history-len`` amax history: the scale
(TE 2.x ``quantization.py``, ``DelayedScalingRecipeState``: ``scale`` and ``amax_history``;
TE 1.x also kept ``scale_inv`` there, 4 bytes more per tensor, 80 bytes per layer)."""


def fp8_weight_bytes_per_layer(spec: LlamaSpec, tp, options):
    """The FP8 weight copies Transformer Engine keeps per layer beyond the BF16 weights, and its
    amax history; they live across microbatches and steps, not per microbatch in flight.

    Sources. megatron-core passes ``is_first_microbatch`` to every TE linear layer
    (``extensions/transformer_engine.py``, ``TELinear.forward``/``TELayerNormColumnParallelLinear
    .forward``: ``None if self.disable_parameter_transpose_cache else self.is_first_microbatch``;
    set True once per step by ``schedules.forward_step`` through ``MegatronModule
    .set_is_first_microbatch``). TE then casts the weight into a cached workspace: ``linear.py``,
    ``Linear.forward`` -> ``get_fp8_workspace``/``get_weight_workspace(cache_name="weight" unless
    is_first_microbatch is None, update_workspace=is_first_microbatch)``, kept in
    ``self._fp8_workspaces`` (``module/base.py``). On Hopper the workspace holds the row-wise
    FP8 data and its transpose: TE 1.11 ``get_fp8_workspace`` allocates ``data`` (uint8, the
    weight's shape) and ``data_transpose`` whenever grad is enabled; TE 2.x sets the weight
    quantizer's usage to ``rowwise=True, columnwise=is_grad_enabled`` (column-wise data of a
    ``Float8Tensor`` is the transpose). So 2 bytes per GEMM weight (plus MXFP8's scales).
    --fp8-param-gather builds the weights as FP8 parameters (``fp8_model_init``): the BF16
    weight is gone (Megatron's parameter buffer is uint8, ``param_and_grad_buffer.py``) and the
    parameter keeps its own transpose cache (TE 1.11 ``Float8Tensor.to_float8(...,
    with_transpose_cache=torch.is_grad_enabled())`` in ``reset_parameters``; TE 2.x quantizes
    it row- and column-wise): 1 + 1 bytes, so the BF16 bytes of those weights come off. Delayed
    scaling keeps ``--fp8-amax-history-len`` FP32 amax values plus a scale per FP8 tensor."""
    if options.fp8_format is None:
        return 0.0 * np.asarray(tp, dtype=float)
    return fp8_weight_bytes(linear_parameters(spec, tp), AMAX_TENSORS_PER_LAYER, options)


def fp8_weight_bytes(linear, amax_tensors, options):
    """``fp8_weight_bytes_per_layer``'s sum for ``linear`` GEMM weights on one GPU and
    ``amax_tensors`` FP8 tensors (5 per GEMM, ``AMAX_TENSORS_PER_LAYER``'s count): the FP8 copy
    and its transpose, 2 bytes (plus MXFP8's scales), less the BF16 weight with
    --fp8-param-gather, plus delayed scaling's amax history and scale (same sources)."""
    copies = 2 * (1 + FP8_SCALE_BYTES[options.fp8_recipe]) * linear
    dropped = options.element_bytes * linear if options.fp8_param_gather else 0.0
    amax = 0
    if options.fp8_recipe == "delayed":
        amax = 4 * (options.fp8_amax_history_len + AMAX_FLOATS_PER_TENSOR_EXTRA) * amax_tensors
    return copies - dropped + amax


def fp8_activation_saving(spec: LlamaSpec, seq_len: int, mbs, options):
    """(saved with SP/TP split, saved that stays whole per TP rank without SP): bytes that one
    layer's activations shrink by for one microbatch with FP8 GEMMs (negative: they grow).

    Transformer Engine saves each FP8 GEMM's input for the weight-gradient GEMM in FP8, one
    copy of 1 byte per element (plus MXFP8's scales): TE 1.11 ``linear.py`` ``_Linear.forward``
    saves ``inputmat`` (``cast_to_fp8``) or ``inputmat_t`` (``fp8_cast_transpose_fused``), not
    both; TE 2.x keeps one usage (``inputmat.update_usage(rowwise_usage=False)`` or row-wise
    only for the sequence-parallel all-gather). What that changes depends on who else holds the
    BF16 tensor (Eq. 11-12 count each once):
    - QKV and FC1 inputs (sbh each, whole per TP rank without SP): the fused norm writes FP8
      directly and that FP8 output is what is saved (TE 1.11 ``layernorm_linear.py``:
      ``ln_out_dtype = torch.uint8 if fp8 and not return_layernorm_output``, saved ``ln_out``;
      TE 2.x ``with_quantized_norm``); the norm's BF16 input is saved as before. 2 -> 1 byte.
    - FC2 input (sb h_ffn): Megatron's SwiGLU saves its own input, not its output, so the BF16
      output is freed once FC2 has its FP8 copy. 2 -> 1 byte.
    - Projection input (the attention output, sb a d): core attention keeps its BF16 output for
      its backward (TE ``FusedAttnFunc``: ``qkvo_tensors = (q, k, v, out)`` unless FP8 attention),
      which in BF16 is the same tensor the projection saves; in FP8 the projection saves an FP8
      copy beside it. 2 -> 2 + 1 bytes: it grows.
    A recomputed MLP (--recompute-modules mlp) keeps neither FC1's nor FC2's input
    (``equations.recomputed_module_bytes``): only the QKV input and the projection's copy remain."""
    zero = 0.0 * np.asarray(mbs, dtype=float)
    if options.fp8_format is None:
        return zero, zero
    scale = FP8_SCALE_BYTES[options.fp8_recipe]
    tokens = seq_len * np.asarray(mbs, dtype=float)
    if options.recompute == "selective" and "mlp" in options.recompute_modules:
        return tokens * -(1 + scale) * spec.query_size + zero, (1 - scale) * tokens * spec.hidden_size + zero
    split = tokens * ((1 - scale) * spec.ffn_hidden_size - (1 + scale) * spec.query_size)
    whole = (1 - scale) * tokens * 2 * spec.hidden_size
    return split + zero, whole + zero

