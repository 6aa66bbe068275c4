"""Megatron-FSDP's optim_grads gradient buckets and reduce-scatter queue, by hand from the real
source, against ``memory_levers.fsdp_buffer_bytes`` (which prices the queued gradients as
queue + u: ``fsdp_queued_elements``).

How the buckets are made (core_v0.15.2 megatron_fsdp/param_and_grad_buffer.py:1300-1384,
core_v0.19.0 :1786-1866, ``_get_parameter_groups``): under optim_grads the adapter passes no FSDP
unit modules (mcore_fsdp_adapter.py:93-96 / :161-164), so every parameter has fsdp_unit_id None and
all BF16 weights of the chunk form ONE parameter group in ``named_parameters`` order (Step 1); Step 2
cuts it into buckets, each closed at the parameter that brings it to >= ``suggested_bucket_size``
= ddp_config.bucket_size = max(40M, 1M x DP x CP) with --overlap-grad-reduce (training.py:984-990 /
:1552-1567). Buckets are not per layer: with B > u a bucket spans several layers.

What is held (param_and_grad_buffer.py, core_v0.19.0): a bucket's whole unsharded storage is
allocated when its first gradient arrives (``main_grad_getter`` -> ``fetch_bucket`` ->
``allocate_bucket_storage``, :3086-3104, :1291-1411); when its last one arrives,
``reduce_gradients`` (:3872-3914) first pops the oldest queued buckets while the queue holds more
than Q elements (``wait_for_previous_grad_reduce``, :3916-3946) and frees them, then appends it
(:4246). So at a peak: the queue trimmed to <= Q, the bucket just queued, and the one being filled,
each a whole BUCKET (about B), not a layer.

Llama 3.1 8B middle stage of 32 layers at TP 1 (u = 218,112,000; per layer, in named order:
input norm 4,096, proj 16,777,216, QKV 25,165,824, MLP norm 4,096, FC1 117,440,512,
FC2 58,720,256), DP 2048: B = 2,048,000,000.
- bucket 0: layers 0-8 (9 u = 1,963,008,000) + layer 9's norm, proj, QKV, norm (41,951,232) =
  2,004,959,232 < B, + FC1_9 -> 2,122,399,744, closed.
- bucket 1: FC2_9 58,720,256 + layers 10-18 (1,963,008,000) + norm_19 + proj_19 = 2,038,509,568 < B,
  + QKV_19 -> 2,063,675,392, closed.
- bucket 2: MLP norm_19 + FC1_19 + FC2_19 (176,164,864) + layers 20-27 (1,744,896,000) + layer 28's
  norm, proj, QKV (41,947,136) = 1,963,008,000 < B, + norm + FC1_28 -> 2,080,452,608, closed.
- bucket 3: FC2_28 + layers 29-31 = 58,720,256 + 654,336,000 = 713,056,256.
Backward fills bucket 3, then 2; bucket 2 completes at MLP norm_19: the queue holds bucket 3
(713,056,256 <= Q on both releases: 1e9 on core_v0.15.2, 2,048,000,000 on core_v0.19.0), kept;
bucket 2 is appended; proj_19's gradient then allocates bucket 1:
713,056,256 + 2,080,452,608 + 2,063,675,392 = 4,857,184,256 elements unsharded at once (the real
buckets are padded a little more: 4,991,221,760 from megatron-core's own ``_get_parameter_groups``
on fake tensors). The advisor prices Q + u: 1,218,112,000 (core_v0.15.2) or 2,266,112,000
(core_v0.19.0). Known underpricing, left open: a fix must replay the bucket cut over the stage's
parameter order (the simple per-bucket forms miss by 10-25% either way at DP 128-2048)."""

import pytest

from advisor import memory_levers as levers
from advisor.memory import MemoryOptions

U_8B = 218_112_000
B_2048 = 2_048_000_000
BUCKETS = (2_122_399_744, 2_063_675_392, 2_080_452_608, 713_056_256)  # named order, by hand above
PEAK = BUCKETS[3] + BUCKETS[2] + BUCKETS[1]


def test_hand_buckets_add_up_to_the_stage():
    assert sum(BUCKETS) == 32 * U_8B == 6_979_584_000
    assert all(b >= B_2048 for b in BUCKETS[:3]) and PEAK == 4_857_184_256


@pytest.mark.xfail(strict=True, reason="optim_grads queue priced as Q + u; real buckets are ~B each "
                                       "(max(40M, 1M x DP x CP)): underpriced from DP x CP ~ 128 (see module doc)")
@pytest.mark.parametrize("from_units", [False, True], ids=["core_v0.15.2", "core_v0.19.0"])
def test_optim_grads_queue_at_dp_2048_covers_three_buckets(from_units):
    options = MemoryOptions(fsdp_strategy="optim_grads", fsdp_budget_from_units=from_units)
    _, gradients = levers.fsdp_buffer_bytes(options, U_8B, 32, 2048)
    assert float(gradients) >= 4 * PEAK  # FP32 main gradients, 4 bytes an element
