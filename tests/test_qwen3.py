"""Dense Qwen3 (Hugging Face model_type qwen3): a Llama decoder with an RMSNorm on each Q and K
head (Megatron's --qk-layernorm) and an explicit head_dim. Read from its config.json, priced with
the QK-norm terms the MoE model prices Qwen3-MoE with (one term each, in advisor.equations and
advisor.throughput.terms), launched with --qk-layernorm and read back from that command.

The symbolic backend's measurement of a Qwen3 layer is in tests/test_symbolic.py; Megatron's
parse_args/validate_args of the rows in tests/test_megatron_validation.py."""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from advisor import equations as eq
from advisor.cli import cli
from advisor.memory import MemoryOptions
from advisor.models import PRESETS, load_hf_config
from advisor.moe import memory as moe_memory
from advisor.moe import time as moe_time
from advisor.moe.spec import PRESETS as MOE_PRESETS
from advisor.stage_model import layer_bytes
from advisor.throughput import terms

FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"
QWEN3_8B = FIXTURES / "qwen3-8b.json"
QWEN3_4B = FIXTURES / "qwen3-4b.json"


def qwen3_8b():
    return load_hf_config(QWEN3_8B)


def write_config(tmp_path, **changes) -> Path:
    config = {**json.loads(QWEN3_8B.read_text()), **changes}
    path = tmp_path / "config.json"
    path.write_text(json.dumps({key: value for key, value in config.items() if value is not None}))
    return path


# --- config.json --------------------------------------------------------------------------


def test_qwen3_config_reads_every_field():
    spec = qwen3_8b()
    assert (spec.num_layers, spec.hidden_size, spec.ffn_hidden_size) == (36, 4096, 12288)
    assert (spec.num_attention_heads, spec.num_query_groups, spec.head_dim, spec.vocab_size) == (32, 8, 128, 151936)
    assert spec.qk_layernorm and not spec.add_qkv_bias and not spec.tie_embeddings
    assert spec.kv_channels is None  # 32 x 128 = 4096: Megatron's default head size, no --kv-channels
    assert (spec.rotary_base, spec.norm_epsilon, spec.rope_scaling_factor) == (1e6, 1e-6, None)
    small = load_hf_config(QWEN3_4B)  # 32 heads x 128 = 4096 wide attention on a 2560 hidden size
    assert (small.kv_channels, small.query_size, small.hidden_size, small.tie_embeddings) == (128, 4096, 2560, True)


def test_qwen3_head_dim_defaults_to_qwen3configs_128(tmp_path):
    """Transformers' Qwen3Config defaults head_dim to 128, not h/a (configuration_qwen3.py): a
    config.json without it is Qwen3-4B's 128-wide heads, 32 x 128 != 2560."""
    spec = load_hf_config(write_config(tmp_path, hidden_size=2560, head_dim=None))
    assert spec.kv_channels == 128 and spec.query_size == 4096


def test_a_qwen3_moe_config_without_head_dim_takes_h_over_a(tmp_path):
    """Unlike Qwen3Config, Transformers' Qwen3MoeConfig has no head_dim default: its attention
    takes h/a where the file leaves it out (modeling_qwen3_moe.py). Qwen3-30B-A3B's config.json
    gives 128 (32 x 128 = 4096 on a 2048 hidden size, --kv-channels 128); without it, 2048 / 32 = 64,
    Megatron's own default, so no kv_channels."""
    published = json.loads((Path(__file__).parent / "data" / "moe" / "qwen3-30b-a3b.json").read_text())
    given = tmp_path / "given.json"
    given.write_text(json.dumps(published))
    left_out = tmp_path / "left_out.json"
    left_out.write_text(json.dumps({key: value for key, value in published.items() if key != "head_dim"}))
    assert (load_hf_config(given).kv_channels, load_hf_config(given).query_size) == (128, 4096)
    assert (load_hf_config(left_out).kv_channels, load_hf_config(left_out).head_dim) == (None, 64)


def test_other_families_keep_their_flags():
    """Only qwen3 (and qwen3_moe) read as --qk-layernorm; every Llama preset's JSON is unchanged:
    no qk_layernorm key where it is false."""
    llamas = [spec for name, spec in PRESETS.items() if name.startswith("llama")]
    assert len(llamas) == len(PRESETS) - 1 and PRESETS["qwen3-8b"].qk_layernorm
    assert not any(spec.qk_layernorm for spec in llamas)
    assert all("qk_layernorm" not in spec.to_dict() for spec in llamas)
    assert load_hf_config(FIXTURES / "qwen2-7b.json").qk_layernorm is False
    assert MOE_PRESETS["qwen3-30b-a3b"].qk_layernorm and MOE_PRESETS["qwen3-30b-a3b"].to_dict()["qk_layernorm"]
    assert MOE_PRESETS["mixtral-8x7b"].to_dict()["qk_layernorm"] is False  # MoE files keep the key


@pytest.mark.parametrize("change,message", [
    ({"attention_bias": True}, "attention_bias true puts biases on Q, K, V and the output projection"),
    ({"use_sliding_window": True}, "use_sliding_window true: this tool and pretrain_gpt.py's Llama layers attend"),
    ({"layer_types": ["full_attention"] * 35 + ["sliding_attention"]},
     "layer_types has 'sliding_attention': this tool and pretrain_gpt.py's Llama layers attend over the whole"),
    ({"layer_types": "full_attention"}, "layer_types must be a list or null, got 'full_attention'"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}},
     "rope_scaling of type 'yarn': Megatron-LM implements only Llama 3's"),
    ({"head_dim": 0}, "head_dim must be a positive integer, got 0"),
])
def test_what_megatron_does_not_build_is_refused_by_key(advisor, tmp_path, change, message):
    line = advisor.error("sweep", "--gpus", "8", "--mem", "80", "--model", write_config(tmp_path, **change))
    assert message in line and "config.json" in line


def test_a_sliding_window_left_unused_is_priced(tmp_path):
    """Qwen3Config ignores sliding_window unless use_sliding_window (``__post_init__``: None)."""
    assert load_hf_config(write_config(tmp_path, sliding_window=4096)) == replace(
        qwen3_8b(), name=str(tmp_path / "config.json"))


# --- parameters ---------------------------------------------------------------------------


def test_qwen3_8b_parameters_by_hand_and_published():
    """Qwen3-8B by hand: per layer Q 4096 x 4096, K and V 4096 x 1024 each, O 4096 x 4096
    (41,943,040), the Q and K norms 128 each (256), SwiGLU 3 x 4096 x 12288 (150,994,944), two
    RMSNorms 2 x 4096 (8,192): 192,946,432; x 36 = 6,946,071,552; untied embedding and LM head
    2 x 151936 x 4096 = 1,244,659,712; the final norm 4,096. 8,190,735,360 is also the
    checkpoint's safetensors total; the model card says 8.2B (6.95B without embeddings)."""
    spec = qwen3_8b()
    layer = 4096 * 4096 + 2 * 4096 * 1024 + 4096 * 4096 + 2 * 128 + 3 * 4096 * 12288 + 2 * 4096
    assert layer == 192_946_432 and eq.layer_parameters(spec) == layer
    total = 36 * layer + 2 * 151936 * 4096 + 4096
    assert total == 8_190_735_360 and eq.model_parameters(spec) == total
    assert abs(eq.model_parameters(spec) / 8.2e9 - 1) < 0.005
    assert abs((total - 2 * 151936 * 4096) / 6.95e9 - 1) < 0.005


def test_qk_norm_weights_are_whole_on_every_tp_rank():
    """2d = 256 per layer at every TP, the GEMM weights split: at TP 4 a layer holds
    (41,943,040 + 150,994,944) / 4 + 8,192 + 256."""
    spec = qwen3_8b()
    assert eq.layer_parameters(spec, 4) == (41_943_040 + 150_994_944) / 4 + 8192 + 256
    assert eq.qk_norm_parameters(spec) == 256 and eq.qk_norm_parameters(replace(spec, qk_layernorm=False)) == 0
    # what runs in FP8 is the GEMMs alone, the norms stay BF16
    from advisor.memory_levers import linear_parameters

    assert linear_parameters(spec, 4) == (41_943_040 + 150_994_944) / 4


# --- activations and time: the MoE model's terms, shared ----------------------------------


def test_qk_norm_inputs_kept_per_layer_by_hand():
    """s 4096, b 1: the Q norm keeps a BF16 copy of Q, 2 s b a d = 2 x 4096 x 32 x 128 = 33,554,432
    bytes, and each norm an FP32 rstd per head and token, 4 s b (a + k) = 4 x 4096 x 40 = 655,360
    (K's input is a view of the QKV output, which V keeps): 34,209,792, split over t c with the
    heads (TP 2, CP 2: 8,552,448), beside Eq. 11."""
    spec, plain = qwen3_8b(), replace(qwen3_8b(), qk_layernorm=False)
    assert eq.qk_norm_activation_bytes(spec, 4096, 1) == 2 * 4096 * 32 * 128 + 4 * 4096 * 40 == 34_209_792
    assert eq.attention_activation_bytes(spec, 4096, 1) - eq.attention_activation_bytes(plain, 4096, 1) == 34_209_792
    options = MemoryOptions()
    kept, _ = layer_bytes(spec, 4096, 1, np.array([2]), np.array([2]), options)
    kept_plain, _ = layer_bytes(plain, 4096, 1, np.array([2]), np.array([2]), options)
    assert kept[0] - kept_plain[0] == 8_552_448


def test_the_moe_model_prices_qwen3_moes_norms_with_the_same_term():
    """Qwen3-30B-A3B (32 heads, 4 KV groups, d 128), s 4096, b 1, TP 2: (2 x 4096 x 32 x 128 +
    4 x 4096 x 36) / 2 = 17,072,128."""
    spec = MOE_PRESETS["qwen3-30b-a3b"]
    plain = replace(spec, qk_layernorm=False)
    gap = moe_memory.attention_activation_bytes(spec, 4096, 1, 2, 1) \
        - moe_memory.attention_activation_bytes(plain, 4096, 1, 2, 1)
    assert gap == (2 * 4096 * 32 * 128 + 4 * 4096 * 36) / 2 == 17_072_128 == eq.qk_norm_activation_bytes(spec, 4096, 1) / 2
    time_gap = moe_time.elementwise_bytes(spec, 4096, 2, 0, 1)[0] - moe_time.elementwise_bytes(plain, 4096, 2, 0, 1)[0]
    assert time_gap == 2 * 2 * 36 * 128 * 4096 / 2  # BF16, read and write (a + k) d per token, over TP


def test_local_qk_norms_keep_the_qkv_output_by_hand():
    """--transformer-impl local (``fused_norms`` False), Qwen3-8B, s 4096, b 1: megatron-core's own
    attention expands K and V (dot_product_attention.py) and never saves V's view, so K's norm,
    whose saved input is a view of the QKV output, keeps all of it, 2 s b (a + 2k) d = 2 x 4096 x
    48 x 128 = 50,331,648 bytes (48 MiB) beside the Q copy, 2 x 4096 x 32 x 128 = 33,554,432, and
    the FP32 rstds, 4 x 4096 x 40 = 655,360: 84,541,440 = 4 s b (a + k) d + 4 s b (a + k) a layer,
    50,331,648 more than Transformer Engine's spec (1.6875 GiB over 36 layers). TP 2 (the local
    spec allows no SP: torch_norm.py) splits it with the heads: 42,270,720."""
    spec, plain = qwen3_8b(), replace(qwen3_8b(), qk_layernorm=False)
    local = eq.qk_norm_activation_bytes(spec, 4096, 1, fused_norms=False)
    assert local == 2 * 4096 * 32 * 128 + 2 * 4096 * 48 * 128 + 4 * 4096 * 40 == 84_541_440
    assert local == 4 * 4096 * 40 * 128 + 4 * 4096 * 40
    assert local - eq.qk_norm_activation_bytes(spec, 4096, 1) == 50_331_648 == 48 * 2**20
    assert eq.qk_norm_activation_bytes(plain, 4096, 1, fused_norms=False) == 0
    # Transformer Engine's unfused backend expands K and V as well: its K norm keeps the QKV output too
    assert eq.qk_norm_activation_bytes(spec, 4096, 1, flash_attention=False) == local
    assert eq.layer_activation_bytes(spec, 4096, 1, False) - eq.layer_activation_bytes(plain, 4096, 1, False) \
        == 84_541_440
    options = MemoryOptions(fused_norms=False, sequence_parallel=False, flash_attention=False)
    kept, _ = layer_bytes(spec, 4096, 1, np.array([2]), np.array([1]), options)
    kept_plain, _ = layer_bytes(plain, 4096, 1, np.array([2]), np.array([1]), options)
    assert kept[0] - kept_plain[0] == 42_270_720


def test_the_moe_model_prices_local_qwen3_moe_norms_with_the_same_term():
    """Qwen3-30B-A3B (a 32, k 4, d 128), s 4096, b 1, TP 2, --transformer-impl local: (4 x 4096 x 36
    x 128 + 4 x 4096 x 36) / 2 = 38,043,648 a layer, which is Transformer Engine's 17,072,128 plus
    the QKV output K's norm keeps, 2 x 4096 x (32 + 8) x 128 / 2 = 20,971,520; the whole MoE layer
    (router, dispatcher, experts unchanged) by the same."""
    spec = MOE_PRESETS["qwen3-30b-a3b"]
    plain = replace(spec, qk_layernorm=False)
    gap = moe_memory.attention_activation_bytes(spec, 4096, 1, 2, 1, fused_norms=False) \
        - moe_memory.attention_activation_bytes(plain, 4096, 1, 2, 1, fused_norms=False)
    assert gap == (4 * 4096 * 36 * 128 + 4 * 4096 * 36) / 2 == 38_043_648
    assert gap - 17_072_128 == 2 * 4096 * 40 * 128 / 2 == 20_971_520
    layer = {fused: moe_memory.moe_layer_activation_bytes(spec, 4096, 1, 2, 1, 1, 1, fused_norms=fused)
             for fused in (True, False)}
    assert layer[False] - layer[True] == 20_971_520


def test_qk_norm_elementwise_passes_by_hand():
    """Forward, one layer, 4096 tokens at TP 2, BF16: the norms read and write (a + k) d = 5,120
    elements per token, 2 x 2 x 5120 x 4096 / 2 = 41,943,040 bytes more HBM traffic."""
    spec, plain = qwen3_8b(), replace(qwen3_8b(), qk_layernorm=False)
    assert terms.qk_norm_elements(spec) == 2 * 40 * 128 and terms.qk_norm_elements(plain) == 0
    gap = terms.layer_elementwise_bytes(spec, 4096, 2) - terms.layer_elementwise_bytes(plain, 4096, 2)
    assert gap == 41_943_040


# --- flags: written, and read back to the same numbers ------------------------------------


def test_rows_launch_with_qk_layernorm_and_read_back_to_the_same_numbers(advisor, tmp_path):
    rows = advisor.json("sweep", "--gpus", "8", "--mem", "80", "--gbs", "64", "--seq-len", "4096",
                        "--model", QWEN3_8B)
    row = rows[0]
    assert "--qk-layernorm" in row["megatron_args"] and row["model"]["qk_layernorm"] is True
    command = tmp_path / "cmd.sh"
    command.write_text(" ".join(["pretrain_gpt.py", *row["megatron_args"], "--tokenizer-type", "NullTokenizer",
                                 "--vocab-size", "151936"]) + "\n")
    back = advisor.json("estimate", "--from-command", command, "--gpus", "8", "--mem", "80")
    assert back["model"]["qk_layernorm"] is True
    for key in ("total_gib", "model_states_gib", "activations_gib"):
        assert back[key] == row[key], key


def test_a_dense_command_with_qk_layernorm_is_priced_with_it(advisor, tmp_path):
    """A hand-written Qwen3-8B command: --qk-layernorm is a model flag, not refused, not ignored:
    without it the same command prices the Q copy and the FP32 rstds, (2 s b a d + 4 s b (a + k)) / t =
    (2 x 4096 x 32 x 128 + 4 x 4096 x 40) / 2 bytes per layer less, x 36 layers (PP 1, one
    microbatch in flight), and a shorter step."""
    words = ["pretrain_gpt.py", "--num-layers", "36", "--hidden-size", "4096", "--ffn-hidden-size", "12288",
             "--num-attention-heads", "32", "--group-query-attention", "--num-query-groups", "8", "--kv-channels",
             "128", "--seq-length", "4096", "--max-position-embeddings", "40960", "--normalization", "RMSNorm",
             "--norm-epsilon", "1e-6", "--swiglu", "--position-embedding-type", "rope", "--rotary-base", "1000000",
             "--disable-bias-linear", "--untie-embeddings-and-output-weights", "--attention-dropout", "0",
             "--hidden-dropout", "0", "--tensor-model-parallel-size", "2", "--sequence-parallel",
             "--micro-batch-size", "1", "--global-batch-size", "64", "--bf16", "--use-distributed-optimizer",
             "--tokenizer-type", "NullTokenizer", "--vocab-size", "151936"]
    priced = {}
    for name, extra in (("with", ["--qk-layernorm"]), ("without", [])):
        path = tmp_path / f"{name}.sh"
        path.write_text(" ".join(words + extra) + "\n")
        priced[name] = advisor.json("estimate", "--from-command", path, "--gpus", "8", "--gpu", "h100-80gb")
    assert priced["with"]["model"]["qk_layernorm"] is True and "qk_layernorm" not in priced["without"]["model"]
    gap_bytes = (priced["with"]["activations_gib"] - priced["without"]["activations_gib"]) * 2**30
    assert gap_bytes == pytest.approx(36 * (2 * 4096 * 32 * 128 + 4 * 4096 * 40) / 2, rel=1e-9)
    assert priced["with"]["step_time_s"] > priced["without"]["step_time_s"]  # the norms' passes (terms above)


QWEN3_8B_COMMAND = ["pretrain_gpt.py", "--num-layers", "36", "--hidden-size", "4096", "--ffn-hidden-size", "12288",
                    "--num-attention-heads", "32", "--group-query-attention", "--num-query-groups", "8",
                    "--kv-channels", "128", "--seq-length", "4096", "--max-position-embeddings", "40960",
                    "--normalization", "RMSNorm", "--norm-epsilon", "1e-6", "--swiglu", "--position-embedding-type",
                    "rope", "--rotary-base", "1000000", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
                    "--attention-dropout", "0", "--hidden-dropout", "0", "--tensor-model-parallel-size", "2",
                    "--micro-batch-size", "1", "--global-batch-size", "64", "--bf16", "--use-distributed-optimizer",
                    "--tokenizer-type", "NullTokenizer", "--vocab-size", "151936", "--qk-layernorm"]


def test_a_local_qwen3_command_prices_the_qkv_output_its_k_norm_keeps(advisor, tmp_path):
    """Qwen3-8B at TP 2 without SP (the local spec's torch norms refuse it), PP 1, one microbatch in
    flight. --transformer-impl local and Transformer Engine's unfused attention (--attention-backend
    unfused) keep the same tensors: both expand K and V and save the expanded copies, never V's
    view, so in both K's norm keeps the QKV output (megatron-core dot_product_attention.py;
    TransformerEngine v2.9 backends.py ``UnfusedDotProductAttention``; equations.qk_norm_activation_bytes):
    the same price, but for megatron-core's global memory buffer that only the local attention keeps
    (the score product's input, 2 b (a/t) s^2 = 2 x 16 x 4096^2 = 0.5 GiB once per stage,
    equations.local_attention_buffer_bytes; TE's unfused backend allocates it per call). Against flash attention (the same command without the backend flag), the
    unfused backend keeps per layer, over t = 2: the BF16 softmax output 2 a s^2 b = 2 x 32 x 4096^2
    = 1,073,741,824, K and V expanded 4 s b (a - k) d = 4 x 4096 x 24 x 128 = 50,331,648, and the
    QKV output 2 s b (a + 2k) d = 2 x 4096 x 48 x 128 = 50,331,648 (under flash V's view keeps it,
    which Eq. 11 does not count): 587,202,560 a layer, x 36 = 21,139,292,160 bytes = 19.6875 GiB.
    Until 2026-12-01 the TE unfused command priced neither the expansion nor the QKV output, 0.84375
    GiB below the local one."""
    priced = {}
    for name, extra in (("local", ["--transformer-impl", "local"]), ("te", ["--attention-backend", "unfused"]),
                        ("flash", [])):
        path = tmp_path / f"{name}.sh"
        path.write_text(" ".join(QWEN3_8B_COMMAND + extra) + "\n")
        priced[name] = advisor.json("estimate", "--from-command", path, "--gpus", "8", "--gpu", "h100-80gb")
    assert priced["local"]["options"]["transformer_impl"] == "local"
    assert "transformer_impl" not in priced["te"]["options"]
    assert priced["local"]["activations_gib"] == priced["te"]["activations_gib"] + 2 * 16 * 4096**2 / 2**30 \
        == priced["te"]["activations_gib"] + 0.5
    unfused = (priced["te"]["activations_gib"] - priced["flash"]["activations_gib"]) * 2**30
    assert unfused == pytest.approx(36 * (2 * 32 * 4096**2 + 4 * 4096 * 24 * 128 + 2 * 4096 * 48 * 128) / 2, rel=1e-12)
    assert 36 * (2 * 32 * 4096**2 + 4 * 4096 * 24 * 128 + 2 * 4096 * 48 * 128) / 2 == 21_139_292_160 == 19.6875 * 2**30


def test_a_local_qwen3_moe_command_prices_the_qkv_output_its_k_norm_keeps(advisor, tmp_path):
    """Qwen3-30B-A3B (a 32, k 4, d 128, 48 layers) at TP 1, EP 8, PP 1, the advisor's own row read
    back, with --transformer-impl local and without (the MoE model prices both as flash attention,
    naming the local one): 48 x 2 s b (a + 2k) d = 48 x 2 x 4096 x 40 x 128 = 2,013,265,920 bytes
    = 1.875 GiB more."""
    row = advisor.json("estimate", "--model", "qwen3-30b-a3b", "--gpus", "8", "--tp", "1", "--pp", "1", "--ep", "8",
                       "--gpu", "h100-80gb", "--seq-len", "4096", "--gbs", "64")
    priced = {}
    for name, extra in (("local", ["--transformer-impl", "local"]), ("te", [])):
        path = tmp_path / f"{name}.sh"
        path.write_text(" ".join(["pretrain_gpt.py", *row["megatron_args"], "--tokenizer-type", "NullTokenizer",
                                  "--vocab-size", "151936", *extra]) + "\n")
        priced[name] = advisor.json("estimate", "--from-command", path, "--gpus", "8", "--gpu", "h100-80gb")
    assert priced["te"]["activations_gib"] == row["activations_gib"]
    assert any(entry.startswith("--transformer-impl local") for entry in priced["local"]["unpriced"])
    gap = (priced["local"]["activations_gib"] - priced["te"]["activations_gib"]) * 2**30
    assert gap == 48 * 2 * 4096 * 40 * 128 == 2_013_265_920


def test_the_qwen3_8b_preset_is_its_config_json():
    """--model qwen3-8b (and Qwen/Qwen3-8B, the repository it names) is the config.json the tests
    read, field by field, but its name; advisor models says which models norm each Q and K head."""
    from advisor.models import load_model

    assert replace(load_model("qwen3-8b"), name="x") == replace(qwen3_8b(), name="x")
    assert load_model("Qwen/Qwen3-8B").name == "qwen3-8b"
    legend = CliRunner().invoke(cli, ["models"]).stdout
    assert "an RMSNorm on each Q and K head (--qk-layernorm): qwen3-8b, qwen3-30b-a3b and qwen3-235b-a22b" in legend


# --- a tied small Qwen3 (0.6B, 1.7B, 4B): its parameters, and its ends at PP > 1 ---------------

QWEN3_0_6B = FIXTURES / "qwen3-0.6b.json"
SMALL = {  # Qwen/Qwen3-1.7B's config.json: Qwen3-4B's keys but these (slime's qwen3-1.7B.sh has the same)
    "1.7b": {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28, "num_attention_heads": 16,
             "max_window_layers": 28},
}


def small_qwen3(tmp_path, size: str) -> Path:
    if size == "0.6b":
        return QWEN3_0_6B
    path = tmp_path / f"qwen3-{size}.json"
    path.write_text(json.dumps({**json.loads(QWEN3_4B.read_text()), **SMALL[size]}))
    return path


def test_tied_small_qwen3_parameters_by_hand(tmp_path):
    """Tied: the vocabulary matrix counted once. Per layer Q h x 128a, K and V h x 1024 each, O
    128a x h, the QK norms 256, SwiGLU 3 h h_ffn, two RMSNorms 2h.
    0.6B: 2,097,152 x 3 + 256 + 9,437,184 + 2,048 = 15,730,944; x 28 = 440,466,432; + 151936 x 1024
    = 155,582,464; + 1,024: 596,049,920 (the card's 0.6B, 0.44B without embeddings). The Hub's
    listings of the 0.6B and 1.7B checkpoints (about 752M and 2.03B) would be these plus one more
    v x h, an lm_head.weight stored beside the tied embedding; not asserted here. 1.7B: 4,194,304 x 3 + 256 + 37,748,736 + 4,096 = 50,336,000; x 28 =
    1,409,408,000; + 151936 x 2048 = 311,164,928; + 2,048: 1,720,574,976 (the card's 1.7B, 1.4B
    without embeddings). 4B (the fixture): 4,022,468,096."""
    cases = {"0.6b": (15_730_944, 596_049_920), "1.7b": (50_336_000, 1_720_574_976)}
    for size, (layer, total) in cases.items():
        spec = load_hf_config(small_qwen3(tmp_path, size))
        h = spec.hidden_size
        assert layer == h * 2048 + 2 * h * 1024 + 2048 * h + 256 + 3 * h * (3 * h) + 2 * h  # h_ffn = 3h
        assert eq.layer_parameters(spec) == layer and spec.tie_embeddings
        assert eq.model_parameters(spec) == total == 28 * layer + 151936 * h + h
    assert abs(440_466_432 / 0.44e9 - 1) < 0.005 and abs(1_409_408_000 / 1.4e9 - 1) < 0.01
    assert eq.model_parameters(load_hf_config(QWEN3_4B)) == 4_022_468_096


def test_tied_small_qwen3_keeps_the_head_on_the_last_stage_at_pp_above_1(advisor, tmp_path):
    """megatron-core core_v0.15.2 models/gpt/gpt_model.py builds the output layer with
    skip_weight_param_allocation = pre_process and share_embeddings_and_output_weights: at PP 1
    the head reuses the embedding; at PP 2 the last stage (not pre_process) allocates its own
    v x h weight (language_module.py setup_embeddings_and_output_layer zeroes it and marks it
    shared; finalize_model_grads all-reduces its gradient with the first stage's). Qwen3-0.6B:
    PP 1 holds 596,049,920 parameters; PP 2's first stage 14 x 15,730,944 + 155,582,464 =
    375,815,680 and its last stage the same plus the final norm's 1,024: 375,816,704 (the two
    ends sum to the model plus one more vocabulary matrix)."""
    path = small_qwen3(tmp_path, "0.6b")
    common = ["--model", path, "--tp", "1", "--mbs", "1", "--gpus", "8", "--mem", "80", "--seq-len", "4096",
              "--gbs", "64"]
    one = advisor.json("estimate", *common, "--pp", "1")["stages"]
    assert [stage["parameters"] for stage in one] == [596_049_920]
    two = advisor.json("estimate", *common, "--pp", "2")["stages"]
    assert [stage["parameters"] for stage in two] == [375_815_680, 375_816_704]
    assert sum(stage["parameters"] for stage in two) == 596_049_920 + 155_582_464


SLIME_QWEN3_1_7B = """\
MODEL_ARGS=(
   --swiglu --num-layers 28 --hidden-size 2048 --ffn-hidden-size 6144 --num-attention-heads 16
   --group-query-attention --num-query-groups 8 --use-rotary-position-embeddings --disable-bias-linear
   --normalization "RMSNorm" --norm-epsilon 1e-6 --rotary-base 1000000 --vocab-size 151936
   --kv-channels 128 --qk-layernorm
)
torchrun --nproc-per-node 8 pretrain_gpt.py "${MODEL_ARGS[@]}" --tensor-model-parallel-size 1 \\
   --pipeline-model-parallel-size 2 --micro-batch-size 1 --global-batch-size 64 --seq-length 4096 \\
   --max-position-embeddings 40960 --bf16 --use-distributed-optimizer --attention-dropout 0.0 \\
   --hidden-dropout 0.0 --tokenizer-type NullTokenizer --lr 1e-4 --train-iters 1000 %s
"""


def test_the_legacy_rope_switch_reads_as_rope(advisor, tmp_path):
    """Qwen3-1.7B as slime's scripts/models/qwen3-1.7B.sh writes it: --use-rotary-position-embeddings,
    no --position-embedding-type, tied. validate_args sets position_embedding_type 'rope' from the
    legacy switch (core_v0.15.2 and core_v0.19.0 arguments.py, "Legacy RoPE arguments"): nothing is
    unpriced (it was named '--position-embedding-type learned_absolute (Megatron's default ...)'),
    and the numbers are the advisor's own row's for Qwen3-1.7B's config.json at that layout."""
    command = tmp_path / "qwen3-1.7b.sh"
    command.write_text(SLIME_QWEN3_1_7B % "")
    read = advisor.json("estimate", "--from-command", command, "--gpu", "h100-80gb")
    assert read["unpriced"] == [] and read["model"]["qk_layernorm"] and read["model"]["tie_embeddings"]
    own = advisor.json("estimate", "--model", small_qwen3(tmp_path, "1.7b"), "--tp", "1", "--pp", "2", "--mbs", "1",
                       "--gpus", "8", "--gbs", "64", "--seq-len", "4096", "--gpu", "h100-80gb",
                       "--no-overlap-grad-reduce", "--dataloader-mask", "cached")
    for key in ("total_gib", "model_states_gib", "activations_gib", "step_time_s", "stages"):
        assert read[key] == own[key], key
    # validate_args sets rope before it checks --no-position-embedding: Megatron takes this command
    command.write_text(SLIME_QWEN3_1_7B % "--no-position-embedding --position-embedding-type learned_absolute")
    assert advisor.json("estimate", "--from-command", command, "--gpu", "h100-80gb")["unpriced"] == []


def test_model_help_names_dense_qwen3():
    """--model's help lists the config.json model_types read: qwen3 since dense Qwen3 is."""
    shown = " ".join(CliRunner().invoke(cli, ["sweep", "--help"], terminal_width=100).stdout.split())
    assert "model_type llama, mistral, qwen2, qwen3, mixtral, qwen3_moe, deepseek_v3 or kimi_k2" in shown


def test_tied_pp_above_1_pays_the_embedding_gradient_all_reduce():
    """megatron-core's finalize_model_grads all-reduces the tied embedding's main gradient between
    the first and the last stage (core_v0.15.2 distributed/finalize_model_grads.py,
    _allreduce_word_embedding_grads), after the DP collectives. Qwen3-0.6B, TP 1, PP 2, FP32 main
    grads: S = 4 x 1024 x 151936 = 622,329,856 bytes; a two-rank ring all-reduce sends S/2 twice,
    S / bandwidth + 2 x 20 us of latency, the bandwidth the preset's link rate x the fitted network
    efficiency (0.9962). In one node (8 H100s, NVLink 450 GB/s one way: 448.29e9 B/s):
    622,329,856 / 448.29e9 + 40e-6 = 1.42823 ms; on 64 GPUs (DP 32) the pair is 32 ranks apart, one
    50 GB/s NIC (49.81e9 B/s): 12.49407 + 0.04 = 12.53407 ms. Untied (at PP 2 the same weights,
    one more matrix either way) or at PP 1 (one copy) there is nothing to reduce."""
    from advisor.hardware import get_gpu
    from advisor.throughput.calibration import load_calibration
    from advisor.throughput.model import TimeModel

    tied, gpu = load_hf_config(FIXTURES / "qwen3-0.6b.json"), get_gpu("h100-80gb")
    untied = replace(tied, tie_embeddings=False)
    size = 4 * 1024 * 151936
    assert size == 622_329_856
    net = load_calibration().network_efficiency
    assert (gpu.nvlink_bytes_per_s, gpu.network_bytes_per_s) == (450e9, 50e9)  # the H100 preset's, one way
    for gpus, bandwidth, ms in ((8, 450e9, 1.42823), (64, 50e9, 12.53407)):
        dp, gbs = gpus // 2, 8 * gpus
        steps = [TimeModel(spec, gpu, 4096, gbs).step(1, 1, 2, dp, 1) for spec in (tied, untied)]
        gap = float(steps[0].dp_comm_s - steps[1].dp_comm_s)
        assert size / (bandwidth * net) + 2 * 20e-6 == pytest.approx(ms * 1e-3, abs=0.00001e-3)
        assert gap == pytest.approx(size / (bandwidth * net) + 2 * 20e-6, rel=1e-12)
        assert float(steps[0].total_s - steps[1].total_s) == pytest.approx(gap, rel=1e-9)
    assert terms.tied_embedding_allreduce_time(tied, 1, 1, 8, 1, 151936, TimeModel(tied, gpu, 4096, 64).rates) == 0
    assert terms.tied_embedding_allreduce_time(untied, 1, 1, 4, 2, 151936, TimeModel(tied, gpu, 4096, 64).rates) == 0
