"""``advisor profile show`` on runs whose numbers are worked out by hand from seed 004."""

import pytest

from factories import TINY, header, iteration, layer, profile

# The tiny Llama (L 4, h 64, h_ffn 128, a 4, k 2, v 256) in FP32 with the local (unfused
# attention) spec, s = 32, b = 1, t = c = 1; worked by hand:
LAYER_PARAMS = 2 * 64 * 64 * 3 // 2 + 3 * 64 * 128 + 2 * 64  # Eq. 1-3 with k/a = 1/2: 36,992
assert LAYER_PARAMS == 36_992
SBH = 32 * 1 * 64
# Eq. 12 in BF16 bytes, doubled for FP32, plus the FP32 softmax output 2 * (2 a s^2 b):
LAYER_ACTIVATIONS = 2 * SBH * (12 + 2 + 16) + 2 * (2 * 4 * 32 * 32 * 1)  # 12 + 4k/a + 8h_ffn/h = 30
EMBEDDING_ACTIVATIONS = 8 * SBH  # Eq. 13 as the paper writes it (int64, no dtype scaling)
OUTPUT_ACTIVATIONS = 2 * 4 * SBH + 4 * 32 * 1 * 256  # Eq. 14: hidden inputs in FP32, FP32 logits
OUTPUT_PARAMS = 64 * 256 + 64  # LM head + final norm (Eq. 9)


def two_stage_run(tmp_path):
    """Ranks 0 and 1 of a PP 2 run, with measured values equal to the hand counts."""
    decoder = dict(parameter_bytes=4 * LAYER_PARAMS, activation_bytes=LAYER_ACTIVATIONS)
    stage0 = (
        layer("embedding", "embedding", None, parameter_bytes=4 * 64 * 256, activation_bytes=EMBEDDING_ACTIVATIONS),
        layer("decoder.layers.0", "decoder", 1, **decoder),
        layer("decoder.layers.1", "decoder", 2, **decoder),
    )
    stage1 = (
        layer("decoder.layers.0", "decoder", 3, **decoder),
        layer("decoder.layers.1", "decoder", 4, **decoder),
        layer("output", "output", None, parameter_bytes=4 * OUTPUT_PARAMS, activation_bytes=OUTPUT_ACTIVATIONS),
    )
    profile(layers=stage0, iterations=(iteration(1, parameter_bytes=4 * (2 * LAYER_PARAMS + 64 * 256)),)).write(tmp_path)
    profile(
        header=header(rank=1, coords={"tp": 0, "cp": 0, "pp": 1, "dp": 0}, stage_layers=(3, 4), first_stage=False,
                      last_stage=True, in_flight_microbatches=1),
        layers=stage1, iterations=(iteration(1, parameter_bytes=4 * (2 * LAYER_PARAMS + OUTPUT_PARAMS)),),
    ).write(tmp_path)
    return tmp_path


def test_compare_gives_ratio_one_where_the_run_matches_the_equations(advisor, tmp_path):
    report = advisor.json("profile", "show", two_stage_run(tmp_path))
    ratios = {(row["rank"], row["module"], row["term"]): row["ratio"] for row in report["compare"]}
    for key in [(0, "embedding", "weights"), (0, "embedding", "activations"), (0, "decoder.layers.0", "weights"),
                (0, "decoder.layers.1", "activations"), (1, "decoder.layers.0", "activations"),
                (1, "output", "weights"), (1, "output", "activations"), (0, "stage", "weights"),
                (1, "stage", "weights")]:
        assert ratios[key] == pytest.approx(1.0), key
    in_flight = next(r for r in report["compare"] if r["rank"] == 0 and r["term"] == "activations in flight")
    # stage 0 of 2 holds 2 microbatches of its embedding and its 2 layers (1F1B)
    assert in_flight["measured_bytes"] == 2 * (EMBEDDING_ACTIVATIONS + 2 * LAYER_ACTIVATIONS)
    assert in_flight["ratio"] == pytest.approx(1.0)
    last = next(r for r in report["compare"] if r["rank"] == 1 and r["term"] == "activations in flight")
    assert last["measured_bytes"] == 2 * LAYER_ACTIVATIONS + OUTPUT_ACTIVATIONS  # one microbatch in flight
    assert last["ratio"] == pytest.approx(1.0)


def test_ranks_and_layers_sections(advisor, tmp_path):
    report = advisor.json("profile", "show", two_stage_run(tmp_path))
    assert [row["layers"] for row in report["ranks"]] == ["1-2", "3-4"]
    assert [row["in_flight_microbatches"] for row in report["ranks"]] == [2, 1]
    assert {row["module"] for row in report["layers"]} == {"embedding", "decoder.layers.0", "decoder.layers.1",
                                                           "output"}
    assert report["run"]["model"]["name"] == TINY.name and report["status"] == "ok"
    table = advisor("profile", "show", tmp_path).stdout
    assert "tiny: TP 1, CP 1, PP 2" in table and "Eq. 12/15" in table and "KiB" in table
    csv = advisor("profile", "show", tmp_path, "--section", "layers", "--rank", 1, "--format", "csv").stdout
    assert csv.splitlines()[0].startswith("rank,module,layer_number") and len(csv.splitlines()) == 4


def test_an_oom_run_says_where_it_stopped(advisor, tmp_path):
    profile(status="oom", where="iteration 1, microbatch 2, forward of decoder.layers.1",
            error="CUDA out of memory").write(tmp_path)
    out = advisor("profile", "show", tmp_path, "--section", "ranks").stdout
    assert "oom" in out and "forward of decoder.layers.1" in out


@pytest.mark.parametrize(
    "args,message",
    [
        (["--rank", 7], "no rank 7"),
        (["--iteration", 9], "recorded no iteration 9"),
        (["--format", "csv"], "--format csv needs one --section"),
    ],
)
def test_bad_requests(advisor, tmp_path, args, message):
    two_stage_run(tmp_path)
    assert message in advisor.error("profile", "show", tmp_path, *args)


def test_bad_directories(advisor, tmp_path):
    line = advisor.error("profile", "show", tmp_path)
    assert "no profile files (rank*.jsonl) nor run directories holding them" in line
    assert "not a directory" in advisor.error("profile", "show", tmp_path / "missing")
    path = profile().write(tmp_path)
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    path.write_text(lines[0] + lines[1][:30] + "\n" + "".join(lines[2:]))
    assert "rank00000.jsonl:2: malformed JSON" in advisor.error("profile", "show", tmp_path)
    path.write_text(text[:-40])  # the end record cut short: the run was killed, and shows as running
    assert "running" in advisor("profile", "show", tmp_path, "--section", "ranks").stdout
    path.write_text(text.replace('"version": 2', '"version": 3'))
    assert "schema version 3" in advisor.error("profile", "show", tmp_path)
