"""The time of a forward-only iteration: what one iteration of Megatron-LM's evaluation costs.

Megatron-LM evaluates (``megatron/training/training.py``, ``evaluate``, core_v0.15.2 and
core_v0.19.0) by calling the training's own pipeline schedule (``get_forward_backward_func``)
with ``forward_only=True`` on one global batch: ``global_batch_size // (micro_batch_size x DP)``
microbatches (core_v0.19.0: ``--eval-global-batch-size`` and ``--eval-micro-batch-size``, which
default to the training's), under ``torch.no_grad()``. Against a training iteration it has

- no backward pass, and so no recomputation, no gradient reduction (the schedules call
  ``finalize_model_grads_func`` only ``if not forward_only``) and no optimizer step (``evaluate``
  never calls it);
- a pipeline of forwards alone (megatron-core ``pipeline_parallel/schedules.py``: without
  interleaving, ``forward_backward_pipelining_without_interleaving``'s steady loop, ``if
  forward_only``, sends each output forward and receives the next input, with no backward between;
  interleaved, ``get_pp_rank_microbatches`` makes every microbatch a warm-up forward): the m
  microbatches go forward through the p stages one after another:
  stage i starts microbatch j once stage i - 1 has sent it and stage i has finished microbatch
  j - 1. With per-microbatch forward times f_i (a stage's layers, its embedding or LM head and
  loss, its boundary send), the last stage ends microbatch m at

      T = sum_i f_i + (m - 1) max_i f_i  =  m max_i f_i + (sum_i f_i - max_i f_i)

  (a flow shop of identical jobs: the slowest stage paces m microbatches, the others fill the
  pipe once; there is no drain, since no backward comes back). With v virtual stages per rank
  (interleaving) a chunk is 1/v of a stage, and the fill is (sum f_i - max f_i) / v, as the
  training schedule's own (``TimeModel._schedule``, Narayanan et al. 2021, Section 2.2) with the
  backward taken out. It cannot beat the data loader, which feeds evaluation as it feeds training.
"""

from __future__ import annotations

from typing import Sequence


def forward_only_pipeline_s(stage_forward_s: Sequence[float], num_microbatches: float, vpp: int = 1) -> float:
    """Seconds of one forward-only pipeline iteration (see the module docstring):
    m max f + (sum f - max f) / v, for ``stage_forward_s`` (one forward per microbatch on each
    pipeline stage, in pipeline order), m = ``num_microbatches`` and v = ``vpp``."""
    if not stage_forward_s or num_microbatches < 1 or vpp < 1:
        raise ValueError("a forward-only pipeline needs stages, at least one microbatch and vpp >= 1")
    slowest, total = max(stage_forward_s), sum(stage_forward_s)
    return num_microbatches * slowest + (total - slowest) / vpp
