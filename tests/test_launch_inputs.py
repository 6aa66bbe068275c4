"""The launcher's inputs: sweep rows, estimates and plans written by the advisor itself, and the
Megatron-LM arguments each becomes; every generated flag exists in Megatron-LM core_v0.15.2."""

import json

import pytest
from conftest import ROOT
from launch_support import FLAGS, plan_files, rank_of, sweep_file, write_json

from advisor.errors import AdvisorError
from launch.arguments import flag_values
from launch.inputs import read_input


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    from conftest import Invoker

    return plan_files(Invoker(), tmp_path_factory.mktemp("plans"))


def sweeps(advisor, root):
    """Sweeps of several models, layouts and estimator options (with --all: every row, oom too)."""
    return [
        sweep_file(advisor, root / "8b.json", "--gpus", "64", "--mem", "40", "--all"),
        sweep_file(advisor, root / "70b.json", "--gpus", "128", "--mem", "80", "--model", "llama3.1-70b",
                   "--seq-len", "32768", "--all"),
        sweep_file(advisor, root / "1b.json", "--gpus", "16", "--mem", "24", "--model", "llama3.2-1b", "--recompute",
                   "full", "--recompute-method", "block", "--recompute-num-layers", "2", "--grad-dtype", "bf16", "--vocab-divisible-by", "128", "--no-distributed-optimizer",
                   "--no-sequence-parallel", "--all"),
    ]


def every_config(advisor, root, plans):
    """(name, LaunchInput) over every row of the sweeps, estimates with options, and launchable plans."""
    configs = []
    for path in sweeps(advisor, root):
        for row in json.loads(path.read_text()):
            single = write_json(root / "row.json", row)
            configs.append((f"{path.name} {row['tp']}/{row['cp']}/{row['pp']}/{row['mbs']}", read_input(single)))
    estimates = {
        "selective": ["--tp", "2", "--cp", "2", "--pp", "4", "--mbs", "1", "--gpus", "32", "--recompute", "selective"],
        "uneven": ["--tp", "4", "--pp", "4", "--gpus", "16", "--layers-per-stage", "7,9,9,7", "--recompute", "full"],
        "vpp": ["--tp", "2", "--pp", "4", "--vpp", "2", "--gpus", "16", "--mem", "80", "--seq-len", "4096"],
        "unfused": ["--tp", "2", "--pp", "2", "--gpus", "8", "--model", "llama3.2-1b", "--no-flash-attn"],
    }
    for name, args in estimates.items():
        path = root / f"estimate-{name}.json"
        advisor("estimate", *args, "--format", "json", "-o", path)
        configs.append((f"estimate {name}", read_input(path)))
    for name in ("pp4", "pp3", "pp3-tp2"):
        configs.append((f"plan {name}", read_input(plans[name])))
    return configs


def test_every_generated_flag_exists_in_megatron_lm(advisor, tmp_path, plans):
    configs = every_config(advisor, tmp_path, plans)
    seen = set()
    for name, config in configs:
        flags = {arg for arg in config.megatron_args if arg.startswith("--")}
        assert flags <= FLAGS, (name, flags - FLAGS)
        values = flag_values(config.megatron_args)
        assert values["--tensor-model-parallel-size"] == (str(config.tp),)
        assert values["--context-parallel-size"] == (str(config.cp),)
        assert values["--pipeline-model-parallel-size"] == (str(config.pp),)
        seen |= flags | {name for name, wide in (("cp>1", config.cp > 1), ("pp>1", config.pp > 1)) if wide}
    # The spread covers what it must: CP and PP > 1, every way to split stages, VPP, recomputation.
    for must in ("cp>1", "pp>1", "--pipeline-model-parallel-layout", "--decoder-last-pipeline-num-layers",
                 "--decoder-first-pipeline-num-layers", "--num-layers-per-virtual-pipeline-stage",
                 "--recompute-granularity", "--recompute-method", "--attention-backend", "--grad-reduce-in-bf16",
                 "--sequence-parallel", "--use-distributed-optimizer"):
        assert must in seen, must
    assert len(configs) > 300


def test_a_sweep_row_becomes_its_layout(advisor, tmp_path):
    path = sweep_file(advisor, tmp_path / "sweep.json", "--gpus", "64", "--mem", "40")
    rank = rank_of(path, cp=2)
    row = next(row for row in json.loads(path.read_text()) if row["rank"] == rank)
    config = read_input(path, rank)
    assert (config.kind, config.tp, config.cp, config.pp, config.dp) == ("sweep row", row["tp"], 2, row["pp"], row["dp"])
    assert config.world_size == 64 and config.origin == f"rank {rank} of {path}"
    values = flag_values(config.megatron_args)
    # llama3.1-8b (32 layers, hidden 4096, 8 KV heads), the paper's sequence and batch
    assert values["--num-layers"] == ("32",) and values["--hidden-size"] == ("4096",)
    assert values["--num-query-groups"] == ("8",) and values["--seq-length"] == ("8192",)
    assert values["--micro-batch-size"] == (str(row["mbs"]),) and values["--global-batch-size"] == ("1024",)
    assert read_input(path).origin == f"rank 1 of {path}"  # the default rank


def test_an_estimate_keeps_its_split_and_options(advisor, tmp_path):
    path = tmp_path / "estimate.json"
    # 12 GPUs as 3 nodes of 4 (whole nodes: 12 is not a multiple of the default 8)
    advisor("estimate", "--tp", "2", "--pp", "3", "--gpus", "12", "--gpus-per-node", "4", "--model", "llama3.2-3b",
            "--layers-per-stage", "8,10,10", "--recompute", "selective", "--format", "json", "-o", path)
    config = read_input(path)
    assert config.kind == "estimate" and config.layers_per_stage == (8, 10, 10) and config.dp == 2
    values = flag_values(config.megatron_args)
    # equal middle stages -> only the first stage's count is written (Megatron splits the rest evenly)
    assert values["--decoder-first-pipeline-num-layers"] == ("8",)
    assert "--decoder-last-pipeline-num-layers" not in values
    assert values["--recompute-granularity"] == ("selective",)
    assert "--untie-embeddings-and-output-weights" not in values  # llama3.2-3b ties them


def test_a_plan_is_launched_with_its_own_arguments(plans):
    document = json.loads(plans["pp4"].read_text())
    config = read_input(plans["pp4"])
    assert config.kind == "plan" and config.megatron_args == tuple(document["megatron_args"])
    assert config.layers_per_stage == (2, 2, 3, 1) and config.world_size == document["world_size"] == 4
    assert config.gpus_per_node == document["gpus_per_node"]


def corrupt(tmp_path, document):
    """A new file holding ``document``."""
    return write_json(tmp_path / f"bad-{len(list(tmp_path.glob('bad-*')))}.json", document)


def test_bad_inputs_are_one_clear_error(advisor, tmp_path, plans):
    sweep = sweep_file(advisor, tmp_path / "sweep.json", "--gpus", "8", "--mem", "80")
    rows = json.loads(sweep.read_text())
    plan = json.loads(plans["pp4"].read_text())
    truncated = tmp_path / "truncated.json"
    truncated.write_text(sweep.read_text()[:200])
    cases = [
        (truncated, None, "malformed JSON at line"),
        (corrupt(tmp_path, {"hello": 1}), None, "neither a sweep row, an estimate nor a plan"),
        (corrupt(tmp_path, "text"), None, "expected a JSON object or array, got 'text'"),
        # JSON's words, not Python's: 'null' was 'got NoneType', '3' 'got int'
        (corrupt(tmp_path, None), None, "expected a JSON object or array, got null"),
        (corrupt(tmp_path, 3), None, "expected a JSON object or array, got 3"),
        (corrupt(tmp_path, []), None, "the sweep holds no rows"),
        (sweep, 999, f"has no row ranked 999 (ranks 1-{len(rows)}; oom rows have no rank)"),
        (plans["pp4"], 2, "--rank picks a row of a sweep array"),
        (tmp_path / "missing.json", None, "no such file"),
        (tmp_path, None, "is a directory"),
        (plans["hybrid"], None, "stock Megatron-LM cannot build this hybrid plan: stages have different TP/DP"),
        (corrupt(tmp_path, {**plan, "version": 2}), None, "plan version 2 is not supported"),
        (corrupt(tmp_path, {**plan, "schema": "other"}), None, "unknown schema 'other'"),
        # not 'it is marked not launchable', which 'yes' is not
        (corrupt(tmp_path, {**plan, "launchable": "yes"}), None, "'launchable' must be true or false, got 'yes'"),
        (corrupt(tmp_path, {**plan, "world_size": 8}), None, "'world_size' is 8, but TP x CP x PP x DP = 4"),
        (corrupt(tmp_path, {**plan, "tp": 2, "world_size": 8}), None,
         "its megatron_args give --tensor-model-parallel-size 1, its fields say 2"),
        (corrupt(tmp_path, {**plan, "megatron_args": "--num-layers 8"}), None, "'megatron_args' must be a list of str"),
        (corrupt(tmp_path, {**rows[0], "gpus": 16}), None, "'gpus' is 16, but TP x CP x PP x DP = 8"),
        (corrupt(tmp_path, {**rows[0], "tp": "2"}), None, "'tp' must be a positive integer, got '2'"),
        # JSON's words: null is null (was Python's None), a key left out is missing
        (corrupt(tmp_path, {**rows[0], "gpus": None}), None, "'gpus' must be a positive integer, got null"),
        (corrupt(tmp_path, [{k: v for k, v in rows[0].items() if k != "tp"}]), None, "missing 'tp'"),
        (corrupt(tmp_path, {k: v for k, v in plan.items() if k != "version"}), None,
         "missing 'version' (this launcher reads version"),
        (corrupt(tmp_path, {k: v for k, v in rows[0].items() if k != "model"}), None, "neither a sweep row"),
        (corrupt(tmp_path, {**rows[0], "model": {**rows[0]["model"], "layers": 3}}), None,
         "model has an unknown field, 'layers'"),
        (corrupt(tmp_path, {**rows[0], "options": {"recompute": "some"}}), None, "recompute must be none, selective"),
        (corrupt(tmp_path, {**rows[0], "tp": 3, "dp": 1, "gpus": 3}), None, "TP 3 must divide the attention heads"),
        # 'OOM' or 5 skipped the warning that an oom row does not fit, without a word
        (corrupt(tmp_path, {**rows[0], "verdict": "OOM"}), None,
         "'verdict' must be null or fits, tight, oom, likely fits, likely oom, got 'OOM'"),
        (corrupt(tmp_path, {**rows[0], "verdict": 5}), None, "'verdict' must be null or fits, tight, oom, likely fits, "),
    ]
    for path, rank, message in cases:
        with pytest.raises(AdvisorError) as error:
            read_input(path, rank)
        assert message in str(error.value), (path, str(error.value))
        assert "\n" not in str(error.value)


@pytest.mark.parametrize("field,message", [
    ("tpp", "unknown field 'tpp' (did you mean 'tp'?)"),
    ("vp", "unknown field 'vp' (did you mean 'vpp'?)"),
    ("learning_rate", "unknown field 'learning_rate'"),
    ("a\nb", "unknown field 'a\\nb'"),
], ids=["tpp", "vp", "learning_rate", "newline"])
def test_a_rows_unknown_field_is_one_line_naming_it_and_the_file(advisor, tmp_path, field, message):
    """A misspelt or foreign field of a sweep row or an estimate was ignored without a word: 'vp' 2
    launched VPP 1, a hand-added 'learning_rate' nothing."""
    from launch_support import launcher

    sweep = sweep_file(advisor, tmp_path / "sweep.json", "--gpus", "8", "--mem", "80", "--top", "1")
    rows = json.loads(sweep.read_text())
    estimate = tmp_path / "estimate.json"
    advisor("estimate", "--gpus", "8", "--mem", "80", "--tp", "2", "--format", "json", "-o", estimate)
    edited = {"rank 1 of ": write_json(tmp_path / "row.json", [{**rows[0], field: 2}]),
              "": write_json(tmp_path / "est.json", {**json.loads(estimate.read_text()), field: 2})}
    for origin, path in edited.items():
        assert launcher().error("args", "--from", path) == (
            f"Error: {origin}{path}: {message}: no sweep row or estimate the advisor writes has it")


def test_rows_and_estimates_with_every_field_the_advisor_writes_are_read(advisor, tmp_path):
    """advisor.saved_row.ROW_FIELDS, the fields the launcher knows, are those that sweeps and
    estimates written with every optional field carry (a budget, a price, the plot's columns, a
    lever's time cost, an MoE model's settings, --compare-best, --from-command), and each is read."""
    from advisor.saved_row import ROW_FIELDS

    logs = ROOT / "tests" / "data" / "logs"
    budget = ("--gpu", "h100-80gb", "--tokens", "1T", "--gpu-hour-price", "2")
    written = {
        "sweep": ("sweep", "--gpus", "16", *budget, "--plot", tmp_path / "sweep.png"),
        "lever": ("sweep", "--model", "llama3.1-70b", "--gpus", "8", "--gpu", "h100-80gb",
                  "--no-distributed-optimizer"),  # the ladder climbed: a lever's time cost
        "moe": ("sweep", "--model", "mixtral-8x7b", "--gpus", "64", *budget),
        "estimate": ("estimate", "--from-command", logs / "core_v0.15.2_cpu_pp2.command", *budget, "--compare-best"),
        "moe-estimate": ("estimate", "--model", "mixtral-8x7b", "--gpus", "64", "--tp", "2", "--pp", "2", "--ep", "8",
                         "--mbs", "1", *budget),
    }
    seen = set()
    for name, args in written.items():
        path = tmp_path / f"{name}.json"
        advisor(*args, "--format", "json", "-o", path, *(("--top", "1") if args[0] == "sweep" else ()))
        document = json.loads(path.read_text())
        seen |= (document[0] if isinstance(document, list) else document).keys()
        assert read_input(path).model.num_layers > 0
    assert seen == ROW_FIELDS


def test_a_plan_launches_the_options_it_was_priced_with(advisor, tmp_path):
    """Issue 21: a plan records its TrainingOptions whole; the launcher emits the flags from them
    (the same writer as a sweep row's), and refuses a plan whose flags and options disagree."""
    from advisor.megatron_args import megatron_args
    from advisor.models import preset
    from advisor.options import TrainingOptions

    path = tmp_path / "plan.json"
    advisor("recommend", "--model", "llama3.2-1b", "--gpus", "8", "--pp", "4", "--mbs", "1", "--gbs", "16",
            "--grad-dtype", "bf16", "--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads",
            "--recompute", "selective", "-o", path)
    document = json.loads(path.read_text())
    priced = TrainingOptions().with_(grad_reduce_dtype="bf16", fsdp_strategy="optim_grads", recompute="selective")
    assert document["options"] == priced.flat()
    config = read_input(path)
    assert config.megatron_args == tuple(megatron_args(
        preset("llama3.2-1b"), 8192, tp=1, cp=1, layers_per_stage=config.layers_per_stage, micro_batch_size=1,
        global_batch_size=16, options=priced))
    values = flag_values(config.megatron_args)
    assert values["--data-parallel-sharding-strategy"] == ("optim_grads",) and "--grad-reduce-in-bf16" in values
    # Options changed by hand without the flags: refused, naming both sides.
    edited = dict(document, options=dict(document["options"], grad_reduce_dtype="fp32"))
    with pytest.raises(AdvisorError, match="inconsistent plan: its megatron_args lack "
                                           "--accumulate-allreduce-grads-in-fp32, which its fields give"):
        read_input(corrupt(tmp_path, edited))
    # A plan written before plans recorded options (or their release) still launches its own flags:
    # here the newest release's words, the derived flags with its gradient dtype (release_spelling)
    older = {key: value for key, value in document.items() if key not in ("options", "megatron_version")}
    assert read_input(corrupt(tmp_path, older)).megatron_args == tuple(document["megatron_args"]) == (
        *config.megatron_args, "--megatron-fsdp-main-grads-dtype", "bf16")


def test_moe_token_dropping_rows_launch_as_priced(advisor, tmp_path):
    """A capacity row launches with --moe-pad-expert-input-to-capacity where it was priced padded
    (and where it predates ``pad_to_capacity``: those were priced padded), with the factor alone
    where not; a padded flex row is refused as megatron-core refuses it."""
    path = tmp_path / "moe.json"
    advisor("estimate", "--model", "mixtral-8x7b", "--gpus", "64", "--pp", "4", "--ep", "8", "--seq-len", "4096",
            "--gbs", "256", "--moe-routing", "capacity", "--moe-expert-capacity-factor", "1.5", "--format", "json",
            "-o", path)
    row = json.loads(path.read_text())
    # edited rows drop their flags, as rows written before they carried them do
    old = {key: value for key, value in row.items() if key not in ("pad_to_capacity", "megatron_args")}
    unpadded = {key: value for key, value in row.items() if key != "megatron_args"} | {"pad_to_capacity": False}
    for pad, document in ((True, row), (False, unpadded), (True, old)):
        args = read_input(write_json(tmp_path / "row.json", document)).megatron_args
        assert ("--moe-pad-expert-input-to-capacity" in args) is pad
        assert args[args.index("--moe-expert-capacity-factor") + 1] == "1.5"
    with pytest.raises(AdvisorError, match="its megatron_args give --moe-pad-expert-input-to-capacity, its "
                                           "fields do not"):  # edited, its flags not
        read_input(write_json(tmp_path / "row.json", {**row, "pad_to_capacity": False}))
    with pytest.raises(AdvisorError, match="flex dispatcher's padding to capacity is not priced"):
        read_input(write_json(tmp_path / "row.json", {**row, "dispatcher": "flex"}))
    with pytest.raises(AdvisorError, match="'pad_to_capacity' must be null, true or false, got 1"):
        read_input(write_json(tmp_path / "row.json", {**row, "pad_to_capacity": 1}))


@pytest.mark.xdist_group("megatron-validator")
@pytest.mark.parametrize("tag", ["core_v0.15.2", "core_v0.19.0"])
def test_an_empty_pipeline_stage_launches_as_a_layout(tag, advisor, tmp_path):
    """An estimate with an empty last stage (--layers-per-stage 32,0), dense and MoE: the launcher
    reads it and writes the split as a layout, which the release's parse_args + validate_args
    accept and build as priced (its --decoder-last-pipeline-num-layers 0 both refuse)."""
    from advisor.models import load_model
    from launch.megatron_versions import named
    from launch_support import launcher
    from megatron_real import NO_TRANSFORMER_ENGINE, checkout, validate

    release = checkout(tag)
    common = ["--pp", "2", "--layers-per-stage", "32,0", "--gpu", "h100-80gb", "--format", "json"]
    estimates = {"llama3.1-8b": ["--gpus", "2"], "mixtral-8x7b": ["--gpus", "64", "--ep", "8"]}
    cases = []
    for model, more in estimates.items():
        path = tmp_path / f"{model}.json"
        advisor("estimate", "--model", model, *more, *common, "-o", path)
        # the NullTokenizer --vocab-size that builds the priced rows on this release (checked since 2026-11-29)
        vocab = named(tag).null_tokenizer_vocab_flag(load_model(model).vocab_size)
        args = json.loads(launcher()("args", "--from", path, "--megatron-version", tag, "--format", "json", "--",
                                     *NO_TRANSFORMER_ENGINE, "--mock-data", "--tokenizer-type", "NullTokenizer",
                                     "--vocab-size", str(vocab), "--train-iters", "10").stdout)
        assert flag_values(args)["--pipeline-model-parallel-layout"] == ("E,t*32|L",)
        assert "--decoder-last-pipeline-num-layers" not in args
        cases.append({"args": args, "world_size": json.loads(path.read_text())["gpus"],
                      "env": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}})
    for result in validate(release, cases):
        assert result["ok"], result.get("error")
        assert result["derived"]["layers_per_stage"] == [32, 0]


def test_a_launch_script_given_as_input_points_to_the_command_that_reads_it(tmp_path):
    """advisor-launch --from train.sh said only 'malformed JSON at line 1, column 1'."""
    from advisor.errors import AdvisorError
    from launch.inputs import read_input

    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\ntorchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 2\n")
    with pytest.raises(AdvisorError) as error:
        read_input(script)
    assert str(error.value).endswith(f"(it reads as a launch script: price it with 'advisor estimate --from-command "
                                     f"{script} -o est.json', then launch --from est.json)")
    # JSON that is only broken keeps its one message, a truncated estimate read from a torchrun script too
    (tmp_path / "broken.json").write_text('{"read_from": "train.sh: torchrun, 8 GPUs", "tp": ')
    with pytest.raises(AdvisorError, match=r"malformed JSON at line 1, column \d+: [^(]*$"):
        read_input(tmp_path / "broken.json")


def test_a_fifo_given_as_input_is_refused_without_waiting_for_a_writer(tmp_path):
    """The FIFO was refused as JSON, then opened to see whether it held a launch script
    (``launch.inputs._script_hint``): that open waited forever for a writer (a CLI fuzzer's
    'advisor-launch sbatch --from fifo' hung). An alarm fails the test where it would hang."""
    import os
    import signal

    os.mkfifo(tmp_path / "fifo")

    def waited(*_):
        raise AssertionError("read_input waited for a writer of the FIFO")

    previous = signal.signal(signal.SIGALRM, waited)
    signal.alarm(30)
    try:
        with pytest.raises(AdvisorError) as error:
            read_input(tmp_path / "fifo")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert str(error.value) == f"{tmp_path / 'fifo'} is a FIFO (named pipe); a JSON file is read from a regular file only"


def test_from_dash_launches_the_sweep_piped_in(advisor, tmp_path):
    """advisor sweep --format json | advisor-launch args --from - --rank 2: the arguments of the
    same row read from the file; the input is named 'standard input' where a file is named."""
    from launch_support import launcher

    saved = sweep_file(advisor, tmp_path / "s.json", "--gpus", "8", "--gpu", "h100-80gb")
    launch = launcher()
    piped = launch.runner.invoke(launch.command, ["args", "--from", "-", "--rank", "2", "--format", "json"],
                                 input=saved.read_text())
    assert piped.exit_code == 0, piped.output
    assert json.loads(piped.stdout) == json.loads(launch("args", "--from", saved, "--rank", 2, "--format", "json").stdout)
    missing = launch.runner.invoke(launch.command, ["args", "--from", "-", "--rank", "999"], input=saved.read_text())
    assert missing.exit_code == 2 and missing.stderr.startswith("Error: standard input has no row ranked 999 (ranks 1-")


@pytest.mark.parametrize("piped,message", [
    ("", "--from -: standard input is empty; pipe in the JSON of advisor sweep or estimate --format json"),
    ("{", "standard input: malformed JSON at line 1"),
])
def test_from_dash_refuses_bad_standard_input(piped, message):
    from launch_support import launcher

    launch = launcher()
    result = launch.runner.invoke(launch.command, ["args", "--from", "-"], input=piped)
    assert (result.exit_code, result.stdout) == (2, "")
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith(f"Error: {message}")


TABLE = "llama3.1-8b, seq 8192, gbs 1024, 8 GPUs x 80 GiB, fits <= 64.0 GiB (80%), ranked by the paper's\nrule\n"


def test_a_table_piped_in_names_json_not_a_parser_position():
    """'advisor sweep ... | advisor-launch args --from -' without --format json was 'standard
    input: malformed JSON at line 1, column 1: Expecting value'."""
    from launch_support import launcher

    launch = launcher()
    result = launch.runner.invoke(launch.command, ["args", "--from", "-"], input=TABLE)
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == ("Error: standard input holds no JSON (it begins 'llama3.1-8b, seq 8192, gbs 1024, 8 "
                             "GP...'): advisor sweep and estimate write it with --format json, advisor recommend "
                             "with -o FILE\n")


@pytest.mark.parametrize("program", ["advisor-launch", "advisor"])
@pytest.mark.parametrize("text,message", [
    ("", "{path} is empty: give the JSON of advisor sweep or estimate --format json (or a plan, advisor recommend -o)"),
    ("\n  \n", "{path} is empty: give the JSON of advisor sweep or estimate --format json (or a plan, "
               "advisor recommend -o)"),
    (TABLE, "{path} holds no JSON (it begins 'llama3.1-8b, seq 8192, gbs 1024, 8 GP...'): advisor sweep and "
            "estimate write it with --format json, advisor recommend with -o FILE"),
], ids=["empty", "blank", "table"])
def test_an_empty_or_table_input_file_says_so(advisor, tmp_path, program, text, message):
    """'advisor sweep --mem abc --format json > sweep.json' leaves an empty sweep.json, and
    'advisor sweep > sweep.json' a table: both were 'malformed JSON at line 1, column 1'."""
    from launch_support import launcher

    path = tmp_path / "sweep.json"
    path.write_text(text)
    if program == "advisor":
        line = advisor.error("report", "--from", path, "-o", tmp_path / "r.html")
        assert not (tmp_path / "r.html").exists()
    else:
        line = launcher().error("args", "--from", path)
    assert line == "Error: " + message.format(path=path)
