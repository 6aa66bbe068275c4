"""``advisor sweep --tp/--cp/--pp/--mbs`` (Megatron's sizes beside them): a pinned sweep is the
full sweep's rows with that degree, each priced as there (brute force against the unpinned
search), a pinned value the search would not try (MBS 3) is enumerated under the same rules and its
rows launch as priced, and a pin no layout can have is one line, exit status 2."""

from __future__ import annotations

import shlex

import pytest
from click.testing import CliRunner

from advisor.cli import cli
from advisor.hardware import get_gpu
from advisor.models import load_model
from advisor.moe.space import sweep as moe_sweep
from advisor.options import TrainingOptions
from advisor.parallel import Pinned, Workload
from advisor.space import SpaceOptions
from advisor.sweep import sweep
from tests.test_cli_wording import refused
from tests.test_from_command import PRICED, invoke

H100 = get_gpu("h100-80gb")
LLAMA = load_model("llama3.1-8b")
MIXTRAL = load_model("mixtral-8x7b")


def _dense(rows) -> dict:
    def key(row):
        p = row.parallel
        return p.tp, p.cp, p.pp, p.dp, p.mbs

    return {key(row): (row.verdict, row.timing["step_time_s"], row.judged_gib, row.options)
            for row in rows}


@pytest.fixture(scope="module")
def dense_full():
    return _dense(sweep(LLAMA, Workload(seq_len=8192, global_batch_size=1024), 64, 80, max_tp=8, options=TrainingOptions(), gpu=H100,
                        memory_model="calibrated").rows)


@pytest.mark.parametrize("pinned", [Pinned(tp=4), Pinned(pp=2), Pinned(cp=2, mbs=2), Pinned(tp=8, pp=4, mbs=1)])
def test_a_pinned_dense_sweep_is_the_full_sweeps_rows_with_that_degree(dense_full, pinned):
    names = ("tp", "cp", "pp", "dp", "mbs")
    want = {key: value for key, value in dense_full.items()
            if all(key[names.index(name)] == pin for name, pin in pinned.given().items())}
    got = _dense(sweep(LLAMA, Workload(seq_len=8192, global_batch_size=1024), 64, 80, max_tp=8, options=TrainingOptions(), gpu=H100,
                       memory_model="calibrated", space=SpaceOptions(pinned=pinned)).rows)
    assert want and got == want


@pytest.mark.parametrize("pinned", [Pinned(tp=2), Pinned(pp=4, mbs=1)])
def test_a_pinned_moe_sweep_is_the_full_sweeps_rows_with_that_degree(pinned):
    keys = ("tp", "cp", "pp", "ep", "etp", "dp", "mbs")

    def priced(result):
        return {tuple(row[k] for k in keys): (row["verdict"], row["step_time_s"], row["vpp"], row["usage_gib"])
                for row in result.rows(include_oom=True)}

    workload = Workload(seq_len=4096, global_batch_size=256)
    full = priced(moe_sweep(MIXTRAL, workload, 64, 80, gpu=H100))
    want = {key: value for key, value in full.items()
            if all(key[keys.index(name)] == pin for name, pin in pinned.given().items())}
    assert want and priced(moe_sweep(MIXTRAL, workload, 64, 80, gpu=H100, pinned=pinned)) == want


def test_a_micro_batch_the_search_skips_is_swept_when_pinned_and_launches_as_priced():
    # 1,026 = 2 x 27 x 19: MBS 3 divides it, and no power of 2 above 2 does
    argv = ["sweep", "--gpus", "16", "--gpu", "h100-80gb", "--seq-len", "2048", "--gbs", "1026",
            "--micro-batch-size", "3", "--format", "json"]
    rows = invoke(argv)
    assert rows and {row["mbs"] for row in rows} == {3}
    assert all(1026 % (3 * row["dp"]) == 0 for row in rows)
    row = rows[0]
    assert row["megatron_args"][row["megatron_args"].index("--micro-batch-size") + 1] == "3"
    # the newest release (read back by default): core 0.19's NullTokenizer builds --vocab-size rows
    command = shlex.join(row["megatron_args"] + ["--tokenizer-type", "NullTokenizer", "--vocab-size", "128256"])
    estimate = invoke(["estimate", "--from-command", "-", "--gpus", "16", "--gpu", "h100-80gb", "--format", "json"],
                      stdin=command)
    assert {key: estimate.get(key) for key in PRICED} == {key: row.get(key) for key in PRICED}


def test_pins_take_megatrons_names_and_show_in_every_row():
    rows = invoke(["sweep", "--gpus", "64", "--gpu", "h100-80gb", "--tensor-model-parallel-size", "2",
                   "--pipeline-model-parallel-size", "2", "--context-parallel-size", "2", "--format", "json"])
    assert rows and {(row["tp"], row["pp"], row["cp"]) for row in rows} == {(2, 2, 2)}


@pytest.mark.parametrize("args, words", [
    (["--tp", "16"], "--tp 16 is more than --gpus-per-node 8: the sweep keeps TP within a node"),
    (["--tp", "3"], "--tp 3 must divide the attention heads (32) and the KV heads (8)"),
    (["--pp", "33"], "--pp 33 exceeds the 32 layers"),
    (["--pp", "3"], "--gpus 64 is not divisible by TP x CP x PP = 1 x 1 x 3 = 3"),
    (["--cp", "2", "--tp", "8", "--pp", "8"], "--gpus 64 is not divisible by TP x CP x PP = 8 x 2 x 8 = 128"),
    (["--cp", "16", "--seq-len", "48"], "sequence length 48 must be divisible by 2 x CP = 32"),
    (["--mbs", "3"], "--gbs 1024 is not divisible by --mbs 3"),
])
def test_a_pin_no_layout_can_have_is_one_line(args, words):
    assert words in refused(cli, "sweep", "--gpus", "64", "--gpu", "h100-80gb", *args)


def test_a_moe_pin_no_layout_can_have_is_one_line():
    assert "--tp 16 is more than --gpus-per-node 8" in refused(
        cli, "sweep", "--gpus", "64", "--gpu", "h100-80gb", "--model", "mixtral-8x7b", "--tp", "16")
    assert refused(cli, "sweep", "--gpus", "64", "--gpu", "h100-80gb", "--model", "mixtral-8x7b", "--pp", "64") \
        == "--pp 64 exceeds the 32 layers"
    # pins that pass one by one but meet no layout together name themselves
    assert "satisfies megatron-core's constraints with TP 8, CP 1, PP 2, MBS 128" in refused(
        cli, "sweep", "--gpus", "64", "--gpu", "h100-80gb", "--model", "mixtral-8x7b", "--seq-len", "4096",
        "--gbs", "256", "--tp", "8", "--cp", "1", "--pp", "2", "--mbs", "128")


def test_estimate_keeps_its_own_tp():
    # the pins are the sweep's: estimate's --tp is the layout it prices (default 1), not a filter
    result = CliRunner().invoke(cli, ["estimate", "--gpus", "8", "--tp", "8", "--format", "json"])
    assert result.exit_code == 0 and '"tp": 8' in result.stdout


def test_where_nothing_fits_a_pin_is_among_the_hints():
    dense = CliRunner().invoke(cli, ["sweep", "--gpus", "8", "--gpu", "h100-80gb", "--seq-len", "524288", "--gbs", "8",
                                     "--pp", "2"])
    assert dense.exit_code == 1
    assert dense.stderr.rstrip().endswith("Try more GPUs, no --pp or a shorter --seq-len (--all shows the rows)")
    # --sharding fixed: the default ladder runs it with optimizer CPU offload (tests/test_moe_escalation.py)
    moe = CliRunner().invoke(cli, ["sweep", "--gpus", "8", "--gpu", "h100-80gb", "--model", "mixtral-8x7b", "--tp", "2",
                                   "--pp", "2", "--sharding", "fixed"])
    assert moe.exit_code == 1
    assert moe.stderr.rstrip().endswith("Try more GPUs, no --tp/--pp or a GPU with more memory (--all shows the rows)")
