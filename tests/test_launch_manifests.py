"""``advisor-launch k8s`` and ``skypilot``: the manifests validate against the official schemas.

No cluster is reachable here, so each document goes through the projects' own models and
schemas: the ``kubernetes`` client's ``V1PodTemplateSpec`` for every replica's pod template and
``kubeflow-training``'s ``KubeflowOrgV1PyTorchJob`` for the whole job (each deserialised with the
package's ApiClient, then serialised back: a key the model does not know would be dropped, so the
round trip must give the document unchanged), and SkyPilot's own task schema
(``sky.utils.schemas.get_task_schema``, checked with jsonschema as ``sky`` itself does) where
``skypilot`` is installed (it pins click < 8.2, which this project's CLI tests outgrew, so it is
not in the test extra)."""


import os
import subprocess

import pytest
import yaml
from launch_support import launcher

from launch.arguments import flag_values


def round_trip(client, document: dict, model: str):
    """``document`` deserialised into ``model`` with the package's ApiClient and serialised back."""
    value = client._ApiClient__deserialize(document, model)  # what ApiClient.deserialize does with a response
    return value, client.sanitize_for_serialization(value)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    from conftest import Invoker

    path = tmp_path_factory.mktemp("manifests") / "estimate.json"  # TP 2: Megatron needs CUDA_DEVICE_MAX_CONNECTIONS=1
    Invoker()("estimate", "--gpus", "16", "--mem", "80", "--tp", "2", "--cp", "1", "--pp", "2", "--mbs", "1",
              "--format", "json", "-o", path)
    return path


def test_the_pytorchjob_validates_against_kubernetes_and_kubeflow_models(sweep, tmp_path):
    kubernetes = pytest.importorskip("kubernetes", reason="pip install -e '.[test]' (the kubernetes client)")
    training = pytest.importorskip("kubeflow.training", reason="pip install -e '.[test]' (kubeflow-training)")
    out = tmp_path / "job.yaml"
    result = launcher()("k8s", "--from", sweep, "--image", "ghcr.io/example/megatron:25.04", "--megatron-lm",
                        "/workspace/Megatron-LM", "--gpus-per-node", "8", "--namespace", "training", "--mock-data",
                        "-o", out, "--", "--lr", "3e-4", "--train-iters", "100")
    assert result.stdout == ""  # written, not printed
    document = yaml.safe_load(out.read_text())
    replicas = document["spec"]["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] == 1 and replicas["Worker"]["replicas"] == 1  # 16 GPUs, nodes of 8
    api = kubernetes.client.ApiClient()
    for spec in replicas.values():
        template, back = round_trip(api, spec["template"], "V1PodTemplateSpec")
        assert back == spec["template"]
        [container] = template.spec.containers
        assert container.resources.limits == {"nvidia.com/gpu": "8"}
        assert {env.name: env.value for env in container.env} == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
        args = container.args
        assert args[args.index("--node-rank") + 1] == "$(RANK)" and "$(MASTER_ADDR)" in args
        megatron = args[args.index("--") + 1:]
        assert flag_values(megatron)["--lr"] == ("3e-4",) and "--mock-data" in megatron
    job, back = round_trip(training.ApiClient(), document, "KubeflowOrgV1PyTorchJob")
    assert back == document and job.kind == "PyTorchJob" and job.metadata.namespace == "training"
    printed = launcher()("k8s", "--from", sweep, "--image", "ghcr.io/example/megatron:25.04", "--megatron-lm",
                         "/workspace/Megatron-LM", "--gpus-per-node", "8", "--namespace", "training", "--mock-data",
                         "--dry-run", "--", "--lr", "3e-4", "--train-iters", "100").stdout
    assert printed == out.read_text()


SKYPILOT_CHECK = """
import sys, sky
task = sky.Task.from_yaml(sys.argv[1])  # SkyPilot's own loader: its schema, then its Task
print(task.num_nodes, sorted(task.envs), [str(r.accelerators) for r in task.resources])
"""


def test_the_skypilot_task_validates_against_skypilots_schema(sweep, tmp_path):
    """SkyPilot pins click < 8.2, which this project's CLI cannot run with, so SkyPilot lives in an
    interpreter of its own (``$SKYPILOT_PYTHON``; .ci/run builds .venv-sky) and validates the task
    with its own loader there."""
    python = os.environ.get("SKYPILOT_PYTHON")
    if not python:
        if os.environ.get("CI") == "true":
            pytest.fail("CI must validate with SkyPilot: set SKYPILOT_PYTHON (.ci/run builds .venv-sky)")
        pytest.skip("no SkyPilot interpreter: set SKYPILOT_PYTHON to a Python with skypilot installed")
    result = launcher()("skypilot", "--from", sweep, "--megatron-lm", "~/Megatron-LM", "--accelerator", "H100",
                        "--mock-data", "--dry-run", "--", "--lr", "3e-4", "--train-iters", "100")
    path = tmp_path / "task.yaml"
    path.write_text(result.stdout)
    checked = subprocess.run([python, "-c", SKYPILOT_CHECK, path], capture_output=True, text=True, timeout=300)
    assert checked.returncode == 0, checked.stderr[-2000:]
    assert checked.stdout.split()[0] == "2" and "H100" in checked.stdout
    task = yaml.safe_load(result.stdout)
    assert task["num_nodes"] == 2 and task["resources"]["accelerators"] == "H100:8"
    assert task["envs"] == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert '--node-rank "$SKYPILOT_NODE_RANK"' in task["run"]
    bad = tmp_path / "bad.yaml"  # and it refuses what is not a task: the check has teeth
    bad.write_text(result.stdout + "not_a_task_field: 1\n")
    assert subprocess.run([python, "-c", SKYPILOT_CHECK, bad], capture_output=True, timeout=300).returncode != 0


def test_bad_manifest_input_is_one_line(sweep):
    result = launcher()("k8s", "--from", sweep, "--image", "x", "--megatron-lm", "/workspace/Megatron-LM", "--name",
                        "Not_A_Label", expect=2)
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert errors == ["Error: --name 'Not_A_Label': a job name must be a DNS label (lower-case letters, digits and "
                      "'-', at most 63 characters)"] and result.stdout == ""
    assert "Missing option '--image'" in launcher().error("k8s", "--from", sweep)


def test_the_manifests_ranks_check_transformer_engine_on_their_nodes(sweep):
    """The image is not this machine's to inspect: as under sbatch, each rank's entry checks
    Transformer Engine first (one line and exit 2 on a node that lacks it, not Megatron's first TE
    import), where the arguments use it; with --transformer-impl local they do not."""
    def entry(*extra: str) -> list[str]:
        for command in ("k8s", "skypilot"):
            text = launcher()(command, "--from", sweep, "--image" if command == "k8s" else "--accelerator",
                              "ghcr.io/example/megatron:25.04" if command == "k8s" else "H100", "--megatron-lm",
                              "/workspace/Megatron-LM", "--gpus-per-node", "8", "--mock-data", "--dry-run", "--",
                              *extra).stdout
            yield text[:text.index(" -- ")] if " -- " in text else text

    assert all("--check-imports" in head for head in entry())
    assert not any("--check-imports" in head for head in entry("--transformer-impl", "local"))


def test_a_flex_rows_ranks_check_deep_ep_on_their_nodes(advisor, tmp_path):
    """The flex dispatcher's DeepEP needs deep_ep on the image: its ranks check it even where
    Transformer Engine is not used (launch.preflight.deep_ep_backend)."""
    from launch_support import write_json

    row = advisor.json("estimate", "--model", "qwen3-30b-a3b", "--gpus", 16, "--ep", 8, "--gpu", "h100-80gb",
                       "--moe-token-dispatcher-type", "flex")
    text = launcher()("k8s", "--from", write_json(tmp_path / "flex.json", row), "--image", "x", "--megatron-lm",
                      "/workspace/Megatron-LM", "--gpus-per-node", "8", "--mock-data", "--dry-run", "--",
                      "--transformer-impl", "local").stdout
    assert "- --check-imports" in text  # the entry's own option, before the Megatron arguments


def test_the_task_asks_for_the_gpu_the_input_was_priced_on(advisor, tmp_path):
    """SkyPilot's accelerator defaults to the priced preset's name (an H200 estimate asks for H200,
    not H100), and another given is launched with a warning: its verdict and time describe the
    priced GPU."""
    estimate = tmp_path / "h200.json"
    advisor("estimate", "--tp", "2", "--gpus", "8", "--gpu", "h200-141gb", "--format", "json", "-o", estimate)
    common = ["skypilot", "--from", estimate, "--megatron-lm", "~/Megatron-LM", "--mock-data", "--dry-run", "--",
              "--lr", "1e-4", "--train-iters", "10"]
    plain = launcher()(*common)
    assert yaml.safe_load(plain.stdout)["resources"]["accelerators"] == "H200:8"
    assert "--accelerator" not in plain.stderr
    other = launcher()(*common[:3], "--accelerator", "A100", *common[3:])
    assert yaml.safe_load(other.stdout)["resources"]["accelerators"] == "A100:8"
    assert "warning: --accelerator A100 is not the GPU the input was priced on (h200-141gb, SkyPilot's H200)" \
        in other.stderr


def test_a_preset_without_a_skypilot_name_asks_for_one():
    from launch.manifests import accelerator_for

    assert accelerator_for("h800-80gb", None) == ("H100", "warning: the input was priced on h800-80gb, which has no "
                                                  "SkyPilot name here: the task asks for H100 (--accelerator NAME asks "
                                                  "for the GPU you mean)")
    assert accelerator_for("h800-80gb", "H800") == ("H800", None) and accelerator_for(None, None) == ("H100", None)


def test_a_userbuffers_file_is_named_as_one_the_nodes_must_hold(tmp_path):
    """k8s and SkyPilot wrote --tp-comm-overlap-cfg FILE as given, a path on this machine, with no
    word (audit): Megatron-LM opens it on every rank. A warning names it; the job keeps the path."""
    from conftest import Invoker

    ub = tmp_path / "ub.yaml"
    ub.write_text("proj_fprop: {num_sm: 24}\n")
    row = tmp_path / "row.json"
    Invoker()("estimate", "--model", "llama3.1-8b", "--gpus", "8", "--tp", "8", "--gpu", "h100-80gb", "--tp-comm-overlap",
              "--tp-comm-overlap-cfg", ub, "--format", "json", "-o", row)
    for command, more in (("k8s", ["--image", "img"]), ("skypilot", ["--accelerator", "H100"])):
        result = launcher()(command, "--from", row, *more, "--megatron-lm", "/workspace/Megatron-LM", "--mock-data",
                            "--dry-run")
        assert (f"warning: --tp-comm-overlap-cfg {ub} is read by every rank where it runs (relative to its working "
                "directory): put the file there (in the image or on a mount); this job does not carry it") \
            in result.stderr.splitlines()
        assert "--tp-comm-overlap-cfg" in result.stdout and str(ub) in result.stdout


def test_the_manifests_say_what_the_image_or_the_nodes_must_hold(sweep):
    """Both run `torchrun ... -m launch.entry` (this package) on every node, and neither installs it
    (no SkyPilot setup: or workdir:, a pod runs its image as it is): each says at its top, in
    comments the parsers skip, that the image or the nodes must hold torch, this package with its
    [megatron] extra and the checkout at --megatron-lm; the documents themselves are unchanged."""
    texts = {command: launcher()(command, "--from", sweep, *more, "--megatron-lm", "/opt/Megatron-LM", "--mock-data",
                                 "--dry-run").stdout
             for command, more in (("k8s", ["--image", "ghcr.io/example/megatron:25.04"]),
                                   ("skypilot", ["--accelerator", "H100"]))}
    for command, text in texts.items():
        comment = " ".join(line.removeprefix("# ") for line in text.splitlines() if line.startswith("#"))
        assert text.startswith("# Written by advisor-launch.") and "-m launch.entry" in text
        for needed in ("`python -m launch.entry`", "torch;", "megatron-4d-advisor, with its [megatron] extra",
                       "the Megatron-LM checkout at /opt/Megatron-LM", "Nothing here installs them."):
            assert needed in comment, (command, needed)
        body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
        assert yaml.safe_load(text) == yaml.safe_load(body)
    assert "The image ghcr.io/example/megatron:25.04 must hold" in texts["k8s"].replace("\n# ", " ")
    task = yaml.safe_load(texts["skypilot"])
    assert "setup" not in task and "workdir" not in task  # nothing installed behind the user's back
    assert "  workdir: DIR" in texts["skypilot"] and "  setup: pip install '.[megatron]'" in texts["skypilot"]
    odd = launcher()("k8s", "--from", sweep, "--image", "img", "--megatron-lm", "/opt/a\nkind: Pod\u2028b: 1",
                     "--dry-run").stdout  # a path's line breaks stay inside the comment
    assert yaml.safe_load(odd)["kind"] == "PyTorchJob" and "/opt/a kind: Pod b: 1" in odd.replace("\n# ", " ")
