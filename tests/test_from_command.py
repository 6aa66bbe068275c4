"""``advisor estimate --from-command``: a sweep row's own flags read back give the row's memory
and time exactly, and real launch scripts read with every unpriced flag named."""

from __future__ import annotations

import json
import shlex
from functools import lru_cache
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from advisor.cli import cli
from advisor.options.flags import training_args
from advisor.releases import NEWEST

COMMANDS = Path(__file__).parent / "data" / "commands"
PRICED = ("total_gib", "model_states_gib", "activations_gib", "verdict", "usage_gib", "margin_gib", "step_time_s",
          "tflops_per_gpu", "layers_per_stage", "vpp", "recompute", "recompute_num_layers", "num_microbatches", "ep",
          "etp", "recompute_modules", "options", "capacity_factor", "pad_to_capacity", "dispatcher_sms")
SWEEPS = [  # (argv, vocabulary): every row of these is read back
    (["--gpus", "8", "--gpu", "h100-80gb"], 128256),
    (["--gpus", "64", "--gpu", "h100-80gb", "--model", "llama3.1-70b", "--seq-len", "4096", "--gbs", "256"], 128256),
    (["--gpus", "32", "--gpu", "a100-40gb", "--model", "llama3.1-8b", "--grad-dtype", "bf16", "--top", "40"], 128256),
    (["--gpus", "16", "--mem", "80", "--model", "llama3.1-8b", "--seq-len", "2048", "--gbs", "64"], 128256),
    # mixtures of experts (advisor.moe): EP, ETP, VPP, oom rows; FP8 and DeepSeek-V3's MTP module
    (["--gpus", "64", "--gpu", "h100-80gb", "--model", "mixtral-8x7b", "--seq-len", "4096", "--gbs", "256", "--all"],
     32000),
    (["--gpus", "256", "--gpu", "h100-80gb", "--model", "deepseek-v3", "--seq-len", "4096", "--gbs", "512",
      "--fp8-format", "hybrid", "--mtp-num-layers", "1", "--top", "40"], 129280),
    # the EP all-to-all overlapped (combined 1F1B) with the flex dispatcher, on 32 of its SMs
    (["--gpus", "16", "--gpu", "h100-80gb", "--model", "qwen3-30b-a3b", "--seq-len", "4096", "--gbs", "256",
      "--moe-token-dispatcher-type", "flex", "--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute",
      "--moe-deepep-num-sms", "32", "--top", "20"], 151936),
    # Megatron's defaults for the vocabulary's padding (128 x TP) and the data loader's mask, rebuilt
    (["--gpus", "32", "--gpu", "h100-80gb", "--model", "mixtral-8x7b", "--seq-len", "4096", "--gbs", "256",
      "--vocab-divisible-by", "128", "--dataloader-mask", "rebuilt", "--top", "20"], 32000),
    # the allgather dispatcher, the MoE block recomputed whole (--recompute-modules moe)
    (["--gpus", "32", "--gpu", "h100-80gb", "--model", "mixtral-8x7b", "--seq-len", "4096", "--gbs", "256",
      "--moe-token-dispatcher-type", "allgather", "--recompute", "selective", "--recompute-modules", "moe",
      "--all", "--top", "10"], 32000),
    # token dropping, padded to capacity (--moe-pad-expert-input-to-capacity) and not padded
    (["--gpus", "32", "--gpu", "h100-80gb", "--model", "mixtral-8x7b", "--seq-len", "4096", "--gbs", "256",
      "--moe-routing", "capacity", "--moe-expert-capacity-factor", "1.5", "--top", "10"], 32000),
    (["--gpus", "32", "--gpu", "h100-80gb", "--model", "mixtral-8x7b", "--seq-len", "4096", "--gbs", "256",
      "--moe-routing", "capacity", "--moe-expert-capacity-factor", "0.75", "--no-moe-pad-expert-input-to-capacity",
      "--top", "10"], 32000),
]


def invoke(argv: list[str], stdin: str | None = None) -> dict | list:
    result = CliRunner().invoke(cli, argv, input=stdin)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@lru_cache(maxsize=None)
def sweep_rows(index: int) -> list[dict]:
    argv, _ = SWEEPS[index]
    return invoke(["sweep", *argv, "--format", "json"])


@st.composite
def rows(draw):
    index = draw(st.sampled_from(range(len(SWEEPS))))
    return index, draw(st.sampled_from(sweep_rows(index)))


@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
@given(rows())
def test_every_sweep_row_reads_back_to_its_own_price(drawn):
    _reads_back(*drawn)


def test_rows_with_the_dispatchers_sms_read_back_to_their_price():
    index = next(i for i, (argv, _) in enumerate(SWEEPS) if "--moe-deepep-num-sms" in argv)
    rows = sweep_rows(index)
    assert {row["dispatcher_sms"] for row in rows} == {32}
    for row in rows[:3]:
        _reads_back(index, row)


def test_allgather_rows_recomputing_the_moe_block_read_back():
    index = len(SWEEPS) - 3
    rows = sweep_rows(index)
    assert {row["dispatcher"] for row in rows} == {"allgather"}
    assert any(row["recompute_modules"] == ["moe"] for row in rows)
    for row in rows[:3] + [row for row in rows if row["recompute_modules"] == ["moe"]][:2]:
        _reads_back(index, row)


@pytest.mark.parametrize("index", [len(SWEEPS) - 2, len(SWEEPS) - 1])
def test_token_dropping_rows_read_back_padded_or_not(index):
    rows = sweep_rows(index)
    assert {row["pad_to_capacity"] for row in rows} == {index == len(SWEEPS) - 2}
    for row in rows[:3]:
        _reads_back(index, row)


def _reads_back(index: int, row: dict) -> None:
    argv, vocab = SWEEPS[index]
    hardware = argv[argv.index("--gpu"):argv.index("--gpu") + 2] if "--gpu" in argv else ["--mem", "80"]
    flag = NEWEST.null_tokenizer_vocab_flag(vocab)  # the newest release's NullTokenizer rows, read back by default
    command = shlex.join(row["megatron_args"] + ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(flag)])
    estimate = invoke(["estimate", "--from-command", "-", "--gpus", str(row["gpus"]), *hardware, "--format", "json"],
                      stdin=command)
    assert {key: estimate.get(key) for key in PRICED} == {key: row.get(key) for key in PRICED}
    assert estimate["megatron_args"] == row["megatron_args"]
    assert estimate["unpriced"] == []


LAYERNORM_KEPT = "--normalization LayerNorm (Megatron's default: the command sets none; priced as RMSNorm)"
"""The scripts keep Megatron's default normalization (Llama 3's with 1p): said so, not as if they wrote it."""


def estimate_of(path: Path, *extra: str) -> tuple[dict, str]:
    result = CliRunner().invoke(cli, ["estimate", "--from-command", str(path), *extra, "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), result.stderr


def test_megatron_llama3_8b_fp8_example_reads_with_every_unpriced_flag_named():
    estimate, stderr = estimate_of(COMMANDS / "megatron_llama3_8b_h100_fp8.sh", "--gpu", "h100-80gb")
    # torchrun ${DISTRIBUTED_ARGS[@]}: --nproc_per_node $GPUS_PER_NODE (8) x --nnodes $NUM_NODES (1)
    assert (estimate["gpus"], estimate["tp"], estimate["cp"], estimate["pp"], estimate["dp"]) == (8, 1, 1, 1, 8)
    assert (estimate["mbs"], estimate["global_batch_size"], estimate["seq_len"]) == (1, 128, 8192)
    model = estimate["model"]
    assert (model["num_layers"], model["hidden_size"], model["ffn_hidden_size"], model["num_query_groups"]) == (
        32, 4096, 14336, 8)
    assert model["vocab_size"] == 128256  # core 0.19's NullTokenizer (the default release): --vocab-size as given
    assert model["rotary_base"] == 1000000 and not model["tie_embeddings"]
    options = estimate["options"]
    assert options["fp8_format"] == "hybrid" and options["fp8_param_gather"] and options["grad_reduce_dtype"] == "bf16"
    assert options["cross_entropy_fusion"] == "native"  # --cross-entropy-loss-fusion, Megatron's default kernel
    assert estimate["unpriced"] == [
        LAYERNORM_KEPT,
        "--empty-unused-memory-level (not known to the advisor)",
        "--fp8-amax-compute-algo (not known to the advisor)"]
    assert stderr.startswith("advisor estimate: not priced (they change memory or time): --normalization")
    # said where the estimate is made, not first at launch: advisor-launch refuses it without the opt-in
    assert stderr.rstrip().endswith("advisor-launch runs this estimate only with --launch-as-priced (it trains what "
                                    "was priced)")


def test_megatron_llama3_8b_fp8_example_on_core_0_15_has_its_null_tokenizers_extra_row():
    """core_v0.15.2's NullTokenizer adds an end-of-document row to --vocab-size; core_v0.19.0's does not."""
    estimate, _ = estimate_of(COMMANDS / "megatron_llama3_8b_h100_fp8.sh", "--gpu", "h100-80gb",
                              "--megatron-version", "0.15")
    assert estimate["model"]["vocab_size"] == 128257
    assert estimate["read_from"].endswith("vocabulary --vocab-size 128256 + 1 (NullTokenizer's end-of-document row "
                                          "on Megatron-LM core 0.15)")


def test_sweep_rows_read_back_on_core_0_15_with_its_null_tokenizer_flag():
    """A row priced for core 0.15 (its flags in that release's words: DeepEP's --moe-enable-deepep),
    launched there (--vocab-size V - 1), read with --megatron-version 0.15 gives the row's own
    price, as the newest release's row and flag do by default (``_reads_back``)."""
    from advisor.releases import RELEASES

    old = next(release for release in RELEASES if release.null_tokenizer_extra_rows)
    index = next(i for i, (argv, _) in enumerate(SWEEPS) if "qwen3-30b-a3b" in argv)
    argv, vocab = SWEEPS[index]
    row = invoke(["sweep", *argv, "--megatron-version", old.checked, "--format", "json"])[0]
    assert row["megatron_version"] == old.checked and "--moe-enable-deepep" in row["megatron_args"]
    tail = ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(old.null_tokenizer_vocab_flag(vocab))]
    command = shlex.join(row["megatron_args"] + tail)
    estimate = invoke(["estimate", "--from-command", "-", "--gpus", str(row["gpus"]), "--gpu", "h100-80gb",
                       "--megatron-version", old.checked, "--format", "json"], stdin=command)
    assert estimate["model"]["vocab_size"] == vocab
    assert {key: estimate.get(key) for key in PRICED} == {key: row.get(key) for key in PRICED}


def test_megatron_llama3_8b_bf16_example_runs_torch_distributed_run_and_skips_what_it_cannot_run():
    estimate, _ = estimate_of(COMMANDS / "megatron_llama3_8b_h200_bf16.sh", "--gpu", "h100-80gb")
    assert estimate["gpus"] == 8 and estimate["read_from"].startswith("megatron_llama3_8b_h200_bf16.sh: python+torchrun")
    assert estimate["model"]["vocab_size"] == 128256  # HuggingFaceTokenizer: the command's --vocab-size as given
    assert "--no-create-attention-mask-in-dataloader" in estimate["megatron_args"]
    assert estimate["unpriced"] == [LAYERNORM_KEPT, "--empty-unused-memory-level (not known to the advisor)",
                                    "$DTYPE_ARGS (a variable the script does not set: read as empty, as bash does; "
                                    "flags it may hold are not priced)"]


def test_megatron_gpt3_175b_example_names_what_a_llama_spec_cannot_say():
    from advisor.megatron_layout import read_layout
    from advisor.megatron_readback import model_spec, split_arguments, vocabulary
    from advisor.shell_command import read_command

    launch = read_command((COMMANDS / "megatron_gpt3_175b.sh").read_text())
    assert (launch.launcher, launch.world_size) == ("torchrun", 8)  # the script's one node; TP 8 x PP 16 needs 128
    parsed = split_arguments(launch.arguments)
    assert vocabulary(parsed.model) == (None, "not in the command")  # GPT-2 BPE files: the user gives it
    spec = model_spec(parsed.model, name="gpt3", vocab_size=50257)
    assert (spec.ffn_hidden_size, spec.num_query_groups, spec.tie_embeddings) == (4 * 12288, 96, True)
    assert read_layout(parsed.layout, 96).layers_per_stage == (6,) * 16
    # skipped as written, values and all (an estimate's 'not_launched'); $5 unset in the script
    assert {"--rampup-batch-size 16 16 5859375", "--data-path $5"} <= set(parsed.skipped)
    result = CliRunner().invoke(cli, ["estimate", "--from-command", str(COMMANDS / "megatron_gpt3_175b.sh"),
                                      "--gpus", "128", "--mem", "80"])
    assert result.exit_code == 2 and "--vocab-size N" in result.stderr and result.stderr.count("\n") == 1



def test_megatron_gpt3_175b_example_prices_fp16_gradients_as_megatron_reduces_them():
    """--fp16 without --accumulate-allreduce-grads-in-fp32: Megatron keeps and reduces the gradients
    in FP16 (``DistributedDataParallelConfig.grad_reduce_in_fp32`` stays False, so the grad buffer
    takes the parameters' dtype), 2 bytes each in memory, in the DP reduction and in the flags."""
    from advisor.options import TrainingOptions

    options = TrainingOptions().with_(params_dtype="float16", grad_reduce_dtype="fp16", distributed_optimizer=False,
                                      overlap_param_gather=False)
    older = {"params_dtype": "float16", "gradient_bytes": 2}  # a row written before grad_reduce_dtype existed
    assert TrainingOptions.from_dict(older).precision.grad_reduce_dtype == "fp16"
    assert (options.memory_options().gradient_bytes, options.time_options().grad_reduce_bytes) == (2, 2)
    args = training_args(options, tp=8)
    assert "--fp16" in args and "--accumulate-allreduce-grads-in-fp32" not in args
    result = CliRunner().invoke(cli, ["estimate", "--from-command", str(COMMANDS / "megatron_gpt3_175b.sh"),
                                      "--gpus", "1024", "--vocab-size", "50257", "--gpu", "h100-80gb",
                                      "--format", "json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["options"]["grad_reduce_dtype"] == "fp16" and report["step_time_s"] > 0
    # no distributed optimizer: 2-byte FP16 gradients, as many as the 2-byte FP16 weights, on every stage
    assert all(stage["gradients_gib"] == stage["weights_gib"] for stage in report["stages"])
    assert "--fp16" in report["megatron_args"] and "--accumulate-allreduce-grads-in-fp32" not in report["megatron_args"]
    # what a Llama-shaped spec cannot say about GPT-3 is named, not ignored
    assert any(item.startswith("no --swiglu") for item in report["unpriced"])
    assert LAYERNORM_KEPT in report["unpriced"]
    assert "--position-embedding-type learned_absolute (Megatron's default: the command sets none; priced as " \
        "RoPE)" in report["unpriced"]

README_TORCHRUN = r"""CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nproc-per-node 8 --standalone \
    -m launch.entry --megatron-lm Megatron-LM --profile-dir profiles/best -- \
    --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 \
    --group-query-attention --num-query-groups 8 --seq-length 8192 --max-position-embeddings 8192 \
    --normalization RMSNorm --norm-epsilon 1e-05 --swiglu --position-embedding-type rope \
    --rotary-base 500000 --use-rope-scaling --rope-scaling-factor 8 --attention-dropout 0 \
    --hidden-dropout 0 --disable-bias-linear --untie-embeddings-and-output-weights \
    --tensor-model-parallel-size 2 --context-parallel-size 1 --pipeline-model-parallel-size 1 \
    --micro-batch-size 1 --global-batch-size 1024 --bf16 --use-distributed-optimizer \
    --sequence-parallel --accumulate-allreduce-grads-in-fp32 --make-vocab-size-divisible-by 1 \
    --mock-data --tokenizer-type NullTokenizer --vocab-size 128255 --train-iters 20 --lr 3e-4
"""


def test_readme_launch_examples_read_back():
    """docs/launch.md: the torchrun dry run and the Slurm script (both as printed there)."""
    # both are written for the docs' core_v0.15.2 checkout, whose NullTokenizer adds a row
    version = ["--megatron-version", "0.15"]
    result = CliRunner().invoke(cli, ["estimate", "--from-command", "-", "--mem", "80", *version, "--format", "json"],
                                input=README_TORCHRUN)
    assert result.exit_code == 0, result.output
    estimate = json.loads(result.stdout)
    assert (estimate["gpus"], estimate["tp"], estimate["dp"], estimate["model"]["vocab_size"]) == (8, 2, 4, 128256)
    assert estimate["unpriced"] == []
    readme = (Path(__file__).parents[1] / "docs" / "launch.md").read_text()
    script = readme[readme.index("#!/bin/bash\n# Written by advisor-launch"):]
    script = script[:script.index("```")]
    result = CliRunner().invoke(cli, ["estimate", "--from-command", "-", "--mem", "80", *version, "--format", "json"],
                                input=script)
    assert result.exit_code == 0, result.output
    estimate = json.loads(result.stdout)
    # srun torchrun --nnodes 2 --nproc-per-node 4; the plan's layout 'E,t|t*2|t*3|t*2,L'
    assert (estimate["gpus"], estimate["pp"], estimate["layers_per_stage"]) == (8, 4, [1, 2, 3, 2])
    assert estimate["model"]["vocab_size"] == 4096 and estimate["unpriced"] == []


_MOE = "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 128 --seq-length 64 --micro-batch-size 1"


@pytest.mark.parametrize("text, error", [
    ("if true; then\n  torchrun pretrain_gpt.py --num-layers 2\nfi\n", "line 2: the launch command inside 'if'"),
    ("A=(--num-layers 2\n", "line 1: an unclosed quote or array"),
    ("torchrun a.py\ntorchrun b.py --x\n", "found 2 Megatron launches (lines 1, 2)"),
    ("echo hello\n", "found no Megatron launch"),
    ("srun bash -c \"torchrun --nproc-per-node 8 pretrain_gpt.py $ARGS\"\n",
     "(a launch inside a quoted string, as in bash -c \"...\", is not read: write the command itself)"),
    ("--num-layers $L --hidden-size 64 --num-attention-heads 4\n",
     "--num-layers is $L, a shell variable the script does not set: write its value in the command"),
    # the MoE flags (advisor.moe.readback)
    (f"{_MOE} --moe-router-topk --num-experts 8\n", "--moe-router-topk needs a value, and none follows it"),
    (f"{_MOE} --num-experts eight\n", "--num-experts must be an integer, got 'eight'"),
    (f"{_MOE} --num-experts 0\n", "--num-experts must be positive, got 0"),
    (f"{_MOE} --num-experts 8 --moe-router-topk-scaling-factor big\n",
     "--moe-router-topk-scaling-factor must be a number, got 'big'"),
    (f"{_MOE} --num-experts 8 --moe-layer-freq '[1,0]*2'\n", "only leading dense layers then MoE layers are priced"),
    (f"{_MOE} --encoder-seq-length 64\n", "--seq-length and --encoder-seq-length are both given"),
    (f"{_MOE} --num-experts 8 --moe-layer-freq 2\n", "--moe-layer-freq 2: an MoE layer every 2 layers is not priced"),
    (f"{_MOE} --num-experts 8 --moe-layer-freq '[0]+[1]*2'\n", "gives 3 layers; the model has 4"),
    (f"{_MOE} --num-experts 8 --moe-layer-freq '([0] + [1]*3)'\n", "Megatron takes only digits"),
    (f"{_MOE} --num-experts 8 --moe-layer-freq '[1]*9999999*9999999'\n", "over 100,000 layers"),
    (f"{_MOE} --num-experts 8 --moe-layer-freq '[1]*[2]'\n", "is not a list of 0s and 1s"),  # was a TypeError
    (f"{_MOE} --num-experts 8 --rope-type mrope\n", "--rope-type 'mrope' is not priced (rope or yarn)"),
    (f"{_MOE} --num-experts 8 --moe-router-score-function relu\n", "--moe-router-score-function 'relu' is not priced"),
    (f"{_MOE} --num-experts 8 --moe-token-dispatcher-type nccl\n",
     "--moe-token-dispatcher-type 'nccl' is not one of Megatron's"),
    (f"{_MOE} --num-experts 8 --moe-pad-expert-input-to-capacity\n",
     "--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor"),
    (f"{_MOE} --num-experts 8 --moe-grouped-gemm false\n",
     "--moe-grouped-gemm is a switch and takes no value, got 'false' (Megatron-LM refuses the command)"),
    (f"{_MOE} --no-overlap-p2p-communication 1\n",
     "--no-overlap-p2p-communication is a switch and takes no value, got '1' (Megatron-LM refuses the command)"),
    (f"{_MOE} --num-experts 8 --no-overlap-p2p-communication=true\n",
     "--no-overlap-p2p-communication is a switch and takes no value, got 'true' (Megatron-LM refuses the command)"),
    (f"{_MOE} --num-experts 8 --moe-token-dispatcher-type flex --moe-expert-capacity-factor 1 "
     "--moe-pad-expert-input-to-capacity\n", "the flex dispatcher's padding to capacity is not priced"),
    # at TP 1 Megatron turns SP off, then refuses the overlap: the read-back dropped it silently (audit)
    (f"{_MOE} --sequence-parallel --tp-comm-overlap\n", "--tp-comm-overlap needs TP > 1"),
    (f"{_MOE} --num-experts 8 --sequence-parallel --tp-comm-overlap\n", "--tp-comm-overlap needs TP > 1"),
    (f"{_MOE} --num-experts 8 --tp-comm-overlap\n", "--tp-comm-overlap needs --sequence-parallel"),
])
def test_what_cannot_be_read_is_refused_in_one_line(text, error):
    result = CliRunner().invoke(cli, ["estimate", "--from-command", "-", "--gpus", "1", "--mem", "80", "--vocab-size", "1000"],
                                input=text)
    assert result.exit_code == 2 and error in result.stderr and result.stderr.count("\n") == 1, result.output


def test_a_command_without_its_world_size_says_so_once():
    """'(the command gives no world size)' repeated the sentence it stood in."""
    result = CliRunner().invoke(cli, ["estimate", "--from-command", str(COMMANDS / "moe_deepseek_v3_megatron_fsdp_example.sh"),
                                      "--gpu", "h100-80gb", "--vocab-size", "32000"])
    assert result.exit_code == 2 and result.stderr == (
        "Error: --from-command moe_deepseek_v3_megatron_fsdp_example.sh: the command does not give its world size (no "
        "torchrun or srun in it): give --gpus N\n")
    srun = CliRunner().invoke(cli, ["estimate", "--from-command", "-", "--mem", "80", "--vocab-size", "1000"],
                              input=f"srun --nodes 2 python pretrain_gpt.py {_MOE}\n")
    assert srun.exit_code == 2 and srun.stderr == (
        "Error: --from-command stdin: the command does not give its world size (srun gives no --ntasks or "
        "--ntasks-per-node): give --gpus N\n")


@pytest.mark.parametrize("flags, line", [
    ("--tensor-model-parallel-size 0", "--tensor-model-parallel-size must be positive, got 0"),  # a value
    ("--kv-channels 0", "--kv-channels must be positive, got 0"),  # the model's, named by the file only once
    ("--tensor-model-parallel-size 3",  # the world size
     "the world size 8 (torchrun --nproc-per-node 8 x --nnodes 1) is not divisible by TP x CP x PP = 3 x 1 x 1 = 3: "
     "give --gpus N for the run you mean"),
    ("'unclosed", "line 1: an unclosed quote or array runs to the end of the text"),  # the shell's, as before
])
@pytest.mark.parametrize("command", ["estimate", "compare-log"])
def test_every_refusal_of_the_files_content_names_the_file_once(command, flags, line, tmp_path):
    """Only the shell reading's errors said which file ('--from-command train.sh: '); a value
    refused (TP 0) and a world size that does not divide named none (nor a missing input:
    tests/test_from_command_missing.py), and the model's (--kv-channels 0) named it bare ('train.sh: ').
    compare-log reads the same way."""
    script = tmp_path / "train.sh"
    script.write_text("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 2 --hidden-size 64 "
                      f"--num-attention-heads 4 --seq-length 128 --micro-batch-size 1 --vocab-size 1000 {flags}\n")
    (tmp_path / "train.log").write_text("")
    argv = (["estimate", "--from-command", str(script), "--mem", "80"] if command == "estimate"
            else ["compare-log", str(tmp_path / "train.log"), "--from-command", str(script)])
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 2 and result.stderr == f"Error: --from-command train.sh: {line}\n", result.output


@pytest.mark.parametrize("setting, shown", [
    ("", "$EP, a shell variable the script does not set"),
    ("EP=$(nproc)\n", "$(nproc), a command substitution the advisor does not run"),
    ("EP=$((GPUS/8))\n", "$((GPUS/8)), shell arithmetic the advisor does not evaluate"),
    ("EP=`nproc`\n", "`nproc`, a command substitution the advisor does not run"),
])
def test_an_unexpanded_value_is_named_as_the_script_writes_it(setting, shown):
    """Error: --expert-model-parallel-size must be an integer, got '\\x00EP\\x00'."""
    result = CliRunner().invoke(cli, ["estimate", "--from-command", "-", "--gpus", "8", "--mem", "80", "--vocab-size",
                                      "1000"], input=f"{setting}{_MOE} --num-experts 8 --expert-model-parallel-size $EP\n")
    assert result.exit_code == 2 and result.stderr == (
        f"Error: --from-command stdin: --expert-model-parallel-size is {shown}: write its value in the command\n")


def test_slurm_world_size_and_shell_expansion():
    from advisor.shell_command import read_command

    text = ("#SBATCH --nodes=4\n#SBATCH --ntasks-per-node=8\nTP=4  # tensor\nARGS=\"--tensor-model-parallel-size $TP\"\n"
            "EXTRA=(--seq-length ${SEQ:-4096} '--lr' \"3e-4\")\n"
            "srun --kill-on-bad-exit=1 -l python -u pretrain_gpt.py $ARGS \"${EXTRA[@]}\" 2>&1 | tee log\n")
    launch = read_command(text)
    assert (launch.launcher, launch.world_size) == ("srun", 32)  # #SBATCH 4 nodes x 8 tasks
    assert launch.arguments == ("--tensor-model-parallel-size", "4", "--seq-length", "4096", "--lr", "3e-4")


def test_gpu_hour_price_turns_the_token_budget_into_a_cost():
    estimate = invoke(["estimate", "--tp", "2", "--gpus", "8", "--gpu", "h100-80gb", "--tokens", "1T",
                       "--gpu-hour-price", "2.5", "--format", "json"])
    gpu_hours = 1e12 / estimate["tokens_per_s"] / 3600 * 8  # the budget's seconds on all 8 GPUs
    assert estimate["gpu_hours"] == pytest.approx(gpu_hours, rel=1e-12)
    assert estimate["cost_usd"] == estimate["gpu_hours"] * 2.5
    rows = invoke(["sweep", "--gpus", "8", "--gpu", "h100-80gb", "--tokens", "1T", "--gpu-hour-price", "2",
                   "--top", "3", "--format", "json"])
    assert [row["cost_usd"] for row in rows] == [row["gpu_hours"] * 2 for row in rows]
    result = CliRunner().invoke(cli, ["estimate", "--gpus", "8", "--gpu", "h100-80gb", "--gpu-hour-price", "2"])
    assert result.exit_code == 2 and "--gpu-hour-price needs --tokens" in result.stderr


def test_a_comment_with_an_apostrophe_inside_an_array_is_a_comment():
    """Bash ends a word-starting '#' comment at the line's end inside an array literal too, so its
    apostrophe opens no quote (the Slurm script's own comment, "Slurm's SIGTERM ...", did)."""
    from advisor.shell_command import read_command

    script = "args=(\n    --num-layers 2\n    # Slurm's SIGTERM: save, then exit\n    --hidden-size 64\n)\n" \
             "torchrun --nproc-per-node 1 pretrain_gpt.py \"${args[@]}\"\n"
    assert read_command(script).arguments == ("--num-layers", "2", "--hidden-size", "64")


def test_a_capacity_factor_without_the_pad_is_priced_unpadded():
    """--moe-expert-capacity-factor alone drops tokens but pads nothing (megatron-core
    ``moe_utils.apply_router_token_dropping``: the routing map AND the capacity mask): the same
    command priced as the advisor's unpadded capacity row, and with the pad flag as its padded one."""
    argv, _ = SWEEPS[-2]  # capacity 1.5, padded
    row = sweep_rows(len(SWEEPS) - 2)[0]
    assert row["pad_to_capacity"] is True and "--moe-pad-expert-input-to-capacity" in row["megatron_args"]
    dropped = [arg for arg in row["megatron_args"] if arg != "--moe-pad-expert-input-to-capacity"]
    common = ["estimate", "--from-command", "-", "--gpus", str(row["gpus"]), "--gpu", "h100-80gb", "--format", "json"]
    tail = ["--tokenizer-type", "NullTokenizer", "--vocab-size", "31999"]
    unpadded = invoke(common, stdin=shlex.join(dropped + tail))
    asked = invoke(["estimate", *argv[:argv.index("--top")], "--no-moe-pad-expert-input-to-capacity",
                    *(f"--{key}={row[key]}" for key in ("tp", "cp", "pp", "ep", "etp", "mbs", "vpp")),
                    "--format", "json"])
    assert unpadded["pad_to_capacity"] is False and unpadded["megatron_args"] == dropped
    assert {key: unpadded.get(key) for key in PRICED} == {key: asked.get(key) for key in PRICED}
    # factor 1.5 > 1: unpadded, every routed copy fits, so less memory and time than padded
    assert unpadded["activations_gib"] < row["activations_gib"] and unpadded["step_time_s"] < row["step_time_s"]


# --- published MoE launch scripts (issues 21 and 22) -------------------------------------------

_H100 = ("--gpu", "h100-80gb")


def _same_price(command: Path, extra: tuple[str, ...], preset: list[str]) -> dict:
    """The command's estimate, checked equal in every priced key to the preset model's estimate
    with the layout and options written out by hand from the script (not read by the advisor)."""
    read, _ = estimate_of(command, *_H100, *extra)
    by_hand = invoke(["estimate", *preset, *_H100, "--format", "json"])
    assert {key: read.get(key) for key in PRICED} == {key: by_hand.get(key) for key in PRICED}
    return read


_ROUTER_BF16 = ("no --moe-router-dtype (priced as --moe-router-dtype fp32, as the advisor's rows run: FP32 router "
                "logits and probabilities, and the ETP combine's FP32 copy)")
"""Megatron's default router dtype (None: the activations' BF16), which the MoE model prices as FP32."""


def test_megatron_mixtral_example_reads_as_the_preset_with_only_its_router_dtype_unpriced():
    """examples/mixtral/train_mixtral_8x7b_distributed.sh: TP 1, PP 4, EP 8 on 8 nodes, alltoall,
    Megatron's defaults (vocabulary padded to 128, the mask built by the data loader, ETP = TP).
    --no-position-embedding (RoPE), --no-masked-softmax-fusion (Transformer Engine attention), the
    aux-loss type and coefficient change nothing and are read silently."""
    read = _same_price(COMMANDS / "moe_mixtral_8x7b_megatron_example.sh", ("--vocab-size", "32000"),
                       ["--model", "mixtral-8x7b", "--gpus", "64", "--tp", "1", "--pp", "4", "--ep", "8", "--etp", "1",
                        "--mbs", "1", "--gbs", "256", "--seq-len", "4096", "--recompute", "none",
                        "--vocab-divisible-by", "128", "--dataloader-mask", "cached", "--moe-token-dispatcher-type",
                        "alltoall", "--overlap-grad-reduce", "--overlap-param-gather", "--sequence-parallel"])
    assert (read["gpus"], read["dp"], read["ep"], read["etp"], read["layers_per_stage"]) == (64, 16, 8, 1, [8] * 4)
    assert read["unpriced"] == [_ROUTER_BF16]  # the example sets no router dtype


def test_megatron_moe_guide_mixtral_prices_its_fused_permutation_and_names_only_its_router_dtype():
    """megatron-core's MoE guide's Mixtral example (32 GPUs, 8 layers per virtual stage: VPP 1), with
    Transformer Engine's fused permutation (--moe-permute-fusion, priced)."""
    read = _same_price(COMMANDS / "moe_mixtral_8x7b_moe_guide.sh", ("--vocab-size", "32000"),
                       ["--model", "mixtral-8x7b", "--gpus", "32", "--tp", "1", "--pp", "4", "--ep", "8", "--etp", "1",
                        "--mbs", "1", "--gbs", "128", "--seq-len", "4096", "--recompute", "none",
                        "--vocab-divisible-by", "128", "--dataloader-mask", "cached", "--moe-token-dispatcher-type",
                        "alltoall", "--overlap-grad-reduce", "--overlap-param-gather", "--sequence-parallel",
                        "--moe-permute-fusion"])
    assert (read["dp"], read["vpp"]) == (8, 1)
    assert read["unpriced"] == [_ROUTER_BF16]  # the guide sets no router dtype


_DSV3 = COMMANDS / "moe_deepseek_v3_megatron_fsdp_example.sh"
_DSV3_FSDP = ("--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params --no-gradient-accumulation-fusion "
              "--use-distributed-optimizer --calculate-per-token-loss --init-model-with-meta-device --ckpt-format "
              "fsdp_dtensor --fsdp-double-buffer --use-nccl-ub --megatron-fsdp-grad-comm-dtype bf16 "
              "--megatron-fsdp-main-grads-dtype bf16")
_DSV3_AS_FLAGS = ["--model", "deepseek-v3", "--gpus", "256", "--tp", "1", "--pp", "1", "--ep", "8", "--etp", "1",
                  "--mbs", "4", "--gbs", "2048", "--seq-len", "4096", "--recompute", "selective",
                  *[word for module in ("mlp", "moe", "mla_up_proj", "layernorm") for word in ("--recompute-modules", module)],
                  "--vocab-divisible-by", "3232", "--moe-token-dispatcher-type", "flex", "--mtp-num-layers", "1",
                  "--dataloader-mask", "off", "--overlap-grad-reduce", "--overlap-param-gather", "--sequence-parallel",
                  "--moe-permute-fusion", "--moe-flex-dispatcher-backend", "hybridep"]
"""Megatron-LM's DeepSeek-V3 example script (_DSV3) as the advisor's own flags, written out by hand."""


def test_megatron_deepseek_v3_example_reads_as_the_preset_and_is_called_oom_without_fsdp():
    """examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh with USE_MEGATRON_FSDP=0 on 256 GPUs
    (its sbatch leaves the nodes to the user): MLA with YaRN, which Megatron takes without
    --rope-type; sigmoid group-limited routing, HybridEP (the flex dispatcher), MTP 1, selective
    recomputation of four modules, MBS 4. PP 1 keeps every layer on every GPU; by hand, the routed
    experts alone: 58 MoE layers + 1 MTP layer, 256 / EP 8 = 32 experts each of 3 x 7168 x 2048
    weights, at 2 (BF16) + 4 (FP32 gradient) + 12 / 32 (Adam over the expert DP group, 256 / EP 8)
    bytes: 493.7 GiB, far past 80."""
    read = _same_price(_DSV3, ("--vocab-size", "129280", "--gpus", "256"),
                       _DSV3_AS_FLAGS)
    assert read["model"]["yarn"]["factor"] == 40.0 and read["model"]["first_dense_layers"] == 3
    assert read["stages"][0]["expert_states_gib"] == pytest.approx(59 * 32 * 3 * 7168 * 2048 * (2 + 4 + 12 / 32) / 2**30,
                                                                   rel=1e-12)
    assert read["verdict"] == "oom"
    assert read["unpriced"] == ["--moe-router-force-load-balancing (priced as balanced routing, which it forces)",
                                "--enable-experimental (experimental kernels, priced as the default ones)",
                                "--moe-flex-dispatcher-backend hybridep (HybridEP's all-to-all, priced as DeepEP's; "
                                "its own permutation at the HBM rate)"]
    assert read["flex_backend"] == "hybridep"


def test_megatron_deepseek_v3_example_with_its_default_fsdp_prices_as_the_advisor_flags(tmp_path):
    """The script's default branch (Megatron-FSDP, optim_grads_params, BF16 main gradients and their
    communication) was refused by name; it is priced since (advisor.moe.fsdp), the same in every
    priced key as the preset with those options written out by hand. Its --fsdp-double-buffer,
    --use-nccl-ub and --init-model-with-meta-device are named as not priced."""
    command = tmp_path / "dsv3_fsdp.sh"
    command.write_text(_DSV3.read_text().replace("python pretrain_gpt.py ${PRETRAIN_ARGS[@]}",
                                                 "python pretrain_gpt.py ${PRETRAIN_ARGS[@]} " + _DSV3_FSDP))
    read = _same_price(command, ("--vocab-size", "129280", "--gpus", "256"),
                       [*_DSV3_AS_FLAGS,
                        "--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params",
                        "--grad-dtype", "bf16", "--megatron-fsdp-grad-comm-dtype", "bf16"])
    assert read["options"]["fsdp_strategy"] == "optim_grads_params"
    assert {"--fsdp-double-buffer (not known to the advisor)", "--use-nccl-ub (not known to the advisor)"} <= set(
        read["unpriced"])


@pytest.mark.parametrize("dtype_flag, words", [
    ([], "does not price FP32 weights (no --bf16 or --fp16: Megatron's default params_dtype float32)"),
    (["--fp16"], "does not price --fp16 (FP16 weights)")])
def test_an_moe_command_without_bf16_is_refused_in_its_own_words(dtype_flag, words):
    """The command never wrote --params-dtype: it left out --bf16 (Megatron's FP32 weights) or gave
    --fp16, and the line says which."""
    index = next(i for i, (argv, _) in enumerate(SWEEPS) if "qwen3-30b-a3b" in argv)
    row = sweep_rows(index)[0]
    args = [word for word in row["megatron_args"] if word != "--bf16"] + dtype_flag
    result = CliRunner().invoke(cli, ["estimate", "--from-command", "-", "--gpus", str(row["gpus"]), *_H100,
                                      "--vocab-size", "151936"], input=shlex.join(args))
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and result.stderr.startswith("Error: ")
    assert words in result.stderr and "--params-dtype" not in result.stderr


def test_modelzoo_qwen3_30b_reads_as_the_preset_on_the_release_that_runs_it():
    """Megatron-MoE-ModelZoo's Qwen3-30B-A3B benchmark (32 GPUs, EP 8, Transformer Engine's
    cross-entropy): core_v0.19.0 refuses --cross-entropy-fusion-impl te, said in one line; on
    core_v0.15 it reads as the preset with the same options."""
    path = COMMANDS / "moe_qwen3_30b_a3b_modelzoo.sh"
    refused = CliRunner().invoke(cli, ["estimate", "--from-command", str(path), *_H100, "--vocab-size", "151936"])
    assert refused.exit_code == 2 and "--cross-entropy-fusion-impl te" in refused.stderr
    read = _same_price(path, ("--vocab-size", "151936", "--megatron-version", "0.15"),
                       ["--model", "qwen3-30b-a3b", "--gpus", "32", "--tp", "1", "--pp", "1", "--ep", "8", "--etp",
                        "1", "--mbs", "1", "--gbs", "256", "--seq-len", "4096", "--recompute", "none",
                        "--vocab-divisible-by", "1187", "--moe-token-dispatcher-type", "alltoall",
                        "--dataloader-mask", "off", "--overlap-grad-reduce", "--overlap-param-gather",
                        "--sequence-parallel", "--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te",
                        "--megatron-version", "0.15", "--moe-permute-fusion", "--moe-router-fusion"])
    assert read["unpriced"] == ["--moe-router-force-load-balancing (priced as balanced routing, which it forces)",
                                "--enable-experimental (experimental kernels, priced as the default ones)"]


def test_modelzoo_deepseek_v3_h100_fp8_reads_its_layout_and_names_the_optimizer_dtypes(tmp_path):
    """Megatron-MoE-ModelZoo's DeepSeek-V3 on 1,024 H100 (TP 2, PP 8, EP 64, FP8 blockwise,
    DeepEP with the all-to-all overlapped). Its layout 'Et|(tt|)*30mL' by hand: 32 chunks, VPP 4;
    rank 0 holds chunks 0, 8, 16, 24 (1 + 2 + 2 + 2 = 7 layers), rank 7 chunks 7, 15, 23, 31 (2 + 2 + 2
    + the MTP chunk's 0 = 6), the others 8. The precision-aware optimizer's BF16 moments are
    priced (FP8 blockwise: megatron-core's FP32 masters). Its sequence-level balancing loss
    (--moe-router-load-balancing-type seq_aux_loss, weight 1e-4) is the preset's (DeepSeek-V3's
    config.json: seq_aux true), at the script's weight (--moe-aux-loss-coeff 0.0001): the script is
    compared with it, and read without the loss (type none, the expert bias alone) prices fewer
    activations, its FP32 scores not kept (advisor.moe.memory.aux_loss_saved_bytes)."""
    script = COMMANDS / "moe_deepseek_v3_modelzoo_h100_fp8.sh"
    without_loss = tmp_path / script.name
    without_loss.write_text(script.read_text().replace("--moe-router-load-balancing-type seq_aux_loss",
                                                       "--moe-router-load-balancing-type none")
                            .replace("--moe-aux-loss-coeff 1e-4", ""))
    bias_only, _ = estimate_of(without_loss, *_H100, "--vocab-size", "129280")
    read = _same_price(script, ("--vocab-size", "129280"),
                       ["--model", "deepseek-v3", "--moe-aux-loss-coeff", "0.0001", "--gpus", "1024", "--tp", "2",
                        "--pp", "8", "--vpp", "4",
                        "--layers-per-stage", "7,8,8,8,8,8,8,6", "--ep", "64", "--etp", "1", "--mbs", "1", "--gbs",
                        "8192", "--seq-len", "4096", "--recompute", "selective", "--recompute-modules", "mla_up_proj",
                        "--recompute-modules", "mlp", "--vocab-divisible-by", "3232", "--moe-token-dispatcher-type",
                        "flex", "--mtp-num-layers", "1", "--dataloader-mask", "off", "--overlap-grad-reduce",
                        "--overlap-param-gather", "--sequence-parallel", "--cross-entropy-loss-fusion",
                        "--cross-entropy-fusion-impl", "native", "--fp8-format", "e4m3", "--fp8-recipe", "blockwise",
                        "--fp8-param-gather", "--delay-wgrad-compute", "--overlap-moe-expert-parallel-comm",
                        "--moe-permute-fusion", "--moe-router-fusion", "--use-precision-aware-optimizer",
                        "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"])
    assert (read["layers_per_stage"], read["vpp"], read["dp"]) == ([7, 8, 8, 8, 8, 8, 8, 6], 4, 64)
    assert read["unpriced"] == ["--enable-experimental (experimental kernels, priced as the default ones)",
                                "--moe-router-padding-for-fp8 (experts' tokens padded to 16/32, not priced)"]
    assert bias_only["unpriced"] == read["unpriced"] and bias_only["step_time_s"] == read["step_time_s"]
    assert bias_only["activations_gib"] < read["activations_gib"]


_SMALL = (f"{_MOE} --num-experts 8 --disable-bias-linear --swiglu --normalization RMSNorm "
          "--position-embedding-type rope --attention-dropout 0 --hidden-dropout 0 --bf16")


@pytest.mark.parametrize("flags, note", [
    ("--moe-router-pre-softmax --moe-router-bias-update-rate 1e-3 --mtp-loss-scaling-factor 0.1", None),
    # the z-loss is one logsumexp a token over the E-wide logits; both drop policies run one top-k
    ("--moe-z-loss-coeff 1e-3 --moe-token-drop-policy position --moe-expert-capacity-factor 1.0", None),
    ("--no-position-embedding --no-masked-softmax-fusion", None),
    ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep",
     "--moe-flex-dispatcher-backend hybridep (HybridEP's all-to-all, priced as DeepEP's; its own permutation at the "
     "HBM rate)"),
    ("--moe-flex-dispatcher-backend hybridep",
     "--moe-flex-dispatcher-backend hybridep (Megatron uses it only with the flex dispatcher)"),
    ("--moe-token-dispatcher-type flex --moe-enable-deepep --moe-deepep-num-sms 20", None),
    ("--moe-token-dispatcher-type flex --moe-deepep-num-sms 32", None),
    ("--moe-deepep-num-sms 32", "--moe-deepep-num-sms 32 without the flex dispatcher (Megatron ignores it)"),
    # with the alltoall dispatcher: megatron-core refuses it with allgather, Megatron's default (test_moe_cli.py);
    # priced (MoEOptions.shared_expert_overlap: its time beside the dispatch, its memory), so not named
    ("--moe-shared-expert-intermediate-size 64 --moe-shared-expert-overlap --moe-token-dispatcher-type alltoall",
     None),
    ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend ncclep",
     "--moe-flex-dispatcher-backend ncclep (NCCL's EP all-to-all, priced as DeepEP's; its own permutation at the HBM "
     "rate)"),
    ("--no-masked-softmax-fusion --transformer-impl local",
     ["--no-masked-softmax-fusion (megatron-core's own attention's softmax unfused, not priced)",
      "--transformer-impl local (megatron-core's own attention, unfused: priced as flash attention, which the "
      "MoE model assumes)"]),
])
def test_moe_flags_that_change_nothing_are_silent_and_the_rest_named(flags, note):
    # EP 2: the flex dispatcher needs EP x ETP > 1 (megatron-core's MoEFlexTokenDispatcher asserts it)
    estimate = invoke(["estimate", "--from-command", "-", "--gpus", "2", "--mem", "80", "--vocab-size", "1000",
                       "--format", "json"],
                      stdin=f"{_SMALL} --moe-grouped-gemm --moe-router-dtype fp32 --expert-model-parallel-size 2 {flags}\n")
    assert estimate["unpriced"] == (note if isinstance(note, list) else [note] if note else [])


@pytest.mark.parametrize("flags, sms", [
    ("--moe-token-dispatcher-type flex --moe-deepep-num-sms 32", 32),
    # core_v0.19.0's unified knob wins over the deprecated per-backend ones (HybridEP recipes give 32)
    ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep --moe-hybridep-num-sms 32", 32),
    ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-num-sms 24 --moe-deepep-num-sms 32", 24),
    ("--moe-token-dispatcher-type flex --moe-deepep-num-sms 32 --moe-hybridep-num-sms 32", 32),
    ("--moe-token-dispatcher-type flex", None),
])
def test_the_flex_dispatchers_sms_are_read_priced_and_written_back(flags, sms):
    estimate = invoke(["estimate", "--from-command", "-", "--gpus", "2", "--mem", "80", "--vocab-size", "1000",
                       "--format", "json"], stdin=f"{_SMALL} --moe-grouped-gemm --expert-model-parallel-size 2 {flags}\n")
    assert estimate["dispatcher_sms"] == sms
    args = estimate["megatron_args"]
    # written back in the words of the release priced, the newest: its unified flags, whatever the backend
    backend = "hybridep" if "hybridep" in flags.split("--moe-flex-dispatcher-backend ")[-1][:8] else "deepep"
    assert estimate["flex_backend"] == backend and not {"--moe-enable-deepep", "--moe-deepep-num-sms"} & set(args)
    assert args[args.index("--moe-flex-dispatcher-backend") + 1] == backend
    flag = "--moe-flex-dispatcher-num-sms"
    assert (args[args.index(flag) + 1] if flag in args else None) == (None if sms is None else str(sms))


@pytest.mark.parametrize("flags, error", [
    ("--moe-token-dispatcher-type flex --moe-deepep-num-sms 20 --moe-hybridep-num-sms 32",
     "--moe-deepep-num-sms 20 and --moe-hybridep-num-sms 32 conflict"),
    ("--moe-token-dispatcher-type flex --moe-deepep-num-sms 21", "DeepEP takes an even number of SMs"),
    ("--moe-token-dispatcher-type flex --moe-deepep-num-sms 132", "the GPU has 132 SMs"),
    ("--moe-enable-deepep", "--moe-enable-deepep needs --moe-token-dispatcher-type flex"),
    ("--moe-flex-dispatcher-backend ncclep", "--moe-flex-dispatcher-backend ncclep needs --moe-token-dispatcher-type"),
    ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend nvshmem", "'nvshmem' is not one of Megatron's"),
    ("--moe-token-dispatcher-type flex --moe-enable-deepep --moe-flex-dispatcher-backend hybridep",
     "only one backend"),
    ("--no-position-embedding --position-embedding-type learned_absolute", "Megatron refuses it"),
])
def test_backend_and_position_flags_megatron_refuses_are_refused_in_one_line(flags, error):
    text = f"{_SMALL} --moe-grouped-gemm {flags}\n"
    if "--position-embedding-type learned_absolute" in flags:
        text = text.replace("--position-embedding-type rope ", "")
    result = CliRunner().invoke(cli, ["estimate", "--from-command", "-", "--gpus", "1", "--mem", "80", "--vocab-size",
                                      "1000"], input=text)
    assert result.exit_code == 2 and error in result.stderr and result.stderr.count("\n") == 1, result.output


def test_compare_best_shows_the_memory_the_sweep_judged():
    # with --gpu the sweep judges the calibrated usage (its GiB column), not the analytic Eq. 18 total:
    # the best row's line quotes the number the sweep table shows, and says which run is slower
    best = invoke(["sweep", "--gpus", "8", "--gpu", "h100-80gb", "--format", "json"])[0]
    assert best["usage_gib"] > best["total_gib"]
    result = CliRunner().invoke(cli, ["estimate", "--tp", "2", "--pp", "1", "--gpus", "8", "--gpu", "h100-80gb",
                                      "--compare-best"], env={"COLUMNS": "200"})
    line = next(line for line in result.stdout.splitlines() if line.startswith("best sweep row"))
    assert f"{best['usage_gib']:.1f} GiB, {best['verdict']}" in line
    assert "x as long)" in line


_DENSE_8B = ("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 "
             "--num-attention-heads 32 --group-query-attention --num-query-groups 8 --seq-length 8192 "
             "--max-position-embeddings 8192 --swiglu --disable-bias-linear --normalization RMSNorm "
             "--position-embedding-type rope --untie-embeddings-and-output-weights --attention-dropout 0 "
             "--hidden-dropout 0 --bf16 --tensor-model-parallel-size 2 --sequence-parallel "
             "--use-distributed-optimizer --micro-batch-size 1 --global-batch-size 64 --vocab-size 128256")


def test_transformer_impl_local_is_priced_as_the_unfused_attention_it_builds():
    """megatron-core's local spec builds DotProductAttention (models/backends.py,
    LocalSpecProvider.core_attention), which computes every score: it was priced as flash
    attention where the unfused attention it runs is oom. Without --sequence-parallel, which the
    local spec's torch RMSNorm refuses (test_local_sequence_parallel)."""
    def estimate(flags):
        return invoke(["estimate", "--from-command", "-", "--gpu", "h100-80gb", "--format", "json"],
                      stdin=f"{_DENSE_8B.replace(' --sequence-parallel', '')} {flags}\n")

    local, unfused, flash = (estimate("--transformer-impl local"), estimate("--attention-backend unfused"),
                             estimate("--use-flash-attn"))
    assert local["step_time_s"] == unfused["step_time_s"]
    # The same attention, plus the input of the score product that megatron-core's DotProductAttention
    # keeps in its global memory buffer (equations.local_attention_buffer_bytes; Transformer Engine's
    # unfused backend allocates it per call): 2 b (a/t) s^2 = 2 x 1 x 16 x 8192^2 bytes = 2 GiB
    assert local["total_gib"] == unfused["total_gib"] + 2 * 1 * 16 * 8192**2 / 2**30 == unfused["total_gib"] + 2
    assert local["total_gib"] > flash["total_gib"] + 20 and local["verdict"] == "oom" != flash["verdict"]


def test_compare_best_against_a_layout_that_does_not_fit_is_no_speedup():
    """A command called oom has no step time to compare: its price is only what it would take if it
    fit, so the line says that instead of 'yours takes 0.8x as long' (which read as a win)."""
    from advisor.cli.from_command import comparison_line

    best = {"tp": 2, "cp": 1, "pp": 4, "dp": 8, "mbs": 1, "vpp": 1, "recompute": "none", "total_gib": 60.0,
            "usage_gib": 70.0, "verdict": "fits", "step_time_s": 5.0}
    for verdict in ("oom", "likely oom"):
        line = comparison_line(best, {"verdict": verdict, "step_time_s": 4.0}, 64)
        assert f"yours is called {verdict} (4.00 s only if it fit)" in line and "as long" not in line
    line = comparison_line(best, {"verdict": "likely fits", "step_time_s": 6.0}, 64)
    assert "(yours takes 1.20x as long)" in line and "yours is faster" not in line
    # a faster layout than the sweep's first row: the row is the simplest within the model's error
    line = comparison_line(best, {"verdict": "fits", "step_time_s": 4.8}, 64)
    assert "(yours takes 0.96x as long); yours is faster by the model, within the 6.9% inside which" in line
    line = comparison_line(best, {"verdict": "fits", "step_time_s": 4.0}, 64)  # 20% faster: not a tie
    assert line.endswith("; yours is faster by the model than every layout the sweep tried")


def test_the_flex_dispatcher_without_deepep_is_refused_where_the_release_asserts_it():
    """core_v0.15.2's MoEFlexTokenDispatcher asserts --moe-enable-deepep when it builds the layer;
    core_v0.19.0 takes DeepEP as the flex dispatcher's default backend."""
    command = f"{_SMALL} --moe-grouped-gemm --expert-model-parallel-size 2 --moe-token-dispatcher-type flex\n"
    base = ["estimate", "--from-command", "-", "--gpus", "2", "--mem", "80", "--vocab-size", "1000"]
    refused = CliRunner().invoke(cli, [*base, "--megatron-version", "0.15"], input=command)
    assert refused.exit_code == 2 and refused.output.count("\n") == 1
    assert "--moe-token-dispatcher-type flex needs --moe-enable-deepep on Megatron-LM core 0.15" in refused.output
    assert CliRunner().invoke(cli, [*base, "--megatron-version", "0.15"],
                              input=command.replace("\n", " --moe-enable-deepep\n")).exit_code == 0
    assert CliRunner().invoke(cli, base, input=command).exit_code == 0  # core 0.19


def test_an_unknown_flag_is_named_with_the_spelling_it_is_near():
    """A typo Megatron's argparse would refuse at start-up names the flag it is near; an MoE flag in a
    dense command (no --num-experts) says that it prices nothing there."""
    base = ["estimate", "--from-command", "-", "--gpus", "2", "--mem", "80", "--vocab-size", "1000", "--format",
            "json"]
    moe = invoke(base, stdin=f"{_SMALL} --moe-grouped-gemm --expert-model-parallel-size 2 --moe-permute-fusoin\n")
    assert "--moe-permute-fusoin (not known to the advisor; did you mean --moe-permute-fusion?)" in moe["unpriced"]
    assert not moe["permute_fusion"]
    dense = invoke(base, stdin=f"{_MOE} --bf16 --moe-router-fusion --use-distribued-optimizer --no-such-flag\n")
    assert dense["unpriced"][-3:] == [
        "--moe-router-fusion (a mixture-of-experts flag, and the command has no --num-experts: nothing it prices)",
        "--use-distribued-optimizer (not known to the advisor; did you mean --use-distributed-optimizer?)",
        "--no-such-flag (not known to the advisor)"]


def test_megatron_cores_own_modules_are_written_back_as_read(tmp_path):
    """--transformer-impl local is launched as it was read: the estimate's arguments and title say
    --transformer-impl local (megatron-core's own modules), not --attention-backend unfused, which
    would launch Transformer Engine's unfused backend instead; advisor-launch takes them so."""
    from launch_support import launcher

    stdin = f"{_MOE} --bf16 --vocab-size 1000 --transformer-impl local --attention-backend fused\n"
    estimate = invoke(["estimate", "--from-command", "-", "--gpus", "1", "--mem", "80", "--format", "json"],
                      stdin=stdin)
    args = estimate["megatron_args"]
    assert args[args.index("--transformer-impl") + 1] == "local" and "--attention-backend" not in args
    assert estimate["options"]["transformer_impl"] == "local" and not estimate["options"]["flash_attention"]
    table = CliRunner(env={"COLUMNS": "200"}).invoke(cli, ["estimate", "--from-command", "-", "--gpus", "1", "--mem",
                                                           "80"], input=stdin)
    assert "--transformer-impl local" in table.stdout.splitlines()[0]
    path = tmp_path / "estimate.json"
    path.write_text(json.dumps(estimate))
    # _MOE is priced otherwise (a GELU, LayerNorm network priced as SwiGLU, RMSNorm): launched as priced
    assert "--launch-as-priced" in launcher().error("args", "--from", path)
    priced = ("args", "--from", path, "--launch-as-priced")
    launched = json.loads(launcher()(*priced, "--format", "json").stdout)
    assert launched[launched.index("--transformer-impl") + 1] == "local"
    # decided: the plan's own modules are not swapped for Transformer Engine after '--'
    assert "conflicts with --transformer-impl local" in launcher().error(*priced, "--", "--transformer-impl",
                                                                        "transformer_engine")
    assert launcher()(*priced, "--", "--transformer-impl", "local")  # restated
    bogus = CliRunner().invoke(cli, ["estimate", "--from-command", "-", "--gpus", "1", "--mem", "80"],
                               input=stdin.replace("local", "inference_optimized"))
    assert bogus.exit_code == 2 and "--transformer-impl 'inference_optimized' is not priced" in bogus.output


def test_megatrons_own_flags_unknown_to_the_advisor_get_no_suggestion():
    """A flag of a release's own parser (advisor.megatron_flag_table) is not a typo, however near a
    flag the advisor reads: --no-data-sharding is not '--data-sharding', nor the hyphenated
    --override-opt-param-scheduler its underscored twin, nor the int --decoder-seq-length (the table
    writes it '--decoder-seq-length:int') '--encoder-seq-length'."""
    base = ["estimate", "--from-command", "-", "--gpus", "2", "--mem", "80", "--vocab-size", "1000", "--format",
            "json"]
    flags = ["--no-data-sharding", "--override-opt-param-scheduler", "--non-persistent-local-ckpt-dir", "x",
             "--decoder-seq-length", "4096"]
    read = invoke(base, stdin=f"{_MOE} --bf16 {' '.join(flags)}\n")
    notes = [note for note in read["unpriced"] if note.startswith(("--no-data-sharding", "--override-opt",
                                                                   "--non-persistent", "--decoder-seq-length"))]
    assert len(notes) == 4 and all("did you mean" not in note for note in notes), notes


def test_ranks_per_node_come_from_the_launcher(tmp_path):
    """torchrun --nproc-per-node 4 on 8-GPU nodes: TP 8 spans two nodes, its collectives over the
    network, as the command runs it; --gpus-per-node, given, decides instead, and a launcher that
    starts as many ranks as the preset's GPUs changes nothing."""
    from advisor.shell_command import read_command

    assert read_command("torchrun --nproc-per-node 4 --nnodes 4 pretrain_gpt.py --bf16").gpus_per_node == 4
    assert read_command("srun --nodes 2 --ntasks-per-node 8 python pretrain_gpt.py --bf16").gpus_per_node == 8
    assert read_command("torchrun --nproc-per-node $GPUS --nnodes 2 pretrain_gpt.py --bf16").gpus_per_node is None
    args = ("--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention "
            "--num-query-groups 8 --seq-length 8192 --max-position-embeddings 8192 --normalization RMSNorm --swiglu "
            "--position-embedding-type rope --disable-bias-linear --attention-dropout 0 --hidden-dropout 0 "
            "--untie-embeddings-and-output-weights --bf16 --use-distributed-optimizer --sequence-parallel "
            "--tensor-model-parallel-size 8 --micro-batch-size 1 --global-batch-size 64 --vocab-size 128256")
    steps = {}
    for per_node, nodes, extra in ((4, 4, ()), (8, 2, ()), (4, 4, ("--gpus-per-node", "8"))):
        path = tmp_path / f"run{per_node}.sh"
        path.write_text(f"torchrun --nproc-per-node {per_node} --nnodes {nodes} pretrain_gpt.py {args}\n")
        result = CliRunner().invoke(cli, ["estimate", "--from-command", str(path), *_H100, *extra, "--format", "json"])
        assert result.exit_code == 0, result.output
        steps[(per_node, extra)] = json.loads(result.stdout)
        assert ("priced at 4 GPUs per node" in result.stderr) == (per_node == 4 and not extra)
        if per_node == 4 and not extra:  # the note is held: a later error stays one line (it came first)
            refused = CliRunner().invoke(cli, ["estimate", "--from-command", str(path), *_H100, "--tokens", "15"])
            assert refused.exit_code == 2 and refused.stderr.startswith("Error: --tokens 15 is less than one step's")
            assert len(refused.stderr.splitlines()) == 1, refused.stderr
    across, within, decided = steps[(4, ())], steps[(8, ())], steps[(4, ("--gpus-per-node", "8"))]
    # the rows say what they were priced at: the command's 4, the preset's 8, --gpus-per-node's 8
    assert (across["gpus_per_node"], within["gpus_per_node"], decided["gpus_per_node"]) == (4, 8, 8)
    assert across["time_parts"]["tp_comm_s"] > 2 * within["time_parts"]["tp_comm_s"]
    assert decided["step_time_s"] == within["step_time_s"] and across["total_gib"] == within["total_gib"]


def test_a_commands_moe_is_priced_under_the_routing_given(tmp_path):
    """--moe-routing and --moe-imbalance are the advisor's assumptions, no Megatron flag's: given
    beside --from-command they price the command's MoE as the estimate it came from priced it
    (dropless read back as balanced was 97.7 GiB against 277.7)."""
    layout = ["--model", "qwen3-30b-a3b", "--gpus", "16", "--tp", "1", "--pp", "1", "--ep", "8", *_H100,
              "--format", "json"]
    for assumption in (["--moe-routing", "dropless"], ["--moe-imbalance", "1.3"]):
        estimate = CliRunner().invoke(cli, ["estimate", *layout, *assumption])
        assert estimate.exit_code == 0, estimate.output
        priced = json.loads(estimate.stdout)
        path = tmp_path / "run.sh"
        path.write_text("torchrun --nproc-per-node 8 --nnodes 2 pretrain_gpt.py " + shlex.join(priced["megatron_args"]))
        command = ["estimate", "--from-command", str(path), *_H100, "--vocab-size", "151936", "--format", "json"]
        plain, read = (json.loads(CliRunner().invoke(cli, [*command, *extra]).stdout) for extra in ([], assumption))
        assert (read["total_gib"], read["step_time_s"]) == (priced["total_gib"], priced["step_time_s"])
        assert (plain["total_gib"], plain["step_time_s"]) != (priced["total_gib"], priced["step_time_s"])
    dense = CliRunner().invoke(cli, ["estimate", "--from-command", str(COMMANDS / "megatron_gpt3_175b.sh"), "--gpus",
                                     "1024", "--vocab-size", "50257", "--moe-routing", "dropless"])
    assert dense.exit_code == 2 and "MoE options need a mixture-of-experts model: --moe-routing" in dense.stderr


@pytest.mark.parametrize("text, dense", [
    ("1", 0), ("[1]*4", 0), ("([0]+[1]*3)", 1), ("[0,0,1,1]", 2), ("[0]*2+[1]*2", 2), ("3*[0]+[1]", 3),
    ("([0]*1+[1]*(1+2))", 1),
])
def test_every_leading_dense_spelling_megatron_evaluates_is_read(text, dense):
    """--moe-layer-freq list forms are read as Megatron's ``_eval_pattern`` evaluates them (Python's
    own eval of the validated text is the oracle); before, only '([0]*k+[1]*n)' was read."""
    from advisor.moe.readback import first_dense_layers, layer_pattern

    assert first_dense_layers(text, 4) == dense
    if "[" in text:
        assert layer_pattern(text) == eval(text)  # noqa: S307 - Megatron's own reading of the same text
    result = CliRunner().invoke(cli, ["estimate", "--from-command", "-", "--gpus", "1", "--mem", "80", "--vocab-size",
                                      "1000", "--format", "json"], input=f"{_MOE} --bf16 --num-experts 8 --moe-layer-freq '{text}'\n")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["model"]["first_dense_layers"] == dense


def test_the_older_name_of_the_sequence_length_is_read():
    """--encoder-seq-length alone is --seq-length (validate_args copies it over); it was refused as
    a command without a sequence length."""
    command = _MOE.replace("--seq-length 64", "--encoder-seq-length 48") + " --bf16\n"
    result = CliRunner().invoke(cli, ["estimate", "--from-command", "-", "--gpus", "1", "--mem", "80", "--vocab-size",
                                      "1000", "--format", "json"], input=command)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["seq_len"] == 48


def test_what_is_not_priced_is_said_once_where_the_table_says_it():
    """The table's caption names what the command's estimate does not price; a note on stderr said
    it again in the same terminal. It stays on stderr beside JSON, and beside a table written to a file."""
    command = f"{_MOE} --bf16\n"  # GELU, LayerNorm, learned positions: named as not priced
    base = ["estimate", "--from-command", "-", "--gpus", "1", "--mem", "80", "--vocab-size", "1000"]
    table = CliRunner().invoke(cli, base, input=command)
    shown = CliRunner().invoke(cli, [*base, "--format", "json"], input=command)
    assert table.exit_code == shown.exit_code == 0
    assert "not priced (they change memory or time)" in table.stdout and "not priced" not in table.stderr
    assert "not priced (they change memory or time)" in shown.stderr


_ROPE = ("--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 4096 --swiglu --normalization RMSNorm "
         "--position-embedding-type rope --disable-bias-linear --attention-dropout 0 --hidden-dropout 0 "
         "--micro-batch-size 1 --bf16")


def test_a_commands_max_position_embeddings_is_launched_as_given(tmp_path):
    """--max-position-embeddings 40960 with --seq-length 4096 (Qwen3's context): with RoPE it builds
    no tensor, so it is priced as 4096 is, but Megatron saves it in the checkpoint and compares it
    when one is loaded (checkpointing.py, check_checkpoint_args), so the estimate's arguments and
    their launch carry 40960, not the sequence length; below --seq-length validate_args refuses it."""
    from launch_support import launcher

    base = ["estimate", "--from-command", "-", "--gpus", "1", "--mem", "80", "--vocab-size", "1000", "--format",
            "json"]
    longer = invoke(base, stdin=f"{_ROPE} --max-position-embeddings 40960\n")
    same = invoke(base, stdin=f"{_ROPE} --max-position-embeddings 4096\n")
    args = longer["megatron_args"]
    assert args[args.index("--max-position-embeddings") + 1] == "40960" and not longer["unpriced"]
    assert longer["model"]["max_position_embeddings"] == 40960
    assert [longer[key] for key in PRICED if key in same] == [same[key] for key in PRICED if key in same]
    # as long as the sequence: the field is left out and the launch writes the sequence length, as before
    assert "max_position_embeddings" not in same["model"]  # the sequence length: written as before
    assert same["megatron_args"][same["megatron_args"].index("--max-position-embeddings") + 1] == "4096"
    path = tmp_path / "estimate.json"
    path.write_text(json.dumps(longer))
    launched = json.loads(launcher()("args", "--from", path, "--format", "json").stdout)
    assert launched[launched.index("--max-position-embeddings") + 1] == "40960"
    refused = CliRunner().invoke(cli, base, input=f"{_ROPE} --max-position-embeddings 1024\n")
    assert refused.exit_code == 2 and refused.stderr.count("\n") == 1, refused.output
    assert "'max_position_embeddings (1024) must be greater than or equal to seq_length (4096)'" in refused.stderr
