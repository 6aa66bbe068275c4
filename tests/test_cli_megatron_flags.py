"""Every Megatron-LM flag that the CLI's messages and help name exists: each '--flag' written in
advisor/cli/*.py is an option of the advisor's (or advisor-launch's) own, or a flag of Megatron-LM
core_v0.15.2 (tables/data/megatron_lm_core_v0.15.2_flags.txt, from its megatron/training/arguments.py).
An error said "--vpp N (Megatron's --virtual-pipeline-model-parallel-size)": no release has that flag,
it is the args attribute that --num-virtual-stages-per-pipeline-rank sets."""

import re

import click
from conftest import ROOT

from advisor.cli import COMMANDS, cli
from advisor.cli.runners import cpu_runner, megatron_runner
from advisor.megatron_flag_table import FLAGS
from advisor.megatron_layout import release_flags
from launch.cli import cli as launch_cli

# every release's flags (a flag core_v0.19.0 added, --step-batch-size-schedule, is Megatron's too)
MEGATRON = {flag.split("=")[0] for flag in
            (ROOT / "tables" / "data" / "megatron_lm_core_v0.15.2_flags.txt").read_text().split()} | {
    flag for release in FLAGS for flag in release_flags(release)}
NOT_MEGATRON = {
    "--help": "click's",
    "--fp8": "named to say it is not a Megatron-LM flag (MEGATRON_LOOKALIKES)",
    "--json": "other tools' spelling of --format json (SPELLED_OTHERWISE)",
}


def _options(command: click.Command) -> set[str]:
    names = {name for param in command.params for name in (*param.opts, *getattr(param, "secondary_opts", ()))}
    for sub in getattr(command, "commands", {}).values():
        names |= _options(sub)
    return names


def test_every_flag_named_is_ours_or_megatrons():
    ctx = click.Context(cli)
    ours = set().union(*(_options(cli.get_command(ctx, name)) for name in COMMANDS), _options(launch_cli),
                       _options(cpu_runner(lambda **_: 0)), _options(megatron_runner(lambda **_: 0)))
    unknown = {}
    for path in sorted((ROOT / "advisor" / "cli").glob("*.py")):
        for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9]", path.read_text()):
            if flag not in ours | MEGATRON | NOT_MEGATRON.keys():
                unknown.setdefault(flag, path.name)
    assert unknown == {}


def test_megatron_has_the_vpp_flag_named():
    """The flag list holds the flag the lookalike advice names, not the attribute it sets."""
    assert "--num-virtual-stages-per-pipeline-rank" in MEGATRON
    assert "--virtual-pipeline-model-parallel-size" not in MEGATRON
