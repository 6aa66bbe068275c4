"""advisor.options: one description of a run's training options, its flags and back."""

import pytest

from advisor.errors import AdvisorError
from advisor.options import TrainingOptions, parse_training_args, release_defaults, training_args

LEVERS = TrainingOptions().with_(grad_reduce_dtype="bf16", fsdp_strategy="optim_grads", fp8_format="hybrid",
                                 fp8_param_gather=True, recompute="full",
                                 recompute_method="block", recompute_num_layers=3, tp_comm_overlap=True)
# The offload apart: Megatron-FSDP with it cannot run (advisor.options.training.FSDP_OFFLOAD).
OFFLOADED = TrainingOptions().with_(grad_reduce_dtype="bf16", optimizer_cpu_offload=True,
                                    optimizer_offload_fraction=0.5, fp8_format="hybrid", fp8_param_gather=True)


@pytest.mark.parametrize("options", [TrainingOptions(), LEVERS, OFFLOADED,
                                     TrainingOptions().with_(flash_attention=False, dataloader_mask="rebuilt"),
                                     TrainingOptions().with_(distributed_optimizer=False, overlap_param_gather=False,
                                                             overlap_grad_reduce=False, vocab_divisible_by=128)])
@pytest.mark.parametrize("tp", [1, 8])
def test_flags_read_back_as_the_same_options(options, tp):
    argv = [*training_args(options, tp=tp), "--tensor-model-parallel-size", str(tp)]
    for release in ("core_v0.15.2", "0.19"):
        assert parse_training_args(argv, release) == (options.at_tp(tp), [])


def test_the_release_decides_what_a_left_out_flag_means():
    argv = ["--bf16", "--use-megatron-fsdp"]
    assert parse_training_args(argv, "0.15")[0].data_parallel.fsdp_strategy == "no_shard"
    assert parse_training_args(argv, "0.19")[0].data_parallel.fsdp_strategy == "optim_grads_params"
    bare, _ = parse_training_args([], "0.19")  # Megatron's defaults: FP32, no DP overlap, mask kept, 128 padding
    assert bare.precision.params_dtype == "float32" and not bare.data_parallel.distributed_optimizer
    assert not bare.data_parallel.overlap_grad_reduce and bare.attention.dataloader_mask == "cached"
    assert bare.vocab_divisible_by == 128
    with pytest.raises(AdvisorError, match="not a release"):
        release_defaults("0.12")


def test_flags_that_change_cost_but_are_not_priced_are_named():
    _, unpriced = parse_training_args(["--bf16", "--fp4-format", "e2m1", "--lr", "3e-4", "--cpu-offloading"])
    assert unpriced == ["--fp4-format", "--cpu-offloading"]


@pytest.mark.parametrize("argv, message", [
    (["--overlap-param-gather", "--use-distributed-optimizer"], "needs --overlap-grad-reduce"),
    (["--tp-comm-overlap", "--tensor-model-parallel-size", "2"], "needs --sequence-parallel"),
    (["--tp-comm-overlap", "--sequence-parallel", "--transformer-impl", "local"], "needs Transformer Engine"),
    (["--bf16", "--optimizer-cpu-offload"], "needs --use-precision-aware-optimizer"),
    (["--bf16", "--fp8-format", "e5m2"], "--fp8-format must be"),
    # arguments.py validate_args, both releases: 'recompute method is not yet supported for selective'
    (["--recompute-granularity", "selective", "--recompute-method", "block"],
     "--recompute-method is for --recompute-granularity full"),
    (["--recompute-activations", "--recompute-num-layers", "2"],  # TransformerConfig: 'must be None'
     "--recompute-num-layers is for --recompute-granularity full"),
    # TransformerConfig.__post_init__: 'recompute_num_layers must be between 1 and ...' (no default)
    (["--recompute-granularity", "full", "--recompute-method", "uniform"], "needs --recompute-num-layers N"),
])
def test_what_megatron_refuses_is_one_line(argv, message):
    with pytest.raises(AdvisorError, match=message):
        parse_training_args(argv)


def test_flat_view_round_trips_and_reads_old_rows():
    assert TrainingOptions.from_dict(LEVERS.changed()) == LEVERS
    assert TrainingOptions.from_dict(OFFLOADED.changed()) == OFFLOADED
    old = TrainingOptions.from_dict({"gradient_bytes": 2, "flash_attention": False})
    assert old.precision.grad_reduce_dtype == "bf16" and old.attention.dataloader_mask == "cached"
    assert TrainingOptions().changed() == {}


@pytest.mark.parametrize("args, message", [
    (["--tp", "2", "--no-sequence-parallel", "--tp-comm-overlap"], "--tp-comm-overlap needs --sequence-parallel"),
    (["--tp", "2", "--gpu", "a100-80gb", "--fp8-format", "hybrid"], "no FP8 tensor cores"),
    (["--tp", "2", "--gpu", "h100-nvl-94gb", "--optimizer-cpu-offload"], "cannot be timed"),
    (["--fp8-param-gather"], "needs --fp8-format"),
    (["--data-parallel-sharding-strategy", "optim"], "needs --use-megatron-fsdp"),
    (["--megatron-version", "0.12"], "not a release the advisor knows"),
])
def test_refused_levers_are_one_line(advisor, args, message):
    assert message in advisor.error("estimate", "--gpus", "8", "--mem", "80", *args)


@pytest.mark.parametrize("args, message", [
    (["--recompute-method", "block"], "--recompute-method and --recompute-num-layers need --recompute full"),
    (["--recompute-method", "uniform"], "--recompute-method and --recompute-num-layers need --recompute full"),
    (["--recompute", "selective", "--recompute-num-layers", "4"],
     "--recompute-method and --recompute-num-layers need --recompute full"),
    (["--optimizer-offload-fraction", "0.5"], "--optimizer-offload-fraction needs --optimizer-cpu-offload"),
    (["--optimizer-offload-fraction", "1"], "--optimizer-offload-fraction needs --optimizer-cpu-offload"),
    (["--fp8-recipe", "delayed"], "--fp8-recipe needs --fp8-format e4m3|hybrid (or --use-precision-aware-optimizer, whose masters it "
     "decides)"),
    (["--fp8-param-gather"], "--fp8-param-gather needs --fp8-format e4m3|hybrid"),
    (["--cross-entropy-fusion-impl", "native"], "--cross-entropy-fusion-impl needs --cross-entropy-loss-fusion"),
])
def test_options_given_without_the_option_they_qualify_are_refused(advisor, args, message):
    """They were ignored without a word, even when given their default's value: the option
    source tells a given value from the default."""
    layout = ["--tp", "2", "--pp", "1", "--mbs", "1", "--gpus", "8", "--gpu", "h100-80gb"]
    assert advisor.error("estimate", *layout, *args) == f"Error: {message}"


def test_qualifying_options_are_taken_with_what_they_qualify(advisor):
    layout = ["estimate", "--tp", "2", "--pp", "2", "--mbs", "1", "--gpus", "8", "--gpu", "h100-80gb"]
    row = advisor.json(*layout, "--recompute", "full", "--recompute-method", "block", "--recompute-num-layers", "4")
    assert (row["recompute"], row["recompute_method"], row["recompute_num_layers"]) == ("full", "block", 4)
    offloaded = advisor.json(*layout, "--optimizer-cpu-offload", "--optimizer-offload-fraction", "0.5")
    assert offloaded["options"]["optimizer_offload_fraction"] == 0.5


def test_sweep_refuses_what_its_search_would_ignore(advisor):
    """--sharding fixed never offloads; --sharding auto may (at the fraction given)."""
    sweep = ["sweep", "--gpus", "8", "--gpu", "h100-80gb"]
    assert advisor.error(*sweep, "--sharding", "fixed", "--optimizer-offload-fraction", "0.5") == \
        "Error: --optimizer-offload-fraction needs --optimizer-cpu-offload"
    assert "need --recompute full" in advisor.error(*sweep, "--recompute", "none", "--recompute-method", "block")
    rows = advisor.json(*sweep, "--top", "1", "--optimizer-offload-fraction", "0.5")
    assert len(rows) == 1 and rows[0]["rank"] == 1


def test_estimate_states_every_priced_option(advisor):
    document = advisor.json("estimate", "--gpus", "8", "--tp", "2", "--mem", "80", "--grad-reduce-in-bf16",
                            "--use-megatron-fsdp", "--megatron-version", "0.15")
    assert document["options"] == {"grad_reduce_dtype": "bf16", "fsdp_strategy": "no_shard"}
    assert parse_training_args(document["megatron_args"], "0.19")[0] == TrainingOptions.from_dict(document["options"])


def test_the_loss_kernel_reads_back_and_core_0_19_refuses_te():
    # --cross-entropy-loss-fusion alone is Megatron's 'native' kernel; with --cross-entropy-fusion-impl
    # te, Transformer Engine's, which core_v0.19.0's validate_args refuses (arguments.py)
    for fusion in ("native", "te"):
        options = TrainingOptions().with_(cross_entropy_fusion=fusion)
        argv = training_args(options, tp=1, release="0.15")
        assert argv[-5:-2] == ["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", fusion]
        assert parse_training_args(argv, "0.15") == (options, [])
    assert parse_training_args(["--cross-entropy-loss-fusion"], "0.15")[0].loss.cross_entropy_fusion == "native"
    assert parse_training_args(["--cross-entropy-fusion-impl", "te"], "0.15")[0].loss.cross_entropy_fusion == "none"
    te = TrainingOptions().with_(cross_entropy_fusion="te")
    with pytest.raises(AdvisorError, match="refuses it"):
        training_args(te, tp=1, release="0.19")
    with pytest.raises(AdvisorError, match="refuses it"):
        parse_training_args(["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te"], "0.19")


def test_the_loss_kernel_flags_are_refused_in_one_line(advisor):
    layout = ["estimate", "--tp", "1", "--pp", "1", "--mbs", "1", "--gpus", "8", "--mem", "80"]
    assert "--cross-entropy-fusion-impl needs --cross-entropy-loss-fusion" in advisor.error(
        *layout, "--cross-entropy-fusion-impl", "te")
    assert "refuses it" in advisor.error(*layout, "--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te",
                                         "--megatron-version", "0.19")


def test_the_te_loss_kernel_keeps_the_bf16_logits_only(advisor):
    # Llama 3.1 8B, s 8192, b 1, TP 2, PP 2: Megatron's cross-entropy keeps an FP32 copy of the
    # logits (Eq. 14: 4 s b v / t) and, at the peak, the BF16 logits and their gradient (2 s b v / t
    # more, the calibrated model's working term); Transformer Engine's kernel writes the gradient
    # into the BF16 logits in place: 2 s b v / t in all. v = 128,256 (a multiple of t).
    from advisor.memory import GIB
    from advisor.memory_terms import cross_entropy_working_bytes, loss_logits_bytes
    from advisor.models import PRESETS
    from advisor.throughput.calibration import load_memory_calibration

    spec = PRESETS["llama3.1-8b"]
    assert loss_logits_bytes(spec, 8192, 1, 128256) == 4 * 8192 * 128256
    assert loss_logits_bytes(spec, 8192, 1, 128256, "native") == 4 * 8192 * 128256
    assert loss_logits_bytes(spec, 8192, 1, 128256, "te") == 2 * 8192 * 128256
    assert cross_entropy_working_bytes(spec, 8192, 1, 2, 1, 128256, "te") == 0.0
    args = ["estimate", "--gpus", "8", "--tp", "2", "--pp", "2", "--megatron-version", "0.15"]
    for memory_model, saved in (["--mem", "80"], 2), (["--gpu", "h100-80gb"], None):
        plain, fused = (advisor.json(*args, *memory_model, *extra)
                        for extra in ([], ["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te"]))
        assert fused["stages"][0] == plain["stages"][0]  # the first stage has no loss
        last, last_fused = plain["stages"][-1], fused["stages"][-1]
        if saved is not None:  # the 4D paper's Eq. 14, the FP32 copy halved
            assert last["output_activations_gib"] - last_fused["output_activations_gib"] == pytest.approx(
                saved * 8192 * 128256 / 2 / GIB)
    # the calibrated model, at PP 1 (one stage, the loss's): 2 s b v / t fewer kept (times the
    # allocator's activation factor) and no working term (2 s b v / t)
    factor = load_memory_calibration().activation_factor
    plain, fused = (advisor.json(*args[:-4], "--pp", "1", "--gpu", "h100-80gb", *extra)
                    for extra in ([], ["--megatron-version", "0.15", "--cross-entropy-loss-fusion",
                                       "--cross-entropy-fusion-impl", "te"]))
    assert plain["usage_gib"] - fused["usage_gib"] == pytest.approx((2 * factor + 2) * 8192 * 128256 / 2 / GIB)
    assert fused["options"] == {"cross_entropy_fusion": "te"}
    assert "--cross-entropy-fusion-impl" in fused["megatron_args"]
