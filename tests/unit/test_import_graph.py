"""The import graph of ``src/pydblog`` (read with ``ast``, nothing imported): no module
cycles, and the capture never imports the HTTP API (the API reads the capture through
``ports.RunnerView`` and ``capture.live``; ``dblog run`` wires the two together).

Every import counts: at module level, inside functions and under ``TYPE_CHECKING``,
so a cycle cannot come back hidden in a function body.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pydblog

SRC = Path(pydblog.__file__).parent

KNOWN_CYCLES: set[frozenset[str]] = {
    # the Spark reader and its row decoder (owned by the Spark package's work)
    frozenset({"pydblog.spark.decode", "pydblog.spark.source"}),
}
"""Cycles that exist and are not this test's to break; any other fails."""


def module_name(root: Path, path: Path) -> str:
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported(node: ast.Import | ast.ImportFrom, package: str) -> Iterator[str]:
    """The dotted names an import statement names (``from a import b``: ``a.b``, which
    is a module or a name in ``a``, so it resolves to ``a.b`` or ``a``); relative
    imports resolved against ``package``."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:
        anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join([*anchor, base] if base else anchor)
    for alias in node.names:
        yield f"{base}.{alias.name}"


def import_graph(root: Path) -> dict[str, set[str]]:
    """Each module of the package at ``root`` -> the package's modules it imports."""
    files = {module_name(root, p): p for p in root.rglob("*.py")}

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for target in _imported(node, package):
                    found = resolve(target)
                    if found is not None and found != name:
                        edges.add(found)
    return graph


def cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.add(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles() -> None:
    new = cycles(import_graph(SRC)) - KNOWN_CYCLES
    assert not new, "import cycles: " + "; ".join(" <-> ".join(sorted(c)) for c in new)


def test_capture_does_not_import_the_api() -> None:
    graph = import_graph(SRC)
    wrong = {
        (module, target)
        for module, targets in graph.items() if module.startswith("pydblog.capture")
        for target in targets if target == "pydblog.api" or target.startswith("pydblog.api.")
    }
    assert not wrong, f"the capture imports the API: {sorted(wrong)}"


def test_a_cycle_hidden_in_a_function_is_found(tmp_path: Path) -> None:
    """The checks above can fail: an import inside a function body (the way a cycle
    hides from the interpreter) and one under ``TYPE_CHECKING`` are edges too."""
    root = tmp_path / "pkg"
    (root / "api").mkdir(parents=True)
    (root / "capture").mkdir()
    for init in (root, root / "api", root / "capture"):
        (init / "__init__.py").write_text("")
    (root / "api" / "server.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from pkg.capture.runner import Runner\n"
    )
    (root / "capture" / "runner.py").write_text(
        "def address() -> None:\n"
        "    from ..api import server\n"
    )
    graph = import_graph(root)
    assert graph["pkg.capture.runner"] == {"pkg.api.server"}
    assert cycles(graph) == {frozenset({"pkg.api.server", "pkg.capture.runner"})}
