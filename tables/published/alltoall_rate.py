"""``python -m tables.published.alltoall_rate``: the achieved rate of a multi-node NCCL
all-to-all, from measurements made elsewhere, for the EP all-to-all's network term
(``advisor.moe.ep_time.all_to_all_time``).

NCCL's maintainers call the NIC's line rate the best case of an all-to-all (nccl-tests issues
#130 and #267): it cannot aggregate NICs, and each rank sends a separate message to every peer.
``nccl_alltoall_p5.csv`` holds nccl-tests' ``alltoall_perf`` on 2-32 nodes of 8 H100s with
400 Gb/s (50 GB/s) of network per GPU (AWS p5, EFA), each row with its source. For a size S per
rank over n ranks, each rank sends S/n to each of its n - 8 peers on other nodes, so the measured
time S / algbw is written as those peers' messages at a plateau rate R plus a fixed cost c per
remote peer, t = (n - 8) (S/n / R + c), and (R, c) fitted by least squares on the relative
error over the runs of 2, 4 and 8 nodes: the node counts the MoE runs checked against span
(EP 16 to 64). None of the MoE runs' step times enters the fit.

The p5's fabric is EFA; the published MoE runs ran on InfiniBand, for which no such table by
message size was found. Single large-message points on InfiniBand H100 nodes (about 85-92% of
line rate; DeepEP issue #3, nccl-tests #355) agree with the plateau found here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tables.published.csv_rows import typed_rows

DATA = Path(__file__).with_name("nccl_alltoall_p5.csv")
COLUMNS = ("nodes", "gpus", "size_mib", "algbw_gb_per_s", "source")
GPUS_PER_NODE = 8
LINE_RATE_GB_PER_S = 50.0
"""400 Gb/s of EFA per H100 on a p5.48xlarge (32 x 100 Gb/s per node of 8)."""
FIT_NODES = (2, 4, 8)


@dataclass(frozen=True, slots=True)
class AllToAllRate:
    fraction: float
    """The plateau rate over the line rate."""
    peer_s: float
    """The fixed cost of each message to a peer on another node."""
    mean_abs_error: float
    max_abs_error: float
    runs: int


def load(path: Path = DATA) -> list[dict]:
    return [row for _, row in typed_rows(path, COLUMNS, ("nodes", "gpus", "size_mib"), ("algbw_gb_per_s",))]


def fit(rows: list[dict] | None = None, nodes: tuple[int, ...] = FIT_NODES) -> AllToAllRate:
    """(R / line rate, c) of t = (n - 8)(S/n / R + c) over the measurements of ``nodes`` nodes."""
    rows = [row for row in (load() if rows is None else rows) if row["nodes"] in nodes]
    peer_bytes = np.array([row["size_mib"] * 2**20 / row["gpus"] for row in rows])
    remote = np.array([row["gpus"] - GPUS_PER_NODE for row in rows], dtype=float)
    seconds = np.array([row["size_mib"] * 2**20 / (row["algbw_gb_per_s"] * 1e9) for row in rows])
    per_peer = seconds / remote
    design = np.stack([peer_bytes, np.ones_like(peer_bytes)], axis=1) / per_peer[:, None]
    (inverse_rate, peer_s), *_ = np.linalg.lstsq(design, np.ones_like(per_peer), rcond=None)
    error = (peer_bytes * inverse_rate + peer_s) / per_peer - 1
    return AllToAllRate(fraction=1 / inverse_rate / 1e9 / LINE_RATE_GB_PER_S, peer_s=float(peer_s),
                        mean_abs_error=float(np.abs(error).mean()), max_abs_error=float(np.abs(error).max()),
                        runs=len(rows))


def main() -> None:
    result = fit()
    print(f"nccl-tests alltoall_perf on {result.runs} runs of {', '.join(map(str, FIT_NODES))} nodes "
          f"(tables/published/nccl_alltoall_p5.csv): plateau {result.fraction:.3f} of the line rate, "
          f"{result.peer_s * 1e6:.1f} us per remote peer; mean |error| {result.mean_abs_error:.1%}, "
          f"max {result.max_abs_error:.1%}")


if __name__ == "__main__":
    main()
