"""--tp-comm-overlap in a mixture-of-experts model: which of its linears megatron-core gives
Transformer Engine's userbuffers, each block priced by the dense model's term
(``advisor.throughput.userbuffers.block_overlap_time``, the one place the overlap's physics lives).

Read in the source of both releases the advisor knows (Megatron-LM core_v0.15.2 and core_v0.19.0):

- Grouped-query attention: ``linear_qkv`` is ``TELayerNormColumnParallelLinear`` with buffer 'qkv'
  and ``linear_proj`` ``TERowParallelLinear`` with 'proj' in MoE layers as in dense ones
  (``models/gpt/gpt_layer_specs.py`` core_v0.15.2:173-175, core_v0.19.0:145-147 and 324-326;
  ``transformer/attention.py`` core_v0.15.2:202 and 966, core_v0.19.0:422 and 1690): the dense
  layer's overlap, every sub-option.
- A dense layer's MLP (the first_k_dense_replace layers): ``TELayerNormColumnParallelLinear`` 'fc1'
  and ``TERowParallelLinear`` 'fc2' (``gpt_layer_specs.py`` core_v0.15.2:380-390, core_v0.19.0:540-550;
  ``transformer/mlp.py`` core_v0.15.2:117 and 136, core_v0.19.0:231 and 253): the dense MLP's.
- The shared experts: ``SharedExpertMLP`` is an ``MLP`` (``transformer/moe/shared_experts.py``
  core_v0.15.2:30-52, core_v0.19.0:111-125), not an expert, buffers 'fc1' and 'fc2', built from
  ``TEColumnParallelLinear`` and ``TERowParallelLinear`` (``models/gpt/moe_module_specs.py``
  core_v0.15.2:50-51, core_v0.19.0:74-75), both ``TELinear``. ``TELinear`` passes Transformer
  Engine only ``ub_overlap_ag``, ``ub_overlap_rs`` and ``ub_name`` (``extensions/transformer_engine.py``
  core_v0.15.2:314-347, core_v0.19.0:934-967), never the ``ub_bulk_dgrad``, ``ub_bulk_wgrad`` and
  ``ub_overlap_rs_dgrad`` that ``TELayerNormColumnParallelLinear`` passes (core_v0.15.2:522-553,
  core_v0.19.0:1197-1228), and TE's ``Linear`` leaves them off by default: FC1's forward all-gather
  and FC2's forward reduce-scatter and backward all-gather get userbuffers, FC1's dgrad
  reduce-scatter runs in NCCL (``SHARED_FC1``). --moe-shared-expert-overlap turns their
  userbuffers off (``shared_experts.py`` core_v0.15.2:88-96, core_v0.19.0:158-168): priced as
  without the overlap.
- The routed experts: none. ``TEGroupedLinear`` passes ``ub_name`` alone, no overlap
  (core_v0.15.2:1131, core_v0.19.0:2160), and an expert ``TELinear`` (``SequentialMLP``) has them
  turned off (core_v0.15.2:328-331, core_v0.19.0:948-951); at ETP > 1 their TP collectives are
  the token dispatcher's, not userbuffers.
- Multi-latent attention: refused (``mla_problem``).

Megatron-LM's validate_args refuses --tp-comm-overlap only without --sequence-parallel
(``megatron/training/arguments.py`` core_v0.15.2:930-931, core_v0.19.0:1401-1402), nothing of
MoE, EP, the dispatcher or --moe-shared-expert-overlap.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import numpy as np

from advisor.options.ub_config import MEGATRON_OVERLAPS, TE_DEFAULTS, LayerOverlaps, UserbuffersConfig
from advisor.throughput import terms
from advisor.throughput.flops import layer_gemm_shapes
from advisor.throughput.terms import Rates, TpBytes
from advisor.throughput.userbuffers import block_overlap_time


class TpOverlap(NamedTuple):
    """--tp-comm-overlap's settings as the MoE time model reads them (``advisor.moe.time.layer_times``)."""

    config: UserbuffersConfig = TE_DEFAULTS
    """The buffers: --tp-comm-overlap-cfg's, else Transformer Engine's defaults."""
    overlaps: LayerOverlaps = MEGATRON_OVERLAPS
    """Megatron's sub-options, as ``TELayerNormColumnParallelLinear`` and ``TERowParallelLinear`` get them."""


def shared_fc1_overlaps(overlaps: LayerOverlaps) -> LayerOverlaps:
    """What the shared experts' FC1, a ``TEColumnParallelLinear``, asks of its buffers: ``TELinear``
    passes no bulk overlap nor ``ub_overlap_rs_dgrad`` (see the module's docstring)."""
    return replace(overlaps, overlap_rs_dgrad=False, bulk_dgrad=False, bulk_wgrad=False)


class BlockTp(NamedTuple):
    """Seconds of one block's sequence-parallel collectives under --tp-comm-overlap, one microbatch:
    what the userbuffers leave exposed plus the GEMMs' slowdown by their SM margin, forward and
    backward (``LayerTimes``' TP fields hold these in place of the collectives' whole time)."""

    forward: object
    backward: object


def overlapped_block(stems: tuple[str, str], gemms: tuple, spec, tokens, tp, gemm_rates: Rates, sms: int,
                     overlap: TpOverlap, sizes: TpBytes, overlaps: LayerOverlaps | None = None) -> BlockTp:
    """``BlockTp`` of a block whose forward GEMMs take ``gemms`` seconds (``block_overlap_time``):
    its exposed collectives with the GEMMs' slowdown. The slowdown is charged with the
    collectives, so that every forward that runs the block (again where recomputed) and its
    backward carry it once each, as the dense model charges it per pass."""
    forward, backward, slow_f, slow_b = block_overlap_time(stems, gemms, spec, tokens, tp, gemm_rates, sms,
                                                           overlap.config, sizes, overlaps or overlap.overlaps)
    return BlockTp(forward + slow_f, backward + slow_b)


def attention_tp(spec, tokens, tp, gemm_rates: Rates, sms: int, overlap: TpOverlap, sizes: TpBytes) -> BlockTp:
    """Grouped-query attention's QKV and output projection (``layer_gemm_shapes``' first two GEMMs)."""
    gemms = tuple(terms.gemm_time(m, k, n, gemm_rates) for m, k, n in layer_gemm_shapes(spec, tokens, tp)[:2])
    return overlapped_block(("qkv", "proj"), gemms, spec, tokens, tp, gemm_rates, sms, overlap, sizes)


def dense_mlp_tp(spec, tokens, tp, gemm_rates: Rates, sms: int, overlap: TpOverlap, sizes: TpBytes) -> BlockTp:
    """A dense layer's MLP, FC1 and FC2 (``layer_gemm_shapes``' last two GEMMs), as a dense model's."""
    gemms = tuple(terms.gemm_time(m, k, n, gemm_rates) for m, k, n in layer_gemm_shapes(spec, tokens, tp)[2:])
    return overlapped_block(("fc1", "fc2"), gemms, spec, tokens, tp, gemm_rates, sms, overlap, sizes)


def shared_tp(spec, tokens, tp, gemm_rates: Rates, sms: int, overlap: TpOverlap, sizes: TpBytes) -> BlockTp:
    """The shared experts: FC1 [tokens, h] x [h, 2 h_shared / t] and FC2 [tokens, h_shared / t] x
    [h_shared / t, h], FC1 asking only what ``TELinear`` passes (``shared_fc1_overlaps``); zeros
    without shared experts."""
    if not spec.shared_expert_size:
        return BlockTp(0.0, 0.0)
    t, h, width = np.asarray(tp, dtype=float), spec.hidden_size, spec.shared_expert_size
    gemms = (terms.gemm_time(tokens, h, 2 * width / t, gemm_rates), terms.gemm_time(tokens, width / t, h, gemm_rates))
    return overlapped_block(("fc1", "fc2"), gemms, spec, tokens, tp, gemm_rates, sms, overlap, sizes,
                            shared_fc1_overlaps(overlap.overlaps))


def mla_problem(spec, tp_comm_overlap: bool) -> str | None:
    """Why --tp-comm-overlap is refused for ``spec``, or None. Multi-latent attention's down
    projections are ``TELinear`` with buffer names Transformer Engine has no buffer for
    ('q_proj' without q_lora_rank, 'q_down_proj', 'kv_down_proj': ``multi_latent_attention.py``
    core_v0.15.2:366, 391 and 430; core_v0.19.0:519, 545 and 592), and ``TELinear`` answers by
    setting ``tp_comm_overlap = False`` on the config it was handed (``extensions/transformer_engine.py``
    core_v0.15.2:302-312, core_v0.19.0:922-932), which is the model chunk's one ``TransformerConfig``
    (every module keeps the config it is given, ``transformer/module.py`` core_v0.15.2:40,
    core_v0.19.0:42, and MLA passes its own on). The first layer's output projection is built
    before them (core_v0.15.2:165-176, core_v0.19.0:220-231), so it alone keeps its userbuffers:
    no other linear of the chunk gets any, its dense MLPs and shared experts included.
    core_v0.19.0's --mla-down-proj-fusion (``FusedMLASelfAttention``, :1230-1330) builds no such
    ``TELinear`` under Transformer Engine: its 'qkv_down_proj' is a ``TELayerNormColumnParallelLinear``
    (``gpt_layer_specs.py``:257-264), and so are its 'q_up_proj' and 'kv_up_proj' with
    --qk-layernorm (:246-255), a class without that check (transformer_engine.py:1122-1228; the
    only one is ``TELinear``'s, :925): the overlap stays on and those linears hand Transformer
    Engine buffer names it has none for (what it does then is not read here). The advisor refuses
    the flag with MLA either way rather than price an overlap Megatron does not run as priced."""
    if not tp_comm_overlap or spec.mla is None:
        return None
    return ("--tp-comm-overlap is not priced with multi-latent attention: with MLA's down projections unfused, "
            "megatron-core turns it off for the whole model chunk when it builds the first of them (TELinear sets "
            "tp_comm_overlap = False on the shared config for a buffer name Transformer Engine lacks, "
            "extensions/transformer_engine.py), leaving only the first layer's output projection overlapped, and "
            "with --mla-down-proj-fusion (core 0.19) the fused projections name buffers Transformer Engine has none "
            "for; drop --tp-comm-overlap")
