"""Shared pieces of the tests that run real megatron-core on the CPU.

Test modules that need megatron-core call ``pytest.importorskip`` first, so that they are
skipped, with the reason, where it is not installed. In-process tests share the session
fixture ``megatron_world`` of conftest.py; multi-rank tests run in spawned processes
(``megatron_hooks.stage_emulation``).
"""

from __future__ import annotations

import torch

from advisor.models import LlamaSpec
from megatron_hooks.backends import CpuBackend

# The tiny Llama of the issue: RMSNorm, SwiGLU, GQA (4 heads, 2 KV heads), RoPE, untied.
TINY = LlamaSpec(name="tiny", num_layers=4, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
                 num_query_groups=2, vocab_size=256)
SEQ, MBS = 32, 2


def tiny_model(seed: int = 0, spec: LlamaSpec = TINY, **kwargs):
    from megatron_hooks.model import build_gpt_model

    torch.manual_seed(seed)
    return build_gpt_model(spec, seq_len=SEQ, **kwargs)


def batches(count: int, spec: LlamaSpec = TINY, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, spec.vocab_size, (MBS, SEQ), generator=generator),
             torch.randint(0, spec.vocab_size, (MBS, SEQ), generator=generator)) for _ in range(count)]


def train(model, optimizer, data, *, iterations: int = 2, microbatches: int = 2, recorder=None) -> list[float]:
    """Plain training loop: each iteration ``microbatches`` forward/backward passes and a step."""
    from megatron_hooks.model import causal_mask

    positions = torch.arange(SEQ).unsqueeze(0).expand(MBS, SEQ)
    mask = causal_mask(SEQ)
    losses = []
    for iteration in range(1, iterations + 1):
        context = recorder.iteration(iteration) if recorder else _NoRecorder()
        with context as step:
            optimizer.zero_grad(set_to_none=True)
            total = 0.0
            for k in range(microbatches):
                tokens, labels = data[(iteration - 1) * microbatches + k]
                loss = model(tokens, positions, mask, labels=labels).mean() / microbatches
                loss.backward()
                total += loss.item()
            optimizer.step()
            step.loss = total
        losses.append(total)
    return losses


class _NoRecorder:
    def __enter__(self):
        from megatron_hooks.recorder import StepResult

        return StepResult()

    def __exit__(self, *exc):
        return False


class OutOfMemoryAt(CpuBackend):
    """The one fake of these tests: a CPU backend that raises torch.OutOfMemoryError when the
    hooks reach a chosen point (``position`` returns the hooks' ``where``), because a real
    out-of-memory error cannot be provoked safely on a shared machine."""

    def __init__(self, where: str) -> None:
        super().__init__()
        self.target = where
        self.position = lambda: ""

    def allocated(self) -> int:
        if self.position() == self.target:
            raise torch.OutOfMemoryError(f"simulated: out of memory at {self.target}")
        return super().allocated()
