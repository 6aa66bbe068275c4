"""The profiling campaign: Description 1 against the paper's lines, coverage, batches, flags."""

import re
from pathlib import Path

import pytest
from advisor.capture.campaign import plan_campaign, profile_microbatches, read_campaign
from advisor.capture.coverage import sources, stage_ranges
from advisor.capture.layout import even_split
from advisor.megatron_args import pipeline_layout, split_args
from advisor.capture.partitionings import description1, reduced
from advisor.errors import AdvisorError
from advisor.models import PRESETS

FLAGS = set((Path(__file__).parent.parent / "tables/data/megatron_lm_core_v0.15.2_flags.txt").read_text().split())


def test_eq_spreads_the_remainder_over_the_last_stages():
    assert even_split(14, 2) == [7, 7]
    assert even_split(13, 2) == [6, 7]
    assert even_split(14, 6) == [2, 2, 2, 2, 3, 3]
    assert even_split(0, 0) == []


def test_description1_starts_with_the_papers_lines():
    # Seed 000, Description 1 with L = 16, G = 4 (q = 4), worked by hand:
    # line 1 [1, 1, eq(14, 2)], line 2 [2, 1, eq(13, 2)], line 3 [3, 1, eq(12, 2)],
    # line 4 [q, 1, 1, eq(10, 1)], line 5 [q+1, 1, 1, eq(9, 1)] (the paper prints eq(L-(q+2), G-3),
    # which would place 17 layers), line 8 [q, 2, 1, eq(9, 1)], then [q, 3, 1, eq(8, 1)].
    assert description1(16, 4)[:7] == [
        (1, 1, 7, 7), (2, 1, 6, 7), (3, 1, 6, 6), (4, 1, 1, 10), (5, 1, 1, 9), (4, 2, 1, 9), (4, 3, 1, 8),
    ]
    # L = 16, G = 8 (q = 2): line 1 [1, 1, eq(14, 6)]; line 4 = line 7 [2, 1, 1, eq(12, 5)]; line 5
    # [3, 1, 1, eq(11, 5)]; line 10 [q, q, 1, 1, eq(10, 4)]; line 11 [q, q+1, 1, 1, eq(9, 4)].
    assert description1(16, 8)[:5] == [
        (1, 1, 2, 2, 2, 2, 3, 3), (2, 1, 1, 2, 2, 2, 3, 3), (3, 1, 1, 2, 2, 2, 2, 3), (2, 2, 1, 1, 2, 2, 3, 3),
        (2, 3, 1, 1, 2, 2, 2, 3),
    ]


def test_description1_measures_every_statistic():
    """Every S from 3 to 16 stages and every L from S + 1 to 80 layers."""
    for stages in range(3, 17):
        for layers in range(stages + 1, 81):
            found = description1(layers, stages)
            assert len(set(found)) == len(found)
            assert all(len(p) == stages and sum(p) == layers and min(p) >= 1 for p in found)
            assert sources(r for p in found for r in stage_ranges(p)).missing(layers) == ([], []), (layers, stages)
            assert len(found) <= layers + 2, (layers, stages)  # the paper's idealised count is L + 1


def test_with_two_stages_only_the_ends_can_sit_alone():
    found = description1(5, 2)
    assert found == [(1, 4), (2, 3), (3, 2), (4, 1)]
    # Layers 2..4 never sit alone; M_a(5) needs 4..5 on the last stage and layer 4 alone.
    assert sources(r for p in found for r in stage_ranges(p)).missing(5) == ([2, 3, 4], [5])


def test_reduced_gives_each_position_two_counts_and_light_ends():
    assert reduced(8, 4) == [(2, 2, 2, 2), (3, 1, 3, 1), (1, 3, 3, 1)]
    for layers, stages in [(32, 16), (80, 16), (33, 5), (126, 32)]:
        even, shifted, ends = reduced(layers, stages)
        assert all(a != b for a, b in zip(even, shifted))
        assert ends[0] == ends[-1] == 1 and sum(shifted) == sum(ends) == layers


def test_profile_microbatches_round_up_to_what_the_scenario_runs():
    assert profile_microbatches(8, (0.5, 0.25), 1) == (2, 4)
    assert profile_microbatches(8, (0.5, 0.25), 4) == (4, 8)
    assert profile_microbatches(1, (0.5, 0.25), 1) == (1, 2)  # both round to 1: the larger moves up
    assert profile_microbatches(1, (0.5, 0.25), 2) == (2, 4)


def test_campaign_for_32_layers_on_16_gpus():
    campaign = plan_campaign(PRESETS["llama3.1-8b"], gpus=16, gpus_per_node=4, seq_len=8192, micro_batch_size=8,
                             global_batch_size=1024)
    stages = {plan.scenario.name: plan.stages for plan in campaign.scenarios}
    assert stages == {"pp": 16, "dp2": 8, "dp4": 4, "tp2": 8, "tp4": 4}
    # Description 1 per scenario (at most L + 2 = 34), each at two batches; CAPTURE counts
    # 10 (L - 1) = 310.
    assert all(plan.partitionings <= 34 for plan in campaign.scenarios)
    assert 300 <= len(campaign.runs) <= 340
    # docs/capture.md quotes this campaign (its first command) and its reduced form: the same counts.
    readme = (Path(__file__).resolve().parent.parent / "docs" / "capture.md").read_text()
    full = re.search(r"advisor profile plan --gpus 16 --gpus-per-node 4 --mbs 8 -o campaign.json +# (\d+) runs", readme)
    reduced = re.search(r"advisor profile plan --gpus 16 --gpus-per-node 4 --mbs 8 --mode reduced +# (\d+) runs", readme)
    assert int(full.group(1)) == len(campaign.runs) == 318
    assert int(reduced.group(1)) == len(plan_campaign(
        PRESETS["llama3.1-8b"], gpus=16, gpus_per_node=4, seq_len=8192, micro_batch_size=8, global_batch_size=1024,
        mode="reduced").runs) == 30
    assert f"{int(reduced.group(1))} runs instead of {int(full.group(1))} for 32" in readme.replace("\n", " ")
    ids = [run.id for run in campaign.runs]
    assert len(set(ids)) == len(ids)
    again = plan_campaign(PRESETS["llama3.1-8b"], gpus=16, gpus_per_node=4, seq_len=8192, micro_batch_size=8,
                          global_batch_size=1024)
    assert [run.id for run in again.runs] == ids  # stable, so a runner can resume
    run = next(r for r in campaign.runs if r.scenario.name == "dp4")
    assert run.micro_batch_size * 4 == run.pipeline_microbatch and run.world_size == 16
    assert run.global_batch_size == run.pipeline_microbatch * run.num_microbatches


def test_reduced_campaign_and_skipped_scenarios():
    spec = PRESETS["llama3.2-1b"]  # 8 KV heads
    campaign = plan_campaign(spec, gpus=8, gpus_per_node=2, seq_len=4096, micro_batch_size=4,
                             global_batch_size=64, mode="reduced")
    assert [plan.scenario.name for plan in campaign.scenarios] == ["pp", "dp2", "tp2"]
    assert {name for name, _ in campaign.skipped} == {"dp4", "tp4"}
    assert len(campaign.runs) == 3 * 2 * 3
    document = campaign.to_dict()
    assert document["schema"] == "megatron-4d-advisor/campaign" and document["version"] == 1
    assert document["runs"][0]["launchable"] is True


def test_merged_units_apply_to_the_parallel_scenarios():
    spec = PRESETS["llama3.2-1b"]  # 16 layers, merged into 8 units of 2
    campaign = plan_campaign(spec, gpus=8, gpus_per_node=4, seq_len=4096, micro_batch_size=4,
                             global_batch_size=64, units=(2,) * 8)
    pp = [run for run in campaign.runs if run.scenario.name == "pp"]
    tp2 = [run for run in campaign.runs if run.scenario.name == "tp2"]
    assert any(1 in run.layers_per_stage for run in pp)
    assert all(count % 2 == 0 for run in tp2 for count in run.layers_per_stage)


@pytest.mark.parametrize("bad,message", [
    (dict(gpus=10, gpus_per_node=4), "not a whole number of nodes"),
    (dict(fractions=(0.5, 0.5)), "--fractions 0.5,0.5: give two different fractions"),
    (dict(micro_batch_size=3, global_batch_size=64), "--gbs 64 is not divisible by --mbs 3"),
    (dict(units=(3, 3)), "--units 3,3 sums to 6 layers, not the model's 16"),
])
def test_campaign_input_errors(bad, message):
    values = dict(gpus=8, gpus_per_node=4, seq_len=4096, micro_batch_size=4, global_batch_size=64)
    values.update(bad)
    with pytest.raises(AdvisorError, match=message):
        plan_campaign(PRESETS["llama3.2-1b"], **values)


def test_split_flags():
    assert split_args([4, 4, 4, 4]) == []
    assert split_args([3, 4, 4, 5]) == ["--decoder-first-pipeline-num-layers", "3",
                                        "--decoder-last-pipeline-num-layers", "5"]
    assert split_args([4, 4, 4, 2]) == ["--decoder-last-pipeline-num-layers", "2"]
    assert split_args([5, 3]) == ["--decoder-first-pipeline-num-layers", "5", "--decoder-last-pipeline-num-layers", "3"]
    assert split_args([3, 5, 4, 4]) == ["--pipeline-model-parallel-layout", "E,t*3|t*5|t*4|t*4,L"]
    assert pipeline_layout([1, 3, 1]) == "E,t|t*3|t,L"


def test_every_campaign_flag_exists_in_megatron():
    campaign = plan_campaign(PRESETS["llama3.1-8b"], gpus=16, gpus_per_node=4, seq_len=8192, micro_batch_size=8,
                             global_batch_size=1024, mode="reduced")
    used = {arg for run in campaign.runs for arg in run.megatron_args if arg.startswith("--")}
    assert used <= FLAGS


def test_layouts_parse_in_megatron_core():
    layout_module = pytest.importorskip("megatron.core.transformer.pipeline_parallel_layer_layout")
    for counts in ([1, 1, 7, 7], [3, 5, 4, 4], [1, 3, 1], [2] * 15 + [1, 1]):
        layout = layout_module.PipelineParallelLayerLayout(pipeline_layout(counts), len(counts))
        layout.validate_layer_layout(num_layers=sum(counts), mtp_num_layers=None)
        built = [[kind.name for kind in stage[0]].count("decoder") for stage in layout.layout]
        assert built == counts


def test_read_campaign_round_trip_and_errors(tmp_path):
    import json

    campaign = plan_campaign(PRESETS["llama3.2-1b"], gpus=8, gpus_per_node=4, seq_len=4096, micro_batch_size=4,
                             global_batch_size=64, mode="reduced")
    path = tmp_path / "campaign.json"
    path.write_text(json.dumps(campaign.to_dict()))
    assert read_campaign(path) == campaign.to_dict()
    document = campaign.to_dict()
    document["runs"].append(document["runs"][0])
    path.write_text(json.dumps(document))
    with pytest.raises(AdvisorError, match="appears twice"):
        read_campaign(path)
    path.write_text(json.dumps({**document, "version": 2}))
    with pytest.raises(AdvisorError, match="campaign schema version 2"):
        read_campaign(path)
    path.write_text("{")
    with pytest.raises(AdvisorError, match="malformed JSON"):
        read_campaign(path)
