"""A symbolic MoE layer profile: what one real megatron-core MoE layer keeps, part by part, and
each analytic term of ``advisor.moe.memory`` beside the part it prices.

``python -m megatron_hooks.moe_layer MODEL --out DIR`` measures one layer on fake tensors
(``megatron_hooks/moe_layer.py``) and writes ``DIR/moe_layer.json`` (``FILENAME``; schema
``megatron-4d-advisor/moe-layer`` v1): the model, sequence, micro-batch, EP and token
dispatcher, and per part (``PARTS``) the parameter and kept activation bytes. ``advisor profile
show DIR`` reads it back (no torch) and prints ``compare``'s rows; ``--format json`` carries them.
"""

from __future__ import annotations

from dataclasses import dataclass

from advisor import fileio, limits
from advisor.errors import AdvisorError
from advisor.moe import memory, params
from advisor.moe.spec import MoESpec, spec_from_dict

SCHEMA, VERSION, FILENAME = "megatron-4d-advisor/moe-layer", 1, "moe_layer.json"
PARTS = ("attention", "router", "dispatch", "experts", "shared_experts")
DISPATCHERS = ("allgather", "alltoall")
_BYTES = limits.Bound(0, 2**50, "one layer's part on one GPU is at most a few hundred GiB; 2^50 B is a PiB")


@dataclass(frozen=True, kw_only=True, slots=True)
class MoELayerProfile:
    """One MoE layer, one microbatch, one rank (TP = CP = ETP = 1), bytes per part (``PARTS``)."""

    model: MoESpec
    seq_len: int
    mbs: int
    ep: int
    """Expert-parallel size: this rank holds E / ep experts."""
    dispatcher: str
    """megatron-core's token dispatcher (--moe-token-dispatcher-type)."""
    parameter_bytes: dict[str, int]
    """The part's parameters (BF16 after megatron's Float16Module cast)."""
    activation_bytes: dict[str, int]
    """What the part's forward pass keeps for the backward pass."""
    gradient_bytes: int
    """The layer's parameter gradients after the backward pass (plain autograd, BF16)."""

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "version": VERSION, "model": self.model.to_dict(), "seq_len": self.seq_len,
                "mbs": self.mbs, "ep": self.ep, "dispatcher": self.dispatcher,
                "parameter_bytes": dict(self.parameter_bytes), "activation_bytes": dict(self.activation_bytes),
                "gradient_bytes": self.gradient_bytes}


def from_dict(doc: object, where: str) -> MoELayerProfile:
    """A profile from its ``to_dict()``; AdvisorError naming ``where`` and the field otherwise."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or doc.get("version") != VERSION:
        raise AdvisorError(f"{where}: not a {SCHEMA} v{VERSION} document")
    try:
        model = spec_from_dict(doc.get("model"))
    except (TypeError, AdvisorError) as exc:
        raise AdvisorError(f"{where}: model: {exc}") from None
    if doc.get("dispatcher") not in DISPATCHERS:
        raise AdvisorError(f"{where}: dispatcher must be one of {', '.join(DISPATCHERS)}, got {doc.get('dispatcher')!r}")
    ep = limits.check_int(doc.get("ep"), "ep", limits.DEGREE, where)
    if model.num_experts % ep:
        raise AdvisorError(f"{where}: ep {ep} does not divide the model's {model.num_experts} experts")
    return MoELayerProfile(
        model=model, seq_len=limits.check_int(doc.get("seq_len"), "seq_len", limits.SEQ_LEN, where),
        mbs=limits.check_int(doc.get("mbs"), "mbs", limits.MICRO_BATCH, where), ep=ep,
        dispatcher=doc["dispatcher"], parameter_bytes=_parts(doc, "parameter_bytes", where),
        activation_bytes=_parts(doc, "activation_bytes", where),
        gradient_bytes=limits.check_int(doc.get("gradient_bytes"), "gradient_bytes", _BYTES, where))


def _parts(doc: dict, key: str, where: str) -> dict[str, int]:
    values = doc.get(key)
    if not isinstance(values, dict) or sorted(values) != sorted(PARTS):
        raise AdvisorError(f"{where}: {key} must map exactly {', '.join(PARTS)} to bytes")
    return {part: limits.check_int(values[part], f"{key}.{part}", _BYTES, where) for part in PARTS}


def load(directory) -> MoELayerProfile:
    """``DIR/moe_layer.json`` (bounded read)."""
    path = f"{directory}/{FILENAME}"
    return from_dict(fileio.read_json(path, what="MoE layer profile"), path)


def compare(profile: MoELayerProfile) -> list[dict]:
    """Each analytic term of ``advisor.moe.memory`` for the profile's layout (TP = CP = ETP = 1,
    its EP, balanced routing) beside the measured part it prices: rows of term, source function,
    analytic and measured bytes, and their ratio. The expert term holds the permutation's index,
    which the dispatcher saves, so the experts and the dispatch are compared together."""
    spec, s, b, ep = profile.model, profile.seq_len, profile.mbs, profile.ep
    tokens = memory.tokens_per_rank(s, b, 1, 1)
    copies = memory.expert_token_copies(spec, tokens, ep, 1, memory.RoutedTokens())
    act, par = profile.activation_bytes, profile.parameter_bytes
    rows = [
        ("attention activations", "attention_activation_bytes", memory.attention_activation_bytes(spec, s, b, 1, 1),
         act["attention"]),
        ("router activations", "router_activation_bytes", memory.router_activation_bytes(spec, tokens), act["router"]),
        ("expert + dispatch activations", "expert_activation_bytes", memory.expert_activation_bytes(spec, copies, 1),
         act["experts"] + act["dispatch"]),
        ("shared expert activations", "shared_expert_activation_bytes",
         memory.shared_expert_activation_bytes(spec, s, b, 1, 1), act["shared_experts"]),
        ("layer activations", "moe_layer_activation_bytes", memory.moe_layer_activation_bytes(spec, s, b, 1, 1, ep, 1),
         sum(act.values())),
        ("layer weights (BF16)", "moe_layer_dense_parameters + local_expert_parameters",
         memory.BF16 * (params.moe_layer_dense_parameters(spec) + params.local_expert_parameters(spec, ep)),
         sum(par.values())),
    ]
    return [{"term": term, "analytic": source, "analytic_bytes": int(analytic), "measured_bytes": int(measured),
             "ratio": measured / analytic if analytic else None} for term, source, analytic, measured in rows]
