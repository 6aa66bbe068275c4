"""The CPU shim and the model builder, with real megatron-core."""

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install -e '.[megatron]')")

import contextlib  # noqa: E402

import torch  # noqa: E402

from advisor import equations as eq  # noqa: E402
from megatron_hooks.cpu_shim import CpuShim  # noqa: E402
from megatron_hooks.model import build_gpt_model, dtype_name, stage_layers  # noqa: E402
from megatron_support import SEQ, TINY, tiny_model  # noqa: E402


def test_the_shim_patches_two_things_and_undoes_them():
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    tracker = get_cuda_rng_tracker()
    device_before, fork_before = torch.cuda.current_device, tracker.__dict__.get("fork")
    with CpuShim() as shim:
        assert shim.installed
        assert torch.cuda.current_device() == "cpu"
        assert isinstance(tracker.fork(), contextlib.nullcontext)
        with pytest.raises(RuntimeError, match="already installed"):
            shim.install()
    assert not shim.installed
    assert torch.cuda.current_device is device_before
    assert tracker.__dict__.get("fork") is fork_before


def test_stage_layers():
    assert stage_layers([3, 5, 4], 0) == (1, 2, 3)
    assert stage_layers([3, 5, 4], 2) == (9, 10, 11, 12)
    with pytest.raises(ValueError, match="stage 3 is not in a pipeline of 3 stages"):
        stage_layers([3, 5, 4], 3)


def test_a_middle_and_a_last_stage(megatron_world):
    middle = tiny_model(layers=(2, 3), pre_process=False, post_process=False)
    assert [layer.layer_number for layer in middle.decoder.layers] == [2, 3]
    assert [layer.self_attention.core_attention.layer_number for layer in middle.decoder.layers] == [2, 3]
    assert sum(p.numel() for p in middle.parameters()) == 2 * eq.layer_parameters(TINY)
    last = tiny_model(layers=(4,), pre_process=False, post_process=True)
    assert sum(p.numel() for p in last.parameters()) == (
        eq.layer_parameters(TINY) + eq.final_norm_parameters(TINY) + eq.embedding_parameters(TINY))
    whole = tiny_model()
    assert sum(p.numel() for p in whole.parameters()) == eq.model_parameters(TINY)
    # Megatron scales the output projections' init by the whole model's depth, not the stage's.
    assert middle.config.output_layer_init_method.keywords["std"] == pytest.approx(0.02 / (2 * TINY.num_layers) ** 0.5)


def test_bad_stages(megatron_world):
    with pytest.raises(ValueError, match="consecutive layers"):
        tiny_model(layers=(1, 3))
    with pytest.raises(ValueError, match="outside 1..4"):
        tiny_model(layers=(4, 5))


def test_dtype_names():
    assert dtype_name(torch.bfloat16) == "bfloat16" and dtype_name(torch.float32) == "float32"
    with pytest.raises(ValueError, match="unsupported params dtype"):
        dtype_name(torch.int8)


def test_bf16_builds_bf16_weights(megatron_world):
    model = build_gpt_model(TINY, seq_len=SEQ, params_dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16} and model.config.bf16
