"""A Megatron-LM flag after '--' that needs a value must have one (launch.arguments.check_values,
the table launch.megatron_flags keeps from each release's own parser).

``--lr`` with nothing after it was passed through (and even silenced the launcher's "no learning
rate" warning); Megatron's argparse then refused the command on every rank at start-up. Now it
is one line, exit status 2, before anything is printed or written. What takes no value (switches,
nargs '*'), several values (nargs '+'), negative numbers and ``--flag=value`` pass as before.

A value that the flag's argparse type refuses (``--lr abc``: float('abc'); ``--num-layers 1.5``:
int('1.5')) passed the same way, and every rank died in argparse after the allocation started;
the table keeps each flag's type where it is int or float, and such a value is one line too."""

import json
import re

import pytest
from launch_support import launcher, sweep_file
from megatron_real import checkout as real_checkout

from conftest import ROOT
from advisor.errors import AdvisorError
from launch.arguments import check_values
from launch.megatron_versions import VERSIONS, named

CORE_15, CORE_19 = named("0.15"), named("0.19")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    from conftest import Invoker

    return sweep_file(Invoker(), tmp_path_factory.mktemp("sweep") / "sweep.json", "--gpus", "8", "--mem", "80")


def refused(*args: str) -> str:
    """The one error line of an advisor-launch command that must fail before anything starts."""
    result = launcher()(*args, expect=2)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert result.stdout == "" and "Traceback" not in result.output
    return lines[0]


def test_a_learning_rate_without_its_value_is_refused(sweep, tmp_path):
    line = refused("torchrun", "--from", sweep, "--mock-data", "--megatron-version", "0.15", "--dry-run", "--",
                   "--train-iters", "20", "--lr")
    assert line.startswith("Error: --lr (after --) needs a value and nothing follows it") and "core 0.15" in line
    # before another flag: that flag is named, and it was not read as --lr's value
    line = refused("torchrun", "--from", sweep, "--mock-data", "--dry-run", "--", "--lr", "--train-iters", "20")
    assert "--lr (after --) needs a value and --train-iters follows it" in line and "core 0.19" in line
    # every such flag at once; sbatch writes no script
    script = tmp_path / "job.sh"
    line = refused("sbatch", "--from", sweep, "--mock-data", "--dry-run", "-o", script, "--", "--lr", "--train-iters")
    assert "--lr (after --) needs a value and --train-iters follows it; --train-iters (after --) needs a value and " \
           "nothing follows it" in line
    assert not script.exists()
    # an empty --flag= is no value either (argparse would read '' and fail on float('')), nor one
    # the word after it gives ('--lr= 1' was launched as '--lr 1')
    assert "--lr (after --) needs a value" in refused("args", "--from", sweep, "--", "--lr=")
    assert "--lr (after --) needs a value and --lr= gives it empty; --lr (after --) takes one value, got '--lr= 1'" \
        in refused("torchrun", "--from", sweep, "--mock-data", "--dry-run", "--", "--lr=", "1")


def test_what_takes_no_value_or_several_or_a_negative_one_passes_unchanged(sweep):
    # negative values of flags the launcher leaves to Megatron (--clip-grad -1: no clipping; a negative
    # --lr, --min-lr or Adam beta it refuses: test_launch_job.py)
    extras = ["--clip-grad", "-1", "--adam-eps", "1e-8", "--log-throughput", "--train-iters=5", "--data-path", "a",
              "b", "c", "--split", "99,1,0", "--exit-signal-handler", "--lr-warmup-init", "-0.5"]
    for release in ("0.15", "0.19"):
        shown = launcher()("args", "--from", sweep, "--megatron-version", release, "--format", "json", "--", *extras)
        assert json.loads(shown.stdout)[-len(extras):] == extras
    # nargs '*' (argparse accepts --data-path alone) and a flag the parser lacks (Megatron's own
    # "unrecognized arguments") are not this check's to refuse
    for alone in (["--data-path"], ["--no-such-megatron-flag"], ["--lr", "3e-4", "--data-path"]):
        assert launcher()("args", "--from", sweep, "--format", "json", "--", *alone)


def test_counts_and_releases_differ_as_their_parsers_do():
    # core_v0.19.0: --rampup-batch-size takes nargs=3; core_v0.15.2 nargs='*'
    with pytest.raises(AdvisorError, match=r"--rampup-batch-size \(after --\) needs 3 values, got 2"):
        check_values(CORE_19, ["--rampup-batch-size", "16", "16"])
    check_values(CORE_15, ["--rampup-batch-size", "16", "16"])
    check_values(CORE_19, ["--rampup-batch-size", "16", "16", "1000"])
    # --recompute-modules: nargs '+' in core_v0.19.0 (one value at least), '*' in core_v0.15.2
    with pytest.raises(AdvisorError, match="--recompute-modules"):
        check_values(CORE_19, ["--recompute-modules", "--lr", "1"])
    check_values(CORE_15, ["--recompute-modules", "--lr", "1"])
    # a switch is followed by the next flag, not by a value
    check_values(CORE_19, ["--bf16", "--use-distributed-optimizer", "--lr", "1"])
    # more values than a flag takes: argparse leaves the rest as unrecognized arguments
    for release in (CORE_15, CORE_19):
        with pytest.raises(AdvisorError, match=r"--lr \(after --\) takes one value, got '3e-4 5' \(the extra '5' too\)"):
            check_values(release, ["--lr", "3e-4", "5", "--train-iters", "10"])
        with pytest.raises(AdvisorError, match=r"--bf16 \(after --\) is a switch and takes no value, got 'true'"):
            check_values(release, ["--bf16", "true"])
        with pytest.raises(AdvisorError, match=r"--log-throughput \(after --\) is a switch"):
            check_values(release, ["--log-throughput=1"])
    with pytest.raises(AdvisorError, match=r"--rampup-batch-size \(after --\) takes 3 values"):
        check_values(CORE_19, ["--rampup-batch-size", "16", "16", "1000", "7"])
    check_values(CORE_19, ["--recompute-modules", "moe", "mlp", "layernorm", "--data-path", "1", "a", "1", "b"])
    # '--flag=value' gets one slot whatever the nargs, and a switch none, not even an empty one
    for extras, words in ((["--lr=3e-4", "5"], "--lr (after --) takes one value"),
                          (["--data-path=a", "b"], "--data-path (after --) takes one value"),
                          (["--bf16="], "--bf16 (after --) is a switch and takes no value, got --bf16="),
                          (["--bf16=true"], "--bf16 (after --) is a switch")):
        with pytest.raises(AdvisorError, match=re.escape(words)):
            check_values(CORE_19, extras)
    check_values(CORE_19, ["--lr=3e-4", "--data-path=a", "--train-iters=5"])
    # '--flag=' is the value '' and the words after it are extra: '--lr= 1' was read as '--lr 1' and
    # launched (a fuzzer); '' itself is refused where the flag's type refuses it, taken where a string
    with pytest.raises(AdvisorError, match=re.escape("--lr (after --) needs a value and --lr= gives it empty; --lr "
                                                     "(after --) takes one value, got '--lr= 1' (the extra '1' too)")):
        check_values(CORE_19, ["--lr=", "1"])
    with pytest.raises(AdvisorError, match=re.escape("got '--wandb-project= x' (the extra 'x' too)")):
        check_values(CORE_19, ["--wandb-project=", "x"])
    check_values(CORE_19, ["--wandb-project=", "--data-path="])  # Megatron's default project is ''


def test_every_release_the_launcher_knows_has_its_table():
    from launch.megatron_check import ParserFlags
    from launch.megatron_flags import table_source, value_types, values_taken

    for rules in VERSIONS:
        taken = values_taken(rules)
        assert taken["--train-iters"] == taken["--data-args-path"] == (1, 1), rules.name
        # nargs None takes one; switches none; nargs '*' (--data-path) any number
        assert taken["--lr"] == (1, 1) and taken["--bf16"] == taken["--no-load-optim"] == (0, 0)
        assert taken["--data-path"] == (0, None), rules.name
    # the committed file is the generator's output (no hand edits): with the real parsers' counts
    # (the next test) it is what regenerating would write
    table = ROOT / "advisor" / "megatron_flag_table.py"
    parsers = {rules.release: ParserFlags(counts=values_taken(rules), types=value_types(rules)) for rules in VERSIONS}
    assert table.read_text() == table_source(parsers, {rules.release: rules.checked for rules in VERSIONS})


@pytest.mark.parametrize("tag", ["core_v0.15.2", "core_v0.19.0"])
def test_the_table_is_what_the_releases_own_parser_says(tag):
    """The committed table against the checkout's parser (megatron_check --flags): the counts and
    the int and float types; on a mismatch, regenerate it (python -m launch.megatron_flags, see its
    docstring)."""
    from launch.megatron_check import parser_flags
    from launch.megatron_flags import value_types, values_taken
    from launch.megatron_versions import of_checkout

    release = real_checkout(tag)
    rules = of_checkout(release.path)
    read = parser_flags(release.path, python=release.python)
    assert values_taken(rules) == read.counts
    assert value_types(rules) == read.types


def test_megatron_itself_refuses_a_flag_without_its_value():
    """The premise, on the real core_v0.15.2: its argparse stops at --lr alone, or before a flag."""
    from launch.megatron_check import validate

    release = real_checkout("core_v0.15.2")
    results = validate(release.path, [{"args": ["--num-layers", "2", "--lr"], "world_size": 1},
                                      {"args": ["--lr", "--train-iters", "5"], "world_size": 1}],
                       python=release.python)
    for result in results:
        assert not result["ok"] and "argument --lr: expected one argument" in result["error"], result


def test_megatron_itself_refuses_more_values_than_a_flag_takes():
    """The premise of the 'takes one value' refusal, on the real core_v0.15.2: argparse leaves the
    extra word as an unrecognized argument and stops."""
    from launch.megatron_check import validate

    release = real_checkout("core_v0.15.2")
    results = validate(release.path, [{"args": ["--num-layers", "2", "--lr", "3e-4", "5"], "world_size": 1},
                                      {"args": ["--num-layers", "2", "--bf16", "true"], "world_size": 1}],
                       python=release.python)
    for result, extra in zip(results, ("5", "true")):
        assert not result["ok"] and "unrecognized arguments" in result["error"] and extra in result["error"], result


def test_megatron_itself_reads_an_empty_equals_value_as_the_empty_string():
    """The premise of the '--flag=' rules, on the real core_v0.15.2: '--lr=' is float(''), the word
    after '--wandb-project=' an unrecognized argument, '--wandb-project=' alone taken."""
    from launch.megatron_check import validate

    release = real_checkout("core_v0.15.2")
    base = ["--num-layers", "2"]
    results = validate(release.path, [{"args": [*base, "--lr=", "1"], "world_size": 1},
                                      {"args": [*base, "--wandb-project=", "x"], "world_size": 1},
                                      {"args": [*base, "--wandb-project="], "world_size": 1}],
                       python=release.python)
    assert not results[0]["ok"] and "invalid float value: ''" in results[0]["error"], results[0]
    assert not results[1]["ok"] and "unrecognized arguments: x" in results[1]["error"], results[1]
    assert "unrecognized" not in results[2].get("error", "") and "invalid" not in results[2].get("error", "")


# --- values of int and float flags --------------------------------------------------------------


def test_the_types_are_the_parsers_int_and_float():
    """Read by hand from core_v0.15.2's megatron/training/arguments.py (``type=`` of each
    add_argument) and core_v0.19.0's nargs=3 int --rampup-batch-size; Megatron's own converters
    (--window-size: tuple_type, --attention-backend: a lambda over AttnBackend) and type=bool
    (--onnx-safe) are not kept: only argparse's int and float are checked here."""
    from launch.megatron_flags import value_types

    for rules in VERSIONS:
        types = value_types(rules)
        assert types["--lr"] == types["--min-lr"] == types["--adam-eps"] == "float", rules.name
        assert types["--num-layers"] == types["--train-iters"] == types["--seed"] == "int", rules.name
        assert not {"--window-size", "--attention-backend", "--onnx-safe", "--tokenizer-type", "--bf16",
                    "--data-path"} & set(types), rules.name
    assert value_types(CORE_19)["--rampup-batch-size"] == "int" and "--rampup-batch-size" not in value_types(CORE_15)


def test_a_value_its_type_refuses_is_one_line_for_every_command(sweep, tmp_path):
    line = refused("torchrun", "--from", sweep, "--mock-data", "--dry-run", "--", "--lr", "abc")
    assert line.startswith("Error: --lr (after --) takes a float, got 'abc' (argparse's float('abc') fails)")
    assert "core 0.19's argument parser refuses that on every rank at start-up" in line
    # int() refuses what float() reads: a fraction and an exponent
    assert "--num-layers (after --) takes an int, got '1.5'" in refused(
        "args", "--from", sweep, "--megatron-version", "0.15", "--", "--num-layers", "1.5")
    assert "--train-iters (after --) takes an int, got 'x'" in refused("args", "--from", sweep, "--", "--train-iters",
                                                                       "x")
    assert "--train-iters (after --) takes an int, got '1e3'" in refused("args", "--from", sweep, "--",
                                                                         "--train-iters", "1e3")
    # the '=' form, and every such flag in the one line; sbatch writes no script
    script = tmp_path / "job.sh"
    line = refused("sbatch", "--from", sweep, "--mock-data", "--dry-run", "-o", script, "--", "--lr=3e-4x",
                   "--seed", "12.0")
    assert "--lr (after --) takes a float, got '3e-4x'" in line and "--seed (after --) takes an int, got '12.0'" in line
    assert not script.exists()
    for command, more in (("k8s", ["--image", "img"]), ("skypilot", ["--accelerator", "H100"])):
        output = tmp_path / f"{command}.yaml"
        assert "--lr (after --) takes a float, got 'abc'" in refused(
            command, "--from", sweep, *more, "--megatron-lm", "/workspace/Megatron-LM", "--mock-data", "-o", output,
            "--", "--lr", "abc")
        assert not output.exists()


def test_what_the_types_read_passes_unchanged(sweep):
    extras = ["--lr", "1e-4", "--min-lr=3e-5", "--seed", "1234", "--train-iters=20", "--adam-eps", "1e-8",
              "--clip-grad", "inf", "--lr-warmup-init", "-0", "--lr-warmup-iters", "+5", "--eval-iters", "1_000",
              "--window-size", "abc", "--wandb-project", "12.5"]
    for release in ("0.15", "0.19"):
        shown = launcher()("args", "--from", sweep, "--megatron-version", release, "--format", "json", "--", *extras)
        assert json.loads(shown.stdout)[-len(extras):] == extras


def test_the_type_check_reads_only_the_values_argparse_converts():
    # the extra word of '--lr 3e-4 5' is counted, not converted; nargs 3 and '+' convert each value
    with pytest.raises(AdvisorError) as refusal:
        check_values(CORE_19, ["--lr", "3e-4", "abc"])
    assert "takes a float" not in str(refusal.value) and "the extra 'abc' too" in str(refusal.value)
    with pytest.raises(AdvisorError, match=re.escape("--rampup-batch-size (after --) takes an int, got '16.5'")):
        check_values(CORE_19, ["--rampup-batch-size", "16", "16.5", "1000"])
    with pytest.raises(AdvisorError, match=re.escape("--profile-ranks (after --) takes an int, got 'a'")):
        check_values(CORE_15, ["--profile-ranks", "0", "a"])
    check_values(CORE_15, ["--rampup-batch-size", "16", "x"])  # core_v0.15.2: nargs '*', no type (str)


def test_megatron_itself_refuses_a_value_its_type_refuses():
    """The premise, on the real core_v0.15.2: argparse's own message for each refusal above, and
    none for the values that pass (validate_args may refuse those for other reasons)."""
    from launch.megatron_check import validate

    release = real_checkout("core_v0.15.2")
    base = ["--num-layers", "2"]
    results = validate(release.path, [{"args": [*base, "--lr", "abc"], "world_size": 1},
                                      {"args": ["--num-layers", "1.5"], "world_size": 1},
                                      {"args": [*base, "--train-iters", "1e3"], "world_size": 1},
                                      {"args": [*base, "--lr=3e-4x"], "world_size": 1},
                                      {"args": [*base, "--lr", "inf", "--seed", "1_234", "--train-iters", "+5"],
                                       "world_size": 1}],
                       python=release.python)
    for result, words in zip(results, ("invalid float value: 'abc'", "invalid int value: '1.5'",
                                       "invalid int value: '1e3'", "invalid float value: '3e-4x'")):
        assert not result["ok"] and words in result["error"], result
    assert "invalid" not in results[-1].get("error", ""), results[-1]


# --- a value that argparse reads as an option --------------------------------------------------


def _argparse_takes(word: str) -> bool:
    """Whether a parser built as Megatron's is (arguments.py: allow_abbrev=False, no option that
    looks like a negative number) takes ``word`` as the value of the flag before it."""
    import argparse
    import contextlib
    import io

    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--adam-eps")
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            return parser.parse_args(["--adam-eps", word]).adam_eps == word
        except SystemExit:
            return False


WORDS = ["-1", "-0.5", "-.5", "-0", "-12.25", "-", "-1e-8", "-1E5", "-1.", "-inf", "-1_000", "-x", "--", "1e-8"]


def test_the_words_read_as_options_are_argparses():
    """The rule (``launch.arguments.read_as_option``) against a real argparse parser, word by word;
    by hand from Python 3.11's Lib/argparse.py (``_negative_number_matcher``, ``_parse_optional``):
    only -N and -N.N / -.N shapes pass as negative numbers; '-' alone is a value."""
    import sys

    from launch.arguments import read_as_option

    for word in WORDS:
        if word != "--":  # '--' is argparse's own end of options, and a flag word here (is_flag: no)
            assert read_as_option(word) is not _argparse_takes(word), word
    if sys.version_info < (3, 14):  # 3.14 reads -1e-8 and -1_000 as numbers too
        assert {word for word in WORDS if _argparse_takes(word)} == {"-1", "-0.5", "-.5", "-0", "-12.25", "-", "1e-8"}


def test_a_negative_exponent_as_its_own_word_is_refused(sweep, tmp_path):
    line = refused("torchrun", "--from", sweep, "--mock-data", "--dry-run", "--", "--train-iters", "5",
                   "--adam-eps", "-1e-8")
    assert line.startswith("Error: --adam-eps (after --) is followed by '-1e-8', which Megatron's argparse reads as "
                           "an option, not as a value (write --adam-eps=-1e-8)")
    script = tmp_path / "job.sh"
    line = refused("sbatch", "--from", sweep, "--mock-data", "--dry-run", "-o", script, "--", "--lr", "-inf",
                   "--rampup-batch-size", "16", "-1e3", "1000")
    assert "--lr (after --) is followed by '-inf'" in line and "(write --lr=-inf)" in line
    assert "--rampup-batch-size (after --) is followed by '-1e3'" in line
    assert not script.exists()


def test_negative_numbers_argparse_reads_pass_unchanged(sweep):
    # --clip-grad -.5: Megatron clips only 'if clip_grad > 0.0' (optimizer.py); a negative --weight-decay
    # is refused instead (launch.job.check_rates: the scheduler asserts start_wd >= 0), as are a negative
    # --adam-eps and Adam betas (torch's AdamW refuses them); --lr-warmup-init is asserted only <= --lr
    extras = ["--clip-grad=-1e-8", "--lr-warmup-init", "-1", "--lr-warmup-init", "-0.5", "--clip-grad", "-.5",
              "--seed", "-0"]
    for release in ("0.15", "0.19"):
        shown = launcher()("args", "--from", sweep, "--megatron-version", release, "--format", "json", "--", *extras)
        assert json.loads(shown.stdout)[-len(extras):] == extras


def test_megatron_itself_refuses_a_negative_exponent_as_its_own_word():
    """The premise, on the real core_v0.15.2: '--adam-eps -1e-8' stops its argparse; the '=' form
    and -1, -0.5 pass it."""
    from launch.megatron_check import validate

    release = real_checkout("core_v0.15.2")
    base = ["--num-layers", "2"]
    results = validate(release.path, [{"args": [*base, "--adam-eps", "-1e-8"], "world_size": 1},
                                      {"args": [*base, "--adam-eps=-1e-8", "--lr", "-1", "--min-lr", "-0.5"],
                                       "world_size": 1}],
                       python=release.python)
    assert not results[0]["ok"] and "argument --adam-eps: expected one argument" in results[0]["error"], results[0]
    error = results[1].get("error", "")
    assert not any(words in error for words in ("expected one argument", "invalid", "unrecognized")), results[1]


# --- words before the first flag ------------------------------------------------------------------


@pytest.mark.parametrize("words,message", [
    (["x", "--lr", "3e-4"], "Error: 'x' (after --) is no flag nor a flag's value: pretrain_gpt.py takes no positional"),
    (["", "--lr", "3e-4"], "Error: '' (after --) is no flag nor a flag's value"),
    (["\u2014lr", "3e-4"], "Error: '\u2014lr' '3e-4' (after --) is no flag nor a flag's value"),  # an em dash, pasted
    (["--", "--lr", "3e-4"], "Error: '--' (after --): a second '--' ends Megatron's options"),
    (["--"], "Error: '--' (after --): a second '--' ends Megatron's options"),
], ids=["word", "empty", "em dash", "second --", "lone second --"])
def test_words_before_the_first_flag_are_refused(sweep, words, message):
    """A fuzzer's find: parse_flags drops the words before the first flag, so they were launched
    without a word, and every rank's argparse refused them ("unrecognized arguments")."""
    line = refused("args", "--from", sweep, "--megatron-version", "0.15", "--", *words)
    assert line.startswith(message) and "core 0.15's argument parser refuses that on every rank" in line


def test_an_option_before_the_first_flag_is_left_to_megatron(sweep):
    """'-x' reads as an option, as an unknown flag does: a checkout may add it."""
    printed = launcher()("args", "--from", sweep, "--megatron-version", "0.15", "--", "-x", "--lr", "3e-4")
    assert printed.stdout.rstrip().endswith("-x --lr 3e-4")


def test_megatron_itself_refuses_words_before_the_first_flag():
    """The premise, on the real core_v0.15.2: a word its parser has no flag for, and a second
    '--', with or without flags after it, stop its argparse."""
    from launch.megatron_check import validate

    release = real_checkout("core_v0.15.2")
    base = ["--num-layers", "2"]
    results = validate(release.path, [{"args": ["x", *base], "world_size": 1},
                                      {"args": [*base, "--"], "world_size": 1},
                                      {"args": ["--", *base], "world_size": 1}],
                       python=release.python)
    for result in results:
        assert not result["ok"] and "unrecognized arguments" in result["error"], result
