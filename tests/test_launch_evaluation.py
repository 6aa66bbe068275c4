"""The evaluation a launch runs besides training (launch/evaluation.py, advisor/throughput/forward_only.py):
counts read from Megatron-LM's train loop by hand, the forward-only pipeline against a hand
calculation and a step-by-step simulation of the schedule, the report's line, and the values
refused in one line with exit status 2."""

import itertools
import json
import random

import pytest
from launch_support import launcher, make_checkout, sweep_file, write_json

from advisor.releases import RELEASES
from advisor.throughput.forward_only import forward_only_pipeline_s
from launch.evaluation import evaluation

OLD, NEW = RELEASES  # core_v0.15.2 (--eval-interval 1000), core_v0.19.0 (none)
MOCK = ["--mock-data", "--lr", "3e-4"]


def test_ten_thousand_iterations_evaluate_ten_times_then_twice_more():
    # core_v0.15.2 training.py, train: after iteration i (1..N), 'if args.eval_interval and i %
    # args.eval_interval == 0': i = 1000, 2000, ..., 10000 (the last iteration included), 10 of them;
    # then pretrain evaluates once on the validation set and once on the test set (mock data: split
    # 1,1,1). (10 + 2) x 100 = 1,200 forward-only iterations of the global batch.
    e = evaluation(OLD, [*MOCK, "--train-iters", "10000"], 1024)
    assert (e.eval_iters, e.interval, e.periodic, e.final, e.iterations) == (100, 1000, 10, 2, 1200)
    # 10,999 iterations: still 10 (11,000 is never reached); 999: none during training
    assert evaluation(OLD, [*MOCK, "--train-iters", "10999"], 1024).periodic == 10
    assert evaluation(OLD, [*MOCK, "--train-iters", "999"], 1024).iterations == 2 * 100


def test_train_samples_count_whole_global_batches():
    # update_train_iters: train_iters = train_samples // global_batch_size ('we throw away any
    # partial last batch'): 1,024,999 samples of GBS 1024 = 1,000 iterations -> 1 evaluation at 1000
    e = evaluation(OLD, [*MOCK, "--train-samples", "1024999"], 1024)
    assert (e.train_iters, e.periodic) == (1000, 1)
    # a batch ramp-up changes the count (update_train_iters' other branch): not counted
    assert evaluation(OLD, [*MOCK, "--train-samples", "1024999", "--rampup-batch-size", "32", "32", "1000"],
                      1024).iterations is None


def test_the_users_own_values_and_data_decide():
    data = ["--data-path", "corpus", "--lr", "3e-4", "--train-iters", "10000"]
    # Megatron's default split with --data-path is '969, 30, 1': a test split, so 10 + 2 evaluations
    assert evaluation(OLD, data, 8).iterations == 12 * 100
    # --split 99,1,0: no test split (its bookend is None, test_ds None, do_test false): 10 + 1
    assert evaluation(OLD, [*data, "--split", "99,1,0"], 8).iterations == 11 * 100
    # --eval-interval 2500, --eval-iters 20: 2500, 5000, 7500, 10000 -> (4 + 2) x 20
    assert evaluation(OLD, [*data, "--eval-interval", "2500", "--eval-iters", "20"], 8).iterations == 6 * 20
    # --eval-iters 0: do_valid and do_test false, nothing at all
    assert evaluation(OLD, [*data, "--eval-iters", "0"], 8).iterations == 0
    # --skip-train: no training loop, then the validation and the test evaluations
    assert evaluation(OLD, [*data, "--skip-train"], 8).iterations == 2 * 100
    # core_v0.19.0 --start-eval-at-iter 2500: i >= 2500 too, so 3000 ... 10000 -> 8, + 2
    assert evaluation(NEW, [*data, "--eval-interval", "1000", "--start-eval-at-iter", "2500"], 8).iterations == 10 * 100
    # --data-args-path: validate_args gives the legacy split only with --data-path ('if args.data_path
    # is not None and args.split is None', both releases), so without --split the command does not
    # say whether there is a test split (the report: 'where the data has a test split'; the count
    # takes the validation's alone, 10 + 1); with --split 98,1,1 there is one: 10 + 2
    args_path = ["--data-args-path", "paths.txt", "--lr", "3e-4", "--train-iters", "10000"]
    unknown = evaluation(OLD, args_path, 8)
    assert (unknown.test_split, unknown.iterations) == (None, 11 * 100)
    assert evaluation(OLD, [*args_path, "--split", "98,1,1"], 8).iterations == 12 * 100


def test_core_0_19_evaluates_only_at_the_end_by_default():
    # ValidationConfig.eval_interval = None: 'if args.eval_interval and ...' never holds
    e = evaluation(NEW, [*MOCK, "--train-iters", "10000"], 1024)
    assert (e.interval, e.periodic, e.iterations) == (None, 0, 2 * 100)


def test_a_forward_only_pipeline_by_hand():
    # two stages of 1.0 s and 1.5 s per microbatch forward, 4 microbatches: the slow stage paces
    # 4 x 1.5 = 6.0 s, and the first fills the pipe once, 1.0 s: 7.0 s. Interleaved (v = 2): the fill
    # is a chunk, 0.5 s: 6.5 s. One stage: 4 x 1.5 = 6.0 s, no fill.
    assert forward_only_pipeline_s([1.0, 1.5], 4) == pytest.approx(7.0)
    assert forward_only_pipeline_s([1.0, 1.5], 4, vpp=2) == pytest.approx(6.5)
    assert forward_only_pipeline_s([1.5], 4) == pytest.approx(6.0)


def _simulated(forward: list[float], m: int) -> float:
    """The schedule step by step: stage i starts microbatch j when stage i - 1 has sent it and it
    has finished microbatch j - 1 (schedules.py's forward-only loop: recv_forward, forward, send_forward)."""
    done = [[0.0] * (m + 1) for _ in range(len(forward) + 1)]
    for i, j in itertools.product(range(1, len(forward) + 1), range(1, m + 1)):
        done[i][j] = max(done[i - 1][j], done[i][j - 1]) + forward[i - 1]
    return done[-1][-1]


def test_the_forward_only_pipeline_is_the_simulated_schedule():
    generator = random.Random(7)
    for _ in range(50):
        forward = [generator.uniform(0.1, 2.0) for _ in range(generator.randint(1, 8))]
        m = generator.randint(1, 40)
        assert forward_only_pipeline_s(forward, m) == pytest.approx(_simulated(forward, m))


def test_an_estimates_evaluation_iteration_is_about_a_third_of_its_step(advisor):
    # PP 1, no recomputation: a forward-only iteration is the forward share of the step's pipeline.
    # The time model's backward is 2x the forward for the GEMMs (Narayanan et al.), 2.5x for flash
    # attention, 2x for the elementwise kernels, 1x for the TP collectives and the per-microbatch
    # overhead: so the share lies between 1/3.5 and 1/2, and near 1/3 where the GEMMs dominate.
    from advisor.saved_row_time import forward_only_iteration

    row = advisor.json("estimate", "--gpu", "h100-80gb", "--gpus", "16", "--tp", "2", "--pp", "1", "--mbs", "1",
                       "--format", "json")
    parts = row["time_parts"]
    pipeline = parts["total_s"] - parts["dp_comm_s"] - parts["optimizer_s"] - parts["data_wait_s"]
    priced = forward_only_iteration(row)
    assert priced.step_s == pytest.approx(row["step_time_s"], rel=1e-9)
    assert 1 / 3.5 < priced.iteration_s / pipeline < 1 / 2


def _evaluation_line(result) -> str:
    return next(line for line in result.stderr.splitlines() if line.startswith("advisor-launch: evaluation:"))


def test_the_report_says_what_evaluation_costs(advisor, tmp_path):
    # 1B tokens of 8192 at GBS 1024: ceil(1e9 / 8192) = 122,071 samples, // 1024 = 119 iterations;
    # --eval-interval 50 (yours): 50 and 100, then validation and test: (2 + 2) x 100 = 400
    sweep = sweep_file(advisor, tmp_path / "sweep.json", "--gpu", "h100-80gb", "--gpus", "16", "--tokens", "1B")
    row = json.loads(sweep.read_text())[0]
    result = launcher()("sbatch", "--from", sweep, "--megatron-version", "0.15", "--dry-run", "--mock-data",
                        "--", "--lr", "3e-4", "--eval-interval", "50")
    line = _evaluation_line(result)
    assert "every 50 iterations (--eval-interval, yours)" in line, line
    assert "(--eval-iters, Megatron-LM core 0.15's default)" in line, line
    assert "2 during the 119 training iterations, 1 on the validation set and 1 on the test set" in line, line
    assert "400 forward-only iterations at " in line and "--eval-iters 0 after -- turns it off" in line, line
    from advisor.saved_row_time import forward_only_iteration

    seconds = forward_only_iteration(row).iteration_s
    share = 400 * seconds / (119 * row["step_time_s"])
    assert f"at {seconds:.2f} s each" in line and f"{share:.1%} of the training's time" in line, line
    # core 0.19 without an interval: none during training in the line, and the preflight warns that
    # training cannot start without one (its data setup divides by it)
    result = launcher()("sbatch", "--from", sweep, "--megatron-version", "0.19", "--dry-run", "--mock-data",
                        "--", "--lr", "3e-4")
    assert "not during training (Megatron-LM core 0.19 has no --eval-interval default)" in _evaluation_line(result)
    assert any(line.startswith("warning: Megatron-LM core 0.19 has no --eval-interval default, and its "
                               "pretrain_gpt.py fails") for line in result.stderr.splitlines()), result.stderr


def test_a_row_without_a_gpu_counts_without_a_time(advisor, tmp_path):
    sweep = sweep_file(advisor, tmp_path / "sweep.json", "--gpus", "8", "--mem", "80")
    result = launcher()("sbatch", "--from", sweep, "--megatron-version", "0.15", "--dry-run", "--mock-data",
                        "--", "--lr", "3e-4", "--train-iters", "3000")
    line = _evaluation_line(result)
    assert "3 during the 3,000 training iterations" in line and "500 forward-only iterations (no time:" in line, line


def test_bad_evaluation_values_are_one_line(advisor, tmp_path):
    sweep = sweep_file(advisor, tmp_path / "sweep.json", "--gpus", "8", "--mem", "80")
    for args, message in ((["--eval-iters", "-3"], "--eval-iters -3: give 0 or more (0: no evaluation)"),
                          (["--eval-interval", "0"], "--eval-interval 0: give 1 or more"),
                          (["--eval-interval", "-5"], "asks for a negative number of samples")):
        line = launcher().error("args", "--from", sweep, "--", *args)
        assert message in line, line
    for document, message in (({"eval_iters": -1}, "eval_iters must be a whole number, 0 or more"),
                              ({"eval_interval": 0}, "eval_interval must be a positive integer, got 0")):
        line = launcher().error("args", "--from", sweep, "--job-config", write_json(tmp_path / "job.json", document))
        assert message in line, line
    # the job file's become Megatron's flags; 0 iterations is a valid way to turn evaluation off
    args = launcher()("args", "--from", sweep, "--job-config",
                      write_json(tmp_path / "job.json", {"eval_iters": 0, "eval_interval": 250})).stdout.split()
    assert args[args.index("--eval-iters") + 1] == "0" and args[args.index("--eval-interval") + 1] == "250"


def test_bad_run_lengths_are_one_line(advisor, tmp_path):
    # core_v0.15.2 arguments.py validate_args: 'if args.train_iters: assert args.train_samples is None,
    # 'expected iteration-based training'' (run through launch.megatron_check: refused); a negative
    # --train-iters passes validate_args and reached the evaluation report as '-5 training iterations'
    sweep = sweep_file(advisor, tmp_path / "sweep.json", "--gpus", "8", "--mem", "80")
    for args, message in (
            (["--train-iters", "10", "--train-samples", "10240"],
             "--train-iters and --train-samples (after --) are both given: Megatron-LM's validate_args refuses "
             "the two together ('expected iteration-based training'); give one of them"),
            # --train-iters 0 is false: validate_args' sample-based branch fails instead ('if args.train_samples:
            # ... assert args.train_iters is None, 'expected sample-based training'')
            (["--train-iters", "0", "--train-samples", "10240"],
             "are both given: Megatron-LM's validate_args refuses the two together ('expected sample-based training')"),
            (["--train-iters", "-5"], "--train-iters -5 (after --): give 0 or more; Megatron-LM does not check it"),
            (["--train-samples", "-10"], "--train-samples -10 (after --): give 0 or more"),
            # the sweep's global batch is 1024: 1023 // 1024 = 0 iterations (update_train_iters)
            (["--train-samples", "1023"], "--train-samples 1023 (after --) is less than one global batch of 1024: "
                                          "Megatron-LM would train no iteration; give at least 1024")):
        for command in (["args"], ["torchrun", "--megatron-version", "0.15", "--dry-run"]):
            line = launcher().error(*command, "--from", sweep, "--mock-data", "--", "--lr", "3e-4", *args)
            assert message in line, line
    assert launcher()("args", "--from", sweep, "--mock-data", "--", "--lr", "3e-4", "--train-samples", "1024").stdout


@pytest.mark.parametrize("flag", ["--train-iters", "--train-samples"])
def test_a_zero_run_length_is_one_line(advisor, tmp_path, flag):
    # core_v0.15.2 and core_v0.19.0 training.py, get_optimizer_param_scheduler: 'if args.train_iters:
    # ... elif args.train_samples: ... else: raise Exception('either train-iters or train-samples
    # should be provided.')', and 0 is false: '-- --train-iters 0' through advisor-launch torchrun on
    # core_v0.15.2 (one rank on the CPU) ended with that Exception on rank 0, exit status 1. The
    # parser takes 0, so launch.megatron_check passes it: refused here, exit status 2.
    sweep = sweep_file(advisor, tmp_path / "sweep.json", "--gpus", "8", "--mem", "80")
    message = (f"Error: {flag} 0 (after --): give 1 or more; Megatron-LM takes 0 and then fails on every rank "
               "building its learning-rate scheduler ('either train-iters or train-samples should be provided.')")
    for version in ("0.15", "0.19"):
        result = launcher()("args", "--from", sweep, "--megatron-version", version, "--mock-data", "--", "--lr", "3e-4",
                            "--eval-interval", "100", flag, "0", expect=2)
        assert message in result.stderr.splitlines(), result.stderr
    # both 0 passes validate_args (neither is true) and fails in the scheduler likewise
    line = launcher().error("args", "--from", sweep, "--mock-data", "--", "--lr", "3e-4", "--train-iters", "0",
                            "--train-samples", "0")
    assert "--train-iters 0 (after --): give 1 or more; Megatron-LM takes 0 and then fails" in line, line
    # core_v0.15.2's --skip-train still builds the scheduler (setup_model_and_optimizer): refused too
    launcher()("args", "--from", sweep, "--megatron-version", "0.15", "--mock-data", "--", "--lr", "3e-4",
               "--skip-train", flag, "0", expect=2)
    # core_v0.19.0's builds no optimizer nor scheduler with --skip-train, and its validate_args skips
    # the length checks ('if args.train_iters and not args.skip_train'): taken, both flags together too
    for args in ([flag, "0"], ["--train-iters", "0", "--train-samples", "0"]):
        assert launcher()("args", "--from", sweep, "--megatron-version", "0.19", "--mock-data", "--", "--lr", "3e-4",
                          "--eval-interval", "100", "--skip-train", *args).stdout


def test_a_short_train_samples_with_skip_train_is_the_users(advisor, tmp_path):
    # --skip-train trains no iteration whatever the length: --train-samples under one global batch
    # (1024 in this sweep) is not refused as 'would train no iteration' there; on core_v0.15.2 it is
    # what builds the scheduler (train_samples // 1024 = 0 iterations, then the evaluation)
    sweep = sweep_file(advisor, tmp_path / "sweep.json", "--gpus", "8", "--mem", "80")
    args = launcher()("args", "--from", sweep, "--megatron-version", "0.15", "--mock-data", "--", "--lr", "3e-4",
                      "--skip-train", "--train-samples", "8").stdout.split()
    assert args[args.index("--train-samples") + 1] == "8" and "--skip-train" in args


def test_core_0_19_training_without_an_interval_is_refused_before_it_starts(advisor, tmp_path):
    # check runs the preflight as torchrun and sbatch do: each problem one line, exit status 2
    sweep = sweep_file(advisor, tmp_path / "sweep.json", "--gpus", "8", "--mem", "80")
    checkout = make_checkout(tmp_path / "megatron-lm", minor=19)
    args = ["check", "--from", sweep, "--megatron-lm", checkout, "--no-gpus-here", "--mock-data", "--", "--lr", "3e-4",
            "--train-iters", "10"]
    result = launcher()(*args, expect=2)
    assert any(line.startswith("Error: Megatron-LM core 0.19 has no --eval-interval default, and its pretrain_gpt.py "
                               "fails without one") for line in result.stderr.splitlines()), result.stderr
    # with an interval (and no evaluation) it is not a problem any more
    invoker = launcher()  # other problems of this stand-in checkout (its Python, megatron-core) may remain
    result = invoker.runner.invoke(invoker.command, [str(a) for a in (*args, "--eval-iters", "0", "--eval-interval",
                                                                      "1000")], catch_exceptions=False)
    assert "--eval-interval default" not in result.stderr and "Traceback" not in result.output, result.output


def test_a_budgets_days_name_core_0_15s_evaluation_beside_them(advisor):
    # 1T tokens of 8192 at GBS 1024: ceil(1e12 / 8192) = 122,070,313 samples, // 1024 = 119,209
    # iterations; at core 0.15's defaults 119 evaluations during training (1000 ... 119000) and 2 at
    # the end: 121 x 100 = 12,100 forward-only iterations, not in the days (tokens / throughput)
    from advisor.saved_row_time import forward_only_iteration

    layout = ["estimate", "--gpu", "h100-80gb", "--tp", "2", "--pp", "1", "--mbs", "1", "--gpus", "16", "--tokens", "1T"]
    text = " ".join(advisor(*layout, "--megatron-version", "0.15").stdout.split())
    assert ("not in these figures: Megatron-LM core 0.15 also evaluates by default (--eval-interval 1,000, "
            "--eval-iters 100), 12,100 forward-only iterations over the 119,209 training iterations") in text, text
    row = advisor.json(*layout, "--megatron-version", "0.15")
    seconds = forward_only_iteration(row).iteration_s * 12_100
    assert f"{seconds / 86400:.1f} days more ({seconds / (119_209 * row['step_time_s']):.1%};" in text, text
    # core 0.19 has no default interval (training needs the user's own --eval-interval): said, with no
    # count; the JSON is unchanged
    newer = " ".join(advisor(*layout, "--megatron-version", "0.19").stdout.split())
    assert ("not in these figures: evaluation, whose --eval-interval you must give: Megatron-LM core 0.19 has no "
            "default and cannot train without one (its data setup divides by it)") in newer, newer
    assert advisor.json(*layout, "--megatron-version", "0.19").keys() == row.keys()


def test_a_sweeps_days_and_an_moe_budget_name_the_evaluation_too(advisor):
    # The sweep's rows share one count: the budget and the global batch decide it. Llama-3-8B's
    # sweep default, seq 8192 at GBS 1024, as above: 119,209 iterations, 12,100 forward-only ones.
    # Mixtral 8x7B at --seq-len 4096 and its default GBS 1024 (its JSON says so, checked below):
    # ceil(1e12 / 4096) = 244,140,625 samples, // 1024 = 238,418 iterations; 238 evaluations during
    # training and 2 at the end: 240 x 100 = 24,000.
    words = "--eval-interval 1,000, --eval-iters 100), {} forward-only iterations over the {} training iterations"
    sweep = ["sweep", "--gpus", "16", "--gpu", "h100-80gb", "--tokens", "1T", "--top", "1", "--megatron-version"]
    text = " ".join(advisor(*sweep, "0.15").stdout.split())
    assert words.format("12,100", "119,209") + "; --eval-iters 0 turns it off (advisor estimate prices its time)" \
        in text, text
    assert "whose --eval-interval you must give" in " ".join(advisor(*sweep, "0.19").stdout.split())
    assert "forward-only" not in advisor(*sweep, "0.15", "--format", "json").stdout  # JSON rows carry no notes

    moe = ["--model", "mixtral-8x7b", "--gpus", "64", "--gpu", "h100-80gb", "--tokens", "1T", "--seq-len", "4096",
           "--megatron-version", "0.15"]
    row = advisor.json("estimate", *moe, "--tp", "1", "--pp", "4", "--ep", "8")
    assert (row["seq_len"], row["global_batch_size"]) == (4096, 1024)
    estimate = " ".join(advisor("estimate", *moe, "--tp", "1", "--pp", "4", "--ep", "8").stdout.split())
    # the MoE time model prices whole steps, not a rank's forward: the count, without days
    assert words.format("24,000", "238,418") + "; --eval-iters 0 turns it off" in estimate, estimate
    assert "days more" not in estimate
    moe_sweep = " ".join(advisor("sweep", *moe, "--top", "1").stdout.split())
    assert words.format("24,000", "238,418") + "; --eval-iters 0 turns it off" in moe_sweep, moe_sweep
    assert "advisor estimate prices its time" not in moe_sweep
