"""Why a measured term differs from seed 004's: the known, documented reasons, read from a run's header.

``advisor profile show --section compare`` divides each measured term by the 4D paper's equation
for the run (``profile_report.compare_rank``). Some ratios are far from 1 for reasons that are
known and checked elsewhere in this project; this module names them, per term, from what the
rank file's header says (dtype, backend, kernels, layer spec, layout, recomputation), and where a
hand count exists, the bytes it predicts. Each reason holds where its condition holds, whatever
the numbers; each hand count is one that a test checks against real megatron-core to the byte
(cited with it), so the expected ratio beside the measured one says whether the reason is the
whole difference.
"""

from __future__ import annotations

from dataclasses import dataclass

from advisor import memory_terms, releases
from advisor.profiles import LayerRecord, RankProfile


@dataclass(frozen=True, kw_only=True, slots=True)
class Reason:
    """One known difference between what a run keeps and what seed 004 counts."""

    key: str
    text: str
    """What differs and why, one sentence (the table's note)."""
    source: str
    """Where the behaviour is, or where it is measured (megatron-core file, project test)."""

    def to_dict(self) -> dict:
        return {"key": self.key, "text": self.text, "source": self.source}


@dataclass(frozen=True, slots=True)
class Explained:
    """The reasons that apply to one compared term, and the bytes they predict (None: no hand
    count for this case, the reasons are said without a number)."""

    reasons: tuple[Reason, ...] = ()
    expected_bytes: float | None = None


NONE = Explained()

FP32_OPTIMIZER = Reason(
    key="fp32-optimizer",
    text="FP32 weights need no FP32 master copy: Adam keeps its two FP32 moments, 8 of Eq. 10's 12 bytes "
         "per parameter (8/12 = 0.667)",
    source="megatron-core optimizer/__init__.py (FP32Optimizer without --bf16/--fp16), "
           "optimizer/distrib_optimizer.py (FP32 parameters: shard_fp32_groups are views of the weights)",
)
EMULATOR_OPTIMIZER = Reason(
    key="emulator-optimizer",
    text="the CPU emulator steps torch's Adam on gradients in the weights' dtype: gradients of {e} bytes "
         "and two moments of {e} bytes per parameter, against Eq. 4's 4 and Eq. 10's 12 ({e}/4 = {grads:.3f}, "
         "{states}/12 = {optimizer:.3f})",
    source="megatron_hooks/stage_emulation.py (torch.optim.Adam, gradients zeros_like(param)); "
           "megatron_hooks/README.md",
)
TOKEN_IDS = Reason(
    key="token-ids",
    text="megatron-core's embedding keeps the int64 token ids, 8 s b bytes (and a bool mask, s b, at TP > 1), "
         "split over CP, where Eq. 13 counts 8 s b h; the calibrated model counts the ids too",
    source="memory_terms.embedding_ids_fraction; Megatron-LM theoretical_memory_usage.py; "
           "tests/test_hooks.py::test_activation_bytes_match_a_hand_count; docs/profiling.md (symbolic)",
)
CPU_KERNELS = Reason(
    key="cpu-kernels",
    text="torch's CPU kernels with the local spec: RMSNorm keeps FP32 copies of its input and x*rsqrt, "
         "RoPE keeps cos and sin, the stage's first layer the causal mask (the estimate already has the local "
         "spec's s x s scores and K and V expanded to every head)",
    source="megatron_hooks/README.md ('What the local layer spec keeps'); "
           "tests/test_hooks.py::hand_count_layer",
)
UNFUSED_SWIGLU = Reason(
    key="unfused-swiglu",
    text="the SwiGLU ran unfused (Megatron-LM with --no-bias-swiglu-fusion, or the CPU emulator, as the run's "
         "header records): FC1's output, x_linear + offset, SiLU's output and FC2's input, 5 s b h_ffn "
         "elements, which the estimate prices (Eq. 12's 4 and the fifth, 2 s b h_ffn bytes in BF16)",
    source="megatron-core transformer/mlp.py (MLP.forward's glu); equations.unfused_swiglu_bytes; "
           "megatron_hooks/README.md ('What the local layer spec keeps'); tests/test_hooks.py::hand_count_layer; "
           "tests/test_launch_run.py",
)
UNRECORDED_UNFUSED_SWIGLU = Reason(
    key="unfused-swiglu-unrecorded",
    text="the CPU emulator's SwiGLU ran unfused, which its file (before version 4) does not record, so the "
         "estimate counts Eq. 12's 4 h_ffn elements: FC1's output, x_linear + offset, SiLU's output and FC2's "
         "input keep 5 s b h_ffn",
    source="megatron_hooks/model.py (bias_activation_fusion off); megatron-core transformer/mlp.py "
           "(MLP.forward's glu); tests/test_hooks.py::hand_count_layer",
)
FUSED_SWIGLU = Reason(
    key="fused-swiglu",
    text="Megatron-LM's SwiGLU fusion (--bias-swiglu-fusion, its default) keeps only its input and FC2's, "
         "3 s b h_ffn elements where Eq. 12 counts 4 (the calibrated model's correction: {share:.3f} of Eq. 12)",
    source="megatron-core fusions/fused_bias_swiglu.py; memory_terms.swiglu_fusion_fraction; "
           "tests/test_launch_run.py (a real core_v0.15.2 run on the CPU)",
)
PER_LAYER_MASK = Reason(
    key="per-layer-mask",
    text="megatron-core {version} builds the s x s bool causal mask again in every layer's softmax when "
         "the data loader gives none (--no-create-attention-mask-in-dataloader, advisor-launch's default), "
         "and each layer's masked_fill keeps its own copy: s^2 bytes in every layer, not only the stage's "
         "first (core_v0.15.2 cached the mask)",
    source="megatron-core transformer/utils.py get_default_causal_mask (@lru_cache in core_v0.15.2, none in "
           "0.16.1 and core_v0.19.0), called from fusions/fused_softmax.py forward_torch_softmax; "
           "tests/test_launch_run.py (real core_v0.15.2 and core_v0.19.0 runs on the CPU)",
)
CPU_OUTPUT = Reason(
    key="cpu-output",
    text="torch's CPU RMSNorm keeps FP32 copies of the final norm's input and x*rsqrt; the cross-entropy "
         "its bool target mask and int64 masked targets",
    source="megatron_hooks/README.md ('What the local layer spec keeps'); "
           "tests/test_hooks.py::test_activation_bytes_match_a_hand_count",
)
TE_LAYER = Reason(
    key="te-layer",
    text="Transformer Engine spec: the fused SwiGLU keeps 6 s b h_ffn of Eq. 12's 8 (all the calibrated "
         "model corrects: {share:.3f} of Eq. 12), V keeps the whole QKV output alive, plus FP32 softmax "
         "statistics and norm rstd, and the stage's first layer RoPE's FP32 frequencies",
    source="docs/profiling.md (symbolic backend, term by term); memory_terms.swiglu_fusion_fraction; "
           "tests/test_symbolic.py::hand_count_te_layer",
)

LOCAL_BUFFER = Reason(
    key="local-buffer",
    text="the estimate adds to Eq. 18 megatron-core's global memory buffer, which the local spec's attention "
         "keeps from its first forward on: its score product's input, b a/t s^2 elements of the activations' "
         "dtype, once per stage, in no module's activations",
    source="megatron-core transformer/dot_product_attention.py (get_global_memory_buffer().get_tensor), "
           "utils.py GlobalMemoryBuffer; equations.local_attention_buffer_bytes; tests/test_emulate.py",
)


def _emulator_optimizer(profile: RankProfile) -> bool:
    """The CPU backend's emulated stages always step torch's Adam on plain gradients
    (stage_emulation.py refuses megatron-core's optimizer on the CPU backend)."""
    return profile.header.backend == "cpu" and profile.header.emulated


def explain_static(profile: RankProfile, term: str, estimated: float) -> Explained:
    """Reasons for a stage's gradients or optimizer term."""
    e = profile.element_bytes
    if _emulator_optimizer(profile):
        reason = Reason(key=EMULATOR_OPTIMIZER.key, source=EMULATOR_OPTIMIZER.source,
                        text=EMULATOR_OPTIMIZER.text.format(e=e, grads=e / 4, states=2 * e, optimizer=2 * e / 12))
        if term == "optimizer":  # Adam's exp_avg and exp_avg_sq (its 4-byte step per tensor aside)
            return Explained((reason,), estimated * 2 * e / 12)
        if term == "gradients" and e != 4:
            return Explained((reason,), estimated * e / 4)
        return NONE
    if term == "optimizer" and profile.header.params_dtype == "float32":
        return Explained((FP32_OPTIMIZER,), estimated * 8 / 12)
    return NONE


def explain_peak(profile: RankProfile) -> Explained:
    """Reasons for a stage's peak: what the estimate adds to Eq. 18 (no hand count of the rest).
    The buffer only where the stage holds layers: their attention asks for it, and a stage of the
    embedding or the LM head alone is priced without it (``StageModel.layer_activations``)."""
    h = profile.header
    return Explained((LOCAL_BUFFER,)) if h.layer_spec == "local" and h.stage_layers else NONE


def explain_module(profile: RankProfile, record: LayerRecord) -> Explained:
    """Reasons for one module's activations (kept for backward by one microbatch)."""
    h = profile.header
    if record.kind == "embedding":
        p = h.parallel
        ids = 8 * h.seq_len * p.mbs + (h.seq_len * p.mbs if p.tp > 1 else 0)
        return Explained((TOKEN_IDS,), ids / p.cp)
    if h.recompute != "none":
        return NONE  # the hand counts below are of layers that keep everything
    if h.kernels == "cpu" and h.layer_spec == "local":
        single = h.parallel.tp == 1 and h.parallel.cp == 1 and _llama_heads(h.model)  # what the counts were made for
        if record.kind == "decoder":
            first = record.layer_number == min(h.stage_layers)
            fused = _swiglu_fused(h)
            swiglu = () if fused is None else (_swiglu_reason(h, fused),)
            per_layer = _mask_per_layer(h)
            reasons = (CPU_KERNELS, *swiglu) + ((_versioned(PER_LAYER_MASK, h),) if per_layer else ())
            counted = single and per_layer is not None and fused is not None
            mask = first or bool(per_layer)
            return Explained(reasons, _cpu_layer_bytes(profile, mask, fused) if counted else None)
        return Explained((CPU_OUTPUT,), _cpu_output_bytes(profile) if single else None)
    if record.kind == "decoder" and h.kernels == "cuda" and h.layer_spec == "transformer_engine" \
            and h.params_dtype == "bfloat16":
        reason = _formatted(TE_LAYER, h)
        # the hand count splits every tensor over t
        counted = (h.parallel.tp == 1 or h.sequence_parallel) and _llama_heads(h.model)
        first = record.layer_number == min(h.stage_layers)
        return Explained((reason,), _te_layer_bytes(profile, first) if counted else None)
    return NONE


def _llama_heads(model) -> bool:
    """The hand counts' attention: a d = h (Q and the context sb x h) and no Q/K norms (Qwen3's
    keep more: equations.qk_norm_activation_bytes). Other models get the reasons, not a number."""
    return model.query_size == model.hidden_size and not model.qk_layernorm


def _swiglu_fused(header) -> bool | None:
    """Whether the run's SwiGLU was fused (the header's swiglu_fusion, v4); before v4 an emulated
    stage's was not (megatron_hooks.model turns bias_activation_fusion off), and a real run's is
    unknown (Megatron-LM fuses it unless --no-bias-swiglu-fusion: 3 s b h_ffn elements or 5)."""
    if header.swiglu_fusion is not None:
        return header.swiglu_fusion
    return False if header.emulated else None


def _swiglu_reason(header, fused: bool) -> Reason:
    """The SwiGLU's reason: fused, or unfused and priced (the header records it, and
    ``profile_report.run_options`` prices what it records), or an emulated stage's before v4,
    unfused but priced fused (its file does not say)."""
    if fused:
        return _formatted(FUSED_SWIGLU, header)
    return UNFUSED_SWIGLU if header.swiglu_fusion is False else UNRECORDED_UNFUSED_SWIGLU


def _mask_per_layer(header) -> bool | None:
    """Whether every layer of a real Megatron-LM run keeps its own causal mask (None: a version
    this cannot read). The emulators pass one mask to every layer (megatron_hooks.model.causal_mask),
    so do runs whose data loader builds it; a run without it gets megatron-core's default mask in
    each layer's softmax, one per layer where its release builds it per call
    (``releases.default_causal_mask_per_call``), else one for the process, kept by the stage's
    first layer. The header does not record whether the data loader made the mask: this is the
    count of advisor-launch's default, which turns it off."""
    if header.emulated:
        return False
    return releases.default_causal_mask_per_call(header.megatron_core_version)


def _versioned(reason: Reason, header) -> Reason:
    return Reason(key=reason.key, text=reason.text.format(version=header.megatron_core_version), source=reason.source)


def _formatted(reason: Reason, header) -> Reason:
    """``reason`` with the calibrated model's SwiGLU share of Eq. 12 for this model in its text."""
    share = memory_terms.swiglu_fusion_fraction(header.model)
    return Reason(key=reason.key, text=reason.text.format(share=share), source=reason.source)


def _cpu_layer_bytes(profile: RankProfile, holds_mask: bool, fused_swiglu: bool) -> float:
    """One local-spec layer on torch's CPU kernels, TP = CP = 1 (megatron_hooks/README.md's table;
    FP32: tests/test_hooks.py::hand_count_layer, equal to real megatron-core to the byte; BF16 the
    same tensors, the norms' copies in FP32, the scores as below). The unfused SwiGLU (the
    emulator's; Megatron-LM's with --no-bias-swiglu-fusion) keeps 5 s b h_ffn elements;
    Megatron-LM's fused one 3 (its input, 2 h_ffn, and FC2's)."""
    h = profile.header
    s, b, hidden, a, ffn = h.seq_len, h.parallel.mbs, h.model.hidden_size, h.model.num_attention_heads, \
        h.model.ffn_hidden_size
    d = h.model.head_dim
    mask = s * s if holds_mask else 0  # bool; one shared by every layer counts in the stage's first (_mask_per_layer)
    swiglu = 3 if fused_swiglu else 5
    if profile.element_bytes == 4:
        # 2 norms x (input, x*rsqrt, output) + Q + K, V expanded + context = 10 sbh; rsqrt 2 sb;
        # RoPE cos, sin for Q and K 4 sd; FP32 softmax a b s^2; SwiGLU 5 sb h_ffn
        elements = 10 * s * b * hidden + 2 * s * b + 4 * s * d + a * b * s * s + swiglu * s * b * ffn
        return 4 * elements + mask
    sbh = s * b * hidden
    # the scores: torch's BF16 softmax output alone, 2 a b s^2, in the emulator and in real
    # Megatron-LM runs alike (--attention-softmax-in-fp32 off in both: fusions/fused_softmax.py
    # forward_torch_softmax makes no FP32 copy). The "FP32 copy" once counted for real runs was
    # the unfused SwiGLU's 4 s b h_ffn bytes, counted as fused: the tests' launches pass
    # --no-bias-swiglu-fusion, and their shape has h_ffn = a s (128 = 4 x 32)
    return (8 * sbh + 8 * sbh + 8 * s * b  # norm inputs and x*rsqrt in FP32, rsqrt
            + 4 * sbh + 2 * sbh + 4 * sbh + 2 * sbh  # norm outputs (linear inputs), Q, K and V expanded, context
            + 8 * s * d + 2 * a * b * s * s + 2 * swiglu * s * b * ffn + mask)  # cos/sin, BF16 scores


def _cpu_output_bytes(profile: RankProfile) -> float:
    """The final norm, output layer and cross-entropy on torch's CPU kernels, TP 1
    (tests/test_hooks.py: FP32 (3 sbh + sb + sbv) x 4 + sb + 8 sb): the norm's input, x*rsqrt and
    output, its rstd, the FP32 logits, the bool target mask and the int64 masked targets."""
    h = profile.header
    s, b, hidden, v = h.seq_len, h.parallel.mbs, h.model.hidden_size, h.model.vocab_size
    e = profile.element_bytes
    norm = 4 * s * b * hidden * 2 + e * s * b * hidden + 4 * s * b  # FP32 input and x*rsqrt, output, rstd
    return norm + 4 * s * b * v + s * b + 8 * s * b


def _te_layer_bytes(profile: RankProfile, first_layer: bool) -> float:
    """A BF16 TE-spec layer, in units of s b h / (t c) bytes (docs/profiling.md's table, equal to
    the symbolic profiles of Llama-3.1-8B, 70B and 405B to 32 bytes, their RNG state):
    14 + 6k/a + 6f/h + (8 + 4a)/h; with CP > 1 TE's ring copies V, 12 + 4k/a + 6f/h + (8 + 4a)/h.
    The stage's first layer also keeps RoPE's FP32 frequencies, 4 s d / c."""
    h = profile.header
    m, p = h.model, h.parallel
    k_a, f_h, a = m.num_query_groups / m.num_attention_heads, m.ffn_hidden_size / m.hidden_size, m.num_attention_heads
    units = (14 + 6 * k_a if p.cp == 1 else 12 + 4 * k_a) + 6 * f_h + (8 + 4 * a) / m.hidden_size
    rope = 4 * h.seq_len * m.head_dim / p.cp if first_layer else 0
    return units * h.seq_len * p.mbs * m.hidden_size / (p.tp * p.cp) + rope
