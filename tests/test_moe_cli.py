"""advisor sweep / estimate / advisor-launch with mixture-of-experts models: bad input is one
line and exit 2; rows carry ep and etp (1 for dense); the launcher rebuilds an MoE row's flags."""

import json
import shlex
import subprocess
import sys

import pytest
from click.testing import CliRunner
from table_text import read_table

from advisor.cli import cli
from advisor.releases import NEWEST

MOE_ROW = ["sweep", "--model", "qwen3-30b-a3b", "--gpus", "16", "--gpu", "h100-80gb", "--seq-len", "4096",
           "--gbs", "256", "--format", "json"]


def _one_line_error(result, *words):
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and all(word in lines[0] for word in words), result.output


def test_bad_expert_layouts_are_one_line():
    runner = CliRunner()
    _one_line_error(runner.invoke(cli, ["estimate", "--model", "mixtral-8x7b", "--gpus", "64", "--ep", "3"]),
                    "EP 3", "8 experts")
    _one_line_error(runner.invoke(cli, ["estimate", "--model", "mixtral-8x7b", "--gpus", "8", "--ep", "8",
                                        "--etp", "2"]), "EP x ETP")
    _one_line_error(runner.invoke(cli, ["sweep", "--gpus", "8", "--mem", "80", "--ep", "2"]), "--ep", "dense")
    # an output MoE rows lack is not an option the model prices: it says so, and what to do
    _one_line_error(runner.invoke(cli, ["sweep", "--model", "mixtral-8x7b", "--gpus", "64", "--mem", "80", "--rank-by",
                                        "throughput"]), "--rank-by throughput needs --gpu NAME")
    _one_line_error(runner.invoke(cli, ["sweep", "--model", "mixtral-8x7b", "--gpus", "8", "--mem", "80",
                                        "--moe-routing", "capacity"]), "--moe-expert-capacity-factor")
    _one_line_error(runner.invoke(cli, ["sweep", "--model", "mixtral-8x7b", "--gpus", "8", "--mem", "80",
                                        "--no-flash-attn", "--profile", "."]), "--no-flash-attn", "--profile")
    _one_line_error(runner.invoke(cli, ["sweep", "--model", "mixtral-8x7b", "--gpus", "8", "--mem", "80",
                                        "--ep", "4", "--etp", "4"]), "EP x ETP = 16 must divide", "8")
    _one_line_error(runner.invoke(cli, ["sweep", "--model", "mixtral-8x7b", "--gpus", "8", "--mem", "80",
                                        "--ep", "4", "--vpp", "2"]), "no layout", "EP 4", "VPP 2")


def test_sweep_choices_apply_to_moe_rows():
    rows = json.loads(CliRunner().invoke(cli, [*MOE_ROW, "--recompute", "full", "--split", "even", "--ep", "4",
                                               "--grad-dtype", "bf16", "--top", "5"]).stdout)
    assert rows and all(r["recompute"] == "full" and 48 % r["pp"] == 0 and r["ep"] == 4 for r in rows)
    assert all("--grad-reduce-in-bf16" in r["megatron_args"] for r in rows)
    capped = json.loads(CliRunner().invoke(cli, [*MOE_ROW, "--moe-routing", "capacity", "--moe-expert-capacity-factor",
                                                 "1.25", "--top", "1"]).stdout)[0]
    modules = json.loads(CliRunner().invoke(cli, [*MOE_ROW, "--recompute", "selective", "--recompute-modules", "moe",
                                                  "--recompute-modules", "shared_experts", "--top", "1"]).stdout)[0]
    assert modules["megatron_args"][-3:] == ["--recompute-modules", "moe", "shared_experts"]
    flags = capped["megatron_args"]
    assert flags[flags.index("--moe-expert-capacity-factor") + 1] == "1.25"
    assert "--moe-pad-expert-input-to-capacity" in flags and capped["pad_to_capacity"] is True


@pytest.mark.parametrize("rank_by", ["memory", "paper"])
def test_moe_rows_rank_by_memory_or_the_papers_rule(advisor, rank_by):
    """--rank-by orders MoE rows as it orders dense ones (``advisor.ranking.order``): by memory the
    least used first, by the paper's rule no recomputation, then the fewest model-parallel GPUs
    (TP x CP x PP), then the largest MBS, then the smallest TP."""
    args = ["sweep", "--model", "mixtral-8x7b", "--gpus", 64, "--gpu", "h100-80gb", "--rank-by", rank_by]
    rows = advisor.json(*args)
    assert [row["rank"] for row in rows] == list(range(1, len(rows) + 1)) and len(rows) > 100
    if rank_by == "memory":
        assert all(a["usage_gib"] <= b["usage_gib"] for a, b in zip(rows, rows[1:]))
    else:
        assert all(r["verdict"] in ("fits", "likely fits") for r in rows)
        fits = [r for r in rows if r["verdict"] == "fits"]
        assert fits == rows[:len(fits)]
        keys = [(r["recompute"] != "none", r["tp"] * r["cp"] * r["pp"], -r["mbs"], r["tp"]) for r in fits]
        assert keys == sorted(keys)
    title = advisor(*args, "--top", 1).stdout.splitlines()[0:2]
    assert {"memory": "ranked by memory headroom", "paper": "ranked by the paper's rule"}[rank_by] in " ".join(title)


def test_capacity_routing_is_launched_as_priced():
    """--moe-routing capacity is priced padded and emits --moe-pad-expert-input-to-capacity; with
    --no-moe-pad-expert-input-to-capacity it is priced unpadded (min(f, x) of the balanced copies,
    ``memory.capacity_share``) and emits the factor alone; the flex dispatcher refuses the pad."""
    layout = ["estimate", "--model", "mixtral-8x7b", "--gpus", "64", "--gpu", "h100-80gb", "--pp", "4", "--ep", "8",
              "--seq-len", "4096", "--gbs", "256", "--format", "json"]

    def estimate(*extra):
        result = CliRunner().invoke(cli, [*layout, *extra])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    capacity = ["--moe-routing", "capacity", "--moe-expert-capacity-factor", "1.5"]
    balanced, padded = estimate(), estimate(*capacity)
    unpadded = estimate(*capacity, "--no-moe-pad-expert-input-to-capacity")
    assert "--moe-pad-expert-input-to-capacity" in padded["megatron_args"]
    assert "--moe-pad-expert-input-to-capacity" not in unpadded["megatron_args"]
    assert "--moe-expert-capacity-factor" in unpadded["megatron_args"] and unpadded["pad_to_capacity"] is False
    # unpadded at 1.5 every balanced copy fits: balanced's memory and time (both wait on the host
    # for the counts, which only the padded alltoall dispatcher knows in advance), but for the
    # routing map each of the stage's 8 MoE layers' dispatchers holds, which is the capacity mask the
    # router's product saves (transient.a2a_routing_held_bytes): 8 x N x E bool less transient, and
    # kept instead (memory.capacity_mask_bytes) by each of the 8 layers for each of the 4
    # microbatches in flight on stage 0 of PP 4 (1F1B)
    held_map = 8 * 4096 * 8 / 2**30
    kept_mask = 8 * 4 * 4096 * 8 / 2**30
    assert unpadded["activations_gib"] == pytest.approx(balanced["activations_gib"] - held_map + kept_mask, abs=1e-12)
    assert balanced["activations_gib"] < padded["activations_gib"]
    assert unpadded["step_time_s"] == balanced["step_time_s"] < padded["step_time_s"]
    _one_line_error(CliRunner().invoke(cli, [*layout, *capacity, "--moe-token-dispatcher-type", "flex"]),
                    "flex dispatcher's padding to capacity is not priced", "--no-moe-pad-expert-input-to-capacity")
    flex = estimate(*capacity, "--moe-token-dispatcher-type", "flex", "--no-moe-pad-expert-input-to-capacity")
    assert "--moe-pad-expert-input-to-capacity" not in flex["megatron_args"]
    _one_line_error(CliRunner().invoke(cli, [*layout, "--moe-pad-expert-input-to-capacity"]),
                    "--moe-pad-expert-input-to-capacity needs --moe-routing capacity")
    # the busiest rank x times its share (--moe-imbalance x): unpadded, capped at the factor, so at
    # x = 1.25 the copies of balanced routing at 1.25 and at x = 2 those of 1.5; padded, every expert
    # runs its capacity whatever x, so x is refused
    skewed = estimate(*capacity, "--no-moe-pad-expert-input-to-capacity", "--moe-imbalance", "1.25")
    capped = estimate(*capacity, "--no-moe-pad-expert-input-to-capacity", "--moe-imbalance", "2")
    assert skewed["step_time_s"] == estimate("--moe-imbalance", "1.25")["step_time_s"] > unpadded["step_time_s"]
    assert capped["step_time_s"] == estimate("--moe-imbalance", "1.5")["step_time_s"]
    assert skewed["activations_gib"] == pytest.approx(estimate("--moe-imbalance", "1.25")["activations_gib"]
                                                      - held_map + kept_mask, abs=1e-12)
    _one_line_error(CliRunner().invoke(cli, [*layout, *capacity, "--moe-imbalance", "1.5"]),
                    "--moe-imbalance 1.5 does not change capacity routing padded to capacity")


def test_dense_rows_and_estimates_carry_ep_and_etp_one():
    rows = json.loads(CliRunner().invoke(cli, ["sweep", "--gpus", "8", "--mem", "80", "--top", "2",
                                               "--format", "json"]).stdout)
    assert all(row["ep"] == 1 and row["etp"] == 1 for row in rows)
    one = json.loads(CliRunner().invoke(cli, ["estimate", "--gpus", "8", "--tp", "2", "--format", "json"]).stdout)
    assert (one["ep"], one["etp"]) == (1, 1)


def test_moe_estimate_json_matches_its_sweep_row():
    row = json.loads(CliRunner().invoke(cli, [*MOE_ROW, "--top", "1", "--moe-token-dispatcher-type",
                                              "allgather"]).stdout)[0]
    args = ["estimate", "--model", "qwen3-30b-a3b", "--gpus", "16", "--gpu", "h100-80gb", "--seq-len", "4096",
            "--gbs", "256", "--format", "json", "--moe-token-dispatcher-type", "allgather",
            *(f"--{k}={row[k]}" for k in ("tp", "cp", "pp", "vpp", "ep", "etp", "mbs")), "--recompute", row["recompute"]]
    one = json.loads(CliRunner().invoke(cli, args).stdout)
    assert one["total_gib"] == row["total_gib"] and one["step_time_s"] == row["step_time_s"]
    assert len(one["stages"]) == row["pp"] and one["megatron_args"] == row["megatron_args"]
    assert "--moe-token-dispatcher-type" in one["megatron_args"]
    # microbatches per pipeline as a dense row states them: GBS 256 / (MBS x DP), DP = 16 / (TP x CP x PP)
    dp = 16 // (row["tp"] * row["cp"] * row["pp"])
    assert row["dp"] == dp and row["num_microbatches"] == one["num_microbatches"] == 256 // (row["mbs"] * dp)


def test_advisor_launch_rebuilds_an_moe_rows_flags(tmp_path):
    result = CliRunner().invoke(cli, [*MOE_ROW, "--top", "3", "-o", str(tmp_path / "rows.json")])
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "rows.json").read_text())
    for rank in (1, 3):
        done = subprocess.run([sys.executable, "-m", "launch", "args", "--from", str(tmp_path / "rows.json"),
                               "--rank", str(rank)], capture_output=True, text=True, check=True)
        assert shlex.split(done.stdout) == rows[rank - 1]["megatron_args"]


def test_the_ep_all_to_all_overlap_is_refused_where_megatron_refuses_it():
    runner = CliRunner()
    base = ["estimate", "--model", "qwen3-30b-a3b", "--gpus", "16", "--gpu", "h100-80gb", "--seq-len", "4096",
            "--gbs", "256"]
    _one_line_error(runner.invoke(cli, [*base, "--ep", "8", "--delay-wgrad-compute"]),
                    "--delay-wgrad-compute", "--overlap-moe-expert-parallel-comm")
    _one_line_error(runner.invoke(cli, [*base, "--ep", "8", "--overlap-moe-expert-parallel-comm",
                                        "--moe-token-dispatcher-type", "allgather"]), "alltoall or flex")
    _one_line_error(runner.invoke(cli, [*base, "--ep", "1", "--overlap-moe-expert-parallel-comm"]), "EP > 1")
    _one_line_error(runner.invoke(cli, [*base, "--ep", "8", "--pp", "2", "--overlap-moe-expert-parallel-comm"]),
                    "--vpp")
    _one_line_error(runner.invoke(cli, [*base, "--ep", "8", "--recompute", "full",
                                        "--overlap-moe-expert-parallel-comm"]), "full")
    _one_line_error(runner.invoke(cli, ["sweep", "--gpus", "8", "--mem", "80", "--overlap-moe-expert-parallel-comm"]),
                    "dense")
    _one_line_error(runner.invoke(cli, ["estimate", "--model", "deepseek-v3", "--gpus", "2048", "--gpu", "h100-80gb",
                                        "--ep", "64", "--pp", "16", "--vpp", "2", "--mtp-num-layers", "2",
                                        "--overlap-moe-expert-parallel-comm"]), "at most one MTP layer")


OVERLAP = "--overlap-moe-expert-parallel-comm"
OVERLAP_ESTIMATE = ["estimate", "--model", "qwen3-30b-a3b", "--gpus", "16", "--gpu", "h100-80gb", "--seq-len", "4096",
                    "--gbs", "256", "--ep", "8"]
OVERLAP_RULES = [  # (megatron-core's rule, the flags breaking it, a saved overlap row broken so, the one line of both)
    ("delay alone", ["--delay-wgrad-compute"], lambda row: {"a2a_overlap": False, "delay_wgrad": True},
     f"--delay-wgrad-compute needs {OVERLAP} (megatron-core refuses it alone)"),
    ("allgather", [OVERLAP, "--moe-token-dispatcher-type", "allgather"], lambda row: {"dispatcher": "allgather"},
     f"{OVERLAP} needs --moe-token-dispatcher-type alltoall or flex, got allgather"),
    ("moe recomputed", [OVERLAP, "--recompute", "selective", "--recompute-modules", "moe"],
     lambda row: {"recompute": "selective", "recompute_modules": ["moe"]},
     f"{OVERLAP} refuses --recompute-modules moe (megatron-core: 'disable moe in recompute_modules when enabling "
     "overlap_moe_expert_parallel_comm')"),
    ("two MTP layers", [OVERLAP, "--mtp-num-layers", "2"], lambda row: {"model": {**row["model"], "mtp_num_layers": 2}},
     f"{OVERLAP} allows at most one MTP layer, got --mtp-num-layers 2 (megatron-core refuses more)"),
]


@pytest.fixture(scope="module")
def overlap_row(tmp_path_factory):
    """A saved sweep row with the overlap, as the sweep writes it (every rule kept)."""
    from conftest import Invoker

    path = tmp_path_factory.mktemp("overlap") / "rows.json"
    Invoker()(*MOE_ROW, "--ep", "8", OVERLAP, "--recompute", "selective", "--top", "1", "-o", path)
    row = json.loads(path.read_text())[0]
    assert row["a2a_overlap"] and row["recompute"] == "selective"
    return row


@pytest.mark.parametrize("flags, edit, message", [rule[1:] for rule in OVERLAP_RULES],
                         ids=[rule[0] for rule in OVERLAP_RULES])
def test_each_overlap_rule_is_one_message_in_both_paths(advisor, tmp_path, overlap_row, flags, edit, message):
    """One check (advisor.moe.overlap.settings_problem) for the command line and a saved row (the
    report and advisor-launch): the same line, naming Megatron's flags, exit 2 everywhere."""
    from launch_support import launcher, write_json

    assert advisor.error(*OVERLAP_ESTIMATE, *flags) == f"Error: {message}"
    path = write_json(tmp_path / "row.json", {**overlap_row, **edit(overlap_row)})
    assert advisor.error("report", "--from", path, "-o", tmp_path / "r.html").endswith(f": {message}")
    assert launcher().error("args", "--from", path).endswith(f": {message}")
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("extra, message", [
    # core_v0.15.2 transformer_config.py:1463-1465, core_v0.19.0 :2691-2693, whatever the granularity
    # (the reader kept the method only under full recomputation, so the command was priced)
    ("--recompute-method uniform",
     f"{OVERLAP} refuses --recompute-method uniform (megatron-core: 'disable recomputation method when enabling "
     "overlap_moe_expert_parallel_comm')"),
    ("--recompute-num-layers=2",  # core_v0.15.2 :1466-1468, core_v0.19.0 :2694-2696
     f"{OVERLAP} refuses --recompute-num-layers 2 (megatron-core: 'recompute_num_layers must be None when enabling "
     "overlap_moe_expert_parallel_comm')"),
    ("--delay-wgrad-compute --transformer-impl local",  # arguments.py: core_v0.15.2 :1173-1175, v0.19.0 :1822-1824
     "--delay-wgrad-compute needs --transformer-impl transformer_engine, got local (Megatron-LM refuses it)"),
    ("--moe-shared-expert-intermediate-size 4096 --moe-shared-expert-overlap",
     f"{OVERLAP} refuses --moe-shared-expert-overlap (megatron-core: 'disable moe_shared_expert_overlap when "
     "enabling overlap_moe_expert_parallel_comm')"),
])
def test_a_commands_overlap_rules_the_flags_cannot_give_are_one_line(extra, message):
    result = _from_command(f"{OVERLAP} {extra}")
    _one_line_error(result, message)
    assert result.output.strip() == f"Error: {message}"


@pytest.mark.parametrize("extra, options, message", [
    # core_v0.15.2 transformer_config.py:840-845 (alltoall only), core_v0.19.0 :1644-1650 (alltoall or flex)
    ("--moe-token-dispatcher-type flex --moe-enable-deepep", ("--megatron-version", "0.15"),
     "--moe-shared-expert-overlap needs --moe-token-dispatcher-type alltoall on Megatron-LM core 0.15, got flex "
     "(megatron-core: 'moe_shared_expert_overlap only works with alltoall token dispatcher')"),
    ("--moe-token-dispatcher-type allgather", (),
     "--moe-shared-expert-overlap needs --moe-token-dispatcher-type alltoall or flex on Megatron-LM core 0.19, got "
     "allgather (megatron-core: 'moe_shared_expert_overlap only works with alltoall or flex token dispatcher')"),
    # core_v0.15.2 :982-989, core_v0.19.0 :1812-1819
    ("--moe-token-dispatcher-type alltoall --recompute-granularity selective --recompute-modules shared_experts", (),
     "--moe-shared-expert-overlap refuses --recompute-modules shared_experts (megatron-core: 'shared_experts "
     "recompute cannot work with --moe-shared-expert-overlap.')"),
])
def test_a_commands_shared_expert_overlap_megatron_refuses_is_one_line(extra, options, message):
    result = _from_command(f"--moe-shared-expert-intermediate-size 4096 --moe-shared-expert-overlap {extra}", *options)
    _one_line_error(result, message)
    assert result.output.strip() == f"Error: {message}"


def test_a_saved_rows_recomputation_method_is_never_launched_beside_the_overlap(tmp_path, overlap_row):
    """What a command gives and a row cannot: a row's method and layer count are launched under
    full recomputation only (advisor.moe.flags), which the overlap refuses by its layout
    (advisor.moe.space.overlap_problem); an overlap row edited to carry them launches without."""
    from launch_support import launcher, write_json

    row = {**overlap_row, "recompute_method": "block", "recompute_num_layers": 2}
    args = json.loads(launcher()("args", "--from", write_json(tmp_path / "row.json", row), "--format",
                                 "json").stdout)
    assert OVERLAP in args and "--recompute-method" not in args and "--recompute-num-layers" not in args
    assert args == overlap_row["megatron_args"]


def test_the_overlap_is_priced_emitted_and_hides_communication():
    base = ["estimate", "--model", "qwen3-30b-a3b", "--gpus", "16", "--gpu", "h100-80gb", "--seq-len", "4096",
            "--gbs", "256", "--ep", "16", "--format", "json"]
    plain = json.loads(CliRunner().invoke(cli, base).stdout)
    overlap = json.loads(CliRunner().invoke(cli, [*base, "--overlap-moe-expert-parallel-comm",
                                                  "--delay-wgrad-compute"]).stdout)
    assert overlap["a2a_overlap"] and overlap["delay_wgrad"]
    assert "--overlap-moe-expert-parallel-comm" in overlap["megatron_args"]
    assert "--delay-wgrad-compute" in overlap["megatron_args"]
    assert "--overlap-moe-expert-parallel-comm" not in plain["megatron_args"]
    # PP 1: one forward and one backward stay plain; the other microbatches' layers overlap
    assert overlap["ep_comm_s"] < plain["ep_comm_s"] and overlap["step_time_s"] < plain["step_time_s"]
    # the combined step holds one layer of its 48 more, not a second microbatch
    one, two = plain["stages"][0], overlap["stages"][0]
    assert two["in_flight_microbatches"] == one["in_flight_microbatches"] == 1
    assert two["layer_activations_gib"] == pytest.approx(one["layer_activations_gib"] * 49 / 48)
    rows = json.loads(CliRunner().invoke(cli, [*MOE_ROW, "--overlap-moe-expert-parallel-comm", "--all"]).stdout)
    assert rows and all(r["ep"] > 1 and r["recompute"] != "full" and (r["pp"] == 1 or r["vpp"] > 1) for r in rows)



def test_the_flex_dispatchers_sms_are_priced_written_and_launched(tmp_path):
    flex = [*MOE_ROW, "--moe-token-dispatcher-type", "flex", "--overlap-moe-expert-parallel-comm", "--ep", "16",
            "--top", "2"]
    default = json.loads(CliRunner().invoke(cli, flex).stdout)
    result = CliRunner().invoke(cli, [*flex, "--moe-deepep-num-sms", "32", "-o", str(tmp_path / "rows.json")])
    assert result.exit_code == 0, result.output
    given = json.loads((tmp_path / "rows.json").read_text())
    assert [row["dispatcher_sms"] for row in default] == [None, None]
    assert [row["dispatcher_sms"] for row in given] == [32, 32]
    for row in given:  # in the words of the release priced, the newest (advisor.releases, own_spelling)
        args = row["megatron_args"]
        assert row["megatron_version"] == NEWEST.checked and "--moe-deepep-num-sms" not in args
        assert args[args.index("--moe-flex-dispatcher-num-sms") + 1] == "32"
    assert all("--moe-flex-dispatcher-num-sms" not in row["megatron_args"] for row in default)
    # the overlapped compute keeps 100 of 132 SMs instead of 112: the same layout is slower
    same = next(row for row in default if (row["tp"], row["pp"], row["mbs"]) == (given[0]["tp"], given[0]["pp"],
                                                                                  given[0]["mbs"]))
    assert given[0]["step_time_s"] > same["step_time_s"]
    done = subprocess.run([sys.executable, "-m", "launch", "args", "--from", str(tmp_path / "rows.json")],
                          capture_output=True, text=True, check=True)
    # launched on the newest release, as the row wrote them for it
    assert shlex.split(done.stdout) == given[0]["megatron_args"]


def test_a_commands_fused_router_and_permutation_are_priced_and_launched_as_read():
    """--moe-permute-fusion and --moe-router-fusion change the price (the unfused ones run at the
    rates measured on an H200: advisor.moe.time), each by its own term, and are no longer named as
    not priced; the estimate's Megatron arguments carry them, as the sweep's rows do. HybridEP
    permutes in its own kernels: priced as fused, and said so."""
    plain = json.loads(_from_command("", "--format", "json").stdout)
    router = json.loads(_from_command("--moe-router-fusion", "--format", "json").stdout)
    fused = json.loads(_from_command("--moe-permute-fusion --moe-router-fusion", "--format", "json").stdout)
    # by hand: Mixtral on 8 GPUs, PP 1, DP 8, GBS 256: 32 microbatches of 32 MoE layers in series.
    # The fused router saves the softmax router's 0.24 ms each; the fused permutation the unfused
    # one's excess: 4096 tokens x top-2 = 8192 copies of h = 4096, 4 x 8192 x 2 x 4096 bytes a pass
    # forward at 80% of the H100's 3.35 TB/s, three times, x (1 / 0.42 - 1)
    layer_microbatches = 32 * 32
    first_pair = 3 * 4 * 8192 * 2 * 4096 / (0.8 * 3.35e12)
    assert plain["step_time_s"] - router["step_time_s"] == pytest.approx(layer_microbatches * 0.24e-3, rel=1e-9)
    assert router["step_time_s"] - fused["step_time_s"] == pytest.approx(
        layer_microbatches * first_pair * (1 / 0.42 - 1), rel=1e-9)
    assert (fused["permute_fusion"], fused["router_fusion"]) == (True, True)
    assert {"--moe-permute-fusion", "--moe-router-fusion"} <= set(fused["megatron_args"])
    assert not [note for note in fused["unpriced"] if "fusion" in note]
    assert not {"--moe-permute-fusion", "--moe-router-fusion"} & set(plain["megatron_args"])
    flex = "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep"
    hybridep = json.loads(_from_command(flex, "--format", "json").stdout)
    hybridep_fused = json.loads(_from_command(f"{flex} --moe-permute-fusion", "--format", "json").stdout)
    deepep = json.loads(_from_command("--moe-token-dispatcher-type flex --moe-enable-deepep", "--format", "json").stdout)
    # HybridEP permutes in its own kernels: priced as the fused permutation, launched as read
    assert hybridep["step_time_s"] == hybridep_fused["step_time_s"] < deepep["step_time_s"]
    assert hybridep["flex_backend"] == "hybridep" and not hybridep["permute_fusion"]
    args = hybridep["megatron_args"]
    assert args[args.index("--moe-flex-dispatcher-backend") + 1] == "hybridep" and "--moe-enable-deepep" not in args
    assert any("hybridep (HybridEP's all-to-all, priced as DeepEP's" in note for note in hybridep["unpriced"])
    sweep = CliRunner().invoke(cli, ["sweep", "--model", "qwen3-30b-a3b", "--gpus", "16", "--gpu", "h100-80gb",
                                     "--ep", "8", "--moe-router-fusion", "--format", "json"])
    rows = json.loads(sweep.stdout)
    assert rows and all(row["router_fusion"] and not row["permute_fusion"] for row in rows)


@pytest.mark.parametrize("extra, words", [
    (["--moe-deepep-num-sms", "32"], "only the flex dispatcher's DeepEP kernels take it"),
    (["--moe-token-dispatcher-type", "flex", "--moe-deepep-num-sms", "31"], "an even number of SMs"),
    (["--moe-token-dispatcher-type", "flex", "--moe-deepep-num-sms", "132"], "the h100-80gb has 132 SMs"),
    (["--moe-token-dispatcher-type", "flex", "--moe-deepep-num-sms", "0"], ("--moe-deepep-num-sms", "at least 2")),
])
def test_dispatcher_sms_megatron_or_deepep_refuse_are_one_line(extra, words):
    _one_line_error(CliRunner().invoke(cli, [*MOE_ROW, *extra]), *([words] if isinstance(words, str) else words))


def test_a_dense_model_refuses_the_dispatchers_sms():
    _one_line_error(CliRunner().invoke(cli, ["sweep", "--gpus", "8", "--mem", "80", "--moe-deepep-num-sms", "32"]),
                    "dense", "--moe-deepep-num-sms")


def test_a_dropless_sweep_prices_every_layout(advisor):
    # --moe-routing dropless over the sweep's layout arrays (it raised a numpy truth-value error
    # with a traceback: the worst case took min(k, E / ep) of a whole EP column); its worst case
    # holds at least the balanced copies, so no layout needs less memory than balanced
    def rows(*routing):
        out = advisor("sweep", "--model", "qwen3-30b-a3b", "--gpus", "16", "--mem", "80", "--seq-len", "4096",
                      "--gbs", "256", "--all", "--format", "json", *routing).stdout
        return {(r["tp"], r["cp"], r["pp"], r["ep"], r["etp"], r["mbs"], r["vpp"], r["recompute"]): r
                for r in json.loads(out)}

    dropless, balanced = rows("--moe-routing", "dropless"), rows()
    both = dropless.keys() & balanced.keys()
    assert both and all(row["routing"] == "dropless" for row in dropless.values())
    assert all(dropless[key]["total_gib"] >= balanced[key]["total_gib"] for key in both)
    assert any(dropless[key]["total_gib"] > balanced[key]["total_gib"] for key in both)


# Megatron-LM's own Mixtral example (examples/mixtral/train_mixtral_8x7b_distributed.sh, its
# argument groups as written there, paths made up; TP 4 and ETP 1 here, where the example has
# TP 1, so that the vocabulary needs padding): it leaves
# --make-vocab-size-divisible-by and the data loader's attention mask at Megatron's defaults.
MIXTRAL_EXAMPLE = """#!/bin/bash
DISTRIBUTED_ARGS=(--nproc_per_node 8 --nnodes 8 --master_addr localhost --master_port 6000)
MODEL_ARGS=(--use-mcore-models --disable-bias-linear --seq-length 4096 --max-position-embeddings 32768
    --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --init-method-std 0.01
    --attention-dropout 0.0 --hidden-dropout 0.0 --normalization RMSNorm --position-embedding-type rope --swiglu
    --untie-embeddings-and-output-weights --group-query-attention --num-query-groups 8 --rotary-base 1000000)
MOE_ARGS=(--num-experts 8 --moe-router-topk 2 --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 1e-2
    --moe-grouped-gemm --moe-token-dispatcher-type alltoall --overlap-param-gather --overlap-grad-reduce)
DATA_ARGS=(--tokenizer-type Llama2Tokenizer --tokenizer-model /data/tokenizer.model --data-path /data/text_document)
TRAINING_ARGS=(--micro-batch-size 1 --global-batch-size 256 --lr 1e-4 --train-iters 500000 --clip-grad 1.0 --bf16)
MODEL_PARALLEL_ARGS=(--tensor-model-parallel-size 4 --pipeline-model-parallel-size 4 --expert-model-parallel-size 8
    --expert-tensor-parallel-size 1 --use-distributed-optimizer --sequence-parallel)
torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py ${MODEL_ARGS[@]} ${MOE_ARGS[@]} ${DATA_ARGS[@]} \\
    ${TRAINING_ARGS[@]} ${MODEL_PARALLEL_ARGS[@]}
"""


def test_megatrons_own_mixtral_example_is_priced_with_its_padded_vocabulary(tmp_path):
    """The example's defaults (vocabulary padded to 128 x TP, the mask built by the data loader)
    were refused for MoE models; they are priced as for dense ones. By hand: Mixtral's 32,000
    rows pad to a multiple of 128 x TP 4, 32,256; stage 0 holds the embedding, 256 more rows of
    4,096 over TP 4 = 262,144 parameters more, at 2 (BF16 weight) + 4 (FP32 gradient) + 12 / DP 4
    (Adam, sharded) = 9 bytes each."""
    script = tmp_path / "train_mixtral_8x7b_distributed.sh"
    script.write_text(MIXTRAL_EXAMPLE)
    runner = CliRunner()
    result = runner.invoke(cli, ["estimate", "--from-command", str(script), "--vocab-size", "32000",
                                 "--gpu", "h100-80gb", "--format", "json"])
    assert result.exit_code == 0, result.output
    read = json.loads(result.stdout)
    args = read["megatron_args"]
    assert args[args.index("--make-vocab-size-divisible-by") + 1] == "128"
    assert "--no-create-attention-mask-in-dataloader" not in args  # built, as the example leaves it
    unpadded = json.loads(runner.invoke(cli, ["estimate", "--model", "mixtral-8x7b", "--tp", "4", "--pp", "4",
                                              "--ep", "8", "--etp", "1", "--gpus", "64", "--mbs", "1", "--gbs", "256",
                                              "--seq-len", "4096", "--gpu", "h100-80gb", "--recompute", "none",
                                              "--format", "json"]).stdout)
    assert read["dp"] == unpadded["dp"] == 4
    grown = (read["stages"][0]["dense_states_gib"] - unpadded["stages"][0]["dense_states_gib"]) * 2**30
    assert grown == 256 * 4096 / 4 * (2 + 4 + 12 / 4)
    assert read["stages"][1]["dense_states_gib"] == unpadded["stages"][1]["dense_states_gib"]


def test_a_mask_rebuilt_per_sample_bounds_the_moe_step_as_the_dense_one():
    """--dataloader-mask rebuilt: a replica steps no faster than its data loader builds the
    s x s masks of its GBS / DP samples (``terms.host_mask_time``, two workers), as dense rows."""
    from advisor.hardware import get_gpu
    from advisor.throughput import terms
    from advisor.throughput.calibration import load_calibration

    base = ["estimate", "--model", "mixtral-8x7b", "--tp", "8", "--pp", "1", "--ep", "8", "--etp", "1", "--gpus", "8",
            "--mbs", "1", "--gbs", "64", "--seq-len", "32768", "--gpu", "h100-80gb", "--format", "json"]
    runner = CliRunner()
    cached = json.loads(runner.invoke(cli, [*base, "--dataloader-mask", "cached"]).stdout)
    rebuilt = json.loads(runner.invoke(cli, [*base, "--dataloader-mask", "rebuilt"]).stdout)
    rates = terms.Rates.of(get_gpu("h100-80gb"), load_calibration())
    host = 64 / 1 * rates.host_mask_s_per_element * 32768.0**2 / 2
    assert host > cached["step_time_s"]  # the case where the data loader is the bound
    assert rebuilt["step_time_s"] == pytest.approx(max(cached["step_time_s"], host), rel=1e-12)


_MIXTRAL_COMMAND = (
    "torchrun --nproc-per-node 8 --nnodes 1 pretrain_gpt.py --num-layers 32 --hidden-size 4096 "
    "--ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention --num-query-groups 8 "
    "--seq-length 4096 --max-position-embeddings 32768 --normalization RMSNorm --swiglu "
    "--position-embedding-type rope --disable-bias-linear --untie-embeddings-and-output-weights --vocab-size 32000 "
    "--make-vocab-size-divisible-by 128 --micro-batch-size 1 --global-batch-size 256 --bf16 "
    "--use-distributed-optimizer --num-experts 8 --moe-router-topk 2 --moe-grouped-gemm "
    "--expert-model-parallel-size 8 --moe-token-dispatcher-type alltoall --moe-router-load-balancing-type aux_loss "
    "--moe-aux-loss-coeff 1e-2")


def _from_command(extra: str, *options: str):
    return CliRunner().invoke(cli, ["estimate", "--from-command", "-", "--gpu", "h100-80gb", *options],
                              input=f"{_MIXTRAL_COMMAND} {extra}\n")


def test_selective_recomputation_in_a_command_is_megatrons_core_attn_by_default():
    """Without --recompute-modules Megatron recomputes core_attn (transformer_config.py,
    __post_init__, both releases): the command is priced so, as the same estimate with
    --recompute-modules core_attn, not with the advisor's own default (moe_act, layernorm)."""
    read = json.loads(_from_command("--recompute-granularity selective", "--format", "json").stdout)
    given = json.loads(_from_command("--recompute-granularity selective --recompute-modules core_attn",
                                     "--format", "json").stdout)
    ours = json.loads(_from_command("--recompute-granularity selective --recompute-modules moe_act layernorm",
                                    "--format", "json").stdout)
    assert read["recompute_modules"] == ["core_attn"]
    assert (read["total_gib"], read["step_time_s"]) == (given["total_gib"], given["step_time_s"])
    assert ours["total_gib"] < read["total_gib"]  # what the command does not recompute is kept


@pytest.mark.parametrize("extra, words", [
    ("--recompute-granularity selective --recompute-modules", ("--recompute-modules names no module",)),
    ("--recompute-granularity selective --recompute-modules core_attn bogus", ("bogus", "not one of Megatron's")),
    ("--moe-router-enable-expert-bias", ("expert_bias", "sigmoid")),
    ("--overlap-moe-expert-parallel-comm --moe-shared-expert-intermediate-size 4096 --moe-shared-expert-overlap",
     ("--moe-shared-expert-overlap",)),
    ("--moe-token-dispatcher-type flex --moe-enable-deepep --expert-model-parallel-size 1",
     ("flex dispatcher needs EP x ETP > 1",)),
    ("--moe-router-topk 1", ("--moe-router-pre-softmax",)),
])
def test_commands_megatron_refuses_are_refused_in_one_line(extra, words):
    _one_line_error(_from_command(extra), *words)


def test_top_one_routing_is_read_and_launched_with_pre_softmax():
    read = json.loads(_from_command("--moe-router-topk 1 --moe-router-pre-softmax", "--format", "json").stdout)
    assert "--moe-router-pre-softmax" in read["megatron_args"]
    assert read["megatron_args"][read["megatron_args"].index("--moe-router-topk") + 1] == "1"


def test_pre_softmax_at_top_two_is_priced_and_launched_as_read():
    # it was read as changing nothing and left out of the launch: a different router (softmax over
    # all 8 experts, not renormalised); its FP32 scores over all E are kept (advisor.moe.memory)
    read = json.loads(_from_command("--moe-router-pre-softmax", "--format", "json").stdout)
    plain = json.loads(_from_command("", "--format", "json").stdout)
    assert "--moe-router-pre-softmax" in read["megatron_args"] and read["model"]["router_pre_softmax"]
    assert "--moe-router-pre-softmax" not in plain["megatron_args"]
    assert read["total_gib"] > plain["total_gib"]


def test_yarn_without_mscale_all_dim_is_megatrons_default():
    # --mscale-all-dim defaults to 0.0 in both releases (_yarn_get_mscale(scale, 0) is 1)
    mla = ("--multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128 "
           "--qk-pos-emb-head-dim 64 --v-head-dim 128")
    result = _from_command(mla, "--format", "json")
    assert result.exit_code == 0, result.output
    assert "--mscale-all-dim" in json.loads(result.stdout)["megatron_args"]


@pytest.mark.parametrize("args, words", [
    (["--model", "mixtral-8x7b", "--gpus", "8", "--ep", "1", "--moe-token-dispatcher-type", "flex"],
     ("flex dispatcher needs EP x ETP > 1",)),
    (["--model", "mixtral-8x7b", "--gpus", "8", "--ep", "8", "--overlap-moe-expert-parallel-comm", "--recompute",
      "selective", "--recompute-modules", "moe"], ("--recompute-modules moe",)),
    (["--model", "mixtral-8x7b", "--gpus", "8", "--ep", "8", "--recompute", "selective", "--recompute-modules",
      "mla_up_proj"], ("mla_up_proj", "multi-latent attention")),
])
def test_estimates_megatron_refuses_are_refused_in_one_line(args, words):
    _one_line_error(CliRunner().invoke(cli, ["estimate", "--gpu", "h100-80gb", *args]), *words)


def test_a_flex_sweep_has_no_row_without_expert_or_tensor_parallelism():
    rows = json.loads(CliRunner().invoke(cli, ["sweep", "--model", "mixtral-8x7b", "--gpus", "8", "--gpu", "b200-180gb",
                                               "--moe-token-dispatcher-type", "flex", "--all", "--format",
                                               "json"]).stdout)
    assert rows and all(r["ep"] * r["etp"] > 1 for r in rows)


def test_a_selective_row_without_modules_launches_the_modules_it_was_priced_with():
    from advisor.moe.flags import row_args
    from advisor.moe.spec import PRESETS

    row = json.loads(CliRunner().invoke(cli, [*MOE_ROW, "--recompute", "selective", "--top", "1"]).stdout)[0]
    priced = row["recompute_modules"]
    row["recompute_modules"] = None  # a hand-edited row: priced with the default (MoEOptions.recompute_modules)
    args = row_args(PRESETS["qwen3-30b-a3b"], 4096, 256, row)
    assert args[args.index("--recompute-modules") + 1:][:len(priced)] == priced


def test_tied_embeddings_share_the_lm_head_at_pp_1_by_hand():
    # Mixtral at TP 1, PP 1, EP 8 on 64 GPUs (DP 64): tied, the LM head is the embedding, so the
    # last stage drops v h parameters of BF16 weights, FP32 gradients and Adam's 12 bytes over DP
    layout = ["estimate", "--model", "mixtral-8x7b", "--gpus", "64", "--gpu", "h100-80gb", "--tp", "1", "--pp", "1",
              "--ep", "8", "--format", "json"]
    untied = json.loads(CliRunner().invoke(cli, layout).stdout)
    tied = json.loads(CliRunner().invoke(cli, [*layout, "--tie-embeddings"]).stdout)
    head = 32000 * 4096 * (2 + 4 + 12 / 64)
    assert (untied["total_gib"] - tied["total_gib"]) * 2**30 == pytest.approx(head)
    assert "--untie-embeddings-and-output-weights" in untied["megatron_args"]
    assert "--untie-embeddings-and-output-weights" not in tied["megatron_args"]
    # at PP 2 the last stage keeps a copy (Megatron syncs the two): the same memory as untied
    staged = [*layout[:-6], "--pp", "2", "--ep", "8", "--format", "json"]
    assert json.loads(CliRunner().invoke(cli, [*staged, "--tie-embeddings"]).stdout)["total_gib"] == pytest.approx(
        json.loads(CliRunner().invoke(cli, staged).stdout)["total_gib"])


@pytest.mark.parametrize("extra, words", [
    ("--moe-router-load-balancing-type bogus", ("'bogus' is not one of Megatron's",)),
    ("--moe-router-load-balancing-type sinkhorn --moe-expert-capacity-factor 1.0", ("sinkhorn", "drops tokens")),
])
def test_balancing_types_megatron_refuses_are_refused_in_one_line(extra, words):
    _one_line_error(_from_command(extra), *words)


def test_several_balancing_losses_are_read_and_launched_as_given():
    """--moe-router-load-balancing-type and --moe-aux-loss-coeff take several values (nargs='+',
    both releases): read, not priced (the same estimate as the aux_loss command), and launched as
    read (tests/test_moe_megatron.py checks Megatron's own reading of them)."""
    base = json.loads(_from_command("", "--format", "json").stdout)
    extra = "--moe-router-load-balancing-type seq_aux_loss global_aux_loss --moe-aux-loss-coeff 1e-3 1e-4"
    # the base command's own balancing flags come first; Megatron and the reader keep the last
    read = json.loads(_from_command(extra, "--format", "json").stdout)
    assert (read["model"]["load_balancing"], read["model"]["aux_loss_coeff"]) == (
        ["seq_aux_loss", "global_aux_loss"], [1e-3, 1e-4])
    assert (read["total_gib"], read["step_time_s"]) == (base["total_gib"], base["step_time_s"])
    args = " ".join(read["megatron_args"])
    assert "--moe-router-load-balancing-type seq_aux_loss global_aux_loss --moe-aux-loss-coeff 0.001 0.0001" in args


_SIGMOID = "--moe-router-score-function sigmoid --moe-router-enable-expert-bias"


@pytest.mark.parametrize("extra, kept", [
    ("", None),  # the base command's aux_loss with its weight
    (f"{_SIGMOID} --moe-router-load-balancing-type none --moe-aux-loss-coeff 0", None),
    (f"{_SIGMOID} --moe-aux-loss-coeff 1e-3", ["aux_loss"]),  # the bias beside an aux loss
    ("--moe-router-load-balancing-type seq_aux_loss", ["seq_aux_loss"]),
])
def test_the_balancing_the_presets_launch_reads_as_theirs(extra, kept):
    """A command's balancing that a preset's (``load_balancing`` null) would launch with the same
    flags reads as null, as the preset says it; any other is kept as given. Each read spec
    launches the balancing type the command gave (Megatron keeps a flag's last value)."""
    read = json.loads(_from_command(extra, "--format", "json").stdout)
    assert read["model"]["load_balancing"] == kept

    def last_type(words: list[str]) -> str:
        return words[len(words) - 1 - words[::-1].index("--moe-router-load-balancing-type") + 1]

    assert last_type(read["megatron_args"]) == last_type(f"{_MIXTRAL_COMMAND} {extra}".split())


@pytest.mark.parametrize("extra, message", [
    ("--moe-router-load-balancing-type seq_aux_loss global_aux_loss --moe-aux-loss-coeff 1e-3",
     "--moe-aux-loss-coeff gives 1 weight for 2 load-balancing types: megatron-core needs one per type"),
    ("--moe-aux-loss-coeff 1e-3 1e-4", "gives 2 weights for 1 load-balancing type:"),
    ("--moe-router-load-balancing-type aux_loss bogus --moe-aux-loss-coeff 1e-3 1e-4",
     "--moe-router-load-balancing-type 'bogus' is not one of Megatron's"),
    ("--moe-router-load-balancing-type aux_loss sinkhorn --moe-aux-loss-coeff 1e-3 0 --moe-expert-capacity-factor 1",
     "--moe-expert-capacity-factor with --moe-router-load-balancing-type sinkhorn"),
])
def test_balancing_losses_megatron_refuses_are_one_line(extra, message):
    _one_line_error(_from_command(extra), message)


def test_recompute_modules_take_megatrons_space_separated_spelling():
    """Megatron-LM's --recompute-modules moe_act layernorm (nargs='+') means what the advisor's
    repeated option means; a word that is not a module is still refused in one line, and nothing
    after '--' is rewritten."""
    from advisor.cli.spellings import megatron_nargs

    base = ["sweep", "--model", "qwen3-30b-a3b", "--gpus", "16", "--gpu", "h100-80gb", "--recompute", "selective",
            "--top", "2", "--format", "json"]
    repeated = CliRunner().invoke(cli, [*base, "--recompute-modules", "moe_act", "--recompute-modules", "layernorm"])
    spaced = CliRunner().invoke(cli, megatron_nargs([*base, "--recompute-modules", "moe_act", "layernorm"]))
    assert repeated.exit_code == spaced.exit_code == 0 and repeated.stdout == spaced.stdout
    assert sorted(json.loads(spaced.stdout)[0]["recompute_modules"]) == ["layernorm", "moe_act"]
    done = subprocess.run([sys.executable, "-m", "advisor", *base, "--recompute-modules", "moe_act", "layernorm"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and json.loads(done.stdout) == json.loads(spaced.stdout)  # the real entry point
    bad = subprocess.run([sys.executable, "-m", "advisor", *base, "--recompute-modules", "moe_act", "bogus"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert "'bogus' is not one of" in bad.stderr and "--recompute-modules" in bad.stderr  # not a stray argument
    passed_on = ["--recompute-modules", "moe_act", "--", "--recompute-modules", "mlp", "moe"]
    assert megatron_nargs(passed_on) == passed_on


def test_the_moe_estimate_title_names_its_options_as_the_sweeps_does():
    """The estimate's title names the training options that differ from the defaults (as the dense
    estimate's) and the MoE settings (as the sweep's): one phrase for both."""
    base = ["--model", "qwen3-30b-a3b", "--gpu", "h100-80gb", "--gpus", "16", "--ep", "8"]
    estimate = CliRunner(env={"COLUMNS": "200"}).invoke(
        cli, ["estimate", *base, "--tp", "1", "--pp", "1", "--gbs", "1024", "--recompute", "full",
              "--grad-reduce-in-bf16", "--moe-router-fusion", "--moe-token-dispatcher-type", "allgather"])
    sweep = CliRunner(env={"COLUMNS": "200"}).invoke(
        cli, ["sweep", *base, "--top", "1", "--grad-reduce-in-bf16", "--moe-router-fusion",
              "--moe-token-dispatcher-type", "allgather"])
    assert estimate.exit_code == sweep.exit_code == 0, estimate.output + sweep.output
    phrase = "routing balanced, dispatcher allgather, --moe-router-fusion"
    estimate_title, sweep_title = (" ".join(result.stdout.splitlines()[:2]) for result in (estimate, sweep))
    # the estimate's one layout says its recomputation too (a sweep's rows each say theirs)
    assert "--grad-reduce-in-bf16" in estimate_title and estimate_title.endswith(f"{phrase}, recompute full")
    assert phrase in sweep_title and "--grad-reduce-in-bf16" in sweep_title


def test_the_estimates_expert_tp_defaults_to_the_tp_as_megatrons_does():
    """Without --etp the estimate runs ETP = TP, Megatron-LM's default (arguments.py: an unset
    --expert-tensor-parallel-size is the TP size), as the same layout read from a command does; the
    sweep names an ETP above a pinned TP as not searched."""
    base = ["estimate", "--model", "qwen3-30b-a3b", "--gpus", "16", "--gpu", "h100-80gb", "--tp", "2", "--ep", "8",
            "--recompute", "full", "--format", "json"]
    default = json.loads(CliRunner().invoke(cli, base).stdout)
    given = json.loads(CliRunner().invoke(cli, [*base, "--etp", "2"]).stdout)
    assert default["etp"] == 2 and default["step_time_s"] == given["step_time_s"]
    args = default["megatron_args"]
    assert args[args.index("--expert-tensor-parallel-size") + 1] == "2"
    _one_line_error(CliRunner().invoke(cli, ["sweep", "--model", "qwen3-30b-a3b", "--gpus", "16", "--gpu", "h100-80gb",
                                             "--tp", "2", "--etp", "4"]), "ETP 4 is not searched with --tp 2")
    # a layout Megatron refuses with its default ETP says the ETP was defaulted
    _one_line_error(CliRunner().invoke(cli, ["estimate", "--model", "qwen3-30b-a3b", "--gpus", "8", "--gpu",
                                             "h100-80gb", "--tp", "4", "--pp", "2", "--ep", "4"]),
                    "EP x ETP = 16 must divide", "; without --etp the ETP is the TP, 4, as Megatron-LM's default: give "
                    "--etp 1")  # TP x CP x DP = 4 x 1 x 1 holds EP 4 x ETP 1 alone (EP 4 x ETP 2 = 8 does not divide)
    # EP 8 fits no ETP on TP x CP x DP = 4: nothing to give
    no_etp = CliRunner().invoke(cli, ["estimate", "--model", "qwen3-30b-a3b", "--gpus", "8", "--gpu", "h100-80gb",
                                      "--tp", "4", "--pp", "2", "--ep", "8"])
    _one_line_error(no_etp, "EP x ETP = 32 must divide TP x CP x DP = 4", "; without --etp the ETP is the TP, 4, as "
                    "Megatron-LM's default")
    assert "give" not in no_etp.output


def test_the_flex_backend_is_an_option_priced_written_and_refused_where_megatron_ignores_it():
    """--moe-flex-dispatcher-backend hybridep: the rows carry it, write Megatron's flag (not
    DeepEP's --moe-enable-deepep), and price HybridEP's own permutation at the HBM rate. By hand,
    the flex dispatcher permutes once (no sort by local expert), so against DeepEP the step saves
    the unfused permutation's excess alone, as --moe-permute-fusion does: the two price alike."""
    common = ["estimate", "--model", "qwen3-30b-a3b", "--gpus", "16", "--ep", "8", "--tp", "1", "--pp", "1",
              "--mbs", "1", "--gbs", "256", "--seq-len", "4096", "--gpu", "h100-80gb",
              "--moe-token-dispatcher-type", "flex", "--format", "json"]

    def run(*extra):
        result = CliRunner().invoke(cli, [*common, *extra])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    deepep, fused = run(), run("--moe-permute-fusion")
    hybridep = run("--moe-flex-dispatcher-backend", "hybridep")
    assert hybridep["step_time_s"] == pytest.approx(fused["step_time_s"], rel=1e-12)
    # 48 MoE layers x 16 microbatches (GBS 256 over DP 16), in series at PP 1; 4096 tokens x top-8
    # copies of h = 2048, 4 x copies x 2 x h bytes a pass at 80% of 3.35 TB/s, three passes
    # (forward, backward twice), x (1 / 0.42 - 1)
    excess = 48 * 16 * 3 * 4 * (4096 * 8) * 2 * 2048 / (0.8 * 3.35e12) * (1 / 0.42 - 1)
    # (the compute's: less compute leaves more of the overlapped DP reduction exposed)
    assert deepep["time_parts"]["compute_s"] - hybridep["time_parts"]["compute_s"] == pytest.approx(excess, rel=1e-9)
    assert (hybridep["flex_backend"], deepep["flex_backend"]) == ("hybridep", "deepep")
    args = hybridep["megatron_args"]
    assert args[args.index("--moe-flex-dispatcher-backend") + 1] == "hybridep" and "--moe-enable-deepep" not in args
    title = CliRunner().invoke(cli, [*common[:-2], "--moe-flex-dispatcher-backend", "hybridep"]).output
    assert "dispatcher flex (hybridep)" in title
    # the option's pricing said as a command's read-back says it
    said = "--moe-flex-dispatcher-backend hybridep (HybridEP's all-to-all, priced as DeepEP's; its own permutation"
    assert said in " ".join(title.split())
    sweep = CliRunner().invoke(cli, [*MOE_ROW[:-2], "--ep", "8", "--moe-token-dispatcher-type", "flex",
                                     "--moe-flex-dispatcher-backend", "hybridep"]).output
    assert said in " ".join(sweep.split())
    rows = json.loads(CliRunner().invoke(cli, [*MOE_ROW, "--ep", "8", "--moe-token-dispatcher-type", "flex",
                                               "--moe-flex-dispatcher-backend", "ncclep"]).stdout)
    assert rows and all(row["flex_backend"] == "ncclep" for row in rows)
    _one_line_error(CliRunner().invoke(cli, [*MOE_ROW, "--moe-flex-dispatcher-backend", "hybridep"]),
                    "--moe-flex-dispatcher-backend hybridep needs --moe-token-dispatcher-type flex")
    _one_line_error(CliRunner().invoke(cli, ["estimate", "--model", "llama3.1-8b", "--gpus", "8",
                                             "--moe-flex-dispatcher-backend", "hybridep"]),
                    "is dense", "--moe-flex-dispatcher-backend")
    # core_v0.15.2 has no such flag: refused where the release is named, as the launcher refuses it
    _one_line_error(CliRunner().invoke(cli, [*common[:-2], "--moe-flex-dispatcher-backend", "hybridep",
                                             "--megatron-version", "0.15"]),
                    "--moe-flex-dispatcher-backend hybridep: Megatron-LM core 0.15 has no such flag")


@pytest.mark.parametrize("layout, edp", [
    (("--tp", "2", "--pp", "16", "--ep", "64", "--etp", "1"), 1),  # 2 x 32 (TP x DP) over 64 x 1
    (("--tp", "2", "--pp", "16", "--ep", "8", "--etp", "1"), 8),  # 64 / 8
    (("--tp", "2", "--pp", "16", "--ep", "8", "--etp", "2"), 4),  # 64 / 16
])
def test_the_estimate_title_names_the_expert_data_parallel_size(layout, edp):
    """The experts' gradients and Adam states are sharded over the expert-data-parallel group (TP x CP
    x DP / (EP x ETP) ranks, megatron-core parallel_state.py), not DP: a reader of the table saw DP 32
    where the largest state term was not sharded at all."""
    result = CliRunner().invoke(cli, ["estimate", "--model", "deepseek-v3", "--gpus", "1024", "--gpu", "h100-80gb",
                                      *layout, "--seq-len", "4096", "--gbs", "8192"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert f"DP 32 (expert DP {edp})," in result.stdout.splitlines()[0]


def test_a_commands_tp_without_sequence_parallelism_is_named_as_the_command_says_it():
    """A command at TP 2 without --sequence-parallel was refused as '--no-sequence-parallel', a flag
    it never wrote (megatron-core's MoELayer raises in training without it, moe_layer.py;
    model_parallel_config.py only warns)."""
    _one_line_error(_from_command("--tensor-model-parallel-size 2 --expert-tensor-parallel-size 1"),
                    "does not price TP without --sequence-parallel")


@pytest.mark.parametrize("extra, words", [
    # delayed FP8 scaling narrows selective's default (MoEOptions.recompute_modules): said, not silent
    (["--fp8-format", "hybrid", "--recompute", "selective"],
     "selective recomputes core_attn (delayed FP8 scaling refuses moe_act and layernorm)"),
    (["--recompute", "selective"], "selective recomputes layernorm, moe_act"),
    (["--recompute", "selective", "--recompute-modules", "moe"], "selective recomputes moe"),
    (["--recompute", "full", "--moe-imbalance", "1.5"], "routing balanced x 1.5 on the busiest rank, "
                                                        "dispatcher alltoall, recompute full"),
])
def test_an_moe_estimate_says_what_it_recomputes_and_its_imbalance(extra, words):
    """Two MoE estimates that differ only in recomputation or imbalance had the same title."""
    result = CliRunner().invoke(cli, ["estimate", "--model", "qwen3-30b-a3b", "--gpus", "16", "--ep", "16", "--gpu",
                                      "h100-80gb", "--seq-len", "4096", *extra], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    assert words in result.output.splitlines()[0]


@pytest.mark.parametrize("fp8", [[], ["--fp8-format", "hybrid"]], ids=["bf16", "fp8"])
def test_an_moe_stage_tables_columns_add_up_to_its_total(fp8):
    """With FP8 the stage table's total held the FP8 weight copies (3.03 GiB a stage here), which
    no column showed (audit): each stage's columns now add up to its total, to the rounding."""
    result = CliRunner().invoke(cli, ["estimate", "--model", "deepseek-v3", "--gpus", "1024", "--pp", "16", "--ep",
                                      "64", "--tp", "1", "--gbs", "8192", "--seq-len", "4096", "--gpu", "h100-80gb",
                                      "--recompute", "full", "--wide", *fp8], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    table = read_table(result.stdout)
    header, rows = table.headers, table.rows
    assert "stage" in header and ("FP8 w. GiB" in header) == bool(fp8)
    parts = [header.index(f"{name} GiB") for name in ("dense st.", "expert st.", "FP8 w.", "act.", "transient")
             if f"{name} GiB" in header]
    assert len(rows) == 16
    for row in rows:
        assert sum(float(row[i]) for i in parts) == pytest.approx(float(row[header.index("total GiB")]), abs=0.03)


def test_an_interleaved_moe_estimate_shows_its_fractional_in_flight_counts_as_the_dense_one():
    """Qwen3-30B-A3B at PP 4, VPP 3 (48 layers: 12 chunks of 4). Megatron's interleaved warm-up
    (core_v0.15.2 megatron/core/pipeline_parallel/schedules.py:728-729, microbatch_group_size_per_vp_stage
    = PP) is (PP - r - 1) x 2 + (VPP - 1) x PP forward chunk passes, plus the one in flight at the
    peak: 15, 13, 11, 9 chunk passes on ranks 0-3, over VPP 3 microbatches' worth of the rank's
    layers: 5, 13/3, 11/3, 3. The MoE table printed 13/3 as '4.33333' (format 'g') where the dense
    table prints 4 significant digits ('4.333'), and it left out the dense table's line saying
    why the counts are fractions."""
    result = CliRunner().invoke(cli, ["estimate", "--model", "qwen3-30b-a3b", "--gpus", "16", "--tp", "1", "--pp", "4",
                                      "--vpp", "3", "--mbs", "1", "--ep", "4", "--gbs", "256", "--seq-len", "4096",
                                      "--mem", "80", "--wide"])
    assert result.exit_code == 0, result.output
    table = read_table(result.output)
    assert [record["in flight"] for record in table.records()] == ["5", "4.333", "3.667", "3"]
    assert "in flight: microbatches' worth of a rank's layers held at its peak" in table.caption
    whole = CliRunner().invoke(cli, ["estimate", "--model", "qwen3-30b-a3b", "--gpus", "16", "--tp", "1", "--pp", "4",
                                     "--mbs", "1", "--ep", "4", "--gbs", "256", "--seq-len", "4096", "--mem", "80"])
    assert whole.exit_code == 0, whole.output
    assert "in flight:" not in read_table(whole.output).caption  # 1F1B's 4, 3, 2, 1: nothing to explain
