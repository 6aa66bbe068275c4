"""Sequence parallelism under ``--transformer-impl local``: the one rule that ``advisor estimate
--from-command`` (``advisor.megatron_readback``) and ``advisor-launch``'s preflight
(``launch.preflight``) both apply.

What megatron-core builds (both releases, core_v0.15.2 and core_v0.19.0): the local layer spec
(``models/gpt/gpt_layer_specs.py``, ``get_gpt_layer_local_spec``/``_submodules``) asks
``LocalSpecProvider.layer_norm(rms_norm=True)`` for an RMSNorm model, which returns torch's norm,
``WrappedTorchNorm`` (``models/backends.py``), whether Apex is installed or not; a LayerNorm model
gets Apex's ``FusedLayerNorm`` where ``import apex`` succeeds (it takes sequence parallelism), else
``WrappedTorchNorm`` too. ``WrappedTorchNorm`` asserts ``not config.sequence_parallel``
("sequence parallel not supported by torch LayerNorm", ``transformer/torch_norm.py``) when the
first transformer layer is built, on every rank, after start-up: ``validate_args`` does not check
it. Sequence parallelism matters only at TP > 1: at TP 1 ``validate_args`` switches it off.

A mixture of experts cannot drop sequence parallelism instead: at TP > 1 megatron-core's
``MoELayer.forward`` raises ValueError in training without it (``transformer/moe/moe_layer.py``,
"During training, performance may degrade if MoE and tensor parallelism are enabled without also
enabling sequence parallelism", both releases), so such a run needs TP 1 or Transformer Engine.
"""

from __future__ import annotations

TORCH_NORM_ASSERTION = "sequence parallel not supported by torch LayerNorm"
"""megatron-core ``transformer/torch_norm.py``, ``WrappedTorchNorm.__new__`` (both releases)."""


def torch_norm_refuses_sequence_parallel(*, sequence_parallel: bool, tp: int, normalization: str) -> bool:
    """Whether megatron-core's local spec builds, for a model of this ``normalization``
    (Megatron's --normalization: LayerNorm or RMSNorm), torch's norm with sequence parallelism on:
    an RMSNorm model at TP > 1 with --sequence-parallel. A LayerNorm model gets Apex's
    FusedLayerNorm where Apex is installed, which this pure check cannot see: not refused."""
    return sequence_parallel and tp > 1 and normalization == "RMSNorm"


def local_sequence_parallel_problem(*, transformer_impl: str, sequence_parallel: bool, tp: int,
                                    normalization: str, moe: bool = False) -> str | None:
    """One line where Megatron-LM cannot build this run's model (``torch_norm_refuses_sequence_parallel``
    under --transformer-impl local), naming the assertion and what to do instead; None otherwise.
    ``moe``: a mixture of experts, which needs sequence parallelism at TP > 1 (module docstring)."""
    if transformer_impl != "local" or not torch_norm_refuses_sequence_parallel(
            sequence_parallel=sequence_parallel, tp=tp, normalization=normalization):
        return None
    instead = ("a mixture of experts needs sequence parallelism at TP > 1 (megatron-core's MoELayer raises "
               "without it), so plan it at TP 1 (advisor sweep --tp 1)" if moe else
               "plan it without sequence parallelism (advisor sweep or estimate --no-sequence-parallel; a command of "
               "your own: drop --sequence-parallel) or at TP 1")
    return (f"--transformer-impl local with --sequence-parallel at TP {tp}: megatron-core's local layer spec builds "
            f"RMSNorm as torch's norm (WrappedTorchNorm), which asserts '{TORCH_NORM_ASSERTION}' on every rank when "
            f"the model is built (transformer/torch_norm.py); {instead}, or install Transformer Engine and drop "
            "--transformer-impl local")


def local_sequence_parallel_clause(*, sequence_parallel: bool, tp: int, normalization: str, moe: bool = False) -> str:
    """What the missing-Transformer-Engine line adds to its suggestion of --transformer-impl local
    where this run has sequence parallelism that torch's norm would refuse ('' where it has not)."""
    if not torch_norm_refuses_sequence_parallel(sequence_parallel=sequence_parallel, tp=tp,
                                                normalization=normalization):
        return ""
    plan = ", which a mixture of experts needs at TP > 1: plan it at TP 1" if moe else \
        ": plan without it (advisor sweep --no-sequence-parallel) or at TP 1"
    return (f"; at TP {tp} it also needs this run's --sequence-parallel off (torch's RMSNorm asserts it when the "
            f"model is built){plan}")
