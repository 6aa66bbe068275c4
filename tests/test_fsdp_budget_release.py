"""Megatron-FSDP's all-gather prefetch and reduce-scatter queue budgets per Megatron-LM release
(``memory_levers.fsdp_communication_unit``), counted by hand.

core_v0.15.2 (megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py:362-386):
``suggested_communication_unit_size = ddp_config.suggested_communication_unit_size or 1_000_000_000``,
so 1e9 unless --suggested-communication-unit-size sets it; the queue holds that many elements, the
prefetch half: (5e8, 1e9). core_v0.19.0 (same file, :420-444): with optim_grads_params twice the
mean FSDP unit's elements over the rank's TransformerLayer modules (``total_param_elements //
total_fsdp_module * 2``, TP-local numel; the embedding and output layer are no FSDP units:
mcore_fsdp_adapter.py:160-164), else the DDP bucket size (max(40M, 1M x DP x CP), training.py:1562),
else 1e9; at least 1e9.

Llama 3.1 70B (h 8192, a 64, k 8, d 128, h_ffn 28672) at TP 1, one layer's elements:
QKV 8192 x (8192 + 2 x 8 x 128) = 83,886,080; projection 8192^2 = 67,108,864; FC1 with its gate
2 x 8192 x 28672 = 469,762,048; FC2 28672 x 8192 = 234,881,024; two RMSNorms 2 x 8192 = 16,384:
u = 855,654,400. core_v0.19.0's unit 2u = 1,711,308,800 > 1e9: prefetch u, queue 2u.
At TP 2: 855,638,016 / 2 + 16,384 = 427,835,392, 2u = 855,670,784 < 1e9: the floor, as in core_v0.15.2.
"""

from __future__ import annotations

import json
import shlex

import pytest
from click.testing import CliRunner

from advisor import equations as eq
from advisor import memory_levers as levers
from advisor.cli import cli
from advisor.memory import MemoryOptions
from advisor.models import PRESETS
from advisor.options import release_defaults
from advisor.options.flags import parse_training_args, release_spelling

GIB = 2**30
SPEC = PRESETS["llama3.1-70b"]
U_TP1 = 855_654_400
U_TP2 = 427_835_392
OGP_19 = MemoryOptions(fsdp_strategy="optim_grads_params")
OGP_15 = MemoryOptions(fsdp_strategy="optim_grads_params", fsdp_budget_from_units=False)
# PP 8: 80 / 8 = 10 layers a stage. Gathered weights (BF16): the unit in use + min(prefetch, 9 u);
# queued gradients (FP32 main gradients): (floor(queue / u) + 2) units (memory_levers.fsdp_queued_units).
GATHERED_19 = 2 * (U_TP1 + U_TP1)  # 3,422,617,600
GATHERED_15 = 2 * (U_TP1 + 500_000_000)  # 2,711,308,800
QUEUED_19 = 4 * (1_711_308_800 // U_TP1 + 2) * U_TP1  # 4 x 4u = 13,690,470,400
QUEUED_15 = 4 * (1_000_000_000 // U_TP1 + 2) * U_TP1  # 4 x 3u = 10,267,852,800


def test_layer_elements_by_hand():
    assert eq.layer_parameters(SPEC, 1) == U_TP1
    assert eq.layer_parameters(SPEC, 2) == U_TP2


def test_release_table():
    """core_v0.15.2 keeps 1e9 whatever the units; core_v0.19.0 (the newest, the default) computes it."""
    assert release_defaults("0.15").fsdp_budget_from_units is False
    assert release_defaults("0.19").fsdp_budget_from_units is True
    assert release_defaults(None).fsdp_budget_from_units is True
    assert MemoryOptions().fsdp_budget_from_units is True


def test_budgets_70b_tp1_optim_grads_params():
    # core_v0.19.0: 10 units of u, mean u, 2u = 1,711,308,800 elements; prefetch 2u // 2 = u
    assert levers.fsdp_communication_unit(OGP_19, 10 * U_TP1, 10) == (U_TP1, 1_711_308_800)
    # core_v0.15.2: the fixed 1e9, prefetch 5e8
    assert levers.fsdp_communication_unit(OGP_15, 10 * U_TP1, 10) == (500_000_000, 1_000_000_000)
    # the mean is an integer division (``total_param_elements // total_fsdp_module``): units of
    # 600,000,000 and 600,000,001 give 1,200,000,000 // 2 * 2, prefetch 600,000,000
    assert levers.fsdp_communication_unit(OGP_19, 1_200_000_001, 2) == (600_000_000, 1_200_000_000)


def test_buffers_70b_tp1_pp8_by_hand():
    """Gathered: 19 -> 2 (u + u) bytes, 15 -> 2 (u + 5e8); queued: 19 -> 4 x 4u, 15 -> 4 x 3u
    (floor(1,711,308,800 / u) = 2 and floor(1e9 / u) = 1 whole units kept, plus two)."""
    assert tuple(float(x) for x in levers.fsdp_buffer_bytes(OGP_19, U_TP1, 10)) == (GATHERED_19, QUEUED_19)
    assert tuple(float(x) for x in levers.fsdp_buffer_bytes(OGP_15, U_TP1, 10)) == (GATHERED_15, QUEUED_15)
    # core_v0.19.0 holds 711,308,800 + 3,422,617,600 = 4,133,926,400 bytes more
    assert GATHERED_19 - GATHERED_15 == 711_308_800 and QUEUED_19 - QUEUED_15 == 3_422_617_600


def test_lines_match_the_buffers():
    """``fsdp_buffer_lines`` (the planner's closed form) with the release's budgets: the smallest
    line at n = 10 is the buffers' sum above, for each release."""
    for options, total in ((OGP_19, GATHERED_19 + QUEUED_19), (OGP_15, GATHERED_15 + QUEUED_15)):
        lines = levers.fsdp_buffer_lines(options, U_TP1)
        assert min(float(slope * 10 + intercept) for slope, intercept in lines) == total


def test_releases_agree_where_the_unit_is_small_or_there_are_no_units():
    # TP 2: 2u = 855,670,784 < 1e9, core_v0.19.0's floor: 5e8 prefetch, 1e9 queue, as core_v0.15.2
    assert levers.fsdp_communication_unit(OGP_19, 10 * U_TP2, 10) == (500_000_000, 1_000_000_000)
    # 10 layers: gathered 2 (u + 5e8) = 1,855,670,784; queued (floor(1e9 / u) = 2, + 2) 4u in FP32
    expected = (2 * (U_TP2 + 500_000_000), 4 * 4 * U_TP2)
    assert tuple(float(x) for x in levers.fsdp_buffer_bytes(OGP_19, U_TP2, 10)) == expected
    assert tuple(float(x) for x in levers.fsdp_buffer_bytes(OGP_15, U_TP2, 10)) == expected
    # optim_grads has no FSDP units: the DDP bucket size (40M at DP x CP <= 40) under the floor, so
    # 1e9 in both; its queue 1e9 + u (fsdp_queued_elements) FP32 elements, nothing gathered
    for from_units in (True, False):
        options = MemoryOptions(fsdp_strategy="optim_grads", fsdp_budget_from_units=from_units)
        assert levers.fsdp_communication_unit(options, 10 * U_TP1, 10) == (500_000_000, 1_000_000_000)
        assert tuple(float(x) for x in levers.fsdp_buffer_bytes(options, U_TP1, 10)) \
            == (0.0, 4 * (1_000_000_000 + U_TP1))


def test_the_release_decides_the_memory_options_not_the_flags():
    """The release is the run's, not a training option: the same flags read back as the same
    options on both releases, and ``memory_options(release)`` takes the release's rule."""
    args = ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params"]
    old, new = parse_training_args(args, release="0.15")[0], parse_training_args(args, release="0.19")[0]
    assert old == new
    assert new.memory_options("0.15").fsdp_budget_from_units is False
    assert new.memory_options("0.19").fsdp_budget_from_units is True
    assert new.memory_options().fsdp_budget_from_units is True  # the newest by default


def _estimate(tp: int, *release: str) -> dict:
    args = ["estimate", "--model", "llama3.1-70b", "--tp", str(tp), "--pp", "8", "--cp", "1", "--mbs", "1",
            "--gpus", "64", "--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params",
            "--format", "json", *release]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_cli_releases_differ_by_the_hand_amount():
    """advisor estimate at TP 1, PP 8 (10 layers on every stage): the default (core_v0.19.0) holds
    711,308,800 bytes more gathered weights and 3,422,617,600 more queued gradients on every stage
    than --megatron-version 0.15 (test_buffers_70b_tp1_pp8_by_hand); nothing else differs."""
    newest, old = _estimate(1), _estimate(1, "--megatron-version", "0.15")
    assert len(newest["stages"]) == 8
    for a, b in zip(newest["stages"], old["stages"]):
        assert a["layers"] == b["layers"] == 10
        assert a["weights_gib"] - b["weights_gib"] == pytest.approx(711_308_800 / GIB)
        assert a["gradients_gib"] - b["gradients_gib"] == pytest.approx(3_422_617_600 / GIB)
        assert (a["optimizer_gib"], a["activations_gib"]) == (b["optimizer_gib"], b["activations_gib"])
        assert a["total_gib"] - b["total_gib"] == pytest.approx(4_133_926_400 / GIB)
    # the same flags, each in its release's words: core_v0.19.0 states the FP32 gradients priced
    assert newest["megatron_args"] == release_spelling(release_defaults(None), old["megatron_args"])
    assert newest["megatron_args"][-2:] == ["--megatron-fsdp-main-grads-dtype", "fp32"]


def test_from_command_prices_each_release():
    """--from-command of each release's estimate's own megatron_args (core_v0.19.0's with
    --megatron-fsdp-main-grads-dtype fp32, which it needs to keep FP32 main gradients:
    ``release_spelling``), read with the default and with --megatron-version 0.15: the same hand
    amounts apart on every stage."""
    args = ["estimate", "--from-command", "-", "--gpus", "64", "--vocab-size", "128256", "--format", "json"]
    newest, old = (CliRunner().invoke(cli, args + list(given), input=shlex.join(_estimate(1, *given)["megatron_args"]))
                   for given in ((), ("--megatron-version", "0.15")))
    assert newest.exit_code == old.exit_code == 0, newest.output + old.output
    for a, b in zip(json.loads(newest.output)["stages"], json.loads(old.output)["stages"], strict=True):
        assert a["weights_gib"] - b["weights_gib"] == pytest.approx(711_308_800 / GIB)
        assert a["gradients_gib"] - b["gradients_gib"] == pytest.approx(3_422_617_600 / GIB)


def test_cli_releases_agree_at_tp2():
    """TP 2: 2u under 1e9, both releases' budgets are (5e8, 1e9): every stage the same."""
    assert _estimate(2)["stages"] == _estimate(2, "--megatron-version", "0.15")["stages"]


# --- optim_grads beyond DP x CP = 1,000: the DDP bucket size grows past the 1e9 floor ------------

OG_19 = MemoryOptions(fsdp_strategy="optim_grads")
U_8B = 218_112_000
"""Llama 3.1 8B (h 4096, a 32, k 8, d 128, h_ffn 14336) at TP 1, one layer: QKV 4096 x (4096 + 2 x 8
x 128) = 25,165,824; projection 4096^2 = 16,777,216; FC1 with its gate 2 x 14336 x 4096 =
117,440,512; FC2 14336 x 4096 = 58,720,256; two RMSNorms 8,192."""


@pytest.mark.parametrize("dp_cp, prefetch, queue", [
    (1, 500_000_000, 1_000_000_000),  # bucket max(40M, 1M) = 40M, under the floor
    (1000, 500_000_000, 1_000_000_000),  # bucket 1M x 1000 = 1e9: the floor exactly
    (1001, 500_500_000, 1_001_000_000),  # bucket 1,001,000,000: past it
    (2048, 1_024_000_000, 2_048_000_000),  # e.g. DP 256 x CP 8, or DP 2048
])
def test_optim_grads_budget_grows_with_dp_cp_on_0_19(dp_cp, prefetch, queue):
    """core_v0.19.0: optim_grads takes ``self.bucket_size`` (megatron_fsdp.py:433-434), which
    training.py:1850-1855 sets to ``resolve_ddp_bucket_size``: max(40,000,000, 1,000,000 x DP x CP)
    with --overlap-grad-reduce (:1561-1562); at least 1e9 (:438-441), the prefetch half (:444)."""
    assert levers.ddp_bucket_size(dp_cp) == max(40_000_000, 1_000_000 * dp_cp)
    assert levers.fsdp_communication_unit(OG_19, 32 * U_8B, 32, dp_cp) == (prefetch, queue)


def test_the_bucket_rule_is_0_19_s_with_overlap_and_not_optim_grads_params():
    """Without --overlap-grad-reduce the bucket size is None (training.py:1565-1566) and the budget
    1e9; core_v0.15.2 keeps 1e9 whatever DP x CP (``suggested_communication_unit_size or 1e9``,
    megatron_fsdp.py:362-364); optim_grads_params is sized by its units alone: 70B at TP 1, 2u."""
    floor = (500_000_000, 1_000_000_000)
    no_overlap = MemoryOptions(fsdp_strategy="optim_grads", overlap_grad_reduce=False)
    assert levers.fsdp_communication_unit(no_overlap, 32 * U_8B, 32, 2048) == floor
    old = MemoryOptions(fsdp_strategy="optim_grads", fsdp_budget_from_units=False)
    assert levers.fsdp_communication_unit(old, 32 * U_8B, 32, 2048) == floor
    assert levers.fsdp_communication_unit(OGP_19, 10 * U_TP1, 10, 2048) == (U_TP1, 2 * U_TP1)


def _8b_gradients_gib(dp: int, *extra: str) -> float:
    result = CliRunner().invoke(cli, ["estimate", "--model", "llama3.1-8b", "--tp", "1", "--pp", "1", "--dp", str(dp),
                                      "--mbs", "1", "--gbs", str(2 * dp), "--gpu", "h100-80gb", "--use-megatron-fsdp",
                                      "--data-parallel-sharding-strategy", "optim_grads", "--format", "json", *extra])
    assert result.exit_code == 0, result.output
    [stage] = json.loads(result.output)["stages"]
    return stage["gradients_gib"]


def test_llama_8b_at_dp_2048_queues_the_bucket_by_hand():
    """advisor estimate, Llama 3.1 8B on 2048 H100s (TP 1, PP 1, DP 2048), optim_grads, FP32 main
    gradients: the shard 4 x 8,030,261,248 / 2048 = 15,684,104 bytes, and the unsharded buckets at
    the queue's peak. The one stage's buckets are cut over the embedding (first in named order,
    525,336,576), the layers, the final norm (4,096) and the output layer (525,336,576)
    (tests/test_fsdp_optim_grads_ends.py, PP1_2048, by hand): the output layer's bucket
    (1,792,065,536), the next (2,063,675,392) and the next (2,122,399,744) at once, 5,978,140,672
    elements (the queue of 2,048,000,000 keeps the first while the third opens). The layers alone
    held 4,857,184,256 (tests/test_fsdp_optim_grads_queue.py).

    At DP 1000 (buckets >= 1e9, queue 1e9): cut in named order, bucket 0 = the embedding + layers
    0-1 + layer 2 to QKV (525,336,576 + 2 u + 41,947,136 = 1,003,507,712), bucket 1 = layer 2's MLP
    norm, FC1, FC2 + layers 3-6 (176,164,864 + 4 u = 1,048,612,864), bucket 2 = layers 7-10 + layer
    11 to FC1 (4 u + 159,391,744 = 1,031,839,744), then three of FC2 + 4 u + the next layer to FC1 =
    5 u = 1,090,560,000 (to layer 31's FC1), last FC2_31 + final norm + output = 584,060,928.
    Backward: the output layer opens the last bucket, FC2_31 completes it (queued), FC1_31 opens
    the one before (1,674,620,928), FC2_26 completes it (584,060,928 <= 1e9: queued), FC1_26 opens
    the next: 584,060,928 + 2 x 1,090,560,000 = 2,765,180,928, the peak (FC2_21's completion pops
    both queued, and every later moment holds two buckets at most). 4 x 8,030,261,248 / 1000 =
    32,121,044.992 + 4 x 2,765,180,928 (the layers alone: 2,676,064,256)."""
    assert eq.layer_parameters(PRESETS["llama3.1-8b"], 1) == U_8B
    assert _8b_gradients_gib(2048) * GIB == pytest.approx(15_684_104 + 4 * 5_978_140_672, rel=1e-12)
    assert _8b_gradients_gib(1000) * GIB == pytest.approx(4 * 8_030_261_248 / 1000 + 4 * 2_765_180_928, rel=1e-12)
    # core 0.15's queue of 1e9 (buckets as at DP 2048): the output's bucket (1,792,065,536) is popped
    # when the next completes (at FC2_16), before FC1_16 opens the third: 2,063,675,392 + 2,122,399,744
    assert _8b_gradients_gib(2048, "--megatron-version", "0.15") * GIB == pytest.approx(
        15_684_104 + 4 * 4_186_075_136, rel=1e-12)
    # no --overlap-grad-reduce: bucket size None, the whole chunk one bucket (32 u, the embedding, the
    # final norm, the output layer: all 8,030,261,248 parameters) unsharded at once
    assert _8b_gradients_gib(2048, "--no-overlap-grad-reduce") * GIB == pytest.approx(
        15_684_104 + 4 * 8_030_261_248, rel=1e-12)
