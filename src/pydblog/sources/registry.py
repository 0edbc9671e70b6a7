"""One registry of source types, so a new connector is one module and one line here.

A factory takes the whole config and returns the source's ``LogSource`` and
``SnapshotReader``. Factories import their drivers lazily.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pydblog.errors import ConfigError
from pydblog.extras import needs_extra

if TYPE_CHECKING:
    from pydblog.config import Config
    from pydblog.ports import LogSource, SnapshotReader

Factory = Callable[["Config"], tuple["LogSource", "SnapshotReader"]]


def _postgres(cfg: Config) -> tuple[LogSource, SnapshotReader]:
    from pydblog.sources.postgres.factory import create

    return create(cfg)


def _mysql(cfg: Config) -> tuple[LogSource, SnapshotReader]:
    with needs_extra("mysql", 'source type "mysql"'):
        from pydblog.sources.mysql.factory import create

    return create(cfg)


SOURCES: dict[str, Factory] = {"postgres": _postgres, "mysql": _mysql}


def create_source(cfg: Config) -> tuple[LogSource, SnapshotReader]:
    try:
        factory = SOURCES[cfg.source.type]
    except KeyError:
        raise ConfigError(f"source.type: unknown source type {cfg.source.type!r}") from None
    return factory(cfg)
