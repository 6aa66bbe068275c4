"""The note that a sweep's rows use a lever because nothing fit names only the fields the rows have."""

from __future__ import annotations

import json

from tests.conftest import Invoker


def test_the_note_names_the_time_cost_only_where_there_is_a_time_model():
    invoke = Invoker()
    for extra, timed in ((["--mem", "8"], False), (["--gpu", "h100-80gb", "--mem", "16"], True)):
        result = invoke("sweep", "--gpus", "8", *extra, "--top", "2", "--format", "json")
        note = [line for line in result.stderr.splitlines() if "nothing fits with the options given" in line]
        rows = json.loads(result.stdout)
        assert len(note) == 1 and rows
        assert ("lever_time_cost_s" in note[0]) == timed == ("lever_time_cost_s" in rows[0])
