"""advisor report --from holds a sweep row or an estimate to advisor-launch's check of its own
megatron_args against its fields (advisor.row_flags, one check for both readers): a row edited in
one and not the other would be priced on one layout and shown with the flags of another. Through
the real CLIs (CliRunner), as a user runs them."""

import json

import pytest

from launch_support import launcher, write_json

SAVED = {  # the JSON each command writes (--format json -o), untouched
    "dense estimate": ("estimate", "--tp", "2", "--pp", "2", "--gpus", "8"),
    "moe estimate": ("estimate", "--model", "mixtral-8x7b", "--tp", "2", "--ep", "8", "--pp", "2", "--gpus", "64",
                     "--gpu", "h100-80gb"),
    "dense sweep": ("sweep", "--gpus", "64", "--mem", "80"),
    # rows with optimizer CPU offload and each its own recomputation (full block n among them)
    "dense sweep with options": ("sweep", "--model", "llama3.1-70b", "--gpus", "16", "--gpu", "h100-80gb", "--top",
                                 "60"),
    "moe sweep": ("sweep", "--model", "mixtral-8x7b", "--gpus", "64", "--gpu", "h100-80gb"),
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict:
    from conftest import Invoker

    folder = tmp_path_factory.mktemp("saved")
    paths = {}
    for name, command in SAVED.items():
        paths[name] = folder / f"{name.replace(' ', '_')}.json"
        Invoker()(*command, "--format", "json", "-o", paths[name])
    return paths


@pytest.mark.parametrize("name", SAVED)
def test_an_untouched_row_is_reported(advisor, tmp_path, saved, name):
    document = json.loads(saved[name].read_text())
    rows = document if isinstance(document, list) else [document]
    assert all(row["megatron_args"] for row in rows)  # the premise: every row carries its flags
    if name == "dense sweep with options":  # ... and those rows price options beyond the defaults
        assert {row["recompute"] for row in rows} >= {"none", "full"}
        assert all(row["options"].get("optimizer_cpu_offload") for row in rows)
    advisor("report", "--from", saved[name], "-o", tmp_path / "r.html")
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")


def _edit_flag(row: dict, flag: str, value: str) -> dict:
    args = list(row["megatron_args"])
    args[args.index(flag) + 1] = value
    return {**row, "megatron_args": args}


def _first(document: list, edit) -> list:
    assert document[0]["rank"] == 1  # the row advisor-launch picks by default
    return [edit(document[0]), *document[1:]]


# (the saved input, the edit, the words after "inconsistent ", from the row's own values read by hand)
EDITS = {
    "its TP": ("dense estimate", lambda row: _edit_flag(row, "--tensor-model-parallel-size", "4"),
               "estimate: its megatron_args give --tensor-model-parallel-size 4, its fields say 2"),
    "its model's size": ("dense estimate", lambda row: {**row, "model": {**row["model"], "hidden_size": 8192}},
                         "estimate: its megatron_args give --hidden-size 4096, its fields say 8192"),
    "its precision": ("dense estimate", lambda row: {**row, "megatron_args": [
                          "--fp16" if arg == "--bf16" else arg for arg in row["megatron_args"]]},
                      "estimate: its megatron_args lack --bf16, which its fields give"),
    "its experts": ("moe estimate", lambda row: {**row, "model": {**row["model"], "num_experts": 16}},
                    "estimate: its megatron_args give --num-experts 8, its fields say 16"),
    "a sweep row's EP": ("moe sweep",
                         lambda rows: _first(rows, lambda row: _edit_flag(row, "--expert-model-parallel-size", "16")),
                         "sweep row: its megatron_args give --expert-model-parallel-size 16, its fields say 8"),
    "a sweep row's TP": ("dense sweep with options",
                         lambda rows: _first(rows, lambda row: _edit_flag(row, "--tensor-model-parallel-size", "8")),
                         "sweep row: its megatron_args give --tensor-model-parallel-size 8, its fields say 4"),
    # the page prices a dense row's own recomputation fields; the launcher launched its options'
    "its recomputation": ("dense estimate", lambda row: {**row, "recompute": "full"},
                          "estimate: its megatron_args lack --recompute-granularity, its fields say full"),
}


@pytest.mark.parametrize("what", EDITS)
def test_a_row_that_contradicts_itself_is_refused_by_the_report_as_by_the_launcher(advisor, tmp_path, saved, what):
    name, edit, words = EDITS[what]
    document = json.loads(saved[name].read_text())
    path = write_json(tmp_path / "edited.json", edit(document))
    where = f"{path}, row 1" if isinstance(document, list) else str(path)
    assert advisor.error("report", "--from", path, "-o", tmp_path / "r.html") == f"Error: {where}: inconsistent {words}"
    assert not (tmp_path / "r.html").exists()
    # the launcher's refusal in the same words (its origin names the row by rank)
    launched = launcher().error("args", "--from", path)
    assert launched.endswith(f": inconsistent {words}")
