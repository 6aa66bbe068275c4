"""Properties of the estimator that hold for any Llama and any valid layout."""

from hypothesis import given, settings
from hypothesis import strategies as st

from advisor.equations import final_norm_parameters, layer_norm_parameters, model_parameters, padded_vocab_size
from advisor.memory import MemoryOptions, estimate_memory
from advisor.models import PRESETS, LlamaSpec
from advisor.parallel import ParallelConfig, Workload

powers = st.sampled_from([1, 2, 4, 8])


@st.composite
def llamas(draw) -> LlamaSpec:
    k = draw(st.sampled_from([1, 2, 4, 8]))
    a = k * draw(st.sampled_from([1, 2, 4, 8]))
    return LlamaSpec(
        name="drawn",
        num_layers=draw(st.sampled_from([8, 16, 24, 32])),
        hidden_size=a * draw(st.sampled_from([16, 64, 128])),
        ffn_hidden_size=draw(st.integers(64, 20000)),
        num_attention_heads=a,
        num_query_groups=k,
        vocab_size=draw(st.integers(1000, 200000)),
        tie_embeddings=draw(st.booleans()),
    )


options = st.builds(
    MemoryOptions,
    distributed_optimizer=st.booleans(),
    gradient_bytes=st.sampled_from([2, 4]),
    recompute=st.sampled_from(["none", "selective", "full"]),
    recompute_num_layers=st.integers(1, 4),
)


def total(spec, workload, opts, **parallel) -> float:
    return estimate_memory(spec, ParallelConfig(**parallel), workload, opts).total_gib


@settings(max_examples=200, deadline=None)
@given(llamas(), powers, powers, st.sampled_from([1, 2, 4]), powers, st.sampled_from([1, 2]), options)
def test_memory_never_grows_when_d_c_or_t_grows_alone(spec, t, c, p, d, b, opts):
    t = min(t, spec.num_query_groups)
    workload = Workload(seq_len=4096, global_batch_size=None)
    base = dict(tp=t, cp=c, pp=p, dp=d, mbs=b)
    now = total(spec, workload, opts, **base)
    assert total(spec, workload, opts, **{**base, "dp": 2 * d}) <= now
    assert total(spec, workload, opts, **{**base, "cp": 2 * c}) <= now
    if spec.num_query_groups % (2 * t) == 0:
        assert total(spec, workload, opts, **{**base, "tp": 2 * t}) <= now


@settings(max_examples=100, deadline=None)
@given(llamas(), powers, st.sampled_from([1, 2]))
def test_first_stage_layer_activations_do_not_depend_on_p(spec, t, b):
    """Section 3.2.2: stage 1 of p holds L/p layers for p microbatches, L layers in all.
    (The embedding input 8sbhp of Eq. 16 does grow with p, as the paper writes it.)"""
    t = min(t, spec.num_query_groups)
    workload = Workload(seq_len=2048, global_batch_size=None)
    values = {
        estimate_memory(spec, ParallelConfig(tp=t, pp=p, mbs=b), workload).stages[0].layer_activations_bytes
        for p in (1, 2, 4, 8)
        if spec.num_layers % p == 0
    }
    assert len(values) == 1


@settings(max_examples=100, deadline=None)
@given(llamas(), powers, st.sampled_from([1, 2, 4, 8]))
def test_stages_parameters_add_up_to_the_model(spec, t, p):
    """Sum over stages (and over the t shards, counting replicated norms once) = Eq. 3 with the
    vocabulary Megatron builds (padded to a multiple of t)."""
    t = min(t, spec.num_query_groups)
    vocab = padded_vocab_size(spec.vocab_size, None, t)
    stages = estimate_memory(spec, ParallelConfig(tp=t, pp=p), Workload(global_batch_size=None)).stages
    replicated = spec.num_layers * layer_norm_parameters(spec) + final_norm_parameters(spec)
    summed = sum(stage.parameters for stage in stages) * t - (t - 1) * replicated
    # With tied embeddings and p > 1 the last stage holds a copy of the embedding.
    copy = spec.hidden_size * vocab if spec.tie_embeddings and p > 1 else 0
    assert summed == model_parameters(spec, vocab) + copy


def test_paper_models_peak_on_the_first_stage():
    """Seed 004 reports the first stage as the one that decides OOM (Section 3.2.2)."""
    for name in ("llama3.1-8b", "llama3.1-70b"):
        spec = PRESETS[name]
        for p in (2, 4, 8, 16):
            result = estimate_memory(spec, ParallelConfig(tp=4, pp=p), Workload())
            assert result.peak.stage == 0
