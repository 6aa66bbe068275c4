"""The data-parallel collectives of one iteration and what of them the first stage's compute
leaves exposed, for the dense model (one group: every parameter of the rank over DP x CP) and the
MoE model (two: its dense parameters over DP x CP, its experts over the expert-data-parallel
group, each on its own links) alike: one group's collectives (``group_collectives``), summed over
the groups and exposed (``exposed_time``). Same conventions as ``terms.py``.
"""

from __future__ import annotations

import functools
import operator
from typing import NamedTuple

import numpy as np

from advisor.throughput import terms
from advisor.throughput.levers import fsdp_microbatch_time
from advisor.throughput.terms import Rates

SHARDED_GRADS = ("optim_grads", "optim_grads_params")
"""Megatron-FSDP's strategies that shard the gradient buffer: they reduce-scatter each microbatch's
gradients (``levers.fsdp_microbatch_time``) instead of once a step."""


class DpGroup(NamedTuple):
    """One data-parallel group of a rank's parameters."""

    parameters: object
    """The rank's parameters (TP/PP-local) the group reduces and gathers."""
    shards: object
    """Its ranks: DP x CP for a model's dense parameters; the expert-data-parallel group,
    t c d / (etp ep), for an MoE model's experts (megatron-core ``parallel_state``)."""
    ranks_per_node: object
    """Its GPUs in one node (``terms.ranks_per_node``), whose NICs its rings use across nodes."""


class DpCollectives(NamedTuple):
    """One group's DP collectives, seconds (``group_collectives``)."""

    reduce: object
    """The step's gradient reduce-scatter (all-reduce without the distributed optimizer)."""
    gather: object
    """The step's parameter all-gather (0 without the distributed optimizer)."""
    fsdp_forward: object
    """Megatron-FSDP's all-gathers per microbatch before the forward (optim_grads_params)."""
    fsdp_backward: object
    """Its all-gathers before the backward and reduce-scatter after it, per microbatch."""


def group_collectives(group: DpGroup, span, rates: Rates, opts) -> DpCollectives:
    """``DpCollectives`` of ``group`` under the time options ``opts`` (``TimeOptions``) in a
    model whose TP x CP x DP ranks span ``span`` consecutive ranks: the distributed optimizer's
    reduce-scatter and all-gather, else (Megatron's DDP without it, Megatron-FSDP's no_shard) the
    gradients' all-reduce and no gather (``terms.data_parallel_time``), the gradients at
    ``TimeOptions.grad_wire_bytes`` an element, the weights at 1 byte with --fp8-param-gather;
    and where Megatron-FSDP shards the gradients its per-microbatch collectives
    (``levers.fsdp_microbatch_time``) on the same links, else zeros. The step's collectives are
    priced whatever the strategy: ``exposed_time`` drops those the strategy runs per microbatch."""
    strategy = opts.fsdp_strategy
    param_bytes = 1 if opts.fp8_param_gather else terms.BF16
    wire = opts.grad_wire_bytes
    reduce, gather = terms.data_parallel_time(group.parameters, group.shards, span, rates, wire,
                                              opts.distributed_optimizer and strategy != "no_shard",
                                              group.ranks_per_node, param_bytes)
    if strategy not in SHARDED_GRADS:
        return DpCollectives(reduce, gather, 0.0, 0.0)
    bandwidth = terms.link_bandwidth(span, rates, group.ranks_per_node)
    forward, backward = fsdp_microbatch_time(group.parameters, group.shards, bandwidth, rates, strategy, param_bytes,
                                             wire)
    return DpCollectives(reduce, gather, forward, backward)


def _shown(seconds, hidden, overlapped: bool):
    """What of ``seconds`` of communication outlasts ``hidden`` seconds of compute beside it, where
    the overlap is on; all of it where off."""
    return np.maximum(0.0, seconds - hidden) if overlapped else seconds


def exposed_time(groups: tuple[DpGroup, ...], span, rates: Rates, opts, m, hidden_forward, hidden_backward):
    """Exposed DP communication of one iteration: the groups' collectives (``group_collectives``),
    summed in order (each group's on its own rings, one after the other on the same streams:
    core_v0.19.0 issues each Megatron-FSDP unit's dense and expert bucket groups as two collectives on
    the one all-gather stream and the one reduce-scatter stream, megatron_fsdp/param_and_grad_buffer.py
    :1938-1950, :4520-4560),
    the step's gradient reduction hidden behind ``hidden_backward`` seconds of the first stage's
    backward where --overlap-grad-reduce is on and its parameter gather behind ``hidden_forward``
    of its forward where --overlap-param-gather is, all exposed where off; where Megatron-FSDP
    shards the gradients (optim_grads: reduced per microbatch instead; optim_grads_params: gathered
    per microbatch too) the ``m`` microbatches' collectives instead, each hidden likewise."""
    columns = zip(*(group_collectives(group, span, rates, opts) for group in groups))
    reduce, gather, fsdp_f, fsdp_b = (functools.reduce(operator.add, column) for column in columns)
    strategy = opts.fsdp_strategy
    if strategy in SHARDED_GRADS:  # reduced per microbatch instead
        reduce = 0.0 * reduce
    if strategy == "optim_grads_params":  # gathered per microbatch instead
        gather = 0.0 * gather
    exposed = _shown(reduce, hidden_backward, opts.overlap_grad_reduce) \
        + _shown(gather, hidden_forward, opts.overlap_param_gather)
    if strategy in SHARDED_GRADS:
        exposed = exposed + m * (_shown(fsdp_f, hidden_forward, opts.overlap_param_gather)
                                 + _shown(fsdp_b, hidden_backward, opts.overlap_grad_reduce))
    return exposed
