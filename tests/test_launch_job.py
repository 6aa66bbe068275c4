"""Complete jobs (launch/job.py): a job file and a token budget become Megatron-LM flags that
both real releases' parse_args + validate_args accept (launch.megatron_check), deriving what
the issue asks (--train-samples and the LR schedule's lengths); bad job files are one line."""

import json
import math

import pytest
from launch_support import launcher, sweep_file, write_json
from megatron_real import NO_TRANSFORMER_ENGINE, checkout, validate

# One worker under pytest-xdist for the tests of the session's validator processes (megatron_real.validate):
# each worker would start its own (torch and Megatron imported again, 10-13 s of CPU per release).
pytestmark = pytest.mark.xdist_group("megatron-validator")


JOB = """\
mock_data = true
save = "{root}/checkpoints"
load = "{root}/checkpoints"
save_interval = 500
tensorboard_dir = "{root}/tensorboard"
lr = 3e-4
min_lr = 3e-5
tokens = 2e9
lr_warmup_fraction = 0.02
fs_bandwidth_gbs = 25
"""


@pytest.mark.parametrize("tag", ["core_v0.15.2", "core_v0.19.0"])
def test_a_job_file_gives_flags_megatron_accepts(tag, advisor, tmp_path):
    release = checkout(tag)
    sweep = sweep_file(advisor, tmp_path / "sweep.json", "--gpus", "8", "--mem", "80")
    job = tmp_path / "job.toml"
    job.write_text(JOB.format(root=tmp_path))
    result = launcher()("args", "--from", sweep, "--megatron-version", tag, "--job-config", job, "--format", "json",
                        "--", *NO_TRANSFORMER_ENGINE)
    args = json.loads(result.stdout)
    seq, gbs = int(args[args.index("--seq-length") + 1]), int(args[args.index("--global-batch-size") + 1])
    samples = -(-2 * 10**9 // seq)  # ceil(2e9 / 8192) = 244141
    assert args[args.index("--train-samples") + 1] == args[args.index("--lr-decay-samples") + 1] == str(samples)
    assert args[args.index("--lr-warmup-samples") + 1] == str(round(samples * 0.02))
    row = json.loads(sweep.read_text())[0]
    [verdict] = validate(release, [{"args": args, "world_size": row["gpus"],
                                    "env": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}}])
    assert verdict["ok"], verdict
    assert verdict["derived"]["global_batch_size"] == gbs


def test_the_dry_run_prices_the_checkpoint_and_names_what_is_missing(advisor, tmp_path):
    sweep = sweep_file(advisor, tmp_path / "sweep.json", "--gpu", "h100-80gb", "--gpus", "8", "--tokens", "1B")
    result = launcher()("torchrun", "--from", sweep, "--megatron-version", "0.15", "--fs-bandwidth", "5",
                        "--dry-run", "--", "--save-interval", "100")
    lines = result.stderr.splitlines()
    assert any(line.startswith("advisor-launch: length: 1e+09 tokens = 122,071 samples of 8192 tokens")
               for line in lines), result.stderr
    priced = next(line for line in lines if "checkpoint:" in line)
    assert "14 bytes/parameter" in priced and "at 5 GB/s (--fs-bandwidth)" in priced and "(yours, 100," in priced
    missing = [line for line in lines if "the job is incomplete" in line]
    assert missing == ["warning: the job is incomplete: it lacks data (--data-path PREFIX after --, data_path in "
                       "--job-config, or --mock-data); a tokenizer (--tokenizer-type HuggingFaceTokenizer "
                       "--tokenizer-model DIR after --); a learning rate (--lr 3e-4 after --). For example: --mock-data "
                       "--tokens 1B -- --lr 3e-4 (or --job-config job.toml with data_path, tokenizer_type, "
                       "tokenizer_model, tokens, lr, save, save_interval, tensorboard_dir)"]
    assert "--train-samples 122071" in result.stdout


def test_an_moe_checkpoint_holds_every_expert(advisor, tmp_path):
    # Mixtral 8x7B: 46.70 B parameters (Mistral AI's 46.7 B; advisor.moe.params.total_parameters,
    # tested against it), not the 7.2 B of one FFN a layer that the dense Eq. 3 would count;
    # 14 bytes each with BF16 weights (2 + 4 main + 8 Adam): 46.70e9 x 14 / 2^30 = 609 GiB
    sweep = sweep_file(advisor, tmp_path / "sweep.json", "--model", "mixtral-8x7b", "--gpu", "h100-80gb",
                       "--gpus", "64", "--seq-len", "4096", "--gbs", "256")
    result = launcher()("sbatch", "--from", sweep, "--megatron-version", "0.15", "--mock-data", "--dry-run",
                        "--", "--train-iters", "10", "--lr", "1e-4")
    priced = next(line for line in result.stderr.splitlines() if "checkpoint:" in line)
    gib = float(priced.split("checkpoint:")[1].split("GiB")[0].replace(",", ""))
    assert gib == pytest.approx(46.70e9 * 14 / 2**30, rel=0.002), priced


def test_a_bad_job_file_is_one_line(advisor, tmp_path):
    sweep = sweep_file(advisor, tmp_path / "sweep.json", "--gpus", "8", "--mem", "80")
    cases = {
        "unknown.json": ({"data": "x"}, "unknown key(s) data"),
        "interval.json": ({"save_interval": 0}, "save_interval must be a positive integer, got 0"),
        "fraction.json": ({"lr_warmup_fraction": 1.5}, "lr_warmup_fraction must be a number in [0, 1)"),
        "paths.json": ({"data_path": "one"}, "data_path must be a list of paths"),
        # a budget counts whole tokens, as --tokens does
        "tokens.json": ({"tokens": 1.5}, "tokens must be a positive whole number of tokens"),
        # argparse read them as options: '--save -x' lacked its value, '--data-path a -x' had an unknown argument
        "dash.json": ({"save": "-x"}, "save \"-x\" begins with '-', which Megatron's argparse reads as an option, "
                      "not as --save's value (every rank refuses the command at start-up); write a path as ./-x"),
        "dashes.json": ({"data_path": ["a", "-x"]}, "data_path \"-x\" begins with '-'"),
    }
    for name, (document, message) in cases.items():
        line = launcher().error("args", "--from", sweep, "--job-config", write_json(tmp_path / name, document))
        assert message in line, line
    # '-' alone, a negative number and a word with a space are values to argparse
    args = launcher()("args", "--from", sweep, "--job-config",
                      write_json(tmp_path / "values.json", {"data_path": ["-", "-1", "-a b"]})).stdout
    assert "--data-path - -1 '-a b'" in args
    # min_lr 0 is Megatron's own default (--min-lr 0.0); the file's min_lr was refused as 'must be a positive number'
    args = launcher()("args", "--from", sweep, "--job-config",
                      write_json(tmp_path / "floor.json", {"lr": 3e-4, "min_lr": 0})).stdout.split()
    assert args[args.index("--min-lr") + 1] == "0"
    broken = tmp_path / "broken.toml"
    broken.write_text("save = [")
    assert "not TOML" in launcher().error("args", "--from", sweep, "--job-config", broken)
    # the user's own length wins over the budget's (no schedule is derived, so nothing conflicts); two
    # global batches of the sweep's 1024, as fewer than one is refused (launch.job.check_length)
    args = launcher()("args", "--from", sweep, "--tokens", "1B", "--", "--train-samples", "2048").stdout.split()
    assert args[-2:] == ["--train-samples", "2048"] and "--lr-decay-samples" not in args


@pytest.mark.parametrize("document,mock,flag", [
    ({"data_path": ["corpus_text_document"]}, ("--mock-data",), "--data-path"),
    ({"mock_data": True, "data_path": ["corpus_text_document"]}, (), "--data-path"),
    ({"mock_data": True, "tokenizer_type": "GPT2BPETokenizer"}, (), "--tokenizer-type"),
], ids=["--mock-data and data_path", "mock_data and data_path", "mock_data and tokenizer_type"])
def test_a_job_files_data_beside_mock_data_is_one_line(advisor, tmp_path, document, mock, flag):
    """The launch had --mock-data and the job's --data-path, which Megatron-LM's validate_args
    refuses on every rank ("A single data source must be provided"); its data after '--' was
    refused already, as a conflict."""
    sweep = sweep_file(advisor, tmp_path / "sweep.json", "--gpus", "8", "--mem", "80")
    job = write_json(tmp_path / "job.json", document)
    line = launcher().error("args", "--from", sweep, *mock, "--job-config", job)
    assert line == (f"Error: {flag} from the job ({job}) conflicts with mock data (--mock-data, or the job file's "
                    "mock_data), which decides the data and the tokenizer (Megatron-LM asserts a single data source "
                    "on every rank at start-up): give one of them")


def test_a_hostile_toml_job_file_is_one_line(advisor, tmp_path):
    """What tomllib raises besides TOMLDecodeError, and a TOML date in the message, were tracebacks
    (found by a CLI fuzzer): RecursionError on deep nesting, int()'s ValueError past 4,300 digits,
    json.dumps's TypeError on a datetime."""
    sweep = sweep_file(advisor, tmp_path / "sweep.json", "--gpus", "8", "--mem", "80")
    cases = {
        "deep.toml": ("save = " + "[" * 20_000 + "]" * 20_000, "TOML nested too deeply"),
        "inline.toml": ("save = " + "{a = " * 5_000 + "1" + "}" * 5_000, "TOML nested too deeply"),
        "digits.toml": ("tokens = " + "1" * 5_000, "an integer of more than 4,300 digits"),
        # beyond int64, as a JSON job file's reader refuses it: it was written into --save-interval
        "interval.toml": ("save_interval = " + "9" * 23, "interval.toml: save_interval must be at most "
                          "9,223,372,036,854,775,807, got 99999999999999999999999: torch and Megatron-LM count "
                          "iterations in int64"),
        "date.toml": ("save = 1979-05-27T07:32:00Z",
                      'save must be a non-empty string without NUL bytes, got "1979-05-27 07:32:00+00:00"'),
    }
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text + "\n")
        line = launcher().error("args", "--from", sweep, "--job-config", tmp_path / name)
        assert message in line, line


def test_learning_rates_megatron_fails_on_are_one_line(advisor, tmp_path):
    # megatron/core/optimizer_param_scheduler.py (core_v0.15.2 and core_v0.19.0), __init__:
    # 'assert self.min_lr >= 0.0', 'assert self.max_lr >= self.min_lr': -1 fails the second with
    # min_lr 0.0, NaN fails it (nan >= 0.0 is False), inf passes both and trains NaN weights
    sweep = sweep_file(advisor, tmp_path / "sweep.json", "--gpus", "8", "--mem", "80")
    finite = "give a finite number, 0 or more; Megatron-LM's scheduler (optimizer_param_scheduler.py) fails on it"
    for args, message in ((["--lr", "nan"], f"--lr nan: {finite}"), (["--lr", "inf"], f"--lr inf: {finite}"),
                          (["--lr", "-1"], f"--lr -1: {finite}"),
                          (["--lr", "3e-4", "--min-lr", "-0.1"], f"--min-lr -0.1: {finite}"),
                          (["--lr", "1e-5", "--min-lr", "1e-4"], "--lr 1e-5 is below --min-lr 1e-4: Megatron-LM's "
                           "scheduler asserts max_lr >= min_lr"),
                          # 'assert self.init_lr <= self.max_lr' (the same __init__): NaN and 1e-3 > 3e-4 fail it
                          (["--lr", "3e-4", "--lr-warmup-init", "nan"], "--lr-warmup-init nan: give a finite number, "
                           "at most --lr; Megatron-LM's scheduler asserts init_lr <= max_lr"),
                          (["--lr", "3e-4", "--lr-warmup-init", "1e-3"], "--lr-warmup-init 1e-3: give a finite number"),
                          (["--lr-warmup-init", "inf"], "--lr-warmup-init inf: give a finite number")):
        line = launcher().error("args", "--from", sweep, "--", *args)
        assert message in line, line
    # the job file's rates meet the user's: lr 3e-4 (the file) under --min-lr 1e-3 (after --)
    job = write_json(tmp_path / "job.json", {"lr": 3e-4})
    line = launcher().error("args", "--from", sweep, "--job-config", job, "--", "--min-lr", "1e-3")
    assert "--lr 0.0003 is below --min-lr 1e-3" in line, line
    assert launcher()("args", "--from", sweep, "--", "--lr", "3e-4", "--min-lr", "0").stdout
    assert launcher()("args", "--from", sweep, "--", "--lr", "3e-4", "--lr-warmup-init", "3e-4").stdout


def test_weight_decays_megatron_fails_on_are_one_line(advisor, tmp_path):
    # the same scheduler's __init__ (both releases): 'assert self.start_wd >= 0.0', 'assert self.end_wd >=
    # self.start_wd'; validate_args sets both to --weight-decay with --weight-decay-incr-style constant (the
    # default), else takes --start-weight-decay and --end-weight-decay
    sweep = sweep_file(advisor, tmp_path / "sweep.json", "--gpus", "8", "--mem", "80")
    finite = ("give a finite number, 0 or more; Megatron-LM's scheduler (optimizer_param_scheduler.py) asserts "
              "start_wd >= 0 at start-up")
    linear = ["--weight-decay-incr-style", "linear"]
    for args, message in ((["--weight-decay", "-.5"], f"--weight-decay -.5: {finite}"),
                          (["--weight-decay", "nan"], f"--weight-decay nan: {finite}"),
                          (["--weight-decay", "inf"], f"--weight-decay inf: {finite}"),
                          ([*linear, "--start-weight-decay", "-0.1", "--end-weight-decay", "0.1"],
                           f"--start-weight-decay -0.1: {finite}"),
                          ([*linear, "--start-weight-decay", "0.1", "--end-weight-decay", "0.01"],
                           "--end-weight-decay 0.01 is below --start-weight-decay 0.1: Megatron-LM's scheduler "
                           "asserts end_wd >= start_wd")):
        line = launcher().error("args", "--from", sweep, "--", "--lr", "3e-4", *args)
        assert message in line, line
    # what the scheduler takes: no decay, and a rising one
    for args in (["--weight-decay", "0"], [*linear, "--start-weight-decay", "0.01", "--end-weight-decay", "0.1"]):
        assert launcher()("args", "--from", sweep, "--", "--lr", "3e-4", *args).stdout


def test_the_users_length_replaces_the_budgets_in_the_report(advisor, tmp_path):
    """With --train-iters after --, job_group adds no schedule: the report does not print one either."""
    sweep = sweep_file(advisor, tmp_path / "sweep.json", "--gpu", "h100-80gb", "--gpus", "16", "--tokens", "1T")
    result = launcher()("sbatch", "--dry-run", "--from", sweep, "--megatron-version", "0.15", "--mock-data", "--",
                        "--train-iters", "20", "--lr", "3e-4")
    lengths = [line for line in result.stderr.splitlines() if "length:" in line]
    assert lengths == ["advisor-launch: length: your --train-iters 20 (after --); the 1e+12-token budget adds "
                       "no --train-samples or LR schedule"], result.stderr
    assert "--train-samples" not in result.stdout and "--train-iters 20" in result.stdout


def _warnings(result, start: str) -> list[str]:
    """The stderr warnings that start with ``start``, each joined back from its wrapped lines."""
    text = " ".join(line.strip() for line in result.stderr.splitlines())
    return [f"warning: {part.strip()}" for part in text.split("warning: ")[1:] if part.startswith(start)]


def test_sbatch_warns_where_the_signal_comes_too_late_to_save(advisor, tmp_path):
    """After Slurm's SIGTERM Megatron finishes the step under way, then saves (training.py,
    checkpoint_and_decide_exit): the lead must hold both. Hand calculation: Llama 3.1 8B has
    8,030,261,248 parameters (Meta's 8.03 B), 14 bytes each = 112,423,657,472 bytes, at 0.25 GB/s
    449.69 s; with the row's own step time (53.24 s on 16 H100) 502.9 s in all -> 503."""
    sweep = sweep_file(advisor, tmp_path / "sweep.json", "--gpu", "h100-80gb", "--gpus", "16")
    step = json.loads(sweep.read_text())[0]["step_time_s"]
    save = 8_030_261_248 * 14 / 0.25e9
    run = ("sbatch", "--from", sweep, "--megatron-version", "0.15", "--mock-data", "--dry-run", "--fs-bandwidth",
           "0.25")
    result = launcher()(*run, "--", "--lr", "1e-4", "--train-iters", "10", "--save", str(tmp_path / "ckpt"))
    [warning] = _warnings(result, "--signal-time")
    assert warning.startswith(f"warning: --signal-time 300 s is shorter than what Megatron does after Slurm's "
                              f"SIGTERM: up to one {step:,.1f} s step to finish (the input's step time) and a "
                              f"{save:,.1f} s save"), warning
    assert warning.endswith(f"give --signal-time {math.ceil(step + save)} or more"), warning
    assert math.ceil(step + save) == 503  # the hand calculation above, with the row's 53.24 s
    # the lead that holds both is quiet; without --save there is nothing to save, and nothing to warn of
    enough = launcher()(*run, "--signal-time", "503", "--", "--lr", "1e-4", "--train-iters", "10", "--save", "c")
    assert not _warnings(enough, "--signal-time") and "#SBATCH --signal=TERM@503" in enough.stdout
    assert not _warnings(launcher()(*run, "--", "--lr", "1e-4", "--train-iters", "10"), "--signal-time")


def test_sbatch_requeue_warns_unless_save_and_load_name_one_directory(advisor, tmp_path):
    """Megatron resumes only from --load and saves only to --save (training.py,
    setup_model_and_optimizer): a requeued job resumes where it stopped only when they agree."""
    sweep = sweep_file(advisor, tmp_path / "sweep.json", "--gpus", "8", "--mem", "80")
    run = ("sbatch", "--from", sweep, "--megatron-version", "0.15", "--mock-data", "--dry-run", "--requeue", "--",
           "--lr", "1e-4", "--train-iters", "10")
    cases = {(): "no --save or --load", ("--save", "c"): "no --load", ("--load", "c"): "no --save",
             ("--save", "a", "--load", "b"): "--save a and --load b differ"}
    for extra, have in cases.items():
        [warning] = _warnings(launcher()(*run, *extra), "--requeue")
        assert warning == (f"warning: --requeue, but {have}: a requeued job starts again where this one started, "
                           "not where it stopped; give --save DIR --load DIR (one directory) after -- or as save "
                           "and load in --job-config"), warning
    result = launcher()(*run, "--save", "c", "--load", "c")
    assert not _warnings(result, "--requeue") and "#SBATCH --requeue" in result.stdout


@pytest.mark.parametrize("groups,said", [
    ([("the plan", ("--num-layers", "2")), ("yours (after --)", ("--train-iters", "5"))],
     "exit (no --save: nothing is saved)"),
    ([("the job (job.toml)", ("--save", "ckpt")), ("yours (after --)", ("--train-iters", "5"))], "save, exit"),
    ([("the plan", ()), ("yours (after --)", ("--save", "ckpt"))], "save, exit"),
    # argparse's --save=DIR is a --save too
    ([("the plan", ()), ("yours (after --)", ("--lr", "3e-4", "--save=ckpt"))], "save, exit")])
def test_the_signal_handlers_comment_says_whether_megatron_saves(groups, said):
    """Megatron saves on SIGTERM only with --save (training.py, checkpoint_and_decide_exit): the
    script's comment over --exit-signal-handler says which, wherever --save is given; the
    handler goes before the user's own group, which stays last."""
    from launch.commands import with_exit_signal_handler

    out = with_exit_signal_handler(groups)
    assert out == [*groups[:-1], (f"Slurm's SIGTERM before the time limit: finish the iteration, {said}",
                                  ("--exit-signal-handler",)), groups[-1]]


def test_optimizer_settings_megatron_fails_on_are_one_line(advisor, tmp_path):
    # torch/optim/adam.py (AdamW's base) and sgd.py raise 'Invalid beta parameter at index 0', 'Invalid
    # epsilon value', 'Invalid momentum value' unless 0 <= beta < 1, 0 <= eps, 0 <= momentum; Megatron-LM
    # builds torch.optim.AdamW or SGD where neither Transformer Engine nor Apex is installed
    # (megatron/core/optimizer/__init__.py, both releases), and a fused Adam takes them and trains badly
    sweep = sweep_file(advisor, tmp_path / "sweep.json", "--gpus", "8", "--mem", "80")
    for args, message in ((["--adam-beta1", "-1"], "--adam-beta1 -1: give in [0, 1); torch.optim's AdamW"),
                          (["--adam-beta2", "1"], "--adam-beta2 1: give in [0, 1)"),
                          (["--adam-beta1", "nan"], "--adam-beta1 nan: give in [0, 1)"),
                          (["--adam-eps=-1e-8"], "--adam-eps -1e-8: give a finite number, 0 or more"),
                          (["--adam-eps", "inf"], "--adam-eps inf: give a finite number, 0 or more"),
                          (["--optimizer", "sgd", "--sgd-momentum", "-0.5"],
                           "--sgd-momentum -0.5: give a finite number, 0 or more; torch.optim's SGD")):
        line = launcher().error("args", "--from", sweep, "--", "--lr", "3e-4", *args)
        assert message in line, line
    # only the chosen optimizer's flags are read: SGD ignores Adam's betas (torch's SGD takes none)
    args = launcher()("args", "--from", sweep, "--", "--lr", "3e-4", "--optimizer", "sgd", "--adam-beta1", "-1")
    assert "--adam-beta1" in args.stdout.split()
    for good in (["--adam-beta1", "0"], ["--adam-beta2", "0.95"], ["--adam-eps", "0"]):
        assert launcher()("args", "--from", sweep, "--", "--lr", "3e-4", *good).stdout


def test_the_optimizer_lines_say_torch_refuses_only_what_it_refuses(advisor, tmp_path):
    """torch's checks (torch/optim/adam.py: ``if not 0.0 <= eps``; sgd.py: ``if momentum < 0.0``) let
    an infinite --adam-eps and a NaN or infinite --sgd-momentum through: those are refused as training
    badly (Adam's step m / (sqrt(v) + inf) = 0; a NaN or infinite momentum buffer), not as torch's
    refusal. Each line is held to what torch itself does with the value."""
    torch = pytest.importorskip("torch")
    sweep = sweep_file(advisor, tmp_path / "sweep.json", "--gpus", "8", "--mem", "80")
    weight = [torch.nn.Parameter(torch.zeros(1))]
    build = {"--adam-beta1": lambda x: torch.optim.AdamW(weight, betas=(x, 0.999)),
             "--adam-eps": lambda x: torch.optim.AdamW(weight, eps=x),
             "--sgd-momentum": lambda x: torch.optim.SGD(weight, lr=0.1, momentum=x)}
    refuses = "(Megatron-LM's optimizer without Transformer Engine or Apex) refuses it at start-up"
    for flag, value, taken in (("--adam-beta1", "nan", False), ("--adam-eps", "-1e-8", False),
                               ("--adam-eps", "nan", False), ("--adam-eps", "inf", True),
                               ("--sgd-momentum", "-0.5", False), ("--sgd-momentum", "nan", True),
                               ("--sgd-momentum", "inf", True)):
        try:
            build[flag](float(value))
            torch_takes = True
        except ValueError:
            torch_takes = False
        assert torch_takes == taken, (flag, value)
        sgd = ["--optimizer", "sgd"] if flag == "--sgd-momentum" else []
        line = launcher().error("args", "--from", sweep, "--", "--lr", "3e-4", *sgd, f"{flag}={value}")
        assert f"{flag} {value}: give " in line, line
        assert (refuses in line) == (not taken), line
        if taken:
            assert "takes it, and" in line, line
    assert "Adam's step m / (sqrt(v) + eps) is then 0: no weight trains" in launcher().error(
        "args", "--from", sweep, "--", "--lr", "3e-4", "--adam-eps", "inf")


def test_job_file_learning_rate_zero_runs_as_megatron_takes_it(advisor, tmp_path):
    # the scheduler asserts only min_lr >= 0.0 and max_lr >= min_lr (optimizer_param_scheduler.py), so
    # lr 0 with min_lr 0 (Megatron's default) starts; the file's lr was refused as 'a positive number'
    sweep = sweep_file(advisor, tmp_path / "sweep.json", "--gpus", "8", "--mem", "80")
    args = launcher()("args", "--from", sweep, "--job-config", write_json(tmp_path / "zero.json", {"lr": 0}),
                      "--", "--train-iters", "10").stdout.split()
    assert args[args.index("--lr") + 1] == "0"
    line = launcher().error("args", "--from", sweep, "--job-config", write_json(tmp_path / "neg.json", {"lr": -1e-4}))
    assert "lr must be a number, 0 or more, got -0.0001" in line, line


@pytest.mark.parametrize("name", ["job.yaml", "job.cfg", "job"])
def test_a_job_file_not_named_toml_says_it_is_read_as_json(advisor, tmp_path, name):
    """A TOML (or YAML) job under another name was 'malformed JSON at line 1, column 1' alone."""
    sweep = sweep_file(advisor, tmp_path / "sweep.json", "--gpus", "8", "--mem", "80")
    job = tmp_path / name
    job.write_text('lr = 3e-4\n')
    line = launcher().error("args", "--from", sweep, "--job-config", job)
    assert line == (f"Error: {job}: malformed JSON at line 1, column 1: Expecting value (a job file is read as JSON "
                    "unless its name ends in .toml)")
    named = tmp_path / "job.json"  # named JSON: the parser's position alone, as before
    named.write_text('lr = 3e-4\n')
    assert launcher().error("args", "--from", sweep, "--job-config", named) == \
        f"Error: {named}: malformed JSON at line 1, column 1: Expecting value"
    job.write_text('{"lr": 3e-4}')  # JSON under any other name still reads
    assert "--lr" in launcher()("args", "--from", sweep, "--job-config", job).stdout.split()
