"""The EP all-to-all's network rate (``advisor.moe.time``) is what nccl-tests measured elsewhere
(``tables.published.alltoall_rate``), not the line rate NCCL's maintainers call the best case."""

from __future__ import annotations

import pytest

from advisor.moe import ep_time
from tables.published import alltoall_rate


def test_the_constants_are_the_fit_of_the_measurements():
    result = alltoall_rate.fit()
    assert result.runs == 21  # 2, 4 and 8 nodes, 7 sizes each
    assert ep_time.A2A_NETWORK_FRACTION == pytest.approx(result.fraction, abs=5e-4)
    assert ep_time.A2A_PEER_S == pytest.approx(result.peer_s, abs=5e-8)
    assert result.mean_abs_error < 0.07  # the two-term model describes the runs it is fitted on


def test_one_measurement_by_hand():
    """2 nodes of 8, 128 MiB per rank: 8 MiB to each of the other node's 8 ranks; 128 MiB at
    73.38 GB/s is 1.829 ms, so each remote message took 0.2286 ms, 36.7 GB/s: 73% of 50 GB/s,
    where line rate would have priced it at 0.168 ms (1.36x faster)."""
    row = next(r for r in alltoall_rate.load() if (r["nodes"], r["size_mib"]) == (2, 128))
    per_peer_s = 128 * 2**20 / (row["algbw_gb_per_s"] * 1e9) / 8
    assert per_peer_s == pytest.approx(0.2286e-3, rel=1e-3)
    achieved = 8 * 2**20 / per_peer_s / 1e9
    assert achieved == pytest.approx(36.7, abs=0.05)
    # the fitted model at this size: 8 MiB at 83.4% of 50 GB/s plus 10.4 us, within 10% of it
    modelled = 8 * 2**20 / (ep_time.A2A_NETWORK_FRACTION * 50e9) + ep_time.A2A_PEER_S
    assert modelled == pytest.approx(per_peer_s, rel=0.10)
    assert modelled > 8 * 2**20 / 50e9 * 1.2  # well above the line rate's price


def test_large_messages_plateau_below_line_rate():
    """At 2 GiB per rank every node count stays under 90% of line rate off-node (the plateau)."""
    for row in alltoall_rate.load():
        if row["size_mib"] == 2048:
            off_node = row["algbw_gb_per_s"] * (row["gpus"] - 8) / row["gpus"]
            assert 0.75 < off_node / alltoall_rate.LINE_RATE_GB_PER_S < 0.9
