"""Issue 17's hostile inputs, through the real commands: each is one line on stderr and exit
status 2 (``Invoker.error`` checks both, and no traceback), or, where it is valid, works.

The readers and validators have their own tests (test_fileio, test_profiles, test_campaign_run,
test_plan_check); this table checks that every command reaches them before any work."""

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from launch_support import launcher, write_json

EXAMPLE_RUN = ROOT / "examples" / "launch" / "profiles" / "pp-b1-2,2,2,2"
HF = json.loads((ROOT / "tests" / "fixtures" / "hf_configs" / "llama3.1-8b.json").read_text())
SWEEP = ["sweep", "--gpus", 8, "--mem", 40]
RECOMMEND = ["recommend", "--profile", EXAMPLE_RUN, "--gpus", 4, "--pp", 4, "--mbs", 1, "--gbs", 4]


def _config(tmp_path, text):
    path = tmp_path / "config.json"
    path.write_text(text)
    return path


def _with(**changes):
    return lambda tmp_path: _config(tmp_path, json.dumps({**HF, **changes}))


def _fifo(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    return tmp_path / "fifo"


def _run_with(edit):
    def make(tmp_path):
        run = tmp_path / "run"
        shutil.copytree(EXAMPLE_RUN, run)
        edit(run / "rank00001.jsonl")
        return run
    return make


def _header(**changes):
    def edit(path):
        lines = path.read_text().splitlines()
        lines[0] = json.dumps({**json.loads(lines[0]), **changes})
        path.write_text("\n".join(lines) + "\n")
    return edit


def _fifo_rank(path):
    path.unlink()
    os.mkfifo(path)


FLAGS = [  # (arguments, what the line says)
    (SWEEP[:-2] + ["--mem", "inf"], "'--mem': must be a finite number, got inf"),
    (SWEEP[:-2] + ["--mem", "nan"], "'--mem': must be a finite number, got nan"),
    (SWEEP[:-2] + ["--mem", "1e400"], "'--mem': must be a finite number, got inf"),
    (SWEEP[:-2] + ["--mem", "100000"], "'--mem': must be at most 16384"),
    (SWEEP + ["--threshold", "nan"], "'--threshold': must be a finite number"),
    (["estimate", "--gpus", 8, "--mem", "nan"], "'--mem': must be a finite number, got nan"),
    (RECOMMEND + ["--mem", "nan"], "'--mem': must be a finite number, got nan"),
    (RECOMMEND + ["--mem", "inf"], "'--mem': must be a finite number, got inf"),
    (SWEEP + ["--num-layers", 10**18], "'--num-layers': must be at most 4,096, got 1000000000000000000"),
    (SWEEP + ["--num-layers", 1000000007], "'--num-layers': must be at most 4,096"),
    (SWEEP + ["--hidden-size", 10**400], "'--hidden-size': must be at most 1,048,576, got a 401-digit number"),
    (SWEEP + ["--seq-len", 10**9], "'--seq-len' / '--seq-length': must be at most 16,777,216"),
    (["sweep", "--gpus", 10**7, "--mem", 40], "'--gpus': must be at most 1,048,576"),
    (SWEEP + ["--gpus-per-node", 0], "'--gpus-per-node': must be at least 1"),
    (["profile", "plan", "--gpus", 8, "--num-layers", 100000, "--mode", "full"], "'--num-layers': must be at most"),
    (["estimate", "--gpus", 8, "--tp", "2.5"], "'--tp' / '--tensor-model-parallel-size': '2.5' is not an integer"),
    (SWEEP + ["--vocab-divisible-by", 10**30], "'--vocab-divisible-by' / '--make-vocab-size-divisible-by': must be at most"),
    (SWEEP + ["--recompute", "full", "--recompute-num-layers", 10**21], "'--recompute-num-layers': must be at most"),
    (SWEEP[:-2] + ["--gpu", "h100-80gb", "--gpus-per-node", 5000], "'--gpus-per-node': must be at most 1,024"),
    (SWEEP[:-2] + ["--gpu", "h100-80gb", "--tokens", "1e400"], "must be a positive, finite token count"),
    (["profile", "run", ROOT / "pyproject.toml", "--out", ""], "--out is empty; give the directory for the runs"),
]


@pytest.mark.parametrize("args,message", FLAGS, ids=[" ".join(map(str, a))[-50:] for a, _ in FLAGS])
def test_hostile_flags(advisor, args, message):
    assert message in advisor.error(*args)


FILES = [  # (make the file under tmp_path, the command given it, what the line says)
    (_with(hidden_size=10**400), "model", "line 1: hidden_size = 100000000000000000000000000... does not fit in 64 bits"),
    (_with(head_dim={}), "model", "head_dim must be a positive integer, got an object"),
    (_with(model_type=["llama"]), "model", "model_type must be a string, got a list"),
    (_with(num_key_value_heads=0), "model", "num_key_value_heads must be a positive integer, got 0"),
    (lambda p: _config(p, "[" * 200_000 + "]" * 200_000), "model", "JSON nested deeper than 64 levels"),
    (lambda p: _config(p, '{"hidden_size": NaN}'), "model", "hidden_size = NaN is not a JSON number"),
    (_fifo, "model", "fifo is a FIFO (named pipe); a model config.json is read from a regular file only"),
    (_fifo, "campaign", "fifo is a FIFO (named pipe); a campaign file is read from a regular file only"),
    (_run_with(lambda path: path.write_bytes(path.read_bytes()[:-2] + b"\xff\n")), "show", "not UTF-8 text"),
    (_run_with(_header(layers_per_stage=["2", "2", "2", "2"])), "show",
     "field 'layers_per_stage' must be a list of integers"),
    (_run_with(_header(world_size=8)), "show", "'world_size' is 8, but TP x CP x PP x DP = "),
    (_run_with(_header(coords={"tp": 3, "cp": 0, "pp": 1, "dp": 0})), "show", "coords tp = 3 is out of range"),
    (_run_with(_header(rank=2)), "show", "rank00001.jsonl: the header says rank 2, the file name another"),
    (_run_with(_header(version=None)), "show", "profile schema version null; this advisor reads"),  # was None
    (_run_with(_header(version=True)), "show", "profile schema version true; this advisor reads"),  # was True
    (_run_with(_fifo_rank), "show", "rank00001.jsonl is a FIFO (named pipe)"),
    (_run_with(lambda path: path.unlink()), "recommend", "no rank file for rank 1 of its world of 4"),
]
COMMANDS = {
    "model": lambda path: SWEEP + ["--model", path],
    "campaign": lambda path: ["profile", "run", path, "--out", path.parent / "runs"],
    "show": lambda path: ["profile", "show", path],
    "recommend": lambda path: ["recommend", "--profile", path, "--gpus", 4, "--pp", 4, "--mbs", 1, "--gbs", 4],
}


@pytest.mark.parametrize("make,command,message", FILES, ids=[f"{c}: {m[:40]}" for _, c, m in FILES])
def test_hostile_files(advisor, tmp_path, make, command, message):
    assert message in advisor.error(*COMMANDS[command](make(tmp_path)))


def test_output_files_that_are_not_replaced(advisor, tmp_path):
    read_only = tmp_path / "old.json"
    read_only.write_text("old")
    read_only.chmod(0o444)
    for target, message in [("/dev/null", "/dev/null is a character device"), ("/dev/full", "/dev/full is a"),
                            (read_only, "is read-only; it is not replaced"), (tmp_path, "is a directory"),
                            (tmp_path / "no" / "x.json", f"no such directory: {tmp_path / 'no'}")]:
        assert message in advisor.error(*SWEEP, "-o", target)
    assert read_only.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["old.json"]


def _advisor(*args, cwd):
    return subprocess.run([sys.executable, "-m", "advisor", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def test_output_files_that_are_written(tmp_path):
    """Real processes (stdout is a pipe here, not CliRunner's buffer): '-' and /dev/stdout are
    standard output; a symbolic link is followed and kept; a new file gets the umask's mode; a
    245-character name works (the temporary name is shortened to fit)."""
    for stdout in ("-", "/dev/stdout"):
        result = _advisor(*SWEEP, "--format", "json", "-o", stdout, cwd=tmp_path)
        assert result.returncode == 0 and json.loads(result.stdout)[0]["rank"] == 1
    (tmp_path / "target.json").write_text("x")
    (tmp_path / "link.json").symlink_to("target.json")
    assert _advisor(*SWEEP, "--format", "json", "-o", "link.json", cwd=tmp_path).returncode == 0
    assert (tmp_path / "link.json").is_symlink() and json.loads((tmp_path / "target.json").read_text())
    long = "a" * 240 + ".json"
    old = os.umask(0o027)
    try:
        assert _advisor(*SWEEP, "-o", long, cwd=tmp_path).returncode == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / long).stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([long, "link.json", "target.json"])


def test_profile_plan_writes_nothing_on_bad_input(advisor, tmp_path):
    out = tmp_path / "campaign.json"
    assert "'--num-layers'" in advisor.error("profile", "plan", "--gpus", 8, "--num-layers", 10**18, "-o", out)
    assert not Path(out).exists()


@pytest.mark.parametrize("counts", ["1x1000000000", "1x" + "9" * 30, "3x5000"])
def test_emulate_layer_counts_are_bounded_before_a_list_is_built(counts):
    """python -m megatron_hooks.emulate --layers-per-stage 1x1000000000 built a list of 10^9
    counts (an out-of-memory) and 1x10^30 an OverflowError traceback."""
    from conftest import Invoker

    from megatron_hooks.emulate import main

    line = Invoker(main).error("--layers-per-stage", counts, "--seq-len", 16, "--out", "unused")
    assert "'--layers-per-stage': more than 4,096 stages" in line


def test_emulate_without_torch_is_one_line(tmp_path):
    """python -m megatron_hooks.emulate where torch cannot be imported dumped a raw
    ModuleNotFoundError; it is one line and exit 2 (torch hidden from a real interpreter)."""
    code = ("import runpy, sys; sys.modules['torch'] = None; sys.argv = ['emulate', '--layers-per-stage', '2,2', "
            f"'--seq-len', '16', '--out', {str(tmp_path / 'out')!r}]; "
            "runpy.run_module('megatron_hooks.emulate', run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 2 and result.stdout == "" and "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        "Error: python -m megatron_hooks.emulate needs torch and megatron-core, and torch cannot be imported here: "
        "pip install torch && pip install -e '.[megatron]'"]
    assert not (tmp_path / "out").exists()


# --- issue 24's hostile inputs -------------------------------------------------------------

ISSUE24 = [  # (arguments, what the line says): each crashed, or was accepted without a word
    (["sweep", "--gpus", 33, "--gpu", "h100-80gb"], "33 GPUs are not whole nodes of 8: give a multiple of 8"),
    (["sweep", "--gpus", 1048575, "--gpu", "h100-80gb"], "1048575 GPUs are not whole nodes of 8"),
    # on nodes of one GPU no layout exists: the time model's rows were a TypeError in space_search._rows
    (["sweep", "--gpus", 33, "--gpu", "h100-80gb", "--gpus-per-node", 1], "no valid (TP, CP, PP, MBS) for 33 GPUs"),
    (["sweep", "--gpus", 1023, "--gpu", "h100-80gb", "--gpus-per-node", 1], "no valid (TP, CP, PP, MBS) for 1023"),
    (["sweep", "--gpus", 3, "--num-layers", 1, "--gpu", "h100-80gb", "--gpus-per-node", 4],
     "no valid (TP, CP, PP, MBS) for 3 GPUs"),
    (SWEEP + ["--gpus-per-node", 3], "8 GPUs are not whole nodes of 3: give a multiple of 3"),
    (["estimate", "--gpus", 8, "--mem", 80, "--gpus-per-node", 3], "8 GPUs are not whole nodes of 3"),
    # N above the layers: block recomputes every layer (both releases run it, tests/test_recompute_layers.py);
    # core 0.15's uniform method fails on it, so no even split is left
    (SWEEP + ["--recompute", "full", "--recompute-method", "uniform", "--recompute-num-layers", 99, "--split", "even",
              "--megatron-version", "0.15"],
     "with --recompute-method uniform --recompute-num-layers 99, every model chunk's layers a multiple of it"),
    (["estimate", "--gpus", 3, "--pp", 3, "--vpp", 11, "--mem", 80], "32 layers cannot fill PP 3 x VPP 11"),
]


@pytest.mark.parametrize("args,message", ISSUE24, ids=[" ".join(map(str, a))[-50:] for a, _ in ISSUE24])
def test_issue24_flags(advisor, args, message):
    assert message in advisor.error(*args)


def test_a_config_without_model_type_is_refused(advisor, tmp_path):
    """Without model_type it was read as Llama: a guess about the architecture. The line names
    every family the reader takes, the mixtures of experts too, as an unknown model_type's does."""
    path = _config(tmp_path, json.dumps({k: v for k, v in HF.items() if k != "model_type"}))
    assert ("model_type is missing: give the model's family (dense: llama, mistral, qwen2, qwen3; mixtures of "
            "experts: mixtral, qwen3_moe, deepseek_v3, kimi_k2)") in advisor.error(*SWEEP, "--model", path)


def test_a_campaign_whose_flags_build_another_model_is_refused(advisor, tmp_path):
    """The CPU emulator ran the edited flags' size; the real path blamed the output directory."""
    campaign = json.loads((ROOT / "tables" / "data" / "capture" / "campaigns" / "heldout-pp2.json").read_text())
    args = campaign["runs"][0]["megatron_args"]
    args[args.index("--hidden-size") + 1] = "256"
    path = tmp_path / "campaign.json"
    path.write_text(json.dumps(campaign))
    line = advisor.error("profile", "run", path, "--out", tmp_path / "runs")
    assert "'megatron_args' give --hidden-size 256, but the campaign's model and seq_len say 128" in line


def test_closed_stdout_is_one_line(tmp_path):
    """'>&-': sys.stdout is None; color_wanted called .isatty() on it (an AttributeError)."""
    result = subprocess.run([sys.executable, "-m", "advisor", *map(str, SWEEP), "--top", "1"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, timeout=120, cwd=tmp_path,
                            preexec_fn=lambda: os.close(1))
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["Error: standard output is closed; redirect it to a file or /dev/null"]


@pytest.mark.parametrize("module, args, what", [
    ("advisor", ["estimate", "--from-command", "-"], "the command file"),
    ("advisor", ["compare-log", "-", "--from-command", "-x-"], "the training log"),
    ("launch", ["args", "--from", "-"], "the launch input"),
])
def test_closed_stdin_is_one_line(tmp_path, module, args, what):
    """'<&-' (a cron job, a daemon): sys.stdin is None, and '-' read sys.stdin.buffer (an
    AttributeError traceback, exit 1)."""
    (tmp_path / "-x-").write_text("--num-layers 2\n")  # compare-log reads the log first
    result = subprocess.run([sys.executable, "-m", module, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, timeout=120, cwd=tmp_path, preexec_fn=lambda: os.close(0))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"Error: standard input is closed; pipe in {what} or give a file name instead of '-'"]


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_a_full_standard_output_is_named(tmp_path, fmt):
    """'advisor sweep > /dev/full' (a full disk behind '> file'): the error named no file, 'Error: No
    space left on device', as if an input were the trouble; it says stdout's now, exit status 2."""
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "advisor", *map(str, SWEEP), "--format", fmt], stdout=full,
                                stderr=subprocess.PIPE, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == "Error: standard output: No space left on device", result.stderr


@pytest.mark.parametrize("command", [["args"], ["args", "--format", "json"], ["torchrun", "--dry-run"],
                                     ["sbatch", "--dry-run"]])
def test_advisor_launch_names_a_full_standard_output_too(advisor, tmp_path, command):
    """advisor-launch's printed lists, commands and scripts (> /dev/full) said 'Error: No space left
    on device' after 461b9bb, which named stdout for advisor's own output only."""
    sweep = tmp_path / "sweep.json"
    advisor(*SWEEP, "--format", "json", "-o", sweep)
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "launch", *command, "--from", str(sweep), "--megatron-version",
                                 "0.15", "--mock-data", "--", "--lr", "3e-4"], stdout=full, stderr=subprocess.PIPE,
                                text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == "Error: standard output: No space left on device", result.stderr


def test_a_reader_that_leaves_gets_no_error_line(tmp_path):
    """'advisor sweep | head -0': the pipe closed before the table was written was 'Error: Broken
    pipe' with exit 2, as if the input were bad; now click's own exit 1 without a word."""
    process = subprocess.Popen([sys.executable, "-m", "advisor", *map(str, SWEEP), "--top", "1"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    process.stdout.close()  # before the interpreter has started: nothing is read
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) == 1
    assert "Error" not in stderr and "Traceback" not in stderr


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_package_info_is_read_through_the_bounded_reader(tmp_path, kind):
    """A FIFO hung the launcher (advisor-launch torchrun --dry-run, args, profile run
    --megatron-lm); a link to /dev/zero was read without end (MemoryError)."""
    from launch_support import launcher, make_checkout

    from conftest import Invoker

    checkout = make_checkout(tmp_path / "megatron-lm")
    info = checkout / "megatron" / "core" / "package_info.py"
    info.unlink()
    os.mkfifo(info) if kind == "fifo" else info.symlink_to("/dev/zero")
    sweep = tmp_path / "sweep.json"
    Invoker()(*SWEEP, "--top", 1, "--format", "json", "-o", sweep)
    line = launcher().error("args", "--from", sweep, "--megatron-lm", checkout)
    assert line.endswith("package_info.py is a FIFO (named pipe); a package_info.py is read from a regular file only"
                         if kind == "fifo" else "package_info.py is a character device; a package_info.py is read "
                                                "from a regular file only")


EST = ["estimate", "--mem", 40]
OWN = [  # issue 24: thirty more, each tried for real first (all already one line; kept so they stay so)
    (["sweep", "--gpus", 0, "--mem", 40], "'--gpus': must be at least 1, got 0"),
    (["sweep", "--gpus", 8, "--mem", -5], "'--mem': must be above 0, got -5"),
    (SWEEP + ["--gbs", 0], "'--gbs' / '--global-batch-size': must be at least 1, got 0"),
    (EST + ["--tp", 3, "--gpus", 3], "TP 3 must divide the attention heads (32) and the KV heads (8)"),
    (EST + ["--cp", 3, "--gpus", 3], "sequence length 8192 must be divisible by 2 x CP = 6"),
    (EST + ["--tp", 2, "--gpus", 3], "--gpus 3 is not divisible by TP x CP x PP = 2 x 1 x 1 = 2"),
    (EST + ["--pp", 2, "--gpus", 2, "--layers-per-stage", "10,10,10"], "--layers-per-stage lists 3 stages, but PP is 2"),
    (EST + ["--pp", 2, "--gpus", 2, "--layers-per-stage", "a,b"], "--layers-per-stage: expected comma-separated layer counts"),
    (EST + ["--pp", 2, "--gpus", 2, "--layers-per-stage", "-1,33"], "must be non-negative and sum to 32 layers"),
    (EST + ["--vpp", 0, "--gpus", 2, "--pp", 2], "'--vpp' / '--num-virtual-stages-per-pipeline-rank': must be at least 1, got 0"),
    (EST + ["--dp", 3, "--gpus", 8], "--dp 3 disagrees with --gpus 8 / (TP x CP x PP) = 8"),
    (EST + ["--mbs", 3, "--gpus", 8], "--gbs 1024 is not divisible by MBS x DP = 3 x 8 = 24"),
    (EST + ["--gpus", 8, "--seq-len", 8191, "--cp", 2], "sequence length 8191 must be divisible by 2 x CP = 4"),
    (EST + ["--pp", 4, "--vpp", 2, "--gpus", 4, "--gbs", 6], "the interleaved schedule needs the microbatches (6)"),
    (EST + ["--gpus", 8, "--threshold", 1.5], "'--threshold': must be at most 1, got 1.5"),
    (EST + ["--gpus", 8, "--tokens", "15T"], "--tokens needs --gpu NAME"),
    (["sweep", "--gpus", 8, "--gpu", "h100-80gb", "--tokens", "-5"], "'-5' must be a positive, finite token count"),
    (["sweep", "--gpus", 8, "--gpu", "h100-80gb", "--tokens", "15Q"], "'15Q' is not a token count"),
    # a budget counts whole tokens: 1.5 and 1e-3 are not counts (4.1T = 4.1 x 10^12 is: test_estimate_csv)
    (["sweep", "--gpus", 8, "--gpu", "h100-80gb", "--tokens", "1.5"],
     "'1.5' is 1.5 tokens, not a whole number: a token count is an integer"),
    (EST + ["--gpus", 8, "--gpu", "h100-80gb", "--tokens", "1e-3"], "'1e-3' is 0.001 tokens, not a whole number"),
    # 1e40 tokens printed 10^25 days; the bound is limits.TOKENS, far beyond any published run
    (["sweep", "--gpus", 8, "--gpu", "h100-80gb", "--tokens", "1e40", "--top", 2],
     "'--tokens': must be at most 1e+17, got 1e+40: the largest published training runs"),
    (EST + ["--gpus", 8, "--gpu", "h100-80gb", "--tokens", "200P"], "'--tokens': must be at most 1e+17, got 2e+17"),
    (["sweep", "--gpus", 8, "--gpu", "nonexistent-gpu"], "unknown GPU 'nonexistent-gpu'"),
    (SWEEP + ["--top", -1], "'--top': must be at least 1, got -1"),
    (SWEEP + ["--model", "nonexistent-model"], "unknown model 'nonexistent-model'"),
    (SWEEP + ["--model", "/dev/null"], "/dev/null is a character device; a model config.json is read from a regular"),
    (SWEEP + ["--model", ROOT / "tests"], "tests is a directory without a config.json"),
    (SWEEP + ["--num-query-groups", 5], "num_attention_heads = 32 must be a multiple of num_query_groups = 5"),
    (SWEEP + ["--hidden-size", 4097], "hidden_size = 4097 must be a multiple of num_attention_heads = 32"),
    (SWEEP + ["--rank-by", "throughput"], "--rank-by throughput needs --gpu NAME"),
    (SWEEP + ["--memory-model", "profile"], "--memory-model profile needs --profile DIR"),
    (SWEEP + ["--profile", "/nonexistent"], "--profile /nonexistent: no such directory"),
    (SWEEP + ["--vpp", 0], "--vpp must be auto or a positive integer, got '0'"),
    (SWEEP + ["--vpp", 64], "VPP 64 needs PP > 1, at least 64 layers per stage"),
    (["gpus", "--format", "xml"], "'xml' is not one of 'table', 'json', 'csv'"),
    (["profile", "plan", "--gpus", 8, "--fractions", "0.5"], "--fractions 0.5: give two different fractions of --mbs in (0, 1]"),
    (["profile", "plan", "--gpus", 8, "--fractions", "2,3"], "--fractions 2,3: give two different fractions of --mbs in (0, 1]"),
    (["profile", "plan", "--gpus", 8, "--units", "1,2"], "--units 1,2 sums to 3 layers, not the model's 32"),
    (["profile", "plan", "--gpus", 8, "--gpus-per-node", 3], "--gpus 8 is not a whole number of nodes of 3 GPUs"),
    (["profile", "show", ROOT / "pyproject.toml"], "pyproject.toml: not a directory"),
]


@pytest.mark.parametrize("args,message", OWN, ids=[" ".join(map(str, a))[-50:] for a, _ in OWN])
def test_issue24_own_hostile_inputs(advisor, args, message):
    assert message in advisor.error(*args)


def test_nothing_fits_is_exit_1_with_one_line(advisor):
    result = advisor(*SWEEP[:-2], "--mem", "1e-30", expect=1)
    assert result.stdout == "" and len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith("advisor sweep: nothing fits: 0 fits, 0 tight, 205 oom")


def test_a_tiny_memory_is_a_share_too_large_to_show_not_hundreds_of_digits(advisor):
    """--mem 1e-300 is valid (nothing fits): the captions' share of it was printed in full, a
    number of 300 digits; JSON keeps the number (advisor.render.percent_text)."""
    peak = next(line for line in advisor("estimate", "--gpus", "8", "--mem", "1e-300").stdout.splitlines()
                if line.startswith("peak:"))
    assert peak.endswith(" GiB (Eq. 18) = >10000% of 1e-300 GiB -> oom"), peak
    caption = advisor("recommend", "--gpus", "16", "--tp", "2", "--pp", "4", "--gbs", "64", "--mem", "1e-300",
                      expect=1).stdout
    assert "(>10000% of 1e-300 GiB) -> oom" in caption
    estimate = advisor.json("estimate", "--gpus", "8", "--mem", "1e-300")
    assert estimate["memory_fraction"] > 1e300


# --- issue 24, item 4: the features added since (MoE, training options, --from-command, compare-log) ---------

MIXTRAL = ["estimate", "--model", "mixtral-8x7b", "--gpus", 8, "--ep", 8, "--gpu", "h100-80gb"]
SINCE = [  # (arguments, what the line says): each was a traceback, found by a fuzzing of every option
    (MIXTRAL + ["--moe-imbalance", "1e300", "--format", "json"], "'--moe-imbalance': must be at most 16384, got 1e+300"),
    (MIXTRAL + ["--moe-imbalance", "nan"], "'--moe-imbalance': must be a finite number, got nan"),
    (MIXTRAL + ["--moe-routing", "capacity", "--moe-expert-capacity-factor", "1e308"],
     "'--moe-expert-capacity-factor': must be at most 16384, got 1e+308"),
    (MIXTRAL + ["--moe-routing", "capacity", "--moe-expert-capacity-factor", "0"],
     "'--moe-expert-capacity-factor': must be above 0, got 0"),
    (MIXTRAL + ["--mtp-num-layers", 17], "'--mtp-num-layers': must be at most 16, got 17"),
    # read and ignored, where their siblings were refused
    (MIXTRAL + ["--moe-routing", "balanced", "--moe-expert-capacity-factor", "1.25"],
     "--moe-expert-capacity-factor drops tokens (capacity routing); --moe-routing balanced routes every token"),
    (MIXTRAL + ["--recompute-modules", "moe"], "--recompute-modules needs --recompute selective (this estimate "
                                                "recomputes none)"),
    (MIXTRAL + ["--recompute", "full", "--recompute-modules", "moe"], "(this estimate recomputes full)"),
    (["sweep", "--model", "mixtral-8x7b", "--gpus", 64, "--gpu", "h100-80gb", "--recompute", "none",
      "--recompute-modules", "moe"], "--recompute-modules needs --recompute selective (this sweep recomputes none)"),
    # Transformer Engine runs MXFP8 on Blackwell only (it was priced on Hopper)
    (MIXTRAL + ["--fp8-format", "hybrid", "--fp8-recipe", "mxfp8"],
     "--fp8-recipe mxfp8 needs Blackwell tensor cores; h100-80gb is hopper"),
    (["sweep", "--gpus", 16, "--gpu", "h100-80gb", "--fp8-format", "hybrid", "--fp8-recipe", "mxfp8"],
     "--fp8-recipe mxfp8 needs Blackwell tensor cores; h100-80gb is hopper"),
]


@pytest.mark.parametrize("args,message", SINCE, ids=[" ".join(map(str, a))[-50:] for a, _ in SINCE])
def test_since_issue24_flags(advisor, args, message):
    assert message in advisor.error(*args)


def test_a_capacity_factor_alone_is_capacity_routing_as_in_megatron(advisor):
    row = advisor.json(*MIXTRAL, "--moe-expert-capacity-factor", "1.25")
    assert (row["routing"], row["capacity_factor"]) == ("capacity", 1.25)


def test_a_commands_recompute_modules_without_selective_are_priced_as_megatron_ignores_them(advisor, tmp_path):
    path = tmp_path / "train.sh"
    path.write_text(MOE_COMMAND.rstrip() + " --recompute-modules moe\n")
    result = advisor("estimate", "--from-command", path, "--gpus", 4, "--mem", 80, "--format", "json")
    row = json.loads(result.stdout)
    assert (row["recompute"], row["recompute_modules"]) == ("none", None)
    assert "--recompute-modules without --recompute-granularity selective (Megatron ignores them" in result.stderr


def test_expert_parallelism_without_experts_is_refused(advisor, tmp_path):
    """Megatron's validate_args asserts it; it was priced as the dense model, exit 0."""
    path = tmp_path / "train.sh"
    path.write_text(MOE_COMMAND.replace("--num-experts 4 --moe-router-topk 2 --moe-grouped-gemm ", ""))
    assert ("--expert-model-parallel-size 2 without --num-experts: Megatron-LM refuses expert parallelism without "
            "experts") in advisor.error("estimate", "--from-command", path, "--gpus", 4, "--mem", 80)


def test_mxfp8_is_priced_on_blackwell(advisor):
    for model in (["--model", "mixtral-8x7b", "--ep", 8], []):
        row = advisor.json("estimate", *model, "--gpus", 8, "--gpu", "b200-180gb", "--fp8-format", "hybrid",
                           "--fp8-recipe", "mxfp8")
        assert row["step_time_s"] > 0 and row["options"]["fp8_recipe"] == "mxfp8"


def test_a_pinned_vpp_sweeps_moe_layouts(advisor):
    """An MoE sweep with --vpp 2 and a GPU: no plain (VPP 1) sibling to prune the interleaved
    layouts by, and an empty space ended in numpy's IndexError; every row has the VPP asked for."""
    rows = advisor.json("sweep", "--model", "mixtral-8x7b", "--gpus", 64, "--gpu", "h100-80gb", "--vpp", 2)
    assert rows and {row["vpp"] for row in rows} == {2} and rows[0]["rank"] == 1


MOE_COMMAND = (ROOT / "tests" / "data" / "logs" / "core_v0.15.2_cpu_pp2.command").read_text().replace(
    "--seq-length 32", "--num-experts 4 --moe-router-topk 2 --moe-grouped-gemm --expert-model-parallel-size 2 "
    "--moe-token-dispatcher-type alltoall --seq-length 32")
COMMANDS_SINCE = [  # (what the command adds, what the line says): read and priced, or a traceback or a hang
    ("--moe-expert-capacity-factor nan", "--moe-expert-capacity-factor must be a finite number, got nan"),
    ("--moe-expert-capacity-factor -1", "--moe-expert-capacity-factor must be above 0, got -1"),
    ("--moe-expert-capacity-factor 1e400", "--moe-expert-capacity-factor must be a finite number, got inf"),
    ("--mtp-num-layers 1000", "--mtp-num-layers must be at most 16, got 1000"),
    ("--moe-router-topk-scaling-factor 0", "--moe-router-topk-scaling-factor must be above 0, got 0"),
    ("--pipeline-model-parallel-layout 'E|t*99999999999999|t,L'", "'t*99999999999999' unrolls past 16,384 layers"),
    ("--pipeline-model-parallel-layout 'E|(t|)*99999999,L'", "'(t|)*99999999' unrolls past 16,384 layers"),
    ("--pipeline-model-parallel-layout '" + "t*9000|" * 2000 + "'", "'t*9000' unrolls past 16,384 layers"),
]


@pytest.mark.parametrize("extra,message", COMMANDS_SINCE, ids=[e[:50] for e, _ in COMMANDS_SINCE])
def test_since_issue24_commands(advisor, tmp_path, extra, message):
    path = tmp_path / "train.sh"
    path.write_text(MOE_COMMAND.rstrip() + " " + extra + "\n")
    assert message in advisor.error("estimate", "--from-command", path, "--mem", 80)


EXPANDS = "the variables' expansions add more than 262,144 characters to the script"


@pytest.mark.parametrize("script,message", [
    ("A=1\n" + "A=$A$A\n" * 60 + "torchrun pretrain_gpt.py --lr $A\n", "line 17: a word of 65,538 characters"),
    ("V=$V$V$V\n" * 40 + "echo $V\n", EXPANDS),
    ("A=(x)\n" + "A=(${A[@]} ${A[@]})\n" * 60 + "torchrun pretrain_gpt.py ${A[@]}\n", EXPANDS),
    (f"A=({'x ' * 70_000})\ntorchrun pretrain_gpt.py \"${{A[@]}}\" \"${{A[@]}}\"\n", EXPANDS),
], ids=["doubling", "tripling", "doubling array", "array"])
def test_expansions_are_bounded(advisor, tmp_path, script, message):
    """Variables that double a line each time ran to 2^60 characters (a hang)."""
    path = tmp_path / "train.sh"
    path.write_text(script)
    assert message in advisor.error("estimate", "--from-command", path)


@pytest.mark.parametrize("value", ["nan", "inf", "1e999", "9" * 5000])
def test_a_log_with_a_non_finite_number(advisor, tmp_path, value):
    """A log's 'nan' or '1e999' (inf) went into the JSON document: a ValueError traceback."""
    logs = ROOT / "tests" / "data" / "logs"
    text = (logs / "core_v0.15.2_cpu_pp2.log").read_text()
    path = tmp_path / "train.log"
    path.write_text(text.replace("max allocated: 0.0", f"max allocated: {value}", 1))
    line = advisor.error("compare-log", path, "--from-command", logs / "core_v0.15.2_cpu_pp2.command", "--gpu",
                         "h100-80gb", "--format", "json")
    shown = repr(value) if len(value) < 40 else "'" + "9" * 36 + "..."  # 5,000 digits were written whole
    assert f"of the log: {shown} is not a finite number" in line


@pytest.mark.parametrize("old,new,number", [
    ("max allocated: 0.0", "max allocated: -1", 685),
    ("per iteration (ms): 531.2", "per iteration (ms): -531.2", 697),
    ("per iteration (ms): 988.6", "per iteration (ms): -988.6", 684),
    ("throughput per GPU (TFLOP/s/GPU): 0.0", "throughput per GPU (TFLOP/s/GPU): -4.5", 684),
], ids=["memory", "iteration", "first iteration", "throughput"])
def test_a_log_with_a_negative_number(advisor, tmp_path, old, new, number):
    """A number's sign failed the line's pattern: a negative memory report, or iteration, was
    skipped with exit 0 (another step time), and one on every iteration line read as no iteration."""
    logs = ROOT / "tests" / "data" / "logs"
    text = (logs / "core_v0.15.2_cpu_pp2.log").read_text()
    path = tmp_path / "train.log"
    path.write_text(text.replace(old, new, 1))
    line = advisor.error("compare-log", path, "--from-command", logs / "core_v0.15.2_cpu_pp2.command", "--gpu",
                         "h100-80gb")
    value = new.rsplit(" ", 1)[1]
    assert line == (f"Error: line {number} of the log: {value!r} is negative; compare-log reads only measured "
                    "times and memory")


@pytest.mark.parametrize("old,new,number,words", [
    ("per iteration (ms): 531.2", "per iteration (ms): 1e300", 697,
     "elapsed time per iteration (ms) must be at most 6.048e+08, got 1e+300: a week"),
    ("throughput per GPU (TFLOP/s/GPU): 0.0", "throughput per GPU (TFLOP/s/GPU): 2e5", 684,
     "throughput per GPU (TFLOP/s/GPU) must be at most 100000, got 200000: "),
    ("max allocated: 0.0", "max allocated: 1e300", 685, "memory (MB) must be at most 1.67772e+07, got 1e+300: "),
    ("total=6.06 MB", "total=1e30 MB", 694, "memory (MB) must be at most 1.67772e+07, got 1e+30: "),
], ids=["iteration", "throughput", "memory", "theoretical"])
def test_a_log_with_an_absurd_number(advisor, tmp_path, old, new, number, words):
    """A finite number no GPU run logs: an iteration of 1e300 ms was compared, exit 0, as a step
    time of 10^297 s against the estimate's 0.135 s."""
    logs = ROOT / "tests" / "data" / "logs"
    path = tmp_path / "train.log"
    path.write_text((logs / "core_v0.15.2_cpu_pp2.log").read_text().replace(old, new, 1))
    line = advisor.error("compare-log", path, "--from-command", logs / "core_v0.15.2_cpu_pp2.command", "--gpu",
                         "h100-80gb")
    assert line.startswith(f"Error: line {number} of the log: {words}")


@pytest.mark.parametrize("old,new,number,words", [
    ("iteration        2/", "iteration " + "9" * 5000 + "/", 697, "iteration"),
    ("[Rank 1] (after 1 iterations)", "[Rank " + "7" * 5000 + "] (after 1 iterations)", 685, "rank"),
    ("(after 1 iterations)", "(after " + "1" * 5000 + " iterations)", 685, "the report's iteration count"),
    ("global batch size:     4", "global batch size: " + "4" * 5000, 684, "global batch size"),
    ("skipped iterations:   0", "skipped iterations: " + "1" * 25, 684, "number of skipped iterations"),
], ids=["iteration", "rank", "after", "batch", "skipped"])
def test_a_log_with_an_integer_beyond_int64(advisor, tmp_path, old, new, number, words):
    """int() of over 4,300 digits is a ValueError: each of these was a traceback."""
    logs = ROOT / "tests" / "data" / "logs"
    path = tmp_path / "train.log"
    path.write_text((logs / "core_v0.15.2_cpu_pp2.log").read_text().replace(old, new, 1))
    line = advisor.error("compare-log", path, "--from-command", logs / "core_v0.15.2_cpu_pp2.command")
    got = "1" * 25 if len(new) < 100 else "a 5,000-digit number"
    assert line == (f"Error: line {number} of the log: {words} must be at most 9,223,372,036,854,775,807, got {got}: "
                    "torch and Megatron-LM count in int64")


def test_a_log_negative_on_every_iteration_line(advisor, tmp_path):
    logs = ROOT / "tests" / "data" / "logs"
    text = (logs / "core_v0.15.2_cpu_pp2.log").read_text()
    path = tmp_path / "train.log"
    path.write_text(text.replace("per iteration (ms): ", "per iteration (ms): -"))
    line = advisor.error("compare-log", path, "--from-command", logs / "core_v0.15.2_cpu_pp2.command")
    assert line.startswith("Error: line 684 of the log: '-988.6' is negative")


@pytest.mark.parametrize("script,message", [
    ("A='\n" + "x\n" * 200_000, "line 1: an unclosed quote or array runs to the end of the text"),
    ('A="\n' + '\\"\n' * 200_000, "line 1: an unclosed quote or array runs to the end of the text"),
    ("A=(\n" + "')'\n" * 200_000, "line 1: an unclosed quote or array runs to the end of the text"),
    ("torchrun pretrain_gpt.py --data-path " + "x" * 900_000 + "\n", "line 1: a word of 900,000 characters"),
    ("#SBATCH --comment '" + "y " * 400_000 + "'\ntorchrun pretrain_gpt.py\n", "line 1: a word of 800,002 characters"),
], ids=["open quote", "open escaped quotes", "open array", "long word", "long #SBATCH word"])
def test_long_scripts_are_read_in_linear_time(advisor, tmp_path, script, message):
    """Each line of a quote or array left open re-read the whole text (minutes over a long
    file), and shlex builds a word one character at a time (a word of 1 MiB: minutes)."""
    path = tmp_path / "train.sh"
    path.write_text(script)
    assert message in advisor.error("estimate", "--from-command", path)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A dense sweep, an MoE sweep and a plan, as the commands save them."""
    from conftest import Invoker

    where = tmp_path_factory.mktemp("saved")
    run = Invoker()
    run("sweep", "--gpus", 16, "--gpu", "h100-80gb", "--top", 2, "--format", "json", "-o", where / "sweep.json")
    run("sweep", "--model", "mixtral-8x7b", "--gpus", 64, "--gpu", "h100-80gb", "--top", 1, "--format", "json", "-o",
        where / "moe.json")
    run("recommend", "--gpus", 16, "--tp", 2, "--pp", 4, "-o", where / "plan.json")
    return {name: json.loads((where / f"{name}.json").read_text()) for name in ("sweep", "moe", "plan")}


def _edit_row(**changes):
    return lambda rows: [{**rows[0], **changes}, *rows[1:]]


def _drop(key):
    return lambda rows: [{k: v for k, v in rows[0].items() if k != key}]


REPORT_INPUTS = [  # (saved document, its edit, what the line says): each was a traceback in the page's figures
    ("sweep", _drop("dp"), "row 1: 'dp' is missing (it must be a positive integer)"),
    ("sweep", _edit_row(mbs="1"), "row 1: 'mbs' must be a positive integer, got '1'"),
    ("sweep", _edit_row(layers_per_stage=["16", "16"]), "'layers_per_stage' must be a list of layer counts"),
    ("sweep", _edit_row(total_gib=1e308), "'total_gib' must be at most 1e+15, got 1e+308"),
    ("sweep", _edit_row(gpu=8), "'gpu' must be a string or null, got 8"),
    ("sweep", _edit_row(options=True), "'options' must be an object, got true"),
    ("moe", _drop("ep"), "row 1: an MoE row's 'ep' is missing (it must be a positive integer)"),
    ("plan", lambda plan: {**plan, "megatron_args": [*plan["megatron_args"], True]},
     "'megatron_args' must be a list of strings"),
    ("plan", lambda plan: {**plan, "baseline": []}, "'baseline' must be an object, got []"),
]


@pytest.mark.parametrize("name,edit,message", REPORT_INPUTS, ids=[m[:40] for _, _, m in REPORT_INPUTS])
def test_report_inputs_are_checked_before_the_page(advisor, tmp_path, saved, name, edit, message):
    path = tmp_path / "input.json"
    path.write_text(json.dumps(edit(saved[name])))
    assert message in advisor.error("report", "--from", path, "-o", tmp_path / "r.html")
    assert not (tmp_path / "r.html").exists()


def test_k8s_without_a_checkout_path_is_one_line(tmp_path, saved, monkeypatch):
    """'$MEGATRON_LM' in a pod's args (no shell expands it) was a yaml RepresenterError traceback."""
    from launch_support import launcher

    monkeypatch.delenv("MEGATRON_LM", raising=False)
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps(saved["sweep"]))
    line = launcher().error("k8s", "--from", sweep, "--image", "img", "--megatron-version", "0.19")
    assert line == ("Error: advisor-launch k8s needs --megatron-lm DIR (or $MEGATRON_LM): the checkout's path inside "
                    "--image (a pod's arguments are not read by a shell)")


def test_skypilot_without_a_checkout_path_is_one_line(tmp_path, saved, monkeypatch):
    """The task's run script read "$MEGATRON_LM" under set -u, which its envs never set: every node
    stopped with 'MEGATRON_LM: unbound variable' (audit). Nothing is written."""
    from launch_support import launcher

    monkeypatch.delenv("MEGATRON_LM", raising=False)
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps(saved["sweep"]))
    line = launcher().error("skypilot", "--from", sweep, "--megatron-version", "0.15", "--mock-data",
                            "-o", tmp_path / "task.yaml")
    assert line == ("Error: advisor-launch skypilot needs --megatron-lm DIR (or $MEGATRON_LM): the checkout's path "
                    "on the nodes (the task's envs set no MEGATRON_LM there)")
    assert not (tmp_path / "task.yaml").exists()


def test_launch_notes_wait_for_the_checks(tmp_path, saved):
    """The release assumed and the oom warning were printed ahead of the error line."""
    from launch_support import launcher

    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps([{**saved["sweep"][0], "verdict": "oom"}]))
    assert "2 nodes of 8 GPUs need a rendezvous" in launcher().error("torchrun", "--from", sweep, "--dry-run",
                                                                      "--mock-data")
    printed = launcher()("args", "--from", sweep, "--mock-data", "--megatron-version", "0.15")
    assert printed.stderr.splitlines()[0].startswith("warning: ") and printed.stdout.startswith("--num-layers")


def _commands(group, path=()):
    import click

    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        yield (*path, name)
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))


@pytest.mark.parametrize("program", ["advisor", "advisor-launch"])
def test_every_help_fits_100_columns_and_teaches(program):
    """Each command's --help: no traceback, within 100 columns, no control characters (click's
    no-rewrap marker \\b printed as a backspace where it did not open a paragraph: 'advisor
    profile run --help' showed two), and an example to copy."""
    from click.testing import CliRunner

    from advisor.cli import cli
    from launch.cli import cli as launch_cli

    group = cli if program == "advisor" else launch_cli
    for path in [(), *_commands(group)]:
        result = CliRunner().invoke(group, [*path, "--help"], terminal_width=100, catch_exceptions=False)
        assert result.exit_code == 0 and "Traceback" not in result.output, path
        assert max(map(len, result.stdout.splitlines())) <= 100, (path, result.stdout)
        assert not any(ord(c) < 32 and c != "\n" for c in result.stdout), (path, result.stdout)
        assert f"\n    {program} " in result.stdout or f"\n      {program} " in result.stdout, path


def test_a_launch_input_with_options_not_an_object_names_the_file_once(tmp_path, saved):
    from launch_support import launcher

    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps([{**saved["sweep"][0], "options": "abc"}]))
    line = launcher().error("args", "--from", sweep, "--megatron-version", "0.19")
    assert line == f"Error: rank 1 of {sweep}: 'options' must be an object, got 'abc'"


@pytest.mark.parametrize("args,message", [
    (["--ep", "0"], "argument --ep: must be at least 1, got 0"),
    (["--seq-len", "0"], "argument --seq-len: must be at least 1, got 0"),
    (["--mbs", "-1"], "argument --mbs: must be at least 1, got -1"),
    (["--capacity-factor", "nan"], "argument --capacity-factor: must be a finite number, got nan"),
    (["--hidden-size", "0"], "argument --hidden-size: must be at least 1, got 0"),
    (["--seq-len", "abc"], "argument --seq-len: 'abc' is not an integer"),
    (["--out", "/dev/full"], "argument --out: /dev/full is a character device, not a directory"),
    # sizes that make no model were ModelSpec's FieldError, a traceback (found by a CLI fuzzer)
    (["--num-attention-heads", "3"], "model 'mixtral-8x7b': num_attention_heads = 3 must be a multiple of "
                                     "num_query_groups = 8"),
    # Mixtral's capacity 4096 x 2 x 1.1 / 8: the fake routing's masked_select would raise deep inside
    (["--dispatcher", "allgather", "--capacity-factor", "1.1"],
     "mixtral-8x7b: the allgather dispatcher with capacity factor 1.1: each expert's capacity N k f / E = 1126.4 "
     "is not whole, which the symbolic routing does not stand in for (its ceil)"),
])
def test_moe_layer_tool_bad_input_is_one_line(capsys, args, message):
    """python -m megatron_hooks.moe_layer: --ep 0 was a ZeroDivisionError, --seq-len 0 and --mbs -1
    errors deep in megatron-core, --out /dev/full a FileExistsError; argparse's usage came first."""
    pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install -e '.[megatron]')")
    from megatron_hooks.moe_layer import main

    with pytest.raises(SystemExit) as exit_:
        main(["mixtral-8x7b", "--backend", "symbolic", *args])
    captured = capsys.readouterr()
    assert exit_.value.code == 2 and captured.out == ""
    assert captured.err.splitlines() == [f"Error: {message}"]


MALFORMED_MOE_MODELS = [  # (field, value, what the line says): each was a TypeError, ValueError or ZeroDivisionError
    ("shared_expert_size", None, "shared_expert_size must be an integer, got null"),
    ("first_dense_layers", "3", "first_dense_layers must be an integer, got '3'"),
    ("mtp_num_layers", None, "mtp_num_layers must be an integer, got null"),
    ("mtp_num_layers", -1, "mtp_num_layers must be at least 0, got -1"),
    ("name", ["x"], "model name must be a string of at most 4096 characters, got a list"),
    ("router_topk_scaling_factor", "x", "router_topk_scaling_factor must be a number, got 'x'"),
    ("router_num_groups", 0, "router_num_groups must be at least 1, got 0"),
    ("router_group_topk", 9, "router_group_topk must be at most router_num_groups = 8, got 9"),
    ("qk_layernorm", "yes", "qk_layernorm must be true or false, got 'yes'"),
    ("score_function", "relu", "score_function must be softmax or sigmoid, got 'relu'"),
    ("mla", {"q_lora_rank": 1}, "model mla lacks the field 'kv_lora_rank'"),
    ("yarn", [1], "model yarn must be an object, got a list"),
    ("extra_key", 1, "model has an unknown field, 'extra_key'"),
]


def _deepseek_row(advisor, tmp_path, field, value):
    row = advisor.json("estimate", "--model", "deepseek-v3", "--gpus", 64, "--pp", 8, "--ep", 8,
                       "--gpu", "h100-80gb")
    row["model"][field] = value
    return write_json(tmp_path / "row.json", row)


@pytest.mark.parametrize("field,value,message", MALFORMED_MOE_MODELS, ids=[f"{f}={v!r}" for f, v, _ in MALFORMED_MOE_MODELS])
def test_a_malformed_moe_model_is_one_line_in_the_report_and_the_launch(advisor, tmp_path, field, value, message):
    """A hand-edited 'model' of an MoE row: the report and advisor-launch name the field in one
    line, exit 2 (the spec was built unchecked and failed deep in the estimator)."""
    path = _deepseek_row(advisor, tmp_path, field, value)
    assert message in advisor.error("report", "--from", path, "-o", tmp_path / "page.html")
    assert not (tmp_path / "page.html").exists()
    assert message in launcher().error("args", "--from", path)


LAYER_PROFILE = ROOT / "examples" / "symbolic" / "deepseek-v3-moe-layer-ep8" / "moe_layer.json"


@pytest.mark.parametrize("change,message", [
    (lambda doc: doc.update(model="deepseek-v3"), "model must be an object (a model spec), got 'deepseek-v3'"),
    (lambda doc: doc["model"].update(router_num_groups=0), "router_num_groups must be at least 1, got 0"),
    (lambda doc: doc["model"].update(shared_expert_size=None), "shared_expert_size must be an integer, got null"),
], ids=["preset name", "no groups", "null shared experts"])
def test_a_malformed_layer_profile_model_is_one_line(advisor, tmp_path, change, message):
    """'advisor profile show' of an MoE layer profile whose model was edited by hand (a
    ValueError, a ZeroDivisionError and a TypeError before)."""
    document = json.loads(LAYER_PROFILE.read_text())
    change(document)
    run = tmp_path / "run"
    run.mkdir()
    (run / LAYER_PROFILE.name).write_text(json.dumps(document))
    assert message in advisor.error("profile", "show", run)


# --- the commands the fuzzer (benchmarks/fuzz_cli.py) does not reach: report, recommend, profile,
# --- advisor-launch; each case below was a traceback, a wrong exit status or a misleading line --------


def _saved_file(tmp_path, document, name="input.json"):
    return write_json(tmp_path / name, document)


PLAN_PAGE = [  # (edit of a plan, what the line says): fields the page draws that check_plan left alone
    (lambda plan: plan.update(predictor="seed004"), "'predictor' must be null or an object with a string 'name'"),
    (lambda plan: plan.update(predictor=[1]), "'predictor' must be null or an object with a string 'name'"),
    (lambda plan: plan.update(launchable=False, megatron_args=[1]), "'megatron_args' must be null or a list of "
                                                                     "strings, got [1]"),
    (lambda plan: plan["stages"][0].update(predicted_gib="x"), "stage 0: 'predicted_gib' must be a finite number"),
    (lambda plan: plan["baseline"].update(stage_predicted_gib="x"), "'stage_predicted_gib' must be a list of finite"),
    (lambda plan: plan.update(peak_predicted_gib="x"), "'peak_predicted_gib' must be a finite number or null"),
    (lambda plan: plan.update(schema="other"), "unknown schema 'other' (a plan of 'advisor recommend -o' has schema "
                                               "megatron-4d-advisor/plan)"),  # was "'mbs' must be a positive integer"
    (lambda plan: plan.pop("schema"), "missing 'schema' (a plan of 'advisor recommend -o'"),
    (lambda plan: plan.update(model=None), "'model' must be an object, got null"),  # Python's TypeError text
    (lambda plan: plan["model"].pop("vocab_size"), "'model' lacks the field 'vocab_size'"),
    # in JSON's words: the string's newline split the line in two, null was Python's None
    (lambda plan: plan.update(layers_per_stage="2\n2"), "'layers_per_stage' '2\\n2' must be layer counts that sum"),
    (lambda plan: plan.update(layers_per_stage=None), "'layers_per_stage' null must be layer counts that sum"),
    # an AttributeError (.strip); no plan has a 'gpu' (advisor.capture.plan_fields.FIELDS)
    (lambda plan: plan.update(gpu=True), "unknown field 'gpu' (did you mean 'gpu_memory'?)"),
]


@pytest.mark.parametrize("edit,message", PLAN_PAGE, ids=[m[:40] for _, m in PLAN_PAGE])
def test_report_checks_what_it_draws_of_a_plan(advisor, tmp_path, saved, edit, message):
    """'advisor report --from plan.json' of a hand-edited plan: a TypeError or an AttributeError
    while the page was drawn (predictor, flags, stage memory), or a message about another kind of file."""
    plan = json.loads(json.dumps(saved["plan"]))
    edit(plan)
    path = _saved_file(tmp_path, plan)
    line = advisor.error("report", "--from", path, "-o", tmp_path / "r.html")
    assert message in line and line.count(str(path)) == 1
    assert not (tmp_path / "r.html").exists()


ROW_PRICING = [  # (edit of a sweep's first row, what the line says after "FILE, row 1: ")
    ({"gpu": "nonexistent"}, "unknown GPU 'nonexistent'"),
    ({"memory_gib": -1}, "'memory_gib' must be above 0, got -1"),
    ({"options": {"bogus": 1}}, "the row's options cannot be read: unknown training options: bogus"),
    ({"model": {}}, "model lacks the field"),
    ({"cp": 3, "gpus": None}, "sequence length 8192 must be divisible by 2 x CP = 6"),
    ({"gpus": 7}, "'gpus' is 7, but TP x CP x PP x DP = 16"),  # drawn as it was; advisor-launch refused it
    ({"layers_per_stage": []}, "'layers_per_stage' lists 0 stages"),  # drawn as an even split; launch refused it
    ({"tp": None}, "'tp' is missing (it must be a positive integer)"),  # a None here drops the key  # "a sweep array must hold row objects"
]


@pytest.mark.parametrize("change,message", ROW_PRICING, ids=[m[:40] for _, m in ROW_PRICING])
def test_report_names_the_row_it_cannot_price(advisor, tmp_path, saved, change, message):
    """A row the page re-prices (model, options, layout, GPU, memory) failed while the figures were
    drawn, in a line that named neither the file nor the row, or was drawn where the launcher refuses it."""
    rows = json.loads(json.dumps(saved["sweep"]))
    rows[0].update(change)
    rows[0] = {key: value for key, value in rows[0].items() if value is not None}
    path = _saved_file(tmp_path, rows)
    line = advisor.error("report", "--from", path, "-o", tmp_path / "r.html")
    assert line.startswith(f"Error: {path}, row 1: ") and message in line
    assert not (tmp_path / "r.html").exists()


def test_a_row_without_its_model_names_the_row(advisor, tmp_path, saved):
    rows = [{key: value for key, value in saved["sweep"][0].items() if key != "model"}]
    path = _saved_file(tmp_path, rows)
    assert advisor.error("report", "--from", path, "-o", tmp_path / "r.html") == (
        f"Error: {path}, row 1: a row without its model: save sweeps with --format json")


@pytest.mark.parametrize("kind,edit,message", [
    ("sweep", lambda rows: rows[0].update(model=None), "'model' must be an object, got null"),
    ("sweep", lambda rows: rows[0].pop("model"), "missing 'model'"),
    ("sweep", lambda rows: rows[0].update(gpus=None), "'gpus' must be a positive integer, got null"),
    ("plan", lambda plan: plan.update(model="llama3.1-8b"), "'model' must be an object, got 'llama3.1-8b'"),
    ("plan", lambda plan: plan.pop("schema"), "missing 'schema' (this launcher reads megatron-4d-advisor/plan)"),
    # a dense row's own recomputation fields: the line named no file
    ("sweep", lambda rows: rows[0].update(recompute="FULL"), "recompute must be none, selective or full, got 'FULL'"),
    # its options in JSON's words: 'got True', 'got None' were Python's
    ("sweep", lambda rows: rows[0].update(options={"recompute": True}),
     "recompute must be none, selective or full, got true"),
    ("sweep", lambda rows: rows[0].update(options={"transformer_impl": None}),
     "must be transformer_engine or local, got null"),
], ids=["row null", "row none", "row null gpus", "plan preset", "plan without schema", "row recompute", "option true",
        "option null"])
def test_launch_names_the_file_once(tmp_path, saved, kind, edit, message):
    """'rank 1 of FILE: rank 1 of FILE: ...': the model's error was prefixed twice; a plan without
    its schema was read as a sweep row ("missing 'mbs'")."""
    document = json.loads(json.dumps(saved[kind]))
    edit(document)
    path = _saved_file(tmp_path, document)
    line = launcher().error("args", "--from", path, "--megatron-version", "0.19")
    assert message in line and line.count(str(path)) == 1


def test_recommend_refuses_gpus_that_are_not_whole_nodes(advisor):
    """16 GPUs on nodes of 3 was planned (exit 0), where sweep and estimate refuse it."""
    for extra in ([], ["--gpu", "h100-80gb"]):
        assert advisor.error("recommend", "--gpus", 16, "--pp", 4, "--gpus-per-node", 3, *extra) == (
            "Error: 16 GPUs are not whole nodes of 3: give a multiple of 3, at most one node, or the GPUs your nodes "
            "hold with --gpus-per-node N (a GB200 NVL72 rack's NVLink domain: --gpus-per-node 72)")


@pytest.mark.parametrize("value,message", [
    ("nan", "'--gpu-hour-price': must be a finite number, got nan"),  # a ValueError writing the JSON
    ("inf", "'--gpu-hour-price': must be a finite number, got inf"),
    ("0", "'--gpu-hour-price': must be above 0, got 0"),
])
def test_gpu_hour_price_is_finite(advisor, value, message):
    assert message in advisor.error("sweep", "--gpus", 8, "--gpu", "h100-80gb", "--tokens", "1T", "--gpu-hour-price",
                                    value, "--format", "json")


@pytest.mark.parametrize("how,message", [
    (["--fs-bandwidth", "nan"], "'--fs-bandwidth': must be a finite number, got nan"),  # a ValueError
    (["--fs-bandwidth", "1e-300"], "'--fs-bandwidth': must be at least 0.001, got 1e-300"),  # a 300-digit interval
    ({"fs_bandwidth_gbs": 1e-300}, "fs_bandwidth_gbs must be at least 0.001, got 1e-300"),
    ({"tokenizer_model": "tok\0"}, "tokenizer_model must be a non-empty string without NUL bytes"),  # into the script
    ({"data_path": ["a\0b"]}, "data_path must be a list of paths without NUL bytes"),
    ({"step_time_s": 1e-300}, "'step_time_s' must be above 1e-06, got 1e-300"),  # an OverflowError
    ({"step_time_s": "slow"}, "'step_time_s' must be a number, got 'slow'"),  # ignored without a word
    ({"tokens": 0}, "'tokens' must be above 0, got 0"),  # became --train-samples 0
], ids=["bandwidth nan", "bandwidth tiny", "job bandwidth", "job NUL", "job paths NUL", "step time tiny",
        "step time text", "tokens 0"])
def test_launch_job_numbers_and_strings(tmp_path, saved, how, message):
    """advisor-launch sbatch -o job.sh with a job that saves checkpoints (its save interval is priced
    from the bandwidth and the row's step time)."""
    row = dict(saved["sweep"][0])
    options = []
    if isinstance(how, list):
        options = how
    elif set(how) & {"step_time_s", "tokens"}:
        row.update(how)
    else:
        job = tmp_path / "job.json"
        job.write_text(json.dumps(how))
        options = ["--job-config", job]
    sweep = _saved_file(tmp_path, [row], "sweep.json")
    line = launcher().error("sbatch", "--from", sweep, "--megatron-version", "0.19", "--dry-run", *options,
                            "-o", tmp_path / "job.sh", "--", "--save", tmp_path / "ckpt")
    assert message in line
    assert not (tmp_path / "job.sh").exists()


def test_file_names_that_are_not_utf8_are_written_back_as_their_bytes(tmp_path, saved):
    """A name with byte 0xff (Python holds it as a surrogate) in the page or the batch script was a
    UnicodeEncodeError: report -o, a report of a model read from such a path, sbatch -o of it."""
    from conftest import Invoker

    odd = os.fsdecode(b"\xff")
    (tmp_path / f"{odd}.json").write_text((ROOT / "tests" / "fixtures" / "hf_configs" / "llama3.1-8b.json").read_text())
    sweep = _saved_file(tmp_path, saved["sweep"], "sweep.json")
    run = Invoker()
    run("report", "--from", sweep, "-o", tmp_path / f"{odd}.html")
    assert b"\xff" in (tmp_path / f"{odd}.html").read_bytes()
    run("report", "estimate", "--gpus", 8, "--mem", 80, "--model", tmp_path / f"{odd}.json", "-o", tmp_path / "m.html")
    run("estimate", "--gpus", 8, "--mem", 80, "--model", tmp_path / f"{odd}.json", "--format", "json", "-o",
        tmp_path / "estimate.json")
    launcher()("sbatch", "--from", tmp_path / "estimate.json", "--megatron-version", "0.19", "--dry-run", "-o",
               tmp_path / "job.sh")
    assert b"\xff.json" in (tmp_path / "job.sh").read_bytes()


@pytest.mark.parametrize("program,args", [
    ("advisor", ["report", "--from", "", "-o", "r.html"]),
    ("advisor", ["report", "--from", "sweep.json", "--profile", "", "-o", "r.html"]),
    ("advisor", ["recommend", "--gpus", 4, "--pp", 4, "--profile", ""]),
    ("advisor", ["sweep", "--gpus", 8, "--mem", 80, "--profile", ""]),
    ("advisor", ["profile", "show", ""]),
    ("advisor", ["profile", "run", "", "--out", "runs"]),
    ("advisor-launch", ["args", "--from", ""]),
    ("advisor-launch", ["args", "--from", "sweep.json", "--job-config", ""]),
    ("advisor-launch", ["check", "--from", "sweep.json", "--profile-dir", ""]),
], ids=lambda value: value if isinstance(value, str) else " ".join(map(str, value))[:40])
def test_an_empty_path_is_refused(advisor, tmp_path, monkeypatch, saved, program, args):
    """Path('') is '.': --from '' said '. is a directory', --profile '' profiled whatever the current
    directory held, profile show '' read it."""
    monkeypatch.chdir(tmp_path)
    _saved_file(tmp_path, saved["sweep"], "sweep.json")
    shutil.copytree(EXAMPLE_RUN, tmp_path / "run")  # what '.' would have been read as
    invoker = advisor if program == "advisor" else launcher()
    assert " is empty; give a " in invoker.error(*args)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "sweep.json"]


# --- a CLI fuzzer's finds (3,180 random and structured command lines) -------------------------

@pytest.mark.parametrize("tokens", ["nan", "-nan", "NaN"])
def test_a_token_budget_that_is_not_a_number(advisor, tokens):
    """--tokens nan was a decimal.InvalidOperation traceback (a decimal NaN refuses '>'), in
    advisor and advisor-launch alike (one TokenCount)."""
    from launch_support import launcher

    message = f"'--tokens': {tokens!r} must be a positive, finite token count"
    assert message in advisor.error("sweep", "--gpus", 8, "--gpu", "h100-80gb", "--tokens", tokens)
    assert message in launcher().error("args", "--from", "-", "--tokens", tokens)


def test_a_tiny_token_budget_is_named_as_typed(advisor):
    """1e-100000 printed 100,000 zeros (1e-999999999 a gigabyte of them): the number is written
    no longer than it was typed."""
    line = advisor.error("sweep", "--gpus", 8, "--gpu", "h100-80gb", "--tokens", "1e-100000")
    assert "'1e-100000' is 1E-100000 tokens, not a whole number" in line and len(line) < 300


SHARED_OVERLAP = ["estimate", "--model", "qwen3-30b-a3b", "--mbs", 1, "--moe-shared-expert-overlap"]


@pytest.mark.parametrize("extra,message", [
    (["--ep", 1, "--etp", 8, "--pp", 4, "--gpus", 4], "EP x ETP = 8 must divide TP x CP x DP = 1"),
    (["--ep", 8, "--gpus", 8, "--moe-deepep-num-sms", 20, "--gpu", "h100-80gb"],
     "--moe-deepep-num-sms 20: only the flex dispatcher's DeepEP kernels take it"),
])
def test_a_moe_note_waits_for_the_checks(advisor, extra, message):
    """The note that a model without shared experts ignores --moe-shared-expert-overlap came
    ahead of the error line of a later check: two lines for bad input."""
    assert message in advisor.error(*SHARED_OVERLAP, *extra)


def test_a_held_moe_note_comes_before_the_output(advisor):
    result = advisor(*SHARED_OVERLAP, "--ep", 8, "--gpus", 8, "--gpu", "h100-80gb")
    assert result.stderr.splitlines()[0].startswith("advisor estimate: --moe-shared-expert-overlap: qwen3-30b-a3b has "
                                                    "no shared experts")
    assert result.stdout.startswith("qwen3-30b-a3b: TP 1, CP 1, PP 1, EP 8")


# the table commands that rewrite a README section: (module, its arguments, the work that must not start)
README_TABLES = [
    ("tables.published.__main__", [], "tables.published.runs.load_source"),
    ("tables.seed004.reserve_forms", [], "tables.seed004.reserve_forms.study"),
    ("tables.splits.__main__", ["--out", "OUT"], "tables.splits.__main__.results"),
    ("tables.seed004.__main__", ["--out", "OUT"], "tables.seed004.__main__.analyse"),
    ("tables.capture.__main__", ["analyse", "--out", "OUT"], "tables.capture.accuracy.evaluate"),
]


@pytest.mark.parametrize("module,args,work", README_TABLES, ids=[m for m, _, _ in README_TABLES])
def test_a_table_readme_is_read_before_the_work(tmp_path, monkeypatch, module, args, work):
    """--readme FIFO hung (click's Path(exists=True) lets it through, and read_text waited for a
    writer; found by a CLI fuzzer), and a README without markers stopped only after the work
    (seed004: tens of seconds): both are one line now, before the work and with nothing written."""
    import importlib

    from conftest import Invoker

    owner, name = work.rsplit(".", 1)
    monkeypatch.setattr(importlib.import_module(owner), name, lambda *a, **k: pytest.fail("worked before the README"))
    main = importlib.import_module(module).main
    args = [tmp_path / "out" if arg == "OUT" else arg for arg in args]
    os.mkfifo(tmp_path / "fifo")
    line = Invoker(main).error(*args, "--readme", tmp_path / "fifo")
    assert line == f"Error: {tmp_path / 'fifo'} is a FIFO (named pipe); a README is read from a regular file only"
    (tmp_path / "notes.md").write_text("# no markers\n")
    assert "the README has no results markers" in Invoker(main).error(*args, "--readme", tmp_path / "notes.md")
    assert (tmp_path / "notes.md").read_text() == "# no markers\n"
    assert not (tmp_path / "out").exists()


def test_calibrate_checks_its_out_file_before_the_fit(tmp_path, monkeypatch):
    """python -m tables.seed004.calibrate --check on a file that is not JSON was a JSONDecodeError
    traceback and on a FIFO hung; a FIFO to write was found only after the fit (a CLI fuzzer)."""
    from conftest import Invoker

    from tables.seed004 import calibrate

    monkeypatch.setattr(calibrate, "fitted_document", lambda on: pytest.fail("fitted before checking --out"))
    (tmp_path / "notes.txt").write_text("not json\n")
    os.mkfifo(tmp_path / "fifo")
    line = Invoker(calibrate.main).error("--out", tmp_path / "notes.txt", "--check")
    assert line == f"Error: {tmp_path / 'notes.txt'}: malformed JSON at line 1, column 1: Expecting value"
    line = Invoker(calibrate.main).error("--out", tmp_path / "fifo", "--check")
    assert line == f"Error: {tmp_path / 'fifo'} is a FIFO (named pipe); a calibration file is read from a regular file only"
    # its --out takes no '-': no hint of standard output (it said 'leave out -o or give -o -')
    assert Invoker(calibrate.main).error("--out", tmp_path / "fifo") == (
        f"Error: {tmp_path / 'fifo'} is a FIFO (named pipe): output files are written atomically, as regular files only")


EMPTY_OUT = [
    ("tables.splits.__main__", ["--no-readme"]),
    ("tables.seed004.__main__", ["--no-readme"]),
    ("tables.capture.__main__", ["analyse", "--no-readme"]),
    ("megatron_hooks.emulate", ["--seq-len", 16, "--layers-per-stage", "1,1"]),
]


@pytest.mark.parametrize("module,args", EMPTY_OUT, ids=[m for m, _ in EMPTY_OUT])
def test_an_empty_out_directory_is_refused(tmp_path, monkeypatch, module, args):
    """--out '' is Path('.'): the tables, or an emulated run's rank files, were written into the
    current directory, exit status 0 (found by a CLI fuzzer); as advisor profile run --out ''."""
    import importlib

    from conftest import Invoker

    monkeypatch.chdir(tmp_path)
    line = Invoker(importlib.import_module(module).main).error(*args, "--out", "")
    assert line == "Error: --out is empty; give a directory"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("module,args", [*EMPTY_OUT, (None, ["profile", "run", "c.json"])],
                         ids=[m for m, _ in EMPTY_OUT] + ["profile run"])
def test_an_out_directory_that_is_a_fifo_or_a_file_is_refused_by_its_kind(tmp_path, monkeypatch, module, args):
    """--out FIFO passed click's file_okay=False (it refuses regular files only) and ended in mkdir's
    'Error: fifo: File exists' (found by a CLI fuzzer); a regular file, one line of its kind."""
    import importlib

    from conftest import Invoker

    monkeypatch.chdir(tmp_path)
    os.mkfifo("fifo")
    Path("file").write_text("keep")
    Path("c.json").write_text("{}")
    invoke = Invoker(importlib.import_module(module).main) if module else Invoker()  # None: the advisor
    assert "Invalid value for '--out': fifo is a FIFO (named pipe), not a directory" in invoke.error(*args, "--out", "fifo")
    assert "Invalid value for '--out': file is a file, not a directory" in invoke.error(*args, "--out", "file")
    assert sorted(os.listdir()) == ["c.json", "fifo", "file"] and Path("file").read_text() == "keep"


def test_only_minus_o_is_told_of_standard_output(advisor, tmp_path):
    """-o takes '-' for standard output, --plot does not: a FIFO given to either is refused, and
    only -o's error says how to write standard output."""
    os.mkfifo(tmp_path / "fifo")
    assert advisor.error("models", "-o", tmp_path / "fifo").endswith(
        "regular files only (for standard output, leave out -o or give -o -) (see 'cli models --help')")
    assert advisor.error("sweep", "--gpus", 8, "--mem", 40, "--plot", tmp_path / "fifo").endswith(
        "is a FIFO (named pipe): output files are written atomically, as regular files only (see 'cli sweep --help')")


def test_moe_layer_refuses_an_empty_out_directory(tmp_path, monkeypatch, capsys):
    from megatron_hooks import moe_layer

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        moe_layer.main(["qwen3-30b-a3b", "--out", ""])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == "Error: argument --out: empty; give a directory\n"
    assert list(tmp_path.iterdir()) == []
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(SystemExit) as exit_:
        moe_layer.main(["qwen3-30b-a3b", "--out", "fifo"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == "Error: argument --out: fifo is a FIFO (named pipe), not a directory\n"


# --- a fuzzer of advisor-launch --from documents (each field of a saved row set to a hostile value) --

@pytest.mark.parametrize("sms,message", [
    ("abc", "'dispatcher_sms' must be an integer, got 'abc'"),  # 'abc' % 2: a TypeError traceback
    ([], "'dispatcher_sms' must be an integer, got []"),
    (-2, "'dispatcher_sms' must be at least 2, got -2"),  # launched as --moe-flex-dispatcher-num-sms -2
    (0, "'dispatcher_sms' must be at least 2, got 0"),
], ids=["text", "list", "negative", "zero"])
def test_a_flex_rows_dispatcher_sms_is_a_count(advisor, tmp_path, sms, message):
    rows = advisor.json("sweep", "--model", "mixtral-8x7b", "--gpus", 16, "--mem", 80, "--top", 1,
                        "--moe-token-dispatcher-type", "flex", "--moe-deepep-num-sms", 24)
    args = rows[0]["megatron_args"]
    args[args.index("--moe-flex-dispatcher-num-sms") + 1] = str(sms)  # the flags edited with the field
    path = _saved_file(tmp_path, [{**rows[0], "dispatcher_sms": sms}])
    assert message in launcher().error("args", "--from", path, "--megatron-version", "0.19")


@pytest.mark.parametrize("field,value", [
    ("unpriced", True), ("not_launched", 3),  # a TypeError (not iterable)
    ("unpriced", "--lr 3e-4"), ("not_launched", "--lr\n"),  # read letter by letter: '\n'.split()[0], an IndexError
    ("not_launched", ["--lr 3e-4", " "]),
], ids=["unpriced true", "not_launched 3", "unpriced text", "not_launched text", "blank entry"])
def test_an_estimates_flag_lists_are_lists_of_flags(tmp_path, saved, field, value):
    row = {**saved["sweep"][0], "read_from": "train.sh: torchrun, 16 GPUs", field: value}
    path = _saved_file(tmp_path, [row])
    line = launcher().error("args", "--from", path, "--megatron-version", "0.19")
    assert f"'{field}' must be null or a list of flags as written, got " in line


@pytest.mark.parametrize("field", ["read_from", "gpu"])
def test_an_inputs_names_are_strings(tmp_path, saved, field):
    """A 'read_from' or 'gpu' that was not a string was dropped without a word (the report refuses
    such a 'gpu'), and with 'read_from' the refusal of an estimate priced otherwise than its
    command (``--launch-as-priced``)."""
    row = {**saved["sweep"][0], "read_from": "train.sh: torchrun", "unpriced": ["no --swiglu (priced as SwiGLU)"],
           field: 1}
    line = launcher().error("args", "--from", _saved_file(tmp_path, [row]), "--megatron-version", "0.19")
    assert f"'{field}' must be a string or null, got 1" in line


@pytest.mark.parametrize("program,args,message", [
    ("advisor", ["sweep", *SWEEP[1:], "-o", "no\ndir/x.json"], "'--output': no\\ndir/x.json: no such directory"),
    ("advisor", ["sweep", *SWEEP[1:], "--model", "a\rb.json"], "Error: a\\rb.json: no such file"),
    ("advisor-launch", ["args", "--from", "no\nfile.json"], "Error: no\\nfile.json: no such file"),
    ("advisor-launch", ["check", "--from", "sweep.json", "--megatron-lm", "no\ndir"], "checkout no\\ndir: no such"),
    ("advisor-launch", ["args", "--from", "sweep.json", "--mock-data", "--megatron-version", "0.19", "--",
                        "--data-path", "a\nb\x1b[2K"], "--data-path a\\nb\\x1b[2K (after --) conflicts with --mock-data"),
], ids=["-o", "--model", "--from", "--megatron-lm", "after --"])
def test_a_newline_in_a_path_or_a_value_does_not_split_the_error_line(advisor, tmp_path, monkeypatch, saved, program,
                                                                     args, message):
    """A newline (or a carriage return, an escape sequence) in a path or a value after -- was
    printed as it is, the one error line split in two (found by a fuzzer of advisor-launch's
    arguments); the error machinery (advisor.cli.options.OneLineErrors) writes them escaped."""
    monkeypatch.chdir(tmp_path)
    _saved_file(tmp_path, saved["sweep"], "sweep.json")
    invoker = advisor if program == "advisor" else launcher()
    assert message in invoker.error(*args)


def test_a_newline_in_a_written_path_does_not_split_the_wrote_line(advisor, tmp_path):
    """'wrote PATH' and the notes printed the path as it was: -o $'a\\nb.json' wrote a line 'b.json'
    that read as a note of its own (advisor.cli.options.wrote and note escape it as errors are)."""
    out = tmp_path / "a\nb.json"
    result = advisor(*SWEEP, "-o", out, "--plot", tmp_path / "c\rd.png")
    lines = result.stderr.strip().splitlines()
    assert f"wrote {tmp_path}/a\\nb.json" in lines and f"wrote {tmp_path}/c\\rd.png" in lines, result.stderr
    assert json.loads(out.read_text())  # the rows, in the file under its real name


@pytest.mark.parametrize("program,args,message", [
    ("advisor", [*SWEEP, "--megatron-version", "0.¹⁵"], "--megatron-version '0.¹⁵': expected a release such as 0.19"),
    ("advisor-launch", ["args", "--from", "sweep.json", "--megatron-version", "0.¹⁵"],
     "--megatron-version '0.¹⁵': expected a release such as 0.19"),
    ("advisor-launch", ["torchrun", "--from", "sweep.json", "--megatron-version", "0.15", "--nnodes", 2,
                        "--rdzv-endpoint", "node001:²⁹⁵⁰⁰", "--dry-run"],
     "--rdzv-endpoint must be HOST:PORT, got 'node001:²⁹⁵⁰⁰'"),
    ("advisor", ["estimate", "--from-command", "train.sh"], "torchrun's --nproc-per-node '²' is not a positive integer"),
], ids=["advisor --megatron-version", "advisor-launch --megatron-version", "--rdzv-endpoint", "--from-command"])
def test_a_superscript_digit_is_not_a_number(advisor, tmp_path, monkeypatch, saved, program, args, message):
    """'²' is a digit to str.isdigit() but not to int() (a superscript, not a decimal digit): each
    check that asked isdigit() then called int() was a ValueError traceback; they ask
    isdecimal(), exactly the digits int() reads (full-width '８' among them, as Megatron-LM's
    argparse int() reads it too)."""
    monkeypatch.chdir(tmp_path)
    _saved_file(tmp_path, saved["sweep"], "sweep.json")
    (tmp_path / "train.sh").write_text("torchrun --nproc-per-node ² --nnodes 1 pretrain_gpt.py --num-layers 32 "
                                       "--hidden-size 4096 --num-attention-heads 32 --seq-length 4096 "
                                       "--max-position-embeddings 4096 --micro-batch-size 1 --global-batch-size 8\n")
    invoker = advisor if program == "advisor" else launcher()
    assert message in invoker.error(*args)


def test_a_terminal_size_rich_cannot_read_is_not_a_traceback(tmp_path):
    """rich reads the size it is not given from $COLUMNS and $LINES, int() after isdigit(): 'LINES=²'
    and 'COLUMNS=²⁰⁰' were ValueError tracebacks in every table and in profile run's progress bar;
    both get a width and a height now, and such a value is as unset (the terminal's own size)."""
    from terminal import STYLE, on_a_terminal
    from test_campaign_run import campaign, write_rank

    unreadable = {"LINES": "²", "COLUMNS": "²⁰⁰"}
    table = STYLE.sub("", on_a_terminal(*map(str, SWEEP), "--top", "1", env=unreadable, columns=100))
    assert max(map(len, table.splitlines())) <= 100 and "| rank |" in table.replace("┃", "|").replace("│", "|")
    document = campaign(layouts=[(2, 2)])
    run = document["runs"][0]
    (tmp_path / "runs" / run["id"]).mkdir(parents=True)
    for stage in (0, 1):  # complete: the bar is drawn, nothing is emulated again
        write_rank(tmp_path / "runs" / run["id"], run, stage)
    (tmp_path / "c.json").write_text(json.dumps(document))
    screen = on_a_terminal("profile", "run", str(tmp_path / "c.json"), "--out", str(tmp_path / "runs"),
                           env=unreadable, stderr_too=True)
    assert "profiling" in screen and "1 already complete" in screen, screen[-500:]


@pytest.mark.parametrize("module, args", [("advisor", ["estimate", "--from-command", "-"]),
                                          ("launch", ["args", "--from", "-"])])
def test_ctrl_c_exits_130_as_a_run_stopped_by_it_does(tmp_path, module, args):
    """SIGINT while the command waits for its input on stdin: click's 'Aborted!' and exit 1, where
    profile run and advisor-launch's runs report 128 + N for a signal, as a shell does; 130 now."""
    from launch_support import wait_for

    process = subprocess.Popen([sys.executable, "-m", module, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        waiting = Path(f"/proc/{process.pid}/wchan")
        assert wait_for(lambda: "pipe_read" in waiting.read_text(), 60), "never read its standard input"
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 128 + signal.SIGINT and stderr.split() == ["Aborted!"], stderr
