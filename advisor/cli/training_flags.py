"""The training options on the command line, with Megatron-LM's own flag names: the one place
that turns click's values into ``advisor.options.TrainingOptions``."""

from __future__ import annotations

import functools
from typing import Callable

import click
from click.core import ParameterSource

from advisor import limits
from advisor.cli.options import (DEGREE, LAYERS, MICRO_BATCH, VOCABULARY, Bounded, InputError, InputPath,
                                 apply_options)
from advisor.errors import AdvisorError
from advisor.options.training import (
    CROSS_ENTROPY_FUSIONS, DATALOADER_MASKS, FP8_FORMATS, FP8_RECIPES, FSDP_GRAD_COMM_DTYPES, FSDP_MAIN_PARAMS_DTYPES,
    FSDP_STRATEGIES, MAIN_PARAMS_DTYPES,
    MOMENT_DTYPES, RECOMPUTE_METHODS, RECOMPUTES, TP_COMM_SUB_FLAGS, DataParallel, sub_option_on,
)

_FRACTION = Bounded(limits.OFFLOAD_FRACTION, integer=False, metavar="FRACTION")

_SUB_OPTION_HELP = {
    "tp_comm_overlap_ag": "no userbuffers for the all-gathers (before QKV and FC1, and of the projection's and FC2's "
                          "output gradients); they run exposed, as without the overlap.",
    "tp_comm_overlap_rs": "no userbuffers for the reduce-scatters after the projection and FC2; they run exposed.",
    "tp_comm_overlap_rs_dgrad": "QKV's and FC1's dgrad reduce-scatter pipelined beside dgrad instead of beside wgrad "
                                "(Transformer Engine then runs neither bulk overlap).",
    "tp_comm_bulk_dgrad": "QKV's and FC1's input re-gather in NCCL behind dgrad, which keeps the 16 SMs the bulk "
                          "overlap takes.",
    "tp_comm_bulk_wgrad": "QKV's and FC1's dgrad reduce-scatter in NCCL, exposed, and wgrad keeps its SMs.",
}
"""What each of --tp-comm-overlap's sub-options (``TP_COMM_SUB_FLAGS``) does, as --help says it."""

def on_unlike_megatron(where: str = "") -> str:
    """--help's sentence for a switch the advisor turns on by default where Megatron-LM's flag is
    off: a user who copies the advisor's flags gets it, one who writes their own must add it."""
    return f"On here by default, off in Megatron: the flags the advisor writes carry it{where}."


NO_BIAS_SWIGLU_FUSION = click.option(
    "--no-bias-swiglu-fusion", is_flag=True, default=False,
    help="Megatron's eager SwiGLU instead of its fused kernel: each layer keeps 5 h_ffn-wide tensors a token, not 3 "
         "(Eq. 18, which counts 4: 2 s b h_ffn / (t c) bytes more; the calibrated model: 4; none with "
         "--recompute-modules mlp), and runs three element-wise kernels, not one.")
"""The one declaration of the switch (``TrainingOptions.fusions``), shared by the commands that
price options (``TRAINING_FLAGS``) and 'advisor profile plan', whose runs carry it."""

TRAINING_FLAGS = [
    click.option("--distributed-optimizer/--no-distributed-optimizer", default=True, show_default=True,
                 help="Shard Adam states over DP x CP (Megatron's --use-distributed-optimizer). "
                      + on_unlike_megatron()),
    click.option("--grad-dtype", type=click.Choice(["fp32", "bf16"]), default=None,
                 help="Gradient accumulation and DP reduction dtype, in memory and time. fp32 (default): "
                      "--accumulate-allreduce-grads-in-fp32, the paper's and Megatron's default with --bf16; "
                      "bf16: --grad-reduce-in-bf16 (half the gradient bytes and the DP reduce traffic)."),
    click.option("--grad-reduce-in-bf16", is_flag=True, default=False,
                 help="Megatron's name for --grad-dtype bf16."),
    click.option("--accumulate-allreduce-grads-in-fp32", "grads_in_fp32", is_flag=True, default=False,
                 help="Megatron's name for --grad-dtype fp32."),
    click.option("--bf16", "bf16", is_flag=True, default=False,
                 help="Megatron's --bf16: BF16 weights and compute, what the advisor prices anyway (FP8 GEMMs: "
                      "--fp8-format); accepted so Megatron's flags can be pasted."),
    click.option("--overlap-grad-reduce/--no-overlap-grad-reduce", default=True, show_default=True,
                 help="Reduce-scatter gradients bucket by bucket during the backward pass; off, the whole "
                      "reduction is exposed after it. " + on_unlike_megatron()),
    click.option("--overlap-param-gather/--no-overlap-param-gather", default=None,
                 help="All-gather updated parameters during the next forward pass (needs --overlap-grad-reduce "
                      "and the distributed optimizer or FSDP). Default: on where Megatron allows it (off in "
                      "Megatron: the flags the advisor writes then carry it)."),
    click.option("--tp-comm-overlap", is_flag=True, default=False,
                 help="Transformer Engine userbuffers hide the TP all-gathers and reduce-scatters behind the "
                      "GEMMs (needs Transformer Engine and --sequence-parallel; TP > 1 only)."),
    click.option("--tp-comm-overlap-cfg", type=InputPath(dir_okay=False), default=None, metavar="FILE",
                 help="With --tp-comm-overlap: Megatron's YAML of per-buffer userbuffers settings (method, num_sm, "
                      "num_splits, set_sm_margin, ...), priced buffer by buffer and emitted as given. Default: "
                      "Transformer Engine's."),
    *(click.option(TP_COMM_SUB_FLAGS[field], is_flag=True, default=False, help=f"With --tp-comm-overlap: {text}")
      for field, text in _SUB_OPTION_HELP.items()),
    click.option("--use-megatron-fsdp", is_flag=True, default=False,
                 help="Megatron-FSDP instead of DDP: shards per --data-parallel-sharding-strategy over DP x CP, "
                      "gathering and reduce-scattering layer by layer; emitted with --ckpt-format fsdp_dtensor."),
    click.option("--data-parallel-sharding-strategy", type=click.Choice(FSDP_STRATEGIES), default=None,
                 metavar="STRATEGY",
                 help="With --use-megatron-fsdp: no_shard (DDP-like), optim (ZeRO-1), optim_grads (ZeRO-2), "
                      "optim_grads_params (ZeRO-3). Default: --megatron-version's (no_shard in 0.15, "
                      "optim_grads_params in 0.19); always emitted."),
    click.option("--megatron-fsdp-main-params-dtype", "fsdp_main_params_dtype",
                 type=click.Choice(FSDP_MAIN_PARAMS_DTYPES), default="fp32", show_default=True,
                 help="With --use-megatron-fsdp, core 0.19 only: its main weights, which Adam steps (its moments stay "
                      "FP32): bf16/fp16 keep 2 bytes per parameter instead of 4, auto none (Adam steps the BF16 "
                      "weights themselves)."),
    click.option("--megatron-fsdp-grad-comm-dtype", "fsdp_grad_comm_dtype",
                 type=click.Choice(FSDP_GRAD_COMM_DTYPES), default="auto", show_default=True,
                 help="With --use-megatron-fsdp, core 0.19 only: the dtype its gradients are reduced in (auto: the "
                      "main gradients'): the DP reduce traffic and, with optim_grads(_params), the un-sharded "
                      "gradient buckets."),
    click.option("--optimizer-cpu-offload", is_flag=True, default=False,
                 help="Keep optimizer states in host memory and step them on the CPU (Megatron's "
                      "HybridDeviceOptimizer; emitted with --use-precision-aware-optimizer): frees up to 12 "
                      "bytes per parameter, costs the host link and CPU Adam time."),
    click.option("--use-precision-aware-optimizer", is_flag=True, default=False,
                 help="Transformer Engine's FusedAdam keeps the optimizer states in the dtypes below (needs "
                      "Transformer Engine and the distributed optimizer): FP32 master weights of BF16 weights "
                      "cost 2 bytes (TE stores the 16 bits BF16 lacks; with the delayed --fp8-recipe, Megatron's "
                      "default), so the states take 10 bytes per parameter, not 12."),
    click.option("--main-params-dtype", type=click.Choice(MAIN_PARAMS_DTYPES), default="fp32", show_default=True,
                 help="With --use-precision-aware-optimizer: the master weights."),
    click.option("--exp-avg-dtype", type=click.Choice(MOMENT_DTYPES), default="fp32", show_default=True,
                 help="With --use-precision-aware-optimizer: Adam's momentum (bf16 is Megatron-Bridge's "
                      "DeepSeek-V3 and Qwen3 recipes' choice)."),
    click.option("--exp-avg-sq-dtype", type=click.Choice(MOMENT_DTYPES), default="fp32", show_default=True,
                 help="With --use-precision-aware-optimizer: Adam's variance."),
    click.option("--fp8-format", type=click.Choice(FP8_FORMATS), default=None,
                 help="Transformer Engine FP8 GEMMs (hybrid: E4M3 forward, E5M2 backward). Changes numerics, so "
                      "never chosen for you. Prices FP8 weight copies, FP8-saved activations and the GPU's FP8 "
                      "rate; attention stays BF16."),
    click.option("--fp8-recipe", type=click.Choice(FP8_RECIPES), default="delayed", show_default=True,
                 help="With --fp8-format: the scaling recipe (mxfp8 needs Blackwell). Megatron also hands it to "
                      "the precision-aware optimizer, FP8 or not: other than delayed, megatron-core keeps FP32 "
                      "master weights itself (4 bytes with --main-params-dtype fp32, as Megatron-Bridge's BF16 "
                      "recipes run)."),
    click.option("--fp8-param-gather", is_flag=True, default=False,
                 help="With --fp8-format: keep compute weights only in FP8 and all-gather them in FP8."),
    click.option("--sequence-parallel/--no-sequence-parallel", default=True, show_default=True,
                 help="Sequence parallelism with TP > 1 (Megatron's --sequence-parallel); without it 8sbh per "
                      "layer stays whole per TP rank. " + on_unlike_megatron(" at TP > 1")),
    click.option("--flash-attn/--no-flash-attn", default=True, show_default=True,
                 help="Without FlashAttention the softmax output (2as^2b per layer) is kept."),
    click.option("--dataloader-mask", type=click.Choice(DATALOADER_MASKS), default=None,
                 help="The data loader's s x s attention mask: off (--no-create-attention-mask-in-dataloader, "
                      "default with flash attention), cached (built once: Megatron's default), rebuilt (per "
                      "sample, with --reset-attention-mask/--eod-mask-loss: priced as host time)."),
    click.option("--cross-entropy-loss-fusion", is_flag=True, default=False,
                 help="Megatron's fused cross-entropy (--cross-entropy-fusion-impl picks the kernel)."),
    click.option("--cross-entropy-fusion-impl", type=click.Choice(CROSS_ENTROPY_FUSIONS[1:]), default="native",
                 show_default=True,
                 help="With --cross-entropy-loss-fusion: te (Transformer Engine's kernel, 0.15 only) writes the "
                      "gradient into the BF16 logits and keeps no FP32 copy (4 s b v / (t c) less on the last "
                      "stage); native keeps the FP32 softmax as the unfused loss does."),
    NO_BIAS_SWIGLU_FUSION,
    click.option("--vocab-divisible-by", type=VOCABULARY, default=None,
                 help="Pad v to a multiple of this x TP, like Megatron's "
                      "--make-vocab-size-divisible-by (128 there). Default: 1, i.e. v padded to a multiple of TP "
                      "as Megatron does even then (the paper's vocabularies need none)."),
    click.option("--megatron-version", default=None, metavar="RELEASE",
                 help="The Megatron-LM release (0.15, 0.19, core_v0.15.2, ...) whose defaults and flags apply. "
                      "Default: the newest the advisor knows."),
]
"""--distributed-optimizer and --grad-dtype first (as before), then the rest."""

TP_COMM_SWITCHES = {flag[2:].replace("-", "_"): field for field, flag in TP_COMM_SUB_FLAGS.items()}
"""The overlap's sub-option flags (click's names) and the ``TensorParallel`` field each sets
(``sub_option_on``)."""

_NAMES = ("distributed_optimizer", "grad_dtype", "grad_reduce_in_bf16", "grads_in_fp32", "bf16", "overlap_grad_reduce", "overlap_param_gather",
          "tp_comm_overlap", "tp_comm_overlap_cfg", *TP_COMM_SWITCHES, "use_megatron_fsdp",
          "data_parallel_sharding_strategy", "fsdp_main_params_dtype", "fsdp_grad_comm_dtype",
          "use_torch_fsdp2", "optimizer_cpu_offload", "optimizer_offload_fraction", "use_precision_aware_optimizer", "main_params_dtype",
          "exp_avg_dtype", "exp_avg_sq_dtype", "fp8_format", "fp8_recipe", "fp8_param_gather", "sequence_parallel",
          "flash_attn", "dataloader_mask", "cross_entropy_loss_fusion", "cross_entropy_fusion_impl",
          "no_bias_swiglu_fusion", "vocab_divisible_by", "megatron_version")


def _torch_fsdp2_option(priced: bool):
    """--use-torch-fsdp2, in --help only where it is ``priced`` (advisor estimate); elsewhere a hidden
    option, so that a Megatron user's flag is refused with where it is priced (``training_options``),
    not as an option no command has."""
    return click.option("--use-torch-fsdp2", is_flag=True, default=False, hidden=not priced,
                        help="torch FSDP2 instead of DDP: weights, gradients and optimizer states sharded over "
                             "DP x CP, gathered and reduce-scattered layer by layer in BF16; without the distributed "
                             "optimizer, PP 1 and untied embeddings only (Megatron's rules).")


def _offload_fraction_option(searchable: bool):
    """--optimizer-offload-fraction, whose help names what else offloads in a sweep (``searchable``)."""
    offload = "--optimizer-cpu-offload, or the offload --sharding auto may try" if searchable else \
        "--optimizer-cpu-offload"
    return click.option("--optimizer-offload-fraction", type=_FRACTION, default=1.0, show_default=True,
                        help=f"With {offload}: the share of the optimizer offloaded.")


def sharding_search_option():
    return click.option(
        "--sharding", type=click.Choice(["auto", "fixed"]), default="auto", show_default=True,
        help="auto: when no layout fits with the options given, try Megatron-FSDP (optim_grads, then "
             "optim_grads_params) and then optimizer CPU offload (an MoE model: those it prices), and say which "
             "the rows use; fixed: only the options given.")


def given(name: str) -> bool:
    """Whether the running command's option ``name`` was given (on the command line or in the
    environment), not left at its default: a dependent option's default is never an error."""
    ctx = click.get_current_context(silent=True)
    source = ctx.get_parameter_source(name) if ctx is not None else None
    return source in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT, ParameterSource.PROMPT)


def _needs_problem(v: dict, offload_searched: bool) -> str | None:
    """An option given without the one it qualifies (Megatron would ignore it): the line that
    says so. ``offload_searched``: the sweep's --sharding auto may turn optimizer offload on, at
    --optimizer-offload-fraction."""
    if v["data_parallel_sharding_strategy"] and not v["use_megatron_fsdp"]:
        return "--data-parallel-sharding-strategy needs --use-megatron-fsdp"
    if v["fp8_param_gather"] and v["fp8_format"] is None:
        return "--fp8-param-gather needs --fp8-format e4m3|hybrid"
    if (v["fp8_recipe"] != "delayed" or given("fp8_recipe")) and v["fp8_format"] is None \
            and not v["use_precision_aware_optimizer"]:
        # with the precision-aware optimizer alone it decides who keeps the masters (megatron-core)
        return "--fp8-recipe needs --fp8-format e4m3|hybrid (or --use-precision-aware-optimizer, whose masters it decides)"
    fraction = v["optimizer_offload_fraction"] != 1.0 or given("optimizer_offload_fraction")
    if fraction and not v["optimizer_cpu_offload"] and not offload_searched:
        return "--optimizer-offload-fraction needs --optimizer-cpu-offload"
    if (v["cross_entropy_fusion_impl"] != "native" or given("cross_entropy_fusion_impl")) \
            and not v["cross_entropy_loss_fusion"]:
        return "--cross-entropy-fusion-impl needs --cross-entropy-loss-fusion"
    return None


def training_options(kwargs: dict, fixed: dict, *, offload_searched: bool = False, torch_fsdp2: bool = False):
    """Pop the training flags' values from ``kwargs`` (leaving ``release`` for the command) and
    build the options; one line (InputError) for a combination Megatron would refuse, for an
    option given without the one it qualifies (not with --from-command, whose own line names
    the option the command decides), or for --use-torch-fsdp2 where the command does not price
    it (``torch_fsdp2`` false)."""
    from advisor.options import TrainingOptions, release_defaults
    from advisor.options.flags import fsdp_dtypes_problem, te_cross_entropy_problem

    v = {name: kwargs.pop(name) for name in _NAMES}
    try:
        release = release_defaults(v["megatron_version"])
        if v["grad_reduce_in_bf16"] and v["grad_dtype"] == "fp32":
            raise AdvisorError("--grad-reduce-in-bf16 contradicts --grad-dtype fp32")
        if v["grads_in_fp32"] and (v["grad_reduce_in_bf16"] or v["grad_dtype"] == "bf16"):
            raise AdvisorError("--accumulate-allreduce-grads-in-fp32 contradicts "
                               + ("--grad-reduce-in-bf16" if v["grad_reduce_in_bf16"] else "--grad-dtype bf16"))
        if not kwargs.get("from_command") and (problem := _needs_problem(v, offload_searched)):
            raise AdvisorError(problem)
        fsdp = None
        if v["use_megatron_fsdp"]:
            fsdp = v["data_parallel_sharding_strategy"] or release.fsdp_sharding_strategy
        if v["use_torch_fsdp2"] and not torch_fsdp2:  # PP 1 only, and not an escalation step
            command = click.get_current_context().info_name
            raise AdvisorError(f"advisor {command} does not search torch FSDP2 (--use-torch-fsdp2): price a layout "
                               "with advisor estimate --use-torch-fsdp2 (PP 1)")
        # --distributed-optimizer is on by default, and torch FSDP2 runs without it; what Megatron refuses
        # (two FSDPs) is DataParallel's to say.
        torch_fsdp2 = v["use_torch_fsdp2"]
        distributed = DataParallel.distributed_optimizer_for(v["distributed_optimizer"] and not torch_fsdp2, fsdp)
        gather = DataParallel.overlap_param_gather_for(v["overlap_param_gather"], v["overlap_grad_reduce"], distributed)
        mask = v["dataloader_mask"] or ("off" if v["flash_attn"] else "cached")
        fusion = v["cross_entropy_fusion_impl"] if v["cross_entropy_loss_fusion"] else "none"
        if kwargs.get("from_command") and not v["tp_comm_overlap"]:  # the command's own line names it
            v["tp_comm_overlap_cfg"] = None
        options = TrainingOptions().with_(
            grad_reduce_dtype="bf16" if v["grad_reduce_in_bf16"] or v["grad_dtype"] == "bf16" else "fp32",
            fp8_format=v["fp8_format"], fp8_recipe=v["fp8_recipe"], fp8_param_gather=v["fp8_param_gather"],
            distributed_optimizer=distributed, overlap_grad_reduce=v["overlap_grad_reduce"],
            overlap_param_gather=gather, fsdp_strategy=fsdp, torch_fsdp2=torch_fsdp2,
            fsdp_main_params_dtype=v["fsdp_main_params_dtype"], fsdp_grad_comm_dtype=v["fsdp_grad_comm_dtype"],
            tp_comm_overlap=v["tp_comm_overlap"], tp_comm_overlap_cfg=v["tp_comm_overlap_cfg"],
            **{field: sub_option_on(field, v[name]) for name, field in TP_COMM_SWITCHES.items()},
            sequence_parallel=v["sequence_parallel"], flash_attention=v["flash_attn"], dataloader_mask=mask,
            optimizer_cpu_offload=v["optimizer_cpu_offload"],
            optimizer_offload_fraction=v["optimizer_offload_fraction"], vocab_divisible_by=v["vocab_divisible_by"],
            precision_aware_optimizer=v["use_precision_aware_optimizer"], main_params_dtype=v["main_params_dtype"],
            exp_avg_dtype=v["exp_avg_dtype"], exp_avg_sq_dtype=v["exp_avg_sq_dtype"],
            cross_entropy_fusion=fusion, bias_swiglu_fusion=not v["no_bias_swiglu_fusion"], **fixed)
        te_cross_entropy_problem(options, release)
        fsdp_dtypes_problem(options, release)
    except AdvisorError as exc:
        raise InputError(str(exc)) from None
    kwargs["release"] = release
    return options


def _recompute_options(searchable: bool) -> list:
    if not searchable:
        return [
            click.option("--recompute", type=click.Choice(RECOMPUTES), default="none",
                         show_default=True, help="Activation recomputation (--recompute-granularity)."),
            click.option("--recompute-method", type=click.Choice(RECOMPUTE_METHODS), default=None,
                         help="With --recompute full: block checkpoints the first N layers of each chunk, "
                              "uniform every group of N; give it with --recompute-num-layers (neither: "
                              "uniform 1, every layer)."),
            click.option("--recompute-num-layers", type=LAYERS, default=None,
                         help="With --recompute full and --recompute-method: N."),
        ]
    return [
        click.option("--recompute", type=click.Choice(("auto", *RECOMPUTES)), default="auto",
                     show_default=True,
                     help="auto: none, or the fewest recomputed layers needed to fit (with a time model: "
                          "whatever is fastest); none: the paper's space; selective/full: every row."),
        click.option("--recompute-method", type=click.Choice(RECOMPUTE_METHODS), default=None,
                     help="With --recompute full: pin the method (default: block, N searched)."),
        click.option("--recompute-num-layers", type=LAYERS, default=None,
                     help="With --recompute full: pin N (default: searched)."),
        click.option("--split", type=click.Choice(["auto", "even"]), default="auto", show_default=True,
                     help="auto: any PP, each row's layers per stage chosen by the planner; even: Megatron's "
                          "default split only (PP divides the layers: the paper's space)."),
        click.option("--vpp", default="auto", show_default=True, metavar="auto|N",
                     help="Virtual pipeline stages per rank: auto searches them (they can only win on time, "
                          "so with a time model), N pins them (1: no interleaving)."),
    ]


def _pin_options() -> list:
    """The sweep's --tp, --cp, --pp and --mbs: each pins its dimension to one value (any Megatron
    launches, not only the powers of 2 the search tries); the rest stay searched."""
    return [
        click.option("--tp", "pin_tp", type=DEGREE, default=None,
                     help="Sweep only this tensor parallel size (default: searched, powers of 2 up to "
                          "--gpus-per-node)."),
        click.option("--cp", "pin_cp", type=DEGREE, default=None,
                     help="Sweep only this context parallel size (default: searched, powers of 2)."),
        click.option("--pp", "pin_pp", type=DEGREE, default=None,
                     help="Sweep only this pipeline parallel size (default: searched, any that divides)."),
        click.option("--mbs", "pin_mbs", type=MICRO_BATCH, default=None,
                     help="Sweep only this micro-batch size (default: searched, powers of 2)."),
    ]


def memory_options(func: Callable | None = None, *, searchable: bool = False, torch_fsdp2: bool = False) -> Callable:
    """The training options (Megatron-LM's flag names) -> ``options: TrainingOptions``
    (``advisor.options``), from which memory, time and the emitted flags all derive. Defaults
    are the advisor's stack (seed 004's, with DP overlap).

    ``searchable`` (sweep): recomputation, the split and VPP become dimensions of the search,
    handed over as ``space: SpaceOptions`` too. ``torch_fsdp2`` (estimate): the command prices
    --use-torch-fsdp2, which the others refuse and leave out of their --help."""
    if func is None:
        return functools.partial(memory_options, searchable=searchable, torch_fsdp2=torch_fsdp2)

    @functools.wraps(func)
    def wrapper(*args, recompute, recompute_method, recompute_num_layers, **kwargs):
        fixed = dict(recompute=recompute, recompute_method=recompute_method, recompute_num_layers=recompute_num_layers)
        # both default to None: estimate fills in uniform 1 (_method_and_layers), the sweep searches them
        pinned = given("recompute_method") or given("recompute_num_layers") or (
            searchable and (recompute_method is not None or recompute_num_layers is not None))
        if recompute != "full" and pinned and not kwargs.get("from_command"):
            raise InputError("--recompute-method and --recompute-num-layers need --recompute full")
        if not searchable:  # with --from-command the command's own are read, and these refused there
            fixed.update(_method_and_layers(recompute_method, recompute_num_layers, kwargs.get("from_command")))
        offload_searched = False
        if searchable:
            from advisor.space import SpaceOptions

            from advisor.parallel import Pinned

            kwargs["space"] = SpaceOptions(
                split=kwargs.pop("split"), vpp=_vpp(kwargs.pop("vpp")), recompute=recompute,
                recompute_method=recompute_method, recompute_num_layers=recompute_num_layers,
                sharding=kwargs.pop("sharding"), overlap_param_gather_given=given("overlap_param_gather"),
                pinned=Pinned(*(kwargs.pop(f"pin_{name}") for name in ("tp", "cp", "pp", "mbs"))))
            offload_searched, fixed = kwargs["space"].sharding == "auto", {}
        options = training_options(kwargs, fixed, offload_searched=offload_searched, torch_fsdp2=torch_fsdp2)
        return func(*args, options=options, **kwargs)

    return apply_options(
        [
            *(_pin_options() if searchable else []),
            *TRAINING_FLAGS[:2],
            *_recompute_options(searchable),
            *([sharding_search_option()] if searchable else []),
            *TRAINING_FLAGS[2:],
            _offload_fraction_option(searchable),
            _torch_fsdp2_option(torch_fsdp2),
        ],
        wrapper,
    )


def _method_and_layers(method: str | None, layers: int | None, from_command=None) -> dict:
    """A pinned full recomputation's method and N. Megatron-LM has no default for either and
    refuses one without the other (core_v0.15.2 transformer_config.py, __post_init__): a sweep
    row's "full block 27" copied as --recompute-num-layers 27 alone must not be priced as uniform
    27. Neither given: every layer (uniform 1), what "--recompute full" asks for."""
    if (method is None) != (layers is None) and from_command is None:
        given_flag, missing = (("--recompute-method " + method, "--recompute-num-layers N") if layers is None
                               else (f"--recompute-num-layers {layers}", "--recompute-method block or uniform"))
        raise InputError(f"{given_flag} needs {missing}, as Megatron-LM does (it has no default; block N "
                         "checkpoints the first N layers of each chunk, uniform N every group of N)")
    return dict(recompute_method=method or "uniform", recompute_num_layers=layers or 1)


def _vpp(text: str) -> int | None:
    if text == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise InputError(f"--vpp must be auto or a positive integer, got {text!r}")
    return value
