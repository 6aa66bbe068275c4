"""tables/published: the published runs' data file keeps its schema, and the report prices every
run through --from-command's path."""

from __future__ import annotations

import json
import re
from pathlib import Path

from click.testing import CliRunner

from tables.published.__main__ import main
from tables.published.runs import COLUMNS, DATA, command_line, load


def test_the_data_file_keeps_its_schema_and_marks_every_run_test():
    assert DATA.read_text().splitlines()[0] == ",".join(COLUMNS)
    runs = load()
    assert len(runs) == 34 and {run.use for run in runs} == {"test"}  # none used for fitting
    assert {run.precision for run in runs} == {"bf16", "fp8"}
    for run in runs:
        assert re.match(r"https://github\.com/NVIDIA/dgxc-benchmarking/blob/[0-9a-f]{40}/llama3\.1/README_\d+b\.md "
                        r"\(.*read 2026-11-25\), table '.*'", run.source), run.source
        assert run.tp * run.cp * run.pp <= run.gpus and run.gpus % (run.tp * run.cp * run.pp) == 0
        assert "--bf16" in run.training_flags and ("--fp8-format" in run.training_flags) == (run.precision == "fp8")
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
    assert len(report["runs"]) == 34
    assert all(row["unpriced"] == [] for row in report["runs"])  # every option the runs used is priced
    assert all(row["verdict"] in ("fits", "likely fits") for row in report["runs"] if row["precision"] == "bf16")
    bf16 = report["summary"]["bf16"]
    assert bf16["within_target"] == bf16["runs"] == 17 and bf16["mape"] <= 0.06


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
