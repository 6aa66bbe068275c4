"""``advisor profile show`` on a symbolic MoE layer profile (advisor/moe/layer_profile.py): the
committed real-size DeepSeek-V3 layer (examples/symbolic/deepseek-v3-moe-layer-ep8, made by
``python -m megatron_hooks.moe_layer deepseek-v3 --ep 8 --dispatcher alltoall --out ...``), its
analytic terms against hand counts, and bad files refused in one line; the layers measured on an
H200 (benchmarks/gpu/data/h200_moe_layers: the cuda backend's local spec, and the symbolic
backend's builds beside it), whose build the analytic terms do not price, said so. No torch."""

import json

from conftest import ROOT

from advisor.cli import profile as profile_cli
from advisor.moe import layer_profile

EXAMPLE = ROOT / "examples" / "symbolic" / "deepseek-v3-moe-layer-ep8"
S, H, A, E, K, FS = 4096, 7168, 128, 256, 8, 2048
QL, KL, DN, DR, DV = 1536, 512, 128, 64, 128


def test_the_cli_knows_the_file_name_without_importing_the_moe_package():
    assert profile_cli.MOE_LAYER_FILE == layer_profile.FILENAME


def test_show_compares_each_term_and_fits_100_columns(advisor, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    out = advisor("profile", "show", EXAMPLE).stdout
    assert max(map(len, out.splitlines())) <= 100
    assert "EP 8, alltoall dispatcher" in out and "layer activations" in out


def test_json_carries_the_rows_with_hand_derived_analytic_terms(advisor):
    doc = advisor.json("profile", "show", EXAMPLE)
    assert doc["moe_layer"]["ep"] == 8 and doc["moe_layer"]["dispatcher"] == "alltoall"
    rows = {row["term"]: row for row in doc["compare"]}
    # MLA per token (advisor.moe.memory.attention_activation_bytes at TP 1): norm and down-projection
    # inputs, the latents before their norms (kv's with its RoPE part), the normed latents, Q, K, V
    # and the attention output, BF16
    mla = 2 * (2 * H + QL + KL + DR) + 2 * (QL + KL) + 2 * A * (2 * (DN + DR) + DV) + 2 * A * DV
    assert rows["attention activations"]["analytic_bytes"] == S * mla
    # the router per token: the norm's input, rstd and output, 2h + 4 + 2h; sigmoid's FP32 scores 4E,
    # the top-k's int64 indices 8k, the picked FP32 scores 4k and their sum 4 (no balancing loss: the
    # measured layer has none); the shared expert's fused SwiGLU, 6 f_s per token (mlp.py)
    assert rows["router activations"]["analytic_bytes"] == S * (4 * H + 4 + 4 * E + 12 * K + 4)
    assert rows["shared expert activations"]["analytic_bytes"] == S * 6 * FS
    # N k copies under balanced routing: 2h + 4f + 2f + 4 (FP32 prob) + 8 (int64 index) each; the
    # alltoall permutation's masked_select: the FP32 probabilities and bool map, 5E per token
    assert rows["expert + dispatch activations"]["analytic_bytes"] == S * K * (2 * H + 6 * 2048 + 12) + S * 5 * E
    total = rows["layer activations"]
    assert total["measured_bytes"] == sum(doc["moe_layer"]["activation_bytes"].values())
    assert abs(total["ratio"] - 1) < 0.05
    assert rows["layer weights (BF16)"]["ratio"] == 1


def test_bad_profiles_are_refused_in_one_line(advisor, tmp_path):
    doc = json.loads((EXAMPLE / layer_profile.FILENAME).read_text())
    (tmp_path / layer_profile.FILENAME).write_text(json.dumps({**doc, "ep": 3}))
    assert "EP 3 must divide the 256 experts" in advisor.error("profile", "show", tmp_path)
    (tmp_path / layer_profile.FILENAME).write_text(json.dumps({**doc, "version": 2, "dispatcher": "flex"}))
    assert "dispatcher must be one of allgather, alltoall, got 'flex'" in advisor.error("profile", "show", tmp_path)
    (tmp_path / layer_profile.FILENAME).write_text(json.dumps({**doc, "version": 2, "tp": 2}))
    assert "multi-latent attention at TP > 1" in advisor.error("profile", "show", tmp_path)
    (tmp_path / layer_profile.FILENAME).write_text(json.dumps({**doc, "version": 2, "capacity_factor": 0}))
    assert "capacity_factor" in advisor.error("profile", "show", tmp_path)
    (tmp_path / layer_profile.FILENAME).write_text(json.dumps({**doc, "activation_bytes": {"attention": 1}}))
    assert "activation_bytes must map exactly" in advisor.error("profile", "show", tmp_path)
    (tmp_path / layer_profile.FILENAME).write_text(json.dumps({**doc, "version": 2, "backend": "tpu"}))
    assert "backend must be one of" in advisor.error("profile", "show", tmp_path)
    (tmp_path / layer_profile.FILENAME).write_text(json.dumps({**doc, "version": 5}))
    assert "not a" in advisor.error("profile", "show", tmp_path)
    (tmp_path / layer_profile.FILENAME).write_text(json.dumps({**doc, "version": 3}))  # v3 must say its build
    assert "layer_spec is missing (it must be one of local, transformer_engine)" in advisor.error("profile", "show", tmp_path)
    (tmp_path / layer_profile.FILENAME).write_text(json.dumps({**doc, "version": 3, "layer_spec": "local",
                                                               "kernels": "tpu"}))
    assert "kernels must be one of cuda, cpu, got 'tpu'" in advisor.error("profile", "show", tmp_path)
    (tmp_path / layer_profile.FILENAME).write_text("[1, 2")
    advisor.error("profile", "show", tmp_path)
    assert "compare section only" in advisor.error("profile", "show", EXAMPLE, "--section", "layers")


def test_a_version_2_profile_prices_its_tp_etp_and_capacity(advisor, tmp_path):
    """Version 2 records TP, ETP and the capacity factor; the analytic terms follow them: N = s / t
    tokens routed here, f N k etp copies at capacity f, each with the experts' width over etp and
    the permutation's int64 index once per copy routed here (advisor.moe.memory)."""
    from advisor.moe.spec import PRESETS

    doc = json.loads((EXAMPLE / layer_profile.FILENAME).read_text())
    mixtral = PRESETS["mixtral-8x7b"]
    v2 = {**doc, "version": 2, "model": mixtral.to_dict(), "tp": 2, "ep": 4, "etp": 2, "capacity_factor": 1.5}
    (tmp_path / layer_profile.FILENAME).write_text(json.dumps(v2))
    rows = {row["term"]: row for row in advisor.json("profile", "show", tmp_path)["compare"]}
    n, k, h, f = 4096 // 2, 2, 4096, 14336
    copies = 1.5 * n * k * 2
    # padded to capacity the alltoall permutation keeps a second int64 index per padded copy sent
    # (the probabilities' 1-D index) and no masked_select
    assert rows["expert + dispatch activations"]["analytic_bytes"] == copies * (2 * (h + 3 * f // 2) + 4) \
        + 2 * 1.5 * n * k * 8
    # the norm (4h + 4), top-k indices and softmax (12k), the capacity mask (bool, E)
    assert rows["router activations"]["analytic_bytes"] == n * (4 * h + 4 + 12 * k + 8)
    out = advisor("profile", "show", tmp_path).stdout
    assert "TP 2, EP 4, ETP 2, alltoall dispatcher, capacity 1.5 (padded)" in " ".join(out.split())
    assert "capacity routing" in " ".join(out.split())


GPU_DATA = ROOT / "benchmarks" / "gpu" / "data" / "h200_moe_layers"
TERM_OF_PART = {"attention": "attention activations", "router": "router activations",
                "dispatch": "expert + dispatch activations", "experts": "expert + dispatch activations",
                "shared_experts": "shared expert activations"}


def test_compare_rows_are_the_terms_a_note_can_name():
    doc = json.loads((EXAMPLE / layer_profile.FILENAME).read_text())
    rows = layer_profile.compare(layer_profile.from_dict(doc, "x"))
    assert tuple(row["term"] for row in rows) == layer_profile.TERMS


def _changed_terms(a: str, b: str) -> set[str]:
    """The analytic terms whose measured parts differ between two committed measurements."""
    first, second = (json.loads((GPU_DATA / name / layer_profile.FILENAME).read_text()) for name in (a, b))
    assert first["parameter_bytes"] == second["parameter_bytes"]  # the build never changes the weights
    return {TERM_OF_PART[part] for part in layer_profile.PARTS
            if first["activation_bytes"][part] != second["activation_bytes"][part]}


def test_the_terms_a_note_names_are_those_the_build_changed_on_the_gpu():
    """BUILD_DIFFERENCES against the H200's measurements: the real local-spec layer (cuda) and the
    symbolic TE-spec one differ in exactly the spec's terms; the local spec on CUDA and on CPU
    kernels (both symbolic) in exactly the kernels' terms. (Neither model has shared experts:
    tests/test_symbolic_moe.py measures those.)"""
    spec_terms, _ = layer_profile.BUILD_DIFFERENCES["layer_spec"]
    kernel_terms, _ = layer_profile.BUILD_DIFFERENCES["kernels"]
    for pair in ("qwen3-30b-a3b-allgather", "qwen3-30b-a3b-alltoall", "mixtral-8x7b-allgather",
                 "mixtral-8x7b-alltoall"):
        assert _changed_terms(f"{pair}-cuda", f"{pair}-symbolic") == set(spec_terms) - {"shared expert activations"}
        assert _changed_terms(f"{pair}-symbolic-local-cuda", f"{pair}-symbolic-local-cpu") == set(kernel_terms)


def test_a_cuda_profile_of_the_local_spec_says_the_terms_price_the_te_spec(advisor, monkeypatch):
    """The H200's Qwen3-30B-A3B layer (cuda backend, a v2 file: the local spec, the only one that
    backend builds): attention reads 23x because megatron-core's unfused attention keeps the s x s
    scores (FP32 softmax and BF16 probabilities: 6 a s^2 bytes; measured while the emulator's
    config kept attention_softmax_in_fp32 on, the dataclass default), which the TE spec's terms do
    not price. The page says so, naming the terms, in the table and in JSON."""
    directory = GPU_DATA / "qwen3-30b-a3b-allgather-cuda"
    doc = advisor.json("profile", "show", directory)
    assert (doc["moe_layer"]["layer_spec"], doc["moe_layer"]["kernels"]) == ("local", "cuda")
    attention = {row["term"]: row for row in doc["compare"]}["attention activations"]
    heads, s = 32, 4096
    assert attention["measured_bytes"] > 6 * heads * s * s > 20 * attention["analytic_bytes"]
    note = doc["build_note"]
    assert note["priced"] == {"layer_spec": "transformer_engine", "kernels": "cuda"} and note["unknown"] == []
    assert note["terms"] == ["attention activations", "expert + dispatch activations", "shared expert activations",
                             "layer activations"]
    monkeypatch.setenv("COLUMNS", "100")
    out = advisor("profile", "show", directory).stdout
    assert max(map(len, out.splitlines())) <= 100
    text = " ".join(out.split())
    assert "note: built with megatron-core's local spec on CUDA kernels, but the analytic terms price the " \
           "Transformer Engine spec on CUDA kernels: its attention, expert + dispatch, shared expert and layer " \
           "activations compare different code" in text
    assert "s x s scores" in text


def test_a_version_3_profile_says_its_build_and_a_te_one_has_no_note(advisor, tmp_path):
    """A v3 file records its build: the local spec on CPU kernels names the kernels' terms too (the
    router's norm); the TE spec on CUDA kernels, what the terms price, has no note."""
    doc = json.loads((GPU_DATA / "mixtral-8x7b-allgather-symbolic-local-cpu" / layer_profile.FILENAME).read_text())
    (tmp_path / layer_profile.FILENAME).write_text(json.dumps({**doc, "version": 3, "layer_spec": "local",
                                                               "kernels": "cpu"}))
    note = advisor.json("profile", "show", tmp_path)["build_note"]
    assert note["terms"] == list(layer_profile.TERMS[:-1])  # every activation term, not the weights
    (tmp_path / layer_profile.FILENAME).write_text(json.dumps({**doc, "version": 3, "layer_spec": "transformer_engine",
                                                               "kernels": "cuda"}))
    assert advisor.json("profile", "show", tmp_path)["build_note"] is None
    assert "note:" not in advisor("profile", "show", tmp_path).stdout


def test_an_old_profile_says_its_build_is_unknown_only_where_it_is(advisor):
    """v1 and v2 files do not record the build. A v2 symbolic layer could be either spec, on either
    kernels (these two H200 files hold the same layer built both ways): "unknown", and the note
    says what that leaves open. The cuda backend builds only the local spec (above); DeepSeek-V3's
    multi-latent attention builds only with the TE spec, and version 1 ran only the CUDA stand-ins:
    the committed v1 DeepSeek-V3 layer is what the terms price, and has no note."""
    for name in ("mixtral-8x7b-alltoall-symbolic", "mixtral-8x7b-alltoall-symbolic-local-cpu"):
        doc = advisor.json("profile", "show", GPU_DATA / name)
        assert (doc["moe_layer"]["layer_spec"], doc["moe_layer"]["kernels"]) == ("unknown", "unknown")
        assert doc["build_note"]["unknown"] == ["layer spec", "kernels"]
        assert "if the layer was built otherwise" in doc["build_note"]["note"]
    example = advisor.json("profile", "show", EXAMPLE)
    assert json.loads((EXAMPLE / layer_profile.FILENAME).read_text())["version"] == 1
    assert (example["moe_layer"]["layer_spec"], example["moe_layer"]["kernels"]) == ("transformer_engine", "cuda")
    assert example["build_note"] is None


def test_a_version_4_profile_compares_its_transient_peaks(advisor, tmp_path):
    """A v4 file's transient peaks (the symbolic backend's) beside the analytic peak, by hand for
    DeepSeek-V3 EP 8 alltoall (N 4096, k 8, h 7168, 32 local experts): at the unsort, the send
    buffer S = N k 2h = 448 MiB, the all-to-all's output 448, the experts' output 448, its unsorted
    copy 448, the shared experts' output N 2h = 56, the routing the dispatcher holds N E 5 B =
    5 MiB and the received FP32 probabilities c x 4 B = 0.125: 1853.125 MiB; a v3 file (no peaks)
    has no such row."""
    doc = json.loads((EXAMPLE / layer_profile.FILENAME).read_text())
    doc.update(version=4, layer_spec="transformer_engine", kernels="cuda",
               transient_bytes={"forward_peak": 1853 * 2**20, "backward_peak": 901 * 2**20})
    (tmp_path / layer_profile.FILENAME).write_text(json.dumps(doc))
    rows = {row["term"]: row for row in advisor.json("profile", "show", tmp_path)["compare"]}
    row = rows[layer_profile.TRANSIENT_TERM]
    assert row["analytic_bytes"] == 1853.125 * 2**20 and row["measured_bytes"] == 1853 * 2**20
    doc.pop("transient_bytes")
    (tmp_path / layer_profile.FILENAME).write_text(json.dumps({**doc, "version": 3}))
    assert layer_profile.TRANSIENT_TERM not in {row["term"] for row in advisor.json("profile", "show", tmp_path)["compare"]}
