"""The README's two commands are the ones that CI and users run."""

import re

from conftest import ROOT


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
