"""DeepSeek-V3's multi-token prediction (--mtp-num-layers D) in memory and time, per GPU.

megatron-core builds every MTP layer on the last pipeline stage, in its last virtual chunk
(``transformer/multi_token_prediction.py``, ``get_mtp_num_layers_to_build``). The MTP layer
(``MultiTokenPredictionLayer``): the next tokens' embedding through the model's own embedding
(``_get_embeddings``: ``roll_tensor`` of the ids, then ``embedding(...)``), ``enorm`` of it and
``hnorm`` of the main model's output, their concatenation [s, b, 2h] through ``eh_proj`` (a
column-parallel 2h x h linear), one transformer layer (the model's MoE layer), its
``final_layernorm``, and the shared output layer with its own cross-entropy
(``models/gpt/gpt_model.py``, ``_postprocess``: ``output_layer(hidden_states_list[k + 1])`` and
``compute_language_model_loss`` per MTP layer). Because the stage that runs MTP needs the
embedding, ``GPTModel.__init__`` builds a ``LanguageModelEmbedding`` on it
(``if self.pre_process or self.mtp_process``): with PP > 1 the last stage holds its own copy
of the word embeddings (tied to the first stage's, ``tie_word_embeddings_state_dict``).
"""

from __future__ import annotations

import numpy as np

from advisor import equations as eq
from advisor import memory_terms
from advisor.moe import memory as mm
from advisor.moe import params
from advisor.moe.spec import MoESpec


def own_parameters(spec: MoESpec, tp) -> float:
    """One MTP layer's parameters beside its transformer layer, on one GPU: enorm, hnorm and the
    final norm (h each, replicated), eh_proj (2h x h, split over t: ``ColumnParallelLinear``)."""
    h = spec.hidden_size
    return 3 * h + 2 * h * h / np.asarray(tp, dtype=float)


def dense_parameters(spec: MoESpec, tp) -> float:
    """One MTP layer's parameters sharded like dense ones, on one GPU: ``own_parameters`` and its
    transformer layer's attention, norms, router and shared experts
    (``params.moe_layer_dense_parameters``)."""
    return own_parameters(spec, tp) + params.moe_layer_dense_parameters(spec, tp)


def embedding_copy_parameters(spec: MoESpec, tp, pp, vocab) -> float:
    """The word embeddings the last stage builds for MTP when it is not also the first (PP > 1):
    v h / t (``GPTModel.__init__``, ``mtp_process``); with PP 1 the one embedding serves both."""
    return np.where(np.asarray(pp) > 1, eq.embedding_parameters(spec, tp, vocab), 0.0)


def activation_bytes(spec: MoESpec, seq_len: int, mbs, tp, cp, vocab, moe_layer_bytes, fusion: str = "none"):
    """(layer, embedding, output) bytes one MTP layer keeps for one microbatch, in the buckets of
    the stage's other activations (the calibrated model corrects each bucket as for the main
    model): layer: its transformer layer (``moe_layer_bytes``, the MoE layer's term), the
    enorm input (the embedding's output, 2h per token) and eh_proj's input (the concatenation,
    4h per token; with sequence parallelism Transformer Engine saves it before the all-gather),
    sequence-parallel over t c; the hnorm input is the main model's final output, already kept
    by its output layer. Embedding: the rolled token ids (Eq. 13's term, as the first stage's).
    Output: Eq. 14 for the MTP's final norm and output layer and the logits its loss keeps
    (``memory_terms.loss_logits_bytes``: FP32, or BF16 with ``fusion`` te)."""
    t, c = np.asarray(tp, dtype=float), np.asarray(cp, dtype=float)
    tokens = seq_len * np.asarray(mbs, dtype=float)
    layer = moe_layer_bytes + mm.BF16 * tokens * spec.hidden_size * 3 / (t * c)
    embedding = eq.embedding_activation_bytes(spec, seq_len, mbs) / (t * c)
    output = (eq.output_hidden_activation_bytes(spec, seq_len, mbs)
              + memory_terms.loss_logits_bytes(spec, seq_len, mbs, vocab, fusion)) / (t * c)
    return layer, embedding, output


def checkpoint_bytes(spec: MoESpec, seq_len: int, mbs, tp, cp):
    """What one MTP layer keeps per microbatch under full recomputation: Megatron checkpoints
    ``_proj_and_transformer_layer`` (enorm, hnorm, eh_proj and the transformer layer) with
    ``recompute_method`` uniform and 1 layer (``MultiTokenPredictionLayer.forward`` and
    ``_checkpointed_forward``, core_v0.15.2 multi_token_prediction.py:632-647; block skips the
    recomputation with a warning, a case the advisor does not price), so it keeps the
    checkpoint's inputs: the next tokens' embedding (2h per token, sequence-parallel over t c)
    and the main model's output, which its output layer keeps already."""
    return mm.BF16 * seq_len * np.asarray(mbs, dtype=float) * spec.hidden_size / (np.asarray(tp, dtype=float)
                                                                                 * np.asarray(cp, dtype=float))


def extra_time(spec: MoESpec, tokens_cp, tp, moe_layer_s, head_s, embedding_s, gemm):
    """Seconds one MTP layer adds to the last stage per microbatch, forward and backward: its
    MoE layer (``moe_layer_s``, forward plus backward as the stage prices a layer), eh_proj
    ([tokens, 2h] x [2h, h/t]: ``gemm(m, k, n)`` forward, twice that backward), the embedding
    lookup (``embedding_s``) and the output layer with its cross-entropy (``head_s``)."""
    eh = gemm(tokens_cp, 2 * spec.hidden_size, spec.hidden_size / np.asarray(tp, dtype=float))
    return moe_layer_s + 3 * eh + head_s + embedding_s
