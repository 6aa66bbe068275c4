"""The load-balancing side of the MoE options: --moe-aux-loss-coeff, the weight a model's router
is trained with (``with_aux_loss_coeff``), and the line that says where the routing priced
assumes a balance the model's router is not trained to (``unbalanced_line``).

Megatron's default weight is 0, and a config.json may say 0 (Qwen3-Coder-480B-A35B's
router_aux_loss_coef): megatron-core's router then applies no balancing loss at all
(core_v0.15.2 ``megatron/core/transformer/moe/router.py``, ``_apply_aux_loss``: ``if
aux_loss_coeff == 0: return probs``), while balanced routing, the default assumption, prices
every expert's balanced share.
"""

from __future__ import annotations

from advisor.cli.options import InputError, command_name, note, table_on_stdout

QWEN = " (Qwen3's 0.001)"
"""The weight the remedy suggests: Qwen3's router_aux_loss_coef (qwen3-30b-a3b's config.json)."""


def with_aux_loss_coeff(spec, weights: tuple[float, ...]):
    """``spec`` with --moe-aux-loss-coeff's ``weights`` in place of its own: one for a router of
    one balancing type, and one per type where it has several, in their order (Megatron's
    nargs='+': megatron-core's ``transformer_config.py`` __post_init__ refuses other counts, and
    a single weight would leave the reader to guess which type it weighs). Refused where no type
    of the spec's takes a weight: megatron-core's ``router.py`` reads one only for aux_loss,
    seq_aux_loss and global_aux_loss (``get_aux_loss_coeff``), and asserts 0 with sinkhorn; an
    expert-bias router without a balance loss (a DeepSeek config.json's aux_loss_alpha 0) balances
    with type none, so the weight would be launched and ignored. DeepSeek-V3's own router takes
    one: its seq_aux_loss beside the bias (``advisor.moe.spec._deepseek_balancing``)."""
    from dataclasses import replace

    from advisor.moe.memory import AUX_LOSS_TYPES, balancing_types

    types = balancing_types(spec)
    named = ", ".join(types)
    if not any(kind in AUX_LOSS_TYPES for kind in types):
        how = "its expert bias (load-balancing type none)" if spec.expert_bias and spec.load_balancing is None \
            else f"load-balancing type {named}"
        raise InputError(f"--moe-aux-loss-coeff: {spec.name} balances with {how}, which takes no weight (megatron-core "
                         f"weighs only {', '.join(AUX_LOSS_TYPES)}: router.py)")
    if len(weights) != len(types):
        given = f"{len(weights)} weight{'s' * (len(weights) != 1)}"
        raise InputError(f"--moe-aux-loss-coeff gives {given} for {spec.name}'s {len(types)} load-balancing "
                         f"type{'s' * (len(types) != 1)} ({named}): megatron-core takes one weight per type, in order")
    return replace(spec, aux_loss_coeff=tuple(weights) if len(types) > 1 else weights[0])


def unbalanced_line(spec, routing, forced: bool = False, command: bool = False, launched: bool = False) -> str | None:
    """One line where the routing priced (``routing``: ``advisor.moe.memory.RoutedTokens``) assumes
    a balanced router that the model does not train (``memory.router_balanced``: an aux-loss
    weight of 0, Megatron's default, or a command's load-balancing type none, and no expert bias),
    with its remedies; None otherwise.
    Balanced routing, and capacity routing not padded (its busiest expert's min(imbalance,
    factor)), price each expert's share x --moe-imbalance; dropless is the worst case and capacity
    padded runs every expert's full capacity, either way whatever the router does. ``forced``: a
    command's --moe-router-force-load-balancing, which balances the routing itself; ``command``:
    the model was read from a command (--from-command), whose weight is given in the command;
    ``launched``: said by advisor-launch of a saved row, whose model flags are decided (a weight
    after -- is refused as a conflict: ``launch.arguments.DECIDED_FLAGS``), so the remedy is a row
    priced otherwise.
    A weight alone does nothing for type none: megatron-core's router reads one only for
    ``AUX_LOSS_TYPES`` (``router.py``, ``get_aux_loss_coeff`` returns 0.0 for any other type), so
    there the line names the type and asks for an aux-loss type with its weight."""
    from advisor.moe.memory import AUX_LOSS_TYPES, balancing_types, router_balanced

    if forced or routing.routing == "dropless" or routing.routing == "capacity" and routing.pad_to_capacity \
            or router_balanced(spec):
        return None
    types = balancing_types(spec)
    aux = any(kind in AUX_LOSS_TYPES for kind in types)
    # type none without the expert bias: only a command sets it (the presets and config.json do not)
    why = "aux-loss coefficient 0, no expert bias" if aux else f"load-balancing type {', '.join(types)}, no expert bias"
    return (f"routing {routing.routing} is an assumption: the model balances nothing ({why}), so Megatron's "
            f"router trains unbalanced; {_remedy(aux, command, launched, AUX_LOSS_TYPES[0])}")


def _remedy(aux: bool, command: bool, launched: bool, aux_type: str) -> str:
    """What ``unbalanced_line`` tells the user to do: train a balancing loss (a weight, and with
    type none an aux-loss type too), or price the worst case."""
    worst = "--moe-routing dropless (the worst case)"
    added = "--moe-aux-loss-coeff" if aux else f"--moe-router-load-balancing-type {aux_type} and --moe-aux-loss-coeff"
    if launched:
        if command:
            return f"launch an estimate of the command with {added} added{QWEN * aux}, or one priced with {worst}"
        return f"launch a row priced with --moe-aux-loss-coeff{QWEN}, or one priced with {worst}" if aux \
            else f"launch a row priced with {worst}"
    if aux:
        return ("add --moe-aux-loss-coeff to the command" if command else "give --moe-aux-loss-coeff") + \
            f"{QWEN} or price {worst}"
    return f"add {added} to the command or price {worst}" if command else f"price {worst}"


def unbalanced_notes(spec, settings, fmt: str, output, read=None) -> list[str]:
    """``unbalanced_line`` for the table's caption, and on stderr where the table is not on stdout
    (JSON and CSV carry no notes: ``from_command.estimate_notes``); ``read``: the --from-command
    reading (``from_command.CommandInputs``), None for the advisor's own options."""
    line = unbalanced_line(spec, settings.routing, forced=read is not None and read.moe.force_balancing,
                           command=read is not None)
    if line is None:
        return []
    if not table_on_stdout(fmt, output):
        note(f"{command_name()}: {line}")
    return [line] if fmt == "table" else []
