"""Part of ``python -m tables.published``: the time model against published large-scale runs it was not
fitted on (a sanity check, not a validation: the runs' software and schedules differ from ours).

Llama 3 405B (Dubey et al. 2024, "The Llama 3 Herd of Models", Table 4): 126 layers on H100
80GB nodes of 8, BF16, 16M tokens per iteration, TFLOP/s per GPU and BF16 MFU as Meta reports
them (causal attention counted, as Megatron-LM counts today). Meta used an interleaved 1F1B
schedule whose virtual-stage count it does not state; we give v = 1 and v = 4, and an even
split (126/16 layers per stage on average; Meta moved one layer off each of the first and last).
The long-context row is taken with DP = 8, the value that makes its product TP x CP x PP x DP equal
its 16,384 GPUs and its 16 sequences per DP rank equal 16M tokens per batch.
"""

from __future__ import annotations

from advisor.hardware import get_gpu
from advisor.models import preset
from advisor.throughput import TimeModel

LLAMA3_405B = [
    # GPUs, TP, CP, PP, DP, sequence, global batch (sequences), TFLOP/s per GPU, MFU
    (8192, 8, 1, 16, 64, 8192, 2048, 430, 0.43),
    (16384, 8, 1, 16, 128, 8192, 2048, 400, 0.41),
    (16384, 8, 16, 16, 8, 131072, 128, 380, 0.38),
]


def rows() -> list[dict]:
    spec, gpu = preset("llama3.1-405b"), get_gpu("h100-80gb")
    out = []
    for gpus, tp, cp, pp, dp, seq, gbs, tflops, mfu in LLAMA3_405B:
        model = TimeModel(spec, gpu, seq, gbs)
        predicted = {}
        for vpp in (1, 4):
            step = model.step(tp, cp, pp, dp, 1, vpp)
            predicted[vpp] = float(model.throughput(step, gpus, tp)["tflops_per_gpu"])
        out.append({"gpus": gpus, "layout": f"TP {tp}, CP {cp}, PP {pp}, DP {dp}", "seq_len": seq,
                    "published_tflops": tflops, "published_mfu": mfu, "ours_v1": predicted[1], "ours_v4": predicted[4]})
    return out


def markdown() -> str:
    lines = ["| GPUs | layout | sequence | Meta: TFLOP/s (MFU) | ours, 1F1B | ours, interleaved v = 4 |",
             "|---:|---|---:|---:|---:|---:|"]
    for r in rows():
        lines.append(f"| {r['gpus']:,} | {r['layout']} | {r['seq_len']:,} | {r['published_tflops']} "
                     f"({r['published_mfu']:.0%}) | {r['ours_v1']:.0f} | {r['ours_v4']:.0f} |")
    return "\n".join(lines) + "\n"
