"""The evaluation a launch will run besides training: how many forward-only iterations, and their time.

What Megatron-LM does (``megatron/training/training.py``, core_v0.15.2 and core_v0.19.0 alike
but for the defaults, ``advisor.releases``: --eval-iters 100 in both, --eval-interval 1000 in
core_v0.15.2 and None in core_v0.19.0):

- during training (``train``), after iteration i (counted from 1, incremented before the check)
  ``if args.eval_interval and i % args.eval_interval == 0 and args.do_valid`` (core_v0.19.0 also
  ``i >= --start-eval-at-iter`` where given), one evaluation on the validation set: so floor(N /
  interval) of them in N iterations, the last at iteration N where the interval divides it;
- at the end (``pretrain``, after ``train`` returns, or at once with --skip-train), one more on
  the validation set ``if args.do_valid`` and one on the test set ``if args.do_test``;
- ``do_valid`` is ``eval_iters > 0`` (or --full-validation): the loaders' list is never None
  (``build_train_valid_test_data_loaders``); ``do_test`` also needs a test split: the mock data's
  (its config forces split 1,1,1: ``BlendedMegatronDatasetConfig``), a --split whose third share
  is not 0 (Megatron's default with --data-path is '969, 30, 1'), or --test-data-path;
- each evaluation (``evaluate``) runs eval_iters iterations of one global batch each
  (``eval_batch_size = args.global_batch_size``; core_v0.19.0: --eval-global-batch-size, default
  the same), forward only through the training's pipeline schedule
  (``advisor.throughput.forward_only``);
- a run of --train-samples S trains floor(S / global batch) iterations (``update_train_iters``:
  'we throw away any partial last batch').

Megatron checks none of these values: a negative --eval-iters or --eval-interval, or an interval
of 0, reaches its data setup (``get_train_valid_test_num_samples``: ``train_iters //
eval_interval``, a ZeroDivisionError for 0, a negative validation size otherwise), so the
launcher refuses them in one line (``check_values``); --start-eval-at-iter (core_v0.19.0) fails
nothing at any value and is left to Megatron.
"""

from __future__ import annotations

import math
import re
from typing import Mapping, Sequence

from advisor.errors import AdvisorError
from advisor.evaluation import Evaluation, trained_iterations
from advisor.releases import MegatronRelease
from launch.arguments import flag_values

_LEAST = {"--eval-iters": 0, "--eval-interval": 1}
"""The evaluation flags whose values the launcher checks, and the least Megatron can run with."""


def _integer(given: Mapping[str, tuple[str, ...]], flag: str) -> int | None:
    """The last value of ``flag`` as argparse's int reads it (the launcher refused a non-int before)."""
    values = given.get(flag)
    if not values:
        return None
    try:
        return int(values[-1])
    except ValueError:
        raise AdvisorError(f"{flag} {values[-1]}: Megatron-LM reads an integer there") from None


def check_values(args: Sequence[str]) -> None:
    """Refuse, in one line, an --eval-iters below 0 or an --eval-interval below 1: argparse takes
    them, and Megatron's data setup (training.py, ``get_train_valid_test_num_samples``, checked in
    core_v0.15.2: ``(train_iters // eval_interval + 1) * eval_iters`` global batches of validation)
    fails with a ZeroDivisionError for an interval of 0 and asks for a negative number of samples
    for a negative value."""
    given = flag_values(args)
    for flag, least in _LEAST.items():
        value = _integer(given, flag)
        if value is not None and value < least:
            want = "0 or more (0: no evaluation)" if least == 0 else "1 or more (--eval-iters 0 turns evaluation off)"
            fails = "divides by it (ZeroDivisionError)" if value == 0 else "asks for a negative number of samples"
            raise AdvisorError(f"{flag} {value}: give {want}; Megatron-LM does not check it, and its data setup "
                               f"(training.py, get_train_valid_test_num_samples) {fails}")


def interval_problem(release: MegatronRelease, args: Sequence[str]) -> str | None:
    """Where this release cannot start training without --eval-interval (``MegatronRelease.eval_interval``
    None: core_v0.19.0's data setup divides by it), the line that says so; None otherwise."""
    given = flag_values(args)
    if (release.eval_interval is not None or "--eval-interval" in given or "--skip-train" in given
            or "--full-validation" in given):
        return None
    return (f"{release.name} has no --eval-interval default, and its pretrain_gpt.py fails without one when it "
            "builds the datasets (training.py, get_train_valid_test_num_samples: train_iters // eval_interval, "
            "a TypeError with None): give --eval-interval N after -- (an evaluation every N iterations), with "
            "--eval-iters 0 for none")


def _test_split(given: Mapping[str, tuple[str, ...]]) -> bool | None:
    """Whether the data has a test split, where the command line says (module docstring); None: unknown."""
    if "--mock-data" in given and not ({"--data-path", "--data-args-path"} & given.keys()):
        return True
    if {"--data-path", "--data-args-path"} & given.keys():
        # validate_args gives --split its legacy default '969, 30, 1' with --data-path only (both
        # releases' arguments.py: 'if args.data_path is not None and args.split is None'): with
        # --data-args-path and no --split the command does not say
        if "--split" not in given and "--data-path" not in given:
            return None
        split = (given.get("--split") or ("969, 30, 1",))[-1]
        # megatron-core parse_and_normalize_split: the numbers of the string, padded with 0.0
        shares = [float(x) for x in re.findall(r"[.0-9]+", split) if x != "."] + [0.0, 0.0, 0.0]
        return shares[2] > 0
    if "--train-data-path" in given or "--valid-data-path" in given:
        return "--test-data-path" in given
    return None


def evaluation(release: MegatronRelease, args: Sequence[str], global_batch_size: int) -> Evaluation:
    """The evaluations of the command line ``args`` on ``release`` (module docstring)."""
    given = flag_values(args)
    eval_iters = _integer(given, "--eval-iters")
    interval = _integer(given, "--eval-interval") if "--eval-interval" in given else release.eval_interval
    train_iters = _integer(given, "--train-iters")
    samples = _integer(given, "--train-samples")
    if not train_iters and samples is not None and "--rampup-batch-size" not in given:
        train_iters = trained_iterations(samples, global_batch_size)
    own = ("--eval-iters", "--eval-interval", "--skip-train", "--full-validation", "--start-eval-at-iter")
    return Evaluation(
        eval_iters=release.eval_iters if eval_iters is None else eval_iters, interval=interval,
        train_iters=train_iters, skip_train="--skip-train" in given, start_at=_integer(given, "--start-eval-at-iter"),
        test_split=_test_split(given), full_validation="--full-validation" in given,
        eval_batch_differs=bool({"--eval-global-batch-size", "--eval-micro-batch-size"} & given.keys()),
        given=tuple(word for flag in own if flag in given for word in (flag, *given[flag])))


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:,.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:,.0f} min"
    return f"{seconds / 3600:,.1f} h" if seconds < 2 * 86400 else f"{seconds / 86400:,.1f} days"


def _schedule_text(e: Evaluation, release: MegatronRelease) -> str:
    """When it evaluates and how much each time, and whose values those are."""
    def whose(flag: str) -> str:
        return f"{flag}, yours" if flag in e.given else f"{flag}, {release.name}'s default"

    each = (f"{e.eval_iters:,} iterations of the global batch ({whose('--eval-iters')})" if not e.full_validation
            else "the whole validation split (--full-validation)")
    if e.skip_train:
        return f"no training (--skip-train), then each evaluation {each}"
    if e.interval:
        return f"every {e.interval:,} iterations ({whose('--eval-interval')}), each {each}"
    return f"not during training ({release.name} has no --eval-interval default), each {each}"


def describe(e: Evaluation, release: MegatronRelease, *, iteration_s: float | None = None,
             step_s: float | None = None, no_time: str | None = None) -> str:
    """One line for the job's report: when and how much it evaluates, its time where ``iteration_s``
    (one forward-only iteration) is known (else ``no_time`` says why), and how to turn it off."""
    if not e.validates:
        return f"evaluation: none (--eval-iters {e.eval_iters})"
    periodic, total = e.periodic, e.iterations
    if e.skip_train or not e.interval:
        during = ""
    elif periodic is None:
        during = "one each interval during training (the command line gives no length), "
    else:
        during = f"{f'{periodic:,}' if periodic else 'none'} during the {e.train_iters:,} training iterations, "
    end = ("1 on the validation set and 1 on the test set at the end" if e.test_split else
           "1 on the validation set at the end" + ("" if e.test_split is False else
                                                    ", and 1 on the test set where the data has a test split"))
    text = f"evaluation: {_schedule_text(e, release)}: {during}{end}"
    if total is not None:
        text += f"; {total:,} forward-only iterations"
        if iteration_s is not None:
            text += (f" at {iteration_s:.2f} s each (the time model's forward passes and pipeline fill), "
                     f"{_duration(total * iteration_s)}")
            if step_s and e.train_iters:
                text += f", {total * iteration_s / (e.train_iters * step_s):.1%} of the training's time"
        elif no_time:
            text += f" (no time: {no_time})"
    rarer = ", a larger --eval-interval makes it rarer" if e.interval and not e.skip_train else ""
    # do_valid = full_validation or eval_iters > 0 (build_train_valid_test_data_loaders)
    off = "--eval-iters 0 without --full-validation" if e.full_validation else "--eval-iters 0 after --"
    return f"{text}; {off} turns it off{rarer}"


def forward_only_time(row: Mapping | None, step_time_s: float | None, e: Evaluation) -> tuple[float | None, str]:
    """(seconds of one forward-only iteration, or None with the reason why not) for the input's row."""
    if e.eval_batch_differs:
        return None, "--eval-global-batch-size/--eval-micro-batch-size are not the batch the input was priced with"
    if row is None or step_time_s is None:
        return None, "the input was priced without a GPU preset (advisor sweep or estimate --gpu)"
    from advisor.saved_row_time import forward_only_iteration

    try:
        priced = forward_only_iteration(dict(row))
    except AdvisorError as exc:
        return None, str(exc)
    if not math.isclose(priced.step_s, step_time_s, rel_tol=1e-6):
        return None, (f"the time model re-prices its step at {priced.step_s:.3g} s, not its {step_time_s:.3g} s "
                      "(priced with other constants)")
    return priced.iteration_s, ""
