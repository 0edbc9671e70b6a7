"""``create(cfg)``: the MySQL/MariaDB source's ``LogSource`` and ``SnapshotReader``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydblog.errors import ConfigError
from pydblog.sources.mysql.binlog import MySqlLogSource
from pydblog.sources.mysql.chunks import MySqlSnapshotReader
from pydblog.sources.mysql.connect import MySqlDsn
from pydblog.sources.mysql.setup import own_tables

if TYPE_CHECKING:
    from pydblog.config import Config
    from pydblog.ports import ConcurrentReader, FencedReader, LogSource, SnapshotReader

    # Static checks that the implementations satisfy the protocols.
    _source_check: type[LogSource] = MySqlLogSource
    _reader_check: type[SnapshotReader] = MySqlSnapshotReader
    _concurrent_check: type[ConcurrentReader] = MySqlSnapshotReader
    _fenced_check: type[FencedReader] = MySqlSnapshotReader


def create(cfg: Config) -> tuple[LogSource, SnapshotReader]:
    """Build (without connecting) the binlog reader and the chunk reader for ``cfg``.

    The captured database is the DSN's path; ``[snapshot] signal_table`` and
    ``watermark_table`` default to ``dblog_signal`` / ``dblog_watermark`` in it (a
    ``public.`` prefix, PostgreSQL's default schema, means the captured database).
    """
    dsn = MySqlDsn.parse(cfg.source.dsn)
    read_dsn = _read_dsn(cfg.snapshot.read_dsn, dsn)
    own = own_tables(cfg.snapshot, dsn.database)
    matcher = cfg.source.table_matcher()
    source = MySqlLogSource(
        dsn,
        server_id=cfg.source.server_id,
        matcher=matcher,
        own=own,
        heartbeat_interval_s=cfg.source.heartbeat_interval_s,
        connect_timeout_s=cfg.source.connect_timeout_s,
        read_only=cfg.snapshot.watermark == "read-only",
    )
    reader = MySqlSnapshotReader(
        read_dsn or dsn,
        matcher=matcher,
        own=own,
        statement_timeout_ms=cfg.snapshot.statement_timeout_ms,
        connect_timeout_s=cfg.source.connect_timeout_s,
        parallelism=cfg.snapshot.parallelism,
        source=dsn if read_dsn is not None else None,
    )
    return source, reader


def _read_dsn(raw: str | None, source: MySqlDsn) -> MySqlDsn | None:
    """``[snapshot] read_dsn`` (a replica of the source: ``sources.mysql.replica``), which
    must name the source's database. Config validation already requires
    ``watermark = "read-only"`` with it."""
    if raw is None:
        return None
    try:
        dsn = MySqlDsn.parse(raw)
    except ConfigError as exc:
        raise ConfigError(exc.message.replace("source.dsn", "snapshot.read_dsn", 1),
                          hint=exc.hint) from None
    if dsn.database != source.database:
        raise ConfigError(
            f"snapshot.read_dsn names database {dsn.database!r}, the source captures "
            f"{source.database!r}",
            hint="read_dsn is the same database on a replica: use the source's database name",
        )
    return dsn
