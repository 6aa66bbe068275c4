"""Real megatron-core MoE layers on one GPU against their symbolic profiles and advisor.moe's terms.

Unattended, one GPU, well under 150 s; each part is guarded, so that one failure keeps the rest.
Each part measures one MoE layer (``megatron_hooks.moe_layer.measure_moe_layer``: what autograd
keeps per part, attention, router, dispatch, experts, shared experts) of one real-size preset at
sequence 4096, MBS 1, BF16, EP 1, and writes ``OUT/<model>-<dispatcher>-<backend>/moe_layer.json``
(``advisor profile show`` reads it):

- ``qwen3-30b-a3b`` (128 experts on the one GPU, 1.2 GB of expert weights) with the allgather and
  the alltoall dispatchers, and ``mixtral-8x7b`` (8 experts, 2.8 GB) with both;
- backend ``cuda``: real tensors on the GPU, this process one NCCL rank, the local layer spec (no
  Transformer Engine on the machine), torch's CUDA kernels, megatron-core's real router on the
  layer's random weights and input (at EP 1 every routed copy stays on this rank, so the split
  among the experts changes no kept byte), torch.compile off (eager, as the other backends); with
  the caching allocator's readings: allocated and reserved before the forward pass, the peaks
  over forward and backward, allocation retries;
- backend ``symbolic`` three ways: the Transformer Engine spec's stand-ins with the CUDA kernels'
  (what the advisor prices), and the local spec with the CUDA kernels' stand-ins (the twin of the
  cuda backend) and with torch's CPU paths; balanced routing (``moe_fake.fake_routing``).

The real runs come first (they need the GPU), then the symbolic ones (which a CPU can redo).
``OUT/summary.json`` holds each part's result or traceback and, per model and dispatcher: each
part's activation bytes per backend, ``advisor.moe.layer_profile.compare``'s rows for the real
profile, and the allocator's numbers with peak reserved over peak allocated.

DeepSeek-V3 is not measured: its multi-latent attention builds with the Transformer Engine spec
only (``model.build_gpt_model``: megatron-core's local ``DotProductAttention`` takes no
k_channels), whose stand-ins compute nothing, so no real-tensor layer of it can run here; and one
layer at EP 1 would hold 256 x 3 x 7168 x 2048 x 2 B = 22.5 GB of expert weights, 22.5 GB of
their gradients and, unfused, 128 heads x 4096^2 x 6 B = 12.9 GB of attention scores, near an
H100's 80 GB before the experts' activations. Its symbolic layer is checked in the tests.

Run on the GPU machine, from the repository root, with a copy of Megatron-LM core_v0.15.2 first
on the path (Python 3.12, torch 2.11, no Transformer Engine or Apex)::

    PYTHONPATH=.gpu_carry/core_v0.15.2:. python3 benchmarks/gpu/measure_moe_layers.py OUT

On a CPU, ``--device cpu --tiny`` runs every part on shrunken presets (sequence 32), the cpu
backend in place of cuda, in about half a minute (what the tests do, to catch errors).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import sys
import time
import traceback
from pathlib import Path

STARTED = time.perf_counter()  # the deadline counts from here: torch's and megatron's imports took ~30 s on an H200
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import script_cli  # noqa: E402  (this folder's shared command line)

DEADLINE_S = 140.0
"""Seconds from the start after which parts not started are skipped (the run must end well under
150 s; each part took under 2 s on an H200)."""
MEASURED = (("qwen3-30b-a3b", "allgather"), ("qwen3-30b-a3b", "alltoall"), ("mixtral-8x7b", "allgather"),
            ("mixtral-8x7b", "alltoall"))
"""(preset, token dispatcher) pairs, each one layer at EP 1."""
SYMBOLIC = {"symbolic": dict(layer_spec="transformer_engine", kernels="cuda"),
            "symbolic-local-cuda": dict(layer_spec="local", kernels="cuda"),
            "symbolic-local-cpu": dict(layer_spec="local", kernels="cpu")}
"""The symbolic variants by label: the TE spec the advisor prices, and the local spec the real
backends run, with the CUDA kernels' stand-ins and with torch's CPU paths."""
TINY = dict(hidden_size=64, ffn_hidden_size=96, moe_ffn_hidden_size=32, num_attention_heads=4, num_query_groups=2,
            kv_channels=16, vocab_size=256)
"""--tiny: the presets' sizes shrunk (Qwen3's fixed head size too), their expert counts and top-k kept."""


def parse() -> argparse.Namespace:
    return script_cli.parser(__doc__, deadline_s=DEADLINE_S, tiny_help="shrunken presets, sequence 32 (a quick check)",
                             device_help="cuda: the cuda backend; cpu: the cpu backend in its place").parse_args()


def preset(name: str, tiny: bool):
    """The ``advisor.moe.spec`` preset ``name``, shrunk with --tiny."""
    from advisor.moe.spec import PRESETS

    return dataclasses.replace(PRESETS[name], **TINY) if tiny else PRESETS[name]


def measure(args: argparse.Namespace, name: str, dispatcher: str, label: str, options: dict) -> dict:
    """One layer measured and written to OUT/<name>-<dispatcher>-<label>/moe_layer.json."""
    from advisor.moe.layer_profile import FILENAME, compare
    from megatron_hooks.moe_layer import measure_moe_layer

    profile = measure_moe_layer(preset(name, args.tiny), seq_len=args.seq_len, dispatcher=dispatcher, **options)
    directory = args.out / f"{name}-{dispatcher}-{label}"
    directory.mkdir()
    (directory / FILENAME).write_text(json.dumps(profile.to_dict(), indent=1) + "\n")
    return {"directory": directory.name, "backend": profile.backend, "layer_spec": options["layer_spec"],
            "kernels": options["kernels"], "routing": "real" if profile.backend != "symbolic" else "balanced",
            "activation_bytes": profile.activation_bytes, "parameter_bytes": profile.parameter_bytes,
            "gradient_bytes": profile.gradient_bytes, "cuda_memory": profile.cuda_memory,
            "compare": compare(profile)}


def parts(args: argparse.Namespace) -> list[tuple[str, tuple[str, str, str, dict]]]:
    """(part name, (preset, dispatcher, backend label, measure_moe_layer's options)) in running
    order: every real run, then the symbolic ones."""
    real = [(f"{name}-{dispatcher}-{args.device}", (name, dispatcher, args.device,
                                                     dict(backend=args.device, layer_spec="local",
                                                          kernels=args.device)))
            for name, dispatcher in MEASURED]
    symbolic = [(f"{name}-{dispatcher}-{label}", (name, dispatcher, label, dict(backend="symbolic", **options)))
                for name, dispatcher in MEASURED for label, options in SYMBOLIC.items()]
    return real + symbolic


def model_summary(results: dict, name: str, dispatcher: str, real: str) -> dict:
    """One (model, dispatcher): each part's activation bytes per backend, the real profile's
    comparison with the analytic terms, its allocator's numbers, and how far each symbolic
    variant is from it per part (real minus symbolic)."""
    from advisor.moe.layer_profile import PARTS

    measured = {label: results[f"{name}-{dispatcher}-{label}"] for label in (real, *SYMBOLIC)
                if f"{name}-{dispatcher}-{label}" in results}
    activations = {part: {label: r["activation_bytes"][part] for label, r in measured.items()} for part in PARTS}
    base = measured.get(real)
    memory = base and base["cuda_memory"]
    allocator = memory and {**memory, "reserved_over_allocated": memory["peak_reserved_bytes"]
                            / memory["peak_allocated_bytes"]}
    return {"activation_bytes": activations, "compare": base and base["compare"], "cuda_memory": allocator,
            "real_minus_symbolic": base and {
                label: {part: base["activation_bytes"][part] - r["activation_bytes"][part] for part in PARTS}
                for label, r in measured.items() if label != real}}


def run_parts(args: argparse.Namespace, summary: dict) -> None:
    """Each part in turn, guarded; skipped past the deadline; the summary rewritten after each
    (a run killed from outside keeps what it had measured)."""
    results = {}
    for part, (name, dispatcher, label, options) in parts(args):
        if time.perf_counter() - STARTED > args.deadline:
            summary["parts"][part] = {"ok": False, "error": f"skipped: past the {args.deadline:.0f} s deadline"}
            write_summary(args, summary)
            continue
        began = time.perf_counter()
        try:
            results[part] = measure(args, name, dispatcher, label, options)
            entry = {"ok": True, "result": results[part]}
        except BaseException as exc:  # one part's failure must not lose the others
            entry = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]}
        summary["parts"][part] = entry = {**entry, "seconds": time.perf_counter() - began}
        summary["models"] = {f"{n}-{d}": model_summary(results, n, d, args.device) for n, d in MEASURED}
        write_summary(args, summary)
        print(f"{part}: {'ok' if entry['ok'] else entry['error']} ({entry['seconds']:.1f} s)", flush=True)
        if "KeyboardInterrupt" in entry.get("error", ""):
            break
        gc.collect()


def write_summary(args: argparse.Namespace, summary: dict) -> None:
    summary["elapsed_s"] = time.perf_counter() - STARTED
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")


def header(args: argparse.Namespace, torch) -> dict:
    """What ran where: the command, the device, the versions, the layout, the routing per backend."""
    from megatron_hooks.recorder import megatron_core_version

    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    return {"command": " ".join(sys.argv), "device": device, "torch": torch.__version__,
            "megatron_core": megatron_core_version(), "python": sys.version.split()[0], "seq_len": args.seq_len,
            "mbs": 1, "ep": 1, "tiny": args.tiny, "deadline_s": args.deadline,
            "models_measured": [f"{n}-{d}" for n, d in MEASURED],
            "routing": {args.device: "megatron-core's TopKRouter on the layer's random weights and input",
                        "symbolic": "balanced (megatron_hooks.moe_fake.fake_routing)"}}


def main() -> int:
    args = parse()
    if (torch := script_cli.start(args)) is None:
        return 2
    args.seq_len = 32 if args.tiny else 4096
    summary = {**header(args, torch), "parts": {}, "models": {}}
    run_parts(args, summary)
    return 0 if all(part["ok"] for part in summary["parts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
