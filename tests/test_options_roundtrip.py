"""The round trip of the training options through Megatron-LM flags: every emitted list reads back
as the options it was priced with (issue 21), for generated options and for real sweep rows."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from advisor.errors import AdvisorError
from advisor.options import (FP8_RECIPES, FSDP_STRATEGIES, TrainingOptions, parse_training_args, release_defaults,
                              training_args)
from advisor.options.flags import release_spelling
from advisor.options.training import FSDP_GRAD_COMM_DTYPES, FSDP_MAIN_PARAMS_DTYPES, MAIN_PARAMS_DTYPES, MOMENT_DTYPES

@st.composite
def training_options(draw) -> TrainingOptions:
    """Options Megatron-LM accepts: each dependent choice drawn among what its premises allow."""
    params = draw(st.sampled_from(["bfloat16", "float16", "float32"]))
    grad = draw(st.sampled_from({"bfloat16": ["fp32", "bf16"], "float16": ["fp32", "fp16"], "float32": ["fp32"]}[params]))
    fsdp = draw(st.sampled_from([None, *FSDP_STRATEGIES]))
    distributed = fsdp is not None or draw(st.booleans())
    grad_overlap = draw(st.booleans())
    fp8 = None if params == "float32" else draw(st.sampled_from([None, "e4m3", "hybrid"]))
    # the precision-aware optimizer it needs runs distributed only; not with Megatron-FSDP, which
    # cannot run it (advisor.options.training.FSDP_OFFLOAD)
    offload = distributed and fsdp is None and draw(st.booleans())
    aware = distributed and fsdp is None and not offload and draw(st.booleans())
    gather = fp8 is not None and distributed and draw(st.booleans())
    recipe = "delayed" if fp8 is None or (offload and gather) else draw(st.sampled_from(FP8_RECIPES))
    sequence_parallel, flash = draw(st.booleans()), draw(st.booleans())
    recompute = draw(st.sampled_from(["none", "selective", "full"]))
    full = recompute == "full"
    # Megatron-FSDP's own dtypes (core_v0.19.0): main weights none
    # ('auto') not with FP8 weights gathered (FusedAdam cannot step them), and a communication dtype
    # other than the main gradients' only where the gradients are sharded
    weights = [dtype for dtype in FSDP_MAIN_PARAMS_DTYPES if not (gather and dtype == "auto")]
    main_weights = draw(st.sampled_from(weights)) if fsdp else "fp32"
    comm = draw(st.sampled_from(FSDP_GRAD_COMM_DTYPES if fsdp in ("optim_grads", "optim_grads_params")
                                else ("auto", grad))) if fsdp else "auto"
    return TrainingOptions().with_(
        params_dtype=params, grad_reduce_dtype=grad, fp8_format=fp8, fp8_recipe=recipe, fp8_param_gather=gather,
        fp8_amax_history_len=draw(st.integers(1, 1024)) if fp8 else 1, distributed_optimizer=distributed,
        overlap_grad_reduce=grad_overlap, overlap_param_gather=grad_overlap and distributed and draw(st.booleans()),
        fsdp_strategy=fsdp, fsdp_main_params_dtype=main_weights, fsdp_grad_comm_dtype=comm,
        sequence_parallel=sequence_parallel,
        # Transformer Engine's userbuffers take no blockwise FP8 (TrainingOptions refuses the pair)
        tp_comm_overlap=sequence_parallel and not (fp8 and recipe == "blockwise") and draw(st.booleans()),
        recompute=recompute,
        recompute_method=draw(st.sampled_from(["uniform", "block"])) if full else "uniform",
        recompute_num_layers=draw(st.integers(1, 64)) if full else 1, flash_attention=flash,
        recompute_modules=draw(st.sampled_from([None, ("mlp",), ("core_attn", "mlp"), ("layernorm", "mlp")]))
        if recompute == "selective" else None,
        dataloader_mask=draw(st.sampled_from(["off", "cached", "rebuilt"] if flash else ["cached", "rebuilt"])),
        optimizer_cpu_offload=offload,
        optimizer_offload_fraction=draw(st.sampled_from([1.0, 0.5, 0.25])) if offload else 1.0,
        precision_aware_optimizer=aware,
        main_params_dtype=draw(st.sampled_from(MAIN_PARAMS_DTYPES)) if aware else "fp32",
        exp_avg_dtype=draw(st.sampled_from(MOMENT_DTYPES)) if aware else "fp32",
        exp_avg_sq_dtype=draw(st.sampled_from(MOMENT_DTYPES)) if aware else "fp32",
        cross_entropy_fusion=draw(st.sampled_from(["none", "native", "te"])),
        bias_swiglu_fusion=draw(st.booleans()),
        vocab_divisible_by=draw(st.sampled_from([None, 64, 128])))


@settings(max_examples=300, deadline=None)
@given(training_options(), st.sampled_from([1, 2, 8]), st.sampled_from(["core_v0.15.2", "0.19"]))
def test_any_options_read_back_from_their_flags(options, tp, release):
    if options.loss.cross_entropy_fusion == "te" and release == "0.19":  # validate_args refuses it there
        with pytest.raises(AdvisorError, match="refuses it"):
            training_args(options, tp=tp, release=release)
        return
    if options.data_parallel.fsdp_dtype_flags() and release != "0.19":  # core_v0.15.2 has no such flags
        with pytest.raises(AdvisorError, match="has no such flag"):
            training_args(options, tp=tp, release=release)
        return
    # as advisor-launch writes them on that release (core_v0.19.0: Megatron-FSDP's gradient dtype stated)
    argv = [*release_spelling(release_defaults(release), training_args(options, tp=tp, release=release)),
            "--tensor-model-parallel-size", str(tp)]
    assert parse_training_args(argv, release) == (options.at_tp(tp), [])


def test_every_sweep_row_reads_back(advisor, tmp_path):
    """Rows of sweeps with the levers (and the escalation to FSDP or offload): their megatron_args
    parse back to their options."""
    cases = [["--gpus", "64", "--gpu", "h100-80gb", "--gbs", "256"],
             ["--gpus", "64", "--gpu", "h100-80gb", "--gbs", "256", "--grad-dtype", "bf16", "--tp-comm-overlap",
              "--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads", "--fp8-format", "hybrid"],
             ["--gpus", "16", "--mem", "40", "--gbs", "64", "--no-overlap-grad-reduce", "--no-flash-attn",
              "--megatron-version", "0.15"],
             ["--gpus", "8", "--gpu", "h100-80gb", "--model", "llama3.1-70b", "--gbs", "64"]]
    rows = 0
    for number, args in enumerate(cases):
        path = tmp_path / f"sweep{number}.json"
        advisor("sweep", *args, "--format", "json", "-o", path)
        for row in json.loads(path.read_text()):
            options = TrainingOptions.from_dict(row["options"])
            release = release_defaults("0.15" if "0.15" in args else None)
            assert parse_training_args(release_spelling(release, row["megatron_args"]), release) == (options, [])
            rows += 1
    assert rows > 100
