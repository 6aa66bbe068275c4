"""Where Megatron puts a launch's parallel groups on its nodes, against the nodes it was priced on.

A sweep row or estimate prices each group's communication over NVLink where the group lies in
one node of its 'gpus_per_node', over the network beyond (``advisor.throughput.terms.link_bandwidth``,
``advisor.moe.ep_time.all_to_all_time``). The launch's ranks per node may differ: a group it splits
across nodes that was priced inside one makes the step time too optimistic. These are notes,
never refusals: the run is valid, its price is not.

Megatron's rank order (``parallel_state.initialize_model_parallel``, core_v0.15.2 and
core_v0.19.0; ``megatron/training/initialize.py`` passes 'tp-cp-ep-dp-pp', or 'tp-cp-ep-pp-dp'
with --use-tp-pp-dp-mapping): TP varies fastest, so a TP group is TP consecutive ranks. The
experts have a RankGenerator of their own over the same order with ETP as its TP and CP 1
(core_v0.19.0 inserts its expert GTP axis after 'ep', size 1 by default), so an EP group is EP
ranks ETP apart, and ETP x EP consecutive ranks hold ETP whole EP groups. A node of n ranks
(nodes start at multiples of n) therefore holds whole groups exactly where the group's span
divides n: otherwise the first node boundary falls inside a span and some group straddles it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class RankGroup:
    """One kind of parallel group as Megatron places it on the ranks."""

    kind: str
    """'TP', 'CP' or 'EP': the notes' name for it."""
    size: int
    """Ranks in one group."""
    stride: int = 1
    """How far apart a group's ranks are: 1 for TP, TP for CP, ETP for EP (the expert rank order)."""
    stride_name: str = ""
    """What the stride is, for the notes: 'TP' for CP, 'ETP' for EP."""
    priced_by_peers: bool = False
    """Whether its price across nodes depends on how many of its ranks share a node: the EP
    all-to-all sends to min(EP, gpus_per_node / ETP) peers over NVLink and the rest over the network
    (``all_to_all_time``; the allgather dispatcher's ring aggregates that many NICs,
    ``allgather_dispatch_time``). TP's ring across nodes is priced at one NIC's rate whatever the
    node (``terms.tensor_parallel_time``), so a TP priced across nodes is priced as launched."""

    @property
    def span(self) -> int:
        """Consecutive ranks that hold whole groups: a node holds whole groups where this divides it."""
        return self.size * self.stride

    @property
    def label(self) -> str:
        if self.stride == 1:
            return f"{self.kind} {self.size}"
        return (f"{self.kind} {self.size} (its ranks {self.stride_name} {self.stride} apart: {self.span} consecutive "
                "ranks)")

    def peers_in_node(self, per_node: int) -> float:
        """The group's ranks in one node of ``per_node``, as the time model counts them."""
        return min(self.size, max(1.0, per_node / self.stride))


def rank_groups(tp: int, ep: int | None = None, etp: int | None = None, cp: int = 1) -> list[RankGroup]:
    """The groups whose placement the time model prices: TP, CP (its ring over the TP x CP ranks it
    spans, ``terms.context_parallel_time``'s ``link_bandwidth(tp * cp)``), and an MoE row's EP (with ETP)."""
    groups = [RankGroup(kind="TP", size=tp)]
    if cp > 1:
        groups.append(RankGroup(kind="CP", size=cp, stride=tp, stride_name="TP"))
    if ep is not None and ep > 1:
        groups.append(RankGroup(kind="EP", size=ep, stride=etp or 1, stride_name="ETP", priced_by_peers=True))
    return groups


def span_note(group: RankGroup, per_node: int, source: str, priced_per_node: int | None = None,
              timed: bool = True) -> str | None:
    """The note for ``group``s that cross nodes at ``per_node`` ranks per node, or None where every
    node holds whole groups. ``priced_per_node``: the GPUs per node ``source`` was priced with (a
    row's 'gpus_per_node'; None for rows written before they recorded it, then the note says where
    it would have been priced so); ``timed``: the input has a step time (a GPU preset's), else
    what it priced, memory, does not depend on the nodes. Too optimistic where the group was
    priced inside a node, or across nodes with more of its ranks in each than launched."""
    if group.size == 1 or per_node % group.span == 0:
        return None
    kind, spans = group.kind, f"{group.label} spans nodes at {per_node} ranks per node"
    if priced_per_node is None:
        return (f"warning: {spans}: its collectives cross the network, priced only where {source} was priced at "
                f"{per_node} GPUs per node (advisor estimate --gpus-per-node {per_node}, or --from-command of this "
                "launch)")
    inside = group.span <= priced_per_node
    fewer = group.priced_by_peers and group.peers_in_node(per_node) < group.peers_in_node(priced_per_node)
    if not inside and not fewer:
        return (f"advisor-launch: {spans}: its collectives cross the network, as {source} priced them (nodes of "
                f"{priced_per_node} GPUs)")
    if not timed:
        return (f"warning: {spans}: its collectives cross the network ({source} has no step time: its memory "
                f"does not depend on where {kind} runs)")
    # a domain larger than the launch's nodes may span them (a GB200 NVL72's 72 GPUs, 4 per host)
    shared = ", unless those nodes share one NVLink domain" if priced_per_node > per_node else ""
    if inside:
        return (f"warning: {source} was priced with {group.label} within a node of {priced_per_node} GPUs; "
                f"launched at {per_node} ranks per node, {kind} groups span nodes: its {kind} communication time "
                f"is too optimistic{shared}")
    return (f"warning: {source} was priced with {group.label} across nodes of {priced_per_node} GPUs; launched "
            f"at {per_node} ranks per node, {kind} groups span more nodes: its {kind} communication time is too "
            f"optimistic{shared}")


def span_notes(per_node: int, source: str, tp: int, ep: int | None = None, etp: int | None = None,
               priced_per_node: int | None = None, timed: bool = True, cp: int = 1) -> list[str]:
    """``span_note`` of each of ``rank_groups``."""
    return [note for group in rank_groups(tp, ep, etp, cp)
            if (note := span_note(group, per_node, source, priced_per_node, timed)) is not None]


def node_size_note(per_node: int, source: str, priced_per_node: int | None = None,
                   planned_per_node: int | None = None) -> str | None:
    """Where the launch puts more ranks on a node than ``source`` was priced with (a row's
    'gpus_per_node') or planned for (a plan's): each node needs that many GPUs, one per rank, and
    what was priced across nodes then runs inside one. Given only the nodes (torchrun --nnodes 1),
    the ranks per node are the world over them, which is easily more than a node has."""
    node, what = (priced_per_node, "priced with") if priced_per_node is not None else (planned_per_node, "planned for")
    if node is None or per_node <= node:
        return None
    inside = f" (what was priced across nodes of {node} then runs inside one)" if priced_per_node is not None else ""
    return (f"advisor-launch: {per_node} ranks per node, more than the {node} GPUs per node {source} was {what}: "
            f"each node needs {per_node} GPUs, one per rank{inside}")
