"""An MoE layout's own pipeline split (``advisor estimate --layers-per-stage``, a command's
--decoder-first/last-pipeline-num-layers or layout read back) and ``--compare-best`` for MoE
models: the stage memory and the step time against hand-derived values, the flags read back,
the best row against ``advisor sweep``'s own."""

import json
import shlex
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from advisor.cli import cli
from advisor.hardware import get_gpu
from advisor.moe import memory as mm
from advisor.moe import stage as st
from advisor.moe import time as mt
from advisor.moe.space import estimate_layout
from advisor.moe.spec import PRESETS
from advisor.options import TrainingOptions
from advisor.parallel import Workload
from advisor.throughput import terms
from advisor.throughput.calibration import load_calibration

MIXTRAL, DSV3 = PRESETS["mixtral-8x7b"], PRESETS["deepseek-v3"]
MIXTRAL_64 = ["--model", "mixtral-8x7b", "--gpus", "64", "--pp", "4", "--ep", "8", "--gbs", "256", "--seq-len", "4096",
              "--gpu", "h100-80gb"]


def test_a_given_split_prices_each_stage_by_hand():
    # Mixtral, PP 2 split 12 | 20, TP 1, CP 1, EP 8, DP 8, MBS 1, 4 microbatches (the dense test's layout,
    # tests/test_moe_time_stage.py, with 16 | 16 there)
    b = st.stage_bytes(MIXTRAL, 4096, st.MoEOptions(), tp=1, cp=1, pp=2, ep=8, etp=1, dp=8, mbs=1,
                       num_microbatches=4, stage=np.array([0, 1]), layers_per_stage=(12, 20))
    embedding = 4096 * 32000
    dense_layer = 4096 * 10240 + 2 * 4096 + 8 * 4096  # attention (GQA) + router + two norms
    assert b.weights_gradients_optimizer[0] == pytest.approx((12 * dense_layer + embedding) * (2 + 4 + 12 / 8))
    assert b.weights_gradients_optimizer[1] == pytest.approx((20 * dense_layer + embedding + 4096) * (2 + 4 + 12 / 8))
    expert = 3 * 4096 * 14336 * (2 + 4 + 12 / 1)  # one expert per GPU; EDP = 8 / 8 = 1
    assert b.expert_states[0] == pytest.approx(12 * expert) and b.expert_states[1] == pytest.approx(20 * expert)
    layer = mm.moe_layer_activation_bytes(MIXTRAL, 4096, 1, 1, 1, 8, 1)
    assert b.activations[0] == pytest.approx(2 * (12 * layer + 8 * 4096 * 4096))
    assert b.activations[1] == pytest.approx(20 * layer + 4 * 4096 * 4096 + 4 * 4096 * 32000)


def test_a_given_split_places_deepseeks_dense_layers_where_they_fall():
    # the first three layers are dense: two on stage 0, the third on stage 1
    split = (2, 3) + (4,) * 13 + (4,)
    b = st.stage_bytes(DSV3, 4096, st.MoEOptions(), tp=1, cp=1, pp=16, ep=64, etp=1, dp=64, mbs=1,
                       num_microbatches=128, stage=np.arange(16), layers_per_stage=split)
    assert list(b.layers) == list(split) and list(b.dense_layers) == [2, 1] + [0] * 14
    per_layer = b.expert_states[2] / 4
    assert b.expert_states[0] == 0 and b.expert_states[1] == pytest.approx(2 * per_layer)


def test_the_default_split_given_is_the_default():
    workload = Workload(seq_len=4096, global_batch_size=8192)
    layout = dict(tp=1, cp=1, pp=16, ep=64, etp=1, dp=128, mbs=1, recompute="selective", memory_gib=80.0,
                  gpu=get_gpu("h100-80gb"))
    plain = estimate_layout(DSV3, workload, **layout)
    given = estimate_layout(DSV3, workload, **layout, layers_per_stage=st.split_layers(61, 16))
    assert given == plain


def test_a_given_split_moves_the_slowest_stage_by_hand():
    """1F1B's step is m x the slowest stage plus the others' fill and drain (advisor.moe.time): 8 | 8 |
    8 | 8 has the last stage slowest (8 layers + the LM head), 7 | 9 | 9 | 7 a middle one (9 layers),
    so the pipeline grows by (m - 1) (t - head) for one MoE layer's t, the total being the same; the
    DP communication and Adam are the first stage's, which holds 7 layers instead of 8 (without the
    DP overlap, which the largest stage's forward would hide). Adam (38 bytes an element) runs on the
    rank's shard of each group (distributed optimizer) and the step zeroes the whole FP32
    main-gradient buffer on every rank, 4 bytes an element of the stage's parameters
    (``terms.optimizer_time``; megatron-core ``zero_grad_buffer`` -> ``grad_data.zero_()``)."""
    workload = Workload(seq_len=4096, global_batch_size=256)
    exposed = TrainingOptions().with_(overlap_grad_reduce=False, overlap_param_gather=False)
    layout = dict(tp=1, cp=1, pp=4, ep=8, etp=1, dp=16, mbs=1, gpu=get_gpu("h100-80gb"), memory_gib=80.0,
                  options=st.MoEOptions(training=exposed))
    even = estimate_layout(MIXTRAL, workload, **layout)
    uneven = estimate_layout(MIXTRAL, workload, **layout, layers_per_stage=(7, 9, 9, 7))
    rates = terms.Rates.of(get_gpu("h100-80gb"), load_calibration())
    times = mt.layer_times(MIXTRAL, 4096, tp=1, cp=1, ep=8, etp=1, mbs=1, rates=rates)
    moe_f, comm = times.moe, times.comm
    # forward, backward twice its compute (core attention's 2.5 times), the all-to-all both ways
    layer = 3 * (moe_f - comm) + times.core_backward_extra + 2 * comm
    head = sum(terms.lm_head_time(MIXTRAL, 4096.0, 1, MIXTRAL.vocab_size, rates))
    assert 2 * layer > head  # 9 layers outlast 7 and the head
    m = 256 / 16

    def data_parallel(layers):  # stage 0: its layers' attention, router and norms, the embedding; one expert each
        dense = layers * (4096 * 10240 + 2 * 4096 + 8 * 4096) + 4096 * 32000
        expert = layers * 3 * 4096 * 14336
        # DP 16 over two nodes at TP 1: the dense group has 8 GPUs in a node (8 NICs); the expert-data-
        # parallel group (2, ranks EP 8 apart) one
        return (sum(terms.data_parallel_time(dense, 16, 16, rates, ranks_per_node=8))
                + sum(terms.data_parallel_time(expert, 2, 16, rates, ranks_per_node=1))
                + terms.optimizer_time(dense, 16, rates, step_bytes=38.0, zeroed_bytes=4.0)
                + terms.optimizer_time(expert, 2, rates, step_bytes=38.0, zeroed_bytes=4.0))

    expected = (m - 1) * float(layer - head) + float(data_parallel(7) - data_parallel(8))
    assert uneven["step_time_s"] - even["step_time_s"] == pytest.approx(expected, rel=1e-9)


def test_layers_per_stage_on_the_command_line_and_read_back(tmp_path):
    runner = CliRunner()
    result = runner.invoke(cli, ["estimate", *MIXTRAL_64, "--layers-per-stage", "7,9,9,7", "--format", "json"])
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout)
    assert row["layers_per_stage"] == [7, 9, 9, 7] and [s["layers"] for s in row["stages"]] == [7, 9, 9, 7]
    flags = row["megatron_args"]
    assert flags[flags.index("--decoder-first-pipeline-num-layers") + 1] == "7"
    assert flags[flags.index("--decoder-last-pipeline-num-layers") + 1] == "7"
    command = tmp_path / "train.sh"
    command.write_text("torchrun --nproc-per-node 8 --nnodes 8 pretrain_gpt.py " + shlex.join(flags) + "\n")
    read = json.loads(runner.invoke(cli, ["estimate", "--from-command", str(command), "--gpu", "h100-80gb",
                                          "--vocab-size", "32000", "--format", "json"]).stdout)
    for key in ("layers_per_stage", "total_gib", "usage_gib", "step_time_s", "stages", "megatron_args"):
        assert read[key] == row[key], key
    # advisor-launch takes the estimate as it is
    (tmp_path / "estimate.json").write_text(json.dumps(row))
    done = subprocess.run([sys.executable, "-m", "launch", "args", "--from", str(tmp_path / "estimate.json")],
                          capture_output=True, text=True, check=True)
    assert shlex.split(done.stdout) == flags


@pytest.mark.parametrize("split, words", [
    ("8,8", "--layers-per-stage lists 2 stages, but PP is 4"),
    ("8,8,8,9", "--layers-per-stage 8,8,8,9 must be non-negative and sum to 32 layers"),
])
def test_a_bad_moe_split_is_one_line(split, words):
    result = CliRunner().invoke(cli, ["estimate", *MIXTRAL_64, "--layers-per-stage", split])
    assert result.exit_code == 2 and result.output.strip().splitlines() == [f"Error: {words}"], result.output


def test_compare_best_is_the_sweeps_first_row(tmp_path):
    runner = CliRunner()
    common = ["--model", "qwen3-30b-a3b", "--gpus", "16", "--gpu", "h100-80gb", "--seq-len", "4096", "--gbs", "256"]
    best = json.loads(runner.invoke(cli, ["sweep", *common, "--top", "1", "--format", "json"]).stdout)[0]
    result = runner.invoke(cli, ["estimate", *common, "--pp", "2", "--ep", "8", "--compare-best", "--format", "json"])
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout)
    for key in ("tp", "cp", "pp", "ep", "etp", "dp", "mbs", "vpp", "recompute", "usage_gib", "step_time_s", "verdict"):
        assert row["best_sweep_row"][key] == best[key], key
    table = runner.invoke(cli, ["estimate", *common, "--pp", "2", "--ep", "8", "--compare-best"]).stdout
    line = " ".join(table.split())
    assert (f"best sweep row on 16 GPUs: TP {best['tp']}, CP {best['cp']}, PP {best['pp']}, EP {best['ep']}, "
            f"ETP {best['etp']}, DP {best['dp']}") in line
    assert f"(yours takes {row['step_time_s'] / best['step_time_s']:.2f}x as long)" in line
    refused = runner.invoke(cli, ["estimate", *common[:4], "--compare-best"])
    assert refused.exit_code == 2 and "--compare-best needs --gpu NAME or --mem GIB" in refused.output
