"""tables/published: the published runs' data file keeps its schema, and the report prices every
run through --from-command's path."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from tables.published.__main__ import main
from tables.published.runs import COLUMNS, DATA, command_line, load, release_changes

RELEASES = {"NeMo 24.09": "143b90dd91f9be958fed4773ae95d941a3356a82",  # DGX Cloud Benchmarking v25.01
            "NeMo 24.12": "8f5cbb3799ea8cc031ed2c2cee1cbdbc15b240ad"}  # v25.02


def test_the_data_file_keeps_its_schema_and_marks_every_run_test():
    assert DATA.read_text().splitlines()[0] == ",".join(COLUMNS)
    runs = load()
    assert len(runs) == 68 and {run.use for run in runs} == {"test"}  # none used for fitting
    assert {run.precision for run in runs} == {"bf16", "fp8"}
    for run in runs:
        assert re.match(r"https://github\.com/NVIDIA/dgxc-benchmarking/blob/([0-9a-f]{40})/llama3\.1/README_\d+b\.md "
                        r"\(.*read 2026-11-2[57]\), table '.*'", run.source), run.source
        assert RELEASES[run.framework] in run.source and run.run.startswith(f"dgxc-{run.framework[5:]}-")
        assert run.tp * run.cp * run.pp <= run.gpus and run.gpus % (run.tp * run.cp * run.pp) == 0
        assert "--bf16" in run.training_flags and ("--fp8-format" in run.training_flags) == (run.precision == "fp8")
        # the TP-overlapped recipes (70B, 405B) ran their llama3.1_*.yaml's ub_tp_comm_overlap_cfg
        overlapped = "--tp-comm-overlap" in run.training_flags
        assert overlapped == (run.tp > 1)
        assert (f"--tp-comm-overlap-cfg tables/published/userbuffers/dgxc-{run.model}.yaml" in run.training_flags) \
            == overlapped
        # the recipe's configure.sh passes +model.fp8_params=$FP8_ENABLED: FP8 primary weights
        assert ("--fp8-param-gather" in run.training_flags) == (run.precision == "fp8")


def test_a_run_is_written_as_the_torchrun_line_a_user_would_paste():
    run = next(run for run in load() if run.run == "dgxc-24.09-70b-bf16-64")
    line = command_line(run)
    assert line.startswith("torchrun --nproc-per-node 8 --nnodes 8 pretrain_gpt.py --num-layers 80 ")
    # PP 4 x VP 5 over 80 layers: 4 layers per model chunk
    assert "--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 4" in line


def test_the_report_prices_every_run_and_the_bf16_runs_meet_their_targets():
    result = CliRunner().invoke(main, ["--format", "json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert len(report["runs"]) == 68
    assert all(row["unpriced"] == [] for row in report["runs"])  # every option the runs used is priced
    assert all(row["verdict"] in ("fits", "likely fits") for row in report["runs"] if row["precision"] == "bf16")
    bf16 = report["summary"]["bf16"]
    # --tp-comm-overlap priced with the recipe's own userbuffers settings (--tp-comm-overlap-cfg
    # tables/published/userbuffers/dgxc-llama3.1-*.yaml: few bulk SMs, no margin beside bulk):
    # every BF16 run within 10%, MAPE 2.3% (3.5% and 33 of 34 at Transformer Engine's defaults)
    assert bf16["runs"] == 34 and bf16["within_target"] == 34 and bf16["mape"] <= 0.06
    # sequence parallelism's gathers in FP8 (levers.fp8_tp_bytes; the 405B recipe's fp8_buf reduce-
    # scatters): every FP8 run within 15% (33 of 34 with them in BF16: 24.12's 405B on 96 GPUs, +15.1%)
    assert report["summary"]["fp8"]["within_target"] == 34
    for release in RELEASES:
        assert report["summary"]["by_framework"][release]["bf16"]["runs"] == 17
    assert report["summary"]["by_framework"]["NeMo 24.12"]["fp8"]["within_target"] == 17
    assert [row["run"] for row in report["runs"] if not row["within_target"]] == []


def test_both_releases_publish_the_same_configurations():
    """v25.02 changed the container (NeMo 24.09 -> 24.12) and nothing the advisor prices: the
    recipe's llama3.1_*.yaml and configure.sh overrides are the same, so every 24.12 run is a
    24.09 run with another step time and source."""
    runs = {run.run: run for run in load()}
    keep = [c for c in COLUMNS if c not in ("run", "framework", "step_time_s", "source")]
    newer = [run for run in runs.values() if run.framework == "NeMo 24.12"]
    assert len(newer) == 34
    for run in newer:
        older = runs[run.run.replace("24.12", "24.09")]
        assert [getattr(run, c) for c in keep] == [getattr(older, c) for c in keep]
    changes = {c["after"]: c for c in release_changes(list(runs.values()))}
    assert len(changes) == 34
    # by hand from the two READMEs: 405B FP8 on 2,304 GPUs, 12.35 s then 11.20 s; 70B BF16 on 64, 14.72 then 14.61
    assert changes["dgxc-24.12-405b-fp8-2304"]["change"] == pytest.approx(11.20 / 12.35 - 1)
    assert 11.20 / 12.35 - 1 == pytest.approx(-0.0931, abs=1e-4)
    assert changes["dgxc-24.12-70b-bf16-64"]["before"] == "dgxc-24.09-70b-bf16-64"
    assert changes["dgxc-24.12-70b-bf16-64"]["change"] == pytest.approx(-0.00747, abs=1e-5)


def test_the_readme_section_is_what_the_command_writes(tmp_path):
    readme = Path(__file__).parents[1] / "tables" / "README.md"
    copy = tmp_path / "README.md"
    copy.write_text(readme.read_text(encoding="utf-8"), encoding="utf-8")
    result = CliRunner().invoke(main, ["--readme", str(copy)])
    assert result.exit_code == 0, result.output
    assert copy.read_text(encoding="utf-8") == readme.read_text(encoding="utf-8")  # committed README is current
    bare = tmp_path / "bare.md"
    bare.write_text("no markers\n", encoding="utf-8")
    result = CliRunner().invoke(main, ["--readme", str(bare)])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and bare.read_text() == "no markers\n"


def test_every_userbuffers_file_is_a_recipes_cited_and_used():
    """tables/published/userbuffers/: each file names its source at a commit in its first lines, is
    read as Megatron-LM would read it, and is some published run's --tp-comm-overlap-cfg."""
    from advisor.options.ub_config import load_userbuffers
    from tables.published import short_sequences

    folder = Path(__file__).parents[1] / "tables" / "published" / "userbuffers"
    flags = " ".join(run.training_flags for run in [*load(), *short_sequences.load()])
    files = sorted(folder.glob("*.yaml"))
    assert files
    for path in files:
        header = "".join(line for line in path.read_text().splitlines(keepends=True) if line.startswith("#"))
        assert re.search(r"github\.com/NVIDIA/[\w-]+/blob/(?:[0-9a-f]{40}|v[\d.]+)/\S+\.(?:yaml|py)", header), path.name
        load_userbuffers(str(path))
        assert f"--tp-comm-overlap-cfg tables/published/userbuffers/{path.name}" in flags, path.name
    # the 405B recipe's (llama3.1_405b.yaml, by hand): the projection's reduce-scatter pipelined on 24 SMs, FC2's on 8,
    # both with the margin; the bulk buffers on 2 or 24 SMs without it
    recipe = load_userbuffers(str(folder / "dgxc-llama3.1-405b.yaml"))
    assert [(recipe.buffer(n).num_sm, recipe.buffer(n).set_sm_margin) for n in ("proj_fprop", "fc2_fprop", "qkv_wgrad")] \
        == [(24, True), (8, True), (24, False)]
