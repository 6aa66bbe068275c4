"""The CPU tracker and collectives: what made test_tp2_halves_everything_megatron_splits flaky.

gloo's worker thread keeps the tensors of a collective alive until its work object dies, which may
be after the program has dropped them; the CPU tracker counted them until then, so the bytes
depended on thread scheduling (two TP ranks 256 bytes apart, campaign runs up to 64 KiB apart).
The tracker now lends collectives untracked copies (megatron_hooks/backends.py)."""

import os
import sys
import threading

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install -e '.[megatron]')")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from two_ranks import run_two_ranks  # noqa: E402

from megatron_hooks.backends import CpuBackend, StorageTracker  # noqa: E402


def test_a_collective_keeps_no_tracked_storage_alive(megatron_world):
    backend = CpuBackend()
    backend.start()
    try:
        before = backend.allocated()
        tensor = torch.full((1024,), 3.0)  # 4 KiB, made while tracking: counted
        assert backend.allocated() == before + 4096
        work = dist.all_reduce(tensor, async_op=True)
        work.wait()
        assert torch.equal(tensor, torch.full((1024,), 3.0))  # the result is in the caller's tensor
        del tensor  # the program is done with it; the work object is not gone yet
        # Deterministic: before the fix the work held the storage here, and the count stayed up
        # until gloo's thread dropped it.
        assert backend.allocated() == before
        del work
    finally:
        backend.stop()


def test_collective_results_and_async_handles(megatron_world):
    backend = CpuBackend()
    backend.start()
    try:
        tensor = torch.arange(8.0)
        gathered = torch.empty(8)
        dist.all_gather_into_tensor(gathered, tensor)
        assert torch.equal(gathered, torch.arange(8.0))
        handle = dist.all_reduce(tensor, op=dist.ReduceOp.MAX, async_op=True)
        handle.wait()
        assert torch.equal(tensor, torch.arange(8.0))
    finally:
        backend.stop()


def test_no_tracked_storage_is_released_off_the_main_thread(megatron_world, monkeypatch):
    """Every release of a counted storage happens in the thread that runs the program."""
    threads = []
    release = StorageTracker._release

    def recording(self, key, nbytes):
        inner = release(self, key, nbytes)

        def callback(ref):
            threads.append(threading.current_thread() is threading.main_thread())
            inner(ref)
        return callback

    monkeypatch.setattr(StorageTracker, "_release", recording)
    backend = CpuBackend()
    backend.start()
    try:
        for _ in range(50):
            tensor = torch.ones(4096) * 2  # a fresh storage each time
            dist.all_reduce(tensor)
            del tensor
    finally:
        backend.stop()
    assert len(threads) >= 50 and all(threads)


def _pipeline_pair(rank: int, init_file: str) -> None:
    """One of two pipeline stages: stage 0 sends a microbatch forward and receives its gradient
    back, as megatron-core's 1F1B does, once with isend/irecv and once with batch_isend_irecv,
    all under the tracker. Exits 0 when every message arrived intact."""
    os.environ["OMP_NUM_THREADS"] = "1"
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    backend = CpuBackend()
    backend.start()
    try:
        peer = 1 - rank
        sent = torch.full((32, 1, 64), float(rank + 1), dtype=torch.bfloat16)
        received = torch.empty_like(sent)
        if rank == 0:  # forward out, gradient back
            works = [dist.isend(sent, peer), dist.irecv(received, peer)]
        else:
            works = [dist.irecv(received, peer), dist.isend(sent, peer)]
        for work in works:
            work.wait()  # the caller's wait, after the tracker saw the op: hung before the fix
        assert torch.all(received == peer + 1)
        received.zero_()
        ops = [dist.P2POp(dist.isend, sent, peer), dist.P2POp(dist.irecv, received, peer)]
        for work in dist.batch_isend_irecv(ops if rank == 0 else ops[::-1]):
            work.wait()
        assert torch.all(received == peer + 1)
    finally:
        backend.stop()
        dist.destroy_process_group()
    sys.exit(0)


def test_point_to_point_under_the_tracker_completes(tmp_path):
    """Pipeline parallelism's sends and receives pass through the tracker: gloo counts completions
    on a point-to-point work, so waiting for it in the tracker and again in the caller deadlocked
    every PP >= 2 profiled run (two real processes here, over gloo)."""
    run_two_ranks(_pipeline_pair, __name__, str(tmp_path / "init"), what="a pipeline stage")
