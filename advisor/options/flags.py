"""Training options <-> Megatron-LM flags: the one emitter (``training_args``) and the one
reader (``parse_training_args``). Flag names, defaults and rules are those of
``megatron/training/arguments.py`` of the releases in ``advisor.options.releases``.

Emission states every priced option explicitly, Megatron's defaults included, so that a list
read by any release means the options priced (the FSDP sharding strategy's default differs
between releases; it is always written) once it is in that release's words: Megatron-FSDP's
gradient dtype, core_v0.19.0's own flag, which rows and launches there add (``release_spelling``,
``spelled_parts``), and its main-weight and
communication dtypes, written only where they differ from its defaults (refused for a release
without them: ``fsdp_dtypes_problem``). Reading applies
the target release's defaults to flags a command line leaves out, and names the flags that
change memory or time but that the options do not describe.
"""

from __future__ import annotations

from typing import Sequence

from advisor import equations as eq
from advisor.errors import AdvisorError
from advisor.options.local_spec import NO_PERSIST_FLAG
from advisor.options.releases import release_defaults
from advisor.options.training import (
    CROSS_ENTROPY_FUSIONS, FP8_FORMATS, FP8_RECIPES, FSDP_GRAD_COMM_DTYPES, FSDP_MAIN_PARAMS_DTYPES, FSDP_STRATEGIES,
    MEGATRON_CROSS_ENTROPY_KERNEL, RECOMPUTE_METHODS, MAIN_PARAMS_DTYPES, MOMENT_DTYPES, RECOMPUTES, Attention,
    DataParallel, Fusions, Loss, Offload, OptimizerStates, Precision,
    TP1_OVERLAP_PROBLEM, TP_COMM_SUB_FLAGS, Recomputation, TensorParallel, TrainingOptions, megatron_grad_reduce_dtype,
    sub_option_on,
)
from advisor.releases import FSDP_GRAD_COMM, FSDP_MAIN_GRADS, FSDP_MAIN_PARAMS

_MEGATRON_PRECISION = Precision()
"""Its FP8 recipe and amax history are Megatron-LM's defaults (the fields' own): what a flag left
out reads as, and what a title leaves unsaid."""


def te_cross_entropy_problem(options: TrainingOptions, release) -> None:
    """AdvisorError where ``release`` (a ``release_defaults``) refuses the options' loss kernel."""
    if options.loss.cross_entropy_fusion == "te" and not release.te_cross_entropy:
        raise AdvisorError(f"--cross-entropy-fusion-impl te: {release.name}'s validate_args refuses it "
                           "('disabled due to stability issues'); use native or --megatron-version 0.15")


_FSDP_RELEASE_KEEPS = {
    FSDP_MAIN_GRADS: "its Megatron-FSDP keeps FP32 gradients with --accumulate-allreduce-grads-in-fp32",
    FSDP_MAIN_PARAMS: "its Megatron-FSDP always keeps FP32 main weights",
    FSDP_GRAD_COMM: "its Megatron-FSDP reduces gradients in their buffer's dtype",
}
"""What core_v0.15.2, which has none of Megatron-FSDP's dtype flags, does instead (its
megatron_fsdp/param_and_grad_buffer.py): the refusal of each flag says it."""


def _fsdp_flag_refused(flag: str, release) -> AdvisorError:
    """The one line for Megatron-FSDP's dtype ``flag`` on ``release``, which lacks it."""
    return AdvisorError(f"{flag}: {release.name} has no such flag (its argument parser refuses the command; "
                        f"{_FSDP_RELEASE_KEEPS[flag]}); core 0.19 reads it: --megatron-version 0.19")


def fsdp_dtypes_problem(options: TrainingOptions, release) -> None:
    """AdvisorError where ``release`` (a ``release_defaults``) lacks a Megatron-FSDP dtype flag the
    options state (``DataParallel.fsdp_dtype_flags``)."""
    _refuse_lacking([flag for flag, _ in options.data_parallel.fsdp_dtype_flags()], release)


def _refuse_lacking(flags, release) -> None:
    """AdvisorError for the first of Megatron-FSDP's dtype ``flags`` that ``release`` lacks."""
    for flag in flags:
        if flag in release.lacks:
            raise _fsdp_flag_refused(flag, release)


SWIGLU_UNFUSED_FLAG = "--no-bias-swiglu-fusion"
"""``Fusions.bias_swiglu_fusion`` off (megatron/training/arguments.py, both releases: store_false,
dest bias_swiglu_fusion, passed to TransformerConfig.bias_activation_fusion with --swiglu)."""


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def training_args(options: TrainingOptions, *, tp: int, release=None) -> list[str]:
    """The flags of every option the models priced, for a layout with this TP on ``release``
    (default the newest the advisor knows), in words every release it knows reads (a row or a
    launch spells them for its release: ``release_spelling``), but --cross-entropy-fusion-impl te,
    which only core_v0.15 takes: refused for a release given that refuses it."""
    defaults = release_defaults(release)  # an unknown release is refused here, before anything is written
    if release is not None:  # the CLI checked the loss kernel against the release its user named
        te_cross_entropy_problem(options, defaults)
        fsdp_dtypes_problem(options, defaults)
    p, dp, tpo, r, a, o = (options.precision, options.data_parallel, options.tensor_parallel,
                           options.recomputation, options.attention, options.offload)
    args = [*_precision_args(p), *_data_parallel_args(dp)]
    if tp > 1 and tpo.sequence_parallel:
        args.append("--sequence-parallel")
    if tp > 1 and tpo.tp_comm_overlap:
        args.append("--tp-comm-overlap")
        if tpo.tp_comm_overlap_cfg is not None:
            args += ["--tp-comm-overlap-cfg", tpo.tp_comm_overlap_cfg]
        # only those off Megatron's defaults: no release has a flag that states a default
        # (--disable-... sets False; core_v0.19.0 also spells it --no-...), and both share them
        args += tpo.changed_sub_options()
    if r.recompute == "selective":
        args += ["--recompute-granularity", "selective"]
        if r.recompute_modules:  # None: Megatron's default core_attn
            args += ["--recompute-modules", *r.recompute_modules]
    elif r.recompute == "full":
        args += ["--recompute-granularity", "full", "--recompute-method", r.recompute_method,
                 "--recompute-num-layers", str(r.recompute_num_layers)]
    if a.transformer_impl == "local":  # megatron-core's own modules: their attention is unfused whatever the backend
        # and their RMSNorm is torch's, which asserts Megatron's default persist_layer_norm off
        # (advisor.options.local_spec)
        args += ["--transformer-impl", "local", NO_PERSIST_FLAG]
    elif not a.flash_attention:
        args += ["--attention-backend", "unfused"]
    if a.dataloader_mask == "off":
        args.append("--no-create-attention-mask-in-dataloader")
    elif a.dataloader_mask == "rebuilt":
        # The least of the three flags that make GPTDataset rebuild the mask per sample
        # (masks_and_position_ids_are_cacheable): it changes only which tokens the loss counts.
        args.append("--eod-mask-loss")
    if o.optimizer_cpu_offload:
        args += ["--optimizer-cpu-offload", "--use-precision-aware-optimizer",
                 "--optimizer-offload-fraction", _number(o.optimizer_offload_fraction)]
    elif options.optimizer_states.precision_aware_optimizer:
        args.append("--use-precision-aware-optimizer")
    args += [word for flag in options.optimizer_states.lowered for word in flag.split()]
    if options.loss.cross_entropy_fusion != "none":
        args += ["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", options.loss.cross_entropy_fusion]
    if not options.fusions.bias_swiglu_fusion:  # Megatron fuses it by default: stated only when off
        args.append(SWIGLU_UNFUSED_FLAG)
    # Megatron pads the vocabulary to 128 x TP by default; 1 keeps it unpadded, as the paper.
    args += ["--make-vocab-size-divisible-by", str(options.vocab_divisible_by or 1)]
    return args


def _precision_args(p: Precision) -> list[str]:
    """``training_args``'s flags for the number formats."""
    args = {"bfloat16": ["--bf16"], "float16": ["--fp16"], "float32": []}[p.params_dtype]
    if p.params_dtype != "float32" and p.grad_reduce_dtype == "fp32":
        # stated even where it is Megatron's default (megatron_grad_reduce_dtype): what the row prices
        args.append("--accumulate-allreduce-grads-in-fp32")
    elif p.grad_reduce_dtype == "bf16":
        args.append("--grad-reduce-in-bf16")
    if p.fp8_format is not None:
        args += ["--fp8-format", p.fp8_format, "--fp8-recipe", p.fp8_recipe,
                 "--fp8-amax-history-len", str(p.fp8_amax_history_len)]
        if p.fp8_param_gather:
            args.append("--fp8-param-gather")
    elif p.fp8_recipe != _MEGATRON_PRECISION.fp8_recipe:
        # without FP8 the recipe still decides who keeps the precision-aware optimizer's masters
        # (TrainingOptions keeps it only then)
        args += ["--fp8-recipe", p.fp8_recipe]
    return args


def _data_parallel_args(dp: DataParallel) -> list[str]:
    """``training_args``'s flags for data parallelism and its sharding."""
    args = ["--use-distributed-optimizer"] if dp.distributed_optimizer else []
    if dp.fsdp_strategy is not None:
        # Megatron-FSDP saves only in its own checkpoint format (validate_args asserts it); its
        # dtype flags, core_v0.19.0's only, only where they differ from its defaults
        args += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", dp.fsdp_strategy,
                 "--ckpt-format", "fsdp_dtensor", *(word for pair in dp.fsdp_dtype_flags() for word in pair)]
    if dp.torch_fsdp2:
        # validate_args: FSDP2 refuses gradient-accumulation fusion (on by default) and saves only
        # in torch_dist or torch_dcp (torch_dist is the default; stated, as Megatron-FSDP's).
        args += ["--use-torch-fsdp2", "--no-gradient-accumulation-fusion", "--ckpt-format", "torch_dist"]
    if dp.overlap_grad_reduce:
        args.append("--overlap-grad-reduce")
    if dp.overlap_param_gather:
        args.append("--overlap-param-gather")
    return args


def changed_args(options: TrainingOptions) -> str:
    """The options that differ from the advisor's defaults, for people (a table's title), in the
    fewest words a Megatron-LM user reads: the flag by which each change is made, never what comes
    with it. '--grad-reduce-in-bf16', not also 'no --accumulate-allreduce-grads-in-fp32' (with
    --bf16 Megatron reduces in FP32 unless told otherwise); '--fp8-format hybrid' without Megatron's
    default recipe and amax history; '--use-megatron-fsdp' with its sharding strategy (the
    releases' defaults differ) but not the checkpoint format it needs; 'no --use-distributed-optimizer'
    without the parameter gather it rules out. The flags are ``training_args``'s
    (tests/test_title_flags.py holds the two together). The Megatron defaults left unsaid
    (--fp8-recipe delayed, --fp8-amax-history-len 1, --optimizer-offload-fraction 1,
    --cross-entropy-fusion-impl native) are both releases': megatron/training/arguments.py, and
    in core_v0.19.0 megatron-core transformer_config.py and model_parallel_config.py."""
    p, dp, tpo, r, a, o = (options.precision, options.data_parallel, options.tensor_parallel,
                           options.recomputation, options.attention, options.offload)
    words = _precision_words(p) + _data_parallel_words(dp)
    if not tpo.sequence_parallel:
        words.append("no --sequence-parallel")
    if tpo.tp_comm_overlap:
        words.append("--tp-comm-overlap")
    if tpo.tp_comm_overlap_cfg is not None:
        words.append(f"--tp-comm-overlap-cfg {tpo.tp_comm_overlap_cfg}")
    words += tpo.changed_sub_options()
    if r.recompute != "none":
        words.append(f"--recompute-granularity {r.recompute}")
        if r.recompute == "selective" and r.recompute_modules:
            words.append(f"--recompute-modules {' '.join(r.recompute_modules)}")
        if r.recompute == "full":
            words += [f"--recompute-method {r.recompute_method}", f"--recompute-num-layers {r.recompute_num_layers}"]
    elif r.recompute_modules:  # a sweep's options: recomputation is searched, its selective rows take these
        words.append(f"--recompute-modules {' '.join(r.recompute_modules)} (selective rows)")
    if a.transformer_impl == "local":
        words.append("--transformer-impl local")
    elif not a.flash_attention:
        words.append("--attention-backend unfused")  # which needs the mask: 'cached' comes with it
    if a.dataloader_mask == "rebuilt":
        words.append("--eod-mask-loss")
    elif a.dataloader_mask == "cached" and a.flash_attention:
        # Megatron has only the flag that turns the mask off, and 'no --no-create-...' reads as a riddle
        words.append("--dataloader-mask cached")
    if o.optimizer_cpu_offload:  # --use-precision-aware-optimizer comes with it (Megatron requires it)
        words.append("--optimizer-cpu-offload")
        if o.optimizer_offload_fraction != Offload().optimizer_offload_fraction:
            words.append(f"--optimizer-offload-fraction {_number(o.optimizer_offload_fraction)}")
    if options.optimizer_states.precision_aware_optimizer:
        words.append("--use-precision-aware-optimizer")
    words += options.optimizer_states.lowered
    if options.loss.cross_entropy_fusion != "none":
        words.append("--cross-entropy-loss-fusion")
        if options.loss.cross_entropy_fusion != MEGATRON_CROSS_ENTROPY_KERNEL:
            words.append(f"--cross-entropy-fusion-impl {options.loss.cross_entropy_fusion}")
    if not options.fusions.bias_swiglu_fusion:
        words.append(SWIGLU_UNFUSED_FLAG)
    if (options.vocab_divisible_by or 1) != 1:
        words.append(f"--make-vocab-size-divisible-by {options.vocab_divisible_by}")
    return ", ".join(words)


def _precision_words(p: Precision) -> list[str]:
    """``changed_args``'s words for the number formats."""
    words = {"bfloat16": [], "float16": ["--fp16"], "float32": ["no --bf16"]}[p.params_dtype]
    if p.grad_reduce_dtype != megatron_grad_reduce_dtype(p.params_dtype):
        words.append("--grad-reduce-in-bf16" if p.grad_reduce_dtype == "bf16"
                     else "--accumulate-allreduce-grads-in-fp32")
    if p.fp8_format is not None:
        words.append(f"--fp8-format {p.fp8_format}")
        if p.fp8_recipe != _MEGATRON_PRECISION.fp8_recipe:  # Megatron's default recipe and amax history go unsaid
            words.append(f"--fp8-recipe {p.fp8_recipe}")
        if p.fp8_amax_history_len != _MEGATRON_PRECISION.fp8_amax_history_len:
            words.append(f"--fp8-amax-history-len {p.fp8_amax_history_len}")
    elif p.fp8_recipe != _MEGATRON_PRECISION.fp8_recipe:  # kept for the precision-aware optimizer alone
        words.append(f"--fp8-recipe {p.fp8_recipe}")
    if p.fp8_param_gather:
        words.append("--fp8-param-gather")
    return words


def _data_parallel_words(dp: DataParallel) -> list[str]:
    """``changed_args``'s words for data parallelism: each sharding names itself alone (torch FSDP2
    runs without the distributed optimizer, Megatron-FSDP with it), and the parameter gather is
    named only where it could run (the overlapped reduction and the distributed optimizer, which
    the CLI's default asks for) but does not."""
    if dp.torch_fsdp2:
        words = ["--use-torch-fsdp2"]
    elif dp.fsdp_strategy is not None:
        words = ["--use-megatron-fsdp", f"--data-parallel-sharding-strategy {dp.fsdp_strategy}",
                 *(f"{flag} {value}" for flag, value in dp.fsdp_dtype_flags())]
    else:
        words = [] if dp.distributed_optimizer else ["no --use-distributed-optimizer"]
    if not dp.overlap_grad_reduce:
        words.append("no --overlap-grad-reduce")
    if dp.overlap_grad_reduce and dp.distributed_optimizer and not dp.overlap_param_gather:
        words.append("no --overlap-param-gather")
    return words


# --- reading flags back ------------------------------------------------------------------

TP_COMM_SUB_OPTIONS = {
    field: (flag, "--no-" + flag.removeprefix("--disable-")) if flag.startswith("--disable-") else (flag,)
    for field, flag in TP_COMM_SUB_FLAGS.items()
}
"""``TensorParallel``'s overlap sub-options and Megatron's flags for them: core_v0.15.2's
(``TP_COMM_SUB_FLAGS``: ``--disable-...``, store_false; ``--tp-comm-overlap-rs-dgrad`` store_true),
and core_v0.19.0's generated parser's, which adds ``--no-...`` beside ``--disable-...``
(``argument_utils.py``, ``ArgumentGroupFactory``: store_false fields get both prefixes)."""
NO_EFFECT = {
    f"--disable-tp-comm-split-{kind}": f"--disable-tp-comm-split-{kind} (Megatron ignores it: it passes Transformer "
                                       f"Engine >= 1.5 tp_comm_overlap_{kind} instead; priced without)"
    for kind in ("ag", "rs")
}
"""Flags Megatron-LM accepts (core_v0.15.2; core_v0.19.0 also as --no-...) that change nothing with
the Transformer Engine it runs: named where a command gives them, never priced."""
NO_EFFECT.update({"--no-" + flag.removeprefix("--disable-"): note.replace("--disable-", "--no-", 1)
                  for flag, note in list(NO_EFFECT.items())})

SWITCHES = frozenset({
    "--bf16", "--fp16", "--accumulate-allreduce-grads-in-fp32", "--grad-reduce-in-bf16", "--fp8-param-gather",
    "--use-distributed-optimizer", "--use-megatron-fsdp", "--overlap-grad-reduce", "--overlap-param-gather",
    "--sequence-parallel", "--tp-comm-overlap", "--recompute-activations", "--no-create-attention-mask-in-dataloader",
    "--reset-attention-mask", "--reset-position-ids", "--eod-mask-loss", "--optimizer-cpu-offload",
    "--use-precision-aware-optimizer", "--use-flash-attn", "--use-torch-fsdp2", "--cross-entropy-loss-fusion",
    SWIGLU_UNFUSED_FLAG,
    # read and left: it comes with --transformer-impl local (training_args), and changes no price
    # (advisor.options.local_spec)
    NO_PERSIST_FLAG,
    *(flag for pair in (TP_COMM_SUB_OPTIONS.values()) for flag in pair),
})
VALUED = frozenset({
    "--fp8-format", "--fp8-recipe", "--fp8-amax-history-len", "--data-parallel-sharding-strategy", "--ckpt-format",
    "--recompute-granularity", "--recompute-method", "--recompute-num-layers", "--attention-backend",
    "--optimizer-offload-fraction", "--make-vocab-size-divisible-by", "--tensor-model-parallel-size",
    "--transformer-impl", "--cross-entropy-fusion-impl", "--main-grads-dtype", "--main-params-dtype",
    "--exp-avg-dtype", "--exp-avg-sq-dtype", "--tp-comm-overlap-cfg", FSDP_MAIN_GRADS, FSDP_MAIN_PARAMS,
    FSDP_GRAD_COMM,
})
MULTI = frozenset({"--recompute-modules"})
"""Flags with several values (Megatron's nargs), each read whole: the words after it up to the next flag."""
UNPRICED = frozenset({
    # Flags that change memory or time which the options do not describe.
    "--fp4-format", "--fp4-recipe", "--fp4-param-gather",
    "--cpu-offloading", "--cpu-offloading-num-layers", "--fine-grained-activation-offloading",
    "--overlap-param-gather-with-optimizer-step", "--no-overlap-p2p-communication", "--cuda-graph-impl", "--cuda-graph-scope",
    "--enable-cuda-graph", "--external-cuda-graph", "--first-last-layers-bf16", "--num-layers-at-start-in-bf16",
    "--num-layers-at-end-in-bf16", "--fp8-dot-product-attention", "--fp8-multi-head-attention",
    "--decoupled-lr", "--optimizer", "--use-custom-fsdp", "--suggested-communication-unit-size",
    "--num-distributed-optimizer-instances", "--ddp-bucket-size", "--ddp-average-in-collective",
    "--calculate-per-token-loss", "--use-cpu-initialization", "--no-gradient-accumulation-fusion",
    "--check-weight-hash-across-dp-replicas-interval",
    "--cp-comm-type", "--hierarchical-context-parallel-sizes",
    "--num-experts", "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--moe-grouped-gemm",
    "--mtp-num-layers", "--multi-latent-attention", "--delay-wgrad-compute",
})
"""Memory or time changes that the models do not price: named, never ignored. Each is a flag of
core_v0.15.2 (tables/data/megatron_lm_core_v0.15.2_flags.txt) or of core_v0.19.0's generated parser."""


def _flag_values(argv: Sequence[str]) -> tuple[dict[str, list[str]], list[str]]:
    """{flag: its values} for the flags this reader knows, and the unpriced flags present. A flag
    written '--flag=value' is read as '--flag value'."""
    known: dict[str, list[str]] = {}
    unpriced: list[str] = []
    tokens = list(argv)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if not token.startswith("--"):
            continue
        flag, eq, inline = token.partition("=")
        if flag in MULTI:
            end = i
            while end < len(tokens) and not tokens[end].startswith("--"):
                end += 1
            known[flag] = [inline] if eq else tokens[i:end]  # the last one given wins, as in argparse
            i = i if eq else end
        elif flag in VALUED:
            if eq:
                value = inline
            elif i < len(tokens):
                value, i = tokens[i], i + 1
            else:
                raise AdvisorError(f"{flag} needs a value")
            known.setdefault(flag, []).append(value)
        elif flag in SWITCHES:
            known.setdefault(flag, [])
        elif flag in UNPRICED and flag not in unpriced:
            unpriced.append(flag)
        elif flag in NO_EFFECT and NO_EFFECT[flag] not in unpriced:
            unpriced.append(NO_EFFECT[flag])
    return known, unpriced


def _last(values: dict, flag: str, default=None):
    return values[flag][-1] if values.get(flag) else default


def _int(values: dict, flag: str, default: int) -> int:
    text = _last(values, flag)
    try:
        return default if text is None else int(text)
    except ValueError:
        raise AdvisorError(f"{flag} must be an integer, got {text!r}") from None


def _one_of(values: dict, flag: str, allowed: Sequence[str], default):
    text = _last(values, flag, default)
    if text is not None and text not in allowed:
        raise AdvisorError(f"{flag} must be one of {', '.join(allowed)}, got {text!r}")
    return text


def _precision(values: dict, unpriced: list[str] | None = None, release=None) -> Precision:
    """The number formats of a command on ``release``: Megatron-FSDP's gradients by
    ``_fsdp_main_grads`` where it decides them, after the refusals of the common flags, which
    Megatron makes whatever the FSDP. ``unpriced``: where to name an FSDP flag Megatron ignores
    (None: no such flag is read, as in ``fsdp_main_grads_args``)."""
    params = "bfloat16" if "--bf16" in values else "float16" if "--fp16" in values else "float32"
    if "--bf16" in values and "--fp16" in values:
        raise AdvisorError("--bf16 and --fp16 together (Megatron-LM refuses them)")
    grad = megatron_grad_reduce_dtype(params)
    main_grads = _one_of(values, "--main-grads-dtype", ("fp32", "bf16"), "fp32")
    if main_grads == "bf16" and "--use-precision-aware-optimizer" not in values:
        raise AdvisorError("--main-grads-dtype bf16 needs --use-precision-aware-optimizer (megatron-core refuses it "
                           "without)")
    if params == "bfloat16" and main_grads == "bf16" and "--accumulate-allreduce-grads-in-fp32" in values:
        raise AdvisorError("--main-grads-dtype bf16 with --accumulate-allreduce-grads-in-fp32 (Megatron-LM refuses "
                           "them together)")
    if params == "bfloat16" and ("--grad-reduce-in-bf16" in values or main_grads == "bf16"):
        # validate_args: BF16 main gradients leave --accumulate-allreduce-grads-in-fp32 off, so the
        # gradient buffer, and its reduction, is BF16 as with --grad-reduce-in-bf16
        grad = "bf16"
    elif params == "float16" and "--accumulate-allreduce-grads-in-fp32" in values:
        grad = "fp32"
    if unpriced is not None and (fsdp := _fsdp_main_grads(values, params, unpriced, release)) is not None:
        grad = fsdp
    return Precision(
        params_dtype=params, grad_reduce_dtype=grad, fp8_format=_one_of(values, "--fp8-format", FP8_FORMATS, None),
        fp8_recipe=_one_of(values, "--fp8-recipe", FP8_RECIPES, _MEGATRON_PRECISION.fp8_recipe),
        fp8_param_gather="--fp8-param-gather" in values,
        fp8_amax_history_len=_int(values, "--fp8-amax-history-len", _MEGATRON_PRECISION.fp8_amax_history_len))


FSDP_MAIN_GRADS_DTYPES = ("fp32", "bf16", "fp16", "auto")
"""``FSDP_MAIN_GRADS``'s choices (core_v0.19.0 arguments.py)."""
_WEIGHTS_GRAD_DTYPE = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
_WEIGHTS_WORDS = {"bfloat16": "BF16 (--bf16)", "float16": "FP16 (--fp16)", "float32": "FP32"}


def _fsdp_main_grads(values: dict, params: str, unpriced: list[str], release) -> str | None:
    """Megatron-FSDP's gradient dtype where ``release`` reads it from ``FSDP_MAIN_GRADS``
    (``fsdp_main_grads_own_flag``): the flag's, or with 'auto' (its default) the weights' dtype
    (``_resolve_group_grad_dtype``; FP8 weights' gradients are BF16 there, 2 bytes as FP16's).
    None where the common rule (``_precision``) holds: no Megatron-FSDP, or core_v0.15.2, whose
    parser refuses the flag (AdvisorError). Given without Megatron-FSDP it is named in ``unpriced``."""
    defaults = release_defaults(release)
    if FSDP_MAIN_GRADS in values and not defaults.fsdp_main_grads_own_flag:
        raise _fsdp_flag_refused(FSDP_MAIN_GRADS, defaults)
    if "--use-megatron-fsdp" not in values:
        if FSDP_MAIN_GRADS in values:
            unpriced.append(f"{FSDP_MAIN_GRADS} without --use-megatron-fsdp (Megatron ignores it; priced without)")
        return None
    if not defaults.fsdp_main_grads_own_flag:
        return None
    text = _one_of(values, FSDP_MAIN_GRADS, FSDP_MAIN_GRADS_DTYPES, "auto")
    grad = _WEIGHTS_GRAD_DTYPE[params] if text == "auto" else text
    if grad != "fp32" and grad != _WEIGHTS_GRAD_DTYPE[params]:  # Precision prices FP32 or the weights' dtype
        raise AdvisorError(f"{FSDP_MAIN_GRADS} {text} with {_WEIGHTS_WORDS[params]} weights is not priced (the "
                           "advisor prices Megatron-FSDP gradients in FP32 or in the weights' dtype)")
    return grad


def release_spelling(release, args: Sequence[str]) -> list[str]:
    """``args`` (an advisor-written list) as a launch on ``release`` (``advisor.releases``) writes
    them: its spelling of renamed flags (``MegatronRelease.own_spelling``) and, where its
    Megatron-FSDP reads the gradient dtype from its own flag (``fsdp_main_grads_own_flag``), that
    flag with the dtype ``args`` price (``fsdp_main_grads_args``): what is launched is what was
    priced. Here, not in the release table, which the options import. ``release``: anything
    ``release_defaults`` takes (None: the newest)."""
    release = release_defaults(release)
    spelled = release.own_spelling(args)
    return spelled + fsdp_main_grads_args(args) if release.fsdp_main_grads_own_flag else spelled


def spelled_parts(release, rows_parts: Sequence[Sequence[Sequence[str]]]) -> list[tuple[tuple[str, ...], ...]]:
    """Each row's flags, in parts (``advisor.megatron_args.rows_arg_parts``, the MoE model's
    ``advisor.moe.flags.rows_arg_parts``), as ``release`` (``release_defaults``'s) reads them to
    mean what was priced: what an estimate or a sweep writes into its ``megatron_args``, so that
    the list runs, and reads back (``--from-command``), as priced on that release. The words are
    ``release_spelling``'s of the whole list: each part in its own spelling, and its Megatron-FSDP
    gradient flag as one more part, found in the part that holds the training options' flags
    (``training_args`` writes them together). Rows sharing parts share their spelled parts (the
    same objects), so that a writer still encodes each once (``render.rows_to_json``)."""
    release = release_defaults(release)
    renamed = {old for old, _ in release.renamed}
    own_flag = release.fsdp_main_grads_own_flag
    # id of a part -> (the part, kept alive so that its id stays its own; its words; the flag it needs)
    spelled: dict[int, tuple] = {}
    out = []
    for parts in rows_parts:
        row, tail = [], ()
        for part in parts:
            held = spelled.get(id(part))
            if held is None or held[0] is not part:
                words = tuple(release.own_spelling(part)) if renamed.intersection(part) else tuple(part)
                held = spelled[id(part)] = (part, words, tuple(fsdp_main_grads_args(part)) if own_flag else ())
            row.append(held[1])
            tail = tail or held[2]
        out.append((*row, tail) if own_flag else tuple(row))
    return out


def fsdp_main_grads_args(args: Sequence[str]) -> list[str]:
    """``FSDP_MAIN_GRADS`` with the gradient dtype that ``args`` (an advisor-written list, which
    states it: ``training_args``) price, for a release whose Megatron-FSDP reads its own flag
    (``release_spelling``); nothing where ``args`` run no Megatron-FSDP or give the flag."""
    values, _ = _flag_values(args)
    if "--use-megatron-fsdp" not in values or FSDP_MAIN_GRADS in values:
        return []
    return [FSDP_MAIN_GRADS, _precision(values).grad_reduce_dtype]


def _data_parallel(values: dict, release, unpriced: list[str]) -> DataParallel:
    fsdp = None
    if "--use-megatron-fsdp" in values:
        fsdp = _one_of(values, "--data-parallel-sharding-strategy", FSDP_STRATEGIES,
                       release_defaults(release).fsdp_sharding_strategy)
    # DataParallel refuses what Megatron refuses (torch FSDP2 with the distributed optimizer, two FSDPs).
    return DataParallel(
        distributed_optimizer=DataParallel.distributed_optimizer_for("--use-distributed-optimizer" in values, fsdp),
        overlap_grad_reduce="--overlap-grad-reduce" in values,
        overlap_param_gather="--overlap-param-gather" in values, fsdp_strategy=fsdp,
        torch_fsdp2="--use-torch-fsdp2" in values, **_fsdp_dtypes(values, fsdp, release, unpriced))


def _fsdp_dtypes(values: dict, fsdp: str | None, release, unpriced: list[str]) -> dict:
    """Megatron-FSDP's main-weight and gradient-communication dtypes (``DataParallel``'s fields)
    as ``release`` reads them: core_v0.19.0's flags, at its defaults where left out; a release
    without them (core_v0.15.2) refuses them (AdvisorError). Without Megatron-FSDP, Megatron
    ignores them: named in ``unpriced``."""
    defaults = release_defaults(release)
    given = [flag for flag in (FSDP_MAIN_PARAMS, FSDP_GRAD_COMM) if flag in values]
    _refuse_lacking(given, defaults)
    if fsdp is None:
        unpriced += [f"{flag} without --use-megatron-fsdp (Megatron ignores it; priced without)" for flag in given]
        return {}
    return {"fsdp_main_params_dtype": _one_of(values, FSDP_MAIN_PARAMS, FSDP_MAIN_PARAMS_DTYPES, "fp32"),
            "fsdp_grad_comm_dtype": _one_of(values, FSDP_GRAD_COMM, FSDP_GRAD_COMM_DTYPES, "auto")}


def _recomputation(values: dict, unpriced: list[str]) -> Recomputation:
    granularity = _one_of(values, "--recompute-granularity", RECOMPUTES[1:], None)  # Megatron has no 'none'
    if granularity is None and "--recompute-activations" in values:
        granularity = "selective"  # Megatron's alias (validate_args)
    modules = _recompute_modules(values, granularity or "none", unpriced)
    if granularity == "selective":
        # validate_args asserts 'recompute method is not yet supported for selective recomputing
        # granularity'; TransformerConfig.__post_init__ 'recompute_num_layers must be None' (both releases)
        for flag in ("--recompute-method", "--recompute-num-layers"):
            if flag in values:
                raise AdvisorError(f"{flag} is for --recompute-granularity full; Megatron-LM refuses it with selective")
    if granularity != "full":
        return Recomputation(recompute=granularity or "none", recompute_modules=modules or None)
    method = _one_of(values, "--recompute-method", RECOMPUTE_METHODS, None)
    if method is None:
        raise AdvisorError("--recompute-granularity full needs --recompute-method uniform|block "
                           "(Megatron-LM refuses it without)")
    if "--recompute-num-layers" not in values:  # TransformerConfig.__post_init__, both releases
        raise AdvisorError("--recompute-granularity full needs --recompute-num-layers N (megatron-core refuses it "
                           "without)")
    return Recomputation(recompute="full", recompute_method=method,
                         recompute_num_layers=_int(values, "--recompute-num-layers", 1))


def _tensor_parallel(values: dict, unpriced: list[str]) -> TensorParallel:
    """The overlap and its sub-options as Megatron reads them: the file and the sub-options only
    with --tp-comm-overlap (initialize.py reads the file only to set the overlap up; model_parallel_config.py,
    'Don't care if tp_comm_overlap is False'), the bulk switches not with --tp-comm-overlap-rs-dgrad
    (Transformer Engine turns both bulk overlaps off with it). Those ignored are named in ``unpriced``."""
    overlap = "--tp-comm-overlap" in values
    given = {name: [flag for flag in flags if flag in values] for name, flags in TP_COMM_SUB_OPTIONS.items()}
    ignored = [flag for flags in given.values() for flag in flags] if not overlap else []
    if overlap and given["tp_comm_overlap_rs_dgrad"]:
        ignored = given["tp_comm_bulk_dgrad"] + given["tp_comm_bulk_wgrad"]
    for flag in ignored:
        unpriced.append(f"{flag} without --tp-comm-overlap (Megatron ignores it; priced without)" if not overlap else
                        f"{flag} with --tp-comm-overlap-rs-dgrad (Transformer Engine then runs no bulk overlap; "
                        "priced without)")
    sub = {name: sub_option_on(name, bool(flags))
           for name, flags in given.items()} if overlap else {}
    return TensorParallel(sequence_parallel="--sequence-parallel" in values, tp_comm_overlap=overlap,
                          tp_comm_overlap_cfg=_last(values, "--tp-comm-overlap-cfg") if overlap else None, **sub)


def _attention(values: dict) -> Attention:
    backend = _last(values, "--attention-backend", "auto")
    if backend not in ("auto", "flash", "fused", "unfused", "local"):
        raise AdvisorError(f"--attention-backend must be one of auto, flash, fused, unfused, local, got {backend!r}")
    # --transformer-impl local builds megatron-core's own DotProductAttention, which computes every
    # score (core_v0.15.2 models/backends.py, LocalSpecProvider.core_attention): unfused, whatever
    # --attention-backend says
    impl = _last(values, "--transformer-impl", "transformer_engine")
    if impl not in ("transformer_engine", "local"):  # core_v0.19.0 also has inference_optimized: not training
        raise AdvisorError(f"--transformer-impl {impl!r} is not priced (transformer_engine or local)")
    local = impl == "local"
    flash = backend not in ("unfused", "local") and not local
    if "--no-create-attention-mask-in-dataloader" in values:
        # unfused, megatron-core builds the causal mask itself, once (fusions/fused_softmax.py,
        # get_default_causal_mask, cached): an s x s mask as the data loader's cached one
        mask = "off" if flash else "cached"
    elif {"--reset-attention-mask", "--reset-position-ids", "--eod-mask-loss"} & set(values):
        mask = "rebuilt"  # the mask differs per sample: built for each (GPTDataset)
    else:
        mask = "cached"
    return Attention(flash_attention=flash, dataloader_mask=mask,
                     transformer_impl="local" if local else "transformer_engine")


def _recompute_modules(values: dict, recompute: str, unpriced: list[str]) -> tuple[str, ...]:
    """A dense command's --recompute-modules (an MoE command's go to ``advisor.moe.readback``:
    ``advisor.megatron_readback`` takes them out first), by the flag's one reader."""
    if "--recompute-modules" not in values:
        return ()
    return read_recompute_modules({"recompute-modules": values["--recompute-modules"]}, recompute, unpriced)


def read_recompute_modules(values: dict, recompute: str, unpriced: list[str]) -> tuple[str, ...]:
    """The modules selective recomputation runs again, as Megatron reads the command: its default
    core_attn where --recompute-modules is absent (``transformer_config.py``, __post_init__, both
    releases), none without selective (Megatron ignores them; named in ``unpriced``). The one
    reader of the flag, an MoE command's (``advisor.moe.readback``) and a dense one's."""
    from advisor.moe.spec import RECOMPUTE_MODULES

    modules = values.get("recompute-modules")
    if recompute != "selective":
        if modules is not None:
            unpriced.append("--recompute-modules without --recompute-granularity selective (Megatron ignores them; "
                            "priced without)")
        return ()
    if modules is None:
        return ("core_attn",)
    if not modules:  # core_v0.15.2's nargs='*' takes it and recomputes nothing; core_v0.19.0's nargs='+' refuses it
        raise AdvisorError("--recompute-modules names no module: give the modules to recompute, or drop "
                           "--recompute-granularity selective")
    if unknown := sorted(set(modules) - set(RECOMPUTE_MODULES)):
        raise AdvisorError(f"--recompute-modules {' '.join(unknown)}: not one of Megatron's "
                           f"({', '.join(RECOMPUTE_MODULES)})")
    return tuple(modules)


def parse_training_args(argv: Sequence[str], release=None) -> tuple[TrainingOptions, list[str]]:
    """(the options of a Megatron-LM argument list, the flags in it that change memory or time but
    that the options do not describe). Flags left out take ``release``'s defaults (default the
    newest release the advisor knows); layout, model, data and other flags that are not training
    options are left to their readers. AdvisorError (one line) where Megatron would refuse the
    combination."""
    values, unpriced = _flag_values(argv)
    tp = _int(values, "--tensor-model-parallel-size", 1)
    if "--tp-comm-overlap" in values and _last(values, "--transformer-impl", "transformer_engine") != "transformer_engine":
        raise AdvisorError("--tp-comm-overlap needs Transformer Engine (--transformer-impl transformer_engine)")
    if "--optimizer-cpu-offload" in values and "--use-precision-aware-optimizer" not in values:
        raise AdvisorError("--optimizer-cpu-offload needs --use-precision-aware-optimizer (Megatron-LM refuses it "
                           "without)")
    divisible = _int(values, "--make-vocab-size-divisible-by", eq.MEGATRON_VOCAB_DIVISIBLE_BY)
    fraction_text = _last(values, "--optimizer-offload-fraction", str(Offload().optimizer_offload_fraction))
    try:
        fraction = float(fraction_text)
    except ValueError:
        raise AdvisorError(f"--optimizer-offload-fraction must be a number, got {fraction_text!r}") from None
    if "--optimizer-cpu-offload" in values:  # Megatron runs them, FP32 whatever they say: named, not refused
        for flag in ("--main-params-dtype", "--exp-avg-dtype", "--exp-avg-sq-dtype"):
            if _last(values, flag, "fp32") != "fp32":
                unpriced.append(f"{flag} {_last(values, flag)} (ignored by Megatron with --optimizer-cpu-offload: its "
                                "HybridDeviceOptimizer keeps FP32 states, as priced)")
                del values[flag]
    options = TrainingOptions(
        precision=_precision(values, unpriced, release), data_parallel=_data_parallel(values, release, unpriced),
        tensor_parallel=_tensor_parallel(values, unpriced),
        recomputation=_recomputation(values, unpriced), attention=_attention(values),
        offload=Offload(optimizer_cpu_offload="--optimizer-cpu-offload" in values,
                        optimizer_offload_fraction=fraction),
        optimizer_states=OptimizerStates(
            precision_aware_optimizer="--use-precision-aware-optimizer" in values,
            main_params_dtype=_one_of(values, "--main-params-dtype", MAIN_PARAMS_DTYPES, "fp32"),
            exp_avg_dtype=_one_of(values, "--exp-avg-dtype", MOMENT_DTYPES, "fp32"),
            exp_avg_sq_dtype=_one_of(values, "--exp-avg-sq-dtype", MOMENT_DTYPES, "fp32")),
        loss=Loss(cross_entropy_fusion=_one_of(values, "--cross-entropy-fusion-impl", CROSS_ENTROPY_FUSIONS[1:],
                                               MEGATRON_CROSS_ENTROPY_KERNEL)
                  if "--cross-entropy-loss-fusion" in values else "none"),
        fusions=Fusions(bias_swiglu_fusion=SWIGLU_UNFUSED_FLAG not in values),
        vocab_divisible_by=None if divisible == 1 else divisible,
    )
    te_cross_entropy_problem(options, release_defaults(release))
    if options.data_parallel.torch_fsdp2:  # required by FSDP2 and priced with it
        unpriced = [flag for flag in unpriced if flag != "--no-gradient-accumulation-fusion"]
    if tp == 1 and options.tensor_parallel.tp_comm_overlap:  # at_tp would drop it: Megatron refuses the command
        raise AdvisorError(TP1_OVERLAP_PROBLEM)
    return options.at_tp(tp), unpriced
