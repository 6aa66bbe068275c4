"""What a campaign will cost the CPU emulator, from its shapes, said before it starts.

``advisor profile run`` on a CPU emulates every stage of every run with real megatron-core modules
(``megatron_hooks.stage_emulation``): two iterations of ``m`` microbatches, 1F1B, in TP x DP
processes.
A real model's campaign there takes hours and more memory than the machine has; this module
estimates both, so that the command can say so and refuse (``limits.CPU_EMULATION_SECONDS``, the
machine's available memory) unless the user insists.

Time, per stage and rank: FLOPs / (FLOP/s per core x threads) + module passes x overhead + the
stage's build, where

- FLOPs per microbatch: forward 2 x tokens x parameters of the stage on this TP rank, plus the
  unfused attention's 4 b s^2 a d / t (scores and attention over V, the full s x s); backward twice
  the forward (seed 004's and Megatron-LM's 3 x forward);
- a module pass is one region's forward or backward (embedding, each layer, output), whose fixed
  cost is the CPU backend's Python work per aten op (about 50 ops per layer);
- ranks of a run share the machine's cores: with more processes than cores, their time adds up.

The constants are fitted by ``benchmarks/bench_emulation_cost.py`` on one set of stage shapes and
checked on another (its output gives the ratios); they describe the machine they were measured on
(x86_64, 2 cores), so on another machine the estimate is a guide, not a promise.

Memory of a process at its peak: its stage's weights, gradients and Adam's two states (the
emulator's dtype, 4 copies), the activations of the microbatches in flight (the local layer
spec's count per layer: (6 + 4/t) sbh + 2sb + 4sd + (a/t) b s^2 + (5/t) sb h_ffn elements, as
tests/test_hooks.py counts it by hand), the FP32 logits of the last stage (three s b v / t tensors
at the loss), and a process's own footprint (torch and megatron-core imported). A run's processes
are alive at once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from advisor import equations as eq
from advisor import limits
from advisor.capture.campaign import PROFILING_ITERATIONS
from advisor.models import LlamaSpec

# Fitted by benchmarks/bench_emulation_cost.py (non-negative least squares on its FIT shapes) on
# this project's 2-core x86_64 machine, idle (load average below 1), 2026-11-25. The first fit, on
# 2026-11-24 while other jobs shared the cores, gave 8.2e9 FLOP/s, 0.024 s and 0.19 s, which put
# the held-out stages 6 to 8 times too long on the idle machine: how far a busy machine can be
# from this estimate, in the other direction.
FLOPS_PER_CORE = 5.25e10
"""FP32 FLOP/s of one core in megatron-core's matmuls under the CPU backend (fitted)."""
SECONDS_PER_PASS = 0.0026
"""Fixed cost of one module's forward or backward pass (fitted)."""
SECONDS_PER_STAGE = 0.0
"""Building a stage's model and optimizer, and the collection between iterations (fitted: too small
to tell from the other two terms on the idle machine)."""
PROCESS_BYTES = 600 * limits.MIB
"""Resident memory of an emulation process before its model (torch and megatron-core imported;
measured: 560-620 MiB)."""
ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True, slots=True)
class RunCost:
    id: str
    seconds: float
    peak_bytes: float
    """Memory of all the run's processes at their peak (they live at once)."""


@dataclass(frozen=True, slots=True)
class CampaignCost:
    runs: tuple[RunCost, ...]
    cores: int

    @property
    def seconds(self) -> float:
        return sum(run.seconds for run in self.runs)

    @property
    def peak(self) -> RunCost | None:
        return max(self.runs, key=lambda run: run.peak_bytes, default=None)

    def summary(self) -> str:
        """'6 runs to emulate: about 2 min, at most 3.1 GiB at once (run x)'."""
        if not self.runs:
            return "every run is complete"
        peak = self.peak
        return (f"{len(self.runs)} run(s) to emulate on {self.cores} core(s): about {duration(self.seconds)}, at most "
                f"{peak.peak_bytes / limits.GIB:.1f} GiB at once (run {peak.id}); estimated from the shapes")

    def problem(self, available_bytes: int | None, limit_seconds: float = limits.CPU_EMULATION_SECONDS) -> str | None:
        """Why these runs cannot finish on this machine (too long, or more memory than it has), or None."""
        reasons = []
        if self.seconds > limit_seconds:
            reasons.append(f"take about {duration(self.seconds)} (the limit is {duration(limit_seconds)})")
        peak = self.peak
        if peak is not None and available_bytes is not None and peak.peak_bytes > available_bytes:
            reasons.append(f"need {peak.peak_bytes / limits.GIB:,.1f} GiB at once for run {peak.id} "
                           f"({available_bytes / limits.GIB:.1f} GiB are available)")
        if not reasons:
            return None
        return (f"its {len(self.runs)} run(s) to emulate would {' and '.join(reasons)}, estimated from their shapes: "
                f"profile at the real size with --backend symbolic (no GPU, seconds) or on GPUs with --megatron-lm, "
                f"or plan a smaller model; --force runs it anyway")


@dataclass(frozen=True, slots=True)
class StageTerms:
    """One stage on one rank over the profiling iterations, before the machine's constants."""
    flops: float
    passes: int
    """Module passes (forward or backward of the embedding, a layer, the output)."""
    peak_bytes: float


def _layer_elements(spec: LlamaSpec, s: int, b: int, t: int) -> float:
    """Activations one layer keeps for one microbatch on a TP rank (local spec, unfused attention)."""
    h, a, ffn = spec.hidden_size, spec.num_attention_heads, spec.ffn_hidden_size
    d = h // a
    return (6 + 4 / t) * s * b * h + 2 * s * b + 4 * s * d + a / t * b * s * s + 5 / t * s * b * ffn


def stage_terms(spec: LlamaSpec, *, seq_len: int, micro_batch_size: int, microbatches: int, layers: int,
                first: bool, last: bool, in_flight: int, tp: int, dtype: str) -> StageTerms:
    """FLOPs, module passes and peak bytes of one stage on one rank, as the module docstring counts them."""
    s, b, t = seq_len, micro_batch_size, tp
    embedding = eq.embedding_parameters(spec, t)
    parameters = layers * eq.layer_parameters(spec, t) + (embedding if first else 0)
    if last:
        parameters += embedding + eq.final_norm_parameters(spec)
    matmul = parameters - (embedding if first else 0)  # the input embedding is a lookup, no matmul
    forward = 2 * s * b * matmul + layers * 4 * b * s * s * spec.hidden_size / t
    iterations_microbatches = PROFILING_ITERATIONS * microbatches
    element = ELEMENT_BYTES[dtype]
    activations = in_flight * layers * _layer_elements(spec, s, b, t) * element + (8 * s * b if first else 0)
    if last:
        activations += 3 * s * b * spec.vocab_size / t * 4  # FP32 logits at the loss
    return StageTerms(flops=iterations_microbatches * 3 * forward,
                      passes=iterations_microbatches * 2 * (layers + first + last),
                      peak_bytes=4 * parameters * element + activations)


def stage_seconds(terms: StageTerms, threads: int) -> float:
    return terms.flops / (FLOPS_PER_CORE * threads) + terms.passes * SECONDS_PER_PASS + SECONDS_PER_STAGE


def emulation_cost(campaign: dict, runs: list[dict] | None = None, *, cores: int | None = None,
                   threads: int | None = None, memory_limit_bytes: float | None = None) -> CampaignCost:
    """The cost of ``runs`` (default: all) of a checked campaign on this machine's ``cores``, each
    process with ``threads`` intra-op threads (default: the runner's, cores / (TP x DP)); with a
    ``memory_limit_bytes``, a stage that needs more ends OOM there instead of growing."""
    cores = cores or os.cpu_count() or 1
    spec = LlamaSpec(**campaign["model"])
    costs = []
    for run in campaign["runs"] if runs is None else runs:
        counts, world = run["layers_per_stage"], run["tp"] * run["dp"] * run.get("cp", 1)
        per_process = threads or max(1, cores // world)
        seconds, peak = 0.0, 0.0
        for stage, layers in enumerate(counts):
            terms = stage_terms(
                spec, seq_len=campaign["seq_len"], micro_batch_size=run["micro_batch_size"],
                microbatches=run["num_microbatches"], layers=layers, first=stage == 0, last=stage == len(counts) - 1,
                in_flight=min(len(counts) - stage, run["num_microbatches"]), tp=run["tp"],
                dtype=campaign["setup"]["params_dtype"])
            seconds += stage_seconds(terms, per_process) * max(1.0, world * per_process / cores)  # shared cores
            peak = max(peak, terms.peak_bytes if memory_limit_bytes is None else min(terms.peak_bytes,
                                                                                   memory_limit_bytes))
        costs.append(RunCost(id=run["id"], seconds=seconds, peak_bytes=world * (PROCESS_BYTES + peak)))
    return CampaignCost(runs=tuple(costs), cores=cores)


def available_memory() -> int | None:
    """MemAvailable of /proc/meminfo (Linux), in bytes; None where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} days"
