"""The dense sweep's output made fast (issue 21's sweep-speed target) gives what the plain way
gives: each row's flags made from parts shared between rows against ``megatron_args`` of that
row, and the JSON and CSV written through ``render.rows_to_json`` (tails: each row's own keys
after the setup) against the dicts built whole, one row at a time, as the sweep wrote them
before."""

import json

import pytest
from table_text import read_table

from advisor import render
from advisor.cli.estimate import _sweep_text
from advisor.render import recompute_text
from advisor.hardware import get_gpu
from advisor.megatron_args import megatron_args, rows_arg_parts
from advisor.models import PRESETS
from advisor.options import TrainingOptions
from advisor.options.flags import release_spelling, spelled_parts
from advisor.parallel import Workload
from advisor.sweep import sweep

SPEC = PRESETS["llama3.1-8b"]
WORKLOAD = Workload(seq_len=8192, global_batch_size=1024)
LEVERS = TrainingOptions().with_(fsdp_strategy="optim_grads", grad_reduce_dtype="bf16", fp8_format="hybrid")


@pytest.fixture(scope="module", params=["plain", "levers", "paper"])
def rows(request):
    if request.param == "paper":  # no time model; 16 GiB forces recomputation on some rows
        return sweep(SPEC, WORKLOAD, 64, 16.0).rows
    options = LEVERS if request.param == "levers" else TrainingOptions()
    return sweep(SPEC, WORKLOAD, 64, 80.0, gpu=get_gpu("h100-80gb"), memory_model="calibrated",
                 rank_by="throughput", options=options, tokens=1e12).rows


def _plain(rows, setup, fmt, plotted=False, price=None, release=None):
    """The rows as the sweep built them before: one whole dict per row, its flags from
    ``megatron_args`` in the words of ``release`` (``release_spelling`` of the whole list) and
    its options from ``TrainingOptions.changed``."""
    dicts = []
    for row in rows:
        entry = {**row.to_dict(), **setup}
        if price is not None:
            entry["cost_usd"] = entry["gpu_hours"] * price
        if plotted and fmt == "json":
            entry.update(split=render.counts_text(entry["layers_per_stage"]), recompute_text=recompute_text(entry))
        p, options = row.parallel, row.training.at_tp(row.parallel.tp)
        entry.update(options=options.changed(), megatron_args=release_spelling(release, megatron_args(
            SPEC, WORKLOAD.seq_len, tp=p.tp, cp=p.cp, layers_per_stage=row.layers_per_stage, micro_batch_size=p.mbs,
            global_batch_size=WORKLOAD.global_batch_size, options=options, virtual_stages=p.vpp, release=release)))
        if fmt == "csv":
            entry.update(options=json.dumps(entry["options"], sort_keys=True),
                         megatron_args=" ".join(entry["megatron_args"]),
                         layers_per_stage=render.counts_text(entry["layers_per_stage"]))
        dicts.append(entry)
    return render.to_json(dicts) if fmt == "json" else render.to_csv(dicts)


def test_flags_made_per_part_are_each_rows_own(rows):
    parts, options = rows_arg_parts(SPEC, 8192, 1024, rows)
    assert len(parts) == len(options) == len(rows) > 100
    # the model's and the options' flags shared, or the writer gains nothing (each row is its own layout)
    assert len({id(p[0]) for p in parts}) == 1 and len({id(p[2]) for p in parts}) < len(rows) / 4
    for row, p, o in zip(rows, parts, options):
        tp = row.parallel.tp
        assert o == row.training.at_tp(tp)
        assert [f for part in p for f in part] == megatron_args(
            SPEC, 8192, tp=tp, cp=row.parallel.cp, layers_per_stage=row.layers_per_stage,
            micro_batch_size=row.parallel.mbs, global_batch_size=1024, options=o, virtual_stages=row.parallel.vpp)


@pytest.mark.parametrize("release", [None, "0.15"])
@pytest.mark.parametrize("fmt, plotted, price", [("json", False, None), ("json", True, 2.5), ("csv", True, 2.5),
                                                  ("csv", False, None), ("json", True, None)])
def test_sweep_text_is_the_plain_rows(rows, fmt, plotted, price, release):
    if "gpu_hours" not in rows[0].to_dict():  # the --mem sweep has no token budget: no GPU-hours to price
        price = None
    setup = {"seq_len": 8192, "global_batch_size": 1024, "memory_gib": 80.0, "memory_model": "calibrated",
             "gpu": "h100-80gb", "ranking_tolerance": 0.05, "model": SPEC.to_dict() if fmt == "json" else SPEC.name}
    text = _sweep_text(rows, setup, SPEC, WORKLOAD, fmt, plotted, price, release)
    assert text == _plain(rows, setup, fmt, plotted, price, release)
    assert _sweep_text(rows[:1], setup, SPEC, WORKLOAD, fmt, plotted, price, release) == _plain(
        rows[:1], setup, fmt, plotted, price, release)
    assert _sweep_text([], setup, SPEC, WORKLOAD, fmt, plotted, price, release) == _plain(
        [], setup, fmt, plotted, price, release)


def test_spelled_parts_are_shared_as_the_parts_are(rows):
    """``spelled_parts`` keeps the writer's sharing: rows that share a part share its spelling,
    and rows that share their options' part share the gradient dtype's part too (core_v0.19.0's)."""
    parts, _ = rows_arg_parts(SPEC, 8192, 1024, rows)
    spelled = spelled_parts(None, parts)
    assert len({id(p[0]) for p in spelled}) == 1
    assert len({id(p[4]) for p in spelled}) == len({id(p[4]) for p in parts}) < len(rows) / 4
    assert len({id(p[5]) for p in spelled if p[5]}) <= len({id(p[4]) for p in parts})
    assert [len(p) for p in spelled_parts("0.15", parts)] == [5] * len(rows)  # no gradient flag there


def test_rows_to_json_tails():
    shared = {"seq_len": 8192, "model": {"name": "m"}}
    opts = {"options": {"fp8_format": "hybrid"}}
    rows = [{"rank": 1, "total_gib": 0.5}, {"rank": 2}, {"rank": 3, "options": 1}, {"rank": 4}, {"seq_len": 1},
            {"rank": 6}]
    tails = [opts, opts, opts, {}, opts, {"seq_len": 2, "cost_usd": 1.0}]  # a row or tail naming a key: plain path
    parts = [(("--a", "1"),), (("--a", "1"), ()), ((),), (), (("--b",),), (("--c",),)]
    whole = render.to_json([{**row, **shared, **tail, "megatron_args": [f for p in ps for f in p]}
                            for row, tail, ps in zip(rows, tails, parts)])
    assert render.rows_to_json(rows, shared, "megatron_args", parts, tails) == whole
    assert render.rows_to_json(rows[:2], {}, "args", parts[:2], tails[:2]) == render.to_json(
        [{**row, **tail, "args": [f for p in ps for f in p]} for row, tail, ps in zip(rows[:2], tails[:2], parts[:2])])
    with pytest.raises(ValueError):  # one tail per row
        render.rows_to_json(rows, shared, "megatron_args", parts, tails[:2])


def test_a_tail_rebuilt_at_a_reused_address_is_encoded_anew():
    rows = [{"rank": i} for i in range(50)]
    text = render.rows_to_json(rows, {}, "args", [()] * 50, ({"cost_usd": i} for i in range(50)))
    assert [row["cost_usd"] for row in json.loads(text)] == list(range(50))


def test_the_title_says_when_the_rows_use_a_lever_nothing_fits_without(advisor):
    """405B on 64 H100s at GBS 256: only optimizer CPU offload fits. stderr said so, the rows'
    options and flags too, but the table's title, the one line a reader keeps, did not."""
    result = advisor("sweep", "--model", "llama3.1-405b", "--gpus", 64, "--gpu", "h100-80gb", "--gbs", 256,
                     "--seq-len", 4096, "--top", 1)
    assert "the rows use optimizer CPU offload" in result.stderr
    title = read_table(result.stdout).title
    assert title.endswith("; the rows use optimizer CPU offload, as nothing fits without it")
    plain = advisor("sweep", "--model", "llama3.1-405b", "--gpus", 128, "--gpu", "h100-80gb", "--gbs", 256,
                    "--seq-len", 4096, "--top", 1)
    assert "the rows use" not in plain.stdout
