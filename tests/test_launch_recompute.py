"""--recompute-method uniform --recompute-num-layers N against the user's Megatron-LM release, in
the launcher: core_v0.15.2 runs the uniform method in whole units of N layers per model chunk and
fails with IndexError at the first forward of a chunk that N does not divide; core_v0.19.0 ends
the last unit early (``MegatronRelease.uniform_recompute_any_n``). The advisor refuses such a
layout for 0.15 (``Recomputation.chunk_problem``); the launcher refuses a plan or row made for 0.19
when the checkout (or --megatron-version, where there is none here) is 0.15: one line on stderr,
exit status 2, nothing written or started, for every command. Run as the user runs it, against
the real checkouts in ../shared/megatron-lm.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from megatron_real import SHARED
from test_launch_strictness import refused, run

V015, V019 = SHARED / "core_v0.15.2", SHARED / "core_v0.19.0"
# Llama 3.1 8B (32 layers) on TP 2, PP 4, fully recomputed in units of 2 layers
RECOMMEND = ["recommend", "--model", "llama3.1-8b", "--gpus", "8", "--tp", "2", "--pp", "4", "--mem", "80",
             "--recompute", "full", "--recompute-method", "uniform", "--recompute-num-layers", "2"]
WORDS = "--recompute-method uniform --recompute-num-layers 2 with model chunks of"
RULE = "Megatron-LM core 0.15 runs --recompute-method uniform in units of N layers per model chunk"

needs_checkouts = pytest.mark.skipif(not all((tag / "pretrain_gpt.py").is_file() for tag in (V015, V019)),
                                     reason=f"no Megatron-LM checkouts core_v0.15.2 and core_v0.19.0 in {SHARED}")


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> dict[str, Path]:
    """'newest': planned for core 0.19 (its split holds stages of an odd number of layers);
    'v015': the same planned for core 0.15 (every stage a multiple of 2)."""
    root = tmp_path_factory.mktemp("recompute")
    paths = {"newest": root / "newest.json", "v015": root / "v015.json"}
    for name, extra in (("newest", []), ("v015", ["--megatron-version", "0.15"])):
        made = run("advisor", *RECOMMEND, *extra, "-o", paths[name])
        assert made.returncode == 0, made.stderr
    assert any(layers % 2 for layers in json.loads(paths["newest"].read_text())["layers_per_stage"])
    assert not any(layers % 2 for layers in json.loads(paths["v015"].read_text())["layers_per_stage"])
    return paths


def output(command: list, path: Path) -> list:
    """-o PATH for the commands that write a file (sbatch, k8s, skypilot)."""
    return [] if command[0] in ("args", "check", "torchrun") else ["-o", path]


def odd_chunks(plan: Path) -> str:
    return ", ".join(str(layers) for layers in sorted(set(json.loads(plan.read_text())["layers_per_stage"]))
                     if layers % 2)


# every command that reads a checkout here (torchrun and sbatch, real or dry), and the
# k8s and SkyPilot writers given a path that is a checkout on this machine
WITH_A_CHECKOUT = [["args"], ["check"], ["torchrun"], ["torchrun", "--dry-run"], ["sbatch"], ["sbatch", "--dry-run"],
                   ["k8s", "--image", "ghcr.io/me/megatron:1"], ["skypilot"]]


@needs_checkouts
@pytest.mark.parametrize("command", WITH_A_CHECKOUT, ids=" ".join)
def test_a_plan_for_core_019_is_refused_on_a_core_015_checkout(tmp_path, plans, command):
    written = tmp_path / "job.out"
    line = refused(run("launch", *command, "--from", plans["newest"], "--megatron-lm", V015,
                       *output(command, written)))
    assert line.startswith(f"Error: the plan ({plans['newest']}): {WORDS} {odd_chunks(plans['newest'])} layers: "
                           f"{RULE}")
    assert "IndexError at the first forward" in line
    assert line.endswith("plan again for core 0.15 (advisor ... --megatron-version 0.15) with an N that divides every "
                         "chunk or with --recompute-method block, or launch with a Megatron-LM core 0.19 checkout")
    assert not written.exists()


@needs_checkouts
@pytest.mark.parametrize("checkout, plan", [(V019, "newest"), (V015, "v015")], ids=["0.19", "0.15 N divides"])
def test_a_plan_its_release_runs_is_launched(tmp_path, plans, checkout, plan):
    """The same plan on core 0.19, and one whose every stage N divides on core 0.15."""
    result = run("launch", "args", "--from", plans[plan], "--megatron-lm", checkout, "--format", "json")
    assert result.returncode == 0, result.stderr
    args = json.loads(result.stdout)
    assert args[args.index("--recompute-num-layers") + 1] == "2"
    for command in (["torchrun", "--dry-run"], ["sbatch", "--dry-run", "-o", tmp_path / "job.sh"],
                    ["k8s", "--image", "ghcr.io/me/megatron:1", "-o", tmp_path / "job.yaml"]):
        result = run("launch", *command, "--from", plans[plan], "--megatron-lm", checkout)
        assert result.returncode == 0, result.stderr
    assert (tmp_path / "job.sh").is_file() and (tmp_path / "job.yaml").is_file()
    # check and a real launch go on to their preflight (this machine has no GPUs), not this refusal
    for command in (["check"], ["torchrun"]):
        assert WORDS not in run("launch", *command, "--from", plans[plan], "--megatron-lm", checkout).stderr


ELSEWHERE = [["torchrun", "--dry-run"], ["sbatch", "--dry-run"], ["k8s", "--image", "ghcr.io/me/megatron:1"],
             ["skypilot"]]


@needs_checkouts
@pytest.mark.parametrize("command", ELSEWHERE, ids=lambda command: command[0])
def test_without_a_checkout_here_the_release_assumed_decides(tmp_path, plans, command):
    """A dry run without a checkout, and k8s and SkyPilot naming one in the image, follow
    --megatron-version, else the newest release's rules (as for --mock-data's vocabulary)."""
    where = ["--megatron-lm", "/workspace/Megatron-LM"] if command[0] in ("k8s", "skypilot") else []
    written = output(command, tmp_path / "job.out")
    line = refused(run("launch", *command, "--from", plans["newest"], *where, "--megatron-version", "0.15", *written))
    assert WORDS in line and RULE in line
    assert not (tmp_path / "job.out").exists()
    result = run("launch", *command, "--from", plans["newest"], *where, *written)
    assert result.returncode == 0, result.stderr
    assert "assuming the rules of Megatron-LM core 0.19" in result.stderr


@needs_checkouts
def test_virtual_stages_are_checked_chunk_by_chunk(tmp_path):
    """An estimate with VPP 2: stages of 12, 8, 6 and 6 layers are chunks of 6, 6, 4, 4, 3, 3, 3, 3;
    N = 3 fails on core 0.15 only on the chunks of 4, though it divides no stage of 8."""
    path = tmp_path / "estimate.json"
    made = run("advisor", "estimate", "--tp", "2", "--pp", "4", "--vpp", "2", "--layers-per-stage", "12,8,6,6",
               "--gpus", "32", "--gbs", "256", "--mem", "80", "--recompute", "full", "--recompute-method", "uniform",
               "--recompute-num-layers", "3", "--format", "json", "-o", path)
    assert made.returncode == 0, made.stderr
    line = refused(run("launch", "args", "--from", path, "--megatron-lm", V015))
    assert "--recompute-num-layers 3 with model chunks of 4 layers" in line
    assert run("launch", "args", "--from", path, "--megatron-lm", V019).returncode == 0


@pytest.mark.parametrize("args, read", [
    (["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "3"],
     ("uniform", 3)),
    (["--recompute-granularity=full", "--recompute-method=block", "--recompute-num-layers=5"], ("block", 5)),
    (["--recompute-granularity", "selective"], None),
    (["--recompute-granularity", "full", "--recompute-num-layers", "3"], None),  # Megatron refuses it itself
    ([], None),
])
def test_the_recomputation_is_read_from_the_command_line(args, read):
    from launch.arguments import recomputation

    found = recomputation(args)
    assert (found and (found.recompute_method, found.recompute_num_layers)) == read
