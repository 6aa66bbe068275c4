"""``advisor profile show`` on a symbolic MoE layer profile (advisor/moe/layer_profile.py): the
committed real-size DeepSeek-V3 layer (examples/symbolic/deepseek-v3-moe-layer-ep8, made by
``python -m megatron_hooks.moe_layer deepseek-v3 --ep 8 --dispatcher alltoall --out ...``), its
analytic terms against hand counts, and bad files refused in one line. No torch."""

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
    # the router's 2h + 2h and 9E per token; the shared expert's 8 f_s per token
    assert rows["router activations"]["analytic_bytes"] == S * (4 * H + 9 * E)
    assert rows["shared expert activations"]["analytic_bytes"] == S * 8 * FS
    # N k copies under balanced routing: 2h + 4f + 2f + 4 (FP32 prob) + 8 (int64 index) each
    assert rows["expert + dispatch activations"]["analytic_bytes"] == S * K * (2 * H + 6 * 2048 + 12)
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
    (tmp_path / layer_profile.FILENAME).write_text(json.dumps({**doc, "version": 3}))
    assert "not a" in advisor.error("profile", "show", tmp_path)
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
    assert rows["expert + dispatch activations"]["analytic_bytes"] == copies * (2 * (h + 3 * f // 2) + 4) + 1.5 * n * k * 8
    assert rows["router activations"]["analytic_bytes"] == n * (4 * h + 9 * 8)
    out = advisor("profile", "show", tmp_path).stdout
    assert "TP 2, EP 4, ETP 2, alltoall dispatcher, capacity 1.5 (padded)" in " ".join(out.split())
    assert "capacity routing" in " ".join(out.split())
