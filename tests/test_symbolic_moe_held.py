"""What every MoE layer's dispatcher holds between its forwards, measured on stacks of real
megatron-core MoE layers under fake tensors (Qwen3-30B-A3B's routing, N 4096 tokens, E 128, top-8;
its widths shrunk, which the held tensors do not depend on): one layer against three, after the
forward and after the backward, the live storages that autograd does not save, each attributed to
the dispatcher attribute that holds it. ``advisor.moe.transient.routing_held_by_other_layers_bytes``
prices (L - 1) such sets beside one layer's transient peak."""

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install -e '.[megatron]')")

from conftest import run_json_script  # noqa: E402

SCRIPT = """
import contextlib, dataclasses, gc, json
import torch
from megatron_hooks.stage_emulation import quiet_megatron; quiet_megatron()
from megatron_hooks import moe_layer
from megatron_hooks.model import build_gpt_model
from megatron_hooks.moe_transient import LiveStorages, grouped_experts
from advisor.moe.spec import PRESETS

spec = dataclasses.replace(PRESETS["qwen3-30b-a3b"], hidden_size=64, moe_ffn_hidden_size=32, ffn_hidden_size=96,
                           num_attention_heads=4, num_query_groups=2, vocab_size=256)

def unsaved(live, saved, layers, skip):
    # bytes live and not saved by autograd (parameters, their gradients, input and output left
    # out), and per layer what its dispatcher's attributes hold of them; ``saved`` holds the
    # serials of the storages autograd saved (LiveStorages.pack), not their ids, which a storage
    # freed in the forward hands on to a later one
    gc.collect()
    alive = {key: ref().nbytes() for key, ref in list(live.live.items())
             if ref() is not None and key not in skip and live.serial.get(key) not in saved}
    held = []
    for layer in layers:
        attributes = {name: value for name, value in vars(layer.mlp.token_dispatcher).items()
                      if isinstance(value, torch.Tensor) and id(value.untyped_storage()) in alive}
        held.append({name: int(value.untyped_storage().nbytes()) for name, value in attributes.items()})
    return {"total": sum(alive.values()), "held": held}

def run(layers, ep=1, dispatcher="alltoall", capacity_factor=None, recompute=False, seq_len=4096):
    with contextlib.ExitStack() as context:
        moe_layer._world(context, "symbolic", tp=1, ep=ep, etp=1)
        moe_layer._kernels_and_routing(context, "symbolic", "cuda", spec, capacity_factor)
        if recompute:  # the checkpoint saves and restores the CUDA RNG state: none here (this process only)
            from megatron.core.tensor_parallel import random
            random._get_cuda_rng_state = lambda *args, **kwargs: torch.get_rng_state()
            random._set_cuda_rng_state = lambda *args, **kwargs: None
        extra = dict(recompute_granularity="selective", recompute_modules=["moe"]) if recompute else {}
        # perform_initialization=False: fake tensors hold no values, so initialising the 1,856
        # experts' weights of the 12 models (a quarter of this script's CPU) changes no byte held
        model = build_gpt_model(spec, seq_len=seq_len, layers=list(range(1, layers + 1)), pre_process=False,
                                post_process=False, params_dtype=torch.bfloat16, layer_spec="transformer_engine",
                                use_cpu_initialization=True, perform_initialization=False,
                                expert_model_parallel_size=ep, expert_tensor_parallel_size=1, moe_token_dispatcher_type=dispatcher,
                                moe_expert_capacity_factor=capacity_factor,
                                moe_pad_expert_input_to_capacity=capacity_factor is not None, **extra)
        context.enter_context(grouped_experts())
        live = context.enter_context(LiveStorages())
        blocks = model.decoder.layers
        params = {id(p.untyped_storage()) for p in model.parameters()}
        def pack(tensor):
            live.pack(tensor)
            return tensor
        received = torch.randn(seq_len, 1, spec.hidden_size, dtype=torch.bfloat16, requires_grad=True)
        model.set_input_tensor(received)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            output = model(None, torch.arange(seq_len).unsqueeze(0), None)
        forward = unsaved(live, live.saved, blocks, params | {id(received.untyped_storage()),
                                                         id(output.untyped_storage())})
        output.backward(torch.randn_like(output))
        del output
        grads = [p.grad for p in model.parameters() if p.grad is not None] + [received, received.grad]
        backward = unsaved(live, set(), blocks, params | {id(t.untyped_storage()) for t in grads})
        return {"forward": forward, "backward": backward}

out = {}
for name, layout in (("alltoall", dict(ep=2)), ("capacity", dict(ep=8, capacity_factor=1.25)),
                     ("allgather", dict(ep=2, dispatcher="allgather")),
                     ("allgather_capacity", dict(dispatcher="allgather", capacity_factor=1.25)),
                     ("recomputed", dict(ep=2, recompute=True)),
                     ("allgather_recomputed", dict(dispatcher="allgather", recompute=True))):
    out[name] = {layers: run(layers, **layout) for layers in (1, 3)}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def measured():
    return run_json_script(SCRIPT)


N, E, K = 4096, 128, 8
"""Qwen3-30B-A3B's routing at sequence 4096, MBS 1: N tokens a rank, E experts, top-k."""


def _held(dispatcher, ep, routing="balanced", capacity_factor=None, recomputed=False):
    from advisor.moe import memory as mm
    from advisor.moe import transient as tr
    from advisor.moe.spec import PRESETS

    qwen = PRESETS["qwen3-30b-a3b"]
    assumption = mm.RoutedTokens(routing=routing, capacity_factor=capacity_factor)
    copies = mm.expert_token_copies(qwen, N, ep, 1, assumption)
    return float(tr.dispatcher_held_bytes(qwen, N, copies, ep, 1, dispatcher, assumption, recomputed))


@pytest.mark.parametrize("name, forward, backward, by_hand", [
    # alltoall: self.probs N E 4 and self.routing_map N E; after the backward also the permutation's
    # sorted indices, N k int64, saved by autograd until then
    ("alltoall", {"probs": N * E * 4, "routing_map": N * E},
     {"probs": N * E * 4, "routing_map": N * E, "reversed_local_input_permutation_mapping": N * K * 8},
     _held("alltoall", 2)),
    # capacity 1.25 padded: the map is the capacity mask, saved by the router's product (kept);
    # 128 experts x ceil(1.25 N k / E) = 40960 indices; besides, a 1 KiB per-expert count tensor,
    # megatron-core's on the host without --moe-permute-fusion (``permute_idx_device``), unpriced
    ("capacity", {"probs": N * E * 4, "num_global_tokens_per_local_expert": E * 8},
     {"probs": N * E * 4, "routing_map": N * E, "num_global_tokens_per_local_expert": E * 8,
      "reversed_local_input_permutation_mapping": 40960 * 8},
     _held("alltoall", 8, "capacity", 1.25) + E * 8),
    # allgather at EP 2: the local map, T = 2N gathered rows x E / 2 bool; after the backward the
    # experts' FP32 probabilities and the permutation's indices, one per copy (N k)
    ("allgather", {"local_map": 2 * N * E // 2},
     {"local_map": 2 * N * E // 2, "local_probs": N * K * 4, "reversed_local_input_permutation_mapping": N * K * 8},
     _held("allgather", 2)),
    # allgather at EP 1, capacity 1.25 padded: the local map is the router's capacity mask (all E
    # columns, ``.contiguous()`` returns it), saved by the router's product: none held after the
    # forward (N E = 0.5 MiB was priced before 2026-11-29); after the backward the mask, and the
    # experts' FP32 probabilities and the permutation's indices, one per padded copy (40960)
    ("allgather_capacity", {},
     {"local_map": N * E, "local_probs": 40960 * 4, "reversed_local_input_permutation_mapping": 40960 * 8},
     _held("allgather", 1, "capacity", 1.25)),
])
def test_each_layer_holds_its_own_routing_beyond_what_autograd_keeps(measured, name, forward, backward, by_hand):
    """After the forward every layer's dispatcher holds the same unsaved tensors, so three layers
    hold three times one layer's (the rest, constant: 32 KiB of positions); the priced per-layer
    term (``dispatcher_held_bytes``) is what the forward leaves. After the backward autograd's
    saved ones are held too, in place of that layer's freed activations."""
    one, three = measured[name]["1"], measured[name]["3"]
    for layers in (one, three):
        assert all(held == forward for held in layers["forward"]["held"])
        assert all(held == backward for held in layers["backward"]["held"])
    assert three["forward"]["total"] - one["forward"]["total"] == 2 * sum(forward.values()) == 2 * by_hand
    assert three["backward"]["total"] - one["backward"]["total"] == 2 * sum(backward.values())


@pytest.mark.parametrize("name, dispatcher, ep", [("recomputed", "alltoall", 2),
                                                  ("allgather_recomputed", "allgather", 1)])
def test_a_recomputed_layer_holds_what_autograd_would_have_saved(measured, name, dispatcher, ep):
    """--recompute-modules moe: the MoE forward runs without autograd, so after it every layer's
    dispatcher holds, unsaved, what it holds after a backward otherwise: alltoall N E 5 + N k 8 =
    2.75 MiB; allgather at EP 1 the router's map N E + N k (4 + 8) = 0.875 MiB."""
    one, three = measured[name]["1"], measured[name]["3"]
    by_hand = N * E * 5 + N * K * 8 if dispatcher == "alltoall" else N * E + N * K * 12
    assert by_hand == _held(dispatcher, ep, recomputed=True)
    assert [sum(held.values()) for held in three["forward"]["held"]] == [by_hand] * 3
    assert three["forward"]["total"] - one["forward"]["total"] == 2 * by_hand
