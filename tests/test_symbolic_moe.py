"""megatron-core's MoE layer on fake tensors (megatron_hooks/moe_layer.py): hand counts of what each
part keeps on small layers (Mixtral-shaped at EP 1 and at EP 4 with the alltoall dispatcher,
DeepSeek-V3-shaped with MLA), and real-size Mixtral 8x7B and DeepSeek-V3 (EP 8) layers against
advisor.moe's analytic terms, each difference accounted for term by term (docs/profiling.md,
"MoE layers measured symbolically"). Real megatron-core modules; the stand-ins are for CUDA, TE
and Triton kernels only (kernels.py, moe_fake.py)."""

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install -e '.[megatron]')")

from conftest import run_json_script  # noqa: E402
from doc_text import numbers, printed, table_after, text_of  # noqa: E402

SCRIPT = """
import dataclasses, json
from megatron_hooks.stage_emulation import quiet_megatron; quiet_megatron()
from advisor.moe.spec import PRESETS
from advisor.moe.layer_profile import compare
from megatron_hooks.moe_layer import measure_moe_layer
mixtral, deepseek = PRESETS["mixtral-8x7b"], PRESETS["deepseek-v3"]
small = dataclasses.replace(mixtral, hidden_size=64, moe_ffn_hidden_size=32, ffn_hidden_size=96,
                            num_attention_heads=4, num_query_groups=2, vocab_size=256)
small_mla = dataclasses.replace(
    deepseek, hidden_size=64, moe_ffn_hidden_size=32, ffn_hidden_size=96, shared_expert_size=32,
    num_attention_heads=4, num_query_groups=4, vocab_size=256, num_experts=16, moe_router_topk=4,
    router_num_groups=4, router_group_topk=2,
    mla=dataclasses.replace(deepseek.mla, q_lora_rank=24, kv_lora_rank=16, qk_head_dim=8,
                            qk_pos_emb_head_dim=4, v_head_dim=8))
out = {"small": measure_moe_layer(small, seq_len=32).to_dict(),
       "small_ep4": measure_moe_layer(small, seq_len=32, ep=4, dispatcher="alltoall").to_dict(),
       "small_mla": measure_moe_layer(small_mla, seq_len=32).to_dict()}
out["real"] = {row["term"]: row for row in compare(measure_moe_layer(mixtral, seq_len=4096))}
real = measure_moe_layer(deepseek, seq_len=4096, ep=8, dispatcher="alltoall")
out["deepseek"] = {row["term"]: row for row in compare(real)}
out["deepseek_profile"] = real.to_dict()
for name, layout in (("tp2_ep4", dict(tp=2, ep=4)), ("tp2_ep4_etp2", dict(tp=2, ep=4, etp=2)),
                     ("ep8_capacity", dict(ep=8, capacity_factor=1.25))):
    out[name] = {row["term"]: row for row in compare(measure_moe_layer(mixtral, seq_len=4096, dispatcher="alltoall",
                                                                       **layout))}
for name, model, ep, etp in (("allgather_ep1", "qwen3-30b-a3b", 1, 1), ("allgather_ep2", "mixtral-8x7b", 2, 1),
                             ("allgather_etp4", "qwen3-30b-a3b", 1, 4), ("allgather_qwen_ep2", "qwen3-30b-a3b", 2, 1),
                             ("allgather_qwen_ep2_etp2", "qwen3-30b-a3b", 2, 2)):
    allgather = measure_moe_layer(PRESETS[model], seq_len=4096, ep=ep, etp=etp, dispatcher="allgather")
    out[name] = {"rows": {row["term"]: row for row in compare(allgather)}, "peaks": allgather.to_dict()["transient_bytes"]}
qwen = PRESETS["qwen3-30b-a3b"]
for ep in (1, 2):
    capacity = measure_moe_layer(qwen, seq_len=4096, ep=ep, dispatcher="allgather", capacity_factor=1.25)
    out[f"allgather_capacity_ep{ep}"] = {"rows": {row["term"]: row for row in compare(capacity)},
                                         "peaks": capacity.transient_bytes}
out["a2a_etp4"] = measure_moe_layer(qwen, seq_len=4096, ep=2, etp=4, dispatcher="alltoall").transient_bytes
from megatron_hooks import moe_fake
def dropless(self, routing_map):
    # the worst a dropless router sends rank 0 (advisor.moe.memory's 'dropless'): every token of
    # every peer picks min(k, E / ep) of its experts; it sends its own N k as balanced
    n, k, local = routing_map.size(0), self.config.moe_router_topk, self.num_local_experts
    return moe_fake.set_alltoall_splits(self, moe_fake.balanced_split(n * k, self.num_experts),
                                        moe_fake.balanced_split(n * min(k, local), local))
balanced, moe_fake._alltoall_preprocess = moe_fake._alltoall_preprocess, dropless
for ep in (8, 128):
    out[f"a2a_dropless_ep{ep}"] = measure_moe_layer(qwen, seq_len=4096, ep=ep, dispatcher="alltoall").transient_bytes
moe_fake._alltoall_preprocess = balanced
out["a2a_capacity_ep8"] = measure_moe_layer(qwen, seq_len=4096, ep=8, dispatcher="alltoall",
                                            capacity_factor=1.25).transient_bytes
try:
    measure_moe_layer(small_mla, seq_len=32, layer_spec="local")
except NotImplementedError as exc:
    out["mla"] = str(exc)
for name, layout in (("flex", dict(ep=4, dispatcher="flex")), ("mla_tp2", dict(tp=2, ep=4, dispatcher="alltoall"))):
    try:
        measure_moe_layer(small_mla if name == "mla_tp2" else small, seq_len=32, **layout)
    except (ImportError, ValueError) as exc:
        out[name] = f"{type(exc).__name__}: {exc}"
for dispatcher in ("allgather", "alltoall"):  # the CPU backend: real tensors over gloo, and the same spec symbolically
    cpu = measure_moe_layer(small, seq_len=32, layer_spec="local", kernels="cpu", backend="cpu", dispatcher=dispatcher)
    out[f"cpu_{dispatcher}"] = cpu.to_dict()
    out[f"cpu_symbolic_{dispatcher}"] = measure_moe_layer(small, seq_len=32, layer_spec="local", kernels="cpu",
                                                          dispatcher=dispatcher).to_dict()
out["cpu_compare"] = {row["term"]: row for row in compare(cpu)}
shared = dataclasses.replace(small, shared_expert_size=32)  # the build's effect on shared experts too
out["shared_builds"] = {spec: measure_moe_layer(shared, seq_len=32, layer_spec=spec).to_dict()
                        for spec in ("transformer_engine", "local")}
try:
    import deep_ep
except ImportError as exc:
    out["deep_ep"] = f"{type(exc).__name__}: {exc}"
import torch
out["torch_cuda"] = torch.version.cuda
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def measured():
    return run_json_script(SCRIPT)


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
    # the router term counts its tensors one by one (advisor.moe.memory.router_activation_bytes: the
    # norm's rstd, the top-k's indices and probabilities) and the dispatch term the allgather
    # dispatcher's masked_select of the local probabilities (FP32 E and a bool E per token)
    assert diff["router activations"] == 0
    assert diff["expert + dispatch activations"] == 0
    total = rows["layer activations"]
    assert abs(total["measured_bytes"] / total["analytic_bytes"] - 1) < 0.05


def test_expert_parallel_alltoall_keeps_the_hand_count(measured):
    """The small layer at EP 4 with the alltoall dispatcher (torch's fake process group, rank 0 of
    4): 2 of the 8 experts here, and under balanced routing the N k = 64 copies this rank sends
    come back as the 64 its two experts receive."""
    s, h, E, k, f, ep = 32, 64, 8, 2, 32, 4
    copies = s * k
    got = measured["small_ep4"]
    assert got["parameter_bytes"]["experts"] == 2 * (E // ep) * 3 * h * f
    assert got["activation_bytes"]["experts"] == copies * (2 * h + 2 * 2 * f + 4 + 2 * f)
    # the permutation before the all-to-all: int64 index per copy; masked_select of the FP32
    # probabilities over all E experts and the bool routing map
    assert got["activation_bytes"]["dispatch"] == copies * 8 + s * E * (4 + 1)
    assert got["activation_bytes"]["router"] == measured["small"]["activation_bytes"]["router"]


def test_multi_latent_attention_keeps_the_hand_count(measured):
    """A small DeepSeek-V3-shaped layer (MLA, sigmoid routing with expert bias and groups, a shared
    expert): h 64, 4 heads, q_lora 24, kv_lora 16, d_nope 8, d_rope 4, d_v 8, 16 experts of 32,
    top-4, shared expert 32, 32 tokens."""
    s, h, a, ql, kl, dn, dr, dv, E, k, f, fs = 32, 64, 4, 24, 16, 8, 4, 8, 16, 4, 32, 32
    got = measured["small_mla"]
    assert got["parameter_bytes"]["attention"] == 2 * (
        h + h * ql + ql + h * (kl + dr) + kl + ql * a * (dn + dr) + kl * a * (dn + dv) + a * dv * h)
    per_token = (2 * h + 2 * h            # input norm's input; the down projections' input (one tensor)
                 + 2 * ql + 2 * (kl + dr)  # the latent norms' inputs (kv's a view of the kv_lora + d_rope output)
                 + 2 * ql + 2 * kl         # the up projections' inputs (the normed latents)
                 + 3 * 4                   # three FP32 rstd
                 + 2 * 2 * dr              # the fused YaRN RoPE's cos and sin, BF16, per position
                 + 2 * 2 * a * (dn + dr)   # Q and K (new tensors from the fused RoPE)
                 + 2 * a * dv + 2 * a * dv  # V; the attention output (the projection's input)
                 + 4 * a)                  # FP32 softmax statistics
    assert got["activation_bytes"]["attention"] == s * per_token + 16
    # norm input and rstd, router input; sigmoid scores FP32 (4E), top-k indices int64 and the
    # normalised top-k probabilities FP32 with their FP32 sum (group-limited selection keeps nothing)
    assert got["activation_bytes"]["router"] == s * (2 * h + 4 + 2 * h + 4 * E + 8 * k + 4 * k + 4)
    assert got["activation_bytes"]["shared_experts"] == s * (2 * 2 * fs + 2 * fs)  # fused SwiGLU input, FC2 input
    assert got["activation_bytes"]["experts"] == s * k * (2 * h + 2 * 2 * f + 4 + 2 * f)


def test_a_real_size_deepseek_v3_layer_against_the_analytic_terms(measured):
    """DeepSeek-V3, sequence 4096, MBS 1, BF16, EP 8 with the alltoall dispatcher (32 of the 256
    experts on this rank): weights exact, activations within 5%, and each term's difference the
    one docs/profiling.md explains."""
    rows = measured["deepseek"]
    s, h, a, dr, E, k, fs = 4096, 7168, 128, 64, 256, 8, 2048
    diff = {term: row["measured_bytes"] - row["analytic_bytes"] for term, row in rows.items()}
    assert rows["layer weights (BF16)"]["measured_bytes"] == 2 * (
        2 * h + h * 1536 + 1536 + h * (512 + dr) + 512 + 1536 * a * 192 + 512 * a * 256 + a * 128 * h
        + E * h + 3 * h * fs + E // 8 * 3 * h * 2048)
    assert diff["layer weights (BF16)"] == 0
    assert diff["attention activations"] == s * (3 * 4 + 4 * dr + 4 * a) + 16
    assert diff["router activations"] == 0  # sigmoid's scores, the top-k, the picked scores and their sum
    assert diff["expert + dispatch activations"] == 0  # the alltoall permutation's masked_select, 5E
    assert diff["shared expert activations"] == 0  # the fused SwiGLU's 6 f_s (8 f_s was priced until 2026-11-29)
    total = rows["layer activations"]
    assert abs(total["measured_bytes"] / total["analytic_bytes"] - 1) < 0.05


def _analytic_measured(cell: str, row: dict | None) -> None:
    """A doc cell 'analytic / measured MiB (+x.x%)' against a compared row (None: the part is absent, 0 / 0)."""
    analytic, measured = (0, 0) if row is None else (row["analytic_bytes"], row["measured_bytes"])
    shown = numbers(cell)
    assert shown[:2] == [printed(analytic / 2**20, shown[0]), printed(measured / 2**20, shown[1])], cell
    if len(shown) > 2:  # the measured excess, in %
        assert shown[2] == printed((measured / analytic - 1) * 100, shown[2]), cell


def test_docs_profiling_md_tables_are_these_measurements(measured):
    """docs/profiling.md's two MoE tables, written by hand from this module's runs: each MiB and %
    as the measurement and advisor.moe's terms give them now, to the doc's printed precision."""
    rows = table_after("docs/profiling.md", "| term | Mixtral analytic / measured MiB |")
    assert len(rows) == 6 and {row[0] for row in rows} <= set(measured["deepseek"])  # the transient row apart
    for term, mixtral, deepseek, _ in rows:
        _analytic_measured(mixtral, measured["real"].get(term))
        _analytic_measured(deepseek, measured["deepseek"][term])
    layouts = {"TP 2, EP 4": "tp2_ep4", "TP 2, EP 4, ETP 2": "tp2_ep4_etp2", "EP 8, capacity 1.25": "ep8_capacity"}
    rows = table_after("docs/profiling.md", "| layout | attention | router | expert + dispatch | layer |")
    assert [row[0] for row in rows] == list(layouts)
    for row in rows:
        _analytic_measured(row[4], measured[layouts[row[0]]]["layer activations"])
    cpu, text = measured["cpu_compare"], text_of("docs/profiling.md")  # the CPU backend's paragraph
    attention, layer = cpu["attention activations"], cpu["layer activations"]
    assert f"{attention['measured_bytes']:,} B against {attention['analytic_bytes']:,}" in text
    assert (f"The layer: {layer['measured_bytes']:,} B against {layer['analytic_bytes']:,} "
            f"({layer['measured_bytes'] / layer['analytic_bytes'] - 1:+.0%})") in text


def test_multi_latent_attention_on_the_local_spec_is_refused_in_one_line(measured):
    assert "multi-latent attention builds with the transformer_engine layer spec only" in measured["mla"]


def _mixtral_differences(rows: dict, tp: int) -> tuple[dict, int, int]:
    """(measured - analytic per term, s, N = s / tp tokens on this rank), weights exact."""
    diff = {term: row["measured_bytes"] - row["analytic_bytes"] for term, row in rows.items()}
    assert diff.pop("layer weights (BF16)") == 0
    total = rows["layer activations"]
    assert abs(total["measured_bytes"] / total["analytic_bytes"] - 1) < 0.05
    return diff, 4096, 4096 // tp


@pytest.mark.parametrize("layout", ["tp2_ep4", "tp2_ep4_etp2"])
def test_a_real_size_mixtral_layer_at_tp_2_against_the_analytic_terms(measured, layout):
    """Mixtral 8x7B at TP 2 (sequence parallel), EP 4, alltoall, ETP 1 and 2: weights exact,
    activations within 5%, each term's difference the TP 1 one with what TP splits split: the
    fused QKV output that V keeps and the softmax statistics over t, the RMSNorm's rstd over t
    (sequence parallel), the RoPE frequencies whole; per routed token (N = s / t) the router's
    and the dispatch's as at TP 1. At ETP 2 the experts see twice the copies, half as wide, and
    the permutation's index stays one per copy this rank routes (advisor.moe.memory prices it so)."""
    a, g, d, E, k, t = 32, 8, 128, 8, 2, 2
    diff, s, n = _mixtral_differences(measured[layout], t)
    assert diff["attention activations"] == s * ((2 * (a + 2 * g) * d - 2 * g * d) // t + 4 * d + 4 * a // t + 4 // t) + 16
    assert diff["router activations"] == 0
    assert diff["expert + dispatch activations"] == 0


def test_token_dropping_padded_to_capacity_against_the_analytic_terms(measured):
    """Mixtral 8x7B, EP 8, alltoall, --moe-expert-capacity-factor 1.25 padded to capacity: every
    expert gets ceil(N k / E x 1.25) = 1280 copies, 10,240 here, which is what capacity routing
    prices. The router also keeps the capacity mask it multiplies the probabilities by (bool, E
    per token); the dispatch keeps two int64 index vectors per padded copy (the tokens' argsort and
    the probabilities' 1-D index, permute(drop_and_pad=True)), and no masked_select (no FP32 E x N
    probabilities and bool map): each priced as such (advisor.moe.memory.capacity_mask_bytes,
    dispatch_activation_bytes)."""
    E, k = 8, 2
    diff, s, n = _mixtral_differences(measured["ep8_capacity"], 1)
    copies = -(-n * k * 5 // (E * 4)) * E  # ceil(N k / E x 1.25) per expert, every expert padded
    assert copies == 10240
    assert diff["router activations"] == 0  # the capacity mask priced (memory.capacity_mask_bytes)
    assert diff["expert + dispatch activations"] == 0  # the 1-D index priced per padded copy sent


def test_what_cannot_be_measured_here_says_why(measured):
    """The flex dispatcher needs DeepEP, which is CUDA code (its build needs a CUDA torch; this one
    is CPU only): megatron-core refuses to build the layer without it. MLA at TP > 1 needs TE's
    duplicated down projections, which have no stand-in."""
    assert measured["torch_cuda"] is None
    assert measured["deep_ep"] == "ModuleNotFoundError: No module named 'deep_ep'"
    assert measured["flex"].startswith("ImportError: DeepEP is not installed. Please install DeepEP package from "
                                       "https://github.com/deepseek-ai/deepep.")
    assert measured["mla_tp2"].startswith("ValueError: multi-latent attention at TP > 1")


@pytest.mark.parametrize("dispatcher", ["allgather", "alltoall"])
def test_the_cpu_backend_measures_what_the_symbolic_one_does(measured, dispatcher):
    """A real megatron-core MoE layer executing on the CPU (real tensors and values, real routing,
    one gloo rank), the local spec on torch's CPU kernels: every part's parameters and kept
    activations, and the gradients, equal the symbolic backend's with the same spec and kernels
    byte for byte (at EP 1 every routed copy is this rank's, so the balanced split changes no byte)."""
    cpu, symbolic = measured[f"cpu_{dispatcher}"], measured[f"cpu_symbolic_{dispatcher}"]
    assert (cpu["backend"], symbolic["backend"]) == ("cpu", "symbolic")
    for key in ("parameter_bytes", "activation_bytes", "gradient_bytes"):
        assert cpu[key] == symbolic[key], key


def test_the_cpu_backend_against_the_analytic_terms(measured):
    """The small layer on the CPU (local spec, BF16, s 32): what it keeps by hand, and each term's
    difference from advisor.moe's (which price the TE spec on a GPU): torch's CPU RMSNorm keeps
    an FP32 copy of its input and x rsqrt (4h + 4h + 4 per token) where the fused kernel keeps the
    BF16 input and rstd; the unfused attention keeps its BF16 s x s scores (torch's BF16 softmax:
    --attention-softmax-in-fp32 off, as in Megatron-LM's arguments) and the shared causal mask, K
    and V expanded to every head, RoPE's cos and sin; the local experts' unfused SwiGLU keeps 6
    h_moe more per copy."""
    s, h, a, d, E, k, f = 32, 64, 4, 16, 8, 2, 32
    rows = measured["cpu_compare"]
    diff = {term: row["measured_bytes"] - row["analytic_bytes"] for term, row in rows.items()}
    assert diff["layer weights (BF16)"] == 0
    # the norm (FP32 input, x rsqrt, rsqrt), its BF16 output (QKV input), Q, K and V on all heads,
    # the context: s (18 h + 4); cos and sin for Q and K (8 s d); BF16 scores 2 a s^2; mask s^2:
    # 32 x 1156 + 4096 + 8192 + 1024 = 50,304 (66,688 while the emulator's softmax also kept FP32, 4 a s^2)
    assert rows["attention activations"]["measured_bytes"] == s * (18 * h + 4) + 8 * s * d + 2 * a * s * s + s * s \
        == 50_304
    assert diff["router activations"] == s * 6 * h
    assert diff["expert + dispatch activations"] == s * k * 6 * f


def test_each_profile_records_its_build_and_the_local_spec_changes_the_terms_its_note_names(measured):
    """The profile says which layer spec built the layer and which kernels it ran (schema v3); on a
    small layer with shared experts, the local spec (CUDA stand-ins) keeps different bytes from the
    TE spec in exactly the terms ``BUILD_DIFFERENCES`` names for it, and the same weights."""
    from advisor.moe.layer_profile import BUILD_DIFFERENCES, PARTS

    builds = {name: (measured[name]["layer_spec"], measured[name]["kernels"])
              for name in ("small", "cpu_allgather", "cpu_symbolic_allgather")}
    assert builds == {"small": ("transformer_engine", "cuda"), "cpu_allgather": ("local", "cpu"),
                      "cpu_symbolic_allgather": ("local", "cpu")}
    te, local = measured["shared_builds"]["transformer_engine"], measured["shared_builds"]["local"]
    assert te["parameter_bytes"] == local["parameter_bytes"] and local["layer_spec"] == "local"
    term = {"attention": "attention activations", "router": "router activations",
            "dispatch": "expert + dispatch activations", "experts": "expert + dispatch activations",
            "shared_experts": "shared expert activations"}
    changed = {term[part] for part in PARTS if te["activation_bytes"][part] != local["activation_bytes"][part]}
    assert "transient_bytes" in te and "transient_bytes" not in local  # measured where the TE spec is built
    assert changed == set(BUILD_DIFFERENCES["layer_spec"][0])


MiB = 2**20


@pytest.mark.parametrize("name, by_hand", [
    # Mixtral TP 2 EP 4 (N 2048, k 2, h 4096, 2 local experts, c = 4096): the backward's FC1 gradient
    # c x 2 x 2 x 14336 B = 224 MiB over the forward's S 32 + all-to-all output 32 + experts' output
    # 32 + unsorted 32 = 128; the held routing 2048 x 8 x 5 B in both
    ("tp2_ep4", 224 + 2048 * 8 * 5 / MiB),
    # ETP 2 (c = 8192, r = 4096): at the reduce-scatter, 32 + 32 + 64 + 64 + FP32 cast 128 + its
    # output 64 = 384, over the backward's 224
    ("tp2_ep4_etp2", 384 + 2048 * 8 * 5 / MiB),
    # EP 8, capacity 1.25 padded (N 4096, 1 local expert, c = 10240 copies sent and received): the
    # backward's FC1 gradient 10240 x 57344 B = 560 MiB over the combine's 2 S + c 2h = 240; the
    # held routing the FP32 probabilities alone (the capacity mask is kept)
    ("ep8_capacity", 560 + 4096 * 8 * 4 / MiB),
    # DeepSeek-V3 EP 8 (N 4096, k 8, h 7168, 32 local experts, c = 32768): S 448 + all-to-all output
    # 448 + experts' output 448 + unsorted 448 = 1792, + the shared output 56 + routing 4096 x 256 x 5
    ("deepseek", 1792 + 56 + 5),
])
def test_the_transient_peak_is_measured_and_priced(measured, name, by_hand):
    """The symbolic layer's larger transient peak (forward or backward, beyond what the layer
    keeps; the grouped GEMM and fused SwiGLU stood in) against ``transient.layer_transient_peaks``
    and the hand count, to the MiB, with several local experts and with one."""
    row = measured[name]["transient (forward/backward peak)"]
    assert abs(row["measured_bytes"] - row["analytic_bytes"]) < MiB
    assert row["measured_bytes"] / MiB == pytest.approx(by_hand, abs=1)
    profile = measured["deepseek_profile"]["transient_bytes"]
    assert profile["forward_peak"] > profile["backward_peak"]  # DeepSeek's forward peak leads


def test_the_allgather_transient_is_measured_and_priced(measured):
    """The allgather dispatcher's backward peak by hand (c copies, T rows gathered, f = h_moe / etp):
    the global buffer T 2h and the local routing map the dispatcher holds (max(T, N) x E / ep bool)
    beside the largest of the reduce-scatter's backward T 6h, the unpermute's (T + c) 2h, FC2's
    c (2h + 2f) and FC1's output gradient c 4f.
    Mixtral EP 2 (T = c = 8192, h 4096, f 14336): 64 + 8192 x 4 B + FC1's 8192 x 57344 B = 448:
    512.03 MiB, the backward the larger peak, priced to the MiB.
    Qwen3-30B-A3B EP 1 (N 4096, nothing gathered, c = 32768, h 2048, f 768): FC2's backward, the
    experts' output gradient c 2h = 128 beside FC2's input gradient c 2f = 48, + the map 4096 x 128
    B = 0.5: 176.5 MiB (priced 96, FC1's output gradient alone, before 2026-11-29); the forward's
    peak the unpermute's: c 2h 128 + N 2h 16 + the held routing N E 5 = 2.5: 146.5.
    Qwen3-30B-A3B EP 1 ETP 4 (T = 16384, c = 131072, f = 192): the unpermute's backward (T + c) 2h
    = 576 above FC2's c (2h + 2f) = 560, + the buffer 64 + the map 16384 x 128 B = 2: 642 MiB."""
    from advisor.moe import transient
    from advisor.moe.spec import PRESETS

    row = measured["allgather_ep2"]["rows"]["transient (forward/backward peak)"]
    assert row["analytic_bytes"] / MiB == pytest.approx(512 + 8192 * 4 / MiB, abs=0.001)
    assert abs(row["measured_bytes"] - row["analytic_bytes"]) < MiB
    qwen, n = PRESETS["qwen3-30b-a3b"], 4096
    forward, backward = transient.layer_transient_peaks(qwen, n, n * 8, 1, 1, "allgather")
    assert (float(forward) / MiB, float(backward) / MiB) == (146.5, 176.5)
    peaks = measured["allgather_ep1"]["peaks"]
    assert abs(peaks["forward_peak"] - forward) < MiB  # 1 KiB of small tensors
    assert abs(peaks["backward_peak"] - backward) < MiB
    backward = transient.layer_transient_peaks(qwen, n, n * 8 * 4, 1, 4, "allgather")[1]
    assert float(backward) / MiB == 642.0
    assert abs(measured["allgather_etp4"]["peaks"]["backward_peak"] - backward) < MiB


@pytest.mark.parametrize("name, model, ep, etp, by_hand", [
    # Qwen3-30B-A3B EP 1 (nothing gathered, c = 32768): the unpermute's c 2h 128 + N 2h 16, the
    # router's map N E B 0.5 and probabilities N E 4 B 2
    ("allgather_ep1", "qwen3-30b-a3b", 1, 1, 128 + 16 + 0.5 + 2),
    # EP 2 (T = 8192, c = 32768): the buffer T 2h 32, the unpermute's c 2h 128 + T 2h 32, the
    # router's map 0.5, the gathered probabilities T E 4 B 4, the local map T E / 2 B 0.5
    ("allgather_qwen_ep2", "qwen3-30b-a3b", 2, 1, 32 + 128 + 32 + 0.5 + 4 + 0.5),
    # EP 2 ETP 2 (T = 16384, c = 65536): 64 + 256 + 64, the routing 0.5 + 8 + 1
    ("allgather_qwen_ep2_etp2", "qwen3-30b-a3b", 2, 2, 64 + 256 + 64 + 0.5 + 8 + 1),
    # EP 1 ETP 4 (T = 16384, c = 131072): 64 + 512 + 64, the routing 0.5 + 8 + the local map,
    # the gathered map itself at EP 1, T E B 2
    ("allgather_etp4", "qwen3-30b-a3b", 1, 4, 64 + 512 + 64 + 0.5 + 8 + 2),
    # Mixtral EP 2 (T = 8192, c = 8192, E 8): the combine's, the buffer T 2h 64, the unpermuted rows
    # T 2h 64, their FP32 copy T 4h 128, its reduce-scatter N 4h 64; the routing N E + T E 4 + T E / 2 B
    ("allgather_ep2", "mixtral-8x7b", 2, 1, 64 + 64 + 128 + 64 + (4096 * 8 + 8192 * 8 * 4 + 8192 * 4) / MiB),
])
def test_the_allgather_forward_is_measured_and_priced(measured, name, model, ep, etp, by_hand):
    """The allgather dispatcher's forward peak by hand: the global buffer T 2h, beside the unpermute
    ((c + max(T, N)) 2h) or the combine (T 6h + N 4h), and the routing alive through the forward:
    custom_forward's router map (N x E bool) and gathered probabilities (max(T, N) x E x 4), the
    dispatcher's local map (T x E / ep bool, where tokens are gathered). Measured and priced to the
    MiB; before 2026-11-29 the routing was priced N E 5, 2.5, 7 and 8 MiB low on Qwen3-30B-A3B at
    EP 2, EP 2 ETP 2 and EP 1 ETP 4."""
    from advisor.moe import transient
    from advisor.moe.spec import PRESETS

    spec, n = PRESETS[model], 4096
    forward, backward = transient.layer_transient_peaks(spec, n, n * spec.moe_router_topk * etp, ep, etp, "allgather")
    assert float(forward) / MiB == pytest.approx(by_hand, abs=1e-9)
    peaks = measured[name]["peaks"]
    assert abs(peaks["forward_peak"] - forward) < MiB
    assert abs(peaks["backward_peak"] - backward) < MiB  # and the backward's, whichever leads


@pytest.mark.parametrize("ep, forward_mib, backward_mib", [
    # EP 1 (nothing gathered, c = 1.25 N k = 40960): the unpermute's c 2h 160 + N 2h 16, the router's
    # probabilities N E 4 B 2; backward FC2's c (2h + 2 h_moe) = 220
    (1, 160 + 16 + 2, 220),
    # EP 2 (T = 8192): the buffer T 2h 32, the unpermute's c 2h 160 + T 2h 32, the gathered
    # probabilities T E 4 B 4, the local map T E / 2 B 0.5; backward 32 + 0.5 + 220
    (2, 32 + 160 + 32 + 4 + 0.5, 32 + 0.5 + 220),
])
def test_the_allgather_capacity_mask_is_kept_not_held(measured, ep, forward_mib, backward_mib):
    """Qwen3-30B-A3B (N 4096, E 128, k 8, h 2048, h_moe 768), allgather, capacity 1.25 padded: the
    router's map is the capacity mask, which its product with the probabilities saves
    (moe_utils.apply_router_token_dropping): the router keeps N E bool more than dropless routing,
    and neither peak holds it again; at EP 1 the dispatcher's local map is that mask (all E columns).
    Measured and priced to 2 KiB; N E = 0.5 MiB more, in both peaks at EP 1 and in the forward's at
    EP 2, was priced before 2026-11-29."""
    from advisor.moe import memory, transient
    from advisor.moe.spec import PRESETS

    qwen, n = PRESETS["qwen3-30b-a3b"], 4096
    got = measured[f"allgather_capacity_ep{ep}"]
    router = got["rows"]["router activations"]["measured_bytes"]
    assert router - measured["allgather_ep1"]["rows"]["router activations"]["measured_bytes"] == n * 128
    assumption = memory.RoutedTokens(routing="capacity", capacity_factor=1.25)
    copies = memory.expert_token_copies(qwen, n, ep, 1, assumption)
    assert copies == 40960
    forward, backward = transient.layer_transient_peaks(qwen, n, copies, ep, 1, "allgather", assumption)
    assert (float(forward) / MiB, float(backward) / MiB) == (forward_mib, backward_mib)
    assert 0 <= got["peaks"]["forward_peak"] - forward <= 2 * 2**10
    assert 0 <= got["peaks"]["backward_peak"] - backward <= 2 * 2**10
    row = got["rows"]["transient (forward/backward peak)"]
    assert 0 <= row["measured_bytes"] - row["analytic_bytes"] <= 2 * 2**10


@pytest.mark.parametrize("name, ep, etp, routing, by_hand", [
    # dropless, EP 8 (16 local experts, c = 4096 x 8 x 8 = 262144): the unsort's, the all-to-all's
    # backward output c 2h 1024 + the concatenation of its split's backward c 2h 1024
    ("a2a_dropless_ep8", 8, 1, "dropless", 2048 + 2.5),
    # dropless, EP 128 (one local expert, c = 4096 x 128 = 524288): FC2's, the experts' output
    # gradient (the all-to-all's backward output) c 2h 2048 + FC2's input gradient c 2 h_moe 768
    ("a2a_dropless_ep128", 128, 1, "dropless", 2816 + 2.5),
    # balanced, EP 2 ETP 4 (c = 131072): the reduce-scatter's FP32 gradient all-gathered c 4h 1024
    # + its BF16 cast c 2h 512
    ("a2a_etp4", 2, 4, "balanced", 1536 + 2.5),
])
def test_the_alltoall_backward_is_measured_and_priced(measured, name, ep, etp, routing, by_hand):
    """Qwen3-30B-A3B (N 4096, k 8, h 2048, h_moe 768), alltoall: the backward peak where the busiest
    rank receives more copies than it sends (dropless: every peer's every token picks this rank's
    experts; the test's stand-in for the fake routing's balanced counts) and at ETP 4, measured and
    priced to the MiB and by hand, + the held routing N E 5 = 2.5 MiB. Priced before 2026-11-29:
    1154.5, 2178.5 and 1282.5 (the combine's S + r 2h, the reduce-scatter's c 4h + r 4h). Only at
    EP 128 does the backward lead the forward (2306.5 measured and priced); at EP 8 the forward's
    3203.5 (S 128 + the all-to-all's output, the experts' output and its unsorted copy, 1024 each,
    + the received FP32 probabilities r x 4 B = 1, unpriced before 2026-11-29, + 2.5) is priced."""
    from advisor.moe import memory, transient
    from advisor.moe.spec import PRESETS

    qwen, n = PRESETS["qwen3-30b-a3b"], 4096
    assumption = memory.RoutedTokens(routing=routing)
    copies = memory.expert_token_copies(qwen, n, ep, etp, assumption)
    forward, backward = transient.layer_transient_peaks(qwen, n, copies, ep, etp, "alltoall", assumption)
    assert float(backward) / MiB == by_hand
    assert abs(measured[name]["backward_peak"] - backward) < MiB
    if name == "a2a_dropless_ep128":
        assert abs(measured[name]["forward_peak"] - forward) < MiB < backward - forward
    if name == "a2a_dropless_ep8":
        assert float(forward) / MiB == 128 + 3 * 1024 + 1 + 2.5
        assert abs(measured[name]["forward_peak"] - forward) < 2**10 + 1


def test_the_alltoall_capacity_forward_holds_the_probabilities_not_the_mask(measured):
    """Qwen3-30B-A3B at EP 8, capacity 1.25 padded (c = r = 40960, S = 160 MiB, 16 local experts):
    the forward's peak, 4 x 160 + the received FP32 probabilities r x 4 B 0.15625 + the held FP32
    probabilities N E 4 B 2 = 642.15625 MiB, measured to 2 KiB (a 1 KiB int64 count tensor, smaller ones);
    the capacity mask the dispatcher also holds is saved by the router's product, kept (N E 5 =
    2.5 priced before 2026-11-29, 0.34 MiB high)."""
    from advisor.moe import memory, transient
    from advisor.moe.spec import PRESETS

    qwen, n = PRESETS["qwen3-30b-a3b"], 4096
    assumption = memory.RoutedTokens(routing="capacity", capacity_factor=1.25)
    copies = memory.expert_token_copies(qwen, n, 8, 1, assumption)
    forward, backward = transient.layer_transient_peaks(qwen, n, copies, 8, 1, "alltoall", assumption)
    assert float(forward) / MiB == 4 * 160 + 0.15625 + 2
    got = measured["a2a_capacity_ep8"]
    assert 0 <= got["forward_peak"] - forward <= 2 * 2**10
    assert got["backward_peak"] < got["forward_peak"]
