"""The pipeline-stage emulator: 1F1B order, per-stage records, TP and DP in real gloo processes."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install -e '.[megatron]')")

from advisor import equations as eq  # noqa: E402
from advisor.profiles import load_run  # noqa: E402
from conftest import ROOT, Invoker  # noqa: E402
from megatron_hooks.stage_emulation import (  # noqa: E402
    StageEmulation, emulate_stages, free_port, intra_op_threads, one_f_one_b)
from megatron_hooks.emulate import main as emulate_main  # noqa: E402
from megatron_hooks.static import storage_key  # noqa: E402
from megatron_support import MBS, SEQ, TINY  # noqa: E402

FP32 = 4
TINY_FLAGS = ["--threads", "1", "--model", "llama3.1-8b", "--num-layers", "4", "--hidden-size", "64", "--ffn-hidden-size", "128",
              "--num-attention-heads", "4", "--num-query-groups", "2", "--vocab-size", "256"]


@pytest.mark.parametrize("stages,microbatches", [(3, 4), (4, 2), (1, 3), (5, 5)])
def test_one_f_one_b_holds_min_p_minus_i_m_microbatches(stages, microbatches):
    for stage in range(stages):
        order = one_f_one_b(stage, stages, microbatches)
        assert sorted(order) == sorted([("F", k) for k in range(microbatches)] + [("B", k) for k in range(microbatches)])
        in_flight, most, backwards = 0, 0, []
        for kind, k in order:
            in_flight += 1 if kind == "F" else -1
            most = max(most, in_flight)
            if kind == "B":
                backwards.append(k)
                assert ("F", k) in order[: order.index(("B", k))]
        assert backwards == list(range(microbatches))  # first in, first out
        assert most == min(stages - stage, microbatches)
    # Seed 004 / MadPipe's 1F1B for the first of 3 stages, 4 microbatches:
    assert one_f_one_b(0, 3, 4) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1), ("B", 2), ("B", 3)]


@pytest.mark.parametrize("omp, threads, world, expected", [
    (None, None, 2, max(1, (os.cpu_count() or 1) // 2)),  # nothing set: the cores shared over the ranks
    ("3", None, 2, 3),  # the user's OMP_NUM_THREADS, which torch.set_num_threads would otherwise override
    ("3,2", None, 2, 3),  # libgomp's nested levels: the outer one
    ("3", 5, 2, 5),  # --threads beats the environment
    ("0", None, 1, max(1, os.cpu_count() or 1)),  # not a thread count: ignored, as libgomp ignores it
    ("many", None, 1, max(1, os.cpu_count() or 1)),
])
def test_intra_op_threads_honour_the_users_setting(monkeypatch, omp, threads, world, expected):
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    assert intra_op_threads(threads, world) == expected


def test_a_free_port_is_below_the_kernels_ephemeral_range(monkeypatch, tmp_path):
    """free_port's pick is bindable on every interface and below the range the kernel gives outgoing
    connections (a port 0 pick was taken by another test's connection before the spawned
    emulation's store bound it: EADDRINUSE in CI); a taken port is skipped; a range with none
    below it falls back to the kernel's pick."""
    import random
    import socket

    from megatron_hooks import stage_emulation

    ports = [free_port() for _ in range(20)]
    low = stage_emulation._ephemeral_low()
    assert all(max(1024, low // 2) <= port < low for port in ports)
    with socket.socket() as taken:
        taken.bind(("", ports[0]))
        taken.listen()
        monkeypatch.setattr(random, "sample", lambda population, k: [ports[0], ports[1]])
        assert free_port() == ports[1]
    monkeypatch.undo()  # random.sample as it was
    (tmp_path / "range").write_text("1024\t65535\n")  # nothing below it but the privileged ports
    monkeypatch.setattr(stage_emulation, "EPHEMERAL_PORTS", tmp_path / "range")
    assert free_port() >= low  # the kernel's pick, from its real range


def test_emulated_pipeline_stages_follow_1f1b(tmp_path):
    """Every stage of an uneven 3-stage split, through the module entry point. Stage i holds
    min(p - i, m) microbatches: the hooks count them, and the stage's peak memory above its
    static memory is that many microbatches' activations plus a transient below one more."""
    out = tmp_path / "pipeline"
    command = [sys.executable, "-m", "megatron_hooks.emulate", *TINY_FLAGS, "--layers-per-stage", "1,2,1",
               "--seq-len", str(SEQ), "--mbs", str(MBS), "--num-microbatches", "4", "--out", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    run = load_run(out)
    assert run.status == "ok" and len(run.ranks) == 3 and len({r.header.run_id for r in run.ranks}) == 1
    for stage, rank in enumerate(run.ranks):
        header = rank.header
        assert header.emulated and header.coords["pp"] == stage and header.rank == stage and header.world_size == 3
        assert header.stage_layers == [(1,), (2, 3), (4,)][stage]
        assert (header.first_stage, header.last_stage) == (stage == 0, stage == 2)
        assert header.in_flight_microbatches == min(3 - stage, 4)
        last = rank.iterations[-1]
        activations = sum(layer.activation_bytes for layer in rank.layers_of(last.iteration))
        held = (last.peak_allocated_bytes - last.static_bytes) / activations
        assert header.in_flight_microbatches <= held < header.in_flight_microbatches + 1, stage
        assert (last.loss is not None) == (stage == 2)
    assert run.ranks[0].header.in_flight_microbatches == 3  # the first stage holds p microbatches


def test_a_stage_keeps_its_gradients_and_steps_in_place(megatron_world, tmp_path):
    """As on a Megatron rank (DDP's gradient buffer, a fused Adam): every gradient exists from the
    start, keeps its storage through the iterations, and the optimizer is torch's fused Adam."""
    from megatron_hooks.stage_emulation import _Stage

    config = StageEmulation(model=TINY, layers_per_stage=(2, 2), seq_len=SEQ, micro_batch_size=MBS,
                            num_microbatches=2, output_dir=tmp_path)
    stage = _Stage(config, 0)
    params = list(stage.model.parameters())
    assert all(p.grad is not None and p.grad.shape == p.shape and not p.grad.any() for p in params)
    storages = [storage_key(p.grad) for p in params]
    for _ in range(2):
        stage.iteration()
    assert [storage_key(p.grad) for p in params] == storages
    assert any(p.grad.any() for p in params)
    assert stage.optimizer.defaults["fused"] is True


def test_the_local_attentions_global_memory_buffer_is_in_the_stage_peak_to_the_byte(megatron_world, tmp_path,
                                                                                     monkeypatch):
    """megatron-core's DotProductAttention (the local spec the emulator builds) takes its score
    product's input from the process's global memory buffer and keeps it: the emulator starts each
    stage with none (as a fresh Megatron rank), so the stage's peak carries it from iteration 1 on
    (on the CPU backend here; the symbolic backend equals it byte for byte, tests/test_symbolic.py).
    Measured: the same stage run again in a process that kept the buffer (its clear() made a no-op)
    peaks lower by exactly the buffer in every iteration, b x a/t x s^2 FP32 elements = 2 x 4 x 32^2
    x 4 = 32,768 bytes, which the advisor prices (equations.local_attention_buffer_bytes, in
    StageModel's layer activations) and ``profile show`` adds to the stage's peak alone: no layer
    keeps it (iteration 1's first layer has it in its forward peak, where it is allocated)."""
    import torch
    from megatron.core import parallel_state

    from advisor.memory import MemoryOptions
    from advisor.profile_report import compare_rank
    from advisor.stage_model import StageModel
    from megatron_hooks.stage_emulation import _run_stage

    class Kept(dict):
        def clear(self) -> None:  # _run_stage clears the buffer before and after a stage: keep it
            pass

    buffer = parallel_state.get_global_memory_buffer()
    monkeypatch.setattr(buffer, "buffer", Kept())
    runs = {}
    for name in ("fresh", "kept"):
        config = StageEmulation(model=TINY, layers_per_stage=(2, 2), seq_len=SEQ, micro_batch_size=MBS,
                                num_microbatches=2, output_dir=tmp_path / name)
        _run_stage(config, 0, None)
        runs[name] = load_run(tmp_path / name).ranks[0]
    hand = MBS * TINY.num_attention_heads * SEQ**2 * FP32
    assert hand == 2 * 4 * 32**2 * 4 == 32_768
    # one buffer, the attention's (its name, the activations' dtype), of b a/t s^2 elements
    assert [(key, tensor.numel() * tensor.element_size()) for key, tensor in buffer.buffer.items()] == [
        (("mpu", torch.float32), hand)]
    fresh, kept = runs["fresh"], runs["kept"]
    assert [a.peak_allocated_bytes - b.peak_allocated_bytes for a, b in zip(fresh.iterations, kept.iterations)] \
        == [hand] * len(fresh.iterations) == [hand, hand]
    assert [r.activation_bytes for r in fresh.layers] == [r.activation_bytes for r in kept.layers]
    options = MemoryOptions(fused_norms=False, flash_attention=False, sequence_parallel=False, element_bytes=FP32)
    model = StageModel(TINY, SEQ, options, tp=1, cp=1, dp=1, mbs=MBS, pp=2, vpp=1, num_microbatches=2, stage=0)
    assert model.attention_buffer == hand
    rows = {row.term: row for row in compare_rank(fresh) if row.module == "stage"}
    parts = sum(rows[term].estimated_bytes for term in ("weights", "gradients", "optimizer", "activations in flight"))
    assert rows["peak"].estimated_bytes - parts == hand
    assert [reason.key for reason in rows["peak"].reasons] == ["local-buffer"]  # said under profile show's table


def test_tp2_halves_everything_megatron_splits(tmp_path):
    """TP = 2 in two gloo processes: per rank, each layer holds half the weights except the
    replicated RMSNorms, and half the activations except what precedes the split (the norms)."""
    config = StageEmulation(model=TINY, layers_per_stage=(4,), seq_len=SEQ, micro_batch_size=MBS,
                            num_microbatches=2, tp=2, threads=1, output_dir=tmp_path)
    assert [p.name for p in emulate_stages(config)] == ["rank00000.jsonl", "rank00001.jsonl"]
    run = load_run(tmp_path)
    assert [r.header.coords["tp"] for r in run.ranks] == [0, 1]
    s, b, h, a, v, ffn = SEQ, MBS, TINY.hidden_size, TINY.num_attention_heads, TINY.vocab_size, TINY.ffn_hidden_size
    norms = eq.layer_norm_parameters(TINY)
    for rank in run.ranks:
        layers = rank.layers_of(2)
        assert len(layers) == 6
        for layer in layers:
            if layer.kind == "decoder":
                replicated = eq.layer_parameters(TINY)
                assert layer.parameter_bytes == ((replicated - norms) / 2 + norms) * FP32
                assert layer.parameter_bytes == eq.layer_parameters(TINY, tp=2) * FP32
                # The hand count of test_hooks with Q, K, V, the context, the scores and the
                # SwiGLU tensors halved; the two norms' 6 sbh and 2 sb, and RoPE's cos/sin, whole.
                elements = (6 + 4 / 2) * s * b * h + 2 * s * b + 4 * s * (h // a) + a / 2 * b * s * s + 5 / 2 * s * b * ffn
                assert layer.activation_bytes == elements * FP32 + (s * s if layer.layer_number == 1 else 0)
            elif layer.kind == "embedding":
                assert layer.parameter_bytes == h * v / 2 * FP32
                assert layer.activation_bytes == 8 * s * b + s * b  # masked int64 ids, bool out-of-range mask
            else:
                assert layer.parameter_bytes == (h * v / 2 + h) * FP32
                assert layer.activation_bytes == (3 * s * b * h + s * b + s * b * v / 2) * FP32 + s * b + 8 * s * b
    first, second = ([(it.peak_allocated_bytes, it.loss) for it in rank.iterations] for rank in run.ranks)
    assert first == second and len(first) == 2  # the two TP ranks hold and compute the same


def test_dp2_under_torchrun(tmp_path):
    """DP = 2 through torchrun and the module entry point: two ranks, one run, unsharded Adam."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
               str(free_port()), "-m", "megatron_hooks.emulate", *TINY_FLAGS, "--layers-per-stage", "2,2",
               "--stage", "1", "--seq-len", str(SEQ), "--mbs", str(MBS), "--num-microbatches", "2", "--dp", "2",
               "--iterations", "1", "--run-id", "dp-test", "--out", str(tmp_path)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    run = load_run(tmp_path)
    # Stage 1 of 2 with DP 2: global ranks 2 and 3 (Megatron's order tp, cp, dp, pp).
    assert [(r.header.rank, r.header.coords["dp"], r.header.world_size) for r in run.ranks] == [(2, 0, 4), (3, 1, 4)]
    for rank in run.ranks:
        assert rank.header.stage_layers == (3, 4) and rank.header.parallel.dp == 2
        assert rank.header.global_batch_size == 2 * MBS * 2
        output = rank.layers_of(1)[-1]
        assert output.optimizer_bytes == 2 * output.parameter_bytes + 4 * 2  # replicated Adam
    assert run.ranks[0].iterations[0].loss != run.ranks[1].iterations[0].loss  # each DP rank its own data


@pytest.fixture
def emulate():
    return Invoker(emulate_main)


@pytest.mark.parametrize("args,message", [
    (["--layers-per-stage", "2,1"], "layers per stage 2,1 sum to 3, but the model has 4 layers"),
    (["--layers-per-stage", "1x4000"], "layers per stage 1x4000 sum to 4000, but the model has 4 layers"),  # not 4000 1s
    (["--layers-per-stage", "2,x"], "expected comma-separated layer counts"),
    (["--layers-per-stage", "4,0"], "layers per stage must be positive integers"),
    (["--layers-per-stage", "2,2", "--stage", "2"], "stage 2 is not in a pipeline of 2 stages (0..1)"),
    (["--layers-per-stage", "4", "--tp", "3"], "TP 3 does not divide the attention heads (4)"),
])
def test_bad_emulation_input_is_one_line_and_exit_2(emulate, tmp_path, args, message):
    line = emulate.error(*TINY_FLAGS, "--seq-len", "8", "--out", tmp_path / "out", *args)
    assert message in line


def test_bad_model_file(emulate, tmp_path):
    line = emulate.error("--model", tmp_path / "missing.json", "--layers-per-stage", "1", "--seq-len", "8",
                         "--out", tmp_path)
    assert "missing.json: no such file" in line


def test_a_failed_worker_is_one_line_and_exit_1(emulate, tmp_path, monkeypatch):
    """Not bad input: a worker died. The fake: emulate_stages raising what torch.multiprocessing
    raises when a worker does (a real out-of-memory cannot be provoked safely)."""
    from torch.multiprocessing import ProcessRaisedException

    import megatron_hooks.stage_emulation

    def dies(config, stages):
        raise ProcessRaisedException("Traceback ...\ntorch.OutOfMemoryError: simulated", 0, 4321)

    monkeypatch.setattr(megatron_hooks.stage_emulation, "emulate_stages", dies)
    result = emulate(*TINY_FLAGS, "--layers-per-stage", "4", "--seq-len", "8", "--out", tmp_path, expect=1)
    assert result.stderr.strip() == (f"Error: an emulation process failed: torch.OutOfMemoryError: simulated "
                                     f"(see the rank files in {tmp_path})")
