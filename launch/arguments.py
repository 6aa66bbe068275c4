"""Megatron-LM argument lists as flags and values; the whole command line of a launch (the
input's arguments, ``--mock-data``'s, the user's own after ``--``); and the conflicts between
what ``advisor-launch`` generates and what the user adds.

A conflict is decided flag by flag. Each generated group of arguments (the input's, and those of
``--mock-data``) *owns* a set of flags:

- a user flag that the group also sets, with a different value, conflicts with it
  (``--micro-batch-size 4`` against the plan's ``--micro-batch-size 2``); the same value is fine;
- a user flag that the group owns but does not set conflicts too, because leaving it unset was a
  decision (``--recompute-granularity full`` against an estimate made without recomputation,
  ``--fp16`` against ``--bf16``, ``--pipeline-model-parallel-layout`` against a plan whose split
  is Megatron's default), except where the user's value restates what the group assumed
  (``--attention-backend flash`` when the estimate assumed FlashAttention).

The input's group owns every flag that decides the model, the parallel layout, the pipeline
split, the batch, or a memory assumption of the estimator (``DECIDED_FLAGS``); every other flag
(data, tokenizer, iterations, learning rate, logging, checkpoints) is the user's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from advisor.errors import AdvisorError
from advisor.models import LlamaSpec
from advisor.moe import flags as moe_flags
from advisor.options.flags import SWIGLU_UNFUSED_FLAG, release_spelling
from advisor.options.training import Recomputation
from advisor.releases import FSDP_GRAD_COMM, FSDP_MAIN_GRADS, FSDP_MAIN_PARAMS
from advisor.row_flags import Flag, flag_values, is_flag, parse_flags  # read here, and by the launch's other modules
from launch.megatron_flags import TYPES, value_types, values_taken
from launch.megatron_versions import MegatronVersion, check_flags, check_mock_data, check_recomputation

MODEL_FLAGS = (
    "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--group-query-attention",
    "--num-query-groups", "--kv-channels", "--seq-length", "--max-position-embeddings",
    # --squared-relu and --quick-geglu: other MLP activations, which megatron-core refuses beside
    # --swiglu ('assert not args.swiglu' in core_transformer_config_from_args: megatron/training/
    # arguments.py in core_v0.15.2, argument_utils.py in core_v0.19.0)
    "--normalization", "--norm-epsilon", "--swiglu", "--squared-relu", "--quick-geglu", "--position-embedding-type",
    "--rotary-base", "--rotary-percent",
    "--use-rope-scaling", "--rope-scaling-factor", "--attention-dropout", "--hidden-dropout", "--disable-bias-linear",
    "--add-bias-linear", "--add-qkv-bias",
    "--untie-embeddings-and-output-weights",
)
PIPELINE_FLAGS = (
    "--pipeline-model-parallel-size", "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
    "--pipeline-model-parallel-layout", "--num-layers-per-virtual-pipeline-stage",
    "--num-virtual-stages-per-pipeline-rank", "--account-for-embedding-in-pipeline-split",
    "--account-for-loss-in-pipeline-split",
)
LAYOUT_FLAGS = ("--tensor-model-parallel-size", "--context-parallel-size", *PIPELINE_FLAGS)
# --step-batch-size-schedule: its last batch is the run's global batch, and core_v0.19.0's
# validate_args raises 'Cannot specify both --step-batch-size-schedule and --global-batch-size'
BATCH_FLAGS = ("--micro-batch-size", "--global-batch-size", "--rampup-batch-size", "--step-batch-size-schedule")
MEMORY_FLAGS = (
    "--bf16", "--fp16", "--fp8-format", "--use-distributed-optimizer", "--sequence-parallel",
    "--accumulate-allreduce-grads-in-fp32", "--grad-reduce-in-bf16", "--recompute-activations",
    "--recompute-granularity", "--recompute-method", "--recompute-num-layers", "--recompute-modules",
    "--attention-backend", "--use-flash-attn", "--make-vocab-size-divisible-by", "--use-megatron-fsdp",
    "--use-torch-fsdp2", "--data-parallel-sharding-strategy", "--overlap-grad-reduce", "--overlap-param-gather",
    "--tp-comm-overlap", "--optimizer-cpu-offload", "--use-precision-aware-optimizer", "--optimizer-offload-fraction",
    "--fp8-recipe", "--fp8-param-gather", "--fp8-amax-history-len", "--no-create-attention-mask-in-dataloader",
    "--transformer-impl", "--disable-tp-comm-overlap-ag", "--disable-tp-comm-overlap-rs", "--tp-comm-overlap-rs-dgrad",
    "--disable-tp-comm-bulk-dgrad", "--disable-tp-comm-bulk-wgrad", FSDP_MAIN_GRADS, FSDP_MAIN_PARAMS, FSDP_GRAD_COMM,
    SWIGLU_UNFUSED_FLAG,
    # core_v0.19.0's spellings of the overlap's sub-options, its user buffer config, the
    # precision-aware optimizer's state dtypes, the loss kernel and the data loader's mask flags:
    # each read by advisor.options.flags into an option the price depends on
    "--no-tp-comm-overlap-ag", "--no-tp-comm-overlap-rs", "--no-tp-comm-bulk-dgrad", "--no-tp-comm-bulk-wgrad",
    "--tp-comm-overlap-cfg", "--exp-avg-dtype", "--exp-avg-sq-dtype", "--main-grads-dtype", "--main-params-dtype",
    "--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "--eod-mask-loss", "--reset-attention-mask",
    "--reset-position-ids",
)
"""Every flag behind a priced training option (``advisor.options.training_args``, and
``FSDP_MAIN_GRADS``, which a launch on core 0.19 adds: ``advisor.options.flags.release_spelling``) is decided."""
DECIDED_FLAGS = frozenset(MODEL_FLAGS + LAYOUT_FLAGS + BATCH_FLAGS + MEMORY_FLAGS + moe_flags.MODEL_FLAGS
                          + moe_flags.LAYOUT_FLAGS + ("--encoder-seq-length",))
"""Flags whose value (or absence) the advisor decided: a user's value for them must agree. A
dense row decides the MoE flags too: it has no experts."""

TOKENIZER_FLAGS = frozenset({"--tokenizer-type", "--tokenizer-model", "--vocab-file", "--merge-file", "--vocab-size"})
"""The tokenizer: a --data-path of the user's does not stand for it (``launch.inputs``' note)."""
DATA_FLAGS = TOKENIZER_FLAGS | {
    "--mock-data", "--data-path", "--train-data-path", "--valid-data-path", "--test-data-path", "--data-args-path",
    "--per-split-data-args-path",
}
"""What ``--mock-data`` decides: the data and the tokenizer."""

# Flags that decide the same thing: when a user flag is unset by a group, these are what it sets instead.
_RELATED = (
    ("--bf16", "--fp16", "--fp8-format"),
    ("--accumulate-allreduce-grads-in-fp32", "--grad-reduce-in-bf16"),
    ("--recompute-activations", "--recompute-granularity", "--recompute-method", "--recompute-num-layers",
     "--recompute-modules"),
    PIPELINE_FLAGS,
    ("--num-attention-heads", "--group-query-attention", "--num-query-groups", "--kv-channels"),
    ("--attention-backend", "--use-flash-attn"),
    ("--use-rope-scaling", "--rope-scaling-factor"),
    ("--disable-bias-linear", "--add-bias-linear", "--add-qkv-bias"),
    BATCH_FLAGS,
    ("--swiglu", "--squared-relu", "--quick-geglu"),
    # --seq-length's older name: validate_args asserts that not both are given (arguments.py)
    ("--seq-length", "--encoder-seq-length"),
    tuple(sorted(DATA_FLAGS)),
    *moe_flags.RELATED_FLAGS,
)

# Values of an unset flag that restate what the generated arguments assume.
_ASSUMED_WHEN_UNSET = {
    "--attention-backend": {("flash",), ("auto",)},  # no --attention-backend: FlashAttention assumed
    "--use-flash-attn": {()},
    "--rope-type": {("rope",)},  # no --rope-type: RoPE (it picks YaRN for MLA only, and MLA rows set it)
    # no --transformer-impl: Transformer Engine, restated; 'local' stays the user's (a CPU test launch
    # over gloo needs megatron-core's own modules), with the launch's note that it is not what was priced
    "--transformer-impl": {("transformer_engine",), ("local",)},
    # Megatron's defaults, restated (arguments.py, both releases)
    **{flag: {("fp32",)} for flag in ("--exp-avg-dtype", "--exp-avg-sq-dtype", "--main-grads-dtype",
                                      "--main-params-dtype")},
    "--cross-entropy-fusion-impl": {("native",)},
}

# How to price a decided flag that a row left unset, where an advisor switch prices it. Megatron-LM
# has no positive spelling of --no-bias-swiglu-fusion (arguments.py, core_v0.15.2 and core_v0.19.0:
# store_false only), so only a row priced fused can conflict with it.
_PRICED_BY = {
    SWIGLU_UNFUSED_FLAG: f"advisor estimate/sweep/profile plan {SWIGLU_UNFUSED_FLAG} prices the eager SwiGLU",
    "--moe-shared-expert-overlap": "advisor estimate/sweep --moe-shared-expert-overlap prices the shared experts "
                                   "beside the dispatch",
}


def _given(extras: Sequence[str]) -> list[tuple[str, list[str], str | None]]:
    """Each flag of ``extras`` with the values that follow it, as ``parse_flags`` reads
    them (up to the next ``--flag``: a single dash does not end them, so ``--lr -1`` and
    ``--adam-eps 1e-8`` keep theirs), and the flag that ends them (None at the end);
    ``--flag=value`` is one value and the words after it more (argparse's extras), ``--flag=`` the
    empty value '' (ended by '=')."""
    found = []
    for i, word in enumerate(extras):
        if not is_flag(word):
            continue
        name, equals, value = word.partition("=")
        end = next((j for j in range(i + 1, len(extras)) if is_flag(extras[j])), len(extras))
        after = list(extras[i + 1:end])
        if equals:
            found.append((name, [value, *after], "="))  # '--lr= 1': argparse reads '' (float fails) and '1' extra
            continue
        found.append((name, after, extras[end].partition("=")[0] if end < len(extras) else None))
    return found


def _type_problems(name: str, values: Sequence[str], kind: str | None) -> list[str]:
    """Each of ``values`` that the flag's argparse type (``kind``: 'int', 'float' or None) refuses:
    argparse calls it on every value (``ArgumentParser._get_value``) and exits with "invalid int
    value" where it raises, so the same call decides here (int('1.5') and int('1e3') fail,
    float('inf') and float('1e-4') pass). Other types (str, Megatron's own converters) pass."""
    if kind is None:
        return []
    problems = []
    for value in values:
        try:
            TYPES[kind](value)
        except ValueError:
            problems.append(f"{name} (after --) takes {'an' if kind == 'int' else 'a'} {kind}, got {value!r} "
                            f"(argparse's {kind}({value!r}) fails)")
    return problems


_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")
"""What argparse reads as a negative number, not an option: ``ArgumentParser.__init__``'s
``_negative_number_matcher`` in Python 3.8 to 3.13 (Lib/argparse.py), which Megatron's parser
applies, having no option that looks like a negative number. '-1', '-0.5', '-.5' pass; '-1e-8',
'-1.', '-inf' and '-1_000' do not (Python 3.14 widened the pattern to exponents and underscores;
the '=' form that the refusal asks for is read alike by every version)."""


def read_as_option(word: str) -> bool:
    """Whether argparse takes ``word``, given as a word of its own, for an option string rather
    than a value (``ArgumentParser._parse_optional``): it starts with '-', is not '-' alone, is not
    a negative number to ``_NEGATIVE_NUMBER``, and holds no space. The flag before it then lacks
    its value ('--adam-eps -1e-8': "argument --adam-eps: expected one argument") on every rank."""
    return word.startswith("-") and len(word) > 1 and not _NEGATIVE_NUMBER.match(word) and " " not in word


def _option_like_values(extras: Sequence[str]) -> dict[int, str]:
    """The problem of each flag after ``--`` (by its place among the flags, as ``_given`` lists
    them) that is followed by a word argparse reads as an option (``read_as_option``), where
    ``parse_flags`` and ``check_values`` count it as the flag's value. The first word after the
    flag can be given as ``--flag=WORD``, which argparse reads as the value whatever it is."""
    problems: dict[int, str] = {}
    place, name, first = -1, None, False
    for word in extras:
        if is_flag(word):
            place, (name, equals, _) = place + 1, word.partition("=")
            first = not equals
            continue
        if name is not None and place not in problems and read_as_option(word):
            remedy = f"write {name}={word}" if first else "only -1 and -0.5 are read as negative numbers"
            problems[place] = (f"{name} (after --) is followed by {word!r}, which Megatron's argparse reads as an "
                               f"option, not as a value ({remedy})")
        first = False
    return problems


def _leading_words(extras: Sequence[str]) -> str | None:
    """The problem of the words after ``--`` that come before its first flag and that no Megatron
    parser takes, or None: pretrain_gpt.py has no positional arguments, so argparse refuses a
    word such as 'x', '' or '—lr' ("unrecognized arguments") on every rank, and a second '--'
    too, or every word after it (Python 3.11's argparse keeps a lone '--' as one). ``parse_flags``
    drops them, so nothing else here saw them. A word that reads as an option ('-x') is left to
    Megatron, as an unknown flag is."""
    leading = []
    for word in extras:
        if is_flag(word):
            break
        leading.append(word)
    positional = [word for word in leading if word in ("-", "--") or not word.startswith("-")]
    if not positional:
        return None
    shown = " ".join(repr(word) for word in positional[:3]) + (" ..." if len(positional) > 3 else "")
    if "--" in positional:
        return (f"{shown} (after --): a second '--' ends Megatron's options, and its argparse refuses it or the words "
                "after it as positional arguments, which pretrain_gpt.py does not take")
    return f"{shown} (after --) is no flag nor a flag's value: pretrain_gpt.py takes no positional arguments"


def check_values(rules: MegatronVersion, extras: Sequence[str]) -> None:
    """AdvisorError, one line naming each flag after ``--`` that gets fewer values than its
    release's parser needs (``launch.megatron_flags``: ``--lr`` at the end, or before another flag),
    more than it takes (``--lr 3e-4 5``, ``--bf16 true``: argparse refuses the rest as
    unrecognized arguments), or a value its int or float type refuses (``--lr abc``,
    ``--num-layers 1.5``, ``--lr=abc``), or a word after it that argparse reads as an option
    (``--adam-eps -1e-8``: ``_option_like_values``). A flag the release lacks is left to
    ``check_flags`` and Megatron."""
    taken, types, option_like = values_taken(rules), value_types(rules), _option_like_values(extras)
    problems = [problem] if (problem := _leading_words(extras)) is not None else []
    for place, (name, values, then) in enumerate(_given(extras)):
        if place in option_like:  # argparse counts and converts otherwise than read here: this one says why
            problems.append(option_like[place])
            continue
        least, most = taken.get(name, (0, None))
        if then == "=" and name in taken:  # argparse gives '--flag=value' one slot, whatever the nargs
            most = min(1, most if most is not None else 1)
        count, got = len(values), " ".join(values)
        empty = then == "=" and values[0] == "" and least > 0 and name in types  # '--lr=': float('') fails
        if then == "=":
            got = f"{name}={got}"
        if then == "=" and most == 0:  # argparse: "ignored explicit argument", even an empty one
            problems.append(f"{name} (after --) is a switch and takes no value, got {got}")
        elif count < least or empty:
            wanted = "a value" if least == 1 else f"{least} values"
            where = (f" and {name}= gives it empty" if empty else f", got {count}" if count
                     else " and nothing follows it" if then is None else f" and {then} follows it")
            problems.append(f"{name} (after --) needs {wanted}{where}")
        if most is not None and count > most and not (then == "=" and most == 0):
            extra = " ".join(values[most:])
            takes = "is a switch and takes no value" if most == 0 else \
                f"takes {'one value' if most == 1 else f'{most} values'}"
            problems.append(f"{name} (after --) {takes}, got {got!r} (the extra {extra!r} too)")
        if not empty:
            problems += _type_problems(name, values[:most], types.get(name))  # those argparse would convert
    if problems:
        raise AdvisorError(f"{'; '.join(problems)}: {rules.name}'s argument parser refuses that on every rank at "
                           "start-up (give the values it takes, or leave the flag out)")


def _same(a: Sequence[str], b: Sequence[str]) -> bool:
    """Equal values, numbers compared as numbers ('2' == '2.0', '1e-4' == '0.0001')."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        try:
            if float(x) != float(y):
                return False
        except ValueError:
            if x != y:
                return False
    return True


@dataclass(frozen=True, kw_only=True, slots=True)
class ArgGroup:
    """Arguments that ``advisor-launch`` generates, where they come from, and the flags they own."""

    source: str
    """Where they come from, for messages: 'the sweep row (rank 1 of sweep.json)', '--mock-data'."""
    args: tuple[str, ...]
    owns: frozenset[str]

    def conflict(self, flag: Flag) -> str | None:
        """Why the user's ``flag`` contradicts this group, or None."""
        if flag.name not in self.owns:
            return None
        ours = flag_values(self.args)
        if flag.name in ours:
            if _same(ours[flag.name], flag.values):
                return None
            return f"{flag} (after --) conflicts with {Flag(flag.name, ours[flag.name])} from {self.source}"
        if flag.values in _ASSUMED_WHEN_UNSET.get(flag.name, ()):
            return None
        related = next((group for group in _RELATED if flag.name in group), ())
        instead = [str(Flag(name, ours[name])) for name in related if name in ours]
        if instead:
            return f"{flag} (after --) conflicts with {', '.join(instead)} from {self.source}"
        hint = f" ({_PRICED_BY[flag.name]})" if flag.name in _PRICED_BY else ""
        return f"{flag} (after --) conflicts with {self.source}, which leaves {flag.name} unset{hint}"


def check_conflicts(groups: Sequence[ArgGroup], extras: Sequence[str]) -> None:
    """Raise AdvisorError naming every conflict between the user's ``extras`` and the groups."""
    problems = [problem for flag in parse_flags(extras) for group in groups
                if (problem := group.conflict(flag)) is not None]
    if problems:
        raise AdvisorError("; ".join(dict.fromkeys(problems)) + " (the input decides these; change the input instead)")


def check_moe_refusals(rules: MegatronVersion, decided: Sequence[str], extras: Sequence[str], source: str) -> None:
    """AdvisorError where the input's flags (``decided``) and the user's after '--' (``extras``)
    together give an MoE combination megatron-core refuses on every rank when it builds its
    config: --moe-shared-expert-overlap, the user's or the row's own (a row checked against the
    newest release's rules: ``advisor.saved_row.moe_row_settings``), beside the dispatcher, EP
    overlap and recomputed modules, on the release launched
    (``advisor.moe.overlap.shared_expert_overlap_problem``). Megatron's own default dispatcher is
    allgather (arguments.py, both releases). And Megatron-FSDP on a release whose Megatron-FSDP
    cannot wrap an MoE model (``advisor.moe.fsdp.release_problem``: it fails at model wrapping),
    which the MoE model refuses to price there."""
    from advisor.moe.fsdp import release_problem
    from advisor.moe.overlap import shared_expert_overlap_problem

    values = flag_values([*decided, *extras])
    if "--num-experts" not in values:
        return
    if "--use-megatron-fsdp" in values and (problem := release_problem(rules)):
        raise AdvisorError(f"{source}: {problem[0]} (megatron_fsdp.py get_expert_dp_group raises AttributeError): "
                           "launch it on a core 0.19 checkout, or price it without --use-megatron-fsdp")
    if "--moe-shared-expert-overlap" not in values:
        return
    problem = shared_expert_overlap_problem(
        dispatcher=(values.get("--moe-token-dispatcher-type") or ("allgather",))[0],
        a2a_overlap="--overlap-moe-expert-parallel-comm" in values,
        recompute_modules=values.get("--recompute-modules") or (), release=rules,
        shared_experts="--moe-shared-expert-intermediate-size" in values)
    if problem:
        whose = (f"{source} gives it" if "--moe-shared-expert-overlap" in flag_values(decided)
                 else f"the flag is yours (after --), the rest {source}'s")
        raise AdvisorError(f"{problem}: {whose}; Megatron-LM would refuse the command on every rank at start-up")


# --- the whole command line ------------------------------------------------------------------


def model_rows(spec: LlamaSpec, decided: Sequence[str]) -> int:
    """The embedding rows Megatron builds for ``spec`` with these arguments: v padded to a
    multiple of --make-vocab-size-divisible-by (128 unless given) x TP, as the estimator prices it."""
    return padded_rows(spec.vocab_size, decided)


def padded_rows(tokens: int, decided: Sequence[str]) -> int:
    """The embedding rows of a tokenizer of ``tokens`` tokens: Megatron's _vocab_size_with_padding
    (megatron/training/tokenizer/tokenizer.py) pads to a multiple of --make-vocab-size-divisible-by x TP."""
    from advisor.equations import padded_vocab_size

    values = flag_values(decided)
    divisible_by = int((values.get("--make-vocab-size-divisible-by") or ("128",))[0])
    tp = int((values.get("--tensor-model-parallel-size") or ("1",))[0])
    return padded_vocab_size(tokens, divisible_by, tp)


def _vocab_multiple(decided: Sequence[str]) -> int:
    """What ``padded_rows`` pads to a multiple of (for messages)."""
    return padded_rows(1, decided)


def check_null_tokenizer(rules: MegatronVersion, model: LlamaSpec, decided: Sequence[str], args: Sequence[str],
                         source: str) -> str | None:
    """The user's own data and tokenizer (``args``: theirs after '--', with the job file's), as
    ``mock_data_args`` sizes the launcher's: AdvisorError, one line, where their --mock-data cannot
    feed the model (``check_mock_data``), or where their NullTokenizer's --vocab-size V builds
    embedding rows other than those ``source`` priced (``model_rows``): V + the release's extra rows
    (``null_tokenizer_extra_rows``: core_v0.15.2's end-of-document token), padded as Megatron pads.
    Another tokenizer's rows come from its files, which are not read here."""
    values = flag_values(args)
    priced, mock_data = model_rows(model, decided), "--mock-data" in values
    if mock_data:  # the model itself: no --vocab-size makes the priced rows feedable
        check_mock_data(rules, priced, model.vocab_size)
    if values.get("--tokenizer-type") == ("NullTokenizer",) and "--vocab-size" not in values:
        # core_v0.15.2 asserts args.vocab_size (tokenizer.py, build_tokenizer); core_v0.19.0's
        # NullTokenizer takes int(vocab_size): both fail on every rank at start-up
        raise AdvisorError(f"--tokenizer-type NullTokenizer (after --) without --vocab-size fails on every rank at "
                           f"start-up (its vocabulary is built from it): give --vocab-size "
                           f"{rules.null_tokenizer_vocab_flag(model.vocab_size)}, which builds the priced rows on "
                           f"{rules.name}")
    vocab = values.get("--vocab-size") or ("",)
    if values.get("--tokenizer-type") != ("NullTokenizer",) or not vocab[0].isdecimal():
        return None  # a value argparse refuses (type=int) is Megatron's to say
    size = int(vocab[0])
    tokens = size + rules.null_tokenizer_extra_rows
    built = padded_rows(tokens, decided)
    if built == priced:  # then --mock-data feeds it too: check_mock_data passed the priced rows
        return None
    how = f"{size:,} + its NullTokenizer's end-of-document token" if rules.null_tokenizer_extra_rows else \
        f"{size:,} as given"
    padding = f", padded to a multiple of {_vocab_multiple(decided)}" if built != tokens else ""
    highest = rules.mock_data_max_token_id
    instead = " (or leave data and tokenizer to advisor-launch --mock-data)" if mock_data else ""
    starved = (f", and its --mock-data feeds token ids up to {highest} whatever the vocabulary "
               "(MockGPTLowLevelDataset), so the run would fail at the first iteration"
               if mock_data and highest is not None and built <= highest else "")
    line = (f"--tokenizer-type NullTokenizer --vocab-size {size} (after --) builds {built:,} embedding rows "
            f"on {rules.name} ({how}{padding}), where {source} priced {priced:,} (v {model.vocab_size:,})"
            f"{starved}: give --vocab-size {rules.null_tokenizer_vocab_flag(model.vocab_size)}, which builds "
            f"the priced rows on that release{instead}")
    if starved:  # the run cannot start
        raise AdvisorError(line)
    # it runs, on a vocabulary other than the priced one (a few rows, or the user's choice): said, not refused
    return f"warning: {line}"


def mock_data_args(spec: LlamaSpec, rules: MegatronVersion, decided: Sequence[str] = ()) -> list[str]:
    """Megatron-LM's mock dataset with its NullTokenizer, sized so that this release builds the
    vocabulary the estimate counted (``launch.megatron_versions``: core_v0.15.2's NullTokenizer adds
    an end-of-document token, core_v0.19.0's does not); AdvisorError if its mock data cannot feed
    the model (core_v0.15.2 draws token ids up to 4094 whatever the vocabulary)."""
    vocab_flag = rules.null_tokenizer_vocab_flag(spec.vocab_size)
    if vocab_flag < 1:
        raise AdvisorError(f"--mock-data needs a vocabulary of at least {1 + rules.null_tokenizer_extra_rows} tokens "
                           f"with {rules.name}, the model has {spec.vocab_size}")
    check_mock_data(rules, model_rows(spec, decided), spec.vocab_size)
    return ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", str(vocab_flag)]


def recomputation(args: Sequence[str]) -> Recomputation | None:
    """The full recomputation an argument list asks for (--recompute-granularity full, its method
    and N, as argparse keeps them), or None: without it, or where Megatron refuses the flags itself."""
    values = flag_values(args)
    method, layers = values.get("--recompute-method") or ("",), values.get("--recompute-num-layers") or ("",)
    if values.get("--recompute-granularity") != ("full",) or not layers[0].isdecimal():
        return None
    try:
        return Recomputation(recompute="full", recompute_method=method[0], recompute_num_layers=int(layers[0]))
    except AdvisorError:  # no method, or one Megatron does not know: its own validate_args says so
        return None


USER_LABEL = "yours (after --)"

def unpriced_extras_note(extras: Sequence[str], source: str, unknown: Sequence[str] = (),
                         named_by_input: Sequence[str] = ()) -> str | None:
    """The note naming the user's flags after '--' that the input did not price, in the words
    ``advisor estimate --from-command`` names them with (``advisor.megatron_readback.unpriced_flag_note``),
    or None where there are none. Not named: the flags the input decides (``DECIDED_FLAGS``: a
    different value is a conflict, the same one restates it), the data's (``DATA_FLAGS``),
    ``unknown``: flags the release's parser lacks, warned of apart (``unknown_flags``), and those
    the input itself names as not priced (``named_by_input``: an estimate read from a command, its
    'unpriced' entries, which told the user to give them after --)."""
    from advisor.megatron_readback import unpriced_flag_note

    skipped = DECIDED_FLAGS | DATA_FLAGS | set(unknown) | {entry.split()[0] for entry in named_by_input if entry}
    named = [note for flag in flag_values(extras) if flag not in skipped
             and (note := unpriced_flag_note(flag)) is not None]
    if not named:
        return None
    return f"advisor-launch: {source} did not price what you give after --, which the launch runs: {'; '.join(named)}"


@dataclass(frozen=True, kw_only=True, slots=True)
class CommandLine:
    """The Megatron-LM arguments of one launch, in labelled groups (for the Slurm script's comments)."""

    groups: tuple[tuple[str, tuple[str, ...]], ...]
    unknown: tuple[UnknownFlag, ...] = ()
    """Each flag after '--' that the release's parser lacks (``unknown_flags``)."""
    notes: tuple[str, ...] = ()
    """Warnings about what runs otherwise than priced (``check_null_tokenizer``'s vocabulary,
    ``unpriced_extras_note``'s flags)."""

    @property
    def args(self) -> list[str]:
        return [arg for _, args in self.groups for arg in args]


def compose(source: str, decided: Sequence[str], *, rules: MegatronVersion, model: LlamaSpec,
            mock_data: bool = False, extras: Sequence[str] = (), job: ArgGroup | None = None,
            chunk_layers: Sequence[int] | None = None, named_by_input: Sequence[str] = ()) -> CommandLine:
    """The input's arguments (``decided``, from ``source``, for ``model``), ``--mock-data``'s if
    asked, the ``job``'s (``launch.job``: its file, its schedule), then the user's ``extras``
    unchanged; AdvisorError on a user flag without the values it needs, on a conflict, on a flag the
    Megatron-LM release ``rules`` lacks, on mock data (the launcher's or the user's own) that
    release cannot feed the model (a NullTokenizer of the user's own that builds other rows than
    were priced is a warning in ``notes``: ``check_null_tokenizer``; so is a flag of theirs the
    advisor does not price and the input did not name (``named_by_input``: ``unpriced_extras_note``), or,
    given the layers of each model chunk (``chunk_layers``),
    on a --recompute-num-layers that release fails on with them (``check_recomputation``)."""
    check_values(rules, extras)  # first: a flag without its value would misread the flags after it
    groups = [ArgGroup(source=source, args=tuple(release_spelling(rules, decided)), owns=DECIDED_FLAGS)]
    if mock_data:
        groups.append(ArgGroup(source="--mock-data", args=tuple(mock_data_args(model, rules, decided)),
                               owns=DATA_FLAGS))
    if job is not None:
        _check_job_data(job, mock_data)
        groups.append(job)
    check_conflicts(groups, rules.own_spelling(extras))  # a restated deprecated spelling is no conflict
    check_moe_refusals(rules, decided, extras, source)
    vocabulary = None
    if not mock_data:  # the user's own data and tokenizer, after '--' (and the job file's tokenizer)
        vocabulary = check_null_tokenizer(rules, model, decided, [*(job.args if job is not None else ()), *extras],
                                          source)
    check_flags(rules, [arg for group in groups for arg in group.args])
    if chunk_layers is not None:
        check_recomputation(rules, recomputation([*decided, *extras]), chunk_layers, source)
    labelled = [(group.source, group.args) for group in groups] + [(USER_LABEL, tuple(extras))]
    unknown = tuple(unknown_flags(rules, extras))
    notes = (vocabulary, unpriced_extras_note(extras, source, [flag.name for flag in unknown], named_by_input))
    return CommandLine(groups=tuple(labelled), unknown=unknown, notes=tuple(note for note in notes if note))


def _check_job_data(job: ArgGroup, mock_data: bool) -> None:
    """AdvisorError where the job file gives data or a tokenizer (its data_path, tokenizer_type,
    tokenizer_model) beside mock data (--mock-data, or its own mock_data), which gives both: the
    launch had --mock-data and --data-path, and Megatron-LM asserts a single data source
    (arguments.py, validate_args, both releases) on every rank at start-up; a tokenizer of the
    job's replaced the NullTokenizer that --mock-data sized. After '--' they are refused as
    conflicts (``check_conflicts``)."""
    given = [flag for flag in flag_values(job.args) if flag in DATA_FLAGS]
    if mock_data and given:
        raise AdvisorError(f"{', '.join(given)} from {job.source} conflicts with mock data (--mock-data, or the job "
                           "file's mock_data), which decides the data and the tokenizer (Megatron-LM asserts a single "
                           "data source on every rank at start-up): give one of them")


@dataclass(frozen=True, slots=True)
class UnknownFlag:
    """A flag after '--' that the release's own parser lacks (``unknown_flags``)."""

    name: str
    problem: str
    """What is wrong, without a verdict: a warning (``warning``) where the checkout may add the flag,
    a problem of ``advisor-launch check`` where it cannot (``launch.checkout.spelled_in``)."""

    def warning(self, where: str | None = None) -> str:
        """The warning line; ``where``: the checkout's file that spells the flag, if known."""
        spelled = f" ({where} spells {self.name})" if where else ""
        return f"warning: {self.problem}, unless your checkout adds it{spelled}"


def unknown_flags(rules: MegatronVersion, extras: Sequence[str]) -> list[UnknownFlag]:
    """Each flag after '--' that ``rules``' release's own parser lacks (``launch.megatron_flags``:
    its flags and those of pretrain_gpt.py's extra_args_provider, ModelOpt's), with the flags it
    may mean: Megatron parses with allow_abbrev=False and no unknown arguments (arguments.py, both
    releases), so every rank refuses it at start-up, after the queue. A checkout's pretrain_gpt.py
    may add flags of its own, so only ``advisor-launch check``, which reads the checkout, refuses one."""
    import difflib

    taken = values_taken(rules)
    if not taken:
        return []
    found = []
    for name, _, _ in _given(extras):
        if name in taken:
            continue
        close = difflib.get_close_matches(name, list(taken), n=2, cutoff=0.8)
        meant = f" (did you mean {' or '.join(close)}?)" if close else ""
        found.append(UnknownFlag(name, f"{name} (after --) is not a flag of {rules.name}'s argument parser{meant}: "
                                       "pretrain_gpt.py refuses it on every rank at start-up"))
    return found
