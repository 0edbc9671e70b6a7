"""Optional dependencies (``pip install 'pydblog[EXTRA]'``): a missing one is a clear
error naming the extra to install, never a ``ModuleNotFoundError`` traceback.

Wrap the import of a feature's modules in ``needs_extra(EXTRA, FEATURE)``. Only a
missing module that belongs to that extra is translated; any other import error is a
bug and propagates unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pydblog.errors import ConfigError

EXTRAS: dict[str, frozenset[str]] = {
    "mysql": frozenset({"pymysqlreplication", "pymysql", "sqlglot"}),
    "spark": frozenset({"pyspark", "py4j", "pyarrow", "deltalake", "pandas"}),
    "ha": frozenset({"kazoo"}),
}
"""Extra name -> the top-level modules it installs (see pyproject.toml)."""


class MissingExtra(ConfigError):
    """A feature the configuration asks for needs an optional dependency (exit code 2)."""


@contextmanager
def needs_extra(extra: str, feature: str) -> Iterator[None]:
    try:
        yield
    except ModuleNotFoundError as exc:
        module = (exc.name or "").partition(".")[0]
        if module not in EXTRAS.get(extra, frozenset()):
            raise
        raise MissingExtra(
            f"{feature} needs the optional dependency {module!r}, which is not installed",
            hint=f"install the {extra!r} extra: pip install 'pydblog[{extra}]'",
        ) from None
