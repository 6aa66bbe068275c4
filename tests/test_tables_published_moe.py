"""tables.published_moe: the published Megatron-core MoE runs (tables/published/moe_runs.csv)."""

import pytest

from tables import published_moe


@pytest.fixture(scope="module")
def results():
    return published_moe.rows()


def test_every_megatron_run_is_called_runnable(results):
    assert all(r["runnable"] for r in results if r["role"] in ("test", "layout"))


def test_test_runs_within_fifteen_percent(results):
    tests = [r for r in results if r["role"] == "test"]
    assert tests and all(r["within_target"] for r in tests), [(r["id"], r["error"]) for r in tests]


def test_published_step_from_megatrons_flops():
    # Mixtral 8x7B, gbs 256, seq 4096, vocab 32000: 12 L h (1.5 f k + h (1 + 8/32 + s/2h)) + 6 h v per token
    h, L, s = 4096, 32, 4096
    per_token = 12 * L * h * (1.5 * 14336 * 2 + h * (1 + 8 / 32 + s / h / 2)) + 6 * h * 32000
    step = 256 * s * per_token / (468e12 * 64)
    row = next(r for r in published_moe.rows() if r["id"] == "mixtral-8x7b-mcore")
    assert row["published_step_time_s"] == pytest.approx(step)
    assert "published" in published_moe.markdown()
