"""The CPU tracker and collectives: what made test_tp2_halves_everything_megatron_splits flaky.

gloo's worker thread keeps the tensors of a collective alive until its work object dies, which may
be after the program has dropped them; the CPU tracker counted them until then, so the bytes
depended on thread scheduling (two TP ranks 256 bytes apart, campaign runs up to 64 KiB apart).
The tracker now lends collectives untracked copies (megatron_hooks/backends.py)."""

import threading

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install -e '.[megatron]')")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from megatron_hooks.backends import CpuBackend, _StorageTracker  # noqa: E402


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
    release = _StorageTracker._release

    def recording(self, key, nbytes):
        inner = release(self, key, nbytes)

        def callback(ref):
            threads.append(threading.current_thread() is threading.main_thread())
            inner(ref)
        return callback

    monkeypatch.setattr(_StorageTracker, "_release", recording)
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
