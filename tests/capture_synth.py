"""Synthetic profile runs for the CAPTURE tests: real rank files (``RankProfile.write``) whose
numbers come from a ground truth stated here, independent of the code under test.

Ground truth, per GPU of a stage with per-replica micro-batch b, TP t, DP d, n microbatches in
flight (the header's ``in_flight_microbatches``, min(p - i, m) as a 1F1B schedule holds):

    module s: parameters P_s/t, gradients P_s/t, optimizer 3 P_s/(t d) (distributed optimizer),
              activation A_s b/t kept per microbatch, forward rise (A_s + F_s) b/t above the
              level at its entry (what it keeps included, as the hooks measure it), backward
              rise B_s b/t above the level at the start of its backward pass
    PM = the highest level while the stage runs 1F1B with n in flight, simulated event by event
         (``Truth.peak``: static memory held throughout; a forward pass adds each module's
         activations in order, a backward pass frees them in reverse) + C0 + C1 b n

With ``additive=True`` the rises are 0 and every run has one microbatch, so PM is a sum over
layers: CAPTURE's additive model is then exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from advisor.models import LlamaSpec
from advisor.parallel import ParallelConfig
from advisor.profiles import IterationRecord, LayerRecord, RankHeader, RankProfile

TINY = LlamaSpec(name="tiny", num_layers=8, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
                 num_query_groups=4, vocab_size=1000)


@dataclass
class Truth:
    spec: LlamaSpec = TINY
    params: dict = field(default_factory=dict)
    """Module key ('embedding', layer number, 'output') -> P_s."""
    activation: dict = field(default_factory=dict)
    forward: dict = field(default_factory=dict)
    """F_s: the forward pass's rise above what the module keeps."""
    backward: dict = field(default_factory=dict)
    """B_s: the backward pass's rise."""
    constant: int = 1000
    per_microbatch: int = 96
    additive: bool = False
    seconds: dict | None = None
    """Module key -> (forward, backward) seconds per microbatch, written as profile schema v2's
    per-layer times (None: untimed, as version 1 files)."""

    def __post_init__(self) -> None:
        layers = self.spec.num_layers
        for layer in range(1, layers + 1):
            # Not identical, so ranges matter; multiples of 64 and 16 keep every term a whole
            # number of bytes up to TP 8 x DP 8.
            self.params.setdefault(layer, 4096 + 64 * layer)
            self.activation.setdefault(layer, 512 + 16 * (layer % 3))
            self.forward.setdefault(layer, 0 if self.additive else 256 + 16 * layer)
            self.backward.setdefault(layer, 0 if self.additive else 128 + 512 * (layer % 2))
        self.params.setdefault("embedding", 64000)
        self.params.setdefault("output", 64000)
        self.activation.setdefault("embedding", 128)
        self.activation.setdefault("output", 4096)
        # The embedding's backward builds a dense gradient of its weight; the output's forward
        # materialises the logits.
        self.forward.setdefault("embedding", 0 if self.additive else 64)
        self.backward.setdefault("embedding", 0 if self.additive else 2048)
        self.forward.setdefault("output", 0 if self.additive else 8192)
        self.backward.setdefault("output", 0 if self.additive else 1024)

    def modules(self, first: int, last: int) -> list:
        keys = list(range(first, last + 1))
        if first == 1:
            keys.insert(0, "embedding")
        if last == self.spec.num_layers:
            keys.append("output")
        return keys

    def terms(self, key, b: float, t: int, d: int) -> dict:
        p = self.params[key] // t
        return dict(parameter_bytes=p, gradient_bytes=p, optimizer_bytes=3 * p // d,
                    activation_bytes=self.activation[key] * b // t,
                    forward_peak_bytes=(self.activation[key] + self.forward[key]) * b // t,
                    backward_peak_bytes=self.backward[key] * b // t)

    def peak(self, first: int, last: int, b: int, t: int, d: int, n: int) -> int:
        """The stage's highest level over a 1F1B order that holds n microbatches: n - 1 warm-up
        forwards, two forward-backward pairs, n - 1 cool-down backwards."""
        terms = [self.terms(key, b, t, d) for key in self.modules(first, last)]
        level = sum(x["parameter_bytes"] + x["gradient_bytes"] + x["optimizer_bytes"] for x in terms)
        highest = level
        order = ["F"] * (n - 1) + ["F", "B"] * 2 + ["B"] * (n - 1)
        for kind in order:
            for x in (terms if kind == "F" else reversed(terms)):
                rise = x["forward_peak_bytes"] if kind == "F" else x["backward_peak_bytes"]
                highest = max(highest, level + rise)
                level += x["activation_bytes"] if kind == "F" else -x["activation_bytes"]
        return highest + self.constant + self.per_microbatch * b * n


def write_run(root: Path, truth: Truth, layers_per_stage, *, mbs: int, tp: int = 1, dp: int = 1,
              num_microbatches: int | None = None, name: str | None = None, status: str = "ok",
              peak_override: dict | None = None, **header_fields) -> Path:
    """One run directory with every rank's file; returns the directory. ``header_fields`` replace
    the headers' (by default a CPU emulator's: ``emulated`` true, the local spec)."""
    layers_per_stage = tuple(layers_per_stage)
    pp = len(layers_per_stage)
    m = 1 if truth.additive else (num_microbatches or pp)
    name = name or f"tp{tp}dp{dp}-b{mbs}-" + ".".join(map(str, layers_per_stage))
    directory = root / name
    directory.mkdir(parents=True)
    first = 1
    for stage, count in enumerate(layers_per_stage):
        last = first + count - 1
        n = min(pp - stage, m)
        for dp_rank in range(dp):
            for tp_rank in range(tp):
                rank = tp_rank + tp * (dp_rank + dp * stage)
                header = RankHeader(
                    run_id=name, created="2026-01-01T00:00:00+00:00", backend="cpu", device="cpu", kernels="cpu",
                    torch_version="2.13.0", megatron_core_version="0.16.1", emulated=True, params_dtype="float32",
                    layer_spec="local", sequence_parallel=tp > 1, recompute="none", distributed_optimizer=True,
                    model=truth.spec, parallel=ParallelConfig(tp=tp, pp=pp, dp=dp, mbs=mbs), seq_len=32,
                    global_batch_size=mbs * dp * m, num_microbatches=m, layers_per_stage=layers_per_stage,
                    rank=rank, world_size=tp * dp * pp, coords={"tp": tp_rank, "cp": 0, "pp": stage, "dp": dp_rank},
                    stage_layers=tuple(range(first, last + 1)), first_stage=stage == 0, last_stage=stage == pp - 1,
                    in_flight_microbatches=n,
                )
                header = replace(header, **header_fields)
                layers = tuple(
                    LayerRecord(iteration=1, name=_name(key), kind=_kind(key),
                                layer_number=key if isinstance(key, int) else None, **truth.terms(key, mbs, tp, dp),
                                **_times(truth, key))
                    for key in truth.modules(first, last)
                )
                peak = truth.peak(first, last, mbs, tp, dp, n)
                if peak_override and (stage, rank) in peak_override:
                    peak = peak_override[(stage, rank)]
                static = sum(layer.static_bytes for layer in layers)
                iterations = (IterationRecord(iteration=1, parameter_bytes=static // 5, gradient_bytes=static // 5,
                                              optimizer_bytes=3 * static // 5, peak_allocated_bytes=peak),)
                RankProfile(header=header, layers=layers if status == "ok" else (),
                            iterations=iterations if status == "ok" else (), status=status).write(directory)
        first = last + 1
    return directory


def _times(truth: Truth, key) -> dict:
    if truth.seconds is None:
        return {}
    forward, backward = truth.seconds[key]
    return {"forward_time_s": forward, "backward_time_s": backward}


def _name(key) -> str:
    return f"decoder.layers.{key - 1}" if isinstance(key, int) else key


def _kind(key) -> str:
    return "decoder" if isinstance(key, int) else key


def write_scenario(root: Path, truth: Truth, partitionings, pipeline_batches, *, tp: int = 1, dp: int = 1,
                   **header_fields) -> None:
    """Every partitioning at every pipeline microbatch (a DP-d run's replicas take 1/d of it each)."""
    for batch in pipeline_batches:
        for layers_per_stage in partitionings:
            write_run(root, truth, layers_per_stage, mbs=batch // dp, tp=tp, dp=dp, **header_fields)


def write_campaign(root: Path, **header_fields) -> Path:
    """A full campaign of the 8-layer model into ``root``: pipeline-only on 4 stages, DP 2 and TP 2
    on 3 (what recommend's megatron and hybrid modes read); ``header_fields`` as ``write_run``'s."""
    from advisor.capture.partitionings import description1

    truth = Truth(spec=TINY)
    write_scenario(root, truth, description1(8, 4), (2, 4), **header_fields)
    write_scenario(root, truth, description1(8, 3), (2, 4), tp=2, **header_fields)
    write_scenario(root, truth, description1(8, 3), (2, 4), dp=2, **header_fields)
    return root
