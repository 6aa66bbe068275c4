"""The CPU emulator's cost model (advisor/capture/campaign_cost.py) against measured stages.

Times ``megatron_hooks.stage_emulation.run_stage`` (two iterations, the CPU backend, one process, the
runner's default threads) for stage shapes of two sets: the FIT set determines the model's three
constants (non-negative least squares on FLOPs / threads, module passes and a constant per
stage), the CHECK set, different shapes, reports measured / estimated with the constants in the
module. Also the resident memory of a process before and after its stage (ru_maxrss), against the
model's estimate.

    python benchmarks/bench_emulation_cost.py [--only fit|check]

Run on a quiet machine: the constants describe the machine they were measured on.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import scipy.optimize

from advisor.capture import campaign_cost
from advisor.models import LlamaSpec

FIT = [  # (name, spec, layers_per_stage, stage, seq, mbs, microbatches)
    ("tiny-mid", dict(num_layers=16, hidden_size=128, ffn_hidden_size=512, num_attention_heads=4,
                      num_query_groups=2, vocab_size=32000), (4, 4, 4, 4), 1, 128, 2, 4),
    ("tiny-first", dict(num_layers=8, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4,
                        num_query_groups=2, vocab_size=1024), (4, 4), 0, 64, 1, 2),
    ("h512-mid", dict(num_layers=8, hidden_size=512, ffn_hidden_size=1792, num_attention_heads=8,
                      num_query_groups=2, vocab_size=8192), (2, 4, 2), 1, 1024, 1, 2),
    ("h256-last", dict(num_layers=6, hidden_size=256, ffn_hidden_size=1024, num_attention_heads=4,
                       num_query_groups=2, vocab_size=16384), (3, 3), 1, 512, 2, 2),
]
CHECK = [
    ("h384-first", dict(num_layers=6, hidden_size=384, ffn_hidden_size=1024, num_attention_heads=6,
                        num_query_groups=2, vocab_size=8192), (2, 4), 0, 256, 4, 2),
    ("h128-mid-m8", dict(num_layers=12, hidden_size=128, ffn_hidden_size=384, num_attention_heads=2,
                         num_query_groups=1, vocab_size=4096), (3, 6, 3), 1, 256, 1, 8),
    ("h768-last", dict(num_layers=4, hidden_size=768, ffn_hidden_size=2048, num_attention_heads=12,
                       num_query_groups=4, vocab_size=32000), (2, 2), 1, 512, 1, 2),
]


def measure(case) -> tuple[float, float, campaign_cost.StageTerms]:
    """(measured seconds, the module's estimate, the stage's terms) of one stage shape."""
    from megatron_hooks.stage_emulation import StageEmulation, run_stage

    name, fields, counts, stage, seq, mbs, m = case
    spec = LlamaSpec(name=name, **fields)
    with tempfile.TemporaryDirectory() as tmp:
        config = StageEmulation(model=spec, layers_per_stage=counts, seq_len=seq, micro_batch_size=mbs,
                                num_microbatches=m, output_dir=Path(tmp))
        gc.collect()
        started = time.perf_counter()
        run_stage(config, stage)
        seconds = time.perf_counter() - started
    terms = campaign_cost.stage_terms(
        spec, seq_len=seq, micro_batch_size=mbs, microbatches=m, layers=counts[stage], first=stage == 0,
        last=stage == len(counts) - 1, in_flight=min(len(counts) - stage, m), tp=1, dtype="float32")
    return seconds, campaign_cost.stage_seconds(terms, THREADS), terms


THREADS = os.cpu_count() or 1


def main() -> None:
    from megatron_hooks.stage_emulation import free_port, process_group, quiet_megatron

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["fit", "check"], default=None)
    args = parser.parse_args()
    quiet_megatron()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"process before any stage: {before / 2**20:.0f} MiB resident (campaign_cost.PROCESS_BYTES: "
          f"{campaign_cost.PROCESS_BYTES / 2**20:.0f} MiB)")
    with process_group(0, 1, free_port(), 1, None):
        gc.freeze()  # as the runner does: the collection between iterations skips torch's own objects
        measure(FIT[1])  # warm-up: first-use costs of torch and megatron-core, not a stage's
        if args.only != "check":
            rows = [(case[0], *measure(case)) for case in FIT]
            matrix = np.array([[terms.flops / THREADS, terms.passes, 1.0] for *_, terms in rows])
            measured = np.array([seconds for _, seconds, _, _ in rows])
            # Non-negative least squares: a negative time per pass or per stage is not a cost (plain
            # least squares gave SECONDS_PER_STAGE = -0.58 s on an idle machine).
            (inverse_rate, per_pass, per_stage), _ = scipy.optimize.nnls(matrix, measured)
            print(f"fit on {len(rows)} shapes: FLOPS_PER_CORE = {1 / inverse_rate:.3g}, SECONDS_PER_PASS = "
                  f"{per_pass:.3g}, SECONDS_PER_STAGE = {per_stage:.3g}")
            for name, seconds, estimate, _ in rows:
                print(f"  fit   {name:12s} measured {seconds:7.2f} s, model (module constants) {estimate:7.2f} s")
        if args.only != "fit":
            for case in CHECK:
                seconds, estimate, _ = measure(case)
                print(f"  check {case[0]:12s} measured {seconds:7.2f} s, estimated {estimate:7.2f} s, "
                      f"ratio {seconds / estimate:.2f}")


if __name__ == "__main__":
    main()
