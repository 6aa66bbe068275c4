"""launch/placement.py: which launches split a parallel group across nodes, checked against the
groups megatron-core itself builds (``parallel_state.RankGenerator``), and what the note says
against the nodes a row was priced on."""

import pytest

from launch.placement import RankGroup, node_size_note, rank_groups, span_note, span_notes

SOURCE = "the estimate (x.json)"


def test_split_groups_are_those_megatron_builds_across_nodes():
    """For every (ETP, EP) and ranks per node of a 16-rank world, the note is given exactly where
    one of the expert RankGenerator's EP groups (and the dense one's TP groups) has ranks on two
    nodes (node = rank // ranks per node), with the order Megatron-LM's training passes."""
    parallel_state = pytest.importorskip("megatron.core.parallel_state",
                                         reason="megatron-core is not installed (pip install -e '.[megatron]')")
    world = 16

    def crosses(groups, per_node):
        return any(len({rank // per_node for rank in group}) > 1 for group in groups)

    for etp, ep in [(1, 2), (1, 8), (1, 16), (2, 2), (2, 4), (2, 8), (4, 2), (4, 4), (8, 2)]:
        experts = parallel_state.RankGenerator(tp=etp, ep=ep, dp=world // (etp * ep), pp=1, cp=1,
                                               order="tp-cp-ep-dp-pp")
        dense = parallel_state.RankGenerator(tp=etp, ep=1, dp=world // etp, pp=1, cp=1, order="tp-cp-ep-dp-pp")
        for per_node in (1, 2, 4, 8, 16):
            ep_group = RankGroup(kind="EP", size=ep, stride=etp, priced_by_peers=True)
            tp_group = RankGroup(kind="TP", size=etp)
            split = span_note(ep_group, per_node, SOURCE, 16) is not None
            assert split == crosses(experts.get_ranks("ep"), per_node), (etp, ep, per_node)
            split = span_note(tp_group, per_node, SOURCE, 16) is not None
            assert split == crosses(dense.get_ranks("tp"), per_node), (etp, per_node)


def test_ep_warning_by_how_it_was_priced():
    """EP 4 at ETP 2: 8 consecutive ranks. Priced on 8-GPU nodes (inside one), on 4-rank nodes it is
    too optimistic; priced on 4-GPU nodes it crosses them as priced; rows without gpus_per_node get
    the conditional words; an untimed row only says where it runs."""
    group = rank_groups(2, 4, 2)[1]
    assert (group.kind, group.span) == ("EP", 8)
    within = span_note(group, 4, SOURCE, 8)
    assert within.startswith(f"warning: {SOURCE} was priced with EP 4 (its ranks ETP 2 apart: 8 consecutive ranks) "
                             "within a node of 8 GPUs; launched at 4 ranks per node, EP groups span nodes")
    assert span_note(group, 4, SOURCE, 4).startswith("advisor-launch: EP 4 (its ranks ETP 2 apart: 8 consecutive "
                                                     "ranks) spans nodes at 4 ranks per node")
    assert "priced only where" in span_note(group, 4, SOURCE, None)
    untimed = span_note(group, 4, SOURCE, 8, timed=False)
    assert "has no step time" in untimed and "too optimistic" not in untimed
    # ETP 8 on 4-rank nodes: one EP rank per node whether priced on 8 or 4 (the model's min 1 peer)
    wide = RankGroup(kind="EP", size=2, stride=8, priced_by_peers=True)
    assert span_note(wide, 4, SOURCE, 8).startswith("advisor-launch: EP 2")


def test_dense_rows_have_no_ep_note_and_tp_priced_across_is_as_priced():
    assert [group.kind for group in rank_groups(8)] == ["TP"]
    assert [group.kind for group in rank_groups(1, 1, 1)] == ["TP"]
    # TP's ring across nodes is priced at one NIC's rate whatever the node: smaller nodes change nothing
    assert span_notes(2, SOURCE, 8, priced_per_node=4)[0].startswith("advisor-launch: TP 8 spans nodes")


def test_node_size_note():
    assert node_size_note(16, SOURCE, 8) == (f"advisor-launch: 16 ranks per node, more than the 8 GPUs per node "
                                             f"{SOURCE} was priced with: each node needs 16 GPUs, one per rank (what "
                                             "was priced across nodes of 8 then runs inside one)")
    planned = node_size_note(16, "the plan (p.json)", None, 8)
    assert planned.endswith("the plan (p.json) was planned for: each node needs 16 GPUs, one per rank")
    assert node_size_note(8, SOURCE, 8) is None and node_size_note(4, SOURCE, 72) is None
    assert node_size_note(16, SOURCE) is None


def test_a_cp_group_split_across_nodes_is_too_optimistic_where_it_was_priced_inside_one():
    """CP's ring is priced over NVLink where its TP x CP ranks lie in one node (terms.link_bandwidth(tp * cp));
    a CP group is CP ranks TP apart (rank order tp-cp-ep-dp-pp), so TP 2 x CP 4 spans 8 consecutive ranks."""
    from launch.placement import span_notes

    notes = span_notes(4, "the estimate (cp.json)", tp=2, cp=4, priced_per_node=8)
    assert notes == ["warning: the estimate (cp.json) was priced with CP 4 (its ranks TP 2 apart: 8 consecutive "
                     "ranks) within a node of 8 GPUs; launched at 4 ranks per node, CP groups span nodes: its CP "
                     "communication time is too optimistic, unless those nodes share one NVLink domain"]
    assert span_notes(8, "x", tp=2, cp=4, priced_per_node=8) == []  # whole groups in a node of 8
    assert span_notes(4, "x", tp=2, cp=2, priced_per_node=8) == []  # TP 2 x CP 2 = 4: whole in 4


def test_split_cp_groups_are_those_megatron_builds_across_nodes():
    """Every (TP, CP) of a 16-rank world and ranks per node: the CP note exactly where one of the
    RankGenerator's CP groups has ranks on two nodes."""
    parallel_state = pytest.importorskip("megatron.core.parallel_state",
                                         reason="megatron-core is not installed (pip install -e '.[megatron]')")
    for tp, cp in [(1, 2), (1, 4), (2, 2), (2, 4), (4, 2), (2, 8), (8, 2)]:
        ranks = parallel_state.RankGenerator(tp=tp, ep=1, dp=16 // (tp * cp), pp=1, cp=cp,
                                             order="tp-cp-ep-dp-pp").get_ranks("cp")
        group = rank_groups(tp, cp=cp)[1]
        for per_node in (1, 2, 4, 8, 16):
            crosses = any(len({rank // per_node for rank in members}) > 1 for members in ranks)
            assert (span_note(group, per_node, SOURCE, 16) is not None) == crosses, (tp, cp, per_node)
