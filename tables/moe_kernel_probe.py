"""``python -m tables.moe_kernel_probe``: the MoE router's and permutations' kernels on one GPU, and
the time-model constants derived from them.

The measurement (``benchmarks/gpu/time_moe_kernels.py``, committed in
``benchmarks/gpu/data/h200_moe_kernels*/``: one H200, torch 2.11.0+cu130, megatron-core 0.15.2
without Transformer Engine, 2026-11-28) builds megatron-core's real MoE layer of a preset
(sequence 4096, MBS 1, EP 1, forced balanced routing, router and permutations unfused) and profiles
one forward and backward of the router and of each dispatcher's dispatch and combine. From the
profiles' kernel times:

- ``ROUTER_KERNELS_S``: the router's kernels less its GEMMs (the measurement's FP32 gating GEMM
  runs on CUDA cores without Transformer Engine; with it, ``te_general_gemm`` runs a BF16
  tensor-core GEMM, which the model prices), the mean of the two dispatchers' runs: softmax from
  Qwen3-30B-A3B, sigmoid from DeepSeek-V3;
- ``PERMUTE_HBM_FRACTION``: the permutation by expert and its inverse priced at the calibrated
  HBM rate of the ``h200-141gb`` preset (three times the forward, as the model prices a
  backward) over their measured kernel time: the allgather dispatcher's dispatch and combine at
  EP 1 (no collective runs on one rank, and it has no second pair), from Qwen3-30B-A3B. The
  alltoall dispatcher's kernels less its concatenations (the sort by local expert) check it; the
  concatenations against the sort's price at the rate say why that pair keeps the rate.

Held out: Mixtral 8x7B (softmax top-2 over 8 experts, hidden 4096) checks both; DeepSeek-V3 checks
the permutations. No published run enters any of them; ``tests/test_tables_moe_kernel_probe.py``
holds the constants in ``advisor.moe.time`` to these derivations.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from advisor.hardware import get_gpu
from advisor.moe import ep_time
from advisor.moe import memory as mm
from advisor.moe import time as moe_time
from advisor.moe.spec import PRESETS
from advisor.throughput import terms
from advisor.throughput.calibration import load_calibration

DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "data"
SUMMARY = DATA / "h200_moe_kernels" / "summary.json"
"""Qwen3-30B-A3B's: what the softmax router's and the permutations' constants come from."""
SUMMARIES = {"qwen3-30b-a3b": SUMMARY, "mixtral-8x7b": DATA / "h200_moe_kernels_mixtral-8x7b" / "summary.json",
             "deepseek-v3": DATA / "h200_moe_kernels_deepseek-v3" / "summary.json"}
HELD_OUT = {"mixtral-8x7b": ("router", "permutations"), "deepseek-v3": ("permutations",)}
"""What each other model's measurement checks without entering it (DeepSeek-V3's router is the
sigmoid constant's source)."""
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
    by_expert, by_local_expert = ep_time.permutation_pairs(spec, copies, 1, "alltoall")
    alltoall = profile_of(summary, "alltoall-dispatch")
    concatenations = sum(k["total_s"] for k in alltoall["top_kernels"] if CONCATENATION in k["name"])
    return Derived(router_kernels_s=router, permute_measured_s=profile_of(summary, "allgather-dispatch")["kernel_s"],
                   permute_priced_s=3 * float(terms.elementwise_time(by_expert, rates)),
                   alltoall_first_pair_s=alltoall["kernel_s"] - concatenations, sort_measured_s=concatenations,
                   sort_priced_s=3 * float(terms.elementwise_time(by_local_expert, rates)))


def load() -> dict[str, Derived]:
    """Each measured model's ``Derived``."""
    return {model: derive(json.loads(path.read_text())) for model, path in SUMMARIES.items()}


def lines(derived: dict[str, Derived]) -> list[str]:
    ms = lambda seconds: f"{seconds * 1e3:.3f} ms"  # noqa: E731
    qwen, deepseek = derived["qwen3-30b-a3b"], derived["deepseek-v3"]
    out = [
        "MoE layers on one H200 (sequence 4096, MBS 1, EP 1), forward + backward (benchmarks/gpu/data/h200_moe_kernels*):",
        f"  softmax router (qwen3-30b-a3b), besides its GEMMs  {ms(qwen.router_kernels_s)}"
        f"   -> ROUTER_KERNELS_S['softmax'] = {moe_time.ROUTER_KERNELS_S['softmax'] * 1e3:.2f} ms",
        f"  sigmoid router (deepseek-v3), besides its GEMMs    {ms(deepseek.router_kernels_s)}"
        f"   -> ROUTER_KERNELS_S['sigmoid'] = {moe_time.ROUTER_KERNELS_S['sigmoid'] * 1e3:.2f} ms",
        f"  permutation by expert + inverse (qwen3-30b-a3b)    {ms(qwen.permute_measured_s)} measured, "
        f"{ms(qwen.permute_priced_s)} at the HBM rate -> PERMUTE_HBM_FRACTION {qwen.permute_hbm_fraction:.3f} "
        f"(advisor: {ep_time.PERMUTE_HBM_FRACTION})",
        f"    check: alltoall less its sort                     {ms(qwen.alltoall_first_pair_s)}",
        f"  sort by local expert (alltoall)                    {ms(qwen.sort_measured_s)} measured, "
        f"{ms(qwen.sort_priced_s)} at the rate ({qwen.sort_priced_s / qwen.sort_measured_s:.2f}x): kept at the rate",
        "Held out (measured / priced now):"]
    for model, parts in HELD_OUT.items():
        d = derived[model]
        if "router" in parts:
            out.append(f"  {model} router        {ms(d.router_kernels_s)} / {ms(moe_time.ROUTER_KERNELS_S['softmax'])}"
                       f" = {d.router_kernels_s / moe_time.ROUTER_KERNELS_S['softmax']:.2f}")
        priced = d.permute_priced_s / ep_time.PERMUTE_HBM_FRACTION
        out.append(f"  {model} permutations  {ms(d.permute_measured_s)} / {ms(priced)} = "
                   f"{d.permute_measured_s / priced:.2f} (its own fraction {d.permute_hbm_fraction:.3f})")
    return out


def main() -> None:
    print("\n".join(lines(load())))


if __name__ == "__main__":
    main()
