"""A Megatron-LM training log, read: iteration times, reported TFLOP/s, the memory report of the
first logged iteration and Megatron's own theoretical memory.

The lines, as megatron/training/ writes them (core_v0.15.2 and core_v0.19.0 alike):

- ``training.py``, ``training_log``: `` [DATE] iteration   N/  T | consumed samples: ... |
  elapsed time per iteration (ms): 988.6 | throughput per GPU (TFLOP/s/GPU): 412.3 | ...``
  (throughput only with ``--log-throughput``; the time is the mean over the log interval);
- ``utils.py``, ``report_memory``: ``[Rank R] (after N iterations) memory (MB) | allocated: A |
  max allocated: M | reserved: S | max reserved: X`` (MB = 2^20 bytes; printed by the ranks with
  data-parallel rank 0, so one per model-parallel rank);
- ``theoretical_memory_usage.py``, ``report_theoretical_memory``: ``Theoretical memory
  footprints: weight and optimizer=W MB, activation=A MB, total=T MB``;
- and, from a launch with the advisor's hooks (``advisor-launch ... --profile-dir``,
  ``megatron_hooks.integration.peak_line``): ``megatron_hooks: [Rank R] peak over N iterations:
  A MB allocated, S MB reserved``, one per rank that Megatron reports for. The hooks reset torch's
  peak counters at every layer, so in a log of theirs Megatron's own reports count only from the
  last reset: the hooks' peaks are read instead, and a log that shows the hooks ran (a
  ``megatron_hooks:`` line, the launcher's ``--profile-dir``) without them has its memory rows
  marked cut short, with no ratio.

What a memory report after the first iteration of a fresh run shows: Adam's momentum and variance
are made in the first optimizer step (torch.optim.Adam's lazy state; Transformer Engine's FusedAdam
likewise), after that iteration's backward, so its forward and backward peak lacks them (8 of the
optimizer's 12 bytes a parameter). core_v0.15.2 reports only after the first logged iteration;
core_v0.19.0 after the second too ("to include optimizer state memory", its training_log). On an
H200 a 14-layer model peaked at 96.7 GiB in iteration 1 and 127.3 GiB from iteration 2 on
(benchmarks/gpu/data/h200_megatron_launch_boundary).

Lines may carry a launcher's prefix (torchrun ``--tee``'s ``[default0]:``, srun ``--label``'s
``0: ``): each pattern is searched for anywhere in a line. Other lines are skipped.

Megatron prints whole lines, so a text that stops without a line end was cut (a log still being
written, or a copy cut short): its last line, if it begins an iteration or memory line, may have
lost digits (``531.2`` cut to ``53``) or fields, and is not read (``TrainingLog.cut_line``).
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field
from typing import Iterable

from advisor import limits
from advisor.errors import AdvisorError
from advisor.options import TrainingOptions
from advisor.parallel import RANK_ORDER, pipeline_stage_of_rank

# The sign is matched so that a negative number is refused by _measured, not skipped with its line.
_NUMBER = r"([+-]?(?:[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|nan|inf))"
_ITERATION = re.compile(r"iteration\s+(\d+)/\s*(\d+)\s*\|.*?elapsed time per iteration \(ms\): " + _NUMBER)
_THROUGHPUT = re.compile(r"throughput per GPU \(TFLOP/s/GPU\): " + _NUMBER)
_BATCH = re.compile(r"global batch size:\s*(\d+)")
_MEMORY = re.compile(r"\[Rank (\d+)\] \(after (\d+) iterations\) memory \(MB\) \| allocated: " + _NUMBER
                     + r" \| max allocated: " + _NUMBER + r" \| reserved: " + _NUMBER + r" \| max reserved: " + _NUMBER)
_HOOKS_PEAK = re.compile(r"megatron_hooks: \[Rank (\d+)\] peak over (\d+) iterations: " + _NUMBER
                         + r" MB allocated(?:, " + _NUMBER + r" MB reserved)?")
_HOOKED = re.compile(r"megatron_hooks:|--profile-dir[\s=]")
"""A line showing the advisor's hooks ran: theirs, or advisor-launch's echo of its command."""
_OOM = re.compile(r"OutOfMemoryError|CUDA out of memory")
LAYOUT_ARGUMENTS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                    "group_query_attention", "tensor_model_parallel_size", "pipeline_model_parallel_size",
                    "context_parallel_size", "micro_batch_size", "seq_length", "world_size", "data_parallel_size",
                    "use_tp_pp_dp_mapping")
"""What a log's argument dump (``arguments.py``, ``_print_args``: ``  name ..... value``) is
checked against the command by: the model's size, the layout, the world and the rank order.
``padded_vocab_size`` is not among them: the dump prints None, as the tokenizer is built after it;
the padded vocabulary line gives it (``_PADDED_VOCAB``)."""
_ARGUMENT = re.compile(r"\b(" + "|".join(LAYOUT_ARGUMENTS) + r") \.{2,} (\S+)\s*$")
_WORLD = re.compile(r"using world size: (\d+), data-parallel size: (\d+),")
"""``validate_args``'s first line (arguments.py, core_v0.15.2 and core_v0.19.0)."""
_PADDED_VOCAB = re.compile(r"> padded vocab \(size: \d+\) with \d+ dummy tokens \(new size: (\d+)\)")
"""``_vocab_size_with_padding`` (megatron/training/tokenizer/tokenizer.py in core_v0.15.2;
megatron/core/tokenizers/utils/build_tokenizer.py in core_v0.19.0): the embedding's rows."""
_SKIPPED = re.compile(r"number of skipped iterations:\s*(\d+)")
_NANS = re.compile(r"number of nan iterations:\s*(\d+)")
"""``training_log``'s counts over the log interval (its total_loss_dict is reset after each line)."""
_CUT = re.compile(r"iteration\s+\d+/|\[Rank \d+\] \(after ")
"""The beginning of an iteration or memory line: enough to tell that a cut last line was one."""
_THEORETICAL = re.compile(r"Theoretical memory footprints: weight and optimizer=" + _NUMBER
                          + r" MB, activation=" + _NUMBER + r" MB, total=" + _NUMBER + " MB")
MIB = 2**20


@dataclass(frozen=True, slots=True)
class Iteration:
    iteration: int
    elapsed_ms: float
    """The mean time per iteration over the log interval that ends here."""
    tflops_per_gpu: float | None
    global_batch_size: int | None
    skipped: int = 0
    """The interval's iterations whose optimizer step was skipped (a loss-scale overflow)."""
    nans: int = 0
    """The interval's iterations with a NaN or infinite loss."""


@dataclass(frozen=True, slots=True)
class MemoryReport:
    rank: int
    after_iterations: int
    allocated_mib: float
    max_allocated_mib: float
    reserved_mib: float
    max_reserved_mib: float


@dataclass(frozen=True, slots=True)
class Peak:
    """One rank's peak memory as compare-log sets it beside the estimate."""

    rank: int
    max_allocated_mib: float
    max_reserved_mib: float | None
    source: str
    """"hooks" (the run's peak), "report" (Megatron's, with Adam's moments made), "first
    iteration" (iteration 1's of a fresh run, before the moments exist: Megatron's report or a
    hooks line over one iteration) or "cut" (Megatron's under the hooks, which reset its counters:
    not the peak)."""
    iterations: int | None = None
    """The iterations a hooks line's peak spans."""


@dataclass(frozen=True, slots=True)
class Theoretical:
    weight_and_optimizer_mib: float
    activation_mib: float
    total_mib: float


@dataclass
class TrainingLog:
    iterations: list[Iteration] = field(default_factory=list)
    memory: list[MemoryReport] = field(default_factory=list)
    theoretical: list[Theoretical] = field(default_factory=list)
    hooks: list[Peak] = field(default_factory=list)
    """The advisor's hooks' peaks (``megatron_hooks: [Rank R] peak ...`` lines)."""
    hooked: bool = False
    """Whether a line shows the hooks ran (``_HOOKED``)."""
    out_of_memory: bool = False
    """Whether a line says CUDA ran out of memory."""
    arguments: dict[str, str] = field(default_factory=dict)
    """``LAYOUT_ARGUMENTS`` as the log's argument dump printed them; also world_size and
    data_parallel_size from the 'using world size' line, and padded_vocab_size from the padded
    vocabulary line."""
    compared_batch: int | None = None
    """The global batch whose iterations are compared (the final one of a ramp-up); None: all."""
    cut_line: int | None = None
    """The last line's number where it is an iteration or memory line without a line end (not read)."""

    def compared(self) -> list[Iteration]:
        """The iterations at ``compared_batch`` (all where it is None, or where a line gives no batch)."""
        return [i for i in self.iterations
                if self.compared_batch is None or i.global_batch_size in (None, self.compared_batch)]

    def steady(self) -> list[Iteration]:
        """The compared iterations after the first (which carries start-up: compilation, NCCL
        set-up, allocator growth; after a ramp-up, its interval may hold smaller batches), or the
        first if it is all there is."""
        compared = self.compared()
        return compared[1:] or compared

    def step_time_s(self) -> float | None:
        """The median steady iteration time, in seconds."""
        steady = self.steady()
        return statistics.median(i.elapsed_ms for i in steady) / 1000 if steady else None

    def tflops_per_gpu(self) -> float | None:
        values = [i.tflops_per_gpu for i in self.steady() if i.tflops_per_gpu is not None]
        return statistics.median(values) if values else None

    def peak_by_rank(self) -> dict[int, Peak]:
        """Each rank's peak: the hooks' where the log has their lines (Megatron's own reports are
        cut short by the hooks' resets then), else its report with the highest max-allocated,
        marked "first iteration" where that report follows the first iteration of a fresh run."""
        out: dict[int, MemoryReport] = {}
        for report in self.memory:
            if report.rank not in out or report.max_allocated_mib > out[report.rank].max_allocated_mib:
                out[report.rank] = report
        fresh = bool(self.iterations) and self.iterations[0].iteration == 1
        if self.hooks:
            return {peak.rank: self._hooks_peak(peak, out.get(peak.rank), fresh) for peak in self.hooks}

        def source(report: MemoryReport) -> str:
            if self.hooked:
                return "cut"
            return "first iteration" if fresh and report.after_iterations == 1 else "report"

        return {rank: Peak(rank, report.max_allocated_mib, report.max_reserved_mib, source(report))
                for rank, report in out.items()}

    @staticmethod
    def _hooks_peak(peak: "Peak", report: "MemoryReport | None", fresh: bool) -> "Peak":
        """A hooks line with Megatron's report of the same rank: the larger of the two, each a
        lower bound of the rank's peak (the hooks count train_step whole; Megatron's report, cut
        by their resets, may count work after it, such as --log-params-norm's FP32 copies); the
        peak over one iteration of a fresh run is iteration 1's, before Adam's moments exist."""
        allocated = max(peak.max_allocated_mib, report.max_allocated_mib if report else 0.0)
        reserved = [x for x in (peak.max_reserved_mib, report.max_reserved_mib if report else None) if x is not None]
        source = "first iteration" if fresh and peak.iterations == 1 else "hooks"
        return Peak(peak.rank, allocated, max(reserved) if reserved else None, source, peak.iterations)


def read_log(lines: Iterable[str], *, last_line_ended: bool = True) -> TrainingLog:
    """The records of a Megatron-LM log's lines; AdvisorError if it holds no iteration line.
    ``last_line_ended`` False: the text stops without a line end, so its last line may be cut."""
    lines = list(lines)
    log = TrainingLog()
    for number, line in enumerate(lines, 1):
        log.hooked = log.hooked or bool(_HOOKED.search(line))
        log.out_of_memory = log.out_of_memory or bool(_OOM.search(line))
        _read_arguments(log, line, number)
        if number == len(lines) and not last_line_ended and _CUT.search(line):
            log.cut_line = number
        elif match := _ITERATION.search(line):
            throughput, batch, skipped, nans = (pattern.search(line) for pattern in (_THROUGHPUT, _BATCH, _SKIPPED, _NANS))
            log.iterations.append(Iteration(
                iteration=_counted(match.group(1), number, "iteration"),
                elapsed_ms=_measured(match.group(3), number, _TIME),
                tflops_per_gpu=_measured(throughput.group(1), number, _RATE) if throughput else None,
                global_batch_size=_counted(batch.group(1), number, "global batch size") if batch else None,
                skipped=_counted(skipped.group(1), number, "number of skipped iterations") if skipped else 0,
                nans=_counted(nans.group(1), number, "number of nan iterations") if nans else 0))
        elif match := _MEMORY.search(line):
            rank, after, *values = match.groups()
            log.memory.append(MemoryReport(_counted(rank, number, "rank"),
                                           _counted(after, number, "the report's iteration count"),
                                           *(_measured(v, number, _MEMORY_MB) for v in values)))
        elif match := _HOOKS_PEAK.search(line):
            rank, iterations, allocated, reserved = match.groups()
            log.hooks.append(Peak(_counted(rank, number, "rank"), _measured(allocated, number, _MEMORY_MB),
                                  None if reserved is None else _measured(reserved, number, _MEMORY_MB), "hooks",
                                  _counted(iterations, number, "the peak's iteration count")))
        elif match := _THEORETICAL.search(line):
            log.theoretical.append(Theoretical(*(_measured(v, number, _MEMORY_MB) for v in match.groups())))
    if not log.iterations:
        cut = f"; line {log.cut_line}, the last, stops without a line end and is not read" if log.cut_line else ""
        raise AdvisorError("no Megatron-LM iteration line ('iteration N/ T | ... elapsed time per iteration (ms): "
                           f"...') in the log{cut}")
    return log


def _read_arguments(log: TrainingLog, line: str, number: int) -> None:
    """The run's arguments a line prints (the dump, the world line, the padded vocabulary) into
    ``log.arguments``; AdvisorError where one differs from an earlier line's: a second run."""
    found: list[tuple[str, str]] = []
    if argument := _ARGUMENT.search(line):
        found.append(argument.groups())
    if world := _WORLD.search(line):
        found += [("world_size", world.group(1)), ("data_parallel_size", world.group(2))]
    if padded := _PADDED_VOCAB.search(line):
        found.append(("padded_vocab_size", padded.group(1)))
    for name, value in found:
        if log.arguments.setdefault(name, value) != value:
            raise AdvisorError(f"line {number} of the log: a second run's {name} {value} (the first's "
                               f"{log.arguments[name]}): give one run's log")


def cut_note(log: TrainingLog) -> str | None:
    """The note that the log's cut last line was not read; None if it was not cut."""
    if log.cut_line is None:
        return None
    return f"line {log.cut_line}, the last, stops without a line end (a log still being written, or cut): not read"


def ends_a_line(text: str) -> bool:
    """Whether ``text`` is empty or ends with a line end (any of str.splitlines's)."""
    return text[-1:].splitlines() in ([], [""])


_TIME = ("elapsed time per iteration (ms)", limits.LOGGED_ITERATION_MS)
_RATE = ("throughput per GPU (TFLOP/s/GPU)", limits.LOGGED_TFLOPS)
_MEMORY_MB = ("memory (MB)", limits.LOGGED_MEMORY_MIB)
"""What a logged number is, in the log's words, and its bound (``_measured``)."""


def _measured(text: str, line: int, quantity: tuple[str, limits.Bound]) -> float:
    """A logged number; nan or inf (1e999 reads as inf) has no measured meaning, and JSON none;
    no time, rate or memory Megatron prints is negative, nor beyond its ``quantity``'s bound
    (1e300 ms was compared as a step time of 10^297 s)."""
    value = float(text)
    if not math.isfinite(value) or value < 0:
        what = "not a finite number" if not math.isfinite(value) else "negative"
        # shortened as a JSON value is: a 5,000-digit number was written whole into the line
        raise AdvisorError(f"line {line} of the log: {limits.json_text(text)} is {what}; compare-log reads only "
                           "measured times and memory")
    return limits.check_float(value, *quantity, f"line {line} of the log")


def _counted(text: str, line: int, what: str) -> int:
    """A logged iteration, rank or count (digits: the patterns match no sign), within int64."""
    digits = text.lstrip("0") or "0"
    # int() of over 4,300 digits is a ValueError (a traceback); a number of as many digits says the size
    value = int(digits) if len(digits) <= 4300 else 10 ** (len(digits) - 1)
    return limits.check_int(value, what, limits.LOGGED_COUNT, f"line {line} of the log")


def _row(what: str, measured: float | None, predicted: float | None, unit: str) -> dict:
    # a logged 0 is no measurement: a run without CUDA (on the CPU) logs 0 MB and 0 TFLOP/s
    ratio = measured / predicted if measured and predicted else None
    return {"what": what, "unit": unit, "measured": measured, "predicted": predicted, "measured_over_predicted": ratio}


def check_ranks(log: TrainingLog, world_size: int) -> None:
    """AdvisorError where a hooks peak line or a memory report cannot be this run's: a rank
    outside its world (its memory would otherwise be left out of every stage, unsaid)."""
    lines = [("megatron_hooks line", peak.rank) for peak in log.hooks]
    lines += [("memory report", report.rank) for report in log.memory]
    for what, rank in lines:
        if rank >= world_size:
            raise AdvisorError(f"the log's {what} names rank {rank}, but the command runs "
                               f"{world_size} GPU{'s' if world_size != 1 else ''}: is it this run's log?")


def run_notes(log: TrainingLog) -> list[str]:
    """What the log says about how the run went that the rows do not show."""
    notes = []
    if len(log.iterations) == 1:
        notes.append("one iteration logged: its time includes start-up (compilation, NCCL set-up)")
    skipped, nans = sum(i.skipped for i in log.iterations), sum(i.nans for i in log.iterations)
    if skipped or nans:  # training_log's 'number of skipped iterations' and 'number of nan iterations'
        counts = [f"{n} {what} iteration{'s' if n != 1 else ''} ({why})" for n, what, why in (
            (skipped, "skipped", "the optimizer step skipped: its gradients overflowed"),
            (nans, "NaN", "a NaN or infinite loss")) if n]
        notes.append(f"the log counts {' and '.join(counts)}")
    if log.out_of_memory:
        notes.append(f"the run ran out of CUDA memory (the log says so) after {len(log.iterations)} logged "
                     f"iteration{'s' if len(log.iterations) != 1 else ''}")
    return notes


def compare(log: TrainingLog, estimate: dict, *, world_size: int, rank_order: str = RANK_ORDER) -> list[dict]:
    """Measured against predicted, one row per quantity: the step time and TFLOP/s (where the
    estimate has a time model and the log the numbers), then each pipeline stage's peak allocated
    memory (the highest of its ranks' reports, each rank's stage by ``rank_order``) against the
    stage's estimate (Eq. 18), and the peak reserved memory against the calibrated usage."""
    check_ranks(log, world_size)
    rows = [_row("step time", log.step_time_s(), estimate.get("step_time_s"), "s"),
            _row("TFLOP/s per GPU", log.tflops_per_gpu(), estimate.get("tflops_per_gpu"), "TFLOP/s")]
    pp, stages = estimate["pp"], estimate["stages"]
    peaks = log.peak_by_rank()
    degrees = {"tp": estimate["tp"], "cp": estimate["cp"], "dp": world_size // (estimate["tp"] * estimate["cp"] * pp)}
    for stage in stages:
        ranks = [r for r in peaks.values()
                 if pipeline_stage_of_rank(r.rank, **degrees, pp=pp, order=rank_order) == stage["stage"]]
        measured = max((r.max_allocated_mib for r in ranks), default=None)
        sources = {r.source for r in ranks}
        when = {frozenset({"first iteration"}): " (iteration 1)", frozenset({"cut"}): " (cut short)"}
        row = _row(f"stage {stage['stage']} max allocated{when.get(frozenset(sources), '')}",
                   None if measured is None else measured * MIB / 2**30, stage["total_gib"], "GiB")
        if "cut" in sources:  # not the peak: no ratio
            row["measured_over_predicted"] = None
        rows.append(row)
    if estimate.get("usage_gib") is not None:
        reserved = max((r.max_reserved_mib for r in peaks.values() if r.max_reserved_mib is not None), default=None)
        rows.append(_row("peak max reserved (calibrated)", None if reserved is None else reserved * MIB / 2**30,
                         estimate["usage_gib"], "GiB"))
    return rows


def memory_source_note(log: TrainingLog, estimate: dict) -> str | None:
    """Where the measured memory comes from, where it is not Megatron's report of a later
    iteration: the hooks' lines, or a first iteration before Adam's moments (their GiB on the
    first stage: in FP32 8 of the optimizer's 12 bytes a parameter, ``equations.ADAM_MOMENT_BYTES``;
    ``TrainingOptions.first_step_bytes`` of the estimate's options)."""
    sources = {peak.source for peak in log.peak_by_rank().values()}
    if log.hooks and "first iteration" not in sources:
        return ("memory: the advisor's hooks' peaks over the run (megatron_hooks lines); Megatron's own reports "
                "count only from the hooks' last reset of torch's peak counters")
    if "cut" in sources:
        return ("memory: the advisor's hooks ran (--profile-dir) but the log has no peak line of theirs, so Megatron's "
                "reports count only from the hooks' last reset of torch's peak counters: not the peak, no ratio "
                "(each iteration's peak is in the profile directory: advisor profile show DIR)")
    if "first iteration" not in sources:
        return None
    stage = estimate["stages"][0]
    options = TrainingOptions.from_dict(estimate.get("options") or {})
    moments = stage["optimizer_gib"] * options.first_step_bytes / options.optimizer_bytes
    what = "the hooks' peaks span iteration 1 only" if log.hooks else "Megatron reported after iteration 1 only"
    return (f"memory: {what}, before Adam's momentum and variance existed ({moments:.3g} GiB on stage 0, made in the "
            "first optimizer step): its peak can be that much below the steady peak predicted (core_v0.19.0 also "
            "reports after iteration 2; a launch with --profile-dir prints each rank's peak over the run)")


def unmeasured_note(rows: list[dict]) -> str | None:
    """The note naming the quantities the log gives as 0, as a run without CUDA (on the CPU)
    logs its memory and TFLOP/s, which therefore have no ratio; None if there are none."""
    zeros = [row["what"] for row in rows if row["measured"] == 0]
    if not zeros:
        return None
    return f"logged as 0, so not measured (a run without CUDA, such as a CPU run), no ratio: {', '.join(zeros)}"


def theoretical_note(log: TrainingLog, estimate: dict) -> str | None:
    """Megatron's own theoretical memory (its first stage, megatron/training/theoretical_memory_usage.py)
    beside ours for the same stage; None if the log has none."""
    if not log.theoretical:
        return None
    theirs, ours = log.theoretical[0], estimate["stages"][0]
    return (f"Megatron's own theoretical memory (stage 0): weights and optimizer "
            f"{theirs.weight_and_optimizer_mib * MIB / 2**30:.3g} GiB, activations {theirs.activation_mib * MIB / 2**30:.3g}"
            f" GiB, total {theirs.total_mib * MIB / 2**30:.3g} GiB; ours {ours['model_states_gib']:.3g} + "
            f"{ours['activations_gib']:.3g} = {ours['total_gib']:.3g} GiB")
