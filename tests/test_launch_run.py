"""Real launches of the real Megatron-LM: ``advisor-launch torchrun ... --profile-dir`` runs a
checkout's own ``pretrain_gpt.py`` (a copy of shared/megatron-lm/core_v0.15.2, and core_v0.19.0
under Python 3.12) on the CPU over gloo, in the four layouts of issue 13, and through the
generated Slurm script (Slurm's commands stood in by tests/fixtures/slurm_standin). The one
double is tests/fixtures/cuda_on_cpu, which stands for the GPU (not for Megatron).

Each launch is checked end to end: it starts (Megatron's validate_args accepted the arguments
in the launcher's environment: TP 2 needs CUDA_DEVICE_MAX_CONNECTIONS=1, which the tests do not
set), every rank file ends ``ok`` with a record for every layer of its stage in every iteration,
the stages hold the layers the estimate split, the embedding has the rows the estimate priced,
and the loss the hooks recorded equals the loss Megatron logged."""

import json
import os
import re
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from launch_support import launcher
from megatron_real import (CPU_TRAINING, LAUNCH_TIMEOUT_S, UNFUSED_SWIGLU, checkout, launch_env, logged_losses,
                          session_copy, writable_copy)
from table_text import read_table

from advisor.equations import padded_vocab_size
from advisor.profile_report import compare_rank
from advisor.profiles import check_complete, load_run
from conftest import ROOT

SLURM = ROOT / "tests" / "fixtures" / "slurm_standin"


def tiny(layers: int, seq_len: int = 32) -> list[str]:
    """A Llama 3.1 shape small enough to train 2 iterations on the CPU in seconds. The vocabulary
    is 4096: core_v0.15.2's --mock-data feeds token ids up to 4094 (launch.megatron_versions)."""
    return ["--model", "llama3.1-8b", "--num-layers", str(layers), "--hidden-size", "64", "--ffn-hidden-size", "128",
            "--num-attention-heads", "4", "--num-query-groups", "2", "--vocab-size", "4096", "--seq-len", str(seq_len),
            "--gbs", "4"]


# name: (model layers, estimate options, the split flag Megatron must get)
LAYOUTS = {
    "one-rank": (2, ["--tp", "1", "--pp", "1", "--mbs", "2", "--gpus", "1"], None),
    "pp2-first-last": (4, ["--tp", "1", "--pp", "2", "--mbs", "1", "--gpus", "2", "--layers-per-stage", "1,3"],
                       "--decoder-first-pipeline-num-layers"),
    "pp4-layout": (8, ["--tp", "1", "--pp", "4", "--mbs", "1", "--gpus", "4", "--layers-per-stage", "1,2,3,2"],
                   "--pipeline-model-parallel-layout"),
    # torch's norms (no Transformer Engine) refuse sequence parallelism: the estimate leaves it off
    "tp2": (2, ["--tp", "2", "--pp", "1", "--mbs", "2", "--gpus", "2", "--no-sequence-parallel"], None),
}


# Session scope: the copy is the session's anyway, and a module-scoped fixture would keep the
# module's launches on one xdist worker (conftest.pytest_collection_modifyitems).
@pytest.fixture(scope="session")
def core_0_15(tmp_path_factory):
    return session_copy("core_v0.15.2", tmp_path_factory)


def estimate(advisor, path: Path, layers: int, options: list[str], seq_len: int = 32,
             swiglu_fusion: bool = False) -> dict:
    """The row a launch runs. Priced with --no-bias-swiglu-fusion unless ``swiglu_fusion``: the
    eager SwiGLU these launches measure (the row writes the flag, which after '--' would conflict
    with a row priced fused: launch.arguments.MEMORY_FLAGS)."""
    fusion = [] if swiglu_fusion else [UNFUSED_SWIGLU]
    advisor("estimate", *tiny(layers, seq_len), "--cp", "1", *options, *fusion, "--format", "json", "-o", path)
    return json.loads(path.read_text())


def check_run(profile_dir: Path, document: dict, output: str, *, running_mean: bool = False,
              swiglu_fusion: bool = False) -> None:
    """Every rank ended ok with every layer's records; the split, vocabulary and loss are the ones
    planned. ``running_mean``: Megatron logs at iteration 2 the mean of iterations 1 and 2
    (core_v0.19.0's training_log keeps its sums after the first iteration: should_reset).
    ``swiglu_fusion``: what the header must record (``estimate`` prices --no-bias-swiglu-fusion unless told)."""
    run = load_run(profile_dir)
    world = document["tp"] * document["cp"] * document["pp"] * document["dp"]
    assert run.status == "ok" and len(run.ranks) == world
    stages = [stage["layers"] for stage in document["stages"]]
    rows = padded_vocab_size(document["model"]["vocab_size"], document["options"].get("vocab_divisible_by"),
                             document["tp"])
    logged = logged_losses(output)
    assert sorted(logged) == [1, 2], output[-2000:]
    peaks = {rank.header.rank: max(it.peak_allocated_bytes for it in rank.iterations) for rank in run.ranks}
    said = dict(re.findall(r"megatron_hooks: \[Rank (\d+)\] peak over 2 iterations: ([0-9.]+) MB allocated", output))
    # the ranks Megatron's report_memory prints for: data-parallel rank 0 (without CP: every CP rank)
    reporting = {rank.header.rank for rank in run.ranks if rank.header.coords["dp"] == 0}
    assert {int(r) for r in said} == reporting, output[-2000:]
    for r, mib in said.items():
        assert float(mib) == pytest.approx(peaks[int(r)] / 2**20, abs=0.005)
    for rank in run.ranks:
        header = rank.header
        assert not header.emulated and list(header.layers_per_stage) == stages
        assert header.swiglu_fusion is swiglu_fusion
        assert len(header.stage_layers) == stages[header.coords["pp"]]
        assert header.model.vocab_size == rows  # the rows Megatron built = the rows the estimate priced
        assert header.model.rotary_base == 500000.0 and header.model.rope_scaling_factor == 8.0  # Llama 3.1's
        assert len(rank.iterations) == 2 and header.asked_iterations == 2 and not rank.stopped_early
        check_complete(rank)  # a record for every layer of the stage, every iteration
        # profile show's expected ratios (advisor/profile_reasons.py): the hand counts of a real
        # Megatron-LM layer on the CPU (the SwiGLU its header records), its token ids and its LM head,
        # to the byte. The bool s x s causal mask: core_v0.15.2 caches one for the process (only
        # the stage's first layer keeps it), core_v0.19.0 builds one in every layer (each keeps it)
        explained = [row for row in compare_rank(rank) if row.term == "activations" and row.expected_bytes is not None]
        assert all(row.measured_bytes == row.expected_bytes for row in explained), \
            [(row.module, row.measured_bytes, row.expected_bytes) for row in explained]
        assert explained or header.parallel.tp > 1
        check_swiglu_priced(rank, swiglu_fusion)
        if header.last_stage:
            recorded = [iteration.loss for iteration in rank.iterations]
            if running_mean:
                recorded[1] = (recorded[0] + recorded[1]) / 2
            assert recorded == pytest.approx([logged[1], logged[2]], rel=1e-6)  # Megatron logs 7 digits


@pytest.mark.parametrize("name", LAYOUTS)
def test_real_pretrain_gpt_trains_with_the_hooks(name, core_0_15, advisor, tmp_path):
    layers, options, split_flag = LAYOUTS[name]
    document = estimate(advisor, tmp_path / "estimate.json", layers, options)
    args = json.loads(launcher()("args", "--from", tmp_path / "estimate.json", "--megatron-lm", core_0_15.path,
                                 "--format", "json").stdout)
    assert split_flag is None or split_flag in args
    assert args.count(UNFUSED_SWIGLU) == 1  # the row's, priced (CPU_TRAINING does not restate it)
    result = subprocess.run(
        [str(core_0_15.bin / "advisor-launch"), "torchrun", "--from", str(tmp_path / "estimate.json"),
         "--megatron-lm", str(core_0_15.path), "--mock-data", "--profile-dir", str(tmp_path / "profile"), "--",
         *CPU_TRAINING], capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S, env=launch_env(core_0_15),
        cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    if document["tp"] > 1:
        assert "CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun" in result.stderr  # what the launcher ran
    check_run(tmp_path / "profile", document, result.stdout + result.stderr)
    compare_log_reads_the_run(advisor, tmp_path, result.stderr, result.stdout + result.stderr, document)


def test_a_run_megatron_ends_early_itself_says_how_many_iterations_it_ran(core_0_15, advisor, tmp_path):
    """--exit-interval 1 with --train-iters 2: core_v0.15.2's train() returns after iteration 1
    with exit status 0 (training.py: ``if args.exit_interval and iteration % args.exit_interval
    == 0``), so the rank file ends ok with one iteration; its header says two were asked for, and
    profile show says so."""
    layers, options, _ = LAYOUTS["one-rank"]
    estimate(advisor, tmp_path / "estimate.json", layers, options)
    result = subprocess.run(
        [str(core_0_15.bin / "advisor-launch"), "torchrun", "--from", str(tmp_path / "estimate.json"),
         "--megatron-lm", str(core_0_15.path), "--mock-data", "--profile-dir", str(tmp_path / "profile"), "--",
         *CPU_TRAINING, "--exit-interval", "1"], capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S,
        env=launch_env(core_0_15), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert sorted(logged_losses(result.stdout + result.stderr)) == [1]  # Megatron trained one iteration
    run = load_run(tmp_path / "profile")
    (rank,) = run.ranks
    assert run.status == "ok" and len(rank.iterations) == 1
    assert rank.header.asked_iterations == 2 and rank.stopped_early
    title = read_table(advisor("profile", "show", tmp_path / "profile", "--section", "ranks").stdout).title
    assert title.endswith("ok, stopped early: 1 of 2 iterations"), title


def test_megatron_lms_fused_swiglu_keeps_3_h_ffn_tensors_and_the_bf16_scores_alone(core_0_15, advisor, tmp_path):
    """Megatron-LM's default fused SwiGLU (a row priced without --no-bias-swiglu-fusion:
    megatron-core's bias_swiglu_impl is torch code under jit_fuser, which runs on the CPU with
    torch.compile off), one rank, BF16, at s 64, where h_ffn (128) is not a s (256): the tiny launches'
    h_ffn = a s made the unfused SwiGLU's 4 s b h_ffn bytes look like an FP32 copy of the scores,
    4 a b s^2. A layer by hand (h 64, a 4, d 16, h_ffn 128, s 64, b 2; s b h = 8,192): the norms'
    FP32 inputs and x*rsqrt 16 s b h = 131,072 and FP32 rsqrt 8 s b = 1,024; the norm outputs,
    Q, K and V expanded, context 12 s b h = 98,304; RoPE's cos and sin 8 s d = 8,192; the BF16
    softmax output 2 a b s^2 = 65,536; the fused SwiGLU's input and FC2's 2 x 3 s b h_ffn =
    98,304: 402,432; the first layer also core_v0.15.2's cached bool mask, s^2 = 4,096. Unfused,
    65,536 more; an FP32 copy of the scores would be 131,072 more."""
    document = estimate(advisor, tmp_path / "estimate.json", 2, LAYOUTS["one-rank"][1], seq_len=64,
                        swiglu_fusion=True)
    result = subprocess.run(
        [str(core_0_15.bin / "advisor-launch"), "torchrun", "--from", str(tmp_path / "estimate.json"),
         "--megatron-lm", str(core_0_15.path), "--mock-data", "--profile-dir", str(tmp_path / "profile"), "--",
         *CPU_TRAINING], capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S, env=launch_env(core_0_15),
        cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    check_run(tmp_path / "profile", document, result.stdout + result.stderr, swiglu_fusion=True)
    assert 131_072 + 1_024 + 98_304 + 8_192 + 65_536 + 98_304 == 402_432
    (rank,) = load_run(tmp_path / "profile").ranks
    layers = {row.module: row for row in compare_rank(rank) if row.term == "activations"}
    assert (layers["decoder.layers.0"].measured_bytes, layers["decoder.layers.1"].measured_bytes) == (
        402_432 + 4_096, 402_432)


def check_swiglu_priced(rank, swiglu_fusion: bool) -> None:
    """profile show's estimate prices the SwiGLU the run's header records: each layer of an
    unfused run (--no-bias-swiglu-fusion) is estimated 2 s b h_ffn / t BF16 bytes above the same
    run read as fused, the eager glu's fifth h_ffn tensor (s 32, h_ffn 128: 8,192 b / t bytes);
    a fused run's layers, nothing more."""
    h = rank.header
    assert h.params_dtype == "bfloat16"
    as_fused = replace(rank, header=replace(h, swiglu_fusion=True))
    fused = {row.module: row.estimated_bytes for row in compare_rank(as_fused) if row.term == "activations"}
    layers = [row for row in compare_rank(rank) if row.term == "activations" and row.module.startswith("decoder.")]
    assert layers
    if swiglu_fusion:
        assert all(row.estimated_bytes == fused[row.module] for row in layers)
        return
    assert h.seq_len == 32 and h.model.ffn_hidden_size == 128
    fifth = 2 * 32 * h.parallel.mbs * 128 / h.parallel.tp
    assert [row.estimated_bytes - fused[row.module] for row in layers] == [fifth] * len(layers)


def compare_log_reads_the_run(advisor, tmp_path: Path, launched: str, output: str, document: dict) -> None:
    """advisor compare-log on the real log, beside the command the launcher printed: every logged
    iteration read, one memory report per pipeline stage, and the same memory estimate."""
    lines = launched.splitlines()  # advisor-launch prints '+ COMMAND \\' lines before torchrun's output
    first = next(i for i, line in enumerate(lines) if line.startswith("+ "))
    last = next(i for i in range(first, len(lines)) if not lines[i].endswith("\\"))
    command = "\n".join(lines[first:last + 1])[2:]
    (tmp_path / "command.txt").write_text(command)
    (tmp_path / "train.log").write_text(output)
    advisor("compare-log", tmp_path / "train.log", "--from-command", tmp_path / "command.txt", "--format", "json",
            "-o", tmp_path / "compare.json")
    compared = json.loads((tmp_path / "compare.json").read_text())
    rows = {row["what"]: row for row in compared["rows"]}
    assert rows["step time"]["measured"] > 0 and "2 logged iterations" in " ".join(compared["notes"])
    # the command that ran, priced: the plan's layout and split, on megatron-core's own unfused
    # attention (the CPU job's --transformer-impl local), which costs more than the plan's flash
    ran = json.loads(advisor("estimate", "--from-command", tmp_path / "command.txt", "--format", "json").stdout)
    assert [stage["layers"] for stage in ran["stages"]] == [stage["layers"] for stage in document["stages"]]
    assert [rows[f"stage {i} max allocated"]["predicted"] for i in range(document["pp"])] == [
        stage["total_gib"] for stage in ran["stages"]]
    # measured: the hooks' peaks (their lines), not Megatron's reports (the CPU double's 0 MB)
    run = load_run(tmp_path / "profile")
    for i in range(document["pp"]):
        stage = [max(it.peak_allocated_bytes for it in rank.iterations) for rank in run.ranks
                 if rank.header.coords["pp"] == i and rank.header.coords["dp"] == rank.header.coords["cp"] == 0]
        assert rows[f"stage {i} max allocated"]["measured"] == pytest.approx(max(stage) / 2**30, abs=1e-5)
    assert any(note.startswith("memory: the advisor's hooks' peaks") for note in compared["notes"])
    assert all(r["total_gib"] >= p["total_gib"] for r, p in zip(ran["stages"], document["stages"]))


def test_core_0_19_trains_through_its_config_container_pretrain(advisor, tmp_path_factory, tmp_path):
    """core_v0.19.0 (Python 3.12): pretrain(config_container, ..., model_provider=None) builds the
    model from the container; the hooks still go on it, and the NullTokenizer gets v as given."""
    release = writable_copy(checkout("core_v0.19.0"), tmp_path_factory.mktemp("megatron19"))
    document = estimate(advisor, tmp_path / "estimate.json", *LAYOUTS["pp2-first-last"][:2])
    result = subprocess.run(
        [str(release.bin / "advisor-launch"), "torchrun", "--from", str(tmp_path / "estimate.json"),
         "--megatron-lm", str(release.path), "--mock-data", "--profile-dir", str(tmp_path / "profile"), "--",
         *CPU_TRAINING], capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S, env=launch_env(release),
        cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert re.search(r"--vocab-size 4096\b", result.stderr)  # core 0.19's NullTokenizer: no extra row
    check_run(tmp_path / "profile", document, result.stdout + result.stderr, running_mean=True)


def test_sbatch_script_runs_torchrun_on_two_nodes(core_0_15, advisor, tmp_path):
    """The generated script, run by bash with Slurm's commands stood in: srun starts one real
    torchrun per "node" (two here, one rank each, TP 2), meeting at a real c10d rendezvous on the
    first; the script's export of CUDA_DEVICE_MAX_CONNECTIONS is what lets Megatron accept TP 2."""
    from megatron_hooks.stage_emulation import free_port

    document = estimate(advisor, tmp_path / "estimate.json", *LAYOUTS["tp2"][:2])
    script = tmp_path / "job.sh"
    launcher()("sbatch", "--from", tmp_path / "estimate.json", "--megatron-lm", core_0_15.path,
               "--gpus-per-node", 1, "--rdzv-port", free_port(), "--profile-dir", tmp_path / "profile",
               "--mock-data", "-o", script, "--dry-run", "--", *CPU_TRAINING)
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in script.read_text()
    # What Slurm's batch environment would hold on these two stand-in nodes (SLURM_CPUS_ON_NODE:
    # the script's srun gives each task the node's CPUs).
    env = launch_env(core_0_15, SLURM_JOB_NODELIST="n[1-2]", SLURM_NNODES="2", SLURM_JOB_ID="4242",
                     SLURM_CPUS_ON_NODE=str(os.cpu_count() or 1), SLURM_STANDIN_HOSTS="127.0.0.1 127.0.0.2")
    env["PATH"] = f"{SLURM}{os.pathsep}{env['PATH']}"
    result = subprocess.run(["bash", script], capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S, env=env,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    check_run(tmp_path / "profile", document, result.stdout + result.stderr)
