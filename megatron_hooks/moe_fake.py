"""What megatron-core's MoE layers need to run on fake tensors: the routing's data-dependent sizes.

A dropless MoE layer (``transformer/moe/``) routes each token to its top-k experts, then sizes
two things by the routing's values, which fake tensors do not have:

- the permutation (``moe_utils.permute``; the allgather dispatcher's ``dispatch_postprocess``)
  selects the routed token copies with ``masked_select`` over the routing map. Top-k routing
  sets exactly k entries of each token's row, so the selection of a map over all E experts has
  N k elements whatever the scores: the stand-in returns that many, and saves for the backward
  pass what aten's ``masked_select`` saves (its input and the mask; ``derivatives.yaml``:
  ``masked_select_backward(grad, self, mask)``). Exact, no assumption.
- the split of those N k copies among the experts (``SequentialMLP.forward``:
  ``tokens_per_expert.tolist()``) depends on which experts the scores pick. Under fake tensors
  the split is the *balanced* one (N k / E each, the remainder to the first experts), the
  routing assumption ``advisor.moe.memory.RoutedTokens(routing="balanced")`` prices; the
  sum, and so every byte that does not depend on the split, is exact.

megatron-core 0.16.1 also refers to ``te_general_gemm`` in its router's GEMM
(``moe_utils.RouterGatingLinearFunction``) where Transformer Engine did not import and the name
was never bound; the context binds it to None, megatron's own fallback (``torch.mm`` in the
router dtype). And megatron-core's fused SwiGLU with the routing probabilities
(``fusions/fused_bias_swiglu.py``, ``weighted_swiglu``) is ``torch.compile``d, and inductor's
compiled kernel crashes the process on fake tensors: torch.compile is off inside the context,
so the same Python runs eagerly (``WeightedSwiGLUFunction`` saves its input and the
probabilities either way).

Only at EP 1 (all E experts on this rank), the allgather dispatcher, and without token dropping
(``moe_expert_capacity_factor`` None): there the selections cover all E experts. Everything is
undone on exit.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensor


class _MaskedSelect(torch.autograd.Function):
    """``masked_select`` with a known output size; saves input and mask, as aten's does."""

    @staticmethod
    def forward(ctx, values: torch.Tensor, mask: torch.Tensor, count: int) -> torch.Tensor:
        ctx.save_for_backward(values, mask)
        return values.new_empty(count)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        values, _ = ctx.saved_tensors
        # aten's masked_select_backward: a zero tensor of the input's shape, scattered into.
        return grad.new_zeros(values.shape), None, None


def balanced_split(copies: int, experts: int) -> list[int]:
    """N k token copies over E experts as evenly as possible, the remainder to the first ones.

    >>> balanced_split(10, 4)
    [3, 3, 2, 2]
    """
    share, extra = divmod(copies, experts)
    return [share + (expert < extra) for expert in range(experts)]


@contextlib.contextmanager
def fake_routing(num_experts: int, topk: int) -> Iterator[None]:
    """megatron-core's dropless top-``topk`` routing over ``num_experts`` experts on fake
    tensors (module docstring)."""
    from megatron.core.transformer.moe import experts, moe_utils

    select = torch.Tensor.masked_select
    sequential_forward = experts.SequentialMLP.forward

    def masked_select(self, mask):
        if not isinstance(mask, FakeTensor) or mask.dtype != torch.bool:
            return select(self, mask)
        if mask.numel() % num_experts:
            raise RuntimeError(f"a routing mask of {tuple(mask.shape)} does not cover {num_experts} experts")
        values = self.expand_as(mask) if self.shape != mask.shape else self
        return _MaskedSelect.apply(values, mask, mask.numel() // num_experts * topk)

    def forward(self, hidden, tokens_per_expert, probs):
        if isinstance(tokens_per_expert, FakeTensor):
            with torch._subclasses.fake_tensor.unset_fake_temporarily():
                tokens_per_expert = torch.tensor(balanced_split(hidden.shape[0], self.num_local_experts))
        return sequential_forward(self, hidden, tokens_per_expert, probs)

    unbound = not hasattr(moe_utils, "te_general_gemm")
    torch.Tensor.masked_select = masked_select
    experts.SequentialMLP.forward = forward
    if unbound:
        moe_utils.te_general_gemm = None
    try:
        with torch._dynamo.config.patch(disable=True):
            yield
    finally:
        if unbound:
            del moe_utils.te_general_gemm
        torch.Tensor.masked_select = select
        experts.SequentialMLP.forward = sequential_forward
