"""The data loader's s x s attention mask is charged only where the run builds it.

Megatron's GPTDataset builds a bool s x s mask per sample unless
--no-create-attention-mask-in-dataloader (core_v0.15.2 gpt_dataset.py,
_get_ltor_masks_and_position_ids); the advisor emits that flag by default (``dataloader_mask``
'off'), so charging the mask there called long-context layouts out of memory that fit."""

import json
import subprocess
import sys

import pytest

from advisor.models import PRESETS
from advisor.options import TrainingOptions
from advisor.parallel import ParallelConfig, Workload
from advisor.memory import estimate_memory
from advisor.throughput.calibration import load_memory_calibration
from advisor.verdicts import calibrated_stage_bytes

GIB = 2**30


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_the_mask_is_b_s_squared_times_one_plus_one_over_cp_on_the_end_stages_only(cp):
    """Hand-derived: the mask is b s^2 bytes (bool) on the rank that loads the batch, and the
    1/c slice CP keeps: at s = 65,536, b = 1, 4 GiB x (1 + 1/c) on the first and the last of
    four stages, nothing on the two between, and nothing at all with the mask off."""
    spec, workload = PRESETS["llama3.1-8b"], Workload(seq_len=65536, global_batch_size=8)
    parallel = ParallelConfig(tp=8, cp=cp, pp=4, dp=1, mbs=1)
    usage = {}
    for mask in ("off", "cached"):
        options = TrainingOptions().with_(dataloader_mask=mask).memory_options()
        estimate = estimate_memory(spec, parallel, workload, options)
        usage[mask] = calibrated_stage_bytes(estimate, spec, 65536, 1, 8, cp, options, load_memory_calibration(), 80.0)
    difference = [(on - off) / GIB for on, off in zip(usage["cached"], usage["off"])]
    expected = 4.0 * (1 + 1 / cp)
    assert difference == pytest.approx([expected, 0.0, 0.0, expected], abs=1e-9)


def test_estimate_charges_the_mask_only_when_asked_for():
    """The CLI: at 64K tokens on one node, the default (mask off, as the emitted flags say) is
    8 GiB lighter than --dataloader-mask cached."""
    def calibrated(*mask: str) -> tuple[float, list[str]]:
        done = subprocess.run([sys.executable, "-m", "advisor", "estimate", "--model", "llama3.1-8b", "--gpus", "8",
                               "--gpu", "h100-80gb", "--tp", "8", "--seq-len", "65536", "--gbs", "8", "--format", "json",
                               *mask], capture_output=True, text=True, check=True)
        result = json.loads(done.stdout)
        return result["usage_gib"], result["megatron_args"]

    default, flags = calibrated()
    cached, cached_flags = calibrated("--dataloader-mask", "cached")
    assert "--no-create-attention-mask-in-dataloader" in flags
    assert "--no-create-attention-mask-in-dataloader" not in cached_flags
    assert cached - default == pytest.approx(8.0, abs=0.01)
