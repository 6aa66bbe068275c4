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

megatron-core (0.15.2 and 0.16.1) also refers to ``te_general_gemm`` in its router's GEMM
(``moe_utils.RouterGatingLinearFunction``) where Transformer Engine did not import and the name
was never bound; the context binds it to None, megatron's own fallback (``torch.mm`` in the
router dtype). And megatron-core's fused SwiGLU with the routing probabilities
(``fusions/fused_bias_swiglu.py``, ``weighted_swiglu``) is ``torch.compile``d, and inductor's
compiled kernel crashes the process on fake tensors: torch.compile is off inside the context,
so the same Python runs eagerly (``WeightedSwiGLUFunction`` saves its input and the
probabilities either way). These two alone are ``moe_without_te``, which the CUDA backend's
real tensors need (and nothing else here).

The alltoall dispatcher (``MoEAlltoAllTokenDispatcher``) also sizes its all-to-all and its
sort of the received chunks by the routing's counts, copied to the host on a CUDA side stream:
``fake_routing`` gives it the balanced counts as host values (``_alltoall_preprocess``), no side
stream, and its chunk orders as host arrays. With EP > 1 (torch's fake process group, a world
of EP ranks of which this process is rank 0) the all-to-all moves no data and returns the
received shapes; with ETP > 1 the all-gather over the expert TP group likewise.

Token dropping padded to capacity (``moe_expert_capacity_factor`` with
``moe_pad_expert_input_to_capacity``) needs no routing value: every expert gets its capacity
(``moe_utils.get_capacity``), and the router's capacity mask has exactly that many entries in
each expert's column. With the alltoall dispatcher the permutation
(``permute(drop_and_pad=True)``: argsort and index_select) has static sizes, and the
dispatcher's own ``preprocess`` runs, its host-side counts as real tensors; with the allgather
dispatcher the ``masked_select`` stand-in selects the capacity's copies (``selected_copies``).
Token dropping without padding (sizes that depend on which tokens drop) is not stood in for.
Everything is undone on exit.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import numpy
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


def selected_copies(mask: torch.Tensor, num_experts: int, topk: int, capacity_factor: float | None = None) -> int:
    """The token copies ``masked_select`` takes with a routing mask over experts (``mask.numel()``
    entries, a whole number of tokens times ``num_experts`` whatever columns it keeps): k per
    token (top-k sets k entries of each token's row); padded to capacity, each expert's column
    holds its capacity C = ceil(N k f / E) of every N routed tokens (``moe_utils.get_capacity``,
    ``apply_router_token_dropping``: the map is the capacity mask), k f per token where N k f / E
    is whole, the only case stood in for (the ceil would need N, which the mask does not say)."""
    if mask.numel() % num_experts:
        raise RuntimeError(f"a routing mask of {tuple(mask.shape)} does not cover {num_experts} experts")
    if capacity_factor is None:
        return mask.numel() // num_experts * topk
    copies = mask.numel() * topk * capacity_factor / num_experts
    if not float(copies).is_integer():
        raise RuntimeError(f"capacity factor {capacity_factor}: a routing mask of {tuple(mask.shape)} over "
                           f"{num_experts} experts selects {copies} copies, not whole (the capacity's ceil is "
                           "not stood in for)")
    return int(copies)


def balanced_split(copies: int, experts: int) -> list[int]:
    """N k token copies over E experts as evenly as possible, the remainder to the first ones.

    >>> balanced_split(10, 4)
    [3, 3, 2, 2]
    """
    share, extra = divmod(copies, experts)
    return [share + (expert < extra) for expert in range(experts)]


def _alltoall_preprocess(self, routing_map: torch.Tensor):
    """``MoEAlltoAllTokenDispatcher.preprocess`` under balanced dropless routing, with the values
    its device-to-host copies would bring (``_maybe_dtoh_and_synchronize``): each of the TP x EP
    ranks sends ``balanced_split(N k, E)`` copies to the E experts, so this rank sends the sums
    over each EP rank's experts (input splits), receives its local experts' share from each
    peer (output splits), and its experts get TP x EP times their share."""
    per_expert = balanced_split(routing_map.size(0) * self.config.moe_router_topk, self.num_experts)
    first = self.local_expert_indices[0]
    return set_alltoall_splits(self, per_expert, per_expert[first:first + self.num_local_experts])


def set_alltoall_splits(dispatcher, per_expert: list[int], mine: list[int]) -> torch.Tensor:
    """The alltoall dispatcher's host-side splits where this rank sends ``per_expert`` copies to
    the E experts and each of the TP x EP ranks sends ``mine`` to its local experts; returns the
    tokens per local expert, as ``preprocess`` does (also a test's worst-case dropless routing)."""
    tp, ep, local = dispatcher.tp_size, dispatcher.ep_size, dispatcher.num_local_experts
    dispatcher.num_out_tokens = sum(per_expert)
    # Host values, as after the copies (numpy, as ``maybe_move_tensor_to_cpu(as_numpy=True)``).
    dispatcher.input_splits = numpy.array([sum(per_expert[r * local:(r + 1) * local]) for r in range(ep)])
    dispatcher.output_splits = numpy.array([sum(mine)] * ep)
    dispatcher.output_splits_tp = numpy.array([sum(mine) * ep] * tp)
    dispatcher.num_global_tokens_per_local_expert = numpy.array([mine] * (tp * ep))
    with torch._subclasses.fake_tensor.unset_fake_temporarily():
        return torch.tensor([count * tp * ep for count in mine])


def _capacity_or_balanced(preprocess):
    """The dispatcher's own ``preprocess`` on real tensors (the CPU backend) and when it pads to
    capacity (sizes of the layout only; its count tensors made real, as host values), else the
    balanced one."""
    def choose(self, routing_map: torch.Tensor):
        if not isinstance(routing_map, FakeTensor):
            return preprocess(self, routing_map)
        if self.drop_and_pad:
            with torch._subclasses.fake_tensor.unset_fake_temporarily():
                return preprocess(self, routing_map)
        return _alltoall_preprocess(self, routing_map)
    return choose


def _alltoall_index_tensors(init):
    """The dispatcher's chunk orders (``torch.arange`` at construction, read with ``tolist()`` by
    ``sort_chunks_by_idxs``) as real tensors: constants of the layout, not of the routing."""
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        chunks = numpy.arange(self.num_experts * self.tp_size)
        self.sort_input_by_local_experts = chunks.reshape(-1, self.num_local_experts).T.ravel()
        self.restore_output_by_local_experts = chunks.reshape(self.num_local_experts, -1).T.ravel()
    return __init__


@contextlib.contextmanager
def fake_routing(num_experts: int, topk: int, capacity_factor: float | None = None) -> Iterator[None]:
    """megatron-core's dropless top-``topk`` routing over ``num_experts`` experts on fake
    tensors, or with ``capacity_factor`` padded to capacity (module docstring)."""
    from megatron.core.transformer.moe import experts
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher as AllToAll

    select = torch.Tensor.masked_select
    sequential_forward = experts.SequentialMLP.forward
    alltoall = {name: AllToAll.__dict__[name] for name in
                ("__init__", "preprocess", "_maybe_dtoh_and_synchronize", "cuda_dtoh_stream")}

    def masked_select(self, mask):
        if not isinstance(mask, FakeTensor) or mask.dtype != torch.bool:
            return select(self, mask)
        values = self.expand_as(mask) if self.shape != mask.shape else self
        return _MaskedSelect.apply(values, mask, selected_copies(mask, num_experts, topk, capacity_factor))

    def forward(self, hidden, tokens_per_expert, probs):
        if isinstance(tokens_per_expert, FakeTensor):
            with torch._subclasses.fake_tensor.unset_fake_temporarily():
                tokens_per_expert = torch.tensor(balanced_split(hidden.shape[0], self.num_local_experts))
        return sequential_forward(self, hidden, tokens_per_expert, probs)

    torch.Tensor.masked_select = masked_select
    experts.SequentialMLP.forward = forward
    # The alltoall dispatcher: a CUDA side stream for its device-to-host copies (made once, at
    # construction; none here: nothing is copied), and the routing's counts.
    AllToAll.cuda_dtoh_stream = "no CUDA stream: fake tensors"
    AllToAll.__init__ = _alltoall_index_tensors(alltoall["__init__"])
    AllToAll.preprocess = _capacity_or_balanced(alltoall["preprocess"])
    AllToAll._maybe_dtoh_and_synchronize = lambda self, point, tokens_per_expert=None: tokens_per_expert
    try:
        with moe_without_te():
            yield
    finally:
        torch.Tensor.masked_select = select
        experts.SequentialMLP.forward = sequential_forward
        for name, value in alltoall.items():
            setattr(AllToAll, name, value)


@contextlib.contextmanager
def moe_without_te() -> Iterator[None]:
    """megatron-core's MoE layer where Transformer Engine does not import, on any tensors: the
    router GEMM's ``te_general_gemm`` bound to None (megatron's torch.mm fallback) and
    torch.compile off (megatron's ``jit_fuser`` functions run eagerly, as on the symbolic backend,
    and no inductor compile eats a GPU run's minutes); both undone on exit."""
    from megatron.core.transformer.moe import moe_utils

    unbound = not hasattr(moe_utils, "te_general_gemm")
    if unbound:
        moe_utils.te_general_gemm = None
    try:
        with torch._dynamo.config.patch(disable=True):
            yield
    finally:
        if unbound:
            del moe_utils.te_general_gemm
