"""What ``advisor-launch check`` and the launches do with the user's own arguments after '--':
a flag the release's parser lacks, and a NullTokenizer vocabulary of the user's own.

A misspelt flag (``--lr-warmup-itres``) made check print a warning and then "ok", exit 0, though
pretrain_gpt.py refuses it on every rank at start-up; with another problem the warning was not
printed at all. A ``--mock-data --tokenizer-type NullTokenizer --vocab-size 1000`` of the user's
own was accepted (core_v0.15.2's mock data draws token ids up to 4094: the first step fails), and
``--vocab-size 151936`` on core 0.15 built 151,937 rows where 151,936 were priced, silently."""

import re
import shutil

import pytest
from launch_support import launcher, write_json
from megatron_real import checkout as real_checkout

from launch.megatron_flags import values_taken
from launch.megatron_versions import named

JOB = ["--lr", "1e-4", "--train-iters", "5"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Estimates with the advisor's own command: Llama 3.1 8B at TP 2 (v 128,256) and Qwen3 30B-A3B
    at TP 1, EP 8 (v 151,936), each on 8 GPUs of one node (torchrun needs no rendezvous)."""
    from conftest import Invoker

    root, advisor = tmp_path_factory.mktemp("inputs"), Invoker()
    llama = advisor.json("estimate", "--model", "llama3.1-8b", "--tp", 2, "--gpus", 8, "--gpu", "h100-80gb")
    qwen = advisor.json("estimate", "--model", "qwen3-30b-a3b", "--ep", 8, "--gpus", 8, "--gpu", "h100-80gb")
    return write_json(root / "llama.json", llama), write_json(root / "qwen.json", qwen)


def errors(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("Error: ")]


# --- a flag the release's parser lacks ------------------------------------------------------------


def test_check_counts_a_misspelt_flag_as_a_problem_with_the_others(inputs):
    core15 = real_checkout("core_v0.15.2").path
    check = ["check", "--from", inputs[0], "--megatron-lm", core15, "--no-gpus-here", "--mock-data", "--"]
    result = launcher()(*check, *JOB, "--lr-warmup-itres", "5", expect=2)
    assert result.stdout == "" and "Traceback" not in result.output  # no "advisor-launch check: ok"
    [line] = errors(result)
    assert line.startswith("Error: --lr-warmup-itres (after --) is not a flag of Megatron-LM core 0.15's argument "
                           "parser (did you mean --lr-warmup-iters"), line
    assert "no Python file of the checkout spells --lr-warmup-itres" in line
    # with another problem (no --train-iters: the job has no length), every one is listed
    result = launcher()(*check, "--lr", "1e-4", "--train-itres", "5", "--lr-warmup-itres", "5", expect=2)
    lines = errors(result)
    assert len(lines) == 3, result.stderr
    assert lines[0].startswith("Error: --train-itres (after --) is not a flag") and "--train-iters?" in lines[0]
    assert lines[1].startswith("Error: --lr-warmup-itres (after --) is not a flag")
    assert lines[2].startswith("Error: the job is incomplete: it lacks the run's length")
    # a launch keeps it a warning (a dry run prints the command; exit 0)
    dry = launcher()("torchrun", "--from", inputs[0], "--megatron-lm", core15, "--mock-data", "--dry-run", "--", *JOB,
                     "--lr-warmup-itres", "5")
    assert "warning: --lr-warmup-itres (after --) is not a flag of Megatron-LM core 0.15's" in dry.stderr
    assert "unless your checkout adds it" in dry.stderr and "--lr-warmup-itres 5" in dry.stdout


@pytest.mark.parametrize("tag", ["core_v0.15.2", "core_v0.19.0"])
def test_the_flags_pretrain_gpt_adds_are_known(tag):
    """Both releases' pretrain_gpt.py pass ModelOpt's add_modelopt_args as extra_args_provider, which
    Megatron's parse_args adds after its own (read from the checkout's source, not the table)."""
    path = real_checkout(tag).path if tag == "core_v0.15.2" else _source_only(tag)
    assert "extra_args_provider=add_modelopt_args if has_nvidia_modelopt else None" in (
        path / "pretrain_gpt.py").read_text()
    added = set(re.findall(r"""['"](--[a-z0-9-]+)['"]""", (path / "megatron/post_training/arguments.py").read_text()))
    assert {"--export-kd-cfg", "--export-quant-cfg", "--modelopt-enabled"} <= added
    rules = named(tag.removeprefix("core_v").rpartition(".")[0])
    assert added - set(values_taken(rules)) == set()


def _source_only(tag: str):
    """A checkout read as source only (core_v0.19.0's Python 3.12 is not needed to read it)."""
    from megatron_real import SHARED

    if not (SHARED / tag / "pretrain_gpt.py").is_file():
        pytest.skip(f"no Megatron-LM checkout {tag} at {SHARED}")
    return SHARED / tag


def test_a_modelopt_flag_passes_check_and_a_flag_the_checkout_spells_is_a_warning(inputs, tmp_path):
    core15 = real_checkout("core_v0.15.2").path
    ok = launcher()("check", "--from", inputs[0], "--megatron-lm", core15, "--no-gpus-here", "--mock-data", "--",
                    *JOB, "--export-kd-cfg", "kd.yaml")
    assert ok.stdout.startswith("advisor-launch check: ok") and "not a flag" not in ok.stderr
    # ModelOpt's knowledge distillation (a teacher model beside the student): run, and named as unpriced
    assert "which the launch runs: --export-kd-cfg (not known to the advisor)" in ok.stderr
    dry = launcher()("torchrun", "--from", inputs[0], "--megatron-version", "0.19", "--mock-data", "--dry-run", "--",
                     *JOB, "--export-kd-cfg", "kd.yaml")
    assert "not a flag" not in dry.stderr
    # a checkout of one's own whose pretrain_gpt.py adds a flag: check cannot run it, so it warns
    fork = tmp_path / "fork"
    shutil.copytree(core15, fork)
    (fork / "my_args.py").write_text("def add_my_args(parser):\n    parser.add_argument('--my-flag', type=int)\n"
                                     "    return parser\n")
    check = ["check", "--from", inputs[0], "--megatron-lm", fork, "--no-gpus-here", "--mock-data", "--", *JOB]
    warned = launcher()(*check, "--my-flag", "3")
    assert warned.stdout.startswith("advisor-launch check: ok")
    assert ("warning: --my-flag (after --) is not a flag of Megatron-LM core 0.15's argument parser: pretrain_gpt.py "
            "refuses it on every rank at start-up, unless your checkout adds it (my_args.py spells --my-flag)"
            ) in warned.stderr
    [line] = errors(launcher()(*check, "--my-flagg", "3", expect=2))
    assert "--my-flagg (after --) is not a flag" in line and "(did you mean" not in line


# --- the user's own NullTokenizer vocabulary ------------------------------------------------------


def test_a_null_tokenizer_vocabulary_the_mock_data_cannot_feed_is_refused(inputs):
    core15 = real_checkout("core_v0.15.2").path
    own = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "1000", *JOB]
    for command in (["check", "--no-gpus-here"], ["torchrun", "--dry-run"]):
        line = launcher().error(command[0], "--from", inputs[0], "--megatron-lm", core15, *command[1:], "--", *own)
        # 1000 + the end-of-document token, padded to a multiple of TP 2 (x --make-vocab-size-divisible-by 1)
        assert ("--tokenizer-type NullTokenizer --vocab-size 1000 (after --) builds 1,002 embedding rows on "
                "Megatron-LM core 0.15 (1,000 + its NullTokenizer's end-of-document token, padded to a multiple of "
                "2), where the estimate") in line, line
        assert "priced 128,256 (v 128,256), and its --mock-data feeds token ids up to 4094" in line
        assert "give --vocab-size 128255, which builds the priced rows on that release" in line


def _warning(result) -> str:
    [line] = [line for line in result.stderr.splitlines() if "embedding rows" in line]
    return line


def test_a_null_tokenizer_vocabulary_other_than_the_priced_one_is_named_and_refused_where_it_cannot_run(
        inputs, tmp_path):
    """A NullTokenizer --vocab-size of the user's own that builds other rows than were priced runs
    (a few rows, or the user's choice of vocabulary): a warning naming the --vocab-size that builds
    the priced rows. Refused, one line, where the release's mock data cannot feed it (core 0.15's
    token ids up to 4094): the run would fail at its first iteration."""
    core15 = real_checkout("core_v0.15.2").path
    check = ["check", "--from", inputs[1], "--megatron-lm", core15, "--no-gpus-here", "--"]
    own = ["--mock-data", "--tokenizer-type", "NullTokenizer"]
    result = launcher()(*check, *own, "--vocab-size", "151936", *JOB)
    line = _warning(result)
    assert line.startswith("warning: --tokenizer-type NullTokenizer --vocab-size 151936 (after --) builds 151,937 "
                           "embedding rows on Megatron-LM core 0.15 (151,936 + its NullTokenizer's end-of-document "
                           "token), where the estimate"), line
    assert "priced 151,936 (v 151,936): give --vocab-size 151935" in line and "4094" not in line
    assert result.stdout.startswith("advisor-launch check: ok")
    assert "embedding rows" not in launcher()(*check, *own, "--vocab-size=151935", *JOB).stderr
    line = launcher().error(*check, *own, "--vocab-size", "1000", *JOB)  # mock data's ids up to 4094
    assert line.startswith("Error: --tokenizer-type NullTokenizer --vocab-size 1000") and "ids up to 4094" in line
    # core 0.19's NullTokenizer has --vocab-size rows: the other way round
    dry = ["torchrun", "--from", inputs[1], "--megatron-version", "0.19", "--dry-run", "--"]
    assert "embedding rows" not in launcher()(*dry, *own, "--vocab-size", "151936", *JOB).stderr
    line = _warning(launcher()(*dry, *own, "--vocab-size", "151935", *JOB))
    assert "builds 151,935 embedding rows on Megatron-LM core 0.19 (151,935 as given)" in line
    assert "give --vocab-size 151936" in line
    # on the user's own data too (rows are the tokenizer's, whatever the data); no --mock-data to suggest
    for suffix in (".bin", ".idx"):
        (tmp_path / f"text{suffix}").touch()
    line = _warning(launcher()(*dry, "--data-path", tmp_path / "text", "--tokenizer-type", "NullTokenizer",
                               "--vocab-size", "1000", *JOB))
    assert line.endswith("give --vocab-size 151936, which builds the priced rows on that release"), line


def test_a_flag_built_from_a_dataclass_field_counts_as_spelled():
    """core_v0.19.0 builds most flags from dataclass fields (ArgumentGroupFactory): no file spells
    '--moe-router-fusion' as a string, its TransformerConfig field 'moe_router_fusion: bool' is what
    a patch release's new flag would look like, so check warns of it rather than refusing it."""
    from launch.checkout import spelled_in
    from megatron_real import SHARED

    core19 = SHARED / "core_v0.19.0"  # read as text: no interpreter needed
    if not (core19 / "pretrain_gpt.py").is_file():
        pytest.skip(f"no Megatron-LM checkout core_v0.19.0 at {core19}")
    assert spelled_in(core19, ["--moe-router-fusion", "--no-such-flagz"]) == {
        "--moe-router-fusion": "megatron/core/transformer/transformer_config.py"}
