"""A command line's mixture-of-experts flags read back: the inverse of ``advisor.moe.flags`` (the
flags an MoE sweep row carries), for ``advisor estimate --from-command``.

Megatron's defaults for what a command leaves out (core_v0.15.2 ``megatron/training/arguments.py``):
--moe-ffn-hidden-size defaults to --ffn-hidden-size, --expert-tensor-parallel-size to TP
(``validate_args``), --expert-model-parallel-size to 1, --moe-token-dispatcher-type to
allgather, --moe-layer-freq to 1 (every layer an MoE layer), the router's score function to
softmax, --moe-pad-expert-input-to-capacity to off (a capacity factor alone drops tokens without
padding: priced unpadded), --moe-flex-dispatcher-backend to deepep. What the MoE model does not
price is named, never dropped; what it knows to change nothing (``HARMLESS``) is read silently.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from advisor import limits
from advisor.errors import AdvisorError
from advisor.models import LlamaSpec
from advisor.moe.spec import FLEX_BACKENDS
from advisor.options.flags import read_recompute_modules

VALUED = {"num-experts", "moe-router-topk", "moe-ffn-hidden-size", "moe-shared-expert-intermediate-size",
          "moe-layer-freq", "moe-router-score-function", "moe-router-num-groups", "moe-router-group-topk",
          "moe-router-topk-scaling-factor", "q-lora-rank", "kv-lora-rank",
          "qk-head-dim", "qk-pos-emb-head-dim", "v-head-dim", "rope-type", "rotary-scaling-factor", "mscale",
          "mscale-all-dim", "mtp-num-layers", "expert-model-parallel-size", "expert-tensor-parallel-size",
          "moe-token-dispatcher-type", "moe-expert-capacity-factor",
          "original-max-position-embeddings", "moe-router-dtype", "moe-router-bias-update-rate",
          "mtp-loss-scaling-factor", "moe-flex-dispatcher-backend", "moe-deepep-num-sms",
          "moe-hybridep-num-sms", "moe-flex-dispatcher-num-sms", "moe-z-loss-coeff", "moe-token-drop-policy"}
SWITCHES = {"moe-grouped-gemm", "moe-router-enable-expert-bias", "multi-latent-attention",
            "moe-router-force-load-balancing", "overlap-moe-expert-parallel-comm", "delay-wgrad-compute",
            "moe-pad-expert-input-to-capacity", "moe-router-pre-softmax", "moe-permute-fusion", "moe-router-fusion",
            "enable-experimental", "moe-enable-deepep", "moe-router-padding-for-fp8",
            "moe-router-padding-for-quantization", "moe-shared-expert-overlap", "mla-down-proj-fusion"}
MULTI = {"recompute-modules", "moe-router-load-balancing-type", "moe-aux-loss-coeff"}
"""Megatron's nargs='+' flags that the reader takes: the balancing loss's types and their weights
(not priced, a few FLOPs on E-wide tensors, but carried by the spec and launched as read)."""
HARMLESS = {"original-max-position-embeddings", "moe-router-bias-update-rate",
            "mtp-loss-scaling-factor", "moe-z-loss-coeff", "moe-token-drop-policy"}
"""Read and known not to change the price: YaRN's original context (fixed by Megatron's MLA config), the expert
bias's update step (E numbers once per step), the MTP loss's weight (a scalar), softmax before the top-k
(``moe_utils.topk_routing_with_score_function``: the E-wide FP32 scores the router term already
keeps; the sigmoid score function ignores it), the router's z-loss (``moe_utils.z_loss_func``: a
logsumexp over the E-wide logits the router term keeps, one number a token) and which tokens a
capacity drops (``moe_utils.apply_capacity``: 'probs' and 'position' run the same top-k over the
T x E map; without --moe-expert-capacity-factor none is dropped)."""
NAMED = {
    "enable-experimental": "--enable-experimental (experimental kernels, priced as the default ones)",
    "moe-router-padding-for-fp8": "--moe-router-padding-for-fp8 (experts' tokens padded to 16/32, not priced)",
    "moe-router-padding-for-quantization": "--moe-router-padding-for-quantization (experts' tokens padded to the "
                                           "quantized GEMM's alignment, not priced)",
    "mla-down-proj-fusion": "--mla-down-proj-fusion (MLA's Q and KV down projections as one column-parallel linear "
                            "with the input norm fused: at TP > 1 it gathers the layer's input and the latents over "
                            "TP and shards that weight; priced as the unfused MLA's two duplicated projections)",
}
"""Read, and changing memory or time by less than the model resolves: named with what is priced
in their place (megatron-core core_v0.15.2): ``is_experimental_enabled()`` switches
the dispatchers' routing-map conversions and padding to Triton kernels (``token_dispatcher.py``);
the router's padding for FP8 (core_v0.19.0: for quantization) rounds each expert's routed tokens
up to the FP8 GEMM's alignment (fewer than 32 more per local expert). --moe-shared-expert-overlap
is priced, not named: ``MoEFlags.shared_expert_overlap``, ``MoEOptions.shared_expert_overlap``.
core_v0.19.0's --mla-down-proj-fusion changes more than that, but is named, not priced: its Transformer
Engine spec builds ``FusedMLASelfAttention`` with one ``linear_qkv_down_proj``, a
``TELayerNormColumnParallelLinear`` in place of the input norm and the two duplicated ``TELinear``
down projections (``gpt_layer_specs.py`` :257-291), which at TP > 1 all-gathers the layer's input
under sequence parallelism, holds the weight's [h, (q_lora_rank + kv_lora_rank + d_rope) / t] shard,
and gathers the Q latent and the KV latent over TP after it (``multi_latent_attention.py``
:1268-1370, :736-739); ``advisor.moe.time.mla_attention_tp_time`` prices the unfused form."""


@dataclass(frozen=True, slots=True)
class MoEFlags:
    """The mixture-of-experts flags of one command line, as given: ``advisor sweep``'s and
    ``advisor estimate``'s own (``advisor.cli.moe.moe_options``) or a Megatron command's read back
    (``read``). ``advisor.cli.moe.moe_settings`` checks them and prices from them.
    ``recompute_method``, ``recompute_num_layers`` and ``transformer_impl`` are a Megatron
    command's only (the advisor's options leave them at their defaults): the overlap's refusals
    (``advisor.moe.overlap``) read them."""

    ep: int | None
    """--expert-model-parallel-size; None: not given (a sweep tries every EP, an estimate runs 1)."""
    etp: int | None
    """--expert-tensor-parallel-size; None: not given (a sweep tries every ETP, an estimate runs the
    TP, Megatron's default)."""
    dispatcher: str
    """--moe-token-dispatcher-type: alltoall, allgather or flex."""
    moe_routing: str | None
    """The advisor's --moe-routing (no Megatron flag): balanced, capacity or dropless; None: capacity
    with --moe-expert-capacity-factor, else balanced."""
    capacity_factor: float | None
    """--moe-expert-capacity-factor; None: dropless (no factor)."""
    moe_imbalance: float
    """The advisor's --moe-imbalance (no Megatron flag): the busiest rank's routed tokens over the mean."""
    recompute_modules: tuple[str, ...]
    """--recompute-modules (with --recompute-granularity selective); empty: not given."""
    mtp_num_layers: int | None
    """--mtp-num-layers; None: the model's own."""
    a2a_overlap: bool
    """--overlap-moe-expert-parallel-comm."""
    delay_wgrad: bool
    """--delay-wgrad-compute."""
    pad_to_capacity: bool | None
    """--moe-pad-expert-input-to-capacity (False: --no-moe-pad-expert-input-to-capacity); None: not
    said (capacity routing pads)."""
    recompute_method: str | None = None
    """--recompute-method as the command writes it, whatever its granularity; None: not given."""
    recompute_num_layers: str | None = None
    """--recompute-num-layers as the command writes it; None: not given."""
    shared_expert_overlap: bool = False
    """--moe-shared-expert-overlap (the advisor's option too: ``advisor.cli.moe.moe_options``)."""
    transformer_impl: str = "transformer_engine"
    """--transformer-impl."""
    permute_fusion: bool = False
    """--moe-permute-fusion. Its time is priced (``advisor.moe.ep_time.permutation_time``); its memory as
    the unfused permutation's: Transformer Engine's (``moe_utils.permute`` with fused=True) keeps
    its own row map where the unfused one keeps an int64 index per token copy
    (``memory.expert_activation_bytes``), a little more."""
    router_fusion: bool = False
    """--moe-router-fusion. Its time is priced (no ``ROUTER_KERNELS_S``), and its memory: the fused
    kernel's bool map and FP32 intermediate where the unfused router keeps its top-k indices and
    probabilities (``memory.routing_saved_bytes``)."""
    dispatcher_sms: int | None = None
    """--moe-deepep-num-sms (a command's core_v0.19.0 --moe-flex-dispatcher-num-sms, or its
    deprecated --moe-hybridep-num-sms, as megatron-core routes them: ``SM_FLAGS``); None: not given."""
    flex_backend: str = "deepep"
    """--moe-flex-dispatcher-backend (core_v0.19.0; core_v0.15.2's flex dispatcher is DeepEP's):
    deepep, hybridep or ncclep, all priced as DeepEP's deduplicated all-to-all; HybridEP and
    NCCL-EP permute in their own kernels (``advisor.moe.stage.OWN_PERMUTATION_BACKENDS``)."""
    given: tuple[str, ...] = ()
    """The advisor's own options given on its command line, as spelled (``moe_options``; a dense
    model refuses them); a Megatron command's read back: none."""
    grouped_gemm: bool = True
    """--moe-grouped-gemm: a Megatron command's read back (``read``); the advisor's own rows always
    write it (``advisor.moe.flags``)."""
    aux_loss_coeff: tuple[float, ...] = ()
    """The advisor's --moe-aux-loss-coeff, one weight per load-balancing type (Megatron's
    nargs='+'), which replaces the model's (``advisor.cli.moe_balancing.with_aux_loss_coeff``);
    empty: the model's own. A Megatron command's weights are read into its spec (``moe_spec``)."""
    force_balancing: bool = False
    """A Megatron command's --moe-router-force-load-balancing: routing forced balanced (random
    logits, ``router.py``), whatever the router balances."""


def take(rest: list[str]) -> tuple[dict, list[str]]:
    """(the MoE flags' values, the other arguments) of ``rest``; None when it has no --num-experts."""
    values: dict = {}
    other: list[str] = []
    i = 0
    while i < len(rest):
        name, has_value, value = rest[i][2:].partition("=")
        if name in SWITCHES and not has_value:
            values[name], i = True, i + 1
        elif name in VALUED | MULTI:
            end = i + 1
            while end < len(rest) and not rest[end].startswith("--"):
                end += 1
            words = [value] if has_value else rest[i + 1:end]
            if name in VALUED and len(words) != 1:
                raise AdvisorError(f"--{name} takes one value, got {len(words)}: {' '.join(words)}" if words
                                   else f"--{name} needs a value, and none follows it")
            values[name], i = (words if name in MULTI else words[0]), (i + 1 if has_value else end)
        else:
            other.append(rest[i])
            i += 1
    return values, other


def flag_int(values: dict, name: str, default=None):
    """--name's integer (``megatron_layout.flag_number``, the one reader of a flag's number),
    positive, or at least 0 for --mtp-num-layers."""
    # only a command read back asks: a sweep's MoEFlags (every sweep makes one) need not import
    # the layout reader and its shell parser (about 3 ms of every start)
    from advisor.megatron_layout import flag_number

    number = flag_number(values, name, int, None)
    if number is None:
        return default
    if number < (0 if name == "mtp-num-layers" else 1):
        raise AdvisorError(f"--{name} must be positive, got {number}")
    return limits.check_int(number, f"--{name}", limits.MTP_LAYERS) if name == "mtp-num-layers" else number


def _float(values: dict, name: str, default=None, *, bound: limits.Bound, low_open: bool = True):
    """A finite number within ``bound`` (nan, inf and negative factors were read and priced)."""
    text = values.get(name)
    return default if text is None else _number(text, name, bound=bound, low_open=low_open)


def _number(text: str, name: str, *, bound: limits.Bound, low_open: bool = True) -> float:
    """One value of --name as a finite number within ``bound``."""
    try:
        number = float(text)
    except ValueError:
        raise AdvisorError(f"--{name} must be a number, got {text!r}") from None
    return limits.check_float(number, f"--{name}", bound, low_open=low_open)


def first_dense_layers(text: str, num_layers: int) -> int:
    """--moe-layer-freq as the leading dense layers it gives, read as Megatron reads it
    (``arguments.moe_freq_type``): an integer N makes every N-th layer an MoE layer (1: all), a
    text with '[' is a Python list expression of 0 (dense) and 1 (MoE) per layer, e.g.
    '([0]*3+[1]*58)' or '[0,1,1,1]'. Priced: 1, or k leading dense layers then MoE layers."""
    if "[" not in text:
        try:
            every = int(text)
        except ValueError:
            raise AdvisorError(f"--moe-layer-freq {text!r} is neither an integer nor a list expression "
                               "(e.g. 1 or '([0]*3+[1]*58)')") from None
        if every != 1:
            raise AdvisorError(f"--moe-layer-freq {text}: an MoE layer every {every} layers is not priced "
                               f"(only leading dense layers then MoE layers: 1 or '([0]*k+[1]*({num_layers}-k))')")
        return 0
    pattern = layer_pattern(text)
    if len(pattern) != num_layers:
        raise AdvisorError(f"--moe-layer-freq {text!r} gives {len(pattern)} layers; the model has {num_layers} "
                           "(Megatron asserts they match: gpt_layer_specs.py)")
    dense = pattern.index(1) if 1 in pattern else num_layers
    if set(pattern) - {0, 1} or 1 not in pattern or 0 in pattern[dense:]:
        raise AdvisorError(f"--moe-layer-freq {text!r}: only leading dense layers then MoE layers are priced "
                           f"('([0]*k+[1]*({num_layers}-k))' or 1)")
    return dense


_PATTERN_LAYERS = 100_000
"""The longest pattern read (every released model has fewer than 200 layers): '[1]*10**9' would
otherwise build a list of a billion before its length is checked."""


def layer_pattern(text: str) -> list:
    """A --moe-layer-freq list expression evaluated as Megatron's ``_eval_pattern`` allows it
    (only digits, commas, brackets, parentheses, '+' and '*'; a space is refused there, as here)
    but without ``eval``: lists, integers, concatenation and repetition, each bounded."""
    import ast

    if re.search(r"[^,\d\[\]()+*]", text):
        raise AdvisorError(f"--moe-layer-freq {text!r}: Megatron takes only digits, ',', '[', ']', '(', ')', "
                           "'+' and '*' in a pattern (arguments.py, _eval_pattern)")

    def value(node):
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.List):
            return [value(item) for item in node.elts]
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Mult) and isinstance(left, int) and isinstance(right, list):
                left, right = right, left
            if isinstance(node.op, ast.Mult) and isinstance(left, list) and isinstance(right, int):
                if len(left) * max(right, 0) > _PATTERN_LAYERS:
                    raise AdvisorError(f"--moe-layer-freq {text!r}: over {_PATTERN_LAYERS:,} layers")
                return left * right
            if type(left) is type(right) and (isinstance(left, int) or isinstance(node.op, ast.Add)):
                return left + right if isinstance(node.op, ast.Add) else left * right  # a list by a list: below
        raise AdvisorError(f"--moe-layer-freq {text!r} is not a list of 0s and 1s (e.g. '([0]*3+[1]*58)')")

    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise AdvisorError(f"--moe-layer-freq {text!r} is not a Python list expression "
                           "(e.g. '([0]*3+[1]*58)')") from None
    pattern = value(tree.body)
    if not isinstance(pattern, list) or not all(type(item) is int for item in pattern):
        raise AdvisorError(f"--moe-layer-freq {text!r} is not a list of 0s and 1s (e.g. '([0]*3+[1]*58)')")
    return pattern


def _mla_and_yarn(values: dict):
    from advisor.moe.spec import MLA, YarnScaling

    mla = None
    if values.get("multi-latent-attention"):
        mla = MLA(q_lora_rank=flag_int(values, "q-lora-rank"), kv_lora_rank=flag_int(values, "kv-lora-rank", 32),
                  qk_head_dim=flag_int(values, "qk-head-dim", 128),
                  qk_pos_emb_head_dim=flag_int(values, "qk-pos-emb-head-dim", 64),
                  v_head_dim=flag_int(values, "v-head-dim", 128))
    yarn = None
    # --rope-type left out: MLA takes YaRN, other attention RoPE (arguments.py pops the None so
    # MLATransformerConfig's rope_type "yarn" stands), with --rotary-scaling-factor's own default.
    rope_type = values.get("rope-type") or ("yarn" if mla is not None else "rope")
    if rope_type == "yarn":  # MLATransformerConfig's fixed beta_fast 32, beta_slow 1, context 4096
        scale = limits.YARN_MSCALE
        yarn = YarnScaling(factor=_float(values, "rotary-scaling-factor", 1.0, bound=limits.ROPE_SCALING,
                                         low_open=False), original_max_position_embeddings=4096,
                           beta_fast=32.0, beta_slow=1.0,
                           mscale=_float(values, "mscale", 1.0, bound=scale, low_open=False),
                           mscale_all_dim=_float(values, "mscale-all-dim", 0.0, bound=scale, low_open=False))
    elif rope_type != "rope":
        raise AdvisorError(f"--rope-type {values['rope-type']!r} is not priced (rope or yarn)")
    return mla, yarn


def moe_spec(dense: LlamaSpec, values: dict):
    """The MoESpec the dense spec and the MoE flags describe."""
    from advisor.moe.spec import MoESpec

    score = values.get("moe-router-score-function", "softmax")
    if score not in ("softmax", "sigmoid"):
        raise AdvisorError(f"--moe-router-score-function {score!r} is not priced (softmax or sigmoid)")
    mla, yarn = _mla_and_yarn(values)
    top_k = flag_int(values, "moe-router-topk", 2)
    balancing, weights = _balancing(values)
    expert_bias = bool(values.get("moe-router-enable-expert-bias"))
    if balancing == (("none",) if expert_bias else ("aux_loss",)) and (weights == 0 or not expert_bias):
        balancing = None  # what MoESpec's None launches (moe.flags._balancing_flags): read as the presets say it
    if top_k == 1 and score == "softmax" and not values.get("moe-router-pre-softmax") \
            and balancing != ("sinkhorn",):  # transformer_config.py, __post_init__ (a list is never 'sinkhorn')
        raise AdvisorError("--moe-router-topk 1 with the softmax score function needs --moe-router-pre-softmax "
                           "(megatron-core refuses it: a softmax over one expert has no gradient)")
    fields = {name: getattr(dense, name) for name in dense.__dataclass_fields__}
    return MoESpec(**fields, num_experts=flag_int(values, "num-experts"),
                   moe_router_topk=top_k,
                   moe_ffn_hidden_size=flag_int(values, "moe-ffn-hidden-size", dense.ffn_hidden_size),
                   shared_expert_size=flag_int(values, "moe-shared-expert-intermediate-size", 0) or 0,
                   first_dense_layers=first_dense_layers(values.get("moe-layer-freq", "1"), dense.num_layers),
                   score_function=score,  # qk_layernorm: the dense spec's (--qk-layernorm, a model flag)
                   # the sigmoid score function ignores it (topk_routing_with_score_function)
                   router_pre_softmax=score == "softmax" and bool(values.get("moe-router-pre-softmax")),
                   expert_bias=expert_bias, aux_loss_coeff=weights, load_balancing=balancing,
                   router_num_groups=flag_int(values, "moe-router-num-groups"),
                   router_group_topk=flag_int(values, "moe-router-group-topk"),
                   router_topk_scaling_factor=_float(values, "moe-router-topk-scaling-factor",
                                                     bound=limits.MOE_TOPK_SCALING), mla=mla, yarn=yarn,
                   mtp_num_layers=flag_int(values, "mtp-num-layers", 0))


def read(values: dict, tp: int, recompute: str, *, recompute_method: str | None = None,
         recompute_num_layers: str | None = None,
         transformer_impl: str = "transformer_engine") -> tuple[MoEFlags, list[str]]:
    """(the MoE flags, what is not priced) of the command's MoE flags, EP and ETP at Megatron's
    defaults where left out. ``recompute_method`` and ``recompute_num_layers``: the command's own
    (None: not given), whatever its granularity, for the overlap's refusals
    (``advisor.moe.overlap``, checked by ``advisor.cli.moe.moe_settings``)."""
    unpriced = []
    if not values.get("moe-grouped-gemm"):
        unpriced.append("no --moe-grouped-gemm (sequential experts; priced as grouped GEMMs)")
    if (router_dtype := values.get("moe-router-dtype")) != "fp32":
        # transformer_config.py: None (Megatron's default) routes in the activations' dtype, BF16
        unpriced.append(f"{f'--moe-router-dtype {router_dtype}' if router_dtype else 'no --moe-router-dtype'} "
                        "(priced as --moe-router-dtype fp32, as the advisor's rows run: FP32 router logits and "
                        "probabilities, and the ETP combine's FP32 copy)")
    if values.get("moe-router-force-load-balancing"):
        unpriced.append("--moe-router-force-load-balancing (priced as balanced routing, which it forces)")
    unpriced += [note for name, note in NAMED.items() if values.get(name)]
    dispatcher, backend, backend_note = _dispatcher(values)
    unpriced += backend_note
    sms = _dispatcher_sms(values)
    if sms is not None and dispatcher != "flex":
        unpriced.append(f"--moe-deepep-num-sms {sms} without the flex dispatcher (Megatron ignores it)")
        sms = None
    capacity = _float(values, "moe-expert-capacity-factor", bound=limits.MOE_CAPACITY_FACTOR)
    for kind in values.get("moe-router-load-balancing-type") or ("aux_loss",):
        _check_capacity_balancing(kind, capacity)
    pad = bool(values.get("moe-pad-expert-input-to-capacity"))  # a factor alone drops without padding
    modules = read_recompute_modules(values, recompute, unpriced)
    mtp_num_layers = flag_int(values, "mtp-num-layers", 0)
    from advisor.moe.flags import pad_problem

    if problem := pad_problem(dispatcher, capacity, pad):
        raise AdvisorError(problem)
    return MoEFlags(ep=flag_int(values, "expert-model-parallel-size", 1),
                    etp=flag_int(values, "expert-tensor-parallel-size", tp), dispatcher=dispatcher,
                    moe_routing="capacity" if capacity is not None else "balanced", capacity_factor=capacity,
                    moe_imbalance=1.0, recompute_modules=modules, mtp_num_layers=mtp_num_layers,
                    a2a_overlap=bool(values.get("overlap-moe-expert-parallel-comm")),
                    delay_wgrad=bool(values.get("delay-wgrad-compute")), pad_to_capacity=pad,
                    recompute_method=recompute_method, recompute_num_layers=recompute_num_layers,
                    shared_expert_overlap=bool(values.get("moe-shared-expert-overlap")),
                    transformer_impl=transformer_impl, dispatcher_sms=sms,
                    permute_fusion=bool(values.get("moe-permute-fusion")), flex_backend=backend,
                    router_fusion=bool(values.get("moe-router-fusion")),
                    grouped_gemm=bool(values.get("moe-grouped-gemm")),
                    force_balancing=bool(values.get("moe-router-force-load-balancing"))), unpriced


def _balancing(values: dict) -> tuple[tuple[str, ...], float | tuple[float, ...]]:
    """(--moe-router-load-balancing-type's types, --moe-aux-loss-coeff's weights), as Megatron
    reads them (nargs='+'; validate_args keeps one value as a scalar): Megatron's choices
    (``BALANCING``), and one weight per type where there are several (``transformer_config.py``)."""
    from advisor.moe.spec import BALANCING

    kinds = tuple(values.get("moe-router-load-balancing-type") or ("aux_loss",))
    for kind in kinds:
        if kind not in BALANCING:
            raise AdvisorError(f"--moe-router-load-balancing-type {kind!r} is not one of Megatron's "
                               f"({', '.join(BALANCING)})")
    texts = values.get("moe-aux-loss-coeff") or ["0"]
    weights = tuple(_number(text, "moe-aux-loss-coeff", bound=limits.AUX_LOSS_COEFF, low_open=False)
                    for text in texts)
    if len(kinds) > 1 and len(weights) != len(kinds) or len(kinds) == 1 and len(weights) > 1:
        raise AdvisorError(f"--moe-aux-loss-coeff gives {len(weights)} weight{'s' * (len(weights) > 1)} for "
                           f"{len(kinds)} load-balancing type{'s' * (len(kinds) > 1)}: megatron-core needs one per type")
    return kinds, (weights if len(kinds) > 1 else weights[0])


def _check_capacity_balancing(balancing: str, capacity: float | None) -> None:
    """A capacity factor only with a loss-based balancing or none (``transformer_config.py``,
    __post_init__, each type of a list)."""
    if capacity is not None and balancing in ("sinkhorn", "quantile_balancing"):
        raise AdvisorError(f"--moe-expert-capacity-factor with --moe-router-load-balancing-type {balancing}: "
                           "megatron-core drops tokens only with aux_loss, seq_aux_loss, global_aux_loss or none")


SM_FLAGS = ("moe-flex-dispatcher-num-sms", "moe-deepep-num-sms", "moe-hybridep-num-sms")
"""The flex dispatcher's SM count, first the one that wins: core_v0.19.0's
moe_flex_dispatcher_num_sms, which takes the deprecated per-backend knobs when it is unset
(``transformer_config.py``, __post_init__); core_v0.15.2 has --moe-deepep-num-sms only."""


def _dispatcher_sms(values: dict) -> int | None:
    """The SMs the command gives the flex dispatcher's kernels, as megatron-core routes the flags
    (``SM_FLAGS``: core_v0.19.0 refuses two deprecated knobs that differ); None: not given."""
    given = {flag: flag_int(values, flag) for flag in SM_FLAGS if flag in values}
    if not given:
        return None
    if SM_FLAGS[0] in given:
        return given[SM_FLAGS[0]]
    if len(set(given.values())) > 1:
        both = " and ".join(f"--{flag} {count}" for flag, count in given.items())
        raise AdvisorError(f"{both} conflict (megatron-core refuses differing deprecated SM counts): give one "
                           f"--{SM_FLAGS[0]}")
    return next(iter(given.values()))


def _dispatcher(values: dict) -> tuple[str, str, list[str]]:
    """(--moe-token-dispatcher-type, the flex dispatcher's backend, what the backend adds unpriced;
    a backend given with another dispatcher is refused by Megatron, or ignored and so noted). The flex dispatcher is
    priced as DeepEP's deduplicated all-to-all (``advisor.moe.time``), which HybridEP also sends;
    Megatron's backend checks are ours (core_v0.19.0 ``transformer_config.py``: DeepEP and NCCL-EP
    only under flex; core_v0.15.2's ``--moe-enable-deepep`` the same)."""
    dispatcher = values.get("moe-token-dispatcher-type", "allgather")
    if dispatcher not in ("alltoall", "allgather", "flex"):
        raise AdvisorError(f"--moe-token-dispatcher-type {dispatcher!r} is not one of Megatron's (alltoall, allgather, "
                           "flex)")
    backend = values.get("moe-flex-dispatcher-backend", "deepep")
    if backend not in FLEX_BACKENDS:
        raise AdvisorError(f"--moe-flex-dispatcher-backend {backend!r} is not one of Megatron's (deepep, hybridep, "
                           "ncclep)")
    if dispatcher != "flex" and (values.get("moe-enable-deepep") or backend == "ncclep"):
        flag = "--moe-enable-deepep" if values.get("moe-enable-deepep") else "--moe-flex-dispatcher-backend ncclep"
        raise AdvisorError(f"{flag} needs --moe-token-dispatcher-type flex (megatron-core refuses it with "
                           f"{dispatcher})")
    if values.get("moe-enable-deepep") and "moe-flex-dispatcher-backend" in values and backend != "deepep":
        raise AdvisorError(f"--moe-enable-deepep with --moe-flex-dispatcher-backend {backend} (megatron-core: only "
                           "one backend for the flex dispatcher)")
    if dispatcher != "flex":
        ignored = [f"--moe-flex-dispatcher-backend {backend} (Megatron uses it only with the flex dispatcher)"]
        return dispatcher, "deepep", ignored if "moe-flex-dispatcher-backend" in values else []
    note = backend_note(backend)
    return dispatcher, backend, [note] if note else []


def backend_note(backend: str) -> str | None:
    """How a flex backend other than DeepEP is priced (a command's read-back names it among what is
    not priced as such; an estimate or sweep given the option says it too), or None for DeepEP."""
    if backend == "deepep":
        return None
    name = {"hybridep": "HybridEP's", "ncclep": "NCCL's EP"}[backend]
    return (f"--moe-flex-dispatcher-backend {backend} ({name} all-to-all, priced as DeepEP's; its own permutation "
            "at the HBM rate)")
