"""--sharding auto on MoE sweeps: the dense sweep's ladder (advisor.escalation.LADDER, climbed by
``advisor.escalation.climb``) over the rungs the MoE model prices (``advisor.cli.moe.rung_problem``,
the checks ``moe_settings`` refuses a command with), the rows carrying the lever; --sharding fixed
and a release that prices no rung keep the nothing-fits line, which says what was tried.

The case: Mixtral 8x7B on 64 H100s at 40 GiB, pinned to PP 1, EP 8, ETP 1 (the experts' states
sharded over an expert-DP group of 64 / (8 x 1) = 8 GPUs). Per GPU, with 45.1B routed-expert
parameters (32 layers x 8 experts x 3 x 4096 x 14336) over EP 8: 5.64B, whose BF16 weights and
FP32 gradients alone (6 bytes) are 31.5 GiB, and Adam's 12 bytes over the expert DP group of 8 add
7.9 GiB: 39.4 GiB of expert states under DDP, more than 40 GiB with the dense part, whatever the
layout. Megatron-FSDP optim_grads shards the gradients too: 2 + (4 + 12) / 8 = 4 bytes, 21.0 GiB,
room for the activations and the FSDP buffers.
"""

from __future__ import annotations

import json

import pytest

from advisor.escalation import LADDER, climb
from advisor.errors import AdvisorError
from advisor.options import TrainingOptions

GIB = 2**30
CASE = ("--model", "mixtral-8x7b", "--gpus", 64, "--gpu", "h100-80gb", "--mem", 40, "--seq-len", 4096, "--gbs", 256,
        "--pp", 1, "--ep", 8, "--etp", 1)
OPTIM_GRADS = LADDER[0][0]
NOTE = (f"advisor sweep: nothing fits with the options given; the rows use {OPTIM_GRADS}: their options and "
        "megatron_args say so; lever_time_cost_s is its step-time cost")


def test_the_case_by_hand_its_expert_states_under_ddp(advisor):
    """The module docstring's arithmetic against the estimate of one of the case's layouts (TP 2,
    DP 32): its experts' states under DDP are the hand count, and with the dense part its states
    alone exceed 40 GiB; optim_grads leaves the weights and Adam's states, and shrinks the gradients."""
    experts = 32 * 8 * 3 * 4096 * 14336 / 8  # routed-expert parameters on one GPU (EP 8)
    layout = ("estimate", *CASE[:-6], "--tp", 2, "--pp", 1, "--ep", 8, "--etp", 1, "--mbs", 2, "--recompute", "full")
    ddp = advisor.json(*layout)["stages"][0]
    assert ddp["expert_states_gib"] == pytest.approx(experts * (2 + 4 + 12 / 8) / GIB, rel=1e-4)  # 39.4
    assert ddp["model_states_gib"] > 40
    fsdp = advisor.json(*layout, "--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads")["stages"][0]
    assert (fsdp["weights_gib"], fsdp["optimizer_gib"]) == (ddp["weights_gib"], ddp["optimizer_gib"])
    assert fsdp["gradients_gib"] < ddp["gradients_gib"] - 15  # 5.64B x 4 B x 7/8 = 18.4 GiB sharded, less its queue


def _fixed_line(rows: list[dict], mem: float) -> str:
    """Today's nothing-fits line of the case's sweep, from its --all rows: the tally, the layout
    that needs the least calibrated usage, what its states need (every layout's exceed the memory)."""
    kinds = ("fits", "likely fits", "likely oom", "oom")
    tally = ", ".join(f"{sum(row['verdict'] == kind for row in rows)} {kind}" for kind in kinds)
    least = min(rows, key=lambda row: row["usage_gib"])
    return (f"advisor sweep: nothing fits: {tally}; the least any layout needs is {least['usage_gib']:.1f} GiB per "
            f"GPU against {mem:g} GiB (TP {least['tp']}, CP {least['cp']}, PP {least['pp']}, EP {least['ep']}, ETP "
            f"{least['etp']}, MBS {least['mbs']}), and its weights, gradients and optimizer states alone need "
            f"{least['model_states_gib']:.1f} GiB (more than {mem:g} GiB in every layout, whatever the --seq-len)")


def test_nothing_fits_under_ddp_and_the_rows_use_optim_grads_with_its_note_and_cost(advisor):
    result = advisor("sweep", *CASE, "--format", "json")
    rows = json.loads(result.stdout)
    assert NOTE in result.stderr.splitlines()
    plain = advisor.json("sweep", *CASE, "--sharding", "fixed", "--all")
    assert plain and not any(row["rank"] for row in plain)  # DDP: nothing expected to run
    steps = {(r["tp"], r["cp"], r["pp"], r["ep"], r["etp"], r["dp"], r["mbs"]): r["step_time_s"] for r in plain}
    assert rows and all(row["rank"] for row in rows)
    for row in rows:
        assert row["options"]["fsdp_strategy"] == "optim_grads"
        args = " ".join(row["megatron_args"])
        assert "--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads " in args + " "
        assert "--use-distributed-optimizer" in row["megatron_args"]
        # the lever's cost: the row's step against the same layout's without it
        layout = (row["tp"], row["cp"], row["pp"], row["ep"], row["etp"], row["dp"], row["mbs"])
        assert row["lever_time_cost_s"] == pytest.approx(row["step_time_s"] - steps[layout], rel=1e-12)
    table = advisor("sweep", *CASE, "--top", 3).stdout
    assert "; the rows use Megatron-FSDP optim_grads, as nothing fits without it;" in " ".join(table.split("\n")[:3])


def test_without_a_time_model_the_rows_have_no_cost_and_the_note_names_none(advisor):
    args = [arg for arg in CASE if arg not in ("--gpu", "h100-80gb")]
    result = advisor("sweep", *args, "--format", "json")
    rows = json.loads(result.stdout)
    assert NOTE.removesuffix("; lever_time_cost_s is its step-time cost") in result.stderr.splitlines()
    assert rows and all("lever_time_cost_s" not in row and row["options"]["fsdp_strategy"] == "optim_grads"
                        for row in rows)


def test_sharding_fixed_keeps_the_exit_1_and_the_line(advisor):
    rows = advisor.json("sweep", *CASE, "--sharding", "fixed", "--all")
    result = advisor("sweep", *CASE, "--sharding", "fixed", expect=1)
    assert result.stdout == ""
    tries = ". Try more GPUs, no --pp/--ep/--etp or a GPU with more memory (--all shows the rows)"
    assert result.stderr.strip() == _fixed_line(rows, 40) + tries


@pytest.mark.parametrize("extra, reason", [
    (("--megatron-version", "0.15"), "Megatron-LM core 0.15's Megatron-FSDP cannot wrap an MoE model's expert-parallel "
                                     "parameters"),
    (("--overlap-moe-expert-parallel-comm",), "--overlap-moe-expert-parallel-comm with --use-megatron-fsdp is not "
                                              "priced"),
], ids=["core-0.15", "ep-overlap"])
def test_a_rung_the_moe_model_refuses_is_not_climbed_and_the_line_says_why(advisor, extra, reason):
    """The Megatron-FSDP rungs refused as the CLI refuses --use-megatron-fsdp with these options
    (exit 2 there): the sweep ends where --sharding fixed does, its line naming the refusal."""
    refused = advisor.error("sweep", *CASE, *extra, "--use-megatron-fsdp")
    assert reason in refused
    fixed = advisor("sweep", *CASE, *extra, "--sharding", "fixed", expect=1).stderr.strip()
    line = advisor("sweep", *CASE, *extra, expect=1).stderr.strip()
    head, _, tries = fixed.partition(". Try ")
    ladder = ("; --sharding auto tried optimizer CPU offload: no layout fits with it either; it did not try "
              f"Megatron-FSDP optim_grads or optim_grads_params: {reason}")
    assert line == head + ladder + ". Try " + tries
    # the rung it did climb, swept as a user would give it: nothing fits there either
    advisor("sweep", *CASE, *extra, "--optimizer-cpu-offload", "--sharding", "fixed", expect=1)


def test_rungs_swept_in_vain_are_passed_and_the_ladder_stops_at_offload(advisor):
    """Mixtral on 8 H100s: the expert DP group is one GPU at every layout (EP x ETP x PP = 8), so
    FSDP shards no expert state and adds its buffers: both FSDP rungs fit nothing, and the ladder
    goes on to optimizer CPU offload (priced for MoE models since), where layouts run. Each claim
    swept as a user would give it."""
    args = ("--model", "mixtral-8x7b", "--gpus", 8, "--gpu", "h100-80gb", "--seq-len", 4096, "--gbs", 256)
    result = advisor("sweep", *args, "--format", "json")
    assert "the rows use optimizer CPU offload (optimizer states in host memory)" in result.stderr
    rows = json.loads(result.stdout)
    assert rows and all(row["options"]["optimizer_cpu_offload"] for row in rows)
    advisor("sweep", *args, "--sharding", "fixed", expect=1)
    for strategy in ("optim_grads", "optim_grads_params"):
        advisor("sweep", *args, "--use-megatron-fsdp", "--data-parallel-sharding-strategy", strategy, expect=1)
    given = json.loads(advisor("sweep", *args, "--optimizer-cpu-offload", "--format", "json").stdout)
    assert [row["tflops_per_gpu"] for row in given] == [row["tflops_per_gpu"] for row in rows]
    # a lever given: the user chose the sharding, and the line names no rung
    given = advisor("sweep", *args, "--use-megatron-fsdp", expect=1).stderr
    assert "--sharding auto" not in given


def test_climb_skips_refused_rungs_and_stops_at_the_first_that_runs():
    swept = []

    def run(options: TrainingOptions):
        swept.append(options.data_parallel.fsdp_strategy)
        if options.data_parallel.fsdp_strategy == "optim_grads_params":
            raise AdvisorError("no layout")
        return options.offload.optimizer_cpu_offload  # only the offload runs

    def problem(options: TrainingOptions):
        return "refused" if options.data_parallel.fsdp_strategy == "optim_grads" else None

    found, attempts = climb(run, bool, TrainingOptions(), problem=problem)
    assert found == (LADDER[2][0], True) and swept == ["optim_grads_params", None]
    assert attempts == ((LADDER[0][0], "refused"), (LADDER[1][0], "no layout"))
    assert climb(run, bool, TrainingOptions().with_(fsdp_strategy="optim")) == (None, ())  # a lever given


def test_the_moe_rungs_follow_what_the_moe_model_prices(monkeypatch):
    """rung_problem reads the CLI's own refusals: optimizer CPU offload, priced for MoE models since
    it left ``_levers_not_priced``, is climbed; were it refused again, its rung would be passed with
    the refusal's words, with no change to the ladder."""
    from advisor.cli import moe

    offload = TrainingOptions().with_(**LADDER[2][1])
    fsdp = TrainingOptions().with_(**LADDER[0][1])
    assert moe.rung_problem(offload, False, None) is None and moe.rung_problem(fsdp, False, None) is None
    monkeypatch.setattr(moe, "_levers_not_priced", lambda training: {"--optimizer-cpu-offload": True})
    assert moe.rung_problem(offload, False, None) == "the MoE model does not price --optimizer-cpu-offload"


@pytest.mark.xdist_group("megatron-validator")
def test_megatron_accepts_the_escalated_rows():
    """The rows' flags through core_v0.19.0's real parse_args + validate_args: accepted, with the
    Megatron-FSDP optim_grads they were priced with."""
    from click.testing import CliRunner

    from advisor.cli import cli
    from advisor.models import load_model
    from megatron_real import checkout, mock_data_case, validate

    tag = "core_v0.19.0"
    release = checkout(tag)  # skips without it
    result = CliRunner().invoke(cli, ["sweep", *map(str, CASE), "--top", "3", "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    cases = [mock_data_case(row, tag, load_model("mixtral-8x7b").vocab_size) for row in rows]
    results = validate(release, cases)
    assert [result.get("error") for result in results] == [None] * len(rows)
    for row, result in zip(rows, results):
        derived = result["derived"]
        assert (derived["use_megatron_fsdp"], derived["data_parallel_sharding_strategy"]) == (True, "optim_grads")
        assert derived["expert_model_parallel_size"] == 8


def test_offload_is_not_climbed_on_a_gpu_without_host_memory_rates(advisor):
    """h800-80gb gives a host link (63 GB/s) but no host memory bandwidth (gpus.json), and
    levers.host_link needs both: climb passes the offload rung on the preset's data, with its own
    short reason, as the CLI refuses --optimizer-cpu-offload there (exit 2, one line). Mixtral on 8
    H800s: both FSDP rungs skipped by the bound (advisor.moe.space.may_fit: the expert DP group is
    one GPU, as on 8 H100s above, and FSDP's buffers come on top), each then given by hand in vain."""
    args = ("--model", "mixtral-8x7b", "--gpus", 8, "--gpu", "h800-80gb", "--seq-len", 4096, "--gbs", 256)
    line = advisor("sweep", *args, expect=1).stderr.strip()
    assert ("; --sharding auto did not try Megatron-FSDP optim_grads or optim_grads_params: no layout can fit with "
            "it; it did not try optimizer CPU offload: h800-80gb has no host link or host memory bandwidth to "
            "time it (gpus.json). Try ") in line
    for strategy in ("optim_grads", "optim_grads_params"):
        advisor("sweep", *args, "--use-megatron-fsdp", "--data-parallel-sharding-strategy", strategy, expect=1)
    assert "gpus.json gives no host link" in advisor.error("sweep", *args, "--optimizer-cpu-offload")
