"""What each option's --help says, for a Megatron-LM user reading 'advisor <command> --help' or
'advisor-launch <command> --help': the Megatron flag an option stands for, its unit and default,
words that fit the command showing them, and no internal names."""

from __future__ import annotations

import json
import re

import click
import pytest

from advisor.cli import cli
from tests.test_help_sections import _command as command_at

OVERRIDES = ("--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--num-query-groups",
             "--vocab-size")
MODEL_PAGES = [("sweep",), ("estimate",), ("recommend",), ("profile", "plan"), ("report", "estimate")]


def option_help(group: click.Group, path: tuple[str, ...], name: str) -> str | None:
    """The help text of option ``name`` on the page of ``path``, on one line; None where the page
    does not show it."""
    command, ctx = command_at(group, path)
    for param in command.get_params(ctx):
        if name in (*param.opts, *getattr(param, "secondary_opts", ())):
            record = param.get_help_record(ctx)
            return None if record is None else " ".join(record[1].split())
    raise AssertionError(f"{' '.join(path)} has no {name}")


@pytest.mark.parametrize("path", MODEL_PAGES, ids=" ".join)
@pytest.mark.parametrize("name", OVERRIDES)
def test_each_model_override_names_its_megatron_flag_and_default(path, name):
    text = option_help(cli, path, name)
    assert f"Megatron's {name}:" in text and "Default: the --model's" in text


@pytest.mark.parametrize("path", MODEL_PAGES, ids=" ".join)
def test_untie_names_megatrons_flag_and_the_default(path):
    text = option_help(cli, path, "--untie-embeddings")
    assert "--untie-embeddings-and-output-weights" in text and "Default: the --model's" in text


@pytest.mark.parametrize("path", MODEL_PAGES, ids=" ".join)
def test_seq_len_says_its_unit_and_megatrons_flag(path):
    text = option_help(cli, path, "--seq-len")
    assert text.startswith("Tokens per training sequence") and "Megatron's --seq-length" in text
    assert "[default: 8192]" in text


def test_the_launchers_exit_statuses_are_said_in_full():
    """advisor-launch's epilog (every page of it) says each status it exits with: 2 for bad input
    or a failed check, 0 where it runs nothing, and the status of what it ran, a signal's death as a
    shell reports it (launch.process.exit_status)."""
    from click.testing import CliRunner

    from launch.cli import cli as launch_cli

    for path in ((), ("torchrun",), ("k8s",)):
        text = " ".join(CliRunner().invoke(launch_cli, [*path, "--help"]).stdout.split())
        assert "Exit status: 2 for bad input or a failed check" in text
        assert "0 where nothing is run (args, check, k8s, skypilot, a dry run)" in text
        assert "the status of the torchrun or sbatch it ran (128 + N where signal N killed it; Ctrl-C before: 130)" in text


def every_page(group: click.Group, path: tuple[str, ...] = ()):
    """(path, --help text on one line) of ``group`` and of every command under it."""
    from click.testing import CliRunner

    result = CliRunner().invoke(group, [*path, "--help"], terminal_width=100, catch_exceptions=False)
    yield path, " ".join(result.stdout.split())
    command, ctx = command_at(group, path)
    for name in getattr(command, "list_commands", lambda _: [])(ctx):
        yield from every_page(group, (*path, name))


def test_no_page_speaks_in_the_projects_own_names():
    """No 'seed 000' or 'seed-004' (the project's names for the papers it implements) and no source
    file of the advisor's to read: each page says what the thing is."""
    from launch.cli import cli as launch_cli

    pages = [*every_page(cli), *every_page(launch_cli)]
    assert len(pages) > 20
    for path, text in pages:
        assert not re.search(r"seed[ -]\d", text, re.I), (path, re.search(r".{40}seed[ -]\d.{40}", text, re.I))
        assert not re.search(r"\b(advisor|megatron_hooks|launch)/[\w/]*\.py", text), path


def test_the_job_config_help_names_every_key_a_job_file_takes():
    from launch.cli import cli as launch_cli
    from launch.job import JOB_KEYS

    text = option_help(launch_cli, ("check",), "--job-config")
    assert all(re.search(rf"(?<![\w-]){key}(?![\w-])", text) for key in JOB_KEYS)
    assert "TOML if named .toml, else JSON" in text


def test_numbers_show_what_they_count_and_releases_show_release():
    """A number's metavar is N, GIB, FRACTION, ... as the docs write them ('--gpus N --mem GIB'),
    never click's INTEGER or FLOAT; every --megatron-version, the advisor's and the launcher's, is
    a RELEASE."""
    from launch.cli import cli as launch_cli

    releases, pages = 0, {}
    for group in (cli, launch_cli):
        for path, text in every_page(group):
            pages[group is cli, path] = text
            assert not re.search(r"\b(INTEGER|FLOAT)\b", text), (path, re.findall(r"\S+ (?:INTEGER|FLOAT)", text))
            command, ctx = command_at(group, path)
            for param in command.get_params(ctx):
                if "--megatron-version" in param.opts:
                    releases += 1
                    assert param.get_help_record(ctx)[0] == "--megatron-version RELEASE", path
    assert releases >= 10
    assert "--gpus N " in pages[True, ("sweep",)] and "--mem GIB " in pages[True, ("sweep",)]


ON_UNLIKE_MEGATRON = {"--distributed-optimizer": "--use-distributed-optimizer",
                      "--sequence-parallel": "--sequence-parallel", "--overlap-grad-reduce": "--overlap-grad-reduce",
                      "--overlap-param-gather": "--overlap-param-gather"}
"""The advisor's switches on by default whose Megatron flags are off by default (core_v0.15.2 and
core_v0.19.0 arguments.py: store_true), and those flags."""


@pytest.mark.parametrize("path", [("sweep",), ("estimate",), ("recommend",)], ids=" ".join)
def test_switches_on_here_and_off_in_megatron_say_so(path):
    """A user who copies the advisor's flags gets these; one who writes their own command must add
    them: each help says the advisor's default, Megatron's, and the flag the advisor writes, which
    an estimate's megatron_args do carry."""
    from click.testing import CliRunner

    for name, flag in ON_UNLIKE_MEGATRON.items():
        text = option_help(cli, path, name)
        assert "off in Megatron: the flags the advisor writes" in text and "carry it" in text, (name, text)
        assert flag == name or flag in text, (name, text)  # its own name where it is Megatron's
    done = CliRunner().invoke(cli, ["estimate", "--tp", "2", "--gpus", "8", "--format", "json"])
    assert set(ON_UNLIKE_MEGATRON.values()) <= set(json.loads(done.stdout)["megatron_args"])


def test_profile_plans_switches_say_megatrons_default():
    for name, flag in (("--distributed-optimizer", "--use-distributed-optimizer"),
                       ("--sequence-parallel", "--sequence-parallel")):
        text = option_help(cli, ("profile", "plan"), name)
        assert "off in Megatron: the flags the advisor writes carry it" in text and flag in text


@pytest.mark.parametrize("path,words", [
    (("sweep",), "TP is searched up to it"), (("recommend",), "TP stays within it"),
    (("estimate",), "a TP larger than it is priced over the network"),
    (("compare-log",), "a TP larger than it is priced over the network"),
], ids=lambda value: " ".join(value) if isinstance(value, tuple) else "")
def test_gpus_per_node_says_what_this_command_does_with_it(path, words):
    """One help shared by four commands said 'sweep and recommend keep TP within it; advisor
    estimate prices a larger TP over the network' in each of them."""
    text = option_help(cli, path, "--gpus-per-node")
    assert text.startswith(f"GPUs per node, the NVLink domain: {words}") and "Default: --gpu's, else 8" in text
    assert not re.search(r"\b(sweep|recommend|advisor estimate)\b", text)


def test_expert_degrees_and_offload_read_right_in_each_command():
    """'sweep: only this EP' in advisor estimate --help, where nothing is swept; the offload
    fraction's '(or, in a sweep, ... --sharding auto ...)' where there is no --sharding."""
    for name in ("--ep", "--etp"):
        assert option_help(cli, ("sweep",), name).startswith("Sweep only this expert")
        assert "sweep" not in option_help(cli, ("estimate",), name).lower()
    assert "--sharding auto" in option_help(cli, ("sweep",), "--optimizer-offload-fraction")
    for path in (("estimate",), ("recommend",)):
        assert option_help(cli, path, "--optimizer-offload-fraction").startswith(
            "With --optimizer-cpu-offload: the share of the optimizer offloaded.")


def test_torch_fsdp2_is_on_the_page_of_the_one_command_that_prices_it():
    """sweep and recommend refuse --use-torch-fsdp2 (PP 1 only, no escalation step): their --help
    no longer lists it, and giving it still says where it is priced."""
    from click.testing import CliRunner

    assert "PP 1" in option_help(cli, ("estimate",), "--use-torch-fsdp2")
    assert option_help(cli, ("report", "estimate"), "--use-torch-fsdp2") is not None
    for path, args in ((("sweep",), ["--gpus", "8", "--mem", "80"]), (("recommend",), ["--gpus", "8", "--pp", "2"]),
                       (("report", "sweep"), ["--gpus", "8", "--mem", "80", "-o", "r.html"])):
        assert option_help(cli, path, "--use-torch-fsdp2") is None
        assert "--use-torch-fsdp2" not in CliRunner().invoke(cli, [*path, "--help"]).stdout
        refused = CliRunner().invoke(cli, [*path, *args, "--use-torch-fsdp2"])
        assert refused.exit_code == 2 and "price a layout with advisor estimate --use-torch-fsdp2" in refused.stderr


@pytest.mark.parametrize("command,document,start,extra", [
    ("k8s", "the PyTorchJob manifest", "kubectl apply -f FILE", ["--image", "ghcr.io/me/megatron:1"]),
    ("skypilot", "the task YAML", "sky launch FILE", []),
])
def test_a_manifests_dry_run_says_what_it_prints_and_that_nothing_is_submitted(tmp_path, command, document, start,
                                                                                 extra):
    """'Print it (the default without -o; nothing is submitted)': which 'it', and as if a run
    without --dry-run submitted something. It prints the document even where -o writes it."""
    from click.testing import CliRunner

    from launch.cli import cli as launch_cli

    text = option_help(launch_cli, (command,), "--dry-run")
    assert text.startswith(f"Print {document} on stdout even with -o, which still writes it")
    assert f"Nothing is submitted, dry run or not: {start} does that." in text
    source, written = tmp_path / "estimate.json", tmp_path / "job.yaml"
    CliRunner().invoke(cli, ["estimate", "--tp", "2", "--gpus", "8", "--format", "json", "-o", str(source)],
                       catch_exceptions=False)
    done = CliRunner().invoke(launch_cli, [command, "--from", str(source), "--megatron-lm", "/w/Megatron-LM", *extra,
                                           "-o", str(written), "--dry-run"], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    assert done.stdout == written.read_text() and done.stdout


def test_profile_plans_gpus_per_node_says_what_it_is_and_its_launch_flag():
    text = option_help(cli, ("profile", "plan"), "--gpus-per-node")
    assert text.startswith("GPUs per node, K: the DP and TP runs' sub-meshes")
    assert "torchrun --nproc-per-node" in text and "[default: 8]" in text
