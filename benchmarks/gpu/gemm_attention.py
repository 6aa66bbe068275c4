"""Measured BF16 GEMM and causal flash-attention speed on one GPU, for Llama layer shapes.

The GEMMs of a Llama layer (QKV, attention output projection, SwiGLU's fc1 and fc2) for the 8B, 70B
and 405B hidden sizes at TP 1, 2, 4, 8 and 1k-32k tokens; torch's scaled_dot_product_attention
(the flash kernel on Hopper) forward and forward+backward, causal, head dim 128, GQA, at sequence
2k, 8k and 32k. Each time is the mean of 10 (4 for the largest GEMMs, 5 for attention) runs after
3 warm-ups, between CUDA events. Random normal BF16 data.

    python3 benchmarks/gpu/gemm_attention.py OUT.json        # about 2 minutes on one H100

Committed result: ``benchmarks/gpu/data/h100_sxm_gemm_attention.json`` (one H100 80GB HBM3, torch
2.11.0+cu130, 2026-11-24), an independent measurement of how close a Llama layer's kernels come to
the datasheet peak; the throughput model is not fitted to it.
"""
import json
import sys
import time

import torch
import torch.nn.functional as F

dev = torch.device("cuda")


def timed(fn, reps=10, warm=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


rows = []
t0 = time.time()
for h, ffn in ((4096, 14336), (8192, 28672), (16384, 53248)):
    for tp in (1, 2, 4, 8):
        for tokens in (1024, 4096, 8192, 16384, 32768):
            for name, k, n in (("qkv", h, (h + 2 * h // 4) // tp), ("proj", h // tp, h),
                               ("fc1", h, 2 * ffn // tp), ("fc2", ffn // tp, h)):
                if tokens * max(k, n) * 2 > 6e9:
                    continue
                a = torch.randn(tokens, k, device=dev, dtype=torch.bfloat16)
                b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
                reps = 10 if tokens * k * n < 2e12 else 4
                sec = timed(lambda: a @ b, reps=reps)
                rows.append({"kind": "gemm", "name": name, "h": h, "tp": tp, "m": tokens, "k": k, "n": n,
                             "seconds": sec, "tflops": 2 * tokens * k * n / sec / 1e12})
        if time.time() - t0 > 90:
            break
for heads, kv in ((32, 8), (64, 8), (128, 8)):
    for tp in (1, 8):
        for seq in (2048, 8192, 32768):
            hq, hk = heads // tp, max(kv // tp, 1)
            q = torch.randn(1, hq, seq, 128, device=dev, dtype=torch.bfloat16, requires_grad=True)
            k = torch.randn(1, hk, seq, 128, device=dev, dtype=torch.bfloat16, requires_grad=True)
            v = torch.randn(1, hk, seq, 128, device=dev, dtype=torch.bfloat16, requires_grad=True)
            fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            try:
                sec_f = timed(fwd, reps=5)
                out = fwd()
                grad = torch.randn_like(out)
                sec_fb = timed(lambda: torch.autograd.grad(fwd(), (q, k, v), grad), reps=5)
            except Exception as exc:  # noqa: BLE001
                rows.append({"kind": "sdpa", "heads": hq, "seq": seq, "error": str(exc)[:200]})
                continue
            flops_f = 4 * seq * seq * 128 * hq / 2  # causal: half of QK^T and PV
            rows.append({"kind": "sdpa", "heads": hq, "kv_heads": hk, "seq": seq, "head_dim": 128,
                         "forward_s": sec_f, "forward_backward_s": sec_fb,
                         "forward_tflops_causal": flops_f / sec_f / 1e12,
                         "fb_tflops_causal": 3.5 * flops_f / sec_fb / 1e12})
info = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
json.dump(info, open(sys.argv[1], "w"), indent=1)
for r in rows:
    print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()})
