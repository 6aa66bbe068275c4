"""The README's two commands are the ones that CI and users run, and every example in README.md and
docs/*.md runs and prints what it shows (tests/doc_examples.py)."""

import os
import re

import pytest
from conftest import ROOT

import doc_examples


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


def test_the_first_screen_speaks_to_a_megatron_user():
    """No project-internal vocabulary before the contents: no seed numbers or issue numbers."""
    text = (ROOT / "README.md").read_text()
    first_screen = text[:text.index("## Contents")]
    assert not re.search(r"\bseed\s*0\d\d|\bissue \d+|these machines", first_screen, re.I)
    assert "--gpu " in first_screen


def test_every_example_block_runs_or_says_why_not():
    for path in doc_examples.documents():
        for block in doc_examples.blocks(path):
            assert block.examples, f"{block.where}: an empty {block.kind} block"
            assert block.not_run is None or len(block.not_run) > 20, f"{block.where}: say why it does not run"


def _needs_checkout(path) -> bool:
    return "Megatron-LM" in "".join(b.body for b in doc_examples.blocks(path) if not b.not_run)


@pytest.mark.parametrize("path", doc_examples.documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_examples_print_what_the_docs_show(path):
    checkouts = os.environ.get("MEGATRON_LM_CHECKOUTS") or ROOT.parent / "shared" / "megatron-lm"
    if _needs_checkout(path) and not (os.path.isdir(os.path.join(checkouts, "core_v0.15.2"))):
        pytest.skip(f"{path.name} runs Megatron-LM dry runs: no core_v0.15.2 checkout at {checkouts}")
    differences = doc_examples.run_document(path)
    report = "\n".join(f"--- {where}\n--- shown\n{shown}\n--- printed\n{printed}" for where, shown, printed in differences)
    assert not differences, f"regenerate with: python tests/doc_examples.py --update {path.relative_to(ROOT)}\n{report}"


def _anchors(path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation but '-' and '_'
    dropped, spaces as '-', a repeated heading numbered -1, -2, ... (code blocks hold none)."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    found, seen = set(), {}
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return found


def test_every_relative_link_resolves():
    """Each relative link of README.md and docs/*.md names a file that exists and, with a
    #fragment into a Markdown file, one of its headings."""
    broken, links = [], 0
    for doc in doc_examples.documents():
        text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            links += 1
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            if not file.exists() or (anchor and file.suffix == ".md" and anchor not in _anchors(file)):
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert links > 50 and broken == []


def test_the_anchors_are_githubs():
    """Headings with code, '|', ':' and '.' in them, slugged by hand as GitHub links them."""
    assert {"capture-python--m-tablescapture-measure--analyse", "results",
            "pipeline-splits-python--m-tablessplits"} <= _anchors(ROOT / "tables" / "README.md")
