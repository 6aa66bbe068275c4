"""Builders of profile records for tests (schema v4 of advisor/profiles.py)."""

from advisor.models import LlamaSpec
from advisor.parallel import ParallelConfig
from advisor.profiles import IterationRecord, LayerRecord, RankHeader, RankProfile

TINY = LlamaSpec(name="tiny", num_layers=4, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
                 num_query_groups=2, vocab_size=256)


def header(**changes) -> RankHeader:
    values = dict(
        run_id="run-1", created="2026-11-22T10:00:00+00:00", backend="cpu", device="cpu", kernels="cpu",
        torch_version="2.13.0", megatron_core_version="0.16.1", emulated=False, params_dtype="float32",
        layer_spec="local", sequence_parallel=False, recompute="none", distributed_optimizer=False, model=TINY,
        parallel=ParallelConfig(pp=2, mbs=1), seq_len=32, global_batch_size=4, num_microbatches=4,
        layers_per_stage=(2, 2), rank=0, world_size=2, coords={"tp": 0, "cp": 0, "pp": 0, "dp": 0},
        stage_layers=(1, 2), first_stage=True, last_stage=False, in_flight_microbatches=2,
        swiglu_fusion=True,  # what a real Megatron-LM run with its defaults records (--bias-swiglu-fusion)
    )
    values.update(changes)
    return RankHeader(**values)


def layer(name, kind, number, iteration=1, **changes) -> LayerRecord:
    values = dict(iteration=iteration, name=name, kind=kind, layer_number=number, parameter_bytes=100,
                  gradient_bytes=200, optimizer_bytes=600, activation_bytes=50, forward_peak_bytes=10,
                  backward_peak_bytes=20)
    values.update(changes)
    return LayerRecord(**values)


def iteration(number=1, **changes) -> IterationRecord:
    values = dict(iteration=number, parameter_bytes=300, gradient_bytes=600, optimizer_bytes=1800,
                  peak_allocated_bytes=5000, step_time_s=0.1)
    values.update(changes)
    return IterationRecord(**values)


def profile(**changes) -> RankProfile:
    values = dict(
        header=header(),
        layers=(layer("embedding", "embedding", None), layer("decoder.layers.0", "decoder", 1),
                layer("decoder.layers.1", "decoder", 2)),
        iterations=(iteration(),),
        status="ok",
    )
    values.update(changes)
    return RankProfile(**values)
