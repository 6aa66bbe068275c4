"""No function in the packages is longer than 80 lines (the team's standard, STYLE.md): from its
``def`` line to its last, docstring included; a long one is split into named helpers."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("advisor", "megatron_hooks", "launch", "tables")
LIMIT = 80


def long_functions(source: str, where: str) -> list[str]:
    return [f"{where}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines"
            for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > LIMIT]


def test_no_function_is_over_80_lines():
    found = [line for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
             for line in long_functions(path.read_text(), str(path.relative_to(ROOT)))]
    assert found == []


def test_the_count_includes_the_docstring():
    body = "\n".join(["    x = 1"] * (LIMIT - 3))
    exactly = f'def f():\n    """Doc\n    string."""\n{body}\n'
    assert long_functions(exactly, "m") == []
    assert long_functions(exactly + "    x = 2\n", "m") == [f"m:1 f: {LIMIT + 1} lines"]
