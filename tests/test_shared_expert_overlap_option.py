"""--moe-shared-expert-overlap as ``advisor estimate`` and ``sweep``'s own option: one field
(``MoEOptions.shared_expert_overlap``, a row's ``shared_expert_overlap``) that the time, the memory
and the row's Megatron flags read; refused in one line where megatron-core refuses it; a row
carries it, writes the flag, is read back with the same refusals and launched as priced.
Its time by hand: ``tests/test_shared_expert_overlap_time.py``."""

from __future__ import annotations

import json
import shlex

import pytest
from click.testing import CliRunner

from advisor.cli import cli
from advisor.hardware import get_gpu
from advisor.moe import ep_time
from advisor.moe import time as mt
from advisor.moe.spec import PRESETS
from advisor.releases import NEWEST
from advisor.throughput import terms
from advisor.throughput.calibration import load_calibration

DSV3 = PRESETS["deepseek-v3"]
FLAG = "--moe-shared-expert-overlap"
# DeepSeek-V3 on one node of 8 H100: TP 1, PP 1, EP 8, alltoall, s 4096, b 1, GBS 64 (DP 8: 8 microbatches)
ONE_NODE = ["estimate", "--model", "deepseek-v3", "--gpus", "8", "--tp", "1", "--pp", "1", "--ep", "8", "--mbs", "1",
            "--seq-len", "4096", "--gbs", "64", "--gpu", "h100-80gb", "--moe-token-dispatcher-type", "alltoall"]
SWEEP = ["sweep", "--model", "deepseek-v3", "--gpus", "1024", "--gpu", "h100-80gb", "--seq-len", "4096",
         "--gbs", "1024"]


def _h100_rates():
    return terms.Rates.of(get_gpu("h100-80gb"), load_calibration())


def test_the_estimate_saves_the_hand_derived_layers(advisor):
    """PP 1: the step is its 8 microbatches' layers in series, so the overlap saves exactly
    8 microbatches x 58 MoE layers x (forward + backward) hidden, the EP communication left exposed
    as much less; the memory keeps nothing more at TP 1 (no gathered input), fused SwiGLU.
    Each all-to-all (0.94 ms) outlasts its partner GEMM, so a layer hides the shared experts' whole
    forward and backward (twice it): 3 x (FC1 + SwiGLU + FC2), the three at GEMMs' 0.9965 (fitted
    compute_factor) x 0.7106 x 989 = 700.32 TFLOP/s and HBM's 2.68 TB/s: 3 x (0.362219 + 0.171719)
    = 1.601815 ms (``tests/test_shared_expert_overlap_time.py`` by hand)."""
    plain, overlap = advisor.json(*ONE_NODE), advisor.json(*ONE_NODE, FLAG)
    rates = _h100_rates()
    per_layer = sum(ep_time.shared_expert_hidden(mt.layer_times(DSV3, 4096, tp=1, cp=1, ep=8, etp=1, mbs=1,
                                                                rates=rates).shared_pairs))
    gemm = load_calibration().compute_factor * 0.7106 * 989e12
    fc1 = 2 * 4096 * 7168 * (2 * 2048) / gemm + 2 * 3 * 2048 * 4096 / 2.68e12  # [s, h] x [h, 2f] + fused SwiGLU
    fc2 = 2 * 4096 * 2048 * 7168 / gemm  # [s, f] x [f, h]
    assert per_layer == pytest.approx(3 * (fc1 + fc2), rel=1e-12)
    assert per_layer == pytest.approx(1.601815e-3, rel=1e-5)
    assert (DSV3.moe_layers, DSV3.mtp_num_layers, plain["num_microbatches"]) == (58, 0, 8)
    saved = 8 * 58 * per_layer
    assert saved == pytest.approx(0.743242, rel=1e-5)
    assert plain["step_time_s"] - overlap["step_time_s"] == pytest.approx(saved, rel=1e-9)
    assert plain["ep_comm_s"] - overlap["ep_comm_s"] == pytest.approx(saved, rel=1e-9)
    assert plain["total_gib"] == overlap["total_gib"]
    assert (plain["shared_expert_overlap"], overlap["shared_expert_overlap"]) == (False, True)
    assert FLAG not in plain["megatron_args"] and overlap["megatron_args"].count(FLAG) == 1


# --- refused where megatron-core refuses it ----------------------------------------------------

OVERLAP = "--overlap-moe-expert-parallel-comm"
REFUSALS = [
    # transformer_config.py __post_init__: core_v0.15.2 :1476-1477, core_v0.19.0 :2707 (any model)
    ([OVERLAP, "--vpp", "2"], f"{OVERLAP} refuses {FLAG} (megatron-core: 'disable moe_shared_expert_overlap when "
                              "enabling overlap_moe_expert_parallel_comm')"),
    # core_v0.19.0 :1644-1650 (alltoall or flex), core_v0.15.2 :840-845 (alltoall)
    (["--moe-token-dispatcher-type", "allgather"],
     f"{FLAG} needs --moe-token-dispatcher-type alltoall or flex on Megatron-LM core 0.19, got allgather "
     "(megatron-core: 'moe_shared_expert_overlap only works with alltoall or flex token dispatcher')"),
    (["--moe-token-dispatcher-type", "flex", "--megatron-version", "0.15"],
     f"{FLAG} needs --moe-token-dispatcher-type alltoall on Megatron-LM core 0.15, got flex "
     "(megatron-core: 'moe_shared_expert_overlap only works with alltoall token dispatcher')"),
    # core_v0.15.2 :982-989, core_v0.19.0 :1812-1819
    (["--recompute", "selective", "--recompute-modules", "shared_experts"],
     f"{FLAG} refuses --recompute-modules shared_experts (megatron-core: 'shared_experts recompute cannot work with "
     f"{FLAG}.')"),
]


@pytest.mark.parametrize("command", ["estimate", "sweep"])
@pytest.mark.parametrize("extra, message", REFUSALS, ids=["ep-overlap", "allgather", "flex-0.15", "recomputed"])
def test_each_refusal_is_one_line_and_exit_2(advisor, command, extra, message):
    base = ["estimate", "--model", "deepseek-v3", "--gpus", "1024", "--gpu", "h100-80gb", "--ep", "64", "--pp", "16",
            "--seq-len", "4096", "--gbs", "1024"] if command == "estimate" else SWEEP
    assert advisor.error(*base, FLAG, *extra) == f"Error: {message}"


@pytest.mark.parametrize("command", ["estimate", "sweep"])
def test_a_dense_model_refuses_it(advisor, command):
    line = advisor.error(command, "--model", "llama3.1-8b", "--gpus", "8", "--gpu", "h100-80gb", FLAG)
    assert line == f"Error: llama3.1-8b is dense; MoE options need a mixture-of-experts model: {FLAG}"


def test_beside_a_command_it_comes_from_the_command(advisor):
    line = advisor.error("estimate", "--from-command", "-", "--gpus", "8", FLAG)
    assert line == f"Error: {FLAG} comes from the command with --from-command (edit the command instead)"


def test_a_model_without_shared_experts_takes_it_and_changes_nothing(advisor):
    """Mixtral has no shared experts: megatron-core checks the dispatcher only where
    moe_shared_expert_intermediate_size is set (transformer_config.py, both releases) and hands the
    dispatcher shared experts only where there are some (moe_layer.py), so the flag is read and
    does nothing: priced as without it, said on stderr, launched as given."""
    base = ["estimate", "--model", "mixtral-8x7b", "--gpus", "8", "--ep", "8", "--gpu", "h100-80gb",
            "--moe-token-dispatcher-type", "allgather", "--format", "json"]
    plain, result = advisor(*base), advisor(*base, FLAG)
    assert result.stderr.strip() == (f"advisor estimate: {FLAG}: mixtral-8x7b has no shared experts; megatron-core "
                                     "takes the flag and changes nothing (priced as without it)")
    a, b = json.loads(plain.stdout), json.loads(result.stdout)
    assert (a["step_time_s"], a["total_gib"]) == (b["step_time_s"], b["total_gib"])
    assert b["shared_expert_overlap"] and b["megatron_args"].count(FLAG) == 1
    assert [arg for arg in b["megatron_args"] if arg != FLAG] == a["megatron_args"]


def test_the_title_says_overlapped_only_where_there_are_shared_experts(advisor):
    """The estimate's title names what is priced: Mixtral's flag changes nothing (no 'shared experts
    overlapped'), DeepSeek-V3's overlaps its shared experts."""
    mixtral = advisor("estimate", "--model", "mixtral-8x7b", "--gpus", "8", "--ep", "8", "--gpu", "h100-80gb",
                      "--moe-token-dispatcher-type", "allgather", FLAG)
    deepseek = advisor("estimate", "--model", "deepseek-v3", "--gpus", "1024", "--pp", "16", "--ep", "64",
                       "--gpu", "h100-80gb", FLAG)
    assert "dispatcher allgather" in mixtral.stdout and "shared experts overlapped" not in mixtral.stdout
    assert "shared experts overlapped" in deepseek.stdout.split("+")[0]


# --- the row: its flag, read back, launched ------------------------------------------------------


def test_an_estimate_read_back_from_its_own_command_keeps_it(advisor):
    """Round trip: the estimate's megatron_args carry the flag, and the same estimate read back from
    them (--from-command) prices and writes the same."""
    row = advisor.json(*ONE_NODE, FLAG)
    vocab = NEWEST.null_tokenizer_vocab_flag(DSV3.vocab_size)
    command = shlex.join(row["megatron_args"] + ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(vocab)])
    done = CliRunner().invoke(cli, ["estimate", "--from-command", "-", "--gpus", "8", "--gpu", "h100-80gb",
                                    "--format", "json"], input=command)
    assert done.exit_code == 0, done.output
    read = json.loads(done.stdout)
    assert read["shared_expert_overlap"] is True and read["unpriced"] == []
    assert (read["step_time_s"], read["total_gib"]) == (row["step_time_s"], row["total_gib"])
    assert read["megatron_args"] == row["megatron_args"]


@pytest.fixture(scope="module")
def overlap_rows(tmp_path_factory):
    from conftest import Invoker

    path = tmp_path_factory.mktemp("shared") / "rows.json"
    Invoker()(*SWEEP, FLAG, "--top", "2", "--format", "json", "-o", path)
    rows = json.loads(path.read_text())
    assert all(row["shared_expert_overlap"] and FLAG in row["megatron_args"] for row in rows)
    return rows


def test_advisor_launch_writes_a_rows_flag(tmp_path, overlap_rows):
    from launch_support import launcher, write_json

    path = write_json(tmp_path / "rows.json", overlap_rows)
    for rank in (1, 2):
        done = launcher()("args", "--from", path, "--rank", str(rank))
        assert shlex.split(done.stdout) == overlap_rows[rank - 1]["megatron_args"]


SAVED_REFUSALS = [  # (a row with the overlap edited so, the one line, after the file and row)
    ({"dispatcher": "allgather"}, REFUSALS[1][1]),
    ({"recompute": "selective", "recompute_modules": ["shared_experts"]}, REFUSALS[3][1]),
    ({"a2a_overlap": True}, REFUSALS[0][1]),
    ({"shared_expert_overlap": "yes"}, "'a2a_overlap', 'delay_wgrad', 'distributed_optimizer', 'permute_fusion', "
                                       "'router_fusion' and 'shared_expert_overlap' must be true or false, "
                                       "'gradient_bytes' 2 or 4"),
]


@pytest.mark.parametrize("edit, message", SAVED_REFUSALS, ids=["allgather", "recomputed", "ep-overlap", "not-bool"])
def test_a_saved_row_is_refused_alike_by_the_report_and_advisor_launch(advisor, tmp_path, overlap_rows, edit,
                                                                        message):
    from launch_support import launcher, write_json

    path = write_json(tmp_path / "row.json", {**overlap_rows[0], **edit})
    if "shared_expert_overlap" in edit:  # the report's field check names it first, as it does every field
        assert advisor.error("report", "--from", path, "-o", tmp_path / "r.html").endswith(
            "'shared_expert_overlap' must be true, false or null, got 'yes'")
    else:
        assert advisor.error("report", "--from", path, "-o", tmp_path / "r.html").endswith(f": {message}")
    assert launcher().error("args", "--from", path).endswith(f": {message}")
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("field, args, difference", [
    (True, lambda args: [arg for arg in args if arg != FLAG], f"lack {FLAG}, which its fields give"),
    (False, lambda args: args, f"give {FLAG}, its fields do not"),
])
def test_a_rows_flag_is_held_to_its_field(advisor, tmp_path, overlap_rows, field, args, difference):
    from launch_support import launcher, write_json

    row = overlap_rows[0]
    path = write_json(tmp_path / "row.json", {**row, "shared_expert_overlap": field,
                                              "megatron_args": args(row["megatron_args"])})
    line = launcher().error("args", "--from", path)
    assert line.endswith(f"inconsistent sweep row: its megatron_args {difference}"), line
    assert advisor.error("report", "--from", path, "-o", tmp_path / "r.html").endswith(
        f"inconsistent sweep row: its megatron_args {difference}")


def test_a_saved_rows_overlap_is_priced_by_the_report(advisor):
    """The report re-prices a row from its fields (advisor.report.moe_detail): an estimate with the
    overlap at TP 2 keeps the gathered FC1 input, 2 s h = 58,720,256 bytes per MoE layer and
    microbatch in flight (memory.shared_expert_gathered_input_bytes), as the estimate priced it."""
    from advisor.report.moe_detail import moe_stages

    row = advisor.json("estimate", "--model", "deepseek-v3", "--gpus", "1024", "--tp", "2", "--pp", "16", "--ep", "64",
                       "--etp", "1", "--mbs", "1", "--seq-len", "4096", "--gbs", "8192", "--gpu", "h100-80gb", FLAG,
                       "--memory-model", "paper")  # the buckets as priced (the calibrated model scales them)
    stages, _, _, _ = moe_stages(row)
    without, _, _, _ = moe_stages({**row, "shared_expert_overlap": False})
    assert [stage["layer activations"] for stage in stages] == pytest.approx(
        [stage["layer_activations_gib"] for stage in row["stages"]], rel=1e-12)
    moe_layers = [(st["layers"] - st["dense_layers"]) * st["in_flight_microbatches"] for st in row["stages"]]
    gap = [(a["layer activations"] - b["layer activations"]) * 2**30 for a, b in zip(stages, without)]
    assert 2 * 4096 * 7168 == 58_720_256
    assert gap == pytest.approx([n * 58_720_256 for n in moe_layers], rel=1e-9)
    assert moe_layers[0] == 0 and moe_layers[1] > 0


def test_a_core_019_flex_row_with_it_is_refused_on_core_015_in_one_line(advisor, tmp_path):
    """A row priced on core 0.19 with the flex dispatcher and the overlap (megatron-core 0.19 takes
    both: transformer_config.py :1644-1650) carries the flag itself; launched on core 0.15, whose
    __post_init__ takes the overlap with alltoall alone (:840-845), advisor-launch refuses it in one
    line, exit 2, saying the row gives the flag (launch.arguments.check_moe_refusals)."""
    from launch_support import launcher

    path = tmp_path / "flex.json"
    advisor("estimate", "--model", "deepseek-v3", "--gpus", "256", "--gpu", "h100-80gb", "--tp", "1", "--pp", "8",
            "--ep", "32", "--moe-token-dispatcher-type", "flex", FLAG, "--format", "json", "-o", path)
    assert FLAG in json.loads(path.read_text())["megatron_args"]
    line = launcher().error("args", "--from", path, "--megatron-version", "0.15", "--", "--lr", "1e-4")
    assert line == (f"Error: {REFUSALS[2][1]}: the estimate ({path}) gives it; Megatron-LM would refuse the command on "
                    "every rank at start-up"), line
    assert launcher()("args", "--from", path, "--megatron-version", "0.19", "--", "--lr", "1e-4").stdout
