"""The examples in README.md and docs/*.md, run as a user would run them.

A ```console block holds commands (``$ `` lines, ``\\`` continues a line) each followed by the
output it prints; a ```bash block holds commands that must succeed (their output is not shown).
Every such block runs, in the order of its file, in one scratch directory per file, where
``examples/`` and ``tables/`` are the repository's and ``Megatron-LM`` is the real core_v0.15.2
checkout (tests/megatron_real.py). A block that cannot run here (it needs GPUs or a cluster) is
preceded by ``<!-- not run: why -->``, and the reason is listed by ``--list``.

    python tests/doc_examples.py --update [FILE ...]   # rewrite the shown outputs from the code
    python tests/doc_examples.py --list                # every example and whether it runs

``advisor`` and ``advisor-launch`` run in process (click's runner: no interpreter start-up per
command); anything else in a subprocess shell. Output is what a terminal shows: stdout and stderr
interleaved, 100 columns (``COLUMNS=100``), no colour.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = ("README.md", "docs/*.md")
FIRST_BLOCKS_ARE_INSTALLS = 2
"""README.md's first two bash blocks install the project (CI runs the second; a user the first)."""

BLOCK = re.compile(r"(?:<!-- not run: (?P<why>.+?) -->\n)?```(?P<kind>\w*)\n(?P<body>.*?)```\n?", re.S)
ENVIRONMENT = {"COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb"}


@dataclass
class Example:
    """One command of a block, with the output the document shows (None: not compared)."""

    command: str
    shown: str | None


@dataclass
class Block:
    path: Path
    line: int
    kind: str
    body: str
    not_run: str | None
    start: int
    end: int
    examples: list[Example] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def documents() -> list[Path]:
    paths = [ROOT / "README.md"]
    paths += sorted((ROOT / "docs").glob("*.md"))
    return [path for path in paths if path.exists()]


def _logical_lines(text: str) -> list[str]:
    return text.replace("\\\n", "\\\n").split("\n")


def parse_console(body: str) -> list[Example]:
    examples: list[Example] = []
    command: list[str] = []
    output: list[str] = []
    continuing = False
    for line in body.split("\n"):
        if continuing:
            command.append(line)
            continuing = line.endswith("\\")
        elif line.startswith("$ "):
            if command:
                examples.append(Example("\n".join(command), _output(output)))
            command, output = [line[2:]], []
            continuing = line.endswith("\\")
        elif command:
            output.append(line)
    if command:
        examples.append(Example("\n".join(command), _output(output)))
    return examples


def _output(lines: list[str]) -> str:
    return "\n".join(line.rstrip() for line in lines).strip("\n")


def parse_bash(body: str) -> list[Example]:
    """A bash block's commands: each logical line (continuations joined), comments dropped; a
    block that defines a loop or a function is one command."""
    if re.search(r"^\s*(for|while|if)\b|\(\)\s*\{", body, re.M):
        return [Example(body.strip(), None)]
    examples, command = [], []
    for line in body.split("\n"):
        if not command and (not line.strip() or line.lstrip().startswith("#")):
            continue
        command.append(line)
        if not line.endswith("\\"):
            examples.append(Example("\n".join(command).strip(), None))
            command = []
    return examples


def blocks(path: Path) -> list[Block]:
    text = path.read_text()
    found = []
    for match in BLOCK.finditer(text):
        kind = match["kind"]
        if kind not in ("console", "bash"):
            continue
        block = Block(path, text.count("\n", 0, match.start("body")), kind, match["body"], match["why"],
                      match.start("body"), match.end("body"))
        block.examples = parse_console(block.body) if kind == "console" else parse_bash(block.body)
        found.append(block)
    if path.name == "README.md" and path.parent == ROOT:
        installs = [b for b in found if b.kind == "bash"][:FIRST_BLOCKS_ARE_INSTALLS]
        for block in installs:
            block.not_run = block.not_run or "installs the project (CI runs the test command, .ci/run)"
    return found


# --- running ----------------------------------------------------------------------------------


def scratch_directory(root: Path) -> Path:
    """examples/, tables/, tests/ and benchmarks/ as in the repository, Megatron-LM the real core_v0.15.2 checkout."""
    for name in ("examples", "tables", "tests", "benchmarks"):
        (root / name).symlink_to(ROOT / name)
    checkouts = Path(os.environ.get("MEGATRON_LM_CHECKOUTS") or ROOT.parent / "shared" / "megatron-lm")
    if (checkouts / "core_v0.15.2").is_dir():
        (root / "Megatron-LM").symlink_to(checkouts / "core_v0.15.2")
    return root


def _in_process(command: str, cwd: Path) -> str | None:
    """advisor / advisor-launch through click's runner; None when the command needs a shell."""
    if re.search(r"[|;&<>`$]|\$\(", command.replace("\\\n", " ")):
        return None
    words = shlex.split(command.replace("\\\n", " "), comments=True)
    if not words or words[0] not in ("advisor", "advisor-launch"):
        return None
    from click.testing import CliRunner

    if words[0] == "advisor":
        from advisor.cli import cli
    else:
        from launch.cli import cli
    previous = Path.cwd()
    os.chdir(cwd)
    try:
        result = CliRunner(env=ENVIRONMENT).invoke(cli, words[1:], prog_name=words[0], catch_exceptions=False)
    finally:
        os.chdir(previous)
    return result.output


def _in_shell(command: str, cwd: Path) -> tuple[int, str]:
    env = {**os.environ, **ENVIRONMENT}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=600)
    return done.returncode, done.stdout


def run(example: Example, cwd: Path, *, must_succeed: bool) -> str:
    output = _in_process(example.command, cwd)
    if output is None:
        status, output = _in_shell(example.command, cwd)
        if must_succeed and status != 0:
            raise AssertionError(f"exit status {status}: {example.command}\n{output}")
    return _output(output.split("\n"))


def run_document(path: Path, *, update: bool = False) -> list[tuple[str, str, str]]:
    """Run every block of ``path``; the (where, shown, printed) of each output that differs.
    With ``update``, write the printed outputs into the document instead."""
    differences = []
    replacements = []
    with tempfile.TemporaryDirectory() as tmp:
        cwd = scratch_directory(Path(tmp))
        for block in blocks(path):
            if block.not_run:
                continue
            printed = []
            for example in block.examples:
                # A shown output may be an error: console examples may fail on purpose.
                out = run(example, cwd, must_succeed=block.kind == "bash")
                printed.append(out)
                if example.shown is not None and out != example.shown:
                    differences.append((f"{block.where}: $ {example.command}", example.shown, out))
            if update and block.kind == "console":
                body = "".join(f"$ {ex.command}\n" + (f"{out}\n" if out else "")
                               for ex, out in zip(block.examples, printed))
                replacements.append((block.start, block.end, body))
    if update and replacements:
        text = path.read_text()
        for start, end, body in reversed(replacements):
            text = text[:start] + body + text[end:]
        path.write_text(text)
    return differences


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--update", action="store_true", help="rewrite the shown outputs from the code")
    parser.add_argument("--list", action="store_true", help="list every example and whether it runs")
    parser.add_argument("files", nargs="*", type=Path)
    args = parser.parse_args(argv)
    paths = [path.resolve() for path in args.files] or documents()
    if args.list:
        for path in paths:
            for block in blocks(path):
                state = f"not run: {block.not_run}" if block.not_run else block.kind
                for example in block.examples:
                    print(f"{block.where}\t{state}\t{example.command.splitlines()[0]}")
        return 0
    status = 0
    for path in paths:
        for where, shown, printed in run_document(path, update=args.update):
            status = 1
            if not args.update:
                print(f"--- {where}\n--- shown\n{shown}\n--- printed\n{printed}\n")
    return 0 if args.update else status


if __name__ == "__main__":
    sys.exit(main())
