"""One real megatron-core MoE layer on fake tensors, measured part by part at real size.

``measure_moe_layer(spec, seq_len=4096)`` builds the middle-stage ``GPTModel`` of one decoder
layer of a ``advisor.moe.spec.MoESpec`` (``model.build_gpt_model``: megatron-core's
``TransformerLayer`` with its ``MoELayer``: the ``TopKRouter``, the allgather or alltoall token
dispatcher and ``SequentialMLP`` experts, plus ``SharedExpertMLP`` where the spec has shared
experts, and ``MLASelfAttention`` where it has multi-latent attention; the Transformer Engine
spec's norm, attention and RoPE stand-ins of ``kernels.py``), as rank 0 of a fake world of EP
ranks (TP = 1, E / EP experts on this rank; ``symbolic.fake_world``) under ``FakeTensorMode``, and runs one
microbatch forward and backward. What autograd saves is counted as the hooks count it
(``hooks.py``: each storage once, in the first part that saves it; parameters never), per part:

- ``attention``: the input RMSNorm and the self-attention;
- ``router``: the pre-MLP RMSNorm and the router (gate GEMM, scores, top-k);
- ``dispatch``: what ``MoELayer`` saves outside its router and experts (the dispatcher's
  permutation and unpermutation);
- ``experts``: the routed experts; ``shared_experts``: the shared experts.

The routing's sizes on fake tensors are ``moe_fake.fake_routing``'s: every byte exact but the
split among the experts, which is the balanced one. ``advisor.moe.memory`` prices the same
parts; ``advisor.moe.layer_profile.compare`` lines each analytic term up with its measured part.
The cpu and cuda backends run the same layer on real tensors, one rank, the local spec, the real
router (``measure_moe_layer``; benchmarks/gpu/measure_moe_layers.py runs the cuda one).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import math
from pathlib import Path

import torch

from advisor import limits
from advisor.errors import AdvisorError
from advisor.moe.layer_profile import (
    BACKENDS, DISPATCHERS, KERNELS, PARTS, MoELayerProfile, build_note, compare, layer_problem,
)


class _SavedByPart:
    """Saved-tensor accounting per part: forward pre/post hooks keep the innermost open part.

    Each saved storage counts once, in the first part that saves it, if it is still kept after
    the forward pass (``static.SavedStorages``: a tensor saved by an autograd node that dies
    during the forward pass is not kept, and its address can come back for a new storage). A
    norm's output counts in the part of ``norms`` that owns the norm, whoever saves it first:
    the pre-MLP norm's output is the router's input (the analytic router term) and the shared
    experts' FC1 input, which megatron-core's ``MoELayer`` runs first."""

    def __init__(self, parts: dict[str, list[torch.nn.Module]], norms: dict[str, torch.nn.Module],
                 parameters) -> None:
        from megatron_hooks.static import SavedStorages, storage_key

        self.key = storage_key
        self.parameters = {storage_key(p) for p in parameters}
        self.saved = SavedStorages()
        self.claimed: dict[int, str] = {}
        self.open: list[str] = []
        self.handles = []
        for name, modules in parts.items():
            for module in modules:
                self.handles.append(module.register_forward_pre_hook(self._opener(name)))
                self.handles.append(module.register_forward_hook(self._close))
        for name, norm in norms.items():
            self.handles.append(norm.register_forward_hook(self._claimer(name)))

    def _claimer(self, name: str):
        def claim(_module, _args, output: torch.Tensor) -> None:
            self.claimed[self.key(output)] = name
        return claim

    def _opener(self, name: str):
        def open_part(*_) -> None:  # a hook that returns a value replaces the module's input
            self.open.append(name)
        return open_part

    def _close(self, *_) -> None:
        self.open.pop()

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        key = self.key(tensor)
        if self.open and key not in self.parameters:
            self.saved.add(tensor, key, self.claimed.get(key, self.open[-1]), tensor.untyped_storage().nbytes())
        return tensor

    def kept(self) -> dict[str, int]:
        """Bytes per part of the saved storages still alive."""
        return {**dict.fromkeys(PARTS, 0), **self.saved.kept()}

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _parts(layer) -> dict[str, list[torch.nn.Module]]:
    mlp = layer.mlp
    parts = {"attention": [layer.input_layernorm, layer.self_attention],
             "router": [layer.pre_mlp_layernorm, mlp.router], "dispatch": [mlp], "experts": [mlp.experts]}
    if mlp.shared_experts is not None:
        parts["shared_experts"] = [mlp.shared_experts]
    return parts


def measure_moe_layer(spec, *, seq_len: int, mbs: int = 1, layer_spec: str = "transformer_engine",
                      ep: int = 1, dispatcher: str = "allgather", tp: int = 1, etp: int = 1,
                      capacity_factor: float | None = None, backend: str = "symbolic",
                      kernels: str = "cuda") -> MoELayerProfile:
    """One BF16 MoE layer of ``spec`` (a ``MoESpec``) on rank 0 of a fake world whose data-parallel
    ranks fold into ``ep`` expert-parallel ranks of ``etp`` expert tensor-parallel ranks, with TP
    ``tp`` (sequence parallel when above 1, as Megatron requires for MoE), one microbatch, with
    the token ``dispatcher`` ("allgather" or "alltoall"); ``capacity_factor``: token dropping,
    every expert padded to its capacity (--moe-expert-capacity-factor with
    --moe-pad-expert-input-to-capacity); see the module docstring. ``backend``
    "cpu": real tensors, this process one gloo rank (TP = EP = ETP = 1), the real routing;
    "cuda": likewise on the GPU (one NCCL rank, parameters and inputs on the GPU, torch's CUDA
    kernels, the real router; the profile's ``cuda_memory`` holds the allocator's readings).
    ``kernels`` "cpu": torch's own CPU paths instead of the CUDA kernels' stand-ins (the CPU
    backend's); the real backends take the local spec and their own device's kernels."""
    problem = (layer_problem(spec, tp=tp, ep=ep, etp=etp, dispatcher=dispatcher, capacity_factor=capacity_factor)
               or _backend_problem(backend, tp=tp, ep=ep, etp=etp, kernels=kernels, layer_spec=layer_spec)
               or _capacity_problem(spec, seq_len * mbs // tp, backend, dispatcher, capacity_factor))
    if problem:
        raise ValueError(problem)
    from megatron_hooks.model import causal_mask
    from megatron_hooks.stage_emulation import freeze_what_is_imported

    freeze_what_is_imported()  # before this layer's first storage
    device = "cuda" if backend == "cuda" else "cpu"
    with contextlib.ExitStack() as context:
        _world(context, backend, tp=tp, ep=ep, etp=etp)
        _kernels_and_routing(context, backend, kernels, spec, capacity_factor)
        model = _layer_model(spec, seq_len=seq_len, layer_spec=layer_spec, tp=tp, ep=ep, etp=etp,
                             dispatcher=dispatcher, capacity_factor=capacity_factor, device=device,
                             symbolic=backend == "symbolic")
        layer = model.decoder.layers[0]
        parts = _parts(layer)
        counter = _SavedByPart(parts, {"attention": layer.input_layernorm, "router": layer.pre_mlp_layernorm},
                               model.parameters())
        # this rank's sequence-parallel share of the tokens
        received = torch.randn(seq_len // tp, mbs, spec.hidden_size, dtype=torch.bfloat16, device=device,
                               requires_grad=True)
        model.set_input_tensor(received)
        mask = causal_mask(seq_len, device) if layer_spec == "local" else None
        positions = torch.arange(seq_len, device=device).unsqueeze(0).expand(mbs, seq_len)
        readings = _AllocatorReadings(received.device) if backend == "cuda" else None
        # the transient peaks of the build the analytic terms price (the TE spec's grouped GEMM)
        live = _transient_record(context, layer) if (backend, layer_spec) == ("symbolic", "transformer_engine") \
            else None
        try:
            with torch.autograd.graph.saved_tensors_hooks(_packer(counter, live), lambda tensor: tensor):
                output = model(None, positions, mask)
            kept = counter.kept()
            gradient = torch.randn_like(output)
            transient = _run_backward(output, gradient, live, model)
        finally:
            counter.remove()
        cuda_memory = None if readings is None else readings.after()
        params = {name: sum(p.numel() * p.element_size() for m in modules for p in m.parameters())
                  for name, modules in parts.items()}
        params["dispatch"] = 0  # MoELayer's own parameters are its router's and experts'
        params.setdefault("shared_experts", 0)
        grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
        measured = MoELayerProfile(model=spec, seq_len=seq_len, mbs=mbs, ep=ep, dispatcher=dispatcher, tp=tp,
                                   etp=etp, capacity_factor=capacity_factor, backend=backend,
                                   parameter_bytes={n: params[n] for n in PARTS}, activation_bytes=kept,
                                   gradient_bytes=grads, cuda_memory=cuda_memory, layer_spec=layer_spec,
                                   kernels=kernels, transient_bytes=transient)
    gc.collect()
    return measured


def _transient_record(context: contextlib.ExitStack, layer):
    """A ``moe_transient.LiveStorages`` over the rest of the measurement (entered last: the
    innermost mode, over the fake tensors), marking the MoE block's forward, the experts run as
    the TE spec's grouped GEMM runs them (``moe_transient.grouped_experts``)."""
    from megatron_hooks.moe_transient import LiveStorages, grouped_experts

    context.enter_context(grouped_experts())
    live = context.enter_context(LiveStorages())
    handles = (layer.mlp.register_forward_pre_hook(lambda *_: live.mark("moe_start")),
               layer.mlp.register_forward_hook(lambda *_: live.mark("moe_end")))
    context.callback(lambda: [handle.remove() for handle in handles])
    return live


def _packer(counter: _SavedByPart, live):
    """The saved-tensor pack hook: the parts' count, and the transient record's (if any)."""
    if live is None:
        return counter.pack

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        live.pack(tensor)
        return counter.pack(tensor)
    return pack


def _run_backward(output: torch.Tensor, gradient: torch.Tensor, live, model) -> dict[str, int] | None:
    """The backward pass; with a transient record, the layer's forward and backward peaks beyond
    what it keeps (``moe_transient.TransientPeaks``)."""
    if live is None:
        output.backward(gradient)
        return None
    from megatron_hooks.moe_transient import TransientPeaks

    peaks = TransientPeaks(live, kept=set(live.saved), after_forward=live.alive())
    live.mark("backward_start")
    output.backward(gradient)
    gradients = live.serials(p.grad for p in model.parameters() if p.grad is not None)
    return {"forward_peak": peaks.forward_peak(), "backward_peak": peaks.backward_peak(gradients)}


def _backend_problem(backend: str, *, tp: int, ep: int, etp: int, kernels: str, layer_spec: str) -> str | None:
    """Why ``backend`` cannot measure these settings, or None. The real-tensor backends run one
    rank (no peers to exchange tokens or shards with) and the local spec (the TE spec's
    stand-ins compute nothing), on their own device's kernels."""
    if backend not in BACKENDS:
        return f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}"
    if kernels not in KERNELS:  # recorded in the profile, which reads back only these
        return f"kernels must be one of {', '.join(KERNELS)}, got {kernels!r}"
    if backend == "symbolic":
        return None
    device, group = backend.upper(), "gloo" if backend == "cpu" else "NCCL"
    if (tp, ep, etp, kernels, layer_spec) != (1, 1, 1, backend, "local"):
        return (f"the {device} backend runs one {group} rank (TP = EP = ETP = 1), the local layer spec, "
                f"torch's {device} kernels")
    if backend == "cuda" and not torch.cuda.is_available():
        return "the CUDA backend needs a GPU, and torch sees none (torch.cuda.is_available() is False)"
    return None


def _capacity_problem(spec, tokens: int, backend: str, dispatcher: str, capacity_factor: float | None) -> str | None:
    """Why the fake routing cannot stand in for the allgather dispatcher's capacity routing on
    ``tokens`` tokens, or None: its ``masked_select`` takes k f copies per token, each expert's
    capacity ceil(N k f / E) exactly only where N k f / E is whole (``moe_fake.selected_copies``)."""
    if backend != "symbolic" or dispatcher != "allgather" or capacity_factor is None:
        return None
    capacity = tokens * spec.moe_router_topk * capacity_factor / spec.num_experts
    if float(capacity).is_integer():
        return None
    return (f"the allgather dispatcher with capacity factor {capacity_factor}: each expert's capacity N k f / E = "
            f"{capacity:g} is not whole, which the symbolic routing does not stand in for (its ceil)")


def _kernels_and_routing(context: contextlib.ExitStack, backend: str, kernels: str, spec,
                         capacity_factor: float | None = None) -> None:
    """Symbolic: the CUDA kernels' stand-ins (with ``kernels`` "cuda") and the fake routing
    (``moe_fake``, padded to ``capacity_factor`` where given); cpu: the fake routing too, which
    passes real tensors through; cuda: no
    stand-in and no routing patch (the alltoall dispatcher's side stream and device-to-host
    copies are real there), only what the layer needs without Transformer Engine."""
    from megatron_hooks.moe_fake import fake_routing, moe_without_te

    if backend == "cuda":
        context.enter_context(moe_without_te())
        return
    if kernels == "cuda":
        from megatron_hooks.kernels import cuda_kernels

        context.enter_context(cuda_kernels())
    context.enter_context(fake_routing(spec.num_experts, spec.moe_router_topk, capacity_factor))


def _layer_model(spec, *, seq_len: int, layer_spec: str, tp: int, ep: int, etp: int, dispatcher: str,
                 capacity_factor: float | None, device: str, symbolic: bool):
    """The middle-stage GPTModel of one decoder layer, BF16. On CUDA megatron initialises its
    weights on the GPU (faster than on the CPU, Mixtral's 2.8 GB of experts); ``build_gpt_model``
    moves what it makes on the CPU whatever the flag (torch's RMSNorm). Under fake tensors
    (``symbolic``: the symbolic backend) nothing is initialised: fake tensors hold no values,
    and the weights' storage is made either way (``perform_initialization``)."""
    from megatron_hooks.model import build_gpt_model

    model = build_gpt_model(spec, seq_len=seq_len, layers=[spec.num_layers // 2 + 1], pre_process=False,
                            post_process=False, params_dtype=torch.bfloat16, layer_spec=layer_spec,
                            use_cpu_initialization=device != "cuda", expert_model_parallel_size=ep,
                            expert_tensor_parallel_size=etp, sequence_parallel=tp > 1,
                            moe_token_dispatcher_type=dispatcher, moe_expert_capacity_factor=capacity_factor,
                            moe_pad_expert_input_to_capacity=capacity_factor is not None,
                            perform_initialization=not symbolic)
    return model


class _AllocatorReadings:
    """``CUDA_MEMORY`` over one forward and backward pass, through ``backends.CudaBackend`` (the
    hooks' reader of the same counters): made before the forward pass, it notes the allocated and
    reserved bytes and the retries so far and resets the peaks; ``after()`` adds the peaks since
    and the retries meanwhile."""

    def __init__(self, device) -> None:
        from megatron_hooks.backends import CudaBackend

        self.cuda = CudaBackend(device)
        self.cuda.synchronize()
        self.before = {"allocated_before_forward_bytes": self.cuda.allocated(),
                       "reserved_before_forward_bytes": torch.cuda.memory_reserved(),  # the backend reads peaks
                       "alloc_retries": self.cuda.alloc_retries()}
        self.cuda.reset_peak()

    def after(self) -> dict[str, int]:
        self.cuda.synchronize()
        return {**self.before, "peak_allocated_bytes": self.cuda.peak(),
                "peak_reserved_bytes": self.cuda.peak_reserved(),
                "alloc_retries": self.cuda.alloc_retries() - self.before["alloc_retries"]}


def _world(context: contextlib.ExitStack, backend: str, *, tp: int, ep: int, etp: int) -> None:
    """Symbolic: rank 0 of a fake world of TP x DP ranks (the fewest DP ranks whose world holds EP
    x ETP) under FakeTensorMode; cpu: this process as the one rank of a gloo group; cuda: of an
    NCCL group (``process_group`` picks NCCL where CUDA is), on a GPU freed of earlier runs'
    cached blocks, so that its reserved bytes are this layer's."""
    if backend in ("cpu", "cuda"):
        from megatron_hooks.stage_emulation import free_port, process_group

        if backend == "cuda":
            gc.collect()  # megatron's modules hold cycles: an earlier layer's tensors go with them
            torch.cuda.empty_cache()
        context.enter_context(process_group(0, 1, free_port(), 1))
        return
    from torch._subclasses.fake_tensor import FakeTensorMode

    from megatron_hooks.symbolic import fake_world

    context.enter_context(fake_world(tp, 1, ep * etp // math.gcd(tp, ep * etp), 0, ep=ep, etp=etp))
    context.enter_context(FakeTensorMode())


SIZES = ("hidden_size", "ffn_hidden_size", "moe_ffn_hidden_size", "num_attention_heads", "num_query_groups",
         "vocab_size")
"""The preset's sizes ``main`` can shrink (a real-tensor layer at Mixtral's size is gigabytes)."""


_BOUND = {"moe_ffn_hidden_size": "ffn_hidden_size"}
"""The bound of a size without one of its own in ``advisor.limits.MODEL``."""


def _bounded(bound, kind=int):
    """An argparse type: a number within ``bound`` (advisor.limits), else argparse's one line
    (--ep 0 was a ZeroDivisionError, --seq-len 0 a reshape error, deep in megatron-core)."""
    def convert(text: str):
        try:
            number = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        try:
            if kind is int:
                return limits.check_int(number, "", bound)
            return limits.check_float(number, "", bound, low_open=True)
        except AdvisorError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return convert


def _directory(text: str) -> Path:
    """An argparse type: --out DIR, not empty (Path("") is ".": the file landed in the current directory)."""
    if text == "":
        raise argparse.ArgumentTypeError("empty; give a directory")
    from advisor.fileio import not_a_directory

    if problem := not_a_directory(text):
        raise argparse.ArgumentTypeError(problem)
    return Path(text)


def main(argv: list[str] | None = None) -> None:
    """``python -m megatron_hooks.moe_layer MODEL [--seq-len S] [--mbs B] [--tp T] [--ep E] [--etp T]
    [--dispatcher D] [--capacity-factor F] [--backend symbolic|cpu|cuda] [--hidden-size H ...] [--out DIR]``:
    one MoE layer of a preset of ``advisor models`` (the size options shrink it, for the CPU
    backend), measured; prints one JSON object (the profile and its comparison with the analytic
    terms, with ``build_note`` where the layer was not built as those terms price it), and with --out
    writes DIR/moe_layer.json for ``advisor profile show DIR``."""
    import json

    from advisor.fileio import atomic_write_text
    from advisor.moe.layer_profile import FILENAME
    from advisor.moe.spec import PRESETS
    from megatron_hooks.stage_emulation import quiet_megatron

    parser = argparse.ArgumentParser(prog="python -m megatron_hooks.moe_layer", description=main.__doc__)
    parser.error = lambda message: parser.exit(2, f"Error: {message}\n")  # one line, not the usage first
    parser.add_argument("model", choices=sorted(PRESETS))
    parser.add_argument("--seq-len", type=_bounded(limits.SEQ_LEN), default=4096)
    parser.add_argument("--mbs", type=_bounded(limits.MICRO_BATCH), default=1)
    parser.add_argument("--tp", type=_bounded(limits.DEGREE), default=1,
                        help="tensor-parallel size (sequence parallel above 1)")
    parser.add_argument("--ep", type=_bounded(limits.DEGREE), default=1,
                        help="expert-parallel size (--expert-model-parallel-size)")
    parser.add_argument("--etp", type=_bounded(limits.DEGREE), default=1, help="--expert-tensor-parallel-size")
    parser.add_argument("--dispatcher", choices=(*DISPATCHERS, "flex"), default="allgather",
                        help="--moe-token-dispatcher-type (flex needs DeepEP, CUDA only: refused in one line)")
    parser.add_argument("--capacity-factor", type=_bounded(limits.MOE_CAPACITY_FACTOR, float), default=None,
                        help="--moe-expert-capacity-factor, padded to capacity")
    parser.add_argument("--backend", choices=BACKENDS, default="symbolic",
                        help="symbolic: fake tensors, real size, the TE spec's kernels stood in for; cpu: real "
                             "tensors over gloo (TP = EP = ETP = 1), the local spec on torch's CPU kernels; cuda: "
                             "the same on the GPU (one NCCL rank), torch's CUDA kernels")
    for field in SIZES:
        parser.add_argument(f"--{field.replace('_', '-')}", type=_bounded(limits.MODEL[_BOUND.get(field, field)]),
                            default=None, help="shrink the preset")
    parser.add_argument("--out", type=_directory, help="write DIR/moe_layer.json (advisor profile show DIR)")
    args = parser.parse_args(argv)
    quiet_megatron()
    try:  # the sizes must still make a model (heads a multiple of the query groups ...): ModelSpec's checks
        spec = dataclasses.replace(PRESETS[args.model], **{f: getattr(args, f) for f in SIZES if getattr(args, f)})
    except AdvisorError as exc:
        parser.exit(2, f"Error: {exc}\n")
    # the real-tensor backends run the local spec on their own device's kernels
    real = {} if args.backend == "symbolic" else dict(layer_spec="local", kernels=args.backend)
    try:
        profile = measure_moe_layer(spec, seq_len=args.seq_len, mbs=args.mbs, ep=args.ep, dispatcher=args.dispatcher,
                                    tp=args.tp, etp=args.etp, capacity_factor=args.capacity_factor,
                                    backend=args.backend, **real)
    except (NotImplementedError, ValueError, ImportError) as exc:
        parser.exit(2, f"Error: {args.model}: {' '.join(str(exc).split())}\n")
    if args.out is not None:
        try:
            args.out.mkdir(parents=True, exist_ok=True)
            atomic_write_text(args.out / FILENAME, json.dumps(profile.to_dict(), indent=1) + "\n")
        except (OSError, AdvisorError) as exc:
            parser.exit(2, f"Error: --out {args.out}: {getattr(exc, 'strerror', None) or exc}\n")
    note = build_note(profile)  # the real-tensor backends' local spec is not what the analytic terms price
    print(json.dumps({**profile.to_dict(), "comparison": compare(profile), "build_note": note and note.to_dict()},
                     indent=1))


if __name__ == "__main__":
    main()
