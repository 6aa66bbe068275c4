"""``python -m tables.splits``: the README section is what the code computes, the optimal splits
are optimal among those compared, and Megatron-LM builds its --account-for-* splits as priced."""

import itertools

import pytest
from conftest import ROOT
from megatron_real import NO_TRANSFORMER_ENGINE, checkout

from advisor.memory import GIB
from tables.splits.__main__ import results
from tables.splits.compare import CASES, megatron_split
from tables.splits.report import BEGIN, END, markdown


@pytest.fixture(scope="module")
def found():
    return results()


def test_the_readme_section_is_what_the_code_computes(found):
    readme = (ROOT / "tables" / "README.md").read_text()
    assert readme[readme.index(BEGIN):readme.index(END) + len(END)] + "\n" == markdown(found)


def test_each_objective_wins_its_own_column(found):
    for case, priced, limit in found:
        splits = {p.name: p for p in priced if p.layers_per_stage is not None}
        memory = splits["memory-optimal"]
        assert all(memory.peak_gib <= p.peak_gib for p in splits.values()), case
        fast = splits.get("time-optimal (MadPipe)")
        fitting = [p for p in splits.values() if p.peak_gib <= limit / GIB]
        if fast is not None:
            assert fast.peak_gib <= limit / GIB and all(fast.period_ms <= p.period_ms for p in fitting), case
        for p in splits.values():
            assert sum(p.layers_per_stage) == {"llama3.1-8b": 32, "llama3.1-70b": 80, "llama3.1-405b": 126}[
                case.model] and len(p.layers_per_stage) == case.pp


def test_the_405b_table_shows_llama_3s_split():
    """Llama 3 (Dubey et al. 2024): TP 8, PP 16, one layer fewer on the first and last stages."""
    assert megatron_split(126, 16, True, True) == (7,) + (8,) * 14 + (7,)
    assert megatron_split(126, 16, True, False) is None  # 127 layers do not divide by 16
    assert megatron_split(32, 3, True, False) == (10, 11, 11)


def test_megatron_builds_its_account_for_splits_as_priced():
    """The real core_v0.15.2: --account-for-embedding/loss-in-pipeline-split for every case where the
    table prices them, through parse_args, validate_args and megatron-core's split of the layers.
    (The one test of the one-shot ``launch.megatron_check.validate``; the others share a session's
    validator process per release: megatron_real.validate.)"""
    from advisor.models import PRESETS
    from launch.megatron_check import validate

    release = checkout("core_v0.15.2")
    cases, expected = [], []
    for case, (embedding, loss) in itertools.product(CASES, [(True, False), (False, True), (True, True)]):
        spec = PRESETS[case.model]
        split = megatron_split(spec.num_layers, case.pp, embedding, loss)
        if split is None:
            continue
        args = ["--num-layers", str(spec.num_layers), "--hidden-size", "64", "--ffn-hidden-size", "128",
                "--num-attention-heads", "8", "--seq-length", "128", "--max-position-embeddings", "128",
                "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", str(case.pp),
                "--micro-batch-size", "1", "--global-batch-size", str(case.pp), "--mock-data",
                "--tokenizer-type", "NullTokenizer", "--vocab-size", "127", *NO_TRANSFORMER_ENGINE]
        args += ["--account-for-embedding-in-pipeline-split"] * embedding + ["--account-for-loss-in-pipeline-split"] * loss
        cases.append({"args": args, "world_size": case.pp, "env": {}})
        expected.append(list(split))
    assert len(cases) >= 4
    for result, split in zip(validate(release.path, cases, python=release.python), expected):
        assert result["ok"], result
        assert result["derived"]["layers_per_stage"] == split
