"""The words of a sweep or estimate that did not fit, dense and MoE alike: what the model states
alone need, whether a larger GPU preset would hold them, and the time lines of a layout that would
not run; and the stage table's line on fractional microbatches in flight (dense and MoE alike)."""

from __future__ import annotations


def states_text(states_gib: float, mem: float) -> str:
    """The clause of a nothing-fits line (dense or MoE) where no layout's model states alone fit
    the memory: the least layout's states, and that no --seq-len changes them."""
    return (f", and its weights, gradients and optimizer states alone need {states_gib:.1f} GiB (more than "
            f"{mem:g} GiB in every layout, whatever the --seq-len)")


def bigger_gpu(states_gib: float, mem: float) -> bool:
    """Whether a GPU preset has room for model states of ``states_gib`` that ``mem`` has not."""
    from advisor.hardware import load_gpus

    return max(gpu.memory_gib for gpu in load_gpus().values()) > max(states_gib, mem)


def if_it_fit(verdict: str | None) -> str:
    """The prefix of an estimate's time lines (dense or MoE): a layout judged oom or likely oom
    would not run, so its step time, throughput and days are what it would take if it fit."""
    return "if it fit: " if verdict in ("oom", "likely oom") else ""


def unpinned(names) -> list[str]:
    """The hint to search the dimensions the user pinned (``advisor.parallel.Pinned``'s, and an
    MoE sweep's VPP, EP and ETP), by option name: 'no --tp/--pp', or none."""
    flags = "/".join(f"--{name}" for name in names)
    return [f"no {flags}"] if flags else []


IN_FLIGHT_FORMAT = ".4g"
"""The stage tables' 'in flight' cells: an interleaved rank's count is its forward chunk passes
over VPP (``advisor.schedule``), so a third or a fifth of a microbatch: 20.33, not 20.3333."""


def in_flight_note(stages: list[dict]) -> str | None:
    """The caption line that explains fractional microbatches in flight (interleaved schedules),
    for the dense and the MoE stage tables alike; None where every count is whole."""
    if not any(stage["in_flight_microbatches"] % 1 for stage in stages):
        return None
    return ("in flight: microbatches' worth of a rank's layers held at its peak; interleaved, its model "
            "chunks hold different counts (forward chunk passes / VPP, docs/estimator.md)")
