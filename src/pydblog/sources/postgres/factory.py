"""Builds the PostgreSQL source pair from the config (see ``sources.registry``)."""

from __future__ import annotations

from pydblog.config import Config
from pydblog.ports import LogSource, SnapshotReader
from pydblog.sources.postgres.chunks import PgSnapshotReader
from pydblog.sources.postgres.source import PgLogSource


def create(cfg: Config) -> tuple[LogSource, SnapshotReader]:
    source = PgLogSource(cfg)
    return source, PgSnapshotReader(cfg, source)
