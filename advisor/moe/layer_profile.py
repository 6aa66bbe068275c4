"""A measured MoE layer profile: what one real megatron-core MoE layer keeps, part by part, and
each analytic term of ``advisor.moe.memory`` (and the transient peak of ``advisor.moe.transient``)
beside the part it prices.

``python -m megatron_hooks.moe_layer MODEL --out DIR`` measures one layer
(``megatron_hooks/moe_layer.py``) and writes ``DIR/moe_layer.json`` (``FILENAME``; schema
``megatron-4d-advisor/moe-layer`` v4): the model, sequence, micro-batch, TP, EP, ETP, token
dispatcher, capacity factor (token dropping, padded to capacity), backend (``BACKENDS``), the
layer spec that built the layer and the kernels it ran (``LAYER_SPECS``, ``KERNELS``, as
``advisor.profiles`` names them in a rank file's header), and per part (``PARTS``) the parameter
and kept activation bytes; from the cuda backend, also ``cuda_memory``: the caching allocator's
readings (``CUDA_MEMORY``); from the symbolic backend, ``transient_bytes``: the forward and
backward peaks beyond what the layer keeps (``TRANSIENT``). ``advisor profile show DIR`` reads it back (no torch) and prints
``compare``'s rows; ``--format json`` carries them, and ``build_note``'s note where the layer was
not built as the analytic terms price it (``PRICED``).

Older versions are read too. Version 1: TP = ETP = 1, no token dropping, symbolic. Versions 1
and 2 do not record the layer spec or the kernels; each reads as what its writer could only have
built, else "unknown" (``_unrecorded_build``). Versions 1 to 3 have no transient peaks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

from advisor import fileio, limits
from advisor.errors import AdvisorError
from advisor.moe import memory, params, transient
from advisor.moe.spec import MoESpec, spec_from_dict
from advisor.parallel import heads_problem
from advisor.render import listed
from advisor.profiles import Kernels, LayerSpec

SCHEMA, VERSION, FILENAME = "megatron-4d-advisor/moe-layer", 4, "moe_layer.json"
VERSIONS = (1, 2, 3, 4)
"""Versions read: 1 has no tp, etp, capacity_factor (TP = ETP = 1, dropless); 1 and 2 no
layer_spec, kernels; 1 to 3 no transient_bytes."""
TRANSIENT = ("forward_peak", "backward_peak")
"""The symbolic backend's transient peaks (``megatron_hooks/moe_transient.py``): the live bytes
beyond what the layer keeps at its MoE block's forward peak and at its backward peak."""
PARTS = ("attention", "router", "dispatch", "experts", "shared_experts")
TERMS = ("attention activations", "router activations", "expert + dispatch activations", "shared expert activations",
         "layer activations", "layer weights (BF16)")
"""``compare``'s rows, in order; then ``TRANSIENT_TERM`` where the profile has transient peaks."""
TRANSIENT_TERM = "transient (forward/backward peak)"
BACKENDS = ("symbolic", "cpu", "cuda")
CUDA_MEMORY = ("allocated_before_forward_bytes", "reserved_before_forward_bytes", "peak_allocated_bytes",
               "peak_reserved_bytes", "alloc_retries")
"""The cuda backend's allocator readings: allocated and reserved before the forward pass, the
peaks over forward and backward (``torch.cuda.max_memory_allocated`` / ``_reserved`` after a
reset), and the allocations retried after freeing the cache (``num_alloc_retries``) meanwhile."""
DISPATCHERS = ("allgather", "alltoall")
"""The dispatchers measured. megatron-core's third, flex, needs DeepEP (CUDA; its build needs a
CUDA torch), which does not import here: a measurement fails with megatron-core's ImportError."""
LAYER_SPECS: tuple[str, ...] = get_args(LayerSpec)
"""megatron_hooks/model.py's build_gpt_model: "transformer_engine" (Megatron-LM's default
--transformer-impl; TE's modules stood in for on fake tensors, megatron_hooks/kernels.py) or
"local" (megatron-core's own modules, with the TE spec's RoPE and SwiGLU fusions off)."""
KERNELS: tuple[str, ...] = get_args(Kernels)
"""What the layer's norms ran: "cuda" (a GPU's kernels, or their stand-ins on fake tensors) or
"cpu" (torch's CPU paths)."""
UNKNOWN = "unknown"
"""A layer spec or kernels that a version 1 or 2 file does not record and its writer did not fix."""
PRICED = {"layer_spec": "transformer_engine", "kernels": "cuda"}
"""What ``advisor.moe.memory``'s activation terms price: the TE spec on a GPU (fused RMSNorm, flash
attention, fused RoPE and SwiGLU; docs/profiling.md, "MoE layers measured symbolically")."""
_BYTES = limits.Bound(0, 2**50, "one layer's part on one GPU is at most a few hundred GiB; 2^50 B is a PiB")
_FACTOR = limits.Bound(0, 1000, "a capacity factor above the experts' count drops nothing")


@dataclass(frozen=True, kw_only=True, slots=True)
class MoELayerProfile:
    """One MoE layer, one microbatch, one rank (CP = 1), bytes per part (``PARTS``)."""

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
    tp: int = 1
    """Tensor-parallel size (sequence parallel when above 1)."""
    etp: int = 1
    """Expert tensor-parallel size."""
    capacity_factor: float | None = None
    """--moe-expert-capacity-factor, every expert padded to its capacity; None: dropless."""
    backend: str = "symbolic"
    """How it was measured: "symbolic" (fake tensors, real size), "cpu" (real tensors over gloo) or
    "cuda" (real tensors on one GPU, one NCCL rank)."""
    cuda_memory: dict[str, int] | None = None
    """The cuda backend's allocator readings (``CUDA_MEMORY``); None from the other backends."""
    layer_spec: str = "transformer_engine"
    """The layer spec that built the layer (``LAYER_SPECS``), or ``UNKNOWN`` (an old file)."""
    kernels: str = "cuda"
    """The kernels its norms ran (``KERNELS``), or ``UNKNOWN`` (an old file)."""
    transient_bytes: dict[str, int] | None = None
    """The symbolic backend's forward and backward peaks beyond what the layer keeps
    (``TRANSIENT``), with the TE spec (its grouped GEMM stood in); None from the other backends
    and builds, and from files before version 4."""

    @property
    def routing(self) -> memory.RoutedTokens:
        """The routing assumption that prices the layer: balanced, or capacity when tokens drop."""
        if self.capacity_factor is None:
            return memory.RoutedTokens()
        return memory.RoutedTokens(routing="capacity", capacity_factor=self.capacity_factor)

    def to_dict(self) -> dict:
        doc = {"schema": SCHEMA, "version": VERSION, "model": self.model.to_dict(), "seq_len": self.seq_len,
               "mbs": self.mbs, "tp": self.tp, "ep": self.ep, "etp": self.etp, "dispatcher": self.dispatcher,
               "capacity_factor": self.capacity_factor, "backend": self.backend, "layer_spec": self.layer_spec,
               "kernels": self.kernels, "parameter_bytes": dict(self.parameter_bytes),
               "activation_bytes": dict(self.activation_bytes), "gradient_bytes": self.gradient_bytes}
        if self.cuda_memory is not None:  # only the cuda backend's: the other documents stay as they were
            doc["cuda_memory"] = dict(self.cuda_memory)
        if self.transient_bytes is not None:  # only the symbolic backend's
            doc["transient_bytes"] = dict(self.transient_bytes)
        return doc


def layer_problem(spec: MoESpec, *, tp: int, ep: int, etp: int, dispatcher: str,
                  capacity_factor: float | None) -> str | None:
    """Why one layer cannot be measured (or was not) with these settings, or None (flex is
    tried: megatron-core says why it cannot build)."""
    if dispatcher not in (*DISPATCHERS, "flex"):
        return f"dispatcher must be one of {', '.join(DISPATCHERS)} or flex, got {dispatcher!r}"
    if spec.mla is not None and tp > 1:
        return ("multi-latent attention at TP > 1: Transformer Engine duplicates its down projections "
                "(TELinear, parallel_mode 'duplicated'), which has no stand-in here")
    if spec.num_experts % ep:
        return f"EP {ep} must divide the {spec.num_experts} experts"
    if problem := heads_problem(tp, spec.num_attention_heads, spec.tp_kv_heads):
        return problem
    if spec.moe_ffn_hidden_size % etp:
        return f"ETP {etp} must divide the experts' width ({spec.moe_ffn_hidden_size})"
    if capacity_factor is not None and (dispatcher not in DISPATCHERS or not capacity_factor > 0):
        return ("a capacity factor (token dropping, padded to capacity) needs the alltoall or allgather dispatcher "
                "and a factor > 0")
    return None


def from_dict(doc: object, where: str) -> MoELayerProfile:
    """A profile from its ``to_dict()`` (or a version 1 document); AdvisorError naming ``where``
    and the field otherwise."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or doc.get("version") not in VERSIONS:
        raise AdvisorError(f"{where}: not a {SCHEMA} v{' or v'.join(map(str, VERSIONS))} document")
    try:
        model = spec_from_dict(doc.get("model"))
    except (TypeError, AdvisorError) as exc:
        raise AdvisorError(f"{where}: model: {exc}") from None
    degrees = {key: limits.check_int(doc.get(key, 1), key, limits.DEGREE, where) for key in ("tp", "ep", "etp")}
    factor = doc.get("capacity_factor")
    if factor is not None:
        factor = limits.check_float(factor, "capacity_factor", _FACTOR, where, low_open=True)
    _one_of(doc, "dispatcher", DISPATCHERS, where)
    if doc.get("backend", "symbolic") not in BACKENDS:
        raise AdvisorError(f"{where}: backend {limits.must_be('one of ' + ', '.join(BACKENDS), doc['backend'])}")
    if problem := layer_problem(model, **degrees, dispatcher=doc["dispatcher"], capacity_factor=factor):
        raise AdvisorError(f"{where}: {problem}")
    return MoELayerProfile(
        **_build(doc, model, where),
        model=model, seq_len=limits.check_int(doc.get("seq_len", limits.ABSENT), "seq_len", limits.SEQ_LEN, where),
        mbs=limits.check_int(doc.get("mbs", limits.ABSENT), "mbs", limits.MICRO_BATCH, where), **degrees,
        capacity_factor=factor,
        dispatcher=doc["dispatcher"], backend=doc.get("backend", "symbolic"),
        parameter_bytes=_parts(doc, "parameter_bytes", where),
        activation_bytes=_parts(doc, "activation_bytes", where),
        gradient_bytes=limits.check_int(doc.get("gradient_bytes", limits.ABSENT), "gradient_bytes", _BYTES, where),
        cuda_memory=None if doc.get("cuda_memory") is None else _parts(doc, "cuda_memory", where, CUDA_MEMORY),
        transient_bytes=None if doc.get("transient_bytes") is None else _parts(doc, "transient_bytes", where,
                                                                               TRANSIENT))


def _build(doc: dict, model: MoESpec, where: str) -> dict[str, str]:
    """The layer spec and kernels a file records (version 3; "unknown" is what an older file read
    and written back says), or for an older file ``_unrecorded_build``'s."""
    if doc["version"] < 3:
        return _unrecorded_build(doc.get("backend", "symbolic"), model, doc["version"])
    build = {}
    for key, allowed in (("layer_spec", LAYER_SPECS), ("kernels", KERNELS)):
        _one_of(doc, key, allowed, where, also=(UNKNOWN,))
        build[key] = doc[key]
    return build


def _one_of(doc: dict, key: str, allowed, where: str, also=()) -> None:
    """One line unless ``doc[key]`` is one of ``allowed`` (or ``also``, which goes unsaid): null is
    said null, a key left out missing."""
    value = doc.get(key, limits.ABSENT)
    if value not in (*allowed, *also):
        raise AdvisorError(f"{where}: {key} {limits.must_be('one of ' + ', '.join(allowed), value)}")


def _unrecorded_build(backend: str, model: MoESpec, version: int) -> dict[str, str]:
    """What a version 1 or 2 writer (megatron_hooks/moe_layer.py) could only have built: its cpu and
    cuda backends build the local spec on their own device's kernels, nothing else
    (``_backend_problem`` since they exist); version 1's symbolic backend always ran the CUDA
    kernels' stand-ins (``kernels`` came with version 2); multi-latent attention builds with the
    TE spec only (the local ``DotProductAttention`` takes no ``k_channels``,
    ``megatron_hooks.model.build_gpt_model``). Anything else: unknown."""
    if backend in ("cpu", "cuda"):
        return {"layer_spec": "local", "kernels": backend}
    return {"layer_spec": "transformer_engine" if model.mla is not None else UNKNOWN,
            "kernels": "cuda" if version == 1 else UNKNOWN}


def _parts(doc: dict, key: str, where: str, names: tuple[str, ...] = PARTS) -> dict[str, int]:
    values = doc.get(key)
    if not isinstance(values, dict) or sorted(values) != sorted(names):
        raise AdvisorError(f"{where}: {key} must map exactly {', '.join(names)} to integers")
    return {name: limits.check_int(values[name], f"{key}.{name}", _BYTES, where) for name in names}


def load(directory) -> MoELayerProfile:
    """``DIR/moe_layer.json`` (bounded read)."""
    path = f"{directory}/{FILENAME}"
    return from_dict(fileio.read_json(path, what="MoE layer profile"), path)


def compare(profile: MoELayerProfile) -> list[dict]:
    """Each analytic term of ``advisor.moe.memory`` (then ``advisor.moe.transient``'s peaks) for the
    profile's layout (its TP, EP, ETP, CP 1, balanced routing or, with token dropping, capacity
    routing) beside the measured part it prices: rows of term, source function, analytic and
    measured bytes, and their ratio. The expert term holds the permutation's index, which the
    dispatcher saves, so the experts and the dispatch are compared together. The router is
    priced without a balancing loss: the
    measured layer is built without one (megatron_hooks/model.py, moe_config_overrides), so the
    loss's scores (``memory.aux_loss_saved_bytes``), which a run with --moe-aux-loss-coeff keeps,
    are not in what was measured."""
    spec, s, b = profile.model, profile.seq_len, profile.mbs
    tp, ep, etp, routing = profile.tp, profile.ep, profile.etp, profile.routing
    tokens = memory.tokens_per_rank(s, b, tp, 1)
    copies = memory.expert_token_copies(spec, tokens, ep, etp, routing)
    act, par = profile.activation_bytes, profile.parameter_bytes
    rows = [
        ("attention activations", "attention_activation_bytes", memory.attention_activation_bytes(spec, s, b, tp, 1),
         act["attention"]),
        ("router activations", "router_activation_bytes",
         memory.router_activation_bytes(spec, tokens, routing, aux_loss=False), act["router"]),
        ("expert + dispatch activations", "expert_activation_bytes + dispatch_activation_bytes",
         memory.expert_activation_bytes(spec, copies, etp)
         + memory.dispatch_activation_bytes(spec, tokens, copies, ep, etp, profile.dispatcher, routing),
         act["experts"] + act["dispatch"]),
        ("shared expert activations", "shared_expert_activation_bytes",
         memory.shared_expert_activation_bytes(spec, s, b, tp, 1), act["shared_experts"]),
        ("layer activations", "moe_layer_activation_bytes",
         memory.moe_layer_activation_bytes(spec, s, b, tp, 1, ep, etp, routing, dispatcher=profile.dispatcher,
                                           aux_loss=False), sum(act.values())),
        ("layer weights (BF16)", "moe_layer_dense_parameters + local_expert_parameters",
         memory.BF16 * (params.moe_layer_dense_parameters(spec, tp) + params.local_expert_parameters(spec, ep, etp)),
         sum(par.values())),
    ]
    if profile.transient_bytes is not None:
        rows.append(_transient_row(profile, tokens, copies))
    return [{"term": term, "analytic": source, "analytic_bytes": int(analytic), "measured_bytes": int(measured),
             "ratio": measured / analytic if analytic else None} for term, source, analytic, measured in rows]


def _transient_row(profile: MoELayerProfile, tokens: float, copies: float) -> tuple:
    """The larger of the measured forward and backward peaks beside ``transient.layer_transient_peaks``'
    (the grouped GEMM's workspace, which the symbolic layer does not allocate, left out)."""
    forward, backward = transient.layer_transient_peaks(profile.model, tokens, copies, profile.ep, profile.etp,
                                                        profile.dispatcher, profile.routing)
    measured = profile.transient_bytes
    return (TRANSIENT_TERM, "layer_transient_peaks", max(float(forward), float(backward)),
            max(measured["forward_peak"], measured["backward_peak"]))


BUILD_DIFFERENCES = {
    "layer_spec": (("attention activations", "expert + dispatch activations", "shared expert activations"),
                   "the local spec's unfused core attention keeps the s x s scores (BF16; layers measured before "
                   "the emulator turned attention_softmax_in_fp32 off keep an FP32 copy too) and K and V expanded to every query head, and it runs without the TE spec's fused RoPE "
                   "and SwiGLU"),
    "kernels": (("attention activations", "router activations"),
                "torch's CPU RMSNorm (the input and pre-MLP norms) computes in FP32 and keeps FP32 copies of its "
                "input"),
}
"""Per build fact (``PRICED``), the terms it changes when the layer was built otherwise, and why:
measured symbolically on a small Mixtral-shaped layer with shared experts, the local spec changes
attention, experts and shared experts (not the router, dispatch or weights), and the CPU kernels
the attention's and the router's norms (tests/test_moe_layer_profile.py; docs/profiling.md: the
CPU backend's bytes by hand; megatron_hooks/kernels.py, the CPU RMSNorm; megatron_hooks/model.py,
``_TE_SPEC_FUSIONS``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BuildNote:
    """Why some of ``compare``'s rows set the measurement against terms for another build: the
    layer's build differs from ``PRICED`` (or was not recorded), and which terms that touches."""

    layer_spec: str
    kernels: str
    unknown: tuple[str, ...]
    """The build facts the file does not record (``UNKNOWN``)."""
    terms: tuple[str, ...]
    """``compare``'s terms the difference touches (the layer total among them)."""
    reasons: tuple[str, ...]

    @property
    def text(self) -> str:
        """One paragraph: what was measured, what is priced, the terms that differ and why."""
        priced = _build_words(PRICED["layer_spec"], PRICED["kernels"])
        parts = [term.removesuffix(" activations") for term in self.terms]
        touched = listed(parts) + " activations"
        measured = _build_words(self.layer_spec, self.kernels)
        if self.unknown:  # files before v3 do not say; whether the ratios compare like with like is unknown
            lead = (f"built with {measured} (files before schema v3 do not record the {' or '.join(self.unknown)}), "
                    f"and the analytic terms price {priced}: if the layer was built otherwise, its {touched} "
                    f"compare different code")
        else:
            lead = f"built with {measured}, but the analytic terms price {priced}: its {touched} compare different code"
        why = "; ".join(self.reasons)
        return f"{lead}. {why[0].upper()}{why[1:]}."

    def to_dict(self) -> dict:
        return {"layer_spec": self.layer_spec, "kernels": self.kernels, "priced": dict(PRICED),
                "unknown": list(self.unknown), "terms": list(self.terms), "note": self.text}


def _build_words(layer_spec: str, kernels: str) -> str:
    spec = {"transformer_engine": "the Transformer Engine spec", "local": "megatron-core's local spec",
            UNKNOWN: "an unrecorded layer spec"}[layer_spec]
    return f"{spec} on {'unrecorded' if kernels == UNKNOWN else kernels.upper()} kernels"


def build_note(profile: MoELayerProfile) -> BuildNote | None:
    """The note for a layer not built as the analytic terms price it (``PRICED``), or not known to
    be; None where it was (the ratios then compare like with like)."""
    differing = [key for key in PRICED if getattr(profile, key) != PRICED[key]]
    if not differing:
        return None
    touched = {term for key in differing for term in BUILD_DIFFERENCES[key][0]} | {"layer activations"}
    return BuildNote(layer_spec=profile.layer_spec, kernels=profile.kernels,
                     unknown=tuple(key.replace("_", " ") for key in differing if getattr(profile, key) == UNKNOWN),
                     terms=tuple(term for term in TERMS if term in touched),
                     reasons=tuple(BUILD_DIFFERENCES[key][1] for key in differing))
