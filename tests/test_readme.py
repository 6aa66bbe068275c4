"""The README's two commands are the ones that CI and users run."""

import re

from conftest import ROOT, Invoker


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(.+?)\n```", text)[:2]


def test_readme_starts_with_the_main_job_and_the_tests():
    main_job, tests = readme_commands()
    assert main_job.endswith("advisor sweep --gpus 64 --mem 40")
    assert "pytest" in tests and "torch==2.13.0" in tests


def test_ci_runs_the_readme_test_command_verbatim():
    _, tests = readme_commands()
    assert tests in (ROOT / ".ci" / "run").read_text().splitlines()


def test_the_first_table_is_the_sweeps_real_output():
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## What it does"):]
    shown = re.search(r"```\n(.+?)```", section, re.S).group(1)
    printed = Invoker()("sweep", "--gpus", 64, "--mem", 40, "--top", 3).stdout
    assert shown.splitlines() == [line.rstrip() for line in printed.splitlines()]
