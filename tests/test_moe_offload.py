"""Optimizer CPU offload on MoE models (--optimizer-cpu-offload, Megatron's HybridDeviceOptimizer):
megatron-core builds one optimizer for the dense parameters (over DP x CP) and one for the experts
(over the expert DP group), each from the same OptimizerConfig, so each offloads the same
--optimizer-offload-fraction of its own shard (core_v0.15.2 optimizer/__init__.py:602-614,
:636-649 and :310-351; core_v0.19.0 :1164-1178, :1203-1217 and :502-543; hybrid_optimizer.py:258-273).
The stage's memory and the step's optimizer time against hand counts, the CLI's estimate and
read-back, the flags through both releases' parse_args + validate_args, and what stays refused."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from advisor.cli import cli
from advisor.moe import stage as st
from advisor.moe.spec import PRESETS
from advisor.options import TrainingOptions

MIXTRAL = PRESETS["mixtral-8x7b"]
GIB = 2**30

# Mixtral 8x7B (h 4096, 32 heads of 128, 8 KV groups, 8 experts of h_moe 14336, vocabulary 32000,
# untied) at TP 1, PP 4, EP 8, ETP 1 on 64 GPUs: DP 16, expert DP 1 x 1 x 16 / (1 x 8) = 2; 8 layers
# a stage. Stage 0's dense parameters per GPU: each layer's attention, QKV 4096 x 6144 and the
# projection 4096 x 4096 (41,943,040), its router 8 x 4096 and two RMSNorms (40,960), and the
# embedding 32000 x 4096 (131,072,000); its experts: 8 / EP 8 = 1 expert a layer of FC1 (gate and
# up) and FC2, 3 x 4096 x 14336 = 176,160,768.
DENSE = 8 * (4096 * 6144 + 4096 * 4096 + 8 * 4096 + 2 * 4096) + 32000 * 4096
EXPERTS = 8 * 3 * 4096 * 14336
LAYOUT = dict(tp=1, cp=1, pp=4, ep=8, etp=1, dp=16)
MIXTRAL_FLAGS = ["--model", "mixtral-8x7b", "--gpus", "64", "--gpu", "h100-80gb", "--tp", "1", "--pp", "4", "--ep",
                 "8", "--etp", "1", "--mbs", "1", "--seq-len", "4096", "--gbs", "256"]
HALF = ["--optimizer-cpu-offload", "--optimizer-offload-fraction", "0.5"]


def _options(**levers) -> st.MoEOptions:
    return st.MoEOptions(training=TrainingOptions().with_(**levers))


def _estimate(*extra: str):
    return CliRunner().invoke(cli, ["estimate", *MIXTRAL_FLAGS, *extra, "--format", "json"])


def test_half_offloaded_states_of_both_groups_leave_the_gpu_by_hand():
    """--optimizer-offload-fraction 0.5: half of each optimizer's shard keeps its FP32 master,
    momentum and variance (12 bytes) on the host. Per dense parameter on the GPU: 2 (BF16 weight)
    + 4 (FP32 main gradient) + 12 / 16 x 0.5 = 0.375 (Adam over DP x CP = 16, half of it left);
    per expert parameter 2 + 4 + 12 / 2 x 0.5 = 3 (over the expert DP group of 2)."""
    assert (DENSE, EXPERTS) == (466_944_000, 1_409_286_144)
    b = st.stage_bytes(MIXTRAL, 4096, _options(optimizer_cpu_offload=True, optimizer_offload_fraction=0.5),
                       **LAYOUT, mbs=1, num_microbatches=16, stage=0)
    assert float(b.optimizer) == pytest.approx(DENSE * 0.375 + EXPERTS * 3.0, rel=1e-12)  # 4,402,962,432 bytes
    assert float(b.weights_gradients_optimizer) == pytest.approx(DENSE * (2 + 4 + 0.375), rel=1e-12)
    assert float(b.expert_states) == pytest.approx(EXPERTS * (2 + 4 + 3.0), rel=1e-12)  # 11.8125 GiB
    assert float(b.expert_states) / GIB == pytest.approx(11.8125, rel=1e-12)
    # weights and gradients stay on the GPU whatever the fraction
    assert (float(b.weights), float(b.gradients)) == pytest.approx(((DENSE + EXPERTS) * 2, (DENSE + EXPERTS) * 4))
    # all of it offloaded (Megatron's default fraction 1.0): no Adam state left on the GPU
    full = st.stage_bytes(MIXTRAL, 4096, _options(optimizer_cpu_offload=True), **LAYOUT, mbs=1, num_microbatches=16,
                          stage=0)
    assert float(full.optimizer) == 0.0


def test_the_estimate_prices_both_groups_host_adam_and_copies_by_hand():
    """The first stage's optimizer step with half offloaded, on an H100 (gpus.json: host link 63 GB/s
    one way, 76.8 GB/s of host memory per GPU). Shards: dense 466,944,000 / 16 = 29,184,000, experts
    1,409,286,144 / 2 = 704,643,072; half of each, 366,913,536 parameters, copies its FP32 gradient
    to the host and its BF16 weight back (4 + 2 bytes over the link) and runs CPU Adam (30 bytes of
    host memory each); the other half runs Adam on the GPU (38 HBM bytes a parameter,
    terms.optimizer_step_bytes) and both FP32 main-gradient buffers are zeroed whole on the GPU
    (4 bytes each of the rank's 1,876,230,144 parameters). Without offload: 38 bytes a shard
    element and the same zeroing, all on the GPU."""
    from advisor.hardware import get_gpu
    from advisor.throughput.calibration import load_calibration
    from advisor.throughput.terms import Rates

    hbm = Rates.of(get_gpu("h100-80gb"), load_calibration()).hbm_bytes_per_s
    shard = DENSE / 16 + EXPERTS / 2
    assert shard == 733_827_072
    host = 0.5 * shard * (4 + 2) / 63e9 + 0.5 * shard * 30 / 76.8e9
    gpu = 38 * 0.5 * shard / hbm
    zeroed = 4 * (DENSE + EXPERTS) / hbm
    result = _estimate(*HALF)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["time_parts"]["optimizer_s"] == pytest.approx(host + gpu + zeroed, rel=1e-9)
    plain = json.loads(_estimate().stdout)
    assert plain["time_parts"]["optimizer_s"] == pytest.approx((38 * shard + 4 * (DENSE + EXPERTS)) / hbm, rel=1e-9)


def test_the_moe_sweep_prices_offload_and_emits_its_flags():
    result = CliRunner().invoke(cli, ["sweep", "--model", "mixtral-8x7b", "--gpus", "64", "--gpu", "h100-80gb",
                                      "--seq-len", "4096", "--gbs", "256", *HALF, "--top", "3", "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert rows
    for row in rows:
        args = row["megatron_args"]
        assert "--optimizer-cpu-offload" in args and "--use-precision-aware-optimizer" in args
        assert args[args.index("--optimizer-offload-fraction") + 1] == "0.5"


COMMANDS = Path(__file__).parent / "data" / "commands"


def test_an_moe_command_with_offload_reads_back_to_the_same_price(tmp_path):
    """Megatron-LM's Mixtral example (TP 1, PP 4, EP 8 on 64 GPUs) with --optimizer-cpu-offload
    --use-precision-aware-optimizer --optimizer-offload-fraction 0.5 added: priced (it was refused
    by name), the same as the preset with the layout and the two flags written out by hand, and
    its states the offloaded ones (stage 0's experts: 11.8125 GiB, above)."""
    script = (COMMANDS / "moe_mixtral_8x7b_megatron_example.sh").read_text()
    command = tmp_path / "mixtral_offload.sh"
    command.write_text(script.replace("--use-distributed-optimizer --sequence-parallel",
                                      "--use-distributed-optimizer --sequence-parallel --optimizer-cpu-offload "
                                      "--use-precision-aware-optimizer --optimizer-offload-fraction 0.5"))
    result = CliRunner().invoke(cli, ["estimate", "--from-command", str(command), "--gpu", "h100-80gb",
                                      "--vocab-size", "32000", "--format", "json"])
    assert result.exit_code == 0, result.output
    read = json.loads(result.stdout)
    by_hand = json.loads(_estimate("--recompute", "none", "--vocab-divisible-by", "128", "--dataloader-mask",
                                   "cached", "--moe-token-dispatcher-type", "alltoall", "--overlap-grad-reduce",
                                   "--overlap-param-gather", "--sequence-parallel", *HALF).stdout)
    for key in ("total_gib", "model_states_gib", "step_time_s", "verdict", "options"):
        assert read[key] == by_hand[key], key
    assert read["stages"][0]["expert_states_gib"] == pytest.approx(11.8125, rel=1e-12)
    assert not any("offload" in flag for flag in read.get("unpriced", []))


def test_offload_on_a_gpu_without_host_rates_is_one_line_and_exit_2():
    """The H800 preset gives no host memory bandwidth (gpus.json), so the host's Adam cannot be
    timed: refused as the dense model refuses it (levers.host_link), not priced at a guess."""
    result = CliRunner().invoke(cli, ["estimate", "--model", "mixtral-8x7b", "--gpus", "64", "--gpu", "h800-80gb",
                                      "--tp", "1", "--pp", "4", "--ep", "8", "--mbs", "1", "--seq-len", "4096",
                                      "--gbs", "256", "--optimizer-cpu-offload"])
    assert result.exit_code == 2 and len(result.output.splitlines()) == 1, result.output
    assert result.output.startswith("Error: h800-80gb: gpus.json gives no host link or host memory bandwidth, "
                                    "so optimizer CPU offload cannot be timed")
    assert "Traceback" not in result.output


@pytest.mark.xdist_group("megatron-validator")
@pytest.mark.parametrize("tag", ["core_v0.15.2", "core_v0.19.0"])
def test_megatron_accepts_moe_rows_with_optimizer_offload(tag):
    """The Mixtral estimate's flags and Qwen3-30B-A3B's top sweep row, each with
    --optimizer-cpu-offload (and the --use-precision-aware-optimizer Megatron requires with it,
    arguments.py core_v0.15.2 :1153-1162, core_v0.19.0 :1802-1811: validate_args has no MoE, EP or
    Megatron-FSDP check for offload) through the release's real parse_args + validate_args:
    accepted, with the offload as priced."""
    from advisor.models import load_model
    from megatron_real import checkout, mock_data_case, validate

    release = checkout(tag)  # skips without it
    estimate = json.loads(_estimate(*HALF).stdout)
    sweep = CliRunner().invoke(cli, ["sweep", "--model", "qwen3-30b-a3b", "--gpus", "16", "--gpu", "h100-80gb",
                                     "--seq-len", "4096", "--gbs", "256", "--optimizer-cpu-offload", "--top", "1",
                                     "--format", "json"])
    assert sweep.exit_code == 0, sweep.output
    rows = [("mixtral-8x7b", estimate, 0.5), *(("qwen3-30b-a3b", row, 1.0) for row in json.loads(sweep.stdout))]
    cases = [mock_data_case(row, tag, load_model(model).vocab_size) for model, row, _ in rows]
    results = validate(release, cases)
    assert [result.get("error") for result in results] == [None] * len(rows)
    for (_, row, fraction), result in zip(rows, results):
        derived = result["derived"]
        assert (derived["optimizer_cpu_offload"], derived["optimizer_offload_fraction"]) == (True, fraction)
        assert derived["use_precision_aware_optimizer"] is True
        assert derived["expert_model_parallel_size"] == row["ep"]
