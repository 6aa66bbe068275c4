"""--tp-comm-overlap in a mixture-of-experts model (advisor.moe.userbuffers): Transformer Engine's
userbuffers beside attention's, a dense MLP's and the shared experts' GEMMs, priced by the dense
model's term (advisor.throughput.userbuffers), against hand-derived numbers.

Hand rates (H100 SXM, advisor/calibration.json, as tests/test_tp_comm_overlap.py): GEMMs at
700.32 TFLOP/s plus 13.8 us a call; one TP ring collective of the [tokens, h] BF16 activation at
TP t: (t - 1)/t x 2 tokens h bytes over 448.29e9 B/s plus (t - 1) x 20 us. Ring exchange hides an
all-gather behind (t - 1)/t of its GEMM; the pipeline method leaves 1/4 of a reduce-scatter and
all of it past 3/4 of its GEMM; bulk hides behind the whole GEMM; pipeline and bulk GEMMs run on
132 - 16 of the H100's 132 SMs (margin 132/116)."""

import json
import shlex
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from advisor.cli import cli
from advisor.hardware import get_gpu
from advisor.moe.spec import PRESETS
from advisor.moe.time import layer_times
from advisor.moe.userbuffers import TpOverlap
from advisor.releases import NEWEST
from advisor.throughput import load_calibration
from advisor.throughput.terms import Rates
from advisor.throughput.userbuffers import tp_overlap_time

H100 = get_gpu("h100-80gb")
MARGIN = 132 / 116
MIXTRAL = PRESETS["mixtral-8x7b"]
# Mixtral 8x7B with 8192-wide shared experts: a grouped-query MoE with shared experts, as a command
# with --moe-shared-expert-intermediate-size and no --multi-latent-attention describes one
SHARED = replace(MIXTRAL, name="mixtral-shared", shared_expert_size=8192)


def hand_rates():
    cal = load_calibration()
    flops = cal.compute_factor * cal.kernels_for("hopper").gemm * 989e12
    return flops, cal.gemm_latency_s, cal.network_efficiency * 450e9, cal.collective_latency_s


def layers(spec, tp, cp=1, mbs=1, **extra):
    """(plain, overlapped) ``LayerTimes`` of one 4096-token sequence."""
    rates = Rates.of(H100, load_calibration())
    common = dict(tp=tp, cp=cp, ep=8, etp=1, mbs=mbs, rates=rates, **extra)
    return layer_times(spec, 4096, **common), layer_times(spec, 4096, **common, tp_overlap=TpOverlap())


def test_mixtral_attention_at_tp_2_hides_its_gathers():
    """Mixtral 8x7B (h 4096, a 32, k 8, d 128), TP 2, 4096 tokens. GEMMs: QKV 2 x 4096 x 4096 x 3072
    -> 0.16099 ms, projection 2 x 4096 x 2048 x 4096 -> 0.11193 ms. One collective: 1/2 x 2 x 4096
    x 4096 B / 448.29 GB/s + 20 us = 0.057425 ms. Forward: QKV's gather by ring exchange, hidden
    (1/2 x 0.16099 > 0.057425); the projection's pipelined scatter, its last quarter 0.014356 ms
    (0.057425 - 3/4 x 0.11193 x 132/116 < 0); the projection on 116 SMs, 16/116 x 0.11193 =
    0.015438 ms: 0.029794 ms against 2 x 0.057425 = 0.11485 ms without. Backward: the projection's
    gradient gather by ring exchange, 0.057425 - 1/2 x 0.11193 = 0.0014619 ms; QKV's dgrad scatter
    bulk beside wgrad, hidden; QKV's dgrad and wgrad on 116 SMs (bulk), 2 x 16/116 x 0.16099 =
    0.044412 ms: 0.045874 ms against 0.11485 ms."""
    flops, latency, bandwidth, hop = hand_rates()
    qkv, proj = (2 * 4096 * k * n / flops + latency for k, n in ((4096, 3072), (2048, 4096)))
    one = 1 / 2 * 2 * 4096 * 4096 / bandwidth + hop
    assert (qkv, proj, one) == pytest.approx((0.16099e-3, 0.11193e-3, 0.057425e-3), rel=1e-4)
    forward = max(0.0, one - qkv / 2) + max(one / 4, one - 3 / 4 * proj * MARGIN) + (MARGIN - 1) * proj
    backward = max(0.0, one - proj / 2) + max(0.0, one - qkv * MARGIN) + 2 * (MARGIN - 1) * qkv
    assert (forward, backward) == pytest.approx((0.029794e-3, 0.045874e-3), rel=1e-3)
    plain, overlapped = layers(MIXTRAL, 2)
    assert (float(plain.attention_tp), float(plain.attention_tp_backward)) == pytest.approx((2 * one, 2 * one),
                                                                                          rel=1e-12)
    assert (float(overlapped.attention_tp), float(overlapped.attention_tp_backward)) == pytest.approx(
        (forward, backward), rel=1e-12)
    # nothing else moves: the routed experts get no userbuffers, Mixtral has no shared experts
    assert float(overlapped.moe) == float(plain.moe) and float(overlapped.shared_tp) == 0.0


def test_the_shared_experts_dgrad_scatter_stays_exposed():
    """Shared experts 8192 wide (FC1 [tokens, h] x [h, 2 x 8192 / 2], FC2 [tokens, 4096] x [4096, h]),
    TP 2, 4096 tokens: FC1 2 x 4096 x 4096 x 8192 -> 0.40633 ms, FC2 2 x 4096 x 4096 x 4096 ->
    0.21007 ms. Their FC1 is a TEColumnParallelLinear, given no bulk overlap: forward FC1's gather
    hidden, FC2's pipelined scatter 0.057425 / 4 = 0.014356 ms, FC2 on 116 SMs 16/116 x 0.21007 =
    0.028975 ms (0.043331 ms); backward FC2's gradient gather hidden (1/2 x 0.21007 > 0.057425),
    FC1's dgrad scatter in NCCL, whole: 0.057425 ms, and no GEMM slowed (a bulk FC1 would have hidden
    it behind wgrad on 116 SMs, slowing dgrad and wgrad by 2 x 16/116 x 0.40633 = 0.11209 ms)."""
    flops, latency, bandwidth, hop = hand_rates()
    fc1, fc2 = (2 * 4096 * k * n / flops + latency for k, n in ((4096, 8192), (4096, 4096)))
    one = 1 / 2 * 2 * 4096 * 4096 / bandwidth + hop
    assert (fc1, fc2) == pytest.approx((0.40633e-3, 0.21007e-3), rel=1e-4)
    forward = max(0.0, one - fc1 / 2) + max(one / 4, one - 3 / 4 * fc2 * MARGIN) + (MARGIN - 1) * fc2
    backward = max(0.0, one - fc2 / 2) + one
    assert (forward, backward) == pytest.approx((0.043331e-3, 0.057425e-3), rel=1e-3)
    plain, overlapped = layers(SHARED, 2)
    assert float(plain.shared_tp) == pytest.approx(2 * one, rel=1e-12)
    assert (float(overlapped.shared_tp), float(overlapped.shared_tp_backward)) == pytest.approx(
        (forward, backward), rel=1e-12)


def test_the_shared_expert_overlap_takes_their_userbuffers_away():
    """--moe-shared-expert-overlap turns off the shared experts' userbuffers (shared_experts.py): their
    collectives stay as without --tp-comm-overlap; attention's still overlap."""
    plain, overlapped = layers(SHARED, 2, shared_expert_overlap=True)
    assert (overlapped.shared_tp, overlapped.shared_tp_backward) == (plain.shared_tp, plain.shared_tp_backward)
    assert float(overlapped.attention_tp) < float(plain.attention_tp)


def test_a_dense_layer_of_an_moe_model_overlaps_as_the_dense_model_prices_it():
    """A dense layer (first_k_dense_replace) of a grouped-query MoE model is a Llama layer: its
    attention's and MLP's userbuffers cost what the dense model's term (tp_overlap_time) gives the
    same layer, exposed and slowed GEMMs together."""
    spec = replace(MIXTRAL, name="mixtral-dense-first", first_dense_layers=1)
    _, overlapped = layers(spec, 4)
    rates = Rates.of(H100, load_calibration())
    forward, backward, slow_f, slow_b = tp_overlap_time(spec, 4096.0, 4, rates, 132)
    assert float(overlapped.attention_tp + overlapped.dense_mlp_tp) == pytest.approx(forward + slow_f, rel=1e-12)
    assert float(overlapped.attention_tp_backward + overlapped.dense_mlp_tp_backward) == pytest.approx(
        backward + slow_b, rel=1e-12)


@pytest.mark.parametrize("spec", [MIXTRAL, PRESETS["qwen3-30b-a3b"], SHARED], ids=lambda s: s.name)
def test_what_the_overlap_leaves_exposed_is_between_zero_and_the_plain_time_and_grows_with_tp(spec):
    """The dense model's property (tests/test_tp_comm_overlap.py) for the MoE blocks: each overlapped
    collective shows at most its whole time, so a block's exposed TP time lies in [0, without], and
    more TP ranks mean bigger collectives beside smaller GEMMs, so it never falls as TP grows. The
    exposed time is the field less the SMs' slowdown, by hand: attention's projection forward
    (proj_fprop pipelined) and QKV's dgrad and wgrad backward (bulk); the shared experts' FC2 forward."""
    flops, latency, _, _ = hand_rates()
    h, a, k, d = spec.hidden_size, spec.num_attention_heads, spec.num_query_groups, spec.head_dim
    tp = np.array([2, 4, 8, 16])
    for cp in (1, 2):
        for mbs in (1, 4):
            tokens = mbs * 4096 / cp
            qkv = 2 * tokens * h * (a + 2 * k) * d / tp / flops + latency
            proj = 2 * tokens * a * d / tp * h / flops + latency
            fc2 = 2 * tokens * spec.shared_expert_size / tp * h / flops + latency
            plain, overlapped = layers(spec, tp, cp, mbs)
            exposed = {"attention": overlapped.attention_tp - (MARGIN - 1) * proj
                       + overlapped.attention_tp_backward - 2 * (MARGIN - 1) * qkv}
            without = {"attention": plain.attention_tp + plain.attention_tp_backward}
            if spec.shared_expert_size:
                exposed["shared"] = overlapped.shared_tp - (MARGIN - 1) * fc2 + overlapped.shared_tp_backward
                without["shared"] = plain.shared_tp + plain.shared_tp_backward
            for block, value in exposed.items():
                assert np.all(value >= -1e-15) and np.all(value <= without[block] + 1e-15), (block, cp, mbs)
                assert np.all(np.diff(value) >= 0), (block, cp, mbs)


def _estimate(*argv) -> dict:
    result = CliRunner().invoke(cli, ["estimate", *argv, "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


MIXTRAL_TP2 = ["--model", "mixtral-8x7b", "--gpus", "8", "--gpu", "h100-80gb", "--tp", "2", "--pp", "1", "--ep", "4",
               "--mbs", "1", "--gbs", "16", "--seq-len", "4096", "--recompute", "none", "--no-overlap-grad-reduce",
               "--no-overlap-param-gather"]


def test_the_step_saves_what_each_layer_saves():
    """Mixtral 8x7B, 8 GPUs, TP 2, PP 1, DP 4, 16 sequences of 4096: 4 microbatches a rank, 32 MoE
    layers each; with the DP collectives not overlapped (their exposed time does not depend on the
    layers'), the step saves 4 x 32 x the attention block's saving a layer (the first test:
    4 x 0.057425 - 0.029794 - 0.045874 = 0.15403 ms): 4 x 32 x 0.15403 = 19.716 ms. The estimator's own memory (seed
    004's) has no userbuffers term, as the dense one's (the calibrated usage has them)."""
    plain = _estimate(*MIXTRAL_TP2)
    overlapped = _estimate(*MIXTRAL_TP2, "--tp-comm-overlap")
    assert "--tp-comm-overlap" in overlapped["megatron_args"] and "--tp-comm-overlap" not in plain["megatron_args"]
    assert overlapped["options"]["tp_comm_overlap"] is True
    saving = 4 * 0.057425e-3 - 0.029794e-3 - 0.045874e-3
    assert 4 * 32 * saving == pytest.approx(19.716e-3, rel=1e-4)
    assert plain["step_time_s"] - overlapped["step_time_s"] == pytest.approx(4 * 32 * saving, rel=1e-3)
    assert overlapped["total_gib"] == plain["total_gib"]


def test_from_command_prices_the_overlap_and_launch_writes_it(tmp_path):
    """The estimate's own Megatron command read back (--from-command) gives the same price, the
    overlap included, and advisor-launch writes --tp-comm-overlap from the saved estimate: what is
    launched is what was priced."""
    from launch.cli import cli as launch_cli

    estimate = _estimate(*MIXTRAL_TP2, "--tp-comm-overlap")
    flag = NEWEST.null_tokenizer_vocab_flag(32000)
    command = shlex.join(estimate["megatron_args"] + ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(flag)])
    result = CliRunner().invoke(cli, ["estimate", "--from-command", "-", "--gpus", "8", "--gpu", "h100-80gb",
                                      "--format", "json"], input=command)
    assert result.exit_code == 0, result.output
    read = json.loads(result.stdout)
    assert read["unpriced"] == []
    for key in ("step_time_s", "usage_gib", "total_gib", "options", "megatron_args"):
        assert read[key] == estimate[key], key
    saved = tmp_path / "estimate.json"
    saved.write_text(json.dumps(estimate))
    launched = CliRunner().invoke(launch_cli, ["args", "--from", str(saved), "--format", "json"])
    assert launched.exit_code == 0, launched.output
    args = json.loads(launched.stdout)
    assert "--tp-comm-overlap" in args and "--sequence-parallel" in args


@pytest.mark.parametrize("argv", [
    ["estimate", "--model", "deepseek-v3", "--gpus", "256", "--gpu", "h100-80gb", "--tp", "2"],
    ["sweep", "--model", "deepseek-v3", "--gpus", "256", "--gpu", "h100-80gb"],
], ids=["estimate", "sweep"])
def test_multi_latent_attention_with_the_overlap_is_refused(argv):
    """megatron-core's unfused MLA down projections switch --tp-comm-overlap off for the whole model
    chunk (TELinear sets tp_comm_overlap = False on the shared config); core 0.19's fused ones keep it
    on but name buffers Transformer Engine lacks (reviewer5): refused either way, not priced as if
    it ran, and the line says both."""
    result = CliRunner().invoke(cli, [*argv, "--tp-comm-overlap"])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("Error: --tp-comm-overlap is not priced with multi-latent attention: with "
                                    "MLA's down projections unfused, megatron-core turns it off for the whole model "
                                    "chunk")
    assert "with --mla-down-proj-fusion (core 0.19) the fused projections name buffers" in result.output
    assert len(result.output.splitlines()) == 1 and "Traceback" not in result.output


# the shared experts beside the dispatch, in a grouped-query MoE command (the advisor's presets with
# shared experts all have MLA): read back, its flags then go through Megatron with the rest
_SHARED_COMMAND = (
    "pretrain_gpt.py --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
    "--group-query-attention --num-query-groups 8 --seq-length 4096 --max-position-embeddings 32768 "
    "--normalization RMSNorm --swiglu --position-embedding-type rope --disable-bias-linear "
    "--untie-embeddings-and-output-weights --vocab-size 32000 --micro-batch-size 1 --global-batch-size 256 --bf16 "
    "--tensor-model-parallel-size 2 --sequence-parallel --tp-comm-overlap --num-experts 8 --moe-router-topk 2 "
    "--moe-grouped-gemm --moe-router-dtype fp32 --moe-shared-expert-intermediate-size 8192 "
    "--moe-shared-expert-overlap --expert-model-parallel-size 4 --moe-token-dispatcher-type alltoall")


@pytest.mark.xdist_group("megatron-validator")
@pytest.mark.parametrize("tag", ["core_v0.15.2", "core_v0.19.0"])
def test_megatron_accepts_the_moe_rows_with_the_overlap(tag):
    """MoE rows with --tp-comm-overlap through each release's real parse_args + validate_args
    (launch.megatron_check): Mixtral's estimate, Qwen3-30B-A3B's top sweep row, with the EP overlap,
    and a grouped-query command with shared experts beside the dispatch, read back. Megatron keeps
    the overlap on (it refuses it only without --sequence-parallel, which every row writes)."""
    from megatron_real import checkout, mock_data_case, validate

    sweep = ["sweep", "--model", "qwen3-30b-a3b", "--gpus", "16", "--gpu", "h100-80gb", "--seq-len", "4096", "--gbs",
             "256", "--tp", "2", "--tp-comm-overlap", "--top", "1", "--format", "json"]
    runner = CliRunner()
    rows = [("mixtral-8x7b", _estimate(*MIXTRAL_TP2, "--tp-comm-overlap")),
            ("qwen3-30b-a3b", json.loads(runner.invoke(cli, sweep).stdout)[0]),
            ("qwen3-30b-a3b", json.loads(runner.invoke(cli, [*sweep, "--overlap-moe-expert-parallel-comm"]).stdout)[0])]
    read = runner.invoke(cli, ["estimate", "--from-command", "-", "--gpus", "8", "--gpu", "h100-80gb", "--format",
                               "json"], input=_SHARED_COMMAND)
    assert read.exit_code == 0, read.output
    rows.append(("mixtral-8x7b", json.loads(read.stdout)))
    assert all("--tp-comm-overlap" in row["megatron_args"] and row["tp"] == 2 for _, row in rows)
    cases = [mock_data_case(row, tag, 32000, {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}) for _, row in rows]
    results = validate(checkout(tag), cases)
    assert all(result["ok"] for result in results), [result.get("error") for result in results]
    for (_, row), result in zip(rows, results):
        derived = result["derived"]
        assert (derived["tp_comm_overlap"], derived["sequence_parallel"], derived["expert_model_parallel_size"]) == (
            True, True, row["ep"])
    assert results[-1]["derived"]["moe_shared_expert_overlap"] is True


def test_the_overlap_at_tp_1_is_refused_for_an_moe_model_as_for_a_dense_one():
    """validate_args turns sequence parallelism off at TP 1 and then asserts it for the overlap (both
    releases): an MoE estimate at TP 1 refuses it in one line, as a dense one does (before the MoE
    model priced the overlap, its refusal of the flag covered this)."""
    result = CliRunner().invoke(cli, ["estimate", "--model", "mixtral-8x7b", "--gpus", "64", "--gpu", "h100-80gb",
                                      "--tp", "1", "--tp-comm-overlap"])
    assert result.exit_code == 2, result.output
    assert result.output == ("Error: --tp-comm-overlap needs TP > 1: at TP 1 Megatron-LM turns sequence parallelism "
                             "off, and refuses the overlap without it\n")
