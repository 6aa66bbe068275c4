"""Megatron-FSDP on MoE models (advisor.moe.fsdp): the stage's states sharded over DP x CP and the
expert DP group, its unsharded buffers, its per-microbatch collectives, each against a hand count;
the CLI's estimate, sweep and read-back with --use-megatron-fsdp, and what stays refused."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from advisor import memory_levers as levers
from advisor.cli import cli
from advisor.memory import MemoryOptions
from advisor.moe import fsdp
from advisor.moe import stage as st
from advisor.moe import time as moe_time
from advisor.moe.spec import PRESETS
from advisor.options import TrainingOptions
from advisor.throughput.terms import Rates

MIXTRAL = PRESETS["mixtral-8x7b"]

# Mixtral 8x7B per layer (h 4096, 32 heads of 128, 8 KV groups, 8 experts of h_moe 14336):
ATTENTION = 4096 * (4096 + 2 * 1024) + 4096 * 4096  # QKV 4096 x 6144 and the projection: 41,943,040
ROUTER_AND_NORMS = 8 * 4096 + 2 * 4096  # the router's E x h and the two RMSNorms, whole on every rank
EXPERT = 3 * 4096 * 14336  # FC1 (gate and up) and FC2: 176,160,768


def _options(strategy: str) -> st.MoEOptions:
    return st.MoEOptions(training=TrainingOptions().with_(fsdp_strategy=strategy))


def test_mixtral_middle_stage_states_and_buffers_by_hand():
    """Mixtral at TP 2, PP 4, EP 4, ETP 1, DP 8 (64 GPUs; expert DP 2 x 8 / 4 = 4), stage 1 (8 MoE
    layers), optim_grads_params. Per GPU and layer: the dense part 41,943,040 / 2 + 40,960 =
    21,012,480, the experts 8 / 4 x 176,160,768 = 352,321,536; the unit 373,334,016, the stage 8 of
    them. Weights (2 bytes), main gradients (4) and Adam (12) all sharded: the dense parts over
    DP x CP = 8, the experts over 4. core_v0.19.0's budget: twice the mean unit, 746,668,032, is
    under 1e9, so 1e9: prefetch 5e8, queue 1e9. Gathered: the unit in use and 5e8 prefetched,
    873,334,016 BF16 elements; queued: floor(1e9 / 373,334,016) + 2 = 4 units, 1,493,336,064
    elements of 4 bytes (FP32 main gradients, no --megatron-fsdp-grad-comm-dtype)."""
    dense, experts = 8 * (ATTENTION / 2 + ROUTER_AND_NORMS), 8 * (8 / 4 * EXPERT)
    assert (dense, experts) == (168_099_840, 2_818_572_288)
    gathered, queued = 2 * (373_334_016 + 500_000_000), 4 * 4 * 373_334_016
    b = st.stage_bytes(MIXTRAL, 4096, _options("optim_grads_params"), tp=2, cp=1, pp=4, ep=4, etp=1, dp=8, mbs=1,
                       num_microbatches=16, stage=1)
    assert float(b.weights) == pytest.approx(dense * 2 / 8 + experts * 2 / 4 + gathered, rel=1e-12)
    assert float(b.gradients) == pytest.approx(dense * 4 / 8 + experts * 4 / 4 + queued, rel=1e-12)
    assert float(b.optimizer) == pytest.approx(dense * 12 / 8 + experts * 12 / 4, rel=1e-12)
    # the buffers split between the columns as the elements held: 168,099,840 of 2,986,672,128 dense
    share = dense / (dense + experts)
    assert float(b.weights_gradients_optimizer) == pytest.approx(dense * 18 / 8 + share * (gathered + queued))
    assert float(b.expert_states) == pytest.approx(experts * 18 / 4 + (1 - share) * (gathered + queued))
    assert float(b.model_states) == pytest.approx(float(b.weights + b.gradients + b.optimizer), rel=1e-12)


def test_optim_shards_only_adam_and_holds_no_buffer():
    """optim (ZeRO-1): Adam's 12 bytes over the two groups, weights and gradients whole, no unsharded
    buffer (SHARDING: optimizer states only); the same layout and stage as above."""
    dense, experts = 168_099_840, 2_818_572_288
    b = st.stage_bytes(MIXTRAL, 4096, _options("optim"), tp=2, cp=1, pp=4, ep=4, etp=1, dp=8, mbs=1,
                       num_microbatches=16, stage=1)
    assert (float(b.weights), float(b.gradients)) == pytest.approx(((dense + experts) * 2, (dense + experts) * 4))
    assert float(b.optimizer) == pytest.approx(dense * 12 / 8 + experts * 12 / 4)


def test_core_v0_19_budget_follows_a_unit_over_half_a_billion():
    """Mixtral at TP 1, EP 1, ETP 1: a layer's unit is 41,943,040 + 40,960 + 8 x 176,160,768 =
    1,451,270,144 elements, so core_v0.19.0's communication unit is twice it (megatron_fsdp.py:
    ``total_param_elements // total_fsdp_module * 2``, above the 1e9 floor): prefetch one more unit,
    queue floor(2u / u) + 2 = 4 units. On 8 layers: 2u gathered, 4u queued."""
    u = ATTENTION + ROUTER_AND_NORMS + 8 * EXPERT
    assert u == 1_451_270_144
    # (the MoE layer's dense part, its experts, a dense layer): Mixtral has no dense layer, and 0 of them
    layers = (ATTENTION + ROUTER_AND_NORMS, 8 * EXPERT, 0)
    gathered, queued, share = fsdp.buffer_bytes(TrainingOptions().with_(fsdp_strategy="optim_grads_params")
                                                .memory_options(), layers, 0, 8)
    assert (float(gathered), float(queued)) == (2 * 2 * u, 4 * 4 * u)
    assert float(share) == pytest.approx((ATTENTION + ROUTER_AND_NORMS) / u)
    # no units: the bucket size's floor (memory_levers.fsdp_communication_unit, the dense model's rule too)
    assert levers.fsdp_communication_unit(MemoryOptions(fsdp_strategy="optim_grads"), 8 * u, 8) == (5e8, 1e9)


def test_optim_grads_queue_grows_with_the_dense_dp_cp():
    """The same 8 Mixtral layers (u = 1,451,270,144 each) under optim_grads on core_v0.19.0: the
    queue is the DDP bucket size, max(1e9, 1M x DP x CP) of the dense DP x CP group
    (training.py:1562 takes ``pg_collection.dp_cp``), and keeps min(8u, queue + u) FP32 elements:
    at DP x CP 8, 1e9 + u = 2,451,270,144; at 2048, 2,048,000,000 + u = 3,499,270,144. Nothing
    gathered (the weights are not sharded)."""
    u = ATTENTION + ROUTER_AND_NORMS + 8 * EXPERT
    options = TrainingOptions().with_(fsdp_strategy="optim_grads").memory_options()
    for dp_cp, queue in ((8, 1_000_000_000), (2048, 2_048_000_000)):
        gathered, held, _ = fsdp.buffer_bytes(options, (ATTENTION + ROUTER_AND_NORMS, 8 * EXPERT, 0), 0, 8, dp_cp)
        assert (float(gathered), float(held)) == (0.0, 4 * (queue + u))


def _rates() -> Rates:
    return Rates(gemm_flops_per_s=1e15, gemm_latency_s=0.0, attention_flops_per_s=1e15, attention_latency_s=0.0,
                 hbm_bytes_per_s=1e12, nvlink_bytes_per_s=400e9, network_bytes_per_s=50e9,
                 collective_latency_s=0.0, gpus_per_node=8, host_mask_s_per_element=0.0)


def test_expert_and_dense_collectives_per_microbatch_by_hand():
    """optim_grads_params at TP 2, DP 8, EP 4, ETP 1 (expert DP 4), 16 microbatches, nothing to hide
    behind (a forward of 0 s): per microbatch each group all-gathers its parameters before the
    forward and again before the backward (2 bytes), and reduce-scatters their FP32 gradients after
    it (4 bytes), a ring moving (n - 1) / n of them. The 16 ranks span two nodes: the dense group
    (ranks 2 apart) has 4 GPUs a node, 4 NICs of 50 GB/s, 200 GB/s; the expert group (ranks 4
    apart) 2 a node, 100 GB/s. No per-step reduce or gather is left (all per microbatch)."""
    dense, experts = 168_099_840.0, 2_818_572_288.0
    columns = {k: np.array([float(v)]) for k, v in dict(tp=2, cp=1, dp=8, ep=4, etp=1).items()}
    training = TrainingOptions().with_(fsdp_strategy="optim_grads_params")
    exposed, _ = moe_time._data_parallel(columns, training, (dense, experts), 0.0, _rates(), m=16.0)
    dense_once = 7 / 8 * dense / 200e9  # seconds per byte of each dense element
    expert_once = 3 / 4 * experts / 100e9
    per_microbatch = (2 + 2 + 4) * (dense_once + expert_once)
    assert float(exposed[0]) == pytest.approx(16 * per_microbatch, rel=1e-12)


def _estimate(*extra):
    return CliRunner().invoke(cli, ["estimate", "--model", "mixtral-8x7b", "--gpus", "64", "--gpu", "h100-80gb",
                                    "--tp", "2", "--pp", "4", "--ep", "4", "--etp", "1", "--mbs", "1", "--seq-len",
                                    "4096", "--gbs", "256", *extra])


def test_the_estimate_prices_megatron_fsdp_and_writes_its_flags():
    result = _estimate("--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads", "--format", "json")
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout)
    args = row["megatron_args"]
    assert args[args.index("--data-parallel-sharding-strategy") + 1] == "optim_grads"
    plain = json.loads(_estimate("--format", "json").stdout)
    # ZeRO-2 shards the main gradients: stage 1's states shrink by more than its queue adds
    assert row["stages"][1]["gradients_gib"] < plain["stages"][1]["gradients_gib"]
    assert row["step_time_s"] > 0


@pytest.mark.parametrize("extra, message", [
    (["--use-megatron-fsdp", "--megatron-version", "0.15"],
     "Megatron-LM core 0.15's Megatron-FSDP cannot wrap an MoE model's expert-parallel parameters"),
    (["--use-megatron-fsdp", "--overlap-moe-expert-parallel-comm"],
     "--overlap-moe-expert-parallel-comm with --use-megatron-fsdp is not priced"),
], ids=["core-0.15", "ep-overlap"])
def test_what_stays_refused_is_one_line_and_exit_2(extra, message):
    result = _estimate(*extra)
    assert result.exit_code == 2 and len(result.output.splitlines()) == 1, result.output
    assert result.output.startswith("Error: mixtral-8x7b is a mixture of experts;") and message in result.output


def test_the_moe_sweep_takes_megatron_fsdp_as_the_dense_sweep_does():
    result = CliRunner().invoke(cli, ["sweep", "--model", "mixtral-8x7b", "--gpus", "64", "--gpu", "h100-80gb",
                                      "--seq-len", "4096", "--gbs", "256", "--use-megatron-fsdp", "--top", "3",
                                      "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert rows and all("--use-megatron-fsdp" in row["megatron_args"] for row in rows)


@pytest.mark.xdist_group("megatron-validator")
@pytest.mark.parametrize("tag", ["core_v0.15.2", "core_v0.19.0"])
def test_megatron_accepts_moe_rows_with_megatron_fsdp(tag):
    """MoE rows priced with Megatron-FSDP (Mixtral and DeepSeek-V3, each strategy that shards the
    gradients) through the release's real parse_args + validate_args: accepted, with the sharding
    priced. core_v0.15.2's validate_args accepts them too (arguments.py:699-720 has no MoE check);
    its failure is at model wrapping (advisor.moe.fsdp), which the advisor refuses by release."""
    from advisor.models import load_model
    from megatron_real import checkout, mock_data_case, validate

    release = checkout(tag)  # skips without it
    rows = []
    for model, gpus, strategy in (("mixtral-8x7b", 64, "optim_grads_params"), ("deepseek-v3", 1024, "optim_grads")):
        result = CliRunner().invoke(cli, ["sweep", "--model", model, "--gpus", str(gpus), "--gpu", "h100-80gb",
                                          "--seq-len", "4096", "--gbs", "1024", "--use-megatron-fsdp",
                                          "--data-parallel-sharding-strategy", strategy, "--top", "2",
                                          "--format", "json"])
        assert result.exit_code == 0, result.output
        rows += [(model, strategy, row) for row in json.loads(result.stdout)]
    cases = [mock_data_case(row, tag, load_model(model).vocab_size) for model, _, row in rows]
    results = validate(release, cases)
    assert [result.get("error") for result in results] == [None] * len(rows)
    for (_, strategy, row), result in zip(rows, results):
        derived = result["derived"]
        assert (derived["use_megatron_fsdp"], derived["data_parallel_sharding_strategy"]) == (True, strategy)
        assert derived["expert_model_parallel_size"] == row["ep"]
