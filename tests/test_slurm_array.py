"""``advisor profile run CAMPAIGN --slurm-array`` on a real Slurm (tests/slurm_real.py): a campaign
of the real core_v0.15.2 pretrain_gpt.py (a copy; CPU, gloo, the GPU double
tests/fixtures/cuda_on_cpu) submitted as one job array, scancel'd while its second task runs, and
resubmitted: the array then holds only the killed run, which is redone; the finished run is not
touched. First, without Slurm: the script's shape and the refusals."""

import json
import shlex
import subprocess

import pytest
from megatron_real import CPU_TRAINING, LAUNCH_TIMEOUT_S, failure_report, launch_env, session_copy
from slurm_real import array_states, cluster, submitted_id, wait_finished, wait_until
from test_profile_run_megatron import plan

from advisor.capture.campaign_run import scan
from advisor.profiles import load_run

# One worker under pytest-xdist for the one-node Slurm's jobs (tests/slurm_real.py): they would only
# queue behind each other's --exclusive jobs on its 2 CPUs, their wait counted in their timeouts.
pytestmark = pytest.mark.xdist_group("slurm")


def test_the_array_script_and_its_refusals(advisor, tmp_path):
    """Six runs on nodes of 2 GPUs: six tasks, each the runner restricted to one run (parsed back
    by the runner's own parser), whole nodes, logs by array job and task; bad input one line."""
    from click import Context
    from launch_support import make_checkout

    from advisor.cli.runners import megatron_runner
    from launch.campaign_runner import run

    runner = megatron_runner(run)

    plan(advisor, tmp_path / "campaign.json", 2, 2)
    checkout = make_checkout(tmp_path / "Megatron LM")
    script = advisor("profile", "run", tmp_path / "campaign.json", "--out", tmp_path / "runs", "--megatron-lm",
                     checkout, "--slurm-array", "--mock-data", "--partition", "gpu", "--dry-run", "--", "--lr",
                     "1e-4").stdout
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    assert "#SBATCH --array=0-5\n#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=1\n#SBATCH --gpus-per-node=2\n" \
           "#SBATCH --exclusive\n#SBATCH --mem=0\n#SBATCH --output=%x-%A_%a.out\n#SBATCH --error=%x-%A_%a.err\n" \
           "#SBATCH --partition=gpu\n" in script
    runs = [run["id"] for run in json.loads((tmp_path / "campaign.json").read_text())["runs"]]
    assert script.split("runs=(\n")[1].split(")")[0].split() == runs
    command = script.split("\nexec ")[1].replace("\\\n", " ")
    words = shlex.split(command.replace('"${runs[$SLURM_ARRAY_TASK_ID]}"', runs[3]))
    assert words[:3] == [words[0], "-m", "launch.campaign_runner"]
    params = runner.make_context("runner", words[3:], parent=Context(runner)).params
    assert (params["only"], params["slurm"], params["mock_data"], params["user_args"]) == (runs[3], True, True,
                                                                                        ("--lr", "1e-4"))
    assert params["megatron_lm"] == str(checkout.resolve()) and params["out"] == (tmp_path / "runs").resolve()
    assert "--slurm-array submits Megatron-LM runs from a login node" in advisor.error(
        "profile", "run", tmp_path / "campaign.json", "--out", tmp_path / "runs", "--slurm-array")
    assert "--qos is for --slurm-array" in advisor.error("profile", "run", tmp_path / "campaign.json", "--out",
                                                         tmp_path / "runs", "--qos", "high")
    assert not (tmp_path / "runs").exists()


def test_a_campaign_of_multi_node_runs_is_one_array(advisor, tmp_path):
    """Runs of 4 GPUs on nodes of 2: every task asks for 2 nodes, and the check of the user's
    arguments builds each run's command as its task does (srun does the rendezvous), so no
    --rdzv-endpoint is asked for; a conflict with them is still refused before the script."""
    from launch_support import make_checkout

    plan(advisor, tmp_path / "wide.json", 4, 2)
    checkout = make_checkout(tmp_path / "Megatron-LM")
    common = ["profile", "run", tmp_path / "wide.json", "--out", tmp_path / "runs", "--megatron-lm", checkout,
              "--slurm-array", "--partition", "gpu", "--time", "00:30:00", "--mock-data", "--dry-run"]
    script = advisor(*common, "--", "--lr", "1e-4").stdout
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gpus-per-node=2\n" in script
    assert "--slurm --rdzv-port 29500" in script.replace("\\\n   ", "")
    assert "--micro-batch-size 3 (after --) conflicts with --micro-batch-size" in advisor.error(
        *common, "--", "--micro-batch-size", "3")
    # each task's time limit in one of sbatch(1)'s formats, as advisor-launch sbatch takes it
    assert "--time 'abc' is not a Slurm time limit: give minutes, MM:SS" in advisor.error(*common, "--time", "abc")
    assert not (tmp_path / "runs").exists()


@pytest.fixture(scope="module")
def core_0_15(tmp_path_factory):
    cluster()
    return session_copy("core_v0.15.2", tmp_path_factory)


def test_a_campaign_runs_as_a_job_array_and_resumes_after_scancel(core_0_15, advisor, tmp_path):
    from megatron_hooks.stage_emulation import free_port

    document = plan(advisor, tmp_path / "full.json", 2, 2)
    document["runs"] = document["runs"][:2]  # two runs of PP 2 are enough (each about 30 s here)
    (tmp_path / "campaign.json").write_text(json.dumps(document))
    first, second = (run["id"] for run in document["runs"])
    env = launch_env(core_0_15)

    def submit(*more: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(core_0_15.bin / "advisor"), "profile", "run", "campaign.json", "--out", "runs", "--megatron-lm",
             str(core_0_15.path), "--slurm-array", "--mock-data", "--rdzv-port", str(free_port()), *more, "--",
             *CPU_TRAINING], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)

    job_id = submitted_id(submit().stdout)
    # Task 0 finishes; task 1 starts and writes its rank files; then the whole array is cancelled.
    wait_until(lambda: array_states(job_id).get("0") == "COMPLETED" and list((tmp_path / "runs" / second).glob(
        "rank*.jsonl")), LAUNCH_TIMEOUT_S, "task 0 done and task 1 running", poll_s=0.2)
    subprocess.run(["scancel", job_id], check=True)
    wait_finished(job_id, 60)
    assert array_states(job_id)["1"] == "CANCELLED"
    states = scan(document, tmp_path / "runs")
    assert (states[first].state, states[second].state) == ("complete", "partial")
    kept = {path: path.stat().st_mtime_ns for path in (tmp_path / "runs" / first).glob("rank*.jsonl")}

    script = submit("--dry-run").stdout  # the resubmission holds the killed run only
    assert "#SBATCH --array=0-0\n" in script and f"runs=(\n    {second}\n)" in script
    again = submitted_id(submit().stdout)
    fields = wait_finished(again, LAUNCH_TIMEOUT_S)
    assert fields["JobState"] == "COMPLETED", failure_report((tmp_path / f"profile-campaign-{again}_0.err").read_text())
    assert all(check.state == "complete" for check in scan(document, tmp_path / "runs").values())
    assert kept == {path: path.stat().st_mtime_ns for path in (tmp_path / "runs" / first).glob("rank*.jsonl")}
    ranks = load_run(tmp_path / "runs" / second).ranks
    assert sorted((rank.header.rank, rank.status) for rank in ranks) == [(0, "ok"), (1, "ok")]
    assert "every run of campaign.json is complete under runs: nothing to submit" in submit().stderr
