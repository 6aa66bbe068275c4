"""advisor-launch --from and advisor report --from read a saved sweep row, estimate or plan
through one check each (``advisor.saved_row.check_saved_fields`` for rows and estimates): what
one refuses, the other refuses in the same line, exit status 2 and no traceback. Run on files
the advisor itself writes, each edited by hand in one field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from advisor.cli import cli as advisor
from launch.cli import cli as launcher


def invoke(command, *args) -> tuple[int, str]:
    result = CliRunner().invoke(command, [str(arg) for arg in args])
    return result.exit_code, result.stderr


def both_refuse(path: Path, words: str) -> None:
    """Both readers refuse ``path`` in one line ending in ``words``; the report writes no page."""
    page = path.with_suffix(".html")
    for code, stderr in (invoke(launcher, "args", "--from", path),
                         invoke(advisor, "report", "--from", path, "-o", page)):
        assert code == 2 and stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
        assert stderr.rstrip().endswith(words), stderr
    assert not page.exists()


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, dict]:
    """A sweep row and an estimate of Llama 3.1 8B on 8 H100s, as the advisor writes them."""
    folder = tmp_path_factory.mktemp("saved")
    gpu = ("--gpus", "8", "--gpu", "h100-80gb", "--format", "json")
    assert invoke(advisor, "sweep", *gpu, "--tokens", "1e9", "-o", folder / "sweep.json")[0] == 0
    assert invoke(advisor, "estimate", *gpu, "--tp", "2", "-o", folder / "estimate.json")[0] == 0
    return {"row": json.loads((folder / "sweep.json").read_text())[0],
            "estimate": json.loads((folder / "estimate.json").read_text())}


EDITS = [
    ({"vp": 2}, "unknown field 'vp' (did you mean 'vpp'?): no sweep row or estimate the advisor writes has it"),
    ({"verdict": "OOM"}, "'verdict' must be null or fits, tight, oom, likely fits, likely oom, got 'OOM'"),
    ({"tokens": "1T"}, "'tokens' must be a number, got '1T'"),
    ({"step_time_s": 1e-300}, "'step_time_s' must be above 1e-06, got 1e-300"),
]


@pytest.mark.parametrize("kind", ["row", "estimate"])
@pytest.mark.parametrize("edit, words", EDITS, ids=[next(iter(edit)) for edit, _ in EDITS])
def test_a_hand_edited_field_is_refused_by_both_readers(tmp_path, saved, kind, edit, words):
    path = tmp_path / f"{kind}.json"
    path.write_text(json.dumps({**saved[kind], **edit}))
    both_refuse(path, words)


@pytest.mark.parametrize("kind", ["row", "estimate"])
def test_what_the_advisor_writes_is_read_by_both(tmp_path, saved, kind):
    path = tmp_path / f"{kind}.json"
    path.write_text(json.dumps(saved[kind]))
    assert invoke(launcher, "args", "--from", path)[0] == 0
    assert invoke(advisor, "report", "--from", path, "-o", tmp_path / "page.html")[0] == 0
