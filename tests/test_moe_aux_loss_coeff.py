"""--moe-aux-loss-coeff on advisor estimate and sweep, and the line that says where balanced
routing is only an assumption.

Qwen3-Coder-480B-A35B's config.json says router_aux_loss_coef 0.0 and has no expert bias: its
rows launch ``--moe-router-load-balancing-type aux_loss`` without a weight, and megatron-core's
router then applies no balancing loss (core_v0.15.2 ``megatron/core/transformer/moe/router.py``,
``_apply_aux_loss``: ``if aux_loss_coeff == 0: return probs``), while the default routing priced,
balanced, gives every expert its balanced share. The option prices and launches the weight the
user will train with; the line says the balance is assumed where nothing trains it.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from advisor.cli.options import InputError
from advisor.models import load_model
from advisor.row_flags import flag_values

DATA = Path(__file__).resolve().parent / "data" / "moe"
CODER = str(DATA / "qwen3-coder-480b-a35b.json")
LAYOUT = ["--gpus", "256", "--gpu", "h100-80gb", "--tp", "1", "--pp", "16", "--ep", "8", "--seq-len", "4096",
          "--gbs", "1024"]
SWEEP = ["--gpus", "256", "--gpu", "h100-80gb", "--seq-len", "4096", "--gbs", "1024", "--top", "2"]
ASSUMED = "is an assumption: the model balances nothing (aux-loss coefficient 0, no expert bias)"



# --- the line ------------------------------------------------------------------------------------


def test_qwen3_coder_estimate_and_sweep_say_balanced_routing_is_assumed(advisor):
    """The table's caption says it, wrapped within 100 columns like the other notes; JSON says it
    on stderr, once, with the advisor's name."""
    line = ("routing balanced is an assumption: the model balances nothing (aux-loss coefficient 0, no expert "
            "bias), so Megatron's router trains unbalanced; give --moe-aux-loss-coeff (Qwen3's 0.001) or price "
            "--moe-routing dropless (the worst case)")
    for command, args in (("estimate", LAYOUT), ("sweep", SWEEP)):
        table = advisor.runner.invoke(advisor.command, [command, "--model", CODER, *args], env={"COLUMNS": "100"})
        assert table.exit_code == 0, table.output
        assert " ".join(table.stdout.split()).count(line) == 1
        assert table.stderr.count(ASSUMED) == 0  # the caption already says it on the terminal
        assert max(len(text) for text in table.stdout.splitlines()) <= 100
        machine = advisor(command, "--model", CODER, *args, "--format", "json")
        assert machine.stderr.count(f"advisor {command}: {line}") == 1
        assert ASSUMED not in machine.stdout


@pytest.mark.parametrize("model, extra", [
    ("qwen3-30b-a3b", ()),                              # router_aux_loss_coef 0.001 (the preset, its config.json)
    (str(DATA / "qwen3-30b-a3b.json"), ()),
    (CODER, ("--moe-routing", "dropless")),             # the worst case: whatever the router does
    (CODER, ("--moe-aux-loss-coeff", "0.001")),         # the balancing trained
    (CODER, ("--moe-expert-capacity-factor", "1.0")),   # padded to capacity: every expert runs its capacity
    ("deepseek-v3", ()),                                # the expert bias balances
])
def test_no_line_where_the_router_is_trained_to_balance_or_the_price_does_not_assume_it(advisor, model, extra):
    for fmt in ("table", "json"):
        result = advisor("estimate", "--model", model, *LAYOUT, *extra, "--format", fmt)
        assert ASSUMED not in result.output


def test_capacity_routing_not_padded_and_a_weight_of_0_given_have_the_line(advisor):
    """Capacity routing not padded prices the busiest expert's min(imbalance, factor) share, an
    assumption too; a weight of 0 given turns Qwen3-30B-A3B's balancing off."""
    unpadded = advisor("estimate", "--model", CODER, *LAYOUT, "--moe-expert-capacity-factor", "1.0",
                       "--no-moe-pad-expert-input-to-capacity", "--format", "json")
    assert f"advisor estimate: routing capacity {ASSUMED}" in unpadded.stderr
    off = advisor("estimate", "--model", "qwen3-30b-a3b", *LAYOUT, "--moe-aux-loss-coeff", "0", "--format", "json")
    assert f"advisor estimate: routing balanced {ASSUMED}" in off.stderr
    assert "--moe-aux-loss-coeff" not in json.loads(off.stdout)["megatron_args"]  # Megatron's default, 0


def test_a_command_read_back_is_told_to_carry_the_weight_unless_it_forces_balance(advisor, tmp_path):
    """--from-command: the command gives its weight (the advisor's option is refused beside it), so
    the line says to add it there; --moe-router-force-load-balancing balances the routing itself
    (random logits, router.py), and the line is not said."""
    row = advisor.json("estimate", "--model", CODER, *LAYOUT)
    command = tmp_path / "train.sh"
    command.write_text(" ".join(row["megatron_args"]))
    read = ["estimate", "--from-command", command, "--gpus", "256", "--gpu", "h100-80gb", "--vocab-size", "151936"]
    result = advisor(*read, "--format", "json")
    assert (f"advisor estimate: routing balanced {ASSUMED}, so Megatron's router trains unbalanced; add "
            "--moe-aux-loss-coeff to the command (Qwen3's 0.001)") in result.stderr
    command.write_text(" ".join(row["megatron_args"]) + " --moe-router-force-load-balancing")
    assert ASSUMED not in advisor(*read, "--format", "json").stderr
    assert advisor.error(*read, "--moe-aux-loss-coeff", "0.001") == (
        "Error: --moe-aux-loss-coeff comes from the command with --from-command (edit the command instead)")


def test_a_command_of_type_none_is_told_to_add_an_aux_loss_type_not_a_weight_alone(advisor, tmp_path):
    """A command with --moe-router-load-balancing-type none and no expert bias balances nothing, and
    a weight alone would change nothing: megatron-core's router reads --moe-aux-loss-coeff only for
    aux_loss, seq_aux_loss and global_aux_loss (core_v0.15.2 router.py, get_aux_loss_coeff: 0.0 for
    any other type). The line names the type, whatever weight the command gives, and asks for an
    aux-loss type with its weight."""
    row = advisor.json("estimate", "--model", CODER, *LAYOUT)
    args = list(row["megatron_args"])
    args[args.index("--moe-router-load-balancing-type") + 1] = "none"
    command = tmp_path / "train.sh"
    read = ["estimate", "--from-command", command, "--gpus", "256", "--gpu", "h100-80gb", "--vocab-size", "151936",
            "--format", "json"]
    for weight in ([], ["--moe-aux-loss-coeff", "0.01"]):
        command.write_text(" ".join([*args, *weight]))
        stderr = advisor(*read).stderr
        assert ("advisor estimate: routing balanced is an assumption: the model balances nothing (load-balancing "
                "type none, no expert bias), so Megatron's router trains unbalanced; add "
                "--moe-router-load-balancing-type aux_loss and --moe-aux-loss-coeff to the command or price "
                "--moe-routing dropless (the worst case)") in stderr, stderr
        assert "aux-loss coefficient 0" not in stderr


# --- the option: flags, memory, refusals ------------------------------------------------------------


def test_the_weight_is_launched_and_priced_as_the_balancing_losss_fp32_scores(advisor):
    """advisor.moe.memory.aux_loss_saved_bytes: with a weight above 0 the router computes the
    balancing loss's scores, softmax's FP32 output over all E experts, 4E bytes per token and MoE
    layer (moe_utils.compute_routing_scores_for_aux_loss). Qwen3-Coder: E = 160, so 640 bytes; at
    TP 1, CP 1, MBS 1, sequence 4096, N = 4096 tokens per microbatch; 1F1B, stage i of 16 holds
    16 - i microbatches. Stage 1 (4 MoE layers, 15 in flight): 4 x 15 x 4096 x 640 =
    157,286,400 bytes = 0.146484375 GiB more; the last stage (3 layers, 1 in flight):
    3 x 1 x 4096 x 640 = 7,864,320 bytes."""
    without = advisor.json("estimate", "--model", CODER, *LAYOUT)
    weighted = advisor.json("estimate", "--model", CODER, *LAYOUT, "--moe-aux-loss-coeff", "0.001")
    assert flag_values(without["megatron_args"])["--moe-router-load-balancing-type"] == ("aux_loss",)
    assert "--moe-aux-loss-coeff" not in without["megatron_args"]
    assert flag_values(weighted["megatron_args"])["--moe-router-load-balancing-type"] == ("aux_loss",)
    assert flag_values(weighted["megatron_args"])["--moe-aux-loss-coeff"] == ("0.001",)
    assert weighted["model"]["aux_loss_coeff"] == 0.001 and without["model"]["aux_loss_coeff"] == 0.0
    scores = 4 * 160 * 4096  # bytes per layer and microbatch in flight
    assert scores == 2_621_440
    gib = 2 ** 30
    for before, after in zip(without["stages"], weighted["stages"]):
        layers, in_flight = after["layers"], after["in_flight_microbatches"]
        assert after["activations_gib"] - before["activations_gib"] == pytest.approx(layers * in_flight * scores / gib,
                                                                                     rel=1e-9)
        assert after["model_states_gib"] == before["model_states_gib"]
    stage1 = weighted["stages"][1]["activations_gib"] - without["stages"][1]["activations_gib"]
    assert stage1 == pytest.approx(157_286_400 / gib) == pytest.approx(0.146484375)
    last = weighted["stages"][15]["activations_gib"] - without["stages"][15]["activations_gib"]
    assert last == pytest.approx(7_864_320 / gib)


def test_sweep_rows_carry_the_weight(advisor):
    rows = advisor.json("sweep", "--model", CODER, *SWEEP, "--moe-aux-loss-coeff", "0.01")
    assert rows and all(flag_values(row["megatron_args"])["--moe-aux-loss-coeff"] == ("0.01",) for row in rows)
    assert all(row["model"]["aux_loss_coeff"] == 0.01 for row in rows)


def test_refusals_are_one_line(advisor):
    # a dense model (also in test_moe_cli_audit's MOE_ONLY, for estimate and sweep)
    assert advisor.error("sweep", "--gpus", "8", "--gpu", "h100-80gb", "--moe-aux-loss-coeff", "0.001") == (
        "Error: llama3.1-8b is dense; MoE options need a mixture-of-experts model: --moe-aux-loss-coeff")
    # a router of type none (the expert bias alone: a DeepSeek config.json with aux_loss_alpha 0,
    # test_deepseek_balance_loss) takes no weight: it would be launched and ignored
    # Megatron's spelling, several values after one flag (nargs='+'): one type, one weight
    assert advisor.error("estimate", "--model", "qwen3-30b-a3b", *LAYOUT, "--moe-aux-loss-coeff", "0.001",
                         "0.01") == (
        "Error: --moe-aux-loss-coeff gives 2 weights for qwen3-30b-a3b's 1 load-balancing type (aux_loss): "
        "megatron-core takes one weight per type, in order")
    assert "must be at least 0, got -1" in advisor.error("estimate", "--model", CODER, *LAYOUT,
                                                         "--moe-aux-loss-coeff", "-1")
    assert "'a' is not a number" in advisor.error("estimate", "--model", CODER, *LAYOUT, "--moe-aux-loss-coeff", "a")


def test_several_balancing_types_take_one_weight_each_in_order():
    """A spec with two balancing types (a command's --moe-router-load-balancing-type aux_loss
    seq_aux_loss, carried by a saved row's model): the weights replace its own one for one, and are
    launched as Megatron's nargs='+' lists them; one weight for two types is refused, as
    megatron-core's transformer_config.py refuses it (which type it weighs would be a guess); a
    router without an aux-loss type (Sinkhorn, which asserts a weight of 0) takes none."""
    from advisor.cli.moe_balancing import with_aux_loss_coeff
    from advisor.moe.flags import model_flags
    from advisor.moe.memory import aux_loss_enabled, router_balanced

    two = replace(load_model("qwen3-30b-a3b"), load_balancing=("aux_loss", "seq_aux_loss"), aux_loss_coeff=(0.0, 0.0))
    assert not aux_loss_enabled(two) and not router_balanced(two)
    weighted = with_aux_loss_coeff(two, (0.001, 0.0001))
    assert weighted.aux_loss_coeff == (0.001, 0.0001) and router_balanced(weighted)
    args = model_flags(weighted)
    assert flag_values(args)["--moe-router-load-balancing-type"] == ("aux_loss", "seq_aux_loss")
    assert flag_values(args)["--moe-aux-loss-coeff"] == ("0.001", "0.0001")
    with pytest.raises(InputError, match=r"gives 1 weight for qwen3-30b-a3b's 2 load-balancing types "
                                         r"\(aux_loss, seq_aux_loss\): megatron-core takes one weight per type"):
        with_aux_loss_coeff(two, (0.001,))
    sinkhorn = replace(load_model("qwen3-30b-a3b"), load_balancing=("sinkhorn",), aux_loss_coeff=0.0)
    assert router_balanced(sinkhorn)  # Sinkhorn balances the routing itself: no line
    with pytest.raises(InputError, match="balances with load-balancing type sinkhorn, which takes no weight"):
        with_aux_loss_coeff(sinkhorn, (0.001,))


# --- a saved row: read back and launched as priced ------------------------------------------------


def test_a_saved_row_reads_back_and_launches_its_weight(advisor, tmp_path):
    """What is launched is what was priced: the row's 'model' carries the weight, the launcher's
    arguments write it, and the row re-read prices the same stages."""
    from launch.inputs import read_input
    from launch_support import launcher

    from advisor.saved_row import row_spec

    path = tmp_path / "row.json"
    advisor("estimate", "--model", CODER, *LAYOUT, "--moe-aux-loss-coeff", "0.001", "--format", "json", "-o", path)
    row = json.loads(path.read_text())
    assert row_spec(row).aux_loss_coeff == 0.001
    assert flag_values(read_input(path).megatron_args)["--moe-aux-loss-coeff"] == ("0.001",)
    args = json.loads(launcher()("args", "--from", path, "--format", "json").stdout)
    assert flag_values(args)["--moe-aux-loss-coeff"] == ("0.001",)
    assert flag_values(args)["--moe-router-load-balancing-type"] == ("aux_loss",)


def test_a_saved_rows_weights_of_the_wrong_count_are_one_line(advisor, tmp_path):
    """A row's model with one balancing type holds its weight as a number; a list there, even of
    one weight, was refused as 'needs one weight per load-balancing type (1), got 1'. Each wrong
    count is one line, exit 2, from advisor-launch (``MoESpec._check_balancing``)."""
    from launch_support import launcher

    path = tmp_path / "row.json"
    advisor("estimate", "--model", CODER, *LAYOUT, "--moe-aux-loss-coeff", "0.001", "--format", "json", "-o", path)
    row = json.loads(path.read_text())
    one = "aux_loss_coeff must be one number for one load-balancing type, got a list of"
    for weights, message in (([0.001], f"{one} 1"), ([], f"{one} 0"), ([0.001, 0.01], f"{one} 2")):
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps({**row, "model": {**row["model"], "aux_loss_coeff": weights}}))
        line = launcher().error("args", "--from", bad)
        assert message in line, line
    two = {**row["model"], "load_balancing": ["aux_loss", "seq_aux_loss"], "aux_loss_coeff": 0.001}
    bad.write_text(json.dumps({**row, "model": two}))
    line = launcher().error("args", "--from", bad)
    assert "aux_loss_coeff needs one weight per load-balancing type (2), got 1" in line, line


@pytest.mark.xdist_group("megatron-validator")
def test_the_weighted_rows_pass_megatrons_parser_with_their_weight(tmp_path):
    """Qwen3-Coder's top sweep rows with --moe-aux-loss-coeff 0.001, launched as advisor-launch
    writes them, pass core_v0.15.2's parse_args + validate_args (launch.megatron_check) and build
    the TransformerConfig priced, its moe_aux_loss_coeff 0.001 with type aux_loss."""
    from megatron_real import NO_TRANSFORMER_ENGINE, checkout, validate
    from test_moe_megatron import _expected, _one, _rows

    from advisor.moe.spec import spec_from_dict

    release = checkout("core_v0.15.2")
    rows = _rows(CODER, 256, "--top", "2", "--moe-aux-loss-coeff", "0.001")
    assert len(rows) == 2
    cases = [{"args": [*row["megatron_args"], *NO_TRANSFORMER_ENGINE, "--mock-data", "--tokenizer-type",
                       "NullTokenizer", "--vocab-size", str(load_model(CODER).vocab_size), "--train-iters", "10"],
              "world_size": row["gpus"], "env": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}} for row in rows]
    results = validate(release, cases)
    assert all(result["ok"] for result in results), [result.get("error") for result in results]
    for row, result in zip(rows, results):
        derived = result["derived"]
        assert _one("moe_aux_loss_coeff", derived["moe_aux_loss_coeff"]) == 0.001
        assert _one("moe_router_load_balancing_type", derived["moe_router_load_balancing_type"]) == "aux_loss"
        expected = _expected(spec_from_dict(row["model"]), row)
        wrong = {key: (derived.get(key), value) for key, value in expected.items() if _one(key, derived.get(key)) != value}
        assert not wrong


# --- advisor-launch says it too ----------------------------------------------------------------


LAUNCHED = ("routing balanced is an assumption: the model balances nothing (aux-loss coefficient 0, no expert bias), "
            "so Megatron's router trains unbalanced; launch a row priced with --moe-aux-loss-coeff (Qwen3's 0.001), "
            "or one priced with --moe-routing dropless (the worst case)")
QWEN30_8 = ["--model", "qwen3-30b-a3b", "--gpus", "8", "--gpu", "h100-80gb", "--pp", "2", "--ep", "4", "--seq-len",
            "4096", "--gbs", "64"]


def test_advisor_launch_says_a_row_trains_with_no_balancing_loss(advisor, tmp_path):
    """A row priced with balanced routing for a router that balances nothing (Qwen3-Coder's
    config.json, and Qwen3-30B-A3B with its weight set to 0) launches no balancing loss (its
    --moe-aux-loss-coeff is Megatron's default, 0: router.py returns the probabilities untouched):
    every advisor-launch command says so once on stderr, as the sweep and estimate that priced it
    did, with a remedy a launch can take (the weight is the input's: one after -- is refused as a
    conflict, below)."""
    from launch_support import launcher, write_json

    coder = tmp_path / "coder.json"
    advisor("estimate", "--model", CODER, *LAYOUT, "--format", "json", "-o", coder)
    sweep = tmp_path / "sweep.json"
    advisor("sweep", "--model", CODER, *SWEEP, "--format", "json", "-o", sweep)
    row = write_json(tmp_path / "row.json", json.loads(sweep.read_text())[0])  # one sweep row saved on its own
    for path, source in ((coder, f"the estimate ({coder})"), (sweep, f"the sweep row (rank 1 of {sweep})"),
                         (row, f"the sweep row ({row})")):
        result = launcher()("args", "--from", path)
        assert result.stderr.count(f"advisor-launch: {source}: {LAUNCHED}") == 1, result.stderr
        assert LAUNCHED not in result.stdout and "--moe-aux-loss-coeff" not in result.stdout
    small = tmp_path / "qwen30.json"
    advisor("estimate", *QWEN30_8, "--moe-aux-loss-coeff", "0", "--format", "json", "-o", small)
    dry = launcher()("torchrun", "--from", small, "--dry-run", "--", "--mock-data", "--train-iters", "5")
    assert dry.stderr.count(f"advisor-launch: the estimate ({small}): {LAUNCHED}") == 1, dry.stderr
    assert "torchrun" in dry.stdout and "--moe-aux-loss-coeff" not in dry.stdout
    # the remedy a launch cannot take: the weight after --, a conflict with the row's balancing
    assert launcher().error("args", "--from", small, "--", "--moe-aux-loss-coeff", "0.001") == (
        "Error: --moe-aux-loss-coeff 0.001 (after --) conflicts with --moe-router-load-balancing-type aux_loss from "
        f"the estimate ({small}) (the input decides these; change the input instead)")


def test_advisor_launch_is_silent_where_the_launch_balances(advisor, tmp_path):
    """No line where the row trains a weight, where its price is dropless (the worst case, whatever
    the router does), where its capacity is padded, for Qwen3-30B-A3B's own weight (0.001), or
    where --moe-router-force-load-balancing after -- balances the routing itself (router.py)."""
    from launch_support import launcher

    cases = {"weighted": [CODER, *LAYOUT, "--moe-aux-loss-coeff", "0.001"],
             "dropless": [CODER, *LAYOUT, "--moe-routing", "dropless"],
             "padded": [CODER, *LAYOUT, "--moe-expert-capacity-factor", "1.0"],
             "own": [*QWEN30_8[1:]]}
    for name, args in cases.items():
        path = tmp_path / f"{name}.json"
        advisor("estimate", "--model", *args, "--format", "json", "-o", path)
        result = launcher()("args", "--from", path)
        assert "is an assumption" not in result.stderr, (name, result.stderr)
    unbalanced = tmp_path / "qwen30.json"
    advisor("estimate", *QWEN30_8, "--moe-aux-loss-coeff", "0", "--format", "json", "-o", unbalanced)
    assert "is an assumption" in launcher()("args", "--from", unbalanced).stderr
    forced = launcher()("args", "--from", unbalanced, "--", "--moe-router-force-load-balancing")
    assert "is an assumption" not in forced.stderr
    assert "--moe-router-force-load-balancing" in forced.stdout


def test_advisor_launch_of_an_unpadded_capacity_row_and_of_a_command_read_back(advisor, tmp_path):
    """Capacity routing not padded prices the busiest expert's min(imbalance, factor) share, an
    assumption too; an estimate read from a command (--from-command) is told to add the weight to
    the command and launch its estimate."""
    from launch_support import launcher

    unpadded = tmp_path / "unpadded.json"
    advisor("estimate", "--model", CODER, *LAYOUT, "--moe-expert-capacity-factor", "1.0",
            "--no-moe-pad-expert-input-to-capacity", "--format", "json", "-o", unpadded)
    assert (f"advisor-launch: the estimate ({unpadded}): routing capacity {ASSUMED}, so Megatron's router trains "
            "unbalanced; launch a row priced with --moe-aux-loss-coeff") in launcher()("args", "--from", unpadded).stderr
    row = advisor.json("estimate", "--model", CODER, *LAYOUT)
    command = tmp_path / "train.sh"
    command.write_text(" ".join(row["megatron_args"]))
    read = tmp_path / "read.json"
    advisor("estimate", "--from-command", command, "--gpus", "256", "--gpu", "h100-80gb", "--vocab-size", "151936",
            "--format", "json", "-o", read)
    stderr = launcher()("args", "--from", read).stderr
    assert (f"advisor-launch: the estimate ({read}): routing balanced {ASSUMED}, so Megatron's router trains "
            "unbalanced; launch an estimate of the command with --moe-aux-loss-coeff added (Qwen3's 0.001), or one "
            "priced with --moe-routing dropless (the worst case)") in stderr, stderr
