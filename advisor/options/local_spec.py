"""Torch's norm under ``--transformer-impl local``: the rules that ``advisor estimate
--from-command`` (``advisor.megatron_readback``), ``advisor-launch``'s preflight
(``launch.preflight``) and the advisor's own flags (``advisor.options.flags``) apply.

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

One line before, ``WrappedTorchNorm`` asserts ``not config.persist_layer_norm`` ("persist_layer_norm
not supported by torch LayerNorm": core_v0.15.2 line 30, core_v0.19.0 line 48), and Megatron-LM
turns the persistent kernel on unless told otherwise: ``persist_layer_norm = not
args.no_persist_layer_norm`` (core_v0.15.2 ``megatron/training/arguments.py``,
``core_transformer_config_from_args``; core_v0.19.0 ``megatron/training/argument_utils.py``, the
TransformerConfig field's own default False being left out of the generated flags as an
"incompatible default in dataclass"). So a local RMSNorm model needs ``--no-persist-layer-norm``
at any TP. Elsewhere the flag only makes Apex's ``FusedLayerNorm`` (a local LayerNorm model with
Apex) take its other kernel, neither of which the advisor prices apart: Transformer Engine's
norms do not read the field (``fusions/fused_layer_norm.py`` and ``torch_norm.py`` are its only
readers, both releases). So the advisor writes it beside every ``--transformer-impl local``
(``advisor.options.flags``) and reads it back as known.
"""

from __future__ import annotations

TORCH_NORM_ASSERTION = "sequence parallel not supported by torch LayerNorm"
"""megatron-core ``transformer/torch_norm.py``, ``WrappedTorchNorm.__new__`` (both releases)."""
PERSIST_ASSERTION = "persist_layer_norm not supported by torch LayerNorm"
"""megatron-core ``transformer/torch_norm.py``, ``WrappedTorchNorm.__new__`` (both releases)."""
NO_PERSIST_FLAG = "--no-persist-layer-norm"
"""Megatron-LM's switch that turns ``persist_layer_norm`` off (both releases' arguments.py)."""


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


def local_persist_layer_norm_problem(*, transformer_impl: str, normalization: str, no_persist_layer_norm: bool,
                                     fix: str = f"add {NO_PERSIST_FLAG} after --") -> str | None:
    """One line where Megatron-LM cannot build this run's model because torch's norm refuses the
    persistent layer-norm kernel that Megatron turns on by default (module docstring): an RMSNorm
    model under --transformer-impl local without --no-persist-layer-norm; None otherwise. A
    LayerNorm model gets Apex's FusedLayerNorm where Apex is installed, which takes the kernel
    (and this pure check cannot see): not refused. ``fix``: what to do, or what was done, where the
    caller reads the command (advisor-launch: after its ``--``)."""
    if transformer_impl != "local" or normalization != "RMSNorm" or no_persist_layer_norm:
        return None
    return (f"--transformer-impl local with RMSNorm without {NO_PERSIST_FLAG}: megatron-core's local layer spec "
            f"builds RMSNorm as torch's norm (WrappedTorchNorm), which asserts '{PERSIST_ASSERTION}' on every rank "
            f"when the model is built (transformer/torch_norm.py), and Megatron-LM turns the persistent kernel on "
            f"unless told otherwise: {fix}")
