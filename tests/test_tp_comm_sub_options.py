"""--tp-comm-overlap's sub-options (Megatron-LM's --disable-tp-comm-overlap-ag/-rs,
--tp-comm-overlap-rs-dgrad, --disable-tp-comm-bulk-dgrad/-wgrad) priced, written and read back.

What each does (Megatron-LM core_v0.15.2/core_v0.19.0 ``extensions/transformer_engine.py`` hands
them to Transformer Engine 2.9's layers as ``ub_overlap_ag``, ``ub_overlap_rs``,
``ub_overlap_rs_dgrad``, ``ub_bulk_dgrad``, ``ub_bulk_wgrad``; ``linear.py`` and
``layernorm_linear.py``): a collective whose overlap is off runs in NCCL, and is priced as without
--tp-comm-overlap (``terms.tensor_parallel_time``: the forward gathers and scatters, the gradient
gathers and the dgrad reduce-scatters exposed whole; the input re-gathers behind dgrad hidden), and
the buffer's SM margin no longer slows its GEMM.

Hand numbers: Llama 3.1 8B at TP 8 on an H100, one 8192-token microbatch, as in
tests/test_tp_comm_overlap.py (its docstring derives them): GEMMs QKV 0.08739 ms, projection
0.06286, FC1 0.35724, FC2 0.18552; one ring collective 7/8 x 67,108,864 B / 448.29 GB/s + 7 x 20 us =
0.27099 ms; the 16-SM margin 132/116. With Megatron's defaults: forward 0.52451 ms exposed (QKV ring
0.19452, projection pipeline 0.21734, FC1 hidden, FC2 pipeline 0.11266), backward 0.49618 (projection
dgrad ring 0.21598, FC2 dgrad ring 0.10866, QKV wgrad bulk 0.17154, FC1 wgrad hidden); GEMMs slowed
0.03426 ms forward (projection, FC2), 0.12266 backward (QKV and FC1 dgrad and wgrad, 0.06133 each pair).
"""

import pytest
from test_tp_comm_overlap import H100, hand_rates

from advisor.errors import AdvisorError
from advisor.models import PRESETS
from advisor.options import TrainingOptions, parse_training_args, training_args
from advisor.throughput import TimeModel

ONE = 0.27099e-3
"""One ring collective of the layer's BF16 activation at TP 8: 7/8 x 2 x 8192 x 4096 B / (450e9 x 0.9962 =
448.29e9 B/s) + 7 x 20 us."""


def layer(**sub):
    """(forward exposed, backward exposed, GEMM slowdown) of one 8B layer at TP 8 with these sub-options,
    the slowdown as the overlapped layer's compute less the plain one's."""
    spec = PRESETS["llama3.1-8b"]
    plain = TimeModel(spec, H100, 8192, 64)
    options = TrainingOptions().with_(tp_comm_overlap=True, **sub).time_options()
    parts, plain_parts = TimeModel(spec, H100, 8192, 64, options=options).layer_parts(8, 1, 1), plain.layer_parts(8, 1, 1)
    slowed = float(parts.compute_f + parts.compute_b - plain_parts.compute_f - plain_parts.compute_b)
    return float(parts.tp_f), float(parts.tp_b), slowed


def gemms():
    flops, latency, _, _ = hand_rates()
    return [2 * 8192 * k * n / flops + latency for k, n in ((4096, 768), (512, 4096), (4096, 3584), (1792, 4096))]


def test_the_hand_collective():
    _, _, bandwidth, hop = hand_rates()
    assert 7 / 8 * 2 * 8192 * 4096 / bandwidth + 7 * hop == pytest.approx(ONE, rel=1e-4)


def test_without_the_all_gather_overlap_the_gathers_run_exposed():
    """--disable-tp-comm-overlap-ag: QKV's and FC1's input gathers (forward) and the projection's and
    FC2's gradient gathers (backward) each 0.27099 ms exposed. Forward 2 x 0.27099 + 0.21734 + 0.11266
    = 0.87197 ms; backward 2 x 0.27099 + 0.17154 = 0.71351 ms. Their ring-exchange buffers set no SM
    margin: the slowdown stays 0.03426 + 0.12266 ms."""
    forward, backward, slowed = layer(tp_comm_overlap_ag=False)
    assert (forward, backward) == pytest.approx((0.87197e-3, 0.71351e-3), rel=1e-4)
    assert slowed == pytest.approx(0.03426e-3 + 0.12266e-3, rel=1e-3)


def test_without_the_reduce_scatter_overlap_the_forward_scatters_run_exposed():
    """--disable-tp-comm-overlap-rs: the projection's and FC2's forward reduce-scatters 0.27099 ms each,
    exposed, and their GEMMs keep every SM. Forward 0.19452 + 2 x 0.27099 = 0.73649 ms; backward
    0.49618 as by default; the slowdown is the backward's 0.12266 ms alone."""
    forward, backward, slowed = layer(tp_comm_overlap_rs=False)
    assert (forward, backward) == pytest.approx((0.73649e-3, 0.49618e-3), rel=1e-4)
    assert slowed == pytest.approx(0.12266e-3, rel=1e-3)


def test_without_the_bulk_dgrad_overlap_dgrad_keeps_its_sms():
    """--disable-tp-comm-bulk-dgrad: the input re-gathers move to NCCL, still behind dgrad (hidden, as
    without the overlap); the exposed times stay the default's, and dgrad loses its 16-SM margin:
    16/116 x (0.08739 + 0.35724) = 0.06133 ms of the backward's slowdown goes."""
    qkv, _, fc1, _ = gemms()
    forward, backward, slowed = layer(tp_comm_bulk_dgrad=False)
    assert (forward, backward) == pytest.approx((0.52451e-3, 0.49618e-3), rel=1e-4)
    assert slowed == pytest.approx(0.03426e-3 + 0.12266e-3 - 0.06133e-3, rel=1e-3)
    assert slowed == pytest.approx(16 / 116 * (qkv + fc1) + 0.03426e-3, rel=1e-3)


def test_without_the_bulk_wgrad_overlap_the_dgrad_scatters_run_exposed():
    """--disable-tp-comm-bulk-wgrad: QKV's and FC1's dgrad reduce-scatters 0.27099 ms each, exposed;
    backward 0.21598 + 0.10866 + 2 x 0.27099 = 0.86661 ms; wgrad keeps its SMs (slowdown 0.03426 +
    0.06133 ms)."""
    forward, backward, slowed = layer(tp_comm_bulk_wgrad=False)
    assert (forward, backward) == pytest.approx((0.52451e-3, 0.86661e-3), rel=1e-4)
    assert slowed == pytest.approx(0.03426e-3 + 0.06133e-3, rel=1e-3)


def test_the_dgrad_reduce_scatter_pipelined_beside_dgrad():
    """--tp-comm-overlap-rs-dgrad: TE runs no bulk overlap; QKV's and FC1's dgrad reduce-scatter is
    pipelined beside dgrad on qkv_dgrad/fc1_dgrad (TE's default method there, bulk, makes the
    non-ring object: 4 splits, 16 SMs). QKV: max(0.27099/4, 0.27099 - 3/4 x 0.08739 x 132/116) =
    0.19640 ms; FC1: max(0.06775, 0.27099 - 3/4 x 0.35724 x 132/116 < 0) = 0.06775 ms. Backward
    0.21598 + 0.10866 + 0.19640 + 0.06775 = 0.58879 ms; the slowdown: dgrad's margins only, 0.06133 ms
    beside the forward's 0.03426."""
    forward, backward, slowed = layer(tp_comm_overlap_rs_dgrad=True)
    assert (forward, backward) == pytest.approx((0.52451e-3, 0.58879e-3), rel=1e-4)
    assert slowed == pytest.approx(0.03426e-3 + 0.06133e-3, rel=1e-3)


def test_the_step_adds_what_the_layers_expose():
    """32 layers, one microbatch each of 8 on 8 GPUs (DP 1): the step's TP time is 8 x 32 times the
    layer's, with and without the all-gather overlap."""
    spec = PRESETS["llama3.1-8b"]
    for sub in ({}, {"tp_comm_overlap_ag": False}):
        options = TrainingOptions().with_(tp_comm_overlap=True, **sub).time_options()
        step = TimeModel(spec, H100, 8192, 8, options=options).step(8, 1, 1, 1, 1)
        forward, backward, _ = layer(**sub)
        assert float(step.tp_comm_s) == pytest.approx(8 * 32 * (forward + backward), rel=1e-9)


SUB_FLAGS = [
    ({"tp_comm_overlap_ag": False}, ["--disable-tp-comm-overlap-ag"]),
    ({"tp_comm_overlap_rs": False}, ["--disable-tp-comm-overlap-rs"]),
    ({"tp_comm_overlap_rs_dgrad": True}, ["--tp-comm-overlap-rs-dgrad"]),
    ({"tp_comm_bulk_dgrad": False}, ["--disable-tp-comm-bulk-dgrad"]),
    ({"tp_comm_bulk_wgrad": False}, ["--disable-tp-comm-bulk-wgrad"]),
    ({"tp_comm_overlap_ag": False, "tp_comm_overlap_rs": False, "tp_comm_bulk_dgrad": False},
     ["--disable-tp-comm-overlap-ag", "--disable-tp-comm-overlap-rs", "--disable-tp-comm-bulk-dgrad"]),
]


@pytest.mark.parametrize("sub, flags", SUB_FLAGS)
def test_written_in_megatrons_words_and_read_back(sub, flags):
    options = TrainingOptions().with_(tp_comm_overlap=True, **sub)
    args = training_args(options, tp=8)
    assert args[args.index("--tp-comm-overlap") + 1:args.index("--tp-comm-overlap") + 1 + len(flags)] == flags
    assert parse_training_args(["--tensor-model-parallel-size", "8", *args]) == (options, [])


def test_megatron_defaults_write_nothing_more():
    assert [a for a in training_args(TrainingOptions().with_(tp_comm_overlap=True), tp=8) if "tp-comm" in a] \
        == ["--tp-comm-overlap"]


def test_core_0_19_spellings_read_as_the_same_options():
    # core_v0.19.0's generated parser also spells each disabling flag --no-... (argument_utils.py)
    base = ["--tensor-model-parallel-size", "8", "--sequence-parallel", "--tp-comm-overlap"]
    assert parse_training_args([*base, "--no-tp-comm-overlap-ag", "--no-tp-comm-bulk-wgrad"]) \
        == parse_training_args([*base, "--disable-tp-comm-overlap-ag", "--disable-tp-comm-bulk-wgrad"])


def test_what_megatron_ignores_is_named_not_priced():
    base = ["--tensor-model-parallel-size", "8", "--sequence-parallel"]
    options, unpriced = parse_training_args([*base, "--disable-tp-comm-bulk-dgrad"])
    assert options == parse_training_args(base)[0]
    assert unpriced == ["--disable-tp-comm-bulk-dgrad without --tp-comm-overlap (Megatron ignores it; priced without)"]
    # Transformer Engine runs neither bulk overlap with the dgrad reduce-scatter overlap
    options, unpriced = parse_training_args([*base, "--tp-comm-overlap", "--tp-comm-overlap-rs-dgrad",
                                             "--disable-tp-comm-bulk-wgrad"])
    assert options.tensor_parallel.tp_comm_bulk_wgrad and options.tensor_parallel.tp_comm_overlap_rs_dgrad
    assert unpriced[0].startswith("--disable-tp-comm-bulk-wgrad with --tp-comm-overlap-rs-dgrad")
    # the split flags reach Transformer Engine only before 1.5: no effect with TE 2.9
    _, unpriced = parse_training_args([*base, "--tp-comm-overlap", "--disable-tp-comm-split-ag"])
    assert unpriced == ["--disable-tp-comm-split-ag (Megatron ignores it: it passes Transformer Engine >= 1.5 "
                        "tp_comm_overlap_ag instead; priced without)"]


def test_refused_as_megatron_or_transformer_engine_would():
    with pytest.raises(AdvisorError, match="--disable-tp-comm-overlap-rs needs --tp-comm-overlap"):
        TrainingOptions().with_(tp_comm_overlap_rs=False)
    # rs_dgrad reduces into qkv_dgrad, FP8 by TE's default: only delayed scaling's GEMM writes FP8 there
    with pytest.raises(AdvisorError, match="'Invalid type'"):
        TrainingOptions().with_(tp_comm_overlap=True, tp_comm_overlap_rs_dgrad=True, fp8_format="hybrid",
                                fp8_recipe="tensorwise")
    TrainingOptions().with_(tp_comm_overlap=True, tp_comm_overlap_rs_dgrad=True, fp8_format="hybrid")  # delayed


def test_the_cli_prices_emits_and_reads_back(advisor, tmp_path):
    base = ["estimate", "--gpu", "h100-80gb", "--gpus", "8", "--tp", "8", "--mbs", "1", "--gbs", "8"]
    row = advisor.json(*base, "--tp-comm-overlap", "--disable-tp-comm-bulk-wgrad")
    default = advisor.json(*base, "--tp-comm-overlap")
    assert row["options"] == {"tp_comm_overlap": True, "tp_comm_bulk_wgrad": False}
    assert "--disable-tp-comm-bulk-wgrad" in row["megatron_args"]
    # 32 layers x 8 microbatches x the 0.37 ms the exposed dgrad reduce-scatters add, less wgrad's margin
    assert row["step_time_s"] - default["step_time_s"] == pytest.approx(
        8 * 32 * (0.86661e-3 - 0.49618e-3 - 0.06133e-3), rel=1e-3)
    command = tmp_path / "command.txt"
    command.write_text(" ".join(row["megatron_args"]))
    read = advisor.json("estimate", "--gpu", "h100-80gb", "--gpus", "8", "--vocab-size", "128256",
                        "--from-command", command)
    assert read["options"] == row["options"] and read["unpriced"] == []
    assert read["step_time_s"] == row["step_time_s"]


@pytest.mark.parametrize("flags, says", [
    (["--disable-tp-comm-overlap-rs"], "--disable-tp-comm-overlap-rs needs --tp-comm-overlap"),
    (["--tp-comm-overlap", "--tp-comm-overlap-rs-dgrad", "--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"],
     "'Invalid type'"),
])
def test_the_cli_refuses_in_one_line_with_exit_status_2(advisor, flags, says):
    result = advisor("estimate", "--gpu", "h100-80gb", "--gpus", "8", "--tp", "8", *flags, expect=2)
    assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1, result.stderr
    assert says in result.stderr and result.stdout == ""
