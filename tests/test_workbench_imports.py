"""The workbench's own import graph has no cycle: every workbench-internal import, at module level or
inside a function, counts (a function-level import is still a run-time dependency); only imports under
`if TYPE_CHECKING:` are left out, since they never run. (That mcore never imports the workbench is
tests/test_public_api.py::test_mcore_never_imports_workbench.)"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "workbench"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(tree: ast.AST):
    """Import nodes that can run: everything except the body of `if TYPE_CHECKING:` (its else runs)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _targets(node: ast.Import | ast.ImportFrom, here: str, is_pkg: bool, modules: set[str]) -> list[str]:
    """The workbench modules an import statement loads (a `from M import name` loads M.name when that
    is a module, else M)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in modules]
    if node.level:
        base = here.split(".") if is_pkg else here.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        mod = ".".join(base + ([node.module] if node.module else []))
    else:
        mod = node.module or ""
    if mod not in modules:
        return []
    return [f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod for a in node.names]


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {imported workbench module: first line}; a module also depends on its parent packages."""
    files = {_module_name(f): f for f in sorted(PKG.rglob("*.py"))}
    modules = set(files)
    graph: dict[str, dict[str, int]] = {}
    for name, f in files.items():
        edges = graph.setdefault(name, {})
        parent = name.rpartition(".")[0]
        if parent in modules:
            edges[parent] = 0
        for node in _runtime_imports(ast.parse(f.read_text(encoding="utf-8"), str(f))):
            for target in _targets(node, name, f.name == "__init__.py", modules):
                if target != name:
                    edges[target] = min(edges.get(target, node.lineno), node.lineno)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _describe(comp: list[str], graph: dict[str, dict[str, int]]) -> str:
    members = set(comp)
    edges = [
        f"    {src} -> {dst} (line {line})"
        for src in comp
        for dst, line in sorted(graph[src].items())
        if dst in members
    ]
    return f"  cycle of {len(comp)}: {', '.join(comp)}\n" + "\n".join(edges)


def test_graph_sees_the_workbench():
    """The parser finds the modules and both kinds of run-time import (guards the test from going hollow)."""
    graph = import_graph()
    assert {"workbench.app", "workbench.actions", "workbench.registry", "workbench.screens.base"} <= set(graph)
    assert "workbench.cli" in graph["workbench.__main__"]  # module level, relative
    assert "workbench.app" in graph["workbench.cli"]  # inside a function


def test_type_checking_imports_are_left_out():
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from .app import X\nelse:\n    from .registry import Y\n"
        "def f():\n    from .actions import Z\n"
    )
    mods = {"workbench", "workbench.app", "workbench.registry", "workbench.actions"}
    got = {t for n in _runtime_imports(tree) for t in _targets(n, "workbench.outputs", False, mods)}
    assert got == {"workbench.registry", "workbench.actions"}


def test_cycle_finder_reports_a_cycle():
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_workbench_import_graph_has_no_cycle():
    graph = import_graph()
    found = cycles(graph)
    assert not found, "workbench import cycles (outside TYPE_CHECKING):\n" + "\n".join(
        _describe(c, graph) for c in found
    )
