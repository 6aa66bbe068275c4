"""Issue 24: every table the CLI prints fits $COLUMNS (100 when unset), --wide shows the rest;
and the small fixes of the same item (profile show of a campaign, coordinates, the split hint)."""

import re

import pytest
from conftest import ROOT
from table_text import BORDER, read_table
from terminal import on_a_terminal

HELDOUT = ROOT / "tables" / "data" / "capture" / "heldout-pp2"
RUN = ROOT / "examples" / "launch" / "profiles" / "pp-b1-2,2,2,2"
COMMANDS = [
    ["sweep", "--gpus", 64, "--mem", 40, "--top", 3],
    ["sweep", "--gpus", 8, "--gpu", "h100-80gb", "--top", 5, "--tokens", "15T"],
    ["sweep", "--gpus", 64, "--gpu", "a100-80gb", "--model", "llama3.1-70b", "--top", 5, "--memory-model", "paper"],
    ["gpus"],
    ["models"],
    ["estimate", "--gpus", 8, "--tp", 2, "--gpu", "h100-80gb", "--tokens", "15T"],
    ["profile", "show", RUN],
    ["profile", "show", HELDOUT, "--section", "ranks"],
    ["profile", "plan", "--gpus", 16, "--gpus-per-node", 4, "--mbs", 8],
    ["recommend", "--profile", HELDOUT, "--gpus", 2, "--pp", 2, "--mbs", 4, "--gbs", 16],
]


def _widest(text: str) -> int:
    return max(len(line) for line in text.splitlines())


@pytest.mark.parametrize("args", COMMANDS, ids=[" ".join(map(str, a[:3])) for a in COMMANDS])
def test_every_table_fits_the_terminal(advisor, monkeypatch, args):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert _widest(advisor(*args).stdout) <= 100
    monkeypatch.setenv("COLUMNS", "80")
    assert _widest(advisor(*args).stdout) <= 80


def test_wide_shows_every_column_and_the_default_names_what_it_left_out(advisor, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    args = ("sweep", "--gpus", 8, "--gpu", "h100-80gb", "--top", 3, "--tokens", "15T")
    narrow, wide = advisor(*args).stdout, advisor(*args, "--wide").stdout
    # the margin says the memory against the limit: the usage in GiB goes before it (tests/test_sweep_narrow.py)
    assert ("not shown to fit 100 columns: m, states GiB, act. GiB, Eq.18 GiB, used GiB, MFU, step s, GPU-h "
            "(--wide shows them)") \
        in " ".join(narrow.split())
    assert _widest(wide) > 120 and "GPU-h" in wide and "not shown" not in wide
    assert "not shown" in advisor(*args).stdout  # --wide does not outlive its command


def test_profile_show_takes_a_campaign_directory_and_names_coordinates(advisor):
    """'profile show runs/' said 'no profile files' where 'recommend --profile runs/' took it."""
    document = advisor.json("profile", "show", HELDOUT, "--section", "ranks")
    runs = sorted(p.name for p in HELDOUT.iterdir() if p.is_dir())
    assert [run["run"]["run_id"].rsplit("-", 1)[0] for run in document["runs"]] == runs
    assert [row["pp_rank"] for row in document["runs"][0]["ranks"]] == [0, 1]
    headers = read_table(advisor("profile", "show", RUN, "--section", "ranks").stdout).headers
    assert headers[:5] == ["rank", "tp_rank", "cp_rank", "pp_rank", "dp_rank"]


def test_estimate_splits_layers_pp_does_not_divide(advisor):
    """126 layers over PP 16 failed with no hint; it is the evenest split, the ends lighter."""
    row = advisor.json("estimate", "--tp", 8, "--pp", 16, "--gpus", 16384, "--gpu", "h100-80gb", "--model",
                       "llama3.1-405b", "--gbs", 2048)
    assert row["layers_per_stage"] == [7] + [8] * 14 + [7]
    three = advisor.json("estimate", "--pp", 3, "--gpus", 3, "--mem", 80)
    assert three["layers_per_stage"] == [11, 11, 10]
    table = advisor("estimate", "--pp", 3, "--gpus", 3, "--mem", 80).stdout
    assert "32 layers do not divide over PP 3: split 11x2,10, the evenest (--layers-per-stage to choose)" in table


def test_estimate_split_caption_names_vpp_when_it_is_vpp_that_does_not_divide(advisor):
    """32 layers divide over PP 4; the caption blamed PP where 8 layers per stage do not divide
    over VPP 3."""
    table = " ".join(advisor("estimate", "--tp", 2, "--pp", 4, "--vpp", 3, "--mbs", 1, "--gpus", 8,
                             "--gpu", "h100-80gb").stdout.split())
    assert "32 layers do not divide over PP 4 x VPP 3 (12 model chunks): split 8x4, the evenest" in table


def test_estimate_threshold_has_help(advisor):
    text = " ".join(advisor("estimate", "--help").stdout.split())
    assert "--threshold FRACTION The paper's rule (--memory-model paper): fits at most this fraction of --mem" in text


def test_plot_with_all_clips_the_memory_axis(advisor, tmp_path):
    """--plot --all stretched the memory axis to 725%: the bars that fit were slivers."""
    from PIL import Image

    path = tmp_path / "sweep.png"
    advisor("sweep", "--gpus", 64, "--mem", 40, "--model", "llama3.1-70b", "--all", "--top", 20, "--plot", path)
    image = Image.open(path).convert("RGB")
    width, height = image.size
    assert width == 715 and height > 400  # 6.5 in at 110 dpi, no time panel without --gpu
    # the widest green (fits) bar spans more than a quarter of the figure: the axis ends near 150%
    green = [x for y in range(0, height, 2) for x in range(width) if image.getpixel((x, y)) == (0x91, 0xcf, 0x60)]
    assert green and max(green) - min(green) > width // 4


def test_colour_on_a_terminal_unless_no_color():
    """NO_COLOR (https://no-color.org) was ignored on a terminal: the tables passed rich
    no_color=False themselves."""
    assert "\x1b[" in on_a_terminal("models", env={"COLUMNS": "100", "NO_COLOR": "", "TERM": "xterm"})
    plain = on_a_terminal("models", env={"COLUMNS": "100", "NO_COLOR": "1", "TERM": "xterm"})
    assert "\x1b[" not in plain and "llama3.1-8b" in plain


def _help_pages():
    """Every ``advisor`` command and subcommand, as its argument list ('profile', 'show')."""
    import click

    from advisor.cli import cli

    def walk(command, path):
        yield path
        if isinstance(command, click.Group):
            ctx = click.Context(command)
            for name in command.list_commands(ctx):
                yield from walk(command.get_command(ctx, name), [*path, name])

    return list(walk(cli, []))


@pytest.mark.parametrize("path", _help_pages(), ids=lambda path: " ".join(path) or "advisor")
def test_every_help_page_fits_80_columns(advisor, monkeypatch, path):
    """At COLUMNS=80, 21 of 22 pages had lines up to 100 characters: hand-wrapped \\b blocks and
    long choice metavars (--data-parallel-sharding-strategy [no_shard|optim|...])."""
    monkeypatch.setenv("COLUMNS", "80")
    text = advisor(*path, "--help").stdout
    assert "Usage:" in text and _widest(text) <= 80, [line for line in text.splitlines() if len(line) > 80]


@pytest.mark.parametrize("runner", ["cpu_runner", "megatron_runner"])
def test_campaign_runner_help_fits_80_columns(monkeypatch, runner):
    """python -m megatron_hooks.campaign_runner / launch.campaign_runner: the advisor's text too."""
    from advisor.cli import runners
    from conftest import Invoker

    monkeypatch.setenv("COLUMNS", "80")
    text = Invoker(getattr(runners, runner)(lambda **options: 0))("--help").stdout
    assert "Usage:" in text and _widest(text) <= 80


UNIT_FIRST = re.compile(r"^(GiB|s|TFLOP/s|tokens/s|comm|fits|oom)\b")
LABEL_LAST = re.compile(r"(\b(TP|CP|PP|EP|ETP|DP|MBS|tp|pp|ep|MFU|stage|seq|gbs)|->)$")


@pytest.mark.parametrize("columns", [60, 80])
@pytest.mark.parametrize("args", [["--model", "llama3.1-70b", "--gpus", 64, "--tp", 4, "--pp", 4],
                                  ["--model", "mixtral-8x7b", "--gpus", 64, "--tp", 2, "--ep", 8]],
                         ids=["dense", "moe"])
def test_an_estimates_wrapped_lines_keep_units_labels_and_verdicts_with_their_values(advisor, monkeypatch,
                                                                                      columns, args):
    """At 80 columns the dense estimate's caption broke 'bubble 5.39' from its 's' and the MoE one
    'ep' from 'comm', at 60 '80' from 'GiB': no line of the title or the caption begins with a unit,
    a comm or a verdict, or ends with a degree's label or an arrow."""
    monkeypatch.setenv("COLUMNS", str(columns))
    lines = advisor("estimate", "--gpu", "h100-80gb", *args).stdout.splitlines()
    borders = [i for i, line in enumerate(lines) if BORDER.match(line)]
    wrapped = lines[:borders[0]] + lines[borders[-1] + 1:]
    assert len(wrapped) > 4 and _widest("\n".join(lines)) <= columns
    assert not [line for line in wrapped if UNIT_FIRST.match(line) or LABEL_LAST.search(line)], wrapped


@pytest.mark.parametrize("args", [("--profile", HELDOUT, "--gpus", 2, "--pp", 2, "--mbs", 4, "--gbs", 16),
                                  ("--model", "llama3.1-405b", "--gpus", 16384, "--tp", 8, "--pp", 16, "--gbs", 2048,
                                   "--objective", "time", "--gpu", "h100-80gb")], ids=["MiB", "GiB"])
def test_a_plans_memory_columns_say_their_unit_at_every_width(advisor, monkeypatch, args):
    """The even split's column said no unit (the plan's, 'GiB per GPU' beside it, did): both say
    the caption's unit under their headers, the time its own, at every width."""
    for columns in (50, 80, 100, 300):
        monkeypatch.setenv("COLUMNS", str(columns))
        table = read_table(advisor("recommend", *args).stdout)
        unit = table.caption.split("predicted peak ")[1].split(" ")[1].rstrip(",;")
        assert unit in ("MiB", "GiB") and {f"plan {unit}", f"even split {unit}"} <= set(table.columns), table.columns
        assert "time ms/microbatch" in table.columns or "--objective" not in args
