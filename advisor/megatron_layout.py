"""The layout flags of a Megatron-LM command read back (``advisor.megatron_readback`` reads the
rest): TP, CP, PP, the uneven split, virtual stages, MBS, GBS and the batch ramp-up, as Megatron
builds them (megatron/core/transformer/transformer_block.py, ``get_num_layers_to_build``;
pipeline_parallel_layer_layout.py, ``parse_str_to_list``), refused in one line where Megatron
refuses the command at start-up; and the one reader of a flag's number.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from advisor import limits
from advisor.errors import AdvisorError
from advisor.parallel import RANK_ORDER, TP_PP_DP_RANK_ORDER, default_layers_per_stage
from advisor.shell_command import unexpanded

RAMPUP = "rampup-batch-size"
"""Read into the layout (``Layout.rampup_batch_size``) and named with the harmless ones: a launch of
the estimate trains its final global batch only."""
STEP_SCHEDULE = "step-batch-size-schedule"
"""core_v0.19.0's batch schedule ('THRESHOLD:BS ...'): read into the layout for its final batch,
which ``StepBatchsizeNumMicroBatchesCalculator`` takes as the run's global batch
(megatron/core/num_microbatches_calculator.py), and named as not priced before it."""
_SUFFIXES = {"K": 1_000, "M": 1_000_000, "B": 1_000_000_000, "T": 1_000_000_000_000}


def unexpanded_problem(name: str, text: str) -> str | None:
    shown = unexpanded(text)
    return None if shown is None else f"--{name} is {shown}: write its value in the command"


def flag_number(values: dict, name: str, kind: type, default):
    """The value of --name as ``kind``; one line if the text is not one, or names an unset variable."""
    text = values.get(name)
    if text is None:
        return default
    if (problem := unexpanded_problem(name, text)) is not None:
        raise AdvisorError(problem)
    try:
        return kind(text)
    except ValueError:
        raise AdvisorError(f"--{name} must be {'an integer' if kind is int else 'a number'}, got {text!r}") from None


def int_value(values: dict, name: str, default: int | None = None) -> int | None:
    number = flag_number(values, name, int, default)
    if number is not None and number < 1 and not name.startswith("decoder-"):
        raise AdvisorError(f"--{name} must be positive, got {number}")
    return number


def float_value(values: dict, name: str, default: float) -> float:
    return flag_number(values, name, float, default)


@dataclass(frozen=True, slots=True)
class Layout:
    """TP, CP, PP, the layers each pipeline rank builds, virtual stages and the batch."""

    tp: int
    cp: int
    layers_per_stage: tuple[int, ...]
    vpp: int
    mbs: int
    global_batch_size: int | None
    rank_order: str = RANK_ORDER
    """Megatron's rank order (``advisor.parallel.RANK_ORDER``, or ``TP_PP_DP_RANK_ORDER`` with
    --use-tp-pp-dp-mapping): which global ranks hold which pipeline stage."""
    rampup_batch_size: tuple[int, int, int] | None = None
    """--rampup-batch-size's start, increment and samples: the run trains smaller global batches
    before ``global_batch_size`` (megatron/core/num_microbatches_calculator.py,
    ``RampupBatchsizeNumMicroBatchesCalculator``); None without a ramp-up."""
    step_schedule: tuple[tuple[int, int], ...] | None = None
    """--step-batch-size-schedule's (threshold in samples, batch size) pairs (``step_schedule``),
    whose last batch is ``global_batch_size``; None without a schedule."""

    @property
    def pp(self) -> int:
        return len(self.layers_per_stage)


_LAYOUT_CHARS = 4 * limits.MODEL["num_layers"].high
"""The longest unrolled --pipeline-model-parallel-layout: each layer bounded, with a stage mark
(|) and an E, L or m beside it ('t*99999999999999' was a MemoryError)."""


def _unrolled(text: str) -> str:
    """The layout with its repetitions ('(t|)*3', 't*4') written out, as Megatron's
    ``parse_str_to_list`` does, refused past ``_LAYOUT_CHARS``; without the commas."""
    flat = text.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        grown = [len(flat)]

        def repeat(match: re.Match) -> str:
            unit, count = match.group(1), match.group(2)
            grown[0] += len(unit) * int(count) if len(count) <= 6 else _LAYOUT_CHARS
            if grown[0] > _LAYOUT_CHARS:
                raise AdvisorError(f"--pipeline-model-parallel-layout {text[:60]!r}: {match.group(0)[:40]!r} "
                                   f"unrolls past {_LAYOUT_CHARS:,} layers and stages (--num-layers is at most "
                                   f"{limits.MODEL['num_layers'].high:,})")
            return unit * int(count)

        flat = re.sub(pattern, repeat, flat)
    return flat


def _layout_segments(text: str, mtp_layers: int = 0) -> list[int]:
    """Decoder layers of each segment of --pipeline-model-parallel-layout, as Megatron unrolls it;
    its MTP layers (m) must be the command's --mtp-num-layers (``validate_layer_layout``)."""
    flat = _unrolled(text)
    if set(flat) - set("ELtm|"):  # m: an MTP layer (priced with --mtp-num-layers, advisor.moe.mtp)
        raise AdvisorError(f"--pipeline-model-parallel-layout {text!r}: only E, L, t and m layers are priced "
                           f"(found {''.join(sorted(set(flat) - set('ELtm|')))})")
    if flat.count("m") != mtp_layers:
        raise AdvisorError(f"--pipeline-model-parallel-layout {text!r} has {flat.count('m')} MTP layers (m); "
                           f"--mtp-num-layers gives {mtp_layers} (Megatron requires them equal)")
    return [segment.count("t") for segment in flat.split("|")]


_VIRTUAL_FLAGS = ("num-layers-per-virtual-pipeline-stage", "num-virtual-stages-per-pipeline-rank",
                  "pipeline-model-parallel-layout")
"""The three ways of giving virtual stages; validate_args takes no more than one (arguments.py,
'No more than one of the following arguments can be set at the same time', both releases)."""
_VPP_FLAG = "--num-virtual-stages-per-pipeline-rank"


def _split(layout: dict, num_layers: int, pp: int, mtp_layers: int = 0, release=None) -> tuple[list[int], int]:
    """(layers per pipeline rank, VPP) as get_num_layers_to_build builds them, refused where
    Megatron refuses the flags (validate_args; TransformerConfig.__post_init__): both releases, or
    ``release``'s (None: the newest) where they differ."""
    if len(given := [f"--{name}" for name in _VIRTUAL_FLAGS if name in layout]) > 1:
        raise AdvisorError(f"{' and '.join(given)}: Megatron-LM refuses more than one of them (validate_args: "
                           "'No more than one of the following arguments can be set at the same time'); give one")
    if "pipeline-model-parallel-layout" in layout:
        segments = _layout_segments(layout["pipeline-model-parallel-layout"], mtp_layers)
        if len(segments) % pp or sum(segments) != num_layers:
            raise AdvisorError(f"--pipeline-model-parallel-layout has {len(segments)} stages and {sum(segments)} "
                               f"layers: Megatron needs a multiple of PP = {pp} stages and --num-layers {num_layers}")
        vpp = len(segments) // pp
        counts = [sum(segments[k * pp + i] for k in range(vpp)) for i in range(pp)]
    elif "decoder-first-pipeline-num-layers" in layout or "decoder-last-pipeline-num-layers" in layout:
        counts, vpp = _uneven_split(layout, num_layers, pp, release)
    else:
        counts, vpp = _even_split(layout, num_layers, pp)
    if vpp > 1 and pp == 1:
        raise AdvisorError(f"{vpp} virtual stages without pipeline parallelism: Megatron-LM refuses the command "
                           "(validate_args: 'When interleaved schedule is used, pipeline-model-parallel size should "
                           "be greater than 1'); give --pipeline-model-parallel-size, or drop the virtual stages")
    return counts, vpp


def _uneven_split(layout: dict, num_layers: int, pp: int, release=None) -> tuple[list[int], int]:
    """--decoder-first/last-pipeline-num-layers: the other stages share the rest evenly; with
    virtual stages (--num-virtual-stages-per-pipeline-rank only: validate_args refuses
    --num-layers-per-virtual-pipeline-stage here), every stage's layers divide into its chunks,
    checked in TransformerConfig.__post_init__'s order ('Uneven PP': first, last, then the middle).
    The counts are get_num_layers_to_build's, which need not add up to --num-layers
    (``_ends_and_middle``)."""
    first = int_value(layout, "decoder-first-pipeline-num-layers")
    last = int_value(layout, "decoder-last-pipeline-num-layers")
    if layout.get("account-for-embedding-in-pipeline-split") or layout.get("account-for-loss-in-pipeline-split"):
        raise AdvisorError("Megatron refuses --account-for-*-in-pipeline-split with uneven first/last stages")
    if "num-layers-per-virtual-pipeline-stage" in layout:
        raise AdvisorError("--num-layers-per-virtual-pipeline-stage with --decoder-first/last-pipeline-num-layers: "
                           f"Megatron-LM refuses the command (validate_args: 'please use {_VPP_FLAG} to specify "
                           "virtual pipeline parallel degree when enable uneven pipeline parallelism')")
    vpp = int_value(layout, "num-virtual-stages-per-pipeline-rank", 1)
    for name, count in (("first", first), ("last", last)):
        if count is not None and count <= 0:
            raise AdvisorError(f"--decoder-{name}-pipeline-num-layers {count}: Megatron-LM refuses the command "
                               f"(TransformerConfig: 'num_layers_in_{name}_pipeline_stage must be larger than 0')")
        _refuse_chunks(f"--decoder-{name}-pipeline-num-layers {count} is", count, vpp, f"at {name} stage")
    per, middle_stages, rest = _ends_and_middle(first, last, num_layers, pp, release)
    if middle_stages > 0:
        _refuse_chunks(f"each middle stage's {per} layers ({rest} of --num-layers {num_layers} over {middle_stages} "
                       "stages) are", per, vpp, "on each middle pipeline rank")
    counts = [per] * pp
    counts[0] = first if first is not None else counts[0]
    counts[-1] = last if last is not None else counts[-1]  # at PP 1 the last count wins, as Megatron's does
    return counts, vpp


def _ends_and_middle(first: int | None, last: int | None, num_layers: int, pp: int,
                     release) -> tuple[int, int, int]:
    """(layers per middle stage, middle stages, the layers the ends leave) as TransformerConfig
    checks them and get_num_layers_to_build counts them (transformer_block.py, both releases): the
    ends take their counts, the stages between share the rest, and with no stage between (PP 2
    with both ends, PP 1 with either) the rest is built nowhere. Where the rest and the stages
    between do not both exist, a release whose TransformerConfig checks it refuses ('Mismatch',
    ``MegatronRelease.uneven_middle_needs_layers``); core_v0.15.2 builds what the counts say (PP 2,
    first and last 10 of --num-layers 32: 20 layers), and the read-back prices that."""
    from advisor.options.releases import release_defaults

    ends = [(name, count) for name, count in (("first", first), ("last", last)) if count is not None]
    middle_stages = pp - len(ends)
    rest = num_layers - sum(count for _, count in ends)
    given = " and ".join(f"--decoder-{name}-pipeline-num-layers {count}" for name, count in ends)
    one = len(ends) == 1  # the verb's number
    defaults = release_defaults(release)
    if defaults.uneven_middle_needs_layers and bool(rest) != bool(middle_stages):
        left = (f"leave{'s' * one} {rest} of the {num_layers} layers for no stage" if rest > 0 else
                f"take{'s' * one} {-rest} layers more than --num-layers {num_layers}" if rest < 0 else
                f"take{'s' * one} all {num_layers} layers, leaving {middle_stages} of the stages without layers")
        raise AdvisorError(f"{given} over PP {pp} {left}: {defaults.name} refuses the command (TransformerConfig: "
                           f"'Mismatch: {rest} middle layers remaining but {middle_stages} middle PP stages "
                           "available'); give counts that add up to --num-layers, with layers for every stage")
    if middle_stages > 0 and rest % middle_stages:
        raise AdvisorError(f"{num_layers} layers do not split as {given} over PP {pp}: Megatron-LM refuses the "
                           f"command (TransformerConfig: 'number of layers at middle stage: {rest} must be divisible "
                           f"by the middle pipeline model parallel size {middle_stages}')")
    per = rest // middle_stages if middle_stages > 0 else 0
    if per < 0:  # Megatron accepts it and builds no layer there, the ends more than --num-layers
        raise AdvisorError(f"{given} take{'s' * one} {-rest} layers more than --num-layers {num_layers}, so each of the other "
                           f"{middle_stages} stages gets {per} (get_num_layers_to_build): not priced; give counts "
                           "that add up to --num-layers")
    return per, middle_stages, rest


def _refuse_chunks(shown: str, count: int | None, vpp: int, where: str) -> None:
    """One line where a stage's ``count`` layers do not divide into its ``vpp`` chunks (Megatron's
    VPP 1 is None: never checked), quoting TransformerConfig.__post_init__'s message; ``shown``:
    the count as the command gives it, with its verb ('--decoder-first-pipeline-num-layers 10 is')."""
    if count is not None and vpp > 1 and count % vpp:
        raise AdvisorError(f"{shown} not divisible by {_VPP_FLAG} {vpp}: Megatron-LM refuses the command "
                           f"(TransformerConfig: 'number of layers {where}: {count} must be divisible by virtual "
                           f"pipeline parallel degree {vpp}')")


def _even_split(layout: dict, num_layers: int, pp: int) -> tuple[list[int], int]:
    """Megatron's even split, the embedding and the loss counted as layers where asked; virtual
    stages divide each rank's share, the embedding and loss counted in it (validate_args derives
    VPP so from --num-layers-per-virtual-pipeline-stage; get_num_layers_to_build asserts it of
    --num-virtual-stages-per-pipeline-rank)."""
    embedding = int(bool(layout.get("account-for-embedding-in-pipeline-split")))
    loss = int(bool(layout.get("account-for-loss-in-pipeline-split")))
    total = num_layers + embedding + loss
    counted = f" (+{embedding + loss} for embedding/loss)" if embedding + loss else ""
    if total % pp:
        raise AdvisorError(f"--num-layers {num_layers}{counted} is not "
                           f"divisible by --pipeline-model-parallel-size {pp}")
    counts = list(default_layers_per_stage(total, pp))
    counts[0] -= embedding
    counts[-1] -= loss
    per_rank = total // pp
    per_chunk = int_value(layout, "num-layers-per-virtual-pipeline-stage")
    if per_chunk is not None:
        if per_rank % per_chunk:
            raise AdvisorError(f"--num-layers-per-virtual-pipeline-stage {per_chunk} does not divide the "
                               f"{per_rank} layers{counted} of a pipeline rank")
        return counts, per_rank // per_chunk
    vpp = int_value(layout, "num-virtual-stages-per-pipeline-rank", 1)
    if per_rank % vpp:  # TransformerConfig checks it with the embedding or loss counted, else the builder
        rule = (f"TransformerConfig: 'number of layers on each pipeline rank: {per_rank} (after enable account_for_"
                f"...) must be divisible by virtual_pipeline_model_parallel_size {vpp}'" if counted else
                f"get_num_layers_to_build: 'num_layers_per_pipeline_rank {per_rank} should be divisible by vp_size "
                f"{vpp}'")
        raise AdvisorError(f"--num-layers {num_layers}{counted} over PP {pp} is {per_rank} layers per pipeline rank, "
                           f"not divisible by {_VPP_FLAG} {vpp}: Megatron-LM refuses the command ({rule})")
    return counts, vpp


def read_layout(layout: dict, num_layers: int, mtp_layers: int = 0, release=None,
                seq_length: int | None = None) -> Layout:
    """The layout a dict of Megatron's layout flags describes (Megatron's defaults: 1, no GBS);
    ``mtp_layers``: the command's --mtp-num-layers; ``release``: the Megatron-LM release whose
    rules refuse it where the releases differ (None: the newest); ``seq_length``: the command's
    --seq-length, which turns --step-batch-size-schedule's thresholds into samples (``step_schedule``)."""
    tp, cp, pp = degrees(layout)
    counts, vpp = _split(layout, num_layers, pp, mtp_layers, release)
    mbs = int_value(layout, "micro-batch-size", 1)
    schedule = _step_schedule(layout, release, seq_length)
    return Layout(tp=tp, cp=cp, layers_per_stage=tuple(counts), vpp=vpp, mbs=mbs,
                  global_batch_size=int_value(layout, "global-batch-size") if schedule is None else schedule[-1][1],
                  rank_order=TP_PP_DP_RANK_ORDER if layout.get("use-tp-pp-dp-mapping") else RANK_ORDER,
                  rampup_batch_size=_rampup(layout), step_schedule=schedule)


def _rampup(layout: dict) -> tuple[int, int, int] | None:
    """--rampup-batch-size's three integers; core_v0.15.2 takes any number of words (nargs='*')
    and its calculator then asserts three (``init_num_microbatches_calculator``)."""
    if RAMPUP not in layout:
        return None
    words = layout[RAMPUP].split()
    if len(words) != 3 or not all(re.fullmatch(r"[0-9]+", word) for word in words):
        raise AdvisorError(f"--{RAMPUP} takes three integers (start batch size, increment, ramp-up samples), got "
                           f"{' '.join(words) or 'none'}")
    start, increment, samples = map(int, words)
    return start, increment, samples


@functools.cache
def release_flags(release: tuple[int, int]) -> frozenset[str]:
    """The flags of ``release``'s own argument parser (``megatron_flag_table``'s
    '--flag[=COUNT][:TYPE]' words), parsed once."""
    from advisor.megatron_flag_table import FLAGS

    return frozenset(word.partition(":")[0].partition("=")[0] for word in FLAGS[release].split())


def _step_schedule(layout: dict, release=None, seq_length: int | None = None) -> tuple[tuple[int, int], ...] | None:
    """--step-batch-size-schedule as Megatron-LM takes it (``step_schedule``; its last batch is the
    run's global batch), or None without one; one line where Megatron-LM refuses the command."""
    given = int_value(layout, "global-batch-size")
    if STEP_SCHEDULE not in layout:
        return None
    from advisor.options.releases import release_defaults

    defaults = release_defaults(release)
    if f"--{STEP_SCHEDULE}" not in release_flags(defaults.release):
        raise AdvisorError(f"--{STEP_SCHEDULE} is not a flag of {defaults.name} (its argparse refuses the command): "
                           f"give --global-batch-size N, or --megatron-version for a release that has it (0.19)")
    if given is not None:  # megatron/training/arguments.py (core_v0.19.0), validate_args: a ValueError
        raise AdvisorError(f"--{STEP_SCHEDULE} with --global-batch-size {given}: {defaults.name} refuses the command "
                           f"(validate_args: 'Cannot specify both --{STEP_SCHEDULE} and --global-batch-size'); "
                           "leave out --global-batch-size (the schedule's last batch is the run's global batch)")
    return tuple(step_schedule(layout[STEP_SCHEDULE], seq_length))


def step_schedule(text: str, seq_length: int | None = None) -> list[tuple[int, int]]:
    """--step-batch-size-schedule's (threshold, batch size) pairs, sorted by threshold, parsed as
    core_v0.19.0's ``StepBatchsizeNumMicroBatchesCalculator._parse_schedule`` does (commas or
    spaces between 'THRESHOLD:BS' entries; K, M, B, T suffixes; ``int(float(x) * multiplier)``;
    a threshold in tokens, ``// seq_length`` into samples, where ``seq_length`` is given: Megatron
    always gives it, ``init_num_microbatches_calculator(..., seq_length=args.seq_length)``,
    megatron/training/global_vars.py:127-136), with the checks of its ``_validate_schedule``, which
    its ``__init__`` runs at start-up (megatron/core/num_microbatches_calculator.py:446-449,
    :536-556): the first threshold 0, the thresholds strictly increasing, every batch size
    positive. One line where it raises."""
    if (shown := unexpanded(text)) is not None:
        raise AdvisorError(f"--{STEP_SCHEDULE} is {shown}: write its value in the command")
    pairs = []
    for entry in text.replace(",", " ").split() or [""]:
        threshold, colon, batch = entry.partition(":")
        numbers = [_schedule_number(part) for part in (threshold, batch)]
        if not colon or None in numbers:
            raise AdvisorError(f"--{STEP_SCHEDULE} entry {entry!r} is not THRESHOLD:BATCH_SIZE (e.g. '0:16 2.4B:320'; "
                               "the numbers may end in K, M, B or T): Megatron-LM refuses it")
        pairs.append((numbers[0] // seq_length if seq_length else numbers[0], numbers[1]))
    pairs.sort(key=lambda pair: pair[0])
    thresholds = [threshold for threshold, _ in pairs]
    if len(set(thresholds)) < len(thresholds) or min(batch for _, batch in pairs) <= 0 or thresholds[0] != 0:
        samples = f" (in samples, tokens // --seq-length {seq_length}: {thresholds})" if seq_length else ""
        raise AdvisorError(f"--{STEP_SCHEDULE} {text!r}: Megatron-LM asserts that its first threshold is 0, that its "
                           f"thresholds increase strictly{samples} and that every batch size is positive")
    return pairs


def _schedule_number(word: str) -> int | None:
    """One number of a schedule entry as core_v0.19.0 reads it (``_parse_numeric_value``)."""
    word = word.strip().upper()
    multiplier = _SUFFIXES.get(word[-1:], 1)
    number = word[:-1] if word[-1:] in _SUFFIXES else word
    try:
        return int(float(number) * multiplier)
    except (ValueError, OverflowError):  # not a number; 'inf'
        return None


def degrees(layout: dict) -> tuple[int, int, int]:
    """(TP, CP, PP) of a dict of Megatron's layout flags, Megatron's default 1 for each."""
    return (int_value(layout, "tensor-model-parallel-size", 1), int_value(layout, "context-parallel-size", 1),
            int_value(layout, "pipeline-model-parallel-size", 1))
