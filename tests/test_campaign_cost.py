"""What a campaign will cost the CPU emulator (advisor/capture/campaign_cost.py), said and
enforced before it starts: issue 17's CPU profiling trap."""

import json
from pathlib import Path

import pytest
from test_campaign_run import campaign, write_rank

from advisor.capture.campaign import plan_campaign
from advisor.capture.campaign_cost import _layer_elements, emulation_cost, stage_terms
from advisor.capture.campaign_run import EmulationBudget, prepare
from advisor.models import preset
from advisor.profiles import load_run

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "launch" / "profiles"


def _stage_estimate(rank_header):
    h = rank_header
    stage, stages = h.coords["pp"], len(h.layers_per_stage)
    return stage_terms(h.model, seq_len=h.seq_len, micro_batch_size=h.parallel.mbs, microbatches=h.num_microbatches,
                       layers=h.layers_per_stage[stage], first=stage == 0, last=stage == stages - 1,
                       in_flight=min(stages - stage, h.num_microbatches), tp=h.parallel.tp, dtype=h.params_dtype)


def test_memory_estimate_against_the_committed_emulated_runs():
    """The independent count: 24 ranks the CPU emulator really ran (examples/launch/profiles,
    measured peaks), each estimated from its shapes alone within 10%."""
    ratios = []
    for directory in sorted(EXAMPLES.iterdir()):
        for rank in load_run(directory).ranks:
            measured = max(iteration.peak_allocated_bytes for iteration in rank.iterations)
            ratios.append(_stage_estimate(rank.header).peak_bytes / measured)
            decoder = next(layer for layer in rank.layers if layer.kind == "decoder")
            h = rank.header
            kept = _layer_elements(h.model, h.seq_len, h.parallel.mbs, h.parallel.tp) * 4
            assert kept == pytest.approx(decoder.activation_bytes, rel=0.01)  # per layer, FP32
    assert len(ratios) == 24 and all(0.9 <= ratio <= 1.1 for ratio in ratios), ratios


def test_time_grows_with_the_work_and_shrinks_with_threads():
    document = campaign()
    base = emulation_cost(document, cores=2, threads=1).seconds
    assert emulation_cost(campaign(num_microbatches=8), cores=2, threads=1).seconds > base
    assert emulation_cost(campaign(seq_len=64), cores=2, threads=1).seconds > base
    assert emulation_cost(document, cores=2, threads=2).seconds < base
    # Processes beyond the cores share them: 4 single-thread processes on 2 cores take twice as long.
    run = {**document["runs"][0], "dp": 4}
    one_core_each = emulation_cost(document, [run], cores=4, threads=1).seconds
    assert emulation_cost(document, [run], cores=2, threads=1).seconds == pytest.approx(2 * one_core_each)


def test_a_memory_limit_caps_what_a_rank_can_take():
    document = campaign()
    free = emulation_cost(document).peak.peak_bytes
    assert emulation_cost(document, memory_limit_bytes=1).peak.peak_bytes < free


def test_the_readme_8b_campaign_is_refused_with_everything_at_once(advisor, tmp_path):
    """The trap as the issue found it: the README's 8B campaign, refused once, naming every
    incompatibility and what the emulation would cost, before anything runs."""
    document = plan_campaign(preset("llama3.1-8b"), gpus=8, gpus_per_node=8, seq_len=8192, micro_batch_size=1,
                             global_batch_size=64, mode="reduced").to_dict()
    path = tmp_path / "c.json"
    path.write_text(json.dumps(document))
    line = advisor.error("profile", "run", path, "--out", tmp_path / "runs")
    assert "(plan it with --no-distributed-optimizer)" in line and "(plan it with --no-sequence-parallel)" in line
    assert f"its {len(document['runs'])} run(s) to emulate would take about" in line and "days" in line
    assert "GiB at once for run" in line and "--backend symbolic" in line and "--force runs it anyway" in line
    assert not (tmp_path / "runs").exists()


def test_budget_counts_only_runs_left_and_force_skips_it(tmp_path):
    document = campaign()
    path = tmp_path / "c.json"
    path.write_text(json.dumps(document))
    out = tmp_path / "runs"
    strict = EmulationBudget()
    assert prepare(path, out, budget=strict) == document  # a toy campaign: seconds, not refused
    assert len(strict.cost(document, out).runs) == 3
    done = document["runs"][0]
    (out / done["id"]).mkdir(parents=True)
    for stage in range(len(done["layers_per_stage"])):
        write_rank(out / done["id"], done, stage)
    assert [run.id for run in strict.cost(document, out).runs] == [run["id"] for run in document["runs"][1:]]
    # Seconds for a toy model are still refused by a budget of none.
    cost = strict.cost(document, out)
    assert cost.problem(available_bytes=None, limit_seconds=0).startswith("its 2 run(s) to emulate would take")
    assert "need" in cost.problem(available_bytes=1) and cost.problem(available_bytes=10**15) is None
    assert prepare(path, out, budget=None) == document  # --force: no budget


def test_the_cost_is_said_before_the_runner_starts(advisor, tmp_path, monkeypatch):
    """A toy campaign is not refused; the line before the runner starts says what it will cost
    (the runner is interrupted where it would start: this test needs no emulation)."""
    import advisor.capture.relay as relay

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    path = tmp_path / "c.json"
    path.write_text(json.dumps(campaign()))
    monkeypatch.setattr(relay, "missing_modules", lambda *args: [])
    monkeypatch.setattr(relay, "relay", interrupted)
    result = advisor("profile", "run", path, "--out", tmp_path / "runs", expect=130)
    first, second = result.stderr.strip().splitlines()
    assert first.startswith("advisor profile run: 3 run(s) to emulate on ") and "GiB at once (run pp-b1-" in first
    assert second.startswith("interrupted: 0 of 3 runs are complete")
