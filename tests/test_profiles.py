"""The profile schema: round trip, append-only writing, and one clear error for every kind of bad
file or run directory (hostile inputs as a table)."""

import json
import os

import pytest

from advisor.profiles import (
    ProfileError, RankFileWriter, iteration_lines, load_run, read_rank_file, rank_file_name,
)
from factories import TINY, header, iteration, layer, profile


def test_round_trip(tmp_path):
    written = profile()
    path = written.write(tmp_path)
    assert path.name == "rank00000.jsonl"
    read = read_rank_file(path)
    assert read == written
    assert read.peak_allocated_bytes == 5000
    run = load_run(tmp_path)
    assert run.status == "ok" and run.header.model == TINY


def test_a_running_file_is_valid_and_says_so(tmp_path):
    path = profile(status="running", iterations=()).write(tmp_path)
    assert read_rank_file(path).status == "running"


def _layers(number):
    return (layer("embedding", "embedding", None, number), layer("decoder.layers.0", "decoder", 1, number),
            layer("decoder.layers.1", "decoder", 2, number))


def test_the_writer_appends_and_a_crash_leaves_every_completed_iteration(tmp_path):
    writer = RankFileWriter(tmp_path, header()).start()
    assert read_rank_file(writer.path).status == "running"  # a header alone: started, nothing done
    for number in (1, 2, 3):
        size = writer.path.stat().st_size
        writer.append(_layers(number), iteration(number))
        grown = writer.path.read_bytes()[size:].decode()
        assert grown == iteration_lines(_layers(number), iteration(number))  # appended, nothing rewritten
    # Killed in the middle of iteration 4: its layer records were written, its iteration record cut short.
    with open(writer.path, "a") as handle:
        handle.write(iteration_lines(_layers(4), iteration(4))[:-40])
    killed = read_rank_file(writer.path)
    assert killed.status == "running" and [it.iteration for it in killed.iterations] == [1, 2, 3]
    assert {layer.iteration for layer in killed.layers} == {1, 2, 3}
    # After a clean end, layer records without their iteration are damage, not a crash.
    text = writer.path.read_text().splitlines(keepends=True)
    writer.path.write_text("".join(text[:-1]) + '{"type": "end", "status": "ok", "iterations": 3, "error": null, '
                                                '"where": null}\n')
    with pytest.raises(ProfileError, match="layer records of iteration 4, which has no iteration record"):
        read_rank_file(writer.path)


def test_a_finished_file_reads_back_what_was_appended(tmp_path):
    writer = RankFileWriter(tmp_path, header()).start()
    for number in (1, 2):
        writer.append(_layers(number), iteration(number, in_flight_microbatches=2))
    for number in range(3, 20):  # after the first iterations, iteration records only
        writer.append((), iteration(number, in_flight_microbatches=2))
    writer.end("oom", "OutOfMemoryError: simulated", "iteration 20, microbatch 0, forward, decoder.layers.1")
    read = read_rank_file(writer.path)
    assert read.status == "oom" and read.where.startswith("iteration 20") and len(read.iterations) == 19
    assert len(read.layers) == 6 and read.header.in_flight_microbatches == 2


def rewrite(path, transform):
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(line) + "\n" for line in transform(lines)))


def _header(lines, **changes):
    return [{**lines[0], **changes}] + lines[1:]


def _first_layer(lines, **changes):
    return [lines[0], {**lines[1], **changes}] + lines[2:]


# header, layer records (embedding, decoder 1, decoder 2), iteration record, end record
@pytest.mark.parametrize(
    "transform,message",
    [
        (lambda lines: [], "empty file"),
        (lambda lines: _header(lines, version=99), "schema version 99"),
        (lambda lines: _header(lines, schema="other"), "not a profile file"),
        (lambda lines: [lines[0]] + [l for l in lines[1:] if l.get("layer_number") != 2],
         "iteration 1: missing decoder layer 2"),
        (lambda lines: [lines[0]] + [l for l in lines[1:] if l.get("kind") != "embedding"], "missing embedding"),
        (lambda lines: _first_layer(lines, activation_bytes=-5), "'activation_bytes' is negative"),
        (lambda lines: _first_layer(lines, activation_bytes="many"), "wrong type"),
        (lambda lines: _first_layer(lines, iteration=-1), "'iteration' is negative"),
        (lambda lines: lines[:4] + [{**lines[4], "alloc_retries": -3}] + lines[5:], "'alloc_retries' is negative"),
        (lambda lines: lines[:4] + [{**lines[4], "step_time_s": -0.5}] + lines[5:], "'step_time_s' is negative"),
        (lambda lines: lines[1:], "first record must be the header"),
        (lambda lines: _header(lines, params_dtype="int8"), "params_dtype must be one of"),
        (lambda lines: _header(lines, asked_iterations=-1), "'asked_iterations' must be from 0"),
        (lambda lines: _header(lines, asked_iterations="2"), "'asked_iterations' has the wrong type"),
        # v3 writes it, null where unknown: a v3 header without it is not one a v3 writer wrote
        (lambda lines: [{k: v for k, v in lines[0].items() if k != "asked_iterations"}] + lines[1:],
         "missing field 'asked_iterations'"),
        (lambda lines: _header(lines, swiglu_fusion="yes"), "'swiglu_fusion' has the wrong type"),
        (lambda lines: [{k: v for k, v in lines[0].items() if k != "swiglu_fusion"}] + lines[1:],
         "missing field 'swiglu_fusion'"),
        (lambda lines: [lines[0], {"type": "mystery"}] + lines[1:], "unknown record type 'mystery'"),
        (lambda lines: [lines[0], [1, 2]] + lines[1:], "expected an object with a 'type'"),
        # the header against itself
        (lambda lines: _header(lines, layers_per_stage=["2", "2"]), "'layers_per_stage' must be a list of integers"),
        (lambda lines: _header(lines, stage_layers=[1, "2"]), "'stage_layers' must be a list of integers"),
        (lambda lines: _header(lines, num_microbatches=-4), "'num_microbatches' is negative"),
        (lambda lines: _header(lines, coords={"tp": 0, "cp": 0, "pp": 5, "dp": 0}), "coords pp = 5 is out of range"),
        (lambda lines: _header(lines, coords={"tp": -1, "cp": 0, "pp": 0, "dp": 0}), "coords tp = -1 is out of range"),
        (lambda lines: _header(lines, coords={"tp": 0, "pp": 0}), "'coords' must give integer tp, cp, pp and dp"),
        (lambda lines: _header(lines, rank=2), "rank 2 is not in a world of 2"),
        (lambda lines: _header(lines, world_size=3), "'world_size' is 3, but TP x CP x PP x DP = "),
        (lambda lines: _header(lines, layers_per_stage=[1, 2]), "does not place 4 layers on PP 2 stages"),
        (lambda lines: _header(lines, stage_layers=[3, 4]), "are not stage 0's layers 1..2"),
        (lambda lines: _header(lines, first_stage=False), "disagree with pipeline stage 0 of 2"),
        (lambda lines: _header(lines, model={**lines[0]["model"], "hidden_size": 0}), "hidden_size"),
        (lambda lines: _header(lines, parallel={**lines[0]["parallel"], "tp": "2"}), "tp must be an integer"),
        # records against each other
        (lambda lines: lines[:5] + [lines[4]] + lines[5:], "iteration 1 follows iteration 1"),
        (lambda lines: lines[:2] + [lines[1]] + lines[2:], "embedding of iteration 1 is recorded twice"),
        (lambda lines: lines + [lines[4]], "a 'iteration' record after the end record"),
        (lambda lines: lines[:-1] + [{**lines[-1], "iterations": 5}], "counts 5 iterations, the file has 1"),
        (lambda lines: _first_layer(lines, kind="decoder", layer_number=4), "layer_number 4 is not one of this rank's"),
        (lambda lines: lines[:-1] + [{**lines[-1], "status": "great"}], "unknown status 'great'"),
    ],
)
def test_bad_files_get_clear_errors(tmp_path, transform, message):
    path = profile().write(tmp_path)
    rewrite(path, transform)
    with pytest.raises(ProfileError, match=message) as error:
        read_rank_file(path)
    assert str(error.value).startswith(str(path)) and "\n" not in str(error.value)


@pytest.mark.parametrize("old,new,message", [
    ('"activation_bytes": 50', '"activation_bytes": NaN', "NaN is not a JSON number"),
    ('"activation_bytes": 50', '"activation_bytes": 1' + "0" * 400, "does not fit in 64 bits"),
    ('"activation_bytes": 50', '"activation_bytes": 1e999', "beyond the range of a double"),
    ('"activation_bytes": 50', '"activation_bytes": ' + "[" * 100 + "]" * 100, "nested deeper than 64 levels"),
    ('"kind": "embedding"', '"kind": "embedding", "kind": "output"', "appears twice as a key"),
])
def test_hostile_numbers_and_structures(tmp_path, old, new, message):
    path = profile().write(tmp_path)
    path.write_text(path.read_text().replace(old, new, 1))
    with pytest.raises(ProfileError, match=message):
        read_rank_file(path)


def test_non_utf8_bytes_and_cut_lines(tmp_path):
    path = profile().write(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data.replace(b'"embedding"', b'"embe\xffding"', 1))
    with pytest.raises(ProfileError, match=r"rank00000.jsonl:2: not UTF-8 text \(byte 0xff"):
        read_rank_file(path)  # was a UnicodeDecodeError traceback
    lines = data.splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:3]) + lines[3][:20] + b"\n" + b"".join(lines[4:]))
    with pytest.raises(ProfileError, match=r"rank00000.jsonl:4: malformed JSON"):
        read_rank_file(path)  # a cut line in the middle is damage
    path.write_bytes(data[: len(lines[0]) // 2])
    with pytest.raises(ProfileError, match="empty file \\(its one line was cut short\\)"):
        read_rank_file(path)


def test_a_fifo_or_a_directory_named_like_a_rank_file_is_refused_unread(tmp_path):
    os.mkfifo(tmp_path / "rank00000.jsonl")
    with pytest.raises(ProfileError, match="is a FIFO"):
        load_run(tmp_path)  # did hang
    os.unlink(tmp_path / "rank00000.jsonl")
    (tmp_path / "rank00000.jsonl").mkdir()
    with pytest.raises(ProfileError, match="is a directory"):
        load_run(tmp_path)


def test_directories(tmp_path):
    with pytest.raises(ProfileError, match="no profile files"):
        load_run(tmp_path)
    with pytest.raises(ProfileError, match="missing: no such directory"):
        load_run(tmp_path / "missing")
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ProfileError, match="a-file: not a directory"):
        load_run(tmp_path / "a-file")
    profile().write(tmp_path)
    profile(header=header(rank=1, run_id="run-2")).write(tmp_path)
    with pytest.raises(ProfileError, match="different runs"):
        load_run(tmp_path)


def _stage1(**changes):
    return header(**{"rank": 1, "coords": {"tp": 0, "cp": 0, "pp": 1, "dp": 0}, "stage_layers": (3, 4),
                     "first_stage": False, "last_stage": True, **changes})


def _stage1_profile(**changes):
    return profile(header=_stage1(**changes), layers=(layer("decoder.layers.0", "decoder", 3),
                                                       layer("decoder.layers.1", "decoder", 4),
                                                       layer("output", "output", None)))


@pytest.mark.parametrize("arrange,message", [
    (lambda d: os.replace(_stage1_profile().write(d), d / "rank00000-copy.jsonl"),
     "rank00000-copy.jsonl: the header says rank 1, the file name another"),
    (lambda d: os.replace(_stage1_profile().write(d), d / rank_file_name(7)),
     "rank00007.jsonl: the header says rank 1"),
    (lambda d: _stage1_profile(seq_len=64).write(d), "seq_len 64 differs from rank00000.jsonl's 32"),
    (lambda d: _stage1_profile(global_batch_size=8).write(d), "global_batch_size 8 differs"),
    (lambda d: _stage1_profile(params_dtype="bfloat16").write(d), "params_dtype 'bfloat16' differs"),
])
def test_the_files_of_a_run_must_describe_one_run(tmp_path, arrange, message):
    profile().write(tmp_path)
    arrange(tmp_path)
    with pytest.raises(ProfileError, match=message):
        load_run(tmp_path)


def test_two_files_for_one_rank_or_one_coordinate(tmp_path):
    profile().write(tmp_path)
    # rank 1's file whose header claims stage 0's coordinates (a copied and edited file)
    profile(header=header(rank=1)).write(tmp_path)
    with pytest.raises(ProfileError, match=r"rank00001.jsonl: coords \{'tp': 0, 'cp': 0, 'pp': 0, 'dp': 0\} is also "
                                           r"in rank00000.jsonl: two files for one rank"):
        load_run(tmp_path)


def test_a_missing_rank_is_listed(tmp_path):
    _stage1_profile().write(tmp_path)
    run = load_run(tmp_path)
    assert run.missing_ranks == (0,) and [rank.header.rank for rank in run.ranks] == [1]


def test_version_1_files_are_read_without_kernels_and_times(tmp_path):
    """A version 1 file (before the kernels field and the per-layer times) reads as what its
    writer ran: CPU kernels on the CPU backend, CUDA kernels on CUDA, and no times."""
    path = profile().write(tmp_path)

    def as_version_1(lines, backend):
        head = {key: value for key, value in lines[0].items() if key != "kernels"}
        rest = [{key: value for key, value in line.items() if not key.endswith("_time_s") or line["type"] != "layer"}
                for line in lines[1:]]
        return [{**head, "version": 1, "backend": backend}] + rest

    for backend, kernels in (("cpu", "cpu"), ("cuda", "cuda")):
        rewrite(path, lambda lines: as_version_1(lines, backend))
        read = read_rank_file(path)
        assert read.header.kernels == kernels and read.header.backend == backend
        assert all(layer.forward_time_s is None and layer.backward_time_s is None for layer in read.layers)
        assert [layer.activation_bytes for layer in read.layers] == [layer.activation_bytes for layer in profile().layers]
    # The committed version 1 example profiles still load.
    from conftest import ROOT

    examples = sorted((ROOT / "examples" / "launch" / "profiles").iterdir())
    assert examples and all(load_run(directory).ranks for directory in examples)


def test_version_2_layer_times_round_trip_and_symbolic_files_have_none(tmp_path):
    timed = profile(layers=tuple(
        layer(name, kind, number, forward_time_s=0.25, backward_time_s=0.5)
        for name, kind, number in (("embedding", "embedding", None), ("decoder.layers.0", "decoder", 1),
                                   ("decoder.layers.1", "decoder", 2))))
    assert read_rank_file(timed.write(tmp_path)) == timed
    assert json.loads(timed.to_jsonl().splitlines()[1])["forward_time_s"] == 0.25
    symbolic = profile(header=header(backend="symbolic", kernels="cuda"))
    read = read_rank_file(symbolic.write(tmp_path))
    assert read.header.backend == "symbolic" and read.layers[0].forward_time_s is None
    path = symbolic.write(tmp_path)
    rewrite(path, lambda lines: [{**lines[0], "kernels": "tpu"}] + lines[1:])
    with pytest.raises(ProfileError, match="kernels must be one of cuda, cpu"):
        read_rank_file(path)


def test_version_3_records_the_iterations_asked_and_older_files_read_as_unknown(tmp_path):
    """v3 headers carry asked_iterations (what Megatron's train loop was asked to run): a run that
    ended ok with fewer stopped early. v1 and v2 files did not record it: None, never early."""
    short = profile(header=header(asked_iterations=2))  # one iteration recorded, two asked
    path = short.write(tmp_path)
    assert json.loads(path.read_text().splitlines()[0])["asked_iterations"] == 2
    read = read_rank_file(path)
    assert read == short and read.header.asked_iterations == 2 and read.stopped_early
    assert not profile(header=header(asked_iterations=1)).stopped_early  # 1 of 1: complete
    assert not profile(header=header(asked_iterations=2), status="oom").stopped_early  # an OOM says so itself
    assert read_rank_file(profile().write(tmp_path)).header.asked_iterations is None  # written as null
    for version in (1, 2):
        rewrite(path, lambda lines: [{**{k: v for k, v in lines[0].items() if k != "asked_iterations"},
                                      "version": version}] + lines[1:])
        old = read_rank_file(path)
        assert old.header.asked_iterations is None and not old.stopped_early and len(old.iterations) == 1


def test_version_4_records_whether_swiglu_ran_fused_and_older_files_read_as_unknown(tmp_path):
    """v4 headers carry swiglu_fusion (Megatron-LM's --bias-swiglu-fusion, read from the model's
    config by megatron_hooks.recorder.swiglu_fusion); files before v4 did not record it: None."""
    for fused in (True, False, None):
        written = profile(header=header(swiglu_fusion=fused))
        path = written.write(tmp_path)
        assert json.loads(path.read_text().splitlines()[0])["swiglu_fusion"] is fused
        assert read_rank_file(path) == written
    for version in (1, 2, 3):
        rewrite(path, lambda lines: [{**{k: v for k, v in lines[0].items() if k != "swiglu_fusion"},
                                      "version": version}] + lines[1:])
        assert read_rank_file(path).header.swiglu_fusion is None
