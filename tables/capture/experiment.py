"""The experiment: one tiny Llama with heavy ends, its profiling campaigns and its held-out layouts.

Model: 16 layers, hidden 128, FFN 512, 4 heads, 2 KV heads, vocabulary 32000, untied; sequence
128; FP32 weights and activations (the emulator's torch Adam, unsharded: no distributed
optimizer). Target: microbatch 4, global batch 16, so 4 microbatches; PP 4 on 4 GPUs.

Profiling (``advisor profile plan``, pipeline-only: one GPU per node, so no DP/TP scenario): the
full campaign (CAPTURE's Description 1, 16 partitionings x microbatches 1 and 2) and the reduced
one (3 x 2). Held out: layouts drawn at random (seeded) from every split of the 16 layers, none
of them a profiled split, measured at the target microbatch 4 with max(PP, 4) microbatches: 40
on PP 4, and 10 on PP 2 and 8 on PP 8 to see other depths (PP 8 with 8 microbatches, so its first
stage holds twice what any profiled stage held).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from itertools import combinations

from advisor.capture.campaign import Campaign, layout_campaign, plan_campaign
from advisor.megatron_args import MegatronSetup
from advisor.models import LlamaSpec

SPEC = LlamaSpec(name="tiny-llama-16x128-v32k", num_layers=16, hidden_size=128, ffn_hidden_size=512,
                 num_attention_heads=4, num_query_groups=2, vocab_size=32000)
SEQ_LEN = 128
MICROBATCH = 4
GLOBAL_BATCH = 16
GPUS = 4
SETUP = MegatronSetup(params_dtype="float32", distributed_optimizer=False, sequence_parallel=False)
SEED = 20261122


@dataclass(frozen=True, kw_only=True, slots=True)
class HeldOut:
    name: str
    pp: int
    count: int

    @property
    def num_microbatches(self) -> int:
        return max(self.pp, 4)


HELD_OUT = (HeldOut(name="heldout-pp4", pp=4, count=40), HeldOut(name="heldout-pp2", pp=2, count=10),
            HeldOut(name="heldout-pp8", pp=8, count=8))
PROFILING = ("full", "reduced")


def profiling_campaign(mode: str) -> Campaign:
    return plan_campaign(SPEC, gpus=GPUS, gpus_per_node=1, seq_len=SEQ_LEN, micro_batch_size=MICROBATCH,
                         global_batch_size=GLOBAL_BATCH, mode=mode, setup=SETUP)


def splits(layers: int, stages: int) -> list[tuple[int, ...]]:
    """Every split of ``layers`` into ``stages`` non-empty stages, in lexicographic order."""
    found = []
    for cuts in combinations(range(1, layers), stages - 1):
        bounds = (0, *cuts, layers)
        found.append(tuple(b - a for a, b in zip(bounds, bounds[1:])))
    return sorted(found)


def held_out_campaign(held: HeldOut, profiled: set[tuple[int, ...]]) -> Campaign:
    """``held.count`` splits on ``held.pp`` stages drawn without replacement (seeded), none profiled."""
    pool = [split for split in splits(SPEC.num_layers, held.pp) if split not in profiled]
    chosen = random.Random(f"{SEED}-{held.name}").sample(pool, held.count)
    return layout_campaign(SPEC, sorted(chosen), seq_len=SEQ_LEN, pipeline_microbatch=MICROBATCH,
                           num_microbatches=held.num_microbatches, setup=SETUP, source="held-out")


def campaigns() -> dict[str, Campaign]:
    """Every campaign of the experiment by name: 'full', 'reduced', then the held-out sets."""
    planned = {mode: profiling_campaign(mode) for mode in PROFILING}
    profiled = {run.layers_per_stage for campaign in planned.values() for run in campaign.runs}
    planned.update({held.name: held_out_campaign(held, profiled) for held in HELD_OUT})
    return planned
