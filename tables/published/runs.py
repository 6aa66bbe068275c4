"""Published Megatron-core runs (``dense_runs.csv``) priced by the advisor exactly as a user's own
launch would be: each run's flags are written as a torchrun line and read back through
``advisor estimate --from-command``'s path (``advisor.shell_command`` -> ``advisor.megatron_readback``
-> ``advisor.pricing.price_layout``), with the GPU preset's calibrated memory model.

Every run is marked ``test``: none was used to fit any constant. The schema is strict: a missing
or unknown column, or a ``use`` other than test/fit, is an error naming it.

The same recipe was published twice (DGX Cloud Benchmarking v25.01 on NeMo 24.09, v25.02 on NeMo
24.12: the same configuration files, layouts and batch sizes, another container), so each layout
has two published step times; ``release_changes`` sets them side by side, which shows how far a
published figure moves without any change the advisor could price.

A second, independent source (``bridge_dense_runs.csv``, the same loader with two more columns):
the DGX-H100 Llama rows of Megatron-Bridge's performance summaries (NeMo 25.09 to 26.06), each
priced with what its recipe set at the release's tag. ``megatron_version`` is the
``--megatron-version`` the line is read with (empty: the newest the advisor knows); ``note`` says
what the recipe set that the advisor does not price, and where the source conflicts with itself.
``SOURCES`` names both files; ``report`` of each is kept apart, and ``python -m tables.published``
prints each source's summary and their total.
"""

from __future__ import annotations

import shlex
import statistics
from dataclasses import dataclass
from pathlib import Path

from advisor.errors import AdvisorError
from tables.published.csv_rows import typed_rows

DATA = Path(__file__).with_name("dense_runs.csv")
ROOT = Path(__file__).resolve().parents[2]
"""The repository: a row's --tp-comm-overlap-cfg file is written relative to it."""
COLUMNS = ("run", "framework", "model", "num_layers", "vocab_size", "gpu", "gpus", "precision", "seq_len",
           "global_batch_size", "micro_batch_size", "tp", "pp", "cp", "vpp", "step_time_s", "training_flags", "use",
           "source")
INTEGERS = ("num_layers", "vocab_size", "gpus", "seq_len", "global_batch_size", "micro_batch_size", "tp", "pp", "cp",
            "vpp")
TARGETS = {"bf16": 0.10, "fp8": 0.15}
"""Issue 21's targets: each BF16 run's step time within 10%, each FP8 run's within 15%."""
MAPE_TARGET = 0.06
"""And the BF16 runs' mean absolute percentage error at most 6%."""
CONFIGURATION = tuple(c for c in COLUMNS if c not in ("run", "framework", "step_time_s", "use", "source"))
"""The columns that say what ran: two rows equal on these are one configuration, published twice."""
BRIDGE_DATA = Path(__file__).with_name("bridge_dense_runs.csv")
BRIDGE_COLUMNS = (*COLUMNS, "megatron_version", "note")
"""``bridge_dense_runs.csv``'s columns: ``dense_runs.csv``'s, then the release the line is read
with and the row's note."""
SOURCES = {"DGX Cloud Benchmarking": (DATA, COLUMNS), "Megatron-Bridge": (BRIDGE_DATA, BRIDGE_COLUMNS)}
"""Each source of published dense runs: its file and that file's exact columns."""
RUNNABLE = ("fits", "likely fits")
"""The calibrated verdicts that call a run runnable: every published run ran."""
NOT_RUNNABLE = {
    run: "likely oom by 0.01 GiB: 80.01 GiB of 80 by the calibrated model on stage 0. Eq. 18 gives 77.12 GiB there "
         "(22.37 of weights, gradients and optimizer states; 54.75 of activations: 10 layers with 9.4 microbatches in "
         "flight at TP 4, CP 1), of which the calibration keeps 0.95 x 82.7% of the layers' 52.9 GiB (41.55) and "
         "adds the runtime's 2.5 GiB, the recipe's userbuffers (1.19) and the allocator reserve fitted on the 4D "
         "paper's runs, 15.5% of memory (12.4 GiB): with a reserve under 12.38 GiB it would be called likely fits. "
         "The data loader's mask is not counted (it never reaches the GPU in Megatron-Bridge). NVIDIA published no "
         "memory for these runs"
    for run in ("mb-25.09-70b-fp8-64", "mb-25.11-70b-fp8-64", "mb-26.02-70b-fp8-64", "mb-26.02.01-70b-fp8-64",
                "mb-26.04-70b-fp8-64", "mb-26.04.01-70b-fp8-64")}
"""Runs that ran but that the calibrated verdict does not call runnable, each with its stated
likely cause (docs/validation.md shows them); no constant was changed for them."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PublishedLayout:
    """What every published run states and ``torchrun_line`` launches: its GPUs, sequence,
    batch, layout and training flags, and where it was published."""
    run: str
    gpu: str
    gpus: int
    precision: str
    seq_len: int
    global_batch_size: int
    micro_batch_size: int
    tp: int
    pp: int
    cp: int
    vpp: int
    training_flags: str
    source: str


@dataclass(frozen=True, kw_only=True, slots=True)
class PublishedRun(PublishedLayout):
    """A row of dense_runs.csv or bridge_dense_runs.csv: a preset model (with its layers and
    vocabulary as run), the published step time and, in the latter, the release the line is read
    with and a note."""
    framework: str
    model: str
    num_layers: int
    vocab_size: int
    step_time_s: float
    use: str
    megatron_version: str = ""
    note: str = ""


def load(path: Path = DATA, columns: tuple[str, ...] = COLUMNS) -> list[PublishedRun]:
    """The runs of ``path``, whose header is ``columns`` exactly, every column present and typed."""
    runs = []
    for line, values in typed_rows(path, columns, INTEGERS, ("step_time_s",)):
        if values["use"] not in ("test", "fit") or values["precision"] not in TARGETS:
            raise AdvisorError(f"{path}:{line}: use must be test or fit and precision bf16 or fp8")
        runs.append(PublishedRun(**values))
    return runs


def load_source(name: str) -> list[PublishedRun]:
    """The runs of one of ``SOURCES``."""
    return load(*SOURCES[name])


def command_line(run: PublishedRun) -> str:
    """The run as a torchrun line: the model's flags (``advisor.megatron_args.model_args``), the
    layout, the published training options, and the vocabulary of its tokenizer."""
    from advisor.megatron_args import model_args
    from advisor.models import preset, with_overrides

    spec = with_overrides(preset(run.model), num_layers=run.num_layers, vocab_size=run.vocab_size)
    return torchrun_line([*model_args(spec, run.seq_len)], run, run.num_layers, ["--vocab-size", str(run.vocab_size)])


def torchrun_line(model: list[str], run: PublishedLayout, num_layers: int, extra: list[str] = ()) -> str:
    """The torchrun line a user would paste for a published ``run`` (its layout, batch, training
    flags and GPUs, 8 per node): ``model``'s flags, then the layout's, then ``extra``."""
    args = [*model, "--tensor-model-parallel-size", str(run.tp), "--context-parallel-size", str(run.cp),
            "--pipeline-model-parallel-size", str(run.pp)]
    if run.vpp > 1 and num_layers % (run.pp * run.vpp):
        # an uneven split (--account-for-*-in-pipeline-split: 126 layers over PP 8 x VP 8): chunks per rank,
        # as megatron-core's get_num_layers_to_build takes them; layers per chunk would not divide
        args += ["--num-virtual-stages-per-pipeline-rank", str(run.vpp)]
    elif run.vpp > 1:
        args += ["--num-layers-per-virtual-pipeline-stage", str(num_layers // (run.pp * run.vpp))]
    args += ["--micro-batch-size", str(run.micro_batch_size), "--global-batch-size", str(run.global_batch_size),
             *_rooted(shlex.split(run.training_flags)), *extra]
    nodes, per_node = (run.gpus // 8, 8) if run.gpus % 8 == 0 else (1, run.gpus)
    return shlex.join(["torchrun", "--nproc-per-node", str(per_node), "--nnodes", str(nodes), "pretrain_gpt.py", *args])


def _rooted(flags: list[str]) -> list[str]:
    """``flags`` with --tp-comm-overlap-cfg's file (a recipe's userbuffers settings,
    tables/published/userbuffers/, written relative to the repository) made absolute, so the line
    prices from any working directory, as Megatron-LM opens the file from its own."""
    out = list(flags)
    for at, flag in enumerate(out[:-1]):
        if flag == "--tp-comm-overlap-cfg" and not Path(out[at + 1]).is_absolute():
            out[at + 1] = str(ROOT / out[at + 1])
    return out


def price(run: PublishedRun) -> dict:
    """The estimate of the run's command line, as ``advisor estimate --from-command`` makes it
    (with ``--megatron-version`` the row's, where it names one)."""
    return price_line(command_line(run), run.run, run.gpu, release=run.megatron_version or None)


def price_line(line: str, name: str, gpu_name: str, time_constants=None, release: str | None = None) -> dict:
    """The estimate of a torchrun line on ``gpu_name``, as ``advisor estimate --from-command``
    makes it, with the calibrated memory model; ``time_constants``: the time model's constants
    (None: the shipped ones); ``release``: ``--megatron-version``'s (None: the newest the advisor
    knows). ``unpriced``: the flags the advisor reads but does not price."""
    from advisor.pricing import price_layout
    from advisor.hardware import get_gpu
    from advisor.megatron_readback import read_run
    from advisor.paper_rule import DEFAULT_THRESHOLD
    from advisor.parallel import ParallelConfig, Workload
    from advisor.shell_command import read_command

    launch = read_command(line)
    read = read_run(launch.arguments, name=name, release=release)
    layout, gpu = read.layout, get_gpu(gpu_name)
    dp = launch.world_size // (layout.tp * layout.cp * layout.pp)
    parallel = ParallelConfig(tp=layout.tp, cp=layout.cp, pp=layout.pp, dp=dp, mbs=layout.mbs, vpp=layout.vpp)
    workload = Workload(seq_len=read.seq_len, global_batch_size=layout.global_batch_size)
    row, *_ = price_layout(read.spec, workload, parallel, layout.layers_per_stage if layout.pp > 1 else None,
                           read.options, gpu=gpu, mem=gpu.memory_gib, threshold=DEFAULT_THRESHOLD,
                           memory_model="calibrated", time_constants=time_constants, release=release)
    return {**row, "unpriced": list(read.unpriced)}


def report(runs: list[PublishedRun]) -> tuple[list[dict], dict]:
    """(one row per run: published and predicted step time, error, verdict; the summary per precision,
    over every run, and per framework release under ``by_framework``). A run the advisor refuses
    keeps its row: no prediction, its one-line refusal under ``refused``."""
    rows = [_row(run) for run in runs]
    summary = _summary(rows)
    frameworks = list(dict.fromkeys(row["framework"] for row in rows))
    if len(frameworks) > 1:
        summary["by_framework"] = {name: _summary([r for r in rows if r["framework"] == name]) for name in frameworks}
    return rows, summary


def _row(run: PublishedRun) -> dict:
    """The report's row of one run, or of its refusal."""
    row = {"run": run.run, "framework": run.framework, "precision": run.precision, "gpus": run.gpus, "use": run.use,
           "layout": f"TP {run.tp} PP {run.pp} CP {run.cp} VP {run.vpp} GBS {run.global_batch_size}",
           "published_s": run.step_time_s}
    try:
        estimate = price(run)
    except AdvisorError as exc:  # recorded, not dropped: a row the advisor cannot price is a finding
        return {**row, "predicted_s": None, "error": None, "within_target": False, "verdict": None,
                "usage_gib": None, "unpriced": [], "refused": str(exc)}
    error = estimate["step_time_s"] / run.step_time_s - 1
    return {**row, "predicted_s": estimate["step_time_s"], "error": error,
            "within_target": abs(error) <= TARGETS[run.precision], "verdict": estimate["verdict"],
            "usage_gib": estimate["usage_gib"], "unpriced": estimate["unpriced"], "refused": None}


def _summary(rows: list[dict]) -> dict:
    summary = {}
    for precision in TARGETS:
        mine = [r for r in rows if r["precision"] == precision]
        errors = [abs(r["error"]) for r in mine if r["refused"] is None]
        if errors:
            largest = max((r for r in mine if r["refused"] is None), key=lambda r: abs(r["error"]))
            summary[precision] = {"runs": len(mine), "mape": statistics.fmean(errors), "max_error": max(errors),
                                  "max_error_run": largest["run"],
                                  "within_target": sum(e <= TARGETS[precision] for e in errors),
                                  "verdicts_ok": sum(r["verdict"] in RUNNABLE for r in mine),
                                  "refused": len(mine) - len(errors)}
    return summary


def combined_summary(rows: list[dict]) -> dict:
    """The summary per precision over the rows of every source together."""
    return _summary(rows)


def release_changes(runs: list[PublishedRun]) -> list[dict]:
    """For each configuration published by more than one framework release (the same model,
    layers, GPUs, layout, batch and options): the first release's run, each later one's, and how
    much the published step time changed, in the order of ``runs``."""
    first: dict[tuple, PublishedRun] = {}
    changes = []
    for run in runs:
        key = tuple(getattr(run, column) for column in CONFIGURATION)
        if key not in first:
            first[key] = run
        elif run.framework != first[key].framework:
            before = first[key]
            changes.append({"before": before.run, "after": run.run, "precision": run.precision,
                            "change": run.step_time_s / before.step_time_s - 1})
    return changes
