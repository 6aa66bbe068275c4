"""What Megatron-LM's pipeline schedules keep in flight: microbatches whose activations a
pipeline rank holds at its peak, per model chunk.

Counted in *forward passes of one model chunk* (a chunk is 1/v of a rank's layers under
interleaving, the whole rank without it). The peak comes just after the last warm-up forward
pass and the first steady-state one, before the first backward pass frees anything
(megatron/core/pipeline_parallel/schedules.py, ``get_pp_rank_microbatches``):

- 1F1B (v = 1): rank i of p runs p - i - 1 warm-up forwards, so it holds F = p - i
  microbatches (seed 004, Section 3.2.2), at most the m that exist.
- Interleaved (v > 1): 2(p - i - 1) + (v - 1)p warm-up forwards, F = that + 1, at most m v.
  Forward pass s runs chunk (s // p) mod v (``get_schedule_table``: groups of p microbatches,
  every chunk in turn; Megatron requires m to be a multiple of p, so every group is full).

Every function takes numpy arrays (or ints) and broadcasts, so one call prices thousands of
layouts. With a rank's layers split as evenly as possible over its chunks and the remainder on
its *last* chunks (the rule ``megatron_args.chunk_layers`` writes), the warm-up peak is the
rank's highest activation level for the whole iteration: the steady state's forward of a chunk
is always matched by a backward of a chunk at least as large (checked against an event-by-event
simulation of Megatron's order in ``tests/test_schedule.py``). Remainders on the first chunks
would not have this property.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def forward_passes_in_flight(stage, pp, vpp, num_microbatches):
    """F: chunk forward passes the rank holds at its peak (see the module docstring)."""
    stage, pp, vpp = np.asarray(stage), np.asarray(pp), np.asarray(vpp)
    interleaved = 2 * (pp - stage - 1) + (vpp - 1) * pp + 1
    warm = np.where(vpp == 1, pp - stage, interleaved)
    return np.minimum(warm, np.asarray(num_microbatches, dtype=float) * vpp)


@dataclass(frozen=True, slots=True)
class InFlight:
    """The forward passes in flight of pipeline ranks at their peak, by chunk (arrays)."""

    pp: np.ndarray
    vpp: np.ndarray
    passes: np.ndarray
    """F, all chunks together."""
    rounds: np.ndarray
    """Whole rounds of v x p passes: each gives every chunk p."""
    rest: np.ndarray
    """E < v x p passes after them: chunks 0, 1, ... get p each, chunk E // p gets E mod p."""
    filled: np.ndarray
    """E // p: the chunks that got p passes of the rest (``last_chunks`` asks for it at every
    call; a float floor division is many times slower than the sums around it)."""

    @classmethod
    def at(cls, stage, pp, vpp, num_microbatches) -> InFlight:
        pp, vpp = np.asarray(pp), np.asarray(vpp)
        passes = forward_passes_in_flight(stage, pp, vpp, num_microbatches)
        # np.divmod and // of whole numbers as a division and its floor: exact below 2^53 (the
        # rounded quotient cannot cross a whole number), and several times faster (numpy computes
        # a float floor division as a divmod)
        rounds = np.floor(passes / (vpp * pp))
        rest = passes - rounds * (vpp * pp)
        return cls(pp=pp, vpp=vpp, passes=passes, rounds=rounds, rest=rest, filled=np.floor(rest / pp))

    def first_chunk(self):
        """phi_0: passes of the first chunk (the embedding lives there on rank 0)."""
        return self.rounds * self.pp + np.minimum(self.rest, self.pp)

    def last_chunks(self, chunks):
        """R_r: passes of the rank's last ``chunks`` chunks together (r of v)."""
        pp, chunks, filled = self.pp, np.asarray(chunks), self.filled  # chunks 0 .. filled - 1 got p passes of the rest
        first = self.vpp - chunks  # the first of the last r chunks
        partial = np.where(first <= filled, self.rest - filled * pp, 0)
        return chunks * self.rounds * pp + np.maximum(filled - first, 0) * pp + partial


# --- the order itself, and a timeline of it (the report draws it) ---------------------------


@dataclass(frozen=True, slots=True)
class Slot:
    """One chunk forward ('F') or backward ('B') pass of one microbatch on one pipeline rank."""

    rank: int
    kind: str
    microbatch: int
    chunk: int
    start: float
    end: float


def warmup_passes(rank: int, pp: int, vpp: int, num_microbatches: int) -> int:
    """Forward passes rank ``rank`` runs before its first backward (``get_pp_rank_microbatches``)."""
    warm = pp - rank - 1 if vpp == 1 else 2 * (pp - rank - 1) + (vpp - 1) * pp
    return min(warm, num_microbatches * vpp)


def megatron_order(rank: int, pp: int, vpp: int, num_microbatches: int) -> list[tuple[str, int, int]]:
    """The passes of one rank in Megatron-LM's order, as (kind, microbatch, chunk): the forwards in
    ``get_schedule_table``'s order (groups of PP microbatches, every chunk in turn), the backwards
    in the same order with the chunks reversed; warm-up forwards, then one forward and one
    backward per step, then the cool-down backwards (megatron/core/pipeline_parallel/schedules.py)."""
    m, v = num_microbatches, vpp
    table = [(mb, chunk) for low in range(0, m, pp) for chunk in range(v) for mb in range(low, min(low + pp, m))]
    forward = [("F", mb, chunk) for mb, chunk in table]
    backward = [("B", mb, v - 1 - chunk) for mb, chunk in table]
    warm = warmup_passes(rank, pp, v, m)
    order = forward[:warm]
    for step in range(len(table) - warm):
        order += [forward[warm + step], backward[step]]
    return order + backward[len(table) - warm:]


def _after(kind: str, mb: int, chunk: int, rank: int, pp: int, vpp: int) -> tuple | None:
    """The pass another rank must finish first: the activation from the previous stage (forward)
    or the gradient from the next one (backward); the model's last chunk turns around itself."""
    if kind == "F":
        if rank > 0:
            return ("F", mb, chunk, rank - 1)
        return ("F", mb, chunk - 1, pp - 1) if chunk > 0 else None
    if rank < pp - 1:
        return ("B", mb, chunk, rank + 1)
    return ("B", mb, chunk + 1, 0) if chunk < vpp - 1 else ("F", mb, chunk, rank)


def timeline(pp: int, vpp: int, num_microbatches: int, forward, backward) -> list[Slot]:
    """Every pass of every rank with its start and end, each rank running ``megatron_order`` and
    each pass waiting for the pass it depends on (``forward[r]``, ``backward[r]``: rank r's time
    for one chunk pass; communication is inside them, as in the time model's stage times)."""
    orders = [megatron_order(r, pp, vpp, num_microbatches) for r in range(pp)]
    done: dict[tuple, float] = {}
    slots: list[Slot] = []
    position, free = [0] * pp, [0.0] * pp
    remaining = sum(len(order) for order in orders)
    while remaining:
        progressed = False
        for r in range(pp):
            while position[r] < len(orders[r]):
                kind, mb, chunk = orders[r][position[r]]
                need = _after(kind, mb, chunk, r, pp, vpp)
                if need is not None and need not in done:
                    break
                start = max(free[r], done.get(need, 0.0))
                end = start + (forward[r] if kind == "F" else backward[r])
                done[(kind, mb, chunk, r)] = free[r] = end
                slots.append(Slot(r, kind, mb, chunk, start, end))
                position[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("pipeline order deadlocked")  # Megatron's order never does
    return slots
