"""The MoE sweep's output made fast (issue 22's speed target) gives what the plain way gives: the
JSON writer that encodes shared parts once against ``render.to_json`` of the whole rows, the
flags made per distinct part against each row's own, the rows read out of the columns at once
against one row at a time, and a base's interleaved variants priced from its shared parts
against pricing each variant whole."""

import json
import math

import numpy as np
import pytest

from advisor import render
from advisor.hardware import get_gpu
from advisor.moe import flags
from advisor.moe import space as sp
from advisor.moe import stage as st
from advisor.moe.spec import PRESETS
from advisor.parallel import Workload

MIXTRAL, DSV3 = PRESETS["mixtral-8x7b"], PRESETS["deepseek-v3"]
WORKLOAD = Workload(seq_len=4096, global_batch_size=256)


@pytest.fixture(scope="module")
def mixtral_sweep():
    return sp.sweep(MIXTRAL, WORKLOAD, 64, 80.0, gpu=get_gpu("h100-80gb"))


def _whole(rows, shared, parts):
    return render.to_json([{**row, **shared, "megatron_args": [flag for part in p for flag in part]}
                           for row, p in zip(rows, parts)])


@pytest.mark.parametrize("count", [0, 1, 2, 40])
def test_rows_to_json_is_to_json_of_the_whole_rows(mixtral_sweep, count):
    rows = mixtral_sweep.rows(include_oom=True, limit=count or None)[:count]
    shared = {"seq_len": 4096, "model": MIXTRAL.to_dict(), "gpu": None, "ranking_tolerance": 0.069}
    parts = flags.rows_arg_parts(MIXTRAL, 4096, 256, rows)
    text = render.rows_to_json(rows, shared, "megatron_args", parts)
    assert text == _whole(rows, shared, parts)
    assert len(json.loads(text)) == count


def test_rows_to_json_edge_rows():
    shared = {"model": {"name": "m", "layers": [1, 2]}}
    a, b = ("--x", "1"), ()
    rows = [{"rank": 1, "total_gib": 0.1}, {"model": "mine", "rank": 2}, {}, {"rank": None, "total_gib": 1e-300}]
    parts = [(a, b, a), (a,), (b,), (b, b)]  # a row naming a shared key keeps its place; empty parts vanish
    assert render.rows_to_json(rows, shared, "megatron_args", parts) == _whole(rows, shared, parts)
    rows, parts = rows[:3], parts[:3]  # the last row through the plain path
    assert render.rows_to_json(rows, shared, "megatron_args", parts) == _whole(rows, shared, parts)
    assert render.rows_to_json(rows[1:2], shared, "megatron_args", parts[1:2]) == _whole(rows[1:2], shared, parts[1:2])
    assert render.rows_to_json(rows, {}, "args", parts) == render.to_json(
        [{**row, "args": [f for p in ps for f in p]} for row, ps in zip(rows, parts)])
    with pytest.raises(ValueError):  # JSON as the standard has it, as to_json
        render.rows_to_json([{"total_gib": math.nan}], shared, "megatron_args", [()])
    with pytest.raises(ValueError):
        render.rows_to_json([{"rank": 1}], {"bad": math.inf}, "megatron_args", [()])


def test_a_part_rebuilt_at_a_reused_address_is_encoded_anew():
    # parts made on the fly may be freed and their addresses reused: each text belongs to its own part
    rows = [{"rank": i} for i in range(50)]
    text = render.rows_to_json(rows, {}, "args", ((("--n", str(i)),) for i in range(50)))
    assert [row["args"] for row in json.loads(text)] == [["--n", str(i)] for i in range(50)]


def test_row_flags_made_per_part_are_each_rows_own(mixtral_sweep):
    rows = mixtral_sweep.rows(include_oom=True)
    parts = flags.rows_arg_parts(MIXTRAL, 4096, 256, rows)
    for i in range(len(parts[0])):  # each part shared, or the writer gains nothing
        assert len({id(p[i]) for p in parts}) < len(rows)
    for row, p in zip(rows[::7], parts[::7]):
        assert [f for part in p for f in part] == flags.row_args(MIXTRAL, 4096, 256, row)
        assert f"--expert-model-parallel-size {row['ep']} " in " ".join(p[-1]) + " "


def test_rows_read_at_once_are_rows_read_one_by_one(mixtral_sweep):
    result = mixtral_sweep
    rows = result.rows(include_oom=True)
    assert [r["rank"] for r in rows[:result.ranked]] == list(range(1, result.ranked + 1))
    assert all(r["rank"] is None for r in rows[result.ranked:])
    for position in (0, 1, result.ranked - 1, result.ranked, len(rows) - 1):
        one = result.row(int(result.order[position]))
        one["rank"] = rows[position]["rank"]
        assert one == rows[position]
    assert rows[0]["layers_per_stage"] is not rows[1]["layers_per_stage"]  # each row its own lists and dicts
    assert rows[0]["options"] is not rows[1]["options"]


def test_interleaved_variants_priced_from_their_base_parts():
    layouts = sp.enumerate_layouts(DSV3, WORKLOAD, 1024, 8, interleave=True)
    which = np.flatnonzero((layouts.recompute == 1) & (layouts.pp > 1))[::5]
    columns = layouts.columns(which)
    vpp = columns.pop("vpp")
    assert len(np.unique(vpp)) > 3
    m = WORKLOAD.global_batch_size / (columns["mbs"] * columns["dp"])
    stage = np.minimum(2, columns["pp"] - 1)
    whole = st.stage_bytes(DSV3, 4096, st.MoEOptions(), num_microbatches=m, stage=stage, recompute="selective",
                           vpp=vpp, **columns)
    by_base = sp._ByBase(layouts.base[which], {**columns, "vpp": vpp})
    assert by_base.shared and len(by_base.first) < len(which) / 3
    shared = by_base.stage_bytes(DSV3, 4096, st.MoEOptions(), stage, "selective", vpp, m)
    for name in st.StageBytes.__dataclass_fields__:
        assert np.array_equal(getattr(shared, name), getattr(whole, name)), name


def test_a_pinned_vpp_sweep_prices_its_variants():
    # --vpp N above 1 leaves no plain sibling to prune by: it ended in an IndexError traceback
    from click.testing import CliRunner

    from advisor.cli import cli

    base = ["--model", "mixtral-8x7b", "--gpus", "64", "--gpu", "h100-80gb", "--seq-len", "4096", "--gbs", "256"]
    done = CliRunner().invoke(cli, ["sweep", *base, "--vpp", "4", "--top", "3", "--format", "json"])
    assert done.exit_code == 0, done.output
    rows = json.loads(done.stdout)
    assert len(rows) == 3 and all(row["vpp"] == 4 and row["pp"] > 1 for row in rows)
    row = rows[0]
    one = json.loads(CliRunner().invoke(cli, ["estimate", *base, "--format", "json", "--recompute", row["recompute"],
                                              *(f"--{k}={row[k]}" for k in ("tp", "cp", "pp", "vpp", "ep", "etp",
                                                                            "mbs"))]).stdout)
    assert (one["usage_gib"], one["step_time_s"], one["verdict"]) == (row["usage_gib"], row["step_time_s"],
                                                                     row["verdict"])


@pytest.mark.parametrize("overlap", [False, True])
def test_step_times_priced_once_per_base_are_each_layouts(overlap):
    from dataclasses import replace

    from advisor.moe import time as mt

    spec = replace(DSV3, mtp_num_layers=1) if not overlap else MIXTRAL
    options = st.MoEOptions(a2a_overlap=overlap, training=st.MoEOptions().training.with_(fp8_format="hybrid"))
    layouts = sp.enumerate_layouts(spec, WORKLOAD, 512, 8, interleave=True)
    which = np.flatnonzero((layouts.recompute == 0) & (layouts.pp > 1) & (layouts.ep > 1))[::3]
    columns = layouts.columns(which)
    m = WORKLOAD.global_batch_size / (columns["mbs"] * columns["dp"])
    by_base = sp._ByBase(layouts.base[which], columns)
    assert by_base.shared
    first = st.stage_bytes(spec, 4096, options, num_microbatches=m, stage=0 * columns["pp"], recompute="none",
                           **columns)
    gpu = get_gpu("h100-80gb")
    whole = mt.step_times(spec, 4096, 256, columns, "none", gpu=gpu, options=options, first_stage=first)
    once = mt.step_times(spec, 4096, 256, columns, "none", gpu=gpu, options=options, first_stage=first,
                         bases=(by_base.first, by_base.inverse))
    assert whole.keys() == once.keys()
    for key in whole:
        assert np.array_equal(whole[key], once[key]), key


def test_the_variant_kept_per_base_is_lexsorts_first():
    rng = np.random.default_rng(22)
    for _ in range(200):
        n = int(rng.integers(1, 60))
        group = np.sort(rng.integers(0, 12, n))
        grade = rng.integers(0, 3, n)
        key = rng.choice([0.5, 1.0, 1.5, -0.0, 0.0, 2.0], n)  # ties, and -0.0 == 0.0
        order = np.lexsort((key, grade, group))
        expected = order[np.r_[True, group[order][1:] != group[order][:-1]]]
        assert np.array_equal(sp._first_best(group, grade, key), expected)
        shuffled = rng.permutation(n)  # out of order: the sort itself
        order = np.lexsort((key[shuffled], grade[shuffled], group[shuffled]))
        expected = order[np.r_[True, group[shuffled][order][1:] != group[shuffled][order][:-1]]]
        assert np.array_equal(sp._first_best(group[shuffled], grade[shuffled], key[shuffled]), expected)
