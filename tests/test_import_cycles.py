"""The packages' import graph has no cycle, and dependencies point one way: launch ->
megatron_hooks -> advisor (STYLE/COMMON: the core never imports the torch side or the launcher).

Every import counts, a function's lazy one included (a cycle hidden inside a function is still a
cycle), except those under ``if TYPE_CHECKING:`` (never run) and under
``if __name__ == "__main__":`` (a process entry: it runs in the module ``__main__``, which no
module imports, so it cannot close a cycle). ``from package import name`` is an edge to the
submodule ``package.name`` where that is a module, else to the package (a submodule's implicit
import of its parent package is not an edge).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("advisor", "megatron_hooks", "launch")
FORBIDDEN = {"advisor": ("megatron_hooks", "launch"), "megatron_hooks": ("launch",)}


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _skipped(node: ast.AST) -> bool:
    """An ``if TYPE_CHECKING:`` or ``if __name__ == "__main__":`` block."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    if isinstance(test, (ast.Name, ast.Attribute)):
        return getattr(test, "id", getattr(test, "attr", None)) == "TYPE_CHECKING"
    return isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"


def _imported(name: str, source: str, package: bool = False) -> set[str]:
    """Dotted names the module ``name`` imports (its skipped blocks' ``else`` branches included)."""
    base = name.split(".") if package else name.split(".")[:-1]
    found: set[str] = set()
    stack: list[ast.AST] = [ast.parse(source)]
    while stack:
        node = stack.pop()
        if _skipped(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                module = ".".join(base[:len(base) - node.level + 1] + ([module] if module else []))
            found.update(f"{module}.{alias.name}" for alias in node.names)
        stack.extend(ast.iter_child_nodes(node))
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        edges = set()
        for target in _imported(name, path.read_text(), path.name == "__init__.py"):
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.add(target)
        graph[name] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            child = next(edges, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle():
    assert _cycles(_graph()) == []


def test_the_checker_sees_a_lazy_cycle():
    """A function's import counts, TYPE_CHECKING's and an entry block's do not; relative imports
    resolve against the package."""
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x\nelse:\n    import z\n"
              "if __name__ == '__main__':\n    import y\n"
              "def f():\n    from advisor import sweep\n    from .. import limits\n")
    assert _imported("advisor.cli.m", source) == {"typing.TYPE_CHECKING", "z", "advisor.sweep", "advisor.limits"}
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert "advisor.sweep" in _graph()["advisor.cli.estimate"]  # a lazy import inside the command


def test_dependencies_point_one_way():
    wrong = [f"{name} -> {target}" for name, targets in _graph().items() for target in targets
             if target.split(".")[0] in FORBIDDEN.get(name.split(".")[0], ())]
    assert wrong == []


def test_the_campaign_runners_take_their_command_line_from_the_one_cli(tmp_path):
    """The two runners that ``advisor profile run`` starts as processes are plain ``run``
    functions: no click in the plugin's or the launcher's runner; their options are parsed by
    ``advisor.cli.runners``, which their ``__main__`` hands ``run`` to. Bad input is still one
    line and exit status 2."""
    import subprocess
    import sys

    for module in ("megatron_hooks.campaign_runner", "launch.campaign_runner"):
        tree = ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text())
        names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        names |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert not {name for name in names if name and name.split(".")[0] == "click"}, module
        done = subprocess.run([sys.executable, "-m", module, str(tmp_path / "missing.json"), "--out",
                               str(tmp_path / "runs")], capture_output=True, text=True, cwd=ROOT)
        assert done.returncode == 2 and done.stderr.strip().splitlines() == [
            f"Error: {tmp_path / 'missing.json'}: no such file"], done.stderr
