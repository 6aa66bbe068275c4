"""``advisor compare-log``: Megatron-LM's log lines read (a real core_v0.15.2 log from the CPU, and
synthetic excerpts of the format variants), and set beside the estimate of the same command."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from advisor.cli import cli
from advisor.errors import AdvisorError
from advisor.megatron_log import read_log
from advisor.parallel import TP_PP_DP_RANK_ORDER, pipeline_stage_of_rank

LOGS = Path(__file__).parent / "data" / "logs"
REAL_LOG = LOGS / "core_v0.15.2_cpu_pp2.log"
"""core_v0.15.2's pretrain_gpt.py, 2 iterations of a 4-layer Llama on PP 2 (1 and 3 layers) over gloo
under tests/fixtures/cuda_on_cpu (its CUDA memory counters read 0), with --log-throughput; the
command that ran it (advisor-launch torchrun --dry-run) is REAL_COMMAND."""
REAL_COMMAND = LOGS / "core_v0.15.2_cpu_pp2.command"


def run(*argv: str, stdin: str | None = None):
    return CliRunner().invoke(cli, list(map(str, argv)), input=stdin)


def test_the_real_log_reads_as_megatron_wrote_it():
    log = read_log(REAL_LOG.read_text().splitlines())
    assert [(i.iteration, i.elapsed_ms, i.tflops_per_gpu, i.global_batch_size) for i in log.iterations] == [
        (1, 988.6, 0.0, 4), (2, 531.2, 0.0, 4)]
    assert sorted(r.rank for r in log.memory) == [0, 1]  # one per pipeline stage (DP = 1)
    assert [(t.weight_and_optimizer_mib, t.activation_mib, t.total_mib) for t in log.theoretical] == [(5.78, 0.28, 6.06)]
    assert log.step_time_s() == 0.5312  # the steady iterations: the second only


def test_format_variants_behind_launcher_prefixes():
    log = read_log((LOGS / "synthetic_variants.log").read_text().splitlines())
    assert [i.elapsed_ms for i in log.iterations] == [9000.0, 4000.0, 4200.0, 4100.0]
    assert log.step_time_s() == 4.1  # median of 4000, 4200, 4100: the first iteration is start-up
    assert log.tflops_per_gpu() == 410.0  # median of 420 and 400; iteration 4 logged no throughput
    peaks = log.peak_by_rank()
    assert {rank: r.max_allocated_mib for rank, r in peaks.items()} == {0: 61440.0, 4: 51200.0}
    assert log.theoretical[0].total_mib == 71680.0


def test_ranks_map_to_stages_with_pipeline_slowest():
    # tp-cp-ep-dp-pp: 16 ranks, PP 4 -> 4 consecutive ranks per stage
    assert [pipeline_stage_of_rank(rank, tp=2, cp=1, dp=2, pp=4) for rank in (0, 3, 4, 5, 15)] == [0, 0, 1, 1, 3]
    # tp-cp-ep-pp-dp (--use-tp-pp-dp-mapping): TP 2 x PP 2 x DP 2, rank = t + 2 p + 4 d
    assert [pipeline_stage_of_rank(rank, tp=2, cp=1, dp=2, pp=2, order=TP_PP_DP_RANK_ORDER)
            for rank in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]


@pytest.mark.parametrize("order", ["tp-cp-ep-dp-pp", TP_PP_DP_RANK_ORDER])
def test_ranks_map_to_the_stages_megatron_builds(order):
    """Against megatron-core's own RankGenerator (the dense decoder's: EP 1) for TP 2, CP 2, PP 2, DP 2."""
    parallel_state = pytest.importorskip("megatron.core.parallel_state",
                                         reason="megatron-core is not installed (pip install -e '.[megatron]')")
    groups = parallel_state.RankGenerator(tp=2, ep=1, dp=2, pp=2, cp=2, order=order).get_ranks("pp")
    megatron = {rank: stage for group in groups for stage, rank in enumerate(group)}
    assert {rank: pipeline_stage_of_rank(rank, tp=2, cp=2, dp=2, pp=2, order=order) for rank in range(16)} == megatron


def test_a_log_without_iterations_is_refused():
    with pytest.raises(AdvisorError, match="no Megatron-LM iteration line"):
        read_log(["Theoretical memory footprints: weight and optimizer=1.00 MB, activation=1.00 MB, total=2.00 MB"])


def test_a_stray_byte_in_the_log_does_not_refuse_it(tmp_path):
    """A line of broken UTF-8 (two ranks' output interleaved mid-character) among the real log's
    lines: read as the clean log is (it was 'Error: ...: not UTF-8 text (byte 0xe2 at offset ...)',
    exit 2, for a log of hours)."""
    lines = REAL_LOG.read_bytes().split(b"\n")
    log = tmp_path / "train.log"
    log.write_bytes(b"\n".join([*lines[:100], b"garbled \xe2\x80 output of rank 3", *lines[100:]]))
    clean = run("compare-log", REAL_LOG, "--from-command", REAL_COMMAND, "--format", "json")
    garbled = run("compare-log", log, "--from-command", REAL_COMMAND, "--format", "json")
    assert garbled.exit_code == 0, garbled.output
    assert json.loads(garbled.stdout)["rows"] == json.loads(clean.stdout)["rows"]


def test_compare_log_sets_the_real_log_beside_the_same_estimate():
    result = run("compare-log", REAL_LOG, "--from-command", REAL_COMMAND, "--gpu", "h100-80gb", "--format", "json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    estimate = json.loads(run("estimate", "--from-command", REAL_COMMAND, "--gpu", "h100-80gb", "--format",
                              "json").stdout)
    rows = {row["what"]: row for row in document["rows"]}
    assert rows["step time"]["measured"] == 0.5312 and rows["step time"]["predicted"] == estimate["step_time_s"]
    assert rows["step time"]["measured_over_predicted"] == 0.5312 / estimate["step_time_s"]
    stage_totals = [stage["total_gib"] for stage in estimate["stages"]]
    # core_v0.15.2 reports memory after iteration 1 only: labelled so, with the moments it lacks
    assert [rows[f"stage {i} max allocated (iteration 1)"]["predicted"] for i in (0, 1)] == stage_totals
    assert rows["stage 0 max allocated (iteration 1)"]["measured"] == 0.0  # the CPU double's counters
    assert any(note.startswith("memory: Megatron reported after iteration 1 only") for note in document["notes"])
    # a logged 0 is no measurement: no ratio (it read 0.000), and a note names the quantities
    assert [rows[what]["measured_over_predicted"] for what in ("TFLOP/s per GPU", "stage 0 max allocated (iteration 1)",
                                                               "peak max reserved (calibrated)")] == [None] * 3
    zeros = [note for note in document["notes"] if note.startswith("logged as 0")]
    assert len(zeros) == 1 and "stage 1 max allocated" in zeros[0] and "step time" not in zeros[0]
    assert any(note.startswith("Megatron's own theoretical memory (stage 0)") for note in document["notes"])


def test_a_log_of_another_batch_is_refused(tmp_path):
    other = tmp_path / "other.log"
    other.write_text(REAL_LOG.read_text().replace("global batch size:     4", "global batch size:     8"))
    result = run("compare-log", other, "--from-command", REAL_COMMAND)
    assert result.exit_code == 2 and "the log trains global batch size 8, the command 4" in result.output


def _cut_after(tmp_path, marker: str) -> Path:
    """The real log cut just after ``marker``'s first occurrence, as a log still being written is."""
    text = REAL_LOG.read_text()
    path = tmp_path / "cut.log"
    path.write_text(text[:text.index(marker) + len(marker)])
    return path


def test_a_cut_last_iteration_line_is_not_read_and_said(tmp_path):
    """The log cut in 531.2 read 53 ms, silently; the cut line is now left out, in a note."""
    path = _cut_after(tmp_path, "per iteration (ms): 53")
    result = run("compare-log", path, "--from-command", REAL_COMMAND, "--gpu", "h100-80gb", "--format", "json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert {row["what"]: row for row in document["rows"]}["step time"]["measured"] == 0.9886  # iteration 1 alone
    assert "1 logged iteration, 2 memory reports" in document["notes"]
    assert ("line 697, the last, stops without a line end (a log still being written, or cut): not read"
            in document["notes"])


def test_a_cut_last_memory_line_is_not_read_and_said(tmp_path):
    path = _cut_after(tmp_path, "[Rank 0] (after 1 iterations) memory (MB) | allocated: 0.0 | max allocated: 0")
    result = run("compare-log", path, "--from-command", REAL_COMMAND, "--format", "json")
    assert result.exit_code == 0, result.output
    notes = json.loads(result.stdout)["notes"]
    assert "1 logged iteration, 1 memory report" in notes
    assert "line 696, the last, stops without a line end (a log still being written, or cut): not read" in notes


def test_a_log_whose_only_iteration_line_is_cut_is_refused(advisor, tmp_path):
    path = _cut_after(tmp_path, "per iteration (ms): 98")
    line = advisor.error("compare-log", path, "--from-command", REAL_COMMAND)
    assert line.startswith("Error: no Megatron-LM iteration line") and line.endswith(
        "; line 684, the last, stops without a line end and is not read")


def test_a_whole_last_line_is_read(tmp_path):
    """A last line with its line end ('\\r\\n' too) is whole: read, and no note."""
    path = tmp_path / "whole.log"
    path.write_bytes("\r\n".join(REAL_LOG.read_text().splitlines()[:697]).encode() + b"\r\n")  # to iteration 2
    result = run("compare-log", path, "--from-command", REAL_COMMAND, "--format", "json")
    assert result.exit_code == 0, result.output
    notes = json.loads(result.stdout)["notes"]
    assert "2 logged iterations, 2 memory reports" in notes and not any("line end" in note for note in notes)


def _compare(text: str, tmp_path, *extra):
    log = tmp_path / "train.log"
    log.write_text(text)
    return run("compare-log", log, "--from-command", REAL_COMMAND, *extra)


def _one_line(result, *words):
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:") and all(word in lines[0] for word in words), lines


HOOKS = ("megatron_hooks: [Rank 0] peak over 2 iterations: 1536.00 MB allocated, 2048.00 MB reserved\n"
         "megatron_hooks: [Rank 1] peak over 2 iterations: 1024.00 MB allocated\n")


def test_the_hooks_peaks_replace_megatrons_reports(tmp_path):
    """A launch with --profile-dir ends with each reporting rank's peak (megatron_hooks.integration
    .peak_line): compare-log sets those beside the stages, and says so."""
    result = _compare(REAL_LOG.read_text() + HOOKS, tmp_path, "--format", "json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    rows = {row["what"]: row for row in document["rows"]}
    assert rows["stage 0 max allocated"]["measured"] == 1.5 and rows["stage 1 max allocated"]["measured"] == 1.0
    assert any(note.startswith("memory: the advisor's hooks' peaks") for note in document["notes"])


def test_a_hooked_log_without_their_peaks_is_marked_cut_short(tmp_path):
    """advisor-launch's echo of --profile-dir shows the hooks reset torch's peak counters: Megatron's
    reports are not the peak, so they get no ratio."""
    echo = "+ torchrun --nproc-per-node 2 --standalone \\\n    --profile-dir /tmp/profile -- \\\n"
    result = _compare(echo + REAL_LOG.read_text(), tmp_path, "--format", "json")
    document = json.loads(result.stdout)
    rows = {row["what"]: row for row in document["rows"]}
    assert rows["stage 0 max allocated (cut short)"]["measured_over_predicted"] is None
    assert any("no peak line of theirs" in note for note in document["notes"])


@pytest.mark.parametrize("line, words", [
    ("megatron_hooks: [Rank 5] peak over 2 iterations: 10.00 MB allocated\n", ("rank 5", "runs 2 GPUs")),
])
def test_hooks_lines_that_cannot_be_this_runs_are_refused(tmp_path, line, words):
    _one_line(_compare(REAL_LOG.read_text() + line, tmp_path), *words)


def test_a_hooks_peak_and_megatrons_report_give_the_larger(tmp_path):
    """Each is a lower bound of the rank's peak: the hooks count train_step whole, Megatron's report
    (cut by their resets) may count work after it (--log-params-norm's FP32 copies)."""
    text = REAL_LOG.read_text().replace("| max allocated: 0.0 |", "| max allocated: 1200.0 |")
    document = json.loads(_compare(text + HOOKS, tmp_path, "--format", "json").stdout)
    rows = {row["what"]: row["measured"] for row in document["rows"]}
    assert rows["stage 0 max allocated"] == 1.5 and rows["stage 1 max allocated"] == pytest.approx(1200 / 1024)


def test_a_hooks_peak_over_one_iteration_is_iteration_1s(tmp_path):
    """A run that died in iteration 2 prints its hooks' peak over iteration 1, before Adam's moments
    exist: labelled so, with the moments note, as Megatron's own report after iteration 1 is."""
    one = HOOKS.replace("over 2 iterations", "over 1 iterations")
    document = json.loads(_compare(REAL_LOG.read_text() + one, tmp_path, "--format", "json").stdout)
    assert [row["what"] for row in document["rows"]][2:4] == ["stage 0 max allocated (iteration 1)",
                                                            "stage 1 max allocated (iteration 1)"]
    assert any(note.startswith("memory: the hooks' peaks span iteration 1 only") for note in document["notes"])


def test_several_runs_in_one_log_are_refused(tmp_path):
    text = REAL_LOG.read_text()
    _one_line(_compare(text + text.replace("num_layers ...................................... 4",
                                           "num_layers ...................................... 8"), tmp_path),
              "a second run's num_layers 8 (the first's 4): give one run's log")


def test_a_log_of_another_model_or_layout_is_refused(tmp_path):
    text = REAL_LOG.read_text().replace("num_layers ...................................... 4",
                                        "num_layers ...................................... 14")
    _one_line(_compare(text, tmp_path), "the log ran num_layers 14 (the command: 4)")
    text = REAL_LOG.read_text().replace("micro_batch_size ................................ 1",
                                        "micro_batch_size ................................ 2")
    _one_line(_compare(text, tmp_path), "micro_batch_size 2 (the command: 1)")


def test_a_run_that_ran_out_of_memory_and_a_lone_iteration_are_said(tmp_path):
    lines = REAL_LOG.read_text().splitlines(keepends=True)
    second = next(i for i, line in enumerate(lines) if re.search(r"iteration\s+2/", line))
    text = "".join(lines[:second]) + "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    document = json.loads(_compare(text, tmp_path, "--format", "json").stdout)
    assert "one iteration logged: its time includes start-up (compilation, NCCL set-up)" in document["notes"]
    assert "the run ran out of CUDA memory (the log says so) after 1 logged iteration" in document["notes"]


def test_without_a_gpu_the_time_rows_say_why_they_are_empty(tmp_path):
    document = json.loads(_compare(REAL_LOG.read_text(), tmp_path, "--format", "json").stdout)
    assert document["rows"][0]["predicted"] is None
    assert "no --gpu: the step time and TFLOP/s are predicted only for a GPU preset" in document["notes"]


EIGHT_GPUS = REAL_COMMAND.read_text().replace("--nproc-per-node 2", "--nproc-per-node 8").replace(
    "--tensor-model-parallel-size 1", "--tensor-model-parallel-size 2")
"""REAL_COMMAND on 8 GPUs with TP 2: TP 2, PP 2 (1 and 3 layers), DP 2, global batch 4."""
STAGE_MIB = {0: 1024.0, 1: 3072.0}
"""The max allocated each stage's ranks report in ``_megatron_log`` (stage 1 holds 3 layers)."""


def _megatron_log(*, world: int = 8, dp: int = 2, tp: int = 2, batches=(4, 4, 4), ranks=(0, 1, 4, 5),
                  stages=(0, 0, 1, 1), padded_vocab: int = 4096, arguments: dict | None = None,
                  counts=None) -> str:
    """A core_v0.15.2 log of a PP 2 run in its own formats: validate_args's world line, _print_args's
    dump, _vocab_size_with_padding's line, training_log's iteration lines (one per entry of
    ``batches``, their global batch sizes; ``counts``: each one's skipped and NaN iterations), and
    report_memory's lines after the first, one per rank with data-parallel rank 0 (``ranks``, on
    ``stages``)."""
    lines = [f"using world size: {world}, data-parallel size: {dp}, context-parallel size: 1, hierarchical "
             f"context-parallel sizes: None, tensor-model-parallel size: {tp}, pipeline-model-parallel size: 2",
             "------------------------ arguments ------------------------"]
    dump = {"num_layers": 4, "hidden_size": 64, "ffn_hidden_size": 128, "num_attention_heads": 4,
            "group_query_attention": True, "num_query_groups": 2, "tensor_model_parallel_size": tp,
            "pipeline_model_parallel_size": 2, "world_size": world, "data_parallel_size": dp,
            "padded_vocab_size": None, "use_tp_pp_dp_mapping": False, **(arguments or {})}
    lines += sorted(("  {} {} {}".format(name, "." * (48 - len(name)), value) for name, value in dump.items()),
                    key=str.lower)
    lines += ["-------------------- end of arguments ---------------------",
              f" > padded vocab (size: 4096) with {padded_vocab - 4096} dummy tokens (new size: {padded_vocab})"]
    consumed = 0
    for n, (batch, (skipped, nans)) in enumerate(zip(batches, counts or [(0, 0)] * len(batches)), 1):
        consumed += batch
        lines.append(f" [2026-11-25 16:25:37] iteration {n:8d}/{len(batches):8d} | consumed samples: {consumed:12d} | "
                     f"elapsed time per iteration (ms): {100.0 * n:.1f} | learning rate: {1e-4:.6E} | "
                     f"global batch size: {batch:5d} | lm loss: {8.3:.6E} | loss scale: 1.0 | grad norm: 1.330 | "
                     f"number of skipped iterations: {skipped:3d} | number of nan iterations: {nans:3d} |")
        if n == 1:
            lines += [f"[Rank {rank}] (after 1 iterations) memory (MB) | allocated: 512.0 | max allocated: "
                      f"{STAGE_MIB[stage]} | reserved: 4096.0 | max reserved: 4096.0" for rank, stage in zip(ranks, stages)]
    return "\n".join(lines) + "\n"


def _compare_8(tmp_path, log: str, command: str = EIGHT_GPUS, *extra):
    (tmp_path / "train.log").write_text(log)
    (tmp_path / "train.sh").write_text(command)
    return run("compare-log", tmp_path / "train.log", "--from-command", tmp_path / "train.sh", *extra)


def _measured_stages(result) -> list[float]:
    assert result.exit_code == 0, result.output
    rows = {row["what"]: row for row in json.loads(result.stdout)["rows"]}
    return [rows[f"stage {i} max allocated (iteration 1)"]["measured"] for i in (0, 1)]


def test_the_eight_gpu_log_reads_its_stages():
    """The generated log's stages where the default order puts them: stage 1's reports from ranks 4, 5."""
    assert read_log(_megatron_log().splitlines()).arguments["padded_vocab_size"] == "4096"


def test_a_log_of_another_world_size_is_refused(tmp_path):
    """16 GPUs (DP 4) against the command's 8: was accepted, its step time set beside 8 GPUs' estimate."""
    _one_line(_compare_8(tmp_path, _megatron_log(world=16, dp=4)),
              "world_size 16 (the command: 8)", "data_parallel_size 4 (the command: 2)",
              "is it the command that wrote the log?")


def test_gpus_replaces_the_world_size_the_command_gives(advisor):
    """As its --help says: the real command's torchrun gives 2 GPUs; --gpus 4 replaces them (and the
    log's world of 2 is then refused), --gpus 2 changes nothing. The help said 'where the command
    does not give it', which read as ignored where it does."""
    line = advisor.error("compare-log", REAL_LOG, "--from-command", REAL_COMMAND, "--gpus", "4")
    assert line.startswith("Error: the log ran world_size 2 (the command: 4)")
    given = run("compare-log", REAL_LOG, "--from-command", REAL_COMMAND, "--gpus", "2", "--format", "json")
    assert json.loads(given.stdout)["rows"] == json.loads(
        run("compare-log", REAL_LOG, "--from-command", REAL_COMMAND, "--format", "json").stdout)["rows"]


def test_validate_args_world_line_alone_is_checked(tmp_path):
    """A log without the argument dump still has validate_args's 'using world size' line."""
    log = "\n".join(line for line in _megatron_log(world=16, dp=4).splitlines() if "world_size ..." not in line
                    and "data_parallel_size ..." not in line)
    _one_line(_compare_8(tmp_path, log), "world_size 16 (the command: 8)")


@pytest.mark.parametrize("arguments, padded, words", [
    ({"ffn_hidden_size": 256}, 4096, ("ffn_hidden_size 256 (the command: 128)",)),
    ({"num_query_groups": 4}, 4096, ("num_query_groups 4 (the command: 2)",)),
    # without --group-query-attention Megatron keeps every head's keys: 4 groups, whatever it prints
    ({"group_query_attention": False}, 4096, ("num_query_groups 4 (the command: 2)",)),
    # core 0.15's NullTokenizer: --vocab-size 4095 + its end-of-document row = 4096, padded to a
    # multiple of 1 x TP 2: 4096; 4352 is another tokenizer or divisor
    ({}, 4352, ("padded_vocab_size 4352 (the command: 4096)", "NullTokenizer")),
])
def test_a_log_of_another_model_shape_is_refused(tmp_path, arguments, padded, words):
    log = _megatron_log(arguments=arguments, padded_vocab=padded)
    _one_line(_compare_8(tmp_path, log, EIGHT_GPUS, "--megatron-version", "0.15"), *words)


def test_the_padded_vocabulary_follows_the_commands_divisor_and_tp(tmp_path):
    """--make-vocab-size-divisible-by 3 x TP 2: core 0.15's 4096 rows pad to 4098 (ceil(4096 / 6) x 6)."""
    command = EIGHT_GPUS.replace("--make-vocab-size-divisible-by 1", "--make-vocab-size-divisible-by 3")
    core_15 = ("--megatron-version", "0.15")
    assert _compare_8(tmp_path, _megatron_log(padded_vocab=4098), command, *core_15).exit_code == 0
    _one_line(_compare_8(tmp_path, _megatron_log(padded_vocab=4096), command, *core_15),
              "padded_vocab_size 4096 (the command: 4098)")


def test_nulltokenizers_rows_are_not_checked_without_the_release(tmp_path):
    """NullTokenizer's rows differ by release (core 0.15 adds one): the command alone does not say the
    padded vocabulary, so without --megatron-version it is not checked (the real core 0.15 log, read
    under the newest release's 4095 rows, is compared)."""
    assert _compare_8(tmp_path, _megatron_log(padded_vocab=4352)).exit_code == 0


def test_a_memory_report_of_a_rank_beyond_the_world_is_refused(tmp_path):
    """Rank 9 of an 8-GPU command: its report was dropped from every stage, unsaid."""
    _one_line(_compare_8(tmp_path, _megatron_log(ranks=(0, 1, 8, 9))),
              "memory report names rank 8", "runs 8 GPUs", "is it this run's log?")


def test_tp_pp_dp_mapping_puts_stage_1_on_ranks_2_and_3(tmp_path):
    """tp-cp-ep-pp-dp: the data-parallel rank 0 replicas are ranks 0, 1 (stage 0) and 2, 3 (stage 1);
    read in the default order, 2 and 3 went to stage 0 and stage 1 had no measurement."""
    command = EIGHT_GPUS.replace("--log-throughput", "--log-throughput --use-tp-pp-dp-mapping")
    log = _megatron_log(ranks=(0, 1, 2, 3), arguments={"use_tp_pp_dp_mapping": True})
    assert _measured_stages(_compare_8(tmp_path, log, command, "--format", "json")) == [1.0, 3.0]
    assert _measured_stages(_compare_8(tmp_path, _megatron_log(), EIGHT_GPUS, "--format", "json")) == [1.0, 3.0]
    _one_line(_compare_8(tmp_path, log), "use_tp_pp_dp_mapping True (the command: False)")


RAMP = EIGHT_GPUS.replace("--global-batch-size 4", "--global-batch-size 8 --rampup-batch-size 4 4 8")


def test_a_ramp_up_is_left_out_and_said(tmp_path):
    """--rampup-batch-size 4 4 8 to global batch 8: iterations 1 and 2 at 4 are ramp-up; the step
    time is iteration 4's (iteration 3, the first at 8, is dropped as start-up would be)."""
    result = _compare_8(tmp_path, _megatron_log(batches=(4, 4, 8, 8)), RAMP, "--gpu", "h100-80gb",
                        "--format", "json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["rows"][0]["measured"] == 0.4  # iteration 4: 400 ms
    assert ("2 logged ramp-up iterations (global batch size 4) left out: the times are those at global batch 8"
            in document["notes"])


def test_a_log_of_ramp_up_only_is_refused(tmp_path):
    _one_line(_compare_8(tmp_path, _megatron_log(batches=(4, 4)), RAMP),
              "every logged iteration ramps up (global batch size 4", "none trains the command's global batch 8")


def test_several_batches_without_a_ramp_up_stay_refused(tmp_path):
    _one_line(_compare_8(tmp_path, _megatron_log(batches=(2, 4, 4))), "the log trains global batch sizes 2 and 4")


def test_skipped_and_nan_iterations_are_counted_in_a_note(tmp_path):
    result = _compare_8(tmp_path, _megatron_log(counts=((0, 0), (2, 1), (1, 0))), EIGHT_GPUS, "--format", "json")
    assert ("the log counts 3 skipped iterations (the optimizer step skipped: its gradients overflowed) and 1 NaN "
            "iteration (a NaN or infinite loss)") in json.loads(result.stdout)["notes"]
    notes = json.loads(_compare_8(tmp_path, _megatron_log(), EIGHT_GPUS, "--format", "json").stdout)["notes"]
    assert not any("skipped" in note for note in notes)


def test_a_missing_log_is_told_before_the_command_is_read(advisor, tmp_path):
    """The command line names the log first; a missing log is its one error line even where the
    command is missing or refused too (it was reported after them, or not at all)."""
    command = tmp_path / "train.sh"
    command.write_text("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 32 --no-such-layout\n")
    for given in (tmp_path / "missing.sh", command):
        line = advisor.error("compare-log", tmp_path / "missing.log", "--from-command", given)
        assert "missing.log: no such file" in line, line
