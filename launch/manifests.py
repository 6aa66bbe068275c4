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
from dataclasses import dataclass
from typing import Mapping

from advisor.errors import AdvisorError
from launch.commands import DEFAULT_RDZV_PORT, ENTRY_MODULE, ShellWord, Topology, wrap

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


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
    if len(name) > 63 or not _DNS_LABEL.match(name):
        raise AdvisorError(f"--name {name!r}: a job name must be a DNS label (lower-case letters, digits and '-', "
                           "at most 63 characters)")
    return name


def job_name(model_name: str) -> str:
    """A DNS label from a model's name: megatron-llama3-1-8b."""
    base = re.sub(r"[^a-z0-9]+", "-", model_name.partition("[")[0].lower()).strip("-")
    return f"megatron-{base}"[:63].rstrip("-")


# --- Kubeflow PyTorchJob -------------------------------------------------------------------------


def pod_template(job: Job, image: str) -> dict:
    """The pod template of every replica (a ``V1PodTemplateSpec``)."""
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
    """A ``kubeflow.org/v1`` PyTorchJob: one Master and nodes - 1 Workers."""
    replica = {"restartPolicy": "OnFailure", "template": pod_template(job, image)}
    specs = {"Master": {"replicas": 1, **replica}}
    if job.topology.nnodes > 1:
        specs["Worker"] = {"replicas": job.topology.nnodes - 1, **replica}
    metadata = {"name": job.name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": metadata,
            "spec": {"runPolicy": {"cleanPodPolicy": "None"}, "pytorchReplicaSpecs": specs}}


# --- SkyPilot ----------------------------------------------------------------------------------


def skypilot_task(job: Job, accelerator: str) -> dict:
    """A SkyPilot task: the nodes, their GPUs, the environment and the run script."""
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


def to_yaml(document: dict) -> str:
    """YAML with multi-line strings as literal blocks (the run script reads as a script)."""
    try:
        import yaml
    except ImportError:
        return json.dumps(document, indent=2) + "\n"  # JSON is YAML; kubectl and sky read it as such

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper, value: str):
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    Dumper.ignore_aliases = lambda self, data: True  # each replica's template written out, no &anchors
    return yaml.dump(document, Dumper=Dumper, sort_keys=False, width=100)

