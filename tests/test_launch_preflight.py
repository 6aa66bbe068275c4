"""The preflight (launch/preflight.py): deliberately broken setups, each refused before any rank
starts with its problem on one line and exit status 2; several problems are listed at once.

Real checkouts (shared/megatron-lm), real files and directories. Two doubles, for what cannot
exist here: a stand-in ``nvidia-smi`` that lists N GPUs (this machine has no GPU), and
``run_process_group`` replaced by a recorder (nothing may start; nothing does)."""

import json
import os
import sys

import pytest
from launch_support import CPU_TEST_JOB, launcher, sweep_file
from megatron_real import SHARED
from megatron_real import checkout as real_checkout

from launch.job import Checkpoint, Schedule


@pytest.fixture
def started(monkeypatch):
    calls = []
    monkeypatch.setattr("launch.process.run_process_group", lambda *args, **kwargs: calls.append(args) or 0)
    return calls


def fake_nvidia_smi(directory, gpus: int):
    """A stand-in nvidia-smi whose ``-L`` lists ``gpus`` H100s, as the real one prints them."""
    directory.mkdir()
    lines = "".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-0000000{i})\\n" for i in range(gpus))
    script = directory / "nvidia-smi"
    script.write_text(f"#!/bin/sh\nprintf '{lines}'\n")
    script.chmod(0o755)
    return directory


def _broken_setup_inputs(advisor, tmp_path) -> tuple:
    """The plans and files the broken setups launch: a TP 2 sweep without sequence parallelism
    (which --transformer-impl local's torch norms refuse), a CP 2 estimate, one with sequence
    parallelism, one priced with TE's TP overlap (its flags carry it), a dataset prefix without
    its .idx, a plain file, and nvidia-smi stand-ins listing 4 GPUs and none."""
    sweep = sweep_file(advisor, tmp_path / "sweep.json", "--gpus", "8", "--mem", "80", "--no-sequence-parallel")
    cp2, sequence_parallel = tmp_path / "cp2.json", tmp_path / "sp.json"
    advisor("estimate", "--gpus", "8", "--mem", "80", "--tp", "2", "--cp", "2", "--pp", "1", "--mbs", "1",
            "--no-sequence-parallel", "--format", "json", "-o", cp2)
    advisor("estimate", "--gpus", "8", "--mem", "80", "--tp", "2", "--pp", "1", "--mbs", "1", "--format", "json",
            "-o", sequence_parallel)
    tp_overlap = tmp_path / "tp-overlap.json"
    advisor("estimate", "--gpus", "8", "--mem", "80", "--tp", "2", "--pp", "1", "--mbs", "1", "--tp-comm-overlap",
            "--format", "json", "-o", tp_overlap)
    prefix = tmp_path / "corpus_text_document"
    (tmp_path / "corpus_text_document.bin").touch()
    a_file = tmp_path / "a-file"
    a_file.touch()
    four, none = fake_nvidia_smi(tmp_path / "four", 4), fake_nvidia_smi(tmp_path / "none", 0)
    return sweep, cp2, sequence_parallel, tp_overlap, prefix, a_file, four, none


def test_every_broken_setup_is_one_line_exit_2_and_nothing_starts(advisor, tmp_path, monkeypatch, started):
    core15 = real_checkout("core_v0.15.2").path
    sweep, cp2, sequence_parallel, tp_overlap, prefix, a_file, four, none = _broken_setup_inputs(advisor, tmp_path)
    no_gloo = [arg for arg in CPU_TEST_JOB if arg not in ("--distributed-backend", "gloo")]
    no_te_switch = [arg for arg in CPU_TEST_JOB if arg not in ("--transformer-impl", "local")]

    good = tmp_path / "good_text_document"
    for suffix in (".bin", ".idx"):
        (tmp_path / f"good_text_document{suffix}").touch()
    null_tokenizer = ["--tokenizer-type", "NullTokenizer", "--vocab-size", "128255"]
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    def launch(*options, extras=tuple(CPU_TEST_JOB), source=sweep, megatron=core15, command="torchrun", mock=True):
        return launcher()(command, "--from", source, "--megatron-lm", megatron, *(["--mock-data"] if mock else []),
                          *options, "--", *extras, expect=2)

    assert launcher()("check", "--from", sweep, "--megatron-lm", core15, "--mock-data", "--", *CPU_TEST_JOB)
    cases = {
        "missing import": (lambda patch: patch.setitem(sys.modules, "six", None), {},
                           "cannot import six (Megatron-LM core 0.15 imports it at run time"),
        "no pybind11 to build the dataset helpers": (
            lambda patch: patch.setitem(sys.modules, "pybind11", None), {},
            "cannot import pybind11 (Megatron-LM core 0.15 compiles its dataset helpers with it at start-up"),
        "fewer GPUs": (lambda patch: patch.setenv("PATH", f"{four}:/usr/bin:/bin"), {"extras": no_gloo},
                       "this node has 4 GPU(s) (nvidia-smi -L, CUDA_VISIBLE_DEVICES), the launch needs 8 per node"),
        "no GPUs": (lambda patch: patch.setenv("PATH", f"{none}:/usr/bin:/bin"), {"extras": no_gloo},
                    "no GPUs on this node (nvidia-smi -L lists none)"),
        "no GPUs, checked": (lambda patch: patch.setenv("PATH", f"{none}:/usr/bin:/bin"),
                             {"extras": no_gloo, "command": "check"},
                             "one per GPU (ranks on other nodes: --no-gpus-here)"),
        "no Transformer Engine": (None, {"extras": no_te_switch},
                                  "cannot import transformer_engine, which Megatron-LM's default --transformer-impl"),
        "CP with local": (None, {"source": cp2}, "CP 2 (megatron-core's DotProductAttention asserts CP 1"),
        # TP overlap needs sequence parallelism, which the local spec's torch RMSNorm refuses too: two lines
        "TP overlap with local": (None, {"source": tp_overlap},
                                  ("--tp-comm-overlap (TE's userbuffers) needs Transformer Engine",
                                   "--transformer-impl local with --sequence-parallel at TP 2")),
        "sequence parallelism with local": (None, {"source": sequence_parallel}, (
            "--transformer-impl local with --sequence-parallel at TP 2: megatron-core's local layer spec builds "
            "RMSNorm as torch's norm (WrappedTorchNorm), which asserts 'sequence parallel not supported by torch "
            "LayerNorm' on every rank when the model is built (transformer/torch_norm.py); plan it without sequence "
            "parallelism (advisor sweep or estimate --no-sequence-parallel")),
        "dataset without .idx": (None, {"extras": [*CPU_TEST_JOB, "--data-path", str(prefix), *null_tokenizer],
                                                  "command": "sbatch", "mock": False},
                                 f"--data-path {prefix}: no {prefix}.idx"),
        "tokenizer missing": (None, {"mock": False, "extras": [
            *CPU_TEST_JOB, "--data-path", str(good), "--tokenizer-type", "SentencePieceTokenizer",
            "--tokenizer-model", str(tmp_path / "tok.model")]},
                              f"--tokenizer-model {tmp_path / 'tok.model'}: no such file or directory"),
        "save under a file": (None, {"extras": [*CPU_TEST_JOB, "--save", str(a_file / "ckpt")]},
                              f"--save {a_file / 'ckpt'}: {a_file} is a file"),
        # by its kind: it said 'is a file'
        "save to a FIFO": (None, {"extras": [*CPU_TEST_JOB, "--save", str(fifo)]},
                           f"--save {fifo} is a FIFO (named pipe), not a directory"),
        "unwritable profile dir": (None, {"options": ("--profile-dir", "/proc/advisor-profile")},
                                   "--profile-dir /proc/advisor-profile: /proc is not writable"),
        # the whole line: tests/test_local_sequence_parallel.py
        "persistent layer norm with local": (None, {"extras": [arg for arg in CPU_TEST_JOB
                                                               if arg != "--no-persist-layer-norm"]},
                                             "asserts 'persist_layer_norm not supported by torch LayerNorm' on every "
                                             "rank when the model is built"),
        "incomplete job": (None, {"extras": ["--distributed-backend", "gloo", "--transformer-impl", "local",
                                             "--no-persist-layer-norm"]},
                           "the job is incomplete: it lacks the run's length (--tokens 1T, or --train-iters N after --);"
                           " a learning rate (--lr 3e-4 after --)"),
    }
    if sys.version_info < (3, 12):
        # and, with no --eval-interval, what its pretrain_gpt.py would fail on (launch.evaluation)
        cases["Python too old"] = (None, {"megatron": real_checkout_path("core_v0.19.0")},
                                   ("Megatron-LM core 0.19 needs Python >= 3.12; this is Python 3.",
                                    "Megatron-LM core 0.19 has no --eval-interval default"))
    for name, (breaks, how, expected) in cases.items():
        with monkeypatch.context() as patch:
            if breaks is not None:  # the break lasts for this case only
                breaks(patch)
            how = dict(how)
            result = launch(*how.pop("options", ()), **how)
        errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
        expected = (expected,) if isinstance(expected, str) else expected
        assert len(errors) == len(expected) and all(text in line for text, line in zip(expected, errors)), (
            name, result.stderr)
        assert "Traceback" not in result.output and result.stdout == "", name
    assert started == []



def test_three_broken_things_are_three_lines_and_one_exit(advisor, tmp_path, started):
    """No Transformer Engine for CP 2, a dataset without its .idx, --save under a file: all said at once."""
    core15 = real_checkout("core_v0.15.2").path
    _, cp2, _, _, prefix, a_file, _, _ = _broken_setup_inputs(advisor, tmp_path)
    no_te_switch = [arg for arg in CPU_TEST_JOB if arg not in ("--transformer-impl", "local")]
    result = launcher()("torchrun", "--from", cp2, "--megatron-lm", core15, "--", *no_te_switch, "--data-path",
                        str(prefix), "--tokenizer-type", "NullTokenizer", "--vocab-size", "128255", "--save",
                        str(a_file / "x"), expect=2)
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 3, result.stderr
    assert started == []


def real_checkout_path(tag: str):
    """The checkout alone (no interpreter for it: the point is that this one is too old)."""
    path = SHARED / tag
    if not (path / "pretrain_gpt.py").is_file():
        pytest.skip(f"no Megatron-LM checkout {tag} at {path}")
    return path


def test_a_cpu_launch_says_it_is_only_for_tests(advisor, tmp_path, started):
    core15 = real_checkout("core_v0.15.2").path
    sweep = sweep_file(advisor, tmp_path / "sweep.json", "--gpus", "8", "--mem", "80", "--no-sequence-parallel")
    result = launcher()("check", "--from", sweep, "--megatron-lm", core15, "--mock-data", "--", *CPU_TEST_JOB)
    assert "a CPU launch over gloo (--distributed-backend gloo) is only for tests" in result.stderr
    assert result.stdout.startswith("advisor-launch check: ok: llama3.1-8b")


def test_schedule_and_checkpoint_by_hand():
    """1e9 tokens of 4096-token samples: ceil(244140.625) = 244141 samples, floor(244141 / 512) = 476
    iterations (Megatron's update_train_iters drops the last 429 samples), 1% warm-up = round(2441.41) = 2441. An 8e9-parameter BF16 model: 14 bytes each
    (2 weights + 4 main + 4 + 4 Adam) = 112e9 bytes; over 64 ranks 1.75e9 each; at 10 GB/s 11.2 s;
    at 2 s per step, saving under 1% of the time needs ceil(11.2 / 0.02) = 560 iterations."""
    schedule = Schedule(tokens=1e9, seq_len=4096, global_batch_size=512)
    assert (schedule.samples, schedule.iterations, schedule.warmup_samples) == (244141, 476, 2441)
    assert schedule.flags() == ["--train-samples", "244141", "--lr-decay-samples", "244141",
                                "--lr-warmup-samples", "2441"]
    checkpoint = Checkpoint(parameters=8e9, weight_bytes=2, world_size=64, bandwidth_gbs=10)
    assert checkpoint.total_bytes == 112e9 and checkpoint.per_rank_bytes == 1.75e9
    assert checkpoint.save_seconds == pytest.approx(11.2) and checkpoint.interval(2.0) == 560
    assert Checkpoint(parameters=1e9, weight_bytes=4, world_size=1, bandwidth_gbs=1).bytes_per_parameter == 12


def test_megatron_core_from_the_checkout_is_enough(monkeypatch):
    """advisor profile run --megatron-lm: megatron-core not installed, but the checkout provides it."""
    import importlib.util

    from advisor.capture.relay import missing_modules

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",  # megatron-core uninstalled (the double)
                        lambda name, *a: None if name.startswith("megatron") else real(name, *a))
    assert missing_modules() == ["megatron.core"]
    assert missing_modules(real_checkout("core_v0.15.2").path) == []


def test_a_sweep_row_carries_its_token_budget(advisor, tmp_path):
    sweep = sweep_file(advisor, tmp_path / "sweep.json", "--gpu", "h100-80gb", "--gpus", "8", "--tokens", "1B")
    assert json.loads(sweep.read_text())[0]["tokens"] == 1e9
    result = launcher()("args", "--from", sweep, "--format", "json")
    args = json.loads(result.stdout)
    seq = int(args[args.index("--seq-length") + 1])
    assert args[args.index("--train-samples") + 1] == str(-(-10**9 // seq))


def test_moe_fused_kernels_need_transformer_engine_whatever_the_implementation():
    """--moe-permute-fusion and --moe-router-fusion call Transformer Engine's kernels from
    megatron-core's own MoE code (TransformerConfig refuses the first without TE), so a launch under
    --transformer-impl local with them still needs TE: checked here where the ranks run, and by each
    rank's entry where they run elsewhere (uses_transformer_engine)."""
    from launch.megatron_versions import VERSIONS
    from launch.preflight import Setup, transformer_engine_problems, uses_transformer_engine

    local = ("--transformer-impl", "local")
    assert not uses_transformer_engine(local)
    assert uses_transformer_engine((*local, "--moe-permute-fusion")) and uses_transformer_engine(
        (*local, "--moe-router-fusion"))

    def problems(*args, te: bool, here: bool = True):
        setup = Setup(rules=VERSIONS[-1], checkout=None, args=args, cp=1, gpus_per_node=8, gpus_here=here)
        return transformer_engine_problems(setup, importable=lambda module: te)

    [line] = problems(*local, "--moe-permute-fusion", "--moe-router-fusion", te=False)
    assert "which --moe-permute-fusion and --moe-router-fusion need" in line and "whatever --transformer-impl" in line
    assert problems(*local, "--moe-permute-fusion", te=True) == []
    assert problems(*local, "--moe-permute-fusion", te=False, here=False) == []  # the ranks' nodes check it
    assert problems(*local, te=False) == []


def test_the_flex_dispatcher_needs_deep_ep_where_the_ranks_run():
    """megatron-core's flex dispatcher imports DeepEP (moe/fused_a2a.py) and fails at the first MoE
    layer without it: the DeepEP and HybridEP backends are checked before anything starts; NCCL-EP
    is Transformer Engine's, and ranks elsewhere are their nodes' to check."""
    from launch.megatron_versions import VERSIONS
    from launch.preflight import Setup, flex_dispatcher_problem

    def problem(*args, deep_ep: bool, here: bool = True):
        setup = Setup(rules=VERSIONS[-1], checkout=None, args=args, cp=1, gpus_per_node=8, gpus_here=here)
        return flex_dispatcher_problem(setup, importable=lambda module: module == "deep_ep" and deep_ep)

    flex = ("--moe-token-dispatcher-type", "flex")
    assert problem(*flex, deep_ep=False) == ("cannot import deep_ep, which the flex dispatcher's deepep backend "
                                             "needs: install DeepEP, or launch a row of another "
                                             "--moe-token-dispatcher-type")
    assert "HybridEPBuffer" in problem(*flex, "--moe-flex-dispatcher-backend", "hybridep", deep_ep=False)
    assert problem(*flex, deep_ep=True) is None
    assert problem(*flex, "--moe-flex-dispatcher-backend", "ncclep", deep_ep=False) is None
    assert problem(*flex, deep_ep=False, here=False) is None
    assert problem("--moe-token-dispatcher-type", "alltoall", deep_ep=False) is None


def test_an_environment_that_contradicts_the_attention_backend_is_refused_before_the_run():
    """megatron-core asserts NVTE_FLASH_ATTN, NVTE_FUSED_ATTN and NVTE_UNFUSED_ATTN against
    --attention-backend when it builds the model (language_module.py, both releases): a shell that
    exports NVTE_FLASH_ATTN=1 fails an unfused plan a minute in, on every rank. Found by a test whose
    worker's in-process Megatron had set it."""
    from launch.megatron_versions import VERSIONS
    from launch.preflight import Setup, attention_environment_problems

    def problems(*args, here: bool = True, **environ):
        setup = Setup(rules=VERSIONS[0], checkout=None, args=args, cp=1, gpus_per_node=8, gpus_here=here)
        return attention_environment_problems(setup, environ)

    assert problems("--attention-backend", "unfused", NVTE_FLASH_ATTN="1") == [
        "NVTE_FLASH_ATTN=1 in the environment contradicts --attention-backend unfused, which sets it to 0 "
        "(megatron-core asserts it when it builds the model): unset NVTE_FLASH_ATTN, NVTE_FUSED_ATTN, "
        "NVTE_UNFUSED_ATTN"]
    assert problems("--attention-backend", "unfused", NVTE_FLASH_ATTN="0", NVTE_UNFUSED_ATTN="1") == []
    assert len(problems(NVTE_FUSED_ATTN="0")) == 1  # Megatron's default, auto, wants 1
    assert problems("--attention-backend", "flash", NVTE_FUSED_ATTN="1", here=False) == []  # their nodes' own
