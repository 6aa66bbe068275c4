"""Megatron-FSDP's real buffers (megatron_hooks/fsdp_symbolic.py: megatron-core's
FullyShardedDataParallel and distributed optimizer around two real-size Llama 3.1 8B layers, on
fake tensors over a fake DP-4 world) against hand counts and the advisor's analytic FSDP terms
(advisor/memory_levers.py). FP8 is not buildable here: Transformer Engine is not importable
(``import transformer_engine.pytorch`` -> ModuleNotFoundError), checked below; docs/options.md,
"Megatron-FSDP measured symbolically"."""

import subprocess
import sys

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install -e '.[megatron]')")

from conftest import run_json_script  # noqa: E402

from advisor.memory_levers import fsdp_buffer_bytes, state_bytes_per_parameter  # noqa: E402
from advisor.options import TrainingOptions  # noqa: E402

SCRIPT = """
import dataclasses, json
from megatron_hooks.stage_emulation import quiet_megatron; quiet_megatron()
from advisor.models import preset
from megatron_hooks.fsdp_symbolic import FSDP_STRATEGIES, measure_fsdp
spec = preset("llama3.1-8b")
print(json.dumps({s: dataclasses.asdict(measure_fsdp(spec, layers=2, strategy=s, dp=4)) for s in FSDP_STRATEGIES}))
"""

# Llama 3.1 8B, by hand: h 4096, 32 query heads and 8 KV heads of 128, FFN 14336, no biases.
# Q and O 4096 x 4096 each, K and V 1024 x 4096 each, gate+up 2 x 14336 x 4096, down 4096 x 14336,
# two RMSNorm weights of 4096.
LAYER = 2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 14336 * 4096 + 2 * 4096
assert LAYER == 218_112_000
STAGE = 2 * LAYER
DP = 4


@pytest.fixture(scope="module")
def measured():
    return run_json_script(SCRIPT)


def test_megatron_fsdp_buffers_by_hand(measured):
    """Bytes by hand: BF16 weights 2, FP32 master weights 4, FP32 gradients 4, Adam 4 + 4 per
    parameter; each divided by DP 4 where the strategy shards it. Megatron-FSDP pads each
    bucket to a multiple of DP (and an alignment), so the buffers hold a few elements more."""
    hand = {  # (weights, main weights, gradients, Adam) bytes
        "optim": (2 * STAGE, 4 * STAGE / DP, 4 * STAGE, 8 * STAGE / DP),
        "optim_grads": (2 * STAGE, 4 * STAGE / DP, 4 * STAGE / DP, 8 * STAGE / DP),
        "optim_grads_params": (2 * STAGE / DP, 4 * STAGE / DP, 4 * STAGE / DP, 8 * STAGE / DP),
    }
    for strategy, (weights, main, grads, adam) in hand.items():
        got = measured[strategy]
        assert got["parameters"] == STAGE
        for name, want in (("weights", weights), ("main_weights", main), ("gradients", grads), ("adam_states", adam)):
            assert want <= got[name] <= want * 1.001, (strategy, name, got[name], want)


@pytest.mark.parametrize("strategy", ["optim", "optim_grads", "optim_grads_params"])
def test_state_terms_match_megatron_fsdp(measured, strategy):
    """advisor.memory_levers.state_bytes_per_parameter x the stage's parameters against the
    real buffers: within 0.1% (the buckets' padding), well inside the 5% asked."""
    options = TrainingOptions().with_(fsdp_strategy=strategy).memory_options()
    weights, gradients, optimizer = (float(term) * STAGE for term in state_bytes_per_parameter(options, DP))
    got = measured[strategy]
    assert got["weights"] == pytest.approx(weights, rel=1e-3)
    assert got["gradients"] == pytest.approx(gradients, rel=1e-3)
    assert got["main_weights"] + got["adam_states"] == pytest.approx(optimizer, rel=1e-3)


def test_unit_buffers_match_fsdp_buffer_bytes(measured):
    """The unsharded bucket one FSDP unit (a transformer layer) is gathered into and reduced
    from, under optim_grads_params: fsdp_buffer_bytes for one layer gives 2 bytes (BF16) and
    4 bytes (FP32) per layer parameter. Under optim_grads Megatron-FSDP has no units: its
    gradient buckets are Megatron-LM's --ddp-bucket-size default (max(4e7, 1e6 x DP) elements,
    closed at the parameter that crosses it), smaller than a layer at this DP; the advisor counts
    the unit being reduced as a whole layer, which holds while that size is below the largest
    weight (above it, docs/options.md's 'Known underpricing': tests/test_fsdp_optim_grads_queue.py)."""
    options = TrainingOptions().with_(fsdp_strategy="optim_grads_params").memory_options()
    weights, gradients = fsdp_buffer_bytes(options, LAYER, 1)
    got = measured["optim_grads_params"]
    assert got["unit_weights"] == pytest.approx(float(weights), rel=1e-3) and weights == 2 * LAYER
    assert got["unit_gradients"] == pytest.approx(float(gradients), rel=1e-3) and gradients == 4 * LAYER
    # optim_grads: the last bucket is FC2's weight alone (4096 x 14336, past 4e7 by itself), in FP32.
    assert measured["optim_grads"]["unit_gradients"] == 4 * 4096 * 14336
    assert measured["optim"]["unit_weights"] == measured["optim"]["unit_gradients"] == 0


def test_fp8_is_not_buildable_here():
    """megatron-core's FP8 layers are Transformer Engine's; TE builds only against CUDA and is not
    importable on this machine, so the FP8 memory terms are checked by hand (test_levers) only."""
    done = subprocess.run([sys.executable, "-c", "import transformer_engine.pytorch"], capture_output=True, text=True)
    assert done.returncode != 0 and "No module named 'transformer_engine'" in done.stderr


GRAD_CAST_SCRIPT = """
import dataclasses, json
from megatron_hooks.stage_emulation import quiet_megatron; quiet_megatron()
from advisor.models import preset
from megatron_hooks.fsdp_symbolic import FSDP_STRATEGIES, measure_grad_cast
spec = preset("llama3.1-8b")
print(json.dumps({f"{s} {fp32}": dataclasses.asdict(measure_grad_cast(spec, layers=1, strategy=s, dp=4,
                  grad_reduce_in_fp32=fp32)) for s in FSDP_STRATEGIES for fp32 in (True, False)}))
"""


@pytest.fixture(scope="module")
def grad_casts():
    return run_json_script(GRAD_CAST_SCRIPT)


@pytest.mark.parametrize("strategy", ["optim", "optim_grads", "optim_grads_params"])
@pytest.mark.parametrize("fp32", [True, False])
def test_update_main_grads_copies_what_the_time_model_prices(grad_casts, strategy, fp32):
    """megatron-core's own update_main_grads on one Llama 3.1 8B layer (218,112,000 parameters) over
    DP 4: the optimizer's gradients are rank 0's quarter, 54,528,000 elements (a few thousand more:
    the buckets' padding sits in the last rank's shard); with FP32 gradients
    (--accumulate-allreduce-grads-in-fp32) they are views of the FP32 main-gradient buffer, nothing
    copied; with BF16 ones (--grad-reduce-in-bf16) FP32 copies, 2 bytes read and 4 written an element,
    as terms.grad_cast_bytes prices them into the optimizer's step."""
    got = grad_casts[f"{strategy} {fp32}"]
    assert LAYER // DP == 54_528_000 <= got["elements"] <= 54_528_000 * 1.001
    options = TrainingOptions().with_(fsdp_strategy=strategy, grad_reduce_dtype="fp32" if fp32 else "bf16")
    cast = options._grad_cast_bytes  # priced into the step's bytes beside Adam's (tests/test_grad_cast.py)
    assert cast == (0 if fp32 else 2 + 4)
    assert got["copied_bytes"] == cast * got["elements"]
