"""``python -m tables.moe_kernel_probe``: the MoE router's and permutations' kernels on one GPU, and
the two time-model constants derived from them.

The measurement (``benchmarks/gpu/time_moe_kernels.py``, committed in
``benchmarks/gpu/data/h200_moe_kernels/``: one H200, torch 2.11.0+cu130, megatron-core 0.15.2
without Transformer Engine, 2026-11-28) builds megatron-core's real Qwen3-30B-A3B MoE layer
(sequence 4096, MBS 1, EP 1, forced balanced routing, router and permutations unfused) and profiles
one forward and backward of the router and of each dispatcher's dispatch and combine. From the
profiles' kernel times:

- ``ROUTER_KERNELS_S``: the router's kernels less its GEMMs (the measurement's FP32 gating GEMM
  runs on CUDA cores without Transformer Engine; with it, ``te_general_gemm`` runs a BF16
  tensor-core GEMM, which the model prices), the mean of the two dispatchers' runs;
- ``PERMUTE_HBM_FRACTION``: the permutation by expert and its inverse priced at the calibrated
  HBM rate of the ``h200-141gb`` preset (three times the forward, as the model prices a
  backward) over their measured kernel time: the allgather dispatcher's dispatch and combine at
  EP 1 (no collective runs on one rank, and it has no second pair). The alltoall dispatcher's
  kernels less its concatenations (the sort by local expert) check it; the concatenations
  against the sort's price at the rate say why that pair keeps the rate.

No published run enters either; ``tests/test_tables_moe_kernel_probe.py`` holds the constants in
``advisor.moe.time`` to these derivations.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from advisor.hardware import get_gpu
from advisor.moe import memory as mm
from advisor.moe import time as moe_time
from advisor.moe.spec import PRESETS
from advisor.throughput import terms
from advisor.throughput.calibration import load_calibration

SUMMARY = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "data" / "h200_moe_kernels" / "summary.json"
GPU = "h200-141gb"
CONCATENATION = "CatArrayBatchedCopy"
"""The kernel-name fragment of ``torch.cat``'s copies, which ``sort_chunks_by_idxs`` runs."""


@dataclass(frozen=True, slots=True)
class Derived:
    router_kernels_s: float
    """Router kernels besides the GEMMs, forward + backward (mean of the two dispatchers)."""
    permute_measured_s: float
    """The allgather dispatcher's dispatch + combine kernels at EP 1: the first pair, forward + backward."""
    permute_priced_s: float
    """The same bytes at the calibrated HBM rate, forward + backward."""
    alltoall_first_pair_s: float
    """The alltoall dispatcher's kernels less its concatenations: the check."""
    sort_measured_s: float
    """The alltoall dispatcher's concatenations (the sort by local expert), forward + backward."""
    sort_priced_s: float
    """The sort's bytes at the rate, forward + backward."""

    @property
    def permute_hbm_fraction(self) -> float:
        return self.permute_priced_s / self.permute_measured_s


def profile_of(summary: dict, name: str) -> dict:
    return summary["parts"][f"{name}-profile"]["result"]


def derive(summary: dict) -> Derived:
    """The constants from the summary's profiles, priced as ``advisor.moe.time`` prices the bytes."""
    routers = [profile_of(summary, f"{d}-router") for d in ("alltoall", "allgather")]
    router = sum(p["kernel_s"] - p["gemm_kernel_s"] for p in routers) / len(routers)
    spec = PRESETS[summary["model"]]
    tokens = mm.tokens_per_rank(summary["seq_len"], 1, 1, 1)
    copies = mm.expert_token_copies(spec, tokens, 1, 1, mm.RoutedTokens())
    rates = terms.Rates.of(get_gpu(GPU), load_calibration())
    by_expert, by_local_expert = moe_time.permutation_pairs(spec, copies, 1, "alltoall")
    alltoall = profile_of(summary, "alltoall-dispatch")
    concatenations = sum(k["total_s"] for k in alltoall["top_kernels"] if CONCATENATION in k["name"])
    return Derived(router_kernels_s=router, permute_measured_s=profile_of(summary, "allgather-dispatch")["kernel_s"],
                   permute_priced_s=3 * float(terms.elementwise_time(by_expert, rates)),
                   alltoall_first_pair_s=alltoall["kernel_s"] - concatenations, sort_measured_s=concatenations,
                   sort_priced_s=3 * float(terms.elementwise_time(by_local_expert, rates)))


def lines(derived: Derived) -> list[str]:
    ms = lambda seconds: f"{seconds * 1e3:.3f} ms"  # noqa: E731
    return [
        f"One Qwen3-30B-A3B MoE layer on one H200 (sequence 4096, MBS 1, EP 1), forward + backward ({SUMMARY.parent.name}):",
        f"  router kernels besides its GEMMs   {ms(derived.router_kernels_s)}"
        f"   -> ROUTER_KERNELS_S = {moe_time.ROUTER_KERNELS_S * 1e3:.2f} ms",
        f"  permutation by expert + inverse    {ms(derived.permute_measured_s)} measured, {ms(derived.permute_priced_s)} "
        f"at the HBM rate -> PERMUTE_HBM_FRACTION {derived.permute_hbm_fraction:.3f} "
        f"(advisor: {moe_time.PERMUTE_HBM_FRACTION})",
        f"    check: alltoall less its sort    {ms(derived.alltoall_first_pair_s)}",
        f"  sort by local expert (alltoall)    {ms(derived.sort_measured_s)} measured, {ms(derived.sort_priced_s)} "
        f"at the rate ({derived.sort_priced_s / derived.sort_measured_s:.2f}x): kept at the rate",
    ]


def main() -> None:
    print("\n".join(lines(derive(json.loads(SUMMARY.read_text())))))


if __name__ == "__main__":
    main()
