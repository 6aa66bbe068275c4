"""``advisor profile run --megatron-lm``: every campaign run through a real torchrun (two gloo
processes) of the real Megatron-LM core_v0.15.2 ``pretrain_gpt.py`` (a copy of
shared/megatron-lm/core_v0.15.2; its 1F1B pipeline over gloo; the GPU double of
tests/fixtures/cuda_on_cpu), with the hooks; and measured as the CPU emulator measures the same
runs. The refusals before anything starts use a directory with a version file (make_checkout)."""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install -e '.[megatron]')")

from conftest import ROOT, Invoker  # noqa: E402
from launch_support import alive, make_checkout, subprocess_env, wait_for  # noqa: E402
from megatron_real import CPU_TRAINING, LAUNCH_TIMEOUT_S, UNFUSED_SWIGLU, launch_env, session_copy  # noqa: E402

from advisor.capture.campaign import read_campaign  # noqa: E402
from advisor.capture.campaign_run import scan  # noqa: E402
from advisor.profiles import load_run  # noqa: E402

MODEL = ["--model", "llama3.1-8b", "--num-layers", "4", "--hidden-size", "64", "--ffn-hidden-size", "128",
         "--num-attention-heads", "4", "--num-query-groups", "2", "--vocab-size", "4096", "--seq-len", "32"]
CPU = ["--mode", "reduced", "--dtype", "float32", "--no-distributed-optimizer", "--no-sequence-parallel"]
SLURM = ROOT / "tests" / "fixtures" / "slurm_standin"
PAUSE = ROOT / "tests" / "fixtures" / "pause_between_iterations"
STATIC_AND_ACTIVATIONS = ("parameter_bytes", "gradient_bytes", "optimizer_bytes", "activation_bytes",
                          "forward_peak_bytes")


def plan(advisor: Invoker, path, gpus: int, per_node: int) -> dict:
    """The campaign of the eager SwiGLU (--no-bias-swiglu-fusion), which the CPU emulator runs too
    (docs/profiling.md): its setup says it and its runs' flags carry it. (Before 'advisor profile
    plan' had the switch, this edited the runs' flags, and the setup still said fused.)"""
    advisor("profile", "plan", *MODEL, "--gpus", gpus, "--gpus-per-node", per_node, "--mbs", 4, "--gbs", 8, *CPU,
            UNFUSED_SWIGLU, "-o", path)
    document = read_campaign(path)
    assert all(run["megatron_args"].count(UNFUSED_SWIGLU) == 1 for run in document["runs"])
    return document


# Session scope: the copy is the session's anyway, and a module-scoped fixture would keep the
# module's launches on one xdist worker (conftest.pytest_collection_modifyitems).
@pytest.fixture(scope="session")
def real_checkout(tmp_path_factory):
    return session_copy("core_v0.15.2", tmp_path_factory)


@pytest.fixture
def checkout_dir(tmp_path):
    """A directory with a version file, where the refusals need a checkout: nothing is started."""
    return make_checkout(tmp_path / "Megatron-LM")


@pytest.fixture(scope="module")
def profiled(tmp_path_factory, real_checkout):
    """Two runs of the reduced campaign of a 4-layer model on 2 GPUs (PP 2, the even split at
    microbatches 1 and 2: what the recommender's batch-size fit needs), through torchrun and the
    real pretrain_gpt.py (a module fixture: two launches; tests/test_launch_run.py covers the
    other layouts' launches) and through the emulator."""
    root = tmp_path_factory.mktemp("megatron-runs")
    advisor = Invoker()
    with pytest.MonkeyPatch.context() as patch:
        for key, value in launch_env(real_checkout).items():
            patch.setenv(key, value)
        document = plan(advisor, root / "full.json", 2, 2)
        document["runs"] = [run for run in document["runs"] if run["layers_per_stage"] == [2, 2]]
        assert [run["micro_batch_size"] for run in document["runs"]] == [1, 2]
        (root / "campaign.json").write_text(json.dumps(document))
        launched = advisor("profile", "run", root / "campaign.json", "--out", root / "runs", "--megatron-lm",
                           real_checkout.path, "--mock-data", "--", *CPU_TRAINING)
    emulated = advisor("profile", "run", root / "campaign.json", "--out", root / "emulated")
    return root, document, launched, emulated


def test_every_run_is_a_profiled_torchrun_launch(profiled):
    root, document, launched, _ = profiled
    assert launched.stdout.startswith("2 runs in ") and ": 2 ok, 0 oom, 0 failed, 0 already complete" in launched.stdout
    assert all(check.state == "complete" for check in scan(document, root / "runs").values())
    for run in document["runs"]:
        profile = load_run(root / "runs" / run["id"])
        headers = sorted((rank.header for rank in profile.ranks), key=lambda header: header.rank)
        assert [(h.rank, h.coords["pp"], h.world_size) for h in headers] == [(0, 0, 2), (1, 1, 2)]
        for header in headers:
            # Megatron's own description of the run (get_args, parallel_state), not the emulator's.
            assert not header.emulated and header.layer_spec == "local" and header.run_id.startswith(run["id"] + "-")
            assert list(header.layers_per_stage) == run["layers_per_stage"]
            assert header.parallel.mbs == run["micro_batch_size"] and header.num_microbatches == run["num_microbatches"]
        assert all(len(rank.iterations) == 2 for rank in profile.ranks)  # --train-iters 2, the default
        # torchrun's output, kept beside the profiles (launch.campaign_runner.LAUNCH_LOG): Megatron's own lines
        log = (root / "runs" / run["id"] / "launch.log").read_text()
        assert "iteration        2/       2" in log, log[-2000:]


def test_the_emulator_measures_what_the_real_pipeline_measures(profiled):
    """Per layer and iteration, the static bytes, the activations kept for backward and the forward
    peak are the same bytes in the real Megatron-LM 1F1B pipeline and in the emulated stages, with
    one difference the real run shows: Megatron's data loader gives every sample its own [1, s, s]
    boolean attention mask, which the unfused attention keeps, where the emulator's is one
    [1, 1, s, s] for the microbatch; so with b > 1 the first decoder layer of each stage keeps
    (b - 1) s^2 bytes more. (The backward peaks are not compared: the real pipeline's are higher.)"""
    root, document, _, emulated = profiled
    assert ": 2 ok, 0 oom, 0 failed" in emulated.stdout
    compared = 0
    seq = document["seq_len"]
    for run in document["runs"]:
        real = {rank.header.rank: rank for rank in load_run(root / "runs" / run["id"]).ranks}
        emulation = {rank.header.rank: rank for rank in load_run(root / "emulated" / run["id"]).ranks}
        assert real.keys() == emulation.keys() == {0, 1}
        masks = (run["micro_batch_size"] - 1) * seq * seq
        for rank, measured in real.items():
            expected = {(layer.iteration, layer.name): layer for layer in emulation[rank].layers}
            assert {(layer.iteration, layer.name) for layer in measured.layers} == expected.keys()
            for layer in measured.layers:
                twin = expected[(layer.iteration, layer.name)]
                for field in STATIC_AND_ACTIVATIONS:
                    extra = masks if field == "activation_bytes" and layer.name == "decoder.layers.0" else 0
                    assert getattr(layer, field) == getattr(twin, field) + extra, (run["id"], rank, layer.name, field)
                compared += 1
    assert compared == 2 * 2 * (4 + 2)  # runs x iterations x (decoder layers + embedding + output)


def test_a_run_that_dies_before_profiling_names_its_log(advisor, tmp_path, monkeypatch, real_checkout):
    """A launch that fails before any rank writes a profile: the error names the run's launch.log
    and its first error line, not torchrun's summary that ends it (the runner's stderr scrolls past
    in a campaign; a CI run's was lost); exit status 1, a run that failed."""
    for key, value in launch_env(real_checkout).items():
        monkeypatch.setenv(key, value)
    document = plan(advisor, tmp_path / "full.json", 2, 2)
    document["runs"] = document["runs"][:1]
    (tmp_path / "one.json").write_text(json.dumps(document))
    # an unknown Megatron flag after --: pretrain_gpt.py's argument parser refuses it on every rank
    result = advisor("profile", "run", tmp_path / "one.json", "--out", tmp_path / "runs", "--megatron-lm",
                     real_checkout.path, "--mock-data", "--", *CPU_TRAINING, "--no-such-megatron-flag", expect=1)
    log = tmp_path / "runs" / document["runs"][0]["id"] / "launch.log"
    assert (f"(its output: {log}; first error: pretrain_gpt.py: error: unrecognized arguments: "
            "--no-such-megatron-flag)") in result.output, result.output
    assert "unrecognized arguments: --no-such-megatron-flag" in log.read_text()


def test_a_second_run_resumes_with_nothing_to_do(profiled, real_checkout, monkeypatch):
    root, *_ = profiled
    for key, value in launch_env(real_checkout).items():  # the first run's environment (torchrun on PATH)
        monkeypatch.setenv(key, value)
    stamps = {path: path.stat().st_mtime_ns for path in (root / "runs").glob("*/rank*.jsonl")}
    again = Invoker()("profile", "run", root / "campaign.json", "--out", root / "runs", "--megatron-lm",
                      real_checkout.path, "--mock-data", "--", *CPU_TRAINING)
    assert ": 0 ok, 0 oom, 0 failed, 2 already complete" in again.stdout
    assert stamps == {path: path.stat().st_mtime_ns for path in (root / "runs").glob("*/rank*.jsonl")}


def test_the_launched_profiles_feed_the_recommender(profiled):
    root, *_ = profiled
    plan_document = Invoker().json("recommend", "--profile", root / "runs", "--gpus", 2, "--gpus-per-node", 2,
                                   "--pp", 2, "--mbs", 4, "--gbs", 8)
    assert sum(plan_document["layers_per_stage"]) == 4 and plan_document["launchable"]


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(child) for child in path.read_text().split()] if path.exists() else []


def test_ctrl_c_between_iterations_leaves_the_run_to_redo(advisor, real_checkout, tmp_path):
    """Ctrl-C (SIGINT to the command's process group, as a terminal sends it) while both ranks are
    between iterations 1 and 2 of 2 (held there by the PAUSE fixture, after Megatron has logged
    iteration 1): the ranks stay 'running', as after a Ctrl-C inside an iteration, so the run is
    redone on resuming. Audit: they ended 'ok' with 2 of 4 iterations; the next 'advisor profile
    run' counted the run complete and skipped it, and 'recommend' priced it. The runner gets the
    Ctrl-C twice (the group's, and the advisor's relay): one stop (launch.process.SAME_STOP_S), so
    the ranks have their time to record it; taken as two, they were SIGKILLed and this test passed
    without the fix in 1 of 5 tries."""
    document = plan(advisor, tmp_path / "full.json", 2, 2)
    document["runs"] = [run for run in document["runs"] if run["id"] == "pp-b1-2x2"]
    (tmp_path / "campaign.json").write_text(json.dumps(document))
    env = launch_env(real_checkout, PAUSE_AFTER_ITERATION="1", PAUSE_DIR=str(tmp_path))
    env["PYTHONPATH"] = os.pathsep.join([str(PAUSE), env["PYTHONPATH"]])
    command = [sys.executable, "-m", "advisor", "profile", "run", str(tmp_path / "campaign.json"), "--out",
               str(tmp_path / "runs"), "--megatron-lm", str(real_checkout.path), "--mock-data", "--", *CPU_TRAINING]
    paused = [tmp_path / f"paused-rank{rank}" for rank in (0, 1)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               start_new_session=True)  # a group of its own: the terminal's foreground group
    try:
        wait_for(lambda: all(path.exists() for path in paused) or process.poll() is not None, LAUNCH_TIMEOUT_S)
        assert process.poll() is None, process.communicate()[1][-3000:]
        torchrun = _children(_children(process.pid)[0])[0]
        os.killpg(process.pid, signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
        assert wait_for(lambda: not alive(torchrun), 10), "torchrun outlived the Ctrl-C"
    finally:
        process.kill()
    assert process.returncode == 128 + signal.SIGINT, stderr[-3000:]
    assert "interrupted: 0 of 1 runs are complete; run the same command to resume" in stderr
    profile = load_run(tmp_path / "runs" / "pp-b1-2x2")
    assert [(rank.status, len(rank.iterations)) for rank in profile.ranks] == [("running", 1)] * 2
    check = scan(document, tmp_path / "runs")["pp-b1-2x2"]
    assert check.state == "partial" and check.reason == "rank 0 ended 'running'"  # redone on resuming
    show = advisor("profile", "show", tmp_path / "runs" / "pp-b1-2x2", "--section", "ranks")
    assert re.search(r"run\s+pp-b1-2x2-\w+: running\n", show.stdout), show.stdout


# --- refused before anything starts (no torchrun) ---------------------------------------------


@pytest.fixture
def small_campaign(advisor, tmp_path):
    plan(advisor, tmp_path / "campaign.json", 2, 2)
    return tmp_path / "campaign.json"


def test_emulator_and_megatron_options_do_not_mix(advisor, small_campaign, tmp_path, checkout_dir):
    out = tmp_path / "runs"
    assert "--threads and --memory-limit are the CPU emulator's" in advisor.error(
        "profile", "run", small_campaign, "--out", out, "--megatron-lm", checkout_dir, "--threads", 1)
    assert "--mock-data is for Megatron-LM runs: give --megatron-lm DIR" in advisor.error(
        "profile", "run", small_campaign, "--out", out, "--mock-data")
    assert "'--lr' is for Megatron-LM runs" in advisor.error("profile", "run", small_campaign, "--out", out, "--",
                                                             "--lr", "1e-4")
    for option in (["--slurm"], ["--rdzv-port", "29501"]):
        assert f"{option[0]} is for Megatron-LM runs" in advisor.error("profile", "run", small_campaign, "--out", out,
                                                                       *option)
    assert not out.exists()


def test_the_runner_refuses_what_it_cannot_launch(advisor, small_campaign, tmp_path, monkeypatch, checkout_dir):
    for key, value in subprocess_env().items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "runs"
    assert "Megatron-LM checkout nowhere: no such directory" in advisor.error(
        "profile", "run", small_campaign, "--out", out, "--megatron-lm", "nowhere")
    conflict = advisor.error("profile", "run", small_campaign, "--out", out, "--megatron-lm", checkout_dir, "--",
                             "--micro-batch-size", "3")
    assert "--micro-batch-size 3 (after --) conflicts with --micro-batch-size 1 from campaign run pp-b1-2x2" in conflict
    plan(advisor, tmp_path / "wide.json", 4, 2)
    assert ("run pp-b1-1x4 needs 4 GPUs, more than a node's 2; without --slurm each run starts on this node: use "
            "--slurm inside an allocation of 2 nodes" in advisor.error("profile", "run", tmp_path / "wide.json",
                                                                       "--out", out, "--megatron-lm", checkout_dir))
    for name in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST"):
        monkeypatch.delenv(name, raising=False)
    assert "--slurm runs inside a Slurm allocation (salloc, or a batch script)" in advisor.error(
        "profile", "run", tmp_path / "wide.json", "--out", out, "--megatron-lm", checkout_dir, "--slurm")
    monkeypatch.setenv("PATH", f"{SLURM}{os.pathsep}{os.environ['PATH']}")
    for name, value in {"SLURM_JOB_ID": "77", "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "n1"}.items():
        monkeypatch.setenv(name, value)
    assert "run pp-b1-1x4 needs 2 nodes of 2 GPUs; this Slurm allocation has 1 (SLURM_NNODES)" in advisor.error(
        "profile", "run", tmp_path / "wide.json", "--out", out, "--megatron-lm", checkout_dir, "--slurm")
    assert not out.exists()


def test_rates_and_lengths_megatron_fails_on_are_refused_before_any_run(advisor, small_campaign, tmp_path,
                                                                        monkeypatch, checkout_dir):
    """The user's arguments after -- go to every run: a learning rate or a length that Megatron-LM
    takes and then fails on at every rank (launch.job.check_rates, check_length; launch.evaluation) is one line, exit
    status 2, before any run starts, as advisor-launch refuses it."""
    for key, value in subprocess_env().items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "runs"
    for args, message in ((["--lr", "-1"], "--lr -1: give a finite number, 0 or more; Megatron-LM's scheduler"),
                          (["--lr", "1e-5", "--min-lr", "1e-4"], "--lr 1e-5 is below --min-lr 1e-4"),
                          (["--train-iters", "-3"], "--train-iters -3 (after --): give 0 or more"),
                          (["--adam-beta1", "1"], "--adam-beta1 1: give in [0, 1)"),
                          (["--eval-interval", "0"], "--eval-interval 0")):
        line = advisor.error("profile", "run", small_campaign, "--out", out, "--megatron-lm", checkout_dir, "--", *args)
        assert message in line, line
    assert not out.exists()


def test_an_early_exit_after_dash_dash_is_refused(advisor, small_campaign, tmp_path, monkeypatch, checkout_dir):
    """Megatron-LM ends training early, with exit status 0, after an iteration --exit-interval
    divides or after --exit-duration-in-mins (megatron/training/training.py): every rank file
    then ended 'ok' after fewer iterations than --train-iters, and the campaign counted the run
    complete (reproduced with core_v0.15.2 on the CPU: --exit-interval 1 recorded one iteration
    of 2, and recommend priced the last stage at 7.30 MiB where both iterations give 9.46)."""
    from launch.campaign_runner import early_exit_problem

    for key, value in subprocess_env().items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "runs"
    run = ["profile", "run", small_campaign, "--out", out, "--megatron-lm", checkout_dir]
    tail = "(--train-iters), with exit status 0, so its profile would read as complete: leave it out of a profiling campaign"
    assert advisor.error(*run, "--train-iters", 4, "--", "--exit-interval", "2") == (
        f"Error: --exit-interval 2 (after --) ends each run after iteration 2 of its 4 {tail}")
    # the user's own --train-iters after '--' is what Megatron-LM runs
    assert advisor.error(*run, "--", "--train-iters", "3", "--exit-interval", "1") == (
        f"Error: --exit-interval 1 (after --) ends each run after iteration 1 of its 3 {tail}")
    assert advisor.error(*run, "--", "--exit-duration-in-mins", "30") == (
        f"Error: --exit-duration-in-mins 30 (after --) can end a run after 30 minutes, before its 2 iterations {tail}")
    assert advisor.error(*run, "--slurm-array", "--dry-run", "--", "--exit-interval", "1").startswith(
        "Error: --exit-interval 1 (after --) ends each run after iteration 1 of its 2")
    assert not out.exists()
    # what cannot end a run early: an interval the last iteration reaches first or at once, and 0 (unset)
    for args in (["--exit-interval", "2"], ["--exit-interval", "5"], ["--exit-interval", "0"],
                 ["--exit-duration-in-mins", "0"]):
        assert early_exit_problem(args, 2) is None


def test_slurm_runs_span_nodes(advisor, tmp_path, monkeypatch, real_checkout):
    """Inside an allocation (Slurm's commands stood in: tests/fixtures/slurm_standin), a run on 2
    nodes of 1 GPU is srun of one real torchrun per node, meeting at a c10d rendezvous."""
    from megatron_hooks.stage_emulation import free_port

    document = plan(advisor, tmp_path / "wide.json", 2, 1)
    document["runs"] = document["runs"][:1]  # one run is enough (each takes about 25 s)
    (tmp_path / "one.json").write_text(json.dumps(document))
    env = launch_env(real_checkout, SLURM_JOB_ID="77", SLURM_NNODES="2", SLURM_JOB_NODELIST="n[1-2]",
                     SLURM_STANDIN_HOSTS="127.0.0.1 127.0.0.2", SLURM_STANDIN_RECORD=str(tmp_path / "slurm.jsonl"))
    env["PATH"] = f"{SLURM}{os.pathsep}{env['PATH']}"
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    result = advisor("profile", "run", tmp_path / "one.json", "--out", tmp_path / "runs", "--megatron-lm",
                     real_checkout.path, "--slurm", "--rdzv-port", free_port(), "--mock-data", "--", *CPU_TRAINING)
    assert ": 1 ok, 0 oom, 0 failed" in result.stdout
    (srun,) = [json.loads(line)["argv"] for line in (tmp_path / "slurm.jsonl").read_text().splitlines()]
    run = document["runs"][0]
    assert srun[:9] == ["--nodes=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "torchrun", "--nproc-per-node",
                        "1", "--nnodes", "2", "--rdzv-backend"]
    assert f"77-{run['id']}-" in srun[srun.index("--rdzv-id") + 1]
    ranks = sorted(load_run(tmp_path / "runs" / run["id"]).ranks, key=lambda rank: rank.header.rank)
    assert [(rank.header.rank, rank.header.coords["pp"], rank.status) for rank in ranks] == [(0, 0, "ok"), (1, 1, "ok")]
    assert all(list(rank.header.layers_per_stage) == run["layers_per_stage"] for rank in ranks)


def test_every_flag_of_a_gpu_campaign_is_megatron_lms(advisor, tmp_path, checkout_dir):
    """The torchrun commands of a default (BF16, distributed optimizer, sequence parallel)
    campaign with DP and TP runs: every Megatron-LM flag is in core_v0.15.2's argument list, and
    the TP runs get CUDA_DEVICE_MAX_CONNECTIONS=1 (test_megatron_validation runs such lists
    through the real parse_args and validate_args)."""
    from launch.campaign_runner import TorchrunExecutor
    from launch.checkout import resolve_release
    from launch_support import FLAGS

    advisor("profile", "plan", "--gpus", 8, "--gpus-per-node", 8, "--mode", "reduced", "-o", tmp_path / "c.json")
    document = read_campaign(tmp_path / "c.json")
    executor = TorchrunExecutor(resolve_release(checkout_dir, None, need_checkout=True), mock_data=True, train_iters=2,
                                extras=())
    scenarios = set()
    for run in document["runs"]:
        argv, env = executor.argv(document, run, tmp_path / run["id"])
        megatron = argv[argv.index("--") + 1:]
        assert {token for token in megatron if token.startswith("--")} <= FLAGS, run["id"]
        assert argv[:5] == ["torchrun", "--nproc-per-node", "8", "--standalone", "-m"]
        assert env == ({"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if run["tp"] > 1 else {}), run["id"]
        scenarios.add(run["scenario"])
    assert scenarios == {"pp", "dp2", "dp4", "tp2", "tp4"}


def test_campaign_runs_do_not_evaluate_unless_asked(tmp_path, small_campaign, checkout_dir):
    """A profiling run measures its training iterations: Megatron-LM's evaluation after them
    (core_v0.15.2: 100 iterations on the validation and on the test set) is switched off with
    --eval-iters 0, and --eval-interval is given, without which core_v0.19.0 cannot build its
    datasets (training.py get_train_valid_test_num_samples: train_iters // eval_interval). The
    user's own values after -- are kept, each flag once."""
    from launch.arguments import flag_values
    from launch.campaign_runner import TorchrunExecutor
    from launch.checkout import resolve_release

    document = read_campaign(small_campaign)
    release = resolve_release(checkout_dir, None, need_checkout=True)
    for extras, expected in (((), {"--eval-iters": ("0",), "--eval-interval": ("2",)}),
                             (("--eval-iters", "5"), {"--eval-iters": ("5",), "--eval-interval": ("2",)}),
                             (("--eval-interval", "7"), {"--eval-iters": ("0",), "--eval-interval": ("7",)})):
        executor = TorchrunExecutor(release, mock_data=True, train_iters=2, extras=extras)
        argv, _ = executor.argv(document, document["runs"][0], tmp_path / "run")
        megatron = argv[argv.index("--") + 1:]
        given = flag_values(megatron)
        assert {flag: given[flag] for flag in expected} == expected, extras
        assert megatron.count("--eval-iters") == megatron.count("--eval-interval") == 1


def _edited(path, tmp_path, name: str, edit) -> str:
    document = read_campaign(path)
    edit(document)
    (tmp_path / name).write_text(json.dumps(document))
    return tmp_path / name


def test_the_runner_refuses_campaigns_and_environments_it_cannot_use(advisor, small_campaign, tmp_path, monkeypatch,
                                                                    checkout_dir):
    for key, value in subprocess_env().items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "runs"
    hybrid = _edited(small_campaign, tmp_path, "hybrid.json", lambda d: d["runs"][1].update(launchable=False))
    assert "run pp-b1-3.1 is not launchable on stock Megatron-LM" in advisor.error(
        "profile", "run", hybrid, "--out", out, "--megatron-lm", checkout_dir)
    bare = _edited(small_campaign, tmp_path, "bare.json", lambda d: d["runs"][0].pop("megatron_args"))
    assert "run pp-b1-2x2 has no megatron_args (plan the campaign with advisor profile plan)" in advisor.error(
        "profile", "run", bare, "--out", out, "--megatron-lm", checkout_dir)
    odd = _edited(small_campaign, tmp_path, "odd.json", lambda d: d.update(gpus_per_node=0))
    assert "odd.json: 'gpus_per_node' must be at least 1, got 0" in advisor.error(  # read_campaign's check
        "profile", "run", odd, "--out", out, "--megatron-lm", checkout_dir)
    for name, value in {"SLURM_JOB_ID": "77", "SLURM_NNODES": "two", "SLURM_JOB_NODELIST": "n1"}.items():
        monkeypatch.setenv(name, value)
    assert "SLURM_NNODES must be a node count, got 'two'" in advisor.error(
        "profile", "run", small_campaign, "--out", out, "--megatron-lm", checkout_dir, "--slurm")
    monkeypatch.setenv("PATH", "/nonexistent")  # the runner starts with this interpreter; torchrun is not found
    monkeypatch.setenv("SLURM_NNODES", "2")
    assert "srun not found on PATH; --slurm runs inside a Slurm allocation" in advisor.error("profile", "run", small_campaign, "--out", out,
                                                              "--megatron-lm", checkout_dir, "--slurm")
    assert "torchrun not found on PATH" in advisor.error("profile", "run", small_campaign, "--out", out,
                                                         "--megatron-lm", checkout_dir)
    assert not out.exists()
