"""The memory backends: the CPU storage tracker is exact; the CUDA backend reads the right
statistics and is chosen for a model on CUDA."""

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install -e '.[megatron]')")

import torch  # noqa: E402

from megatron_hooks.backends import CpuBackend, CudaBackend, select_backend  # noqa: E402
from megatron_hooks.hooks import LayerMemoryHooks  # noqa: E402
from megatron_support import TINY, batches, tiny_model, train  # noqa: E402
from test_hooks import run_info  # noqa: E402

MIB = 2**20


def test_the_backend_follows_the_device():
    assert isinstance(select_backend("cpu"), CpuBackend)
    cuda = select_backend(torch.device("cuda", 1))  # choosing it touches no CUDA API
    assert isinstance(cuda, CudaBackend) and cuda.name == "cuda" and cuda.device == "cuda:1"
    with pytest.raises(ValueError, match="no memory backend for device type 'meta'"):
        select_backend("meta")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        CudaBackend("cpu")


def test_hooks_choose_the_cpu_backend_for_a_cpu_model(megatron_world):
    assert LayerMemoryHooks(tiny_model()).backend.name == "cpu"
    with pytest.raises(ValueError, match="no megatron-core GPTModel"):
        LayerMemoryHooks(torch.nn.Linear(2, 2))


def test_a_memory_limit_is_an_out_of_memory_error():
    """An emulated 10000-byte device: 8000 bytes fit, 8000 more do not (the failed result is
    dropped, as a failed allocation), and tensors handed to track() count without raising."""
    backend = CpuBackend(memory_limit=10_000)
    earlier = torch.zeros(500, dtype=torch.float64)
    backend.track([earlier])  # 4000 bytes, counted, no error
    backend.start()
    try:
        kept = torch.empty(1000, dtype=torch.float32)
        assert backend.allocated() == 8000
        with pytest.raises(torch.OutOfMemoryError, match="emulated out of memory: .* needs 12000 bytes in all; "
                                                         "the emulated device has 10000"):
            torch.empty(1000, dtype=torch.float32)
        assert backend.allocated() == 8000
        del kept
        torch.empty(1500, dtype=torch.float32)  # 4000 + 6000: at the limit, not above
    finally:
        backend.stop()
    del earlier


def test_the_cpu_tracker_counts_storages_exactly():
    backend = CpuBackend()
    backend.start()
    try:
        base = backend.allocated()
        a = torch.empty(1000, dtype=torch.float32)
        assert backend.allocated() - base == 4000
        views = [a.view(10, 100), a[5:]]  # views allocate nothing
        a.add_(1)  # neither do in-place ops
        assert backend.allocated() - base == 4000
        b = torch.ones(10, dtype=torch.int64) * 3  # ones, then the product: both counted, ones freed
        assert backend.allocated() - base == 4080
        assert backend.peak() - base == 4160
        del a
        assert backend.allocated() - base == 4080  # the view still holds the storage
        del views
        assert backend.allocated() - base == 80
        backend.reset_peak()
        assert backend.peak() == backend.allocated()
        del b
        assert backend.allocated() == base
    finally:
        backend.stop()
    assert torch._C._len_torch_dispatch_stack() == 0
    earlier = torch.zeros(256, dtype=torch.float64)  # made while stopped: counted once tracked
    backend.track([earlier, earlier[1:]])
    assert backend.allocated() - base == 2048
    assert backend.peak_reserved() is None and backend.alloc_retries() is None


class CudaStatsFromCpu:
    """A documented fake of torch.cuda's allocator statistics (CUDA cannot exist here): it
    answers from a CPU storage tracker, reports reserved memory as the allocated peak rounded
    up to 2 MiB segments, and counts one allocation retry per peak reset; its timing events are
    host clock readings. It lets the CUDA backend's code path run end to end through the hooks."""

    def __init__(self, monkeypatch):
        self.cpu = CpuBackend()
        self.resets = 0
        self.events = 0
        for name in ("memory_allocated", "max_memory_allocated", "reset_peak_memory_stats", "max_memory_reserved",
                     "memory_stats", "synchronize", "get_device_name"):
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))
        monkeypatch.setattr(torch.cuda, "Event", self.event)

    def event(self, enable_timing=False):
        assert enable_timing
        self.events += 1
        return HostEvent()

    def memory_allocated(self, device):
        return self.cpu.allocated()

    def max_memory_allocated(self, device):
        return self.cpu.peak()

    def reset_peak_memory_stats(self, device):
        self.resets += 1
        self.cpu.reset_peak()

    def max_memory_reserved(self, device):
        return -(-self.cpu.peak() // (2 * MIB)) * 2 * MIB

    def memory_stats(self, device):
        return {"num_alloc_retries": self.resets}

    def synchronize(self, device=None):
        pass

    def get_device_name(self, device=None):
        return "Fake GPU"


class HostEvent:
    """torch.cuda.Event's two timing methods on the host clock (part of the fake above)."""

    def record(self):
        import time

        self.time = time.perf_counter()

    def elapsed_time(self, end):  # milliseconds, as CUDA events
        return (end.time - self.time) * 1000.0


def test_the_cuda_backend_path_through_the_hooks(megatron_world, monkeypatch, tmp_path):
    """Same model, same data: the CUDA backend (on faked statistics) reports the peaks that the
    CPU backend measures, plus the reserved peak and the retries of each iteration."""
    from advisor.profiles import load_run
    from megatron_hooks.recorder import ProfileRecorder

    data = batches(4)

    def profile(backend, directory, tracker):
        tracker.track(t for batch in data for t in batch)  # the data set, as allocated before training
        model = tiny_model()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        with LayerMemoryHooks(model, optimizer=optimizer, backend=backend) as hooks:
            recorder = ProfileRecorder(hooks, run_info(), directory).start()
            train(model, optimizer, data, recorder=recorder)
            recorder.finish()
        return load_run(directory).ranks[0]

    warm = CpuBackend()
    profile(warm, tmp_path / "warm-up", warm)  # megatron's global attention buffer, allocated once
    cpu = CpuBackend()
    on_cpu = profile(cpu, tmp_path / "cpu", cpu)
    fake = CudaStatsFromCpu(monkeypatch)
    fake.cpu.start()
    try:
        on_cuda = profile(CudaBackend("cuda:0"), tmp_path / "cuda", fake.cpu)
    finally:
        fake.cpu.stop()
    assert on_cuda.header.backend == "cuda" and on_cuda.header.device == "cuda:0 (Fake GPU)"
    for cpu, cuda in zip(on_cpu.iterations, on_cuda.iterations, strict=True):
        # The fake also sees small tensors that the model made when it was built (not parameters
        # or buffers), which the CPU backend, starting at the iteration, does not.
        assert abs(cpu.peak_allocated_bytes - cuda.peak_allocated_bytes) <= 1024
        assert cuda.peak_reserved_bytes == -(-cuda.peak_allocated_bytes // (2 * MIB)) * 2 * MIB
        # One reset per region entry after the iteration began: 2 microbatches x (6 forward +
        # 6 backward regions).
        assert cuda.alloc_retries == 2 * 12
        assert cpu.peak_reserved_bytes is None and cpu.alloc_retries is None
    assert [r.forward_peak_bytes for r in on_cpu.layers] == [r.forward_peak_bytes for r in on_cuda.layers]
    assert [r.backward_peak_bytes for r in on_cpu.layers] == [r.backward_peak_bytes for r in on_cuda.layers]
    assert TINY.num_layers == len(on_cuda.header.stage_layers)
    # Times: two events per region interval (2 iterations x 2 microbatches x 12 intervals), and
    # every region has a positive forward and backward time on both backends.
    assert fake.events == 2 * 2 * 2 * 12
    for profile in (on_cpu, on_cuda):
        assert all(r.forward_time_s > 0 and r.backward_time_s > 0 for r in profile.layers)
    assert on_cuda.header.kernels == "cuda" and on_cpu.header.kernels == "cpu"
