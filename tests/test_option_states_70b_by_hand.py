"""The model states of one stage under each memory lever, counted by hand from megatron-core's
source, for one concrete layout: Llama 3.1 70B, sequence 8192, TP 4, PP 4, DP 8, MBS 1, global
batch 512, stage 0 (the embedding and 20 layers).

Parameters on one GPU of stage 0: per layer QKV h (h + 2 k d) = 8192 x 10240, the projection
8192^2, FC1 with its gate 2 x 8192 x 28672 and FC2 8192 x 28672, all split over TP 4:
855,638,016 / 4 = 213,909,504 GEMM weights, plus two RMSNorm weights of 8192 that TP does not
split: 213,925,888 a layer, 4,278,517,760 for 20; the embedding 128,256 / 4 x 8192 = 262,668,288
(the advisor's --make-vocab-size-divisible-by 1: 128,256 divides by TP 4). N = 4,541,186,048.

megatron-core's DDP (param_and_grad_buffer.py, both releases) keeps the BF16 weights in its
parameter buffer (2 N) and the main gradients in its gradient buffer, FP32 with
--accumulate-allreduce-grads-in-fp32 (4 N) or BF16 with --grad-reduce-in-bf16 (2 N); the
buffers' padding (each parameter to 64 elements, each bucket end to lcm(DP, 128)) adds nothing
here, every size being a multiple of 128 already. The distributed optimizer keeps an FP32 master
shard (distrib_optimizer.py, shard_main_param) and Adam's two FP32 moments: 12 N / DP.
--overlap-param-gather gathers into the parameter buffer itself: no buffer of its own.
"""

from __future__ import annotations

import json

import pytest

GIB = 2**30
N = 4_541_186_048
LAYER = 213_925_888  # one layer's parameters on one GPU (above)
# Megatron-FSDP optim_grads_params's queued un-sharded gradient buckets, one per layer
# (memory_levers.fsdp_queued_units): the whole layers
# of at most 10^9 elements the queue keeps, floor(10^9 / LAYER) = 4 (5 would be 1,069,629,440), the
# layer just reduced and the one being produced: 6 layers, 1,283,555,328 elements
QUEUED = (4 + 2) * LAYER
# optim_grads's: 5 layers and the embedding (128,256 x 8,192 / 4), whose gradient comes last
# (tests/test_fsdp_main_grads.py; 5 layers and FC2 over the layers alone)
OPTIM_GRADS_PEAK = 5 * LAYER + 262_668_288
GEMM = 213_909_504  # its GEMM weights (what Transformer Engine runs in FP8)
LAYOUT = ["--model", "llama3.1-70b", "--tp", "4", "--pp", "4", "--dp", "8", "--mbs", "1", "--gbs", "512",
          "--gpu", "h100-80gb", "--format", "json"]


@pytest.mark.parametrize("options, weights, gradients, optimizer", [
    ((), 2 * N, 4 * N, 12 * N / 8),
    (("--grad-reduce-in-bf16",), 2 * N, 2 * N, 12 * N / 8),
    # HybridDeviceOptimizer (cpu_offloading/hybrid_optimizer.py) moves half of the shard's
    # parameters, their FP32 copies and Adam states, to the host; the GPU half keeps FP32 copies
    # (param_update_in_fp32=True) and FP32 Adam states: 12 N / 8 / 2
    (("--optimizer-cpu-offload", "--optimizer-offload-fraction", "0.5"), 2 * N, 4 * N, 12 * N / 8 / 2),
    # Megatron-FSDP optim_grads (core_v0.15.2: FP32 gradient buffer with grad_reduce_in_fp32):
    # the gradient shard 4 N / 8, and the unsharded FP32 buckets at the reduce-scatter queue's peak,
    # 5 layers + FC2 = 1,128,349,696 elements (buckets of >= 4e7 cut two a layer, by hand in
    # tests/test_fsdp_main_grads.py; memory_levers.fsdp_optim_grads_peak)
    (("--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads", "--megatron-version", "0.15"),
     2 * N, 4 * N / 8 + 4 * OPTIM_GRADS_PEAK, 12 * N / 8),
    # optim_grads_params also shards the weights (its queue: QUEUED above), and gathers the unit in
    # use plus the next units
    # up to the all-gather prefetch of 5 x 10^8 elements, in BF16
    (("--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params", "--megatron-version", "0.15"),
     2 * N / 8 + 2 * (LAYER + 500_000_000), 4 * N / 8 + 4 * QUEUED, 12 * N / 8),
    # core_v0.19.0's Megatron-FSDP dtypes (tests/test_fsdp_dtypes.py): BF16 main gradients reduced in FP32
    # (--megatron-fsdp-grad-comm-dtype fp32): the shard 2 N / 8, the queued un-sharded buckets in FP32
    # (main_grad_getter's fetch_bucket(dtype=grad_comm_dtype))
    (("--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params", "--megatron-version", "0.19",
      "--grad-dtype", "bf16", "--megatron-fsdp-grad-comm-dtype", "fp32"),
     2 * N / 8 + 2 * (LAYER + 500_000_000), 2 * N / 8 + 4 * QUEUED, 12 * N / 8),
    # BF16 main weights (--megatron-fsdp-main-params-dtype bf16): 2 bytes and FusedAdam's two FP32
    # moments, 10 N / 8; none ('auto': Adam steps the BF16 weights' shards), the moments alone, 8 N / 8
    (("--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim", "--megatron-version", "0.19",
      "--megatron-fsdp-main-params-dtype", "bf16"), 2 * N, 4 * N, 10 * N / 8),
    (("--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads", "--megatron-version", "0.19",
      "--megatron-fsdp-main-params-dtype", "auto"), 2 * N, 4 * N / 8 + 4 * OPTIM_GRADS_PEAK, 8 * N / 8),
    # FP8 without --fp8-param-gather: each TE linear caches its weight's FP8 copy and transpose
    # (megatron-core passes is_first_microbatch), 1 + 1 bytes a GEMM weight beside the BF16 one,
    # and current scaling keeps no amax history
    (("--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"), 2 * N + 2 * 20 * GEMM, 4 * N, 12 * N / 8),
    # with --fp8-param-gather the GEMM weights are FP8 parameters: the uint8 parameter buffer (1)
    # and the parameter's own transpose (1) in place of the BF16 weight (2)
    (("--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--fp8-param-gather"), 2 * N, 4 * N, 12 * N / 8),
])
def test_stage0_states_by_hand(advisor, options, weights, gradients, optimizer):
    [stage, *_] = json.loads(advisor("estimate", *LAYOUT, *options).stdout)["stages"]
    assert stage["parameters"] == N
    assert stage["weights_gib"] * GIB == pytest.approx(weights, rel=1e-12)
    assert stage["gradients_gib"] * GIB == pytest.approx(gradients, rel=1e-12)
    assert stage["optimizer_gib"] * GIB == pytest.approx(optimizer, rel=1e-12)
