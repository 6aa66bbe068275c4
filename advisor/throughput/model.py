"""The step time of a Megatron-LM iteration, assembled from the terms in ``terms.py``.

A pipeline stage runs each microbatch forward and backward: its layers (GEMMs, attention,
memory-bound kernels, TP and CP communication), plus the embedding on the first stage, the LM
head and loss on the last, the boundary sends, and a fixed per-microbatch overhead. The
iteration is the 1F1B (or interleaved) schedule over those stage times, the exposed part of the
data-parallel gradient reduction and parameter gather, the optimizer step, and it cannot beat
the data loader. Every input that describes a layout may be a numpy array; all broadcast.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Literal, NamedTuple

import numpy as np

from advisor import equations as eq
from advisor.hardware import GpuSpec, streaming_multiprocessors
from advisor.models import LlamaSpec
from advisor.options.ub_config import MEGATRON_OVERLAPS, TE_DEFAULTS, LayerOverlaps, UserbuffersConfig
from advisor.throughput import data_parallel, levers, terms, userbuffers
from advisor.throughput.calibration import Calibration, load_calibration
from advisor.throughput.flops import FlopsConvention, layer_gemm_shapes, megatron_flops_per_iteration

if TYPE_CHECKING:  # the options' one Recompute type; TrainingOptions.time_options imports this module
    from advisor.options.training import Recompute

DataloaderMask = Literal["cached", "rebuilt"]
AttentionKernel = Literal["fused", "flash2"]


@dataclass(frozen=True, kw_only=True, slots=True)
class TimeOptions:
    """How the run is configured, where it changes time. Defaults: Megatron-LM's defaults with
    the paper's flags (--sequence-parallel --use-distributed-optimizer --overlap-grad-reduce
    --overlap-param-gather --accumulate-allreduce-grads-in-fp32, no TP communication overlap)."""

    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    distributed_optimizer: bool = True
    grad_reduce_bytes: int = 4
    """4 with --accumulate-allreduce-grads-in-fp32 (the paper), 2 for BF16 gradient reduction."""
    grad_comm_bytes: int | None = None
    """Megatron-FSDP's gradient element on the wire where it differs from ``grad_reduce_bytes``
    (core_v0.19.0's --megatron-fsdp-grad-comm-dtype); None: ``grad_reduce_bytes``."""
    optimizer_step_bytes: float = 38.0
    """HBM bytes per optimizer element (of the rank's shard) of the Adam step
    (``terms.optimizer_step_bytes``): 38 with FP32 states, fewer with the precision-aware
    optimizer's; plus any cast of the gradient into the main weights' dtype before the step
    (``terms.grad_cast_bytes``)."""
    grad_zero_bytes: float = 4.0
    """HBM bytes per element of the main-gradient buffer zeroed at each step's start (its dtype's;
    0 under torch FSDP2), priced over the buffer, not the shard (``terms.grad_zero_time``)."""
    tp_comm_overlap: bool = False
    """--tp-comm-overlap (Transformer Engine userbuffers) hides the TP collectives behind the GEMMs
    beside them, as far as those GEMMs last (``userbuffers.tp_overlap_time``)."""
    userbuffers: UserbuffersConfig = TE_DEFAULTS
    """With it, each buffer's method, SMs and splits: --tp-comm-overlap-cfg's, else TE's defaults."""
    tp_overlaps: LayerOverlaps = MEGATRON_OVERLAPS
    """With it, which buffers the layers use (Megatron's --disable-tp-comm-overlap-ag/-rs,
    --tp-comm-overlap-rs-dgrad, --disable-tp-comm-bulk-dgrad/-wgrad); a collective left out runs
    exposed as without the overlap (``userbuffers.tp_overlap_time``)."""
    dataloader_mask: DataloaderMask = "cached"
    """'rebuilt': the data loader builds an s x s mask per sample (--reset-attention-mask,
    --reset-position-ids or --eod-mask-loss without --no-create-attention-mask-in-dataloader:
    the paper's runs); 'cached': built once and reused, or not built (Megatron's default)."""
    dataloader_workers: int = 2
    """--num-workers (Megatron's default 2)."""
    flops_convention: FlopsConvention = "megatron"
    """How TFLOP/s and MFU count attention: 'megatron' (causal, Megatron-LM >= core_r0.10) or
    'paper' (full s x s, the paper's Megatron-LM fork)."""
    flash_attention: bool = True
    """A fused attention kernel (Megatron's --attention-backend auto); False: --no-flash-attn's
    unfused core attention (``terms.unfused_attention_time``)."""
    attention_kernel: AttentionKernel = "fused"
    """'fused': a current fused attention kernel (cuDNN / FlashAttention-3 class, what
    Transformer Engine picks on Hopper today); 'flash2': FlashAttention-2 (the paper's 2024
    stack)."""
    fsdp_strategy: str | None = None
    """Megatron-FSDP's sharding strategy (None: DDP with the distributed optimizer or not)."""
    optimizer_host_fraction: float = 0.0
    """The share of the optimizer's step that runs on the host CPU (--optimizer-cpu-offload)."""
    fp8_format: str | None = None
    """--fp8-format: the linear layers' GEMMs in FP8 (None: BF16)."""
    fp8_recipe: str = "delayed"
    """--fp8-recipe, with --fp8-format (mxfp8 needs Blackwell's tensor cores)."""
    fp8_param_gather: bool = False
    """--fp8-param-gather: parameters gathered in FP8 (1 byte)."""
    recompute_modules: frozenset[str] = frozenset({"core_attn"})
    """With selective recomputation: Megatron's --recompute-modules (its default core_attn)."""
    vocab_divisible_by: int = eq.MEGATRON_VOCAB_DIVISIBLE_BY
    """--make-vocab-size-divisible-by: the LM head's rows, the embedding's parameters and Megatron's
    FLOP count take v padded to a multiple of it x TP (``equations.padded_vocab_size``); 128,
    Megatron's default, which the paper's runs kept."""
    fused_norms: bool = True
    """Transformer Engine's layer spec (the dense layers' norms fused into linear_qkv and
    linear_fc1); False: --transformer-impl local, whose norms --recompute-modules layernorm reruns."""
    bias_swiglu_fusion: bool = True
    """Megatron's fused SwiGLU (its default); False, --no-bias-swiglu-fusion: three element-wise
    kernels instead of one (``terms.swiglu_elements``)."""

    @property
    def grad_wire_bytes(self) -> int:
        """Bytes of one gradient element the DP reduction moves: ``grad_comm_bytes`` where
        Megatron-FSDP communicates in a dtype of its own, else ``grad_reduce_bytes``
        (``TrainingOptions.time_options`` sets ``grad_comm_bytes`` from ``TrainingOptions.grad_comm_bytes``
        where it differs); what the dense and the MoE model's DP groups move
        (``data_parallel.group_collectives``)."""
        return self.grad_reduce_bytes if self.grad_comm_bytes is None else self.grad_comm_bytes


class LayerParts(NamedTuple):
    """One layer, one microbatch (``TimeModel.layer_parts``), seconds."""

    compute_f: object
    compute_b: object
    tp_f: object
    tp_b: object
    cp_f: object
    cp_b: object
    attention_f: object
    """Core attention's forward (what selective recomputation's core_attn runs again)."""


@dataclass(frozen=True, slots=True)
class StageTimes:
    """Per-microbatch time of a pipeline stage on one GPU, forward and backward, and its parts
    (each an array broadcast over the layouts)."""

    forward: np.ndarray
    backward: np.ndarray
    compute: np.ndarray
    tp_comm: np.ndarray
    cp_comm: np.ndarray
    pp_comm: np.ndarray
    overhead: np.ndarray

    @property
    def total(self) -> np.ndarray:
        return self.forward + self.backward


@dataclass(frozen=True, slots=True)
class StepTime:
    """One iteration, seconds, with where the time goes. ``total_s`` = pipeline (compute +
    tp/cp/pp communication + overhead + bubble) + exposed DP communication + optimizer +
    waiting for the data loader."""

    total_s: np.ndarray
    compute_s: np.ndarray
    tp_comm_s: np.ndarray
    cp_comm_s: np.ndarray
    pp_comm_s: np.ndarray
    overhead_s: np.ndarray
    bubble_s: np.ndarray
    dp_comm_s: np.ndarray
    optimizer_s: np.ndarray
    data_wait_s: np.ndarray

    def parts(self) -> dict[str, np.ndarray]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def row(self, i=...) -> dict[str, float]:
        """One layout's parts as plain floats (``i`` indexes the broadcast layouts)."""
        return {name: float(np.asarray(value)[i]) for name, value in self.parts().items()}


def _f(x) -> np.ndarray:
    return np.asarray(x, dtype=float)


def _stacked(stages: list[StageTimes]) -> StageTimes:
    """Stages' ``StageTimes`` as one of arrays with the pipeline order along the last axis."""
    return StageTimes(**{f.name: np.stack(np.broadcast_arrays(*[getattr(s, f.name) for s in stages]), axis=-1)
                         for f in fields(StageTimes)})


class TimeModel:
    """Time of Megatron-LM training iterations of ``spec`` on ``gpu`` GPUs.

    ``calibration`` defaults to ``advisor/calibration.json`` (the fitted constants)."""

    def __init__(
        self,
        spec: LlamaSpec,
        gpu: GpuSpec,
        seq_len: int,
        global_batch_size: int,
        calibration: Calibration | None = None,
        options: TimeOptions = TimeOptions(),
    ) -> None:
        self.spec, self.gpu, self.seq_len, self.gbs = spec, gpu, seq_len, global_batch_size
        self.cal = calibration if calibration is not None else load_calibration()
        self.options = options
        self.rates = terms.Rates.of(gpu, self.cal, flash2=options.attention_kernel == "flash2")
        # FP8 runs the linear layers' GEMMs at the FP8 rate (levers.FP8_EFFICIENCY_NOTE); the rest stays BF16.
        self.fp8 = levers.fp8_gemms(self.rates, gpu, options.fp8_recipe) if options.fp8_format else None
        # and with sequence parallelism its gathers move FP8 (levers.fp8_tp_bytes), with or without userbuffers
        self.tp_bytes = self.fp8.collectives if self.fp8 else terms.BF16_TP
        self.host = levers.host_link(gpu) if options.optimizer_host_fraction > 0 else None
        self.sms = streaming_multiprocessors(gpu.architecture)

    # --- one layer, one microbatch ---------------------------------------------------------

    def layer(self, tp, cp, mbs):
        """(forward, backward, compute, tp_comm, cp_comm, attention_forward) of one transformer
        layer for one microbatch on one GPU."""
        p = self.layer_parts(tp, cp, mbs)
        return (p.compute_f + p.tp_f + p.cp_f, p.compute_b + p.tp_b + p.cp_b, p.compute_f + p.compute_b,
                p.tp_f + p.tp_b, p.cp_f + p.cp_b, p.attention_f)

    def layer_parts(self, tp, cp, mbs) -> "LayerParts":
        """One transformer layer, one microbatch, on one GPU: each pass's compute, TP and CP
        communication apart (what full recomputation runs again is the forward's, part by part)."""
        spec, rates, s = self.spec, self.rates, self.seq_len
        tokens = _f(mbs) * s / _f(cp)
        gemm_rates = self.fp8.rates if self.fp8 else rates
        gemm_f, gemm_b = terms.layer_gemm_time(spec, tokens, tp, gemm_rates)
        if self.options.flash_attention:
            attn_f, attn_b = terms.attention_time(spec, s, mbs, tp, cp, rates)
        else:  # CP runs inside fused attention only (advisor.memory refuses CP > 1 without it)
            attn_f, attn_b = terms.unfused_attention_time(spec, s, mbs, tp, rates)
        elem = terms.elementwise_time(terms.layer_elementwise_bytes(spec, tokens, tp, self.options.bias_swiglu_fusion),
                                      rates)
        if self.fp8:
            casts = levers.fp8_cast_bytes(spec, tokens, tp, self.fp8.casts)
            gemm_f = gemm_f + terms.elementwise_time(casts.forward, rates)
            gemm_b = gemm_b + terms.elementwise_time(casts.backward, rates)
        if self.options.tp_comm_overlap:  # userbuffers: what their GEMMs leave, and the SMs they take
            tp_f, tp_b, slow_f, slow_b = userbuffers.tp_overlap_time(spec, tokens, tp, gemm_rates, self.sms,
                                                                     self.options.userbuffers, self.tp_bytes,
                                                                     self.options.tp_overlaps)
            gemm_f, gemm_b = gemm_f + slow_f, gemm_b + slow_b
        else:
            tp_f, tp_b = terms.tensor_parallel_time(spec, tokens, tp, rates, self.tp_bytes)
        cp_f, cp_b = terms.context_parallel_time(spec, s, mbs, tp, cp, rates, attn_f, attn_b)
        compute_f = gemm_f + attn_f + elem
        compute_b = gemm_b + attn_b + 2 * elem  # backward reads the saved input and writes grads
        return LayerParts(compute_f, compute_b, tp_f, tp_b, cp_f, cp_b, attn_f)

    def recomputed_forward_parts(self, tp, tokens, attention_forward):
        """(compute, TP communication): the forward seconds of one layer, one microbatch, that selective recomputation
        (``TimeOptions.recompute_modules``) runs again in the backward (megatron-core
        ``transformer_layer.py``, both releases): core_attn, core attention
        (``attention_forward``, Korthikanti et al. 2023); mlp, the whole MLP under
        ``tensor_parallel.checkpoint`` (``_forward_mlp``): FC1 and FC2 (``layer_gemm_shapes``' last
        two), SwiGLU (``terms.swiglu_elements``) and its two sequence-parallel collectives (the
        all-gather before FC1, the reduce-scatter after FC2: ``terms.tp_block_time``'s
        forward; with --tp-comm-overlap what their userbuffers leave exposed and the SMs they take,
        ``userbuffers.mlp_forward_overlap_time``), its FP8 input casts besides; layernorm, the two
        RMSNorms (read and write h each) where they are modules of their own (--transformer-impl
        local; Transformer Engine's dense spec fuses them into the linear layers and Megatron
        recomputes nothing)."""
        modules, rates = self.options.recompute_modules, self.rates
        again = attention_forward if "core_attn" in modules else 0.0 * attention_forward
        comm = 0.0 * again
        if "mlp" in modules:
            gemm_rates = self.fp8.rates if self.fp8 else rates
            f = self.spec.ffn_hidden_size
            shapes = layer_gemm_shapes(self.spec, tokens, tp)[2:]  # FC1, FC2
            gemms = sum(terms.gemm_time(m, k, n, gemm_rates) for m, k, n in shapes)
            swiglu = terms.elementwise_time(
                terms.BF16 * terms.swiglu_elements(f, self.options.bias_swiglu_fusion) * tokens / _f(tp), rates)
            casts = levers.fp8_mlp_cast_bytes(self.spec.hidden_size, f, tokens, tp, self.fp8.casts)[0] if self.fp8 \
                else 0.0
            if self.options.tp_comm_overlap:  # the same userbuffers beside FC1 and FC2; their SMs slow FC2
                comm, slow = userbuffers.mlp_forward_overlap_time(self.spec, tokens, tp, gemm_rates, self.sms,
                                                                  self.options.userbuffers, self.tp_bytes,
                                                                  self.options.tp_overlaps)
            else:
                comm, slow = terms.tp_block_time(self.spec, tokens, tp, rates, self.tp_bytes)[0], 0.0
            again = again + gemms + slow + swiglu + terms.elementwise_time(casts, rates)
        if "layernorm" in modules and not self.options.fused_norms:
            again = again + terms.elementwise_time(terms.BF16 * 4 * self.spec.hidden_size * tokens / _f(tp), rates)
        return again, comm

    # --- one pipeline stage ------------------------------------------------------------------

    def stage(self, tp, cp, mbs, layers, embedding=False, head=False, recompute: Recompute = "none",
              recompute_layers=0, pipeline_cross_node=False, pipeline_parallel=True) -> StageTimes:
        """Per-microbatch time of one pipeline stage holding ``layers`` transformer layers,
        plus the embedding and/or the LM head and loss where ``embedding``/``head`` is true.

        Full recomputation re-runs the forward of ``recompute_layers`` of them during the
        backward pass; selective recomputation re-runs core attention (Korthikanti et al.
        2023). ``pipeline_parallel`` adds the boundary sends (one forward, one backward)."""
        spec, rates, s = self.spec, self.rates, self.seq_len
        layers, embedding, head = _f(layers), np.asarray(embedding, dtype=bool), np.asarray(head, dtype=bool)
        parts = self.layer_parts(tp, cp, mbs)
        tokens = _f(mbs) * s / _f(cp)
        # what the backward runs again, by part (the step's parts add up to its total)
        again_compute, again_tp, again_cp = 0.0, 0.0, 0.0
        if recompute == "full":
            rl = _f(recompute_layers)
            again_compute, again_tp, again_cp = rl * parts.compute_f, rl * parts.tp_f, rl * parts.cp_f
        elif recompute == "selective":
            again_compute, again_tp = (layers * x for x in self.recomputed_forward_parts(tp, tokens, parts.attention_f))
        extra_b = again_compute + again_tp + again_cp
        emb_f, emb_b = terms.embedding_time(spec, tokens, tp, rates)
        head_f, head_b = terms.lm_head_time(spec, tokens, tp, self.padded_vocab(tp), rates)
        end_f = np.where(embedding, emb_f, 0.0) + np.where(head, head_f, 0.0)
        end_b = np.where(embedding, emb_b, 0.0) + np.where(head, head_b, 0.0)
        p2p = terms.pipeline_p2p_time(spec, tokens, tp, pipeline_cross_node, rates)
        p2p = np.where(pipeline_parallel, p2p, 0.0)
        overhead = self.cal.microbatch_overhead_s + 0.0 * layers
        forward = layers * (parts.compute_f + parts.tp_f + parts.cp_f) + end_f + p2p + overhead / 2
        backward = layers * (parts.compute_b + parts.tp_b + parts.cp_b) + extra_b + end_b + p2p + overhead / 2
        return StageTimes(
            forward=forward,
            backward=backward,
            compute=layers * (parts.compute_f + parts.compute_b) + end_f + end_b + again_compute,
            tp_comm=layers * (parts.tp_f + parts.tp_b) + again_tp,
            cp_comm=layers * (parts.cp_f + parts.cp_b) + again_cp,
            pp_comm=2 * p2p,
            overhead=overhead,
        )

    # --- the iteration -----------------------------------------------------------------------

    def num_microbatches(self, mbs, dp) -> np.ndarray:
        return self.gbs / (_f(mbs) * _f(dp))

    def step(self, tp, cp, pp, dp, mbs, vpp=1, recompute: Recompute = "none", recompute_layers=None) -> StepTime:
        """The iteration time of an even split (L/pp layers per stage, the embedding on the
        first stage, the LM head on the last), 1F1B or, with ``vpp`` > 1, interleaved.

        ``recompute_layers`` (full recomputation) is per stage and defaults to all its layers
        (Megatron's 'uniform' method recomputes every layer)."""
        L = self.spec.num_layers
        layers = L / _f(pp)
        rl = layers if recompute_layers is None else _f(recompute_layers)
        first_last_apart = _f(pp) > 1
        cross = _f(tp) * _f(cp) * _f(dp) * _f(pp) > self.gpu.gpus_per_node
        common = dict(recompute=recompute, recompute_layers=rl, pipeline_cross_node=cross,
                      pipeline_parallel=first_last_apart)
        body = self.stage(tp, cp, mbs, layers, **common)
        first = self.stage(tp, cp, mbs, layers, embedding=True, head=~first_last_apart, **common)
        last = self.stage(tp, cp, mbs, layers, head=True, **common)
        p = _f(pp)
        # Sum and max over the stages: p - 2 middle ones, the first and the last (one when p = 1).
        def over_stages(field):
            one = getattr(first, field)
            return np.where(first_last_apart, one + getattr(last, field) + (p - 2) * getattr(body, field), one)
        total = over_stages("total")
        slowest = np.where(first_last_apart, np.maximum(first.total, last.total), first.total)
        fwd_first, bwd_first = first.forward, first.backward
        params = self._stage_parameters(tp, pp)
        return self._schedule(total, slowest, p, over_stages, tp, cp, pp, dp, mbs, vpp, fwd_first, bwd_first, params)

    def step_from_stages(self, stages: list[StageTimes], tp, cp, dp, mbs, vpp=1, parameters=None,
                         hiding: StageTimes | None = None) -> StepTime:
        """The iteration time of any split: ``stages`` lists each stage's ``StageTimes``
        (from ``stage``), in pipeline order; ``parameters`` is the largest stage's parameter
        count on one GPU (for the DP collectives and the optimizer), default the even split's;
        ``hiding``, where given, the first stage the DP overlap hides behind instead of
        ``stages[0]`` (a search's lower bound gives it the most layers any split could)."""
        return self.step_from_stage_arrays(_stacked(stages), tp, cp, dp, mbs, vpp, parameters=parameters,
                                           hiding=None if hiding is None else _stacked([hiding]))

    def step_from_stage_arrays(self, stages: StageTimes, tp, cp, dp, mbs, vpp=1, parameters=None,
                               hiding: StageTimes | None = None) -> StepTime:
        """``step_from_stages`` with the stages as one ``StageTimes`` of (K, PP) arrays, the pipeline
        order along the last axis (``hiding``'s first column the stage the DP overlap hides behind):
        the same sums in the same order, np.add.accumulate adding the stages one at a time as
        ``sum`` does over the list, in one call per part instead of one per stage (a sweep prices
        pipelines of up to 128 stages)."""
        pp = stages.forward.shape[-1]
        per_stage = stages.total

        def over_stages(field):
            return np.add.accumulate(getattr(stages, field), axis=-1)[..., -1]
        total = np.add.accumulate(per_stage, axis=-1)[..., -1]
        params = self._stage_parameters(tp, pp) if parameters is None else _f(parameters)
        first = stages if hiding is None else hiding
        return self._schedule(total, per_stage.max(axis=-1), float(pp), over_stages, tp, cp, pp, dp, mbs, vpp,
                              first.forward[..., 0], first.backward[..., 0], params)

    def _schedule(self, total, slowest, p, over_stages, tp, cp, pp, dp, mbs, vpp, fwd_first, bwd_first, params) -> StepTime:
        """1F1B with m microbatches over stages of per-microbatch times t_i: the slowest stage
        paces the steady state and the others fill and drain the pipe, T = m max t_i +
        (sum t_i - max t_i) / v; for equal stages the bubble is (p - 1)/(v m) of the work
        (Narayanan et al. 2021, Section 2.2; v = 1 is PipeDream-Flush's 1F1B)."""
        rates, opts = self.rates, self.options
        m = self.num_microbatches(mbs, dp)
        v = _f(vpp)
        pipeline = m * slowest + (total - slowest) / v
        busy = m * total / p
        shards = _f(dp) * _f(cp)
        span = _f(tp) * _f(cp) * _f(dp)
        per_node = terms.ranks_per_node(shards, _f(tp), rates.gpus_per_node)
        # every parameter over DP x CP, hidden behind the first stage's forward and backward
        dp_comm = data_parallel.exposed_time((data_parallel.DpGroup(params, shards, per_node),), span, rates, opts, m,
                                             fwd_first, bwd_first)
        # shown with the DP collectives: finalize_model_grads runs it right after them
        dp_comm = dp_comm + terms.tied_embedding_allreduce_time(
            self.spec, tp, cp, dp, pp, self.padded_vocab(tp), rates, opts.grad_reduce_bytes)
        optimizer = self._optimizer(params, shards)
        compute_bound = pipeline + dp_comm + optimizer
        total_s = terms.data_loader_bound(compute_bound, opts.dataloader_mask == "rebuilt", self.gbs / _f(dp),
                                          self.seq_len, rates, opts.dataloader_workers)
        share = m / p
        return StepTime(
            total_s=total_s,
            compute_s=share * over_stages("compute"),
            tp_comm_s=share * over_stages("tp_comm"),
            cp_comm_s=share * over_stages("cp_comm"),
            pp_comm_s=share * over_stages("pp_comm"),
            overhead_s=share * over_stages("overhead"),
            bubble_s=pipeline - busy,
            dp_comm_s=dp_comm,
            optimizer_s=optimizer,
            data_wait_s=total_s - compute_bound,
        )

    def _optimizer(self, params, shards):
        """The optimizer step on this rank's shard (``levers.optimizer_step_time``: on the GPU, or
        with the offloaded share on the host and the main-gradient buffer's zeroing on the GPU apart)."""
        return levers.optimizer_step_time(params, _f(shards), self.rates, self.options, self.host)

    def _stage_parameters(self, tp, pp):
        """Parameters on one GPU of the heaviest even stage: its layers plus the embedding or the
        LM head (seed 004, Eq. 6-9; the element count the DP collectives and Adam move), and the
        final norm's h, whole on every TP rank (as the layers' norms and Qwen3's Q and K norms), on
        the last stage (PP 1's only one), which the LM head makes the heavier end. Tied at PP 1 the head has no weight of its own
        (``stage_model.head_shares_embedding``; core_v0.15.2 models/gpt/gpt_model.py:
        skip_weight_param_allocation=pre_process and share_embeddings_and_output_weights)."""
        spec, t, p = self.spec, _f(tp), _f(pp)
        per_layer = eq.layer_parameters(spec, t)  # Eq. 6, with Qwen2's QKV biases and Qwen3's QK norms
        embedding = eq.embedding_parameters(spec, t, self.padded_vocab(tp))
        ends = np.where(p > 1, 1.0, 1.0 if spec.tie_embeddings else 2.0)
        return spec.num_layers / p * per_layer + embedding * ends + spec.hidden_size

    # --- what a user reads -----------------------------------------------------------------

    def padded_vocab(self, tp):
        """The rows Megatron builds at ``tp`` with the run's --make-vocab-size-divisible-by."""
        return eq.padded_vocab_size(self.spec.vocab_size, self.options.vocab_divisible_by, _f(tp))

    def flops_per_iteration(self, tp=1) -> np.ndarray:
        return megatron_flops_per_iteration(self.spec, self.seq_len, self.gbs, self.padded_vocab(tp),
                                            self.options.flops_convention)

    def throughput(self, step: StepTime, gpus, tp=1) -> dict[str, np.ndarray]:
        """TFLOP/s per GPU (Megatron's count), MFU, tokens/s for iterations of ``step``."""
        seconds = step.total_s
        tflops = self.flops_per_iteration(tp) / (seconds * _f(gpus)) / 1e12
        return {
            "step_time_s": seconds,
            "tflops_per_gpu": tflops,
            "mfu": tflops / self.gpu.bf16_dense_tflops,
            "tokens_per_s": self.gbs * self.seq_len / seconds,
        }
