"""What the one-GPU measurement scripts of this folder share: their command line (an output
folder, the device, a shrunken quick check, a deadline) and their refusal to start.

Each script is run as ``python benchmarks/gpu/<script>.py OUT``, so this folder is on its path."""

from __future__ import annotations

import argparse
from pathlib import Path


def positive_number(text: str) -> float:
    """A number of seconds above 0 and at most an hour."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 3600, got {text}")
    return value


def parser(doc: str, *, deadline_s: float, device_help: str, tiny_help: str) -> argparse.ArgumentParser:
    """The shared arguments: OUT, --device, --tiny, --deadline; a bad one is one ``Error:`` line
    and exit status 2, not the usage first."""
    made = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    made.error = lambda message: made.exit(2, f"Error: {message}\n")
    made.add_argument("out", type=Path, help="directory for the results (created; must not hold results)")
    made.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help=device_help)
    made.add_argument("--tiny", action="store_true", help=tiny_help)
    made.add_argument("--deadline", type=positive_number, default=deadline_s,
                      help="seconds from the start after which parts not started are skipped")
    return made


def start(args: argparse.Namespace):
    """torch, imported for ``args.device`` (a CPU run hides any GPU first: the cpu backend's gloo
    rank and CPU shim, even on a GPU machine), with warnings and Megatron's logging quieted; None
    after one ``Error:`` line where the run cannot start (``refusal``)."""
    import os
    import sys
    import warnings

    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    warnings.filterwarnings("ignore")
    import torch

    if problem := refusal(args, torch):
        print(f"Error: {problem}", file=sys.stderr)
        return None
    from megatron_hooks.stage_emulation import quiet_megatron

    quiet_megatron()
    return torch


def refusal(args: argparse.Namespace, torch) -> str | None:
    """Why the run cannot start (no GPU for --device cuda, OUT not a folder it can make, or OUT
    already holds results), or None."""
    if args.device == "cuda" and not torch.cuda.is_available():
        return "no CUDA device: use --device cpu"
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"{args.out}: {exc.strerror or exc}"
    return f"{args.out} is not empty" if any(args.out.iterdir()) else None


def sample_seconds(fn, device: str, repeats: int, warmups: int) -> list[float]:
    """Seconds of each of ``repeats`` runs of ``fn`` after ``warmups`` untimed ones: between two CUDA
    events on a GPU (the GPU idle at the start), with time.perf_counter on the CPU."""
    import time

    import torch

    for _ in range(warmups):
        fn()
    samples = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            began = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - began)
    return samples
