"""Megatron-LM arguments read back into the model, the layout and the workload: the inverse of
``advisor.megatron_args`` (whose flags a sweep row carries), for a user's own command line.

Model flags (``--num-layers``, ``--hidden-size``, ... ``--untie-embeddings-and-output-weights``)
become a ``LlamaSpec`` with Megatron's own defaults for what the command leaves out
(megatron/training/arguments.py, ``validate_args``: h_ffn = 4h, or int(8h/3 / 64) x 64 with
``--swiglu``; k = a without ``--group-query-attention``; d = h/a). Layout flags (TP, CP, PP, the
uneven split, virtual stages, MBS, GBS) become layers per stage and VPP as Megatron builds them
(``advisor.megatron_layout``). Flags known to change neither memory
nor time (data, logging, checkpoints, seeds, learning-rate schedule) are skipped; the rest go to
the training options' parser, and whatever nobody prices is named, never dropped.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field, replace

from advisor.errors import AdvisorError
from advisor.megatron_layout import (RAMPUP, STEP_SCHEDULE, Layout, degrees, float_value, int_value, read_layout,
                                     unexpanded_problem)
from advisor.model_spec import FieldError
from advisor.models import LlamaSpec
from advisor.parallel import RANK_ORDER
from advisor.shell_command import as_written, unexpanded, unset_variable

# Flags read here, and how many values each takes.
_MODEL_VALUED = {"num-layers", "hidden-size", "ffn-hidden-size", "num-attention-heads", "num-query-groups",
                 "kv-channels", "seq-length", "max-position-embeddings", "normalization", "norm-epsilon",
                 "position-embedding-type", "rotary-base", "rope-scaling-factor", "rotary-percent", "vocab-size",
                 "tokenizer-type", "attention-dropout", "hidden-dropout", "encoder-seq-length"}
_MODEL_SWITCHES = {"group-query-attention", "swiglu", "quick-geglu", "use-rope-scaling", "disable-bias-linear", "add-qkv-bias",
                   "qk-layernorm", "untie-embeddings-and-output-weights", "add-bias-linear", "use-mcore-models",
                   "no-position-embedding"}
_LAYOUT_VALUED = {"tensor-model-parallel-size", "context-parallel-size", "pipeline-model-parallel-size",
                  "decoder-first-pipeline-num-layers", "decoder-last-pipeline-num-layers",
                  "pipeline-model-parallel-layout", "num-layers-per-virtual-pipeline-stage",
                  "num-virtual-stages-per-pipeline-rank", "micro-batch-size", "global-batch-size"}
_TOKENIZER = {"tokenizer-type", "vocab-size"}
"""Read for the vocabulary (``vocabulary``), which the rows size with --make-vocab-size-divisible-by:
not among the flags a launch writes, so named with the harmless ones (``ParsedArguments.skipped``)."""
_LAYOUT_SWITCHES = {"account-for-embedding-in-pipeline-split", "account-for-loss-in-pipeline-split",
                    "use-tp-pp-dp-mapping"}

# Known to change neither memory nor time: what a run reads and writes, logs, and its schedule of
# learning rates (megatron/training/arguments.py's data, logging, checkpointing, learning-rate,
# initialization, validation and tokenizer groups). Values taken by each: 1 unless listed below.
HARMLESS_VALUED = {
    "data-path", "train-data-path", "valid-data-path", "test-data-path", "data-cache-path", "split",
    "vocab-file", "merge-file", "tokenizer-model", "tiktoken-pattern", "num-workers", "data-args-path",
    "per-split-data-args-path", "save", "load", "save-interval", "pretrained-checkpoint",
    "tensorboard-dir", "tensorboard-log-interval", "wandb-project", "wandb-exp-name", "wandb-save-dir",
    "log-interval", "eval-interval", "eval-iters", "exit-interval", "exit-duration-in-mins", "exit-signal",
    "train-iters", "train-samples", "lr", "min-lr", "lr-decay-style", "lr-decay-iters", "lr-decay-samples",
    "lr-warmup-iters", "lr-warmup-samples", "lr-warmup-fraction", "lr-warmup-init", "lr-wsd-decay-style",
    "lr-wsd-decay-iters", "lr-wsd-decay-samples", "decoupled-lr", "decoupled-min-lr", "weight-decay",
    "start-weight-decay", "end-weight-decay", "weight-decay-incr-style", "clip-grad", "adam-beta1",
    "adam-beta2", "adam-eps", "sgd-momentum", "init-method-std", "seed", "data-parallel-random-init",
    "distributed-timeout-minutes", "distributed-backend", "profile-step-start", "profile-step-end",
    "profile-ranks", "timing-log-level", "timing-log-option", "logging-level", "loss-scale",
    "initial-loss-scale", "min-loss-scale", "loss-scale-window", "hysteresis",
    "dataloader-type", "mid-level-dataset-surplus", "ckpt-step", "async-save", "dist-ckpt-strictness",
    "one-logger-project", "one-logger-run-name", "wandb-entity", "log-straggler", "straggler-minmax-count",
    "manual-gc-interval", "memory-snapshot-path", "rerun-mode", "check-weight-hash-across-dp-replicas-interval",
    "save-retain-interval",
    "object-storage-cache-path", "ckpt-fully-parallel-save", "non-persistent-save-interval",
    "non-persistent-ckpt-type", "non-persistent-global-ckpt-dir", "use-checkpoint-args", "data-sharding",
    # RoPE's position interpolation scales the positions (rotary_pos_embedding.py): no tensor changes.
    "rotary-seq-len-interpolation-factor",
}
HARMLESS_SWITCHES = {
    "mock-data", "no-mmap-bin-files", "log-throughput", "log-timers-to-tensorboard", "log-validation-ppl-to-tensorboard",
    "log-memory-to-tensorboard", "log-params-norm", "log-num-zeros-in-grad", "log-world-size-to-tensorboard",
    "log-loss-scale-to-tensorboard", "log-progress", "profile", "use-pytorch-profiler", "record-memory-history",
    "no-load-optim", "no-load-rng", "no-save-optim", "no-save-rng", "finetune", "use-dist-ckpt", "ckpt-fully-parallel-load",
    "apply-layernorm-1p", "calculate-per-token-loss", "manual-gc", "check-for-nan-in-loss-and-grad",
    "no-check-for-nan-in-loss-and-grad", "use-rotary-position-embeddings", "auto-detect-ckpt-format",
    "exit-on-missing-checkpoint", "no-initialization", "log-energy", "adlr-autoresume", "use-checkpoint-opt_param-scheduler",
    "override-opt_param-scheduler", "disable-tensorboard", "exit-signal-handler",
    "no-ckpt-fully-parallel-save",
}
_MULTI_VALUED = {"rampup-batch-size": 3, "data-path": None, "train-data-path": None, "valid-data-path": None,
                 "test-data-path": None, "profile-ranks": None}
"""Flags that take several values (None: any number, up to the next flag)."""
_PRICED_MULTI = {"recompute-modules": None, "moe-router-load-balancing-type": None, "moe-aux-loss-coeff": None}
"""Priced flags with several values (``advisor.moe.readback``), kept whole for their reader."""


@dataclass
class ParsedArguments:
    """A Megatron argument list sorted by who reads it."""

    model: dict[str, str | bool] = field(default_factory=dict)
    layout: dict[str, str | bool] = field(default_factory=dict)
    rest: list[str] = field(default_factory=list)
    """Everything else, in order: for the training options' parser."""
    skipped: list[str] = field(default_factory=list)
    """The flags met that a launch of the estimate does not write, as written (a flag and its
    values: '--lr 3e-4'): the harmless ones, and the tokenizer's (``_TOKENIZER``), whose
    vocabulary is read into the model (``ReadRun.skipped``)."""
    unset: list[str] = field(default_factory=list)
    """Words that are one variable the script does not set, where a flag may stand ($EXTRA_ARGS):
    read as empty, as bash expands them, and named as written."""


def _is_value(word: str) -> bool:
    return not word.startswith("--") and not re.fullmatch(r"-[A-Za-z].*", word)


@functools.cache
def _switches() -> frozenset[str]:
    """Every flag known to be a switch (store_true or store_false in Megatron's argparse): read
    here, by the training options' parser or by the MoE reader."""
    from advisor.moe.readback import SWITCHES as MOE_SWITCHES
    from advisor.options.flags import NO_EFFECT, SWITCHES, UNPRICED

    counts = _megatron_value_counts()
    # the unpriced and no-effect flags that are switches in every release that has them
    # (--no-overlap-p2p-communication): a value after one is refused as after the others
    named = {flag for flag in UNPRICED | NO_EFFECT.keys() if counts.get(flag) == {"0"}}
    return frozenset(_MODEL_SWITCHES | _LAYOUT_SWITCHES | HARMLESS_SWITCHES | MOE_SWITCHES
                     | {flag[2:] for flag in SWITCHES | named} | {_SOFTMAX_FUSION_OFF[2:]})


@functools.cache
def _megatron_value_counts() -> dict[str, set[str]]:
    """Every flag of the releases' own parsers (``megatron_flag_table``: '--flag[=COUNT][:TYPE]'
    words) -> the value counts the releases give it ('0': a switch; '1' where none is written)."""
    from advisor.megatron_flag_table import FLAGS

    counts: dict[str, set[str]] = {}
    for text in FLAGS.values():
        for word in text.split():
            flag, _, count = word.partition(":")[0].partition("=")
            counts.setdefault(flag, set()).add(count or "1")
    return counts


def _stray_value(name: str, words: list[str], i: int, has_value: bool, value: str) -> None:
    """A value after a switch (--moe-grouped-gemm false): Megatron's argparse refuses the command
    (unrecognized arguments; ignored explicit argument for --switch=value), so one line here."""
    stray = value if has_value else words[i + 1] if i + 1 < len(words) and _is_value(words[i + 1]) else None
    if stray is not None and not has_value and unset_variable(stray):
        return  # $EXTRA after a switch: no word at all where the script leaves it unset
    if stray is not None:
        raise AdvisorError(f"--{name} is a switch and takes no value, got {as_written(stray)!r} (Megatron-LM "
                           f"refuses the command): write --{name} alone to set it, or leave it out")




def split_arguments(arguments: list[str] | tuple[str, ...]) -> ParsedArguments:
    """Sort ``arguments`` (``--flag value``, ``--flag=value``, ``--switch``) into model, layout,
    harmless and the rest; a later occurrence of a flag wins, as argparse's does."""
    parsed, i, words = ParsedArguments(), 0, list(arguments)
    previous: tuple[str, list[str]] | None = None  # the flag read last and its values, with no '='
    while i < len(words):
        word = words[i]
        if not word.startswith("--"):
            if unset_variable(word):  # bash expands it to nothing: flags it may hold are not seen
                parsed.unset.append(as_written(word))
                i += 1
                continue
            if (shown := unexpanded(word)) is not None:
                raise AdvisorError(f"{shown}, stands where Megatron's arguments are: write them in the command")
            raise AdvisorError(f"{word!r} is not a flag (Megatron's arguments are --name [value])"
                               + _after_value(previous))
        name, has_value, value = word[2:].partition("=")
        previous = None
        if name in _switches():
            _stray_value(name, words, i, bool(has_value), value)
        if name in _MODEL_SWITCHES | _LAYOUT_SWITCHES | HARMLESS_SWITCHES and not has_value:
            target = (parsed.model if name in _MODEL_SWITCHES else parsed.layout if name in _LAYOUT_SWITCHES
                      else None)
            if target is None:
                parsed.skipped.append(f"--{name}")
            else:
                target[name] = True
            i += 1
            continue
        count = 0 if name in _switches() else _MULTI_VALUED.get(name, _PRICED_MULTI.get(name, 1))
        if has_value:
            values, i = [value], i + 1
        else:
            end = i + 1
            while end < len(words) and _is_value(words[end]) and (count is None or end - i <= count):
                end += 1
            values, i = words[i + 1:end], end
            previous = (name, values) if values and count is not None else None
        if name in _MODEL_VALUED | _LAYOUT_VALUED:
            if len(values) != 1:
                raise AdvisorError(f"--{name} takes one value, got {len(values)}: {' '.join(values)}" if values
                                   else f"--{name} needs a value, and none follows it")
            (parsed.model if name in _MODEL_VALUED else parsed.layout)[name] = values[0]
            if name in _TOKENIZER:
                parsed.skipped.append(f"--{name} {as_written(values[0])}")
        elif name in HARMLESS_VALUED or name in _MULTI_VALUED or name == STEP_SCHEDULE:
            parsed.skipped.append(" ".join((f"--{name}", *map(as_written, values))))
            if name in (RAMPUP, STEP_SCHEDULE):
                parsed.layout[name] = " ".join(values)
        else:
            parsed.rest += [f"--{name}", *values]
    _legacy_rope(parsed)
    return parsed


def _after_value(previous: tuple[str, list[str]] | None) -> str:
    """Where a word that is not a flag follows a flag's values: the flag, whose values are read, so
    that a value split at its spaces (an unquoted ${ARGS[@]} of "0:16 2.4B:320") is found."""
    if previous is None:
        return ""
    name, values = previous
    # the releases' own parsers (megatron_flag_table): where one value is all each takes, argparse
    # leaves the next word over, and pretrain_gpt.py has no positional arguments
    refused = (", and Megatron-LM's argparse refuses it too (unrecognized arguments)"
               if _megatron_value_counts().get(f"--{name}") == {"1"} else "")
    return (f": it follows --{name} {' '.join(map(as_written, values))}, read as its value{'s' * (len(values) > 1)}"
            f"{refused}; a value with spaces needs its quotes where the command is run (\"${{ARGS[@]}}\" in a "
            "script)")


def _legacy_rope(parsed: ParsedArguments) -> None:
    """--use-rotary-position-embeddings (deprecated, as slime's and older Qwen scripts still write it)
    is RoPE whatever --position-embedding-type says: validate_args sets position_embedding_type
    'rope' from it (core_v0.15.2 and core_v0.19.0 megatron/training/arguments.py, "Legacy RoPE
    arguments"), before its --no-position-embedding check. Skipped as written (a launch writes
    --position-embedding-type rope), read here as that type."""
    if "--use-rotary-position-embeddings" in parsed.skipped:
        parsed.model["position-embedding-type"] = "rope"




def _unpriced_model(model: dict) -> list[str]:
    """What a LlamaSpec cannot say about the command's network, named (priced as Llama's)."""
    notes = []
    if model.get("quick-geglu"):  # beside --swiglu refused first (_refuse_activations_with_swiglu)
        notes.append("--quick-geglu (a gated MLP as SwiGLU is: priced as SwiGLU, the same weights and FLOPs; its "
                     "quick-GELU activation, not SiLU, not priced)")
    elif not model.get("swiglu"):
        notes.append("no --swiglu (a GELU MLP, priced as SwiGLU with the same h_ffn: 1.5x its MLP weights and "
                     "FLOPs; --swiglu with 2/3 of its --ffn-hidden-size prices the same weights and FLOPs)")
    for name, default, priced, as_priced in (("normalization", "LayerNorm", "RMSNorm", "RMSNorm"),
                                             ("position-embedding-type", "learned_absolute", "rope", "RoPE")):
        if name not in model:  # Megatron's default, which the script may keep unknowingly
            notes.append(f"--{name} {default} (Megatron's default: the command sets none; priced as {as_priced})")
        elif model[name] != priced:
            notes.append(f"--{name} {as_written(str(model[name]))} (priced as {as_priced})")
    if not model.get("disable-bias-linear"):
        notes.append("no --disable-bias-linear (linear-layer biases, not priced)")
    for name in ("attention-dropout", "hidden-dropout"):
        if float_value(model, name, 0.1) != 0:
            notes.append(f"--{name} {model[name]} (dropout masks, not priced)" if name in model
                         else f"--{name} 0.1 (Megatron's default: the command sets none; dropout masks, not priced)")
    if float_value(model, "rotary-percent", 1.0) != 1.0:
        notes.append(f"--rotary-percent {model['rotary-percent']}")
    return notes


@dataclass(frozen=True, slots=True)
class Missing:
    """One input the command leaves out."""

    what: str
    """'--seq-length', 'its vocabulary'."""
    why: str | None = None
    """Why the command cannot say it ('its tokenizer is read from files'); None for a flag."""
    give: str | None = None
    """The advisor's option that supplies it ('--gpus N'); None: only the command can (a flag)."""


class MissingInputs(AdvisorError):
    """The command leaves out inputs the reading needs, every one named in a single line: found
    one per run, a user would learn them one failed run at a time."""

    def __init__(self, missing):
        self.missing = tuple(missing)
        super().__init__(missing_line(self.missing))


def missing_line(missing: tuple[Missing, ...]) -> str:
    """'the command does not give A (why) or B: write A in the command; give --option N'."""
    from advisor.render import listed

    named = [item.what + (f" ({item.why})" if item.why else "") for item in missing]
    flags = [item.what for item in missing if item.give is None]
    given = [item.give for item in missing if item.give is not None]
    remedies = []
    if flags:  # beside the advisor's options, the flags are named again: those go in the script
        written = listed(flags) if given else "it" if len(flags) == 1 else "them"
        remedies.append(f"write {written} in the command")
    if given:
        remedies.append("give " + listed(given))
    return f"the command does not give {listed(named, 'or')}: {'; '.join(remedies)}"


_REQUIRED_MODEL = ("num-layers", "hidden-size", "num-attention-heads")
"""The model flags Megatron has no default for (validate_args asserts them)."""


def vocabulary(model: dict, release=None) -> tuple[int | None, str]:
    """The tokenizer's vocabulary as ``release`` (None: the newest) builds it, and where it came
    from: core_v0.15.2's NullTokenizer adds an end-of-document row, core_v0.19.0's has --vocab-size
    rows (``MegatronRelease.null_tokenizer_extra_rows``); other tokenizers read theirs from files
    the command names, so their --vocab-size is taken as given."""
    from advisor.options.releases import release_defaults

    size = int_value(model, "vocab-size")
    if size is None:
        return None, "not in the command"
    if model.get("tokenizer-type") == "NullTokenizer":
        defaults = release_defaults(release)
        extra = defaults.null_tokenizer_extra_rows
        if extra:
            return size + extra, (f"--vocab-size {size} + {extra} (NullTokenizer's end-of-document row on "
                                  f"{defaults.name})")
        return size, f"--vocab-size {size} (NullTokenizer's rows as given on {defaults.name})"
    tokenizer = model.get("tokenizer-type")
    if tokenizer is not None and tokenizer not in _TOKENIZERS_SIZED_BY_FLAG:
        return size, (f"--vocab-size {size} (taken as the size of {as_written(str(tokenizer))}'s files: Megatron "
                      "builds that tokenizer's vocabulary from them and ignores --vocab-size)")
    return size, f"--vocab-size {size}"


_TOKENIZERS_SIZED_BY_FLAG = frozenset({"NullTokenizer", "TikTokenizer", "NullMultimodalTokenizer"})
"""The tokenizers whose vocabulary --vocab-size sets (core_v0.15.2 tokenizer.py, ``build_tokenizer``:
_NullTokenizer(args.vocab_size), CustomTikTokenizer(vocab_size=args.vocab_size); core_v0.19.0
core/tokenizers/utils/build_tokenizer.py likewise). Every other one (GPT2BPETokenizer from
--vocab-file and --merge-file, HuggingFaceTokenizer and the SentencePiece ones from
--tokenizer-model) sizes its vocabulary from its files, and padded_vocab_size pads that."""


def model_spec(model: dict, *, name: str, vocab_size: int) -> LlamaSpec:
    """The LlamaSpec a Megatron model-flag dict builds, with validate_args' defaults; the flags
    Megatron has no default for are there (``read_run`` names every missing one first, ``_missing``)."""
    # validate_args refuses the deprecated switch but with RoPE, where it changes nothing: the
    # learned position table is built only for learned_absolute (language_model_embedding.py).
    if model.get("no-position-embedding") and model.get("position-embedding-type") != "rope":
        raise AdvisorError("--no-position-embedding without --position-embedding-type rope (Megatron refuses it: "
                           "deprecated, use --position-embedding-type)")
    hidden = int_value(model, "hidden-size")
    heads = int_value(model, "num-attention-heads")
    # megatron/training/arguments.py, validate_args: the FFN default with and without SwiGLU.
    ffn_default = int((4 * hidden * 2 / 3) / 64) * 64 if model.get("swiglu") else 4 * hidden
    groups = int_value(model, "num-query-groups", heads) if model.get("group-query-attention") else heads
    kv = int_value(model, "kv-channels")
    try:
        return LlamaSpec(
            name=name, num_layers=int_value(model, "num-layers"), hidden_size=hidden,
            ffn_hidden_size=int_value(model, "ffn-hidden-size", ffn_default), num_attention_heads=heads,
            num_query_groups=groups, vocab_size=vocab_size,
            tie_embeddings="untie-embeddings-and-output-weights" not in model,
            kv_channels=None if kv is None or kv * heads == hidden else kv,
            add_qkv_bias=bool(model.get("add-qkv-bias")),
            qk_layernorm=bool(model.get("qk-layernorm")),
            rotary_base=float_value(model, "rotary-base", 10000.0),
            rope_scaling_factor=(float_value(model, "rope-scaling-factor", 8.0) if model.get("use-rope-scaling")
                                 else None),
            norm_epsilon=float_value(model, "norm-epsilon", 1e-5),
            max_position_embeddings=_context(model),
        )
    except FieldError as error:  # named as the command's flags: --kv-channels is the user's to give here
        # the file is named by its reader (advisor.cli.from_command.read_inputs), as for every other refusal
        raise AdvisorError(error.worded(lambda field: '--' + field.replace('_', '-'))) from None



def _context(model: dict) -> int | None:
    """--max-position-embeddings where it is above --seq-length, for the launch to write (None where
    equal or not given: the launch writes the sequence length); one line where it is below, which
    validate_args asserts against (arguments.py, both releases)."""
    context, seq_len = int_value(model, "max-position-embeddings"), int_value(model, "seq-length")
    if context is not None and seq_len is not None and context < seq_len:
        raise AdvisorError(f"--max-position-embeddings {context} is below --seq-length {seq_len}: Megatron-LM refuses "
                           f"the command (validate_args: 'max_position_embeddings ({context}) must be greater than "
                           f"or equal to seq_length ({seq_len})')")
    return context if context != seq_len else None


def model_parallel_degrees(arguments: list[str] | tuple[str, ...]) -> tuple[int, int, int]:
    """(TP, CP, PP) of Megatron's arguments: what a world size must be a multiple of, readable
    where the rest of the run is not (a missing vocabulary)."""
    return degrees(split_arguments(arguments).layout)


@dataclass(frozen=True, slots=True)
class ReadRun:
    """A user's run as the advisor prices it."""

    spec: LlamaSpec
    seq_len: int
    layout: Layout
    options: object
    """The training options (``advisor.options.TrainingOptions``)."""
    unpriced: tuple[str, ...]
    """Flags (and defaults) that change memory or time and are not priced, each named."""
    skipped: tuple[str, ...]
    """Flags a launch of the estimate does not write, as written ('--lr 3e-4'): those known to
    change neither, the tokenizer's (``ParsedArguments.skipped``), and those no reader here takes
    (also unpriced: ``_unknown_as_written``)."""
    vocab_source: str
    moe: object = None
    """The MoE part (``advisor.moe.readback.MoEFlags``: EP, ETP, dispatcher, routing, MTP) of a
    command with --num-experts; None for a dense one."""
    vocab_by_release: bool = False
    """Whether the vocabulary is NullTokenizer's, whose rows differ by release (``vocabulary``):
    the command alone then does not say them, the release does."""
    added: tuple[str, ...] = ()
    """Why the estimate's arguments carry a flag the command lacks, one line each: where the
    command as written stops before training and the flag lets it build (``_added_for_build``)."""


def read_run(arguments: list[str] | tuple[str, ...], *, name: str = "command", vocab_size: int | None = None,
             release=None) -> ReadRun:
    """Megatron's ``pretrain_gpt.py`` arguments -> the model, layout and options they train.
    ``vocab_size`` (the user's, for a tokenizer read from files) overrides the command's."""
    parsed = split_arguments(arguments)
    _refuse_unexpanded(parsed)
    _sequence_length_alias(parsed.model)
    command_vocab, source = vocabulary(parsed.model, release)
    if vocab_size is not None:
        command_vocab, source = vocab_size, f"--vocab-size {vocab_size} (given to the advisor)"
    if missing := _missing(parsed.model, command_vocab, parsed.layout):
        raise MissingInputs(missing)
    spec = model_spec(parsed.model, name=name, vocab_size=command_vocab)
    seq_len = int_value(parsed.model, "seq-length")
    moe_values, rest = ({}, parsed.rest) if "--num-experts" not in _flags(parsed.rest) else _moe_values(parsed.rest)
    if not moe_values:
        _refuse_expert_parallelism_without_experts(parsed.rest)
    mtp = int_value(moe_values, "mtp-num-layers") if moe_values else _dense_mtp_layers(rest)
    layout = read_layout(parsed.layout, spec.num_layers, mtp or 0, release, seq_len)
    spec, built = _as_built(spec, layout, bool(moe_values))
    _refuse_interleaving_without_p2p_overlap(layout, rest)
    _refuse_activations_with_swiglu(parsed.model, rest)
    fusion_off = _SOFTMAX_FUSION_OFF in rest
    rest = [word for word in rest if word != _SOFTMAX_FUSION_OFF]
    options, unpriced = training_options(rest, layout.tp, release)
    unpriced += _local_norms(options, layout.tp, parsed.model, bool(moe_values))
    left_out = _unknown_as_written(rest)
    if STEP_SCHEDULE in parsed.layout:
        unpriced.append(f"--{STEP_SCHEDULE} (priced at its last batch, {layout.global_batch_size}, the global batch "
                        "Megatron-LM gives the run; the steps before it train smaller batches, not priced)")
    if layout.rank_order != RANK_ORDER:
        unpriced.append(f"--use-tp-pp-dp-mapping (ranks ordered {layout.rank_order}: the time model places the "
                        f"data-parallel and pipeline groups on nodes in Megatron's default order, {RANK_ORDER})")
    if fusion_off:
        unpriced += _softmax_fusion_note(options)
    if not moe_values:
        unpriced += _local_attention_note(options)
        unpriced = [_DENSE_MTP_NOTE.format(mtp) if entry == "--mtp-num-layers" else entry for entry in unpriced]
    moe = None
    if moe_values:  # a mixture of experts (advisor.moe.readback)
        from advisor.moe import readback

        spec = readback.moe_spec(spec, moe_values)
        impl = options.attention.transformer_impl  # the training options' reading, the one place
        options, unpriced = _moe_local_attention(options, unpriced, rest, impl)
        moe, moe_unpriced = readback.read(moe_values, layout.tp, options.recomputation.recompute,
                                          recompute_method=_last_value(rest, "--recompute-method"),
                                          recompute_num_layers=_last_value(rest, "--recompute-num-layers"),
                                          transformer_impl=impl)
        _refuse_flex_without_deepep(moe, moe_values, release)
        unpriced = moe_unpriced + unpriced
    return ReadRun(spec=spec, seq_len=seq_len, layout=layout, options=options,
                   unpriced=tuple(built + _unpriced_model(parsed.model) + unpriced + [
                       f"{name} (a variable the script does not set: read as empty, as bash does; flags it may "
                       "hold are not priced)" for name in dict.fromkeys(parsed.unset)]),
                   skipped=tuple(parsed.skipped + left_out),
                   vocab_source=source, moe=moe, added=_added_for_build(options, parsed.model, rest),
                   vocab_by_release=vocab_size is None and parsed.model.get("tokenizer-type") == "NullTokenizer")


def _added_for_build(options, model: dict, rest: list[str]) -> tuple[str, ...]:
    """The line saying that the command as written dies when Megatron-LM builds its model and
    that the estimate's arguments add the flag that lets it: --no-persist-layer-norm for an RMSNorm
    model under --transformer-impl local (``advisor.options.local_spec``, which advisor-launch's
    preflight refuses without it; ``training_args`` writes it beside --transformer-impl local)."""
    from advisor.options.local_spec import NO_PERSIST_FLAG, local_persist_layer_norm_problem

    problem = local_persist_layer_norm_problem(
        transformer_impl=options.attention.transformer_impl, normalization=str(model.get("normalization", "LayerNorm")),
        no_persist_layer_norm=NO_PERSIST_FLAG in rest,
        fix=f"the command as written stops there; the estimate's arguments add {NO_PERSIST_FLAG}")
    return (problem,) if problem else ()


def _as_built(spec: LlamaSpec, layout: Layout, moe: bool) -> tuple[LlamaSpec, list[str]]:
    """The model with the decoder layers its pipeline ranks build, where uneven first/last stages
    build another number than --num-layers (core_v0.15.2: PP 2, first and last 10 of 32 build 20;
    ``megatron_layout._ends_and_middle``), and the note that says so; unchanged otherwise."""
    built = sum(layout.layers_per_stage)
    if built == spec.num_layers:
        return spec, []
    counts = "/".join(map(str, layout.layers_per_stage))
    if moe:  # which layers of --moe-layer-freq's pattern it builds is not read here
        raise AdvisorError(f"--num-layers {spec.num_layers} with uneven first/last stages that build {built} "
                           f"layers ({counts} over PP {layout.pp}): not priced for a mixture of experts; give "
                           "counts that add up to --num-layers")
    return replace(spec, num_layers=built), [f"--num-layers {spec.num_layers} (the pipeline ranks build {counts}: "
                                          f"priced as the {built} layers built)"]


def priced_otherwise(unpriced: list[str] | tuple[str, ...], not_launched: list[str] | tuple[str, ...]) -> list[str]:
    """The unpriced entries (``ReadRun.unpriced``) that a launch of the estimate writes otherwise
    than the command: a default or a flag priced as something else ('--normalization LayerNorm
    (priced as RMSNorm)', 'no --swiglu (...)'), whose launch trains another network. Not the flags
    it leaves out (``not_launched``: advisor-launch names them, for the user to give after --),
    nor a variable the script leaves unset (empty, as bash runs it)."""
    left_out = {entry.split()[0] for entry in not_launched}
    otherwise = []
    for entry in unpriced:
        words = entry.split()
        flag = words[1] if words[0] == "no" and len(words) > 1 else words[0]
        if flag.startswith("--") and flag not in left_out:
            otherwise.append(entry)
    return otherwise


def _sequence_length_alias(model: dict) -> None:
    """--encoder-seq-length is the older name of --seq-length: validate_args copies it over where
    --seq-length is not given and asserts that not both are (arguments.py, both releases)."""
    if "encoder-seq-length" not in model:
        return
    if "seq-length" in model:
        raise AdvisorError("--seq-length and --encoder-seq-length are both given: Megatron-LM refuses the command "
                           "(validate_args asserts one of them)")
    model["seq-length"] = model.pop("encoder-seq-length")


_NO_P2P_OVERLAP = "--no-overlap-p2p-communication"


def _refuse_activations_with_swiglu(model: dict, rest: list[str]) -> None:
    """--quick-geglu or --squared-relu beside --swiglu: core_transformer_config_from_args
    (arguments.py in core_v0.15.2, argument_utils.py in core_v0.19.0) sets each activation after
    'assert not args.swiglu'. --quick-geglu is read into the model (a gated MLP), --squared-relu is
    left in the rest (named, not priced)."""
    if not model.get("swiglu"):
        return
    given = {"--quick-geglu": model.get("quick-geglu"), "--squared-relu": "--squared-relu" in _flags(rest)}
    for flag in (flag for flag, present in given.items() if present):
        raise AdvisorError(f"{flag} with --swiglu: Megatron-LM refuses the command (building its "
                           "TransformerConfig: 'assert not args.swiglu'); keep one of them")


def _refuse_interleaving_without_p2p_overlap(layout: Layout, rest: list[str]) -> None:
    """Virtual stages at PP 2 with --no-overlap-p2p-communication: validate_args asserts PP > 2 for
    an interleaved schedule without p2p overlap, both releases (arguments.py: 'When interleaved
    schedule is used and p2p communication overlap is disabled, pipeline-model-parallel size should
    be greater than 2'); PP 1 with virtual stages is refused with the layout (``megatron_layout``)."""
    if layout.vpp > 1 and layout.pp <= 2 and _NO_P2P_OVERLAP in _flags(rest):
        raise AdvisorError(f"{_NO_P2P_OVERLAP} with {layout.vpp} virtual stages at PP {layout.pp}: Megatron-LM "
                           "refuses the command (validate_args: 'When interleaved schedule is used and p2p "
                           "communication overlap is disabled, pipeline-model-parallel size should be greater "
                           f"than 2'); drop {_NO_P2P_OVERLAP}, or the virtual stages, or use PP > 2")


def _refuse_flex_without_deepep(moe, moe_values: dict, release) -> None:
    """The flex dispatcher without --moe-enable-deepep on a release that asserts it when it builds the
    layer (``MegatronRelease.flex_needs_enable_deepep``): refused, as Megatron would refuse it."""
    from advisor.options.releases import release_defaults

    defaults = release_defaults(release)
    if moe.dispatcher == "flex" and defaults.flex_needs_enable_deepep and not moe_values.get("moe-enable-deepep"):
        raise AdvisorError(f"--moe-token-dispatcher-type flex needs --moe-enable-deepep on {defaults.name} "
                           "(megatron-core asserts it when it builds the MoE layer)")


def _missing(model: dict, vocab_size: int | None, layout: dict) -> list[Missing]:
    """Every input the reading needs that neither the command nor the advisor's options give:
    each is known without the others, so all are named at once. --micro-batch-size has no
    default in Megatron-LM (validate_args asserts it is set, both releases)."""
    missing = [Missing(f"--{flag}") for flag in (*_REQUIRED_MODEL, "seq-length") if flag not in model]
    if "micro-batch-size" not in layout:
        missing.append(Missing("--micro-batch-size"))
    if vocab_size is None:
        missing.append(Missing("its vocabulary", "its tokenizer is read from files",
                               "--vocab-size N (the tokenizer's size)"))
    return missing


_SOFTMAX_FUSION_OFF = "--no-masked-softmax-fusion"
_SHOWN_AS_WRITTEN = {"normalization", "position-embedding-type", "tokenizer-type"}
"""Model flags whose text is compared or shown, never parsed: an unexpanded one is named as written."""


def _priced_valued() -> set[str]:
    """The flags whose value the training options' parser or the MoE reader parses (their own
    messages would show it unexpanded)."""
    from advisor.moe import readback
    from advisor.options.flags import VALUED

    return {flag[2:] for flag in VALUED} | (readback.VALUED - readback.HARMLESS) | readback.MULTI


def _refuse_unexpanded(parsed: ParsedArguments) -> None:
    """One line for a priced value the script did not expand ($EP unset, $(nproc), $((N*8))),
    named as written; data paths and other unpriced values may stay unexpanded."""
    values = [(name, value) for name, value in {**parsed.model, **parsed.layout}.items()
              if isinstance(value, str) and name not in _SHOWN_AS_WRITTEN]
    priced, flag = _priced_valued(), None
    for word in parsed.rest:
        if word.startswith("--"):
            flag, has_value, value = word[2:].partition("=")
            values += [(flag, value)] if has_value and flag in priced else []
        elif flag in priced:
            values.append((flag, word))
    for name, value in values:
        if (problem := unexpanded_problem(name, value)) is not None:
            raise AdvisorError(problem)


def _moe_local_attention(options, unpriced: list[str], rest: list[str], impl: str):
    """(options, unpriced) of an MoE command on --transformer-impl local: its attention is
    megatron-core's unfused DotProductAttention, which the MoE model does not price; named as
    not priced and priced as flash attention, unless the command asks for unfused attention
    itself (then refused, as any unfused MoE attention)."""
    backend = _last_value(rest, "--attention-backend") or "auto"
    if impl != "local" or options.attention.flash_attention or backend in ("unfused", "local"):
        return options, unpriced
    note = ("--transformer-impl local (megatron-core's own attention, unfused: priced as flash attention, which "
            "the MoE model assumes)")
    return options.with_(flash_attention=True), [*unpriced, note]


def _softmax_fusion_note(options) -> list[str]:
    """What --no-masked-softmax-fusion leaves unpriced: only megatron-core's own attention fuses
    its scale, mask and softmax (dot_product_attention.py, ``FusedScaleMaskSoftmax``); Transformer
    Engine's flash or fused attention, priced by default, never runs it (Megatron-LM's own MoE
    examples pass the switch beside it)."""
    if options.attention.flash_attention and options.attention.transformer_impl != "local":
        return []
    return [f"{_SOFTMAX_FUSION_OFF} (megatron-core's own attention's softmax unfused, not priced)"]


def _local_norms(options, tp: int, model: dict, moe: bool) -> list[str]:
    """AdvisorError (one line) where Megatron-LM cannot build the command's model: --transformer-impl
    local with sequence parallelism and RMSNorm at TP > 1 (``advisor.options.local_spec``, the rule
    advisor-launch's preflight applies too), so there is nothing to price. A LayerNorm model
    (Megatron's default) then runs only where Apex is installed on the ranks' nodes: named."""
    from advisor.options.local_spec import local_sequence_parallel_problem

    impl, sequence_parallel = options.attention.transformer_impl, options.tensor_parallel.sequence_parallel
    normalization = str(model.get("normalization", "LayerNorm"))
    if problem := local_sequence_parallel_problem(transformer_impl=impl, sequence_parallel=sequence_parallel, tp=tp,
                                                  normalization=normalization, moe=moe):
        raise AdvisorError(problem)
    if impl != "local" or not sequence_parallel or tp == 1 or normalization != "LayerNorm":
        return []
    # models/backends.py: LNImpl is Apex's FusedLayerNorm where 'import apex' succeeds, else torch's
    # norm, which asserts 'sequence parallel not supported by torch LayerNorm' (transformer/torch_norm.py)
    return ["--transformer-impl local with --sequence-parallel and LayerNorm (megatron-core builds Apex's "
            "FusedLayerNorm where Apex is installed on the ranks' nodes; without Apex, torch's norm refuses sequence "
            "parallelism when the model is built)"]


UNFUSED_LOCAL_MEASURED = "3.7-4.2x"
"""megatron-core's own unfused attention (``DotProductAttention`` with the PyTorch softmax) over
the advisor's unfused-attention price, forward and backward, at 4096 and 8192 tokens and 4-32
heads on one H200 (``benchmarks/gpu/time_unfused_attention.py``,
``benchmarks/gpu/data/h200_unfused_attention.json``)."""


def _local_attention_note(options) -> list[str]:
    """What --transformer-impl local leaves underpriced in a dense run: its attention is priced as
    unfused attention with one fused softmax kernel (Transformer Engine's unfused backend), but
    megatron-core's own ``FusedScaleMaskSoftmax`` takes PyTorch's softmax, mask fill and copies above
    4096 tokens, and below them without Apex's compiled kernels (``fusions/fused_softmax.py``,
    ``is_kernel_available``), which one H200 timed at ``UNFUSED_LOCAL_MEASURED`` the price."""
    if options.attention.transformer_impl != "local":
        return []
    return [f"--transformer-impl local (megatron-core's own attention: priced as unfused attention with a fused "
            f"softmax; with PyTorch's softmax, above 4096 tokens or without Apex, one H200 took "
            f"{UNFUSED_LOCAL_MEASURED} that price at 4096-8192 tokens, more at 2048: "
            f"benchmarks/gpu/data/h200_unfused_attention.json)"]


def _last_value(rest: list[str], flag: str) -> str | None:
    """The value the command last gives ``flag`` ('--flag value' or '--flag=value'), None without
    one: for the readers that need a flag the training options keep only in part (--recompute-method
    and --recompute-num-layers, kept under full recomputation only)."""
    value = None
    for i, word in enumerate(rest):
        name, has_value, inline = word.partition("=")
        if name == flag:
            value = inline if has_value else rest[i + 1] if i + 1 < len(rest) and _is_value(rest[i + 1]) else None
    return value


_DENSE_MTP_NOTE = ("--mtp-num-layers {0} (multi-token prediction: megatron-core builds it for a dense GPT model "
                   "too, on the last stage, each MTP layer a transformer layer with eh_proj, norms and an output "
                   "layer and loss of its own; the advisor prices it for MoE models only, where advisor.moe.mtp's "
                   "MTP layer is the model's MoE layer, so this estimate leaves it out)")
"""--mtp-num-layers in a dense command: named with what it leaves out (gpt_builders.py builds the
MTP block from the decoder's own layer spec, MoE or not; validate_args asks only RoPE or no
position embedding)."""


def _dense_mtp_layers(rest: list[str]) -> int | None:
    """A dense command's --mtp-num-layers (what its --pipeline-model-parallel-layout's m layers must
    equal), None without it; the MoE reader takes an MoE command's (``advisor.moe.readback``)."""
    from advisor.moe.readback import flag_int  # the MoE reader's bounds: at least 0, at most limits.MTP_LAYERS

    text = _last_value(rest, "--mtp-num-layers")
    return None if text is None else flag_int({"mtp-num-layers": text}, "mtp-num-layers")


def _refuse_expert_parallelism_without_experts(rest: list[str]) -> None:
    """EP > 1 on a dense command: validate_args asserts 'num_experts must be non None to use expert
    model parallelism' (arguments.py, both releases); it was priced as the dense model."""
    from advisor.moe.readback import flag_int

    ep = flag_int(_moe_values(rest)[0], "expert-model-parallel-size", 1)
    if ep != 1:
        raise AdvisorError(f"--expert-model-parallel-size {ep} without --num-experts: Megatron-LM refuses expert "
                           "parallelism without experts (give --num-experts, or drop the EP flag)")


def _moe_values(rest: list[str]) -> tuple[dict, list[str]]:
    from advisor.moe import readback

    return readback.take(rest)


def _flags(arguments: list[str]) -> list[str]:
    return [word.partition("=")[0] for word in arguments if word.startswith("--")]


def training_options(rest: list[str], tp: int, release=None) -> tuple[object, list[str]]:
    """(``TrainingOptions``, unpriced flags) of the arguments that are neither model, layout nor
    harmless: ``advisor.options``' parser (the one place that knows training flags) with the
    release's defaults, plus every flag that neither it nor this module knows, named."""
    from advisor.options.flags import parse_training_args

    options, unpriced = parse_training_args(["--tensor-model-parallel-size", str(tp), *rest], release)
    return options, list(unpriced) + [_unknown_note(flag) for flag in _unknown(rest)]


def _unknown(rest: list[str]) -> list[str]:
    """The flags of ``rest`` that no reader here takes, each once."""
    from advisor.options.flags import MULTI, NO_EFFECT, SWITCHES, UNPRICED, VALUED

    return [flag for flag in dict.fromkeys(_flags(rest))
            if flag not in VALUED | SWITCHES | UNPRICED | MULTI | NO_EFFECT.keys()]


def _unknown_as_written(rest: list[str]) -> list[str]:
    """The flags no reader here takes, each as written with the values after it ('--empty-unused-
    memory-level 2'): a launch of the estimate does not write them (it writes what was priced), so
    they join the flags it leaves out (``ReadRun.skipped``), which advisor-launch names for the
    user to give after -- where the run needs them, rather than dropping them unsaid."""
    unknown, written = set(_unknown(rest)), []
    for i, word in enumerate(rest):
        if word.partition("=")[0] in unknown:
            end = i + 1
            while "=" not in word and end < len(rest) and _is_value(rest[end]):
                end += 1
            written.append(" ".join(as_written(part) for part in rest[i:end]))
    return written


@functools.cache
def _flag_spellings() -> tuple[frozenset[str], list[str]]:
    """(every flag of the releases' own parsers, ``megatron_flag_table``; every flag a reader here
    takes, sorted): read once, not once per unknown flag."""
    from advisor.moe import readback
    from advisor.options.flags import MULTI, NO_EFFECT, SWITCHES, UNPRICED, VALUED

    megatrons = frozenset(_megatron_value_counts())
    read_here = ({f"--{name}" for name in (_MODEL_VALUED | _LAYOUT_VALUED | HARMLESS_VALUED | set(_MULTI_VALUED)
                                           | readback.VALUED | readback.SWITCHES | readback.MULTI | _switches())}
                 | VALUED | SWITCHES | UNPRICED | MULTI | NO_EFFECT.keys())
    return megatrons, sorted(read_here)


def unpriced_flag_note(flag: str) -> str | None:
    """How ``estimate --from-command`` names ``flag`` where a command gives it and the estimate
    does not price it: a flag known to change memory or time that the options do not describe
    (``options.flags.UNPRICED``: '--fp4-format (not priced)'), one read and priced otherwise
    (``advisor.moe.readback.NAMED``), or one no reader here takes (``_unknown_note``); None where
    a reader takes it (priced, or changing no price: data, logging, ...). What advisor-launch
    says of a user's flags after '--' (``launch.arguments.unpriced_extras_note``)."""
    from advisor.moe.readback import NAMED
    from advisor.options.flags import UNPRICED

    if flag[2:] in NAMED:
        return NAMED[flag[2:]]
    if flag in UNPRICED:
        return f"{flag} (not priced)"
    if flag not in _read_here():
        return _unknown_note(flag)
    return None


@functools.cache
def _read_here() -> frozenset[str]:
    return frozenset(_flag_spellings()[1])


def _unknown_note(flag: str) -> str:
    """How a flag no reader here takes is named: a mixture-of-experts flag in a dense command (no
    --num-experts: Megatron builds no experts), a flag of no release the advisor knows near one the
    advisor reads (a typo Megatron's argparse would refuse at start-up: ``megatron_flag_table``,
    every flag of each release's parser), or unknown."""
    import difflib

    from advisor.moe import readback

    if flag[2:] in readback.VALUED | readback.SWITCHES | readback.MULTI:
        return f"{flag} (a mixture-of-experts flag, and the command has no --num-experts: nothing it prices)"
    megatrons, read_here = _flag_spellings()
    if flag in megatrons:
        return f"{flag} (not known to the advisor)"  # Megatron's own: not a typo
    near = difflib.get_close_matches(flag, read_here, n=1, cutoff=0.9)
    return f"{flag} (not known to the advisor{f'; did you mean {near[0]}?' if near else ''})"
