"""The orders ``advisor.moe.fsdp_replay`` and ``memory_levers`` give Megatron-FSDP's optim_grads
replay, read off real megatron-core layers on the CPU: a two-layer block (a dense first layer, then
an MoE layer with a router with expert bias, four routed experts and shared experts) of
megatron-core's local spec, one forward and backward pass, for grouped-query attention with QK
norms (Qwen3-like), multi-latent attention with a q LoRA (DeepSeek-V3-like) and without one.

What is read: the ``named_parameters()`` order and sizes, which decide the buckets' cut, and the
order in which backward produces each gradient (``register_post_accumulate_grad_hook``; on one CPU
device the autograd engine runs the ready node of the highest sequence number first, so the order
is deterministic: the weights' forward use, last first). Checked against ``moe_layer_weights(spec,
1, 1, 1, grouped=False)``, ``dense_layer_weights`` and ``memory_levers.layer_weights`` /
``LAYER_WEIGHT_ARRIVAL``. The routed experts are ``SequentialMLP``'s (``moe_grouped_gemm=False``),
which the local spec builds exactly; ``TEGroupedMLP``'s order (every FC1, then every FC2; one node
makes all of a ``GroupedLinear``'s gradients) needs Transformer Engine and is not checked here.

Where the local spec is not Transformer Engine's, the advisor follows TE's naming and the test maps
the local modules onto it (``ENTRY``):

- MLA's latent norms ``q_layernorm`` / ``kv_layernorm`` are modules of their own in the local spec,
  named after ``linear_kv_up_proj`` and produced between the up and the down projections; TE fuses
  them into ``linear_q_up_proj`` / ``linear_kv_up_proj`` (``layer_norm_weight``), so the advisor
  counts each in its up projection: q_lora_rank and kv_lora_rank elements.
- GQA's per-head ``q_layernorm`` / ``k_layernorm`` (2 d elements) are separate modules in both
  specs, named after ``linear_qkv``, produced just before it; the advisor folds them into QKV.
- The input norm: its own module here and with MLA; TE fuses GQA's into ``linear_qkv``
  (named after ``linear_proj``), the dense MLP's pre-MLP norm into ``linear_fc1``. The advisor
  keeps the local order for both (``memory_levers.layer_weights``' docstring).
- core attention: megatron-core 0.16.1's local ``DotProductAttention`` takes no ``k_channels``, which
  MLA passes; ``SdpaAttention`` here is torch's scaled-dot-product attention in its place. It holds
  no weights and is one step between the projections, so it moves no gradient in the order.
"""

import dataclasses
import re

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install -e '.[megatron]')")
pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install -e '.[megatron]')")

from megatron.core.transformer.module import MegatronModule  # noqa: E402

from advisor import memory_levers as levers  # noqa: E402
from advisor.moe import fsdp_replay  # noqa: E402
from advisor.moe.spec import PRESETS  # noqa: E402

SEQ, MBS = 16, 2
SMALL = dict(hidden_size=64, ffn_hidden_size=96, moe_ffn_hidden_size=32, shared_expert_size=48, num_experts=4,
             moe_router_topk=2, expert_bias=True, vocab_size=256)
# Qwen3's shape with shared experts and the expert bias added (the bias needs the sigmoid score,
# megatron-core refuses it with softmax); head_dim stays Qwen3's 128.
GQA = dataclasses.replace(PRESETS["qwen3-30b-a3b"], num_attention_heads=4, num_query_groups=2,
                          score_function="sigmoid", **SMALL)
MLA = dataclasses.replace(PRESETS["deepseek-v3"], num_attention_heads=4, num_query_groups=4, router_num_groups=2,
                          router_group_topk=1, mla=dataclasses.replace(
                              PRESETS["deepseek-v3"].mla, q_lora_rank=24, kv_lora_rank=16, qk_head_dim=8,
                              qk_pos_emb_head_dim=4, v_head_dim=8), **SMALL)
MLA_NO_Q_LORA = dataclasses.replace(MLA, mla=dataclasses.replace(MLA.mla, q_lora_rank=None))

ENTRY = [  # a local-spec parameter (its name after "layers.N.") -> the advisor's weight that counts it
    (r"input_layernorm", "input_norm"), (r"self_attention\.linear_proj", "proj"),
    (r"self_attention\.(linear_qkv|k_layernorm)", "qkv"),
    (r"self_attention\.linear_q_down_proj", "q_down"), (r"self_attention\.linear_q_proj", "q"),
    (r"self_attention\.linear_q_up_proj", "q_up"), (r"self_attention\.linear_kv_down_proj", "kv_down"),
    (r"self_attention\.(linear_kv_up_proj|kv_layernorm)", "kv_up"),  # the latent norm: fused with TE
    (r"pre_mlp_layernorm", "mlp_norm"), (r"mlp\.router", "router"),
    (r"mlp\.experts\.local_experts\.(\d+)\.linear_(fc\d)", r"\2.\1"),
    (r"mlp\.shared_experts\.linear_(fc\d)", r"shared_\1"),
    (r"mlp\.linear_(fc\d)", r"\1"),
]
FOLDED = ("q_layernorm", "k_layernorm", "kv_layernorm")
"""The norms counted in another module's entry, produced apart from it (the module docstring)."""


class SdpaAttention(MegatronModule):
    """Causal core attention on torch's ``scaled_dot_product_attention``, with the constructor and
    forward of megatron-core's ``DotProductAttention`` (and MLA's ``k_channels`` / ``v_channels``)."""

    def __init__(self, config, layer_number, attn_mask_type, attention_type, attention_dropout=None,
                 softmax_scale=None, k_channels=None, v_channels=None, cp_comm_type=None, pg_collection=None):
        super().__init__(config=config)

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))  # [s, b, heads, d] -> [b, heads, s, d]
        k, v = (x.repeat_interleave(q.size(1) // x.size(1), dim=1) for x in (k, v))  # GQA's groups
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.permute(2, 0, 1, 3).reshape(out.size(2), out.size(0), -1)


def _entry(name: str, latent: bool) -> tuple[int, str]:
    """(layer index, the advisor's weight) of a local-spec parameter name; ``latent``: MLA, whose
    q_layernorm is the q latent's (in q_up with TE), not a per-head norm (in QKV)."""
    layer, rest = re.fullmatch(r"layers\.(\d+)\.(.*)\.weight", name).groups()
    for pattern, entry in [(r"self_attention\.q_layernorm", "q_up" if latent else "qkv"), *ENTRY]:
        if re.fullmatch(pattern, rest):
            return int(layer), re.sub(pattern, entry, rest)
    raise AssertionError(f"no advisor weight for {name}")


def _layer_specs(spec) -> list:
    """megatron-core's local specs of a dense layer and an MoE layer of ``spec`` (``SdpaAttention``
    as core attention)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    specs = [get_gpt_layer_local_spec(num_experts=experts, moe_grouped_gemm=False, normalization="RMSNorm",
                                      multi_latent_attention=spec.mla is not None, qk_layernorm=spec.qk_layernorm)
             for experts in (None, spec.num_experts)]
    for layer in specs:
        layer.submodules.self_attention.submodules.core_attention = SdpaAttention
    return specs


def _built(build):
    """``build()`` with megatron-core 0.16.1's MLA reading HAVE_TE from its TE extension's import,
    which succeeds without Transformer Engine (megatron_hooks.kernels.cuda_kernels does the same)."""
    import megatron.core.extensions.transformer_engine as extensions
    import megatron.core.transformer.multi_latent_attention as mla

    torch.manual_seed(0)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(mla, "HAVE_TE", extensions.HAVE_TE)
        return build()


def _recorded(module, run) -> tuple[list, list]:
    """([(name, elements)] of ``module`` in named order, [name] in the order ``run()``'s backward
    produced their gradients: ``register_post_accumulate_grad_hook``, Megatron-FSDP's own hook,
    core_v0.19.0 megatron_fsdp.py:1111)."""
    from megatron_hooks.moe_fake import moe_without_te

    named, produced = [], []
    for name, weight in module.named_parameters():
        named.append((name, weight.numel()))
        weight.register_post_accumulate_grad_hook(lambda _, name=name: produced.append(name))
    with moe_without_te():
        run().float().square().mean().backward()
    return named, produced


def _read_block(spec) -> tuple[list, list]:
    """([(name, elements)] in named order, [name] in the order backward produced their gradients)
    of a dense layer then an MoE layer of ``spec``, megatron-core's local spec, TP = EP = 1."""
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.transformer.transformer_block import TransformerBlock, TransformerBlockSubmodules

    from megatron_hooks.model import causal_mask, moe_config_overrides, transformer_config

    latent = spec.mla is not None
    config = transformer_config(spec, num_layers=2, **moe_config_overrides(spec))
    block = _built(lambda: TransformerBlock(config, TransformerBlockSubmodules(layer_specs=_layer_specs(spec)),
                                            post_process=False))
    rope = None if latent else RotaryEmbedding(kv_channels=spec.head_dim, rotary_percent=1.0)(SEQ)
    return _recorded(block, lambda: block(torch.randn(SEQ, MBS, spec.hidden_size), attention_mask=causal_mask(SEQ),
                                          rotary_pos_emb=rope))


SPECS = {"gqa-qk-norm": GQA, "mla-q-lora": MLA, "mla-no-q-lora": MLA_NO_Q_LORA}


@pytest.fixture(scope="module")
def readings(megatron_world) -> dict:
    """Each of ``SPECS``' blocks read once (about a second each)."""
    return {key: _read_block(spec) for key, spec in SPECS.items()}


def _as_advisor(spec, reading: tuple, layer: int) -> tuple[list, list, list]:
    """One layer's (the advisor's weights in named order, each (name, elements, group): the
    first-named part places it; the order backward produced them, by each weight's own part, the
    folded norms left out; the folded norms in the order produced)."""
    named, produced = reading
    latent = spec.mla is not None
    sizes, group = {}, {}
    for name, elements in named:
        index, entry = _entry(name, latent)
        if index == layer:
            sizes[entry] = sizes.get(entry, 0) + elements
            group[entry] = int(".experts." in name)  # _get_parameter_groups' key
    ours = [name.split(".")[-2] if name.split(".")[-2] in FOLDED else name
            for name in produced if _entry(name, latent)[0] == layer]
    order = [_entry(name, latent)[1] for name in ours if name not in FOLDED]
    return [(entry, float(size), group[entry]) for entry, size in sizes.items()], order, \
        [name for name in ours if name in FOLDED]


def _names(weights: list, arrival: tuple) -> list:
    """The advisor's arrival (indices into ``weights``) as the weights' names."""
    return [weights[i][0] for i in arrival]


@pytest.mark.parametrize("key,folded_norms", [("gqa-qk-norm", ["k_layernorm", "q_layernorm"]),
                                              ("mla-q-lora", ["kv_layernorm", "q_layernorm"]),
                                              ("mla-no-q-lora", ["kv_layernorm"])])
def test_the_moe_layers_named_and_backward_orders_are_megatron_cores(key, folded_norms, readings):
    """The MoE layer (layer 2): the advisor's weights, sizes and groups in megatron-core's named
    order, and the order backward produces them: expert 3's FC2, FC1, ..., expert 0's, the router,
    the shared FC2, FC1, the pre-MLP norm, the attention, the input norm. The folded norms are
    produced after linear_proj and before QKV (GQA, k then q) or between the up and the down
    projections (MLA, kv then q): a few hundred elements produced apart from where the advisor
    counts them."""
    spec = SPECS[key]
    weights, order, folded = _as_advisor(spec, readings[key], layer=1)
    layer, arrival = fsdp_replay.moe_layer_weights(spec, 1, 1, 1, grouped=False)
    assert [(size, group) for _, size, group in weights] == [(w[0], w[1]) for w in layer], readings[key][0]
    assert _names(weights, arrival) == order, readings[key][1]
    assert folded == folded_norms
    # the 8 routed expert weights alone in group 1, produced first, the last expert first
    assert [w[2] for w in weights] == [0] * (len(weights) - 10) + [1] * 8 + [0, 0]
    assert order[:12] == ["fc2.3", "fc1.3", "fc2.2", "fc1.2", "fc2.1", "fc1.1", "fc2.0", "fc1.0",
                          "router", "shared_fc2", "shared_fc1", "mlp_norm"]
    assert order[-1] == "input_norm"


@pytest.mark.parametrize("key", SPECS)
def test_the_dense_layers_orders_and_the_stages_are_megatron_cores(key, readings):
    """The first, dense layer: ``dense_layer_weights`` (with GQA also ``memory_levers.layer_weights``
    and ``LAYER_WEIGHT_ARRIVAL``) in megatron-core's named and backward orders: FC2, FC1, the
    pre-MLP norm, the attention, the input norm; and every gradient of the MoE layer (layer 2)
    before the dense layer's first, as ``moe_stage``'s ``pre_arrival`` has them."""
    spec = SPECS[key]
    weights, order, _ = _as_advisor(spec, readings[key], layer=0)
    dense, arrival = fsdp_replay.dense_layer_weights(spec, 1)
    assert [(size, group) for _, size, group in weights] == [(w[0], w[1]) for w in dense], readings[key][0]
    assert _names(weights, arrival) == order, readings[key][1]
    assert order[:3] == ["fc2", "fc1", "mlp_norm"] and order[-1] == "input_norm"
    if spec.mla is None:
        assert [size for _, size, _ in weights] == list(levers.layer_weights(spec, 1))
        assert _names(weights, levers.LAYER_WEIGHT_ARRIVAL) == order == \
            ["fc2", "fc1", "mlp_norm", "proj", "qkv", "input_norm"]
    layers = [_entry(name, spec.mla is not None)[0] for name in readings[key][1]]
    assert layers == sorted(layers, reverse=True)


@pytest.mark.parametrize("key,named,produced", [
    ("mla-q-lora", ["proj", "q_down", "q_up", "kv_down", "kv_up"], ["proj", "kv_up", "q_up", "kv_down", "q_down"]),
    ("mla-no-q-lora", ["proj", "q", "kv_down", "kv_up"], ["proj", "kv_up", "q", "kv_down"])])
def test_mla_attention_orders_by_hand(key, named, produced, readings):
    """MLA's part of a layer, by hand from multi_latent_attention.py (core_v0.19.0 :509-616 builds
    linear_q_proj or q_down and q_up, then kv_down, kv_up after linear_proj :221; forward :644,
    :662, :856-866 runs q_down, kv_down, q_up or q_proj, kv_up, then linear_proj): produced in the
    reverse. Without a q LoRA q_proj comes before kv_down (the advisor had it after until this
    test)."""
    for layer in (0, 1):
        weights, order, _ = _as_advisor(SPECS[key], readings[key], layer)
        assert [entry for entry, _, _ in weights][1:1 + len(named)] == named
        attention = order[3:] if layer == 0 else order[12:]
        assert attention == produced + ["input_norm"]


def _read_mtp_model(spec, first: bool, mtp_layers: int) -> tuple[list, list]:
    """``_recorded`` of a whole ``GPTModel`` of ``spec`` with ``mtp_layers`` MTP layers
    (``get_gpt_mtp_block_spec``: each an MoE layer, the decoder's last layer's spec) over a dense
    layer then an MoE layer, untied, local spec, TP = EP = 1, one loss with labels. ``first``: the
    model's own embedding (PP 1); else the last stage of PP > 1 (``pre_process`` False: the
    embedding is the MTP's copy, the decoder's input given by ``set_input_tensor``)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import LNImpl, get_gpt_mtp_block_spec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    from megatron_hooks.model import causal_mask, moe_config_overrides, transformer_config

    config = transformer_config(spec, num_layers=2, mtp_num_layers=mtp_layers, **moe_config_overrides(spec))
    block = TransformerBlockSubmodules(layer_specs=_layer_specs(spec), layer_norm=LNImpl)
    model = _built(lambda: GPTModel(
        config, block, vocab_size=spec.vocab_size, max_sequence_length=SEQ, pre_process=first,
        mtp_block_spec=get_gpt_mtp_block_spec(config, block, use_transformer_engine=False),
        position_embedding_type="none" if spec.mla else "rope", share_embeddings_and_output_weights=False))
    ids = torch.randint(0, spec.vocab_size, (MBS, SEQ))

    def run():
        if not first:
            model.set_input_tensor(torch.randn(SEQ, MBS, spec.hidden_size))
        return model(ids, torch.arange(SEQ).expand(MBS, SEQ), causal_mask(SEQ), labels=ids)
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    with pytest.MonkeyPatch.context() as patch:  # its loss log is sized by the first model's MTP layers
        patch.setattr(MTPLossLoggingHelper, "tracker", {})
        return _recorded(model, run)


def _model_entry(name: str, latent: bool) -> str:
    """The advisor's weight counting a ``GPTModel`` parameter: the ends by name, a decoder or MTP
    transformer layer's weight as ``_entry``'s, prefixed by its layer (``L0.``, ``M0.``)."""
    match = re.fullmatch(r"mtp\.layers\.(\d+)\.(enorm|hnorm|eh_proj|final_layernorm)\.weight", name)
    if match:
        return f"M{match[1]}.{match[2]}"
    match = re.fullmatch(r"(decoder|mtp)\.layers\.(\d+)\.(?:transformer_layer\.)?(.*)", name)
    if match:
        return f"{'L' if match[1] == 'decoder' else 'M'}{match[2]}." + _entry(f"layers.0.{match[3]}", latent)[1]
    return {"embedding.word_embeddings.weight": "embedding", "decoder.final_layernorm.weight": "final_norm",
            "output_layer.weight": "output"}[name]


def _expanded(stage: levers.StageWeights, layers: int) -> tuple[list, list]:
    """``stage`` of ``layers`` layers as ([(elements, group)] in named order, the named indices in
    the order backward produces them), as ``StageWeights`` says: ``post_order``, the layers from
    the last (``arrival`` within each), then ``pre_order``."""
    named = stage.pre + stage.layer * layers + stage.post
    base, width = len(stage.pre) + layers * len(stage.layer), len(stage.layer)
    order = [j if j < len(stage.pre) else base + j - len(stage.pre) for j in stage.post_order()]
    order += [len(stage.pre) + layer * width + p for layer in range(layers - 1, -1, -1) for p in stage.arrival]
    return [(w[0], w[1]) for w in named], order + stage.pre_order()


@pytest.mark.parametrize("key,first,mtp_layers", [("gqa-qk-norm", False, 1), ("mla-q-lora", False, 1),
                                                  ("gqa-qk-norm", True, 1), ("gqa-qk-norm", False, 2)])
def test_an_mtp_stages_named_and_backward_orders_are_megatron_cores(key, first, mtp_layers, megatron_world):
    """A last stage holding MTP layers (``fsdp_replay.moe_stage(..., mtp)``) against megatron-core
    0.16.1's ``GPTModel`` on the CPU. Named: the embedding (at PP > 1 the MTP's copy), the decoder
    layers, the decoder's final norm, per MTP layer enorm, hnorm, eh_proj, its MoE layer and its
    final norm, the output layer (core_v0.19.0 gpt_model.py:167-274 builds them in that order,
    multi_token_prediction.py:983-1053 the MTP layer's). Backward: the output layer (the main loss
    and each MTP loss use it, one accumulation), each MTP layer from the last (its final norm, its
    layer, eh_proj, hnorm, enorm), the embedding copy (its last use the first MTP layer's
    lookup), the decoder's final norm, the decoder layers; at PP 1 the embedding last. Routed
    experts alone in group 1, the MTP layer's too (``.experts.`` in their names)."""
    spec = SPECS[key]
    named, produced = _read_mtp_model(spec, first, mtp_layers)
    latent, sizes, groups = spec.mla is not None, {}, {}
    for name, elements in named:
        entry = _model_entry(name, latent)
        sizes[entry] = sizes.get(entry, 0) + elements
        groups[entry] = int(".experts." in name)
    order = list(dict.fromkeys(_model_entry(name, latent) for name in produced
                               if name.split(".")[-2] not in FOLDED))
    position = levers.LAST | (levers.FIRST if first else 0)
    stage = fsdp_replay.moe_stage(spec, 1, 1, 1, 1, float(spec.hidden_size * spec.vocab_size), position,
                                  grouped=False, mtp=mtp_layers)
    weights, arrival = _expanded(stage, 1)
    entries = list(sizes)
    assert weights == [(float(sizes[e]), groups[e]) for e in entries], named
    assert [entries[i] for i in arrival] == order, produced
    assert (order[0], order[-1]) == ("output", "embedding" if first else "L0.input_norm")
    tail = [e for e in order if not e.startswith(("L", "M"))]
    assert tail == ["output", "final_norm", "embedding"] if first else ["output", "embedding", "final_norm"]
    for k in range(mtp_layers):
        own = [e for e in order if e.startswith(f"M{k}.")]
        assert (own[0], own[-3:]) == (f"M{k}.final_layernorm", [f"M{k}.eh_proj", f"M{k}.hnorm", f"M{k}.enorm"])
        assert [e for e in own if e[3:] in ("fc2.3", "fc1.3", "router")] == [f"M{k}.fc2.3", f"M{k}.fc1.3", f"M{k}.router"]
        assert all(groups[e] == e[3:].startswith(("fc1.", "fc2.")) for e in own)
