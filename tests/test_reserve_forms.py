"""tables/seed004/reserve_forms.py: the allocator reserve's forms, fitted on seed 004 only. Its
harness is checked against the numbers the project already reports for the shipped form."""

import numpy as np
import pytest
from conftest import ROOT, Invoker

from advisor.throughput.calibration import load_memory_calibration
from tables.seed004 import oomfit
from tables.seed004 import reserve_forms as rf
from tables.seed004.results import analyse

SHIPPED, CONSTANT, SHARE, CAPPED, PART = rf.FORMS


@pytest.fixture(scope="module")
def seed004():
    measured = analyse().measured
    return ({t.paper.number: oomfit.memory_runs([t]) for t in measured},
            {t.paper.number: t.paper.gpu for t in measured})


def test_the_shipped_form_held_out_by_gpu_type_is_what_tables_readme_reports(seed004):
    """tables/README.md, issue 16's targets: 442 of 454 right, 65 of the tight band's 76, 8 false
    fits; its confusion table's false OOMs: 3 ran called likely oom + 1 called oom = 4. The
    per-direction constants of its 'fitted on / tested on' table."""
    by_table, gpu_of = seed004
    score, directions = rf.held_out_by_gpu(SHIPPED, by_table, gpu_of)
    assert score == rf.Score(correct=442, total=454, tight_correct=65, tight=76, false_fits=8, false_ooms=4)
    (a100, *_), (h100, *_) = directions
    assert (a100.params, a100.factor, a100.band, a100.tie_break) == ((0.18,), 0.9, 0.0554, "conservative")
    assert (h100.params, h100.factor, h100.band, h100.tie_break) == ((0.065,), 1.13, 0.067, "largest margin")


def test_the_shipped_form_fitted_on_all_runs_is_the_shipped_calibration(seed004):
    """advisor/calibration.json was written by tables.seed004.calibrate through oomfit.fit_memory,
    not this module's fit: the two agree."""
    by_table, _ = seed004
    fit = rf.fit_selected(SHIPPED, by_table)
    shipped = load_memory_calibration()
    assert (fit.params[0], fit.factor, fit.band) == (shipped.reserve_fraction, shipped.activation_factor, shipped.band)


def test_each_forms_reserve_by_hand():
    """On an H200 (141 GiB) whose peak stage allocates 120 GiB beside the runtime:
    0.155 x 141 = 21.855; 4 GiB; 0.115 x 120 = 13.8; min(0.17 x 141 = 23.97, 14.5) = 14.5;
    1 + 0.145 x 141 = 21.445."""
    memory, allocated = np.array(141.0), np.array(120.0)
    assert [float(form.reserve(p, memory, allocated)) for form, p in (
        (SHIPPED, (0.155,)), (CONSTANT, (4.0,)), (SHARE, (0.115,)), (CAPPED, (0.17, 14.5)), (PART, (1.0, 0.145)))
    ] == pytest.approx([21.855, 4.0, 13.8, 14.5, 21.445])


def test_the_h200_runs_under_the_shipped_form_are_the_launch_datas_figures():
    """tests/test_gpu_megatron_launch_data.py: read back from the runs' command, 12 layers 134.57
    GiB calibrated (likely fits), 14 layers 148.71 (likely oom; it trained), 16 layers oom. 148.71
    is 126.86 without the reserve + 0.155 x 141 = 21.855."""
    fit = rf.FormFit(SHIPPED, (0.155,), 0.95, 0.0723)
    calls = rf.h200_calls(fit)
    assert [(layers, round(usage, 2), verdict, outcome) for layers, usage, verdict, outcome in calls] == [
        (12, 134.57, "likely fits", "ran"), (14, 148.71, "likely oom", "ran"), (16, 162.85, "oom", "OOM")]
    assert calls[1][1] - 0.155 * 141 == pytest.approx(126.86, abs=0.005)


def test_docs_estimator_md_holds_the_tables_the_code_computes_now():
    """docs/estimator.md's reserve-form tables are a generated section: a change of the fits, the
    data or the verdicts fails here until `python -m tables.seed004.reserve_forms --readme
    docs/estimator.md` rewrites it (seconds: every form fitted on every fold)."""
    committed = (ROOT / "docs" / "estimator.md").read_text()
    assert rf.section(rf.markdown(rf.study())) in committed, \
        "regenerate with: python -m tables.seed004.reserve_forms --readme docs/estimator.md"


def test_readme_without_the_markers_is_one_line_before_any_fitting(tmp_path, monkeypatch):
    readme = tmp_path / "notes.md"
    readme.write_text("# no markers\n")
    monkeypatch.setattr(rf, "study", lambda: pytest.fail("fitted before checking the markers"))
    line = Invoker(rf.main).error("--readme", readme)
    assert line == f"Error: the README has no results markers ({rf.BEGIN!r} ... {rf.END!r})"
    assert readme.read_text() == "# no markers\n"


@pytest.mark.parametrize("form", [f for f in rf.FORMS if f.by_memory_alone], ids=lambda f: f.name)
def test_the_sorted_peaks_keys_are_the_broadcast_ratios_keys(seed004, form):
    """fit_form's shortcut for a reserve set by the memory alone (a binary search on the sorted
    peaks) against every run's ratio at every grid point and factor (the fit's own computation,
    broadcast): the same wrong calls, mean reserves and margins, bit for bit, on all 454 runs."""
    by_table, _ = seed004
    runs = [r for runs in by_table.values() for r in runs]
    oom = np.array([x.oom for x in runs])
    memory = np.array([x.memory_gib for x in runs])
    peaks = oomfit.grid_peaks(runs)
    fast = rf._keys_by_memory(form, peaks, memory, oom)
    for start in range(0, len(form.grid), 100):  # in slices: 100 points x 41 factors x 454 runs at a time
        part = rf.Form(form.name, form.params, form.grid[start:start + 100])
        for shortcut, broadcast in zip(fast, rf._keys_by_broadcast(part, peaks, memory, oom)):
            assert np.array_equal(shortcut[start:start + 100], broadcast)
