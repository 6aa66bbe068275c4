"""One wording for one refusal, whichever command meets it: each is one line 'Error: ...' on stderr,
exit status 2, through the real CLIs (``advisor``, ``advisor-launch`` and the module entry points).
The pipeline split and its stage count, a GPU count or a global batch that does not divide, a
number out of its range, values shown as people write them, an empty option value, and a training
option Megatron-LM refuses at the layout given."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from advisor.cli import cli
from launch.cli import cli as launch_cli
from tests.test_compare_log import REAL_COMMAND, REAL_LOG

EST = ["estimate", "--model", "llama3.1-8b"]
CHECKOUT = "give the directory of your Megatron-LM checkout"


def one_error(result) -> str:
    """The one 'Error:' line of a refusal (exit status 2, nothing on stdout), without its prefix."""
    assert result.exit_code == 2, f"exit {result.exit_code}\n{result.output}"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert result.stdout == ""
    return lines[0].removeprefix("Error: ")


def refused(command, *args) -> str:
    return one_error(CliRunner().invoke(command, [str(arg) for arg in args]))


# --- 1. the split names its flag, and counts stages in English ----------------------------------


@pytest.mark.parametrize("pp,split,words", [
    (2, "32", "--layers-per-stage lists 1 stage, but PP is 2"),
    (2, "10,10,12", "--layers-per-stage lists 3 stages, but PP is 2"),
    (2, "16,15", "--layers-per-stage 16,15 must be non-negative and sum to 32 layers"),
])
def test_the_split_names_its_flag(pp, split, words):
    assert refused(cli, *EST, "--gpus", 8, "--pp", pp, "--layers-per-stage", split) == words


# --- 2. a count that does not divide: one wording, its factors shown ---------------------------


def test_gpus_that_do_not_divide_show_each_degree():
    assert refused(cli, *EST, "--gpus", 7, "--tp", 2) == "--gpus 7 is not divisible by TP x CP x PP = 2 x 1 x 1 = 2"


def test_a_launch_world_that_does_not_divide_says_where_it_came_from(tmp_path):
    command = tmp_path / "train.sh"
    command.write_text(REAL_COMMAND.read_text().replace("--nproc-per-node 2", "--nproc-per-node 3"))
    words = refused(cli, "estimate", "--from-command", command)
    assert words.startswith("--from-command train.sh: the world size 3 (torchrun --nproc-per-node 3")
    assert words.endswith("is not divisible by TP x CP x PP = 1 x 1 x 2 = 2: give --gpus N for the run you mean")


def test_a_global_batch_that_does_not_divide_shows_each_factor():
    assert refused(cli, *EST, "--gpus", 8, "--mbs", 3) == "--gbs 1024 is not divisible by MBS x DP = 3 x 8 = 24"


# --- 3. ranges: the project's wording everywhere, never click's 'x>=1' --------------------------


@pytest.mark.parametrize("command,args,words", [
    (cli, ["sweep", "--gpus", 8, "--top", 0], "Invalid value for '--top': must be at least 1, got 0"),
    (cli, ["report", "sweep", "--gpus", 8, "--top", 21], "Invalid value for '--top': must be at most 20, got 21"),
    (cli, ["profile", "show", ".", "--iteration", -1], "Invalid value for '--iteration': must be at least 0, got -1"),
    (cli, ["profile", "run", "c.json", "--out", "runs", "--train-iters", 0],
     "Invalid value for '--train-iters': must be at least 1, got 0"),
    (cli, ["compare-log", "log", "--from-command", "cmd", "--vocab-size", 0],
     "Invalid value for '--vocab-size': must be at least 1, got 0"),
    (launch_cli, ["torchrun", "--from", "x.json", "--rank", 0],
     "Invalid value for '--rank': must be at least 1, got 0"),
    (launch_cli, ["torchrun", "--from", "x.json", "--node-rank", -1],
     "Invalid value for '--node-rank': must be at least 0, got -1"),
    (launch_cli, ["sbatch", "--from", "x.json", "--cpus-per-task", 0],
     "Invalid value for '--cpus-per-task': must be at least 1, got 0"),
    (launch_cli, ["sbatch", "--from", "x.json", "--signal-time", 30],
     "Invalid value for '--signal-time': must be at least 60, got 30"),
    (launch_cli, ["sbatch", "--from", "x.json", "--rdzv-port", 70000],
     "Invalid value for '--rdzv-port': must be at most 65,535, got 70000"),
], ids=lambda value: " ".join(map(str, value))[:50] if isinstance(value, list) else None)
def test_a_number_out_of_range_is_worded_as_the_project_words_it(command, args, words):
    line = refused(command, *args)
    assert line.startswith(words) and "in the range" not in line


def _commands():
    """Every command of the CLIs and the module entry points that take numbers, with its path."""
    from launch.slurm_array import main as slurm_array
    from megatron_hooks.emulate import main as emulate
    from tables.capture.__main__ import measure as tables_capture

    def walk(command, path, parent=None):
        ctx = click.Context(command, info_name=path[-1], parent=parent)
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                yield from walk(command.get_command(ctx, name), [*path, name], ctx)
        else:
            yield " ".join(path), command

    for command, name in ((cli, "advisor"), (launch_cli, "advisor-launch"), (slurm_array, "launch.slurm_array"),
                          (emulate, "megatron_hooks.emulate"), (tables_capture, "tables.capture measure")):
        yield from walk(command, [name])


def test_no_option_words_its_range_as_click_does():
    """click's IntRange/FloatRange print 'x>=1' and '0 is not in the range': the project's Bounded
    (advisor.limits' bounds) says 'must be at least 1, got 0' and why a bound is where it is."""
    clicks = {f"{path} {param.opts[0]}" for path, command in _commands() for param in command.params
              if isinstance(param.type, click.types._NumberRangeBase)}
    assert clicks == set()


# --- 4. values as people write them -------------------------------------------------------------


def test_a_log_of_another_batch_names_it_as_a_number(tmp_path):
    log = tmp_path / "other.log"
    log.write_text(REAL_LOG.read_text().replace("global batch size:     4", "global batch size:     8"))
    assert refused(cli, "compare-log", log, "--from-command", REAL_COMMAND) == (
        "the log trains global batch size 8, the command 4: is it the command that wrote the log?")
    log.write_text(REAL_LOG.read_text().replace("global batch size:     4", "global batch size:    16", 1)
                   .replace("global batch size:     4", "global batch size:     8"))
    assert refused(cli, "compare-log", log, "--from-command", REAL_COMMAND).startswith(
        "the log trains global batch sizes 8 and 16, the command 4:")


# --- 5. an empty value is a value given, refused in one wording ---------------------------------


@pytest.mark.parametrize("args,words", [
    (EST + ["--gpus", 8, "--layers-per-stage", ""],
     "--layers-per-stage is empty; give one layer count per stage, for example 7,9,9,7"),
    (["report", "estimate", "--gpus", 8, "--layers-per-stage", ""],
     "--layers-per-stage is empty; give one layer count per stage, for example 7,9,9,7"),
    (EST + ["--from-command", ""], "--from-command is empty; give a file, or - for standard input"),
    (["compare-log", "", "--from-command", "cmd"], "LOG is empty; give a file, or - for standard input"),
    (["profile", "plan", "--gpus", 8, "--units", ""],
     "--units is empty; give the layers of each merged unit, summing to the model's layers"),
    (["profile", "run", "c.json", "--out", "runs", "--megatron-lm", ""], f"--megatron-lm is empty; {CHECKOUT}"),
    (["profile", "run", "c.json", "--out", ""], "--out is empty; give the directory for the runs"),
    (["sweep", "--gpus", 8, "--profile", ""], "--profile is empty; give a file or directory"),
    (["sweep", "--gpus", 8, "--plot", ""], "--plot is empty; give a file ending in .png"),
    (EST + ["--gpus", 8, "-o", ""], "--output is empty; give a file, or - for standard output"),
], ids=lambda value: " ".join(map(str, value))[-40:] if isinstance(value, list) else None)
def test_an_empty_advisor_option_is_refused(args, words):
    assert refused(cli, *args) == words


@pytest.fixture(scope="module")
def estimate_json(tmp_path_factory):
    path = tmp_path_factory.mktemp("estimate") / "estimate.json"
    CliRunner().invoke(cli, [*EST, "--gpus", 8, "--format", "json", "-o", str(path)], catch_exceptions=False)
    return path


@pytest.mark.parametrize("args,words", [
    (["torchrun", "--dry-run", "--megatron-lm", ""], f"--megatron-lm is empty; {CHECKOUT}"),
    (["args", "--megatron-lm", ""], f"--megatron-lm is empty; {CHECKOUT}"),
    (["torchrun", "--dry-run", "--rdzv-endpoint", ""],
     "--rdzv-endpoint is empty; give HOST:PORT, for example node001:29500"),
    (["torchrun", "--dry-run", "--rdzv-endpoint", "node001:29500", "--rdzv-id", ""],
     "--rdzv-id is empty; give the job id all nodes share"),
    (["torchrun", "--dry-run", "--run-id", ""],
     "--run-id is empty; give the profiled run's id, or leave it out for a new one"),
    (["sbatch", "--dry-run", "--job-name", ""],
     "--job-name is empty; give a Slurm job name, or leave it out for megatron-MODEL"),
    (["args", "--job-config", ""], "--job-config is empty; give a file"),
], ids=lambda value: " ".join(map(str, value))[-40:] if isinstance(value, list) else None)
def test_an_empty_launch_option_is_refused(estimate_json, args, words):
    command, *rest = args
    assert refused(launch_cli, command, "--from", estimate_json, *rest) == words


def test_the_launcher_from_is_refused_empty():
    assert refused(launch_cli, "args", "--from", "") == "--from is empty; give a file, or - for standard input"


# --- 6. --tp-comm-overlap at TP 1: Megatron-LM asserts sequence parallelism, off at TP 1 --------


def test_tp_comm_overlap_at_tp_1_is_refused_as_megatron_refuses_it():
    words = refused(cli, *EST, "--gpus", 8, "--tp", 1, "--tp-comm-overlap", "--gpu", "h100-80gb")
    assert words == ("--tp-comm-overlap needs TP > 1: at TP 1 Megatron-LM turns sequence parallelism off, "
                     "and refuses the overlap without it")


def test_tp_comm_overlap_at_tp_2_is_priced():
    result = CliRunner().invoke(cli, [*EST, "--gpus", "8", "--tp", "2", "--tp-comm-overlap", "--gpu", "h100-80gb",
                                      "--format", "json"])
    assert result.exit_code == 0, result.output


def test_recommend_words_divisibility_as_estimate_does():
    """advisor recommend and advisor estimate refuse the same layout in the same words (the one
    advisor.parallel.model_parallel_problem / global_batch_problem)."""
    from advisor.parallel import global_batch_problem, model_parallel_problem

    result = CliRunner().invoke(cli, ["recommend", "--gpus", "8", "--pp", "3", "--gbs", "64"])
    assert result.exit_code == 2
    assert model_parallel_problem(8, 1, 1, 3) in result.output
    result = CliRunner().invoke(cli, ["recommend", "--gpus", "8", "--pp", "2", "--mbs", "3", "--gbs", "64"])
    assert result.exit_code == 2
    assert global_batch_problem(64, 3, 4) in result.output


@pytest.mark.parametrize("items,text", [([8], "8"), ([8, 16], "8 and 16"), ([2, 4, 8], "2, 4 and 8"), ([], "")])
def test_lists_read_as_a_sentence(items, text):
    from advisor.render import listed

    assert listed(items) == text


# --- where nothing fits or an estimate does not fit: one wording, dense or MoE ----------------------


def test_dense_and_moe_word_the_states_bound_and_the_hypothetical_step_alike():
    """The clause that no layout's states fit at any --seq-len, and the 'if it fit:' of an oom
    estimate's step, read the same for a dense model and a mixture of experts."""
    import re

    runner = CliRunner()
    clause = re.compile(r", and its weights, gradients and optimizer states alone need [\d.]+ GiB \(more than 80 "
                        r"GiB in every layout, whatever the --seq-len\)")
    for model, gpus in (("llama3-405b", "8"), ("deepseek-v3", "16")):
        result = runner.invoke(cli, ["sweep", "--model", model, "--gpus", gpus, "--gpu", "h100-80gb"])
        assert result.exit_code == 1 and clause.search(result.stderr), result.stderr
        assert "a shorter --seq-len" not in result.stderr
    for args in (["--model", "llama3-405b", "--gpus", "8", "--tp", "8"], ["--model", "mixtral-8x7b", "--gpus", "8",
                                                                            "--ep", "8"]):
        result = runner.invoke(cli, ["estimate", *args, "--gpu", "h100-80gb"])
        assert result.exit_code == 0 and "-> oom\nif it fit: step " in result.stdout, result.output


def test_a_token_budget_reads_as_it_was_given():
    """'--tokens 15T' printed '1.5e+13 tokens'."""
    from advisor.render import si_count

    assert [si_count(n) for n in (15e12, 3e11, 2.5e9, 7e6, 1500, 12)] == ["15T", "300B", "2.5B", "7M", "1.5k", "12"]


def test_report_sweep_names_itself_in_its_summary(advisor, tmp_path):
    """'advisor report sweep' said "advisor sweep: N layouts considered": the command that speaks
    is the one typed."""
    result = advisor("report", "sweep", "--gpus", "64", "--gpu", "h100-80gb", "-o", tmp_path / "r.html")
    assert result.stderr.startswith("advisor report sweep: ") and "layouts considered" in result.stderr


def test_recommend_without_pp_asks_for_it_without_naming_a_mode_never_typed():
    """'advisor recommend --gpus 8' said '--mode megatron needs --pp': --mode megatron is the
    default, so a newcomer who typed no --mode met a flag they never gave."""
    words = refused(cli, "recommend", "--gpus", 8)
    assert words == ("advisor recommend needs --pp P, the number of pipeline stages whose layers it plans "
                     "(--mode megatron, the default; --mode hybrid chooses PP itself, from profiles)")


# --- 7. a Megatron-LM flag the command has no option for: where a whole command is read ---------


@pytest.mark.parametrize("args,flag,reader", [
    (["estimate", "--gpus", 8], "--swiglu", "advisor estimate"),
    (["sweep", "--gpus", 8, "--mem", 80], "--disable-bias-linear", "advisor estimate"),
    (["recommend", "--gpus", 8, "--pp", 2], "--normalization", "advisor estimate"),
    (["compare-log", "train.log", "--from-command", "train.sh"], "--swiglu", "advisor compare-log"),
], ids=lambda value: " ".join(map(str, value))[-30:] if isinstance(value, list) else value)
def test_a_megatron_flag_without_an_option_points_to_from_command(args, flag, reader):
    """'advisor estimate --swiglu' said "No such option '--swiglu'. Did you mean '--gpu'?": a
    Megatron-LM user pasting flags was sent to a GPU preset, not to the reader of their command."""
    words = refused(cli, *args, flag)
    assert words.startswith(f"no such option: {flag} (advisor {args[0]} has no option for this Megatron-LM flag); "
                            f"a whole Megatron-LM command that gives it is read by {reader} --from-command FILE "
                            "('-' reads standard input)")


def test_a_misspelt_option_keeps_clicks_hint():
    assert refused(cli, *EST, "--seq-lenght", 4096).startswith(
        "No such option '--seq-lenght'. (Did you mean one of: '--seq-len', '--seq-length'?)")


@pytest.mark.parametrize("args,words", [
    (["estimate", "--gpus", 8, "--attention-backend", "flash"],
     "Megatron's --attention-backend is the advisor's --flash-attn (a fused kernel, as auto, flash and fused run it; "
     "the default) or --no-flash-attn (unfused, as unfused and local run it)"),
    (["sweep", "--gpus", 8, "--no-create-attention-mask-in-dataloader"],
     "Megatron's --no-create-attention-mask-in-dataloader is the advisor's --dataloader-mask off (its default with "
     "flash attention; Megatron's own default builds the mask: --dataloader-mask cached)"),
], ids=lambda value: str(value[-2] if isinstance(value, list) else "")[:30])
def test_megatrons_attention_flags_point_to_the_advisors_options(args, words):
    """Megatron's own flags for the kernel and the data loader's mask were "No such option" with a
    guess ('--num-attention-heads'): each names the advisor option that prices it."""
    assert refused(cli, *args).removesuffix(f" (see 'cli {args[0]} --help')") == words


def test_an_attention_flag_on_a_command_without_the_option_is_a_megatron_flag_like_any():
    """profile plan has no --flash-attn: the advice to give it would be refused there too."""
    assert refused(cli, "profile", "plan", "--gpus", 4, "--attention-backend", "flash").startswith(
        "no such option: --attention-backend (advisor profile plan has no option for this Megatron-LM flag)")
