"""--tp-comm-overlap: what Transformer Engine's userbuffers hide of a layer's TP collectives, and
what they cost the GEMMs they hide behind. Same conventions as ``terms.py``.

Megatron-LM (core_v0.15.2) passes --tp-comm-overlap to Transformer Engine's linear layers with
its sub-options at their defaults (``model_parallel_config.py``: tp_comm_overlap_ag/rs, split_ag/rs,
bulk_dgrad/wgrad on, tp_comm_overlap_rs_dgrad off; ``extensions/transformer_engine.py``, the
``ub_*`` arguments of ``TELinear`` and ``TELayerNormColumnParallelLinear``, buffer names qkv,
proj, fc1, fc2), and ``initialize_ub`` (TE 2.9, the release core_v0.15.2 pins,
``pytorch/module/base.py``, ``get_default_config``) picks each GEMM's method:

- ring_exchange (qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad): the all-gather as tp point-to-point
  steps on the copy engines (use_ce, num_sm 1, no SM margin), the GEMM split into tp chunks, each
  running while the next chunk arrives (``CommOverlapP2PBase::split_overlap_ag``);
- pipeline (proj_fprop, fc2_fprop): the GEMM split into 4, each chunk reduce-scattered by 16 SMs
  while the next is computed (``CommOverlapBase::split_overlap_rs``);
- bulk (qkv/fc1 dgrad and wgrad): the whole collective beside the whole GEMM on 16 SMs
  (``CommOverlapBase::bulk_overlap``): the input's re-gather beside dgrad, dgrad's reduce-scatter
  beside wgrad;
- external (proj_wgrad, fc2_wgrad): reuses proj_dgrad's and fc2_dgrad's gathered gradient, no
  collective of its own.
Pipeline and bulk set an SM margin (``_math_sms = sm_count - num_comm_sm``): their GEMM runs on
16 fewer SMs.
"""

from __future__ import annotations

import numpy as np

from advisor.models import LlamaSpec
from advisor.throughput.flops import layer_gemm_shapes
from advisor.throughput.terms import BF16, Rates, gemm_time, link_bandwidth, ring_collective_time

COMM_SMS = 16
"""SMs the pipeline and bulk methods' userbuffers kernels take from the GEMM beside them
(TE 2.9 ``initialize_ub`` defaults: num_sm 16, set_sm_margin true; ring_exchange: num_sm 1 on the
copy engines, no margin). Assumed: a GEMM's time scales with the SMs it runs on, sm / (sm - 16)."""

PIPELINE_SPLITS = 4
"""The pipeline method's chunks (``initialize_ub`` default num_splits 4)."""


def ring_exchange_exposed(comm, gemm, tp):
    """Exposed time of an all-gather of ``comm`` seconds run as ring exchange beside a GEMM of
    ``gemm``: chunk i's GEMM runs while chunk i + 1 arrives, so the last chunk's GEMM (1/tp of it)
    has nothing to hide and the first has its input already; the exchange shows where it
    outlasts the other (tp - 1)/tp of the GEMM."""
    t = np.asarray(tp, dtype=float)
    return np.maximum(0.0, comm - gemm * (t - 1) / t)


def pipeline_exposed(comm, gemm, splits: int = PIPELINE_SPLITS):
    """Exposed time of a reduce-scatter of ``comm`` seconds pipelined behind a GEMM of ``gemm``
    in ``splits`` chunks: chunk i's reduce-scatter waits for chunk i's GEMM, so the last chunk's
    (comm/splits) always shows, and all of it past the other chunks' GEMMs when it is slower."""
    return np.maximum(comm / splits, comm - gemm * (splits - 1) / splits)


def bulk_exposed(comm, gemm):
    """Exposed time of a collective of ``comm`` seconds run whole beside a GEMM of ``gemm``."""
    return np.maximum(0.0, comm - gemm)


def tp_overlap_time(spec: LlamaSpec, tokens, tp, rates: Rates, sms: int):
    """(forward exposed, backward exposed, forward GEMM slowdown, backward GEMM slowdown) of one
    layer with --tp-comm-overlap, on a GPU of ``sms`` SMs; ``rates``, the GEMMs' (FP8's under
    --fp8-format). Each collective is ``terms.tensor_parallel_time``'s one ring of the [tokens, h]
    BF16 activation. Forward: QKV's and FC1's all-gathers by ring exchange, the projection's and
    FC2's reduce-scatters pipelined (their GEMMs slowed by the margin). Backward: the projection's
    and FC2's gradient all-gathers by ring exchange beside their dgrad; QKV's and FC1's dgrad
    reduce-scatters in bulk beside their wgrad; their inputs' re-gathers beside dgrad stay hidden,
    as ``tensor_parallel_time`` has them without the overlap (Transformer Engine gathers them
    asynchronously behind dgrad either way, ``layernorm_linear.py``); all four of those GEMMs
    slowed by the margin. Nothing at TP 1 (Megatron refuses the overlap there)."""
    qkv, proj, fc1, fc2 = (gemm_time(m, k, n, rates) for m, k, n in layer_gemm_shapes(spec, tokens, tp))
    one = ring_collective_time(BF16 * tokens * spec.hidden_size, tp, link_bandwidth(tp, rates), rates)
    slow = np.where(np.asarray(tp) > 1, sms / (sms - COMM_SMS) - 1.0, 0.0)
    margin = 1.0 + slow
    forward = (ring_exchange_exposed(one, qkv, tp) + pipeline_exposed(one, proj * margin)
               + ring_exchange_exposed(one, fc1, tp) + pipeline_exposed(one, fc2 * margin))
    backward = (ring_exchange_exposed(one, proj, tp) + ring_exchange_exposed(one, fc2, tp)
                + bulk_exposed(one, qkv * margin) + bulk_exposed(one, fc1 * margin))
    return forward, backward, slow * (proj + fc2), slow * 2 * (qkv + fc1)
