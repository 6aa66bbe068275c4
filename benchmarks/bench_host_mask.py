"""CPU time per element of the s x s attention mask that Megatron's data loader builds per sample.

The prior of ``Calibration.host_mask_ns_per_element``: Megatron-LM's own
``megatron/core/datasets/gpt_dataset.py:_get_ltor_masks_and_position_ids`` (read from the
checkout, not copied), with --reset-position-ids --reset-attention-mask as the paper's runs, on
one thread as in a DataLoader worker, for sequence lengths 2048-8192 with and without document
ends. Reported: nanoseconds per s^2 element (the best of 3 per case), and the time this gives
per sample at 32K with Megatron's 2 loader workers.

    python benchmarks/bench_host_mask.py --megatron-lm CHECKOUT   (or $MEGATRON_LM)
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

def load_function(checkout: Path):
    """The function's source from the checkout, executed alone (importing megatron.core.datasets
    would need the compiled dataset helpers)."""
    import torch

    source = (checkout / "megatron" / "core" / "datasets" / "gpt_dataset.py").read_text()
    start = source.index("def _get_ltor_masks_and_position_ids")
    end = source.index("\nclass ", start)
    namespace = {"torch": torch}
    exec(compile(source[start:end], "gpt_dataset.py", "exec"), namespace)
    return namespace["_get_ltor_masks_and_position_ids"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megatron-lm", type=Path, default=os.environ.get("MEGATRON_LM"),
                        help="a Megatron-LM checkout (default: $MEGATRON_LM)")
    args = parser.parse_args()
    if args.megatron_lm is None or not (Path(args.megatron_lm) / "megatron" / "core").is_dir():
        parser.error("give --megatron-lm CHECKOUT (a Megatron-LM checkout) or set MEGATRON_LM")
    args.megatron_lm = Path(args.megatron_lm)
    import torch

    torch.set_num_threads(1)
    build = load_function(args.megatron_lm)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, torch {torch.__version__}; checkout {args.megatron_lm}")
    per_element = []
    for seq in (2048, 4096, 8192):
        for documents in (1, 5):
            tokens = torch.randint(1, 1000, (seq,))
            if documents > 1:
                tokens[torch.linspace(0, seq - 1, documents + 1)[1:-1].long()] = 0
            best = min(_timed(build, tokens) for _ in range(3))
            per_element.append(best / seq**2)
            print(f"s = {seq:5d}, {documents} document(s): {best * 1e3:8.1f} ms, {1e9 * best / seq**2:.2f} ns per element")
    typical = statistics.median(per_element[2:])  # s >= 4096: past the cache-resident sizes
    print(f"median (s >= 4096): {1e9 * typical:.2f} ns per element; at s = 32768 with 2 workers: "
          f"{typical * 32768**2 / 2:.2f} s per sample")
    return 0


def _timed(build, tokens) -> float:
    start = time.perf_counter()
    build(tokens, 0, True, True, False, True)
    return time.perf_counter() - start


if __name__ == "__main__":
    sys.exit(main())
