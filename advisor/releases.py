"""The Megatron-LM releases the advisor knows, as data: the one table of release facts.

Each entry was read from, and is tested against, a real checkout of the release named in
``checked``: ``launch.megatron_versions`` (which imports this table and adds what a launch does
with it: reading a checkout's version, environment rules) explains each launch fact and
``tests/test_megatron_real.py`` checks them; ``advisor.options.releases`` reads the training
flags' defaults (``fsdp_sharding_strategy``), checked by ``tests/test_options_real.py``. It lives
in the core because the core (``advisor``) cannot import the launcher.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


FSDP_MAIN_GRADS = "--megatron-fsdp-main-grads-dtype"
"""core_v0.19.0's dtype of Megatron-FSDP's main gradients: fp32, bf16, fp16 or auto (its default,
the weights' dtype; arguments.py, ``_add_distributed_args``)."""
FSDP_MAIN_PARAMS = "--megatron-fsdp-main-params-dtype"
"""core_v0.19.0's dtype of Megatron-FSDP's main weight buffer, the weights its optimizer updates:
fp32 (its default), bf16, fp16, or auto (no such buffer: the optimizer updates the compute
weights' own buffer; arguments.py; ``ParamAndGradBuffer._init_each_parameter_group_buffers``)."""
FSDP_GRAD_COMM = "--megatron-fsdp-grad-comm-dtype"
"""core_v0.19.0's dtype of Megatron-FSDP's gradient communication: fp32, bf16, fp16, or auto (its
default: the main gradients' dtype; arguments.py; ``DataParallelBuffer.fetch_bucket``)."""
FSDP_DTYPE_FLAGS = (FSDP_MAIN_GRADS, FSDP_MAIN_PARAMS, FSDP_GRAD_COMM)
"""Megatron-FSDP's three dtype flags (``_add_distributed_args``): core_v0.19.0 has them, core_v0.15.2 none."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MegatronRelease:
    """What one Megatron-LM release line needs, builds and defaults to (see the module docstring)."""

    release: tuple[int, int]
    """(major, minor): the rules hold for every patch release of this minor."""
    checked: str
    """The release tag these rules were read from and are tested against."""
    python: tuple[int, int]
    """The oldest Python it runs on (requires-python of its pyproject.toml)."""
    null_tokenizer_extra_rows: int
    """NullTokenizer.vocab_size - --vocab-size: 1 where it adds an end-of-document token."""
    mock_data_max_token_id: int | None
    """The largest token id --mock-data feeds whatever the vocabulary; None: ids modulo it."""
    pretrain: Literal["providers", "config_container"]
    """pretrain(dataset_provider, model_provider, ...) or pretrain(config_container, dataset_provider,
    model_type, forward_step, model_provider=None, ...)."""
    transformer_config_module: str
    """Where core_transformer_config_from_args lives."""
    fsdp_sharding_strategy: str
    """``--data-parallel-sharding-strategy``'s default: 'no_shard' in core_v0.15.2
    (arguments.py, ``_add_distributed_args``), 'optim_grads_params' in core_v0.19.0."""
    eval_interval: int | None
    """``--eval-interval``'s default: 1000 in core_v0.15.2 (megatron/training/arguments.py,
    ``_add_validation_args``), None in core_v0.19.0 (megatron/training/config/training_config.py,
    ``ValidationConfig``: 'If not set, evaluation will not run during training'). Both train loops
    evaluate after iteration i where ``args.eval_interval and i % args.eval_interval == 0``
    (training.py, ``train``). None also means that training cannot start: both releases' data
    setup sizes the validation split as ``args.train_iters // args.eval_interval + 1`` evaluations
    (training.py, ``get_train_valid_test_num_samples``), a TypeError with None (and a
    ZeroDivisionError with 0) unless --skip-train (core_v0.19.0) or --full-validation."""
    eval_iters: int = 100
    """``--eval-iters``' default (both releases): the iterations of one evaluation, each one global
    batch forward only (training.py, ``evaluate``)."""
    lacks: frozenset[str] = frozenset()
    """Flags the launcher may write that this release does not have. Where it lacks
    ``FSDP_MAIN_GRADS`` (core_v0.15.2), Megatron-FSDP keeps its main gradients per
    --accumulate-allreduce-grads-in-fp32 (``fsdp_main_grads_own_flag``)."""
    te_cross_entropy: bool = True
    """Whether validate_args accepts --cross-entropy-loss-fusion with --cross-entropy-fusion-impl te:
    core_v0.19.0's asserts against it ('disabled due to stability issues', arguments.py)."""
    uniform_recompute_any_n: bool = True
    """Whether --recompute-method uniform runs with any --recompute-num-layers N: core_v0.19.0's
    ``checkpointed_forward`` ends each unit at ``min(layer_idx + recompute_num_layers,
    num_layers_per_pipeline_rank)`` (megatron/core/recompute.py), so a model chunk's last unit may
    be shorter. core_v0.15.2's ``TransformerBlock._checkpointed_forward`` runs
    ``custom(layer_idx, layer_idx + self.config.recompute_num_layers)``, whose loop takes
    ``self.layers[index]`` (megatron/core/transformer/transformer_block.py): a chunk whose layers N
    does not divide (N above them included) fails with IndexError at its first training forward.
    Neither release validates N against the layers (transformer_config.py only refuses None)."""
    flex_needs_enable_deepep: bool = False
    """Whether the flex token dispatcher needs ``--moe-enable-deepep``: core_v0.15.2's
    ``MoEFlexTokenDispatcher`` asserts it when it builds the layer ('Please set
    --moe-enable-deepep', token_dispatcher.py); core_v0.19.0 takes DeepEP as its default backend."""
    uneven_middle_needs_layers: bool = True
    """Whether uneven first/last stages (--decoder-first/last-pipeline-num-layers) must leave layers
    for the stages between them: core_v0.19.0's ``TransformerConfig.__post_init__`` raises 'Mismatch:
    0 middle layers remaining but N middle PP stages available' (transformer_config.py, 'Uneven PP');
    core_v0.15.2 has no such check, and its get_num_layers_to_build builds them with none."""
    shared_expert_overlap_dispatchers: tuple[str, ...] = ("alltoall", "flex")
    """The token dispatchers --moe-shared-expert-overlap runs with where the model has shared
    experts (``transformer_config.py``, ``__post_init__``: 'moe_shared_expert_overlap only works
    with alltoall token dispatcher' in core_v0.15.2, '... alltoall or flex ...' in core_v0.19.0)."""
    renamed: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """(a deprecated flag the advisor's rows write, the words this release spells it with): the
    rows are written once for every release, with the spelling the oldest one needs; a launch on
    this release writes its own (``own_spelling``). A switch's words replace it; a valued flag's
    name is replaced and its value kept."""
    fsdp_wraps_experts: bool = True
    """Whether Megatron-FSDP can wrap an expert-parallel model: core_v0.15.2's
    ``MegatronFSDP.__init__`` calls ``dist_index.get_expert_dp_group()`` (megatron_fsdp.py:229-242),
    which its ``FSDPDistributedIndex`` lacks (``advisor.moe.fsdp.release_problem``)."""
    fsdp_budget_from_units: bool = True
    """Whether Megatron-FSDP sizes its all-gather prefetch and reduce-scatter queue from the rank's
    FSDP units (``memory_levers.fsdp_communication_unit``): core_v0.19.0 sets
    ``suggested_communication_unit_size``, where --suggested-communication-unit-size leaves it None,
    to twice the mean unit's elements under optim_grads_params, else the DDP bucket size or 1e9, and
    at least 1e9 (megatron_fsdp/megatron_fsdp.py:420-444). core_v0.15.2 reads
    ``ddp_config.suggested_communication_unit_size or 1_000_000_000`` (:362-364), so its branch that
    would size it is dead: always 1e9."""
    imports: tuple[tuple[str, str], ...] = ()
    """(module, why) for each module outside the standard library that its pretrain_gpt.py imports
    on the way to training: found by importing the script's module level (and, for core_v0.15.2,
    the tokenizer module it builds) with each candidate refused in turn, and by the modules a
    real launch loaded (PYTHONPROFILEIMPORTTIME); the ``megatron`` extra of pyproject.toml
    installs them all. torch's own dependencies (sympy, setuptools) come with torch."""

    @property
    def name(self) -> str:
        return f"Megatron-LM core {self.release[0]}.{self.release[1]}"

    @property
    def python_text(self) -> str:
        return f"Python >= {self.python[0]}.{self.python[1]}"

    @property
    def fsdp_main_grads_own_flag(self) -> bool:
        """Whether Megatron-FSDP keeps its main gradients in the dtype of its own flag,
        ``FSDP_MAIN_GRADS`` (default 'auto': the weights' dtype), whatever
        --accumulate-allreduce-grads-in-fp32 says: core_v0.19.0's ``_resolve_group_grad_dtype``
        (megatron/core/distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py) returns
        ``mp_policy.main_grads_dtype`` or the parameters' dtype, and no FSDP module reads
        grad_reduce_in_fp32. core_v0.15.2 has no such flag, and its buffer is FP32 where
        grad_reduce_in_fp32 is set (``dtype=torch.float32 if grad_reduce_in_fp32 else grad_dtype``,
        the same file)."""
        return FSDP_MAIN_GRADS not in self.lacks

    def own_spelling(self, args: list[str] | tuple[str, ...]) -> list[str]:
        """``args`` with each deprecated flag (``renamed``) spelled as this release spells it
        (a launch writes ``advisor.options.flags.release_spelling``, which adds what this
        release's own flags need said)."""
        renamed = dict(self.renamed)
        return [word for arg in args for word in renamed.get(arg, (arg,))]

    def null_tokenizer_vocab_flag(self, rows: int) -> int:
        """The --vocab-size that makes its NullTokenizer give ``rows`` tokens."""
        return rows - self.null_tokenizer_extra_rows


RELEASES: tuple[MegatronRelease, ...] = (
    MegatronRelease(
        release=(0, 15), checked="core_v0.15.2", python=(3, 10), null_tokenizer_extra_rows=1,
        mock_data_max_token_id=4094, pretrain="providers",
        transformer_config_module="megatron.training.arguments", fsdp_sharding_strategy="no_shard", eval_interval=1000,
        uniform_recompute_any_n=False, flex_needs_enable_deepep=True, shared_expert_overlap_dispatchers=("alltoall",),
        uneven_middle_needs_layers=False, fsdp_budget_from_units=False, fsdp_wraps_experts=False,
        lacks=frozenset({"--moe-flex-dispatcher-backend", "--moe-flex-dispatcher-num-sms", *FSDP_DTYPE_FLAGS}),
        imports=(("torch", ""), ("numpy", ""), ("packaging", ": megatron/training/arguments.py"),
                 ("six", ": megatron/training/tokenizer/bert_tokenization.py"),
                 ("regex", ": megatron/training/tokenizer/gpt2_tokenization.py"),
                 ("yaml", ": megatron/training/yaml_arguments.py")),
    ),
    MegatronRelease(
        release=(0, 19), checked="core_v0.19.0", python=(3, 12), null_tokenizer_extra_rows=0,
        mock_data_max_token_id=None, pretrain="config_container",
        transformer_config_module="megatron.training.argument_utils", fsdp_sharding_strategy="optim_grads_params",
        eval_interval=None,
        te_cross_entropy=False,
        # transformer_config.py, __post_init__: each routed to its new field with a deprecation warning
        renamed=(("--moe-enable-deepep", ("--moe-flex-dispatcher-backend", "deepep")),
                 ("--moe-deepep-num-sms", ("--moe-flex-dispatcher-num-sms",))),
        imports=(("torch", ""), ("numpy", ""),
                 ("packaging", ": megatron/core/dist_checkpointing/strategies/torch.py")),
    ),
)
NEWEST = RELEASES[-1]


DEFAULT_CAUSAL_MASK_PER_CALL_SINCE = (0, 16)
"""The first megatron-core release whose softmax builds its default causal mask anew for every
call: ``get_default_causal_mask(sq)`` (megatron/core/fusions/fused_softmax.py), used where the
data loader passed no mask, is cached by ``@lru_cache`` in core_v0.15.2 (one tensor for the
process) and not in the megatron-core 0.16.1 wheel nor core_v0.19.0 (every layer keeps its own).
A megatron-core version, not a line of ``RELEASES``: the profiles record the installed package's."""


def default_causal_mask_per_call(megatron_core_version: str) -> bool | None:
    """Whether this megatron-core builds its default causal mask per call (see above); None for a
    version string this cannot read."""
    parts = megatron_core_version.split(".")
    if len(parts) < 2 or not (parts[0].isdecimal() and parts[1].isdecimal()):
        return None
    return (int(parts[0]), int(parts[1])) >= DEFAULT_CAUSAL_MASK_PER_CALL_SINCE
