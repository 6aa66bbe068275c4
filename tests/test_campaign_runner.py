"""``advisor profile run`` with the real runner: megatron-core stages emulated on the CPU in a
subprocess (TP in a pool of gloo processes), resumed, out of memory, and byte for byte what a
fresh emulation process measures."""

import json

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install -e '.[megatron]')")

from advisor.capture.campaign import layout_campaign  # noqa: E402
from advisor.capture.campaign_run import scan  # noqa: E402
from advisor.capture.layout import Scenario  # noqa: E402
from advisor.capture.observations import load_profile_set  # noqa: E402
from advisor.megatron_args import MegatronSetup  # noqa: E402
from advisor.profiles import load_run  # noqa: E402
from megatron_support import SEQ, TINY  # noqa: E402

CPU = MegatronSetup(params_dtype="float32", distributed_optimizer=False, sequence_parallel=False)
GIB = 2**30


def _campaign(path, *parts) -> dict:
    """One campaign of several layout campaigns (scenario, layouts), pipeline microbatch 2, m = 2."""
    documents = [layout_campaign(TINY, layouts, seq_len=SEQ, pipeline_microbatch=2, num_microbatches=2,
                                 scenario=scenario, setup=CPU).to_dict() for scenario, layouts in parts]
    document = documents[0]
    for other in documents[1:]:
        document["runs"] += other["runs"]
        for key in ("gpus", "gpus_per_node"):  # what the widest run needs
            document[key] = max(document[key], other[key])
    path.write_text(json.dumps(document))
    return document


def _stamps(out) -> dict:
    return {path.relative_to(out): path.stat().st_mtime_ns for path in sorted(out.glob("*/rank*.jsonl"))}


def _measured(path) -> dict:
    """A rank file's measurements: everything but the run id, wall times (the step's and, since
    schema v2, each layer's forward and backward) and the creation date."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line in lines:
        for key in [key for key in line if key in ("run_id", "created") or key.endswith("_time_s")]:
            line.pop(key)
    return lines


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """Two pipeline-only runs and a TP 2 run, through the CLI (a module fixture: the runs take
    about 15 s)."""
    from conftest import Invoker

    root = tmp_path_factory.mktemp("runner")
    document = _campaign(root / "campaign.json", (Scenario(), [(2, 2), (3, 1)]), (Scenario(tp=2), [(2, 2)]))
    result = Invoker()("profile", "run", root / "campaign.json", "--out", root / "runs")
    return root, document, result


def test_every_run_is_profiled_and_shown(profiled):
    root, document, result = profiled
    assert result.stdout.startswith("3 runs in ") and ": 3 ok, 0 oom, 0 failed, 0 already complete" in result.stdout
    cost, *lines = result.stderr.splitlines()
    assert cost.startswith("advisor profile run: 3 run(s) to emulate on ")  # said before it starts
    assert lines[0].endswith(": 0 complete, 3 to run")  # not a terminal: one line per run
    assert [line.split(": ")[0] for line in lines[1:]] == ["[1/3] pp-b2-2x2", "[2/3] pp-b2-3.1", "[3/3] tp2-b2-2x2"]
    assert all(": ok (" in line for line in lines[1:])
    profiles = load_profile_set([root / "runs"])
    assert {run.run for run in profiles.runs} == {"pp-b2-2x2", "pp-b2-3.1", "tp2-b2-2x2"}
    tp = load_run(root / "runs" / "tp2-b2-2x2")
    # TP 2 x PP 2: Megatron's ranks tp-dp-pp, every one emulated, all in one run.
    assert [(r.header.rank, r.header.coords["tp"], r.header.coords["pp"]) for r in tp.ranks] == \
        [(0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1)]
    assert len({r.header.run_id for r in tp.ranks}) == 1 and all(r.header.emulated for r in tp.ranks)


def test_a_rerun_skips_complete_runs_and_redoes_partial_ones(profiled, advisor):
    root, document, _ = profiled
    runs = root / "runs"
    before = _stamps(runs)
    again = advisor("profile", "run", root / "campaign.json", "--out", runs)
    assert ": 0 ok, 0 oom, 0 failed, 3 already complete" in again.stdout
    assert again.stderr.splitlines() == [f"3 runs in {runs}: 3 complete, 0 to run"]
    assert _stamps(runs) == before
    # A killed run (a rank still "running") and a lost rank file: those two runs again, only.
    killed = runs / "pp-b2-3.1" / "rank00001.jsonl"
    lines = killed.read_text().splitlines()
    end = json.loads(lines[-1]) | {"status": "running"}
    killed.write_text("\n".join(lines[:-1] + [json.dumps(end)]) + "\n")
    (runs / "pp-b2-2x2" / "rank00000.jsonl").unlink()
    redo = advisor("profile", "run", root / "campaign.json", "--out", runs)
    assert ": 2 ok, 0 oom, 0 failed, 1 already complete" in redo.stdout
    cost, *lines = redo.stderr.splitlines()
    assert cost.startswith("advisor profile run: 2 run(s) to emulate")  # only the runs left
    assert [line.split(": ")[0] for line in lines[1:]] == ["[2/3] pp-b2-2x2", "[3/3] pp-b2-3.1"]
    after = _stamps(runs)
    assert set(after) == set(before)
    for path in before:
        assert (after[path] == before[path]) == (path.parts[0] == "tp2-b2-2x2"), path
    assert all(check.state == "complete" for check in scan(document, runs).values())


def test_a_reused_process_measures_what_a_fresh_one_does(profiled, tmp_path):
    """The runner ran pp-b2-3.1 in a process that had run pp-b2-2x2 before it (megatron-core's
    attention buffer is reset per stage); a freshly spawned emulation process agrees byte for byte."""
    from megatron_hooks.stage_emulation import StageEmulation, emulate_stages

    root, _, _ = profiled
    config = StageEmulation(model=TINY, layers_per_stage=(3, 1), seq_len=SEQ, micro_batch_size=2, num_microbatches=2,
                            threads=1, output_dir=tmp_path)
    for path in emulate_stages(config):
        assert _measured(root / "runs" / "pp-b2-3.1" / path.name) == _measured(path)


def test_out_of_memory_is_an_outcome(profiled, tmp_path, advisor):
    """A memory limit between the two stages' peaks that the same run reached without one: the
    first stage (the embedding, two microbatches in flight) runs out of memory, the last does not;
    the run is complete, its outcome "oom", and a rerun leaves it alone."""
    root, _, _ = profiled
    campaign = tmp_path / "campaign.json"
    _campaign(campaign, (Scenario(), [(2, 2)]))
    first, last = (rank.peak_allocated_bytes for rank in load_run(root / "runs" / "pp-b2-2x2").ranks)
    assert first > last
    limit = (first + last) / 2 / GIB
    result = advisor("profile", "run", campaign, "--out", tmp_path / "runs", "--memory-limit", repr(limit))
    assert ": 0 ok, 1 oom, 0 failed" in result.stdout
    assert "pp-b2-2x2: oom (" in result.stderr and "rank 0: iteration" in result.stderr
    run = load_run(tmp_path / "runs" / "pp-b2-2x2")
    assert [rank.status for rank in run.ranks] == ["oom", "ok"]
    assert run.ranks[0].error.startswith("OutOfMemoryError: emulated out of memory")
    again = advisor("profile", "run", campaign, "--out", tmp_path / "runs", "--memory-limit", repr(limit))
    assert "1 already complete" in again.stdout
