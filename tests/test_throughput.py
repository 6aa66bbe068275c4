"""The time model: FLOP counts against Megatron-LM's own code, vectorisation, and properties."""

import ast
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from advisor.hardware import get_gpu
from advisor.models import preset
from advisor.options import TrainingOptions
from advisor.throughput import Calibration, TimeModel, TimeOptions
from advisor.throughput.flops import megatron_flops_per_iteration
from advisor.throughput.terms import Rates, gemm_time, ring_collective_time

from conftest import ROOT

# The project's read-only Megatron-LM checkouts sit beside the repository (shared/megatron-lm).
CHECKOUT = next((base / "shared" / "megatron-lm" / "core_v0.15.2" for base in ROOT.parents
                 if (base / "shared" / "megatron-lm" / "core_v0.15.2").is_dir()), Path("/nonexistent"))
SPEC = preset("llama3.1-8b")
H100 = get_gpu("h100-80gb")


def _padded_128(vocab: int, tp: int) -> int:
    """Megatron's default padding written out: v up to a multiple of 128 x TP."""
    multiple = 128 * tp
    return (vocab + multiple - 1) // multiple * multiple


def megatron_num_floating_point_operations():
    """``num_floating_point_operations`` from the real Megatron-LM checkout's training.py, executed
    on its own (importing megatron.training needs CUDA-era dependencies)."""
    path = CHECKOUT / "megatron" / "training" / "training.py"
    if not path.exists():
        pytest.skip("no Megatron-LM checkout in shared/megatron-lm beside the repository")
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "num_floating_point_operations")
    namespace: dict = {}
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace)
    return namespace["num_floating_point_operations"]


def megatron_args(spec, seq_len, tp):
    return SimpleNamespace(
        num_layers=spec.num_layers, hidden_size=spec.hidden_size, ffn_hidden_size=spec.ffn_hidden_size,
        num_attention_heads=spec.num_attention_heads, num_query_groups=spec.num_query_groups,
        group_query_attention=True, kv_channels=spec.head_dim, seq_length=seq_len, swiglu=True,
        padded_vocab_size=_padded_128(spec.vocab_size, tp), num_experts=None, moe_router_topk=1,
        moe_ffn_hidden_size=None, moe_shared_expert_intermediate_size=None, mtp_num_layers=None,
        multi_latent_attention=False, is_hybrid_model=False, moe_layer_freq=1, hybrid_override_pattern=None,
    )


@pytest.mark.parametrize("model, seq_len, tp", [("llama3.1-8b", 8192, 1), ("llama3.1-70b", 4096, 8),
                                                ("llama3.1-405b", 8192, 8), ("llama3.2-1b", 2048, 2)])
def test_flops_are_megatron_lms_own_count(model, seq_len, tp):
    spec = preset(model)
    ours = float(megatron_flops_per_iteration(spec, seq_len, 1024, _padded_128(spec.vocab_size, tp), "megatron"))
    theirs = megatron_num_floating_point_operations()(megatron_args(spec, seq_len, tp), 1024)
    assert ours == pytest.approx(theirs, rel=1e-12)


def test_the_papers_convention_counts_the_full_score_matrix():
    """The fork's formula (okoge-kaz/Megatron-LM v0.9.0-abci training.py), written out here."""
    h, L, s, k, a, f = 4096, 32, 8192, 8, 32, 14336
    v = 128256  # Llama 3's vocabulary, a multiple of 128
    fork = 12 * 1024 * s * L * h * h * ((1 + k / a + s / h) + f / h * 1.5 + v / (2 * L * h))
    assert float(megatron_flops_per_iteration(SPEC, s, 1024, v, "paper")) == pytest.approx(fork, rel=1e-12)


def test_the_time_model_pads_the_vocabulary_as_the_run_does():
    """Llama 3's 128,256 rows at TP 8: 129,024 with Megatron's default divisible-by 128 (a multiple
    of 1,024), 128,256 with the advisor's launched --make-vocab-size-divisible-by 1 (16,032 a rank).
    The 768 rows cost the DP/Adam count 768 x 4096 / 8 a rank for the embedding and again for the
    untied head, and Megatron's FLOP count 6 x gbs x s x h x 768 (the logit GEMM's 2 x 3 passes)."""
    s, gbs, h = 8192, 1024, 4096
    megatron = TimeModel(SPEC, H100, s, gbs)
    launched = TimeModel(SPEC, H100, s, gbs, options=TrainingOptions().time_options())
    assert (float(megatron.padded_vocab(8)), float(launched.padded_vocab(8))) == (129024, 128256)
    assert float(megatron._stage_parameters(8, 1) - launched._stage_parameters(8, 1)) == 2 * 768 * h / 8
    assert float(megatron.flops_per_iteration(8) - launched.flops_per_iteration(8)) == pytest.approx(
        6 * gbs * s * h * 768, rel=1e-9)
    # the head's GEMMs see the rows too: the launched run is priced a little faster, never slower
    layout = dict(tp=8, cp=1, pp=1, dp=8, mbs=1)
    assert launched.step(**layout).total_s < megatron.step(**layout).total_s


def test_gemm_and_ring_terms_by_hand():
    cal = Calibration()
    rates = Rates.of(H100, cal)
    # 8192 x 4096 x 4096: 2.75e11 FLOPs at 0.7106 x 989e12 FLOP/s, plus the 13.8 us latency.
    assert gemm_time(8192, 4096, 4096, rates) == pytest.approx(2 * 8192 * 4096 * 4096 / (0.7106 * 989e12) + 13.8e-6)
    # A 1 GB all-gather over 8 NVLink ranks: 7/8 of it at 0.8 x 450 GB/s, plus 7 latencies.
    one = ring_collective_time(1e9, 8, rates.nvlink_bytes_per_s, rates)
    assert one == pytest.approx(7 / 8 * 1e9 / (cal.network_efficiency * 450e9) + 7 * cal.collective_latency_s)
    assert ring_collective_time(1e9, 1, rates.nvlink_bytes_per_s, rates) == 0


layouts = st.tuples(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4, 8]),
                    st.sampled_from([1, 2, 4, 8, 16]), st.sampled_from([1, 2, 4]))


@settings(max_examples=30, deadline=None)
@given(st.lists(layouts, min_size=2, max_size=12))
def test_one_vectorised_call_equals_a_loop(batch):
    model = TimeModel(SPEC, H100, 8192, 1024, Calibration())
    tp, cp, pp, dp, mbs = (np.array(x) for x in zip(*batch))
    together = model.step(tp, cp, pp, dp, mbs).total_s
    alone = [float(model.step(*layout).total_s) for layout in batch]
    assert together == pytest.approx(alone, rel=1e-12)


def test_equal_stages_give_the_1f1b_and_interleaved_bubbles():
    """(p - 1) / (v m) of the busy time (Narayanan et al. 2021, Section 2.2)."""
    model = TimeModel(SPEC, H100, 8192, 1024, Calibration())
    stage = model.stage(2, 1, 1, 8, pipeline_parallel=True)
    p, m = 4, 1024 // 8
    for v in (1, 2, 4):
        step = model.step_from_stages([stage] * p, 2, 1, 8, 1, vpp=v)
        busy = m * float(stage.total)
        assert float(step.bubble_s) == pytest.approx((p - 1) / (v * m) * busy, rel=1e-9)


def test_terms_vanish_where_their_parallelism_does():
    model = TimeModel(SPEC, H100, 8192, 1024, Calibration())
    step = model.step(1, 1, 1, 8, 1)
    assert float(step.tp_comm_s) == float(step.cp_comm_s) == float(step.pp_comm_s) == float(step.bubble_s) == 0
    assert float(step.data_wait_s) == 0  # Megatron's default data loader caches its mask
    step = model.step(2, 2, 2, 2, 1)
    # TP 2 with SP: 8 collectives per layer show; CP 2's one K/V send per step (2 x 2 x 4096 x 8 x 128 / 2
    # bytes = 8 MiB, about 20 us on NVLink) hides behind half a layer's attention (milliseconds): zero shows
    assert float(step.tp_comm_s) > 0 and float(step.cp_comm_s) == 0
    send = 2 * 2 * 4096 * 8 * 128 / 2 / (Calibration().network_efficiency * H100.nvlink_bytes_per_s)
    attention_forward = model.layer(2, 2, 1)[5]
    assert send < 1e-4 < float(attention_forward) / 2


def test_full_recomputation_adds_each_layers_forward_to_its_backward():
    model = TimeModel(SPEC, H100, 8192, 1024, Calibration())
    plain = model.stage(2, 1, 1, 8)
    full = model.stage(2, 1, 1, 8, recompute="full", recompute_layers=8)
    layer_forward, *_ = model.layer(2, 1, 1)
    assert float(full.backward - plain.backward) == pytest.approx(8 * float(layer_forward))
    assert float(full.forward) == pytest.approx(float(plain.forward))


def test_more_gpus_never_slow_a_replica_down_and_tokens_per_s_is_consistent():
    model = TimeModel(preset("llama3.1-70b"), H100, 8192, 1024, Calibration())
    dp = np.array([1, 2, 4, 8, 16])
    step = model.step(8, 1, 8, dp, 1)
    assert np.all(np.diff(step.total_s) < 0)
    numbers = model.throughput(step, 64 * dp, 8)
    assert numbers["tokens_per_s"] == pytest.approx(1024 * 8192 / step.total_s)
    assert numbers["mfu"] == pytest.approx(numbers["tflops_per_gpu"] / 989)


def test_the_rebuilt_mask_bounds_a_replica_by_its_samples():
    """The paper's data loader: a replica cannot beat gbs / dp samples x seconds per sample."""
    options = TimeOptions(dataloader_mask="rebuilt")
    model = TimeModel(SPEC, get_gpu("h100-94gb"), 32768, 1024, Calibration(), options)
    step = model.step(np.array([4, 2]), np.array([1, 4]), 1, np.array([1, 1]), 1)
    per_sample = Calibration().host_mask_ns_per_element * 1e-9 * (3200 / 4800) * 32768**2 / 2
    assert step.total_s == pytest.approx([1024 * per_sample] * 2)
    assert np.all(step.data_wait_s > 0)


def test_unfused_attention_is_what_the_layer_runs_without_flash_attention():
    """--no-flash-attn cost memory and no time (the layer priced flash attention whatever the
    option): the layer now runs ``terms.unfused_attention_time``, and nothing else changes."""
    from advisor.throughput import terms

    spec, gpu = preset("llama3.1-8b"), get_gpu("h100-80gb")
    fused = TimeModel(spec, gpu, 8192, 1024, None, TimeOptions())
    unfused = TimeModel(spec, gpu, 8192, 1024, None, TimeOptions(flash_attention=False))
    f, u = fused.layer(2, 1, 1), unfused.layer(2, 1, 1)
    forward, backward = terms.unfused_attention_time(spec, 8192, 1, 2, unfused.rates)
    flash_forward, flash_backward = terms.attention_time(spec, 8192, 1, 2, 1, fused.rates)
    assert float(u[5]) == pytest.approx(float(forward))
    assert float(u[0] - f[0]) == pytest.approx(float(forward - flash_forward))
    assert float(u[1] - f[1]) == pytest.approx(float(backward - flash_backward))
    assert float(forward) > float(flash_forward)  # every s x s score computed and written, not half in SRAM


def test_the_no_flash_attn_option_reaches_the_time_model():
    from advisor.options import TrainingOptions
    from advisor.options.training import Attention

    unfused = Attention(flash_attention=False, dataloader_mask="cached")  # unfused attention reads the mask
    assert TrainingOptions(attention=unfused).time_options().flash_attention is False
    assert TrainingOptions().time_options().flash_attention is True


@pytest.mark.parametrize("options", [
    {}, {"recompute": "selective"}, {"recompute": "selective", "recompute_modules": ("core_attn", "mlp")},
    {"recompute": "selective", "recompute_modules": ("mlp",), "tp_comm_overlap": True},
    {"recompute": "full"}, {"recompute": "full", "fp8_format": "hybrid"},
    {"recompute": "full", "tp_comm_overlap": True, "fp8_format": "hybrid", "context_parallel": 2},
], ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "plain")
def test_a_steps_parts_add_up_to_its_time(options):
    """What recomputation runs again lands in its parts: compute, TP and CP communication (the
    recomputed MLP's collectives, full recomputation's forward collectives), not a compute share
    of it (an audit: 70B TP 8 PP 4 with --recompute-modules mlp left 0.98 s in no part, full
    recomputation counted 0.53 s twice, and the report's bar drew the parts)."""
    from advisor.options import TrainingOptions

    cp = options.pop("context_parallel", 1)
    training = TrainingOptions().with_(**options)
    model = TimeModel(preset("llama3.1-70b"), H100, 8192, 128, options=training.time_options())
    step = model.step(8, cp, 4, 2 // cp if cp > 1 else 2, 1, recompute=training.recomputation.recompute)
    parts = step.row()
    total = parts.pop("total_s")
    assert sum(parts.values()) == pytest.approx(total, rel=1e-12)
