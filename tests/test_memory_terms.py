"""The calibrated model's correction terms (``advisor.memory_terms``) against hand-derived values."""

from pathlib import Path

import pytest

from advisor import memory_terms
from advisor.models import load_model

HF = Path(__file__).parent / "fixtures" / "hf_configs"


def test_swiglu_fusion_keeps_six_of_eight_h_ffn_of_llama_3_1_8b():
    """h 4096, 32 heads, 8 KV groups, h_ffn 14336: Eq. 12 per token is h (12 + 4 k/a + 8 h_ffn/h)
    = 49152 + 4096 + 114688 = 167936 bytes; fusion keeps 2 h_ffn = 28672 fewer."""
    assert memory_terms.swiglu_fusion_fraction(load_model("llama3.1-8b")) == pytest.approx(1 - 28672 / 167936)


def test_swiglu_fusion_with_an_explicit_head_size():
    """Mistral-NeMo-12B: h 5120 but 32 heads of 128 (Q is 4096 wide, K and V 8 x 128). Eq. 11's
    general form per token: 2 h + 4 a d + 4 k d = 10240 + 16384 + 4096 = 30720; the MLP 2 (h + 4
    h_ffn) = 124928; the norms 4 h = 20480; in all 176128, of which fusion drops 2 h_ffn = 28672.
    Eq. 12's d = h / a shorthand, h (12 + 4 k/a + 8 h_ffn/h) = 61440 + 5120 + 114688 = 181248,
    would give 1 - 28672 / 181248 (0.84181 against 0.83721): rel=1e-9 tells them apart."""
    spec = load_model(str(HF / "mistral-nemo-12b.json"))
    assert memory_terms.swiglu_fusion_fraction(spec) == pytest.approx(1 - 28672 / 176128, rel=1e-9)
