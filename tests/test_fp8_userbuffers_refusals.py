"""What Transformer Engine 2.9 (core_v0.15.2's pin) fails on at run time with FP8 userbuffers,
refused as one ``Error:`` line, exit status 2, from estimate, sweep and a command read back
(``options.training._check_fp8_userbuffers``): --fp8-recipe blockwise with --tp-comm-overlap
(``fill_userbuffers_buffer_for_all_gather`` raises "Unsupported quantizer for Userbuffers" for
``Float8BlockQuantizer``), and a reduce-scatter buffer made FP8 by the file's fp8_buf under any
recipe but delayed (the GEMM's output is quantised after a BF16 GEMM, ``gemm.cpp``, and
``split_overlap_rs`` reduces FP8 only: "Invalid type")."""

from __future__ import annotations

import json
import shlex

import pytest
from click.testing import CliRunner

from advisor.cli import cli

BASE = ["--model", "llama3.1-8b", "--gpus", "8", "--gpu", "h100-80gb", "--gbs", "64", "--fp8-format", "hybrid",
        "--tp-comm-overlap"]
FP8_RS = "proj_fprop: {method: pipeline, fp8_buf: true}\n"


def _one_error(result, *words: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "Traceback" not in result.output
    for word in words:
        assert word in lines[0], lines[0]


def _file(tmp_path, text: str, name: str = "ub.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _line(args: list[str], recipe: str, cfg: str | None = None) -> str:
    """A torchrun line of a delayed-scaling run's arguments with ``recipe`` (and ``cfg``) put in."""
    args = list(args)
    if "--fp8-recipe" in args:
        args[args.index("--fp8-recipe") + 1] = recipe
    else:
        args += ["--fp8-recipe", recipe]
    if cfg:
        args += ["--tp-comm-overlap-cfg", cfg]
    return shlex.join(["torchrun", "--nproc-per-node", "8", "pretrain_gpt.py", *args, "--vocab-size", "128256"])


def _delayed_args() -> list[str]:
    out = CliRunner().invoke(cli, ["estimate", *BASE, "--tp", "8", "--format", "json"])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)["megatron_args"]


@pytest.mark.parametrize("command", ["estimate", "sweep"])
def test_blockwise_with_userbuffers_is_refused(command):
    extra = ["--tp", "8"] if command == "estimate" else []
    _one_error(CliRunner().invoke(cli, [command, *BASE, *extra, "--fp8-recipe", "blockwise"]),
               "--fp8-recipe blockwise", "--tp-comm-overlap", "Unsupported quantizer for Userbuffers")
    # the per-tensor recipes run with the overlap, and blockwise without it
    for recipe in ("delayed", "tensorwise"):
        assert CliRunner().invoke(cli, [command, *BASE, *extra, "--fp8-recipe", recipe]).exit_code == 0, recipe
    plain = [a for a in BASE if a != "--tp-comm-overlap"]
    assert CliRunner().invoke(cli, [command, *plain, *extra, "--fp8-recipe", "blockwise"]).exit_code == 0


def test_blockwise_with_userbuffers_read_back_is_refused():
    line = _line(_delayed_args(), "blockwise")
    _one_error(CliRunner().invoke(cli, ["estimate", "--gpu", "h100-80gb", "--from-command", "-"], input=line),
               "--fp8-recipe blockwise", "Unsupported quantizer for Userbuffers")


@pytest.mark.parametrize("command", ["estimate", "sweep"])
def test_fp8_buf_on_a_reduce_scatter_needs_delayed_scaling(tmp_path, command):
    path = _file(tmp_path, FP8_RS)
    extra = ["--tp", "8"] if command == "estimate" else []
    given = [command, *BASE, *extra, "--tp-comm-overlap-cfg", path]
    _one_error(CliRunner().invoke(cli, [*given, "--fp8-recipe", "tensorwise"]),
               f"--tp-comm-overlap-cfg {path}: proj_fprop: fp8_buf", "--fp8-recipe delayed")
    # MXFP8 is Blackwell's: the same refusal on a B200
    blackwell = [a if a != "h100-80gb" else "b200-180gb" for a in given]
    _one_error(CliRunner().invoke(cli, [*blackwell, "--fp8-recipe", "mxfp8"]),
               f"--tp-comm-overlap-cfg {path}: proj_fprop: fp8_buf", "--fp8-recipe delayed")
    assert CliRunner().invoke(cli, [*given, "--fp8-recipe", "delayed"]).exit_code == 0
    # fp8_buf on an all-gather or on a bulk reduce-scatter changes nothing TE runs: not refused
    quiet = _file(tmp_path, "qkv_fprop: {fp8_buf: true}\nqkv_wgrad: {method: bulk, fp8_buf: true}\n",
                  "quiet.yaml")
    assert CliRunner().invoke(cli, [command, *BASE, *extra, "--tp-comm-overlap-cfg", quiet, "--fp8-recipe",
                                    "tensorwise"]).exit_code == 0
    # without FP8 the buffer stays BF16 (initialize_ub: FP8 buffers only in an FP8 run)
    bf16 = [a for a in BASE if a not in ("--fp8-format", "hybrid")]
    assert CliRunner().invoke(cli, [command, *bf16, *extra, "--tp-comm-overlap-cfg", path]).exit_code == 0


def test_fp8_buf_is_refused_where_te_makes_the_buffer_fp8(tmp_path):
    """TE 2.9 ``initialize_ub`` honours fp8_buf on a buffer of its default ``methods["pipeline"]``
    list whatever method the file gives it: proj_fprop by ring exchange is FP8 (refused under
    tensorwise), qkv_wgrad by pipeline is not (runs)."""
    given = ["estimate", *BASE, "--tp", "8", "--fp8-recipe", "tensorwise", "--tp-comm-overlap-cfg"]
    ring = _file(tmp_path, "proj_fprop: {method: ring_exchange, fp8_buf: true}\n", "ring.yaml")
    _one_error(CliRunner().invoke(cli, [*given, ring]), f"--tp-comm-overlap-cfg {ring}: proj_fprop: fp8_buf")
    wgrad = _file(tmp_path, "qkv_wgrad: {method: pipeline, fp8_buf: true}\n", "wgrad.yaml")
    assert CliRunner().invoke(cli, [*given, wgrad]).exit_code == 0


def test_fp8_buf_on_a_reduce_scatter_read_back_is_refused(tmp_path):
    path = _file(tmp_path, FP8_RS)
    line = _line(_delayed_args(), "tensorwise", path)
    _one_error(CliRunner().invoke(cli, ["estimate", "--gpu", "h100-80gb", "--from-command", "-"], input=line),
               f"--tp-comm-overlap-cfg {path}: proj_fprop: fp8_buf")
    delayed = _line(_delayed_args(), "delayed", path)
    assert CliRunner().invoke(cli, ["estimate", "--gpu", "h100-80gb", "--from-command", "-"],
                              input=delayed).exit_code == 0


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise"])
def test_a_dgrad_moved_off_bulk_must_hold_fp8(tmp_path, recipe):
    """qkv_dgrad by pipeline without fp8_buf: ``initialize_ub`` takes it off the all-gather list, so
    BF16, but the QKV layer's bulk dgrad still gathers its FP8 input there
    (``fill_userbuffers_buffer_for_all_gather``: "Userbuffers is not initialized with FP8
    buffers"), under any recipe; with fp8_buf it is FP8 and runs, as the default bulk buffer."""
    given = ["estimate", *BASE, "--tp", "8", "--fp8-recipe", recipe, "--tp-comm-overlap-cfg"]
    bf16 = _file(tmp_path, "qkv_dgrad: {method: pipeline}\n", "bf16.yaml")
    _one_error(CliRunner().invoke(cli, [*given, bf16]), f"--tp-comm-overlap-cfg {bf16}: qkv_dgrad:", "fp8_buf: true")
    fp8 = _file(tmp_path, "qkv_dgrad: {method: pipeline, fp8_buf: true}\n", "fp8.yaml")
    assert CliRunner().invoke(cli, [*given, fp8]).exit_code == 0
