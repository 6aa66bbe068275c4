"""A dense model's selective recomputation of Megatron's --recompute-modules (core_attn, mlp,
layernorm), as the MoE models take the flag: what each module stops keeping and the forward it
runs again, against hand calculations from megatron-core's ``transformer_layer.py`` (core_v0.15.2
and core_v0.19.0), the modules Megatron refuses for a dense model, the flags the rows write and
their read-back from a command."""

import json

import pytest

from advisor.hardware import get_gpu
from advisor.memory import GIB, estimate_memory
from advisor.models import PRESETS
from advisor.options import TrainingOptions, parse_training_args, training_args
from advisor.parallel import ParallelConfig, Workload
from advisor.throughput import terms
from advisor.throughput.model import TimeModel

L70 = PRESETS["llama3.1-70b"]  # h 8192, a 64, k 8, h_ffn 28672, 80 layers
S = 8192
LAYOUT = ["--model", "llama3.1-70b", "--gpus", "64", "--gpu", "h100-80gb", "--tp", "8", "--pp", "4"]
LOCAL = {"transformer_impl": "local", "flash_attention": False, "dataloader_mask": "cached"}

# Stage 0 of TP 8, PP 4, DP 2, MBS 1 holds 20 layers and 4 microbatches in flight (1F1B): every
# per-token byte of a layer weighs 20 x 4 x 8192 tokens / TP 8 = 81,920 on one GPU (with SP).
# Eq. 12 per token: 12h + 4hk/a + 8h_ffn = 98,304 + 4,096 + 229,376 = 331,776 bytes.
WEIGHT = 20 * 4 * S // 8
# mlp (Transformer Engine's spec: the pre-MLP norm fused into linear_fc1, the checkpoint keeps its
# input, the norm's input): FC1's input 2h = 16,384 and the MLP's 8h_ffn = 229,376 per token go.
MLP_TE = 16_384 + 229_376
# layernorm with --transformer-impl local: the two norms' outputs, 2h each, 32,768 per token;
# with Transformer Engine's spec both norms are fused (IdentityOp): nothing is recomputed.
NORMS_LOCAL = 32_768


def _stage0(**training) -> float:
    options = TrainingOptions().with_(recompute="selective", **training).memory_options()
    result = estimate_memory(L70, ParallelConfig(tp=8, pp=4, dp=2), Workload(seq_len=S), options)
    return result.stages[0].layer_activations_bytes


def test_recomputed_modules_free_their_part_of_eq_12():
    plain = _stage0()
    assert plain - _stage0(recompute_modules=("core_attn", "mlp")) == WEIGHT * MLP_TE == 18.75 * GIB
    assert _stage0(recompute_modules=("layernorm",)) == plain  # both norms fused: nothing to free
    local = _stage0(**LOCAL)  # unfused attention: core_attn kept recomputed in each case
    assert local - _stage0(recompute_modules=("core_attn", "layernorm"), **LOCAL) == WEIGHT * NORMS_LOCAL == 2.5 * GIB
    # local, both: the norms' outputs and the MLP's 8h_ffn (the checkpoint's input is the freed norm output)
    assert local - _stage0(recompute_modules=("core_attn", "mlp", "layernorm"), **LOCAL) == WEIGHT * 262_144
    # mlp alone: core attention's s^2 scores (unfused) are kept again, 2as^2 b / t per layer and microbatch,
    # and K and V expanded from k = 8 to a = 64 heads of d = 128, 4 (a - k) d = 28,672 bytes per token
    scores = 20 * 4 * 2 * 64 * S * S // 8
    assert _stage0(recompute_modules=("mlp",), **LOCAL) - local == scores + WEIGHT * 28_672 - WEIGHT * 229_376


def test_with_fp8_the_recomputed_mlp_keeps_no_fp8_copies_either():
    fp8 = {"fp8_format": "hybrid"}  # delayed scaling: per-tensor scales, counted as no bytes
    # FP8 kept FC1's input in 1 byte (2h -> h) and FC2's (2h_ffn -> h_ffn): with the MLP recomputed
    # those savings go with the tensors, 2h + 8h_ffn - h - h_ffn = h + 7h_ffn = 208,896 bytes per token
    assert _stage0(**fp8) - _stage0(recompute_modules=("core_attn", "mlp"), **fp8) == WEIGHT * 208_896


def test_without_sequence_parallelism_the_freed_fc1_input_is_whole_on_each_rank():
    plain = _stage0(sequence_parallel=False)
    # 2h whole per TP rank, 8h_ffn split over TP 8: 20 x 4 x 8192 x (16,384 + 229,376 / 8) = 27.5 GiB
    assert plain - _stage0(sequence_parallel=False, recompute_modules=("core_attn", "mlp")) == 27.5 * GIB


def test_the_calibrated_share_is_of_what_eq_12_keeps_after_the_modules():
    from advisor import memory_terms

    # the recomputed MLP keeps none of the fused SwiGLU's tensors: Eq. 12 less the MLP is kept whole
    assert memory_terms.swiglu_fusion_fraction(L70, frozenset({"core_attn", "mlp"})) == 1.0
    # layernorm (local): (331,776 - 2 x 28,672 - 32,768) / (331,776 - 32,768)
    assert memory_terms.swiglu_fusion_fraction(L70, frozenset({"layernorm"}), fused_norms=False) \
        == pytest.approx(241_664 / 299_008)
    assert memory_terms.swiglu_fusion_fraction(L70, frozenset({"layernorm"})) == memory_terms.swiglu_fusion_fraction(L70)


def _backward(**training):
    options = TrainingOptions().with_(recompute="selective", **training)
    model = TimeModel(L70, get_gpu("h100-80gb"), S, 1024, options=options.time_options())
    return model, float(model.stage(8, 1, 1, 20, recompute="selective").backward)


def test_a_recomputed_mlp_runs_its_forward_again_in_the_backward():
    model, plain = _backward()
    _, mlp = _backward(recompute_modules=("core_attn", "mlp"))
    r = model.rates
    tokens, h, f = S, 8192, 28672
    fc1 = 2 * tokens * h * (2 * f / 8) / r.gemm_flops_per_s + r.gemm_latency_s
    fc2 = 2 * tokens * (f / 8) * h / r.gemm_flops_per_s + r.gemm_latency_s
    swiglu = 2 * 3 * f * tokens / 8 / r.hbm_bytes_per_s  # BF16: read 2 h_ffn, write h_ffn over TP
    # SP's all-gather before FC1 and reduce-scatter after FC2: [tokens, h] BF16 over 8 ranks on NVLink
    ring = 7 / 8 * 2 * tokens * h / r.nvlink_bytes_per_s + 7 * r.collective_latency_s
    assert mlp - plain == pytest.approx(20 * (fc1 + fc2 + swiglu + 2 * ring), rel=1e-12)
    # fused norms: Megatron recomputes nothing; and without core_attn, core attention is not run again
    assert _backward(recompute_modules=("core_attn", "layernorm"))[1] == plain
    attention, _ = terms.attention_time(L70, S, 1, 8, 1, r)
    assert plain - _backward(recompute_modules=("layernorm",))[1] == pytest.approx(20 * attention, rel=1e-12)


def test_local_norms_run_again_when_recomputed():
    model, plain = _backward(**LOCAL)
    _, norms = _backward(recompute_modules=("core_attn", "layernorm"), **LOCAL)
    # two RMSNorms, each reading and writing [tokens, h] BF16 split over TP 8
    assert norms - plain == pytest.approx(20 * 2 * 4 * 8192 * S / 8 / model.rates.hbm_bytes_per_s, rel=1e-12)


def test_estimate_prices_and_writes_the_modules(advisor):
    plain = advisor.json("estimate", *LAYOUT, "--recompute", "selective")
    mlp = advisor.json("estimate", *LAYOUT, "--recompute", "selective", "--recompute-modules", "core_attn",
                       "--recompute-modules", "mlp")
    assert plain["total_gib"] - mlp["total_gib"] == 18.75  # stage 0, the peak of both
    assert mlp["step_time_s"] > plain["step_time_s"]
    assert mlp["options"] == {"recompute": "selective", "recompute_modules": ["core_attn", "mlp"]}
    args = mlp["megatron_args"]
    at = args.index("--recompute-granularity")
    assert args[at:at + 5] == ["--recompute-granularity", "selective", "--recompute-modules", "core_attn", "mlp"]
    options = TrainingOptions.from_dict(mlp["options"])
    assert parse_training_args(args) == (options, [])


@pytest.mark.parametrize("modules, message", [
    (["moe_act"], "'moe_act in recompute_modules is only supported with moe_grouped_gemm.'"),
    (["moe"], "llama3.1-70b is dense, and Megatron recomputes it only in MoE layers"),
    (["shared_experts", "mlp"], "recomputes it only in MoE layers"),
    (["mla_up_proj"], "needs multi-latent attention, which llama3.1-70b does not have (megatron-core refuses it)"),
])
def test_modules_megatron_refuses_for_a_dense_model(advisor, modules, message):
    given = [word for module in modules for word in ("--recompute-modules", module)]
    assert message in advisor.error("estimate", *LAYOUT, "--recompute", "selective", *given)


def test_modules_need_selective_and_fp8_delayed_refuses_layernorm(advisor):
    assert "--recompute-modules needs --recompute selective (this estimate recomputes none)" in advisor.error(
        "estimate", *LAYOUT, "--recompute-modules", "mlp")
    assert "(this sweep recomputes full)" in advisor.error(
        "sweep", "--model", "llama3.1-8b", "--gpus", "8", "--mem", "80", "--recompute", "full",
        "--recompute-modules", "mlp")
    assert "megatron-core refuses them with delayed scaling" in advisor.error(
        "estimate", *LAYOUT, "--recompute", "selective", "--recompute-modules", "layernorm", "--fp8-format", "hybrid")


def test_sweep_selective_rows_carry_the_modules(advisor):
    rows = advisor.json("sweep", "--model", "llama3.1-70b", "--gpus", "64", "--gpu", "h100-80gb", "--recompute",
                        "selective", "--recompute-modules", "mlp", "--top", "3")
    assert rows and all(row["options"]["recompute_modules"] == ["mlp"] for row in rows)
    for row in rows:
        assert parse_training_args(row["megatron_args"]) == (TrainingOptions.from_dict(row["options"]), [])
    # searched (--recompute auto): selective rows join where the modules free memory (as without
    # FlashAttention), and carry them; the none and full rows do not
    rows = advisor.json("sweep", "--model", "llama3.1-70b", "--gpus", "64", "--gpu", "h100-80gb",
                        "--recompute-modules", "mlp", "--all")
    kinds = {(row["recompute"], tuple(row["options"].get("recompute_modules") or ())) for row in rows}
    assert kinds == {("none", ()), ("selective", ("mlp",)), ("full", ())}
    # the table's title says so, as it says every other option (it said nothing: audit)
    title = advisor("sweep", "--model", "llama3.1-70b", "--gpus", "64", "--gpu", "h100-80gb", "--recompute",
                    "selective", "--recompute-modules", "core_attn", "mlp", "--top", "3", "--wide").stdout
    assert "--recompute-modules core_attn mlp (selective rows)" in " ".join(title.split())


COMMAND = ("pretrain_gpt.py --num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672 --num-attention-heads 64 "
           "--group-query-attention --num-query-groups 8 --seq-length 8192 --max-position-embeddings 8192 "
           "--micro-batch-size 1 --global-batch-size 1024 --tensor-model-parallel-size 8 "
           "--pipeline-model-parallel-size 4 --vocab-size 128256 --bf16 --swiglu --normalization RMSNorm "
           "--position-embedding-type rope --untie-embeddings-and-output-weights --disable-bias-linear "
           "--attention-dropout 0 --hidden-dropout 0 --use-distributed-optimizer --sequence-parallel "
           "--recompute-granularity selective")


def test_a_dense_commands_modules_are_read_back_and_priced(advisor, tmp_path):
    plain, mlp = tmp_path / "plain.sh", tmp_path / "mlp.sh"
    plain.write_text(COMMAND + "\n")
    mlp.write_text(COMMAND + " --recompute-modules core_attn mlp\n")
    common = ["estimate", "--gpu", "h100-80gb", "--gpus", "64", "--format", "json", "--from-command"]
    read = advisor(*common, mlp)
    assert "--recompute-modules" not in read.stderr  # priced, not named as unpriced
    document, before = json.loads(read.stdout), json.loads(advisor(*common, plain).stdout)
    assert document["options"]["recompute_modules"] == ["core_attn", "mlp"]
    assert before["stages"][0]["layer_activations_gib"] - document["stages"][0]["layer_activations_gib"] == 18.75
    # the flag without selective: Megatron ignores it, and so does the price, saying so
    ignored = tmp_path / "ignored.sh"
    ignored.write_text(COMMAND.replace("--recompute-granularity selective", "") + " --recompute-modules mlp\n")
    result = advisor(*common, ignored)
    assert "--recompute-modules without --recompute-granularity selective" in result.stderr
    assert "recompute_modules" not in json.loads(result.stdout)["options"]


def test_a_dense_commands_refused_module_is_refused(advisor, tmp_path):
    path = tmp_path / "moe_act.sh"
    path.write_text(COMMAND + " --recompute-modules moe_act\n")
    assert "only supported with moe_grouped_gemm" in advisor.error(
        "estimate", "--gpu", "h100-80gb", "--gpus", "64", "--from-command", path)


def test_options_state_modules_once():
    assert TrainingOptions().with_(recompute="selective", recompute_modules=["core_attn"]).recomputation \
        .recompute_modules is None  # Megatron's default, one description
    options = TrainingOptions().with_(recompute="selective", recompute_modules=["mlp", "layernorm", "mlp"])
    assert options.recomputation.recompute_modules == ("mlp", "layernorm")
    args = training_args(options, tp=8)
    at = args.index("--recompute-modules")
    assert args[at:at + 3] == ["--recompute-modules", "mlp", "layernorm"]
    assert "--recompute-modules" not in training_args(options.with_(recompute="full"), tp=8)
