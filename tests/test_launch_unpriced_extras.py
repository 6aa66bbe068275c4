"""advisor-launch names the user's flags after '--' that the input did not price, in the words
``advisor estimate --from-command`` names them with (``advisor.megatron_readback.unpriced_flag_note``):
a flag known to change memory or time that the options do not describe (its
``options.flags.UNPRICED``), one the advisor reads and prices otherwise, or one no reader takes
(a flag of Megatron's own parser the advisor does not know). A job's own flags (iterations,
learning rates, logging, the backend) and the data's are read and change no price: not named.
Found by fuzzing: --num-distributed-optimizer-instances, --no-gradient-accumulation-fusion and
--cp-comm-type passed through without a word."""

import pytest
from launch_support import launcher, sweep_file


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    from conftest import Invoker

    return sweep_file(Invoker(), tmp_path_factory.mktemp("unpriced") / "sweep.json",
                      "--gpus", "8", "--mem", "80", "--gbs", "64")


HEAD = "did not price what you give after --, which the launch runs: "


@pytest.mark.parametrize("extra, named", [
    (["--num-distributed-optimizer-instances", "2"], "--num-distributed-optimizer-instances (not priced)"),
    (["--no-gradient-accumulation-fusion"], "--no-gradient-accumulation-fusion (not priced)"),
    (["--cp-comm-type", "a2a", "--lr", "3e-4"], "--cp-comm-type (not priced)"),
    (["--decoder-seq-length", "4096"], "--decoder-seq-length (not known to the advisor)"),
])
def test_a_flag_the_input_did_not_price_is_named(sweep, monkeypatch, extra, named):
    monkeypatch.delenv("MEGATRON_LM", raising=False)
    result = launcher()("args", "--from", sweep, "--", *extra)
    [line] = [line for line in result.stderr.splitlines() if HEAD in line]
    assert line == f"advisor-launch: the sweep row (rank 1 of {sweep}) {HEAD}{named}"
    assert result.stdout.split()[-len(extra):] == extra  # run as given


@pytest.mark.parametrize("extra", [
    ["--train-iters", "20", "--lr", "3e-4", "--log-interval", "1", "--distributed-backend", "gloo"],
    ["--micro-batch-size", "1"],  # the input's own value, restated
    ["--data-path", "corpus_text_document", "--save", "ckpt", "--save-interval", "100"],
])
def test_a_jobs_own_flags_and_restated_ones_are_not_named(sweep, monkeypatch, extra):
    monkeypatch.delenv("MEGATRON_LM", raising=False)
    assert HEAD not in launcher()("args", "--from", sweep, "--", *extra).stderr


@pytest.mark.parametrize("extra", [
    ["--exp-avg-dtype", "bf16"], ["--main-params-dtype", "fp16"], ["--cross-entropy-loss-fusion"],
    ["--eod-mask-loss"], ["--reset-position-ids"], ["--no-tp-comm-bulk-dgrad"],
])
def test_a_priced_option_the_input_left_unset_is_a_conflict(sweep, monkeypatch, extra):
    """Flags that advisor.options reads into an option the price depends on (the precision-aware
    optimizer's state dtypes, the loss kernel, the data loader's mask, core_v0.19.0's spellings of
    the TP overlap's sub-options) are the input's to decide, as --bf16 is: they passed through,
    and the launch ran what was not priced (reviewer7)."""
    monkeypatch.delenv("MEGATRON_LM", raising=False)
    line = launcher().error("args", "--from", sweep, "--", *extra)
    assert line.startswith(f"Error: {' '.join(extra)} (after --) conflicts with the sweep row (rank 1 of {sweep})")


@pytest.mark.parametrize("extra", [["--exp-avg-dtype", "fp32"], ["--cross-entropy-fusion-impl", "native"]])
def test_megatrons_default_restated_is_no_conflict(sweep, monkeypatch, extra):
    monkeypatch.delenv("MEGATRON_LM", raising=False)
    assert launcher()("args", "--from", sweep, "--", *extra).stdout.split()[-len(extra):] == extra
