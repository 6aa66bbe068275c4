"""The MoE side of ``advisor sweep`` and ``advisor estimate`` (advisor.moe): the options they
add (--ep, --etp, the dispatcher and the routing assumption) and their output."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import click

from advisor import limits
from advisor.cli.moe_balancing import unbalanced_notes, with_aux_loss_coeff
from advisor.cli.options import (
    DEGREE, Bounded, InputError, apply_options, drawing_for, command_name, emit, held_note, note, nothing_fits,
)
from advisor.moe.spec import FLEX_BACKENDS, RECOMPUTE_MODULES
from advisor.options.releases import release_defaults
from advisor.paper_rule import judged_threshold

MOE_CAPACITY_FACTOR = Bounded(limits.MOE_CAPACITY_FACTOR, integer=False, low_open=True, metavar="FACTOR")
MOE_IMBALANCE = Bounded(limits.MOE_IMBALANCE, integer=False, metavar="RATIO")
MTP_LAYERS = Bounded(limits.MTP_LAYERS)
AUX_LOSS_COEFF = Bounded(limits.AUX_LOSS_COEFF, integer=False)
DISPATCHER_SMS = Bounded(limits.DISPATCHER_SMS)

if TYPE_CHECKING:
    from advisor.moe.readback import MoEFlags

_FLAG_FIELDS = ("ep", "etp", "dispatcher", "moe_routing", "capacity_factor", "pad_to_capacity", "moe_imbalance",
                "mtp_num_layers", "a2a_overlap", "delay_wgrad", "dispatcher_sms", "permute_fusion", "router_fusion",
                "flex_backend", "recompute_modules", "aux_loss_coeff", "shared_expert_overlap")
"""The ``MoEFlags`` fields that ``moe_options`` adds an option for (the rest: a Megatron command's only)."""


EXPERT_DEGREE_HELP = {
    "sweep": ("Sweep only this expert parallel size (MoE models; default: searched, any divisor of the experts).",
              "Sweep only this expert tensor parallel size (MoE models; default: searched, powers of 2 up to TP)."),
    "estimate": ("Expert parallel size (MoE models; default: 1).",
                 "Expert tensor parallel size (MoE models; default: the TP, as Megatron's)."),
}
"""--ep's and --etp's help in each command that takes them: the sweep pins a searched dimension,
the estimate prices one value."""


def moe_options(command: str):
    """The MoE options (``_with_moe_options``), --ep's and --etp's help worded for ``command``
    (``EXPERT_DEGREE_HELP``)."""
    return functools.partial(_with_moe_options, degree_help=EXPERT_DEGREE_HELP[command])


def _with_moe_options(func, degree_help: tuple[str, str]):
    """--ep, --etp, --moe-token-dispatcher-type, --moe-routing, --moe-expert-capacity-factor,
    --moe-pad-expert-input-to-capacity, --moe-imbalance, --mtp-num-layers,
    --overlap-moe-expert-parallel-comm, --moe-shared-expert-overlap, --delay-wgrad-compute,
    --moe-deepep-num-sms, --moe-permute-fusion, --moe-router-fusion, --moe-flex-dispatcher-backend,
    --recompute-modules, --moe-aux-loss-coeff ->
    ``moe: MoEFlags`` (``advisor.moe.readback``)."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        from advisor.moe.readback import MoEFlags

        values = {name: kwargs.pop(name) for name in _FLAG_FIELDS}
        return func(*args, moe=MoEFlags(**values, given=_given(values)), **kwargs)

    return apply_options([
        click.option("--ep", type=DEGREE, default=None, help=degree_help[0]),
        click.option("--etp", type=DEGREE, default=None, help=degree_help[1]),
        click.option("--moe-token-dispatcher-type", "dispatcher", type=click.Choice(["alltoall", "allgather", "flex"]),
                     default="alltoall", show_default=True, help="Megatron's token dispatcher (MoE models)."),
        click.option("--moe-flex-dispatcher-backend", "flex_backend", type=click.Choice(FLEX_BACKENDS),
                     default="deepep", show_default=True,
                     help="The flex dispatcher's backend (core_v0.19.0's flag; core_v0.15.2 runs DeepEP alone): "
                          "each priced as DeepEP's all-to-all; HybridEP and NCCL-EP permute in their own kernels."),
        click.option("--moe-routing", type=click.Choice(["balanced", "capacity", "dropless"]), default=None,
                     help="Routed tokens per rank: balanced (x --moe-imbalance; the default), capacity "
                     "(x --moe-expert-capacity-factor; the default with a factor), dropless (the worst case)."),
        click.option("--moe-expert-capacity-factor", "capacity_factor", type=MOE_CAPACITY_FACTOR,
                     default=None, help="Megatron's capacity factor: tokens over it are dropped (capacity routing)."),
        click.option("--moe-pad-expert-input-to-capacity/--no-moe-pad-expert-input-to-capacity", "pad_to_capacity",
                     default=None, help="With --moe-routing capacity: every expert runs its full capacity (the "
                     "default, as token-drop recipes run it) or only the routed tokens it kept."),
        click.option("--moe-imbalance", type=MOE_IMBALANCE, default=1.0, show_default=True,
                     help="The busiest rank's routed tokens over the mean: balanced routing's, capacity routing's "
                          "not padded up to its factor, and dropless routing's pace (its memory is the worst case)."),
        click.option("--mtp-num-layers", "mtp_num_layers", type=MTP_LAYERS, default=None,
                     help="Multi-token-prediction layers (DeepSeek-V3's MTP, Megatron's --mtp-num-layers): priced on "
                          "the last pipeline stage. MoE models. A config.json's num_nextn_predict_layers is priced "
                          "only through this option (a line on stderr says so where it is not given)."),
        click.option("--moe-aux-loss-coeff", "aux_loss_coeff", multiple=True, type=AUX_LOSS_COEFF, metavar="X",
                     help="The load-balancing loss's weight to train with, replacing the model's (a config.json's "
                          "router_aux_loss_coef): Megatron's router balances nothing at 0, so --moe-routing balanced "
                          "is then an assumption. One weight per balancing type where the model has several "
                          "(Megatron's nargs='+'). The rows launch it. MoE models."),
        click.option("--overlap-moe-expert-parallel-comm", "a2a_overlap", is_flag=True,
                     help="Megatron's combined 1F1B: the EP all-to-all hidden behind the other microbatch's compute "
                          "(needs EP > 1, the alltoall or flex dispatcher, VPP with PP > 1, no full recompute)."),
        click.option("--moe-shared-expert-overlap", "shared_expert_overlap", is_flag=True,
                     help="Megatron's shared experts on their own stream beside the dispatch and combine "
                          "all-to-all (alltoall dispatcher; flex too on core 0.19; not with "
                          "--overlap-moe-expert-parallel-comm): their time hidden behind the communication, "
                          "their memory as that path keeps it. A model without shared experts: no effect."),
        click.option("--delay-wgrad-compute", "delay_wgrad", is_flag=True,
                     help="Megatron's delayed weight gradients (with --overlap-moe-expert-parallel-comm only)."),
        click.option("--moe-deepep-num-sms", "dispatcher_sms", type=DISPATCHER_SMS, default=None, metavar="N",
                     help="The flex dispatcher's SMs (DeepEP's default 20; an even number): the overlapped compute "
                          "runs on the rest, and the rows write the flag."),
        click.option("--moe-permute-fusion", "permute_fusion", is_flag=True,
                     help="Transformer Engine's fused token permutation (Megatron's flag; needs TE 2.1+). Time only: "
                          "priced at the HBM rate, where megatron-core's own unfused one runs at 42% of it (measured "
                          "on an H200); memory as unfused. Given, not searched: the rows write it."),
        click.option("--moe-router-fusion", "router_fusion", is_flag=True,
                     help="Transformer Engine's fused router (Megatron's flag; needs TE 2.7+). Time only: the router "
                          "priced as its GEMM, where the unfused one adds small kernels measured on an H200 at 0.24 "
                          "ms a layer and microbatch (0.50 ms DeepSeek-V3's); memory as unfused. Given, not searched: "
                          "the rows write it."),
        click.option("--recompute-modules", "recompute_modules", multiple=True, type=click.Choice(RECOMPUTE_MODULES),
                     metavar="MODULE",
                     help=f"With --recompute selective: Megatron's --recompute-modules, one of "
                          f"{', '.join(RECOMPUTE_MODULES)} (repeat the option, or list them after it as Megatron "
                          "does). MoE models' default here: moe_act, layernorm and, with MLA, mla_up_proj, which "
                          "save memory, and their rows always write the modules; dense models' default: Megatron's "
                          "core_attn (saves none with fused attention; mlp frees the MLP's activations, layernorm "
                          "frees nothing with Transformer Engine, whose norms are fused)."),
    ], wrapper)


def _given(values: dict) -> tuple[str, ...]:
    """The options of ``values`` (``moe_options``' parameters) given on the command line, as
    spelled there (the way ``from_command.refuse_explicit`` tells them from their defaults)."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return ()
    return tuple(param.secondary_opts[0] if values[param.name] is False and param.secondary_opts else param.opts[0]
                 for param in ctx.command.params if param.name in values
                 and ctx.get_parameter_source(param.name) == click.core.ParameterSource.COMMANDLINE)


def _dense_refused(flags: MoEFlags) -> list[str]:
    """The MoE options a dense model refuses: every one given (``MoEFlags.given``) but --ep 1 and
    --etp 1 (a dense run's own, as its rows state them), and any set otherwise."""
    set_ = {"--ep": (flags.ep or 1) > 1, "--etp": (flags.etp or 1) > 1, "--mtp-num-layers": bool(flags.mtp_num_layers),
            "--overlap-moe-expert-parallel-comm": flags.a2a_overlap, "--delay-wgrad-compute": flags.delay_wgrad,
            "--moe-shared-expert-overlap": flags.shared_expert_overlap,
            "--moe-deepep-num-sms": flags.dispatcher_sms is not None, "--moe-permute-fusion": flags.permute_fusion,
            "--moe-router-fusion": flags.router_fusion,
            "--moe-flex-dispatcher-backend": flags.flex_backend != "deepep"}
    # --recompute-modules is a dense recomputation flag too (``dense_recompute_options``)
    named = [flag for flag in flags.given if flag not in ("--ep", "--etp", "--recompute-modules") or set_.get(flag)]
    return named + [flag for flag, on in set_.items() if on and flag not in named]


def recompute_modules_problem(modules, *, spec, recompute: str, fp8_format, fp8_recipe: str, space: bool,
                              grouped_gemm: bool = True) -> str | None:
    """Why --recompute-modules ``modules`` cannot run (or be priced) with this model and
    recomputation, or None: the one check of the modules, an MoE model's and a dense one's.
    ``recompute``: the estimate's granularity, or the sweep's (``space``: 'auto' searches it);
    ``grouped_gemm``: an MoE command's --moe-grouped-gemm (``MoEFlags.grouped_gemm``).
    megatron-core's ``TransformerConfig.__post_init__`` (core_v0.15.2 and core_v0.19.0) refuses
    moe_act without grouped GEMMs (a dense model has none), mla_up_proj without MLA, and moe_act or
    layernorm with FP8's delayed scaling; a dense model's layers recompute moe and shared_experts
    nowhere (``transformer_layer.py``: only an MoELayer reads them), so they are refused as the
    mistake they are rather than priced as nothing."""
    from advisor.moe.spec import is_moe

    if not modules:
        return None
    if recompute not in ("selective", "auto"):
        # Megatron reads --recompute-modules only with --recompute-granularity selective
        return (f"--recompute-modules needs --recompute selective (this {'sweep' if space else 'estimate'} "
                f"recomputes {recompute})")
    dense = not is_moe(spec)
    if dense and "moe_act" in modules:
        return (f"--recompute-modules moe_act: {spec.name} is dense, and megatron-core refuses it without grouped "
                "GEMMs ('moe_act in recompute_modules is only supported with moe_grouped_gemm.')")
    if "moe_act" in modules and not grouped_gemm:
        return ("--recompute-modules moe_act without --moe-grouped-gemm: Megatron-LM refuses the command "
                "(TransformerConfig: 'moe_act in recompute_modules is only supported with moe_grouped_gemm.'); give "
                "--moe-grouped-gemm, or drop moe_act")
    if dense and (moe := [module for module in ("moe", "shared_experts") if module in modules]):
        return (f"--recompute-modules {' '.join(moe)}: {spec.name} is dense, and Megatron recomputes "
                f"{'them' if len(moe) > 1 else 'it'} only in MoE layers (transformer_layer.py): drop "
                f"{'them' if len(moe) > 1 else 'it'}")
    if fp8_format is not None and fp8_recipe == "delayed" and {"moe_act", "layernorm"} & set(modules):
        return ("--recompute-modules moe_act or layernorm with FP8 needs an --fp8-recipe other than delayed "
                "(megatron-core refuses them with delayed scaling)")
    if "mla_up_proj" in modules and getattr(spec, "mla", None) is None:
        return (f"--recompute-modules mla_up_proj needs multi-latent attention, which {spec.name} does not "
                "have (megatron-core refuses it)")
    return None


def idle_modules_line(modules, spec) -> str | None:
    """One line naming the --recompute-modules that recompute nothing in this MoE model, and why,
    or None. Megatron accepts them and builds nothing to recompute (core_v0.15.2 and core_v0.19.0):
    shared_experts without shared experts (``moe_layer.py``: ``shared_experts_compute`` runs only
    where ``use_shared_expert``), mlp where every layer is an MoE layer (``transformer_layer.py``:
    ``recompute_mlp`` only where the MLP is not an ``MoELayer``). They are priced as the nothing
    they do (``advisor.moe.stage``, ``advisor.moe.time``); the line says why the numbers do not move."""
    idle = {module: why for module, why, on in (
        ("shared_experts", "it has no shared experts", not spec.shared_expert_size),
        ("mlp", "Megatron's mlp is the dense MLP, and every layer is an MoE layer: moe or moe_act recompute the "
                "experts", not spec.first_dense_layers)) if on and module in (modules or ())}
    if not idle:
        return None
    return (f"--recompute-modules {' and '.join(idle)} recompute{'s' if len(idle) == 1 else ''} nothing on "
            f"{spec.name} ({'; '.join(idle.values())}), and {'is' if len(idle) == 1 else 'are'} priced so")


def config_mtp_line(spec, mtp_num_layers: int | None) -> str | None:
    """One line saying that the model's config.json declares MTP layers (num_nextn_predict_layers)
    priced without them, and the flag that prices them; None where it declares none or
    --mtp-num-layers was given (0 too: the user chose). The config is read as its preset (without
    MTP: DeepSeek-V3's 671B); Megatron-Bridge's DeepSeekV3Bridge builds them
    (``mtp_num_layers = num_nextn_predict_layers``) and Megatron-LM's --mtp-num-layers defaults to
    none (core_v0.15.2 ``arguments.py``; core_v0.19.0 ``TransformerConfig.mtp_num_layers``), so a
    user of either may expect either: the line says which."""
    declared = spec.config_mtp_num_layers
    if not declared or mtp_num_layers is not None:
        return None
    them = "it" if declared == 1 else "them"
    return (f"{spec.name} has {declared} multi-token-prediction layer{'s' * (declared != 1)} "
            f"(num_nextn_predict_layers), priced without {them}: --mtp-num-layers {declared} prices {them}")


def dense_recompute_options(spec, flags: MoEFlags, options, space=None):
    """The training options of a dense model with its --recompute-modules: the advisor's option
    (``flags``, the MoE options' one parser) or a command's read back (already in ``options``),
    checked by ``recompute_modules_problem``; ``options`` unchanged for an MoE model, whose modules
    are ``moe_settings``'."""
    from advisor.moe.spec import is_moe

    if is_moe(spec):
        return options
    modules = tuple(flags.recompute_modules) or options.recomputation.recompute_modules
    recompute = space.recompute if space is not None else options.recomputation.recompute
    precision = options.precision
    if problem := recompute_modules_problem(modules, spec=spec, recompute=recompute, fp8_format=precision.fp8_format,
                                            fp8_recipe=precision.fp8_recipe, space=space is not None):
        raise InputError(problem)
    return options.with_(recompute_modules=modules) if modules else options


def moe_settings(spec, flags: MoEFlags, *, options, gpu=None, space=None, unsupported: dict | None = None,
                 release=None):
    """(spec, MoEOptions) from the MoE flags (the advisor's own or a command's read back), the
    run's training options inside (the one description dense rows are priced from); a dense model
    refuses the MoE options given (``_dense_refused``); for an MoE model, every option the MoE
    model does not price is refused by name (none is ignored), as is every option of the command
    that MoE rows do not offer yet (``unsupported``: flag -> given). The spec gets the flags'
    ``mtp_num_layers`` where given; ``gpu`` (None: a Hopper's SMs) bounds the dispatcher's SMs."""
    from advisor.moe.spec import is_moe

    recompute_modules, mtp_num_layers = flags.recompute_modules, flags.mtp_num_layers
    if not is_moe(spec):  # a dense model: nothing of advisor.moe's pricing is imported for it
        if named := _dense_refused(flags):
            raise InputError(f"{spec.name} is dense; MoE options need a mixture-of-experts model: {', '.join(named)}")
        return spec, None
    from dataclasses import replace

    from advisor.moe.memory import RoutedTokens
    from advisor.moe.overlap import settings_problem
    from advisor.moe.userbuffers import mla_problem
    from advisor.moe.stage import MoEOptions
    from advisor.moe.ep_time import dispatcher_sms_problem

    training = options  # advisor.options.TrainingOptions
    _refuse_unpriced(spec, training, space, unsupported)
    if problem := fsdp_problem(training, flags.a2a_overlap, release):
        raise InputError(f"{spec.name} is a mixture of experts; {''.join(problem)}")
    capacity_factor, dispatcher = flags.capacity_factor, flags.dispatcher
    moe_routing = _routing(flags.moe_routing, capacity_factor)
    recompute = space.recompute if space is not None else training.recomputation.recompute
    fp8 = training.precision
    if problem := recompute_modules_problem(recompute_modules, spec=spec, recompute=recompute,
                                            fp8_format=fp8.fp8_format, fp8_recipe=fp8.fp8_recipe,
                                            space=space is not None, grouped_gemm=flags.grouped_gemm):
        raise InputError(problem)
    for line in (idle_modules_line(recompute_modules, spec), config_mtp_line(spec, mtp_num_layers)):
        if line:
            held_note(f"{command_name()}: {line}")
    padded = _padded(moe_routing, capacity_factor, flags.pad_to_capacity, dispatcher)
    if moe_routing == "capacity" and padded and flags.moe_imbalance != 1:
        raise InputError(f"--moe-imbalance {flags.moe_imbalance:g} does not change capacity routing padded to capacity "
                         "(every expert runs exactly its capacity): leave it out, or give "
                         "--no-moe-pad-expert-input-to-capacity (the busiest expert then runs min(imbalance, factor) "
                         "of its share)")
    if problem := settings_problem(
            a2a_overlap=flags.a2a_overlap, delay_wgrad=flags.delay_wgrad, dispatcher=dispatcher, recompute=recompute,
            recompute_method=flags.recompute_method, recompute_num_layers=flags.recompute_num_layers,
            recompute_modules=recompute_modules, shared_expert_overlap=flags.shared_expert_overlap,
            transformer_impl=flags.transformer_impl,
            mtp_num_layers=spec.mtp_num_layers if mtp_num_layers is None else mtp_num_layers):
        raise InputError(problem)
    if problem := mla_problem(spec, training.tensor_parallel.tp_comm_overlap):
        raise InputError(problem)
    if flags.shared_expert_overlap:
        _check_shared_overlap(flags, dispatcher, recompute_modules, spec, release)
    if problem := dispatcher_sms_problem(flags.dispatcher_sms, dispatcher, gpu.architecture if gpu else "hopper",
                                         gpu.name if gpu else None):
        raise InputError(problem)
    if flags.flex_backend != "deepep":
        _check_flex_backend(flags.flex_backend, dispatcher, release)
    if mtp_num_layers is not None:
        spec = replace(spec, mtp_num_layers=mtp_num_layers)
    if flags.aux_loss_coeff:
        spec = with_aux_loss_coeff(spec, flags.aux_loss_coeff)
    return spec, MoEOptions(dispatcher=dispatcher, training=training.with_(recompute="none"),
                            a2a_overlap=flags.a2a_overlap, delay_wgrad=flags.delay_wgrad,
                            dispatcher_sms=flags.dispatcher_sms, permute_fusion=flags.permute_fusion,
                            router_fusion=flags.router_fusion, flex_backend=flags.flex_backend,
                            shared_expert_overlap=flags.shared_expert_overlap,
                            routing=RoutedTokens(routing=moe_routing, capacity_factor=capacity_factor,
                                                 pad_to_capacity=padded, imbalance=flags.moe_imbalance),
                            modules=frozenset(recompute_modules) if recompute_modules else None)


def _refuse_unpriced(spec, training, space, unsupported: dict | None) -> None:
    """``moe_settings``' one line for what an MoE row does not price (``_levers_not_priced``, TP without
    sequence parallelism, unfused attention, a pinned recomputation method) or does not offer yet
    (``unsupported``: flag -> given), every such option named."""
    from advisor.render import listed

    memory, levers = training.memory_options(), _levers_not_priced(training)
    # at TP > 1: a command without --sequence-parallel says it no more than the advisor's own flag does
    refused = {"TP without --sequence-parallel (megatron-core's MoELayer raises in training at TP > 1 without it, "
               "moe_layer.py)": not memory.sequence_parallel, "--no-flash-attn": not memory.flash_attention,
               **levers}
    if space is not None:
        refused["--recompute-method/--recompute-num-layers"] = bool(space.recompute_method
                                                                    or space.recompute_num_layers)
    named = [flag for flag, given in refused.items() if given]
    lacking = [flag for flag, given in (unsupported or {}).items() if given]
    if named or lacking:
        parts = ([f"its model does not price {', '.join(named)}"] if named else []) + (
            [MOE_PRICED_TRAINING] if any(levers.values()) else []) + (
            [f"its rows have no {listed(lacking)} yet (drop {'it' if len(lacking) == 1 else 'them'})"] if lacking else [])
        raise InputError(f"{spec.name} is a mixture of experts; {'; '.join(parts)}")


def _check_shared_overlap(flags, dispatcher: str, recompute_modules, spec, release) -> None:
    """megatron-core's refusals of --moe-shared-expert-overlap, the advisor's own or a command's
    (``advisor.moe.overlap``), as one line; on a model without shared experts, the line on stderr
    that says it changes nothing (``no_shared_experts_line``)."""
    from advisor.moe.overlap import shared_expert_overlap_problem

    if problem := shared_expert_overlap_problem(dispatcher=dispatcher, a2a_overlap=flags.a2a_overlap,
                                                recompute_modules=recompute_modules,
                                                shared_experts=bool(spec.shared_expert_size),
                                                release=release_defaults(release)):
        raise InputError(problem)
    if line := no_shared_experts_line(spec):
        held_note(f"{command_name()}: {line}")


def no_shared_experts_line(spec) -> str | None:
    """What --moe-shared-expert-overlap does for a model without shared experts: nothing, as
    megatron-core reads it (core_v0.15.2 and core_v0.19.0 ``transformer_config.py``, ``__post_init__``,
    checks the dispatcher only where ``moe_shared_expert_intermediate_size`` is set; ``moe_layer.py``
    hands the dispatcher shared experts only where there are some): accepted, and said so."""
    if spec.shared_expert_size:
        return None
    return (f"--moe-shared-expert-overlap: {spec.name} has no shared experts; megatron-core takes the flag and "
            "changes nothing (priced as without it)")


def _check_flex_backend(backend: str, dispatcher: str, release) -> None:
    """HybridEP and NCCL-EP: the flex dispatcher's only, and on a release that has the flag (the
    rows write it: ``advisor.moe.flags.layout_flags``; core_v0.15.2's flex dispatcher is DeepEP's)."""
    if dispatcher != "flex":
        raise InputError(f"--moe-flex-dispatcher-backend {backend} needs --moe-token-dispatcher-type flex "
                         f"(Megatron uses a backend only there; this one runs {dispatcher})")
    defaults = release_defaults(release) if release is not None else None
    if defaults is not None and "--moe-flex-dispatcher-backend" in defaults.lacks:
        raise InputError(f"--moe-flex-dispatcher-backend {backend}: {defaults.name} has no such flag "
                         "(its flex dispatcher is DeepEP's); drop the backend or name a newer --megatron-version")


def _routing(moe_routing: str | None, capacity_factor: float | None) -> str:
    """--moe-routing: capacity when a factor is given (Megatron drops tokens over it), else
    balanced; a factor with another routing would be read and ignored, so it is refused."""
    if moe_routing is None:
        return "balanced" if capacity_factor is None else "capacity"
    if moe_routing == "capacity" and capacity_factor is None:
        raise InputError("--moe-routing capacity needs --moe-expert-capacity-factor")
    if moe_routing != "capacity" and capacity_factor is not None:
        raise InputError(f"--moe-expert-capacity-factor drops tokens (capacity routing); --moe-routing {moe_routing} "
                         "routes every token: give one of them")
    return moe_routing


def _padded(moe_routing: str, capacity_factor, pad_to_capacity: bool | None, dispatcher: str) -> bool:
    """Whether capacity routing pads the expert inputs (padded unless told not to), refused where
    megatron-core refuses the pad (``advisor.moe.flags.pad_problem``)."""
    from advisor.moe.flags import pad_problem

    if moe_routing != "capacity":
        if pad_to_capacity:
            raise InputError("--moe-pad-expert-input-to-capacity needs --moe-routing capacity and "
                             "--moe-expert-capacity-factor")
        return True
    padded = pad_to_capacity is not False
    if problem := pad_problem(dispatcher, capacity_factor, padded):
        raise InputError(f"{problem}; give --no-moe-pad-expert-input-to-capacity or another dispatcher")
    return padded


_WEIGHTS_NOT_PRICED = {"float32": "FP32 weights (no --bf16 or --fp16: Megatron's default params_dtype float32)",
                       "float16": "--fp16 (FP16 weights)"}
"""The weights' number format the MoE model does not price, in Megatron's words: it prices --bf16."""


MOE_PRICED_TRAINING = ("it prices BF16 weights (--bf16) under Megatron's DDP or Megatron-FSDP, with or without "
                       "optimizer CPU offload: drop or change those flags to price the run so")
"""The remedy where a training option the MoE model does not price is given (``_levers_not_priced``)."""


def _levers_not_priced(training) -> dict[str, bool]:
    """The training options (advisor.options) the MoE model does not price yet: named, never ignored.
    Megatron-FSDP is priced (``advisor.moe.fsdp``), but not where ``fsdp_problem`` says; optimizer
    CPU offload is, for the dense and the expert optimizer alike (``advisor.moe.stage.model_states``,
    ``advisor.moe.time._data_parallel``)."""
    dp, params_dtype = training.data_parallel, training.precision.params_dtype
    return {"--use-torch-fsdp2": dp.torch_fsdp2,
            **({_WEIGHTS_NOT_PRICED[params_dtype]: True} if params_dtype != "bfloat16" else {})}


def fsdp_problem(training, a2a_overlap: bool, release) -> tuple[str, str] | None:
    """Why the MoE model does not price this run's Megatron-FSDP, or None: (the short reason, its
    source and remedy; the command's refusal is the two joined, a --sharding auto rung's the
    reason alone). A release that cannot wrap an MoE model (``advisor.moe.fsdp.release_problem``),
    or --overlap-moe-expert-parallel-comm, whose combined schedule core_v0.19.0 runs under
    Megatron-FSDP with per-submodule gathers (mcore_fsdp_adapter.py:168-225:
    ``enable_fine_grained_param_gather_hook``), two layers' weights gathered at once, which
    ``advisor.moe.fsdp`` does not price."""
    if training.data_parallel.fsdp_strategy is None:
        return None
    from advisor.moe.fsdp import release_problem

    if problem := release_problem(release):
        return problem
    if a2a_overlap:
        return ("--overlap-moe-expert-parallel-comm with --use-megatron-fsdp is not priced",
                " (core_v0.19.0 gathers each submodule's weights for its combined schedule: mcore_fsdp_adapter.py); "
                "drop one of them")
    return None


def rung_problem(training, a2a_overlap: bool, release) -> str | None:
    """Why the MoE model refuses the training options of a --sharding auto rung
    (``advisor.escalation.LADDER``), or None: the lever checks ``moe_settings`` refuses a command
    with, the levers not priced (``_levers_not_priced``) and Megatron-FSDP's refusals
    (``fsdp_problem``), so that the MoE sweep climbs every rung the MoE model prices and no other.
    The reason is the refusal's short reason (its sources and remedy are the command's)."""
    if named := [flag for flag, given in _levers_not_priced(training).items() if given]:
        from advisor.render import listed

        return f"the MoE model does not price {listed(named)}"
    if problem := fsdp_problem(training, a2a_overlap, release):
        return problem[0]
    return None


def row_flags(spec, workload, row: dict, release) -> list[str]:
    """Every Megatron flag of one MoE row (``advisor.moe.flags.row_args``) as ``release`` reads
    them (``release_spelling``)."""
    from advisor.moe.flags import row_args
    from advisor.options.flags import release_spelling

    return release_spelling(release, row_args(spec, workload.seq_len, workload.global_batch_size, row))


def sweep(spec, workload, gpus, mem, threshold, gpu, gpus_per_node, settings, ep, etp, show_all, top, fmt, output,
          space=None, memory_model=None, budget=(None, None), plot=None, rank_by=None, release=None):
    """The MoE rows of ``advisor sweep`` (``advisor.moe.space.sweep``) as the dense sweep writes
    its own: the table, or JSON or CSV with the count line on stderr, and ``plot``'s picture of
    the rows shown; where nothing fits, the line saying why (``_nothing_fits``) and exit status 1.
    ``budget``: (--tokens, --gpu-hour-price), each None where not given: the rows' days,
    GPU-hours and cost, as dense rows have them; ``rank_by``: --rank-by (None: the default);
    ``release``: the Megatron-LM release whose evaluation the days leave out."""
    from advisor.cli.sweep_table import write_plot
    from advisor.errors import AdvisorError
    from advisor.moe.space import sweep as run

    tokens, gpu_hour_price = budget
    layouts = dict(max_tp=gpus_per_node, ep=ep, etp=etp, even_split=space is not None and space.split == "even",
                   **({} if space is None else {"pinned": space.pinned}))  # the sweep's and the ladder's bound's
    swept = functools.partial(
        run, spec, workload, gpus, mem, threshold=threshold, gpu=gpu, **layouts,
        recompute=None if space is None or space.recompute == "auto" else space.recompute, memory_model=memory_model,
        vpp=None if space is None else space.vpp, tokens=tokens, rank_by=rank_by)
    try:
        result = swept(options=settings)
    except AdvisorError as error:
        raise InputError(str(error)) from None
    if space is not None and space.sharding == "auto":  # the dense sweep's ladder (advisor.escalation)
        from advisor.moe.space import escalate, may_fit

        result = escalate(result, lambda lever: swept(options=lever), gpu,
                          lambda training: rung_problem(training, settings.a2a_overlap, release),
                          space.overlap_param_gather_given,
                          may_help=lambda lever: may_fit(spec, workload, gpus, mem, options=lever, **layouts))
        if result.escalation:
            from advisor.cli.sweep_table import lever_note

            note(lever_note(result.escalation, timed=result.lever_time_cost is not None))
    shown = _priced(result.rows(include_oom=show_all, limit=top or (30 if fmt == "table" else None)), gpu_hour_price)
    setup = {"seq_len": workload.seq_len, "global_batch_size": workload.global_batch_size, "memory_gib": mem,
             "memory_model": result.memory_model, "threshold": judged_threshold(result.memory_model, threshold),
             "gpu": gpu.name if gpu else None, "gpus_per_node": gpus_per_node, "ranking_tolerance": result.tolerance,
             "megatron_version": release_defaults(release).checked,
             "model": spec.to_dict() if fmt == "json" else spec.name}
    if plot is not None:  # the setup's memory_gib is each bar's whole
        write_plot([{**setup, **row} for row in shown], plot,
                   _title(result, spec, workload, gpus, mem, threshold, gpu, settings), experts=True)
    unbalanced = unbalanced_notes(spec, settings, fmt, output)
    if fmt != "table":
        text = _machine_text(shown, setup, spec, workload, fmt, release)
        if fmt == "csv" and not shown:  # nothing shown: the columns of a row (the search always makes one)
            from advisor import render

            text = render.csv_header(_machine_text(_priced(result.rows(include_oom=True, limit=1), gpu_hour_price),
                                                   setup, spec, workload, fmt, release))
        note(f"{command_name()}: {_searched(result)}")
    else:
        text = _sweep_table(result, shown, spec, workload, gpus, mem, threshold, gpu, settings, show_all, output,
                            priced=gpu_hour_price is not None, release=release, notes=unbalanced)
    if not result.ranked and not show_all:
        if fmt != "table":  # the empty document, as the dense sweep gives it
            emit(text, output)
        nothing_fits(_nothing_fits(result, mem, space, ep, etp, settings.a2a_overlap))
    emit(text, output)


def _priced(rows: list[dict], gpu_hour_price: float | None) -> list[dict]:
    """The rows, each with its ``cost_usd`` (``advisor.ranking.cost_usd``) where a price is given."""
    if gpu_hour_price is not None:
        from advisor.ranking import cost_usd

        for row in rows:
            row["cost_usd"] = cost_usd(row["gpu_hours"], gpu_hour_price)
    return rows


def _searched(result) -> str:
    """What the search priced: the table's caption line, and with JSON or CSV the stderr line."""
    from advisor.render import counted

    # ``advisor.moe.space._one_variant_each``: with a GPU the fastest variant that fits, else the
    # least recomputation (no interleaving) that does; a layout nothing fits shows its least memory
    chosen = "its fastest variant that fits" if result.timing else "its least recomputation that fits"
    return f"{counted(result.considered, 'layout')} x recomputation x VPP priced; one row per layout, {chosen}"


def _nothing_fits(result, mem: float, space, ep, etp, a2a_overlap: bool) -> str:
    """The dense sweep's nothing-fits line (``advisor.cli.estimate``) for MoE rows: the verdicts'
    tally, the layout that needs the least of the memory its verdict judged (the calibrated usage
    where calibrated, else the analytic total) with its EP and ETP, and the choices given that
    the search could relax (recomputation, the split, VPP, EP, ETP, the overlap). Where no
    layout's model states alone fit, it says so, and hints neither recomputation nor a shorter
    --seq-len; and it says which of --sharding auto's levers it tried in vain and why it did not
    try the others (``sweep_table.ladder_text``)."""
    from advisor import render
    from advisor.cli.hints import bigger_gpu, states_text, unpinned
    from advisor.memory import GIB

    least = result.least()
    need = least.get("usage_gib", least["total_gib"])
    # each layout's states at its peak stage: no more than its fullest stage's, so a floor
    floor = float(result.memory["states"][result.order].min()) / GIB
    bound = floor > mem  # what the --seq-len and recomputation shrink, activations, cannot help
    recompute, split, vpp = (space.recompute, space.split, space.vpp) if space is not None else ("auto", "auto", None)
    given = space.pinned.given() if space is not None else {}
    pins = unpinned([*given, *(name for name, value in (("vpp", vpp if vpp != 1 else None), ("ep", ep), ("etp", etp))
                               if value is not None)])
    levers = {"--recompute auto": recompute in ("none", "selective") and not bound, "--split auto": split == "even",
              **dict.fromkeys(pins, True), "no --overlap-moe-expert-parallel-comm": a2a_overlap,
              "a shorter --seq-len": not bound, "a GPU with more memory": bound and bigger_gpu(floor, mem)}
    hints = ["more GPUs", *(hint for hint, helps in levers.items() if helps)]
    tally = ", ".join(f"{n:,} {verdict}" for verdict, n in result.counts.items())
    states = states_text(least["model_states_gib"], mem) if bound else ""
    from advisor.cli.sweep_table import ladder_text

    climbed = ladder_text(result.ladder)
    return (f"{command_name()}: nothing fits: {tally}; the least any layout needs is {need:.1f} GiB per GPU against "
            f"{mem:g} GiB (TP {least['tp']}, CP {least['cp']}, PP {least['pp']}, EP {least['ep']}, ETP "
            f"{least['etp']}, MBS {least['mbs']}){states}{climbed}. Try {render.listed(hints, 'or')} "
            "(--all shows the rows)")


def _sweep_table(result, shown: list[dict], spec, workload, gpus, mem, threshold, gpu, settings, show_all: bool,
                 output, priced: bool = False, release=None, notes: list[str] = ()) -> str:
    """The MoE sweep's table: the dense sweep's title, columns and caption (``sweep_table``), with
    EP and ETP, and the MoE settings in the title; a budget's days and GPU-hours (and ``priced``,
    its cost) as the dense table's, with what ``release`` evaluates besides them; ``notes`` last."""
    from advisor import render
    from advisor.cli.sweep_table import counts_caption, evaluation_caption
    from advisor.sweep_columns import sweep_columns

    title = _title(result, spec, workload, gpus, mem, threshold, gpu, settings)
    selected = len(result.order) if show_all else result.ranked
    caption = (counts_caption(result.counts, show_all, len(shown), selected)
               + evaluation_caption(result.tokens, workload, release, experts=True)
               + f"\n{_searched(result)}"
               + (f"\n{render.ranking_note(result.tolerance)}" if result.tolerance else "")
               + (f"\n{note}" if (note := _backend_caption(settings)) else "")
               + "".join(f"\n{line}" for line in notes))
    # an MoE row's full recomputation is always every layer (uniform 1: advisor.moe.flags), so 'full'
    # says it all, and the ten characters saved keep TFLOP/s on an 80-column terminal
    rows = [{**row, "split": render.counts_text(row["layers_per_stage"]),
             "recompute_text": "full" if row["recompute"] == "full" else render.recompute_text(row)} for row in shown]
    columns = sweep_columns(result.memory_model == "calibrated", gpu is not None, tokens=result.tokens is not None,
                            priced=priced, experts=True, rank_by=result.rank_by)
    return render.to_table(rows, columns, title=title, row_style=render.verdict_style, caption=caption,
                           drawing=drawing_for(output))


def _title(result, spec, workload, gpus, mem, threshold, gpu, settings) -> str:
    """The MoE sweep's title, its table's and its picture's: the dense sweep's setup line (the
    options given, and the lever the rows use where nothing fit without it) with the MoE settings."""
    from advisor.cli.sweep_table import setup_line

    return (setup_line(spec, workload, gpus, mem, threshold, settings.training, gpu, result.memory_model,
                       result.rank_by, result.escalation)
            + f"; {settings_words(settings, spec)}")  # FP8: setup_line's --fp8-format


def _backend_caption(settings) -> str | None:
    """The flex backend's pricing, as a command's read-back says it (``readback.backend_note``)."""
    from advisor.moe.readback import backend_note

    note = backend_note(settings.flex_backend) if settings.dispatcher == "flex" else None
    return f"priced: {note}" if note else None


def settings_words(settings, spec, recompute: str | None = None) -> str:
    """The MoE settings a title names: the routing assumption (with its imbalance), the
    dispatcher, the all-to-all overlap, the fused kernels, the MTP layers and the recomputation
    (``recompute``: one estimate's; a sweep's rows each say theirs, and the title what selective
    recomputes where that is not the default) (the training options are the titles' own
    ``changed_args``)."""
    routing = settings.routing
    busiest = f"x {routing.imbalance:g} on the busiest rank" if routing.imbalance != 1 else ""
    if routing.routing == "dropless":
        # memory priced at its bound, every EP rank's tokens sent to this one; time at the balanced
        # pace times the imbalance (advisor.moe.memory, advisor.moe.time): lest the GiB read as a typical peak
        shown = "routing dropless (worst-case memory" + (f", pace {busiest}" if busiest else "") + ")"
    else:
        shown = (f"routing {routing.routing}" + (" unpadded" if routing.routing == "capacity"
                                                 and not routing.pad_to_capacity else "")
                 + (f" {busiest}" if busiest else ""))
    words = [shown,
             f"dispatcher {settings.dispatcher}"
             + (f" ({settings.flex_backend})" if settings.dispatcher == "flex" and settings.flex_backend != "deepep" else "")]
    words += [word for word, on in (("a2a overlapped", settings.a2a_overlap),
                                    # a model without shared experts takes the flag and changes nothing
                                    ("shared experts overlapped", settings.shared_expert_overlap
                                     and spec.shared_expert_size),
                                    ("--moe-permute-fusion", settings.permute_fusion),
                                    ("--moe-router-fusion", settings.router_fusion)) if on]
    words += [f"MTP {spec.mtp_num_layers}"] if spec.mtp_num_layers else []
    return ", ".join(words + _recompute_words(settings, spec, recompute))


def _recompute_words(settings, spec, recompute: str | None) -> list[str]:
    """``settings_words``' recomputation: full, or what selective recomputes, with why delayed FP8
    scaling narrows the default (``MoEOptions.recompute_modules``)."""
    if recompute == "full":
        return ["recompute full"]
    narrowed = settings.delayed_fp8 and settings.modules is None
    # A sweep (recompute None) prices selective beside none and full: name its modules only where
    # they are not the default, as an estimate with --recompute selective always does.
    not_default = narrowed or settings.modules is not None
    if not (recompute == "selective" or (recompute is None and not_default)):
        return []
    why = " (delayed FP8 scaling refuses moe_act and layernorm)" if narrowed else ""
    return [f"selective recomputes {', '.join(sorted(settings.recompute_modules(spec)))}{why}"]


def _machine_text(shown: list[dict], setup: dict, spec, workload, fmt: str, release) -> str:
    """The rows as JSON or CSV, each with the setup and its Megatron flags as ``release`` reads
    them (``rows_arg_parts``, ``spelled_parts``: the rows share most of their flags, and JSON
    encodes each shared part once)."""
    from advisor import render
    from advisor.moe.flags import rows_arg_parts
    from advisor.options.flags import spelled_parts

    parts = spelled_parts(release, rows_arg_parts(spec, workload.seq_len, workload.global_batch_size, shown))
    if fmt == "json":
        return render.rows_to_json(shown, setup, "megatron_args", parts)
    return render.to_csv([{**row, **setup, "megatron_args": " ".join(flag for part in flags for flag in part),
                           "layers_per_stage": render.counts_text(row["layers_per_stage"]),
                           "recompute_modules": " ".join(row["recompute_modules"] or [])}
                          for row, flags in zip(shown, parts)])


def _defaulted_etp_hint(tp: int, cp: int, dp: int, ep: int) -> str:
    """The refusal's tail when the ETP was Megatron's default (the TP): the largest ETP dividing
    the TP whose EP x ETP divides TP x CP x DP, as --etp to give, where one exists."""
    ranks = tp * cp * dp
    etp = next((e for e in range(tp - 1, 0, -1) if tp % e == 0 and ranks % (ep * e) == 0), None)
    give = f": give --etp {etp}" if etp is not None else ""
    return f"; without --etp the ETP is the TP, {tp}, as Megatron-LM's default{give}"


def estimate(spec, workload, tp, cp, pp, ep, etp, dp, mbs, mem, threshold, gpu, settings, fmt, output, vpp=1,
             recompute="none", memory_model=None, read=None, *, layers_per_stage=None, compare_best=False,
             gpus_per_node=8, budget=(None, None), release=None):
    """One MoE layout, every stage (``read``: the --from-command reading, named in the output;
    ``layers_per_stage``: its own split; ``compare_best``: the best sweep row on its GPUs too;
    ``budget``: (--tokens, --gpu-hour-price), as ``sweep``'s; ``release``: the Megatron-LM release
    whose evaluation defaults the budget's note names)."""
    from advisor import render
    from advisor.errors import AdvisorError
    from advisor.moe.space import estimate_layout

    if compare_best:
        from advisor.cli.from_command import need_memory

        need_memory(mem)
    # what validate_args refuses with the layout, as for a dense estimate (--tp-comm-overlap at TP 1)
    if problem := settings.training.layout_problem(tp=tp, pp=pp, tie_embeddings=spec.tie_embeddings):
        raise InputError(problem)
    try:
        # without --etp, Megatron's own default: the expert TP is the TP (arguments.py, both releases)
        row = estimate_layout(spec, workload, tp=tp, cp=cp, pp=pp, ep=ep or 1, etp=etp or tp, dp=dp, mbs=mbs, vpp=vpp,
                              recompute=recompute, memory_gib=mem, threshold=threshold, gpu=gpu, options=settings,
                              memory_model=memory_model, layers_per_stage=layers_per_stage, tokens=budget[0])
    except AdvisorError as error:
        defaulted = _defaulted_etp_hint(tp, cp, dp, ep or 1) if etp is None and tp > 1 and "ETP" in str(error) else ""
        raise InputError(f"{error}{defaulted}") from None
    _priced([row], budget[1])
    row.update(megatron_version=release_defaults(release).checked,
               megatron_args=row_flags(spec, workload, row, release), model=spec.to_dict(), memory_gib=mem,
               threshold=judged_threshold(row["memory_model"], threshold), gpus_per_node=gpus_per_node)
    from advisor.cli.from_command import estimate_notes

    notes = estimate_notes(row, read, fmt, output, release)
    if read is None and (note := _backend_caption(settings)):  # a read-back names it among the unpriced
        notes.append(note)
    notes += unbalanced_notes(spec, settings, fmt, output, read)
    if compare_best:
        best, line = _best_row_line(row, spec, workload, mem, threshold, gpu, gpus_per_node, settings, memory_model)
        row["best_sweep_row"] = best
        notes.append(line)
    stages = row["stages"]
    if fmt == "json":
        emit(render.to_json(row), output)
        return
    if fmt == "csv":
        from advisor.cli.estimate_csv import estimate_csv

        emit(estimate_csv(row, stages), output)
        return
    emit(_stage_table(row, spec, workload, gpu, (tp, cp, pp, dp, mbs, vpp), mem, notes, output, settings, budget[1]),
         output)


def _best_row_line(row: dict, spec, workload, mem, threshold, gpu, gpus_per_node, settings, memory_model):
    """(the best MoE sweep row on the estimate's GPUs, model, batch and options, one line comparing
    it with ``row``): ``advisor sweep``'s own first row."""
    from advisor.cli.from_command import comparison_line
    from advisor.errors import AdvisorError
    from advisor.moe.space import sweep as run

    gpus = row["gpus"]
    try:
        result = run(spec, workload, gpus, mem, threshold=threshold, max_tp=gpus_per_node, gpu=gpu, options=settings,
                     memory_model=memory_model)
    except AdvisorError as error:
        raise InputError(str(error)) from None
    ranked = result.rows(limit=1)
    best = ranked[0] if ranked else None
    return best, comparison_line(best, row, gpus, experts=True)


def _stage_columns(stages: list[dict], calibrated: bool) -> list:
    """The stage table's columns. Narrow terminals leave out the counts first (the dense layers
    among the stage's, then 'in flight'), then the additive terms all together, so that those shown
    always add up to the total (at 80 columns 'transient' and the total went, and 1.63 + 11.81 +
    32.02 read as 59.00); the memory the verdict judges (the calibrated usage, else the total)
    goes last. The total is ``stage.StageBytes.total``: dense and expert states, FP8 copies,
    activations, transient. Each column says its unit under its header: the terms said none, and
    'dense', a count of layers beside 'dense st.' in GiB, read as either."""
    from advisor.cli.hints import IN_FLIGHT_FORMAT
    from advisor.render import Column

    def term(key: str, header: str) -> Column:
        return Column(key, header, ".2f", drop=2, group="terms", unit="GiB")

    columns = [Column("stage", "stage"), Column("layers", "layers"),
               Column("dense_layers", "dense", drop=6, unit="layers"),
               Column("in_flight_microbatches", "in flight", IN_FLIGHT_FORMAT, drop=5), term("dense_states_gib", "dense st."),
               term("expert_states_gib", "expert st.")]
    if any(stage.get("fp8_weights_gib") for stage in stages):  # the FP8 copies of the weights, in the total
        columns.append(term("fp8_weights_gib", "FP8 w."))
    columns += [term("activations_gib", "act."), term("transient_gib", "transient"),
                Column("total_gib", "total", ".2f", drop=1 if calibrated else -1, unit="GiB")]
    if calibrated:  # the usage Megatron's allocator is predicted to reach: the verdict's number, as the sweep's
        columns.append(Column("usage_gib", "used", ".2f", drop=-1, unit="GiB"))
    return columns


def _stage_table(row, spec, workload, gpu, layout, mem, notes, output, settings, gpu_hour_price=None) -> str:
    """One row per pipeline stage; the caption the peak stage, its verdict, the step time and a
    budget's days, GPU-hours and cost (the dense estimate's line); the title the layout, the
    training options that differ from the defaults and the MoE settings."""
    from advisor.cli.hints import in_flight_note
    from advisor.options.flags import changed_args

    from advisor import render

    tp, cp, pp, dp, mbs, vpp = layout
    stages = row["stages"]
    calibrated = row["memory_model"] == "calibrated"
    columns = _stage_columns(stages, calibrated)
    key = "usage_gib" if calibrated else "total_gib"
    peak = max(stages, key=lambda stage: stage[key])
    caption = f"peak: stage {peak['stage']}, {peak['total_gib']:.2f} GiB (analytic)"
    if calibrated:
        caption += render.memory_call_text(mem, row["verdict"], usage_gib=peak["usage_gib"])
    elif mem:
        caption += render.memory_call_text(mem, row["verdict"], fraction=peak["total_gib"] / mem)
    if gpu is not None:
        from advisor.cli.hints import if_it_fit

        caption += f"\n{if_it_fit(row['verdict'])}{render.step_text(row, row['time_parts'], row.get('options'))}"
        if "tokens" in row:
            caption += f"\n{if_it_fit(row['verdict'])}{render.budget_text(row, gpu_hour_price)}"
    caption += "".join(f"\n{note}" for note in notes)
    if note := in_flight_note(stages):  # as the dense table says it: an interleaved rank's counts are fractions
        caption += f"\n{note}"
    changed = changed_args(settings.training)
    # EDP: the expert-data-parallel group the experts' gradients and Adam states are sharded over
    title = (f"{spec.name}: TP {tp}, CP {cp}, PP {pp}, EP {row['ep']}, ETP {row['etp']}, DP {dp} (expert DP "
             f"{row['edp']}), MBS {mbs}"
             + (f", VPP {vpp}" if vpp > 1 else "") + f", seq {workload.seq_len}, gbs {workload.global_batch_size}"
             + (f", {gpu.name}" if gpu else "") + (f"; {changed}" if changed else "")
             + f"; {settings_words(settings, spec, row['recompute'])}")
    return render.to_table(stages, columns, caption=caption, drawing=drawing_for(output), title=title)
