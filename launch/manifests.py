"""The same launch as a Kubernetes or SkyPilot job: a Kubeflow PyTorchJob manifest and a SkyPilot
task, from the same input, environment and Megatron-LM arguments as ``torchrun``/``sbatch``.

Each node (a pod, a SkyPilot node) runs one torchrun with static rendezvous, as Megatron-LM's
own examples do (``--node-rank --master-addr --master-port``), starting ``launch.entry`` on
its GPUs:

- PyTorchJob (``kubeflow.org/v1``, Kubeflow Training Operator): one ``Master`` replica and
  ``nodes - 1`` ``Worker`` replicas; the operator sets ``MASTER_ADDR``, ``MASTER_PORT`` and
  ``RANK`` (the pod's node rank) in each container, which Kubernetes expands in ``args``
  (``$(NAME)``); ``nvidia.com/gpu`` GPUs per pod (the NVIDIA device plugin's resource); a
  memory-backed ``/dev/shm`` (NCCL and the data loader's workers need more than the 64 MiB a
  container gets by default).
- SkyPilot task: ``num_nodes``, ``resources.accelerators: NAME:GPUS``; its run script reads
  ``SKYPILOT_NODE_RANK``, ``SKYPILOT_NODE_IPS`` (the first is the head) and
  ``SKYPILOT_NUM_GPUS_PER_NODE``, as SkyPilot's distributed-training docs do.

The environment Megatron demands (``launch.megatron_versions.environment``) is set in both.
"""

from __future__ import annotations

import json
import re
import textwrap
from dataclasses import dataclass
from typing import Mapping, Sequence

from advisor.errors import AdvisorError
from launch.commands import DEFAULT_RDZV_PORT, ENTRY_MODULE, ShellWord, Topology, wrap

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_ACCELERATOR = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True, kw_only=True, slots=True)
class Job:
    """What both writers take: the job's name, its nodes and the command every node runs."""

    name: str
    topology: Topology
    entry: tuple[str, ...]
    """launch.entry's own options."""
    megatron: tuple[str, ...]
    environment: Mapping[str, str]
    port: int = DEFAULT_RDZV_PORT

    def __post_init__(self) -> None:
        check_name(self.name)

    def torchrun(self, node_rank: str, master: str, port: str) -> list[str]:
        return ["torchrun", "--nnodes", str(self.topology.nnodes), "--nproc-per-node",
                str(self.topology.nproc_per_node), "--node-rank", node_rank, "--master-addr", master,
                "--master-port", port, "-m", ENTRY_MODULE, *self.entry, "--", *self.megatron]


def check_name(name: str) -> str:
    """A Kubernetes object name (and a SkyPilot task name): a DNS label (RFC 1123)."""
    return _dns_label("--name", name, "a job name")


def check_namespace(namespace: str) -> str:
    """A Kubernetes namespace: a DNS label too (``--namespace ''`` left the manifest without one)."""
    return _dns_label("--namespace", namespace, "a namespace")


def _dns_label(option: str, value: str, what: str) -> str:
    if len(value) > 63 or not _DNS_LABEL.match(value):
        raise AdvisorError(f"{option} {value!r}: {what} must be a DNS label (lower-case letters, digits and '-', "
                           "at most 63 characters)")
    return value


def check_image(image: str) -> str:
    """A container image reference: neither blank nor holding blanks (``--image ''`` wrote
    ``image: ''``, which Kubernetes refuses only when the job is created)."""
    if not image.strip() or any(char.isspace() for char in image):
        raise AdvisorError(f"--image {image!r}: give a container image reference without blanks, e.g. "
                           "ghcr.io/me/megatron:25.04")
    return image


SKYPILOT_ACCELERATORS = {
    "a100-40gb": ("A100",), "a100-40gb-abci": ("A100",), "a100-80gb": ("A100-80GB", "A100-80GB-SXM"),
    "h100-80gb": ("H100", "H100-MEGA"), "h200-141gb": ("H200",), "b200-180gb": ("B200",), "gb200": ("GB200",),
    "mi300x-192gb": ("MI300X",),
}
"""SkyPilot's accelerator names for the GPU presets they are (``sky show-gpus -a``,
docs.skypilot.co/en/stable/compute/gpus.html), the first the one a task asks for by default."""


def accelerator_for(priced_gpu: str | None, given: str | None) -> tuple[str, str | None]:
    """(the accelerator a task asks for, a warning or None): ``given`` where given, else the
    SkyPilot name of the preset the input was priced on, else H100; the warning where the given
    one is not the priced GPU (its verdict and step time describe another GPU)."""
    names = SKYPILOT_ACCELERATORS.get(priced_gpu or "", ())
    if given is None and priced_gpu and not names:
        return "H100", (f"warning: the input was priced on {priced_gpu}, which has no SkyPilot name here: the task "
                        "asks for H100 (--accelerator NAME asks for the GPU you mean)")
    if given is None:
        return (names[0] if names else "H100"), None
    if names and given.upper() not in {name.upper() for name in names}:
        return given, (f"warning: --accelerator {given} is not the GPU the input was priced on ({priced_gpu}, "
                       f"SkyPilot's {names[0]}): its memory verdict and step time describe that GPU, not {given}")
    return given, None


def check_accelerator(accelerator: str) -> str:
    """A SkyPilot accelerator name alone (H100, A100-80GB): the writer adds the count, the GPUs per
    node (``H100:8`` became ``accelerators: H100:8:8``, which SkyPilot cannot parse)."""
    if ":" in accelerator:
        name = accelerator.partition(":")[0].strip() or "H100"
        raise AdvisorError(f"--accelerator {accelerator!r}: give the accelerator's name alone (e.g. {name}): "
                           "the count is the GPUs per node, which the launcher adds (--gpus-per-node sets it)")
    if not _ACCELERATOR.match(accelerator):
        raise AdvisorError(f"--accelerator {accelerator!r}: an accelerator name is letters, digits, '-', '_' and "
                           "'.', e.g. H100 or A100-80GB")
    return accelerator


def job_name(model_name: str) -> str:
    """A DNS label from a model's name: megatron-llama3-1-8b."""
    base = re.sub(r"[^a-z0-9]+", "-", model_name.partition("[")[0].lower()).strip("-")
    return f"megatron-{base}"[:63].rstrip("-")


# --- Kubeflow PyTorchJob -------------------------------------------------------------------------


def pod_template(job: Job, image: str) -> dict:
    """The pod template of every replica (a ``V1PodTemplateSpec``)."""
    check_image(image)
    env = [{"name": name, "value": value} for name, value in job.environment.items()]
    container = {
        "name": "pytorch",  # the container name the training operator looks for
        "image": image,
        "command": job.torchrun("$(RANK)", "$(MASTER_ADDR)", "$(MASTER_PORT)")[:1],
        "args": job.torchrun("$(RANK)", "$(MASTER_ADDR)", "$(MASTER_PORT)")[1:],
        # a Quantity: the client's model holds it as a string ("8"), which the API server reads as 8
        "resources": {"limits": {"nvidia.com/gpu": str(job.topology.nproc_per_node)}},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }
    if env:
        container["env"] = env
    return {"spec": {"containers": [container],
                     "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]}}


def pytorchjob(job: Job, image: str, namespace: str | None = None) -> dict:
    """A ``kubeflow.org/v1`` PyTorchJob: one Master and nodes - 1 Workers (in ``namespace``, else
    in kubectl's)."""
    if namespace is not None:
        check_namespace(namespace)
    replica = {"restartPolicy": "OnFailure", "template": pod_template(job, image)}
    specs = {"Master": {"replicas": 1, **replica}}
    if job.topology.nnodes > 1:
        specs["Worker"] = {"replicas": job.topology.nnodes - 1, **replica}
    metadata = {"name": job.name, **({"namespace": namespace} if namespace is not None else {})}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": metadata,
            "spec": {"runPolicy": {"cleanPodPolicy": "None"}, "pytorchReplicaSpecs": specs}}


# --- SkyPilot ----------------------------------------------------------------------------------


def skypilot_task(job: Job, accelerator: str) -> dict:
    """A SkyPilot task: the nodes, their GPUs (``accelerator``, a name alone), the environment and
    the run script."""
    check_accelerator(accelerator)
    head = ShellWord('"$(echo "$SKYPILOT_NODE_IPS" | head -n1)"')
    torchrun = job.torchrun(ShellWord('"$SKYPILOT_NODE_RANK"'), head, str(job.port))
    lines = wrap(torchrun, width=96, break_before=frozenset({"-m"}), break_after=frozenset({"--"}))
    run = "set -euo pipefail\n" + " \\\n".join(lines) + "\n"
    task = {"name": job.name, "num_nodes": job.topology.nnodes,
            "resources": {"accelerators": f"{accelerator}:{job.topology.nproc_per_node}"},
            "run": run}
    if job.environment:
        task["envs"] = dict(job.environment)
    return task


# --- writing -------------------------------------------------------------------------------------


def node_needs(job: Job, where: str) -> list[str]:
    """What ``where`` (the image, the nodes) must hold for the job to start, as comment lines:
    torchrun starts ``python -m launch.entry`` (this package) on every GPU, which runs the
    checkout's ``pretrain_gpt.py``; neither manifest installs anything (a pod runs its image as it
    is; a SkyPilot task without ``setup:`` runs on the nodes' Python as it is)."""
    checkout = job.entry[job.entry.index("--megatron-lm") + 1] if "--megatron-lm" in job.entry else "--megatron-lm"
    checkout = " ".join(checkout.splitlines())  # a path may hold a line break (YAML's \x85, \u2028 too); a comment may not
    return textwrap.wrap(
        f"Written by advisor-launch. {where} must hold, for every node's torchrun and its `python -m "
        "launch.entry`: torch; this package, megatron-4d-advisor, with its [megatron] extra (pip install "
        "'DIR[megatron]' from a checkout DIR of it, the launcher's version); and the Megatron-LM checkout at "
        f"{checkout}. Nothing here installs them.", width=96, break_long_words=False, break_on_hyphens=False)


SKYPILOT_SETUP = [
    "Nodes without this package: sync a checkout of it and install it before the run, e.g.",
    "  workdir: DIR          # synced to ~/sky_workdir on every node; setup and run start there",
    "  setup: pip install '.[megatron]'",
    "(relative paths in the run, e.g. --save, are then read under ~/sky_workdir).",
]
"""SkyPilot's own way, as an example, not written into the task: ``workdir`` is synced to
``~/sky_workdir`` on every node and ``setup`` and ``run`` execute there
(docs.skypilot.co/en/stable/examples/syncing-code-artifacts.html); where this package comes from
(a source checkout, a wheel, the image) is the user's to say."""


def to_yaml(document: dict, comment: Sequence[str] = ()) -> str:
    """YAML with multi-line strings as literal blocks (the run script reads as a script), after
    ``comment``'s lines as ``#`` comments (YAML's; a JSON document after them is still YAML)."""
    header = "".join(f"# {line}\n" for line in comment)
    try:
        import yaml
    except ImportError:
        return header + json.dumps(document, indent=2) + "\n"  # JSON is YAML; kubectl and sky read it as such

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper, value: str):
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    Dumper.ignore_aliases = lambda self, data: True  # each replica's template written out, no &anchors
    return header + yaml.dump(document, Dumper=Dumper, sort_keys=False, width=100)

