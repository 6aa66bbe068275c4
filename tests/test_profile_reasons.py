"""``advisor profile show --section compare``: the known reasons a measured term differs from seed
004's, said where their condition (the rank file's header) holds and only there, with the ratio
their hand counts predict, checked against hand derivations and real profiles."""

from dataclasses import replace
from pathlib import Path

import pytest

from advisor.parallel import ParallelConfig
from advisor.profile_report import compare_rank
from advisor.profiles import load_run
from factories import TINY, header, iteration, layer, profile

ROOT = Path(__file__).resolve().parent.parent
# TINY (L 4, h 64, h_ffn 128, a 4, k 2, v 256): parameters by hand, Eq. 1-3 and 7 (as test_profile_show)
LAYER_PARAMS = 2 * 64 * 64 * 3 // 2 + 3 * 64 * 128 + 2 * 64  # 36,992
EMBEDDING_PARAMS = 256 * 64


def rows_of(rank) -> dict:
    return {(row.module, row.term): row for row in compare_rank(rank)}


def keys(row) -> list[str]:
    return [reason.key for reason in row.reasons]


def test_fp32_optimizer_keeps_8_of_eq_10s_12_bytes_per_parameter():
    """Stage 0 of a FP32 Megatron run (not emulated): the embedding and two layers, 16,384 + 2 x
    36,992 = 90,368 parameters. Eq. 10 without the distributed optimizer: 12 bytes each,
    1,084,416. megatron-core keeps no FP32 master copy of FP32 weights, so Adam's two FP32 moments
    are all: 8 bytes each, 722,944, ratio 8/12 = 0.6667."""
    params = EMBEDDING_PARAMS + 2 * LAYER_PARAMS
    assert params == 90_368
    measured = 8 * params
    rank = profile(iterations=(iteration(optimizer_bytes=measured),))
    row = rows_of(rank)[("stage", "optimizer")]
    assert row.estimated_bytes == 12 * params == 1_084_416
    assert keys(row) == ["fp32-optimizer"]
    assert row.ratio == pytest.approx(0.6667, abs=1e-4) and row.expected_ratio == pytest.approx(8 / 12)
    assert row.expected_bytes == measured == 722_944
    assert "8 of Eq. 10's 12 bytes" in row.reasons[0].text and "FP32Optimizer" in row.reasons[0].source
    assert keys(rows_of(rank)[("stage", "gradients")]) == []  # FP32 gradients: Eq. 4 exactly


CPU_EMULATOR = dict(backend="cpu", kernels="cpu", emulated=True, layer_spec="local", swiglu_fusion=False)
MEGATRON_TE = dict(backend="symbolic", kernels="cuda", emulated=True, layer_spec="transformer_engine",
                   params_dtype="bfloat16")


@pytest.mark.parametrize("changes,expected", [
    # a real Megatron-LM run in FP32 on torch's CPU kernels (tests/test_launch_run.py's kind); its
    # megatron-core 0.16.1 builds the causal mask in every layer
    # (every local-spec run: its attention's global memory buffer, which the estimate's peak adds)
    (dict(), {("stage", "optimizer"): ["fp32-optimizer"], ("decoder.layers.0", "activations"):
              ["cpu-kernels", "fused-swiglu", "per-layer-mask"], ("embedding", "activations"): ["token-ids"],
              ("stage", "peak"): ["local-buffer"]}),
    # core_v0.15.2 caches the mask: the stage's first layer keeps it, nothing to say
    (dict(megatron_core_version="0.15.2"),
     {("stage", "optimizer"): ["fp32-optimizer"], ("decoder.layers.0", "activations"): ["cpu-kernels", "fused-swiglu"],
      ("embedding", "activations"): ["token-ids"], ("stage", "peak"): ["local-buffer"]}),
    # the CPU emulator: torch's Adam on plain gradients in the weights' dtype
    (dict(CPU_EMULATOR, params_dtype="float32"),
     {("stage", "optimizer"): ["emulator-optimizer"], ("decoder.layers.0", "activations"):
      ["cpu-kernels", "unfused-swiglu"], ("embedding", "activations"): ["token-ids"], ("stage", "peak"): ["local-buffer"]}),
    (dict(CPU_EMULATOR, params_dtype="bfloat16"),
     {("stage", "optimizer"): ["emulator-optimizer"], ("stage", "gradients"): ["emulator-optimizer"],
      ("decoder.layers.0", "activations"): ["cpu-kernels", "unfused-swiglu"],
      ("embedding", "activations"): ["token-ids"], ("stage", "peak"): ["local-buffer"]}),
    # BF16 with megatron-core's optimizer: Eq. 4 and 10 hold; the TE layer's own reasons
    (MEGATRON_TE, {("decoder.layers.0", "activations"): ["te-layer"], ("embedding", "activations"): ["token-ids"]}),
    # FP32 TE: no hand count of that layer (the TE note is of BF16 layers), the optimizer's holds
    (dict(MEGATRON_TE, params_dtype="float32"),
     {("stage", "optimizer"): ["fp32-optimizer"], ("embedding", "activations"): ["token-ids"]}),
    # recomputed layers keep less than any hand count here: none said
    (dict(MEGATRON_TE, recompute="selective"), {("embedding", "activations"): ["token-ids"]}),
])
def test_notes_appear_exactly_where_their_condition_holds(changes, expected):
    rank = profile(header=header(**changes))
    said = {key: keys(row) for key, row in rows_of(rank).items() if row.reasons}
    in_flight = said.pop(("stage", "activations in flight"), [])
    assert said.pop(("decoder.layers.1", "activations"), None) == said.get(("decoder.layers.0", "activations"))
    assert said == expected
    # the activations in flight sum the modules': their reasons, each once
    assert sorted(in_flight) == sorted({k for (_, term), ks in expected.items() if term == "activations" for k in ks})


@pytest.mark.parametrize("version,second_layer_mask", [("0.15.2", 0), ("0.16.1", 32 * 32), ("0.19.1", 32 * 32)])
def test_the_causal_mask_is_counted_in_every_layer_whose_megatron_core_builds_it_per_layer(version, second_layer_mask):
    """A real run, FP32, TINY (h 64, h_ffn 128, a 4, d 16), s 32, b 1, layers 1 and 2 on this stage.
    One layer by hand (megatron_hooks/README.md): 10 s b h = 20,480 (norm copies, Q, K and V
    expanded, context) + 2 s b = 64 (rsqrt) + 4 s d = 2,048 (RoPE cos, sin) + a b s^2 = 4,096
    (softmax) + 3 s b h_ffn = 12,288 (fused SwiGLU) = 38,976 elements, 155,904 bytes; the bool
    s x s mask 1,024 more. core_v0.15.2 caches the mask (@lru_cache): the first layer keeps it.
    0.16.1 and core_v0.19.0 build it in each layer's softmax, and each layer's masked_fill keeps
    its own: measured on core_v0.19.0, every layer of the last stage held s^2 more than 0.15.2's
    non-first layers (tests/test_launch_run.py)."""
    layer_bytes = 4 * (20_480 + 64 + 2_048 + 4_096 + 12_288)
    assert layer_bytes == 155_904
    rows = rows_of(profile(header=header(megatron_core_version=version)))
    assert rows[("decoder.layers.0", "activations")].expected_bytes == layer_bytes + 1_024
    assert rows[("decoder.layers.1", "activations")].expected_bytes == layer_bytes + second_layer_mask
    said = keys(rows[("decoder.layers.1", "activations")])
    assert ("per-layer-mask" in said) == (second_layer_mask > 0)
    if second_layer_mask:
        assert f"megatron-core {version} builds" in rows[("decoder.layers.1", "activations")].reasons[-1].text


def test_a_megatron_core_version_it_cannot_read_gets_no_layer_count():
    rows = rows_of(profile(header=header(megatron_core_version="unknown")))
    row = rows[("decoder.layers.0", "activations")]
    assert keys(row) == ["cpu-kernels", "fused-swiglu"] and row.expected_bytes is None


def test_the_emulator_passes_one_mask_to_every_layer_whatever_its_megatron_core():
    """megatron_hooks.model.causal_mask, made once per batch: the stage's first layer keeps it."""
    rows = rows_of(profile(header=header(**CPU_EMULATOR, megatron_core_version="0.19.1")))
    first, second = (rows[(f"decoder.layers.{i}", "activations")] for i in (0, 1))
    assert "per-layer-mask" not in keys(second)
    assert first.expected_bytes - second.expected_bytes == 32 * 32


def test_without_a_hand_count_the_reason_is_said_without_a_number():
    """TP 2 on the CPU: the hand counts are of TP 1 layers, so the layer's reasons stand without an
    expected ratio; the token ids are counted at any TP (8 s b + the bool mask s b)."""
    rank = profile(header=header(parallel=ParallelConfig(tp=2, pp=2, mbs=1), world_size=4))
    rows = rows_of(rank)
    layer_row = rows[("decoder.layers.0", "activations")]
    assert keys(layer_row) == ["cpu-kernels", "fused-swiglu", "per-layer-mask"] and layer_row.expected_bytes is None
    assert rows[("embedding", "activations")].expected_bytes == 8 * 32 + 32  # s = 32, b = 1
    assert rows[("stage", "activations in flight")].expected_bytes is None


@pytest.mark.parametrize("model", [replace(TINY, qk_layernorm=True), replace(TINY, kv_channels=32)],
                         ids=["qk-norms", "a-d-not-h"])
@pytest.mark.parametrize("spec", [dict(), MEGATRON_TE], ids=["cpu", "te"])
def test_a_layer_the_hand_counts_do_not_cover_gets_its_reasons_without_a_number(model, spec):
    """The layer counts are of Llama's attention: a d = h and no Q/K norms. Qwen3's norms keep more
    (equations.qk_norm_activation_bytes) and a d != h changes Q and the context (TINY: a 4 x d 32 =
    128 against h 64), so such a layer gets its reasons and no expected ratio."""
    row = rows_of(profile(header=header(**spec, model=model)))[("decoder.layers.0", "activations")]
    assert row.reasons and row.expected_bytes is None


def test_the_cpu_emulators_committed_profile_is_explained_to_the_byte():
    """examples/launch/profiles/pp-b1-2,2,2,2 (the CPU emulator, FP32, h 256, a 4, h_ffn 512,
    v 4096, s 128, b 1): the audit's 1.36 (1.285 since K and V are priced expanded) and 0.667 and 0.004,
    each predicted exactly.
    A layer, by hand (tests/test_hooks.py::hand_count_layer): 10 sbh + 2 sb + 4 sd + a b s^2 +
    5 sb h_ffn elements = 327,680 + 256 + 32,768 + 65,536 + 327,680 = 753,920, x 4 bytes =
    3,015,680; the stage's first layer also the bool causal mask, s^2 = 16,384. The embedding:
    8 s b = 1,024. The optimizer: 8 bytes per parameter (2 x 4, Adam's moments in FP32) of rank
    0's 1,048,576 + 2 x 590,336, plus Adam's 4-byte step for each of its 13 tensors."""
    rank = load_run(ROOT / "examples" / "launch" / "profiles" / "pp-b1-2,2,2,2").ranks[0]
    rows = rows_of(rank)
    first, second = rows[("decoder.layers.0", "activations")], rows[("decoder.layers.1", "activations")]
    assert (first.measured_bytes, second.measured_bytes) == (3_015_680 + 16_384, 3_015_680)
    assert (first.expected_bytes, second.expected_bytes) == (3_032_064, 3_015_680)
    # the estimate (--no-flash-attn, FP32: 2 x the BF16 terms): Eq. 12, s b h (12 + 4 k/a + 8 h_ffn/h) =
    # 32,768 x 30 = 983,040, the softmax output 2 a s^2 b = 131,072 and K and V expanded from 2 to 4
    # heads, 4 s b (a - k) d = 65,536: 2 x 1,179,648 = 2,359,296 (1.361 before K and V were priced expanded)
    assert first.ratio == 3_032_064 / 2_359_296 == 1.28515625 and first.expected_ratio == first.ratio
    embedding = rows[("embedding", "activations")]
    assert embedding.measured_bytes == embedding.expected_bytes == 1024 and embedding.ratio == pytest.approx(1 / 256)
    optimizer = rows[("stage", "optimizer")]
    params = 1_048_576 + 2 * 590_336
    assert optimizer.measured_bytes == 8 * params + 13 * 4 and optimizer.expected_bytes == 8 * params
    assert optimizer.expected_ratio == pytest.approx(8 / 12)


@pytest.mark.parametrize("name", ["llama3.1-8b-pp4", "llama3.1-70b-tp8", "llama3.1-405b-tp8-cp2"])
def test_the_symbolic_real_size_profiles_are_explained(name):
    """The committed symbolic profiles (TE spec, BF16; docs/profiling.md's table): every module's
    activations with a reason are predicted by its hand count to within 32 bytes (the RNG state a
    layer keeps), the layer's 0.89 and the embedding's token ids; the sum in flight, which takes
    the LM head's Eq. 14 as it is (no reason: 0.01% off), to 0.01%."""
    run = load_run(ROOT / "examples" / "symbolic" / name)
    checked = 0
    for rank in run.ranks:
        for row in compare_rank(rank):
            if row.term.startswith("activations") and row.reasons:
                assert row.expected_bytes is not None, (rank.header.rank, row.module, row.term)
                if row.term == "activations":
                    assert abs(row.measured_bytes - row.expected_bytes) <= 32, (rank.header.rank, row.module)
                else:
                    assert row.measured_bytes == pytest.approx(row.expected_bytes, rel=1e-4), rank.header.rank
                checked += 1
    assert checked >= 5


def test_show_says_the_reasons_under_the_table_and_in_json(advisor, tmp_path):
    rank = profile(iterations=(iteration(optimizer_bytes=8 * (EMBEDDING_PARAMS + 2 * LAYER_PARAMS)),))
    rank.write(tmp_path)
    text = " ".join(advisor("profile", "show", tmp_path, "--section", "compare").stdout.split())
    assert "optimizer: FP32 weights need no FP32 master copy" in text
    assert "embedding activations: megatron-core's embedding keeps the int64 token ids" in text
    assert "layer activations: torch's CPU kernels" in text and "gradients:" not in text
    assert "peak: the estimate adds to Eq. 18 megatron-core's global memory buffer" in text  # a local-spec run
    report = advisor.json("profile", "show", tmp_path, "--section", "compare")
    optimizer = next(row for row in report["compare"] if row["term"] == "optimizer")
    assert optimizer["reasons"] == ["fp32-optimizer"] and optimizer["expected_ratio"] == pytest.approx(8 / 12)
    assert set(report["compare_reasons"]) == {"fp32-optimizer", "token-ids", "cpu-kernels", "fused-swiglu",
                                              "per-layer-mask", "local-buffer"}  # the factory's megatron-core 0.16.1
    assert "distrib_optimizer.py" in report["compare_reasons"]["fp32-optimizer"]["source"]
    weights = next(row for row in report["compare"] if row["term"] == "weights")
    assert weights["reasons"] == [] and weights["expected_ratio"] is None


def test_a_rank_no_reason_applies_to_has_no_notes(advisor, tmp_path):
    """The last stage of a BF16 TE run with full recomputation: no embedding, recomputed layers,
    Eq. 4 and 10 hold: nothing to explain, nothing said."""
    last = profile(header=header(**MEGATRON_TE, recompute="full", rank=1,
                                 coords={"tp": 0, "cp": 0, "pp": 1, "dp": 0}, stage_layers=(3, 4),
                                 first_stage=False, last_stage=True, in_flight_microbatches=1),
                   layers=(layer("decoder.layers.0", "decoder", 3), layer("decoder.layers.1", "decoder", 4),
                           layer("output", "output", None)))
    assert not any(row.reasons for row in compare_rank(last))
    last.write(tmp_path)
    text = advisor("profile", "show", tmp_path, "--section", "compare").stdout
    assert "expected: the ratio" not in text and "activations in flight:" not in text


def test_a_bf16_cpu_emulator_layer_is_explained_to_the_byte(tmp_path):
    """The CPU emulator in BF16 (local spec on torch's CPU kernels, TP 1; h 256, a 4, k 2, d 64,
    h_ffn 512, s 128, b 1): each layer keeps what _cpu_layer_bytes counts, to the byte. The softmax
    runs in BF16 (megatron_hooks.model turns attention_softmax_in_fp32 off, as Megatron-LM's
    arguments leave it; torch's CPU softmax keeps nothing in FP32 besides), so the scores are one
    BF16 copy. By hand (s b h = 32,768): the two norms' FP32 inputs and x*rsqrt 16 s b h =
    524,288 and their FP32 rsqrt 8 s b = 1,024; the norm outputs (BF16 linear inputs) 4 s b h =
    131,072; Q 2 s b h = 65,536; K and V expanded to the 4 heads 4 s b h = 131,072; the context
    2 s b h = 65,536; RoPE's BF16 cos and sin for Q and K 8 s d = 65,536; the BF16 scores
    2 a s^2 b = 131,072; the unfused SwiGLU's five tensors 10 s b h_ffn = 655,360: 1,770,496; the
    stage's first layer also the bool causal mask, s^2 = 16,384."""
    pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install -e '.[megatron]')")
    import warm_python

    flags = ["--model", "llama3.1-8b", "--num-layers", "2", "--hidden-size", "256", "--ffn-hidden-size", "512",
             "--num-attention-heads", "4", "--num-query-groups", "2", "--vocab-size", "4096",
             "--layers-per-stage", "2", "--seq-len", "128", "--dtype", "bfloat16"]
    done = warm_python.run(["-m", "megatron_hooks.emulate", "--threads", "1", *flags, "--out", str(tmp_path)])
    assert done.returncode == 0, done.stderr[-3000:]
    (rank,) = load_run(tmp_path).ranks
    rows = rows_of(rank)
    first, second = rows[("decoder.layers.0", "activations")], rows[("decoder.layers.1", "activations")]
    assert 524_288 + 1_024 + 131_072 + 65_536 + 131_072 + 65_536 + 65_536 + 131_072 + 655_360 == 1_770_496
    assert (first.measured_bytes, second.measured_bytes) == (1_770_496 + 16_384, 1_770_496)
    assert (first.expected_bytes, second.expected_bytes) == (first.measured_bytes, second.measured_bytes)
    assert keys(first) == ["cpu-kernels", "unfused-swiglu"]
    assert rank.header.swiglu_fusion is False  # what megatron_hooks.recorder read from the emulator's config


@pytest.mark.parametrize("fused,swiglu_bytes,key", [(True, 24_576, "fused-swiglu"), (False, 40_960, "unfused-swiglu")])
def test_a_real_bf16_cpu_layer_counts_the_swiglu_its_header_records_and_the_bf16_scores_alone(fused, swiglu_bytes,
                                                                                               key):
    """A real core_v0.15.2 run in BF16 on torch's CPU kernels, TINY (h 64, a 4, d 16, h_ffn 128),
    s 32, b 1. By hand (s b h = 2,048): the norms' FP32 inputs and x*rsqrt 16 s b h = 32,768 and
    FP32 rsqrt 8 s b = 256; the norm outputs, Q, K and V expanded, context 12 s b h = 24,576;
    RoPE's cos and sin 8 s d = 4,096; torch's BF16 softmax output 2 a b s^2 = 8,192, and no FP32
    copy (--attention-softmax-in-fp32 off: fused_softmax.py forward_torch_softmax); SwiGLU fused
    (--bias-swiglu-fusion) 2 x 3 s b h_ffn = 24,576, unfused (--no-bias-swiglu-fusion) 2 x 5 s b
    h_ffn = 40,960. The stage's first layer also the cached bool mask, s^2 = 1,024."""
    rows = rows_of(profile(header=header(params_dtype="bfloat16", megatron_core_version="0.15.2",
                                         swiglu_fusion=fused)))
    layer_bytes = 32_768 + 256 + 24_576 + 4_096 + 8_192 + swiglu_bytes
    assert layer_bytes == (94_464 if fused else 110_848)
    first, second = rows[("decoder.layers.0", "activations")], rows[("decoder.layers.1", "activations")]
    assert (first.expected_bytes, second.expected_bytes) == (layer_bytes + 1_024, layer_bytes)
    assert keys(second) == ["cpu-kernels", key]


def test_a_real_run_whose_header_does_not_say_how_swiglu_ran_gets_no_layer_count():
    """Profile files before v4 do not record --bias-swiglu-fusion: a real run's layer keeps 3 or 5
    s b h_ffn elements, so its reasons stand without a number; an emulated stage's SwiGLU is
    unfused whatever the file's version (megatron_hooks.model)."""
    row = rows_of(profile(header=header(swiglu_fusion=None)))[("decoder.layers.0", "activations")]
    assert keys(row) == ["cpu-kernels", "per-layer-mask"] and row.expected_bytes is None
    emulated = rows_of(profile(header=header(**{**CPU_EMULATOR, "swiglu_fusion": None})))
    # the estimate of such a file prices the SwiGLU fused, as before the option was priced, and says so
    assert keys(emulated[("decoder.layers.1", "activations")]) == ["cpu-kernels", "unfused-swiglu-unrecorded"]
    assert emulated[("decoder.layers.1", "activations")].expected_bytes is not None
    recorded = rows_of(profile(header=header(**CPU_EMULATOR)))  # v4: swiglu_fusion false, priced
    assert recorded[("decoder.layers.1", "activations")].estimated_bytes \
        - emulated[("decoder.layers.1", "activations")].estimated_bytes == 4 * 32 * 1 * 128 == 16_384  # FP32: 4 s b h_ffn


def test_an_unfused_runs_fifth_h_ffn_tensor_is_priced_in_its_estimate(advisor, tmp_path):
    """A real core_v0.15.2 run in BF16 on the CPU (TINY: h_ffn 128; s 32, b 1, TP 1; stage 0 of
    PP 2 with layers 1 and 2, 4 microbatches, so 1F1B holds min(2 - 0, 4) = 2) whose header
    records --no-bias-swiglu-fusion (v4): each layer's estimate prices the eager SwiGLU's fifth
    h_ffn tensor, 2 s b h_ffn = 2 x 32 x 1 x 128 = 8,192 BF16 bytes more than the same run
    recorded fused; the activations in flight and the peak 2 x 2 x 8,192 = 32,768 more. The
    layer's hand count (110,848 bytes, as in the test above) is then against an estimate that
    counts its five h_ffn tensors. A file before v4 (unknown) is priced fused, as before."""
    def rows(fusion):
        return rows_of(profile(header=header(params_dtype="bfloat16", megatron_core_version="0.15.2",
                                             swiglu_fusion=fusion)))

    unfused, fused, unknown = rows(False), rows(True), rows(None)
    assert 2 * 32 * 1 * 128 == 8_192 and 2 * 2 * 8_192 == 32_768
    for module in ("decoder.layers.0", "decoder.layers.1"):
        row = unfused[(module, "activations")]
        assert row.estimated_bytes - fused[(module, "activations")].estimated_bytes == 8_192
        assert unknown[(module, "activations")].estimated_bytes == fused[(module, "activations")].estimated_bytes
    for term in ("activations in flight", "peak"):
        assert unfused[("stage", term)].estimated_bytes - fused[("stage", term)].estimated_bytes == 32_768
        assert unknown[("stage", term)].estimated_bytes == fused[("stage", term)].estimated_bytes
    second = unfused[("decoder.layers.1", "activations")]
    assert second.expected_bytes == 110_848 and keys(second) == ["cpu-kernels", "unfused-swiglu"]
    assert second.expected_ratio == pytest.approx(110_848 / (fused[("decoder.layers.1", "activations")]
                                                             .estimated_bytes + 8_192))
    profile(header=header(params_dtype="bfloat16", megatron_core_version="0.15.2", swiglu_fusion=False)).write(tmp_path)
    text = " ".join(advisor("profile", "show", tmp_path, "--section", "compare").stdout.split())
    assert "5 s b h_ffn elements, which the estimate prices (Eq. 12's 4 and the fifth, 2 s b h_ffn bytes in BF16)" \
        in text


@pytest.mark.parametrize("version,per_call", [("0.15.2", False), ("0.15.0rc1", False), ("0.16.1", True),
                                              ("0.19.0", True), ("1.0.0", True), ("unknown", None), ("0", None),
                                              ("0.x.1", None)])
def test_which_megatron_core_builds_its_default_causal_mask_per_call(version, per_call):
    """The release fact behind the per-layer mask, in advisor.releases: core_v0.15.2's
    get_default_causal_mask is @lru_cache'd, the 0.16.1 wheel's and core_v0.19.0's are not
    (read in each; measured by the real launches of tests/test_launch_run.py); a version string
    it cannot read is None, which the hand count then leaves uncounted."""
    from advisor.releases import default_causal_mask_per_call
    assert default_causal_mask_per_call(version) is per_call


def test_a_local_stage_without_layers_gets_no_buffer_reason():
    """The local attention's global memory buffer is asked for by the layers' attention: TINY at
    s 32, b 1, a 4, t 1, 2 b a s^2 = 8,192 BF16 bytes, 16,384 in this FP32 run, on a stage with
    layers, on top of its other estimated terms; a first stage of the embedding alone (layers 0
    and 4 on PP 2) is priced without it, and its peak row does not name it."""
    def peak_over_terms(rank) -> tuple[float, list[str]]:
        rows = rows_of(rank)
        terms = sum(rows[("stage", term)].estimated_bytes
                    for term in ("weights", "gradients", "optimizer", "activations in flight"))
        return rows[("stage", "peak")].estimated_bytes - terms, keys(rows[("stage", "peak")])

    with_layers = profile()
    embedding_only = profile(header=header(layers_per_stage=(0, 4), stage_layers=()),
                             layers=(layer("embedding", "embedding", None),))
    assert peak_over_terms(with_layers) == (2 * 1 * 4 * 32 * 32 * 2, ["local-buffer"])
    assert peak_over_terms(embedding_only) == (0.0, [])
