"""``python -m tables.seed004.reserve_forms``: does the calibrated memory model's reserve *form*
extrapolate? Alternative forms of the allocator's reserve, each fitted on seed 004 alone with
``oomfit``'s machinery, compared on seed 004's held-out validation, then (only then) set beside
data none of them was fitted or chosen on.

The calibrated usage of a stage is Eq. 18's terms, the runtime (2.5 GiB) and a reserve; the
activations carry a fitted factor k in every form (``oomfit.FACTOR_GRID``). The reserve, in GiB,
of a run on a GPU of M GiB whose peak stage allocates A GiB (its usage without reserve or runtime):

- ``fraction of memory`` (shipped): f M, f in ``oomfit.RESERVE_GRID``;
- ``constant``: c;
- ``share of allocated``: r A (the allocator's reserve grows with what it holds; r 0: a factor alone);
- ``fraction, capped``: min(f M, cap);
- ``constant + fraction``: c + f M.

Protocol, for every form alike (the shipped one's numbers are the project's, which checks the
harness): the grid point with the fewest wrong calls (false fits x3), a tie-break among equals
(``conservative``: the largest mean reserve on the training runs, then k nearest the prior's;
``largest margin``: the boundary farthest from the runs called right), chosen by leaving one
training table out (``oomfit.select_tie_break``), and the band from the training errors
(``oomfit.fit_memory``). Where the reserve has two parameters and the training runs one memory
size, equally good points remain: the grid's order then prefers no cap and no constant part
(the shipped form). Held out: (1) by GPU type, as ``tables.seed004.validation`` does (fit on the
A100 tables, call the H100 runs, and the reverse; 454 calls); (2) by table, each of the five left
out in turn. The fit on all 454 runs (``tables.seed004.calibrate``'s procedure) is then applied to
the H200 runs of benchmarks/gpu/data/h200_megatron_launch_boundary (12, 14 layers trained, 16 went
out of memory) and to the published MoE runs (``tables.published_moe``): an independent check,
used to choose nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import click
import numpy as np

from advisor.cli.options import OneLineCommand
from advisor.errors import AdvisorError
from advisor.verdicts import MemoryCalibration, verdict_for
from tables.seed004 import oomfit
from tables.seed004.validation import GPUS, TIGHT

RUNTIME_GIB = oomfit.PRIOR.overhead_gib
CONSTANT_GRID = np.round(np.arange(0.0, 30.001, 0.25), 2)
SHARE_GRID = np.round(np.arange(0.0, 0.4001, 0.005), 3)
CAP_GRID = np.round(np.arange(30.0, -0.001, -0.5), 1)
"""Descending: among equally good points the grid's first, no cap, wins."""
PART_GRID = np.round(np.arange(0.0, 15.001, 0.5), 1)
"""Ascending: among equally good points the grid's first, no constant part, wins."""
H200 = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "data" / "h200_megatron_launch_boundary" / "core_v0.15.2"
H200_OUTCOMES = {12: "ran", 14: "ran", 16: "OOM"}
"""The runs' status files (tests/test_gpu_megatron_launch_data.py)."""


@dataclass(frozen=True, slots=True)
class Form:
    name: str
    params: tuple[str, ...]
    grid: tuple[tuple[float, ...], ...]
    """Every combination of the reserve's parameters, in the order that breaks exact ties."""

    def reserve(self, p: tuple[float, ...], memory: np.ndarray, allocated: np.ndarray) -> np.ndarray:
        """The reserve in GiB (broadcast over ``memory`` and ``allocated``)."""
        if self.name == "fraction of memory":
            return p[0] * memory + 0 * allocated
        if self.name == "constant":
            return p[0] + 0 * (memory + allocated)
        if self.name == "share of allocated":
            return p[0] * allocated + 0 * memory
        if self.name == "fraction, capped":
            return np.minimum(p[0] * memory, p[1]) + 0 * allocated
        return p[0] + p[1] * memory + 0 * allocated  # constant + fraction

    def describe(self, p: tuple[float, ...]) -> str:
        return ", ".join(f"{name} {value:g}" for name, value in zip(self.params, p))

    @property
    def by_memory_alone(self) -> bool:
        """The reserve is set by the GPU's memory alone (not the allocation): ``fit_form`` counts
        its wrong calls on sorted peaks."""
        return self.name != "share of allocated"


def _pairs(a, b) -> tuple[tuple[float, ...], ...]:
    return tuple((float(x), float(y)) for x in a for y in b)


FORMS = (
    Form("fraction of memory", ("f",), tuple((float(x),) for x in oomfit.RESERVE_GRID)),
    Form("constant", ("c GiB",), tuple((float(x),) for x in CONSTANT_GRID)),
    Form("share of allocated", ("r",), tuple((float(x),) for x in SHARE_GRID)),
    Form("fraction, capped", ("f", "cap GiB"), _pairs(oomfit.RESERVE_GRID, CAP_GRID)),
    Form("constant + fraction", ("c GiB", "f"), _pairs(PART_GRID, oomfit.RESERVE_GRID)),
)


@dataclass(frozen=True, slots=True)
class FormFit:
    form: Form
    params: tuple[float, ...]
    factor: float
    band: float
    tie_break: str = "conservative"

    def usage(self, allocated_gib: np.ndarray, memory_gib: np.ndarray) -> np.ndarray:
        """Calibrated usage from the peak stage's usage without reserve (``allocated_gib``
        includes the runtime, as ``oomfit.MemoryRun``'s fixed terms do)."""
        return allocated_gib + self.form.reserve(self.params, memory_gib, allocated_gib - RUNTIME_GIB)

    def describe(self) -> str:
        return f"{self.form.describe(self.params)}, k {self.factor:g}, band {self.band:g}"


def _grid_columns(form: Form) -> tuple[np.ndarray, ...]:
    """The grid's parameters as columns (points, 1), so that ``Form.reserve`` prices every point at once."""
    grid = np.array(form.grid, dtype=float)
    return tuple(grid[:, [c]] for c in range(grid.shape[1]))


def _keys_by_broadcast(form: Form, peaks: np.ndarray, memory: np.ndarray, oom: np.ndarray):
    """(weighted wrong calls, mean reserve, margin), each (points, factors), from every run's ratio
    at every point and factor: the per-point computation of the fit, broadcast over the points
    (each element the same operations on the same numbers)."""
    columns = tuple(c[:, :, None] for c in _grid_columns(form))
    reserve = form.reserve(columns, memory, peaks[None] - RUNTIME_GIB)  # (points, factors, runs)
    r = (peaks[None] + reserve) / memory
    fits = r <= 1
    weighted = oomfit.FALSE_FITS_WEIGHT * np.sum(fits & oom, axis=2) + np.sum(~fits & ~oom, axis=2)
    margin = np.min(np.where(fits != oom, np.abs(r - 1), np.inf), axis=2)
    return weighted, np.mean(reserve, axis=2), margin


def _called_fit(xs: np.ndarray, reserve: np.ndarray, memory: float) -> np.ndarray:
    """How many of each factor's sorted peaks ``xs`` (factors, runs) are called fit with each
    point's reserve (points,): shape (points, factors). The call ``(x + reserve) / memory <= 1`` is
    monotone in x (IEEE addition and division round monotonically), so the count is where it turns
    false: searched at x <= memory - reserve, then moved run by run to where the fit's very
    expression turns (rounding can put it a run or so away)."""
    n = xs.shape[1]
    rows = np.arange(len(xs))[None]

    def called(k: np.ndarray) -> np.ndarray:
        return (xs[rows, np.clip(k, 0, n - 1)] + reserve[:, None]) / memory <= 1

    count = np.stack([np.searchsorted(x, memory - reserve, side="right") for x in xs], axis=1)
    while True:
        back, ahead = (count > 0) & ~called(count - 1), (count < n) & called(count)
        if not (back.any() or ahead.any()):
            return count
        count = count - back + ahead


def _keys_by_memory(form: Form, peaks: np.ndarray, memory: np.ndarray, oom: np.ndarray):
    """``_keys_by_broadcast``'s keys for a reserve set by the GPU's memory alone, without the
    (points, factors, runs) ratios: per memory size the reserve is one number per point, so the
    wrong calls are counts below a threshold of the sorted peaks (``_called_fit``) and the margin
    the ratio of the runs either side of it (|r - 1| grows away from the boundary)."""
    reserve = form.reserve(_grid_columns(form), memory, np.zeros_like(memory))  # (points, runs)
    shape = (len(form.grid), len(peaks))
    weighted, margin = np.zeros(shape, dtype=int), np.full(shape, np.inf)
    rows = np.arange(len(peaks))[None]
    for m in np.unique(memory):
        reserve_m = reserve[:, np.flatnonzero(memory == m)[0]]  # one per point: the reserve of memory m
        for went_oom in (True, False):
            xs = np.sort(peaks[:, (memory == m) & (oom == went_oom)], axis=1)
            n = xs.shape[1]
            if n == 0:
                continue
            called = _called_fit(xs, reserve_m, m)
            # OOM runs called fit are false fits; the first one called OOM is the nearest called
            # right. Runs that ran and were called OOM are false OOMs; the last called fit is nearest.
            weighted += oomfit.FALSE_FITS_WEIGHT * called if went_oom else n - called
            nearest = called if went_oom else called - 1
            r = (xs[rows, np.clip(nearest, 0, n - 1)] + reserve_m[:, None]) / m
            margin = np.minimum(margin, np.where((nearest >= 0) & (nearest < n), np.abs(r - 1), np.inf))
    return weighted, np.broadcast_to(np.mean(reserve, axis=1)[:, None], shape), margin


def _first_least(keys, shape) -> tuple[int, int]:
    """The (point, factor) of the least key, compared element by element as tuples are, the
    first in the grid's order among equals."""
    best = np.ones(shape, dtype=bool)
    for key in keys:
        key = np.broadcast_to(key, shape)
        best &= key == np.min(key[best])
    return divmod(int(np.flatnonzero(best)[0]), shape[1])


def fit_form(form: Form, runs, tie_break: str = "conservative") -> FormFit:
    """``oomfit.fit_memory`` for any form: the same weighting, tie-breaks and band. Every grid
    point's keys at once (``_keys_by_memory``, or ``_keys_by_broadcast`` for a reserve that
    depends on the allocation); the least of (weighted wrong calls, [-margin,] -mean reserve,
    distance of k from the prior's), the first in the grid's order among equals."""
    oom = np.array([x.oom for x in runs])
    memory = np.array([x.memory_gib for x in runs], dtype=float)
    peaks = oomfit.grid_peaks(runs)
    keys = _keys_by_memory if form.by_memory_alone else _keys_by_broadcast
    weighted, size, margin = keys(form, peaks, memory, oom)
    size = np.round(size, 9)
    distance = np.abs(oomfit.FACTOR_GRID - oomfit.PRIOR.activation_factor)[None]
    if tie_break == "conservative":
        order = (weighted, -size, distance)
    else:
        order = (weighted, -np.where(np.isfinite(margin), margin, 0.0), -size, distance)
    i, j = _first_least(order, weighted.shape)
    p = form.grid[i]
    r = (peaks[j] + form.reserve(p, memory, peaks[j] - RUNTIME_GIB)) / memory
    wrong = (r <= 1) == oom
    band = max(oomfit.MIN_BAND, float(np.max(np.abs(r[wrong] - 1))) if wrong.any() else 0.0)
    return FormFit(form, p, float(oomfit.FACTOR_GRID[j]), round(band + 1e-4, 4), tie_break)


def _usage(runs, fit: FormFit) -> np.ndarray:
    allocated = np.array([r.usage_gib(0.0, fit.factor) for r in runs])
    return fit.usage(allocated, np.array([r.memory_gib for r in runs], dtype=float))


def _errors(runs, fit: FormFit) -> tuple[int, int]:
    called = _usage(runs, fit) <= np.array([r.memory_gib for r in runs])
    oom = np.array([r.oom for r in runs])
    return int(np.sum(called & oom)), int(np.sum(~called & ~oom))


def fit_selected(form: Form, by_table: dict[int, tuple]) -> FormFit:
    """``oomfit.select_tie_break`` then ``fit_memory`` on these tables, for any form."""
    scores = {}
    for name in oomfit.TIE_BREAKS:
        ff = fo = 0
        for table, held in by_table.items():
            rest = [r for t, runs in by_table.items() if t != table for r in runs]
            a, b = _errors(held, fit_form(form, rest, name))
            ff, fo = ff + a, fo + b
        scores[name] = (ff, fo)
    order = list(oomfit.TIE_BREAKS)
    chosen = min(order, key=lambda n: (oomfit.FALSE_FITS_WEIGHT * scores[n][0] + scores[n][1], scores[n][0],
                                       order.index(n)))
    return fit_form(form, [r for runs in by_table.values() for r in runs], chosen)


@dataclass(frozen=True, slots=True)
class Score:
    correct: int
    total: int
    tight_correct: int
    tight: int
    false_fits: int
    false_ooms: int


def score(calls: list[tuple[object, str]]) -> Score:
    """(``oomfit.MemoryRun``, verdict) pairs scored as ``validation.Prediction`` does."""
    right = [(v in ("fits", "likely fits")) == (not r.oom) for r, v in calls]
    tight = [TIGHT[0] < r.run.row.memory_fraction <= TIGHT[1] for r, _ in calls]
    return Score(sum(right), len(calls), sum(a and b for a, b in zip(right, tight)), sum(tight),
                 sum(v in ("fits", "likely fits") and r.oom for r, v in calls),
                 sum(v not in ("fits", "likely fits") and not r.oom for r, v in calls))


def _calls(runs, fit: FormFit) -> list[tuple[object, str]]:
    return [(r, verdict_for(float(u), r.memory_gib, fit.band)) for r, u in zip(runs, _usage(runs, fit))]


def mean_reserve(runs, fit: FormFit) -> float:
    """The reserve ``fit`` adds, in GiB, averaged over ``runs``."""
    allocated = np.array([r.usage_gib(0.0, fit.factor) for r in runs])
    return float(np.mean(fit.usage(allocated, np.array([r.memory_gib for r in runs], dtype=float)) - allocated))


def held_out_by_gpu(form: Form, by_table: dict[int, tuple], gpu_of: dict[int, str]) -> tuple[Score, list[tuple]]:
    """The score of the calls held out by GPU type, and per direction (fit, its mean reserve on
    its own runs, on the held-out runs)."""
    calls, directions = [], []
    for train in GPUS:
        own = [r for t, runs in by_table.items() if gpu_of[t] == train for r in runs]
        held = [r for t, runs in by_table.items() if gpu_of[t] != train for r in runs]
        fit = fit_selected(form, {t: runs for t, runs in by_table.items() if gpu_of[t] == train})
        directions.append((fit, mean_reserve(own, fit), mean_reserve(held, fit)))
        calls += _calls(held, fit)
    return score(calls), directions


def held_out_by_table(form: Form, by_table: dict[int, tuple]) -> Score:
    calls = []
    for table, held in by_table.items():
        calls += _calls(held, fit_selected(form, {t: runs for t, runs in by_table.items() if t != table}))
    return score(calls)


def _without_reserve(factor: float):
    """The calibrated model with its reserve at 0 and the activation factor ``factor``, for the
    CLI's commands run in process (every caller loads the calibration through this function)."""
    from advisor.throughput import calibration

    cal = MemoryCalibration(reserve_fraction=0.0, activation_factor=factor)
    return mock.patch.object(calibration, "load_memory_calibration", lambda *a, **k: cal)


def _judged(fit: FormFit, row: dict) -> tuple[float, str]:
    """(usage GiB, verdict) of an estimate made ``_without_reserve``, with ``fit``'s reserve."""
    usage = float(fit.usage(np.array(row["usage_gib"]), np.array(float(row["memory_gib"]))))
    return usage, verdict_for(usage, row["memory_gib"], fit.band)


def h200_calls(fit: FormFit) -> list[tuple[int, float, str, str]]:
    """(layers, usage GiB, verdict, outcome) of the H200 runs, read back from their command as
    tests/test_gpu_megatron_launch_data.py does."""
    from click.testing import CliRunner

    from advisor.cli import cli

    command = (H200 / "l14-mbs2" / "command.sh").read_text()
    out = []
    for layers, outcome in H200_OUTCOMES.items():
        with _without_reserve(fit.factor):
            result = CliRunner().invoke(cli, ["estimate", "--from-command", "-", "--gpu", "h200-141gb",
                                              "--megatron-version", "core_v0.15.2", "--format", "json"],
                                        input=command.replace("--num-layers 14", f"--num-layers {layers}"),
                                        catch_exceptions=False)
        if result.exit_code != 0:
            raise AdvisorError(f"H200 run, {layers} layers: {result.output.strip()}")
        out.append((layers, *_judged(fit, json.loads(result.stdout)), outcome))
    return out


def moe_calls(fit: FormFit) -> list[tuple[str, float, str]]:
    """(id, usage GiB, verdict) of every published Megatron MoE run (not ``context``), each priced
    as ``tables.published_moe`` prices it."""
    from tables import published_moe

    out = []
    for run in published_moe.load():
        if run.role != "context":
            with _without_reserve(fit.factor):
                row, _, _ = published_moe.price(run)
            out.append((run.id, *_judged(fit, row)))
    return out


def study(forms=FORMS) -> list[dict]:
    from tables.seed004.results import analyse

    measured = analyse().measured
    by_table = {t.paper.number: oomfit.memory_runs([t]) for t in measured}
    gpu_of = {t.paper.number: t.paper.gpu for t in measured}
    rows = []
    for form in forms:
        by_gpu, direction_fits = held_out_by_gpu(form, by_table, gpu_of)
        everything = fit_selected(form, by_table)
        rows.append({"form": form, "by_gpu": by_gpu, "directions": direction_fits,
                     "by_table": held_out_by_table(form, by_table), "all": everything,
                     "h200": h200_calls(everything), "moe": moe_calls(everything)})
    return rows


def _score(s: Score) -> str:
    weighted = oomfit.FALSE_FITS_WEIGHT * s.false_fits + s.false_ooms
    return (f"{s.correct}/{s.total} | {s.tight_correct}/{s.tight} | {s.false_fits} | {s.false_ooms} | {weighted}")


RUNNABLE = ("fits", "likely fits")
H200_RESERVED_LESS_ALLOCATED = {12: 122.52 - 112.75, 14: 135.96 - 127.26}
"""GiB, the last iteration's peaks (tests/test_gpu_megatron_launch_data.py)."""
MOE_CHECKED = "mb2509-q30-td"
"""The MoE run whose verdict needs a reserve under 7.0 GiB (tables.published_moe.NOT_RUNNABLE)."""


def _reserve_at(fit: FormFit, memory_gib: float, usage_gib: float) -> float:
    """The reserve of a run whose calibrated usage is ``usage_gib`` (solved for the allocation)."""
    if fit.form.name == "share of allocated":
        return (usage_gib - RUNTIME_GIB) * fit.params[0] / (1 + fit.params[0])
    return float(fit.form.reserve(fit.params, np.array(memory_gib), np.array(0.0)))


def markdown(rows: list[dict]) -> str:
    """Two tables: seed 004 held out (the comparison), then the independent check."""
    lines = ["Seed 004, held out (each call from constants fitted without its GPU type, or its table); "
             "FF: false fits (called fits / likely fits, went OOM), FO: false OOMs, loss: 3 FF + FO, what the fit "
             "minimises:", "",
             "| reserve form | by GPU type: right | tight band | FF | FO | loss "
             "| by table: right | tight band | FF | FO | loss |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        lines.append(f"| {row['form'].name} | {_score(row['by_gpu'])} | {_score(row['by_table'])} |")
    lines += ["", "Fitted on one GPU type (the by-GPU folds); the reserve it adds, mean GiB over its own runs and "
              "over the other type's:", "",
              "| reserve form | fitted on A100 (40 GiB) | own | on H100 | fitted on H100 (94 GiB) | own | on A100 |",
              "|---|---|---:|---:|---|---:|---:|"]
    for row in rows:
        (a100, a_own, a_held), (h100, h_own, h_held) = row["directions"]
        lines.append(f"| {row['form'].name} | {a100.describe()} | {a_own:.1f} | {a_held:.1f} | "
                     f"{h100.describe()} | {h_own:.1f} | {h_held:.1f} |")
    lines += ["", "Fitted on all 454 runs (the shipped procedure), then checked on data none was fitted or chosen "
              "on: the H200 runs (reserved less allocated, measured: 9.8 GiB at 12 layers, 8.7 at 14) and the "
              f"published MoE runs ({MOE_CHECKED}: runnable with a reserve under 7.0 GiB):", "",
              "| reserve form | fitted on all 454 | H200 reserve, 14 layers | H200 12 / 14 / 16 layers: GiB of 141 "
              "(ran / ran / OOM) | right | MoE runs called runnable | "
              f"{MOE_CHECKED}: GiB of 80 |",
              "|---|---|---:|---|---:|---:|---|"]
    for row in rows:
        fit: FormFit = row["all"]
        h200 = "; ".join(f"{usage:.1f} {verdict}" for _, usage, verdict, _ in row["h200"])
        right = sum((v in RUNNABLE) == (o == "ran") for _, _, v, o in row["h200"])
        fourteen = next(usage for layers, usage, _, _ in row["h200"] if layers == 14)
        moe = {i: (usage, verdict) for i, usage, verdict in row["moe"]}
        runnable = sum(v in RUNNABLE for _, v in moe.values())
        lines.append(f"| {row['form'].name} | {fit.describe()} | {_reserve_at(fit, 141, fourteen):.1f} | {h200} "
                     f"| {right}/3 | {runnable}/{len(moe)} | {moe[MOE_CHECKED][0]:.1f} {moe[MOE_CHECKED][1]} |")
    return "\n".join(lines) + "\n"


BEGIN = ("<!-- BEGIN RESERVE FORMS: generated by `python -m tables.seed004.reserve_forms --readme docs/estimator.md`; "
         "do not edit by hand -->")
END = "<!-- END RESERVE FORMS -->"


def section(text: str) -> str:
    """``markdown``'s tables between the markers, as docs/estimator.md holds them."""
    return f"{BEGIN}\n\n{text}\n{END}"


@click.command(cls=OneLineCommand)
@click.option("--readme", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Also rewrite this Markdown file's section between its BEGIN/END RESERVE FORMS markers with "
                   "the tables, e.g. docs/estimator.md (tests/test_reserve_forms.py checks that it is current).")
def main(readme: Path | None) -> None:
    """Fit each reserve form on seed 004, validate it held out, and check it on the H200 and MoE runs.

    \b
    Examples:
      python -m tables.seed004.reserve_forms
      python -m tables.seed004.reserve_forms --readme docs/estimator.md   # and rewrite its section
    """
    from advisor.fileio import atomic_write_text
    from tables.readme import read_readme, replace_between

    # a file without the markers stops before the seconds of fitting
    original = None if readme is None else read_readme(readme, BEGIN, END)
    text = markdown(study())
    if readme is not None:
        atomic_write_text(readme, replace_between(original, BEGIN, END, section(text)))
    click.echo(text, nl=False)


if __name__ == "__main__":
    main()
