"""The profile schema: round trip, and a clear error for every kind of bad file."""

import json

import pytest

from advisor.models import PRESETS, with_overrides
from advisor.parallel import ParallelConfig
from advisor.profiles import (
    IterationRecord, LayerRecord, ProfileError, RankHeader, RankProfile, load_run, read_rank_file,
)

TINY = with_overrides(PRESETS["llama3.1-8b"], num_layers=4, hidden_size=64, ffn_hidden_size=128,
                      num_attention_heads=4, num_query_groups=2, vocab_size=256)


def header(**changes) -> RankHeader:
    values = dict(
        run_id="run-1", created="2026-11-22T10:00:00+00:00", backend="cpu", device="cpu",
        torch_version="2.13.0", megatron_core_version="0.16.1", emulated=False, params_dtype="float32",
        layer_spec="local", sequence_parallel=False, recompute="none", distributed_optimizer=False, model=TINY,
        parallel=ParallelConfig(pp=2, mbs=1), seq_len=32, global_batch_size=4, num_microbatches=4,
        layers_per_stage=(2, 2), rank=0, world_size=2, coords={"tp": 0, "cp": 0, "pp": 0, "dp": 0},
        stage_layers=(1, 2), first_stage=True, last_stage=False, in_flight_microbatches=2,
    )
    values.update(changes)
    return RankHeader(**values)


def layer(name, kind, number, iteration=1, **changes):
    values = dict(iteration=iteration, name=name, kind=kind, layer_number=number, parameter_bytes=100,
                  gradient_bytes=200, optimizer_bytes=600, activation_bytes=50, forward_peak_bytes=10,
                  backward_peak_bytes=20)
    values.update(changes)
    return LayerRecord(**values)


def profile(**changes) -> RankProfile:
    values = dict(
        header=header(),
        layers=(layer("embedding", "embedding", None), layer("decoder.layers.0", "decoder", 1),
                layer("decoder.layers.1", "decoder", 2)),
        iterations=(IterationRecord(iteration=1, parameter_bytes=300, gradient_bytes=600, optimizer_bytes=1800,
                                    peak_allocated_bytes=5000, step_time_s=0.1),),
        status="ok",
    )
    values.update(changes)
    return RankProfile(**values)


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


def rewrite(path, transform):
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(line) + "\n" for line in transform(lines)))


@pytest.mark.parametrize(
    "transform,message",
    [
        (lambda lines: [], "empty file"),
        (lambda lines: lines[:-1], "truncated: no end record"),
        (lambda lines: [{**lines[0], "version": 99}] + lines[1:], "schema version 99"),
        (lambda lines: [{**lines[0], "schema": "other"}] + lines[1:], "not a profile file"),
        (lambda lines: [lines[0]] + [l for l in lines[1:] if l.get("layer_number") != 2],
         "iteration 1: missing decoder layer 2"),
        (lambda lines: [lines[0]] + [l for l in lines[1:] if l.get("kind") != "embedding"],
         "missing embedding"),
        (lambda lines: [lines[0], {**lines[1], "activation_bytes": -5}] + lines[2:], "'activation_bytes' is negative"),
        (lambda lines: [lines[0], {**lines[1], "activation_bytes": "many"}] + lines[2:], "wrong type"),
        (lambda lines: lines[1:], "first record must be the header"),
        (lambda lines: [{**lines[0], "params_dtype": "int8"}] + lines[1:], "params_dtype must be one of"),
        (lambda lines: [lines[0], {"type": "mystery"}] + lines[1:], "unknown record type 'mystery'"),
    ],
)
def test_bad_files_get_clear_errors(tmp_path, transform, message):
    path = profile().write(tmp_path)
    rewrite(path, transform)
    with pytest.raises(ProfileError, match=message):
        read_rank_file(path)


def test_nan_and_half_written_lines(tmp_path):
    path = profile().write(tmp_path)
    text = path.read_text()
    path.write_text(text.replace('"activation_bytes": 50', '"activation_bytes": NaN', 1))
    with pytest.raises(ProfileError, match="not finite"):
        read_rank_file(path)
    path.write_text(text[: len(text) // 2])
    with pytest.raises(ProfileError, match="truncated or malformed JSON"):
        read_rank_file(path)


def test_directories(tmp_path):
    with pytest.raises(ProfileError, match="no profile files"):
        load_run(tmp_path)
    with pytest.raises(ProfileError, match="not a directory"):
        load_run(tmp_path / "missing")
    profile().write(tmp_path)
    profile(header=header(rank=1, run_id="run-2")).write(tmp_path)
    with pytest.raises(ProfileError, match="different runs"):
        load_run(tmp_path)
