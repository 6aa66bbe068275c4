"""The fixed cost of an MoE layer's small kernels on one GPU, against what advisor.moe.time prices.

Question: the advisor predicts Qwen3-30B-A3B's MoE runs 13-35% too fast (docs/validation.md).
The routed experts' GEMMs match it on an H200 (``moe_grouped_gemm.py``: 0.93-1.00) and the EP
all-to-all is priced from link bandwidths; what is left is the many small non-GEMM kernels
around them: the router's softmax, top-k, aux loss (and z-loss where set) and the forced
balancing's random logits, the token counts, the permutations' index work and the unpermute, and
the dropless dispatcher's host wait for the counts. ``advisor.moe.time.layer_times`` prices the
router as one GEMM (``router``), the permutations by their HBM bytes (``permutation_pairs`` at
the calibrated HBM rate, ``terms.elementwise_time``) and the host wait as ``host_sync_idle``:
no per-kernel cost. (That was the model this was written against; its first run, committed in
``data/h200_moe_kernels/``, gave the router's small kernels and the permutations' rate the
model now has: ``python -m tables.moe_kernel_probe``.) One GPU times these parts without the 2-node all-to-all.

What runs: megatron-core's real MoE layer of qwen3-30b-a3b (hidden 2048, 128 experts, top-8,
expert width 768) at sequence 4096, MBS 1, BF16, EP 1, TP 1, this process one NCCL rank, the
local layer spec (no Transformer Engine: ``megatron_hooks.moe_layer``'s cuda backend, whose world
and kernel settings this reuses), built once per token dispatcher (alltoall, allgather), with the
router flags ``advisor.moe.flags.model_flags`` emits for the preset (aux-loss balancing at its
coefficient, ``--moe-router-dtype fp32``) and ``--moe-router-force-load-balancing``, as the
published runs set it (tables/published/moe_runs.csv). Parts, each forward and backward, each
guarded (one failure keeps the others), ``OUT/summary.json`` rewritten atomically after each:

- ``router``: the ``TopKRouter`` on a [4096, 1, 2048] input with its aux loss
  (``router.py``, ``TopKRouter.forward``: gating GEMM, random logits, softmax top-k, aux loss);
- ``dispatch``: the token dispatcher with no experts between dispatch and combine, called as
  ``MoELayer.forward`` calls it (``moe_layer.py``: ``dispatch_preprocess``, ``token_dispatch``,
  ``dispatch_postprocess``, then ``combine_preprocess``, ``token_combine``, ``combine_postprocess``),
  the permuted tokens fed straight to the combine; the backward runs through both outputs;
- ``block``: the whole ``MoELayer`` (router, dispatcher, experts). The local spec's experts are
  ``SequentialMLP``, a Python loop over the 128 experts, not the grouped GEMM the advisor prices
  (``TEGroupedMLP``): recorded, labelled so, not a test of the model.

Each part is timed with CUDA events, median of N repeats after warm-ups, two ways: ``isolated``
(the GPU idle at the start: every launch's host time shows) and ``queued`` (behind a
``torch.cuda._sleep`` kernel, so the host runs ahead as in training: the GPU's own time plus
what the host sync leaves idle). ``router`` and ``dispatch`` also run once under torch.profiler
(CUDA activities): kernels launched, the sum of their durations, the time the GPU was busy and
the gaps (launch- and host-bound idle) over the run's span; the gzipped Chrome trace is kept in
``OUT/traces/``. Beside each part stands the advisor's price of the same part for the
h100-80gb preset (the published runs' GPU) and h200-141gb, computed with advisor.moe.time's
functions and the calibration: router ``LayerTimes.block - LayerTimes.expert`` less the
permutation term (``layer_times`` keeps no field of its own for it), dispatch the permutation
term, the EP communication (0 at EP 1) and ``host_sync_idle``, the block ``LayerTimes.block``
with those; forward and backward as ``layer_times`` prices them (the backward twice the forward,
the communication both ways, the host wait once, in the forward).

Run on the GPU machine, from the repository root, with a copy of Megatron-LM core_v0.15.2 first
on the path (Python 3.12, torch 2.11+cu130, no Transformer Engine or Apex), well under 150 s::

    PYTHONPATH=.gpu_carry/core_v0.15.2:. python3 benchmarks/gpu/time_moe_kernels.py OUT

On a CPU, ``--device cpu --tiny`` runs every part on a shrunken Qwen3-shaped preset (hidden 64,
8 experts, top-2, sequence 32) over gloo, timed with time.perf_counter and profiled with CPU
activities (a "kernel" there is an aten op), in seconds: what tests/test_gpu_moe_kernels_script.py
runs, to catch errors before the lent GPU does.

Reading the result against the model: ``readout`` in the summary sets, per dispatcher and part,
the measured medians beside the h100-80gb price. Where ``queued`` exceeds the price by about
the kernel count times a few microseconds, and the profile's ``kernel_s`` far exceeds the bytes
over HBM, the missing term is a fixed cost per kernel; where ``isolated`` exceeds ``queued``
and the profile shows large ``gaps_s``, the host's launches bound the part (hidden in training
only while the host runs ahead, so not after the dispatcher's host sync). The router runs its
GEMM in FP32 through torch.mm without TE (``moe_utils.RouterGatingLinearFunction``), which the
profile's GEMM kernels (``gemm_kernel_s``) set apart. A layer's miss is the part's excess times
48 layers and the microbatches per step; compare it with the 13-35% step-time miss.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import gzip
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

STARTED = time.perf_counter()  # the deadline counts from here: torch's and megatron's imports took ~30 s on an H200
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import script_cli  # noqa: E402  (this folder's shared command line)

DEADLINE_S = 120.0
"""Seconds from the start after which parts not started are skipped (the run must end well under
150 s; ``measure_moe_layers.py`` built and ran each such layer in under 2 s on an H200)."""
MODEL = "qwen3-30b-a3b"
"""The preset measured by default (--model): the published runs' Qwen3-30B-A3B."""
MODELS = ("qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v3")
"""--model's choices: the default, and two held out of what ``tables.moe_kernel_probe`` derives
from it (Mixtral's 8 experts, top-2, hidden 4096; DeepSeek-V3's 256, sigmoid group-limited top-8,
hidden 7168), to check the derived constants on shapes they were not taken from."""
DISPATCHERS = ("alltoall", "allgather")
PARTS = ("router", "router-profile", "dispatch", "dispatch-profile", "block")
"""The parts run per dispatcher, after its ``build``, in this order."""
PRICED_ON = ("h100-80gb", "h200-141gb")
"""GPU presets the advisor's price is computed for: the published runs' H100 (the reference), and
the H200 this is meant to run on."""
TINY = dict(hidden_size=64, ffn_hidden_size=96, moe_ffn_hidden_size=32, num_attention_heads=4, num_query_groups=2,
            kv_channels=16, vocab_size=256, num_experts=8, moe_router_topk=2)
"""--tiny: the preset shrunk (measure_moe_layers.py's sizes), 8 experts, top-2."""
SLEEP_CYCLES = 40_000_000
"""``torch.cuda._sleep`` before a queued repeat: about 20-30 ms at an H200's 1.4-2 GHz clocks,
longer than the host takes to queue a router or dispatch part."""
GEMM_NAMES = ("gemm", "nvjet", "xmma", "cutlass", "cublas", "matmul")
"""Kernel-name fragments (lower case) of GEMM kernels (cuBLAS's Hopper kernels are ``nvjet_*``), to
set the router's GEMMs apart."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """How often each part runs."""

    repeats: int
    """Timed repeats of the router and dispatch parts (the median is reported)."""
    warmups: int
    """Untimed runs before them."""
    block_repeats: int
    """Timed repeats of the whole block (SequentialMLP: 128 experts' launches each)."""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 1 <= value <= 1000:
        raise argparse.ArgumentTypeError(f"must be between 1 and 1000, got {value}")
    return value


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = script_cli.parser(__doc__, deadline_s=DEADLINE_S, tiny_help="a shrunken preset, sequence 32 (a quick check)",
                               device_help="cuda: one GPU, one NCCL rank; cpu: gloo, perf_counter and CPU profiling")
    parser.add_argument("--repeats", type=_positive_int, default=None,
                        help="timed repeats of the router and dispatch parts (default 20 on CUDA, 3 on the CPU)")
    parser.add_argument("--model", choices=MODELS, default=MODEL,
                        help=f"the MoE preset whose layer is timed (default {MODEL})")
    parser.add_argument("--z-loss-coeff", type=script_cli.positive_number, default=None, metavar="COEFF",
                        help="--moe-z-loss-coeff for the router (default: none, as the advisor's flags and the "
                             "published Qwen3 runs' notes have it)")
    args = parser.parse_args(argv)
    gpu = args.device == "cuda"
    args.plan = Plan(repeats=args.repeats or (20 if gpu else 3), warmups=3 if gpu else 1,
                     block_repeats=5 if gpu else 2)
    args.seq_len = 32 if args.tiny else 4096
    return args


def preset(tiny: bool, model: str = MODEL):
    """The ``advisor.moe.spec`` preset ``model``, shrunk with --tiny. Multi-latent attention (and its
    YaRN) is dropped: the local layer spec cannot build it, and the parts timed here, the router and
    the dispatcher, do not depend on the attention before them (the ``block`` part is labelled
    as not the model's anyway)."""
    from advisor.moe.spec import PRESETS

    spec = dataclasses.replace(PRESETS[model], mla=None, yarn=None)
    return dataclasses.replace(spec, **TINY) if tiny else spec


def router_settings(spec, z_loss_coeff: float | None) -> dict:
    """``TransformerConfig`` fields of the router: the balancing, its coefficient and the router
    dtype as ``advisor.moe.flags.model_flags`` emits them for ``spec`` (the one place that knows
    the flags), with --moe-router-force-load-balancing (the published runs force balanced
    routing: random logits, ``router.py`` ``TopKRouter.forward`` / ``moe_utils.apply_random_logits``)."""
    from advisor.moe.flags import model_flags

    flags = model_flags(spec)

    def values(flag: str) -> list[str]:
        if flag not in flags:
            return []
        start = end = flags.index(flag) + 1
        while end < len(flags) and not flags[end].startswith("--"):
            end += 1
        return flags[start:end]

    kinds, coefficients = values("--moe-router-load-balancing-type") or ["none"], values("--moe-aux-loss-coeff")
    weights = [float(c) for c in coefficients] or [0.0]
    return dict(moe_router_load_balancing_type=kinds[0] if len(kinds) == 1 else kinds,
                moe_aux_loss_coeff=weights[0] if len(weights) == 1 else weights,
                moe_router_dtype=(values("--moe-router-dtype") or [None])[0],
                moe_router_force_load_balancing=True, moe_z_loss_coeff=z_loss_coeff)


# --- the advisor's price ---------------------------------------------------------------------


def prices(spec, seq_len: int, dispatcher: str) -> dict:
    """Per GPU preset of ``PRICED_ON``: advisor.moe.time's terms of one MoE layer at EP 1, TP 1,
    MBS 1, balanced routing (what forced balancing draws), forward and forward + backward."""
    from advisor.hardware import get_gpu, streaming_multiprocessors
    from advisor.moe import memory as mm
    from advisor.moe import ep_time
    from advisor.moe import time as moe_time
    from advisor.throughput import terms
    from advisor.throughput.calibration import load_calibration

    cal = load_calibration()
    tokens = mm.tokens_per_rank(seq_len, 1, 1, 1)
    copies = mm.expert_token_copies(spec, tokens, 1, 1, mm.RoutedTokens())
    priced = {}
    for name in PRICED_ON:
        gpu = get_gpu(name)
        rates = terms.Rates.of(gpu, cal)
        layer = moe_time.layer_times(spec, seq_len, tp=1, cp=1, ep=1, etp=1, mbs=1, rates=rates,
                                     dispatcher=dispatcher, sms=streaming_multiprocessors(gpu.architecture))
        by_expert, by_local_expert = ep_time.permutation_pairs(spec, copies, 1, dispatcher)
        permute = ep_time.permutation_time(spec, copies, 1, rates, dispatcher)
        router = layer.block - layer.expert - permute  # layer_times' ``router`` term
        idle = ep_time.host_sync_idle(spec, tokens, rates, dispatcher)
        forward = {"router_s": router, "permute_s": permute, "host_sync_idle_s": idle, "comm_s": layer.comm,
                   "block_s": layer.block, "expert_s": layer.expert, "moe_layer_s": layer.moe}
        # backward twice the compute, the communication once each way, the host wait in the forward only
        # (advisor.moe.time._moe_layer_paces without recomputation)
        both = {"router": 3 * router, "dispatch": 3 * permute + 2 * layer.comm + idle,
                "block": 3 * layer.block + 2 * layer.comm + idle}
        priced[name] = {"forward": {k: float(v) for k, v in forward.items()},
                        "forward_backward_s": {k: float(v) for k, v in both.items()},
                        "permutation_bytes_forward": float(by_expert + by_local_expert),
                        "permutation_pairs_bytes_forward": [float(by_expert), float(by_local_expert)],
                        "permute_hbm_fraction": ep_time.PERMUTE_HBM_FRACTION,
                        "hbm_bytes_per_s": rates.hbm_bytes_per_s, "gemm_flops_per_s": rates.gemm_flops_per_s,
                        "host_launch_s": ep_time.HOST_LAUNCH_S}
    return priced


def against(measured_s: float, priced: dict, part: str) -> dict:
    """The measured time over and minus each preset's price of ``part``."""
    return {name: {"predicted_s": p["forward_backward_s"][part], "measured_over_predicted":
                   measured_s / p["forward_backward_s"][part] if p["forward_backward_s"][part] > 0 else None,
                   "measured_minus_predicted_s": measured_s - p["forward_backward_s"][part]}
            for name, p in priced.items()}


# --- the layer and its passes ----------------------------------------------------------------


@dataclasses.dataclass(kw_only=True)
class Pieces:
    """One built MoE layer and the tensors its parts run on."""

    model: object
    """The one-layer GPTModel (``megatron_hooks.model.build_gpt_model``), kept alive."""
    mlp: object
    """Its ``MoELayer``: ``.router`` (``TopKRouter``), ``.token_dispatcher``, ``.experts``."""
    hidden: object
    """[s, 1, h] BF16 leaf, requiring grad: the pre-MLP norm's output in a real layer."""
    grad_hidden: object
    """The gradient fed to the layer's (and the combine's) output."""
    probs: object
    """[s, E] router probabilities of ``hidden`` (no autograd history), for the dispatch part."""
    routing_map: object
    """[s, E] boolean routing of ``hidden``."""
    grad_probs: object
    """The gradient fed to the router's probabilities."""
    ones: dict = dataclasses.field(default_factory=dict)
    """Gradients of the dispatched probabilities by shape (dropless: N k copies, fixed)."""

    def describe(self) -> dict:
        mlp = self.mlp
        return {"router": type(mlp.router).__name__, "token_dispatcher": type(mlp.token_dispatcher).__name__,
                "experts": type(mlp.experts).__name__, "tokens": int(self.routing_map.shape[0]),
                "routed_copies": int(self.routing_map.sum()),
                "parameter_bytes": sum(p.numel() * p.element_size() for p in mlp.parameters())}


def build(context: contextlib.ExitStack, args: argparse.Namespace, dispatcher: str) -> Pieces:
    """The MoE layer of ``preset`` with ``dispatcher``, as ``megatron_hooks.moe_layer.measure_moe_layer``
    builds its real-tensor backends' (``_world``: this process one NCCL, or gloo, rank;
    ``_kernels_and_routing``: cuda, megatron's MoE without TE, torch.compile off; cpu, the real
    tensors through ``moe_fake.fake_routing``, which only gives the alltoall dispatcher no CUDA side
    stream; ``_layer_model``'s ``build_gpt_model`` call), with ``router_settings``' router."""
    import torch

    from megatron_hooks.model import build_gpt_model
    from megatron_hooks.moe_layer import _kernels_and_routing, _world

    spec, device = preset(args.tiny, args.model), args.device
    _world(context, device, tp=1, ep=1, etp=1)
    _kernels_and_routing(context, device, device, spec)
    model = build_gpt_model(spec, seq_len=args.seq_len, layers=[spec.num_layers // 2 + 1], pre_process=False,
                            post_process=False, params_dtype=torch.bfloat16, layer_spec="local",
                            use_cpu_initialization=device != "cuda", expert_model_parallel_size=1,
                            expert_tensor_parallel_size=1, sequence_parallel=False,
                            moe_token_dispatcher_type=dispatcher,
                            **router_settings(spec, args.z_loss_coeff))
    mlp = model.decoder.layers[0].mlp
    hidden = torch.randn(args.seq_len, 1, spec.hidden_size, dtype=torch.bfloat16, device=device, requires_grad=True)
    with torch.no_grad():
        probs, routing_map = mlp.router(hidden)
    return Pieces(model=model, mlp=mlp, hidden=hidden, grad_hidden=torch.randn_like(hidden), probs=probs,
                  routing_map=routing_map, grad_probs=torch.randn_like(probs))


def router_pass(pieces: Pieces) -> None:
    """``TopKRouter`` forward (``router.py``: ``gating``, ``apply_random_logits``, ``routing``:
    softmax top-k, aux loss attached to the probabilities) and backward."""
    pieces.hidden.grad = None
    pieces.mlp.router.zero_grad(set_to_none=True)
    probs, _ = pieces.mlp.router(pieces.hidden)
    probs.backward(pieces.grad_probs)


def dispatch_pass(pieces: Pieces) -> None:
    """The token dispatcher's dispatch and combine with nothing between, as ``moe_layer.py``
    ``MoELayer.forward`` calls them (``router_and_preprocess``, ``dispatch``,
    ``routed_experts_compute``, ``combine``; core_v0.15.2 ``token_dispatcher.py``), the permuted
    tokens standing for the experts' output; backward through the output and the permuted
    probabilities (which the experts would weight their output by)."""
    import torch

    dispatcher = pieces.mlp.token_dispatcher
    pieces.hidden.grad = None
    probs = pieces.probs.detach().requires_grad_()
    tokens, permuted = dispatcher.dispatch_preprocess(pieces.hidden, pieces.routing_map, probs)
    tokens, permuted = dispatcher.token_dispatch(tokens, permuted)
    tokens, _tokens_per_expert, permuted = dispatcher.dispatch_postprocess(tokens, permuted)
    output = dispatcher.combine_postprocess(dispatcher.token_combine(dispatcher.combine_preprocess(tokens)))
    ones = pieces.ones.get(tuple(permuted.shape))
    if ones is None:
        ones = pieces.ones[tuple(permuted.shape)] = torch.ones_like(permuted)
    torch.autograd.backward((output, permuted), (pieces.grad_hidden, ones))


def block_pass(pieces: Pieces) -> None:
    """The whole ``MoELayer`` forward and backward (``moe_layer.py`` ``MoELayer.forward``)."""
    pieces.hidden.grad = None
    pieces.mlp.zero_grad(set_to_none=True)
    output, _ = pieces.mlp(pieces.hidden)
    output.backward(pieces.grad_hidden)


PASSES = {"router": router_pass, "dispatch": dispatch_pass, "block": block_pass}
WHAT = {"router": "TopKRouter forward + backward: FP32 gating GEMM (torch.mm, no TE), random logits "
                  "(forced balancing), softmax top-k, aux loss",
        "dispatch": "token dispatcher dispatch + combine with no experts between, forward + backward",
        "block": "the whole MoELayer forward + backward with the local spec's SequentialMLP experts (a Python "
                 "loop over the experts, not the grouped GEMM the advisor prices: not a test of the model)"}


# --- timing and profiling --------------------------------------------------------------------


def _stats(samples: list[float]) -> dict:
    quartiles = statistics.quantiles(samples, n=4) if len(samples) > 1 else [samples[0]] * 3
    return {"median_s": statistics.median(samples), "min_s": min(samples), "max_s": max(samples),
            "iqr_s": quartiles[2] - quartiles[0], "repeats": len(samples)}


def timed(fn, device: str, repeats: int, warmups: int, queued: bool = False) -> dict:
    """``fn`` run ``warmups`` times, then ``repeats`` times timed: on CUDA between two events, the
    GPU idle at the start (isolated) or, ``queued``, behind a ``torch.cuda._sleep`` kernel the host
    queues ``fn`` behind (``host_queue_s`` over ``sleep_s`` says whether the queue ran dry, as
    it must at a host sync); on the CPU with time.perf_counter."""
    import torch

    for _ in range(warmups):
        fn()
    times, host, queue, slept = [], [], [], []
    for _ in range(repeats):
        if device != "cuda":
            began = time.perf_counter()
            fn()
            times.append(time.perf_counter() - began)
            continue
        torch.cuda.synchronize()
        before, start, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        began = time.perf_counter()
        if queued:
            before.record()
            torch.cuda._sleep(SLEEP_CYCLES)
        start.record()
        fn()
        end.record()
        queue.append(time.perf_counter() - began)
        end.synchronize()
        host.append(time.perf_counter() - began)
        times.append(start.elapsed_time(end) / 1e3)
        if queued:
            slept.append(before.elapsed_time(start) / 1e3)
    result = _stats(times)
    if device == "cuda":
        result.update(host_median_s=statistics.median(host), host_queue_s=statistics.median(queue))
    if slept:
        result["sleep_s"] = statistics.median(slept)
    return result


def measure_time(args: argparse.Namespace, pieces: Pieces, priced: dict, part: str) -> dict:
    """One part timed isolated and, on CUDA, queued; each median beside the advisor's price."""
    plan, fn = args.plan, (lambda: PASSES[part](pieces))
    repeats = plan.block_repeats if part == "block" else plan.repeats
    warmups = min(plan.warmups, 2) if part == "block" else plan.warmups
    isolated = timed(fn, args.device, repeats, warmups)
    queued = timed(fn, args.device, repeats, 1, queued=True) if args.device == "cuda" else None
    return {"what": WHAT[part], "isolated": isolated, "queued": queued,
            "isolated_vs_predicted": against(isolated["median_s"], priced, part) if priced else None,
            "queued_vs_predicted": against(queued["median_s"], priced, part) if priced and queued else None}


def measure_profile(args: argparse.Namespace, pieces: Pieces, priced: dict, part: str, name: str) -> dict:
    """One isolated run of ``part`` under torch.profiler (CUDA activities; on the CPU, CPU ones),
    its Chrome trace gzipped into OUT/traces/NAME.json.gz and summed up (``trace_stats``), the
    kernels' summed time beside the advisor's price. The profiler's own cost per launch widens
    the gaps a little: ``wall_s`` against the timing part's isolated median shows by how much."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from advisor.fileio import atomic_write_bytes

    cuda = args.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    PASSES[part](pieces)  # warm (the timing parts ran before, but a failed one may not have)
    sync()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        began = time.perf_counter()
        PASSES[part](pieces)
        sync()
        wall = time.perf_counter() - began
    traces = args.out / "traces"
    traces.mkdir(exist_ok=True)
    raw = traces / f"{name}.json"
    prof.export_chrome_trace(str(raw))
    events = json.loads(raw.read_text())["traceEvents"]
    atomic_write_bytes(traces / f"{name}.json.gz", gzip.compress(raw.read_bytes()))
    raw.unlink()
    stats = trace_stats(events, cuda)
    return {"what": WHAT[part], "wall_s": wall, **stats, "trace": f"traces/{name}.json.gz",
            "kernel_vs_predicted": against(stats["kernel_s"], priced, part) if priced else None}


def _union_s(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by (start, end) microsecond intervals, overlaps once."""
    covered, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            covered += end - max(start, reach)
            reach = end
    return covered / 1e6


def _top(events: list[dict], count: int) -> list[dict]:
    by_name: dict[str, list[float]] = {}
    for event in events:
        by_name.setdefault(event.get("name", "?"), []).append(float(event.get("dur", 0)))
    ranked = sorted(by_name.items(), key=lambda item: -sum(item[1]))[:count]
    return [{"name": name[:160], "count": len(durs), "total_s": sum(durs) / 1e6} for name, durs in ranked]


def trace_stats(events: list[dict], cuda: bool) -> dict:
    """Kineto Chrome-trace events summed up. CUDA: ``kernels`` launched (category kernel), their
    summed durations ``kernel_s`` (``gemm_kernel_s`` of them GEMMs, by name), memcpy/memset
    ``copies``, ``busy_s`` the union of all device activity, ``span_s`` from its first start to
    its last end, ``gaps_s`` = span - busy (launch- or host-bound idle), and the CUDA runtime
    calls by total host time (launches, the host sync's wait). CPU: the aten ops stand for the
    kernels (every ``aten::`` op, nested ones too; ``kernel_s`` their union, nesting once)."""
    complete = [e for e in events if e.get("ph") == "X" and "ts" in e]
    category = lambda e: str(e.get("cat", "")).lower()  # noqa: E731
    if cuda:
        device = [e for e in complete if category(e) in ("kernel", "gpu_memcpy", "gpu_memset")]
        kernels = [e for e in device if category(e) == "kernel"]
    else:
        device = kernels = [e for e in complete if category(e) == "cpu_op" and e.get("name", "").startswith("aten::")]
    intervals = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in device]
    span = (max(end for _, end in intervals) - min(start for start, _ in intervals)) / 1e6 if intervals else 0.0
    busy = _union_s(intervals)
    stats = {"kernels": len(kernels), "kernel_s": sum(float(e.get("dur", 0)) for e in kernels) / 1e6 if cuda else busy,
             "gemm_kernel_s": sum(float(e.get("dur", 0)) for e in kernels
                                  if any(g in e.get("name", "").lower() for g in GEMM_NAMES)) / 1e6,
             "copies": len(device) - len(kernels), "busy_s": busy, "span_s": span, "gaps_s": span - busy,
             "counted": "CUDA kernels" if cuda else "aten ops (CPU)", "top_kernels": _top(kernels, 15)}
    if cuda:
        stats["runtime_calls"] = _top([e for e in complete if category(e) in ("cuda_runtime", "cuda_driver")], 8)
    return stats


# --- the run ---------------------------------------------------------------------------------


def attempt(args: argparse.Namespace, summary: dict, name: str, work):
    """``work()`` guarded (one part's failure must not lose the others), skipped past the
    deadline; its result (or ``describe()``) or traceback recorded as part ``name`` and the
    summary rewritten (a run killed from outside keeps what it had measured). Returns what
    ``work`` returned, or None. A KeyboardInterrupt is recorded, then raised."""
    if time.perf_counter() - STARTED > args.deadline:
        summary["parts"][name] = {"ok": False, "error": f"skipped: past the {args.deadline:.0f} s deadline"}
        write_summary(args, summary)
        return None
    began, value = time.perf_counter(), None
    try:
        value = work()
        entry = {"ok": True, "result": value.describe() if hasattr(value, "describe") else value}
    except BaseException as exc:  # noqa: BLE001 - recorded; KeyboardInterrupt raised again below
        entry = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]}
        value = exc if isinstance(exc, KeyboardInterrupt) else None
    summary["parts"][name] = entry = {**entry, "seconds": time.perf_counter() - began}
    write_summary(args, summary)
    print(f"{name}: {'ok' if entry['ok'] else entry['error']} ({entry['seconds']:.1f} s)", flush=True)
    if isinstance(value, KeyboardInterrupt):
        raise value
    return value


def run_dispatcher(args: argparse.Namespace, summary: dict, dispatcher: str) -> None:
    """The advisor's price, the build and every part of one dispatcher, in one process group."""
    import functools

    priced = attempt(args, summary, f"{dispatcher}-price", lambda: prices(preset(args.tiny, args.model), args.seq_len, dispatcher))
    summary["predicted"][dispatcher] = priced
    with contextlib.ExitStack() as context:
        pieces = attempt(args, summary, f"{dispatcher}-build", lambda: build(context, args, dispatcher))
        for part in PARTS:
            name = f"{dispatcher}-{part}"
            if pieces is None:
                summary["parts"][name] = {"ok": False, "error": "not run: the build failed or was skipped"}
                continue
            kind = part.removesuffix("-profile")
            work = (functools.partial(measure_profile, args, pieces, priced or {}, kind, name)
                    if part.endswith("-profile") else functools.partial(measure_time, args, pieces, priced or {}, kind))
            attempt(args, summary, name, work)
        summary["readout"] = readout(summary)
        write_summary(args, summary)
        del pieces
        gc.collect()


def readout(summary: dict) -> dict:
    """Per dispatcher and part: the measured medians, the profile's kernels, kernel time and
    gaps, beside the h100-80gb price (``PRICED_ON[0]``) of the same part, forward + backward;
    ``measured_over_predicted`` from the queued median where there is one (CUDA), else the
    isolated one."""
    table = {}
    for dispatcher in DISPATCHERS:
        priced = (summary["predicted"].get(dispatcher) or {}).get(PRICED_ON[0])
        for part in PASSES:
            timing = summary["parts"].get(f"{dispatcher}-{part}", {}).get("result") or {}
            profile = summary["parts"].get(f"{dispatcher}-{part}-profile", {}).get("result") or {}
            predicted = priced and priced["forward_backward_s"][part]
            row = {"isolated_s": (timing.get("isolated") or {}).get("median_s"),
                   "queued_s": (timing.get("queued") or {}).get("median_s"), "kernels": profile.get("kernels"),
                   "kernel_s": profile.get("kernel_s"), "gaps_s": profile.get("gaps_s"),
                   f"predicted_{PRICED_ON[0]}_s": predicted}
            measured = row["queued_s"] or row["isolated_s"]
            row["measured_over_predicted"] = measured / predicted if measured and predicted else None
            table[f"{dispatcher}-{part}"] = row
    return table


def write_summary(args: argparse.Namespace, summary: dict) -> None:
    from advisor.fileio import atomic_write_text

    summary["elapsed_s"] = time.perf_counter() - STARTED
    atomic_write_text(args.out / "summary.json", json.dumps(summary, indent=1, default=str) + "\n")


def header(args: argparse.Namespace, torch) -> dict:
    """What ran where: the command, the device, the versions, the layer and its router, the plan."""
    from advisor.throughput.calibration import CALIBRATION_FILE
    from megatron_hooks.recorder import megatron_core_version

    spec = preset(args.tiny, args.model)
    return {"command": " ".join(sys.argv), "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
            "torch": torch.__version__, "cuda": torch.version.cuda, "megatron_core": megatron_core_version(),
            "python": sys.version.split()[0], "model": args.model, "tiny": args.tiny,
            "sizes": {f: getattr(spec, f) for f in ("hidden_size", "num_experts", "moe_router_topk",
                                                    "moe_ffn_hidden_size")},
            "seq_len": args.seq_len, "mbs": 1, "ep": 1, "tp": 1, "dtype": "bf16", "layer_spec": "local",
            "router": router_settings(spec, args.z_loss_coeff), "moe_permute_fusion": False,
            "dispatchers": list(DISPATCHERS), "plan": dataclasses.asdict(args.plan), "deadline_s": args.deadline,
            "sleep_cycles": SLEEP_CYCLES if args.device == "cuda" else None,
            "predicted_on": list(PRICED_ON), "calibration": str(Path(CALIBRATION_FILE).relative_to(ROOT)),
            "timing": "CUDA events, median of the repeats" if args.device == "cuda" else "time.perf_counter"}


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if (torch := script_cli.start(args)) is None:
        return 2
    summary = {**header(args, torch), "predicted": {}, "parts": {}, "readout": {}}
    write_summary(args, summary)
    try:
        for dispatcher in DISPATCHERS:
            run_dispatcher(args, summary, dispatcher)
    except KeyboardInterrupt:
        return 1
    return 0 if all(part["ok"] for part in summary["parts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
