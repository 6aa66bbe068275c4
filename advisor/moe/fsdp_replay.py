"""Megatron-FSDP's optim_grads reduce-scatter queue on an MoE stage, replayed bucket by bucket as
the dense model's (``memory_levers.fsdp_optim_grads_peak``, ``StageWeights``): an MoE layer's
weights on one GPU in megatron-core's ``named_parameters`` order, in two parameter groups, and
the order in which backward produces their gradients.

The groups: core_v0.19.0's ``_get_parameter_groups`` keys a parameter by dtype, ``".experts." in
name`` and requires_grad (megatron_fsdp/param_and_grad_buffer.py:1782-1797), and cuts each group
into buckets on its own at --ddp-bucket-size (:1823-1866); all share one reduce-scatter queue
(``reduce_gradients`` / ``wait_for_previous_grad_reduce``, :3872-3946). So group 0 holds the
dense part (norms, attention, the router ``mlp.router.weight``, the shared experts
``mlp.shared_experts.*``: no ``.experts.`` in their names) and the embedding, final norm and
output layer; group 1 the routed experts (``mlp.experts.*``), EP/ETP-local.

The named order (core_v0.19.0): ``TransformerLayer.__init__`` builds input_layernorm,
self_attention, pre_mlp_layernorm, mlp (transformer_layer.py:352-441); ``MoELayer`` the router,
then the experts, then the shared experts (moe/moe_layer.py:259, :326, :338); ``TEGroupedMLP``
linear_fc1's weight0..weightN-1, then linear_fc2's (one ``GroupedLinear`` each, moe/experts.py),
``SequentialMLP`` local_experts.i.linear_fc1 and .linear_fc2 expert by expert (without
--moe-grouped-gemm). Multi-latent attention: linear_proj (multi_latent_attention.py:221), then
linear_q_down_proj, linear_q_up_proj (or linear_q_proj without a q LoRA), linear_kv_down_proj,
linear_kv_up_proj (:509-616). Grouped-query attention as the dense model's
(``memory_levers.layer_weights``). The router's expert bias is a buffer (router.py), no weight.

The backward order: the one-device autograd engine runs the ready node of the highest sequence
number first (the later built in forward). ``MoELayer.forward`` computes the shared experts
first, then the router, the dispatch, the routed experts and the combine (moe_layer.py:651-680),
so backward produces the routed experts' FC2 then FC1 (the last expert first for SequentialMLP),
then the router, then the shared experts' FC2 and FC1, then the pre-MLP norm. MLA's forward runs
q_down, kv_down, q_up, kv_up (multi_latent_attention.py:644, :662, :856, :866), so after
linear_proj backward produces kv_up, q_up, kv_down, q_down; without a q LoRA q_proj runs after
kv_down (:860), so kv_up, q_proj, kv_down; and the input norm last. tests/test_moe_layer_order.py
reads both orders, the named one and the backward one, off megatron-core's local-spec layers on
the CPU.

Where the exact order is uncertain, the sizes that move are small: with Transformer Engine the
input norm of grouped-query attention is fused into QKV (named after the projection, as
``memory_levers.layer_weights`` says), MLA's latent norms are fused into the up projections (counted
in them here) and a dense layer's pre-MLP norm into FC1; a ``GroupedLinear``'s weights all take
their gradients in one node, taken here in index order; --moe-shared-expert-overlap runs the shared
experts on another stream (not modelled: the order above).

A last stage holding MTP layers (``_mtp_ends``): ``GPTModel`` builds the embedding (on the last
stage too when it holds MTP layers: ``if self.pre_process or self.mtp_process``), the decoder,
the MTP block, the output layer, in that order (core_v0.19.0 models/gpt/gpt_model.py:167-274);
with MTP the decoder's final norm sits on the stage of its last layer (transformer_block.py:
387-412), named before the MTP layers; each MTP layer names enorm, hnorm, eh_proj (2h x h / t),
its transformer layer (``mtp_model_layer``, ``transformer_layer`` in 0.16.1: the MoE layer, its
routed experts in group 1 by their names) and its final norm (multi_token_prediction.py:983-1053).
At PP > 1 the stage's embedding copy is ``shared_embedding`` (language_module.py:271-284), a
bucket of its own (param_and_grad_buffer.py:1769-1780). Backward: the output layer (the main
loss and each MTP loss use it, gpt_model.py:667-718 and process_mtp_loss, one accumulation),
each MTP layer from the last (its final norm, its layer, eh_proj, then hnorm and enorm:
``_concat_embeddings`` runs enorm before hnorm, :1124-1131), the embedding copy (last used by the
first MTP layer's ``_get_embeddings``, :1104), then the decoder's final norm, whose output the
MTP layers' hnorm read, then the layers; at PP 1 the one embedding comes last, as without MTP.
tests/test_moe_layer_order.py reads both orders off megatron-core 0.16.1's ``GPTModel`` with MTP
on the CPU (PP 1 and a last stage of PP > 1, one and two MTP layers).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from advisor import equations as eq
from advisor import memory_levers as levers
from advisor.moe.spec import MoESpec

DENSE, ROUTED = 0, 1
"""The two parameter groups of an MoE model's weights (the module docstring)."""


def _attention(spec: MoESpec, tp) -> tuple[list, list]:
    """([(name, elements)] of one layer's attention after its input norm, in named order, on one
    GPU; the names in the order backward produces them). Their sum is
    ``advisor.moe.params.attention_parameters``."""
    t, h, a = float(tp), spec.hidden_size, spec.num_attention_heads
    mla = spec.mla
    if mla is None:  # as memory_levers.layer_weights: the projection, then QKV with its bias and QK norms
        k, d = spec.num_query_groups, spec.head_dim
        bias = (a + 2 * k) * d if spec.add_qkv_bias else 0
        return [("proj", h * a * d / t), ("qkv", (h * (a + 2 * k) * d + bias) / t + eq.qk_norm_parameters(spec))], \
            ["proj", "qkv"]
    q_head = mla.qk_head_dim + mla.qk_pos_emb_head_dim
    kv_norm = mla.kv_lora_rank if spec.qk_layernorm else 0  # fused into linear_kv_up_proj with TE
    named = [("proj", a * mla.v_head_dim * h / t)]
    if mla.q_lora_rank is None:
        named.append(("q", h * a * q_head / t))
        order = ["proj", "kv_up", "q", "kv_down"]  # q_proj runs after kv_down (the module docstring)
    else:
        q_norm = mla.q_lora_rank if spec.qk_layernorm else 0  # fused into linear_q_up_proj with TE
        named += [("q_down", float(h * mla.q_lora_rank)), ("q_up", mla.q_lora_rank * a * q_head / t + q_norm)]
        order = ["proj", "kv_up", "q_up", "kv_down", "q_down"]
    named += [("kv_down", float(h * (mla.kv_lora_rank + mla.qk_pos_emb_head_dim))),
              ("kv_up", mla.kv_lora_rank * a * (mla.qk_head_dim + mla.v_head_dim) / t + kv_norm)]
    return named, order


def _indexed(named: list, order: list) -> tuple[tuple, tuple]:
    """(``StageWeights``' weights of ``named`` [(name, elements, group)], the arrival as indices)."""
    index = {name: i for i, (name, _, _) in enumerate(named)}
    return tuple((float(size), group, False, False) for _, size, group in named), tuple(index[n] for n in order)


@functools.lru_cache(maxsize=256)
def moe_layer_weights(spec: MoESpec, tp, ep, etp, grouped: bool = True) -> tuple[tuple, tuple]:
    """(an MoE layer's weights on one GPU as ``StageWeights.layer`` takes them, their arrival):
    input norm h, the attention (``_attention``), pre-MLP norm h, router E h (group 0), the E / ep
    local experts' FC1 2 h h_moe / etp and FC2 h_moe h / etp (group 1: TEGroupedMLP's every FC1
    then every FC2, ``grouped``; else SequentialMLP's expert by expert), the shared experts' FC1
    2 h h_s / t and FC2 h_s h / t (group 0). The group-0 weights sum to
    ``params.moe_layer_dense_parameters``, the group-1 ones to ``params.local_expert_parameters``."""
    h, t = spec.hidden_size, float(tp)
    attention, attention_order = _attention(spec, tp)
    local = spec.num_experts // int(ep)
    fc1, fc2 = 2.0 * h * spec.moe_ffn_hidden_size / etp, float(h * spec.moe_ffn_hidden_size) / etp
    if grouped:
        experts = [(f"fc1.{i}", fc1, ROUTED) for i in range(local)] + [(f"fc2.{i}", fc2, ROUTED) for i in range(local)]
        routed = [f"fc2.{i}" for i in range(local)] + [f"fc1.{i}" for i in range(local)]
    else:
        experts = [(f"{kind}.{i}", size, ROUTED) for i in range(local) for kind, size in (("fc1", fc1), ("fc2", fc2))]
        routed = [f"{kind}.{i}" for i in range(local - 1, -1, -1) for kind in ("fc2", "fc1")]
    shared = []
    if spec.shared_expert_size:
        hs = spec.shared_expert_size
        shared = [("shared_fc1", 2.0 * h * hs / t, DENSE), ("shared_fc2", h * hs / t, DENSE)]
    named = ([("input_norm", h, DENSE)] + [(n, s, DENSE) for n, s in attention]
             + [("mlp_norm", h, DENSE), ("router", spec.num_experts * h, DENSE)] + experts + shared)
    order = routed + ["router"] + (["shared_fc2", "shared_fc1"] if shared else []) + ["mlp_norm"] \
        + attention_order + ["input_norm"]
    return _indexed(named, order)


@functools.lru_cache(maxsize=256)
def dense_layer_weights(spec: MoESpec, tp) -> tuple[tuple, tuple]:
    """(one of the first dense layers' weights, their arrival), all group 0: input norm, the
    attention, pre-MLP norm h (fused into FC1 with TE), FC1 2 h h_ffn / t, FC2 h_ffn h / t;
    backward FC2, FC1, the norm, the attention, the input norm (``memory_levers.layer_weights``'
    for grouped-query attention). Their sum is ``params.dense_layer_parameters``."""
    h, t = spec.hidden_size, float(tp)
    attention, attention_order = _attention(spec, tp)
    named = ([("input_norm", h, DENSE)] + [(n, s, DENSE) for n, s in attention]
             + [("mlp_norm", h, DENSE), ("fc1", 2.0 * h * spec.ffn_hidden_size / t, DENSE),
                ("fc2", h * spec.ffn_hidden_size / t, DENSE)])
    return _indexed(named, ["fc2", "fc1", "mlp_norm"] + attention_order + ["input_norm"])


def mtp_layer_weights(spec: MoESpec, tp, ep, etp, grouped: bool = True) -> tuple[tuple, tuple]:
    """(one MTP layer's weights on one GPU, their arrival) as ``moe_layer_weights``: enorm h, hnorm
    h, eh_proj 2 h h / t (group 0), its MoE layer (``moe_layer_weights``), its final norm h;
    backward produces the final norm, the MoE layer in its own order, eh_proj, hnorm, enorm (the
    module docstring). Their sum is ``advisor.moe.mtp.own_parameters`` + the MoE layer's."""
    h = float(spec.hidden_size)
    layer, arrival = moe_layer_weights(spec, tp, ep, etp, grouped)
    weights = ((h, DENSE, False, False), (h, DENSE, False, False), (2.0 * h * h / tp, DENSE, False, False)) \
        + layer + ((h, DENSE, False, False),)
    return weights, (len(weights) - 1,) + tuple(3 + i for i in arrival) + (2, 1, 0)


def _mtp_ends(spec: MoESpec, tp, ep, etp, grouped: bool, mtp: int, ends: tuple, dense: int,
              matrix: float, position: int) -> tuple[tuple, tuple, tuple]:
    """(``pre``, ``post``, ``post_arrival``) of a last stage holding ``mtp`` MTP layers, from its
    ``ends`` (``memory_levers.end_weights``) and the ``dense`` weights of its dense layers, which
    follow ``pre``: the MTP layers between the final norm and the output
    layer in ``post``; at PP > 1 the stage's copy of the embedding first in ``pre``, a bucket of
    its own (``shared_embedding``), touched first where tied (the output layer then uses it and
    has no weight of its own here, as ``advisor.moe.stage.model_states`` counts it). Backward:
    the output layer, the MTP layers from the last, the embedding copy, the final norm."""
    pre, post = ends
    if not position & levers.FIRST:
        pre = ((matrix, DENSE, True, bool(spec.tie_embeddings)),) + pre
        post = post[:1] if spec.tie_embeddings else post
    weights, arrival = mtp_layer_weights(spec, tp, ep, etp, grouped)
    base, width = len(pre) + dense + 1, len(weights)
    order = tuple(base + k * width + i for k in range(mtp - 1, -1, -1) for i in arrival)
    output = (base + mtp * width,) if len(post) > 1 else ()
    copy = () if position & levers.FIRST else (0,)
    return pre, post[:1] + weights * mtp + post[1:], output + order + copy + (base - 1,)


@functools.lru_cache(maxsize=4096)
def moe_stage(spec: MoESpec, tp, ep, etp, dense: int, matrix: float, position: int,
              grouped: bool = True, mtp: int = 0) -> levers.StageWeights:
    """A stage's ``StageWeights``: its ``dense`` dense layers (the model's first, before its MoE
    layers) after the embedding in ``pre``, each produced in its own order, the last first; the
    MoE layer as ``layer``; the final norm and output layer in ``post`` (``memory_levers.end_sizes``
    of the v h / t ``matrix`` at ``position``: ``memory_levers.end_weights``); on the last stage
    its ``mtp`` MTP layers (``_mtp_ends``)."""
    layer, arrival = moe_layer_weights(spec, tp, ep, etp, grouped)
    dense_weights, dense_arrival = dense_layer_weights(spec, tp)
    pre, post = ends = levers.end_weights(matrix, float(spec.hidden_size), position, spec.tie_embeddings, DENSE)
    post_arrival = ()
    if mtp and position & levers.LAST:
        pre, post, post_arrival = _mtp_ends(spec, tp, ep, etp, grouped, mtp, ends, dense * len(dense_weights),
                                            matrix, position)
    base, width = len(pre), len(dense_weights)
    pre_arrival = tuple(base + layer_index * width + p for layer_index in range(dense - 1, -1, -1)
                        for p in dense_arrival) + tuple(range(base))
    return levers.StageWeights(pre + dense_weights * dense, layer, post, arrival, pre_arrival if dense else (),
                               post_arrival)


class ReplayedStages(NamedTuple):
    """What ``queued_elements`` needs of the stages beside the options (arrays over layouts)."""

    spec: MoESpec
    tp: object
    pp: object
    ep: object
    etp: object
    stage: object
    vocab: object
    moe_layers: object
    mtp: object
    grouped: bool = True

    def ends(self) -> levers.StageEnds:
        """Each stage's embedding, final norm and output layer (``memory_levers.stage_ends``)."""
        return levers.stage_ends(self.spec, self.tp, self.pp, self.stage, self.vocab)


def queued_elements(options, stages: ReplayedStages, dense, dp_cp, queue):
    """The unsharded gradient elements Megatron-FSDP holds at most under optim_grads on each
    layout's stage (``memory_levers.fsdp_optim_grads_peak``'s replay of ``moe_stage``, its MTP
    layers included). ``queue``: the queue's capacity
    (``memory_levers.fsdp_communication_unit``); one replay per distinct stage and
    count of MoE layers (``memory_levers.stage_peak``: the full stage's replay alone). A middle
    stage has no ends (its vocabulary moves nothing) and a stage of no MoE layers no expert (its
    EP and ETP move nothing): those are set alike, so that the stages alike replay once."""
    spec = stages.spec
    bucket = levers.fsdp_bucket_size(options, dp_cp)
    ends = stages.ends()
    position, matrix = ends.position, np.where(ends.position > 0, ends.matrix, 0.0)
    moe_layers = np.asarray(stages.moe_layers)
    ep, etp = (np.where(moe_layers > 0, x, 1) for x in (stages.ep, stages.etp))
    columns = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (
        stages.tp, ep, etp, matrix, position, dense, bucket, queue, moe_layers, stages.mtp)))
    rows, inverse = levers._unique_rows(np.stack([c.ravel() for c in columns], axis=1))
    values = np.array([_stage_peak(spec, int(tp), int(ep), int(etp), int(dense_layers), matrix_, int(position_),
                                   stages.grouped, int(moe), bucket_, queue_, int(mtp))
                       for tp, ep, etp, matrix_, position_, dense_layers, bucket_, queue_, moe, mtp in rows])
    return values[inverse].reshape(columns[0].shape)


@functools.lru_cache(maxsize=4096)
def _stage_peak(spec: MoESpec, tp: int, ep: int, etp: int, dense: int, matrix: float, position: int, grouped: bool,
                moe: int, bucket: float, queue: float, mtp: int = 0) -> float:
    """``memory_levers.stage_peak`` of ``moe_stage``, kept by these numbers: a sweep asks for the
    same stages again and again (about 14,600 times for some 1,500 at DeepSeek-V3 on 2,048 GPUs),
    and a key of numbers hashes in a microsecond where a stage of a few hundred weights takes tens."""
    return levers.stage_peak(moe_stage(spec, tp, ep, etp, dense, matrix, position, grouped, mtp), moe, bucket, queue)
