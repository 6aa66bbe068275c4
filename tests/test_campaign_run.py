"""Executing a campaign, without torch: run states, the resuming loop, and ``advisor profile run``'s
errors. The loop's executor here is a documented fake that writes rank files (factories.py);
tests/test_campaign_runner.py runs the real one, the CPU emulator."""

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
from factories import TINY, header, iteration, layer, profile

from advisor.capture.campaign import layout_campaign
from advisor.capture.campaign_run import check_run, clear_run, execute, scan
from advisor.errors import AdvisorError
from advisor.megatron_args import MegatronSetup
from advisor.models import with_overrides
from advisor.parallel import ParallelConfig

CPU = MegatronSetup(params_dtype="float32", distributed_optimizer=False, sequence_parallel=False)


def campaign(layouts=((2, 2), (1, 3), (3, 1)), **changes) -> dict:
    values = dict(seq_len=32, pipeline_microbatch=1, num_microbatches=4, setup=CPU)
    values.update(changes)
    return layout_campaign(TINY, list(layouts), **values).to_dict()


def write_rank(directory: Path, run: dict, stage: int, status: str = "ok", **changes) -> None:
    """Rank ``stage`` of a PP-only campaign run, as the CPU emulator's hooks write it (emulated
    stages; ``emulated=False`` for a Megatron-LM run's)."""
    counts = tuple(run["layers_per_stage"])
    first = sum(counts[:stage]) + 1
    layers = tuple(range(first, first + counts[stage]))
    values = dict(
        run_id=run["id"], model=TINY, seq_len=32, layers_per_stage=counts, rank=stage, world_size=len(counts),
        parallel=ParallelConfig(pp=len(counts), mbs=run["micro_batch_size"]),
        global_batch_size=run["global_batch_size"], num_microbatches=run["num_microbatches"],
        coords={"tp": 0, "cp": 0, "pp": stage, "dp": 0}, stage_layers=layers, first_stage=stage == 0,
        last_stage=stage == len(counts) - 1, in_flight_microbatches=min(len(counts) - stage, 4), emulated=True,
    )
    values.update(changes)
    modules = ([layer("embedding", "embedding", None)] if stage == 0 else []) + \
        [layer(f"decoder.layers.{i}", "decoder", n) for i, n in enumerate(layers)] + \
        ([layer("output", "output", None)] if stage == len(counts) - 1 else [])
    done = status == "ok"
    failed = status in ("oom", "error")
    profile(header=header(**values), layers=tuple(modules) if done else (), iterations=(iteration(),) if done else (),
            status=status, where="iteration 1, microbatch 0, forward, embedding" if failed else None,
            error="OutOfMemoryError: simulated" if failed else None).write(directory)


class FakeExecutor:
    """Writes every rank of a run as ended ``outcomes.get(id, "ok")``; raises for ids in ``crash``."""

    def __init__(self, outcomes=None, crash=()):
        self.outcomes, self.crash, self.ran, self.closed = outcomes or {}, set(crash), [], False

    def run(self, document, run, directory):
        self.ran.append(run["id"])
        if run["id"] in self.crash:
            raise RuntimeError("emulation process 1 of 2 died (exit code -9)")
        for stage in range(len(run["layers_per_stage"])):
            write_rank(directory, run, stage, self.outcomes.get(run["id"], "ok") if stage == 0 else "ok")

    def close(self):
        self.closed = True


def test_run_states(tmp_path):
    document = campaign()
    run = document["runs"][0]
    directory = tmp_path / run["id"]
    assert check_run(directory, document, run).state == "absent"
    directory.mkdir()
    write_rank(directory, run, 0)
    check = check_run(directory, document, run)
    assert (check.state, check.reason) == ("partial", "no rank file for rank 1")
    write_rank(directory, run, 1, status="running")
    assert check_run(directory, document, run).reason == "rank 1 ended 'running'"
    write_rank(directory, run, 1, status="error")
    assert check_run(directory, document, run).reason == "rank 1 ended 'error'"
    write_rank(directory, run, 1)
    assert check_run(directory, document, run) == replace(check, state="complete", status="ok", reason=None)
    write_rank(directory, run, 1, status="oom")
    assert (check_run(directory, document, run).state, check_run(directory, document, run).status) == \
        ("complete", "oom")
    (directory / "rank00001.jsonl").write_text('{"type": "header"')  # cut off mid-write
    assert check_run(directory, document, run).state == "partial"
    (directory / ".rank00001.jsonl.x.tmp").write_text("")
    clear_run(directory)
    assert list(directory.iterdir()) == []


def test_a_directory_of_another_run_is_an_error(tmp_path):
    document = campaign()
    run = document["runs"][0]
    directory = tmp_path / run["id"]
    directory.mkdir()
    write_rank(directory, run, 0, num_microbatches=2, global_batch_size=2)
    with pytest.raises(AdvisorError, match="holds another run than campaign run pp-b1-2x2: rank 0 has "
                                           "num_microbatches 2, the campaign's run 4; choose another --out"):
        check_run(directory, document, run)
    write_rank(directory, run, 0, model=with_overrides(TINY, hidden_size=128))
    with pytest.raises(AdvisorError, match="rank 0 profiles another model"):
        scan(document, tmp_path)


def test_execute_skips_complete_runs_and_redoes_partial_ones(tmp_path):
    document = campaign()
    events = []
    first = FakeExecutor(outcomes={"pp-b1-1.3": "oom"})
    assert execute(document, tmp_path, first, events.append) == 0
    assert first.ran == ["pp-b1-2x2", "pp-b1-1.3", "pp-b1-3.1"] and first.closed
    assert [e["event"] for e in events] == ["campaign", "start", "run", "start", "run", "start", "run", "done"]
    assert [(e["id"], e["index"], e["status"]) for e in events if e["event"] == "run"] == \
        [("pp-b1-2x2", 1, "ok"), ("pp-b1-1.3", 2, "oom"), ("pp-b1-3.1", 3, "ok")]
    oom = events[4]
    assert oom["where"] == "rank 0: iteration 1, microbatch 0, forward, embedding" and oom["seconds"] >= 0
    assert events[-1] | {"seconds": 0} == {"event": "done", "ok": 2, "oom": 1, "error": 0, "skipped": 0, "seconds": 0}

    # A kill left one run with a rank "running", another lost a file: only those run again.
    write_rank(tmp_path / "pp-b1-3.1", document["runs"][2], 1, status="running")
    (tmp_path / "pp-b1-2x2" / "rank00000.jsonl").unlink()
    events.clear()
    again = FakeExecutor()
    assert execute(document, tmp_path, again, events.append) == 0
    assert again.ran == ["pp-b1-2x2", "pp-b1-3.1"]
    assert events[0] | {"out": ""} == {"event": "campaign", "schema": "megatron-4d-advisor/campaign-events",
                                       "version": 1, "runs": 3, "complete": 1, "out": ""}
    assert [e["index"] for e in events if e["event"] == "run"] == [2, 3]
    assert events[-1]["skipped"] == 1
    assert all(check.state == "complete" for check in scan(document, tmp_path).values())


def test_execute_records_a_run_it_could_not_run_and_goes_on(tmp_path):
    events = []
    executor = FakeExecutor(crash={"pp-b1-1.3"})
    assert execute(campaign(), tmp_path, executor, events.append) == 1
    failed = [e for e in events if e["event"] == "run" and e["status"] == "error"]
    assert [e["id"] for e in failed] == ["pp-b1-1.3"]
    assert failed[0]["error"] == "RuntimeError: emulation process 1 of 2 died (exit code -9)"
    assert executor.ran[-1] == "pp-b1-3.1" and events[-1]["error"] == 1


def test_a_run_that_left_an_error_is_a_failure(tmp_path):
    class ErrorExecutor(FakeExecutor):
        def run(self, document, run, directory):
            write_rank(directory, run, 0)
            write_rank(directory, run, 1, status="error")

    events = []
    assert execute(campaign(layouts=[(2, 2)]), tmp_path, ErrorExecutor(), events.append) == 1
    assert events[2]["status"] == "error" and events[2]["where"].startswith("rank 1: iteration 1")


# --- advisor profile run: bad input ------------------------------------------------------


def _write(path: Path, document: dict) -> Path:
    path.write_text(json.dumps(document))
    return path


@pytest.fixture
def campaign_file(tmp_path):
    return _write(tmp_path / "campaign.json", campaign())


def test_missing_torch_is_one_line(advisor, campaign_file, tmp_path, monkeypatch):
    """torch is installed here; what the command sees of a machine without it is faked."""
    monkeypatch.setattr("advisor.capture.relay.missing_modules", lambda *args: ["torch", "megatron.core"])
    line = advisor.error("profile", "run", campaign_file, "--out", tmp_path / "runs")
    assert line == ("Error: advisor profile run needs torch and megatron-core, and torch and megatron.core cannot "
                    "be imported here: pip install torch && pip install -e '.[megatron]'")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("backend, said", [((), True), (("--backend", "symbolic", "--layer-spec", "local"), True),
                                            (("--backend", "symbolic"), False)])
def test_an_eager_swiglu_campaign_on_a_local_spec_emulator_says_what_its_plan_launches(advisor, tmp_path, monkeypatch,
                                                                                      backend, said):
    """The CPU emulator's (and the symbolic local spec's) stages run the eager SwiGLU whatever is
    asked and stand for Megatron-LM's fused default, so a campaign asking the eager one is told,
    before any work, that its plan launches the fused one; Transformer Engine's symbolic spec
    builds what is asked and says nothing. (torch's absence is faked to stop before the runs.)"""
    monkeypatch.setattr("advisor.capture.relay.missing_modules", lambda *args: ["torch"])
    eager = _write(tmp_path / "eager.json", campaign(layouts=[(2, 2)], setup=replace(CPU, bias_swiglu_fusion=False)))
    result = advisor("profile", "run", eager, "--out", tmp_path / "runs", *backend, expect=2)
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("Error: advisor profile run needs torch") and "Traceback" not in result.output
    assert lines[:-1] == ([_eager_note()] if said else [])
    fused = _write(tmp_path / "fused.json", campaign(layouts=[(2, 2)]))
    assert len(advisor("profile", "run", fused, "--out", tmp_path / "runs", *backend, expect=2).stderr.splitlines()) == 1


def _eager_note() -> str:
    return ("note: the campaign asks for the eager SwiGLU (bias_swiglu_fusion false), but this backend's local spec "
            "runs it whatever is asked, and its profiles stand for Megatron-LM's fused default: a plan from them "
            "launches the fused SwiGLU; to profile the eager one as asked, use --backend symbolic --layer-spec "
            "transformer_engine (its default) or --megatron-lm DIR")


def test_missing_modules_are_found_without_importing_them(monkeypatch):
    from advisor.capture import relay

    monkeypatch.setattr(relay, "REQUIRED", ("json", "no_such_package_xyz", "no_such_parent_xyz.core"))
    assert relay.missing_modules() == ["no_such_package_xyz", "no_such_parent_xyz.core"]


def _run0(**changes):
    return lambda d: d["runs"][0].update(changes)


# The hostile campaigns of issue 17 and their kin: each one line, exit 2, before any work.
@pytest.mark.parametrize("change,message", [
    (_run0(layers_per_stage=[2, 1]),
     "run pp-b1-2x2: 'layers_per_stage' [2, 1] must be positive layer counts that sum to the model's 4 layers"),
    (_run0(layers_per_stage=["2", "2"]), "'layers_per_stage' ['2', '2'] must be positive layer counts"),
    (_run0(id="../escape"), "run 1: run id '../escape' cannot name a directory"),
    (_run0(id=" "), "run id ' ' cannot name a directory"),
    (_run0(id="a\nb"), "run id 'a\\nb' cannot name a directory"),
    (_run0(id="a\0b"), "run id 'a\\x00b' cannot name a directory"),
    (_run0(id=""), "run id '' cannot name a directory"),
    (_run0(id=".hidden"), "run id '.hidden' cannot name a directory"),
    (_run0(id="x" * 201), "cannot name a directory: use up to 200 letters"),
    (_run0(id=7), "a run id must be a string, got 7"),
    (_run0(tp=0), "run pp-b1-2x2: 'tp' must be at least 1, got 0"),
    (_run0(cp="2"), "run pp-b1-2x2: 'cp' must be an integer, got '2'"),  # was a traceback
    (_run0(cp=0), "run pp-b1-2x2: 'cp' must be at least 1, got 0"),
    (_run0(pp=3), "run pp-b1-2x2: 'pp' is 3, but the number of stages in layers_per_stage is 2"),
    (_run0(world_size=4), "'world_size' is 4, but TP x DP x CP x PP = 1 x 1 x 1 x 2 is 2"),
    (_run0(global_batch_size=64), "'global_batch_size' is 64, but micro_batch_size x DP x num_microbatches"),
    (_run0(pipeline_microbatch=2), "'pipeline_microbatch' is 2, but micro_batch_size x DP = 1 x 1 is 1"),
    (_run0(num_microbatches=1_000_000_000), "'num_microbatches' must be at most 4,096, got 1000000000: a 1F1B"),
    (lambda d: (d.update(gpus=8, gpus_per_node=8), d["runs"][0].update(tp=3, world_size=6)), "run pp-b1-2x2: TP 3 must divide the attention heads (4) and the KV heads (2)"),
    (_run0(megatron_args=["--lr", "1e-4\0"]), "'megatron_args' must be a list of strings without NUL bytes"),
    (lambda d: (d.update(gpus=4), d["runs"][0].update(tp=2, world_size=4)), "a stage's TP x DP x CP = 2 GPUs is more than a node's 1 (gpus_per_node)"),
    (lambda d: d.update(version=2), "campaign schema version 2; this advisor reads 1"),
    (lambda d: d["runs"].append(dict(d["runs"][0])), "run id 'pp-b1-2x2' appears twice"),
    (lambda d: d.update(setup=[]), "'setup' must be a JSON object, got []"),  # was exit 1
    (lambda d: d["setup"].update(params_dtype="int8"), "'params_dtype' must be one of bfloat16, float16, float32"),
    (lambda d: d["setup"].update(bias_swiglu_fusion="no"), "'setup': 'bias_swiglu_fusion' must be true or false, got 'no'"),
    # the header's name for it, silently ignored, would have run the fused SwiGLU
    (lambda d: d["setup"].update(swiglu_fusion=False), "'setup': unknown field 'swiglu_fusion' (did you mean "
                                                       "'bias_swiglu_fusion'?): a campaign's setup has params_dtype, "
                                                       "distributed_optimizer, sequence_parallel, bias_swiglu_fusion"),
    # the runs' flags and the setup (what the emulators build and the prices read) say one SwiGLU
    (lambda d: d["setup"].update(bias_swiglu_fusion=False), "run pp-b1-2x2: 'megatron_args' lack --no-bias-swiglu-fusion, "
                                                            "but the campaign's setup says bias_swiglu_fusion false"),
    (_run0(megatron_args=[*campaign()["runs"][0]["megatron_args"], "--no-bias-swiglu-fusion"]),
     "run pp-b1-2x2: 'megatron_args' give --no-bias-swiglu-fusion, but the campaign's setup says bias_swiglu_fusion true"),
    # a plan's setup records the layer spec its profiles ran; a campaign's runs take theirs from the
    # runner (campaign_run.backend_fields), so the field would be read and ignored
    (lambda d: d["setup"].update(transformer_impl="local"), "'setup': unknown field 'transformer_impl': a campaign's "
                                                            "setup has params_dtype, distributed_optimizer, "
                                                            "sequence_parallel, bias_swiglu_fusion"),
    (lambda d: d.update(seq_len=10**9), "'seq_len' must be at most 16,777,216, got 1000000000"),
    (lambda d: d.update(runs=[]), "'runs' must be a non-empty list of runs, got []"),
    (lambda d: d.update(runs={}), "'runs' must be a non-empty list of runs, got {}"),
    (lambda d: d.update(gpus=-1), "'gpus' must be at least 1, got -1"),
    (lambda d: d.update(gpus=1), "'world_size' 2 is more than the campaign's 1 GPUs"),
    (lambda d: d.update(model=[]), "'model' must be an object, got a list"),
    (lambda d: d["model"].update(heads=4), "'model' has an unknown field, 'heads'"),  # was Python's TypeError
    (lambda d: d.pop("model"), "c.json: missing 'model'"),  # the file was named twice
    (lambda d: d["model"].pop("vocab_size"), "'model' lacks the field 'vocab_size'"),
    (lambda d: d.pop("runs"), "missing 'runs'"),
    # a misspelt field was ignored without a word: a run's 'megatron_arg' launched it from the model alone
    (lambda d: d["runs"][0].update(megatron_arg=d["runs"][0].pop("megatron_args")),
     "run pp-b1-2x2: unknown field 'megatron_arg' (did you mean 'megatron_args'?): a campaign's run has id, "
     "scenario, tp, dp, cp, pp, "),
    (lambda d: d.update(sequence_length=64), "c.json: unknown field 'sequence_length': a campaign has schema, "),
])
def test_bad_campaigns(advisor, tmp_path, change, message):
    document = campaign()
    change(document)
    line = advisor.error("profile", "run", _write(tmp_path / "c.json", document), "--out", tmp_path / "runs")
    assert message in line and str(tmp_path / "c.json") in line
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("args,message", [
    (["--out", ""], "--out is empty; give the directory for the runs"),  # wrote into the current directory
    (["--out", "runs", "--memory-limit", "nan"], "'--memory-limit': must be a finite number, got nan"),
    (["--out", "runs", "--memory-limit", "inf"], "'--memory-limit': must be a finite number, got inf"),
    (["--out", "runs", "--threads", "100000"], "'--threads': must be at most"),  # the runner segfaulted
])
def test_bad_run_options(advisor, campaign_file, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    assert message in advisor.error("profile", "run", campaign_file, *args)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["campaign.json"]


def test_a_fifo_where_a_run_directory_goes_is_refused(advisor, campaign_file, tmp_path):
    (tmp_path / "runs").mkdir()
    os.mkfifo(tmp_path / "runs" / "pp-b1-2x2")
    line = advisor.error("profile", "run", campaign_file, "--out", tmp_path / "runs")
    assert "runs/pp-b1-2x2 is not a directory (a run's directory must be one)" in line
    os.unlink(tmp_path / "runs" / "pp-b1-2x2")
    os.mkfifo(tmp_path / "campaign.fifo")
    line = advisor.error("profile", "run", tmp_path / "campaign.fifo", "--out", tmp_path / "runs")
    assert "campaign.fifo is a FIFO (named pipe); a campaign file is read from a regular file only" in line


def test_what_the_emulator_cannot_run_is_reported_at_once(advisor, tmp_path):
    """The CPU profiling trap: every incompatibility in one line, not one per attempt."""
    from advisor.capture.campaign import plan_campaign

    document = plan_campaign(with_overrides(TINY, num_layers=8), gpus=8, gpus_per_node=4, seq_len=32,
                             micro_batch_size=4, global_batch_size=16, mode="reduced", cp=2).to_dict()
    line = advisor.error("profile", "run", _write(tmp_path / "c.json", document), "--out", tmp_path / "runs")
    assert "the CPU emulator cannot run this campaign as planned: " in line
    assert "with DP > 1 with the distributed optimizer, which the emulator does not shard, first dp2-" in line
    assert "(plan it with --no-distributed-optimizer)" in line
    assert "with TP > 1 with sequence parallelism, which the emulator cannot run, first tp2-" in line
    assert "with CP > 1; the emulator runs no context parallelism, first pp-" in line and "(plan it with --cp 1)" in line


def test_out_must_be_a_directory_without_other_runs(advisor, campaign_file, tmp_path):
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    assert "--out" in advisor.error("profile", "run", campaign_file, "--out", not_a_directory)
    document = json.loads(campaign_file.read_text())
    directory = tmp_path / "runs" / "pp-b1-2x2"
    directory.mkdir(parents=True)
    write_rank(directory, document["runs"][0], 0, seq_len=64)
    line = advisor.error("profile", "run", campaign_file, "--out", tmp_path / "runs")
    assert "holds another run than campaign run pp-b1-2x2: rank 0 has seq_len 64, the campaign's run 32" in line


def test_out_holding_runs_of_another_setup_is_refused(advisor, campaign_file, tmp_path):
    """A campaign run into the --out of another model's campaign (other run ids, so no run
    directory clashed) ran to the end, and 'advisor recommend --profile OUT' then refused the mix
    ("run pp-b1-1.3x2.1 differs from run dp2-b2-1.15x2.1 in model (...)"): refused before any
    work now, nothing deleted. Runs of the same setup under it (another campaign's) are fine."""
    document = json.loads(campaign_file.read_text())
    other = {**document["runs"][0], "id": "pp-b1-other"}
    directory = tmp_path / "runs" / other["id"]
    directory.mkdir(parents=True)
    for stage in (0, 1):
        write_rank(directory, other, stage, seq_len=64)
    line = advisor.error("profile", "run", campaign_file, "--out", tmp_path / "runs")
    assert line == (f"Error: {tmp_path / 'runs'} holds run pp-b1-other of another setup, seq_len (64 vs 32) (its vs "
                    "this campaign's): 'advisor recommend --profile' reads every run under it as one setup; choose "
                    "another --out")
    for stage in (0, 1):
        write_rank(directory, other, stage, model=with_overrides(TINY, hidden_size=128))
    assert "holds run pp-b1-other of another setup, model (hidden_size 128 vs 64) (its vs this campaign's)" in \
        advisor.error("profile", "run", campaign_file, "--out", tmp_path / "runs", "--backend", "symbolic")
    assert sorted(path.name for path in directory.iterdir()) == ["rank00000.jsonl", "rank00001.jsonl"]
    for stage in (0, 1):  # the campaign's own setup: another campaign's run, which recommend reads with these
        write_rank(directory, other, stage)
    assert scan(document, tmp_path / "runs", {"emulated": True, "backend": "cpu", "layer_spec": "local"})
    assert "holds run pp-b1-other of another setup, backend ('cpu' vs 'symbolic') (its vs this campaign's)" in \
        advisor.error("profile", "run", campaign_file, "--out", tmp_path / "runs", "--backend", "symbolic")


def test_out_holding_a_run_that_recomputes_is_refused_before_the_campaign_runs(advisor, campaign_file, tmp_path):
    """A run under --out of the campaign's model, sequence, dtype, optimizer, spec and backend but
    with full recomputation (a Megatron-LM profile of a recomputing row, say): the campaign ran to
    the end, and 'advisor recommend --profile' then refused the mix, because the campaign side
    compared five of the fields that recommend compares (observations.check_one_setup). Refused
    now before any work, in one line, exit status 2, nothing run."""
    document = json.loads(campaign_file.read_text())
    other = {**document["runs"][0], "id": "pp-b1-other"}
    directory = tmp_path / "runs" / other["id"]
    directory.mkdir(parents=True)
    for stage in (0, 1):
        write_rank(directory, other, stage, recompute="full")
    line = advisor.error("profile", "run", campaign_file, "--out", tmp_path / "runs")
    assert line == (f"Error: {tmp_path / 'runs'} holds run pp-b1-other of another setup, recompute ('full' vs 'none') "
                    "(its vs this campaign's): 'advisor recommend --profile' reads every run under it as one setup; "
                    "choose another --out")
    assert sorted(path.name for path in (tmp_path / "runs").iterdir()) == ["pp-b1-other"]


FIELD_CHANGES = [
    ("model", {"model": with_overrides(TINY, hidden_size=128)}), ("seq_len", {"seq_len": 64}),
    ("params_dtype", {"params_dtype": "bfloat16"}), ("distributed_optimizer", {"distributed_optimizer": True}),
    ("recompute", {"recompute": "selective"}), ("layer_spec", {"layer_spec": "transformer_engine"}),
    ("backend", {"backend": "symbolic"}),
    # a Megatron-LM run of the eager SwiGLU: the CPU emulator's own eager one stands for the fused
    ("bias_swiglu_fusion", {"emulated": False, "swiglu_fusion": False})]


@pytest.mark.parametrize("field, changes", FIELD_CHANGES)
def test_the_campaign_refuses_under_out_what_recommend_refuses(tmp_path, field, changes):
    """One setup on both sides: each field of observations.header_setup (what recommend compares)
    that differs in a run under --out is refused by the campaign (the CPU emulator's, whose runs
    are the factory's: FP32, local spec, CPU backend, no recomputation), naming that field, and
    recommend refuses the same two runs for the same field. (CP, the one field left out, needs a
    run of twice the ranks, which this factory does not write; campaign_setup takes it from the
    campaign as before.)"""
    from advisor.capture.observations import header_setup

    assert {field for field, _ in FIELD_CHANGES} | {"cp"} == set(header_setup(header()))
    from advisor.capture.campaign_run import backend_fields
    from advisor.capture.observations import check_one_setup
    from advisor.profiles import ProfileError, load_run

    document = campaign(layouts=[(2, 2)])
    own, other = document["runs"][0], {**document["runs"][0], "id": "pp-b1-other"}
    for run, values in ((own, {}), (other, changes)):
        (tmp_path / run["id"]).mkdir()
        for stage in (0, 1):
            write_rank(tmp_path / run["id"], run, stage, **values)
    with pytest.raises(AdvisorError, match=f"holds run pp-b1-other of another setup, {field} "):
        scan(document, tmp_path, backend_fields("cpu"))
    with pytest.raises(ProfileError, match=f"in {field} "):
        check_one_setup([load_run(tmp_path / own["id"]), load_run(tmp_path / other["id"])])


def test_a_megatron_lm_campaign_compares_the_layer_spec_its_arguments_ask(advisor, tmp_path):
    """A Megatron-LM campaign's runs write the --transformer-impl given after -- (Megatron-LM's
    default transformer_engine): one run with --transformer-impl local into an --out holding
    Transformer Engine runs of another campaign ran, and recommend refused the mix. Refused before
    anything starts (the checkout is a stand-in that never runs)."""
    from launch_support import make_checkout

    document = {**campaign(layouts=[(2, 2)]), "gpus_per_node": 2}
    campaign_file = _write(tmp_path / "campaign.json", document)
    checkout = make_checkout(tmp_path / "Megatron-LM")
    other = {**document["runs"][0], "id": "pp-b1-other"}
    directory = tmp_path / "runs" / other["id"]
    directory.mkdir(parents=True)
    for stage in (0, 1):
        write_rank(directory, other, stage, emulated=False, backend="cuda", layer_spec="transformer_engine")
    line = advisor.error("profile", "run", campaign_file, "--out", tmp_path / "runs", "--megatron-lm", checkout,
                         "--", "--transformer-impl", "local")
    assert line == (f"Error: {tmp_path / 'runs'} holds run pp-b1-other of another setup, layer_spec "
                    "('transformer_engine' vs 'local') (its vs this campaign's): 'advisor recommend --profile' reads "
                    "every run under it as one setup; choose another --out")


def test_runs_of_another_setup_or_backend_are_not_taken_as_complete(advisor, tmp_path):
    """A run id names the layout and batch only (pp-b1-2x2 in an FP32 and a BF16 campaign alike):
    a BF16 campaign (or --backend symbolic) resumed into the FP32 CPU campaign's --out read its runs
    as complete, and recommend then priced FP32 CPU profiles (audit)."""
    fp32 = campaign(layouts=[(2, 2)])
    directory = tmp_path / "runs" / fp32["runs"][0]["id"]
    directory.mkdir(parents=True)
    for stage in (0, 1):
        write_rank(directory, fp32["runs"][0], stage)  # the factory's CPU backend, FP32, local spec
    cpu_file = _write(tmp_path / "fp32.json", fp32)
    assert scan(fp32, tmp_path / "runs")[fp32["runs"][0]["id"]].state == "complete"

    bf16 = campaign(layouts=[(2, 2)], setup=replace(CPU, params_dtype="bfloat16"))
    assert bf16["runs"][0]["id"] == fp32["runs"][0]["id"]
    line = advisor.error("profile", "run", _write(tmp_path / "bf16.json", bf16), "--out", tmp_path / "runs")
    assert line == (f"Error: {directory} holds another run than campaign run pp-b1-2x2: rank 0 has params_dtype "
                    "'float32', the campaign's run 'bfloat16'; choose another --out")
    adam = campaign(layouts=[(2, 2)], setup=replace(CPU, distributed_optimizer=True))
    with pytest.raises(AdvisorError, match="rank 0 has distributed_optimizer False, the campaign's run True"):
        scan(adam, tmp_path / "runs")
    line = advisor.error("profile", "run", cpu_file, "--out", tmp_path / "runs", "--backend", "symbolic")
    assert line.endswith("rank 0 was profiled with backend 'cpu', this command's is 'symbolic'; choose another --out")
    # the same campaign and backend: complete, nothing run again
    result = advisor("profile", "run", cpu_file, "--out", tmp_path / "runs")
    assert "1 runs in" in result.stdout and "1 already complete" in result.stdout


def test_emulated_runs_and_megatron_lm_runs_do_not_complete_each_other(advisor, tmp_path):
    """The same campaign emulated first, then run on Megatron-LM into the same --out: the
    emulator's runs read as complete, so nothing ran and the exit status was 0 (a user trying
    the CPU first, then the GPUs); and the emulator took Megatron-LM's CPU runs (backend 'cpu',
    local spec, as the GPU double tests/fixtures/cuda_on_cpu writes them) as its own. The header's
    'emulated' tells them apart; refused before anything starts, nothing deleted."""
    from launch_support import make_checkout

    document = {**campaign(layouts=[(2, 2)]), "gpus_per_node": 2}  # a run fits on a node: launchable
    campaign_file = _write(tmp_path / "campaign.json", document)
    checkout = make_checkout(tmp_path / "Megatron-LM")  # never started: the refusal comes first
    emulated = tmp_path / "emulated" / document["runs"][0]["id"]
    emulated.mkdir(parents=True)
    for stage in (0, 1):
        write_rank(emulated, document["runs"][0], stage)
    for gpus in ([], ["--slurm-array", "--dry-run"]):
        line = advisor.error("profile", "run", campaign_file, "--out", tmp_path / "emulated", "--megatron-lm",
                             checkout, *gpus)
        assert line == (f"Error: {emulated} holds another run than campaign run pp-b1-2x2: rank 0 was emulated "
                        "(advisor profile run without --megatron-lm), this command runs Megatron-LM; choose another "
                        "--out")
    launched = tmp_path / "launched" / document["runs"][0]["id"]
    launched.mkdir(parents=True)
    for stage in (0, 1):
        write_rank(launched, document["runs"][0], stage, emulated=False)
    line = advisor.error("profile", "run", campaign_file, "--out", tmp_path / "launched")
    assert line == (f"Error: {launched} holds another run than campaign run pp-b1-2x2: rank 0 was run by "
                    "Megatron-LM (--megatron-lm), this command emulates it; choose another --out")
    assert sorted(path.name for path in emulated.iterdir()) == ["rank00000.jsonl", "rank00001.jsonl"]


def test_missing_or_unreadable_campaign_file(advisor, tmp_path):
    assert "none.json: no such file" in advisor.error("profile", "run", tmp_path / "none.json", "--out", tmp_path)
    (tmp_path / "latin1.json").write_bytes('{"schema": "caf\xe9"}'.encode("latin-1"))
    assert "latin1.json: not UTF-8 text (byte 0xe9 at offset 15)" in advisor.error("profile", "run", tmp_path / "latin1.json",
                                                                 "--out", tmp_path / "runs")


# --- advisor profile run: a runner that does not end well ---------------------------------


def test_a_runner_that_dies_is_reported(advisor, tmp_path, monkeypatch):
    """The process boundary: a stand-in runner (tests/fixtures/fake_runner.py) prints the first
    events and is killed by a signal, as an out-of-memory killer would."""
    _write(tmp_path / "campaign.json", campaign(layouts=[(2, 2)], pipeline_microbatch=2))
    monkeypatch.setattr("advisor.capture.relay.RUNNER_MODULE", "tests.fixtures.fake_runner")
    monkeypatch.setenv("FAKE_RUNNER", "die")
    result = advisor("profile", "run", tmp_path / "campaign.json", "--out", tmp_path / "runs", expect=1)
    assert result.stdout == ""
    assert result.stderr.strip().splitlines()[-1] == (
        "Error: the campaign runner stopped (signal 9) after 0 runs; run the same command to resume (finished runs "
        "are kept). Its last words: starting pp-b2-2x2")


def test_a_failed_run_is_named_and_exits_1(advisor, tmp_path, monkeypatch):
    _write(tmp_path / "campaign.json", campaign(layouts=[(2, 2)], pipeline_microbatch=2))
    monkeypatch.setattr("advisor.capture.relay.RUNNER_MODULE", "tests.fixtures.fake_runner")
    monkeypatch.setenv("FAKE_RUNNER", "fail")
    result = advisor("profile", "run", tmp_path / "campaign.json", "--out", tmp_path / "runs", expect=1)
    assert result.stdout.startswith("1 runs in ") and ": 0 ok, 0 oom, 1 failed, 0 already complete" in result.stdout
    assert result.stderr.strip().splitlines()[-1] == (
        "Error: 1 run(s) failed, first pp-b2-2x2: RuntimeError: emulation process 1 of 2 died (exit code -9) (run "
        "the same command to retry them)")
