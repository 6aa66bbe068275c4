"""``advisor-launch``: the printed commands and scripts, read back the way bash and torchrun read
them, and every bad input as one line with exit status 2 before anything starts."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from launch_support import CPU_TEST_JOB, data_job, launcher, make_checkout, plan_files, subprocess_env, sweep_file, write_json

from conftest import ROOT
from launch.arguments import flag_values
from launch.entry import _parser as entry_parser
from launch.entry import split_argv

SLURM = ROOT / "tests" / "fixtures" / "slurm_standin"


def shell_words(text: str) -> list[str]:
    """The words bash makes of a printed command (backslash-newlines included)."""
    result = subprocess.run(["bash", "-c", 'eval "set -- $1"; printf "%s\\0" "$@"', "_", text],
                            capture_output=True, check=True)
    return result.stdout.decode().split("\0")[:-1]


def read_torchrun(argv: list[str]):
    """torchrun's own parse of a command (after any NAME=value the shell sets for it), and
    launch.entry's parse of the script's arguments."""
    from torch.distributed.run import get_args_parser

    while "=" in argv[0] and not argv[0].startswith("-"):
        argv = argv[1:]
    assert argv[0] == "torchrun"
    torchrun = get_args_parser().parse_args(argv[1:])
    assert torchrun.module and torchrun.training_script == "launch.entry"
    own, megatron = split_argv(torchrun.training_script_args)
    return torchrun, entry_parser().parse_args(own), megatron


@pytest.fixture
def checkout(tmp_path):
    """core 0.15.2's version, in a directory with a space in its name (to test the quoting)."""
    return make_checkout(tmp_path / "Megatron LM", 15)


@pytest.fixture
def checkout19(tmp_path):
    return make_checkout(tmp_path / "Megatron-LM-0.19", 19)


@pytest.fixture
def started(monkeypatch):
    """Every command the launcher would start (none should, in these tests)."""
    calls = []
    monkeypatch.setattr("launch.process.run_process_group", lambda *args, **kwargs: calls.append(args) or 0)
    return calls


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    from conftest import Invoker

    return plan_files(Invoker(), tmp_path_factory.mktemp("plans"))


def test_single_node_dry_run(advisor, tmp_path, checkout, started):
    sweep = sweep_file(advisor, tmp_path / "sweep.json", "--gpus", "8", "--mem", "80")
    row = json.loads(sweep.read_text())[1]
    result = launcher()("torchrun", "--from", sweep, "--rank", 2, "--megatron-lm", checkout, "--profile-dir",
                        tmp_path / "prof", "--run-id", "r1", "--mock-data", "--dry-run", "--", "--train-iters", "10",
                        "--lr", "3e-4")
    words = shell_words(result.stdout)
    assert row["tp"] > 1 and words[0] == "CUDA_DEVICE_MAX_CONNECTIONS=1"  # what Megatron requires with TP > 1
    torchrun, entry, megatron = read_torchrun(words)
    assert torchrun.standalone and torchrun.nproc_per_node == "8" and torchrun.nnodes == "1:1"
    assert (entry.megatron_lm, entry.profile_dir, entry.run_id) == (str(checkout), str(tmp_path / "prof"), "r1")
    values = flag_values(megatron)
    assert values["--tensor-model-parallel-size"] == (str(row["tp"]),) and row["rank"] == 2
    assert values["--micro-batch-size"] == (str(row["mbs"]),) and values["--num-layers"] == ("32",)
    assert values["--vocab-size"] == ("128255",) and "--mock-data" in values  # llama3.1-8b: 128256 - 1
    assert megatron[-4:] == ["--train-iters", "10", "--lr", "3e-4"]
    longest_option = len(shlex.join(["--megatron-lm", str(checkout)])) + 4  # the one unit never split
    assert all(len(line) <= max(100, longest_option + 2) for line in result.stdout.splitlines())
    assert not started and not (tmp_path / "prof").exists()
    assert all(line.startswith(("advisor-launch: ", "warning: ")) for line in result.stderr.splitlines())


def test_multi_node_dry_run(advisor, tmp_path, checkout):
    sweep = sweep_file(advisor, tmp_path / "sweep.json", "--gpus", "16", "--mem", "80")
    common = ["torchrun", "--from", sweep, "--megatron-lm", checkout, "--dry-run"]
    c10d = launcher()(*common, "--rdzv-endpoint", "node001:29500", "--rdzv-id", "job7").stdout
    torchrun, _, _ = read_torchrun(shell_words(c10d))
    assert (torchrun.nnodes, torchrun.nproc_per_node) == ("2", "8") and not torchrun.standalone
    assert (torchrun.rdzv_backend, torchrun.rdzv_endpoint, torchrun.rdzv_id) == ("c10d", "node001:29500", "job7")
    ipv6 = launcher()(*common, "--rdzv-endpoint", "[fd00::1]:29500", "--rdzv-id", "job7").stdout  # a host, bracketed
    assert read_torchrun(shell_words(ipv6))[0].rdzv_endpoint == "[fd00::1]:29500"
    # blanks and newlines are a store key and a file name to torchrun: passed, quoted for the shell
    blanks = launcher()(*common, "--rdzv-endpoint", "node001:29500", "--rdzv-id", "job 7\nb").stdout
    assert read_torchrun(shell_words(blanks))[0].rdzv_id == "job 7\nb"
    static = launcher()(*common, "--nnodes", 4, "--node-rank", 3, "--rdzv-endpoint", "10.0.0.1:6000").stdout
    torchrun, _, megatron = read_torchrun(shell_words(static))
    assert (torchrun.nnodes, torchrun.nproc_per_node, torchrun.node_rank) == ("4", "4", 3)
    assert (torchrun.rdzv_backend, torchrun.master_addr, torchrun.master_port) == ("static", "10.0.0.1", 6000)
    best = json.loads(sweep.read_text())[0]
    assert best["rank"] == 1 and best["gpus"] == 16
    assert flag_values(megatron)["--tensor-model-parallel-size"] == (str(best["tp"]),)


def test_a_plan_keeps_its_layout_through_the_shell(plans, checkout, monkeypatch):
    monkeypatch.setenv("MEGATRON_LM", str(checkout))  # the checkout from the environment
    result = launcher()("torchrun", "--from", plans["pp4"], "--dry-run", "--", "--exit-interval", "-1")
    torchrun, entry, megatron = read_torchrun(shell_words(result.stdout))
    assert torchrun.nproc_per_node == "4" and entry.megatron_lm == str(checkout)
    # plan.json's layers per stage are 2, 2, 3, 1: embedding and loss around them, '|' between stages
    assert flag_values(megatron)["--pipeline-model-parallel-layout"] == ("E,t*2|t*2|t*3|t,L",)
    assert megatron[-2:] == ["--exit-interval", "-1"]


def slurm_env(tmp_path, **extra):
    return subprocess_env(PATH=f"{SLURM}{os.pathsep}{subprocess_env()['PATH']}", SLURM_JOB_NODELIST="node[001-003]",
                          SLURM_NNODES="3", SLURM_JOB_ID="77", SLURM_STANDIN_HOSTS="node001 node002 node003",
                          SLURM_STANDIN_RECORD=str(tmp_path / "slurm.jsonl"), SLURM_CPUS_ON_NODE="64", **extra)


def test_sbatch_script(plans, tmp_path, checkout19):
    checkout = checkout19  # core 0.19: its mock data feeds the TINY model's vocabulary of 1000
    args = ["sbatch", "--from", plans["pp3-tp2"], "--megatron-lm", checkout, "--partition", "gpu", "--account",
            "proj1", "--time", "01:00:00", "--qos", "high", "--requeue", "--signal-time", "120", "--profile-dir",
            "profiles/plan", "--mock-data", "--dry-run", "--", "--train-iters", "5"]
    script = launcher()(*args).stdout
    written = launcher()(*args[:-3], "-o", tmp_path / "job.sh", "--", "--train-iters", "5")
    assert (tmp_path / "job.sh").read_text() == script and written.stdout == ""
    directives = dict((line.removeprefix("#SBATCH --").split("=", 1) + [None])[:2] for line in script.splitlines()
                      if line.startswith("#SBATCH"))
    # the plan: TP 2 x DP 2 x PP 3 = 12 GPUs, planned on nodes of 4; whole nodes; logs by job id;
    # SIGTERM to the steps' tasks (no B:) 120 s before the limit; all of each node's memory, which
    # --exclusive alone does not give (sbatch(1): only the memory requested; --mem=0 is all of it)
    assert directives == {"job-name": "megatron-tiny", "nodes": "3", "ntasks-per-node": "1", "gpus-per-node": "4",
                          "exclusive": None, "mem": "0", "output": "%x-%j.out", "error": "%x-%j.err", "signal": "TERM@120",
                          "requeue": None, "partition": "gpu", "account": "proj1", "qos": "high", "time": "01:00:00"}
    subprocess.run(["bash", "-n", tmp_path / "job.sh"], check=True)
    assert "\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\n" in script  # TP 2, before srun passes the environment on
    # Run it as Slurm would on the first node: srun gets one torchrun command for every node.
    subprocess.run(["bash", tmp_path / "job.sh"], env=slurm_env(tmp_path, SLURM_STANDIN_DRY="1"), check=True)
    (srun,) = [json.loads(line) for line in (tmp_path / "slurm.jsonl").read_text().splitlines()]
    assert srun["argv"][:2] == ["--kill-on-bad-exit=1", "--cpus-per-task=64"]  # the node's CPUs, without --cpus-per-task
    torchrun, entry, megatron = read_torchrun(srun["argv"][2:])
    assert (torchrun.nnodes, torchrun.nproc_per_node, torchrun.rdzv_backend) == ("3", "4", "c10d")
    # The ranks get the signal's lead to save before torchrun kills them: through the variable
    # torch's launcher reads, not --shutdown-timeout, which torch releases before 2026 refuse
    # (every torchrun option written is one torch 2.4's parser has too).
    assert torchrun.shutdown_timeout is None and "\nexport TORCH_ELASTIC_SHUTDOWN_TIMEOUT=120\n" in script
    assert {arg for arg in srun["argv"][3:srun["argv"].index("-m")] if arg.startswith("-")} == {
        "--nnodes", "--nproc-per-node", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id"}
    from torch.distributed.run import config_from_args
    with mock.patch.dict(os.environ, TORCH_ELASTIC_SHUTDOWN_TIMEOUT="120"):
        assert config_from_args(torchrun)[0].shutdown_timeout == 120
    assert (torchrun.rdzv_endpoint, torchrun.rdzv_id) == ("node001:29500", "77")
    assert (entry.megatron_lm, entry.profile_dir) == (str(checkout), "profiles/plan")
    values = flag_values(megatron)
    assert values["--decoder-last-pipeline-num-layers"] == ("2",)  # the plan's 3, 3, 2
    assert values["--vocab-size"] == ("1000",)  # core 0.19's NullTokenizer: the TINY model's 1000 as given
    assert megatron[-3:] == ["--exit-signal-handler", "--train-iters", "5"]  # Megatron catches the SIGTERM


def test_sbatch_submits_and_returns_its_status(plans, tmp_path, checkout, monkeypatch):
    for name, value in slurm_env(tmp_path).items():
        monkeypatch.setenv(name, value)
    common = ["sbatch", "--from", plans["pp4"], "--megatron-lm", checkout]
    job = ["--", *data_job(tmp_path)]
    script = launcher()(*common, "--dry-run", *job).stdout
    launcher()(*common, *job)  # the script on sbatch's stdin
    monkeypatch.setenv("SLURM_STANDIN_EXIT", "3")
    launcher()(*common, "-o", tmp_path / "job.sh", *job, expect=3)  # the file, and sbatch's status
    submitted = [json.loads(line) for line in (tmp_path / "slurm.jsonl").read_text().splitlines()]
    assert [s["argv"] for s in submitted] == [[], [str(tmp_path / "job.sh")]]
    assert submitted[0]["script"] == submitted[1]["script"] == script


def test_an_oom_configuration_is_launched_with_a_warning(advisor, tmp_path):
    sweep = sweep_file(advisor, tmp_path / "sweep.json", "--gpus", "8", "--mem", "40", "--all")
    oom = next(row for row in json.loads(sweep.read_text()) if row["verdict"] == "oom")
    result = launcher()("args", "--from", write_json(tmp_path / "oom.json", oom))
    assert result.stdout.startswith("--num-layers 32 ")
    assert result.stderr.splitlines()[0] == (f"warning: the sweep row ({tmp_path / 'oom.json'}) does not fit: "
                                             f"{oom['total_gib']:.1f} GiB per GPU of 40 GiB (oom)")
    # the one other line: what the launch must set where the row has TP > 1 or CP > 1
    assert all("CUDA_DEVICE_MAX_CONNECTIONS=1" in line for line in result.stderr.splitlines()[1:])
    assert len(result.stderr.splitlines()) == 1 + (oom["tp"] > 1 or oom["cp"] > 1)


GPT_SCRIPT = ("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 24 --hidden-size 2048 --num-attention-heads 16 "
              "--seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 256 "
              "--tensor-model-parallel-size 2 --position-embedding-type learned_absolute --normalization LayerNorm "
              "--vocab-size 50257 --bf16 --lr 1e-4\n")
"""A GPT-style script: a GELU MLP (no --swiglu), LayerNorm, learned positions, linear biases (no
--disable-bias-linear) and Megatron's dropout 0.1 (core_v0.15.2 megatron/training/arguments.py:
--attention-dropout and --hidden-dropout default to 0.1): six ways from the Llama network the
advisor prices, so the estimate's megatron_args are another network (--swiglu, RMSNorm, rope, ...)."""


def gpt_estimate(advisor, directory) -> Path:
    script = directory / "gpt.sh"
    script.write_text(GPT_SCRIPT)
    estimate = directory / "est.json"
    advisor("estimate", "--from-command", script, "--gpu", "h100-80gb", "--format", "json", "-o", estimate)
    return estimate


@pytest.mark.parametrize("command", [
    ["torchrun", "--dry-run"], ["torchrun", "--megatron-lm", "CHECKOUT", "--mock-data"],
    ["sbatch", "--dry-run", "-o", "job.sh"], ["sbatch", "--megatron-lm", "CHECKOUT", "-o", "job.sh"],
    ["args"], ["args", "--format", "json"], ["check", "--megatron-lm", "CHECKOUT"],
    ["k8s", "--image", "img", "--megatron-lm", "/opt/Megatron-LM", "-o", "job.yaml"],
    ["skypilot", "--megatron-lm", "/opt/Megatron-LM", "-o", "task.yaml"],
], ids=lambda command: " ".join(command))
def test_an_estimate_read_from_a_gpt_script_is_refused_by_every_launch(advisor, tmp_path, checkout, started,
                                                                        monkeypatch, command):
    """Launching a GPT script's estimate ran the Llama network it was priced as (its megatron_args:
    --swiglu, RMSNorm, rope, no biases, no dropout), not the script, behind one warning line: each
    command that takes --from now refuses it in one line naming the script, its first two
    differences and both ways on, before anything is written, submitted or started."""
    for name, value in slurm_env(tmp_path).items():
        monkeypatch.setenv(name, value)  # a real sbatch would be recorded in slurm.jsonl
    monkeypatch.chdir(tmp_path)
    estimate = gpt_estimate(advisor, tmp_path)
    words = [str(checkout) if word == "CHECKOUT" else word for word in command]
    line = launcher().error(words[0], "--from", estimate, *words[1:], "--", "--train-iters", "5")
    assert line == (f"Error: the estimate ({estimate}) was read from gpt.sh, which it priced otherwise: no --swiglu, "
                    "--normalization LayerNorm and 4 more (its \"unpriced\" list), so its launch would train what "
                    "was priced, not gpt.sh as written. Give --launch-as-priced to launch what was priced, or change "
                    "gpt.sh so that the advisor prices it as written (each entry says what was priced in its place) "
                    "and estimate it again")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["Megatron LM", "est.json", "gpt.sh"]  # nothing written
    assert started == []


def test_an_estimate_read_from_a_gpt_script_launches_as_priced_when_asked(advisor, tmp_path):
    """--launch-as-priced takes the estimate as priced: the Llama network of its megatron_args, with
    the warning naming every difference from the script."""
    estimate = gpt_estimate(advisor, tmp_path)
    result = launcher()("args", "--from", estimate, "--launch-as-priced")
    words = result.stdout.split()
    assert "--swiglu" in words and "--normalization RMSNorm" in result.stdout and "--disable-bias-linear" in words
    [warning] = [line for line in result.stderr.splitlines() if "was read from" in line]
    assert f"the estimate ({estimate}) was read from gpt.sh, which it priced otherwise: no --swiglu" in warning
    for difference in ("--normalization LayerNorm", "--position-embedding-type learned_absolute",
                       "no --disable-bias-linear", "--attention-dropout 0.1", "--hidden-dropout 0.1"):
        assert difference in warning
    assert warning.endswith("not gpt.sh as written")
    script = launcher()("sbatch", "--from", estimate, "--launch-as-priced", "--dry-run", "-o", tmp_path / "job.sh",
                        "--", "--train-iters", "5")
    assert "was read from gpt.sh" in script.stderr and "--swiglu" in (tmp_path / "job.sh").read_text().split()
    dry = launcher()("torchrun", "--from", estimate, "--launch-as-priced", "--dry-run", "--", "--train-iters", "5")
    assert "--swiglu" in dry.stdout.split()


def test_a_commands_flags_that_change_no_price_are_named_where_not_launched(advisor, tmp_path):
    """An estimate read from a command prices it without its learning rates, clipping, data,
    tokenizer or checkpoints (they change no price), and its megatron_args leave them out: its launch ran
    Megatron's defaults in their place, silently. The estimate records them as written
    ('not_launched') and the launch names those the user does not give after --."""
    script = tmp_path / "train.sh"
    script.write_text("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 24 --hidden-size 2048 "
                      "--num-attention-heads 16 --seq-length 2048 --max-position-embeddings 2048 --swiglu "
                      "--normalization RMSNorm --position-embedding-type rope --disable-bias-linear "
                      "--micro-batch-size 1 --global-batch-size 256 --bf16 --vocab-size 50257 "
                      "--attention-dropout 0 --hidden-dropout 0 "
                      "--lr 3e-4 --clip-grad 1.0 --lr-decay-style cosine --save /ckpt\n")
    estimate = tmp_path / "est.json"
    advisor("estimate", "--from-command", script, "--mem", "80", "-o", estimate)
    # a Llama network priced as written (dropout 0 given: Megatron's default is 0.1), launched without
    # --launch-as-priced
    assert json.loads(estimate.read_text())["unpriced"] == []
    dry = launcher()("torchrun", "--from", estimate, "--dry-run", "--", "--train-iters", "5")
    assert "was read from" not in dry.stderr and "--swiglu" in dry.stdout.split()
    # the vocabulary is read into the model; the rows size it with --make-vocab-size-divisible-by
    assert json.loads(estimate.read_text())["not_launched"] == ["--vocab-size 50257", "--lr 3e-4", "--clip-grad 1.0",
                                                                "--lr-decay-style cosine", "--save /ckpt"]
    result = launcher()("args", "--from", estimate, "--", "--lr", "1e-4", "--save=/mine")
    assert "--clip-grad" not in result.stdout.split()
    [note] = [line for line in result.stderr.splitlines() if "not launched" in line]
    assert note == (f"advisor-launch: train.sh's flags that change no price (data, tokenizer, schedule, logging) or "
                    f"that the advisor does not know are not in the estimate ({estimate}) and not launched: --vocab-size 50257, --clip-grad 1.0, --lr-decay-style cosine (Megatron's "
                    "defaults run instead: give the ones the run needs after --)")
    # the launch's own data (--mock-data) and length (a token budget's --train-samples) stand for the
    # command's --data-path, --vocab-size and --train-iters: not named as left out
    script.write_text(script.read_text().replace("--save /ckpt", "--data-path /d/text --train-iters 100"))
    advisor("estimate", "--from-command", script, "--mem", "80", "-o", estimate)
    result = launcher()("args", "--from", estimate, "--", "--mock-data", "--train-samples", "1000", "--lr", "1e-4")
    [note] = [line for line in result.stderr.splitlines() if "not launched" in line]
    assert note.endswith("not launched: --clip-grad 1.0, --lr-decay-style cosine (Megatron's defaults run instead: "
                         "give the ones the run needs after --)"), note
    # the user's own data stands for the command's data, not for its tokenizer, which the note names
    script.write_text(script.read_text().replace("--data-path /d/text", "--data-path /d/text --tokenizer-type "
                                                 "HuggingFaceTokenizer --tokenizer-model /tok"))
    advisor("estimate", "--from-command", script, "--mem", "80", "-o", estimate)
    result = launcher()("args", "--from", estimate, "--", "--data-path", "/mine", "--train-samples", "1000")
    [note] = [line for line in result.stderr.splitlines() if "not launched" in line]
    assert note.endswith("not launched: --vocab-size 50257, --lr 3e-4, --clip-grad 1.0, --lr-decay-style cosine, "
                         "--tokenizer-type HuggingFaceTokenizer, --tokenizer-model /tok (Megatron's defaults run "
                         "instead: give the ones the run needs after --)"), note


@pytest.mark.parametrize("version, flag", [("0.15", "999"), ("0.19", "1000")])
def test_a_null_tokenizer_without_its_vocabulary_size_is_one_line_and_exit_2(plans, version, flag):
    """Both releases fail on every rank at start-up on a NullTokenizer without --vocab-size: refused
    before anything starts, naming the value that builds the plan's 1,000 rows on that release
    (core_v0.15.2's NullTokenizer adds one row for its end-of-document token; core_v0.19.0's none)."""
    line = launcher().error("args", "--from", plans["pp3"], "--megatron-version", version, "--",
                            "--tokenizer-type", "NullTokenizer")
    assert "--tokenizer-type NullTokenizer (after --) without --vocab-size fails on every rank" in line
    assert f"give --vocab-size {flag}, which builds the priced rows" in line


def test_args_command(plans):
    printed = launcher()("args", "--from", plans["pp3"], "--", "--train-iters", "7").stdout
    as_json = json.loads(launcher()("args", "--from", plans["pp3"], "--format", "json", "--", "--train-iters", "7").stdout)
    assert shell_words(printed) == as_json
    assert as_json == json.loads(plans["pp3"].read_text())["megatron_args"] + ["--train-iters", "7"]


def test_args_warns_as_the_launchers_do_where_megatron_would_refuse_the_arguments(advisor, tmp_path):
    """advisor-launch args printed --transformer-impl local (after --) on an FP8 row without a word,
    where torchrun --dry-run warns that Megatron-LM refuses FP8 without Transformer Engine on every
    rank (launch.preflight.local_implementation_problems) and that the attention is no longer the
    fused one priced; args launches nothing, so both are warnings and the arguments still print."""
    sweep = sweep_file(advisor, tmp_path / "sweep.json", "--gpus", "8", "--gpu", "h100-80gb", "--fp8-format",
                       "hybrid", "--cp", "1", "--top", "1")
    result = launcher()("args", "--from", sweep, "--", "--transformer-impl", "local")
    assert result.stdout.split()[-2:] == ["--transformer-impl", "local"]
    warnings = result.stderr.splitlines()
    assert any(line.startswith("warning: FP8 (--fp8-format: TE's autocast) needs Transformer Engine, and the launch "
                               "has --transformer-impl local: Megatron-LM refuses it on every rank") for line in warnings)
    assert any("runs megatron-core's own unfused attention" in line for line in warnings)
    # the row as priced: nothing to say but the environment its TP or CP needs (test_args_names_...)
    assert not [line for line in launcher()("args", "--from", sweep).stderr.splitlines()
                if "CUDA_DEVICE_MAX_CONNECTIONS=1 with TP > 1 or CP > 1" not in line]


@pytest.mark.parametrize("layout, demand", [
    (("--tp", "2", "--cp", "1"), "CUDA_DEVICE_MAX_CONNECTIONS=1 with TP > 1 or CP > 1 on GPUs before Blackwell"),
    (("--tp", "1", "--cp", "2"), "CUDA_DEVICE_MAX_CONNECTIONS=1 with TP > 1 or CP > 1 on GPUs before Blackwell"),
    (("--tp", "1", "--cp", "1"), None),
    (("--tp", "2", "--cp", "1", "--use-megatron-fsdp"),
     "CUDA_DEVICE_MAX_CONNECTIONS unset or other than 1 under FSDP (--use-megatron-fsdp, --use-torch-fsdp2)"),
])
def test_args_names_the_environment_megatron_asserts_on_stderr(advisor, tmp_path, layout, demand):
    """advisor-launch args printed only the flags of a TP 2 row, which Megatron refuses on every
    rank unless CUDA_DEVICE_MAX_CONNECTIONS=1 (core_v0.15.2 and core_v0.19.0
    megatron/training/arguments.py, validate_args: TP > 1 or CP > 1, before Blackwell, unless FSDP,
    which asserts the opposite); every other launcher sets it. args says so in one line on stderr,
    leaving stdout (what a script captures) the flags alone."""
    estimate = tmp_path / "estimate.json"
    advisor("estimate", "--gpus", "8", "--mem", "80", *layout, "--pp", "1", "--mbs", "1", "--format", "json",
            "-o", estimate)
    result = launcher()("args", "--from", estimate)
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in result.stdout and result.stdout.startswith("--num-layers ")
    said = [line for line in result.stderr.splitlines() if "CUDA_DEVICE_MAX_CONNECTIONS" in line]
    if demand is None:
        assert said == []
    else:
        assert said == [f"advisor-launch: your launch must give every rank {demand}: Megatron-LM core 0.19 "
                        "(megatron/training/arguments.py, validate_args) refuses these arguments otherwise (the other "
                        "advisor-launch commands see to it)"]


def _bad_launch_inputs(sweep, plans, checkout, tmp_path, empty, used, malformed) -> list[tuple]:
    """(arguments, what the one error line says, and more it says) for each bad input."""
    run = ["torchrun", "--from", sweep, "--megatron-lm", checkout]
    return [
        (["torchrun", "--from", sweep, "--megatron-lm", tmp_path / "nope"], "Megatron-LM checkout", "no such directory"),
        (["torchrun", "--from", sweep, "--megatron-lm", empty], f"checkout {empty} has no pretrain_gpt.py", ""),
        (["torchrun", "--from", malformed, "--megatron-lm", checkout], "malformed JSON at line 1", ""),
        (["torchrun", "--from", write_json(tmp_path / "x.json", {"x": 1}), "--megatron-lm", checkout],
         "neither a sweep row, an estimate nor a plan", ""),
        (["torchrun", "--from", plans["hybrid"], "--megatron-lm", checkout],
         "stock Megatron-LM cannot build this hybrid plan", "--mode megatron"),
        ([*run, "--nproc-per-node", 3], "needs 8 GPUs (TP", "not a whole number of nodes of --nproc-per-node 3"),
        ([*run, "--nnodes", 2, "--nproc-per-node", 8], "needs 8 GPUs", "--nnodes 2 x --nproc-per-node 8 = 16"),
        ([*run, "--nproc-per-node", 10**20], "--nproc-per-node", "must be at most 1,024"),
        ([*run, "--nnodes", 10**20], "--nnodes", "must be at most 1,048,576"),
        (["sbatch", "--from", sweep, "--megatron-lm", checkout, "--gpus-per-node", 2000], "--gpus-per-node",
         "must be at most 1,024"),
        (["sbatch", "--from", sweep, "--megatron-lm", checkout, "--nodes", 0], "--nodes", "must be at least 1"),
        (["sbatch", "--from", sweep, "--megatron-lm", checkout, "--nodes", 3], "needs 8 GPUs",
         "which --nodes 3 nodes cannot share equally"),
        ([*run, "--", "--micro-batch-size", "64", "--fp16"], "--micro-batch-size 64 (after --) conflicts with "
         "--micro-batch-size", "--fp16 (after --) conflicts with --bf16"),
        ([*run, "--nnodes", 2, "--nproc-per-node", 4], "2 nodes of 4 GPUs need a rendezvous", "--rdzv-endpoint"),
        ([*run, "--node-rank", 1], "--node-rank and --rdzv-id need --rdzv-endpoint", ""),
        ([*run, "--nnodes", 2, "--nproc-per-node", 4, "--node-rank", 2, "--rdzv-endpoint", "h:1"],
         "--node-rank 2 is not below --nnodes 2", ""),
        ([*run, "--rdzv-endpoint", "node001"], "--rdzv-endpoint must be HOST:PORT", ""),
        # the form is right, the port is not: the message says which (it said only 'must be HOST:PORT')
        ([*run, "--nnodes", 2, "--nproc-per-node", 4, "--rdzv-endpoint", "node001:99999"],
         "--rdzv-endpoint must be HOST:PORT with PORT from 1 to 65,535 (a TCP port), got 'node001:99999'", ""),
        # launched as it was, and failed to resolve on every node
        ([*run, "--nnodes", 2, "--nproc-per-node", 4, "--rdzv-endpoint", "node 001:29500"],
         "--rdzv-endpoint 'node 001:29500': HOST must be a host name or an address", "an IPv6 address in brackets"),
        # torchrun names its log directory after the id (a FileNotFoundError, an OSError on every node once
        # they have met), and its argparse takes '-x' for an option
        *[([*run, "--nnodes", 2, "--nproc-per-node", 4, "--rdzv-endpoint", "h:1", "--rdzv-id", rdzv_id],
           f"--rdzv-id {rdzv_id!r}: torchrun names a log directory after the id", "give at most 246 bytes, without '/'")
          for rdzv_id in ("job/7", "-7", "é" * 124)],
        ([*run, "--nnodes", 2, "--nproc-per-node", 4, "--rdzv-endpoint", "h:1", "--node-rank", 0, "--rdzv-id", "j"],
         "--rdzv-id names a c10d rendezvous, and --node-rank switches to torchrun's static one", "give one or the other"),
        ([*run, "--run-id", "r"], "--run-id names a profiled run", ""),
        ([*run, "--profile-dir", used], "already holds a run's rank files", ""),
        # by its kind: it said '/dev/null is a file'
        ([*run, "--profile-dir", "/dev/null"], "--profile-dir /dev/null is a character device, not a directory", ""),
        ([*run, "--train-iters", "5"], "no such option: --train-iters (Megatron-LM arguments go after '--')", ""),
        (["sbatch", "--from", sweep, "--megatron-lm", checkout, "--job-name", "my job"], "--job-name 'my job'", ""),
        (["sbatch", "--from", sweep, "--megatron-lm", checkout, "--qos", "hi\n#SBATCH --x"], "--qos 'hi\\n#SBATCH", ""),
        (["sbatch", "--from", sweep, "--megatron-lm", checkout, "--partition", ""], "--partition is empty", ""),
        (["sbatch", "--from", sweep, "--megatron-lm", checkout, "--signal-time", 10], "--signal-time",
         "must be at least 60, got 10"),
        (["sbatch", "--from", sweep, "--megatron-lm", checkout, "--cpus-per-task", 0], "--cpus-per-task",
         "must be at least 1, got 0"),
        (["torchrun", "--from", plans["pp4"], "--megatron-lm", checkout, "--mock-data"],
         "Megatron-LM core 0.15's --mock-data feeds token ids up to 4094", "has 1000 rows"),
        (["torchrun", "--from", plans["pp4"], "--megatron-lm", checkout, "--", "--mock-data"],
         "Megatron-LM core 0.15's --mock-data feeds token ids up to 4094", "use a vocabulary of at least 4095"),
        (["torchrun", "--from", sweep, "--megatron-lm", make_checkout(tmp_path / "v17", 17)],
         "Megatron-LM core 0.17.2 (", "is not a version advisor-launch knows; it knows core 0.15"),
        (["torchrun", "--from", sweep, "--megatron-lm", checkout, "--megatron-version", "0.19"],
         "--megatron-version 0.19, but the checkout", "is Megatron-LM core 0.15.2"),
        (["torchrun", "--from", sweep, "--megatron-version", "1.x", "--dry-run"], "--megatron-version '1.x'", ""),
    ]


def test_bad_input_is_one_line_and_starts_nothing(advisor, plans, tmp_path, checkout, started, monkeypatch):
    # no sequence parallelism: the CPU test job's --transformer-impl local refuses it at TP 2
    sweep = sweep_file(advisor, tmp_path / "sweep.json", "--gpus", "8", "--mem", "80", "--no-sequence-parallel")
    empty = tmp_path / "empty"
    empty.mkdir()
    used = tmp_path / "used"
    used.mkdir()
    (used / "rank00000.jsonl").write_text("{}\n")
    malformed = tmp_path / "malformed.json"
    malformed.write_text('{"tp": 2,')
    run = ["torchrun", "--from", sweep, "--megatron-lm", checkout]
    cases = _bad_launch_inputs(sweep, plans, checkout, tmp_path, empty, used, malformed)
    for args, message, more in cases:
        line = launcher().error(*args)
        assert message in line and more in line, (args, line)
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "8")
    for command in ("torchrun", "sbatch"):  # the best row is TP 2: Megatron would refuse 8
        line = launcher().error(command, "--from", sweep, "--megatron-lm", checkout, "--dry-run")
        assert line == ("Error: CUDA_DEVICE_MAX_CONNECTIONS=8 in your environment: Megatron-LM core 0.15 "
                        "(megatron/training/arguments.py, validate_args) requires CUDA_DEVICE_MAX_CONNECTIONS=1 with "
                        "TP > 1 or CP > 1 on GPUs before Blackwell; unset it or set it to 1")
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")  # the value Megatron wants is kept
    deterministic = ["--from", sweep, "--megatron-version", "0.19", "--dry-run", "--", "--deterministic-mode"]
    monkeypatch.setenv("NCCL_ALGO", "Tree")  # core 0.15's list has it; core 0.19's determinism.py refuses it
    for command in ("torchrun", "sbatch"):
        assert launcher().error(command, *deterministic) == (
            "Error: NCCL_ALGO=Tree in your environment: Megatron-LM core 0.19 (megatron/training/arguments.py, "
            "validate_args) refuses it with --deterministic-mode: it accepts a comma-separated list of Ring, "
            "CollnetDirect, CollnetChain, ^NVLS, or unset")
    monkeypatch.delenv("NCCL_ALGO")  # unset: core 0.19 sets Ring itself
    launcher()("torchrun", *deterministic)

    launcher()("torchrun", "--from", sweep, "--megatron-lm", checkout, "--dry-run")
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS")
    if sys.version_info < (3, 12):  # among the preflight's problems (tests/test_launch_preflight.py)
        assert "Error: Megatron-LM core 0.19 needs Python >= 3.12; this is Python 3." in launcher()(
            "torchrun", "--from", sweep, "--megatron-lm", make_checkout(tmp_path / "v19", 19), expect=2).stderr
    monkeypatch.delenv("MEGATRON_LM", raising=False)
    assert "give --megatron-lm DIR (your Megatron-LM checkout) or set MEGATRON_LM" in launcher().error(
        "torchrun", "--from", sweep)
    monkeypatch.setenv("PATH", str(empty))
    cpu_job = ["--mock-data", "--", *CPU_TEST_JOB]
    assert "Error: torchrun not found on PATH" in launcher()(*run, *cpu_job, expect=2).stderr
    assert "sbatch not found on PATH" in launcher().error("sbatch", "--from", sweep, "--megatron-lm", checkout, "--",
                                                          *data_job(tmp_path))
    assert not started and sorted(tmp_path.glob("**/rank*.jsonl")) == [used / "rank00000.jsonl"]


def test_a_dry_run_needs_no_checkout(advisor, tmp_path, monkeypatch):
    """It says which release's rules it assumed; --megatron-version picks the vocabulary rule. A
    checkout it is given must be one (tests/test_launch_strictness.py)."""
    monkeypatch.delenv("MEGATRON_LM", raising=False)
    sweep = sweep_file(advisor, tmp_path / "sweep.json", "--gpus", "8", "--mem", "80")
    newest = launcher()("torchrun", "--from", sweep, "--mock-data", "--dry-run")
    assert newest.stderr.startswith("advisor-launch: no --megatron-lm or $MEGATRON_LM: assuming the rules of "
                                    "Megatron-LM core 0.19 (checked with core_v0.19.0); --megatron-version picks "
                                    "another\n")
    assert flag_values(shell_words(newest.stdout))["--vocab-size"] == ("128256",)
    old = launcher()("torchrun", "--from", sweep, "--megatron-version", "core_v0.15.2", "--mock-data", "--dry-run")
    # the release given is named, not assumed, and no other is offered (audit: it said 'assuming ...;
    # --megatron-version picks another' to a user who had given --megatron-version)
    assert old.stderr.startswith("advisor-launch: no --megatron-lm or $MEGATRON_LM: the rules of Megatron-LM core "
                                 "0.15 (--megatron-version core_v0.15.2; checked with core_v0.15.2)\n")
    assert "assuming" not in old.stderr and "picks another" not in old.stderr
    assert '-m launch.entry --megatron-lm "$MEGATRON_LM" --' in old.stdout  # the shell expands it when run
    monkeypatch.setenv("MEGATRON_LM", "/opt/Megatron-LM")
    torchrun, entry, megatron = read_torchrun(shell_words(old.stdout))
    assert entry.megatron_lm == "/opt/Megatron-LM" and flag_values(megatron)["--vocab-size"] == ("128255",)


def test_help_teaches_and_the_cli_imports_no_torch():
    help_text = launcher()("torchrun", "--help").stdout
    for words in ("after '--'", "--train-iters", "--data-path", "--tokenizer-type", "--mock-data", "Examples:"):
        assert words in help_text
    code = ("import sys, launch.cli, advisor.cli; "
            "print(sorted(m for m in ('torch', 'megatron', 'numpy') if m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"
    core = "import sys, advisor.cli; print([m for m in sys.modules if m.split('.')[0] in ('launch', 'megatron_hooks')])"
    assert subprocess.run([sys.executable, "-c", core], capture_output=True, text=True, check=True).stdout == "[]\n"


def _help_pages(command=None, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every ``advisor-launch`` command and subcommand, groups included, as its argument list."""
    from launch.cli import cli

    command = cli if command is None else command
    children = sorted(getattr(command, "commands", {}).items())  # a click.Group's; none for a command
    return [path, *(page for name, child in children for page in _help_pages(child, (*path, name)))]


@pytest.mark.parametrize("path", _help_pages(), ids=lambda path: " ".join(path) or "advisor-launch")
def test_every_help_page_fits_80_columns(monkeypatch, path):
    """As every ``advisor`` page does (tests/test_terminal_width.py): at COLUMNS=80 the shared
    paragraph on the inputs and the examples (\\b blocks, which click does not rewrap) were up to
    94 characters wide."""
    monkeypatch.setenv("COLUMNS", "80")
    text = launcher()(*path, "--help").stdout
    assert "Usage:" in text
    wide = [line for line in text.splitlines() if len(line) > 80]
    assert not wide, "\n".join(f"{len(line)}: {line}" for line in wide)


def test_a_dry_run_shows_every_priced_lever_and_no_connections_limit_under_fsdp(advisor, tmp_path):
    """Issue 21: the overlap flags and the Megatron-FSDP strategy are in the printed command, and under
    FSDP (with TP > 1) the launcher does not set CUDA_DEVICE_MAX_CONNECTIONS=1, which Megatron refuses there."""
    path = tmp_path / "estimate.json"
    advisor("estimate", "--gpus", "8", "--tp", "2", "--mem", "80", "--use-megatron-fsdp",
            "--data-parallel-sharding-strategy", "optim_grads", "--format", "json", "-o", path)
    result = launcher()("torchrun", "--from", path, "--megatron-version", "0.15", "--mock-data", "--dry-run")
    words = shell_words(result.stdout)
    assert not any(word.startswith("CUDA_DEVICE_MAX_CONNECTIONS") for word in words)
    _, _, megatron = read_torchrun(words)
    values = flag_values(megatron)
    assert values["--data-parallel-sharding-strategy"] == ("optim_grads",) and values["--ckpt-format"] == ("fsdp_dtensor",)
    assert {"--use-megatron-fsdp", "--overlap-grad-reduce", "--overlap-param-gather"} <= set(values)


def test_an_unusable_output_is_one_line_before_any_note(advisor, tmp_path, monkeypatch):
    """-o is checked with the other inputs (advisor.cli.options.output_option, as advisor's own -o),
    and a file that cannot be created after all (/sys as root) is written before the notes (the
    assumed release, the job's length and checkpoint) come out: one line either way."""
    monkeypatch.delenv("MEGATRON_LM", raising=False)
    sweep = sweep_file(advisor, tmp_path / "sweep.json", "--gpu", "h100-80gb", "--gpus", "16", "--tokens", "1T")
    commands = {"sbatch": ["--dry-run"], "skypilot": ["--megatron-lm", "/opt/Megatron"], "k8s": ["--image", "img", "--megatron-lm", "/opt/Megatron"]}
    outputs = {tmp_path / "missing" / "x": "no such directory", tmp_path: "is a directory",
               "/sys/advisor-x": "/sys/advisor-x"}
    for command, more in commands.items():
        for output, message in outputs.items():
            line = launcher().error(command, "--from", sweep, *more, "-o", output, "--", "--train-iters", "20")
            assert message in line, (command, line)
        printed = launcher()(command, "--from", sweep, *more, "-o", "-", "--", "--train-iters", "20")
        text = printed.stdout
        if command != "sbatch":  # the manifests open with comments (what their nodes must hold), then the document
            text = "".join(line for line in text.splitlines(keepends=True) if not line.startswith("#"))
        assert text.startswith(("#!/bin/bash\n", "name: ", "apiVersion: ")), printed.stdout[:40]
    assert not list(tmp_path.glob("*.tmp")) and not (tmp_path / "-").exists()


def test_sbatch_time_limits_are_slurms(advisor, tmp_path):
    """sbatch(1)'s --time formats pass; anything else is one line, as Slurm would refuse it at submit."""
    sweep = sweep_file(advisor, tmp_path / "sweep.json", "--gpus", "8", "--mem", "80")
    for limit in ("30", "30:00", "01:00:00", "2-12", "2-12:30", "2-12:30:15", "UNLIMITED", "infinite", "0"):
        script = launcher()("sbatch", "--from", sweep, "--megatron-version", "0.15", "--time", limit,
                            "--dry-run").stdout
        assert f"\n#SBATCH --time={limit}\n" in script
    for limit in ("abc", "1:", "1.5", "1-2-3", "1:2:3:4", "-1", "1h"):
        line = launcher().error("sbatch", "--from", sweep, "--megatron-version", "0.15", "--time", limit, "--dry-run")
        assert f"--time {limit!r} is not a Slurm time limit: give minutes, MM:SS, HH:MM:SS, D-HH" in line, line
    # Slurm 22.05 keeps a limit up to 2^31 - 60 s and wraps a longer one around into another, without a word
    # (99999999:00:00 became 2973620-03:43:00, 35791394 minutes 2957761-01:03:00)
    for limit in ("24855-03:13:08", "35791393", "596523:13:08"):
        script = launcher()("sbatch", "--from", sweep, "--megatron-version", "0.15", "--time", limit,
                            "--dry-run").stdout
        assert f"\n#SBATCH --time={limit}\n" in script
    for limit in ("24855-03:13:09", "35791394", "99999999:00:00", "35791393:09", "24856-0"):
        line = launcher().error("sbatch", "--from", sweep, "--megatron-version", "0.15", "--time", limit, "--dry-run")
        assert f"--time {limit!r} is longer than Slurm can keep (24855-03:13:08, about 68 years" in line, line


def test_sbatch_warns_where_the_time_limit_is_within_the_signal_lead(advisor, tmp_path):
    """--time 3 (three minutes) with the default --signal-time 300: Slurm sends SIGTERM as the job
    starts (up to 60 s early, its event resolution), and Megatron stops after one iteration. Said
    once on stderr; a limit past the lead and its 60 s, or none (0, UNLIMITED), says nothing."""
    sweep = sweep_file(advisor, tmp_path / "sweep.json", "--gpus", "8", "--mem", "80")
    for limit, signal, warned in (("3", "300", True), ("6:00", "300", True), ("6:01", "300", False),
                                  ("3:00", "60", False), ("2:00", "60", True), ("0", "300", False),
                                  ("UNLIMITED", "300", False), ("01:00:00", "300", False)):
        result = launcher()("sbatch", "--from", sweep, "--megatron-version", "0.15", "--time", limit,
                            "--signal-time", signal, "--dry-run")
        said = [line for line in result.stderr.splitlines() if "Megatron stops after its first iteration" in line]
        assert len(said) == warned, (limit, signal, result.stderr)
        if warned:
            assert said[0].startswith(f"warning: --time {limit} is "), said
        assert f"\n#SBATCH --time={limit}\n" in result.stdout


def test_an_moe_scripts_header_names_its_expert_layout(advisor, tmp_path):
    sweep = sweep_file(advisor, tmp_path / "moe.json", "--model", "mixtral-8x7b", "--gpus", "64", "--gpu", "h100-80gb",
                       "--top", "1")
    row = json.loads(sweep.read_text())[0]
    script = launcher()("sbatch", "--from", sweep, "--megatron-version", "0.15", "--dry-run").stdout
    header = script.splitlines()[1]
    assert f"DP {row['dp']}, EP {row['ep']}, ETP {row['etp']}, MBS {row['mbs']}," in header, header
    dense = launcher()("sbatch", "--from", sweep_file(advisor, tmp_path / "dense.json", "--gpus", "8", "--mem", "80"),
                       "--megatron-version", "0.15", "--dry-run").stdout
    assert "EP" not in dense.splitlines()[1]


def test_sbatch_without_slurm_writes_nothing_and_says_one_line(tmp_path, monkeypatch):
    """No sbatch on PATH (not a login node): one error line before the script is written or any
    note is printed, not a script left behind."""
    from conftest import Invoker
    from launch_support import CPU_TEST_JOB, sweep_file
    from megatron_real import checkout as real_checkout

    sweep = sweep_file(Invoker(), tmp_path / "sweep.json", "--gpus", "8", "--mem", "80", "--no-sequence-parallel")
    monkeypatch.setenv("PATH", "/nonexistent")
    script = tmp_path / "job.sh"
    result = launcher()("sbatch", "--from", sweep, "--megatron-lm", real_checkout("core_v0.15.2").path, "--mock-data",
                        "-o", script, "--", *CPU_TEST_JOB, "--transformer-impl", "local", expect=2)
    assert result.stderr.startswith("Error: sbatch not found on PATH") and result.stderr.count("\n") == 1
    assert not script.exists() and result.stdout == ""


def test_an_oom_warning_quotes_the_memory_the_verdict_was_judged_on(advisor, tmp_path):
    """A calibrated estimate is judged on its usage (reserve included), not the analytic total: a
    warning that quoted the total read as fitting (79.3 GiB of 80, the estimate oom at 96.0)."""
    row = advisor.json("estimate", "--model", "qwen3-30b-a3b", "--gpus", 8, "--ep", 8, "--gpu", "h100-80gb",
                       "--recompute", "full", "--moe-token-dispatcher-type", "flex")
    assert row["verdict"] == "oom" and row["total_gib"] < 80 < row["usage_gib"]
    result = launcher()("args", "--from", write_json(tmp_path / "oom.json", row))
    assert f"does not fit: {row['usage_gib']:.1f} GiB per GPU of 80 GiB (oom)" in result.stderr


def test_tp_across_nodes_is_launched_with_a_warning(advisor, tmp_path):
    """Megatron's TP ranks are consecutive: at 4 ranks per node TP 8 crosses nodes; at 8 it does
    not. An estimate priced on the preset's 8-GPU nodes priced TP 8 over NVLink, and the warning
    says so; one written before rows recorded their gpus_per_node gets the conditional words."""
    estimate = tmp_path / "tp8.json"
    advisor("estimate", "--tp", "8", "--gpus", "16", "--gpu", "h100-80gb", "--format", "json", "-o", estimate)
    older = {key: value for key, value in json.loads(estimate.read_text()).items() if key != "gpus_per_node"}

    def warning(path, per_node: int = 4) -> str:
        result = launcher()("torchrun", "--from", path, "--nproc-per-node", str(per_node), "--nnodes",
                            str(16 // per_node), "--rdzv-endpoint", "node001:29500", "--mock-data", "--dry-run")
        return "".join(line for line in result.stderr.splitlines() if "spans nodes" in line or "span nodes" in line)

    assert warning(estimate, per_node=8) == ""
    known = warning(estimate)
    assert known.startswith(f"warning: the estimate ({estimate}) was priced with TP 8 within a node of 8 GPUs; "
                            "launched at 4 ranks per node, TP groups span nodes:"), known
    assert "TP communication time is too optimistic" in known
    unknown = warning(write_json(tmp_path / "older.json", older))
    assert unknown.startswith("warning: TP 8 spans nodes at 4 ranks per node: its collectives cross the network, "
                              "priced only where the estimate"), unknown
    assert "too optimistic" not in unknown
    # priced on nodes of 4 (TP over the network, as launched), or with no time to be wrong
    across = tmp_path / "across.json"
    advisor("estimate", "--tp", "8", "--gpus", "16", "--gpu", "h100-80gb", "--gpus-per-node", "4", "--format",
            "json", "-o", across)
    assert warning(across).startswith("advisor-launch: TP 8 spans nodes at 4 ranks per node: its collectives cross "
                                      "the network, as the estimate")
    untimed = tmp_path / "untimed.json"
    advisor("estimate", "--tp", "8", "--gpus", "16", "--mem", "80", "--format", "json", "-o", untimed)
    assert "has no step time" in warning(untimed) and "too optimistic" not in warning(untimed)


def span_lines(stderr: str, kind: str) -> str:
    """The launch's lines about ``kind`` ('TP', 'EP') groups crossing nodes."""
    return "".join(line for line in stderr.splitlines() if f"{kind} groups span" in line or "spans nodes" in line)


def test_ep_across_nodes_is_launched_with_a_warning(advisor, tmp_path):
    """An EP group is EP ranks ETP apart (megatron-core's expert RankGenerator: its rank order
    tp-ep-dp-pp with ETP as its TP): EP 8 at ETP 1 is 8 consecutive ranks, split by 4-rank nodes.
    Priced on the preset's 8-GPU nodes its all-to-all went over NVLink; re-priced at 4 GPUs per
    node it goes half over the network and takes longer, so the launch says the time is too
    optimistic, from torchrun and sbatch alike. At 8 ranks per node every EP group fits: no word."""
    estimate, slower = tmp_path / "ep8.json", tmp_path / "ep8-4.json"
    common = ("estimate", "--model", "qwen3-30b-a3b", "--gpus", "16", "--gpu", "h100-80gb", "--ep", "8",
              "--format", "json", "-o")
    advisor(*common, estimate)
    advisor(*common, slower, "--gpus-per-node", "4")
    priced, repriced = json.loads(estimate.read_text()), json.loads(slower.read_text())
    assert (priced["gpus_per_node"], priced["tp"], priced["etp"]) == (8, 1, 1)
    assert repriced["ep_comm_s"] > 2 * priced["ep_comm_s"]  # what the warning is about
    expected = (f"warning: the estimate ({estimate}) was priced with EP 8 within a node of 8 GPUs; launched at 4 "
                "ranks per node, EP groups span nodes: its EP communication time is too optimistic")
    torchrun = launcher()("torchrun", "--from", estimate, "--nproc-per-node", "4", "--nnodes", "4",
                          "--rdzv-endpoint", "node001:29500", "--mock-data", "--dry-run")
    assert span_lines(torchrun.stderr, "EP").startswith(expected), torchrun.stderr
    sbatch = launcher()("sbatch", "--from", estimate, "--gpus-per-node", "4", "--mock-data", "--dry-run")
    assert span_lines(sbatch.stderr, "EP").startswith(expected), sbatch.stderr
    fits = launcher()("torchrun", "--from", estimate, "--nproc-per-node", "8", "--nnodes", "2",
                      "--rdzv-endpoint", "node001:29500", "--mock-data", "--dry-run")
    assert span_lines(fits.stderr, "EP") == "", fits.stderr


def test_ep_priced_across_nodes_warns_only_where_launched_on_smaller_nodes(advisor, tmp_path):
    """EP 16 on 8-GPU nodes was priced across two nodes (8 peers over NVLink, 8 over the network):
    launched so, a note that it is as priced; on 4-rank nodes it has fewer peers inside each, which
    the estimate re-priced at 4 GPUs per node shows slower, and the launch warns."""
    across, smaller = tmp_path / "ep16.json", tmp_path / "ep16-4.json"
    common = ("estimate", "--model", "qwen3-30b-a3b", "--gpus", "16", "--gpu", "h100-80gb", "--ep", "16",
              "--format", "json", "-o")
    advisor(*common, across)
    advisor(*common, smaller, "--gpus-per-node", "4")
    assert json.loads(smaller.read_text())["ep_comm_s"] > json.loads(across.read_text())["ep_comm_s"]

    def lines(path, per_node: int) -> str:
        result = launcher()("torchrun", "--from", path, "--nproc-per-node", str(per_node), "--nnodes",
                            str(16 // per_node), "--rdzv-endpoint", "node001:29500", "--mock-data", "--dry-run")
        return span_lines(result.stderr, "EP")

    as_priced = lines(across, 8)
    assert as_priced.startswith("advisor-launch: EP 16 spans nodes at 8 ranks per node: its collectives cross the "
                                f"network, as the estimate ({across}) priced them (nodes of 8 GPUs)"), as_priced
    assert "too optimistic" not in as_priced
    assert lines(across, 4).startswith(f"warning: the estimate ({across}) was priced with EP 16 across nodes of 8 "
                                       "GPUs; launched at 4 ranks per node, EP groups span more nodes: its EP "
                                       "communication time is too optimistic")
    assert "too optimistic" not in lines(smaller, 4)  # priced on the nodes it is launched on


def test_one_node_for_a_wider_plan_says_each_node_needs_every_rank(advisor, tmp_path):
    """torchrun --nnodes 1 with a 16-GPU row puts its 16 ranks on one node (nodes x ranks per node
    is the world), twice the 8 GPUs per node it was priced with: a note says so."""
    estimate = tmp_path / "tp8.json"
    advisor("estimate", "--tp", "8", "--gpus", "16", "--gpu", "h100-80gb", "--format", "json", "-o", estimate)
    result = launcher()("torchrun", "--from", estimate, "--nnodes", "1", "--mock-data", "--dry-run")
    assert "torchrun --nproc-per-node 16 --standalone" in result.stdout
    assert (f"advisor-launch: 16 ranks per node, more than the 8 GPUs per node the estimate ({estimate}) was priced "
            "with: each node needs 16 GPUs, one per rank") in result.stderr, result.stderr
    two = launcher()("torchrun", "--from", estimate, "--nnodes", "2", "--rdzv-endpoint", "node001:29500",
                     "--mock-data", "--dry-run")
    assert "ranks per node, more than" not in two.stderr


def test_a_flag_the_advisor_does_not_know_is_named_not_refused(advisor, tmp_path):
    """Megatron's own flags the advisor does not price (--empty-unused-memory-level, in NVIDIA's Llama
    3 8B script) are unpriced, but the launch writes nothing in their place: it leaves them out and
    names them for the user to give after -- (as its learning rates), rather than refusing the
    estimate as one priced otherwise (review: the refusal's advice could not be followed but by
    deleting working flags); a flag priced as something else is still refused."""
    script = tmp_path / "train.sh"
    script.write_text("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 24 --hidden-size 2048 "
                      "--num-attention-heads 16 --seq-length 2048 --max-position-embeddings 2048 --swiglu "
                      "--normalization RMSNorm --position-embedding-type rope --disable-bias-linear "
                      "--micro-batch-size 1 --global-batch-size 256 --bf16 --vocab-size 50257 "
                      "--attention-dropout 0 --hidden-dropout 0 --empty-unused-memory-level 2 --lr 3e-4\n")
    estimate = tmp_path / "est.json"
    read = advisor("estimate", "--from-command", script, "--mem", "80", "-o", estimate)
    saved = json.loads(estimate.read_text())
    assert saved["unpriced"] == ["--empty-unused-memory-level (not known to the advisor)"]
    assert saved["not_launched"] == ["--vocab-size 50257", "--lr 3e-4", "--empty-unused-memory-level 2"]
    assert "--launch-as-priced" not in read.stderr  # nothing priced otherwise: no refusal to announce
    result = launcher()("args", "--from", estimate)
    assert "--empty-unused-memory-level" not in result.stdout.split()
    [note] = [line for line in result.stderr.splitlines() if "not launched" in line]
    assert "--empty-unused-memory-level 2" in note
    given = launcher()("args", "--from", estimate, "--", "--empty-unused-memory-level", "2")
    assert not [line for line in given.stderr.splitlines() if "--empty-unused-memory-level" in line]
    script.write_text(script.read_text().replace("--normalization RMSNorm", "--normalization LayerNorm"))
    advisor("estimate", "--from-command", script, "--mem", "80", "-o", estimate)
    assert "--normalization LayerNorm" in launcher().error("args", "--from", estimate)
