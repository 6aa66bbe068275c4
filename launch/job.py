"""A complete job: data, tokenizer, length and schedule, checkpoints and logs.

The input decides the model, the layout and the batch; a training job needs more, and Megatron-LM
finds out only after the nodes are allocated. This module

- reads a small job file (``--job-config FILE``, TOML or JSON; keys in ``JOB_KEYS``) and turns
  it into Megatron-LM's own flags (one labelled group of the command line, whose values the
  user's arguments after ``--`` may restate but not contradict);
- derives the run's length and learning-rate schedule from a token budget (``--tokens``, the job
  file's ``tokens``, or a sweep row made with ``advisor sweep --tokens``): ``--train-samples`` =
  ceil(tokens / seq_len) (Megatron trains on samples of ``--seq-length`` tokens),
  ``--lr-decay-samples`` = the same (decay over the whole run), ``--lr-warmup-samples`` =
  ``lr_warmup_fraction`` of it (default 1%);
- prices a checkpoint (``Checkpoint``) so that ``--save-interval`` can be chosen;
- names, in one line with an example, what the job still lacks (``missing``).
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from advisor import limits
from advisor.errors import AdvisorError
from advisor.fileio import decode_utf8, parse_json, read_bytes
from advisor.releases import MegatronRelease
from launch.arguments import ArgGroup, flag_values

DEFAULT_FS_BANDWIDTH_GBS = 10.0
"""Aggregate write bandwidth (GB/s, 10^9 bytes) a checkpoint is priced at unless --fs-bandwidth
says otherwise: a modest parallel file system; measure yours (e.g. with fio) and pass it."""
CHECKPOINT_OVERHEAD = 0.01
"""The share of training time the suggested --save-interval spends saving."""
DEFAULT_WARMUP_FRACTION = 0.01

# job-file key -> (Megatron-LM flag, kind): 'path' values are strings, 'paths' a list of them.
JOB_KEYS = {
    "data_path": ("--data-path", "paths"), "mock_data": ("--mock-data", "switch"),
    "tokenizer_type": ("--tokenizer-type", "text"), "tokenizer_model": ("--tokenizer-model", "text"),
    "save": ("--save", "text"), "load": ("--load", "text"), "save_interval": ("--save-interval", "count"),
    "tensorboard_dir": ("--tensorboard-dir", "text"), "lr": ("--lr", "floor"), "min_lr": ("--min-lr", "floor"),
    "eval_iters": ("--eval-iters", "iterations"), "eval_interval": ("--eval-interval", "count"),
    "tokens": (None, "tokens"), "lr_warmup_fraction": (None, "fraction"), "fs_bandwidth_gbs": (None, "bandwidth"),
}
LENGTH_FLAGS = ("--train-iters", "--train-samples")
DATA_SOURCES = ("--mock-data", "--data-path", "--train-data-path", "--data-args-path", "--per-split-data-args-path")


@dataclass(frozen=True, kw_only=True, slots=True)
class JobFile:
    """The job file's values, checked: Megatron-LM flags and the launcher's own settings."""

    origin: str
    flags: tuple[str, ...]
    tokens: float | None = None
    lr_warmup_fraction: float = DEFAULT_WARMUP_FRACTION
    fs_bandwidth_gbs: float | None = None
    mock_data: bool = False


def read_job_file(path: str | Path) -> JobFile:
    """A TOML (.toml) or JSON file of ``JOB_KEYS``; an unknown key or a wrong type is one line."""
    path = Path(path)
    text = decode_utf8(read_bytes(path, what="job file"), str(path))
    document = _toml(path, text) if path.suffix == ".toml" else _json(path, text)
    if not isinstance(document, dict):
        raise AdvisorError(f"{path}: expected a table of job settings")
    unknown = sorted(set(document) - set(JOB_KEYS))
    if unknown:
        raise AdvisorError(f"{path}: unknown key(s) {', '.join(unknown)}; known: {', '.join(JOB_KEYS)}")
    flags: list[str] = []
    for key, value in document.items():
        flag, kind = JOB_KEYS[key]
        _check_value(path, key, kind, value)
        if flag is None or kind == "switch":
            continue
        flags += [flag, *value] if kind == "paths" else [flag, _text(value)]
    return JobFile(origin=str(path), flags=tuple(flags), tokens=document.get("tokens"),
                   lr_warmup_fraction=document.get("lr_warmup_fraction", DEFAULT_WARMUP_FRACTION),
                   fs_bandwidth_gbs=document.get("fs_bandwidth_gbs"), mock_data=document.get("mock_data", False))


def _json(path: Path, text: str) -> object:
    try:
        return parse_json(text, str(path))
    except AdvisorError as exc:  # job.yaml, or a TOML job.cfg: 'malformed JSON' alone did not say why JSON
        if path.suffix == ".json":
            raise
        raise AdvisorError(f"{exc} (a job file is read as JSON unless its name ends in .toml)") from None


def _toml(path: Path, text: str) -> dict:
    try:
        import tomllib  # Python >= 3.11
    except ImportError:
        raise AdvisorError(f"{path}: TOML job files need Python >= 3.11; write it as JSON") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise AdvisorError(f"{path}: not TOML ({exc})") from None
    except RecursionError:  # tomllib parses nested arrays and inline tables by recursion, unbounded
        raise AdvisorError(f"{path}: TOML nested too deeply; a job file's values are strings, numbers, "
                           "booleans and lists of paths") from None
    except ValueError:  # int()'s limit on digits (sys.get_int_max_str_digits), not a TOMLDecodeError
        raise AdvisorError(f"{path}: an integer of more than {sys.get_int_max_str_digits():,} digits; "
                           "write a token count as 1e12 or 1_000_000_000_000") from None


def _text(value) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def _check_value(path: Path, key: str, kind: str, value) -> None:
    if kind == "bandwidth":  # bounded as --fs-bandwidth is
        limits.check_float(value, key, limits.FS_BANDWIDTH_GBS, str(path))
        return
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    # a NUL byte cannot pass through exec, and was written into the batch script and the manifests
    ok = {"paths": isinstance(value, list) and bool(value) and all(isinstance(v, str) and v and "\0" not in v
                                                                   for v in value),
          "switch": isinstance(value, bool), "text": isinstance(value, str) and bool(value) and "\0" not in value,
          "count": isinstance(value, int) and not isinstance(value, bool) and value > 0,
          # --eval-iters 0 turns evaluation off (launch.evaluation)
          "iterations": isinstance(value, int) and not isinstance(value, bool) and value >= 0,
          "fraction": number and 0 <= value < 1,
          # --min-lr 0.0 is Megatron's default (arguments.py), and its scheduler asserts only min_lr >= 0.0
          # and max_lr >= min_lr (megatron/core/optimizer_param_scheduler.py), so lr 0 runs as --lr 0 does
          "floor": number and 0 <= value < math.inf,
          # a budget counts whole tokens, as --tokens does (1e12 is whole, 1.5 is not)
          "tokens": number and 0 < value < math.inf and float(value).is_integer()}[kind]
    if not ok:
        want = {"paths": "a list of paths without NUL bytes", "switch": "true or false",
                "text": "a non-empty string without NUL bytes", "count": "a positive integer",
                "iterations": "a whole number, 0 or more (0: no evaluation)",
                "floor": "a number, 0 or more", "fraction": "a number in [0, 1)",
                "tokens": "a positive whole number of tokens (1e12, or 1_000_000_000_000 in TOML)"}[kind]
        # default=str: TOML's dates and times, which JSON has no spelling for
        raise AdvisorError(f"{path}: {key} must be {want}, got {json.dumps(value, default=str)[:60]}")
    if kind in ("count", "iterations"):  # TOML's integers are unbounded (a JSON file's reader refuses past int64)
        limits.check_int(value, key, limits.ITERATION, str(path))
    if kind in ("paths", "text"):
        _check_not_an_option(path, key, value if kind == "paths" else [value])


def _check_not_an_option(path: Path, key: str, words: list[str]) -> None:
    """AdvisorError where a value of the job file's ``key`` is a word argparse reads as an option
    (``launch.arguments.read_as_option``: '-x', not '-1'): '--save -x' lacked its value and
    '--data-path a -x' had an unrecognized argument, refused by Megatron-LM's parser on every rank
    at start-up."""
    from launch.arguments import read_as_option

    if word := next((word for word in words if read_as_option(word)), None):
        raise AdvisorError(f"{path}: {key} {json.dumps(word)[:60]} begins with '-', which Megatron's argparse reads as "
                           f"an option, not as {JOB_KEYS[key][0]}'s value (every rank refuses the command at "
                           f"start-up); write a path as ./{word[:40]}")


# --- the run's length --------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Schedule:
    """A token budget as Megatron-LM's sample-based length and LR schedule."""

    tokens: float
    seq_len: int
    global_batch_size: int
    warmup_fraction: float = DEFAULT_WARMUP_FRACTION

    @property
    def samples(self) -> int:
        """Sequences of ``seq_len`` tokens that hold the budget (``advisor.evaluation.budget_samples``)."""
        from advisor.evaluation import budget_samples

        return budget_samples(self.tokens, self.seq_len)

    @property
    def iterations(self) -> int:
        """The iterations Megatron-LM trains for ``--train-samples`` (``samples``): whole global
        batches (``advisor.evaluation.trained_iterations``)."""
        from advisor.evaluation import trained_iterations

        return trained_iterations(self.samples, self.global_batch_size)

    @property
    def warmup_samples(self) -> int:
        return round(self.samples * self.warmup_fraction)

    def flags(self) -> list[str]:
        return ["--train-samples", str(self.samples), "--lr-decay-samples", str(self.samples),
                "--lr-warmup-samples", str(self.warmup_samples)]


# --- the checkpoint ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Checkpoint:
    """What one save writes and how long it takes.

    Bytes per parameter that Megatron-LM's distributed checkpoint holds (its distributed
    optimizer's table, docs/source/api-guide/dist_optimizer.md: 2 bytes of BF16 weights, 4 of FP32
    main weights, 4 + 4 of Adam's two moments; the gradients are not saved): 14 with 16-bit
    weights, 12 with FP32 weights (no separate main copy). Megatron's fully parallel save spreads
    the writes over every rank, so each writes the total / world size; the save takes the total
    over the file system's aggregate bandwidth."""

    parameters: float
    weight_bytes: int
    world_size: int
    bandwidth_gbs: float

    @property
    def bytes_per_parameter(self) -> int:
        main = 4 if self.weight_bytes < 4 else 0
        return self.weight_bytes + main + 8

    @property
    def total_bytes(self) -> float:
        return self.parameters * self.bytes_per_parameter

    @property
    def per_rank_bytes(self) -> float:
        return self.total_bytes / self.world_size

    @property
    def save_seconds(self) -> float:
        return self.total_bytes / (self.bandwidth_gbs * 1e9)

    def interval(self, step_seconds: float) -> int:
        """Iterations between saves so that saving costs ``CHECKPOINT_OVERHEAD`` of the time."""
        return max(1, math.ceil(self.save_seconds / (CHECKPOINT_OVERHEAD * step_seconds)))

    def describe(self, step_seconds: float | None, save_interval: int | None) -> str:
        text = (f"checkpoint: {self.total_bytes / 2**30:,.1f} GiB ({self.bytes_per_parameter} bytes/parameter), "
                f"{self.per_rank_bytes / 2**30:,.2f} GiB per rank, {self.save_seconds:,.1f} s per save at "
                f"{self.bandwidth_gbs:g} GB/s (--fs-bandwidth)")
        if step_seconds:
            text += (f"; at {step_seconds:.2f} s per step, --save-interval {self.interval(step_seconds)} keeps saving "
                     f"under {CHECKPOINT_OVERHEAD:.0%} of the time")
            if save_interval:
                text += f" (yours, {save_interval}, costs {self.save_seconds / (save_interval * step_seconds):.2%})"
        return text


# --- what is missing ------------------------------------------------------------------------

_NEEDED = (
    (DATA_SOURCES, "data (--data-path PREFIX after --, data_path in --job-config, or --mock-data)"),
    (("--tokenizer-type",), "a tokenizer (--tokenizer-type HuggingFaceTokenizer --tokenizer-model DIR after --)"),
    (LENGTH_FLAGS, "the run's length (--tokens 1T, or --train-iters N after --)"),
    (("--lr",), "a learning rate (--lr 3e-4 after --)"),
)


def missing(args: Sequence[str]) -> str | None:
    """One line naming what the command line lacks for a training job, with an example; None if complete."""
    present = flag_values(args)
    lacks = [what for flags, what in _NEEDED if not any(flag in present for flag in flags)]
    if not lacks:
        return None
    return (f"the job is incomplete: it lacks {'; '.join(lacks)}. For example: --mock-data --tokens 1B -- --lr 3e-4 "
            "(or --job-config job.toml with data_path, tokenizer_type, tokenizer_model, tokens, lr, save, "
            "save_interval, tensorboard_dir)")


def requeue_warning(args: Sequence[str]) -> str | None:
    """A warning where ``#SBATCH --requeue`` cannot resume: Megatron loads a checkpoint only from
    ``--load`` (core_v0.15.2 and core_v0.19.0 megatron/training/training.py,
    setup_model_and_optimizer: ``if args.load is not None or args.pretrained_checkpoint is not
    None``) and saves only to ``--save``, so a requeued job resumes where it stopped only when the
    two name one directory; otherwise it starts again from its first iteration (or from the same
    initial checkpoint), and with ``--save`` writes over the first run's checkpoints."""
    given = flag_values(args)
    save, load = given.get("--save"), given.get("--load")
    if save and save == load:
        return None
    have = ("no --save or --load" if not (save or load) else "no --load" if not load else "no --save" if not save
            else f"--save {save[0]} and --load {load[0]} differ")
    return (f"warning: --requeue, but {have}: a requeued job starts again where this one started, not where it "
            "stopped; give --save DIR --load DIR (one directory) after -- or as save and load in --job-config")


def check_length(args: Sequence[str], rules: MegatronRelease | None = None) -> None:
    """Refuse, in one line, a run length that Megatron-LM takes and then fails on or misreads:
    --train-iters with --train-samples (validate_args, both releases' arguments.py: 'expected
    iteration-based training' on every rank), a zero one (``_zero_length``), --train-samples under
    one global batch (no iteration trained), and a negative one, which neither release checks
    (training.py, get_train_valid_test_num_samples: train_iters x global batch training samples,
    a negative number; the launch's evaluation report printed '-5 training iterations', -1408%).
    ``rules``: the release's; None: core_v0.15.2's behaviour, where --skip-train still builds the
    scheduler. With --skip-train no iteration is trained anyway: a short --train-samples is the user's."""
    given = flag_values(args)
    # core_v0.19.0 with --skip-train checks neither: validate_args ('if args.train_iters and not
    # args.skip_train'), and setup_model_and_optimizer builds no optimizer nor scheduler
    scheduled = not ("--skip-train" in given and rules is not None and rules.release >= (0, 19))
    both = all(flag in given for flag in LENGTH_FLAGS)
    if scheduled and both and any(given[flag][-1] != "0" for flag in LENGTH_FLAGS):  # both 0: _zero_length's
        # validate_args asserts 'expected iteration-based training' where --train-iters is non-zero,
        # else 'expected sample-based training' (--train-iters 0 is false: 'if args.train_samples')
        based = "sample" if given["--train-iters"][-1] in ("0", "-0") else "iteration"
        raise AdvisorError("--train-iters and --train-samples (after --) are both given: Megatron-LM's validate_args "
                           f"refuses the two together ('expected {based}-based training'); give one of them")
    for flag in LENGTH_FLAGS:
        values = given.get(flag)
        if values and values[-1].lstrip("-").isdecimal() and int(values[-1]) < 0:
            raise AdvisorError(f"{flag} {values[-1]} (after --): give 0 or more; Megatron-LM does not check it, "
                               "and its data setup (training.py, get_train_valid_test_num_samples) asks for a "
                               "negative number of training samples")
    if scheduled:
        _zero_length(given)
    samples, batch = given.get("--train-samples"), given.get("--global-batch-size")
    short = samples and batch and samples[-1].isdecimal() and batch[-1].isdecimal() and 0 < int(samples[-1]) < int(batch[-1])
    if short and "--skip-train" not in given:
        # update_train_iters: train_iters = train_samples // global_batch_size (advisor.evaluation.trained_iterations),
        # as a budget under one global batch, which _check_budget refuses the same way
        raise AdvisorError(f"--train-samples {samples[-1]} (after --) is less than one global batch of {batch[-1]}: "
                           f"Megatron-LM would train no iteration; give at least {batch[-1]}")


def _zero_length(given: dict[str, list[str]]) -> None:
    """Refuse --train-iters 0 or --train-samples 0 (the other not given, or 0 too): Megatron-LM's
    parser and validate_args take it, and then every rank raises 'either train-iters or
    train-samples should be provided.' while it builds the learning-rate scheduler, after the model
    (training.py, get_optimizer_param_scheduler: 'if args.train_iters: ... elif
    args.train_samples: ... else: raise', 0 being false; both releases, run on core_v0.15.2)."""
    for flag in LENGTH_FLAGS:
        values = given.get(flag)
        if values and values[-1].isdecimal() and int(values[-1]) == 0:
            raise AdvisorError(f"{flag} {values[-1]} (after --): give 1 or more; Megatron-LM takes 0 and then fails on "
                               "every rank building its learning-rate scheduler ('either train-iters or "
                               "train-samples should be provided.')")


def check_rates(args: Sequence[str]) -> None:
    """Refuse, in one line, a --lr or --min-lr that argparse's float takes and Megatron-LM then fails
    on at every rank, after the model is built: its scheduler asserts ``min_lr >= 0.0`` and
    ``max_lr >= min_lr`` (megatron/core/optimizer_param_scheduler.py, both releases; NaN fails the
    second), and an infinite rate passes both and trains NaN weights; the weight decay likewise
    (``_check_weight_decay``), and the optimizer's own hyper-parameters (``_check_optimizer``).
    The job file's lr and min_lr are checked as they are read (``_check_value``); here they meet
    the user's flags after --."""
    given = flag_values(args)
    rates = _scheduler_values(given, ("--lr", "--min-lr"), "fails on it at start-up")
    lr, min_lr = rates.get("--lr"), rates.get("--min-lr", 0.0)
    if lr is not None and lr < min_lr:
        raise AdvisorError(f"--lr {given['--lr'][-1]} is below --min-lr {given['--min-lr'][-1]}: Megatron-LM's "
                           "scheduler asserts max_lr >= min_lr (optimizer_param_scheduler.py) at start-up")
    _check_warmup_init(given, lr)
    _check_weight_decay(given)
    _check_optimizer(given)


def _check_warmup_init(given: dict[str, list[str]], lr: float | None) -> None:
    """The same scheduler asserts ``init_lr <= max_lr``, --lr-warmup-init against --lr: NaN fails
    it, an infinite one with no --lr to compare is refused as it would train NaN weights. A
    negative one passes the assert, and is Megatron's to take."""
    if (init := _last_float(given, "--lr-warmup-init")) is None:
        return
    if not math.isfinite(init) or (lr is not None and init > lr):
        raise AdvisorError(f"--lr-warmup-init {given['--lr-warmup-init'][-1]}: give a finite number, at most --lr; Megatron-LM's "
                           "scheduler asserts init_lr <= max_lr (optimizer_param_scheduler.py) at start-up")


def _check_optimizer(given: dict[str, list[str]]) -> None:
    """Adam's betas outside [0, 1), a negative or non-finite --adam-eps, and (with --optimizer sgd)
    a negative or non-finite --sgd-momentum, refused in one line: argparse's float takes them, and
    torch.optim.AdamW and SGD, which megatron/core/optimizer/__init__.py falls back to without
    Transformer Engine or Apex, raise 'Invalid beta parameter' / 'Invalid epsilon value' /
    'Invalid momentum value' at start-up where their checks fail (``_torch_refuses``); a fused Adam
    takes them and trains badly (a beta of 1 divides Adam's bias correction by 1 - 1^t = 0). What
    torch's checks let through, an infinite epsilon and a NaN or infinite momentum, trains too, and
    badly (``_TAKEN_BADLY``). Only --optimizer adam's (the default) and sgd's flags are read; core
    0.19's other optimizers mix theirs (``_get_megatron_emerging_optimizer``)."""
    optimizer = given.get("--optimizer", ["adam"])[-1]
    bounds = {"adam": (("--adam-beta1", 1.0), ("--adam-beta2", 1.0), ("--adam-eps", math.inf)),
              "sgd": (("--sgd-momentum", math.inf),)}.get(optimizer, ())
    torch_name = "SGD" if optimizer == "sgd" else "AdamW"
    for flag, high in bounds:
        if (value := _last_float(given, flag)) is not None and not 0.0 <= value < high:
            want = "in [0, 1)" if high == 1.0 else "a finite number, 0 or more"
            why = (f"torch.optim's {torch_name} (Megatron-LM's optimizer without Transformer Engine or Apex) "
                   "refuses it at start-up") if _torch_refuses(flag, value) else _TAKEN_BADLY[flag]
            raise AdvisorError(f"{flag} {given[flag][-1]}: give {want}; {why}")


def _torch_refuses(flag: str, value: float) -> bool:
    """Whether torch's own check raises at start-up (torch/optim/adam.py, AdamW's base:
    ``if not 0.0 <= eps``, ``if not 0.0 <= betas[i] < 1.0``; torch/optim/sgd.py: ``if momentum <
    0.0``): an infinite epsilon, and a NaN or infinite momentum, pass them."""
    if flag == "--sgd-momentum":
        return value < 0.0
    if flag == "--adam-eps":
        return not value >= 0.0  # negative or NaN
    return not 0.0 <= value < 1.0  # the betas


_TAKEN_BADLY = {
    "--adam-eps": "torch.optim's AdamW takes it, and Adam's step m / (sqrt(v) + eps) is then 0: no weight trains",
    "--sgd-momentum": "torch.optim's SGD takes it, and its momentum buffer, then every weight, turns NaN or infinite",
}
"""Why a value torch's checks let through is refused all the same (``_check_optimizer``)."""


def _check_weight_decay(given: dict[str, list[str]]) -> None:
    """The same scheduler's weight decay, refused as ``check_rates`` refuses a rate: it asserts
    ``start_wd >= 0.0`` and ``end_wd >= start_wd`` (optimizer_param_scheduler.py, both releases),
    which validate_args sets to --weight-decay with the default --weight-decay-incr-style constant,
    else to --start-weight-decay and --end-weight-decay (arguments.py); NaN fails them, and an
    infinite decay passes and trains NaN weights."""
    constant = given.get("--weight-decay-incr-style", ["constant"])[-1] == "constant"
    flags = ("--weight-decay",) if constant else ("--start-weight-decay", "--end-weight-decay")
    decays = _scheduler_values(given, flags, "asserts start_wd >= 0 at start-up")
    start, end = decays.get("--start-weight-decay"), decays.get("--end-weight-decay")
    if start is not None and end is not None and end < start:
        raise AdvisorError(f"--end-weight-decay {given['--end-weight-decay'][-1]} is below --start-weight-decay "
                           f"{given['--start-weight-decay'][-1]}: Megatron-LM's scheduler asserts end_wd >= start_wd "
                           "(optimizer_param_scheduler.py) at start-up")


def _scheduler_values(given: dict[str, list[str]], flags: Sequence[str], fails: str) -> dict[str, float]:
    """The last value of each of ``flags`` given, as a float, refused in one line where it is not
    finite or is negative (what Megatron-LM's scheduler ``fails`` with; an infinite value passes
    its asserts and trains NaN weights). A value that is no float was refused before, by the
    release's flag types (launch.arguments): skipped here."""
    found = {flag: value for flag in flags if (value := _last_float(given, flag)) is not None}
    for flag, value in found.items():
        if not math.isfinite(value) or value < 0:
            raise AdvisorError(f"{flag} {given[flag][-1]}: give a finite number, 0 or more; Megatron-LM's scheduler "
                               f"(optimizer_param_scheduler.py) {fails}, or trains NaN weights")
    return found


def _last_float(given: dict[str, list[str]], flag: str) -> float | None:
    """The last value given to ``flag`` as a float; None where it is absent, or is no float (then
    refused before, by the release's flag types: launch.arguments)."""
    if not (values := given.get(flag)):
        return None
    try:
        return float(values[-1])
    except ValueError:
        return None


def user_length(user_args: Sequence[str]) -> list[str]:
    """The user's own length flags after ``--`` with their values (``--train-iters 20``), or []."""
    given = flag_values(user_args)
    return [word for flag in LENGTH_FLAGS if flag in given for word in (flag, *given[flag])]


def job_group(job: JobFile | None, schedule: Schedule | None, user_args: Sequence[str]) -> ArgGroup | None:
    """The job file's flags and the schedule's, as one group of the command line; the schedule is
    left out where the user gives the length (``--train-iters``/``--train-samples``) after ``--``."""
    args = list(job.flags) if job is not None else []
    if schedule is not None and not user_length(user_args):
        args += schedule.flags()
    if not args:
        return None
    source = f"the job ({job.origin})" if job is not None else "--tokens"
    return ArgGroup(source=source, args=tuple(args), owns=frozenset(flag_values(args)))


@dataclass(frozen=True, kw_only=True, slots=True)
class JobPlan:
    """What the launcher adds to a launch to make it a job, and what it reports about it."""

    group: ArgGroup | None
    schedule: Schedule | None
    checkpoint: Checkpoint
    step_time_s: float | None
    user_length: tuple[str, ...] = ()
    """The user's length flags after ``--``: then ``job_group`` adds no schedule, and the report says so."""
    release: MegatronRelease | None = None
    """The release launched, whose evaluation defaults the report reads (None: no evaluation line)."""
    global_batch_size: int = 1
    row: Mapping[str, object] | None = None
    """The input's sweep row or estimate, from which an evaluation iteration is priced (``launch.evaluation``)."""

    def report(self, args: Sequence[str]) -> list[str]:
        """The lines a launch prints about the job: its length and its checkpoint (what it lacks
        is ``missing``'s)."""
        lines = []
        if self.schedule is not None and self.user_length:
            lines.append(f"length: your {' '.join(self.user_length)} (after --); the {self.schedule.tokens:.4g}-token "
                         "budget adds no --train-samples or LR schedule")
        elif self.schedule is not None:
            s = self.schedule
            lines.append(f"length: {s.tokens:.4g} tokens = {s.samples:,} samples of {s.seq_len} tokens = "
                         f"{s.iterations:,} iterations of {s.global_batch_size}; LR warm-up {s.warmup_samples:,} "
                         f"samples, decay {s.samples:,}")
        interval = flag_values(args).get("--save-interval")
        lines.append(self.checkpoint.describe(self.step_time_s, int(interval[0]) if interval else None))
        if self.release is not None:
            lines.append(self.evaluation_line(self.release, args))
        return lines

    def evaluation_line(self, release: MegatronRelease, args: Sequence[str]) -> str:
        """What the run evaluates besides training, and at what cost (``launch.evaluation``)."""
        from launch.evaluation import describe, evaluation, forward_only_time

        plan = evaluation(release, args, self.global_batch_size)
        if not plan.validates or plan.iterations is None:
            return describe(plan, release)
        seconds, why = forward_only_time(self.row, self.step_time_s, plan)
        return describe(plan, release, iteration_s=seconds, step_s=self.step_time_s, no_time=why)

    def signal_lead_warning(self, signal_time_s: int, args: Sequence[str]) -> str | None:
        """A warning where Slurm's SIGTERM comes too late for Megatron to save before the time limit.

        ``--exit-signal-handler`` looks at the signal only between iterations, then saves with
        ``--save`` (core_v0.15.2 and core_v0.19.0 megatron/training/training.py,
        checkpoint_and_decide_exit: ``if any(signal_handler.signals_received()): if args.save:
        save_checkpoint_and_time(...)``): after a SIGTERM it may need the rest of one step and a
        whole save, and Slurm kills the job at its time limit (torchrun already at the same lead,
        TORCH_ELASTIC_SHUTDOWN_TIMEOUT). None without ``--save`` (nothing to save) or where the
        step and the save fit the lead."""
        if "--save" not in flag_values(args):
            return None
        step = self.step_time_s or 0.0
        need = step + self.checkpoint.save_seconds
        if need <= signal_time_s:
            return None
        c = self.checkpoint
        parts = ([f"up to one {step:,.1f} s step to finish (the input's step time)"] if step else []) + [
            f"a {c.save_seconds:,.1f} s save ({c.total_bytes / 2**30:,.1f} GiB at {c.bandwidth_gbs:g} GB/s, "
            "--fs-bandwidth)"]
        want = math.ceil(need)
        advice = (f"give --signal-time {want} or more" if want <= limits.SIGNAL_TIME_S.high else
                  f"more than Slurm's --signal allows ({limits.SIGNAL_TIME_S.high} s): save more often, or to a "
                  "faster file system (--fs-bandwidth)")
        return (f"warning: --signal-time {signal_time_s} s is shorter than what Megatron does after Slurm's SIGTERM: "
                f"{' and '.join(parts)}, {need:,.0f} s in all; Slurm kills the job at its time limit before the save "
                f"ends, losing the iterations since the last one: {advice}")


def _budget(tokens: float | None, job_file: JobFile | None, config) -> tuple[float | None, str]:
    """The token budget and, for messages, where it came from: --tokens, else the job file's, else
    the input's (``advisor sweep --tokens``)."""
    if tokens:
        return tokens, "--tokens"
    if job_file is not None and job_file.tokens:
        return job_file.tokens, f"{job_file.origin}: tokens"
    return config.tokens, f"{config.source}: 'tokens'"


def _check_budget(tokens: float, seq_len: int, global_batch_size: int, source: str) -> None:
    """A budget whose --train-samples Megatron can count: ceil(tokens / seq_len) at most 2^63 - 1,
    since megatron-core indexes the samples with numpy.int64 (core_v0.15.2
    megatron/core/datasets/gpt_dataset.py, _build_shuffle_index: numpy.arange(0, num_samples,
    dtype=numpy.int64)); 1e300 tokens were a 300-digit --train-samples. Each reader has already
    refused a budget that is not positive or not finite (TokenCount, the job file's 'number', the
    input's NUMBERS); the ratio's check catches one that got past them. And at least one global
    batch: Megatron trains train_samples // global batch iterations (``Schedule.iterations``), so
    a smaller budget would start the job, build the data and train nothing."""
    samples = tokens / seq_len
    if not (math.isfinite(samples) and math.ceil(samples) <= limits.JSON_INT):
        raise AdvisorError(f"{source} {tokens:g} is {samples:.4g} samples of {seq_len} tokens: --train-samples must "
                           f"fit Megatron's int64 sample index (at most {limits.JSON_INT:,} samples, "
                           f"{limits.JSON_INT * seq_len:.4g} tokens)")
    from advisor.evaluation import budget_samples, trained_iterations

    if trained_iterations(budget_samples(tokens, seq_len), global_batch_size) < 1:
        raise AdvisorError(f"{source} {tokens:g} is {math.ceil(samples):,} samples of {seq_len} tokens, less than one "
                           f"global batch of {global_batch_size}: Megatron-LM would train no iteration; give at "
                           f"least {global_batch_size * seq_len:,} tokens")


def plan_job(config, *, job_file: JobFile | None, tokens: float | None, bandwidth_gbs: float | None,
             user_args: Sequence[str], release: MegatronRelease | None = None) -> JobPlan:
    """The job of ``config`` (a ``launch.inputs.LaunchInput``): --tokens, else the job file's, else the
    sweep row's budget; the bandwidth from --fs-bandwidth, else the job file's, else the default.
    ``release``: the one launched, for the report's evaluation line."""
    from advisor.moe.params import every_parameter

    budget, source = _budget(tokens, job_file, config)
    schedule = None
    if budget is not None:
        _check_budget(budget, config.seq_len, config.global_batch_size, source)
        fraction = job_file.lr_warmup_fraction if job_file else DEFAULT_WARMUP_FRACTION
        schedule = Schedule(tokens=budget, seq_len=config.seq_len, global_batch_size=config.global_batch_size,
                            warmup_fraction=fraction)
    decided = flag_values(config.megatron_args)
    weight_bytes = 2 if ("--bf16" in decided or "--fp16" in decided) else 4
    bandwidth = bandwidth_gbs or (job_file.fs_bandwidth_gbs if job_file else None) or DEFAULT_FS_BANDWIDTH_GBS
    checkpoint = Checkpoint(parameters=every_parameter(config.model), weight_bytes=weight_bytes,
                            world_size=config.world_size, bandwidth_gbs=bandwidth)
    return JobPlan(group=job_group(job_file, schedule, user_args), schedule=schedule, checkpoint=checkpoint,
                   step_time_s=config.step_time_s, user_length=tuple(user_length(user_args)), release=release,
                   global_batch_size=config.global_batch_size, row=getattr(config, "row", None))
