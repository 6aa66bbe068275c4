"""MoE rows priced by the dense rows' pieces (issue 22's second pricing folded): FP8 and MTP terms
against hand-derived values, the calibrated verdicts and the ranking rule on MoE stages, VPP."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from advisor.cli import cli
from advisor.hardware import get_gpu
from advisor.moe import fp8, mtp, params
from advisor.moe import memory as mm
from advisor.moe import space as sp
from advisor.moe import stage as st
from advisor.moe import time as mt
from advisor.throughput import levers as time_levers
from advisor.moe.spec import PRESETS
from advisor.options import TrainingOptions
from advisor.paper_rule import classify
from advisor.ranking import simplicity
from advisor.throughput.calibration import load_calibration, load_memory_calibration
from advisor.throughput.levers import fp8_rates
from advisor.throughput.terms import Rates

MIXTRAL, DSV3 = PRESETS["mixtral-8x7b"], PRESETS["deepseek-v3"]
HYBRID = TrainingOptions().with_(fp8_format="hybrid")


def test_fp8_weight_copies_of_an_moe_layer_by_hand():
    # Mixtral, TP 1, EP 8 (one expert per GPU): QKV + proj 2 h^2 (1 + 8/32) and one expert 3 h h_moe,
    # FP8 copy + transpose 2 bytes each; delayed scaling: 4 GEMMs x 5 tensors x (1 amax + 1 scale) x 4 bytes
    linear = 2 * 4096 * 4096 * 1.25 + 3 * 4096 * 14336
    assert fp8.weight_bytes(MIXTRAL, 1, 8, 1, HYBRID.memory_options()) == 2 * linear + 4 * 5 * 2 * 4
    # --fp8-param-gather drops the BF16 weight (2 bytes) of every GEMM weight
    gather = HYBRID.with_(fp8_param_gather=True).memory_options()
    assert fp8.weight_bytes(MIXTRAL, 1, 8, 1, gather) == 2 * linear - 2 * linear + 160
    assert fp8.weight_bytes(MIXTRAL, 1, 8, 1, TrainingOptions().memory_options()) == 0
    # DeepSeek-V3's MLA: Q down/up, KV down/up, proj (5 GEMMs); shared experts 2; 256/64 = 4 experts x 2
    assert fp8.moe_layer_fp8(DSV3, 1, 64, 1)[1] == 5 + 2 + 8


def test_fp8_activation_saving_of_an_moe_layer_by_hand():
    # 8192 token copies (top-2 of 4096 tokens): FC1 input h and FC2 input h_moe saved in 1 byte, not 2;
    # GQA: QKV input h saved in FP8 (-1 byte), the projection's FP8 copy a d (+1 byte): 4096 - 4096
    options = HYBRID.memory_options()
    saved = fp8.activation_saving(MIXTRAL, 4096, 1, 1, 1, 8192.0, 1, options)
    assert saved == 8192 * (4096 + 14336) + 4096 * (4096 - 4096)
    assert fp8.activation_saving(MIXTRAL, 4096, 1, 1, 1, 8192.0, 1, options, frozenset({"moe_act"})) == 8192 * 4096


def test_fp8_expert_gemms_run_at_the_fp8_rate():
    gpu = get_gpu("h100-80gb")
    rates = Rates.of(gpu, load_calibration())
    fast = fp8_rates(rates, gpu)
    forward, _ = mt.expert_gemm_time(MIXTRAL, 4096.0, 8, 1, fast, element_bytes=1)
    # one expert of 4096 copies: FC1 in 55 waves of 132 tiles, FC2 in 8 (``test_grouped_gemm_from_its_shapes``)
    rate = rates.gemm_flops_per_s * gpu.fp8_dense_tflops / gpu.bf16_dense_tflops
    fc1 = 2 * 4096 * 4096 * 28672 / (rate * 4096 * 28672 / (55 * 132 * 16384))
    fc2 = 2 * 4096 * 14336 * 4096 / (rate * 4096 * 4096 / (8 * 132 * 16384))
    assert forward == pytest.approx(fc1 + fc2 + 2 * rates.gemm_latency_s)


def test_mtp_terms_by_hand():
    h, v = 7168, 129280
    assert mtp.dense_parameters(DSV3, 1) == 3 * h + 2 * h * h + params.moe_layer_dense_parameters(DSV3, 1)
    assert mtp.dense_parameters(DSV3, 8) == 3 * h + 2 * h * h / 8 + params.moe_layer_dense_parameters(DSV3, 8)
    assert mtp.embedding_copy_parameters(DSV3, 8, 16, v) == v * h / 8
    assert mtp.embedding_copy_parameters(DSV3, 8, 1, v) == 0
    # layer: enorm input 2h and eh_proj's input 4h per token over t c; embedding: int64 ids (Eq. 13);
    # output: final norm and output-layer inputs 4h and FP32 logits 4v per token
    layer, embedding, output = mtp.activation_bytes(DSV3, 4096, 1, 2, 1, v, 1000.0)
    assert layer == 1000 + 4096 * 6 * h / 2
    assert embedding == 8 * 4096 * h / 2
    assert output == 4096 * (4 * h + 4 * v) / 2


def test_mtp_on_the_last_stage_by_hand():
    with_mtp = DSV3.__class__(**{**{f: getattr(DSV3, f) for f in DSV3.__dataclass_fields__}, "mtp_num_layers": 1})
    layout = dict(tp=1, cp=1, pp=16, ep=64, etp=1, dp=64, mbs=1, num_microbatches=64, stage=np.array([0, 15]))
    plain = st.stage_bytes(DSV3, 4096, st.MoEOptions(), **layout)
    more = st.stage_bytes(with_mtp, 4096, st.MoEOptions(), **layout)
    assert more.total[0] == plain.total[0]  # MTP lives on the last stage only
    h, v = 7168, 129280
    dense = 3 * h + 2 * h * h + params.moe_layer_dense_parameters(DSV3, 1) + v * h  # + the embedding copy
    assert more.weights_gradients_optimizer[1] - plain.weights_gradients_optimizer[1] == pytest.approx(
        dense * (2 + 4 + 12 / 64))
    experts = 4 * 3 * h * 2048  # 256 / 64 experts; EDP = 64 / 64 = 1
    assert more.expert_states[1] - plain.expert_states[1] == pytest.approx(experts * (2 + 4 + 12))
    assert more.output_activations[1] - plain.output_activations[1] == pytest.approx(4096 * (4 * h + 4 * v))


def test_full_recomputation_checkpoints_the_mtp_layer():
    """Under --recompute full Megatron checkpoints the MTP layer (multi_token_prediction.py:702-703,
    uniform with 1 layer, the only full recomputation the advisor prices for MoE): it keeps the
    next tokens' embedding, 2h per token over t c (DeepSeek-V3, s 4096, TP 2: 2 x 4096 x 7168 / 2),
    and is rebuilt in its backward, the whole MTP layer at once (the layer it keeps without
    recomputation). A last stage of MTP alone rebuilds the MTP layer, not a dense layer."""
    with_mtp = DSV3.__class__(**{**{f: getattr(DSV3, f) for f in DSV3.__dataclass_fields__}, "mtp_num_layers": 1})
    layout = dict(tp=2, cp=1, pp=16, ep=64, etp=1, dp=32, mbs=1, stage=15)
    kept = st.stage_parts(with_mtp, 4096, st.MoEOptions(), **layout)
    for split in (None, (5,) + (4,) * 14 + (0,)):
        full = st.stage_parts(with_mtp, 4096, st.MoEOptions(), **layout, recompute="full", layers_per_stage=split)
        assert float(full.mtp_layers) == 2 * 4096 * 7168 / 2
        assert float(full.rebuilt) == float(kept.mtp_layers)
    assert float(st.stage_parts(DSV3, 4096, st.MoEOptions(), **layout, recompute="full",
                                layers_per_stage=(5,) + (4,) * 14 + (0,)).rebuilt) == 0.0


def test_a_last_stage_of_mtp_alone_has_one_moe_layers_transient():
    """A layout whose last stage holds the MTP layer and no decoder layer ('Et*5|(t*4|)*14mL' at PP
    16; Megatron-LM gpt_builders.py builds the MTP layer from the MoE layer spec there): the MTP
    layer's MoE layer has the transient peak of any other, by hand (DeepSeek-V3, TP 2, EP 64,
    alltoall, balanced: N = 2048 tokens, k 8, h 7168, 4 local experts, c = r = N k = 16384):
    S = N k 2h = 224 MiB; at the unsort S + the all-to-all's output + the experts' output + its
    unsorted copy, 4 x 224, + the shared experts' output N 2h = 28, + the received FP32
    probabilities r 4 B = 0.0625, + the routing the dispatcher holds N E 5 B = 2.5: 926.5625 MiB,
    + the grouped GEMM's four cuBLAS workspaces of 32 MiB + 256 B; no other MoE layer holds routing
    beside it. Priced 0 before 2026-11-29; without MTP the stage has none."""
    with_mtp = DSV3.__class__(**{**{f: getattr(DSV3, f) for f in DSV3.__dataclass_fields__}, "mtp_num_layers": 1})
    split = (5,) + (4,) * 14 + (0,)
    layout = dict(tp=2, cp=1, pp=16, ep=64, etp=1, dp=32, mbs=1, num_microbatches=256, stage=15,
                  layers_per_stage=split)
    MiB = 2**20
    one_layer = (4 * 224 + 28 + 0.0625 + 2.5) * MiB + 4 * (32 * MiB + 256)
    assert float(st.stage_bytes(with_mtp, 4096, st.MoEOptions(), **layout).transient) == one_layer
    assert float(st.stage_bytes(DSV3, 4096, st.MoEOptions(), **layout).transient) == 0.0
    # the layout as a user gives it: advisor estimate prices the MTP-only stage the same
    result = CliRunner().invoke(cli, ["estimate", "--model", "deepseek-v3", "--tp", "2", "--pp", "16", "--ep", "64",
                                      "--etp", "1", "--gpus", "1024", "--gbs", "8192", "--seq-len", "4096",
                                      "--mtp-num-layers", "1", "--layers-per-stage", "5,4x14,0", "--format", "json"])
    assert result.exit_code == 0, result.output
    last = json.loads(result.output)["stages"][-1]
    assert (last["layers"], last["transient_gib"]) == (0, pytest.approx(one_layer / 2**30))
    # beside one decoder MoE layer, the other's dispatcher holds its routing (as before)
    beside = st.stage_bytes(with_mtp, 4096, st.MoEOptions(), **{**layout, "layers_per_stage": (4,) * 15 + (1,)})
    assert float(beside.transient) == one_layer + 2.5 * MiB


def test_megatron_flops_count_the_mtp_layers():
    # training.py num_floating_point_operations with --mtp-num-layers 1: L' = 62 layers (59 MoE),
    # MTP norms and eh projection 6 (3h + 2h^2), the logits twice
    with_mtp = DSV3.__class__(**{**{f: getattr(DSV3, f) for f in DSV3.__dataclass_fields__}, "mtp_num_layers": 1})
    s, gbs, v, h, a = 4096, 64, 129280, 7168, 128
    mlp = 12 * 62 * h * 1.5 * (18432 * 3 / 62 + (2048 * 8 + 2048) * 59 / 62)
    attention = 6 * 62 * (1536 * (h + a * 192 + 1) + 512 * (h + a * 256 + 1) + h * 64 + a * 128 * h
                          + s * a * 192 / 2 + s * a * 128 / 2)
    expected = gbs * s * (mlp + attention + 6 * (3 * h + 2 * h * h) + 6 * h * v * 2)
    assert mt.megatron_flops_per_iteration(with_mtp, s, gbs, v) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("mask", ["off", "cached"])
def test_calibrated_verdicts_of_moe_stages_compose_the_dense_terms(mask):
    """usage = states + f (layers + transient) + f/h embedding + f output + runtime + reserve +
    the cross-entropy's BF16 logits on the last stage (the calibrated model's terms), and the
    data loader's s x s mask on both where the run builds it (not with the default 'off')."""
    cal = load_memory_calibration()
    options = st.MoEOptions(training=TrainingOptions().with_(dataloader_mask=mask))
    judge, band = sp.calibrated_judge(MIXTRAL, 4096, options, 80.0)
    columns = dict(tp=1, cp=1, pp=2, ep=8, etp=1, dp=8, mbs=1)
    b = st.stage_bytes(MIXTRAL, 4096, options, num_microbatches=4, stage=np.array([0, 1]), **columns)
    usage = judge(b, columns, np.array([0, 1]), "none")
    f, added = cal.activation_factor, cal.overhead_gib * 2**30 + cal.reserve_fraction * 80 * 2**30
    loader_mask = 4096 * 4096 * 2 * (cal.dataloader_mask and mask != "off")  # b s^2 (1 + 1/c) bytes
    first = (b.model_states[0] + f * (b.layer_activations[0] + b.transient[0]) + f / 4096 * b.embedding_activations[0]
             + added + loader_mask)
    last = b.model_states[1] + f * (b.layer_activations[1] + b.transient[1]) + f * b.output_activations[1] + added \
        + 2 * 4096 * 32000 + loader_mask
    assert usage[0] == pytest.approx(first) and usage[1] == pytest.approx(last)
    assert band == cal.band


def test_verdicts_by_bisection_equal_the_rule_on_every_value():
    values = np.random.default_rng(0).uniform(0, 120, 5000) * 2**30
    values[:3] = [0.8 * 80 * 2**30, 80 * 2**30, 64 * 2**30 + 1]  # the boundaries themselves
    verdicts = sp._verdicts({"total": values}, 80.0, 0.8, None)
    assert list(verdicts) == [classify(v / 2**30, 80.0, 0.8) for v in values]


def test_simplicity_puts_smaller_ep_and_bf16_first():
    base = dict(pp=2, vpp=1, recompute="none", recomputed_layers=0, model_parallel=4, fsdp=False, offload=False)
    assert simplicity(**base, fp8=False, ep=4) < simplicity(**base, fp8=False, ep=8)
    assert simplicity(**base, fp8=False, ep=8) < simplicity(**base, fp8=True, ep=4)
    assert simplicity(**{**base, "vpp": 2}, fp8=False, ep=1) > simplicity(**base, fp8=True, ep=64)


def _sweep(*extra) -> list[dict]:
    result = CliRunner().invoke(cli, ["sweep", "--model", "mixtral-8x7b", "--gpus", "64", "--gpu", "h100-80gb",
                                      "--seq-len", "4096", "--gbs", "256", "--format", "json", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_moe_rows_are_judged_and_ranked_as_dense_rows():
    rows = _sweep("--all")
    tolerance = rows[0]["ranking_tolerance"]
    assert rows[0]["memory_model"] == "calibrated" and tolerance > 0
    assert {"fits", "oom"} <= {row["verdict"] for row in rows}
    ranked = [row for row in rows if row["rank"]]
    assert all(row["verdict"] in ("fits", "likely fits") for row in ranked)
    fastest = max(row["tflops_per_gpu"] for row in ranked)
    near = [row for row in ranked if row["tflops_per_gpu"] >= (1 - tolerance) * fastest]
    assert ranked[:len(near)] == near  # the rows within the tolerance lead, simplest first
    keys = [(row["pp"] * row["vpp"], row["recompute"] != "none") for row in near]
    assert keys == sorted(keys)
    assert any(row["vpp"] > 1 for row in rows)  # interleaving is searched
    paper = _sweep("--memory-model", "paper", "--top", "5")
    assert {row["verdict"] for row in paper} <= {"fits", "tight"} and "usage_gib" not in paper[0]


def _estimate(*extra) -> dict:
    result = CliRunner().invoke(cli, ["estimate", "--model", "mixtral-8x7b", "--tp", "1", "--pp", "2", "--ep", "8",
                                      "--gpus", "64", "--gpu", "h100-80gb", "--seq-len", "4096", "--gbs", "256",
                                      "--format", "json", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_fp8_layouts_carry_their_flags_and_cost_less_time_and_more_states():
    bf16, hybrid = _estimate(), _estimate("--fp8-format", "hybrid")
    assert "--fp8-format" in hybrid["megatron_args"] and hybrid["options"]["fp8_format"] == "hybrid"
    assert "--fp8-format" not in bf16["megatron_args"]
    assert hybrid["step_time_s"] < bf16["step_time_s"]
    assert all(stage["fp8_weights_gib"] > 0 for stage in hybrid["stages"])
    assert hybrid["model_states_gib"] > bf16["model_states_gib"]
    # VPP in an estimate: the interleaved layout is launchable and holds more in flight
    interleaved = _estimate("--vpp", "2")
    assert interleaved["vpp"] == 2 and "--num-layers-per-virtual-pipeline-stage" in interleaved["megatron_args"]
    assert interleaved["stages"][0]["in_flight_microbatches"] > bf16["stages"][0]["in_flight_microbatches"]


def test_report_detail_shows_the_moe_stage_terms():
    """advisor.report's per-layout detail of an MoE row: its model states by kind (weights,
    gradients, optimizer, as a dense stage's) and its own buckets (FP8 weights, the dispatcher's
    buffers), stacked to the calibrated usage of each stage of its estimate."""
    from advisor.report.details import layout_detail
    from advisor.report.moe_detail import MOE_SEGMENTS

    row = _sweep("--fp8-format", "hybrid", "--top", "1")[0]
    detail = layout_detail(row)
    assert list(detail.stages[0]) == list(MOE_SEGMENTS) and detail.model_name == "calibrated MoE"
    assert all(stage["optimizer"] > 0 and stage["FP8 weights"] > 0 for stage in detail.stages)
    estimate = _estimate_of(row)
    assert [sum(stage.values()) for stage in detail.stages] == pytest.approx(
        [stage["usage_gib"] for stage in estimate["stages"]])
    assert f"EP {row['ep']}" in detail.label or row["ep"] == 1


def _estimate_of(row: dict) -> dict:
    args = ["estimate", "--model", "mixtral-8x7b", "--gpu", "h100-80gb", "--seq-len", "4096", "--gbs", "256",
            "--format", "json", "--fp8-format", "hybrid", "--recompute", row["recompute"]]
    for key in ("tp", "cp", "pp", "ep", "etp", "mbs", "vpp"):
        args += [f"--{key}", str(row[key])]
    result = CliRunner().invoke(cli, [*args, "--gpus", str(row["gpus"])])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_advisor_launch_keeps_an_fp8_mtp_rows_flags(tmp_path):
    import shlex
    import subprocess
    import sys

    path = tmp_path / "rows.json"
    result = CliRunner().invoke(cli, ["sweep", "--model", "deepseek-v3", "--gpus", "256", "--gpu", "h100-80gb",
                                      "--seq-len", "4096", "--gbs", "512", "--fp8-format", "hybrid", "--mtp-num-layers",
                                      "1", "--top", "1", "--format", "json", "-o", str(path)])
    assert result.exit_code == 0, result.output
    row = json.loads(path.read_text())[0]
    done = subprocess.run([sys.executable, "-m", "launch", "args", "--from", str(path), "--rank", "1"],
                          capture_output=True, text=True, check=True)
    args = shlex.split(done.stdout)
    assert args == row["megatron_args"]
    assert args[args.index("--fp8-format") + 1] == "hybrid" and args[args.index("--mtp-num-layers") + 1] == "1"


@pytest.mark.parametrize("argv, message", [
    (["--model", "mixtral-8x7b", "--gpu", "a100-80gb", "--fp8-format", "hybrid"], "no FP8 tensor cores"),
    (["--gpu", "h100-80gb", "--mtp-num-layers", "1"], "need a mixture-of-experts model"),
    (["--model", "mixtral-8x7b", "--gpu", "h100-80gb", "--fp8-format", "hybrid", "--recompute", "selective",
      "--recompute-modules", "moe_act"], "other than delayed"),
    # offload is priced (tests/test_moe_offload.py), but not where the preset gives no host rates
    (["--model", "mixtral-8x7b", "--gpu", "h800-80gb", "--optimizer-cpu-offload"],
     "h800-80gb: gpus.json gives no host link or host memory bandwidth, so optimizer CPU offload cannot be timed"),
])
def test_what_moe_rows_cannot_price_is_one_line(argv, message):
    result = CliRunner().invoke(cli, ["sweep", "--gpus", "64", *argv])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def test_fp8_casts_and_mtp_time_by_hand():
    # Mixtral (GQA a 32, k 8, d 128), 4096 tokens, TP 2, 8192 copies, ETP 1, current scaling on Hopper (6
    # bytes an operand: the amax read, the cast's read, its FP8 write and transpose; 4 after QKV's norm, which
    # finds the amax). Sequence parallelism gathers QKV's input and the projection's gradient (h each): cast
    # row-wise on the shard (3 normed, 5), each transposed whole after the gather (4096 x h, read 1 and write 1).
    # Forward inputs h (normed, gathered) + a d over t and h + h_moe per copy; backward output gradients
    # (a + 2k) d + h (gathered) over t, the two transposes, and 2 h_moe + h per copy
    casts = time_levers.fp8_casts("tensorwise", "hopper")
    forward, backward, transposes = fp8.cast_bytes(MIXTRAL, 4096.0, 2, 8192.0, 1, casts)
    assert forward == 4096 * (3 * 4096 + 6 * 32 * 128) / 2 + 6 * 8192 * (4096 + 14336)
    assert transposes == 2 * 2 * 4096 * 4096
    assert backward == 4096 * (6 * (32 + 16) * 128 + 5 * 4096) / 2 + 2 * 2 * 4096 * 4096 \
        + 6 * 8192 * (2 * 14336 + 4096)
    # DeepSeek-V3's MLA: the down projections' inputs (h twice) are duplicated linears' on the shard after the
    # layer's norm, 6, not gathered; the up projections' (q_lora 1536, kv_lora 512) are LayerNormLinears'
    # (qk_layernorm), gathered: 3; the output projection's a d_v = 128 x 128, 6; the shared expert's input h
    # (gathered, 5) and 2048 (6) over t, and each copy's h + 2048, 6
    forward, _, _ = fp8.cast_bytes(DSV3, 4096.0, 2, 8192.0, 1, casts)
    assert forward == 4096 * (6 * (2 * 7168 + 128 * 128) + 3 * (1536 + 512)) / 2 \
        + 4096 * (5 * 7168 + 6 * 2048) / 2 + 6 * 8192 * (7168 + 2048)
    # one MTP layer on the last stage: its MoE layer, eh_proj forward plus a backward twice it, embedding, head
    calls = []

    def gemm(m, k, n):
        calls.append((m, k, n))
        return 1.0
    assert mtp.extra_time(DSV3, 4096.0, 8, 10.0, 2.0, 0.5, gemm) == 10.0 + 3 * 1.0 + 2.0 + 0.5
    assert calls == [(4096.0, 2 * 7168, 7168 / 8)]


def test_fp8_casts_land_in_the_part_that_runs_them():
    """With the GEMMs left at the BF16 rate (``Fp8Gemms`` with BF16 rates), FP8 adds the casts'
    bytes over the HBM rate, each to its part, and takes off what the FP8 sequence-parallel input
    all-gathers save: one before QKV (attention), one before FC1 (a dense layer's MLP, or the MoE
    layer's shared experts, ``time.shared_expert_tp_time``), each 1 byte
    an element instead of 2, of which a TP-2 ring sends half, over NVLink. DeepSeek-V3, 4096
    tokens, TP 2, EP 8, current scaling on Hopper (6 bytes an operand, 4 after a norm; an operand
    sequence parallelism gathers cast row-wise on its shard, 5, 3 after a norm). A first dense
    layer: MLA's casts (down projections' h twice and a d_v at 6, the up projections' q_lora 1536
    + kv_lora 512 after their latent norms, gathered, at 3) and its MLP's (FC1's input h after the
    fused pre-MLP norm, gathered, at 3, FC2's h_ffn 18432 at 6), over t. The MoE layer's experts:
    the shared expert (h gathered at 5 + 2048 at 6, over t) and each routed copy (h + 2048 at 6,
    ETP 1); MLA's up projections cast again when recomputed."""
    rates = Rates.of(get_gpu("h100-80gb"), load_calibration())
    casts = time_levers.fp8_casts("tensorwise", "hopper")
    kw = dict(tp=2, cp=1, ep=8, etp=1, mbs=1, rates=rates)
    plain, fp8 = mt.layer_times(DSV3, 4096, **kw), mt.layer_times(DSV3, 4096, **kw,
                                                                   fp8=time_levers.Fp8Gemms(rates, casts, "tensorwise"))
    h, tokens = 7168, 4096
    attention = tokens * (6 * (2 * h + 128 * 128) + 3 * (1536 + 512)) / 2
    dense_mlp = tokens * (3 * h + 6 * 18432) / 2
    copies = float(mm.expert_token_copies(DSV3, mm.tokens_per_rank(4096, 1, 2, 1), 8, 1, mm.RoutedTokens()))
    experts = tokens * (5 * h + 6 * 2048) / 2 + 6 * copies * (h + 2048)
    bandwidth = rates.hbm_bytes_per_s
    gather_saved = 0.5 * (2 - 1) * tokens * h / rates.nvlink_bytes_per_s
    # MLA gathers its up projections' latents (1536 + 512) in FP8, the rotary key (64) in BF16 as
    # megatron-core's own gather (time.mla_attention_tp_time)
    mla_gather_saved = 0.5 * (2 - 1) * tokens * (1536 + 512) / rates.nvlink_bytes_per_s
    # the casts in the compute, the gathers saved in each block's TP collectives (LayerTimes.attention_tp ...)
    assert float(fp8.dense - plain.dense) == pytest.approx((attention + dense_mlp) / bandwidth, rel=1e-9)
    assert float(fp8.dense_mlp - plain.dense_mlp) == pytest.approx(dense_mlp / bandwidth, rel=1e-9)
    assert float(fp8.expert - plain.expert) == pytest.approx(experts / bandwidth, rel=1e-9)
    assert float(fp8.moe - plain.moe) == pytest.approx((attention + experts) / bandwidth, rel=1e-9)
    for block, saved in (("attention_tp", mla_gather_saved), ("dense_mlp_tp", gather_saved),
                         ("shared_tp", gather_saved)):
        assert float(getattr(fp8, block) - getattr(plain, block)) == pytest.approx(-saved, rel=1e-9)
    # the backward's transposes of the gathered operands, all 4096 tokens, 2 bytes an element: attention's
    # latents (1536 + 512) and the projection's gradient h; the dense MLP's or the shared expert's h twice
    mla = 2 * tokens * (1536 + 512 + h)
    assert float(fp8.dense_transposes) == pytest.approx((mla + 2 * 2 * tokens * h) / bandwidth, rel=1e-9)
    assert float(fp8.moe_transposes) == pytest.approx((mla + 2 * 2 * tokens * h) / bandwidth, rel=1e-9)
    assert (plain.dense_transposes, plain.moe_transposes) == (0.0, 0.0)
    assert float(fp8.mla_up - plain.mla_up) == pytest.approx(tokens * 3 * (1536 + 512) / 2 / bandwidth, rel=1e-9)
    assert float(fp8.comm) == float(plain.comm)


def test_deepseek_dense_layers_keep_the_fused_swiglu_activations():
    # first dense layer, TP 1, CP 1, MBS 1: attention's terms + 2 s (h + 3 h_ffn) (fused SwiGLU) + 2 s h (pre-MLP norm)
    s, h, f = 4096, 7168, 18432
    kept = st._dense_layer_activations(DSV3, s, 1, 1, 1)
    assert kept == mm.attention_activation_bytes(DSV3, s, 1, 1, 1) + 2 * s * (h + 3 * f) + 2 * s * h


@pytest.mark.parametrize("pp", [4, 16, 32])
def test_representative_stages_hold_the_peak_with_leading_dense_layers(pp):
    """DeepSeek-V3's three dense layers: the first all-MoE stage (stage 3 at PP 32, two MoE layers
    with 29 microbatches in flight) can be the peak; the sweep's stages must include it."""
    layout = dict(tp=4, cp=1, pp=pp, ep=4, etp=2, dp=2, mbs=2, num_microbatches=64)
    every = st.stage_bytes(DSV3, 4096, st.MoEOptions(), stage=np.arange(pp), **layout).total.max()
    chosen = max(st.stage_bytes(DSV3, 4096, st.MoEOptions(), stage=stage, **layout).total.max()
                 for stage in st.representative_stages(DSV3, np.array(pp)))
    assert chosen == every


@pytest.mark.parametrize("extra", [["--use-torch-fsdp2"]], ids=["fsdp2"])
def test_an_unpriced_moe_training_option_says_what_is_priced(extra):
    """The refusal named the flag and stopped (helper scripts, on Megatron-LM's DeepSeek-V3
    Megatron-FSDP example): it now says what the MoE model prices, so the user knows what to change.
    Megatron-FSDP itself is priced since (tests/test_moe_fsdp.py), and optimizer CPU offload
    (tests/test_moe_offload.py)."""
    result = CliRunner().invoke(cli, ["estimate", "--model", "mixtral-8x7b", "--gpus", "64", "--gpu", "h100-80gb",
                                      *extra])
    assert result.exit_code == 2 and len(result.output.splitlines()) == 1, result.output
    assert result.output.rstrip().endswith(
        "it prices BF16 weights (--bf16) under Megatron's DDP or Megatron-FSDP, with or without optimizer CPU "
        "offload: drop or change those flags to price the run so")
