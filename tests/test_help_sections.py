"""--help in titled sections (``advisor.cli.help_sections``): the long pages (sweep 443 lines,
estimate 387, recommend 306 at 80 columns, one flat list of about 90 options) list their options
by topic, the essentials (--model, --gpus, --mem, --tp, ...) before the ~60 memory, time and MoE
levers; nothing is lost, and the layout is click's own, option for option."""

from __future__ import annotations

import re

import click
import pytest
from click.testing import CliRunner

from advisor.cli import cli
from advisor.cli.help_sections import ADVISOR_SECTIONS, OTHER, sectioned
from launch.cli import LAUNCH_SECTIONS
from launch.cli import cli as launch_cli

ADVISOR_PAGES = [("sweep",), ("estimate",), ("recommend",), ("report", "sweep"), ("report", "estimate"),
                 ("report", "recommend")]
LAUNCH_PAGES = [("torchrun",), ("sbatch",), ("check",), ("k8s",), ("skypilot",), ("args",)]
PAGES = [(cli, path) for path in ADVISOR_PAGES] + [(launch_cli, path) for path in LAUNCH_PAGES]
IDS = [" ".join(path) for _, path in PAGES]

LEVERS = ("--distributed-optimizer", "--use-megatron-fsdp", "--recompute", "--fp8-format", "--grad-dtype",
          "--optimizer-cpu-offload", "--overlap-grad-reduce", "--tp-comm-overlap")
"""The levers a newcomer need not read first."""


def _help(group: click.Group, path: tuple[str, ...], width: int = 80) -> str:
    result = CliRunner().invoke(group, [*path, "--help"], terminal_width=width, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def _command(group: click.Group, path: tuple[str, ...]) -> tuple[click.Command, click.Context]:
    # the group's settings, as click's make_context applies them: a context without its -h would
    # build (and cache on the shared command) a help option without -h for every later page
    ctx = click.Context(group, info_name="advisor", **group.context_settings)
    command = group
    for name in path:
        command = command.get_command(ctx, name)
        ctx = click.Context(command, info_name=name, parent=ctx)
    return command, ctx


def _sections(text: str) -> dict[str, list[str]]:
    """The option lines of each section of a --help page ('Title:' at the margin, then indented)."""
    options = text[text.index("\n\n", text.index("Usage:")):]  # after the usage line
    sections: dict[str, list[str]] = {}
    current = None
    for line in options.splitlines():
        if re.fullmatch(r"[A-Z][\w -]*:", line):
            current = sections.setdefault(line[:-1], [])
        elif current is not None and line.strip():
            current.append(line)
        else:  # a section ends at a blank line (then the epilog, indented too, or the next title)
            current = None
    return sections


def _names(lines: list[str]) -> list[str]:
    """The option names on a section's lines: those of its names column ('  --tp, --tensor-... N')."""
    return [name for line in lines if line.startswith("  -")
            for name in re.findall(r"(?<![\w-])--?[a-z][\w-]*", re.split(r"\s{2,}", line.strip())[0])]


@pytest.mark.parametrize("group, path", PAGES, ids=IDS)
def test_every_section_is_titled_in_order_and_other_is_last(group, path):
    titles = [title for title, _ in (ADVISOR_SECTIONS if group is cli else LAUNCH_SECTIONS)]
    shown = list(_sections(_help(group, path)))
    assert shown[-1] == OTHER and "Options" not in shown
    assert shown[:-1] == [title for title in titles if title in shown]  # the order of the one mapping


@pytest.mark.parametrize("path", [("sweep",), ("estimate",), ("recommend",)], ids=" ".join)
def test_the_essentials_come_first_and_the_levers_after(path):
    sections = _sections(_help(cli, path))
    titles = list(sections)
    assert titles[:3] == ["Model and run", "Cluster", "Layout"]
    assert {"--model", "--seq-len", "--gbs"} <= set(_names(sections["Model and run"]))
    assert {"--gpus", "--gpu", "--mem", "--gpus-per-node"} == set(_names(sections["Cluster"]))
    assert {"--tp", "--cp", "--pp", "--mbs"} <= set(_names(sections["Layout"]))
    assert {"--format", "-o", "--output"} <= set(_names(sections["Output"]))
    names = [name for lines in sections.values() for name in _names(lines)]
    first_lever = min(names.index(lever) for lever in LEVERS)
    for essential in ("--model", "--gpus", "--gpu", "--mem", "--tp", "--pp", "--mbs"):
        assert names.index(essential) < first_lever, essential
    assert titles.index("Memory and precision levers") > titles.index("Layout")


@pytest.mark.parametrize("group, path", PAGES, ids=IDS)
def test_no_option_is_lost_nor_shown_twice(group, path):
    command, ctx = _command(group, path)
    options = [param for param in command.get_params(ctx) if isinstance(param, click.Option) and not param.hidden]
    declared = {name for param in options for name in (*param.opts, *param.secondary_opts)}
    sections = _sections(_help(group, path))
    shown = [name for lines in sections.values() for name in _names(lines)]
    assert len(shown) == len(set(shown)) and set(shown) <= declared
    # a Megatron spelling too long for the names column is named in the help text instead (SpelledOption)
    spellings = {name for param in options for name in getattr(param, "megatron", ())}
    text = " ".join(" ".join(line for lines in sections.values() for line in lines).split())
    for name in declared - set(shown):
        assert name in spellings and re.search(rf"(?<![\w-]){name}(?![\w-])", text), name


@pytest.mark.parametrize("group, path", PAGES, ids=IDS)
def test_the_options_read_as_click_lays_them_out_flat(group, path):
    """Only the headings change: every option's lines (names, help text, defaults, wrapping and the
    one names column) are those of click's own single "Options" list at the same width."""
    command, ctx = _command(group, path)
    formatter = click.HelpFormatter(width=80)
    click.Command.format_options(command, ctx, formatter)
    flat = [line for line in formatter.getvalue().splitlines()[1:] if line.strip()]
    sectioned_lines = [line for lines in _sections(_help(group, path)).values() for line in lines]
    assert sorted(sectioned_lines) == sorted(flat)


@pytest.mark.parametrize("width", [80, 100])
@pytest.mark.parametrize("group, path", PAGES, ids=IDS)
def test_a_sectioned_page_fits_its_columns(group, path, width):
    text = _help(group, path, width)
    assert max(map(len, text.splitlines())) <= width, [line for line in text.splitlines() if len(line) > width]


@pytest.mark.parametrize("path", [("sweep",), ("estimate",), ("recommend",)], ids=" ".join)
def test_only_the_release_and_help_are_other(path):
    """A new option joins a section in ADVISOR_SECTIONS, not the tail of the page."""
    assert _names(_sections(_help(cli, path))[OTHER]) == ["--megatron-version", "-h", "--help"]


@pytest.mark.parametrize("path", [("models",), ("gpus",), ("profile", "show"), ("profile", "plan")], ids=" ".join)
def test_a_short_page_stays_one_list(path):
    assert list(_sections(_help(cli, path))) == ["Options"]


def test_sections_keep_their_order_and_the_rest_keeps_the_commands():
    records = [(name, (f"--{name}", "")) for name in ("zeta", "b", "a", "extra", "c", "help")]
    grouped = sectioned(records, (("First", ("a", "b")), ("Empty", ("none",)), ("Second", ("c",))))
    assert [(title, [first for first, _ in rows]) for title, rows in grouped] == [
        ("First", ["--a", "--b"]), ("Second", ["--c"]), (OTHER, ["--zeta", "--extra", "--help"])]
