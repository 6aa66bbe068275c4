"""megatron-core's MoE layer on fake tensors (megatron_hooks/moe_layer.py): hand counts of what each
part keeps on a small layer, and a real-size Mixtral 8x7B layer against advisor.moe's analytic
terms, each difference accounted for term by term (README, "MoE layers measured symbolically")."""

import json
import subprocess
import sys

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install -e '.[megatron]')")

from conftest import ROOT  # noqa: E402

SCRIPT = """
import dataclasses, json
from megatron_hooks.emulate import quiet_megatron; quiet_megatron()
from advisor.moe.spec import PRESETS
from megatron_hooks.moe_layer import compare, measure_moe_layer
mixtral = PRESETS["mixtral-8x7b"]
small = dataclasses.replace(mixtral, hidden_size=64, moe_ffn_hidden_size=32, ffn_hidden_size=96,
                            num_attention_heads=4, num_query_groups=2, vocab_size=256)
out = {"small": dataclasses.asdict(measure_moe_layer(small, seq_len=32))}
real = measure_moe_layer(mixtral, seq_len=4096)
out["real"] = {row["term"]: row for row in compare(mixtral, real, seq_len=4096)}
try:
    measure_moe_layer(PRESETS["deepseek-v3"], seq_len=64)
except NotImplementedError as exc:
    out["mla"] = str(exc)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def measured():
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def per_token_attention(h, a, g, d):
    """What the TE-spec attention keeps per token, by hand from the code paths (BF16 2 B, FP32 4 B):
    the RMSNorm's input (2h) and FP32 rstd (4), the QKV GEMM's input (2h), the fused RoPE's FP32
    frequencies (4d), Q and K after RoPE (2ad, 2gd), V a view of the fused QKV output that keeps
    all of it (2(a + 2g)d), the attention output (2ad) and its FP32 softmax statistics (4a)."""
    return 2 * h + 4 + 2 * h + 4 * d + 2 * a * d + 2 * g * d + 2 * (a + 2 * g) * d + 2 * a * d + 4 * a


def test_each_part_keeps_the_hand_count(measured):
    """Small Mixtral-shaped layer: h 64, 4 heads of 16 on 2 KV groups, 8 experts of FFN 32, top-2,
    32 tokens (64 routed copies)."""
    s, h, a, g, d, E, k, f = 32, 64, 4, 2, 16, 8, 2, 32
    copies = s * k
    got = measured["small"]
    assert got["parameter_bytes"] == {
        "attention": 2 * (h + h * (a + 2 * g) * d + a * d * h),   # input norm, QKV, output projection
        "router": 2 * (h + E * h),                                # pre-MLP norm, gate
        "dispatch": 0, "experts": 2 * E * 3 * h * f, "shared_experts": 0}
    assert got["activation_bytes"] == {
        # + 16: the two uint64 RNG seed/offset values the cuDNN attention stand-in keeps
        "attention": s * per_token_attention(h, a, g, d) + 16,
        # norm input, rstd, gate input; top-k indices (int64) and probabilities (FP32)
        "router": s * (2 * h + 4 + 2 * h + 8 * k + 4 * k),
        # permutation indices (int64 per copy); masked_select of the probs: FP32 E x N and the bool map
        "dispatch": copies * 8 + s * E * (4 + 1),
        # FC1 input, SwiGLU input (2f), FP32 prob, FC2 input, per copy
        "experts": copies * (2 * h + 2 * 2 * f + 4 + 2 * f),
        "shared_experts": 0}


def test_a_real_size_mixtral_layer_against_the_analytic_terms(measured):
    """Mixtral 8x7B, sequence 4096, MBS 1, BF16: weights exact, activations within 5% of
    advisor.moe's terms, and each term's difference exactly the one the README explains."""
    rows = measured["real"]
    s, h, a, g, d, E, k = 4096, 4096, 32, 8, 128, 8, 2
    diff = {term: row["measured_bytes"] - row["analytic_bytes"] for term, row in rows.items()}
    assert diff["layer weights (BF16)"] == 0
    assert diff["attention activations"] == s * (2 * (a + 2 * g) * d - 2 * g * d + 4 * d + 4 * a + 4) + 16
    assert diff["router activations"] == s * (4 + 12 * k - 9 * E)
    # the allgather dispatcher's masked_select of the local probabilities: FP32 E and a bool E per token
    assert diff["expert + dispatch activations"] == s * 5 * E
    total = rows["layer activations"]
    assert abs(total["measured_bytes"] / total["analytic_bytes"] - 1) < 0.05


def test_multi_latent_attention_is_refused_in_one_line(measured):
    assert "multi-latent attention does not build without Transformer Engine" in measured["mla"]
