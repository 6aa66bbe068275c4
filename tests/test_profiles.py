"""The profile schema: round trip, and a clear error for every kind of bad file."""

import json

import pytest

from advisor.profiles import ProfileError, load_run, read_rank_file
from factories import TINY, header, profile

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
    from factories import layer

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
