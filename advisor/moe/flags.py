"""Megatron-LM flags of an MoE model and layout (names as in core_v0.15.2's arguments.py)."""

from __future__ import annotations

import functools

from advisor.megatron_args import _number
from advisor.moe.spec import MoESpec


MODEL_FLAGS = (
    "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size", "--moe-grouped-gemm",
    "--moe-router-load-balancing-type", "--moe-aux-loss-coeff", "--moe-router-dtype", "--moe-layer-freq",
    "--moe-shared-expert-intermediate-size", "--qk-layernorm", "--moe-router-score-function",
    "--moe-router-enable-expert-bias", "--moe-router-num-groups", "--moe-router-group-topk",
    "--moe-router-topk-scaling-factor", "--multi-latent-attention", "--kv-lora-rank", "--qk-head-dim",
    "--qk-pos-emb-head-dim", "--v-head-dim", "--q-lora-rank", "--rope-type", "--rotary-scaling-factor", "--mscale",
    "--mscale-all-dim", "--mtp-num-layers", "--moe-router-pre-softmax",
)
"""Every flag ``model_flags`` writes (its presence or absence is the model)."""
LAYOUT_FLAGS = (
    "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--moe-token-dispatcher-type",
    "--moe-enable-deepep", "--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute",
    "--moe-expert-capacity-factor", "--moe-pad-expert-input-to-capacity", "--moe-deepep-num-sms",
    "--moe-flex-dispatcher-backend", "--moe-flex-dispatcher-num-sms", "--moe-permute-fusion", "--moe-router-fusion",
    "--moe-hybridep-num-sms", "--moe-shared-expert-overlap",
)
"""Every flag ``layout_flags`` writes but --recompute-modules (a dense recomputation flag too), and
core_v0.19.0's deprecated --moe-hybridep-num-sms, which sets the SMs the rows write another way."""
RELATED_FLAGS = (
    ("--moe-router-load-balancing-type", "--moe-aux-loss-coeff", "--moe-router-enable-expert-bias"),
    ("--moe-router-num-groups", "--moe-router-group-topk"),
    ("--rope-type", "--rotary-scaling-factor", "--mscale", "--mscale-all-dim"),
    ("--moe-token-dispatcher-type", "--moe-enable-deepep", "--moe-flex-dispatcher-backend"),
    ("--moe-expert-capacity-factor", "--moe-pad-expert-input-to-capacity"),
)
"""Flags that decide one thing together: a user's flag that a row leaves unset conflicts with
those of its group that the row sets."""


@functools.lru_cache(maxsize=16)
def _model_flags(spec: MoESpec) -> tuple[str, ...]:
    return tuple(model_flags(spec))


def _balancing_flags(spec: MoESpec) -> list[str]:
    """The balancing a command gave, as read (``MoESpec.load_balancing``); else an aux-loss router
    with the model's weight (Megatron's default 0 would not balance), or none with the expert bias."""
    if spec.load_balancing is None:
        if spec.expert_bias:
            return ["--moe-router-load-balancing-type", "none"]
        weight = ["--moe-aux-loss-coeff", _number(spec.aux_loss_coeff)] if spec.aux_loss_coeff else []
        return ["--moe-router-load-balancing-type", "aux_loss", *weight]
    weights = spec.aux_loss_coeff if isinstance(spec.aux_loss_coeff, tuple) else (spec.aux_loss_coeff,)
    given = ["--moe-aux-loss-coeff", *map(_number, weights)] if any(weights) else []
    return ["--moe-router-load-balancing-type", *spec.load_balancing, *given]


def model_flags(spec: MoESpec) -> list[str]:
    """The expert, router, MLA and YaRN flags of ``spec`` (the dense ones come from
    ``advisor.megatron_args.model_args``)."""
    args = ["--num-experts", str(spec.num_experts), "--moe-router-topk", str(spec.moe_router_topk),
            "--moe-ffn-hidden-size", str(spec.moe_ffn_hidden_size), "--moe-grouped-gemm"]
    args += _balancing_flags(spec)
    # the router's logits and probabilities in FP32, as memory.routing_saved_bytes, the
    # dispatchers' kept probabilities and the allgather dispatcher's combine are priced (router.py:
    # else the input's BF16)
    args += ["--moe-router-dtype", "fp32"]
    if spec.first_dense_layers:
        args += ["--moe-layer-freq", f"([0]*{spec.first_dense_layers}+[1]*{spec.moe_layers})"]
    if spec.shared_expert_size:
        args += ["--moe-shared-expert-intermediate-size", str(spec.shared_expert_size)]
    if spec.qk_layernorm:
        args.append("--qk-layernorm")
    if spec.score_function == "sigmoid":
        args += ["--moe-router-score-function", "sigmoid"]
    elif spec.router_pre_softmax or spec.moe_router_topk == 1:
        # megatron-core refuses top-1 softmax after the top-k (no gradient)
        args.append("--moe-router-pre-softmax")
    if spec.expert_bias:
        args.append("--moe-router-enable-expert-bias")
    if spec.router_num_groups is not None:
        args += ["--moe-router-num-groups", str(spec.router_num_groups),
                 "--moe-router-group-topk", str(spec.router_group_topk)]
    if spec.router_topk_scaling_factor is not None:
        args += ["--moe-router-topk-scaling-factor", _number(spec.router_topk_scaling_factor)]
    if spec.mla is not None:
        mla = spec.mla
        args += ["--multi-latent-attention", "--kv-lora-rank", str(mla.kv_lora_rank),
                 "--qk-head-dim", str(mla.qk_head_dim), "--qk-pos-emb-head-dim", str(mla.qk_pos_emb_head_dim),
                 "--v-head-dim", str(mla.v_head_dim)]
        if mla.q_lora_rank is not None:
            args += ["--q-lora-rank", str(mla.q_lora_rank)]
    if spec.yarn is not None:
        y = spec.yarn
        args += ["--rope-type", "yarn", "--rotary-scaling-factor", _number(y.factor), "--mscale", _number(y.mscale),
                 "--mscale-all-dim", _number(y.mscale_all_dim)]
    elif spec.mla is not None:  # without it MLA takes YaRN (megatron-core MLATransformerConfig.rope_type)
        args += ["--rope-type", "rope"]
    if spec.mtp_num_layers:
        args += ["--mtp-num-layers", str(spec.mtp_num_layers)]
    return args


def layout_flags(*, ep: int, etp: int, dispatcher: str, recompute_modules: list[str] | None = None,
                 capacity_factor: float | None = None, pad_to_capacity: bool = True, a2a_overlap: bool = False,
                 delay_wgrad: bool = False, dispatcher_sms: int | None = None, permute_fusion: bool = False,
                 router_fusion: bool = False, flex_backend: str | None = None,
                 shared_expert_overlap: bool = False) -> list[str]:
    """EP, ETP, the dispatcher (and the overlap of its all-to-all with the other microbatch's
    compute, or with the shared experts: --moe-shared-expert-overlap), the capacity factor the routing assumed with its padding (priced padded, the
    expert inputs are padded only with --moe-pad-expert-input-to-capacity: megatron-core
    ``moe_utils.apply_router_token_dropping``), the flex dispatcher's backend (None: DeepEP) and
    SMs where given, and selective recomputation's modules."""
    args = ["--expert-model-parallel-size", str(ep), "--expert-tensor-parallel-size", str(etp),
            "--moe-token-dispatcher-type", dispatcher]
    if dispatcher == "flex" and flex_backend not in (None, "deepep"):
        # HybridEP and NCCL-EP: core_v0.19.0's flags (core_v0.15.2 lacks them: releases.py, lacks)
        args += ["--moe-flex-dispatcher-backend", flex_backend]
        if dispatcher_sms is not None:
            args += ["--moe-flex-dispatcher-num-sms", str(dispatcher_sms)]
    elif dispatcher == "flex":
        # core_v0.15.2's flex dispatcher asserts it ('Please set --moe-enable-deepep',
        # token_dispatcher.py); core_v0.19.0 takes it as its default backend, deepep, with a
        # deprecation warning
        args.append("--moe-enable-deepep")
        if dispatcher_sms is not None:
            # both releases take it: core_v0.19.0 routes it to moe_flex_dispatcher_num_sms, with a
            # deprecation warning, as it takes --moe-enable-deepep
            args += ["--moe-deepep-num-sms", str(dispatcher_sms)]
    if a2a_overlap:
        args.append("--overlap-moe-expert-parallel-comm")
    if delay_wgrad:
        args.append("--delay-wgrad-compute")
    if shared_expert_overlap:
        args.append("--moe-shared-expert-overlap")
    if permute_fusion:
        args.append("--moe-permute-fusion")
    if router_fusion:
        args.append("--moe-router-fusion")
    if capacity_factor is not None:
        args += ["--moe-expert-capacity-factor", _number(capacity_factor)]
        if pad_to_capacity:
            args.append("--moe-pad-expert-input-to-capacity")
    if recompute_modules:
        args += ["--recompute-modules", *recompute_modules]
    return args


def row_options(row: dict):
    """The training options a row was priced with: its ``options`` (``TrainingOptions.changed``),
    or, for rows written before they carried them, its gradient dtype and optimizer sharding;
    with the row's recomputation."""
    return _row_options(*_options_key(row))


def _options_key(row: dict) -> tuple:
    """What ``row_options`` reads of a row, as a key of plain values (cheap to hash, unlike the
    options it stands for)."""
    given = row.get("options")
    key = tuple(sorted(given.items())) if isinstance(given, dict) else None
    return key, row.get("distributed_optimizer", True), row.get("gradient_bytes", 4), row["recompute"], \
        row.get("recompute_num_layers") or 1


@functools.lru_cache(maxsize=256)
def _row_options(given: tuple | None, distributed: bool, gradient_bytes: int, recompute: str, layers: int):
    from advisor.options import TrainingOptions

    if given is not None:
        options = TrainingOptions.from_dict(dict(given))
    else:
        options = TrainingOptions().with_(grad_reduce_dtype="fp32" if gradient_bytes == 4 else "bf16",
                                          distributed_optimizer=distributed, overlap_param_gather=distributed)
    return options.with_(recompute=recompute, recompute_method="uniform", recompute_num_layers=layers)


def row_args(spec: MoESpec, seq_len: int, global_batch_size: int, row: dict) -> list[str]:
    """Every Megatron flag of one MoE sweep row or estimate: the dense model, layout, batch and
    training-option flags (``advisor.megatron_args``, from the row's ``TrainingOptions``), the
    MoE model's, EP, ETP, the dispatcher and the recomputation's modules."""
    return [flag for part in rows_arg_parts(spec, seq_len, global_batch_size, [row])[0] for flag in part]


def rows_arg_parts(spec: MoESpec, seq_len: int, global_batch_size: int, rows) -> list[tuple[tuple[str, ...], ...]]:
    """``row_args`` of many rows, each as its parts, concatenated in this order: the dense
    ``megatron_args``' (the model's, the sizes', the split's with the MTP layers, the batch's, the
    training options', as ``advisor.megatron_args.rows_arg_parts`` makes them), the MoE model's,
    the experts' and dispatcher's. Rows of one sweep share few of each part: each is made once per
    distinct key of plain values and shared (the same tuple object), so that a writer encodes it
    once too, and a release's spelling reads it once (``spelled_parts``); hashing the nested frozen
    spec and options per row cost more than making the flags. A layout's flags whole were one
    part: as many as the layouts, each read and written anew though they differ in a few flags."""
    from advisor.megatron_args import _batch_args, _model_args, _once, _sizes_args, _training_args, split_args

    dense, model = _model_args(spec, seq_len), _model_flags(spec)
    sizes: dict = {}
    splits: dict = {}
    batches: dict = {}
    trainings: dict = {}
    experts: dict = {}
    out = []
    for row in rows:
        tp, layers = row["tp"], tuple(row["layers_per_stage"])
        key = tp > 1, _options_key(row)
        training = trainings.get(key)
        if training is None:  # the options at their TP (it enters their flags only through TP > 1)
            training = trainings[key] = _training_args(key[0], _row_options(*key[1]), None)
        split = splits.get(key := (layers, row.get("vpp", 1)))
        if split is None:
            split = splits[key] = _with_mtp(tuple(split_args(*key)), spec.mtp_num_layers)
        modules = _recomputed_modules(spec, row)
        key = (row["ep"], row["etp"], row["dispatcher"], None if modules is None else tuple(modules),
               row.get("capacity_factor"), row_pads(row), bool(row.get("a2a_overlap")), bool(row.get("delay_wgrad")),
               row.get("dispatcher_sms"), bool(row.get("permute_fusion")), bool(row.get("router_fusion")),
               row.get("flex_backend"), bool(row.get("shared_expert_overlap")))
        flags = experts.get(key)
        if flags is None:
            flags = experts[key] = tuple(layout_flags(ep=key[0], etp=key[1], dispatcher=key[2],
                                                      recompute_modules=key[3], capacity_factor=key[4],
                                                      pad_to_capacity=key[5], a2a_overlap=key[6], delay_wgrad=key[7],
                                                      dispatcher_sms=key[8], permute_fusion=key[9],
                                                      router_fusion=key[10], flex_backend=key[11],
                                                      shared_expert_overlap=key[12]))
        out.append((dense, _once(sizes, (tp, row["cp"], len(layers)), _sizes_args), split,
                    _once(batches, (row["mbs"], global_batch_size), _batch_args), training, model, flags))
    return out


def _recomputed_modules(spec: MoESpec, row: dict) -> list[str] | None:
    """The row's --recompute-modules: its own, or, for a selective row without them, the default
    it was priced with (``MoEOptions.recompute_modules``), never Megatron's core_attn."""
    modules = row.get("recompute_modules")
    if modules is None and row.get("recompute") == "selective":
        from advisor.moe.stage import MoEOptions

        modules = sorted(MoEOptions(training=row_options(row)).recompute_modules(spec))
    return modules


def pad_problem(dispatcher: str, capacity_factor: float | None, pad_to_capacity: bool) -> str | None:
    """Why padding expert inputs to capacity is refused here, or None. megatron-core
    (``transformer_config.py``, ``__post_init__``, both releases): the pad needs
    moe_expert_capacity_factor, and the flex dispatcher refuses it with DeepEP (core_v0.15.2's only
    backend, core_v0.19.0's default). The advisor prices padding for alltoall and allgather only:
    HybridEP's and NCCL-EP's, which megatron-core lets pass, are refused as not priced."""
    if not pad_to_capacity:
        return None
    if capacity_factor is None:
        return "--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor (megatron-core refuses it alone)"
    if dispatcher == "flex":
        return ("the flex dispatcher's padding to capacity is not priced (megatron-core refuses "
                "--moe-pad-expert-input-to-capacity with DeepEP; the advisor prices it for alltoall and allgather)")
    return None


def row_pads(row: dict) -> bool:
    """Whether a capacity row's expert inputs are padded to capacity: its ``pad_to_capacity``;
    rows written before they carried it were priced padded."""
    return row.get("pad_to_capacity") is not False


def _with_mtp(args: tuple[str, ...], mtp_layers: int) -> tuple[str, ...]:
    """A --pipeline-model-parallel-layout with the MTP layers: Megatron requires them in it, ``m``
    each, in the last stage's last chunk before the loss (``pipeline_parallel_layer_layout.py``,
    ``validate_layer_layout``: 'Number of mtp layers in layout must match mtp_num_layers')."""
    flag = "--pipeline-model-parallel-layout"
    if not mtp_layers or flag not in args:
        return args
    at = args.index(flag) + 1
    layout = args[at]
    mtp = "m" if mtp_layers == 1 else f"m*{mtp_layers}"
    head, _, tail = layout.rpartition("L")
    layout = head + (mtp + ",L" if head.endswith((",", "|")) or not head else "," + mtp + ",L") + tail
    return (*args[:at], layout, *args[at + 1:])
