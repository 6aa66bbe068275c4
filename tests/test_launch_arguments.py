"""The launch's Megatron-LM command line: the user's arguments pass through, conflicts are named."""

import pytest
from launch_support import FLAGS

from advisor.errors import AdvisorError
from advisor.megatron_args import megatron_args
from advisor.options import TrainingOptions
from advisor.models import PRESETS
from launch.arguments import Flag, compose, flag_values, mock_data_args, parse_flags
from launch.megatron_versions import VERSIONS, named

SPEC = PRESETS["llama3.1-8b"]
SOURCE = "the plan (plan.json)"
OLD, NEW = VERSIONS  # core 0.15 and core 0.19


def plan_args(layers=(8, 8, 8, 8), tp=2, options=TrainingOptions()):
    return megatron_args(SPEC, 8192, tp=tp, cp=1, layers_per_stage=layers, micro_batch_size=2,
                         global_batch_size=256, options=options)


def conflict(extras, *, decided=None, mock_data=None) -> str:
    with pytest.raises(AdvisorError) as error:
        compose(SOURCE, plan_args() if decided is None else decided, rules=OLD, model=SPEC, mock_data=mock_data is not None, extras=extras)
    return str(error.value)


def test_parse_flags():
    assert parse_flags(["--lr", "3e-4", "--bf16", "--data-path", "0.3", "a", "0.7", "b", "--adam-eps=-1e-8"]) == [
        Flag("--lr", ("3e-4",)), Flag("--bf16", ()), Flag("--data-path", ("0.3", "a", "0.7", "b")),
        Flag("--adam-eps", ("-1e-8",))]
    assert flag_values(["--seed", "1", "--seed", "2"]) == {"--seed": ("2",)}  # argparse keeps the last


def test_the_users_arguments_pass_through_unchanged():
    extras = ["--train-iters", "100", "--lr=3e-4", "--data-path", "0.5", "a b", "0.5", "c", "--log-interval", "1"]
    line = compose(SOURCE, plan_args(), rules=OLD, model=SPEC, extras=extras)
    assert line.args == plan_args() + extras
    assert [label for label, _ in line.groups] == [SOURCE, "yours (after --)"]


def test_restating_the_plan_is_no_conflict():
    # a float flag's value compares as a number (the plan's --norm-epsilon 1e-05, --attention-dropout 0)
    same = ["--tensor-model-parallel-size", "2", "--micro-batch-size=2", "--global-batch-size", "256", "--bf16",
            "--sequence-parallel", "--attention-backend", "flash", "--use-flash-attn", "--norm-epsilon", "0.00001",
            "--attention-dropout", "0.0"]
    assert compose(SOURCE, plan_args(), rules=OLD, model=SPEC, extras=same).args[-len(same):] == same
    # an int flag's '256.0' equals 256 as a number, but argparse's int('256.0') refuses it
    assert "--global-batch-size (after --) takes an int, got '256.0'" in conflict(["--global-batch-size", "256.0"])


@pytest.mark.parametrize("extras,named", [
    # the same flag with another value: both values named
    (["--micro-batch-size", "4"], "--micro-batch-size 4 (after --) conflicts with --micro-batch-size 2 from the plan"),
    (["--tensor-model-parallel-size=4"], "--tensor-model-parallel-size 4 (after --) conflicts with "
                                         "--tensor-model-parallel-size 2"),
    (["--num-layers", "30"], "--num-layers 30 (after --) conflicts with --num-layers 32"),
    (["--seq-length", "4096"], "--seq-length 4096 (after --) conflicts with --seq-length 8192"),
    (["--global-batch-size", "512"], "--global-batch-size 512 (after --) conflicts with --global-batch-size 256"),
    # a flag that changes what the plan decided by leaving it unset: the plan's own flags named
    (["--fp16"], "--fp16 (after --) conflicts with --bf16 from the plan"),
    (["--grad-reduce-in-bf16"], "--grad-reduce-in-bf16 (after --) conflicts with --accumulate-allreduce-grads-in-fp32"),
    (["--decoder-first-pipeline-num-layers", "6"],
     "--decoder-first-pipeline-num-layers 6 (after --) conflicts with --pipeline-model-parallel-size 4 from the plan"),
    (["--recompute-granularity", "full"],
     "--recompute-granularity full (after --) conflicts with the plan (plan.json), which leaves "
     "--recompute-granularity unset"),
    (["--attention-backend", "unfused"], "--attention-backend unfused (after --) conflicts with the plan (plan.json), "
                                         "which leaves --attention-backend unset"),
])
def test_each_kind_of_conflict_is_named(extras, named):
    message = conflict(extras)
    assert named in message and message.endswith("(the input decides these; change the input instead)")


def test_a_split_the_plan_chose_cannot_be_overridden():
    uneven = plan_args(layers=(2, 2, 3, 1))  # written as a layout
    message = conflict(["--decoder-last-pipeline-num-layers", "1"], decided=uneven)
    assert "conflicts with" in message and "--pipeline-model-parallel-layout E,t*2|t*2|t*3|t,L" in message
    message = conflict(["--pipeline-model-parallel-layout", "E,t*2|t*2|t*2|t*2,L"], decided=uneven)
    assert "(after --) conflicts with --pipeline-model-parallel-layout E,t*2|t*2|t*3|t,L" in message


def test_every_conflict_in_one_line():
    message = conflict(["--micro-batch-size", "4", "--train-iters", "10", "--fp16", "--no-flash", "x"])
    assert message.count("(after --) conflicts with") == 2 and "\n" not in message


def test_options_the_estimate_turned_off_stay_off():
    decided = plan_args(options=TrainingOptions().with_(sequence_parallel=False, distributed_optimizer=False,
                                                         overlap_param_gather=False))
    for flag in ("--sequence-parallel", "--use-distributed-optimizer"):
        assert f"{flag} (after --) conflicts with the plan" in conflict([flag], decided=decided)


def test_mock_data():
    args = mock_data_args(SPEC, OLD)
    # core_v0.15.2's NullTokenizer adds an end-of-document token: v - 1 gives the model's 128256 rows.
    assert args == ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "128255"]
    assert {arg for arg in args if arg.startswith("--")} <= FLAGS
    line = compose(SOURCE, plan_args(), rules=OLD, model=SPEC, mock_data=True, extras=["--train-iters", "5"])
    assert line.args == plan_args() + args + ["--train-iters", "5"]
    assert [label for label, _ in line.groups] == [SOURCE, "--mock-data", "yours (after --)"]
    assert ("--data-path data/text (after --) conflicts with --mock-data, --tokenizer-type NullTokenizer, "
            "--vocab-size 128255 from --mock-data") in conflict(["--data-path", "data/text"], mock_data=SPEC)
    assert "--vocab-size 32000 (after --) conflicts with --vocab-size 128255 from --mock-data" in conflict(
        ["--vocab-size", "32000"], mock_data=SPEC)
    # without --mock-data the data and the tokenizer are the user's
    assert compose(SOURCE, plan_args(), rules=OLD, model=SPEC, extras=["--vocab-size", "32000"]).args[-1] == "32000"


def test_mock_data_by_release():
    """core_v0.19.0's NullTokenizer gives --vocab-size rows as given (its eod is v - 1)."""
    assert mock_data_args(SPEC, NEW)[-1] == "128256"
    assert named("core_v0.19.0") is NEW and named("0.15") is OLD


@pytest.mark.parametrize("vocab,tp,refused", [(1024, 1, True), (4094, 1, True), (4095, 1, False), (4093, 2, True), (4093, 4, False)])
def test_mock_data_refuses_what_core_0_15_cannot_feed(vocab, tp, refused):
    """core_v0.15.2's MockGPTLowLevelDataset feeds ids up to 4094: fewer rows fail at iteration 1.
    The rows are the padded vocabulary: 4093 pads to 4094 rows at TP 2, too few, and to 4096 at TP 4."""
    from dataclasses import replace

    spec = replace(SPEC, vocab_size=vocab)
    decided = plan_args(tp=tp)
    if refused:
        with pytest.raises(AdvisorError, match="--mock-data feeds token ids up to 4094 whatever the vocabulary"):
            mock_data_args(spec, OLD, decided)
    else:
        assert mock_data_args(spec, OLD, decided)[-1] == str(vocab - 1)
    assert mock_data_args(spec, NEW, decided)[-1] == str(vocab)  # core 0.19 takes ids modulo the vocabulary


def _moe_row_args(model="deepseek-v3", **layout):
    from advisor.moe.flags import row_args
    from advisor.moe.spec import PRESETS as MOE

    row = {"tp": 1, "cp": 1, "pp": 1, "layers_per_stage": [MOE[model].num_layers], "mbs": 1, "vpp": 1,
           "recompute": "none", "options": {}, "ep": 8, "etp": 1, "dispatcher": "alltoall", **layout}
    return MOE[model], row_args(MOE[model], 4096, 512, row)


@pytest.mark.parametrize("extras,named", [
    # the expert layout and the model's expert flags, each once passed through and taken last by argparse
    (["--expert-model-parallel-size", "16"], "--expert-model-parallel-size 16 (after --) conflicts with "
                                             "--expert-model-parallel-size 8"),
    (["--expert-tensor-parallel-size", "2"], "conflicts with --expert-tensor-parallel-size 1"),
    (["--moe-router-topk", "2"], "conflicts with --moe-router-topk 8"),
    (["--moe-token-dispatcher-type", "allgather"], "conflicts with --moe-token-dispatcher-type alltoall"),
    (["--moe-ffn-hidden-size", "1024"], "conflicts with --moe-ffn-hidden-size 2048"),
    (["--moe-layer-freq", "1"], "conflicts with --moe-layer-freq ([0]*3+[1]*58)"),
    (["--mtp-num-layers", "1"], "--mtp-num-layers 1 (after --) conflicts with the plan (plan.json), which leaves "
                                "--mtp-num-layers unset"),
    (["--moe-expert-capacity-factor", "1.0"], "which leaves --moe-expert-capacity-factor unset"),
    (["--moe-enable-deepep"], "--moe-enable-deepep (after --) conflicts with --moe-token-dispatcher-type alltoall"),
    (["--moe-aux-loss-coeff", "0.01"], "--moe-aux-loss-coeff 0.01 (after --) conflicts with --moe-aux-loss-coeff 0.001"),
    (["--moe-router-load-balancing-type", "none"], "conflicts with --moe-router-load-balancing-type seq_aux_loss"),
    (["--rope-type", "rope"], "--rope-type rope (after --) conflicts with --rope-type yarn"),
])
def test_an_moe_rows_expert_flags_cannot_be_overridden(extras, named):
    """advisor-launch passed these through: Megatron took the user's last value, and the run
    launched was not the one priced."""
    spec, decided = _moe_row_args()
    with pytest.raises(AdvisorError) as error:
        compose(SOURCE, decided, rules=OLD, model=spec, extras=extras)
    assert named in str(error.value)


@pytest.mark.parametrize("layout, extras, named", [
    # a backend or a fusion the plan did not price: before, passed through and launched unpriced
    ({"dispatcher": "flex", "flex_backend": "hybridep"}, ["--moe-flex-dispatcher-backend", "deepep"],
     "--moe-flex-dispatcher-backend deepep (after --) conflicts with --moe-flex-dispatcher-backend hybridep"),
    ({"dispatcher": "flex"}, ["--moe-flex-dispatcher-backend", "hybridep"],
     # on core_v0.19.0 the row says deepep in that release's words (own_spelling)
     "--moe-flex-dispatcher-backend hybridep (after --) conflicts with --moe-flex-dispatcher-backend deepep"),
    ({}, ["--moe-permute-fusion"], "which leaves --moe-permute-fusion unset"),
])
def test_an_moe_rows_backend_and_fusions_cannot_be_overridden(layout, extras, named):
    spec, decided = _moe_row_args("qwen3-30b-a3b", **layout)
    with pytest.raises(AdvisorError) as error:
        compose(SOURCE, decided, rules=NEW, model=spec, extras=extras)
    assert named in str(error.value)


def test_a_hybridep_row_is_launched_on_core_0_19_only():
    """core_v0.15.2 has no --moe-flex-dispatcher-backend (its flex dispatcher is DeepEP's): one
    line naming the release and the flag, before anything starts."""
    spec, decided = _moe_row_args("qwen3-30b-a3b", dispatcher="flex", flex_backend="hybridep", dispatcher_sms=32)
    assert compose(SOURCE, decided, rules=NEW, model=spec, extras=[]).args
    with pytest.raises(AdvisorError, match=r"core 0\.15 has no --moe-flex-dispatcher-backend, "
                                           r"--moe-flex-dispatcher-num-sms, which this launch needs"):
        compose(SOURCE, decided, rules=OLD, model=spec, extras=[])


@pytest.mark.parametrize("model, layout, rules, refused", [
    # megatron-core's TransformerConfig refuses these on every rank (transformer_config.py, __post_init__)
    ("deepseek-v3", {"dispatcher": "flex"}, OLD, "--moe-shared-expert-overlap needs --moe-token-dispatcher-type "
                                                 "alltoall on Megatron-LM core 0.15, got flex"),
    ("deepseek-v3", {"recompute": "selective", "recompute_modules": ["shared_experts"]}, NEW,
     "--moe-shared-expert-overlap refuses --recompute-modules shared_experts"),
    ("deepseek-v3", {"a2a_overlap": True}, NEW,
     "--overlap-moe-expert-parallel-comm refuses --moe-shared-expert-overlap"),
    ("qwen3-30b-a3b", {"a2a_overlap": True}, NEW,
     "--overlap-moe-expert-parallel-comm refuses --moe-shared-expert-overlap"),
    # what megatron-core runs: alltoall on both releases, flex on core 0.19, and a model without shared
    # experts on any dispatcher but beside the EP overlap (the flag is read and ignored)
    ("deepseek-v3", {}, OLD, None),
    ("deepseek-v3", {"dispatcher": "flex"}, NEW, None),
    ("qwen3-30b-a3b", {"dispatcher": "flex"}, OLD, None),
])
def test_a_shared_expert_overlap_megatron_refuses_is_not_launched(model, layout, rules, refused):
    """advisor-launch passed --moe-shared-expert-overlap through whatever the row: a row with the
    EP overlap or the flex dispatcher started and then failed in TransformerConfig on every rank.
    The row carries the flag now (``shared_expert_overlap``, priced), checked on the release
    launched: a row of core 0.19's flex dispatcher is refused on core 0.15."""
    spec, decided = _moe_row_args(model, **layout, shared_expert_overlap=True)
    assert decided.count("--moe-shared-expert-overlap") == 1
    if refused is None:
        assert "--moe-shared-expert-overlap" in compose(SOURCE, decided, rules=rules, model=spec, extras=[]).args
        # restating it after -- is no conflict
        assert compose(SOURCE, decided, rules=rules, model=spec, extras=["--moe-shared-expert-overlap"]).args
        return
    with pytest.raises(AdvisorError) as error:
        compose(SOURCE, decided, rules=rules, model=spec, extras=[])
    assert str(error.value).startswith(refused) and str(error.value).endswith(
        f": {SOURCE} gives it; Megatron-LM would refuse the command on every rank at start-up")


def test_a_users_shared_expert_overlap_on_a_row_without_it_is_a_conflict():
    """The overlap is priced (time and memory), so a row priced without it is not launched with
    it: the user's flag after -- is refused, naming what prices it."""
    spec, decided = _moe_row_args("deepseek-v3")
    with pytest.raises(AdvisorError) as error:
        compose(SOURCE, decided, rules=NEW, model=spec, extras=["--moe-shared-expert-overlap"])
    assert (f"--moe-shared-expert-overlap (after --) conflicts with {SOURCE}, which leaves --moe-shared-expert-overlap "
            "unset (advisor estimate/sweep --moe-shared-expert-overlap prices the shared experts beside the dispatch)"
            in str(error.value))


def test_restating_an_moe_row_is_no_conflict():
    spec, decided = _moe_row_args("qwen3-30b-a3b", dispatcher="flex")
    same = ["--expert-model-parallel-size", "8", "--moe-router-topk", "8", "--moe-token-dispatcher-type", "flex",
            "--moe-enable-deepep", "--num-experts", "128", "--moe-grouped-gemm"]
    assert compose(SOURCE, decided, rules=OLD, model=spec, extras=same).args[-len(same):] == same


@pytest.mark.parametrize("sms", [None, 24])
def test_a_deepep_row_is_launched_in_each_releases_own_words(sms):
    """The rows write DeepEP's flags as core_v0.15.2 needs them (--moe-enable-deepep,
    --moe-deepep-num-sms); core_v0.19.0 takes them with a deprecation warning and routes them to
    --moe-flex-dispatcher-backend deepep and --moe-flex-dispatcher-num-sms (transformer_config.py,
    __post_init__), which a launch there writes instead. Restating the old spelling after -- is
    no conflict on either."""
    spec, decided = _moe_row_args("qwen3-30b-a3b", dispatcher="flex", dispatcher_sms=sms)
    old = compose(SOURCE, decided, rules=OLD, model=spec, extras=[]).args
    new = compose(SOURCE, decided, rules=NEW, model=spec, extras=[]).args
    assert "--moe-enable-deepep" in old and "--moe-flex-dispatcher-backend" not in old
    assert "--moe-enable-deepep" not in new and "--moe-deepep-num-sms" not in new
    assert new[new.index("--moe-flex-dispatcher-backend") + 1] == "deepep"
    if sms is not None:
        assert old[old.index("--moe-deepep-num-sms") + 1] == new[new.index("--moe-flex-dispatcher-num-sms") + 1] == "24"
    restated = ["--moe-enable-deepep", *(["--moe-deepep-num-sms", "24"] if sms else [])]
    for rules in (OLD, NEW):
        assert compose(SOURCE, decided, rules=rules, model=spec, extras=restated).args[-len(restated):] == restated


def test_the_older_name_of_the_sequence_length_conflicts_with_the_rows():
    """--encoder-seq-length after -- beside the row's --seq-length: validate_args asserts one of them
    on every rank (arguments.py); it passed the launcher."""
    assert "--encoder-seq-length 8192 (after --) conflicts with --seq-length" in conflict(["--encoder-seq-length", "8192"])


@pytest.mark.parametrize("rules, flag", [(OLD, "128255"), (NEW, "128256")])
def test_a_null_tokenizer_without_its_vocabulary_size_is_refused(rules, flag):
    """core_v0.15.2 asserts args.vocab_size when it builds a NullTokenizer; core_v0.19.0's takes
    int(vocab_size): both failed on every rank at start-up, after the queue."""
    with pytest.raises(AdvisorError) as error:
        compose(SOURCE, plan_args(), rules=rules, model=SPEC, extras=["--mock-data", "--tokenizer-type", "NullTokenizer"])
    assert str(error.value).startswith("--tokenizer-type NullTokenizer (after --) without --vocab-size fails on every "
                                       f"rank at start-up (its vocabulary is built from it): give --vocab-size {flag}")


def test_a_dense_row_refuses_expert_flags():
    assert "which leaves --num-experts unset" in conflict(["--num-experts", "8"])
    assert "which leaves --expert-model-parallel-size unset" in conflict(["--expert-model-parallel-size", "2"])
    assert compose(SOURCE, plan_args(), rules=OLD, model=SPEC, extras=["--rope-type", "rope"])  # RoPE, restated


@pytest.mark.parametrize("model", ["mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3"])
@pytest.mark.parametrize("layout", [
    {"dispatcher": "flex", "a2a_overlap": False}, {"dispatcher": "alltoall", "a2a_overlap": True, "delay_wgrad": True},
    {"dispatcher": "alltoall", "capacity_factor": 1.25}, {"dispatcher": "allgather", "etp": 2},
    {"dispatcher": "flex", "flex_backend": "hybridep", "dispatcher_sms": 32, "permute_fusion": True,
     "router_fusion": True},
    {"dispatcher": "flex", "dispatcher_sms": 24}, {"dispatcher": "alltoall", "shared_expert_overlap": True}])
def test_every_flag_an_moe_row_writes_is_decided(model, layout):
    """The conflict check covers what the MoE flag writer emits: a flag outside DECIDED_FLAGS
    would pass through a user's other value unrefused."""
    from launch.arguments import DECIDED_FLAGS

    _, decided = _moe_row_args(model, **layout)
    assert {flag.name for flag in parse_flags(decided)} - DECIDED_FLAGS == set()


def test_an_moe_conflict_is_one_line_and_exit_2_from_advisor_launch(advisor, tmp_path):
    from launch_support import launcher, write_json

    row = advisor.json("estimate", "--model", "mixtral-8x7b", "--gpus", 8, "--ep", 8, "--gpu", "h100-80gb")
    path = write_json(tmp_path / "row.json", row)
    line = launcher().error("args", "--from", path, "--", "--expert-model-parallel-size", "4", "--moe-router-topk", "1")
    assert "--expert-model-parallel-size 4 (after --) conflicts with --expert-model-parallel-size 8" in line
    assert "--moe-router-topk 1 (after --) conflicts with --moe-router-topk 2" in line


def test_a_flag_the_release_lacks_is_named_with_what_it_may_mean():
    """Megatron parses with allow_abbrev=False and refuses unknown flags on every rank at start-up
    (after a queue): a misspelt flag after '--' is named, with the release's close flags; a warning
    for a launch, as a checkout may add flags of its own (check reads the checkout:
    tests/test_launch_check_flags.py)."""
    from launch.arguments import unknown_flags
    from launch.megatron_versions import VERSIONS

    rules = VERSIONS[0]
    [misspelt, unknown] = unknown_flags(rules, ["--lr", "1e-4", "--save-intervall", "100", "--bogus-flag",
                                                "--train-iters=10", "--save-interval", "5"])
    assert misspelt.name == "--save-intervall" and unknown.name == "--bogus-flag"
    assert misspelt.warning().startswith("warning: --save-intervall (after --) is not a flag of Megatron-LM core 0.15's")
    assert "(did you mean --save-interval?)" in misspelt.problem
    assert unknown.warning().startswith("warning: --bogus-flag (after --)") and "did you mean" not in unknown.problem
    assert unknown_flags(rules, ["--lr", "1e-4", "--train-iters", "10", "--save-interval", "5"]) == []
