"""A newcomer's audit of the MoE side of ``advisor sweep`` and ``advisor estimate``: MoE sweeps
refuse what dense sweeps and MoE estimates refuse (GPUs that are not whole nodes, an EP that
cannot divide the experts), say why nothing fits as the dense sweep says it, print their count
line on stderr with JSON and CSV, and a dense model refuses every MoE option given to it."""

import json
import re

import pytest

MIXTRAL = ("--model", "mixtral-8x7b")
SMALL = (*MIXTRAL, "--gpus", 8, "--gpu", "h100-80gb", "--seq-len", 4096, "--gbs", 64)


def _error(advisor, tmp_path, *args) -> str:
    """The one ``Error:`` line of a refused command (``Invoker.error``), which writes nothing."""
    target = tmp_path / "out.json"
    line = advisor.error(*args, "--format", "json", "-o", target)
    assert not target.exists()
    return line


# --- 1. whole nodes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("hardware, gpus, node", [(("--gpu", "gb200"), 256, 72),
                                                   (("--mem", 80, "--gpus-per-node", 3), 64, 3)])
def test_an_moe_sweep_refuses_gpus_that_are_not_whole_nodes_as_dense_sweeps_and_estimates_do(advisor, tmp_path,
                                                                                               hardware, gpus, node):
    expected = (f"Error: {gpus} GPUs are not whole nodes of {node}: give a multiple of {node}, at most one node, "
                "or the GPUs your nodes hold with --gpus-per-node N (a GB200 NVL72 rack's NVLink domain: "
                "--gpus-per-node 72)")
    moe_sweep = _error(advisor, tmp_path, "sweep", "--model", "deepseek-v3", "--gpus", gpus, *hardware,
                       "--seq-len", 4096, "--gbs", 8192)
    dense_sweep = _error(advisor, tmp_path, "sweep", "--gpus", gpus, *hardware)
    moe_estimate = _error(advisor, tmp_path, "estimate", *MIXTRAL, "--gpus", gpus, *hardware)
    assert moe_sweep == dense_sweep == moe_estimate == expected


def test_whole_nodes_and_a_single_partial_node_still_sweep(advisor):
    two_nodes = advisor.json("sweep", *MIXTRAL, "--gpus", 144, "--gpu", "gb200", "--seq-len", 4096, "--gbs", 288,
                             "--top", 1)
    one_node = advisor.json("sweep", *MIXTRAL, "--gpus", 64, "--gpu", "gb200", "--seq-len", 4096, "--gbs", 256,
                            "--top", 1)
    assert two_nodes[0]["gpus"] == 144 and one_node[0]["gpus"] == 64


# --- 2. a pinned EP or ETP that cannot work -----------------------------------------------------------

@pytest.mark.parametrize("pins, expected", [
    (("--ep", 3), "Error: EP 3 must divide the 8 experts"),
    (("--ep", 8, "--etp", 16), "Error: EP x ETP = 128 must divide TP x CP x DP = 64 (megatron-core's expert groups)"),
    (("--ep", 1, "--etp", 1, "--moe-token-dispatcher-type", "flex"),
     "Error: the flex dispatcher needs EP x ETP > 1 (megatron-core asserts 'Flex token dispatcher requires TPxEP > 1')"),
])
def test_a_pinned_expert_layout_that_cannot_run_says_why_as_the_estimate_does(advisor, tmp_path, pins, expected):
    sweep = _error(advisor, tmp_path, "sweep", *MIXTRAL, "--gpus", 64, "--gpu", "h100-80gb", *pins)
    estimate = _error(advisor, tmp_path, "estimate", *MIXTRAL, "--gpus", 64, "--gpu", "h100-80gb", *pins)
    assert sweep == estimate == expected


@pytest.mark.parametrize("gpus, ep, etp", [(48, 8, 3), (64, 2, 16)])
def test_a_pinned_etp_outside_the_search_says_so(advisor, tmp_path, gpus, ep, etp):
    # EP x ETP divides the GPUs, so megatron-core could build the groups; the sweep's ETP is a power
    # of 2 up to TP (at most the node's 8 GPUs), so --etp 3 and --etp 16 would find no row
    line = _error(advisor, tmp_path, "sweep", *MIXTRAL, "--gpus", gpus, "--gpu", "h100-80gb", "--ep", ep,
                  "--etp", etp, "--gbs", gpus)
    assert line == (f"Error: ETP {etp} is not searched: the sweep's ETP is a power of 2 up to TP, which is at "
                    "most 8 (--gpus-per-node)")


@pytest.mark.parametrize("pins", [("--etp", 3), ("--ep", 8, "--etp", 3), ("--tp", 8, "--etp", 6)])
def test_an_etp_that_is_no_power_of_2_is_refused_as_unsearched_not_by_the_expert_group_rule(advisor, tmp_path, pins):
    # on 64 GPUs EP x ETP = 3 (EP unpinned counted as 1), 24 and 6 divide no TP x CP x DP of 64, but
    # the sweep never tries ETP 3 or 6 at any EP or PP: "EP x ETP = 3 must divide ..." named an EP
    # the user never gave and a rule that the sweep's own (powers of 2) makes moot
    line = _error(advisor, tmp_path, "sweep", *MIXTRAL, "--gpus", 64, "--gpu", "h100-80gb", *pins)
    etp = pins[-1]
    assert line == (f"Error: ETP {etp} is not searched: the sweep's ETP is a power of 2 up to TP, which is at "
                    "most 8 (--gpus-per-node)")


# --- 3. nothing fits ----------------------------------------------------------------------------------

def _nothing_fits(advisor, *args) -> tuple[str, list[dict]]:
    """(the nothing-fits line, every row as --all gives them)."""
    result = advisor("sweep", *args, expect=1)
    assert result.stdout == "" and result.stderr.count("\n") == 1
    return result.stderr.strip(), advisor.json("sweep", *args, "--all")


def test_nothing_fits_tallies_the_verdicts_and_quotes_the_calibrated_usage_they_judged(advisor):
    # --sharding fixed: with auto the ladder's optimizer CPU offload runs layouts here (tests/test_moe_escalation.py)
    line, rows = _nothing_fits(advisor, *SMALL, "--mem", 110, "--sharding", "fixed")
    kinds = ("fits", "likely fits", "likely oom", "oom")
    tally = ", ".join(f"{sum(row['verdict'] == kind for row in rows)} {kind}" for kind in kinds)
    assert sum(row["verdict"] == "likely oom" for row in rows) > 0  # a tally of more than one kind
    least = min(rows, key=lambda row: row["usage_gib"])
    assert round(least["usage_gib"], 1) != round(min(row["total_gib"] for row in rows), 1)
    layout = (f"(TP {least['tp']}, CP {least['cp']}, PP {least['pp']}, EP {least['ep']}, ETP {least['etp']}, "
              f"MBS {least['mbs']})")
    assert line == (f"advisor sweep: nothing fits: {tally}; the least any layout needs is {least['usage_gib']:.1f} "
                    f"GiB per GPU against 110 GiB {layout}. Try more GPUs or a shorter --seq-len (--all "
                    "shows the rows)")  # recomputation, any split, every EP and ETP were searched already


def test_nothing_fits_with_the_paper_rule_quotes_the_total_and_hints_the_choices_given(advisor):
    args = (*MIXTRAL, "--gpus", 8, "--mem", 40, "--seq-len", 8192, "--recompute", "selective", "--split", "even",
            "--ep", 8, "--etp", 1, "--sharding", "fixed")  # auto: optimizer CPU offload leaves two rows tight
    line, rows = _nothing_fits(advisor, *args)
    assert {row["verdict"] for row in rows} == {"oom"}
    least = min(rows, key=lambda row: row["total_gib"])
    assert line.startswith(f"advisor sweep: nothing fits: 0 fits, 0 tight, {len(rows)} oom; the least any layout "
                           f"needs is {least['total_gib']:.1f} GiB per GPU against 40 GiB (TP {least['tp']}, ")
    # Mixtral's states alone at EP 8 (about 98 GiB) exceed 40 GiB: neither recomputation nor a shorter
    # --seq-len can help, a pin, the split or a larger GPU can
    assert "and its weights, gradients and optimizer states alone need " in line
    assert line.endswith(". Try more GPUs, --split auto, no --ep/--etp or a GPU with more memory "
                         "(--all shows the rows)")


def test_nothing_fits_with_the_overlap_hints_it(advisor):
    line, _ = _nothing_fits(advisor, *MIXTRAL, "--gpus", 8, "--gpu", "h100-80gb", "--mem", 40,
                            "--overlap-moe-expert-parallel-comm", "--vpp", 2)
    assert line.endswith("Try more GPUs, no --vpp, no --overlap-moe-expert-parallel-comm or a GPU with more memory "
                         "(--all shows the rows)")


# --- 4. the count line with JSON and CSV ----------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_json_and_csv_moe_sweeps_print_the_tables_count_line_on_stderr(advisor, fmt):
    table = advisor("sweep", *SMALL, "--mem", 140, "--top", 1).stdout
    # with --gpu, each layout's fastest variant that fits (without, its least recomputation)
    counted = re.search(r"^([\d,]+) layouts x recomputation x VPP priced; one row per layout, its fastest "
                        r"variant that fits$", table, re.M)
    assert counted, table
    result = advisor("sweep", *SMALL, "--mem", 140, "--top", 1, "--format", fmt)
    assert result.stderr == f"advisor sweep: {counted.group(0)}\n"
    assert result.stdout.strip()
    untimed = advisor("sweep", *MIXTRAL, "--gpus", 8, "--mem", 140, "--seq-len", 4096, "--gbs", 64, "--top", 1,
                      "--format", fmt)
    assert untimed.stderr.endswith("; one row per layout, its least recomputation that fits\n")


def test_a_json_moe_sweep_where_nothing_fits_prints_the_count_then_why(advisor):
    result = advisor("sweep", *SMALL, "--mem", 60, "--format", "json", "--sharding", "fixed", expect=1)
    assert result.stdout == "[]\n"
    counted, why = result.stderr.splitlines()
    assert re.fullmatch(r"advisor sweep: [\d,]+ layouts x recomputation x VPP priced; .*", counted)
    assert why.startswith("advisor sweep: nothing fits: 0 fits, 0 likely fits, ")


@pytest.mark.parametrize("args", [("--model", "deepseek-v3", "--gpus", 64, "--gpu", "h100-80gb", "--seq-len", 4096,
                                   "--gbs", 1024),
                                  ("--model", "llama3.1-405b", "--gpus", 512, "--mem", 10, "--gbs", 2048)])
def test_the_nothing_fits_tally_groups_thousands_as_the_count_caption_does(advisor, args):
    # DeepSeek-V3's 671B parameters on 64 GPUs (an MoE sweep), Llama 3.1 405B on 512 GPUs of 10 GiB
    # (a dense one): every row oom, more than 999 of them; the tally said "2928 oom" where the table's
    # count caption (render.counted) writes "2,928 oom"
    result = advisor("sweep", *args, expect=1)
    oom = len(advisor.json("sweep", *args, "--all"))
    assert oom > 999
    assert re.search(rf"nothing fits: 0 fits, (0 likely fits, 0 likely oom|0 tight), {oom:,} oom; ", result.stderr)


# --- 5. MoE options on a dense model --------------------------------------------------------------------

MOE_ONLY = [("--ep", 2), ("--etp", 2), ("--moe-token-dispatcher-type", "alltoall"), ("--moe-routing", "balanced"),
            ("--moe-expert-capacity-factor", 1.25), ("--moe-pad-expert-input-to-capacity",),
            ("--no-moe-pad-expert-input-to-capacity",), ("--moe-imbalance", 1.0), ("--mtp-num-layers", 0),
            ("--overlap-moe-expert-parallel-comm",), ("--delay-wgrad-compute",), ("--moe-aux-loss-coeff", 0.001)]
"""Every MoE option, each at a value that a mixture of experts takes (the defaults among them:
given, they are still refused). --recompute-modules is a dense recomputation flag too; the modules
a dense model refuses (moe_act among them) are tests/test_dense_recompute_modules.py's."""


@pytest.mark.parametrize("command", [("estimate", "--tp", 2, "--gpus", 8, "--gpu", "h100-80gb"),
                                     ("sweep", "--gpus", 8, "--gpu", "h100-80gb")])
@pytest.mark.parametrize("option", MOE_ONLY, ids=[option[0] for option in MOE_ONLY])
def test_a_dense_model_refuses_each_moe_option_given(advisor, tmp_path, command, option):
    line = _error(advisor, tmp_path, *command, *option)
    assert line == f"Error: llama3.1-8b is dense; MoE options need a mixture-of-experts model: {option[0]}"


def test_a_dense_model_names_every_moe_option_given(advisor, tmp_path):
    line = _error(advisor, tmp_path, "estimate", "--tp", 2, "--gpus", 8, "--gpu", "h100-80gb", "--moe-routing",
                  "dropless", "--moe-token-dispatcher-type", "flex", "--moe-imbalance", 3)
    named = line.split(": ")[-1].split(", ")
    assert sorted(named) == ["--moe-imbalance", "--moe-routing", "--moe-token-dispatcher-type"]
    line = _error(advisor, tmp_path, "sweep", "--gpus", 8, "--gpu", "h100-80gb", "--moe-expert-capacity-factor",
                  1.25, "--no-moe-pad-expert-input-to-capacity")
    assert line.endswith(": --moe-expert-capacity-factor, --no-moe-pad-expert-input-to-capacity")


def test_a_dense_run_keeps_its_own_ep_and_etp_of_one_and_its_defaults(advisor):
    """EP 1 and ETP 1 are a dense run's own (its rows state them), so a row's layout fed back runs;
    the MoE options left at their defaults change nothing, as before."""
    row = advisor.json("sweep", "--gpus", 8, "--gpu", "h100-80gb", "--top", 1)[0]
    layout = [f"--{key}={row[key]}" for key in ("tp", "cp", "pp", "vpp", "ep", "etp", "mbs")]
    one = advisor.json("estimate", "--gpus", 8, "--gpu", "h100-80gb", *layout, "--recompute", row["recompute"])
    assert (one["ep"], one["etp"], one["total_gib"]) == (1, 1, row["total_gib"])
    plain = advisor.json("estimate", "--gpus", 8, "--gpu", "h100-80gb", "--tp", 2)
    assert plain["options"] == {}


def test_a_dense_megatron_command_is_read_with_megatrons_defaults(advisor):
    row = advisor.json("sweep", "--gpus", 8, "--mem", 80, "--top", 1)[0]
    result = advisor.runner.invoke(advisor.command, ["estimate", "--from-command", "-", "--gpus", "8", "--mem", "80",
                                                     "--vocab-size", "128256", "--format", "json"], input=" ".join(row["megatron_args"]))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["total_gib"] == pytest.approx(row["total_gib"])


def test_an_moe_model_takes_the_same_options_as_before(advisor):
    rows = advisor.json("sweep", *SMALL, "--mem", 140, "--moe-routing", "dropless", "--moe-token-dispatcher-type",
                        "alltoall", "--moe-imbalance", 1.0, "--top", 1)
    assert rows[0]["routing"] == "dropless" and rows[0]["dispatcher"] == "alltoall"
