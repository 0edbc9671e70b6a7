"""``dblog setup --print-sql``: the source's least-privilege setup for a configuration,
by ``sources.postgres.grants`` / ``sources.mysql.grants`` (which do no I/O).

PostgreSQL's publication lists the captured tables: ``[source] tables`` made of plain
names (``public\\.orders``) are taken as written; patterns are matched against the
database's tables through a connection (``--dsn``: an administrator's, by default the
configured one), with the capture's own rules (tables without a primary key or replica
identity are left out, as the capture leaves them out). Without ``tables`` everything is
captured: the publication is ``FOR ALL TABLES``. MySQL/MariaDB need no connection.
"""

from __future__ import annotations

import re
from typing import Any

from pydblog.config import Config, redact_dsn
from pydblog.errors import ConfigError, SourceError


def literal_tables(patterns: list[str]) -> list[str] | None:
    """The names ``patterns`` match when each matches exactly one name (``public\\.t``),
    else None."""
    names = []
    for p in patterns:
        name = re.sub(r"\\(.)", r"\1", p)
        if re.escape(name) != p and re.escape(name).replace("\\_", "_") != p:
            return None
        names.append(name if "." in name else f"public.{name}")
    return names


def print_sql(cfg: Config, dsn: str | None = None, host: str = "%") -> str:
    if cfg.source.type == "mysql":
        from pydblog.sources.mysql.connect import MySqlDsn
        from pydblog.sources.mysql.grants import MyTarget, setup_sql

        parsed = MySqlDsn.parse(cfg.source.dsn)
        return setup_sql(cfg, MyTarget(parsed.user, parsed.database, host))
    return _postgres(cfg, dsn)


def _postgres(cfg: Config, dsn: str | None) -> str:
    from psycopg.conninfo import conninfo_to_dict

    from pydblog.sources.postgres.grants import PgTarget, setup_sql

    try:
        info = conninfo_to_dict(cfg.source.dsn)
    except Exception:
        raise ConfigError(f"source.dsn: {redact_dsn(cfg.source.dsn)!r} is not a PostgreSQL DSN",
                          hint="write it as postgresql://user:password@host:5432/database") from None
    role, database = info.get("user"), info.get("dbname")
    if not role or not database:
        raise ConfigError(f"source.dsn: {redact_dsn(cfg.source.dsn)!r} names no "
                          f"{'user' if not role else 'database'}",
                          hint="the capture role and database are the DSN's: "
                               "postgresql://capture:...@host:5432/app")
    patterns = cfg.source.tables
    literal = literal_tables(patterns) if patterns is not None else None
    looked = _look(cfg, dsn, need=patterns is not None and literal is None)
    own: list[str] = []
    version: int | None = None
    if looked is None:
        assert literal is not None or patterns is None
        tables = literal or []
    else:
        tables, version, own = looked
        if literal is not None:
            tables = [t for t in tables if t in literal]
    return setup_sql(cfg, PgTarget(str(role), str(database), tables, all_tables=patterns is None,
                                   existing_own=own, server_version=version))


def _look(cfg: Config, dsn: str | None, need: bool) -> tuple[list[str], int, list[str]] | None:
    """The captured tables, server version and existing own tables, read through ``dsn``
    (else the configured DSN); None when no connection could be made and none is
    ``need``ed (the configured role may not exist yet)."""
    import psycopg

    from pydblog.sources.postgres import setup

    target = dsn or cfg.source.dsn
    try:
        conn: psycopg.Connection[Any] = psycopg.connect(
            target, autocommit=True, connect_timeout=max(1, int(cfg.source.connect_timeout_s)))
    except psycopg.Error as exc:
        if not need and dsn is None:
            return None
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SourceError(
            f"cannot connect to {redact_dsn(target)} to list the tables [source] tables "
            f"matches ({detail})",
            hint="pass --dsn with an administrator's connection to the same database, or write "
                 "[source] tables as plain names (public\\\\.orders)") from None
    with conn:
        own = {cfg.snapshot.signal_table, cfg.snapshot.watermark_table}
        listed = setup.list_tables(conn, cfg.source.table_matcher(), own)
        tables = [t.qualified for t in setup.publishable(listed, set())]
        existing = [t for t in sorted(own) if setup.table_exists(conn, t)]
        return tables, conn.info.server_version, existing
