"""Measured activation terms from profiles, for the estimator: ``--memory-model profile``.

Seed 004 prices what a layer, the embedding and the LM head keep for the backward pass with
Eq. 12-14; a profile measures it (``megatron_hooks``: on GPUs, on the CPU, or symbolically at the
real model size). ``measured_activations(DIR)`` reads every run under DIR and returns, for each
of the three terms, the ratio measured / estimated that ``advisor profile show`` prints
(``profile_report.compare_rank``: the estimator's own term for that run's model, layout,
sequence, micro-batch, dtype and attention), the median over the profiled ranks and layers. The
calibrated memory model (``advisor.verdicts``) then uses Eq. 12-14 times these ratios instead of
its Eq. 12-14 corrections, on any layout: a ratio is a property of the layer's code (what its
kernels save) more than of the layout, because Eq. 12-14 already carry the layout (t, c, SP, s, b).

Where that does not hold, it refuses or says so: profiles taken with another model, another
layer spec than the sweep's attention (the local spec keeps the s x s scores: sweep with
``--no-flash-attn``), or without sequence parallelism when the sweep has it (or the reverse).
A layout whose (TP, CP) was profiled uses the ratios measured there; others use the ratios of
all profiled layouts together (``for_layout`` says which).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path

from advisor.errors import AdvisorError
from advisor.models import LlamaSpec
from advisor.profiles import ProfileError, ProfileRun, directory_problem, load_run

TERMS = {"decoder": "Eq. 12/15", "embedding": "Eq. 13", "output": "Eq. 14"}
"""Each measured module kind and the seed-004 equation of its activations."""
SHAPE_FIELDS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                "vocab_size", "tie_embeddings", "head_dim", "add_qkv_bias")
"""What a model's memory depends on (not its name, RoPE base or norm epsilon)."""


def same_shape(a: LlamaSpec, b: LlamaSpec) -> bool:
    return all(getattr(a, name) == getattr(b, name) for name in SHAPE_FIELDS)


@dataclass(frozen=True, kw_only=True, slots=True)
class ActivationRatios:
    """Measured / Eq. 12-14, per module kind (None where no profile holds that module)."""

    decoder: float | None
    embedding: float | None
    output: float | None
    samples: int
    """Module records behind the ratios."""

    def to_dict(self) -> dict:
        return {"decoder": self.decoder, "embedding": self.embedding, "output": self.output, "samples": self.samples}


@dataclass(frozen=True, kw_only=True, slots=True)
class MeasuredActivations:
    """The ratios of a profile directory, overall and per profiled (TP, CP)."""

    model: LlamaSpec
    source: str
    layer_spec: str
    sequence_parallel: bool | None
    """Whether the TP > 1 profiles had sequence parallelism (None: every profile had TP 1)."""
    params_dtype: str
    backends: tuple[str, ...]
    overall: ActivationRatios
    by_layout: dict[tuple[int, int], ActivationRatios] = field(default_factory=dict)

    def for_layout(self, tp: int, cp: int) -> ActivationRatios:
        """The ratios measured at (tp, cp), or the overall ones; a term a layout's profiles lack
        is taken from the overall ratios."""
        ratios = self.by_layout.get((tp, cp))
        if ratios is None:
            return self.overall
        return replace(ratios, **{kind: getattr(self.overall, kind) for kind in TERMS
                                  if getattr(ratios, kind) is None})

    def check_sweep(self, spec: LlamaSpec, flash_attention: bool, sequence_parallel: bool) -> None:
        """AdvisorError unless these profiles can price a sweep of ``spec`` with these options."""
        if not same_shape(spec, self.model):
            raise AdvisorError(f"--profile {self.source} profiles {self.model.name}, another model than the sweep's "
                               f"{spec.name}: profile the model you sweep")
        if flash_attention != (self.layer_spec == "transformer_engine"):
            raise AdvisorError(
                f"--profile {self.source} measured the {self.layer_spec} layer spec, whose attention "
                + ("keeps the s x s scores: sweep with --no-flash-attn" if self.layer_spec == "local"
                   else "is flash attention: sweep without --no-flash-attn"))
        if self.sequence_parallel is not None and sequence_parallel != self.sequence_parallel:
            raise AdvisorError(f"--profile {self.source} was taken {'with' if self.sequence_parallel else 'without'} "
                               f"sequence parallelism and the sweep has {'it' if sequence_parallel else 'none'}: "
                               f"profile the way you train")

    def to_dict(self) -> dict:
        return {
            "source": self.source, "model": self.model.name, "layer_spec": self.layer_spec,
            "sequence_parallel": self.sequence_parallel, "params_dtype": self.params_dtype,
            "backends": list(self.backends), "overall": self.overall.to_dict(),
            "by_layout": [{"tp": tp, "cp": cp, **r.to_dict()} for (tp, cp), r in sorted(self.by_layout.items())],
        }


def _runs(directory: Path) -> list[ProfileRun]:
    """The run under ``directory``, or the runs in its subdirectories (a campaign's --out)."""
    if problem := directory_problem(directory):
        raise AdvisorError(f"--profile {directory}: {problem}")
    if any(directory.glob("rank*.jsonl")):
        return [load_run(directory)]
    runs = []
    for child in sorted(p for p in directory.iterdir() if p.is_dir() and any(p.glob("rank*.jsonl"))):
        try:
            run = load_run(child)
        except ProfileError:
            continue  # a partial or damaged run (a campaign interrupted): not a measurement
        if run.status == "ok":
            runs.append(run)
    if not runs:
        raise AdvisorError(f"--profile {directory}: no completed profile run (rank*.jsonl) in it or its subdirectories")
    return runs


def _ratios(rows: dict[str, list[float]], samples: int) -> ActivationRatios:
    return ActivationRatios(**{kind: statistics.median(rows[kind]) if rows[kind] else None for kind in TERMS},
                            samples=samples)


def measured_activations(directory: str | Path) -> MeasuredActivations:
    """Measured / Eq. 12-14 activation ratios of every profiled rank under ``directory``."""
    from advisor.profile_report import compare_rank

    directory = Path(directory)
    runs = _runs(directory)
    first = runs[0].header
    overall: dict[str, list[float]] = {kind: [] for kind in TERMS}
    sequence_parallel = None
    by_layout: dict[tuple[int, int], dict[str, list[float]]] = {}
    for run in runs:
        for rank in run.ranks:
            h = rank.header
            if not same_shape(h.model, first.model):
                raise AdvisorError(f"--profile {directory}: {run.directory} profiles another model than "
                                   f"{runs[0].directory}")
            for name in ("layer_spec", "params_dtype"):
                if getattr(h, name) != getattr(first, name):
                    raise AdvisorError(f"--profile {directory}: runs differ in {name.replace('_', ' ')} "
                                       f"({getattr(first, name)} and {getattr(h, name)})")
            if h.parallel.tp > 1:
                if sequence_parallel not in (None, h.sequence_parallel):
                    raise AdvisorError(f"--profile {directory}: runs differ in sequence parallelism")
                sequence_parallel = h.sequence_parallel
            names = {record.name: record.kind for record in rank.layers}
            layout = by_layout.setdefault((h.parallel.tp, h.parallel.cp), {kind: [] for kind in TERMS})
            for row in compare_rank(rank):
                kind = names.get(row.module)
                if row.term == "activations" and kind in TERMS and row.ratio is not None:
                    overall[kind].append(row.ratio)
                    layout[kind].append(row.ratio)
    samples = sum(len(values) for values in overall.values())
    if not overall["decoder"]:
        raise AdvisorError(f"--profile {directory}: no decoder layer was profiled")
    return MeasuredActivations(
        model=first.model, source=str(directory), layer_spec=first.layer_spec,
        sequence_parallel=sequence_parallel, params_dtype=first.params_dtype,
        backends=tuple(sorted({rank.header.backend for run in runs for rank in run.ranks})),
        overall=_ratios(overall, samples),
        by_layout={key: _ratios(values, sum(map(len, values.values()))) for key, values in by_layout.items()},
    )
