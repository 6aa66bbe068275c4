"""How many evaluations a Megatron-LM run makes besides training, and how many forward-only
iterations they take: the counting, which the launcher (``launch.evaluation``, from a command
line) and ``advisor estimate --tokens`` (from a release's defaults) share.

Read from ``megatron/training/training.py`` (core_v0.15.2 and core_v0.19.0): after iteration i
(1..N) ``if args.eval_interval and i % args.eval_interval == 0 and args.do_valid`` (core_v0.19.0
also ``i >= --start-eval-at-iter``), one evaluation on the validation set; at the end one more on
it (``do_valid``: ``eval_iters > 0`` or --full-validation) and one on the test set (``do_test``:
the same, and a test split); each of ``eval_iters`` global batches, forward only
(``advisor.throughput.forward_only`` prices one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class Evaluation:
    """The evaluations one run makes (module docstring)."""

    eval_iters: int
    interval: int | None
    train_iters: int | None
    """Megatron's training iterations; None where the command line does not say (or a batch ramp-up)."""
    skip_train: bool = False
    start_at: int | None = None
    test_split: bool | None = None
    full_validation: bool = False
    eval_batch_differs: bool = False
    """core_v0.19.0's --eval-global-batch-size or --eval-micro-batch-size given: not the row's batch."""
    given: tuple[str, ...] = ()
    """The evaluation flags the user gave, for the report."""

    @property
    def periodic(self) -> int | None:
        """Evaluations during training: the multiples of the interval in [max(1, start), N]."""
        if self.skip_train or not self.interval or not self.validates:
            return 0
        if self.train_iters is None:
            return None
        first = max(1, self.start_at or 1)
        return max(0, self.train_iters // self.interval - (first - 1) // self.interval)

    @property
    def validates(self) -> bool:
        return self.eval_iters > 0 or self.full_validation

    @property
    def final(self) -> int:
        """Evaluations at the end: the validation set's, and the test set's where the data has one."""
        return int(self.validates) + int(self.validates and bool(self.test_split))

    @property
    def iterations(self) -> int | None:
        """Forward-only iterations of the global batch in all; None where unknown."""
        periodic = self.periodic
        if periodic is None or self.full_validation:
            return None
        return (periodic + self.final) * self.eval_iters


def budget_samples(tokens: float, seq_len: int) -> int:
    """The --train-samples advisor-launch writes for a token budget: sequences of ``seq_len``
    tokens that hold it, rounded up."""
    return math.ceil(tokens / seq_len)


def trained_iterations(samples: int, global_batch_size: int) -> int:
    """The iterations Megatron-LM trains for --train-samples: whole global batches, the last
    partial one dropped (core_v0.15.2 and core_v0.19.0 megatron/training/training.py,
    update_train_iters: ``args.train_iters = args.train_samples // args.global_batch_size``)."""
    return samples // global_batch_size


def default_evaluation(eval_iters: int, interval: int | None, train_iters: int) -> Evaluation:
    """A release's defaults over ``train_iters`` iterations, on data with a test split (mock data,
    or Megatron's default --split '969, 30, 1' with --data-path)."""
    return Evaluation(eval_iters=eval_iters, interval=interval, train_iters=train_iters, test_split=True)


def budget_words(tokens: float, seq_len: int, global_batch_size: int, release) -> str:
    """What a token budget's days and GPU-hours leave out on ``release`` (an
    ``advisor.releases.MegatronRelease``), which count training alone: where the release evaluates
    during training by default (core_v0.15.2: every 1,000 iterations), how many forward-only
    iterations its defaults add; where it has no default interval (core_v0.19.0: its
    pretrain_gpt.py cannot build its datasets without --eval-interval,
    ``launch.evaluation.interval_problem``), that the evaluation is the user's own to set
    (advisor-launch prices it in its report). The count depends on the budget and the global
    batch alone, so a sweep's rows share it."""
    if release.eval_interval is None:  # the user's to set, and the launch refuses to start without it
        # said as what the user will give, not 'the evaluation you set': nothing was set yet (review)
        return (f"not in these figures: evaluation, whose --eval-interval you must give: {release.name} has no "
                "default and cannot train without one (its data setup divides by it)")
    return _default_words(_budget_evaluation(tokens, seq_len, global_batch_size, release), release)


def _default_words(e: Evaluation, release) -> str:
    """``budget_words`` for a release that evaluates by default, its evaluations ``e``."""
    return (f"not in these figures: {release.name} also evaluates by default (--eval-interval "
            f"{release.eval_interval:,}, --eval-iters {release.eval_iters}), {e.iterations:,} forward-only iterations "
            f"over the {e.train_iters:,} training iterations")


def _budget_evaluation(tokens: float, seq_len: int, global_batch_size: int, release) -> Evaluation:
    """The evaluations of the iterations a budget trains, at ``release``'s defaults."""
    train_iters = trained_iterations(budget_samples(tokens, seq_len), global_batch_size)
    return default_evaluation(release.eval_iters, release.eval_interval, train_iters)


def budget_note(row: dict, release) -> str | None:
    """For one row's token budget (``advisor estimate --tokens``): ``budget_words``, with the
    evaluation's time where the time model prices it (a dense row on a GPU preset,
    ``forward_only_iteration``; an MoE row's time model prices whole steps, so its note gives the
    count alone); None where the row has no budget."""
    if not row.get("tokens") or not row.get("step_time_s"):
        return None
    if release.eval_interval is None:
        return budget_words(row["tokens"], row["seq_len"], row["global_batch_size"], release)
    from advisor.errors import AdvisorError
    from advisor.saved_row_time import forward_only_iteration

    e = _budget_evaluation(row["tokens"], row["seq_len"], row["global_batch_size"], release)
    text = _default_words(e, release)
    try:
        seconds = forward_only_iteration(row).iteration_s * e.iterations
    except AdvisorError:  # an MoE row: its time model prices whole steps, not a rank's forward
        seconds = None
    if seconds is not None and e.train_iters:
        text += (f", {seconds / 86400:.1f} days more ({seconds / (e.train_iters * row['step_time_s']):.1%}; "
                 "the time model's forward passes)")
    return f"{text}; --eval-iters 0 turns it off"
