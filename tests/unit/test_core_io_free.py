"""The snapshot core (``pydblog.core``) imports nothing that does IO, keeps time or
starts threads: every module of it imports only pure standard modules, ``orjson`` and
the data modules of pydblog (events, positions, ports, errors, the core itself)."""

from __future__ import annotations

import ast
from pathlib import Path

import pydblog.core

ALLOWED = {
    "__future__", "bisect", "collections", "collections.abc", "contextlib", "dataclasses",
    "enum", "functools", "itertools", "json", "math", "orjson", "re", "typing", "uuid",
    "pydblog.errors", "pydblog.events", "pydblog.ports", "pydblog.positions",
}


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            found.add(node.module)
    return found


def test_every_core_module_imports_only_pure_modules() -> None:
    core = Path(pydblog.core.__file__).parent
    modules = sorted(core.glob("*.py"))
    assert len(modules) > 10
    bad = {
        path.name: sorted(m for m in imports(path)
                          if m not in ALLOWED and not m.startswith("pydblog.core."))
        for path in modules
    }
    assert {name: mods for name, mods in bad.items() if mods} == {}


def test_the_check_sees_an_io_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import threading\nfrom time import sleep\nfrom pydblog.core import x\n")
    assert imports(module) == {"threading", "time", "pydblog.core"}
