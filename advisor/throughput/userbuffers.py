"""--tp-comm-overlap: what Transformer Engine's userbuffers hide of a layer's TP collectives, and
what they cost the GEMMs they hide behind. Same conventions as ``terms.py``.

Megatron-LM (core_v0.15.2) passes --tp-comm-overlap to Transformer Engine's linear layers with
its sub-options, by default (``model_parallel_config.py``: tp_comm_overlap_ag/rs, split_ag/rs,
bulk_dgrad/wgrad on, tp_comm_overlap_rs_dgrad off; others as ``ub_config.LayerOverlaps`` says;
``extensions/transformer_engine.py``, the
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
16 fewer SMs. Assumed: a GEMM's time scales with the SMs it runs on, sm / (sm - num_sm); a buffer
without a margin leaves its GEMM every SM.

--tp-comm-overlap-cfg FILE replaces any buffer's method, SMs, margin and splits
(``advisor.options.ub_config``); each buffer is priced by the overlap TE then really runs
(``UserbuffersConfig.kernel``): the file's method picks only ring exchange or TE's other object,
and the layer's role picks bulk or pipelined (TE 2.9 ``csrc/extensions/gemm.cpp``, ``gemm``), so
``proj_fprop: {method: bulk}`` runs pipelined and ``qkv_wgrad: {method: pipeline}`` bulk.
"""

from __future__ import annotations

import numpy as np

from advisor.errors import AdvisorError
from advisor.models import LlamaSpec
from advisor.options.ub_config import MEGATRON_OVERLAPS, TE_DEFAULTS, LayerOverlaps, Userbuffer, UserbuffersConfig
from advisor.throughput.flops import layer_gemm_shapes
from advisor.throughput.terms import BF16_TP, Rates, TpBytes, gemm_time, tp_collective_time

PIPELINE_SPLITS = 4
"""The pipeline method's chunks (``initialize_ub`` default num_splits 4; ``ub_config.default_buffer``)."""


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


def exposed(kernel: str, comm, gemm, tp, splits: int):
    """Exposed time of a collective of ``comm`` seconds beside a GEMM of ``gemm`` (already slowed by
    any SM margin) run by ``kernel`` (``UserbuffersConfig.kernel``, not the file's method); ring
    exchange runs TP chunks whatever ``num_splits`` says (TE's ``CommOverlapP2P`` takes no split
    count), bulk runs the collective whole (``num_splits`` unused)."""
    if kernel == "ring_exchange":
        return ring_exchange_exposed(comm, gemm, tp)
    if kernel == "pipeline":
        return pipeline_exposed(comm, gemm, splits)
    return bulk_exposed(comm, gemm)


def _margin(buffer: Userbuffer, sms: int, tp) -> np.ndarray:
    """The factor a buffer's GEMM is slowed by: sm / (sm - num_sm) where it sets an SM margin
    (``_math_sms = sm_count - num_comm_sm``), 1 without one and at TP 1 (no overlap there)."""
    if not buffer.set_sm_margin:
        return np.ones_like(np.asarray(tp, dtype=float))
    if buffer.num_sm >= sms:
        raise AdvisorError(f"--tp-comm-overlap-cfg: num_sm {buffer.num_sm} with set_sm_margin leaves no SMs of the "
                           f"GPU's {sms} to the GEMM")
    return np.where(np.asarray(tp) > 1, sms / (sms - buffer.num_sm), 1.0)


def buffer_element_bytes(name: str, buffer: Userbuffer, sizes: TpBytes) -> float:
    """Bytes per element the collective of buffer ``name`` moves, from the layer's ``sizes``
    (``terms.tensor_parallel_time``'s, one source for both paths): the input all-gathers
    (qkv_fprop, fc1_fprop; FP8 under --fp8-format, their buffers always FP8 there), the gradient
    all-gathers (proj_dgrad, fc2_dgrad), the forward reduce-scatters (proj_fprop, fc2_fprop) and the
    dgrad reduce-scatters (qkv/fc1_wgrad, bulk whatever the dgrad's method), a reduce-scatter at
    ``sizes.fp8_scatter`` where its buffer is FP8 (``Userbuffer.fp8_buf``)."""
    if name in ("qkv_fprop", "fc1_fprop"):
        return sizes.input_gather
    if name in ("proj_dgrad", "fc2_dgrad"):
        return sizes.grad_gather
    if buffer.fp8_buf:  # a reduce-scatter the file made FP8 (Userbuffer.fp8_buf says which can be)
        return sizes.fp8_scatter
    return sizes.output_scatter if name in ("proj_fprop", "fc2_fprop") else sizes.dgrad_scatter


def _collective(name: str, buffer: Userbuffer, spec: LlamaSpec, tokens, tp, rates: Rates, sizes: TpBytes):
    """The ring collective of buffer ``name`` (``terms.tp_collective_time``) at its bytes an element."""
    return tp_collective_time(spec, tokens, tp, rates, buffer_element_bytes(name, buffer, sizes))


NCCL_BYTES = {"qkv_fprop": "input_gather", "fc1_fprop": "input_gather", "proj_fprop": "output_scatter",
              "fc2_fprop": "output_scatter", "proj_dgrad": "grad_gather", "fc2_dgrad": "grad_gather",
              "qkv_wgrad": "dgrad_scatter", "fc1_wgrad": "dgrad_scatter"}
"""The ``TpBytes`` field of the collective a buffer would carry, where Megatron's sub-options leave
it to NCCL instead (``LayerOverlaps.role`` None): the activation's own dtype, never a buffer's FP8."""


def _beside(name: str, gemm, spec: LlamaSpec, tokens, tp, rates: Rates, sms: int, config: UserbuffersConfig,
            sizes: TpBytes, overlaps: LayerOverlaps):
    """(exposed, GEMM slowdown) of buffer ``name``'s collective beside its GEMM of ``gemm`` seconds:
    the overlap TE runs (``UserbuffersConfig.kernel``), slowed by the buffer's SM margin; where the
    sub-options leave the buffer unused, the collective in NCCL on the compute stream, all of it
    exposed and no GEMM slowed, as ``terms.tensor_parallel_time`` prices it without the overlap."""
    kernel = config.kernel(name, overlaps)
    if kernel is None:
        return tp_collective_time(spec, tokens, tp, rates, getattr(sizes, NCCL_BYTES[name])), 0.0
    buffer = config.buffer(name)
    margin = _margin(buffer, sms, tp)
    comm = _collective(name, buffer, spec, tokens, tp, rates, sizes)
    return exposed(kernel, comm, gemm * margin, tp, buffer.num_splits), gemm * (margin - 1)


def _summed(parts):
    """(exposed, GEMM slowdown) of ``parts``, [(exposed, slowdown), ...], added one at a time in
    their order (from 0.0: the same bits as adding them onto the first)."""
    exposed_s, slow = 0.0, 0.0
    for part, slowed in parts:
        exposed_s, slow = exposed_s + part, slow + slowed
    return exposed_s, slow


def _forward_parts(stems: tuple[str, str], gemms: tuple, spec: LlamaSpec, tokens, tp, rates: Rates, sms: int,
                   config: UserbuffersConfig, sizes: TpBytes, overlaps: LayerOverlaps):
    """[(exposed, GEMM slowdown), ...] of a block's forward: its column-parallel linear's all-gather
    (``stems[0]``: qkv_fprop, fc1_fprop) beside its GEMM ``gemms[0]``, then its row-parallel linear's
    reduce-scatter (``stems[1]``: proj_fprop, fc2_fprop) beside ``gemms[1]``."""
    return [_beside(f"{stem}_fprop", gemm, spec, tokens, tp, rates, sms, config, sizes, overlaps)
            for stem, gemm in zip(stems, gemms)]


def _backward_parts(stems: tuple[str, str], gemms: tuple, spec: LlamaSpec, tokens, tp, rates: Rates, sms: int,
                    config: UserbuffersConfig, sizes: TpBytes, overlaps: LayerOverlaps):
    """[(exposed, GEMM slowdown), ...] of a block's backward, each GEMM the size of the forward's: the
    row-parallel linear's gradient all-gather beside its dgrad (proj_dgrad, fc2_dgrad) first, then
    the column-parallel linear's (``_column_backward``)."""
    column, row = stems
    return [_beside(f"{row}_dgrad", gemms[1], spec, tokens, tp, rates, sms, config, sizes, overlaps),
            *_column_backward(column, gemms[0], spec, tokens, tp, rates, sms, config, sizes, overlaps)]


def mlp_forward_overlap_time(spec: LlamaSpec, tokens, tp, rates: Rates, sms: int,
                             config: UserbuffersConfig = TE_DEFAULTS, sizes: TpBytes = BF16_TP,
                             overlaps: LayerOverlaps = MEGATRON_OVERLAPS):
    """(exposed, GEMM slowdown) of the MLP's forward alone under --tp-comm-overlap: FC1's
    all-gather (fc1_fprop) and FC2's reduce-scatter (fc2_fprop), as ``tp_overlap_time`` prices
    them in the layer; what --recompute-modules mlp runs again in the backward (the checkpointed
    MLP calls the same Transformer Engine modules, with their userbuffers)."""
    gemms = tuple(gemm_time(m, k, n, rates) for m, k, n in layer_gemm_shapes(spec, tokens, tp)[2:])
    return _summed(_forward_parts(("fc1", "fc2"), gemms, spec, tokens, tp, rates, sms, config, sizes, overlaps))


def _column_backward(stem: str, gemm, spec: LlamaSpec, tokens, tp, rates: Rates, sms: int,
                     config: UserbuffersConfig, sizes: TpBytes, overlaps: LayerOverlaps):
    """[(exposed, GEMM slowdown), ...] of QKV's or FC1's backward collectives (``stem``), each GEMM the
    size of the forward's ``gemm``. Bulk dgrad (Megatron's default): the input's re-gather beside
    dgrad stays hidden, as ``tensor_parallel_time`` has it without the overlap (TE gathers it
    asynchronously behind dgrad either way, ``layernorm_linear.py``), its SM margin still slowing
    dgrad; --disable-tp-comm-bulk-dgrad leaves it to NCCL, hidden the same, dgrad unslowed. The
    dgrad reduce-scatter: beside wgrad (``*_wgrad``, bulk), or in NCCL and exposed with
    --disable-tp-comm-bulk-wgrad, or with --tp-comm-overlap-rs-dgrad beside dgrad itself on the
    ``*_dgrad`` buffer (pipelined, ring exchange where the file makes it so), both bulk overlaps off."""
    dgrad = f"{stem}_dgrad"
    role = overlaps.role(dgrad)
    parts = []  # (exposed, slowdown) in the order they add up (the sums stay bit for bit as before)
    if role == "bulk_all_gather":  # its re-gather: hidden
        parts.append((0.0, gemm * (_margin(config.buffer(dgrad), sms, tp) - 1)))
    elif role == "reduce_scatter":
        parts.append(_beside(dgrad, gemm, spec, tokens, tp, rates, sms, config, sizes, overlaps))
    if not overlaps.overlap_rs_dgrad:
        parts.append(_beside(f"{stem}_wgrad", gemm, spec, tokens, tp, rates, sms, config, sizes, overlaps))
    return parts


def block_overlap_time(stems: tuple[str, str], gemms: tuple, spec: LlamaSpec, tokens, tp, rates: Rates, sms: int,
                       config: UserbuffersConfig = TE_DEFAULTS, sizes: TpBytes = BF16_TP,
                       overlaps: LayerOverlaps = MEGATRON_OVERLAPS):
    """``tp_overlap_time``'s terms for one block of a layer alone: its column-parallel linear
    ``stems[0]`` (qkv or fc1, whose buffers it uses) and its row-parallel one ``stems[1]`` (proj or
    fc2), beside their forward GEMMs ``gemms`` (seconds, already at the run's rates; each backward
    GEMM the same size), the block's [tokens, h] collectives each ``_beside`` its GEMM: forward the
    column linear's all-gather and the row linear's reduce-scatter, backward the row linear's
    gradient all-gather and the column linear's (``_column_backward``). Returns (forward exposed,
    backward exposed, forward GEMM slowdown, backward GEMM slowdown). For blocks whose GEMMs are
    not the dense layer's (a mixture-of-experts model's shared experts, ``advisor.moe.time``), and
    whose linears Megatron may give fewer of the sub-options (``overlaps``)."""
    forward, slow_f = _summed(_forward_parts(stems, gemms, spec, tokens, tp, rates, sms, config, sizes, overlaps))
    backward, slow_b = _summed(_backward_parts(stems, gemms, spec, tokens, tp, rates, sms, config, sizes, overlaps))
    return forward, backward, slow_f, slow_b


def tp_overlap_time(spec: LlamaSpec, tokens, tp, rates: Rates, sms: int, config: UserbuffersConfig = TE_DEFAULTS,
                    sizes: TpBytes = BF16_TP, overlaps: LayerOverlaps = MEGATRON_OVERLAPS):
    """(forward exposed, backward exposed, forward GEMM slowdown, backward GEMM slowdown) of one
    layer with --tp-comm-overlap, on a GPU of ``sms`` SMs; ``rates``, the GEMMs' (FP8's under
    --fp8-format); ``config``, the --tp-comm-overlap-cfg buffers (default TE's); ``sizes``, the
    collectives' bytes an element (``levers.fp8_tp_bytes`` under --fp8-format); ``overlaps``,
    Megatron's sub-options (``LayerOverlaps``: which buffers the layers use at all). Each collective
    is ``terms.tensor_parallel_time``'s one ring of the [tokens, h] activation at its buffer's bytes
    (``buffer_element_bytes``), beside the GEMM of its buffer, by the buffer's method. Forward: the
    all-gathers before QKV and FC1 (qkv_fprop, fc1_fprop) and the reduce-scatters after the
    projection and FC2 (proj_fprop, fc2_fprop). Backward: the projection's and FC2's gradient
    all-gathers beside their dgrad (proj_dgrad, fc2_dgrad); QKV's and FC1's (``_column_backward``):
    by default their dgrad reduce-scatters beside their wgrad (qkv_wgrad, fc1_wgrad, bulk),
    whatever method qkv_dgrad/fc1_dgrad are given (their layers run bulk there, ``ROLES``). A
    collective whose overlap a sub-option turns off runs in NCCL, priced as without the overlap
    (``_beside``). Every GEMM beside a buffer that sets an SM margin is slowed by it. Nothing at
    TP 1 (Megatron refuses the overlap there)."""
    qkv, proj, fc1, fc2 = (gemm_time(m, k, n, rates) for m, k, n in layer_gemm_shapes(spec, tokens, tp))
    blocks = ((("qkv", "proj"), (qkv, proj)), (("fc1", "fc2"), (fc1, fc2)))
    args = (spec, tokens, tp, rates, sms, config, sizes, overlaps)
    attention_f, mlp_f = (_forward_parts(stems, gemms, *args) for stems, gemms in blocks)
    attention_b, mlp_b = (_backward_parts(stems, gemms, *args) for stems, gemms in blocks)
    # ``block_overlap_time``'s parts, each block's, added in the layer's order: forward QKV, projection,
    # FC1, FC2; backward both row linears' dgrad gathers (projection, FC2) before the column linears'
    # (QKV's, FC1's). Adding the two blocks' sums instead would reassociate the floats (the backward's
    # most: (p + q) + (f + c) is not ((p + f) + q) + c bit for bit) and move every --tp-comm-overlap
    # number by an ulp or so; this order keeps them as they were.
    forward, slow_f = _summed(attention_f + mlp_f)
    backward, slow_b = _summed([attention_b[0], mlp_b[0], *attention_b[1:], *mlp_b[1:]])
    return forward, backward, slow_f, slow_b
