"""Megatron-FSDP's main-weight and gradient-communication dtypes (core_v0.19.0's
--megatron-fsdp-main-params-dtype and --megatron-fsdp-grad-comm-dtype): priced, launched as
priced, read back as Megatron runs them, refused where core_v0.15.2 has no such flags.

What core_v0.19.0 does with them (megatron/core/distributed/fsdp/src/megatron_fsdp/):
- main params (default fp32): ``ParamAndGradBuffer._init_each_parameter_group_buffers`` makes
  the main weight buffer in that dtype, or none for 'auto' (None); the optimizer steps its
  shards, or the compute weights' shards (``_init_distributed_params``: 'mbuf -> wbuf'), sharded
  as the optimizer states. Transformer Engine's FusedAdam (no master weights: the precision-aware
  optimizer is not priced with FSDP) keeps FP32 moments whatever the parameter's dtype. So 12
  bytes a parameter before sharding with fp32, 10 with bf16/fp16, 8 with auto.
- grad comm (default auto: the main gradients' dtype): ``main_grad_getter`` and the reduce-scatter
  fetch the un-sharded gradient buckets with ``fetch_bucket(dtype=grad_comm_dtype if
  gbuf.is_data_distributed else None)``, so where the gradients are sharded (optim_grads,
  optim_grads_params) the queued buckets and the reduce-scatter are in that dtype, and the
  sharded main-gradient buffer stays in its own. Where they are not (no_shard, optim) another
  dtype makes an extra un-sharded copy of each bucket in the last microbatch's backward: not
  priced, refused.

Hand count, Llama 3.1 70B, TP 4, PP 4, DP 8, stage 0 (tests/test_option_states_70b_by_hand.py):
N = 4,541,186,048 parameters on a GPU, a layer 213,925,888; the heaviest stage for the time
model is the last, N + 8,192 (the final norm, whole on each TP rank) = 4,541,194,240 = P.
"""

from __future__ import annotations

import json
import shlex

import pytest
from launch_support import launcher

from advisor.hardware import get_gpu
from advisor.models import PRESETS
from advisor.options import TrainingOptions, parse_training_args, training_args
from advisor.options.flags import release_spelling
from advisor.releases import FSDP_GRAD_COMM, FSDP_MAIN_PARAMS
from advisor.throughput import TimeModel, load_calibration
from launch.megatron_versions import named

GIB = 2**30
N = 4_541_186_048
LAYER = 213_925_888
QUEUE = 1_000_000_000  # megatron_fsdp.py suggested_RS_queue_capacity
# optim_grads_params's un-sharded buckets queued at most, one per layer (memory_levers.fsdp_queued_units):
# the queue is trimmed to whole layers of at most QUEUE elements, floor(10^9 / 213,925,888) = 4 (855,703,552; 5 would be
# 1,069,629,440), then the layer just reduced joins it and the next fills its own: 6 of stage 0's 20.
QUEUED = (4 + 2) * LAYER  # 1,283,555,328
P = N + 8192  # the last stage's parameters: the time model's heaviest (module docstring)
LAYOUT = ["--model", "llama3.1-70b", "--tp", "4", "--pp", "4", "--dp", "8", "--mbs", "1", "--gbs", "512",
          "--gpu", "h100-80gb", "--format", "json"]
COMMAND = ["--num-layers", "80", "--hidden-size", "8192", "--ffn-hidden-size", "28672", "--num-attention-heads", "64",
           "--group-query-attention", "--num-query-groups", "8", "--seq-length", "8192",
           "--max-position-embeddings", "8192", "--micro-batch-size", "1", "--global-batch-size", "512",
           "--tensor-model-parallel-size", "4", "--pipeline-model-parallel-size", "4", "--swiglu",
           "--normalization", "RMSNorm", "--position-embedding-type", "rope", "--disable-bias-linear",
           "--untie-embeddings-and-output-weights", "--attention-dropout", "0", "--hidden-dropout", "0",
           "--make-vocab-size-divisible-by", "1", "--bf16", "--use-distributed-optimizer", "--use-megatron-fsdp"]
"""Llama 3.1 70B as a user's core-0.19 command gives it (the brief's torchrun line, read back)."""


def _from_command(advisor, args: list[str], release: str = "0.19", expect: int = 0):
    """``advisor estimate --from-command`` of a torchrun line with ``args`` on 128 GPUs."""
    line = shlex.join(["torchrun", "--nproc-per-node", "8", "pretrain_gpt.py", *args])
    result = advisor.runner.invoke(advisor.command, [
        "estimate", "--from-command", "-", "--gpus", "128", "--gpu", "h100-80gb", "--format", "json", "--vocab-size",
        "128256", "--megatron-version", release], input=line)
    assert result.exit_code == expect, result.output
    return result


@pytest.mark.parametrize("strategy, flags, gradients, optimizer", [
    # Megatron's defaults on 0.19: BF16 main gradients ('auto', the weights'), reduced in them
    ("optim_grads_params", [], 2 * N / 8 + 2 * QUEUED, 12 * N / 8),
    # FP32 communication: the queued un-sharded buckets in FP32, the shard still BF16
    ("optim_grads_params", [FSDP_GRAD_COMM, "fp32"], 2 * N / 8 + 4 * QUEUED, 12 * N / 8),
    # FP32 main gradients reduced in BF16: the shard FP32, the buckets BF16
    # (optim_grads: the command has no --overlap-grad-reduce, so the bucket size is None and the
    # stage's 20 layers and its embedding, 128,256 x 8,192 / 4 = 262,668,288, are one bucket, all
    # unsharded at once: memory_levers.fsdp_bucket_size, stage_ends; N is those, 20 x LAYER + it)
    ("optim_grads", ["--megatron-fsdp-main-grads-dtype", "fp32", FSDP_GRAD_COMM, "bf16"],
     4 * N / 8 + 2 * (20 * LAYER + 262_668_288), 12 * N / 8),
    # BF16 main weights: 2 + 8 bytes, sharded
    ("optim", [FSDP_MAIN_PARAMS, "bf16"], 2 * N, 10 * N / 8),
    # none: Adam's two FP32 moments only, of the BF16 weights' shards
    ("optim_grads_params", [FSDP_MAIN_PARAMS, "auto"], 2 * N / 8 + 2 * QUEUED, 8 * N / 8),
    # no_shard shards nothing: 10 bytes a parameter, whole
    ("no_shard", [FSDP_MAIN_PARAMS, "fp16"], 2 * N, 10 * N),
    # a communication dtype that is the main gradients' own: no other buffer (fetch_bucket)
    ("optim", [FSDP_GRAD_COMM, "bf16"], 2 * N, 12 * N / 8),
])
def test_a_core_019_command_is_priced_as_its_buffers_by_hand(advisor, strategy, flags, gradients, optimizer):
    read = json.loads(_from_command(advisor, [*COMMAND, "--data-parallel-sharding-strategy", strategy,
                                              *flags]).stdout)
    [stage, *_] = read["stages"]
    assert stage["parameters"] == N
    assert stage["gradients_gib"] * GIB == pytest.approx(gradients, rel=1e-12)
    assert stage["optimizer_gib"] * GIB == pytest.approx(optimizer, rel=1e-12)
    assert read["unpriced"] == []


def test_the_hand_counts_in_gib():
    """The numbers docs/options.md quotes, from the hand counts above."""
    assert [round(x / GIB, 2) for x in (2 * N / 8 + 2 * QUEUED, 2 * N / 8 + 4 * QUEUED,
                                        12 * N / 8, 10 * N / 8, 8 * N / 8)] == [3.45, 5.84, 6.34, 5.29, 4.23]


H100 = get_gpu("h100-80gb")


def _step(**changes):
    """The 70B step at TP 4, CP 1, PP 4, DP 8, MBS 1, VPP 1 with the DP overlap off (all exposed)."""
    options = TrainingOptions().with_(overlap_grad_reduce=False, overlap_param_gather=False, **changes)
    return TimeModel(PRESETS["llama3.1-70b"], H100, 8192, 512, options=options.time_options()).step(4, 1, 4, 8, 1)


def test_the_reduce_scatter_moves_the_communication_dtype():
    """optim_grads reduce-scatters each microbatch's gradients: 64 microbatches (512 / DP 8), each
    (n - 1)/n of P elements per rank over the DP group. FP32 main gradients reduced in BF16 move 2
    bytes fewer an element: 64 x 7/8 x 2P over the link (the latencies cancel). The group spans
    TP x DP = 32 GPUs, so the network, with the NICs of the 8 / TP = 2 group members in a node."""
    fsdp = dict(fsdp_strategy="optim_grads")
    fp32, bf16 = _step(**fsdp), _step(**fsdp, fsdp_grad_comm_dtype="bf16")
    bandwidth = 2 * load_calibration().network_efficiency * H100.network_bytes_per_s
    expected = 64 * 7 / 8 * 2 * P / bandwidth
    assert float(fp32.dp_comm_s - bf16.dp_comm_s) == pytest.approx(expected, rel=1e-9)
    # 'fp32' stated with FP32 main gradients is the same run as 'auto'
    assert float(_step(**fsdp, fsdp_grad_comm_dtype="fp32").dp_comm_s) == float(fp32.dp_comm_s)


def test_bf16_main_gradients_reduced_in_fp32_move_fp32():
    """The other way: BF16 main gradients (--grad-dtype bf16) with FP32 communication move as many
    bytes as FP32 main gradients do (optim_grads_params: its all-gathers are the weights', unchanged)."""
    fsdp = dict(fsdp_strategy="optim_grads_params")
    assert float(_step(**fsdp, grad_reduce_dtype="bf16", fsdp_grad_comm_dtype="fp32").dp_comm_s) == \
        pytest.approx(float(_step(**fsdp).dp_comm_s), rel=1e-12)


@pytest.mark.parametrize("main_weights, step_bytes", [("fp32", 4 + 4 + (4 + 2) + 16 + 8 + 4),
                                                      ("bf16", 2 + 2 + (2 + 2) + 16 + 4 + (4 + 2) + 4),
                                                      ("auto", 4 + 4 + (0 + 2) + 16 + 2 + 4)])
def test_adam_moves_the_main_weights_it_keeps(main_weights, step_bytes):
    """Adam's step on the rank's P / 8 parameters at the HBM rate (terms.optimizer_step_bytes): the
    gradient Adam is handed read (4 for the FP32 main gradients; 2 for the BF16 copy BF16 main weights
    get), the norm's read of the same gradient (4 or 2), copy_main_weights_to_model_weights reading
    the main weight (4 from FP32, 2 from BF16, none with no main-weight buffer: Adam steps the weight
    in place) and writing the BF16 weight (2), the FP32 moments (8 + 8) and the main weight: FP32
    read and written (8), BF16 (2 + 2 = 4), or none, the BF16 weight read (2; its write is the 2
    above); and the FP32 main-gradient buffer, sharded under optim_grads_params, zeroed (4): 42, 32
    and 32. BF16 main weights also have update_main_grads cast the FP32 gradient shard to BF16 first
    (read 4, write 2: tests/test_grad_cast.py): 38."""
    hbm = load_calibration().hbm_efficiency * H100.hbm_bytes_per_s
    step = _step(fsdp_strategy="optim_grads_params", fsdp_main_params_dtype=main_weights)
    assert float(step.optimizer_s) == pytest.approx(step_bytes * P / 8 / hbm, rel=1e-9)


@pytest.mark.parametrize("flag, value, message", [
    (FSDP_MAIN_PARAMS, "fp64",
     f"Error: --from-command stdin: {FSDP_MAIN_PARAMS} must be one of fp32, bf16, fp16, auto, got 'fp64'\n"),
    (FSDP_GRAD_COMM, "fp8",
     f"Error: --from-command stdin: {FSDP_GRAD_COMM} must be one of fp32, fp16, bf16, auto, got 'fp8'\n"),
])
def test_a_bad_value_is_one_line_and_exit_2(advisor, flag, value, message):
    result = _from_command(advisor, [*COMMAND, flag, value], expect=2)
    assert result.stderr == message


@pytest.mark.parametrize("flag", [FSDP_MAIN_PARAMS, FSDP_GRAD_COMM])
def test_core_0_15_refuses_each_flag_in_one_line(advisor, flag):
    result = _from_command(advisor, [*COMMAND, "--data-parallel-sharding-strategy", "optim", flag, "fp32"], "0.15",
                           expect=2)
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"Error: --from-command stdin: {flag}: Megatron-LM core 0.15 has no such flag")


def test_a_communication_copy_of_unsharded_gradients_is_refused_in_one_line(advisor):
    result = _from_command(advisor, [*COMMAND, "--data-parallel-sharding-strategy", "optim", FSDP_GRAD_COMM, "fp32"],
                           expect=2)
    assert result.stderr == (f"Error: --from-command stdin: {FSDP_GRAD_COMM} fp32 with bf16 main gradients and "
                             "--data-parallel-sharding-strategy optim is not priced (Megatron-FSDP copies each "
                             "un-sharded bucket into that dtype to reduce it); use auto, or optim_grads / "
                             "optim_grads_params\n")


@pytest.mark.parametrize("flag", [FSDP_MAIN_PARAMS, FSDP_GRAD_COMM])
def test_the_cli_refuses_each_without_megatron_fsdp_and_on_0_15(advisor, flag):
    without = advisor.runner.invoke(advisor.command, ["estimate", *LAYOUT, flag, "bf16"])
    assert without.exit_code == 2 and without.stderr == f"Error: {flag} bf16 needs --use-megatron-fsdp\n"
    on_15 = advisor.runner.invoke(advisor.command, ["estimate", *LAYOUT, "--use-megatron-fsdp", "--megatron-version",
                                                    "0.15", "--grad-dtype", "bf16", flag, "bf16"])
    assert on_15.exit_code == 2 and on_15.stderr.startswith(f"Error: {flag}: Megatron-LM core 0.15 has no such flag")


def test_without_megatron_fsdp_a_command_names_them_as_ignored(advisor):
    command = [arg for arg in COMMAND if arg != "--use-megatron-fsdp"]
    read = json.loads(_from_command(advisor, [*command, FSDP_MAIN_PARAMS, "bf16", FSDP_GRAD_COMM, "bf16"]).stdout)
    assert read["unpriced"] == [f"{flag} without --use-megatron-fsdp (Megatron ignores it; priced without)"
                                for flag in (FSDP_MAIN_PARAMS, FSDP_GRAD_COMM)]
    assert read["stages"][0]["optimizer_gib"] * GIB == pytest.approx(12 * N / 8, rel=1e-12)  # DDP's


def test_the_estimate_states_them_and_the_launch_writes_them_on_0_19_only(advisor, tmp_path):
    estimate = tmp_path / "fsdp.json"
    advisor("estimate", *LAYOUT, "--use-megatron-fsdp", FSDP_MAIN_PARAMS, "auto", FSDP_GRAD_COMM, "bf16",
            "-o", estimate)
    document = json.loads(estimate.read_text())
    assert document["options"]["fsdp_main_params_dtype"] == "auto"
    assert document["options"]["fsdp_grad_comm_dtype"] == "bf16"
    args = launcher()("args", "--from", estimate, "--megatron-version", "0.19").stdout.split()
    assert args[args.index(FSDP_MAIN_PARAMS) + 1] == "auto" and args[args.index(FSDP_GRAD_COMM) + 1] == "bf16"
    line = launcher().error("args", "--from", estimate, "--megatron-version", "0.15")
    assert "core 0.15" in line and FSDP_GRAD_COMM in line and FSDP_MAIN_PARAMS in line
    line = launcher().error("args", "--from", estimate, "--megatron-version", "0.19", "--", FSDP_GRAD_COMM, "fp32")
    assert f"{FSDP_GRAD_COMM} fp32 (after --) conflicts with {FSDP_GRAD_COMM} bf16" in line


def test_a_default_row_launched_with_another_dtype_after_the_dashes_conflicts(advisor, tmp_path):
    """A row priced at Megatron's defaults decides them: a user's other value is not what was priced."""
    estimate = tmp_path / "fsdp.json"
    advisor("estimate", *LAYOUT, "--use-megatron-fsdp", "-o", estimate)
    line = launcher().error("args", "--from", estimate, "--megatron-version", "0.19", "--", FSDP_MAIN_PARAMS, "bf16")
    assert f"{FSDP_MAIN_PARAMS} bf16 (after --) conflicts with the estimate" in line
    assert f"leaves {FSDP_MAIN_PARAMS} unset" in line


@pytest.mark.parametrize("tag", ["core_v0.15.2", "core_v0.19.0"])
def test_megatron_runs_the_priced_dtypes_from_the_launched_args(tag):
    """The real parse_args/validate_args and, on core_v0.19.0, its DDP config and FSDP buffers'
    dtype rules (launch.megatron_check): each launched list derives the main weights and the
    communication dtype priced. core_v0.15.2's parser refuses both flags (``lacks``)."""
    from megatron_real import TINY_MODEL_ARGS as base, checkout, validate

    release = checkout(tag)  # skips without it
    rules = named(tag)
    priced = [TrainingOptions().with_(fsdp_strategy="optim_grads", fsdp_main_params_dtype=main,
                                      fsdp_grad_comm_dtype=comm, grad_reduce_dtype=grad)
              for main, comm, grad in (("bf16", "bf16", "fp32"), ("auto", "fp32", "bf16"), ("fp16", "auto", "bf16"))]
    # as a launch on core_v0.19.0 writes them (the main gradients' dtype stated too), read back as priced;
    # core_v0.15.2's launcher would refuse them (test above): its parser does too
    written = [release_spelling(named("core_v0.19.0"), training_args(options, tp=1)) for options in priced]
    for options, args in zip(priced, written):
        assert parse_training_args([*args, "--tensor-model-parallel-size", "1"], "0.19") == (options, [])
    results = validate(release, [{"args": [*base, *args], "world_size": 8, "env": {}} for args in written])
    if rules.release == (0, 15):
        assert all(f"unrecognized arguments: {FSDP_MAIN_PARAMS}" in result["error"] for result in results)
        return
    assert [result.get("error") for result in results] == [None] * 3
    derived = [tuple(result["derived"][f"fsdp_{name}_dtype"] for name in ("main_params", "grad_comm", "main_grads"))
               for result in results]
    assert derived == [("bfloat16", "bfloat16", "float32"), ("None", "float32", "bfloat16"),
                       ("float16", "bfloat16", "bfloat16")]


AUTO_FP8 = (f"Error: {FSDP_MAIN_PARAMS} auto with --fp8-param-gather cannot train: with no main weights Megatron-FSDP "
            "has Adam step the FP8 weights' own bytes, which Transformer Engine's FusedAdam refuses ('only support "
            "model weights in fp32, fp16, bf16 and fp8') or, unsharded, leaves unchanged; use fp32, bf16 or fp16\n")
"""core_v0.19.0: FP8 weights (--fp8-param-gather) keep a uint8 compute buffer, and 'auto' no main
weight buffer, so the optimizer gets the uint8 shard (``_init_distributed_params``) and nothing
re-quantizes (``copy_main_weights_to_model_weights``: 'if mbuf is None: continue');
advisor.options.training._FSDP_AUTO_FP8 has the sources."""


@pytest.mark.parametrize("strategy", ["no_shard", "optim", "optim_grads_params"])
def test_no_main_weights_with_fp8_weights_is_refused_in_one_line(advisor, strategy):
    fp8 = ["--fp8-format", "hybrid", "--fp8-param-gather"]
    result = advisor.runner.invoke(advisor.command, ["estimate", *LAYOUT, "--use-megatron-fsdp",
                                                     "--data-parallel-sharding-strategy", strategy, *fp8,
                                                     FSDP_MAIN_PARAMS, "auto"])
    assert result.exit_code == 2 and result.stderr == AUTO_FP8
    read = _from_command(advisor, [*COMMAND, "--data-parallel-sharding-strategy", strategy, *fp8, FSDP_MAIN_PARAMS,
                                   "auto"], expect=2)
    assert read.stderr == "Error: --from-command stdin: " + AUTO_FP8.removeprefix("Error: ")  # the same line, the file named
    # a main weight buffer of any dtype is what the FP8 weights are cast from: priced
    for main in ("fp32", "bf16"):
        _from_command(advisor, [*COMMAND, "--data-parallel-sharding-strategy", strategy, *fp8, FSDP_MAIN_PARAMS, main])
