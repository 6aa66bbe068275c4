"""tables/published: the published runs' data file keeps its schema, and the report prices every
run through --from-command's path."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from tables.published.__main__ import main
from tables.published.runs import (
    BRIDGE_COLUMNS, BRIDGE_DATA, COLUMNS, DATA, NOT_RUNNABLE, command_line, load, load_source, price,
    release_changes, report,
)

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
    flags = " ".join(run.training_flags for run in [*load(), *load_source("Megatron-Bridge"), *short_sequences.load()])
    files = sorted(folder.glob("*.yaml"))
    assert files
    for path in files:
        header = "".join(line for line in path.read_text().splitlines(keepends=True) if line.startswith("#"))
        assert re.search(r"github\.com/NVIDIA(?:-NeMo)?/[\w-]+/blob/(?:[0-9a-f]{40}|v[\d.]+)/\S+\.(?:yaml|py)", header), \
            path.name
        load_userbuffers(str(path))
        assert f"--tp-comm-overlap-cfg tables/published/userbuffers/{path.name}" in flags, path.name
    # the 405B recipe's (llama3.1_405b.yaml, by hand): the projection's reduce-scatter pipelined on 24 SMs, FC2's on 8,
    # both with the margin; the bulk buffers on 2 or 24 SMs without it
    recipe = load_userbuffers(str(folder / "dgxc-llama3.1-405b.yaml"))
    assert [(recipe.buffer(n).num_sm, recipe.buffer(n).set_sm_margin) for n in ("proj_fprop", "fc2_fprop", "qkv_wgrad")] \
        == [(24, True), (8, True), (24, False)]
    # Megatron-Bridge's FP8 H100 configs (comm_overlap.py, by hand): the projection's and FC2's reduce-scatters by
    # ring exchange on 1 SM with the margin, not pipelined; the 405B's qkv_dgrad and fc1_wgrad bulk on 2 SMs, 70B's on 4
    for name, bulk in (("mb-llama3-70b-fp8.yaml", 4), ("mb-llama3.1-405b-fp8.yaml", 2)):
        recipe = load_userbuffers(str(folder / name))
        assert [(recipe.buffer(n).method, recipe.buffer(n).num_sm, recipe.buffer(n).set_sm_margin)
                for n in ("proj_fprop", "fc2_fprop", "qkv_dgrad", "fc1_wgrad", "qkv_wgrad")] == [
            ("ring_exchange", 1, True), ("ring_exchange", 1, True), ("bulk", bulk, False), ("bulk", bulk, False),
            ("bulk", 24, False)]


BRIDGE_ARCHIVE = ("https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/067f987df03b8355b03192d88d70f1709fedf51a/"
                  "docs/performance-summary-archive.md (Megatron-Bridge performance summary archive, read 2026-11-29), ")
BRIDGE_MODELS = {"LLAMA3_8B": ("llama3.1-8b", 32), "LLAMA3_70B": ("llama3.1-70b", 80), "LLAMA3.1_405B": ("llama3.1-405b", 126)}


def _published_row(source: str) -> tuple[str, str, dict]:
    """(container, model, {column: cell}) of the summary row a Megatron-Bridge run quotes."""
    found = re.match(r"(.*?)'(?P<container>[\d.]+) NeMo Container', Pre-Training Performance, (?P<table>[^,]+), "
                     r"columns '(?P<columns>[^']+)', row '\|(?P<row>[^']+)\|'", source)
    assert found and found.group(1) == BRIDGE_ARCHIVE, source
    cells = dict(zip([c.strip() for c in found["columns"].split("|")], [c.strip() for c in found["row"].split("|")]))
    model = cells.get("Model") or found["table"].removeprefix("Model: ")
    return found["container"], model, cells


def test_the_bridge_file_keeps_its_schema_and_each_row_is_the_summary_row_it_quotes():
    assert BRIDGE_DATA.read_text().splitlines()[0] == ",".join(BRIDGE_COLUMNS)
    runs = load_source("Megatron-Bridge")
    assert len(runs) == 13 and {run.use for run in runs} == {"test"}  # held out: none used for fitting
    for run in runs:
        container, model, cells = _published_row(run.source)
        assert run.framework == f"NeMo {container}" and cells.get("System", "DGX-H100") == "DGX-H100"
        assert run.run == f"mb-{container}-{model.split('_')[1].lower()}-fp8-{run.gpus}"
        assert (run.model, run.num_layers) == BRIDGE_MODELS[model] and run.gpu == "h100-80gb"
        assert cells.get("Precision", "FP8") in ("FP8", "FP8-CS") and run.precision == "fp8"
        assert [run.gpus, run.global_batch_size, run.micro_batch_size, run.seq_len, run.tp, run.pp, run.cp] == [
            int(cells[c]) for c in ("#-GPUs", "GBS", "MBS", "Sequence Length", "TP", "PP", "CP")]
        assert run.vpp == (1 if cells["VP"] == "n/a" else int(cells["VP"]))
        assert ("--use-megatron-fsdp" in run.training_flags) == (int(cells.get("FSDP", "0")) > 0)
        # the step time is the published throughput's: GBS x sequence / (tokens/s per GPU x GPUs)
        tokens = int(cells["Tokens / sec / GPU"])
        assert run.step_time_s == pytest.approx(run.global_batch_size * run.seq_len / (tokens * run.gpus), rel=1e-5)
    # by hand, 26.02's 70B row: 256 x 8192 / (1621 x 64) = 20.2147 s
    assert next(r for r in runs if r.run == "mb-26.02-70b-fp8-64").step_time_s == pytest.approx(20.2147, abs=1e-4)


def test_the_bridge_runs_carry_what_their_recipes_set():
    for run in load_source("Megatron-Bridge"):
        flags = run.training_flags
        # bf16_with_fp8_current_scaling_mixed: hybrid, tensorwise, fp8_param_gather; grad_reduce_in_fp32 False
        assert "--fp8-format hybrid --fp8-recipe tensorwise --fp8-param-gather" in flags
        assert "--grad-reduce-in-bf16" in flags and "--overlap-grad-reduce --overlap-param-gather" in flags
        assert "--cross-entropy-loss-fusion --cross-entropy-fusion-impl te" in flags and run.megatron_version == "0.15"
        assert "--no-create-attention-mask-in-dataloader" in flags and "--recompute" not in flags
        ub = {"llama3.1-70b": "mb-llama3-70b-fp8.yaml", "llama3.1-405b": "mb-llama3.1-405b-fp8.yaml"}.get(run.model)
        assert (f"--tp-comm-overlap --tp-comm-overlap-cfg tables/published/userbuffers/{ub}" in flags) == (run.tp > 1)
        assert ("--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split" in flags) == (
            run.model == "llama3.1-405b")
        assert ("--data-parallel-sharding-strategy optim_grads_params" in flags) == (run.model == "llama3.1-8b")
        assert run.note


def test_the_405b_split_counts_the_embedding_and_the_loss_as_layers():
    """Megatron-Bridge's 405B recipe accounts for the embedding and the loss in the pipeline split:
    126 layers + 2 over PP 8 is 16 a rank, the first and last rank one layer fewer; VP 8 is given
    as chunks per rank, as layers per chunk (126 / 64) would not divide."""
    run = next(r for r in load_source("Megatron-Bridge") if r.run == "mb-26.06-405b-fp8-1024")
    line = command_line(run)
    assert "--num-virtual-stages-per-pipeline-rank 8" in line and "--num-layers-per-virtual-pipeline-stage" not in line
    estimate = price(run)
    assert estimate["layers_per_stage"] == [15, 16, 16, 16, 16, 16, 16, 15] and estimate["vpp"] == 8


def test_the_report_keeps_the_bridge_runs_apart_and_sums_both_sources():
    result = CliRunner().invoke(main, ["--format", "json"])
    assert result.exit_code == 0, result.output
    report_ = json.loads(result.stdout)
    bridge = report_["megatron_bridge"]
    assert len(report_["runs"]) == 68 and len(bridge["runs"]) == 13
    assert all(row["unpriced"] == [] and row["refused"] is None for row in bridge["runs"])
    fp8 = bridge["summary"]["fp8"]
    assert fp8["runs"] == 13 and fp8["within_target"] == 13 and fp8["refused"] == 0
    # the runs not called runnable are exactly the stated ones, each quoting the memory the report prints
    missed = {row["run"]: row for row in bridge["runs"] if row["verdict"] not in ("fits", "likely fits")}
    assert set(missed) == set(NOT_RUNNABLE) and fp8["verdicts_ok"] == 13 - len(missed)
    for name, row in missed.items():
        assert f"{row['verdict']} by" in NOT_RUNNABLE[name] and f"{row['usage_gib']:.2f} GiB of 80" in NOT_RUNNABLE[name]
    # the same layout in several containers: 25.09/25.11 (8B, 70B, 405B), 26.02 -> 26.02.01, 26.04, 26.04.01 (70B),
    # 26.02 -> 26.04.01, 26.06 (405B): 8 pairs
    assert len(bridge["release_changes"]) == 8
    # the layer pairs: DGX Cloud's 405B at 21 and 42 layers, two releases by two precisions
    assert len(report_["layer_pairs"]) == 4
    total = report_["total"]
    assert total["fp8"]["runs"] == 34 + 13 and total["bf16"] == report_["summary"]["bf16"]
    assert total["fp8"]["within_target"] == report_["summary"]["fp8"]["within_target"] + fp8["within_target"]
    markdown_ = CliRunner().invoke(main, []).stdout
    assert "bridge_dense_runs.csv" in markdown_ and "- all published dense runs, FP8: 47 runs" in markdown_


def test_a_refused_run_keeps_its_row_and_its_refusal():
    """A row the advisor refuses is reported, not dropped: core_v0.19.0's validate_args asserts against
    Transformer Engine's cross-entropy (arguments.py: 'disabled due to stability issues'), so a
    Megatron-Bridge row read as 0.19 is refused."""
    import dataclasses

    run = next(r for r in load_source("Megatron-Bridge") if r.run == "mb-26.06-405b-fp8-1024")
    rows, summary = report([dataclasses.replace(run, megatron_version="0.19")])
    assert rows[0]["predicted_s"] is None and "--cross-entropy-fusion-impl te" in rows[0]["refused"]
    assert summary == {}  # no error to summarise
    rows, summary = report([run, dataclasses.replace(run, run="refused", megatron_version="0.19")])
    assert summary["fp8"]["runs"] == 2 and summary["fp8"]["refused"] == 1 and summary["fp8"]["within_target"] == 1
