"""--no-bias-swiglu-fusion priced (``Fusions.bias_swiglu_fusion``): megatron-core's eager SwiGLU
keeps two more h_ffn-wide BF16 tensors per token than its fused kernel (``equations.
unfused_swiglu_bytes``) and runs three element-wise kernels instead of one
(``throughput.terms.swiglu_elements``); the option reads back from a command, is written only
when set, and Megatron-LM's own parsers build it."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from advisor import equations as eq
from advisor.memory import GIB
from advisor.models import PRESETS
from advisor.options import TrainingOptions, parse_training_args, training_args
from advisor.options.flags import changed_args
from advisor.throughput import terms

SPEC = PRESETS["llama3.1-8b"]  # h 4096, h_ffn 14336, 32 layers
UNFUSED = "--no-bias-swiglu-fusion"


def test_the_unfused_swiglu_keeps_one_h_ffn_tensor_beyond_eq_12_by_hand():
    # Eq. 12 counts 4 h_ffn-wide BF16 elements a token (gate, up, SiLU output, FC2's input); the eager
    # glu keeps 5: FC1's output (2, SiLU's saved input is a view of it), the SiLU output, x_linear + 0.0
    # and the product (FC2's input): one more, 2 bytes
    assert eq.unfused_swiglu_bytes(SPEC, 8192, 1) == (5 - 4) * 2 * 8192 * 1 * 14336 == 234_881_024
    # the fused kernel keeps 3, one fewer than Eq. 12 (the calibrated model's correction): unfused and
    # fused differ by 2 elements, what the real one-rank CPU launch of core_v0.15.2 measured at s 32, b 2,
    # h_ffn 128: 2 x 2 x 32 x 2 x 128 = 32,768 bytes
    tiny = replace(SPEC, ffn_hidden_size=128)
    fused_correction = 2 * 32 * 2 * 128  # memory_terms.swiglu_fusion_fraction's 2 s b h_ffn
    assert eq.unfused_swiglu_bytes(tiny, 32, 2) + fused_correction == 2 * 2 * 32 * 2 * 128 == 32_768


def _stages(advisor, *args):
    """(Eq. 18's per-stage layer activations in bytes, the calibrated usage in GiB, the row) of an estimate."""
    row = advisor.json("estimate", "--gpus", "8", "--gpu", "h100-80gb", *args)
    return [stage["layer_activations_gib"] * GIB for stage in row["stages"]], row["usage_gib"], row


@pytest.mark.parametrize("layout, tc, b, held", [
    # TP 2, PP 2, MBS 1: s b h_ffn / t = 8192 x 14336 / 2 per layer
    (["--tp", "2", "--pp", "2", "--mbs", "1"], 2, 1, [16 * 2, 16 * 1]),
    # TP 2 without sequence parallelism: FC1's output is [s, b, 2 h_ffn / t] either way
    (["--tp", "2", "--pp", "2", "--mbs", "1", "--no-sequence-parallel"], 2, 1, [16 * 2, 16 * 1]),
    # TP 4, CP 2, MBS 2: split over t c = 8, two sequences
    (["--tp", "4", "--cp", "2", "--pp", "1", "--mbs", "2"], 4 * 2, 2, [32 * 1]),
])
def test_each_stage_keeps_the_unfused_term_per_layer_and_microbatch_in_flight(advisor, layout, tc, b, held):
    plain = _stages(advisor, *layout)[0]
    unfused, _, row = _stages(advisor, *layout, UNFUSED)
    per_layer = 2 * 8192 * b * 14336 / tc  # 2 s b h_ffn / (t c)
    # held: layers x microbatches in flight; Llama 3.1 8B at PP 2 has 16 layers a stage, and 1F1B
    # holds p - i microbatches on stage i (2 on the first, 1 on the last); at PP 1, 32 layers, one
    assert [after - before for before, after in zip(plain, unfused)] == pytest.approx(
        [layers * per_layer for layers in held], rel=1e-9)
    assert row["options"] == {"bias_swiglu_fusion": False, **({"sequence_parallel": False}
                                                              if "--no-sequence-parallel" in layout else {})}
    assert UNFUSED in row["megatron_args"]


def test_the_calibrated_usage_grows_by_the_measured_two_elements_times_the_allocator_factor(advisor):
    # PP 1, TP 2 (SP): 32 layers, one microbatch in flight. Eq. 18 grows by 32 x 2 s b h_ffn / t (3.5
    # GiB); the calibrated model, which took 2 s b h_ffn off Eq. 12 for the fused kernel, takes nothing
    # off the eager one's 5 elements: it grows by 32 x 4 s b h_ffn / t (7.0 GiB) times its activation factor
    from advisor.throughput.calibration import load_memory_calibration

    factor = load_memory_calibration().activation_factor
    plain, plain_usage, _ = _stages(advisor, "--tp", "2", "--pp", "1", "--mbs", "1")
    unfused, unfused_usage, _ = _stages(advisor, "--tp", "2", "--pp", "1", "--mbs", "1", UNFUSED)
    assert (unfused[0] - plain[0]) / GIB == pytest.approx(32 * 2 * 8192 * 14336 / 2 / GIB, rel=1e-12) == 3.5
    assert unfused_usage - plain_usage == pytest.approx(factor * 32 * 4 * 8192 * 14336 / 2 / GIB, rel=1e-9)
    assert 32 * 4 * 8192 * 14336 / 2 / GIB == 7.0


def test_a_recomputed_mlp_keeps_none_of_it_and_fp8_keeps_it_in_bf16(advisor):
    base = ["--tp", "2", "--pp", "1", "--mbs", "1"]
    selective = [*base, "--recompute", "selective", "--recompute-modules", "mlp"]
    assert _stages(advisor, *selective)[:2] == _stages(advisor, *selective, UNFUSED)[:2]
    # FP8 GEMMs: Transformer Engine casts only FC2's own input; the extra tensor stays BF16
    fp8 = [*base, "--fp8-format", "hybrid"]
    plain, unfused = _stages(advisor, *fp8)[0], _stages(advisor, *fp8, UNFUSED)[0]
    assert unfused[0] - plain[0] == pytest.approx(32 * 2 * 8192 * 14336 / 2, rel=1e-12)


def test_the_calibrated_model_corrects_only_the_fused_count():
    from advisor.memory_terms import swiglu_fusion_fraction

    layer = eq.layer_activation_bytes(SPEC, 1, 1)  # Eq. 12 per token, bytes
    assert swiglu_fusion_fraction(SPEC) == pytest.approx(1 - 2 * SPEC.ffn_hidden_size / layer)
    assert swiglu_fusion_fraction(SPEC, bias_swiglu_fusion=False) == 1.0
    assert swiglu_fusion_fraction(SPEC, frozenset({"mlp"}), bias_swiglu_fusion=False) == 1.0


def test_the_fused_correction_leaves_unfused_attentions_scores_whole(advisor):
    # Llama-3.1-8B (h 4096, a 32, k 8, d 128, h_ffn 14336) per token: Eq. 12 is h (12 + 4k/a) + 8 h_ffn
    # = 4096 x 13 + 114,688 = 167,936 bytes, of which the fused SwiGLU keeps 2 h_ffn = 28,672 fewer
    # (0.1707 = 7/41). Unfused core attention keeps 2 a s + 4 (a - k) d more a token at s 4096
    # (262,144 + 12,288), which the fusion does not touch: the share kept is 1 - 28,672 / 442,368
    # (0.9352), not 1 - 28,672 / 167,936 applied to the scores too (which took 17% off them).
    from advisor.memory_terms import swiglu_fusion_fraction

    assert eq.layer_activation_bytes(SPEC, 1, 1) == 167_936
    assert swiglu_fusion_fraction(SPEC, unfused_attention_seq_len=4096) == pytest.approx(1 - 28_672 / 442_368,
                                                                                         rel=1e-12)
    # a whole estimate: PP 1, TP 1, MBS 1, seq 4096, 32 layers, one microbatch in flight. Without
    # FlashAttention the analytic peak grows by the unfused attention's bytes (32 x 2.1 GiB), and
    # the calibrated usage by its activation factor times Eq. 12's kept share's change plus them,
    # and by the data loader's bool mask, which unfused attention reads (b s^2 (1 + 1/c), unscaled)
    from advisor.throughput.calibration import load_memory_calibration

    factor = load_memory_calibration().activation_factor
    layout = ["--tp", "1", "--pp", "1", "--mbs", "1", "--seq-len", "4096"]
    flash, flash_usage, _ = _stages(advisor, *layout)
    plain, plain_usage, _ = _stages(advisor, *layout, "--no-flash-attn")
    scores = 32 * (2 * 32 * 4096**2 + 4 * 4096 * (32 - 8) * 128)
    eq12 = 32 * 167_936 * 4096
    assert plain[0] - flash[0] == pytest.approx(scores, rel=1e-12)
    kept_flash, kept_plain = eq12 - 32 * 28_672 * 4096, eq12 + scores - 32 * 28_672 * 4096
    mask = 4096**2 * (1 + 1)
    assert (plain_usage - flash_usage) * GIB == pytest.approx(factor * (kept_plain - kept_flash) + mask, rel=1e-9)


def test_the_time_model_prices_the_three_eager_kernels_by_hand():
    # fused: read 2 f, write f; eager: SiLU (read f, write f), + 0.0 (read f, write f), product (read 2 f, write f)
    f = SPEC.ffn_hidden_size
    assert terms.swiglu_elements(f) == 3 * f
    assert terms.swiglu_elements(f, False) == (2 + 2 + 3) * f
    tokens, tp = 8192, 2
    gap = terms.layer_elementwise_bytes(SPEC, tokens, tp, False) - terms.layer_elementwise_bytes(SPEC, tokens, tp)
    assert float(gap) == 2 * 4 * f * tokens / tp  # 469,762,048 bytes forward per layer and microbatch


def test_the_step_time_grows_by_the_extra_traffic_forward_and_backward(advisor):
    # PP 1, TP 2, DP 4, gbs 1024: 256 microbatches of 32 layers; each moves 2 x 4 f x 8192 / 2 bytes
    # more forward and twice that backward (the model's backward for every element-wise kernel)
    from advisor.throughput.calibration import load_calibration
    from advisor.hardware import get_gpu
    from advisor.throughput.terms import Rates

    rates = Rates.of(get_gpu("h100-80gb"), load_calibration())
    args = ["estimate", "--gpus", "8", "--gpu", "h100-80gb", "--tp", "2", "--pp", "1", "--mbs", "1"]
    plain, unfused = advisor.json(*args), advisor.json(*args, UNFUSED)
    per_layer = 3 * 2 * 4 * 14336 * 8192 / 2
    expected = 256 * 32 * per_layer / rates.hbm_bytes_per_s
    assert unfused["time_parts"]["compute_s"] - plain["time_parts"]["compute_s"] == pytest.approx(expected, rel=1e-9)


def test_the_flag_is_emitted_only_when_set_and_reads_back():
    default = TrainingOptions()
    assert UNFUSED not in training_args(default, tp=2)
    unfused = default.with_(bias_swiglu_fusion=False)
    written = training_args(unfused, tp=2)
    assert written.count(UNFUSED) == 1
    for release in ("0.15", "0.19"):
        assert parse_training_args([*written, "--tensor-model-parallel-size", "2"], release) == (unfused, [])
    assert parse_training_args(["--bf16", UNFUSED], "0.15")[0].fusions.bias_swiglu_fusion is False
    assert UNFUSED in changed_args(unfused) and UNFUSED not in changed_args(default)
    assert TrainingOptions.from_dict(unfused.changed()) == unfused


def test_a_command_with_the_flag_is_priced_not_named(advisor, tmp_path):
    command = tmp_path / "cmd.sh"
    line = ("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 "
            "--num-attention-heads 32 --group-query-attention --num-query-groups 8 --seq-length 8192 "
            "--max-position-embeddings 8192 --normalization RMSNorm --swiglu --position-embedding-type rope "
            "--disable-bias-linear --untie-embeddings-and-output-weights --tensor-model-parallel-size 2 "
            "--micro-batch-size 1 --global-batch-size 64 --bf16 --use-distributed-optimizer "
            "--vocab-size 128256 --tokenizer-type NullTokenizer --mock-data")
    command.write_text(line + " " + UNFUSED + "\n")
    (tmp_path / "fused.sh").write_text(line + "\n")
    unfused = advisor.json("estimate", "--from-command", command, "--gpu", "h100-80gb")
    fused = advisor.json("estimate", "--from-command", tmp_path / "fused.sh", "--gpu", "h100-80gb")
    assert not any(UNFUSED in note for note in unfused["unpriced"])
    assert unfused["options"]["bias_swiglu_fusion"] is False and "bias_swiglu_fusion" not in fused["options"]
    assert UNFUSED in unfused["megatron_args"] and UNFUSED not in fused["megatron_args"]
    # without SP at TP 2 (the command sets none): still 2 s b h_ffn / t per layer, 32 layers, PP 1
    gap = unfused["stages"][0]["layer_activations_gib"] - fused["stages"][0]["layer_activations_gib"]
    assert gap * GIB == pytest.approx(32 * 2 * 8192 * 14336 / 2, rel=1e-12)
    line = advisor.error("estimate", "--from-command", command, "--gpu", "h100-80gb", UNFUSED)
    assert f"{UNFUSED} comes from the command" in line


@pytest.mark.parametrize("tag", ["core_v0.15.2", "core_v0.19.0"])
def test_megatron_builds_the_mlp_as_priced_from_the_launched_args(tag):
    """The real parse_args/validate_args and core_transformer_config_from_args (launch.megatron_check):
    the written list without the flag keeps Megatron's fused SwiGLU, with it the eager one."""
    from megatron_real import checkout, validate

    release = checkout(tag)  # skips without it
    base = ["--num-layers", "2", "--hidden-size", "256", "--ffn-hidden-size", "512", "--num-attention-heads", "4",
            "--seq-length", "128", "--max-position-embeddings", "128", "--micro-batch-size", "1",
            "--global-batch-size", "8", "--tensor-model-parallel-size", "1", "--mock-data", "--tokenizer-type",
            "NullTokenizer", "--vocab-size", "4096", "--no-rope-fusion", "--no-gradient-accumulation-fusion",
            "--swiglu", "--disable-bias-linear", "--normalization", "RMSNorm"]
    options = [TrainingOptions(), TrainingOptions().with_(bias_swiglu_fusion=False)]
    results = validate(release, [{"args": [*base, *training_args(o, tp=1)], "world_size": 8, "env": {}}
                                 for o in options])
    assert [result.get("error") for result in results] == [None, None]
    assert [result["derived"]["bias_activation_fusion"] for result in results] == [True, False]


TINY = ["--model", "llama3.1-8b", "--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128",
        "--num-attention-heads", "4", "--num-query-groups", "2", "--vocab-size", "4096", "--seq-len", "32",
        "--gbs", "4", "--tp", "1", "--pp", "1", "--cp", "1", "--mbs", "2", "--gpus", "1"]


def test_the_launch_refuses_the_flag_on_a_row_priced_fused(tmp_path):
    """The flag is decided (launch.arguments.MEMORY_FLAGS): after '--' on a row priced with the
    fused SwiGLU it would launch two more h_ffn tensors a layer than were priced, so it is the
    launcher's conflict, one line, exit 2, saying how to price it; on a row priced unfused the
    user's restatement agrees, and the row's own arguments say it once."""
    from conftest import Invoker
    from launch_support import launcher

    advisor = Invoker()
    fused, unfused = tmp_path / "fused.json", tmp_path / "unfused.json"
    advisor("estimate", *TINY, "--format", "json", "-o", fused)
    advisor("estimate", *TINY, UNFUSED, "--format", "json", "-o", unfused)
    line = launcher().error("args", "--from", fused, "--megatron-version", "0.15", "--", UNFUSED, "--lr", "1e-4")
    assert line == (f"Error: {UNFUSED} (after --) conflicts with the estimate ({fused}), which leaves {UNFUSED} "
                    f"unset (advisor estimate/sweep/profile plan {UNFUSED} prices the eager SwiGLU) (the input decides these; "
                    "change the input instead)"), line
    row = launcher()("args", "--from", unfused, "--megatron-version", "0.15", "--format", "json").stdout
    restated = launcher()("args", "--from", unfused, "--megatron-version", "0.15", "--format", "json", "--",
                          UNFUSED).stdout
    assert json.loads(row).count(UNFUSED) == 1
    # the user's arguments pass through unchanged (docs/launch.md), the row's flag once before them
    assert json.loads(restated) == [*json.loads(row), UNFUSED]


@pytest.mark.parametrize("tag", ["core_v0.15.2", "core_v0.19.0"])
def test_megatron_builds_the_launched_lists_as_priced(tag, tmp_path):
    """advisor-launch's lists (--mock-data, the CPU's flags after '--') for a row priced fused and
    one priced unfused, the latter also with the user's restatement: the real parse_args and
    validate_args accept each, and core_transformer_config_from_args derives the priced fusion."""
    from conftest import Invoker
    from launch_support import launcher
    from megatron_real import NO_TRANSFORMER_ENGINE, checkout, validate

    release = checkout(tag)  # skips without it
    advisor, lists = Invoker(), []
    for name, options, extras in (("fused", [], []), ("unfused", [UNFUSED], []), ("restated", [UNFUSED], [UNFUSED])):
        advisor("estimate", *TINY, *options, "--format", "json", "-o", tmp_path / f"{name}.json")
        lists.append(json.loads(launcher()("args", "--from", tmp_path / f"{name}.json", "--megatron-version", tag,
                                           "--mock-data", "--format", "json", "--", *NO_TRANSFORMER_ENGINE,
                                           *extras, "--train-iters", "2", "--lr", "1e-4").stdout))
    results = validate(release, [{"args": args, "world_size": 1, "env": {}} for args in lists])
    assert [result.get("error") for result in results] == [None, None, None]
    assert [result["derived"]["bias_activation_fusion"] for result in results] == [True, False, False]


def test_moe_experts_keep_three_more_h_moe_per_copy_and_shared_and_dense_mlps_two():
    """MoE: the routed experts' eager activation (experts.py bias_act_func, both releases) keeps the
    SiLU output, x_linear + 0.0 and their product (saved by the multiplication by the FP32 probs):
    3 h_moe / etp per token copy, BF16; moe_act's checkpoint keeps none. The shared experts and
    DeepSeek-V3's dense layers run mlp.py's glu: 2 of their widths per token, as a dense model."""
    from advisor.moe import memory as mm
    from advisor.moe import stage as st
    from advisor.moe.spec import PRESETS as MOE_PRESETS

    mixtral, dsv3 = MOE_PRESETS["mixtral-8x7b"], MOE_PRESETS["deepseek-v3"]
    copies, f = 8192, 14336  # Mixtral's h_moe, ETP 2
    gap = mm.expert_activation_bytes(mixtral, copies, 2, bias_swiglu_fusion=False) \
        - mm.expert_activation_bytes(mixtral, copies, 2)
    assert gap == copies * 2 * 3 * f / 2 == 352_321_536
    assert mm.expert_activation_bytes(mixtral, copies, 2, True, False) == mm.expert_activation_bytes(
        mixtral, copies, 2, True)
    # DeepSeek-V3 shared expert (f_s 2048), s 4096, b 1, TP 2, CP 2: 6 -> 10 s b f_s / (t c)
    assert mm.shared_expert_activation_bytes(dsv3, 4096, 1, 2, 2, False) == 10 * 4096 * 2048 / 4
    # its dense layers (h_ffn 18432), TP 1: 4 s h_ffn more; --recompute-modules mlp keeps none of it
    s, h_ffn = 4096, 18432
    dense = [st._dense_layer_activations(dsv3, s, 1, 1, 1, bias_swiglu_fusion=fused) for fused in (True, False)]
    assert dense[1] - dense[0] == 4 * s * h_ffn
    mlp = frozenset({"mlp"})
    assert st._dense_layer_activations(dsv3, s, 1, 1, 1, mlp, bias_swiglu_fusion=False) == \
        st._dense_layer_activations(dsv3, s, 1, 1, 1, mlp)


def test_an_moe_estimate_prices_and_writes_the_flag(advisor):
    # Mixtral 8x7B, s 4096, b 1, TP 2 (SP), EP 8, ETP 2, PP 4 (8 layers a stage): each rank routes
    # s b / t = 2048 tokens x top-2; balanced, its one expert gets 2048 x 2 x 8 / 8 = 4096 copies,
    # gathered over ETP 2: 8192 of h_moe / 2; 1F1B holds 4 - i microbatches on stage i
    args = ["estimate", "--model", "mixtral-8x7b", "--gpus", "64", "--tp", "2", "--pp", "4", "--ep", "8",
            "--etp", "2", "--mbs", "1", "--seq-len", "4096", "--gpu", "h100-80gb"]
    plain, unfused = advisor.json(*args), advisor.json(*args, UNFUSED)
    per_layer = 8192 * 2 * 3 * 14336 / 2
    gaps = [(b["layer_activations_gib"] - a["layer_activations_gib"]) * GIB
            for a, b in zip(plain["stages"], unfused["stages"])]
    assert gaps == pytest.approx([8 * (4 - i) * per_layer for i in range(4)], rel=1e-9)
    assert UNFUSED in unfused["megatron_args"] and UNFUSED not in plain["megatron_args"]
    assert unfused["step_time_s"] > plain["step_time_s"]


def test_moe_time_prices_the_eager_kernels_and_the_probs_weighting_by_hand():
    # routed: glu 7 f BF16 elements (14 f bytes) + the FP32 probs product (read 2 f, write 4 f bytes)
    # and its cast back (read 4 f, write 2 f bytes): 26 f bytes a copy, against the fused 3 f (6 f bytes)
    from advisor.moe.spec import PRESETS as MOE_PRESETS
    from advisor.moe.time import elementwise_bytes

    dsv3 = MOE_PRESETS["deepseek-v3"]
    tokens, tp, copies, etp = 4096.0, 2, 1000.0, 1
    fused = elementwise_bytes(dsv3, tokens, tp, copies, etp)
    eager = elementwise_bytes(dsv3, tokens, tp, copies, etp, False)
    assert eager[0] == fused[0]  # norms, residuals, RoPE: unchanged
    assert eager[1] - fused[1] == 2 * 4 * 18432 * tokens / tp  # dense MLP: 3 f -> 7 f elements
    assert eager[2] == 26 * 2048 * copies and fused[2] == 6 * 2048 * copies
    assert eager[3] - fused[3] == 2 * 4 * 2048 * tokens / tp  # shared expert, f_s 2048
