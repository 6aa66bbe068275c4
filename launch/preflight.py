"""Preflight: everything that would stop a launch after its ranks started, checked before.

``advisor-launch check`` runs these checks alone; ``torchrun`` and ``sbatch`` run them before
they start anything (a dry run prints them as warnings). Each check returns its problems, one
line each, so that every problem of a setup is named at once:

- the Python the checkout's release needs (its pyproject's ``requires-python``);
- the modules the release imports at run time (``MegatronVersion.imports``), and megatron-core
  itself (from the checkout, which provides it, or installed);
- GPUs on this node (``nvidia-smi -L``, restricted by ``CUDA_VISIBLE_DEVICES``) against the GPUs
  per node the launch starts; none at all is allowed only for the CPU test path
  (``--distributed-backend gloo``), which says so;
- Transformer Engine: importable where the launch uses it (``--transformer-impl
  transformer_engine``, Megatron-LM's default), and options only it implements refused with
  ``--transformer-impl local``: ``--tp-comm-overlap`` (userbuffers, ``initialize_ub``), FP8
  (``--fp8-format``: TE's autocast), CP > 1 (megatron-core's ``DotProductAttention`` asserts
  ``context_parallel_size == 1``, "Context parallelism is only supported by
  TEDotProductAttention!", when the model is built, 40-50 s into the run, on every rank), and
  sequence parallelism with RMSNorm at TP > 1 (torch's norm asserts it, the same way:
  ``advisor.options.local_spec``, which advisor estimate --from-command applies too), and
  RMSNorm without ``--no-persist-layer-norm`` (torch's norm asserts Megatron's default persistent
  kernel off, one line before: ``advisor.options.local_spec`` too). Its
  import is checked only where the ranks run here: a Slurm login node often lacks TE (no GPU, an
  environment of its own), so for ``sbatch`` the job's ranks check it on their nodes instead
  (``launch.entry --check-imports``: at most one line per node and exit status 2
  before Megatron starts), and this node's lack of it is a note;
- data and tokenizer files: each ``--data-path`` prefix has its ``.bin`` and ``.idx`` (Megatron's
  ``IndexedDataset``), the tokenizer's files exist;
- the directories a run writes (``--save``, ``--tensorboard-dir``, ``--wandb-save-dir``, the
  profile directory) can be created and written: a file is created (and removed at once) in
  the nearest existing one, which is what a root user on a read-only mount needs too.

No torch is imported here.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from launch.arguments import flag_values
from launch.megatron_versions import MegatronVersion, check_python
from advisor.errors import AdvisorError
from advisor.fileio import not_a_directory
from advisor.options.local_spec import (NO_PERSIST_FLAG, local_persist_layer_norm_problem,
                                        local_sequence_parallel_clause, local_sequence_parallel_problem)

TE_ONLY_FLAGS = {"--tp-comm-overlap": "--tp-comm-overlap (TE's userbuffers)",
                 "--fp8-format": "FP8 (--fp8-format: TE's autocast)"}
TE_KERNEL_FLAGS = ("--moe-permute-fusion", "--moe-router-fusion")
"""Flags that need Transformer Engine importable whatever --transformer-impl says: megatron-core's
MoE code calls TE's fused permutation and router kernels itself (``moe_utils.fused_permute``, which
``TransformerConfig.__post_init__`` requires; ``fused_topk_with_score_function`` at the first
forward), both releases."""
DATA_PREFIX_FLAGS = ("--data-path", "--train-data-path", "--valid-data-path", "--test-data-path")
DATA_FILE_FLAGS = ("--data-args-path", "--per-split-data-args-path", "--vocab-file", "--merge-file")
WRITTEN_DIRECTORIES = ("--save", "--tensorboard-dir", "--wandb-save-dir")
INSTALL = "pip install 'megatron-4d-advisor[megatron]'"
CPU_TEST_NOTE = ("no GPUs on this node: a CPU launch over gloo (--distributed-backend gloo) is only for tests "
                 "(tests/fixtures/cuda_on_cpu stands in for CUDA); a training run needs GPUs")


@dataclass(frozen=True, kw_only=True, slots=True)
class Setup:
    """What one launch will run, as its checks see it."""

    rules: MegatronVersion
    checkout: Path | None
    """None: a dry run without a checkout on disk (megatron-core's presence is not checked)."""
    args: tuple[str, ...]
    """The whole Megatron-LM command line."""
    cp: int
    gpus_per_node: int
    profile_dir: Path | None = None
    gpus_here: bool = True
    """Whether the ranks run on this node (torchrun, check) or elsewhere (sbatch: on the job's nodes):
    elsewhere, neither this node's GPUs nor its Transformer Engine is checked."""
    elsewhere_option: str | None = None
    """The command's option that says the ranks run elsewhere (check: --no-gpus-here), named
    where this node has no GPUs."""


@dataclass(slots=True)
class Report:
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    incomplete: str | None = None
    """What the job lacks (``launch.job.missing``), where the caller checked it."""


# --- the checks ----------------------------------------------------------------------------


def python_problems(setup: Setup, running: tuple[int, int] | None = None) -> list[str]:
    try:
        check_python(setup.rules, running or sys.version_info[:2])
    except AdvisorError as exc:
        return [str(exc)]
    return []


def importable_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package absent, or a broken module in sys.modules
        return False


def _builds_dataset_helpers(checkout: Path) -> bool:
    """The checkout ships the dataset helpers' source but no compiled ``helpers_cpp`` module."""
    datasets = checkout / "megatron" / "core" / "datasets"
    return (datasets / "Makefile").is_file() and not any(datasets.glob("helpers_cpp*"))


def import_problems(setup: Setup, importable: Callable[[str], bool] = importable_module) -> list[str]:
    """Each module the release imports at run time that this Python cannot import."""
    problems = [f"cannot import {module} ({setup.rules.name} imports it at run time{why}): {INSTALL}"
                for module, why in setup.rules.imports if not importable(module)]
    if setup.checkout is not None and _builds_dataset_helpers(setup.checkout) and not importable("pybind11"):
        # megatron/core/datasets/Makefile: CPPFLAGS += $(shell python3 -m pybind11 --includes); the
        # first rank compiles helpers_cpp at start-up when the checkout has none built
        problems.append(f"cannot import pybind11 ({setup.rules.name} compiles its dataset helpers with it at "
                        f"start-up: megatron/core/datasets/Makefile): {INSTALL}")
    provided = setup.checkout is not None and (setup.checkout / "megatron" / "core" / "__init__.py").is_file()
    if setup.checkout is not None and not provided and not importable("megatron.core"):
        problems.append(f"cannot import megatron.core: the checkout {setup.checkout} has no megatron/core and none "
                        f"is installed: {INSTALL}")
    return problems


def count_gpus(environ: Mapping[str, str] | None = None) -> int | None:
    """GPUs this node gives a process: ``nvidia-smi -L``'s, restricted by ``CUDA_VISIBLE_DEVICES``;
    None where there is no nvidia-smi (no NVIDIA driver)."""
    environ = os.environ if environ is None else environ
    program = shutil.which("nvidia-smi", path=environ.get("PATH"))
    if program is None:
        return None
    try:
        listed = subprocess.run([program, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = sum(line.startswith("GPU ") for line in listed.stdout.splitlines()) if listed.returncode == 0 else 0
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        found = min(found, len([item for item in visible.split(",") if item.strip() and item.strip() != "-1"]))
    return found


def gpu_problems(setup: Setup, report: Report, found: int | None) -> list[str]:
    if not setup.gpus_here:
        return []
    if not found:
        if flag_values(setup.args).get("--distributed-backend") == ("gloo",):
            report.notes.append(CPU_TEST_NOTE)
            return []
        where = "nvidia-smi -L lists none" if found == 0 else "no nvidia-smi on PATH (no NVIDIA driver)"
        elsewhere = f" (ranks on other nodes: {setup.elsewhere_option})" if setup.elsewhere_option else ""
        return [f"no GPUs on this node ({where}); the launch starts {setup.gpus_per_node} ranks per node, one per "
                f"GPU{elsewhere}"]
    if found < setup.gpus_per_node:
        return [f"this node has {found} GPU(s) (nvidia-smi -L, CUDA_VISIBLE_DEVICES), the launch needs "
                f"{setup.gpus_per_node} per node"]
    return []


def implementation(values: dict) -> str:
    """--transformer-impl of a command's flag values: the last given, as argparse keeps it, or
    Megatron-LM's default, transformer_engine."""
    return (values.get("--transformer-impl") or ("transformer_engine",))[0]


def uses_transformer_engine(args) -> bool:
    """Whether ``args`` need Transformer Engine: its modules (``--transformer-impl
    transformer_engine``, Megatron-LM's default; the last one given wins, as argparse keeps it) or
    its MoE code (``_te_kernels``, under either implementation)."""
    values = flag_values(args)
    impl = implementation(values)
    return impl == "transformer_engine" or bool(_te_kernels(values))


def _te_kernels(values: dict) -> list[str]:
    """The options that call Transformer Engine's MoE code whatever --transformer-impl says:
    ``TE_KERNEL_FLAGS``, the flex dispatcher's NCCL-EP backend (core_v0.19.0
    ``moe/fused_a2a.py``: ``transformer_engine.pytorch.ep``), and the precision-aware optimizer
    (with --optimizer-cpu-offload too): megatron-core's ``OptimizerConfig``, built after the model,
    asks TE's version (core_v0.15.2 fails without TE, even offloaded) and then imports TE's
    FusedAdam unless offloaded (core_v0.19.0 runs the offloaded one without TE: refused here all
    the same, with --transformer-impl local only, as the one rule)."""
    kernels = [flag for flag in TE_KERNEL_FLAGS if flag in values]
    if _flex_backend(values) == "ncclep":
        kernels.append("--moe-flex-dispatcher-backend ncclep")
    if "--use-precision-aware-optimizer" in values:
        kernels.append("--use-precision-aware-optimizer")
    return kernels


def _flex_backend(values: dict) -> str | None:
    """The flex dispatcher's backend (Megatron's default deepep), or None without the flex dispatcher
    (Megatron's default dispatcher is allgather); the last value given wins, as argparse keeps it."""
    if (values.get("--moe-token-dispatcher-type") or ("allgather",))[-1] != "flex":
        return None
    return (values.get("--moe-flex-dispatcher-backend") or ("deepep",))[-1]


def transformer_engine_import_problem(args, where: str = "") -> str:
    """The line for a missing ``transformer_engine`` that ``args`` need (``where``: the node, for
    a rank's message)."""
    values = flag_values(args)
    kernels = _te_kernels(values)
    if implementation(values) == "local" and kernels:
        return (f"cannot import transformer_engine{where}, which {' and '.join(kernels)} need"
                f"{'s' if len(kernels) == 1 else ''} (Transformer Engine's own kernels, whatever "
                "--transformer-impl says): install Transformer Engine, or plan the run without them (advisor "
                "sweep or estimate without those options)")
    given = "--transformer-impl transformer_engine" if "--transformer-impl" in values else \
        "Megatron-LM's default --transformer-impl transformer_engine"
    return (f"cannot import transformer_engine{where}, which {given} needs: install Transformer Engine "
            "(--transformer-impl local after -- runs megatron-core's own modules instead: unfused attention, not "
            "the fused attention a plan is priced with, and no CP > 1, FP8, TP overlap or fused MoE kernels"
            f"{local_sequence_parallel_clause(**_norm_setting(values))})")


def _norm_setting(values: dict) -> dict:
    """What decides whether megatron-core's local spec can build ``values``' norms with sequence
    parallelism (``advisor.options.local_spec``): --sequence-parallel, TP, --normalization
    (Megatron's default LayerNorm), and whether the model has experts; the last value given wins."""
    tp = (values.get("--tensor-model-parallel-size") or ("1",))[-1]
    return {"sequence_parallel": "--sequence-parallel" in values, "tp": int(tp) if tp.isdecimal() else 1,
            "normalization": (values.get("--normalization") or ("LayerNorm",))[-1],
            "moe": "--num-experts" in values}


def local_attention_note(plan_args, args) -> str | None:
    """Where the user's --transformer-impl local (after --) makes the attention unfused and the plan
    (``plan_args``, the input's own arguments) priced fused attention: neither megatron-core's own
    modules nor --attention-backend unfused. The run keeps every s x s score, so its memory and
    time are not the plan's. A note, not a refusal: a CPU test launch over gloo needs the local
    modules (tests/fixtures/cuda_on_cpu)."""
    plan, values = flag_values(plan_args), flag_values(args)
    if implementation(values) != "local" \
            or implementation(plan) == "local" or plan.get("--attention-backend") == ("unfused",):
        return None
    return ("--transformer-impl local (after --) runs megatron-core's own unfused attention, which keeps every "
            "s x s score: the plan was priced with fused attention, so its memory and time are not this run's "
            "(advisor estimate --from-command prices the command as launched)")


def local_implementation_problems(args: Sequence[str], cp: int) -> list[str]:
    """What ``args`` ask of Transformer Engine that their --transformer-impl local cannot give
    (FP8, TP-communication overlap, CP > 1, and sequence parallelism with RMSNorm at TP > 1:
    ``advisor.options.local_spec``, the rule advisor estimate --from-command applies too), and an
    RMSNorm model without --no-persist-layer-norm (torch's norm refuses Megatron's default
    persistent kernel: ``advisor.options.local_spec`` too): Megatron-LM refuses each on every rank
    after start-up. Empty without --transformer-impl local."""
    values = flag_values(args)
    if implementation(values) != "local":
        return []
    uses = [text for flag, text in TE_ONLY_FLAGS.items() if flag in values]
    if cp > 1:
        uses.append(f"CP {cp} (megatron-core's DotProductAttention asserts CP 1 when the model is built)")
    problems = [f"{use} needs Transformer Engine, and the launch has --transformer-impl local: Megatron-LM refuses "
                f"it on every rank after start-up; drop --transformer-impl local and install Transformer Engine"
                for use in uses]
    norms = _norm_setting(values)
    # torch's norm asserts persist_layer_norm off one line before sequence parallelism (local_spec)
    if problem := local_persist_layer_norm_problem(transformer_impl="local", normalization=norms["normalization"],
                                                   no_persist_layer_norm=NO_PERSIST_FLAG in values):
        problems.append(problem)
    if problem := local_sequence_parallel_problem(transformer_impl="local", **norms):
        problems.append(problem)
    return problems


def transformer_engine_problems(setup: Setup, importable: Callable[[str], bool] = importable_module) -> list[str]:
    if problems := local_implementation_problems(setup.args, setup.cp):
        return problems
    if uses_transformer_engine(setup.args) and setup.gpus_here and not importable("transformer_engine"):
        return [transformer_engine_import_problem(setup.args)]
    return []


def transformer_engine_note(setup: Setup, importable: Callable[[str], bool] = importable_module) -> str | None:
    """Where the ranks run elsewhere: that this node lacks the Transformer Engine they need, as a
    note (the nodes that run them are what matters; sbatch's job checks it there)."""
    if setup.gpus_here or not uses_transformer_engine(setup.args) or importable("transformer_engine"):
        return None
    return ("transformer_engine is not importable on this node, where no rank runs: the job's nodes need it "
            "(advisor-launch sbatch's script checks it there before Megatron starts)")


def deep_ep_backend(args) -> str | None:
    """The flex dispatcher's backend where it needs ``deep_ep`` (DeepEP's and HybridEP's: megatron-core
    ``moe/fused_a2a.py`` imports ``deep_ep.Buffer``, and ``HybridEPBuffer`` from DeepEP's hybrid-ep
    branch, and without it fails when the first MoE layer is built); None otherwise (NCCL-EP is
    Transformer Engine's)."""
    backend = _flex_backend(flag_values(args))
    return None if backend == "ncclep" else backend


def deep_ep_import_problem(backend: str, where: str = "") -> str:
    build = "a DeepEP build with HybridEPBuffer (its hybrid-ep branch)" if backend == "hybridep" else "DeepEP"
    return (f"cannot import deep_ep{where}, which the flex dispatcher's {backend} backend needs: install {build}, "
            "or launch a row of another --moe-token-dispatcher-type")


def rank_import_problems(args, where: str = "", importable: Callable[[str], bool] = importable_module) -> list[str]:
    """A line for each module ``args`` need that cannot be imported (``where``: the node, for the
    ranks' own check): Transformer Engine (``uses_transformer_engine``), DeepEP (``deep_ep_backend``)."""
    problems = []
    if uses_transformer_engine(args) and not importable("transformer_engine"):
        problems.append(transformer_engine_import_problem(args, where))
    if (backend := deep_ep_backend(args)) is not None and not importable("deep_ep"):
        problems.append(deep_ep_import_problem(backend, where))
    return problems


def flex_dispatcher_problem(setup: Setup, importable: Callable[[str], bool] = importable_module) -> str | None:
    """The line for a missing ``deep_ep`` (``deep_ep_backend``) where the ranks run here."""
    if not setup.gpus_here or (backend := deep_ep_backend(setup.args)) is None or importable("deep_ep"):
        return None
    return deep_ep_import_problem(backend)


ATTENTION_ENVIRONMENT = {  # --attention-backend: NVTE_FLASH_ATTN, NVTE_FUSED_ATTN, NVTE_UNFUSED_ATTN
    "local": (0, 0, 0), "flash": (1, 0, 0), "fused": (0, 1, 0), "unfused": (0, 0, 1), "auto": (1, 1, 1)}
"""What megatron-core's ``LanguageModule._set_attention_backend`` (``language_module.py``, both
releases) asserts each Transformer Engine variable is, where set, when it builds the model."""


def attention_environment_problems(setup: Setup, environ: Mapping[str, str] | None = None) -> list[str]:
    """A line for each ``NVTE_*_ATTN`` variable of this environment that contradicts the launch's
    --attention-backend (Megatron's default auto), where the ranks run here: megatron-core asserts
    it when it builds the model, a minute into the run, on every rank."""
    environ = os.environ if environ is None else environ
    backend = (flag_values(setup.args).get("--attention-backend") or ("auto",))[-1]
    expected = ATTENTION_ENVIRONMENT.get(backend)
    if not setup.gpus_here or expected is None:
        return []
    names = ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN")
    return [f"{name}={environ[name]} in the environment contradicts --attention-backend {backend}, which sets it to "
            f"{value} (megatron-core asserts it when it builds the model): unset {', '.join(names)}"
            for name, value in zip(names, expected) if name in environ and environ[name] != str(value)]


def data_problems(setup: Setup) -> list[str]:
    """Dataset prefixes without their .bin/.idx, tokenizer and data-argument files that do not exist."""
    values, problems = flag_values(setup.args), []
    for flag in DATA_PREFIX_FLAGS:
        for prefix in values.get(flag, ()):
            if _is_number(prefix):  # a blend: weight prefix weight prefix ...
                continue
            missing = [suffix for suffix in (".bin", ".idx") if not Path(prefix + suffix).is_file()]
            if missing:
                problems.append(f"{flag} {prefix}: no {' or '.join(prefix + s for s in missing)} (Megatron reads a "
                                "dataset prefix's .bin and .idx, as tools/preprocess_data.py writes them)")
    for flag in DATA_FILE_FLAGS:
        for path in values.get(flag, ()):
            if not Path(path).exists():
                problems.append(f"{flag} {path}: no such file")
    model = values.get("--tokenizer-model")
    if model and not Path(model[0]).exists() and not _hub_name(values, model[0]):
        problems.append(f"--tokenizer-model {model[0]}: no such file or directory")
    return problems


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _hub_name(values: dict, name: str) -> bool:
    """A Hugging Face tokenizer may be a hub name (org/model), which only the run can resolve."""
    return values.get("--tokenizer-type") == ("HuggingFaceTokenizer",) and not name.startswith(("/", ".", "~"))


def directory_problem(flag: str, path: Path) -> str | None:
    """Why a run could not create and write files in the directory ``path``, or None."""
    if problem := not_a_directory(path, f"{flag} {path}"):  # by its kind: a FIFO or /dev/null was 'a file'
        return problem
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"{flag} {path}: {existing} is a file, so the directory cannot be created"
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        return f"{flag} {path}: {existing} is not writable ({exc.strerror or exc})"
    return None


def directory_problems(setup: Setup) -> list[str]:
    values = flag_values(setup.args)
    targets = [(flag, Path(value[0])) for flag in WRITTEN_DIRECTORIES if (value := values.get(flag))]
    if setup.profile_dir is not None:
        targets.append(("--profile-dir", Path(setup.profile_dir)))
    return [problem for flag, path in targets if (problem := directory_problem(flag, path.absolute()))]


# --- all of them ---------------------------------------------------------------------------


def preflight(setup: Setup, *, gpus_found: int | None | Callable[[], int | None] = count_gpus) -> Report:
    """Every check; the report holds every problem found (one line each) and the notes."""
    report = Report()
    found = gpus_found() if callable(gpus_found) else gpus_found
    report.problems += python_problems(setup)
    report.problems += import_problems(setup)
    report.problems += gpu_problems(setup, report, found if setup.gpus_here else None)
    report.problems += transformer_engine_problems(setup)
    if (problem := flex_dispatcher_problem(setup)) is not None:
        report.problems.append(problem)
    report.problems += attention_environment_problems(setup)
    if (note := transformer_engine_note(setup)) is not None:
        report.notes.append(note)
    report.problems += data_problems(setup)
    report.problems += directory_problems(setup)
    return report

