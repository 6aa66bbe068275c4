"""--memory-model profile: measured / Eq. 12-14 ratios from profile directories, and the
calibrated memory model priced with them (torch-free: profiles written by the test)."""

from dataclasses import replace

import pytest

from advisor.memory import MemoryOptions, estimate_memory
from advisor.models import preset
from advisor.parallel import ParallelConfig, Workload
from advisor.profile_terms import ActivationRatios, MeasuredActivations, measured_activations
from advisor.throughput.calibration import load_memory_calibration
from advisor.verdicts import assess
from factories import TINY, header, iteration, layer, profile

S, B = 32, 1


def eq12(spec, s=S, b=B) -> float:
    """Seed 004's Eq. 12 by hand: s b h (12 + 4 k/a + 8 f/h) bytes."""
    h, f, k, a = spec.hidden_size, spec.ffn_hidden_size, spec.num_query_groups, spec.num_attention_heads
    return s * b * h * (12 + 4 * k / a + 8 * f / h)


def write_run(directory, *, decoder, embedding, output, tp=1, **head):
    """A two-stage run whose records keep the given bytes per microbatch, in BF16 (the paper's
    element size) with flash attention (the transformer_engine spec)."""
    common = dict(params_dtype="bfloat16", layer_spec="transformer_engine", seq_len=S, layers_per_stage=(2, 2),
                  parallel=ParallelConfig(tp=tp, pp=2, mbs=B), world_size=2 * tp, sequence_parallel=tp > 1, **head)
    directory.mkdir(parents=True)
    for stage in (0, 1):
        numbers = (1, 2) if stage == 0 else (3, 4)
        layers = [layer(f"decoder.layers.{i}", "decoder", n, activation_bytes=decoder) for i, n in enumerate(numbers)]
        layers = ([layer("embedding", "embedding", None, activation_bytes=embedding)] if stage == 0 else []) + layers
        if stage == 1:
            layers.append(layer("output", "output", None, activation_bytes=output))
        for tp_rank in range(tp):
            profile(header=header(rank=stage * tp + tp_rank, coords={"tp": tp_rank, "cp": 0, "pp": stage, "dp": 0},
                                  stage_layers=numbers, first_stage=stage == 0, last_stage=stage == 1, **common),
                    layers=tuple(layers), iterations=(iteration(),)).write(directory)


def test_ratios_are_measured_over_the_equations(tmp_path):
    """Half of Eq. 12 per layer, the int64 token ids for the embedding (8 s b against Eq. 13's
    8 s b h) and Eq. 14 exactly: the ratios are 0.5, 1/h and 1, overall and for the profiled TP."""
    h, v = TINY.hidden_size, TINY.vocab_size
    write_run(tmp_path / "run", decoder=int(eq12(TINY) / 2), embedding=8 * S * B,
              output=4 * S * B * h + 4 * S * B * v)
    measured = measured_activations(tmp_path)  # a campaign's --out: runs in subdirectories
    assert measured.overall.decoder == pytest.approx(0.5)
    assert measured.overall.embedding == pytest.approx(1 / h)
    assert measured.overall.output == pytest.approx(1.0)
    assert measured.for_layout(1, 1) == measured.by_layout[(1, 1)] and measured.overall.samples == 6
    assert measured_activations(tmp_path / "run").overall == measured.overall  # one run directory
    assert measured.sequence_parallel is None  # TP 1 only: nothing said about SP


def test_profile_model_with_the_calibrated_models_ratios_is_the_calibrated_model():
    """The calibrated model corrects Eq. 12 for the fused SwiGLU (6 f/h instead of 8) and Eq. 13
    for the token ids (8 s b): measured ratios equal to these corrections must give its usage
    exactly, stage by stage, on layouts with TP, CP and PP."""
    spec = preset("llama3.1-8b")
    h, f, k, a = spec.hidden_size, spec.ffn_hidden_size, spec.num_query_groups, spec.num_attention_heads
    ratios = ActivationRatios(decoder=(12 + 4 * k / a + 6 * f / h) / (12 + 4 * k / a + 8 * f / h), embedding=1 / h,
                              output=1.0, samples=3)
    measured = MeasuredActivations(model=spec, source="hand", layer_spec="transformer_engine", sequence_parallel=True,
                                   params_dtype="bfloat16", backends=("symbolic",), overall=ratios)
    workload = Workload(seq_len=8192, global_batch_size=1024)
    for tp, cp, pp, mbs in ((1, 1, 1, 1), (2, 2, 4, 2), (8, 1, 8, 1)):
        parallel = ParallelConfig(tp=tp, cp=cp, pp=pp, dp=1, mbs=mbs)
        estimate = estimate_memory(spec, parallel, workload, MemoryOptions())
        calibrated = assess(estimate, spec, 8192, mbs, tp, cp, 80.0)
        profiled = assess(estimate, spec, 8192, mbs, tp, cp, 80.0, measured=measured)
        assert profiled.usage_gib == pytest.approx(calibrated.usage_gib, rel=1e-12)
        assert profiled.peak_stage == calibrated.peak_stage
    # Twice the measured layer: the usage grows by exactly the layers' activations, times the
    # calibration's allocator factor on activations.
    doubled = replace(measured, overall=replace(ratios, decoder=2 * ratios.decoder))
    estimate = estimate_memory(spec, ParallelConfig(pp=1, dp=1, mbs=1), workload, MemoryOptions())
    (stage,) = estimate.stages
    grown = assess(estimate, spec, 8192, 1, 1, 1, 80.0, measured=doubled).usage_gib
    base = assess(estimate, spec, 8192, 1, 1, 1, 80.0, measured=measured).usage_gib
    factor = load_memory_calibration().activation_factor
    assert (grown - base) * 2**30 == pytest.approx(factor * ratios.decoder * stage.layer_activations_bytes, rel=1e-9)


def test_sweep_with_a_profile(advisor, tmp_path):
    h, v = TINY.hidden_size, TINY.vocab_size
    write_run(tmp_path / "run", decoder=int(eq12(TINY)), embedding=8 * S * B, output=4 * S * B * (h + v))
    flags = ["sweep", "--gpus", "4", "--mem", "1", "--model", "llama3.1-8b", "--num-layers", "4", "--hidden-size",
             "64", "--ffn-hidden-size", "128", "--num-attention-heads", "4", "--num-query-groups", "2",
             "--vocab-size", "256", "--seq-len", "32", "--gbs", "8", "--all"]
    rows = advisor.json(*flags, "--profile", tmp_path)
    assert rows and {row["memory_model"] for row in rows} == {"profile"}
    assert all(row["usage_gib"] > 0 for row in rows)
    assert "needs --profile DIR" in advisor.error(*flags, "--memory-model", "profile")
    assert "not --memory-model paper" in advisor.error(*flags, "--memory-model", "paper", "--profile", tmp_path)
    assert "another model" in advisor.error(*flags, "--num-layers", "8", "--profile", tmp_path)
    assert "sweep without --no-flash-attn" in advisor.error(*flags, "--no-flash-attn", "--profile", tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no completed profile run" in advisor.error(*flags, "--profile", empty)
