"""megatron-core's unfused core attention timed on one GPU, against what the advisor prices for it.

Question: ``advisor.throughput.terms.unfused_attention_time`` prices attention without a fused
kernel (``--no-flash-attn``, ``--transformer-impl local``) as two batched GEMMs forward (four
backward) at the slower of the GEMM rate and one BF16 pass over the s x s matrix, plus two BF16
passes for the softmax forward (three backward); docs/time.md says it was never checked against
a measured unfused run. Megatron-core's ``DotProductAttention`` (core_v0.15.2
``transformer/dot_product_attention.py``) may move more: GQA's ``repeat_interleave`` of K and V,
``baddbmm`` into the global buffer, and ``FusedScaleMaskSoftmax``, which without Apex's compiled
kernels (and always above sk 4096: ``is_kernel_available``) takes ``forward_torch_softmax``: the
causal mask built once and cached, ``masked_fill_`` over the scores, ``torch.softmax``.

What runs: megatron-core's real ``DotProductAttention`` (causal, self-attention) with the
llama3.1-8b preset's heads (32 query heads, 8 KV groups, head dim 128) on one TP rank of TP 1, 2,
4 and 8 (32, 16, 8, 4 heads: what one rank of a TP group computes, as a 70B layer at TP 8 has 8),
at sequence 2048, 4096 and 8192, MBS 1, BF16, Megatron's defaults (softmax in the input's dtype,
``--attention-softmax-in-fp32`` off; no query-key layer scaling) and attention dropout 0, as the
Llama recipes set it; ``--masked-softmax-fusion`` only where Apex's kernels are installed
(``fused_softmax_available``: without them every case is the torch softmax); this process one NCCL rank (gloo on the CPU). Forward and forward +
backward are timed with CUDA events, median of the repeats after warm-ups, the GPU idle at the
start; one forward + backward also runs under torch.profiler (kernels by name and total time).
Beside each case stands the advisor's price for the h200-141gb preset with the calibration
(``Rates.of``), and the ratio measured / priced.

Run on the GPU machine, from the repository root, with a copy of Megatron-LM core_v0.15.2 first on
the path (Python 3.12, torch 2.11+cu130, no Transformer Engine or Apex), in well under a minute
after the imports::

    PYTHONPATH=.gpu_carry/core_v0.15.2:. python3 benchmarks/gpu/time_unfused_attention.py OUT

``--device cpu --tiny`` runs two small cases over gloo with time.perf_counter, in seconds (what
tests/test_gpu_unfused_attention_script.py runs).
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

STARTED = time.perf_counter()
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import script_cli  # noqa: E402  (this folder's shared command line)

MODEL = "llama3.1-8b"
PRICED_ON = "h200-141gb"
TPS = (1, 2, 4, 8)
SEQ_LENS = (2048, 4096, 8192)
TINY_SEQ_LENS = (64, 128)
DEADLINE_S = 90.0
REPEATS, WARMUPS = 10, 3


def price(spec, seq_len: int, tp: int) -> dict:
    """The advisor's (forward, backward) price of one layer's unfused core attention on a TP rank."""
    from advisor.hardware import get_gpu
    from advisor.throughput import terms
    from advisor.throughput.calibration import load_calibration

    rates = terms.Rates.of(get_gpu(PRICED_ON), load_calibration())
    forward, backward = terms.unfused_attention_time(spec, seq_len, 1, tp, rates)
    return {"forward_s": float(forward), "forward_backward_s": float(forward + backward),
            "hbm_bytes_per_s": rates.hbm_bytes_per_s, "gemm_flops_per_s": rates.gemm_flops_per_s}


def fused_softmax_available() -> bool:
    """Whether Megatron's compiled softmax kernels (Apex's ``scaled_masked_softmax_cuda``, which NGC's
    PyTorch containers ship) can be imported. Without them ``--masked-softmax-fusion`` (on by
    default) fails at sk <= 4096 (``is_kernel_available`` imports them), so it is turned off, as
    ``--no-masked-softmax-fusion`` does: every case then takes ``forward_torch_softmax``."""
    import importlib.util

    return importlib.util.find_spec("scaled_masked_softmax_cuda") is not None


def build(spec, tp: int, device: str):
    """``DotProductAttention`` with one TP rank's heads of ``spec`` at TP ``tp``."""
    import torch
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(num_layers=1, hidden_size=spec.hidden_size // tp,
                               num_attention_heads=spec.num_attention_heads // tp,
                               num_query_groups=max(1, spec.num_query_groups // tp), kv_channels=spec.head_dim,
                               attention_dropout=0.0, bf16=True, params_dtype=torch.bfloat16,
                               attention_softmax_in_fp32=False, apply_query_key_layer_scaling=False,
                               masked_softmax_fusion=fused_softmax_available())
    return DotProductAttention(config, layer_number=1, attn_mask_type=AttnMaskType.causal,
                               attention_type="self").to(device)


def inputs(spec, seq_len: int, tp: int, device: str):
    """Q [s, 1, a/t, d], K and V [s, 1, k/t, d], requiring grad, and the output's gradient."""
    import torch

    heads, groups = spec.num_attention_heads // tp, max(1, spec.num_query_groups // tp)
    make = lambda n: torch.randn(seq_len, 1, n, spec.head_dim, dtype=torch.bfloat16, device=device,  # noqa: E731
                                 requires_grad=True)
    q, k, v = make(heads), make(groups), make(groups)
    grad = torch.randn(seq_len, 1, heads * spec.head_dim, dtype=torch.bfloat16, device=device)
    return q, k, v, grad


def timed(fn, device: str, repeats: int, warmups: int) -> dict:
    """Median (and spread) seconds of ``fn`` after warm-ups (``script_cli.sample_seconds``)."""
    samples = script_cli.sample_seconds(fn, device, repeats, warmups)
    return {"median_s": statistics.median(samples), "min_s": min(samples), "max_s": max(samples),
            "repeats": len(samples)}


def profiled(fn, device: str) -> dict:
    """One run of ``fn`` under torch.profiler: the kernels (aten ops on a CPU) by total time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = device == "cuda"
    with profile(activities=[ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    rows = sorted(prof.key_averages(), key=lambda e: -(e.device_time_total if cuda else e.self_cpu_time_total))
    top = [{"name": e.key[:120], "count": e.count,
            "total_s": (e.device_time_total if cuda else e.self_cpu_time_total) / 1e6} for e in rows[:12]]
    return {"top": top, "total_s": sum(r["total_s"] for r in top)}


def measure(spec, seq_len: int, tp: int, device: str, tiny: bool) -> dict:
    """One case: forward and forward + backward timed, profiled, beside the price."""
    attention = build(spec, tp, device)
    q, k, v, grad = inputs(spec, seq_len, tp, device)
    # No mask on CUDA: megatron-core builds its causal mask itself, once (``get_default_causal_mask``,
    # cached), as under --no-create-attention-mask-in-dataloader. That builder puts it on "cuda"
    # whatever the device, so the CPU check passes the data loader's [1, 1, s, s] mask instead.
    import torch

    mask = None if device == "cuda" else torch.ones(1, 1, seq_len, seq_len, dtype=torch.bool).triu(1)

    def forward():
        return attention(q, k, v, attention_mask=mask)

    def forward_backward():
        q.grad = k.grad = v.grad = None
        forward().backward(grad)

    repeats, warmups = (2, 1) if tiny else (REPEATS, WARMUPS)
    priced = price(spec, seq_len, tp)
    result = {"heads": spec.num_attention_heads // tp, "groups": max(1, spec.num_query_groups // tp),
              "forward": timed(forward, device, repeats, warmups),
              "forward_backward": timed(forward_backward, device, repeats, warmups),
              "profile": profiled(forward_backward, device), "priced": priced}
    result["forward_over_priced"] = result["forward"]["median_s"] / priced["forward_s"]
    result["forward_backward_over_priced"] = result["forward_backward"]["median_s"] / priced["forward_backward_s"]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = script_cli.parser(__doc__, deadline_s=DEADLINE_S, tiny_help="sequences 64 and 128, TP 4 and 8 (a quick check)",
                               device_help="cuda: one GPU, one NCCL rank; cpu: gloo and perf_counter")
    args = parser.parse_args(argv)
    if (torch := script_cli.start(args)) is None:
        return 2
    import dataclasses

    from advisor.fileio import atomic_write_text
    from advisor.models import PRESETS
    from megatron_hooks.recorder import megatron_core_version
    from megatron_hooks.stage_emulation import free_port, process_group

    spec = PRESETS[MODEL]
    if args.tiny:
        spec = dataclasses.replace(spec, hidden_size=256, num_attention_heads=8, num_query_groups=8)
    cases = [(s, tp) for s in (TINY_SEQ_LENS if args.tiny else SEQ_LENS) for tp in ((4, 8) if args.tiny else TPS)]
    summary = {"command": " ".join(sys.argv), "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
               "torch": torch.__version__, "megatron_core": megatron_core_version(), "model": MODEL,
               "priced_on": PRICED_ON, "mbs": 1, "dtype": "bf16", "attention_dropout": 0.0,
               "softmax_in_fp32": False, "masked_softmax_fusion": fused_softmax_available(), "cases": {}}
    ok = True
    with contextlib.ExitStack() as context:
        context.enter_context(process_group(0, 1, free_port(), 1))
        for seq_len, tp in cases:
            name = f"s{seq_len}-tp{tp}"
            if time.perf_counter() - STARTED > args.deadline:
                summary["cases"][name] = {"ok": False, "error": f"skipped: past the {args.deadline:.0f} s deadline"}
                ok = False
                continue
            try:
                summary["cases"][name] = {"ok": True, **measure(spec, seq_len, tp, args.device, args.tiny)}
            except Exception as exc:  # noqa: BLE001 - one case's failure keeps the others
                summary["cases"][name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                                          "traceback": traceback.format_exc()[-3000:]}
                ok = False
            if args.device == "cuda":
                torch.cuda.empty_cache()
            case = summary["cases"][name]
            print(f"{name}: " + (f"fwd+bwd {case['forward_backward']['median_s'] * 1e3:.2f} ms, "
                                 f"{case['forward_backward_over_priced']:.2f}x the price" if case["ok"] else case["error"]),
                  flush=True)
            summary["elapsed_s"] = time.perf_counter() - STARTED
            atomic_write_text(args.out / "summary.json", json.dumps(summary, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
