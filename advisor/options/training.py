"""One description of a run's training options: the single source from which the memory
estimate (``MemoryOptions``), the time model (``TimeOptions``) and the emitted Megatron-LM flags
(``advisor.options.flags``) are derived, and into which Megatron-LM flags parse back.

As megatron-core's own ``DistributedDataParallelConfig`` / ``OptimizerConfig`` /
``ModelParallelConfig``: a few small frozen dataclasses by concern, each field with its
docstring, composed into ``TrainingOptions``. Field names are unique over all concerns, so a
run's options also read and write as one flat dict (``flat``, ``changed``, ``from_dict``): the
``options`` of a sweep row or an estimate.

Defaults are the advisor's stack, seed 004's (the paper's) plus the overlap its time model has
always assumed: BF16 weights, FP32 gradient reduction, the distributed optimizer with
``--overlap-grad-reduce --overlap-param-gather``, sequence parallelism, flash attention, no
recomputation, no FP8, no FSDP, no offload. Megatron-LM's own defaults differ (no distributed
optimizer, no overlap, no SP): every emitted list states each option explicitly, and
``parse_training_args`` applies Megatron's defaults to flags a command line leaves out.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Literal, get_args

from advisor import limits
from advisor.errors import AdvisorError
from advisor.options.releases import release_defaults
from advisor.releases import FSDP_GRAD_COMM, FSDP_MAIN_PARAMS

ParamsDtype = Literal["bfloat16", "float16", "float32"]
GradDtype = Literal["fp32", "bf16", "fp16"]
Fp8Format = Literal["e4m3", "hybrid"]
Fp8Recipe = Literal["delayed", "tensorwise", "mxfp8", "blockwise"]
FsdpStrategy = Literal["no_shard", "optim", "optim_grads", "optim_grads_params"]
Recompute = Literal["none", "selective", "full"]
RecomputeMethod = Literal["uniform", "block"]
DataloaderMask = Literal["off", "cached", "rebuilt"]
TransformerImpl = Literal["transformer_engine", "local"]
CrossEntropyFusion = Literal["none", "native", "te"]
MainParamsDtype = Literal["fp32", "fp16"]
MomentDtype = Literal["fp32", "fp16", "bf16", "fp8"]
FsdpMainParamsDtype = Literal["fp32", "bf16", "fp16", "auto"]
FsdpGradCommDtype = Literal["fp32", "fp16", "bf16", "auto"]

# Each choice's values, from its type: the fields' checks, the command line's choices and the
# flag readers all take them from here.
PARAMS_DTYPES: tuple[str, ...] = get_args(ParamsDtype)
GRAD_DTYPES: tuple[str, ...] = get_args(GradDtype)
FP8_FORMATS: tuple[str, ...] = get_args(Fp8Format)
FP8_RECIPES: tuple[str, ...] = get_args(Fp8Recipe)
FSDP_STRATEGIES: tuple[str, ...] = get_args(FsdpStrategy)
RECOMPUTES: tuple[str, ...] = get_args(Recompute)
RECOMPUTE_METHODS: tuple[str, ...] = get_args(RecomputeMethod)
DATALOADER_MASKS: tuple[str, ...] = get_args(DataloaderMask)
TRANSFORMER_IMPLS: tuple[str, ...] = get_args(TransformerImpl)
CROSS_ENTROPY_FUSIONS: tuple[str, ...] = get_args(CrossEntropyFusion)
MAIN_PARAMS_DTYPES: tuple[str, ...] = get_args(MainParamsDtype)
MOMENT_DTYPES: tuple[str, ...] = get_args(MomentDtype)
FSDP_MAIN_PARAMS_DTYPES: tuple[str, ...] = get_args(FsdpMainParamsDtype)
FSDP_GRAD_COMM_DTYPES: tuple[str, ...] = get_args(FsdpGradCommDtype)


def _choice(value, allowed, what: str) -> None:
    if value not in allowed:
        names = [str(name) for name in allowed]
        # a saved row's options are JSON: null and true, not Python's None and True
        raise AdvisorError(f"{what} must be {', '.join(names[:-1])} or {names[-1]}, got {limits.json_text(value)}")


def _switches(concern) -> None:
    """Every bool field of ``concern`` holds a bool: a saved row's options are JSON a person may
    edit, where "false" would be a switch read as on."""
    for field in fields(concern):
        if field.type == "bool":  # the annotation's text (``from __future__ import annotations``)
            limits.check_bool(getattr(concern, field.name), field.name)


def megatron_grad_reduce_dtype(params_dtype: str) -> str:
    """What Megatron-LM reduces gradients in unless told (megatron/training/arguments.py,
    validate_args): FP32 with --bf16 (it sets --accumulate-allreduce-grads-in-fp32), FP16 with
    --fp16, FP32 in an FP32 run. The one statement of it: the flags written, the flags read and
    the titles all follow it."""
    return "fp16" if params_dtype == "float16" else "fp32"


FSDP_MAIN_WEIGHT_KINDS = {"bf16": "fsdp_half", "fp16": "fsdp_half", "auto": "fsdp_none"}
"""How Megatron-FSDP's main weights are kept (``memory_levers.STATE_BYTES``'s keys) by its
--megatron-fsdp-main-params-dtype other than fp32: a 2-byte main-weight buffer, or none ('auto':
the optimizer steps the compute weights' buffer, ``ParamAndGradBuffer._init_distributed_params``,
'fall-back logic on mbuf -> wbuf'). Its optimizer is Transformer Engine's FusedAdam without
master weights (not the precision-aware optimizer, which the options refuse with FSDP), whose
moments are FP32 whatever the parameter's dtype (``_initialize_state``: ``exp_avg_dtype``,
default torch.float32)."""

_FSDP_AUTO_FP8 = (
    f"{FSDP_MAIN_PARAMS} auto with --fp8-param-gather cannot train: with no main weights Megatron-FSDP has "
    "Adam step the FP8 weights' own bytes, which Transformer Engine's FusedAdam refuses ('only support model "
    "weights in fp32, fp16, bf16 and fp8') or, unsharded, leaves unchanged; use fp32, bf16 or fp16")
"""Why core_v0.19.0 cannot train Megatron-FSDP's 'auto' main weights with FP8 weights
(--fp8-param-gather makes them FP8: argument_utils.py ``fp8_param = fp8_param_gather``).
megatron_fsdp/param_and_grad_buffer.py: a group of FP8 weights has a uint8 compute buffer
(``_init_each_parameter_group_buffers``: ``torch.uint8 if is_dtype_float8``) and no main weight
buffer with 'auto' (None), so ``_init_distributed_params`` gives the optimizer that uint8 buffer's
shard ('mbuf -> wbuf'), or under no_shard the FP8 parameter itself, and
``copy_main_weights_to_model_weights`` skips the group ('if mbuf is None: continue'): nothing
re-quantizes the weights. Transformer Engine's FusedAdam.step raises 'FusedAdam only support
model weights in fp32, fp16, bf16 and fp8' for a uint8 tensor, and without master weights never
applies its FP8 list (``p_fp8_model``: only the master-weights branch steps it)."""

FSDP_OFFLOAD = (
    "--optimizer-cpu-offload with Megatron-FSDP (--use-megatron-fsdp) cannot run on megatron-core 0.15 or 0.19: "
    "HybridDeviceOptimizer pins a CPU copy of each offloaded parameter (param.detach().clone().cpu().pin_memory(), "
    "optimizer/cpu_offloading/hybrid_optimizer.py:274) and Megatron-FSDP's parameters are DTensors, which torch "
    "cannot pin (NVIDIA/Megatron-LM issue #1986); leave one of them off")
"""Why the advisor refuses Megatron-FSDP with optimizer CPU offload on both releases (validate_args
accepts it). get_megatron_optimizer's Megatron-FSDP branch (core_v0.15.2 optimizer/__init__.py:545-580,
core_v0.19.0 :1083-1135) takes its parameter groups from the wrapped module's parameters, which
Megatron-FSDP has replaced with its optimizer parameters at construction (megatron_fsdp.py
``_replace_param_with_distributed_if_needed``, core_v0.15.2 :290, core_v0.19.0 :353): DTensors over
the main-weight shard, or the weight buffer's (core_v0.15.2 without main weights under the
precision-aware optimizer: training.py:975-976), for every strategy (param_and_grad_buffer.py
``_init_distributed_params`` / ``make_fsdp_dtensor``, core_v0.15.2 :2279-2343, core_v0.19.0
:3216-3285). ``_get_megatron_optimizer_based_on_param_groups`` builds HybridDeviceOptimizer over them
(core_v0.15.2 :340, core_v0.19.0 :532), whose ``_get_sub_optimizer_param_groups`` pins a CPU copy of
the first parameters up to --optimizer-offload-fraction of the elements (hybrid_optimizer.py:273-276,
both releases): DTensor has no ``aten._pin_memory`` (torch 2.13 raises 'NYI:
aten._pin_memory.default' in its sharding propagation), so the optimizer is never built; its first
step would also copy each DTensor gradient into a plain pinned tensor (:108-114: 'got mixed
torch.Tensor and DTensor'). NVIDIA/Megatron-LM issue #1986 shows the failure from
get_megatron_optimizer; the fix (pull request #4623, 'operating on local shards') is in neither
release. With --optimizer-offload-fraction 0 nothing is pinned, but nothing is offloaded either,
and on core_v0.19.0 the GPU share then reads ``p.grad`` where Megatron-FSDP sets only
``decoupled_grad`` (param_and_grad_buffer.py:3396-3399): refused too."""

MEGATRON_CROSS_ENTROPY_KERNEL = "native"
"""--cross-entropy-fusion-impl's default with --cross-entropy-loss-fusion (both releases)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Precision:
    """Number formats (Megatron-LM's --bf16/--fp16, gradient reduction, Transformer Engine FP8)."""

    params_dtype: ParamsDtype = "bfloat16"
    """The model's weights and activations: --bf16, --fp16, or neither (FP32)."""
    grad_reduce_dtype: GradDtype = "fp32"
    """Gradient accumulation and data-parallel reduction, as Megatron defines it: with --bf16, FP32
    by default (--accumulate-allreduce-grads-in-fp32, set by validate_args), BF16 with
    --grad-reduce-in-bf16; with --fp16, FP16 unless --accumulate-allreduce-grads-in-fp32. An
    FP32 run reduces in FP32."""
    fp8_format: Fp8Format | None = None
    """--fp8-format: Transformer Engine FP8 GEMMs in the linear layers ('hybrid': E4M3 forward,
    E5M2 gradients); None: BF16 GEMMs. FP8 changes numerics, so only a user asks for it."""
    fp8_recipe: Fp8Recipe = "delayed"
    """--fp8-recipe (Megatron's default 'delayed': per-tensor scales from an amax history)."""
    fp8_param_gather: bool = False
    """--fp8-param-gather: the compute weight is kept only in FP8 (no BF16 copy) and gathered in FP8."""
    fp8_amax_history_len: int = 1
    """--fp8-amax-history-len (Megatron's default 1): amax values kept per FP8 tensor (delayed scaling)."""

    def __post_init__(self) -> None:
        _switches(self)
        _choice(self.params_dtype, PARAMS_DTYPES, "params_dtype")
        _choice(self.grad_reduce_dtype, GRAD_DTYPES, "the gradient reduction dtype")
        if self.fp8_format is not None:
            _choice(self.fp8_format, FP8_FORMATS, "--fp8-format")
        _choice(self.fp8_recipe, FP8_RECIPES, "--fp8-recipe")
        if self.grad_reduce_dtype == "bf16" and self.params_dtype != "bfloat16":
            raise AdvisorError("BF16 gradient reduction (--grad-reduce-in-bf16) needs BF16 weights (--bf16)")
        if self.grad_reduce_dtype == "fp16" and self.params_dtype != "float16":
            raise AdvisorError("FP16 gradient reduction comes only with FP16 weights (--fp16)")
        if self.fp8_format is not None and self.params_dtype == "float32":
            raise AdvisorError("FP8 (--fp8-format) runs with BF16 or FP16 weights, not FP32")
        if self.fp8_param_gather and self.fp8_format is None:
            raise AdvisorError("--fp8-param-gather needs --fp8-format")
        limits.check_int(self.fp8_amax_history_len, "fp8_amax_history_len (--fp8-amax-history-len)",
                         limits.FP8_AMAX_HISTORY)

    @property
    def element_bytes(self) -> int:
        return 4 if self.params_dtype == "float32" else 2

    @property
    def gradient_bytes(self) -> int:
        """Bytes of one gradient element in the buffer Megatron reduces (main_grad)."""
        return 4 if self.grad_reduce_dtype == "fp32" else 2


@dataclass(frozen=True, kw_only=True, slots=True)
class DataParallel:
    """How the data-parallel replicas shard and reduce (megatron-core's DistributedDataParallelConfig)."""

    distributed_optimizer: bool = True
    """--use-distributed-optimizer: Adam states (and FP32 master weights) sharded over DP x CP (ZeRO-1)."""
    overlap_grad_reduce: bool = True
    """--overlap-grad-reduce: the gradient reduce-scatter runs bucket by bucket during the backward
    pass; off, it runs after it (Megatron's default)."""
    overlap_param_gather: bool = True
    """--overlap-param-gather: the parameter all-gather runs during the next forward pass; Megatron
    requires --overlap-grad-reduce and the distributed optimizer (or Megatron-FSDP) for it."""
    fsdp_strategy: FsdpStrategy | None = None
    """Megatron-FSDP (--use-megatron-fsdp) with --data-parallel-sharding-strategy: 'no_shard'
    (nothing sharded), 'optim' (optimizer states and main weights: ZeRO-1), 'optim_grads'
    (and gradients: ZeRO-2), 'optim_grads_params' (and weights: ZeRO-3), over DP x CP. None:
    megatron-core's DDP."""
    torch_fsdp2: bool = False
    """--use-torch-fsdp2: torch FSDP2 (``fully_shard`` per transformer layer) shards weights,
    gradients and optimizer states over DP x CP like optim_grads_params, reducing in the weights'
    dtype, with Megatron's non-distributed optimizer over the shards. Megatron's validate_args
    refuses it with the distributed optimizer (so with --overlap-param-gather), FP16, tied
    embeddings and PP or EP > 1 (the last two are the layout's: ``TrainingOptions.layout_problem``)."""
    fsdp_main_params_dtype: FsdpMainParamsDtype = "fp32"
    """Megatron-FSDP's main weights, which its optimizer updates (core_v0.19.0's
    --megatron-fsdp-main-params-dtype; core_v0.15.2 keeps them in FP32): an FP32 buffer (the
    default), a BF16 or FP16 one, or 'auto', none (the optimizer updates the compute weights'
    buffer). Sharded as the optimizer states; Adam's moments stay FP32 whatever it is
    (``TrainingOptions._state_kinds``)."""
    fsdp_grad_comm_dtype: FsdpGradCommDtype = "auto"
    """Megatron-FSDP's gradient reduce-scatter (or all-reduce) dtype (core_v0.19.0's
    --megatron-fsdp-grad-comm-dtype): 'auto', the main gradients' (the default), or fp32, bf16,
    fp16. Where gradients are sharded its un-sharded buckets take it (``TrainingOptions.grad_comm_bytes``)."""

    def __post_init__(self) -> None:
        _switches(self)
        _choice(self.fsdp_main_params_dtype, FSDP_MAIN_PARAMS_DTYPES, FSDP_MAIN_PARAMS)
        _choice(self.fsdp_grad_comm_dtype, FSDP_GRAD_COMM_DTYPES, FSDP_GRAD_COMM)
        if self.fsdp_strategy is None:
            for flag, value in self.fsdp_dtype_flags():
                raise AdvisorError(f"{flag} {value} needs --use-megatron-fsdp")
        if self.torch_fsdp2:
            if self.fsdp_strategy is not None:
                raise AdvisorError("--use-torch-fsdp2 and --use-megatron-fsdp are two FSDPs: choose one")
            if self.distributed_optimizer:
                raise AdvisorError("--use-torch-fsdp2 runs without --use-distributed-optimizer (Megatron-LM refuses "
                                   "the two together)")
        if self.fsdp_strategy is not None:
            _choice(self.fsdp_strategy, FSDP_STRATEGIES, "--data-parallel-sharding-strategy")
            if not self.distributed_optimizer:  # see distributed_optimizer_for
                raise AdvisorError("Megatron-FSDP (--use-megatron-fsdp) runs with --use-distributed-optimizer")
        if self.overlap_param_gather and not self.overlap_grad_reduce:
            raise AdvisorError("--overlap-param-gather needs --overlap-grad-reduce (Megatron-LM refuses it alone)")
        if self.overlap_param_gather and not self.distributed_optimizer:
            raise AdvisorError("--overlap-param-gather needs the distributed optimizer or Megatron-FSDP")

    @staticmethod
    def distributed_optimizer_for(asked: bool, fsdp_strategy: str | None) -> bool:
        """``distributed_optimizer`` for a command line that asks ``asked`` of it beside
        ``fsdp_strategy``: Megatron-FSDP runs with the distributed optimizer asked or not
        (core_v0.19.0's validate_args turns it on), and the options state it."""
        return asked or fsdp_strategy is not None

    @staticmethod
    def overlap_param_gather_for(asked: bool | None, overlap_grad_reduce: bool, distributed_optimizer: bool) -> bool:
        """``overlap_param_gather`` for a command line that asks ``asked`` of it (None: not given)
        beside the other two: the CLI's default is on where Megatron allows it (with
        --overlap-grad-reduce and the distributed optimizer, ``__post_init__``). The one rule for
        the options a command builds and for a --sharding auto rung (``advisor.escalation.rung``),
        which turns the distributed optimizer on."""
        return (overlap_grad_reduce and distributed_optimizer) if asked is None else asked

    def fsdp_dtype_flags(self) -> list[tuple[str, str]]:
        """Megatron-FSDP's dtype flags (core_v0.19.0's) whose value differs from Megatron's default,
        with that value: the flags a list states (``advisor.options.flags.training_args``)."""
        return [(flag, value) for flag, value, default in (
            (FSDP_MAIN_PARAMS, self.fsdp_main_params_dtype, "fp32"),
            (FSDP_GRAD_COMM, self.fsdp_grad_comm_dtype, "auto")) if value != default]


TP_COMM_SUB_FLAGS = {"tp_comm_overlap_ag": "--disable-tp-comm-overlap-ag",
                     "tp_comm_overlap_rs": "--disable-tp-comm-overlap-rs",
                     "tp_comm_overlap_rs_dgrad": "--tp-comm-overlap-rs-dgrad",
                     "tp_comm_bulk_dgrad": "--disable-tp-comm-bulk-dgrad",
                     "tp_comm_bulk_wgrad": "--disable-tp-comm-bulk-wgrad"}
"""``TensorParallel``'s overlap sub-options and core_v0.15.2's flag for each (arguments.py): a
--disable-... flag turns its field off, --tp-comm-overlap-rs-dgrad turns its on. The one list of
them: the emitted flags, the read-back (``options.flags``) and the CLI's options are made from it."""


def sub_option_on(field: str, given: bool) -> bool:
    """The value of sub-option ``field`` where its flag is ``given`` (``TP_COMM_SUB_FLAGS``)."""
    return given if field == "tp_comm_overlap_rs_dgrad" else not given


@dataclass(frozen=True, kw_only=True, slots=True)
class TensorParallel:
    """What runs with tensor parallelism (TP > 1; at TP 1 Megatron turns both off, which prices the same)."""

    sequence_parallel: bool = True
    """--sequence-parallel (seed 004 assumes it whenever TP > 1)."""
    tp_comm_overlap: bool = False
    """--tp-comm-overlap: Transformer Engine userbuffers overlap the TP all-gathers and
    reduce-scatters with the GEMMs; needs Transformer Engine and sequence parallelism."""
    tp_comm_overlap_cfg: str | None = None
    """--tp-comm-overlap-cfg FILE: the YAML of per-buffer userbuffers settings Megatron-LM passes to
    Transformer Engine (``advisor.options.ub_config``), as the path was given; None: TE's defaults.
    Read (and refused where TE would refuse it) when the options are made."""
    # The overlap's sub-options (core_v0.15.2 arguments.py; core_v0.19.0 generates the same from
    # model_parallel_config.py, which also spells the disabling ones --no-...), Megatron's defaults:
    # which collectives Transformer Engine's layers overlap (``ub_config.LayerOverlaps``). They make
    # no buffer of their own (``initialize_ub`` gets none of them), so memory is the overlap's either way.
    tp_comm_overlap_ag: bool = True
    """Off: --disable-tp-comm-overlap-ag: the all-gathers before QKV and FC1 (forward) and of the
    projection's and FC2's output gradients (backward) run in NCCL, exposed."""
    tp_comm_overlap_rs: bool = True
    """Off: --disable-tp-comm-overlap-rs: the reduce-scatters after the projection and FC2 (forward)
    run in NCCL, exposed."""
    tp_comm_overlap_rs_dgrad: bool = False
    """--tp-comm-overlap-rs-dgrad: QKV's and FC1's dgrad reduce-scatter pipelined beside dgrad itself
    (their qkv/fc1_dgrad buffers); Transformer Engine then runs neither bulk overlap, whatever the two
    bulk switches say (kept at their defaults: one description of one run)."""
    tp_comm_bulk_dgrad: bool = True
    """Off: --disable-tp-comm-bulk-dgrad: QKV's and FC1's input re-gather runs in NCCL, behind dgrad
    as without the overlap, and frees the 16 SMs the bulk overlap takes from dgrad."""
    tp_comm_bulk_wgrad: bool = True
    """Off: --disable-tp-comm-bulk-wgrad: QKV's and FC1's dgrad reduce-scatter runs in NCCL, exposed,
    and wgrad keeps its SMs."""

    def __post_init__(self) -> None:
        _switches(self)
        if self.tp_comm_overlap and not self.sequence_parallel:
            raise AdvisorError("--tp-comm-overlap needs --sequence-parallel (Megatron-LM refuses it without)")
        if not self.tp_comm_overlap and (changed := self.changed_sub_options()):
            # Megatron reads them only with the overlap ('Don't care if tp_comm_overlap is False')
            raise AdvisorError(f"{changed[0]} needs --tp-comm-overlap")
        if self.tp_comm_overlap_rs_dgrad:  # LayerNormLinear.__init__: ub_bulk_* ... and not ub_overlap_rs_dgrad
            object.__setattr__(self, "tp_comm_bulk_dgrad", True)
            object.__setattr__(self, "tp_comm_bulk_wgrad", True)
        if self.tp_comm_overlap_cfg is not None:
            if not isinstance(self.tp_comm_overlap_cfg, str) or not self.tp_comm_overlap_cfg:
                raise AdvisorError(f"tp_comm_overlap_cfg (--tp-comm-overlap-cfg) must be a file's path, got "
                                   f"{self.tp_comm_overlap_cfg!r}")
            if not self.tp_comm_overlap:  # Megatron-LM reads the file only to set up the overlap
                raise AdvisorError("--tp-comm-overlap-cfg needs --tp-comm-overlap")
            self.userbuffers()

    def changed_sub_options(self) -> list[str]:
        """The overlap's sub-options that differ from Megatron's defaults, as Megatron's flags."""
        return [flag for field, flag in TP_COMM_SUB_FLAGS.items()
                if getattr(self, field) != sub_option_on(field, False)]

    def overlaps(self):
        """What the sub-options ask of Transformer Engine's layers (``ub_config.LayerOverlaps``)."""
        from advisor.options.ub_config import LayerOverlaps

        return LayerOverlaps(overlap_ag=self.tp_comm_overlap_ag, overlap_rs=self.tp_comm_overlap_rs,
                             overlap_rs_dgrad=self.tp_comm_overlap_rs_dgrad, bulk_dgrad=self.tp_comm_bulk_dgrad,
                             bulk_wgrad=self.tp_comm_bulk_wgrad)

    def userbuffers(self):
        """The --tp-comm-overlap-cfg file's buffers (``ub_config.UserbuffersConfig``), TE's defaults without one."""
        from advisor.options.ub_config import TE_DEFAULTS, load_userbuffers

        return load_userbuffers(self.tp_comm_overlap_cfg) if self.tp_comm_overlap_cfg else TE_DEFAULTS


@dataclass(frozen=True, kw_only=True, slots=True)
class Recomputation:
    """Activation recomputation (--recompute-granularity, --recompute-method, --recompute-num-layers)."""

    recompute: Recompute = "none"
    """--recompute-granularity: none, selective (core attention) or full (whole layers)."""
    recompute_method: RecomputeMethod = "uniform"
    """With full: 'uniform' checkpoints every N layers, 'block' the first N of each chunk."""
    recompute_num_layers: int = 1
    """N of --recompute-num-layers (per model chunk)."""
    recompute_modules: tuple[str, ...] | None = None
    """--recompute-modules of a dense model, with selective: what it recomputes (``mlp``,
    ``layernorm``, ``core_attn``); None: Megatron's default, core_attn alone (a tuple of exactly
    core_attn is kept as None: one description of one run). An MoE model's modules are its own
    options' (``advisor.moe.stage.MoEOptions.modules``)."""

    def __post_init__(self) -> None:
        _choice(self.recompute, RECOMPUTES, "recompute")
        _choice(self.recompute_method, RECOMPUTE_METHODS, "recompute_method")
        if self.recompute_modules is not None:
            self._check_modules()
        # A layer count, as --recompute-num-layers on the command line (advisor.cli.options.LAYERS).
        limits.check_int(self.recompute_num_layers, "recompute_num_layers (--recompute-num-layers)",
                         limits.MODEL["num_layers"])

    def _check_modules(self) -> None:
        """The modules as one tuple of Megatron's names, given once, in order (a saved row's
        ``options`` is JSON, where they are a list); exactly core_attn becomes None."""
        from advisor.moe.spec import RECOMPUTE_MODULES

        modules = self.recompute_modules
        if isinstance(modules, str) or not isinstance(modules, (list, tuple)) or not modules \
                or not all(isinstance(module, str) for module in modules):
            raise AdvisorError("recompute_modules must be null or a non-empty list of module names, "
                               f"got {limits.json_text(modules)}")
        if unknown := [module for module in modules if module not in RECOMPUTE_MODULES]:
            raise AdvisorError(f"recompute_modules: {', '.join(unknown)} is not one of Megatron's "
                               f"({', '.join(RECOMPUTE_MODULES)})")
        modules = tuple(dict.fromkeys(modules))
        object.__setattr__(self, "recompute_modules", None if modules == ("core_attn",) else modules)

    @property
    def selective_modules(self) -> frozenset[str]:
        """What selective recomputation recomputes: the modules given, or Megatron's default
        core_attn (``transformer_config.py`` __post_init__, both releases)."""
        return frozenset(self.recompute_modules or ("core_attn",))

    def chunk_multiple(self, release=None) -> int:
        """What the layers of every model chunk (a pipeline stage, or each of its virtual stages)
        must be a multiple of for Megatron-LM ``release`` (what ``release_defaults`` takes; None:
        the newest) to run this recomputation: N with the uniform method on a release that cannot
        end a unit early (``MegatronRelease.uniform_recompute_any_n``: core_v0.15.2), else 1.

        The block method runs any N on both releases: its loop checkpoints the layers with
        ``layer_idx < recompute_num_layers`` (transformer_block.py, core_v0.19.0 recompute.py), so
        an N above a chunk's layers recomputes all of them, and is priced as N = those layers."""
        if self.recompute != "full" or self.recompute_method != "uniform" \
                or release_defaults(release).uniform_recompute_any_n:
            return 1
        return self.recompute_num_layers

    def chunk_problem(self, chunk_layers, release=None, remedy: str | None = None) -> str | None:
        """The line refusing a layout whose model chunks hold ``chunk_layers`` layers each
        (``megatron_args.chunk_layers``) where ``release`` would fail on them, or None: the one
        check of --recompute-num-layers against a layout, for every command. ``remedy``: what the
        line ends with, what to do (default: the advisor's options; the launcher names its own)."""
        multiple = self.chunk_multiple(release)
        bad = sorted({int(layers) for layers in chunk_layers if layers % multiple})
        if not bad:
            return None
        chunks = ", ".join(map(str, bad))
        remedy = remedy or "give an N that divides every chunk, --recompute-method block or --megatron-version 0.19"
        return (f"--recompute-method uniform --recompute-num-layers {multiple} with model chunks of {chunks} layers: "
                f"{uniform_chunk_rule(release)}; {remedy}")


def uniform_chunk_rule(release=None) -> str:
    """Why ``Recomputation.chunk_multiple`` is N on ``release``, for the lines that refuse a layout
    or a search over splits."""
    return (f"{release_defaults(release).name} runs --recompute-method uniform in units of N layers per model "
            "chunk and fails on a chunk that N does not divide (IndexError at the first forward: "
            "transformer_block.py, _checkpointed_forward; core 0.19 ends the last unit early)")


@dataclass(frozen=True, kw_only=True, slots=True)
class Attention:
    """The attention kernel and the data loader's mask."""

    flash_attention: bool = True
    """A fused (flash / cuDNN) kernel, Megatron's --attention-backend auto; False: unfused, which
    keeps the s x s softmax output."""
    dataloader_mask: DataloaderMask = "off"
    """'off': --no-create-attention-mask-in-dataloader (fused causal kernels need no mask: the
    default with flash attention); 'cached': Megatron's default, an s x s mask built once and
    reused; 'rebuilt': built per sample (--reset-attention-mask, --reset-position-ids or
    --eod-mask-loss with the mask on: the paper's runs), which the time model prices."""
    transformer_impl: TransformerImpl = "transformer_engine"
    """--transformer-impl: 'local' builds megatron-core's own modules (a command read back), whose
    attention is unfused (``flash_attention`` False for a dense model; the MoE model prices it as
    flash attention and says so); launched as read, not as Transformer Engine's unfused backend."""

    def __post_init__(self) -> None:
        _switches(self)
        _choice(self.dataloader_mask, DATALOADER_MASKS, "dataloader_mask")
        _choice(self.transformer_impl, TRANSFORMER_IMPLS, "transformer_impl")
        if self.dataloader_mask == "off" and not self.flash_attention:
            raise AdvisorError("unfused attention needs the data loader's mask: keep it (cached or rebuilt)")


@dataclass(frozen=True, kw_only=True, slots=True)
class Offload:
    """Optimizer states in host memory (--optimizer-cpu-offload, Megatron's HybridDeviceOptimizer)."""

    optimizer_cpu_offload: bool = False
    """--optimizer-cpu-offload (with --use-precision-aware-optimizer, which Megatron requires)."""
    optimizer_offload_fraction: float = 1.0
    """--optimizer-offload-fraction (Megatron's default 1.0): the share of the optimizer's
    parameters whose states and step live on the CPU."""

    def __post_init__(self) -> None:
        _switches(self)
        limits.check_float(self.optimizer_offload_fraction, "optimizer_offload_fraction (--optimizer-offload-fraction)",
                           limits.OFFLOAD_FRACTION)

    @property
    def host_fraction(self) -> float:
        """The share of the optimizer states held in host memory."""
        return self.optimizer_offload_fraction if self.optimizer_cpu_offload else 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class OptimizerStates:
    """Megatron's precision-aware optimizer (--use-precision-aware-optimizer: Transformer Engine's
    FusedAdam keeps the master weights and Adam's moments in the dtypes given; megatron-core
    ``optimizer_config.py`` and ``optimizer/__init__.py``, both releases). Without it the states
    are FP32 and the dtypes below must stay fp32 (megatron-core asserts it)."""

    precision_aware_optimizer: bool = False
    """--use-precision-aware-optimizer (implied by --optimizer-cpu-offload, which Megatron runs
    only with it: ``TrainingOptions`` keeps it False there, so one run has one description)."""
    main_params_dtype: MainParamsDtype = "fp32"
    """--main-params-dtype: the master weights (fp32: with BF16 weights TE stores only the 16
    bits BF16 lacks, ``store_param_remainders``)."""
    exp_avg_dtype: MomentDtype = "fp32"
    """--exp-avg-dtype: Adam's momentum (fp8: one byte, E4M3 with a per-tensor scale)."""
    exp_avg_sq_dtype: MomentDtype = "fp32"
    """--exp-avg-sq-dtype: Adam's variance."""

    def __post_init__(self) -> None:
        _switches(self)
        _choice(self.main_params_dtype, MAIN_PARAMS_DTYPES, "main_params_dtype (--main-params-dtype)")
        _choice(self.exp_avg_dtype, MOMENT_DTYPES, "exp_avg_dtype (--exp-avg-dtype)")
        _choice(self.exp_avg_sq_dtype, MOMENT_DTYPES, "exp_avg_sq_dtype (--exp-avg-sq-dtype)")

    @property
    def lowered(self) -> list[str]:
        """The flags of the states kept below FP32, as Megatron names them."""
        return [f"{flag} {value}" for flag, value in (("--main-params-dtype", self.main_params_dtype),
                                                        ("--exp-avg-dtype", self.exp_avg_dtype),
                                                        ("--exp-avg-sq-dtype", self.exp_avg_sq_dtype))
                if value != "fp32"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Loss:
    """The cross-entropy loss's kernel."""

    cross_entropy_fusion: CrossEntropyFusion = "none"
    """'none': Megatron's default vocab-parallel cross-entropy (an FP32 copy of the logits, kept
    for the backward); 'native': --cross-entropy-loss-fusion, megatron-core's fused version of it
    (``fusions/fused_cross_entropy.py``: the same FP32 softmax saved), priced as 'none'; 'te':
    --cross-entropy-loss-fusion --cross-entropy-fusion-impl te, Transformer Engine's kernel, which
    writes the gradient into the BF16 logits in place and keeps no FP32 copy
    (``advisor.memory_terms.loss_logits_bytes``). Time is priced as 'none' for all three."""

    def __post_init__(self) -> None:
        _choice(self.cross_entropy_fusion, CROSS_ENTROPY_FUSIONS, "cross_entropy_fusion")


@dataclass(frozen=True, kw_only=True, slots=True)
class Fusions:
    """Megatron-LM's kernel fusions that change what a layer keeps and how much HBM traffic it
    makes (``megatron/training/arguments.py``, the fusion switches beside --no-bias-gelu-fusion)."""

    bias_swiglu_fusion: bool = True
    """Megatron-LM's default (its dest for --no-bias-swiglu-fusion): the MLP's SwiGLU runs
    megatron-core's fused ``bias_swiglu_impl`` (``fusions/fused_bias_swiglu.py``), which saves
    only its input. False (--no-bias-swiglu-fusion): the eager ``glu`` of ``transformer/mlp.py``
    (both releases), whose SiLU output and ``x_linear + glu_linear_offset`` copy are kept too
    (``equations.unfused_swiglu_bytes``) and which runs three element-wise kernels instead of one."""

    def __post_init__(self) -> None:
        _switches(self)


_CONCERNS = {"precision": Precision, "data_parallel": DataParallel, "tensor_parallel": TensorParallel,
             "recomputation": Recomputation, "attention": Attention, "offload": Offload,
             "optimizer_states": OptimizerStates, "loss": Loss, "fusions": Fusions}
_OWNER = {f.name: concern for concern, cls in _CONCERNS.items() for f in fields(cls)}
"""Each flat field name -> the concern that holds it (names are unique over the concerns)."""


TP1_OVERLAP_PROBLEM = ("--tp-comm-overlap needs TP > 1: at TP 1 Megatron-LM turns sequence parallelism off, and "
                       "refuses the overlap without it")
"""``TrainingOptions.layout_problem``'s, and a command's read back at TP 1 (``options.flags``)."""


def _check_fp8_userbuffers(recipe: str, tensor_parallel: TensorParallel) -> None:
    """What Transformer Engine 2.9 (core_v0.15.2's pin) fails on at run time with FP8 userbuffers.
    Blockwise: ``fill_userbuffers_buffer_for_all_gather`` (module/base.py) takes per-tensor FP8 and
    MXFP8 only and raises "Unsupported quantizer for Userbuffers" for ``Float8BlockQuantizer``, on
    the first QKV all-gather. A reduce-scatter buffer made FP8 (fp8_buf): the layer then asks its
    GEMM for FP8 output (``Linear.forward``: ``fp8_output``/``fp8_grad`` where ``is_fp8_ubuf``), which
    only delayed scaling's quantizer writes fused (csrc/extensions/gemm.cpp, ``gemm``:
    ``unfused_quantization_needed`` unless ``IsFloat8Quantizers``); any other recipe's GEMM writes
    BF16 and ``split_overlap_rs`` (comm_gemm_overlap.cpp) reduces it with
    ``TRANSFORMER_ENGINE_TYPE_SWITCH_FP8ONLY``: "Invalid type". An all-gather buffer left BF16 (a
    qkv/fc1_dgrad moved off bulk without fp8_buf), under any recipe: the layer's bulk dgrad still
    gathers its FP8 input there, and ``fill_userbuffers_buffer_for_all_gather`` raises
    "Attempting to all-gather FP8 tensor, but Userbuffers is not initialized with FP8 buffers"."""
    if recipe == "blockwise":
        raise AdvisorError("--fp8-recipe blockwise does not run with --tp-comm-overlap (Transformer Engine's "
                           "userbuffers all-gather takes no blockwise FP8: 'Unsupported quantizer for Userbuffers'); "
                           "use another recipe or drop --tp-comm-overlap")
    overlaps = tensor_parallel.overlaps()  # a buffer the sub-options leave unused fails on nothing
    bf16_gathers = tensor_parallel.userbuffers().bf16_all_gathers(overlaps)
    if bf16_gathers:
        raise AdvisorError(f"--tp-comm-overlap-cfg {tensor_parallel.tp_comm_overlap_cfg}: {bf16_gathers[0]}: a method "
                           f"other than bulk leaves this buffer BF16, but the layer still all-gathers its FP8 input "
                           f"there (Transformer Engine: 'Userbuffers is not initialized with FP8 buffers'); set "
                           f"fp8_buf: true or method: bulk")
    fp8_scatters = tensor_parallel.userbuffers().fp8_reduce_scatters(overlaps) if recipe != "delayed" else ()
    if fp8_scatters and fp8_scatters[0] in ("qkv_dgrad", "fc1_dgrad"):
        # _LayerNormLinear asks its dgrad GEMM for FP8 output where the dgrad buffer is FP8 (fp8_grad,
        # LayerNormLinear.forward), the same failure as a forward reduce-scatter's below
        raise AdvisorError(f"--tp-comm-overlap-rs-dgrad with --fp8-recipe {recipe}: {fp8_scatters[0]} holds FP8 "
                           f"(Transformer Engine's default for it), and only --fp8-recipe delayed writes FP8 GEMM "
                           f"output there (Transformer Engine: 'Invalid type'); use delayed, or move {fp8_scatters[0]} "
                           f"off bulk without fp8_buf in --tp-comm-overlap-cfg")
    if fp8_scatters:
        raise AdvisorError(f"--tp-comm-overlap-cfg {tensor_parallel.tp_comm_overlap_cfg}: {fp8_scatters[0]}: fp8_buf "
                           f"on a reduce-scatter runs only with --fp8-recipe delayed (Transformer Engine's GEMM "
                           f"writes no FP8 output for {recipe} there: 'Invalid type'); drop fp8_buf")


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainingOptions:
    """Everything about a run that changes its memory or its time, beyond the model and the layout."""

    precision: Precision = Precision()
    data_parallel: DataParallel = DataParallel()
    tensor_parallel: TensorParallel = TensorParallel()
    recomputation: Recomputation = Recomputation()
    attention: Attention = Attention()
    offload: Offload = Offload()
    optimizer_states: OptimizerStates = OptimizerStates()
    loss: Loss = Loss()
    fusions: Fusions = Fusions()
    vocab_divisible_by: int | None = None
    """Pad v to a multiple of this x TP (--make-vocab-size-divisible-by, 128 in Megatron); None:
    1, the smallest padding Megatron does (the paper's vocabularies divide by every TP)."""

    def __post_init__(self) -> None:
        if self.vocab_divisible_by is not None:  # bounded as --vocab-divisible-by (advisor.cli.options.VOCABULARY)
            limits.check_int(self.vocab_divisible_by, "vocab_divisible_by (--make-vocab-size-divisible-by)",
                             limits.MODEL["vocab_size"])
        precision, offload, dp = self.precision, self.offload, self.data_parallel
        if precision.fp8_param_gather and not (dp.distributed_optimizer or dp.torch_fsdp2):
            raise AdvisorError("--fp8-param-gather needs the distributed optimizer, Megatron-FSDP or torch FSDP2")
        if dp.torch_fsdp2 and precision.params_dtype == "float16":
            raise AdvisorError("--use-torch-fsdp2 does not run with --fp16 (Megatron-LM refuses it)")
        if offload.optimizer_cpu_offload and precision.fp8_param_gather and precision.fp8_recipe != "delayed":
            raise AdvisorError("--optimizer-cpu-offload with --fp8-param-gather needs --fp8-recipe delayed "
                               "(Megatron-LM refuses it otherwise)")
        self._check_optimizer_states()
        self._check_fsdp_dtypes()
        if precision.fp8_format is not None and self.tensor_parallel.tp_comm_overlap:
            _check_fp8_userbuffers(precision.fp8_recipe, self.tensor_parallel)
        if precision.fp8_format is None and precision.fp8_recipe != "delayed" \
                and not self.optimizer_states.precision_aware_optimizer:  # offloaded: FP32 states whatever it says
            # the recipe does nothing without FP8 or the precision-aware optimizer: one description
            object.__setattr__(self, "precision", replace(precision, fp8_recipe="delayed"))

    def _check_optimizer_states(self) -> None:
        """What megatron-core's OptimizerConfig refuses (``__post_init__``, both releases), what
        the advisor does not price (the precision-aware optimizer under FSDP, whose own buffers
        hold the main weights), Megatron-FSDP with the offload, which cannot run (``FSDP_OFFLOAD``),
        and one description of an offloaded run (the switch it implies
        is not also stated)."""
        states, offload, dp = self.optimizer_states, self.offload, self.data_parallel
        if offload.optimizer_cpu_offload and dp.fsdp_strategy is not None:
            raise AdvisorError(FSDP_OFFLOAD)
        asked = (states.precision_aware_optimizer and not offload.optimizer_cpu_offload) or states.lowered
        if asked and (dp.fsdp_strategy is not None or dp.torch_fsdp2):
            raise AdvisorError("--use-precision-aware-optimizer with FSDP is not priced (Megatron-FSDP keeps the main "
                               "weights in its own buffers; Megatron-Bridge turns the optimizer off with FSDP)")
        if offload.optimizer_cpu_offload and states.lowered:
            raise AdvisorError(f"{states.lowered[0]} has no effect with --optimizer-cpu-offload (Megatron's "
                               "HybridDeviceOptimizer keeps FP32 states)")
        if offload.optimizer_cpu_offload and states.precision_aware_optimizer:
            object.__setattr__(self, "optimizer_states", replace(states, precision_aware_optimizer=False))
        if not self.precision_aware_optimizer:
            if states.lowered:
                raise AdvisorError(f"{states.lowered[0]} needs --use-precision-aware-optimizer (megatron-core keeps "
                                   "the optimizer states in FP32 without it)")
            return
        if not dp.distributed_optimizer:
            raise AdvisorError("--use-precision-aware-optimizer needs --use-distributed-optimizer (megatron-core "
                               "refuses it without)")

    def _check_fsdp_dtypes(self) -> None:
        """Megatron-FSDP's dtypes (core_v0.19.0) where the advisor has no price: a gradient
        communication dtype other than the main gradients' where the gradients are not sharded
        (no_shard, optim): Megatron-FSDP then allocates an un-sharded bucket in that dtype for each
        bucket of the last microbatch's backward (``GradReducePipeline._bucket_group_gradient_reduce``:
        'an extra un-sharded buffer needs to be allocated!'), held while the stage holds fewer
        activations than at its peak. And no main weights ('auto') with FP8 weights, which cannot
        train (``_FSDP_AUTO_FP8``)."""
        dp = self.data_parallel
        if dp.fsdp_strategy is not None and dp.fsdp_main_params_dtype == "auto" and self.precision.fp8_param_gather:
            raise AdvisorError(_FSDP_AUTO_FP8)
        if self._custom_grad_comm and dp.fsdp_strategy in ("no_shard", "optim"):
            raise AdvisorError(f"{FSDP_GRAD_COMM} {dp.fsdp_grad_comm_dtype} with {self.precision.grad_reduce_dtype} "
                               f"main gradients and --data-parallel-sharding-strategy {dp.fsdp_strategy} is not priced "
                               "(Megatron-FSDP copies each un-sharded bucket into that dtype to reduce it); use auto, "
                               "or optim_grads / optim_grads_params")

    @property
    def _custom_grad_comm(self) -> bool:
        """Whether Megatron-FSDP communicates gradients in a dtype other than its main gradients'."""
        comm = self.data_parallel.fsdp_grad_comm_dtype
        return comm not in ("auto", self.precision.grad_reduce_dtype)

    @property
    def grad_comm_bytes(self) -> int:
        """Bytes of one gradient element on the wire in the data-parallel reduction, and in
        Megatron-FSDP's un-sharded gradient buckets where it shards the gradients: its
        --megatron-fsdp-grad-comm-dtype's, else the main gradients' (``Precision.gradient_bytes``).
        core_v0.19.0 megatron_fsdp/param_and_grad_buffer.py: ``main_grad_getter`` and the
        reduce-scatter fetch those buckets with ``fetch_bucket(dtype=mp_policy.grad_comm_dtype if
        gbuf.is_data_distributed else None)``, which takes the buffer's own dtype for None;
        ``reduce_scatter_tensor`` then moves them, and the reduced shard is added into the
        main-gradient shard (``local_grad += reduced_grad``)."""
        if not self._custom_grad_comm:
            return self.precision.gradient_bytes
        return 4 if self.data_parallel.fsdp_grad_comm_dtype == "fp32" else 2

    @property
    def precision_aware_optimizer(self) -> bool:
        """Whether Megatron runs its precision-aware optimizer: asked for, or implied by offload."""
        return self.optimizer_states.precision_aware_optimizer or self.offload.optimizer_cpu_offload

    # --- flat views -------------------------------------------------------------------------

    def flat(self) -> dict:
        """Every field, by its (unique) name."""
        out = {name: getattr(getattr(self, concern), name) for name, concern in _OWNER.items()}
        out["vocab_divisible_by"] = self.vocab_divisible_by
        return out

    def changed(self) -> dict:
        """The fields that differ from the advisor's defaults (a row's ``options``)."""
        default = TrainingOptions().flat()
        return {name: value for name, value in self.flat().items() if value != default[name]}

    def with_(self, **changes) -> "TrainingOptions":
        """A copy with flat fields replaced, e.g. ``options.with_(recompute='full')``."""
        unknown = sorted(set(changes) - set(_OWNER) - {"vocab_divisible_by"})
        if unknown:
            raise AdvisorError(f"unknown training options: {', '.join(unknown)}")
        grouped: dict[str, dict] = {}
        for name, value in changes.items():
            if name != "vocab_divisible_by":
                grouped.setdefault(_OWNER[name], {})[name] = value
        top = {concern: replace(getattr(self, concern), **values) for concern, values in grouped.items()}
        if "vocab_divisible_by" in changes:
            top["vocab_divisible_by"] = changes["vocab_divisible_by"]
        return replace(self, **top)

    @classmethod
    def from_dict(cls, values: dict) -> "TrainingOptions":
        """The options of a row's ``options`` (``changed`` or ``flat``). Also reads the estimator's
        older keys (``gradient_bytes``, ``element_bytes``) of files written before these options."""
        values = dict(values)
        if "gradient_bytes" in values:
            half = "fp16" if values.get("params_dtype") == "float16" else "bf16"  # 2-byte gradients take the weights' type
            values.setdefault("grad_reduce_dtype", "fp32" if values.pop("gradient_bytes") == 4 else half)
        if "element_bytes" in values:
            values.setdefault("params_dtype", "float32" if values.pop("element_bytes") == 4 else "bfloat16")
        if values.get("params_dtype") == "float32":
            values.setdefault("grad_reduce_dtype", "fp32")
        if values.get("flash_attention") is False:
            values.setdefault("dataloader_mask", "cached")
        if values.get("distributed_optimizer") is False:
            values.setdefault("overlap_param_gather", False)
        return cls().with_(**values)

    def at_tp(self, tp: int) -> "TrainingOptions":
        """The canonical options of a layout with this TP: at TP 1 Megatron turns sequence
        parallelism (and so TP overlap) off; neither changes memory or time there, so they take
        the defaults, and two descriptions of the same run compare equal."""
        if tp > 1 or self.tensor_parallel == TensorParallel():
            return self
        return replace(self, tensor_parallel=TensorParallel())

    # --- what the models read ---------------------------------------------------------------

    @property
    def optimizer_bytes(self) -> float:
        """Bytes per parameter of the master weight, momentum and variance before sharding
        (``memory_levers.optimizer_state_bytes``)."""
        from advisor.memory_levers import optimizer_state_bytes

        return optimizer_state_bytes(self._state_kinds)

    @property
    def _state_kinds(self) -> tuple[str, str, str]:
        """How the master weight, momentum and variance are kept (``memory_levers.optimizer_state_kinds``).
        Offloaded, Megatron's HybridDeviceOptimizer keeps FP32 copies and FP32 Adam states whatever
        the dtypes (get_megatron_optimizer builds it instead of the precision-aware FusedAdam), except
        for FP32 weights, which need no copy (``_steps_fp32_weights_in_place``: 'fp32_weight')."""
        from advisor.memory_levers import optimizer_state_kinds

        states, dp = self.optimizer_states, self.data_parallel
        kinds = optimizer_state_kinds(states.precision_aware_optimizer, states.main_params_dtype, states.exp_avg_dtype,
                                      states.exp_avg_sq_dtype, bf16_weights=self.precision.params_dtype == "bfloat16",
                                      te_holds_masters=self._te_holds_masters)
        master = kinds[0]
        if dp.fsdp_strategy is not None and dp.fsdp_main_params_dtype != "fp32":  # not offloaded, not precision-aware
            master = FSDP_MAIN_WEIGHT_KINDS[dp.fsdp_main_params_dtype]
        # the weight is its own master: FP32 weights stepped in place, or Megatron-FSDP's 'auto'
        # main weights (no buffer: Adam steps the model weights) of FP32 weights
        fp32_in_place = self._steps_fp32_weights_in_place and master == "fp32"
        if self.precision.params_dtype == "float32" and (fp32_in_place or master == "fsdp_none"):
            master = "fp32_weight"
        return (master, *kinds[1:])

    @property
    def _step_gradient(self) -> tuple[str, str | None]:
        """(the main gradients' dtype as the optimizer step finds them, the dtype they are cast into
        before Adam, or None: handed to Adam as they are). Adam and the gradient norm read the cast
        copy where there is one, else the main gradients (``step_bytes``).

        Megatron-FSDP: its ``update_main_grads`` casts the main-gradient buffer's dtype
        (``Precision.grad_reduce_dtype``; on both releases, ``options.flags._fsdp_main_grads``) into
        its main weights' (``fsdp_main_params_dtype``, ``terms.grad_cast_bytes``); nothing to cast to
        with 'auto' main weights, and the precision-aware optimizer's gradients it leaves uncast. A
        known simplification: FP8 weights' gradients are BF16 under 2-byte main gradients
        (``_resolve_group_grad_dtype``), priced in the weights' dtype, which differs only with --fp16
        and 2-byte main weights.

        Megatron's DDP: the 16-bit optimizers hand Adam ``main_grad.float()``, into their FP32
        masters (``_copy_model_grads_to_main_grads``: distrib_optimizer.py, optimizer.py's
        Float16OptimizerWithFloat16Params; core_v0.15.2 and core_v0.19.0), a copy only where
        --grad-reduce-in-bf16 keeps BF16 main gradients. None where Transformer Engine's FusedAdam
        reads them as ``decoupled_grad`` (``use_precision_aware_optimizer_no_fp8_or_ds_fp8``:
        ``_te_holds_masters``), nor with FP32 weights (FP32Optimizer hands ``main_grad`` itself).

        torch FSDP2: the gradients are the weights' dtype whatever --grad-reduce-in-bf16 says
        (``param.grad``, a BF16 DTensor shard: no MixedPrecisionPolicy, ``memory_levers.SHARDING``),
        and Float16OptimizerWithFloat16Params, which has no ``main_grad`` to read, hands Adam
        ``model_param.grad.float()`` (core_v0.15.2 optimizer/optimizer.py:757-758, core_v0.19.0 the
        same function, :1092): BF16 into FP32 (tests/test_torch_fsdp2_grads.py runs it).

        Offloaded (--optimizer-cpu-offload): Megatron builds HybridDeviceOptimizer with
        ``param_update_in_fp32=True`` (core_v0.15.2 optimizer/__init__.py:348), whose GPU share
        steps FP32 copies handed ``grad.to(fp32_param.dtype)`` of the (decoupled) gradient
        (cpu_offloading/hybrid_optimizer.py:91-93, both releases): a cast where it is not FP32."""
        dp, p = self.data_parallel, self.precision
        if dp.torch_fsdp2:
            grads = "fp32" if p.params_dtype == "float32" else "bf16"  # fp16 weights are refused with it
            return grads, "fp32"
        if self.offload.optimizer_cpu_offload:
            return p.grad_reduce_dtype, "fp32"
        if dp.fsdp_strategy is not None:
            uncast = self.precision_aware_optimizer or dp.fsdp_main_params_dtype == "auto"
            return p.grad_reduce_dtype, None if uncast else dp.fsdp_main_params_dtype
        if self._te_holds_masters or p.params_dtype == "float32":
            return p.grad_reduce_dtype, None
        return p.grad_reduce_dtype, "fp32"

    @property
    def _grad_cast_bytes(self) -> float:
        """Bytes per optimizer element of the gradient cast before Adam (``terms.grad_cast_bytes``
        of ``_step_gradient``): read in the main gradients' dtype, written in the one Adam takes;
        0 where no copy is made."""
        from advisor.throughput.terms import grad_cast_bytes

        return grad_cast_bytes(*self._step_gradient)

    @property
    def step_bytes(self) -> float:
        """HBM bytes per optimizer element of one step (``terms.optimizer_step_bytes``): Adam's
        over the states as kept (``_state_kinds``), reading the gradient it is handed twice (the
        step and the gradient norm) in that gradient's dtype (``_step_gradient``: the cast copy,
        else the main gradients), writing the model weight (``_weight_write_bytes``) and reading
        the master it is copied from where that is a pass of its own (``_master_copy_read_bytes``), plus the cast
        (``_grad_cast_bytes``). The main-gradient buffer's zeroing is priced apart, over the
        buffer (``grad_zero_bytes``)."""
        from advisor.throughput.terms import DTYPE_BYTES, optimizer_step_bytes

        grads, cast = self._step_gradient
        return (optimizer_step_bytes(self._state_kinds, DTYPE_BYTES[cast or grads], self._master_copy_read_bytes,
                                     self._weight_write_bytes)
                + self._grad_cast_bytes)

    @property
    def grad_zero_bytes(self) -> float:
        """Bytes per element of the main-gradient buffer that ``zero_grad_buffer`` writes at each
        step's start: its dtype's (``_step_gradient``'s first; ``terms.grad_zero_time`` prices it
        over the buffer, whole under Megatron's DDP). None to zero under torch FSDP2:
        ``TorchFullyShardedDataParallel.zero_grad_buffer`` is the base class's ``pass``
        (core/distributed/data_parallel_base.py:60-65), and the optimizer frees the gradients
        (``model_param.grad = None``, optimizer.py:763, and ``zero_grad(set_to_none=True)``)."""
        from advisor.throughput.terms import DTYPE_BYTES

        return 0.0 if self.data_parallel.torch_fsdp2 else float(DTYPE_BYTES[self._step_gradient[0]])

    @property
    def _master_copy_read_bytes(self) -> float:
        """Bytes per optimizer element of the updated master weight read back to write the model's
        weight, where that copy is a pass of its own after Adam's kernel (the write is
        ``_weight_write_bytes``).

        Megatron's DDP with 16-bit weights: ``_copy_main_params_to_model_params`` copies each FP32
        main shard into the parameter buffer's shard, which the all-gather then sends
        (``shard_model_param.data.copy_(shard_main_param)``: core_v0.15.2
        optimizer/distrib_optimizer.py:2406-2456, core_v0.19.0 :2792-2882), and without the
        distributed optimizer or under torch FSDP2, Float16OptimizerWithFloat16Params's
        ``_multi_tensor_copy_this_to_that`` (core_v0.15.2 optimizer/optimizer.py:770-775,
        core_v0.19.0 :1112): 4. None with FP32 weights (``_steps_fp32_weights_in_place``).
        Megatron-FSDP: ``copy_main_weights_to_model_weights`` copies its main-weight buffer into
        the model weights (``model_param.data.copy_(main_weight)``, core_v0.15.2
        megatron_fsdp/param_and_grad_buffer.py:2468-2524, core_v0.19.0 :3410-3561): the buffer's 4 or 2
        bytes, for FP32 weights too; none without a buffer ('auto' main weights, which Adam steps
        in place: ``if mbuf is None: continue``). Offloaded: HybridDeviceOptimizer's GPU share
        copies its FP32 copies back (``param.data.copy_(fp32_param.data)``, a step post-hook,
        cpu_offloading/hybrid_optimizer.py:129-148, both releases): 4; none of FP32 weights, which
        it makes no copy of (``param.dtype != torch.float32``, :277) and, under Megatron's DDP,
        steps in place.

        0 where Transformer Engine's FusedAdam holds the masters (``_te_holds_masters``): its
        kernel writes the model weight beside the master in one pass (``multi_tensor_adam`` or
        ``multi_tensor_adam_param_remainder`` over five tensor lists, ``fused_adam.py`` ``step``)
        and megatron-core's copy returns early (distrib_optimizer.py:2424 core_v0.15.2, :2812
        core_v0.19.0)."""
        from advisor.memory_levers import STATE_BYTES

        if self._steps_fp32_weights_in_place:
            return 0.0
        if self.offload.optimizer_cpu_offload:
            return 4.0
        master = self._state_kinds[0]
        if self._te_holds_masters or master not in ("fp32", "fsdp_half"):
            return 0.0
        return float(STATE_BYTES[master])

    @property
    def _weight_write_bytes(self) -> float:
        """Bytes per optimizer element of the model weight written after Adam: the weight's dtype's,
        where that write is not the master's own.

        Megatron-FSDP: ``copy_main_weights_to_model_weights`` writes ``model_param``, an item of
        the model-weight buffer, built in the parameters' own dtype, or under no_shard the
        parameter itself (core_v0.15.2 megatron_fsdp/param_and_grad_buffer.py:1812-1834,
        ``dtype=param_dtype``; :2508; the copy :2524; core_v0.19.0 :2624-2651, :3509, :3561):
        4 for FP32 weights, which Megatron-LM accepts with --use-megatron-fsdp on both releases
        (no --bf16 needed; tests/test_fsdp_fp32_weights.py runs its parse_args/validate_args).

        0 where the FP32 weight is its own master (``_state_kinds``' 'fp32_weight': the optimizer
        steps FP32 weights in place, ``_steps_fp32_weights_in_place``, or Megatron-FSDP's 'auto'
        main weights, no buffer, are FP32 weights): their read and write are the master's 8 bytes
        (``STATE_STEP_BYTES``), and no second write follows. BF16, FP16 and FP8 weights: 2, as before (FP8's quantised write is not
        priced apart)."""
        if self.precision.params_dtype != "float32":
            return 2.0
        return 0.0 if self._state_kinds[0] == "fp32_weight" else 4.0

    @property
    def _steps_fp32_weights_in_place(self) -> bool:
        """FP32 weights that the optimizer steps as they are, with no master of its own and no copy
        back: Megatron's DDP (the distributed optimizer steps a view of each FP32 parameter,
        ``shard_model_param = model_param.view(-1)[...]``, core_v0.15.2
        optimizer/distrib_optimizer.py:416-419; FP32Optimizer the parameters) and torch FSDP2,
        offloaded or not (HybridDeviceOptimizer copies only weights that are not FP32,
        ``if self.param_update_in_fp32 and param.dtype != torch.float32``,
        cpu_offloading/hybrid_optimizer.py:277, both releases). Not Megatron-FSDP, which copies
        its main-weight buffer into the model weights (``_weight_write_bytes``)."""
        return self.precision.params_dtype == "float32" and self.data_parallel.fsdp_strategy is None

    @property
    def _te_holds_masters(self) -> bool:
        """megatron-core's ``use_precision_aware_optimizer_no_fp8_or_ds_fp8`` (optimizer_config.py):
        Transformer Engine's FusedAdam, not megatron-core, keeps the master weights. It reads the
        optimizer config's fp8_recipe, which Megatron-LM fills from --fp8-recipe (default delayed)
        whether or not FP8 runs; Megatron-Bridge's BF16 recipes carry 'tensorwise' there
        (``bf16_mixed``), so their precision-aware optimizer keeps megatron-core's FP32 masters:
        a BF16 run with --fp8-recipe tensorwise prices that."""
        states, p = self.optimizer_states, self.precision
        return states.precision_aware_optimizer and (states.main_params_dtype != "fp32" or p.fp8_recipe == "delayed")

    @property
    def first_step_bytes(self) -> float:
        """Bytes per parameter of the optimizer states the first optimizer step makes: Adam's
        momentum and variance (``equations.ADAM_MOMENT_BYTES`` in FP32), and the master weight
        too where Transformer Engine's FusedAdam holds it (``initialize_state``, called in its
        first ``step``; megatron-core makes its own masters when it builds the optimizer)."""
        from advisor.memory_levers import STATE_BYTES

        master, *moments = self._state_kinds
        return float(sum(STATE_BYTES[kind] for kind in moments) + (STATE_BYTES[master] if self._te_holds_masters else 0))

    def memory_options(self, release=None):
        """The estimator's view (``advisor.memory.MemoryOptions``) on Megatron-LM ``release`` (what
        ``release_defaults`` takes; None: the newest), which decides what no flag says: Megatron-FSDP's
        prefetch and queue budgets (``MegatronRelease.fsdp_budget_from_units``). The release is the
        run's, not an option: the same flags read back as the same options on every release."""
        from advisor.memory import MemoryOptions

        p, dp, r = self.precision, self.data_parallel, self.recomputation
        return MemoryOptions(
            # torch FSDP2 keeps its sharded gradients in the weights' dtype (advisor.memory_levers).
            distributed_optimizer=dp.distributed_optimizer or dp.torch_fsdp2,
            gradient_bytes=p.element_bytes if dp.torch_fsdp2 else p.gradient_bytes,
            grad_comm_bytes=self.grad_comm_bytes if self._custom_grad_comm else None,
            element_bytes=p.element_bytes, recompute=r.recompute, recompute_method=r.recompute_method,
            recompute_num_layers=r.recompute_num_layers, recompute_modules=r.selective_modules,
            fused_norms=self.attention.transformer_impl == "transformer_engine",
            sequence_parallel=self.tensor_parallel.sequence_parallel,
            flash_attention=self.attention.flash_attention, vocab_divisible_by=self.vocab_divisible_by,
            fsdp_strategy="torch_fsdp2" if dp.torch_fsdp2 else dp.fsdp_strategy,
            fsdp_budget_from_units=release_defaults(release).fsdp_budget_from_units,
            overlap_grad_reduce=dp.overlap_grad_reduce,
            optimizer_bytes=self.optimizer_bytes, optimizer_host_fraction=self.offload.host_fraction,
            fp8_format=p.fp8_format, fp8_recipe=p.fp8_recipe,
            fp8_param_gather=p.fp8_param_gather, fp8_amax_history_len=p.fp8_amax_history_len,
            cross_entropy_fusion=self.loss.cross_entropy_fusion,
            dataloader_mask=self.attention.dataloader_mask != "off",
            userbuffers=self.tensor_parallel.userbuffers() if self.tensor_parallel.tp_comm_overlap else None,
            bias_swiglu_fusion=self.fusions.bias_swiglu_fusion,
        )

    def time_options(self, **model_choices):
        """The time model's view (``advisor.throughput.TimeOptions``); ``model_choices`` are the
        time model's own settings that no Megatron flag decides (flops_convention, attention_kernel)."""
        from advisor.throughput.model import TimeOptions

        dp, p = self.data_parallel, self.precision
        if dp.torch_fsdp2:
            # The same collectives as Megatron-FSDP's optim_grads_params, per layer and microbatch:
            # all-gather before forward and backward (reshard_after_forward, Megatron's default),
            # reduce-scatter after backward, in the weights' dtype, on FSDP2's own streams,
            # overlapped with the neighbouring layers' compute by its prefetching.
            fsdp = dict(overlap_grad_reduce=True, overlap_param_gather=True, distributed_optimizer=True,
                        grad_reduce_bytes=p.element_bytes, fsdp_strategy="optim_grads_params")
        else:
            fsdp = dict(overlap_grad_reduce=dp.overlap_grad_reduce, overlap_param_gather=dp.overlap_param_gather,
                        distributed_optimizer=dp.distributed_optimizer, grad_reduce_bytes=p.gradient_bytes,
                        grad_comm_bytes=self.grad_comm_bytes if self._custom_grad_comm else None,
                        fsdp_strategy=dp.fsdp_strategy)
        return TimeOptions(
            **fsdp, tp_comm_overlap=self.tensor_parallel.tp_comm_overlap,
            userbuffers=self.tensor_parallel.userbuffers(), tp_overlaps=self.tensor_parallel.overlaps(),
            optimizer_step_bytes=self.step_bytes, grad_zero_bytes=self.grad_zero_bytes,
            dataloader_mask="rebuilt" if self.attention.dataloader_mask == "rebuilt" else "cached",
            optimizer_host_fraction=self.offload.host_fraction, flash_attention=self.attention.flash_attention,
            fp8_format=p.fp8_format, fp8_recipe=p.fp8_recipe, fp8_param_gather=p.fp8_param_gather,
            recompute_modules=self.recomputation.selective_modules,
            fused_norms=self.attention.transformer_impl == "transformer_engine",
            bias_swiglu_fusion=self.fusions.bias_swiglu_fusion,
            vocab_divisible_by=self.vocab_divisible_by or 1, **model_choices,
        )

    def layout_problem(self, *, pp: int, tie_embeddings: bool, tp: int | None = None) -> str | None:
        """Why Megatron-LM's validate_args refuses these options with this layout, or None:
        --use-torch-fsdp2 with pipeline parallelism or tied embeddings (arguments.py, both
        releases; EP > 1 too, which dense layouts never have); --tp-comm-overlap at TP 1, where
        validate_args switches sequence parallelism off and then asserts it for the overlap
        (core_v0.15.2 and core_v0.19.0: 'Tensor parallel communication/GEMM overlap can happen
        only when sequence parallelism is enabled'). ``tp`` None: TP is searched (a sweep), whose
        TP 1 rows run without the overlap."""
        if tp == 1 and self.tensor_parallel.tp_comm_overlap:
            return TP1_OVERLAP_PROBLEM
        if not self.data_parallel.torch_fsdp2:
            return None
        if pp > 1:
            return f"--use-torch-fsdp2 runs without pipeline parallelism (PP 1), got PP {pp} (Megatron-LM refuses it)"
        if tie_embeddings:
            return "--use-torch-fsdp2 needs untied embeddings (Megatron-LM refuses it with tied ones)"
        return None

    def describe(self) -> str:
        """One line for people: what differs from the advisor's defaults."""
        changed = self.changed()
        return ", ".join(f"{key}={value}" for key, value in changed.items()) if changed else "advisor defaults"
