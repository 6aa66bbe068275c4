"""One real megatron-core MoE layer on fake tensors, measured part by part at real size.

``measure_moe_layer(spec, seq_len=4096)`` builds the middle-stage ``GPTModel`` of one decoder
layer of a ``advisor.moe.spec.MoESpec`` (``model.build_gpt_model``: megatron-core's
``TransformerLayer`` with its ``MoELayer``: the ``TopKRouter``, the allgather token dispatcher
and ``SequentialMLP`` experts, plus ``SharedExpertMLP`` where the spec has shared experts; the
Transformer Engine spec's norm and attention stand-ins of ``kernels.py``), in a fake world of
one rank (TP = EP = 1; ``symbolic.fake_world``) under ``FakeTensorMode``, and runs one
microbatch forward and backward. What autograd saves is counted as the hooks count it
(``hooks.py``: each storage once, in the first part that saves it; parameters never), per part:

- ``attention``: the input RMSNorm and the self-attention;
- ``router``: the pre-MLP RMSNorm and the router (gate GEMM, scores, top-k);
- ``dispatch``: what ``MoELayer`` saves outside its router and experts (the dispatcher's
  permutation and unpermutation);
- ``experts``: the routed experts; ``shared_experts``: the shared experts.

The routing's sizes on fake tensors are ``moe_fake.fake_routing``'s: every byte exact but the
split among the experts, which is the balanced one. ``advisor.moe.memory`` prices the same
parts; ``compare`` lines each analytic term up with its measured part.
"""

from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass

import torch

PARTS = ("attention", "router", "dispatch", "experts", "shared_experts")


@dataclass(frozen=True, kw_only=True, slots=True)
class MoELayerMeasurement:
    """One MoE layer, one microbatch, one rank: bytes per part (``PARTS``)."""

    parameter_bytes: dict[str, int]
    """The part's parameters (BF16 after megatron's Float16Module cast)."""
    activation_bytes: dict[str, int]
    """What the part's forward pass keeps for the backward pass."""
    gradient_bytes: int
    """The layer's parameter gradients after the backward pass (plain autograd, the weights' dtype)."""


class _SavedByPart:
    """Saved-tensor accounting per part: forward pre/post hooks keep the innermost open part."""

    def __init__(self, parts: dict[str, list[torch.nn.Module]], parameters) -> None:
        from megatron_hooks.static import storage_key

        self.key = storage_key
        self.bytes = dict.fromkeys(PARTS, 0)
        self.seen = {storage_key(p) for p in parameters}
        self.open: list[str] = []
        self.handles = []
        for name, modules in parts.items():
            for module in modules:
                self.handles.append(module.register_forward_pre_hook(self._opener(name)))
                self.handles.append(module.register_forward_hook(self._close))

    def _opener(self, name: str):
        def open_part(*_) -> None:  # a hook that returns a value replaces the module's input
            self.open.append(name)
        return open_part

    def _close(self, *_) -> None:
        self.open.pop()

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        key = self.key(tensor)
        if self.open and key not in self.seen:
            self.seen.add(key)
            self.bytes[self.open[-1]] += tensor.untyped_storage().nbytes()
        return tensor

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


def measure_moe_layer(spec, *, seq_len: int, mbs: int = 1, layer_spec: str = "transformer_engine"
                      ) -> MoELayerMeasurement:
    """One BF16 MoE layer of ``spec`` (a ``MoESpec``) on one rank, one microbatch; see the module
    docstring."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from megatron_hooks.kernels import cuda_kernels
    from megatron_hooks.model import build_gpt_model, causal_mask
    from megatron_hooks.moe_fake import fake_routing
    from megatron_hooks.symbolic import fake_world

    with contextlib.ExitStack() as context:
        context.enter_context(fake_world(1, 1, 1, 0))
        context.enter_context(FakeTensorMode())
        context.enter_context(cuda_kernels())
        context.enter_context(fake_routing(spec.num_experts, spec.moe_router_topk))
        model = build_gpt_model(spec, seq_len=seq_len, layers=[spec.num_layers // 2 + 1], pre_process=False,
                                post_process=False, params_dtype=torch.bfloat16, layer_spec=layer_spec,
                                use_cpu_initialization=True)
        layer = model.decoder.layers[0]
        parts = _parts(layer)
        counter = _SavedByPart(parts, model.parameters())
        received = torch.randn(seq_len, mbs, spec.hidden_size, dtype=torch.bfloat16, requires_grad=True)
        model.set_input_tensor(received)
        mask = causal_mask(seq_len) if layer_spec == "local" else None
        positions = torch.arange(seq_len).unsqueeze(0).expand(mbs, seq_len)
        try:
            with torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda tensor: tensor):
                output = model(None, positions, mask)
            output.backward(torch.randn_like(output))
        finally:
            counter.remove()
        params = {name: sum(p.numel() * p.element_size() for m in modules for p in m.parameters())
                  for name, modules in parts.items()}
        params["dispatch"] = 0  # MoELayer's own parameters are its router's and experts'
        params.setdefault("shared_experts", 0)
        grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
        measured = MoELayerMeasurement(parameter_bytes={n: params[n] for n in PARTS},
                                       activation_bytes=dict(counter.bytes), gradient_bytes=grads)
    gc.collect()
    return measured


def compare(spec, measured: MoELayerMeasurement, *, seq_len: int, mbs: int = 1) -> list[dict]:
    """Each analytic term of ``advisor.moe`` (one rank, TP = CP = EP = ETP = 1, balanced
    routing) beside the measured part it prices: rows of term, analytic and measured bytes."""
    from advisor.moe import memory, params

    tokens = memory.tokens_per_rank(seq_len, mbs, 1, 1)
    copies = memory.expert_token_copies(spec, tokens, 1, 1, memory.RoutedTokens())
    act, par = measured.activation_bytes, measured.parameter_bytes
    rows = [
        ("attention activations", memory.attention_activation_bytes(spec, seq_len, mbs, 1, 1), act["attention"]),
        ("router activations", memory.router_activation_bytes(spec, tokens), act["router"]),
        # the analytic expert term holds the permutation's index, which the dispatcher saves
        ("expert + dispatch activations", memory.expert_activation_bytes(spec, copies, 1),
         act["experts"] + act["dispatch"]),
        ("shared expert activations", memory.shared_expert_activation_bytes(spec, seq_len, mbs, 1, 1),
         act["shared_experts"]),
        ("layer weights (BF16)", memory.BF16 * (params.moe_layer_dense_parameters(spec)
                                                + params.local_expert_parameters(spec)), sum(par.values())),
    ]
    rows.append(("layer activations", sum(r[1] for r in rows[:4]), sum(r[2] for r in rows[:4])))
    return [{"term": term, "analytic_bytes": int(analytic), "measured_bytes": int(got)} for term, analytic, got in rows]


def main(argv: list[str] | None = None) -> None:
    """``python -m megatron_hooks.moe_layer MODEL [--seq-len S] [--mbs B]``: one JSON object, the
    measurement and its comparison with the analytic terms (a preset of ``advisor models``)."""
    import argparse
    import dataclasses
    import json

    from advisor.moe.spec import PRESETS
    from megatron_hooks.emulate import quiet_megatron

    parser = argparse.ArgumentParser(prog="python -m megatron_hooks.moe_layer", description=main.__doc__)
    parser.add_argument("model", choices=sorted(PRESETS))
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--mbs", type=int, default=1)
    args = parser.parse_args(argv)
    quiet_megatron()
    spec = PRESETS[args.model]
    try:
        measured = measure_moe_layer(spec, seq_len=args.seq_len, mbs=args.mbs)
    except NotImplementedError as exc:
        parser.exit(2, f"Error: {args.model}: {exc}\n")
    print(json.dumps({"model": args.model, "seq_len": args.seq_len, "mbs": args.mbs,
                      "measured": dataclasses.asdict(measured),
                      "comparison": compare(spec, measured, seq_len=args.seq_len, mbs=args.mbs)}, indent=1))


if __name__ == "__main__":
    main()
