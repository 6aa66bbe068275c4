"""advisor.space's count of what it priced and pruned: distinct variants, never more than the space.

The planners price some variants more than once (the second memory limit plans again what the
first left open; the uniform method tries every N). Counted as pricings, ``--recompute-method
uniform`` printed "3,862 layouts considered, -1,351 pruned" on 64 GPUs at 40 GiB."""

import pytest

from advisor.hardware import get_gpu
from advisor.memory import MemoryOptions
from advisor.models import PRESETS
from advisor.options import TrainingOptions
from advisor.parallel import Workload
from advisor.space import SpaceOptions, launchable
from advisor.space_search import search
from advisor.sweep import sweep


def _groups_by_hand(spec, bases) -> int:
    """(base, VPP) pairs Megatron runs, by a plain loop: VPP 1, or 1 .. L/PP where the
    interleaved schedule runs (PP > 1 and the microbatches a multiple of PP)."""
    count = 0
    for b in range(len(bases)):
        p, m = int(bases.pp[b]), float(bases.microbatches[b])
        interleaves = p > 1 and (m == float("inf") or (m >= p and m % p == 0))
        count += spec.num_layers // p if interleaves else 1
    return count


@pytest.mark.parametrize("model,gpus,gbs,memory", [("llama3.2-1b", 24, 16, 6.0), ("llama3.1-8b", 32, 256, 60.0)])
def test_without_recomputation_or_a_time_model_every_layout_is_priced_once(model, gpus, gbs, memory):
    """No time model, no recomputation: each layout's VPP 1 variant is priced (interleaving only
    adds memory, so its other VPPs are pruned), once, however many memory limits plan it; so
    ``evaluated`` is the number of layouts and ``considered`` the number of (layout, VPP) pairs.
    (The memories are chosen so that every layout's model states fit: one whose states alone
    exceed the memory is pruned unpriced.)"""
    spec, workload = PRESETS[model], Workload(seq_len=4096, global_batch_size=gbs)
    bases = launchable(spec, workload, gpus, 8, MemoryOptions(), "auto")
    result = search(spec, workload, gpus, memory, threshold=0.8, max_tp=8, options=MemoryOptions(),
                    space=SpaceOptions(recompute="none"))
    usage = result.chosen.terms.total.max(axis=1) / 2**30
    assert ((usage > 0.8 * memory) & (usage <= memory)).any()  # some were planned by both limits
    assert result.considered == _groups_by_hand(spec, bases) and result.evaluated == len(bases)


SPACES = [SpaceOptions(), SpaceOptions(recompute="none"), SpaceOptions(recompute="selective"),
          SpaceOptions(recompute="full"), SpaceOptions(recompute="full", recompute_method="uniform"),
          SpaceOptions(recompute="full", recompute_method="uniform", recompute_num_layers=1),
          SpaceOptions(recompute="full", recompute_method="block", recompute_num_layers=3),
          SpaceOptions(recompute="full", recompute_method="uniform", recompute_num_layers=2, vpp=2),
          SpaceOptions(split="even"), SpaceOptions(split="even", recompute="full", recompute_method="uniform")]


@pytest.mark.parametrize("timed", [False, True])
@pytest.mark.parametrize("space", SPACES, ids=range(len(SPACES)))
@pytest.mark.parametrize("model,gpus,memory", [("llama3.1-8b", 64, 40.0), ("llama3.1-70b", 64, 40.0),
                                               ("llama3.1-70b", 16, 24.0)])
def test_the_count_priced_lies_within_the_space(model, gpus, memory, space, timed):
    """0 <= evaluated <= considered, with and without a time model, where layouts fit and where
    none does: 70B on 16 GPUs of 24 GiB, whose model states alone exceed the memory in every
    layout, so that no variant is priced (each row is shown at its evenest split, unpriced)."""
    found = sweep(PRESETS[model], Workload(), gpus, memory, space=space,
                  gpu=get_gpu("h100-80gb") if timed else None, options=TrainingOptions())
    assert 0 <= found.evaluated <= found.considered and found.pruned == found.considered - found.evaluated
    assert (found.evaluated > 0) == (gpus == 64)
